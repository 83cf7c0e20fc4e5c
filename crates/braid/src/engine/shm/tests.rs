//! The same-host ring on its own: stream order across wrap-around, back-pressure, the
//! doorbell rung only for an armed side, the peer's end, a peer that breaks the ring,
//! payloads that cross by reference to a region file, and page exchange.

use std::time::Duration;

use super::ring::{CTRL_BYTES, MIN_RING_BYTES, map_shared};
use super::*;
use braid_testkit::maps::mapped_private;
use rustix::fs::{MemfdFlags, SealFlags};

const SMALL: usize = MIN_RING_BYTES;
/// A region large enough to live in a region file.
const SHARED: usize = 64 << 10;

/// A link pair copying payloads by reference (no page exchange).
pub(super) fn pair(ring_bytes: usize) -> (ShmLink, ShmLink) {
    pair_with(ring_bytes, false)
}

fn pair_with(ring_bytes: usize, exchange: bool) -> (ShmLink, ShmLink) {
    pair_flags(ring_bytes, exchange, exchange)
}

/// A link pair whose connecting side has page exchange `a_ex`, the other `b_ex`.
fn pair_flags(ring_bytes: usize, a_ex: bool, b_ex: bool) -> (ShmLink, ShmLink) {
    let file = RingFile::create(ring_bytes).expect("ring file");
    let (a, b) = UnixStream::pair().expect("socket pair");
    let (fa, fb) = UnixStream::pair().expect("socket pair");
    // The acceptor maps the file the way a peer process would: from the descriptor.
    let dup = file.fd().try_clone().expect("dup");
    let theirs = RingFile::open(dup).expect("open ring file");
    (
        ShmLink::new(file, Side::Connector, a, fa, a_ex).expect("connector"),
        ShmLink::new(theirs, Side::Acceptor, b, fb, b_ex).expect("acceptor"),
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

pub(super) fn send_all(l: &ShmLink, data: &[u8]) -> usize {
    l.send(&[(data.as_ptr(), data.len())], 0, false, &[])
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
            match a.send(&pieces, 0, false, &[]) {
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
    // A full ring takes nothing more until the reader makes room (one record header of it
    // is not payload, and one byte stays free for the zero tag after the last record).
    let big = vec![5u8; SMALL + 1];
    assert_eq!(send_all(&a, &big), SMALL - INLINE_HDR - 1);
    assert_eq!(
        a.send(&[(big.as_ptr(), 1)], 0, false, &[])
            .unwrap_err()
            .kind(),
        io::ErrorKind::WouldBlock
    );
}

/// A batch of small frames (a `Done`, a request's header, its payload) is one record: the
/// reader takes one record header per batch, not one per piece.
#[test]
fn small_pieces_of_one_send_share_one_inline_record() {
    let (a, b) = pair(SMALL);
    let data: Vec<u8> = (0..136u32).map(|i| (i * 3) as u8).collect();
    let pieces = [
        (data.as_ptr(), 64),
        (data[64..].as_ptr(), 64),
        (data[128..].as_ptr(), 8),
    ];
    assert_eq!(a.send(&pieces, 0, false, &[]).expect("send"), 136);
    assert_eq!(a.txc.lock().head, (INLINE_HDR + 136) as u64, "one header");
    // Part of the first piece already went: the rest still makes one record.
    assert_eq!(a.send(&pieces, 10, false, &[]).expect("send"), 126);
    assert_eq!(a.txc.lock().head, (2 * INLINE_HDR + 136 + 126) as u64);
    let mut got = [0u8; 262];
    assert_eq!(b.recv(&mut got).expect("recv"), 262);
    assert_eq!(&got[..136], &data[..]);
    assert_eq!(&got[136..], &data[10..]);
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
    assert_eq!(send_all(&a, &fill), SMALL - INLINE_HDR - 1);
    // Drain the first doorbell (the reader started armed).
    assert!(b.arm(1).expect("arm"));
    assert_eq!(
        a.send(&[(fill.as_ptr(), 1)], 0, false, &[])
            .unwrap_err()
            .kind(),
        io::ErrorKind::WouldBlock
    );
    assert!(!rung(&a, Duration::ZERO));
    let mut buf = vec![0u8; 1000];
    assert_eq!(b.recv(&mut buf).expect("recv"), 1000);
    assert!(rung(&a, Duration::from_secs(5)), "the writer was not woken");
    // The reader freed the first record's header too.
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
        b.send(&[(buf.as_ptr(), 1)], 0, false, &[])
            .unwrap_err()
            .kind(),
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
    }
    // A stream count no ring can hold.
    a.tx.ctrl()
        .stream_head
        .store(u64::MAX - 5, Ordering::Release);
    assert_eq!(b.bytes_waiting(), None);
    assert_eq!(b.arm(1).unwrap_err().kind(), io::ErrorKind::InvalidData);
    // And the reader's tail, as the writer sees it when it needs the room (a small send
    // fits what it saw before and does not look).
    b.rx.ctrl().tail.store(SMALL as u64 * 9, Ordering::Release);
    let big = vec![0u8; SMALL];
    assert_eq!(
        a.send(&[(big.as_ptr(), SMALL)], 0, false, &[])
            .unwrap_err()
            .kind(),
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
fn the_ring_file_travels_over_the_socket_with_the_region_file_socket() {
    let file = RingFile::create(SMALL).expect("ring file");
    let (a, b) = UnixStream::pair().expect("pair");
    let (files, files_end) = UnixStream::pair().expect("pair");
    send_ring_file(&a, &file, &files_end, b"hello ring").expect("send");
    drop(files_end);
    let mut msg = [0u8; 10];
    let (fd, their_files) = recv_ring_file(&b, &mut msg).expect("recv");
    assert_eq!(&msg, b"hello ring");
    let theirs = RingFile::open(fd).expect("open");
    let (x, y) = UnixStream::pair().expect("pair");
    let mine = ShmLink::new(file, Side::Connector, x, files, true).expect("link");
    let peer = ShmLink::new(theirs, Side::Acceptor, y, their_files, true).expect("link");
    assert_eq!(send_all(&peer, b"back"), 4);
    let mut got = [0u8; 4];
    assert_eq!(mine.recv(&mut got).expect("recv"), 4);
    assert_eq!(&got, b"back");
    // A message without descriptors is refused.
    a.set_nonblocking(false).expect("blocking");
    use std::io::Write;
    (&a).write_all(b"0123456789").expect("plain");
    assert!(recv_ring_file(&b, &mut msg).is_err());
}

/// A region of `len` bytes (in a shareable region file), filled with `fill`.
fn region_file(len: usize, fill: u8) -> braid_proto::Region {
    let registry = std::sync::Arc::new(braid_proto::Registry::with_limit(None));
    let r = braid_proto::Region::allocate_in(&registry, len, braid_proto::Access::all())
        .expect("region");
    r.write_at(0, &vec![fill; len]).expect("fill");
    r
}

#[test]
fn payloads_in_region_files_cross_by_reference_and_move_once() {
    let (a, b) = pair(SMALL);
    let len = 4 * SMALL; // larger than the ring: only a reference fits
    let region = region_file(len, 0x5a);
    let src = region.addr();
    let hdr = [1u8; 40];
    let pieces = [(hdr.as_ptr(), 40), (src as *const u8, len)];
    // Not stable (a read response's source, say): copied inline, as much as fits.
    let n = a.send(&pieces, 0, false, &[false, false]).expect("send");
    assert!(n < 40 + len && n > SMALL / 2, "inline: {n}");
    let mut sink = vec![0u8; n];
    let mut got = 0;
    while got < n {
        got += b.recv(&mut sink[got..]).expect("drain");
    }
    assert!(sink[40..].iter().all(|&x| x == 0x5a));
    let before = a.tx.ctrl().head.load(Ordering::Acquire);
    assert_eq!(
        a.send(&pieces, 0, false, &[false, true]).expect("send"),
        40 + len
    );
    // The ring holds the header inline and a reference: not the payload.
    let ring_used = a.tx.ctrl().head.load(Ordering::Acquire) - before;
    assert_eq!(ring_used, (INLINE_HDR + 40 + REF_HDR) as u64);
    assert_eq!(b.bytes_waiting(), Some(40 + len));
    // The bytes are read from the sender's memory when received: a change made before
    // shows (the sender keeps its payload until the peer's acknowledgement, as braid does).
    // SAFETY: inside the mapping.
    unsafe { *src.add(len - 1) = 0x77 };
    let mut h = [0u8; 40];
    assert_eq!(b.recv(&mut h).expect("header"), 40);
    let mut dst = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let r = b
            .recv_pieces(&[(dst.as_mut_ptr(), len)], got, None, false)
            .expect("payload");
        got += r.got;
    }
    assert!(dst[..len - 1].iter().all(|&x| x == 0x5a));
    assert_eq!(dst[len - 1], 0x77);
    // The second payload from the same file sends no second descriptor.
    assert_eq!(send_all(&a, &[0u8; 4]), 4);
    assert_eq!(
        a.send(&[(src as *const u8, len)], 0, false, &[true])
            .expect("again"),
        len
    );
    assert_eq!(a.sharer.given_count(), 1);
}

#[test]
fn a_reference_to_a_file_never_sent_or_past_its_end_fails_the_link() {
    for (token_known, off) in [(false, 0u64), (true, (SMALL as u64) * 8)] {
        let (a, b) = pair(SMALL);
        let region = region_file(SHARED, 1);
        let src = region.addr();
        let span = braid_proto::mem::shared::lookup(src, SHARED).expect("shareable");
        if token_known {
            assert!(a.sharer.give(&span, 0, 0));
        }
        // A forged record: the peer names bytes it may not.
        let mut h = [0u8; REF_HDR];
        h[0] = REF;
        h[4..8].copy_from_slice(&(REF_MIN as u32).to_le_bytes());
        h[8..16].copy_from_slice(&span.token.to_le_bytes());
        h[16..24].copy_from_slice(&off.to_le_bytes());
        // SAFETY: the first bytes of the ring.
        unsafe { a.tx.copy(0, h.as_mut_ptr(), REF_HDR, true, false) };
        a.tx.ctrl().head.store(REF_HDR as u64, Ordering::Release);
        a.tx.ctrl()
            .stream_head
            .store(REF_MIN as u64, Ordering::Release);
        let mut buf = vec![0u8; REF_MIN];
        let e = b.recv(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}

#[test]
fn a_record_header_of_garbage_fails_the_link() {
    let (a, b) = pair(SMALL);
    let mut junk = [0xffu8; 32];
    // SAFETY: the first bytes of the ring.
    unsafe { a.tx.copy(0, junk.as_mut_ptr(), 32, true, false) };
    a.tx.ctrl().head.store(32, Ordering::Release);
    a.tx.ctrl().stream_head.store(32, Ordering::Release);
    let mut buf = [0u8; 32];
    assert_eq!(
        b.recv(&mut buf).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
}

#[test]
fn truncated_file_pages_are_a_fault_not_a_signal() {
    let (a, b) = pair(SMALL);
    let fd = rustix::fs::memfd_create("pages", MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&fd, 8192).expect("size");
    let map = map_shared(&fd, 8192, false).expect("map");
    rustix::fs::ftruncate(&fd, 0).expect("truncate");
    let page = map.base;
    // Nothing before the bad page: the fault itself.
    let e = a
        .send(&[(page as *const u8, 4096)], 0, true, &[])
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    // Good bytes, then the bad page: the good bytes go, the fault comes next.
    let hdr = [9u8; 10];
    assert_eq!(
        a.send(
            &[(hdr.as_ptr(), 10), (page as *const u8, 4096)],
            0,
            true,
            &[]
        )
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

/// Sends `len` bytes of `r` by reference and reads them on `b`.
fn send_ref_and_read(a: &ShmLink, b: &ShmLink, r: &braid_proto::Region, len: usize) -> Vec<u8> {
    assert_eq!(
        a.send(&[(r.addr() as *const u8, len)], 0, false, &[true])
            .expect("send"),
        len
    );
    let mut got = vec![0u8; len];
    let mut n = 0;
    while n < len {
        n += b.recv(&mut got[n..]).expect("recv");
    }
    got
}

#[test]
fn the_peer_lets_go_of_a_freed_regions_file() {
    let (a, b) = pair(SMALL);
    let first = region_file(SHARED, 1);
    assert!(
        send_ref_and_read(&a, &b, &first, REF_MIN)
            .iter()
            .all(|&x| x == 1)
    );
    assert_eq!(b.rxc.lock().files.mapped(), 1);
    drop(first);
    let second = region_file(SHARED, 2);
    assert!(
        send_ref_and_read(&a, &b, &second, REF_MIN)
            .iter()
            .all(|&x| x == 2)
    );
    assert_eq!(b.rxc.lock().files.mapped(), 1, "the first file was let go");
    assert_eq!(a.sharer.given_count(), 1);
}

/// The ring alone, between two threads: 8 B ping-pong, busy polling. A floor for braid's
/// same-host latency (`cargo test --release -p braid --lib ring_ping_pong -- --ignored
/// --nocapture`); the session, the engine and the completion queue come on top.
#[test]
#[ignore = "a measurement, not a check"]
fn ring_ping_pong_one_way_latency() {
    const N: usize = 200_000;
    let (a, b) = pair(SMALL);
    let echo = std::thread::spawn(move || {
        let mut m = [0u8; 8];
        for _ in 0..N {
            loop {
                match b.recv(&mut m) {
                    Ok(8) => break,
                    Ok(n) => panic!("short read {n}"),
                    Err(_) => std::hint::spin_loop(),
                }
            }
            assert_eq!(send_all(&b, &m), 8);
        }
    });
    let mut m = [0u8; 8];
    let t = std::time::Instant::now();
    for i in 0..N {
        m[..8].copy_from_slice(&(i as u64).to_le_bytes());
        assert_eq!(send_all(&a, &m), 8);
        loop {
            match a.recv(&mut m) {
                Ok(8) => break,
                Ok(n) => panic!("short read {n}"),
                Err(_) => std::hint::spin_loop(),
            }
        }
    }
    let one_way = t.elapsed().as_nanos() as f64 / N as f64 / 2.0;
    echo.join().expect("echo thread");
    eprintln!(
        "ring alone: 8 B one way {:.0} ns (mean of {N} round trips)",
        one_way
    );
}

/// Receives `len` payload bytes into `dst` through `pieces` calls.
fn recv_into(b: &ShmLink, dst: *mut u8, len: usize) {
    let mut got = 0;
    while got < len {
        got += b
            .recv_pieces(&[(dst, len)], got, None, false)
            .expect("payload")
            .got;
    }
}

#[test]
fn whole_pages_cross_by_page_exchange_with_the_semantics_of_a_copy() {
    let (a, b) = pair_with(SMALL, true);
    let len = 16 * SHARED;
    let src = region_file(len, 0x5a);
    let dst = region_file(len, 0);
    let hdr = [1u8; 40];
    let pieces = [(hdr.as_ptr(), 40), (src.addr() as *const u8, len)];
    let before = a.tx.ctrl().head.load(Ordering::Acquire);
    assert_eq!(
        a.send(&pieces, 0, false, &[false, true]).expect("send"),
        40 + len
    );
    let used = a.tx.ctrl().head.load(Ordering::Acquire) - before;
    assert_eq!(
        used,
        (INLINE_HDR + 40 + REF_HDR) as u64,
        "a reference, not bytes"
    );
    // Frozen when sent: a change the sender makes now is its own (unlike a plain reference).
    src.write_at(len - 1, &[0x77]).expect("write");
    let mut h = [0u8; 40];
    assert_eq!(b.recv(&mut h).expect("header"), 40);
    recv_into(&b, dst.addr(), len);
    assert!(
        mapped_private(dst.addr()),
        "the pages were mapped, not copied"
    );
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).expect("read");
    assert!(got.iter().all(|&x| x == 0x5a));
    // The receiver writes: the sender is unaffected; the sender writes: the receiver keeps
    // its bytes; both write the same page.
    dst.write_at(0, &[1, 2, 3]).expect("write");
    src.write_at(1, &[9]).expect("write");
    let (mut s4, mut d4) = ([0u8; 4], [0u8; 4]);
    src.read_at(0, &mut s4).expect("read");
    dst.read_at(0, &mut d4).expect("read");
    assert_eq!((s4, d4), ([0x5a, 9, 0x5a, 0x5a], [1, 2, 3, 0x5a]));
    // The sender's region is freed: the receiver's pages stay.
    drop(src);
    dst.read_at(0, &mut d4).expect("read");
    assert_eq!(d4, [1, 2, 3, 0x5a]);
    dst.read_at(len - 4, &mut d4).expect("read");
    assert_eq!(d4, [0x5a; 4]);
}

#[test]
fn exchanged_pages_that_cannot_be_mapped_are_copied() {
    let (a, b) = pair_with(SMALL, true);
    let len = 2 * SHARED;
    let src = region_file(len, 0x3c);
    // Into memory braid does not own, and into a region at an offset off the page grid.
    for (at, dst_len) in [(None, len), (Some(100usize), len + 100)] {
        assert_eq!(
            a.send(&[(src.addr() as *const u8, len)], 0, false, &[true])
                .expect("send"),
            len
        );
        let region = region_file(dst_len, 0);
        let mut heap = vec![0u8; len];
        let dst = match at {
            None => heap.as_mut_ptr(),
            // SAFETY: inside the region.
            Some(off) => unsafe { region.addr().add(off) },
        };
        recv_into(&b, dst, len);
        let got = match at {
            None => heap,
            Some(off) => {
                assert!(!mapped_private(dst), "copied, not mapped");
                let mut v = vec![0u8; len];
                region.read_at(off, &mut v).expect("read");
                v
            }
        };
        assert!(got.iter().all(|&x| x == 0x3c), "{at:?}");
    }
}

#[test]
fn a_file_named_by_an_unread_record_is_not_let_go() {
    let (a, b) = pair_with(SMALL, true);
    let len = 4 * SHARED;
    let half = len / 2;
    let src = region_file(len, 0x11);
    let send = |n: usize| {
        assert_eq!(
            a.send(&[(src.addr() as *const u8, n)], 0, false, &[true])
                .expect("send"),
            n
        );
    };
    // Frozen in place; then written, so its bytes move to a file of their own (a plain
    // reference to it); then a larger span over it moves to another file, and the first
    // one is no longer in use while its record is still unread.
    send(half);
    src.write_at(0, &[0x22]).expect("write");
    send(half);
    src.write_at(half, &[0x33]).expect("write");
    send(len);
    let mut want = vec![0x11u8; half];
    for (n, first, mid) in [
        (half, 0x11, None),
        (half, 0x22, None),
        (len, 0x22, Some(0x33)),
    ] {
        let mut got = vec![0u8; n];
        recv_into(&b, got.as_mut_ptr(), n);
        want.resize(n, 0x11);
        want[0] = first;
        if let Some(m) = mid {
            want[half] = m;
        }
        assert!(got == want, "payload of {n} starting {first:#x}");
    }
}

#[test]
fn a_receiver_without_page_exchange_copies_exchanged_pages() {
    let (a, b) = pair_flags(SMALL, true, false);
    let len = 2 * SHARED;
    let src = region_file(len, 0x6b);
    let dst = region_file(len, 0);
    assert_eq!(
        a.send(&[(src.addr() as *const u8, len)], 0, false, &[true])
            .expect("send"),
        len
    );
    recv_into(&b, dst.addr(), len);
    assert!(!mapped_private(dst.addr()), "copied, not mapped");
    src.write_at(0, &[1]).expect("write");
    let mut got = vec![0u8; len];
    dst.read_at(0, &mut got).expect("read");
    assert!(got.iter().all(|&x| x == 0x6b));
}
