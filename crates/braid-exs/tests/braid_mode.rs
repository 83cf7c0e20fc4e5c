//! braid mode: ES-API sockets riding a braid endpoint over loopback rails
//! (127.0.0.1..127.0.0.4). Both ends live in this process (one braid context, two
//! endpoints), except in the killed-peer test, which runs the peer as a child process.

mod common;

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::*;
use exs::capi::*;
use exs::*;

const T: Option<Duration> = Some(Duration::from_secs(20));
const FOUR: &str = "127.0.0.1,127.0.0.2,127.0.0.3,127.0.0.4";

/// A loopback bootstrap pair, both ends attached: (connecting side, accepting side).
fn attached(listen: &str, rails: Option<&str>) -> (TcpStream, TcpStream) {
    let (c, s) = pair();
    let listen = listen.to_string();
    // Attach keys on the descriptor: use the same one (not a dup) afterwards.
    let acc =
        std::thread::spawn(move || braid_attach(&s, BraidRole::Accept, Some(&listen)).map(|_| s));
    braid_attach(&c, BraidRole::Connect, rails).expect("connecting side attaches");
    let s = acc.join().unwrap().expect("accepting side attaches");
    (c, s)
}

/// Sends `total` bytes of pattern 7 from `fd` in sends of the given sizes (cycled), at most
/// `depth` in flight; returns the bytes the send events reported.
fn send_stream(fd: &TcpStream, total: usize, sizes: &[usize], depth: usize) -> usize {
    let data = pattern(total, 7);
    let q = Queue::new(depth).unwrap();
    let (mut off, mut i, mut inflight, mut done) = (0usize, 0usize, 0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while off < total || inflight > 0 {
        assert!(Instant::now() < deadline, "sender stuck");
        while off < total && inflight < depth {
            let n = sizes[i % sizes.len()].min(total - off);
            i += 1;
            let buf: Buffer = if i % 2 == 0 {
                data[off..off + n].to_vec().into()
            } else {
                let mut r = Registration::zeroed(n.max(1)).unwrap();
                r.as_mut_slice()[..n].copy_from_slice(&data[off..off + n]);
                Buffer::registered(r, 0..n)
            };
            q.send(fd, buf, n as u64).expect("send accepted");
            off += n;
            inflight += 1;
        }
        for e in q.dequeue(depth, T).unwrap() {
            assert_eq!(e.kind(), EventKind::Send);
            assert_eq!(e.result().expect("send succeeds"), e.user() as usize);
            done += e.user() as usize;
            inflight -= 1;
        }
    }
    done
}

/// Receives until end of stream with receives of the given sizes (cycled), `depth` in
/// flight; returns (bytes, FNV-1a of the bytes in order).
fn recv_stream(fd: &TcpStream, sizes: &[usize], depth: usize, flags: Flags) -> (usize, u64) {
    let q = Queue::new(depth).unwrap();
    let (mut i, mut inflight, mut bytes, mut sum, mut eof) = (0usize, 0usize, 0, FNV_INIT, false);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next_user = 0u64;
    let mut expect_user = 0u64;
    while !eof || inflight > 0 {
        assert!(Instant::now() < deadline, "receiver stuck");
        while !eof && inflight < depth {
            let n = sizes[i % sizes.len()];
            i += 1;
            let buf: Buffer = if i % 3 == 0 {
                Registration::zeroed(n).unwrap().into()
            } else {
                vec![0u8; n].into()
            };
            q.recv_with(fd, buf, flags, next_user)
                .expect("recv accepted");
            next_user += 1;
            inflight += 1;
        }
        for e in q.dequeue(depth, T).unwrap() {
            assert_eq!(e.user(), expect_user, "receives complete in posting order");
            expect_user += 1;
            inflight -= 1;
            let n = e.result().expect("receive succeeds");
            if n == 0 {
                eof = true;
                continue;
            }
            assert!(!eof, "data after end of stream");
            let b = e.into_buffer().unwrap();
            let r = b.range();
            sum = fnv1a(sum, &b.as_slice()[r.start..r.start + n]);
            bytes += n;
        }
    }
    (bytes, sum)
}

fn shutdown_wr(s: &TcpStream) {
    s.shutdown(std::net::Shutdown::Write).unwrap();
}

#[test]
fn stream_over_four_rails() {
    let (c, s) = attached(FOUR, Some(FOUR));
    const N: usize = 48 << 20;
    let rx = std::thread::spawn(move || {
        let r = recv_stream(&s, &[1 << 20], 8, Flags::NONE);
        (r, s)
    });
    let sent = send_stream(&c, N, &[1 << 20, 3 << 20, 256 << 10], 6);
    assert_eq!(sent, N);
    shutdown_wr(&c);
    let ((bytes, sum), _s) = rx.join().unwrap();
    assert_eq!(bytes, N);
    assert_eq!(sum, fnv1a(FNV_INIT, &pattern(N, 7)));
}

#[test]
fn unequal_sizes_waitall_and_one_rail() {
    // No rail list: one rail to the accepting side's bootstrap address.
    let (c, s) = attached("", None);
    const N: usize = (5 << 20) + 12345;
    let rx = std::thread::spawn(move || {
        let r = recv_stream(&s, &[1000, 65536, 777_777, 3], 5, Flags::NONE);
        (r, s)
    });
    let sent = send_stream(&c, N, &[1, 4096, 1_500_000, 99, 0, 65537], 4);
    assert_eq!(sent, N);
    shutdown_wr(&c);
    let ((bytes, sum), s) = rx.join().unwrap();
    assert_eq!(bytes, N);
    assert_eq!(sum, fnv1a(FNV_INIT, &pattern(N, 7)));

    // The other direction, with WAITALL receives larger than the sends: each receive is
    // filled by several sends, the last one short at end of stream.
    const M: usize = (3 << 20) + 5;
    let rx = std::thread::spawn(move || recv_stream(&c, &[1 << 20], 3, Flags::WAITALL));
    assert_eq!(send_stream(&s, M, &[100_000, 7], 8), M);
    shutdown_wr(&s);
    let (bytes, sum) = rx.join().unwrap();
    assert_eq!(bytes, M);
    assert_eq!(sum, fnv1a(FNV_INIT, &pattern(M, 7)));
}

#[test]
fn vectored_c_calls() {
    let (c, s) = attached("127.0.0.1,127.0.0.2", Some("127.0.0.1,127.0.0.2"));
    let q = exs_qcreate(16);
    assert!(q >= 0);
    let data = pattern(300_000, 3);
    let mut parts: Vec<Vec<u8>> = vec![
        data[..10].to_vec(),
        data[10..200_000].to_vec(),
        data[200_000..].to_vec(),
    ];
    let mh = exs_mregister(parts[1].as_mut_ptr().cast(), parts[1].len(), 0);
    assert!(mh >= 0);
    let iov: Vec<exs_iovec_t> = parts
        .iter_mut()
        .enumerate()
        .map(|(i, p)| exs_iovec_t {
            iov_base: p.as_mut_ptr().cast(),
            iov_len: p.len(),
            iov_mhandle: if i == 1 { mh } else { EXS_MHANDLE_UNREGISTERED },
        })
        .collect();
    // Receive into two pieces with WAITALL: 300_000 bytes exactly.
    let mut r0 = vec![0u8; 123_456];
    let mut r1 = vec![0u8; 300_000 - 123_456];
    let riov = [
        exs_iovec_t {
            iov_base: r0.as_mut_ptr().cast(),
            iov_len: r0.len(),
            iov_mhandle: EXS_MHANDLE_UNREGISTERED,
        },
        exs_iovec_t {
            iov_base: r1.as_mut_ptr().cast(),
            iov_len: r1.len(),
            iov_mhandle: EXS_MHANDLE_UNREGISTERED,
        },
    ];
    let sfd = s.as_raw_fd();
    let cfd = c.as_raw_fd();
    assert_eq!(
        unsafe { exs_recvv(sfd, riov.as_ptr(), 2, libc::MSG_WAITALL, q, 2 as _) },
        0
    );
    assert_eq!(unsafe { exs_sendv(cfd, iov.as_ptr(), 3, 0, q, 1 as _) }, 0);
    let mut evs = [exs_event_t::zeroed(); 2];
    let t = ts(20_000);
    assert_eq!(unsafe { exs_qdequeue(q, evs.as_mut_ptr(), -2, &t) }, 2);
    for e in &evs {
        assert_eq!(e.ev_errno, 0);
        assert_eq!(e.ev_result, 300_000);
        let ty = if e.ev_ahandle as usize == 1 {
            EXS_EVT_SENDMSG
        } else {
            EXS_EVT_RECVMSG
        };
        assert_eq!(e.ev_type, ty);
    }
    assert!(r0 == data[..123_456] && r1 == data[123_456..]);
    assert_eq!(exs_mderegister(mh), 0);

    // End of stream: the peer's receive completes with 0 after the data.
    let mut r = vec![0u8; 10];
    assert_eq!(
        unsafe {
            exs_recv(
                sfd,
                r.as_mut_ptr().cast(),
                10,
                0,
                q,
                3 as _,
                EXS_MHANDLE_UNREGISTERED,
            )
        },
        0
    );
    shutdown_wr(&c);
    assert_eq!(unsafe { exs_qdequeue(q, evs.as_mut_ptr(), 1, &t) }, 1);
    assert_eq!((evs[0].ev_result, evs[0].ev_errno), (0, 0));
    // A send after our own end of stream fails (the peer has seen it: its receive ended).
    let mut b = [1u8; 4];
    assert_eq!(
        unsafe {
            exs_send(
                cfd,
                b.as_mut_ptr().cast(),
                4,
                0,
                q,
                4 as _,
                EXS_MHANDLE_UNREGISTERED,
            )
        },
        0
    );
    assert_eq!(unsafe { exs_qdequeue(q, evs.as_mut_ptr(), 1, &t) }, 1);
    assert_eq!((evs[0].ev_result, evs[0].ev_errno), (-1, libc::EPIPE));
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn invalid_attach_arguments() {
    let set = |e: i32| unsafe { *libc::__errno_location() = e };
    let attach = |fd: i32, rails: Option<&str>, flags: i32| {
        set(0);
        let c = rails.map(|r| std::ffi::CString::new(r).unwrap());
        let r = unsafe {
            exs_braid_attach(
                fd,
                c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                flags,
            )
        };
        (r, errno())
    };
    let (c, s) = pair();
    let cfd = c.as_raw_fd();
    assert_eq!(attach(cfd, None, 0), (-1, libc::EINVAL));
    assert_eq!(attach(cfd, None, 3), (-1, libc::EINVAL));
    assert_eq!(attach(-1, None, EXS_BRAID_CONNECT), (-1, libc::EBADF));
    assert_eq!(
        attach(cfd, Some("not-an-address"), EXS_BRAID_CONNECT),
        (-1, libc::EINVAL)
    );
    assert_eq!(
        attach(cfd, Some("127.0.0.1,,"), EXS_BRAID_ACCEPT),
        (-1, libc::EINVAL)
    );
    let file = std::fs::File::open("/proc/self/stat").unwrap();
    assert_eq!(
        attach(file.as_raw_fd(), None, EXS_BRAID_CONNECT),
        (-1, libc::ENOTSOCK)
    );
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    assert_eq!(
        attach(udp.as_raw_fd(), None, EXS_BRAID_CONNECT),
        (-1, libc::EOPNOTSUPP)
    );
    let unconnected = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert_eq!(
        attach(unconnected, None, EXS_BRAID_CONNECT),
        (-1, libc::ENOTCONN)
    );
    unsafe { libc::close(unconnected) };
    // A peer that never attaches: bounded wait.
    let t0 = Instant::now();
    let e =
        braid_attach_timeout(&c, BraidRole::Connect, None, Duration::from_millis(300)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT));
    assert!(t0.elapsed() < Duration::from_secs(5));
    drop((c, s));
    // A peer that does not speak the attach protocol.
    let (c, mut s) = pair();
    use std::io::Write;
    s.write_all(&[0x55u8; 64]).unwrap();
    let e = braid_attach_timeout(&c, BraidRole::Connect, None, Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EPROTO));
    // Attaching twice.
    let (c, s) = attached("127.0.0.1", None);
    let e = braid_attach(&c, BraidRole::Connect, None).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EISCONN));
    drop(s);
}

#[test]
fn graceful_close_gives_zero_then_detaches() {
    let (c, s) = attached("127.0.0.1,127.0.0.2", None);
    let q = Queue::new(8).unwrap();
    q.recv(&s, vec![0u8; 100], 1).unwrap();
    q.recv(&s, vec![0u8; 100], 2).unwrap();
    q.recv(&s, vec![0u8; 100], 3).unwrap();
    q.send(&c, b"hello".to_vec(), 9).unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(q.dequeue(8, T).unwrap());
    }
    got.sort_by_key(|e| e.user());
    assert_eq!(got[0].result().unwrap(), 5);
    assert_eq!(got[1].result().unwrap(), 5);
    shutdown_wr(&c);
    let evs = q.dequeue_exact(2, T).unwrap();
    assert_eq!(evs.len(), 2, "pending receives end at end of stream");
    for (e, u) in evs.iter().zip([2, 3]) {
        assert_eq!((e.user(), e.result().unwrap()), (u, 0));
    }
    // Both directions finished: later receives still see end of stream.
    shutdown_wr(&s);
    q.recv(&c, vec![0u8; 10], 4).unwrap();
    let e = q.dequeue_one(T).unwrap().expect("event");
    assert_eq!(e.result().unwrap(), 0);
}

const CHILD_ENV: &str = "EXS_BRAID_TEST_CHILD_PORT";

/// The peer of `killed_peer_gives_error_events`, run as a child process.
#[test]
fn killed_peer_child() {
    let Ok(port) = std::env::var(CHILD_ENV) else {
        return;
    };
    let c = TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    braid_attach(&c, BraidRole::Connect, Some("127.0.0.1,127.0.0.2")).unwrap();
    let q = Queue::new(4).unwrap();
    q.recv(&c, vec![0u8; 1 << 20], 1).unwrap();
    // Say we are ready on the bootstrap-independent channel: stdout.
    println!("CHILD-READY");
    std::thread::sleep(Duration::from_secs(30));
    std::process::exit(0);
}

#[test]
fn killed_peer_gives_error_events() {
    use std::io::{BufRead, BufReader};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "killed_peer_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, port.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = child.stdout.take().unwrap();
    let mut child = Kill(child);
    let (s, _) = l.accept().unwrap();
    braid_attach(&s, BraidRole::Accept, Some("127.0.0.1,127.0.0.2")).unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        let line = lines.next().expect("child output").unwrap();
        if line.contains("CHILD-READY") {
            break;
        }
    }
    let q = Queue::new(8).unwrap();
    q.recv(&s, vec![0u8; 4096], 1).unwrap();
    q.recv(&s, vec![0u8; 4096], 2).unwrap();
    // More than the child's one advertised receive: the rest waits for receives that never come.
    q.send(&s, vec![5u8; 3 << 20], 3).unwrap();
    let t0 = Instant::now();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let evs = q.dequeue_exact(3, T).unwrap();
    assert_eq!(evs.len(), 3, "every operation ends after the peer died");
    assert!(t0.elapsed() < Duration::from_secs(20));
    for e in &evs {
        let err = e.result().expect_err("error event").raw_os_error().unwrap();
        match e.user() {
            1 | 2 => assert_eq!(err, libc::ECONNRESET, "{e:?}"),
            _ => assert_eq!(err, libc::EPIPE, "{e:?}"),
        }
    }
    // Later operations fail at once, never hang.
    q.send(&s, vec![1u8; 10], 4).unwrap();
    q.recv(&s, vec![0u8; 10], 5).unwrap();
    let evs = q.dequeue_exact(2, T).unwrap();
    assert_eq!(evs.len(), 2);
    assert!(evs.iter().all(|e| e.result().is_err()));
}
