//! The same-host ring on its own: stream order across wrap-around, back-pressure, the
//! doorbell rung only for an armed side, the peer's end, and a peer that breaks the ring.

use std::os::fd::AsRawFd;
use std::time::Duration;

use super::*;

const SMALL: usize = MIN_RING_BYTES;

fn pair(ring_bytes: usize) -> (ShmLink, ShmLink) {
    let file = RingFile::create(ring_bytes).expect("ring file");
    let (a, b) = UnixStream::pair().expect("socket pair");
    // The acceptor maps the file the way a peer process would: from the descriptor.
    let dup = file.fd().try_clone().expect("dup");
    let theirs = RingFile::open(dup).expect("open ring file");
    (
        ShmLink::new(file, Side::Connector, a).expect("connector"),
        ShmLink::new(theirs, Side::Acceptor, b).expect("acceptor"),
    )
}

/// Whether `link`'s doorbell socket has a byte (or an end) waiting within `within`.
fn rung(link: &ShmLink, within: Duration) -> bool {
    let mut p = libc::pollfd {
        fd: link.readiness_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut p, 1, within.as_millis() as i32) };
    n == 1
}

fn send_all(l: &ShmLink, data: &[u8]) -> usize {
    l.send(&[(data.as_ptr(), data.len())], 0, false)
        .unwrap_or(0)
}

#[test]
fn bytes_come_out_in_order_across_wrap_around_and_a_full_ring_pushes_back() {
    let (a, b) = pair(SMALL);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let total = 5 * SMALL + 777;
    let src: Vec<u8> = (0..total).map(|i| (i * 7 + i / 251) as u8).collect();
    let mut dst = vec![0u8; total];
    let (mut sent, mut got) = (0, 0);
    while got < total {
        if sent < total {
            // Sends of odd sizes, gathered from two pieces.
            let len = ((next() % 20_000) as usize + 1).min(total - sent);
            let half = len / 2;
            let pieces = [
                (src[sent..].as_ptr(), half),
                (src[sent + half..].as_ptr(), len - half),
            ];
            match a.send(&pieces, 0, false) {
                Ok(n) => {
                    assert!(n <= len);
                    sent += n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("send: {e}"),
            }
        }
        let want = ((next() % 30_000) as usize + 1).min(total - got);
        match b.recv(&mut dst[got..got + want]) {
            Ok(n) => {
                assert!(n > 0 && n <= want);
                got += n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => assert_eq!(got, sent),
            Err(e) => panic!("recv: {e}"),
        }
        assert_eq!(b.bytes_waiting(), Some(sent - got));
    }
    assert!(dst == src, "the stream differs");
    // A full ring takes nothing more until the reader makes room.
    let big = vec![5u8; SMALL + 1];
    assert_eq!(send_all(&a, &big), SMALL);
    assert_eq!(
        a.send(&[(big.as_ptr(), 1)], 0, false).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
}

#[test]
fn received_pieces_fill_in_order_then_the_tail() {
    let (a, b) = pair(SMALL);
    let data: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
    assert_eq!(send_all(&a, &data), 300);
    let (mut p1, mut p2, mut tail) = ([0u8; 100], [0u8; 100], [0u8; 64]);
    let pieces = [(p1.as_mut_ptr(), 100), (p2.as_mut_ptr(), 100)];
    // Skip 30 bytes of the first piece (already filled by an earlier read).
    let r = b
        .recv_pieces(&pieces, 30, Some((tail.as_mut_ptr(), 64)), false)
        .expect("recv");
    assert_eq!((r.got, r.asked), (70 + 100 + 64, 70 + 100 + 64));
    assert_eq!(&p1[30..], &data[..70]);
    assert_eq!(&p2[..], &data[70..170]);
    assert_eq!(&tail[..], &data[170..234]);
    let mut rest = [0u8; 100];
    assert_eq!(b.recv(&mut rest).expect("rest"), 66);
    assert_eq!(&rest[..66], &data[234..]);
}

#[test]
fn the_doorbell_rings_only_for_an_armed_reader_and_for_the_bytes_it_wants() {
    let (a, b) = pair(SMALL);
    // Both start armed: the first bytes ring.
    assert_eq!(send_all(&a, b"x"), 1);
    assert!(rung(&b, Duration::from_secs(5)));
    assert!(b.arm(1).expect("arm"), "a byte already waits");
    let mut one = [0u8; 1];
    assert_eq!(b.recv(&mut one).expect("recv"), 1);
    // Not armed (a polling reader): no system call, no doorbell.
    assert_eq!(send_all(&a, b"y"), 1);
    assert!(!rung(&b, Duration::ZERO));
    assert_eq!(b.recv(&mut one).expect("recv"), 1);
    // Armed for 100 bytes: 50 do not ring, 100 do.
    assert!(!b.arm(100).expect("arm"));
    assert_eq!(send_all(&a, &[1u8; 50]), 50);
    assert!(!rung(&b, Duration::ZERO));
    assert_eq!(send_all(&a, &[2u8; 50]), 50);
    assert!(rung(&b, Duration::from_secs(5)));
    // Arming reads the doorbells it was woken by.
    assert!(b.arm(1).expect("arm"));
    assert!(!rung(&b, Duration::ZERO));
}

#[test]
fn a_writer_blocked_on_a_full_ring_is_woken_when_the_reader_makes_room() {
    let (a, b) = pair(SMALL);
    let fill = vec![3u8; SMALL];
    assert_eq!(send_all(&a, &fill), SMALL);
    // Drain the first doorbell (the reader started armed).
    assert!(b.arm(1).expect("arm"));
    assert_eq!(
        a.send(&[(fill.as_ptr(), 1)], 0, false).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    assert!(!rung(&a, Duration::ZERO));
    let mut buf = vec![0u8; 1000];
    assert_eq!(b.recv(&mut buf).expect("recv"), 1000);
    assert!(rung(&a, Duration::from_secs(5)), "the writer was not woken");
    assert_eq!(send_all(&a, &fill[..1000]), 1000);
}

#[test]
fn the_peers_end_is_seen_by_an_arming_reader_and_ends_the_stream() {
    let (a, b) = pair(SMALL);
    assert_eq!(send_all(&a, b"last words"), 10);
    drop(a);
    // What was sent is still read; then the end.
    let mut buf = [0u8; 32];
    assert_eq!(b.recv(&mut buf).expect("recv"), 10);
    assert!(rung(&b, Duration::from_secs(5)), "the end wakes the reader");
    let e = b.arm(1).expect_err("the peer is gone");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    assert_eq!(b.recv(&mut buf).expect("end"), 0);
    assert_eq!(
        b.send(&[(buf.as_ptr(), 1)], 0, false).unwrap_err().kind(),
        io::ErrorKind::BrokenPipe
    );
}

#[test]
fn a_peer_that_breaks_the_cursors_fails_the_link_without_harm() {
    let (a, b) = pair(SMALL);
    assert_eq!(send_all(&a, b"ok"), 2);
    // The "peer" moves its head far past the tail, then backwards.
    for bad in [SMALL as u64 * 3, u64::MAX - 5] {
        a.tx.ctrl().head.store(bad, Ordering::Release);
        let mut buf = [0u8; 16];
        assert_eq!(
            b.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(b.bytes_waiting(), None);
    }
    // And the reader's tail, as the writer sees it.
    b.rx.ctrl().tail.store(SMALL as u64 * 9, Ordering::Release);
    assert_eq!(
        a.send(&[(b"x".as_ptr(), 1)], 0, false).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
}

#[test]
fn a_ring_file_that_is_unsealed_misshapen_or_foreign_is_refused() {
    let memfd = |len: u64, seal: bool| {
        let fd = rustix::fs::memfd_create("t", MemfdFlags::ALLOW_SEALING).expect("memfd");
        rustix::fs::ftruncate(&fd, len).expect("size");
        if seal {
            rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
                .expect("seal");
        }
        fd
    };
    let good_len = (CTRL_BYTES + 2 * SMALL) as u64;
    let kind = |r: io::Result<RingFile>| r.err().map(|e| e.kind());
    assert_eq!(
        kind(RingFile::open(memfd(good_len, false))),
        Some(io::ErrorKind::InvalidData)
    );
    assert_eq!(
        kind(RingFile::open(memfd(good_len + 4096, true))),
        Some(io::ErrorKind::InvalidData)
    );
    assert_eq!(
        kind(RingFile::open(memfd(100, true))),
        Some(io::ErrorKind::InvalidData)
    );
    // Right shape, no marks.
    assert_eq!(
        kind(RingFile::open(memfd(good_len, true))),
        Some(io::ErrorKind::InvalidData)
    );
    assert!(RingFile::create(SMALL + 1).is_err());
    assert!(RingFile::create(SMALL / 2).is_err());
}

#[test]
fn the_ring_file_travels_over_the_socket_with_its_message() {
    let file = RingFile::create(SMALL).expect("ring file");
    let (a, b) = UnixStream::pair().expect("pair");
    send_ring_file(&a, &file, b"hello ring").expect("send");
    let mut msg = [0u8; 10];
    let fd = recv_ring_file(&b, &mut msg).expect("recv");
    assert_eq!(&msg, b"hello ring");
    assert!(fd.as_raw_fd() >= 0);
    let theirs = RingFile::open(fd).expect("open");
    let (x, y) = UnixStream::pair().expect("pair");
    let mine = ShmLink::new(file, Side::Connector, x).expect("link");
    let peer = ShmLink::new(theirs, Side::Acceptor, y).expect("link");
    assert_eq!(send_all(&peer, b"back"), 4);
    let mut got = [0u8; 4];
    assert_eq!(mine.recv(&mut got).expect("recv"), 4);
    assert_eq!(&got, b"back");
    // A message without a descriptor is refused.
    a.set_nonblocking(false).expect("blocking");
    use std::io::Write;
    (&a).write_all(b"0123456789").expect("plain");
    assert!(recv_ring_file(&b, &mut msg).is_err());
}

#[test]
fn truncated_file_pages_are_a_fault_not_a_signal() {
    let (a, b) = pair(SMALL);
    let fd = rustix::fs::memfd_create("pages", MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&fd, 8192).expect("size");
    let map = map_shared(&fd, 8192).expect("map");
    rustix::fs::ftruncate(&fd, 0).expect("truncate");
    let page = map.base;
    // Nothing before the bad page: the fault itself.
    let e = a.send(&[(page as *const u8, 4096)], 0, true).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    // Good bytes, then the bad page: the good bytes go, the fault comes next.
    let hdr = [9u8; 10];
    assert_eq!(
        a.send(&[(hdr.as_ptr(), 10), (page as *const u8, 4096)], 0, true)
            .expect("send"),
        10
    );
    let mut got = [0u8; 10];
    assert_eq!(b.recv(&mut got).expect("recv"), 10);
    assert_eq!(got, hdr);
    // Receiving into the bad page: a fault, and the bytes stay in the ring.
    assert_eq!(send_all(&a, &[7u8; 100]), 100);
    let e = b.recv_pieces(&[(page, 100)], 0, None, true).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    assert_eq!(b.bytes_waiting(), Some(100));
}
