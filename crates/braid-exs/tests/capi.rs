//! The C ABI, called directly from Rust, against plain std sockets on loopback.

mod common;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

use common::*;
use exs::capi::*;
use exs::*;

fn ev0() -> exs_event_t {
    exs_event_t::zeroed()
}

/// Dequeue exactly n events (bounded: 20 s).
fn take(q: exs_qhandle_t, n: usize) -> Vec<exs_event_t> {
    let mut evs = vec![ev0(); n];
    let t = ts(20_000);
    let r = unsafe { exs_qdequeue(q, evs.as_mut_ptr(), -(n as i32), &t) };
    assert_eq!(
        r,
        n as i32,
        "dequeue of {n} events timed out or failed (errno {})",
        errno()
    );
    evs
}

#[test]
fn init_version() {
    assert_eq!(exs_init(EXS_VERSION), EXS_VERSION1);
    assert_eq!(exs_init(0), -1);
    assert_eq!(errno(), libc::EINVAL);
}

#[test]
fn exs_send_to_plain_recv_with_flow_control() {
    assert_eq!(exs_init(EXS_VERSION), 1);
    let (a, mut b) = pair();
    let total = 8 << 20;
    let data = pattern(total, 1);
    let want = fnv1a(FNV_INIT, &data);
    let reader = std::thread::spawn(move || {
        let mut got = 0usize;
        let mut h = FNV_INIT;
        let mut buf = vec![0u8; 65536];
        loop {
            let n = b.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            h = fnv1a(h, &buf[..n]);
            got += n;
        }
        (got, h)
    });
    let q = exs_qcreate(4);
    assert!(q >= 0);
    // Half the data from a registration, half unregistered.
    let mh = exs_mregister(data.as_ptr() as *mut _, total / 2, 0);
    assert!(mh >= 0, "mregister errno {}", errno());
    let chunk = 256 << 10;
    let (mut off, mut done, mut eagain, mut next_ah) = (0usize, 0usize, 0, 0usize);
    let deadline = Instant::now() + Duration::from_secs(30);
    while done < total {
        assert!(Instant::now() < deadline);
        if off < total {
            let m = if off + chunk <= total / 2 {
                mh
            } else {
                EXS_MHANDLE_UNREGISTERED
            };
            let r = unsafe {
                exs_send(
                    a.as_raw_fd(),
                    data.as_ptr().add(off) as *mut _,
                    chunk,
                    0,
                    q,
                    next_ah as exs_ahandle_t,
                    m,
                )
            };
            if r == 0 {
                off += chunk;
                next_ah += 1;
                continue;
            }
            assert_eq!(errno(), libc::EAGAIN);
            eagain += 1;
        }
        let mut evs = [ev0(); 4];
        let t = ts(10_000);
        let n = unsafe { exs_qdequeue(q, evs.as_mut_ptr(), 4, &t) };
        assert!((1..=4).contains(&n), "n={n}");
        for e in &evs[..n as usize] {
            assert_eq!(e.ev_type, EXS_EVT_SEND);
            assert_eq!(e.ev_errno, 0);
            assert_eq!(e.ev_result as usize, chunk);
            assert_eq!(e.ev_fd, a.as_raw_fd());
            // Events of one socket come in order.
            assert_eq!(e.ev_ahandle as usize, done / chunk);
            assert_eq!(unsafe { e.ev_u.xfer.xf_len }, chunk);
            done += chunk;
        }
    }
    assert!(eagain > 0, "depth 4 must have pushed back");
    assert_eq!(exs_mderegister(mh), 0);
    assert_eq!(exs_qdelete(q), 0);
    drop(a);
    let (got, h) = reader.join().unwrap();
    assert_eq!(got, total);
    assert_eq!(h, want);
}

#[test]
fn plain_send_to_exs_recv_until_close() {
    let (mut a, b) = pair();
    let total = 3 << 20;
    let data = pattern(total, 2);
    let want = fnv1a(FNV_INIT, &data);
    let writer = std::thread::spawn(move || {
        a.write_all(&data).unwrap();
    });
    let q = exs_qcreate(2);
    let mut buf = vec![0u8; 100_000];
    let mh = exs_mregister(buf.as_mut_ptr().cast(), buf.len(), EXS_MRF_SHARED);
    assert!(mh >= 0);
    let (mut got, mut h) = (0usize, FNV_INIT);
    for _ in 0..100_000 {
        let r = unsafe {
            exs_recv(
                b.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                q,
                null_mut(),
                mh,
            )
        };
        assert_eq!(r, 0, "errno {}", errno());
        let e = take(q, 1)[0];
        assert_eq!(e.ev_type, EXS_EVT_RECV);
        assert_eq!(e.ev_errno, 0);
        let n = e.ev_result as usize;
        if n == 0 {
            break;
        }
        h = fnv1a(h, &buf[..n]);
        got += n;
    }
    writer.join().unwrap();
    assert_eq!(got, total);
    assert_eq!(h, want);
    assert_eq!(exs_mderegister(mh), 0);
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn recv_waitall_fills_buffer() {
    let (mut a, b) = pair();
    let data = pattern(1 << 20, 3);
    let q = exs_qcreate(2);
    let mut buf = vec![0u8; 1 << 20];
    let r = unsafe {
        exs_recv(
            b.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_WAITALL,
            q,
            null_mut(),
            EXS_MHANDLE_UNREGISTERED,
        )
    };
    assert_eq!(r, 0);
    let d2 = data.clone();
    let w = std::thread::spawn(move || {
        for c in d2.chunks(1000) {
            a.write_all(c).unwrap();
        }
        a
    });
    let e = take(q, 1)[0];
    assert_eq!(e.ev_result as usize, buf.len());
    assert_eq!(buf, data);
    // Stream end with WAITALL: completes with what arrived.
    let a = w.join().unwrap();
    let mut small = [0u8; 10];
    let r = unsafe {
        exs_recv(
            b.as_raw_fd(),
            small.as_mut_ptr().cast(),
            10,
            libc::MSG_WAITALL,
            q,
            null_mut(),
            EXS_MHANDLE_UNREGISTERED,
        )
    };
    assert_eq!(r, 0);
    (&a).write_all(b"abc").unwrap();
    drop(a);
    let e = take(q, 1)[0];
    assert_eq!(e.ev_result, 3);
    assert_eq!(&small[..3], b"abc");
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn eagain_when_queue_full_and_receiver_idle() {
    let (a, mut b) = pair();
    let q = exs_qcreate(2);
    let big = pattern(8 << 20, 4);
    let fd = a.as_raw_fd();
    let send = |ah: usize| unsafe {
        exs_send(
            fd,
            big.as_ptr() as *mut _,
            big.len(),
            0,
            q,
            ah as _,
            EXS_MHANDLE_UNREGISTERED,
        )
    };
    assert_eq!(send(1), 0);
    assert_eq!(send(2), 0);
    assert_eq!(send(3), -1);
    assert_eq!(errno(), libc::EAGAIN);
    // Nothing completes while the receiver does not read (8 MiB > socket buffers).
    let mut evs = [ev0(); 2];
    let t = ts(50);
    assert_eq!(unsafe { exs_qdequeue(q, evs.as_mut_ptr(), 2, &t) }, 0);
    // Deleting a queue with work outstanding is refused.
    assert_eq!(exs_qdelete(q), -1);
    assert_eq!(errno(), libc::EBUSY);
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        while got < 16 << 20 {
            got += b.read(&mut buf).unwrap();
        }
        got
    });
    let evs = take(q, 2);
    assert_eq!(evs[0].ev_ahandle as usize, 1);
    assert_eq!(evs[1].ev_ahandle as usize, 2);
    assert!(evs.iter().all(|e| e.ev_result as usize == big.len()));
    assert_eq!(reader.join().unwrap(), 16 << 20);
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn registration_checks() {
    let (a, _b) = pair();
    let fd = a.as_raw_fd();
    let q = exs_qcreate(8);
    let mut buf = vec![7u8; 4096];
    let p = buf.as_mut_ptr();
    let mh = exs_mregister(p.cast(), 4096, 0);
    assert!(mh >= 0);
    // Outside the registration: one byte past the end, and before the start.
    let r = unsafe { exs_send(fd, p.add(1).cast(), 4096, 0, q, null_mut(), mh) };
    assert_eq!((r, errno()), (-1, libc::EINVAL));
    let r = unsafe { exs_send(fd, p.wrapping_sub(1).cast(), 10, 0, q, null_mut(), mh) };
    assert_eq!((r, errno()), (-1, libc::EINVAL));
    // Inside: fine.
    let r = unsafe { exs_send(fd, p.add(100).cast(), 100, 0, q, null_mut(), mh) };
    assert_eq!(r, 0);
    assert_eq!(take(q, 1)[0].ev_result, 100);
    // Deregistered handle.
    assert_eq!(exs_mderegister(mh), 0);
    let r = unsafe { exs_send(fd, p.cast(), 10, 0, q, null_mut(), mh) };
    assert_eq!((r, errno()), (-1, libc::EINVAL));
    assert_eq!(exs_mderegister(mh), -1);
    assert_eq!(errno(), libc::EINVAL);
    // Invalid handles.
    for bad in [EXS_MHANDLE_INVALID, 0, 12345, i32::MAX] {
        let r = unsafe { exs_send(fd, p.cast(), 10, 0, q, null_mut(), bad) };
        assert_eq!((r, errno()), (-1, libc::EINVAL), "mhandle {bad}");
    }
    // Unregistered works.
    let r = unsafe { exs_send(fd, p.cast(), 10, 0, q, null_mut(), EXS_MHANDLE_UNREGISTERED) };
    assert_eq!(r, 0);
    assert_eq!(take(q, 1)[0].ev_result, 10);
    // Bad registrations.
    assert_eq!(exs_mregister(null_mut(), 10, 0), EXS_MHANDLE_INVALID);
    assert_eq!(exs_mregister(p.cast(), 0, 0), EXS_MHANDLE_INVALID);
    assert_eq!(exs_mregister(p.cast(), 10, 0x100), EXS_MHANDLE_INVALID);
    assert_eq!(errno(), libc::EINVAL);
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn deregister_busy_while_in_flight() {
    let (a, mut b) = pair();
    let q = exs_qcreate(2);
    let big = pattern(16 << 20, 5);
    let mh = exs_mregister(big.as_ptr() as *mut _, big.len(), 0);
    assert!(mh >= 0);
    let r = unsafe {
        exs_send(
            a.as_raw_fd(),
            big.as_ptr() as *mut _,
            big.len(),
            0,
            q,
            null_mut(),
            mh,
        )
    };
    assert_eq!(r, 0);
    assert_eq!(exs_mderegister(mh), -1);
    assert_eq!(errno(), libc::EBUSY);
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        (&mut b).take(16 << 20).read_to_end(&mut v).unwrap();
        v
    });
    assert_eq!(take(q, 1)[0].ev_result as usize, big.len());
    assert_eq!(exs_mderegister(mh), 0);
    assert!(reader.join().unwrap() == big);
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn invalid_queue_fd_and_flags() {
    let (a, _b) = pair();
    let fd = a.as_raw_fd();
    let q = exs_qcreate(4);
    let mut buf = [0u8; 16];
    let p = buf.as_mut_ptr().cast();
    let u = EXS_MHANDLE_UNREGISTERED;
    unsafe {
        for bad_q in [EXS_QHANDLE_INVALID, 0, 999_999] {
            assert_eq!(
                (exs_send(fd, p, 16, 0, bad_q, null_mut(), u), errno()),
                (-1, libc::EINVAL)
            );
            assert_eq!(
                (exs_recv(fd, p, 16, 0, bad_q, null_mut(), u), errno()),
                (-1, libc::EINVAL)
            );
        }
        assert_eq!(
            (exs_send(-1, p, 16, 0, q, null_mut(), u), errno()),
            (-1, libc::EBADF)
        );
        assert_eq!(
            (exs_send(1_000_000, p, 16, 0, q, null_mut(), u), errno()),
            (-1, libc::EBADF)
        );
        let mut pipe = [0; 2];
        assert_eq!(libc::pipe(pipe.as_mut_ptr()), 0);
        assert_eq!(
            (exs_send(pipe[1], p, 16, 0, q, null_mut(), u), errno()),
            (-1, libc::ENOTSOCK)
        );
        libc::close(pipe[0]);
        libc::close(pipe[1]);
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(
            (
                exs_recv(udp.as_raw_fd(), p, 16, 0, q, null_mut(), u),
                errno()
            ),
            (-1, libc::EOPNOTSUPP)
        );
        assert_eq!(
            (
                exs_send(fd, p, 16, libc::MSG_DONTWAIT, q, null_mut(), u),
                errno()
            ),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            (exs_recv(fd, p, 0, 0, q, null_mut(), u), errno()),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            (exs_recv(fd, null_mut(), 16, 0, q, null_mut(), u), errno()),
            (-1, libc::EFAULT)
        );
        let mut evs = [ev0(); 1];
        assert_eq!(
            (
                exs_qdequeue(999_999, evs.as_mut_ptr(), 1, std::ptr::null()),
                errno()
            ),
            (-1, libc::EINVAL)
        );
        let bad_t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 2_000_000_000,
        };
        assert_eq!(
            (exs_qdequeue(q, evs.as_mut_ptr(), 1, &bad_t), errno()),
            (-1, libc::EINVAL)
        );
        assert_eq!(
            (exs_cancel(fd, null_mut(), EXS_CAF_FILDES), errno()),
            (-1, libc::ENOSYS)
        );
    }
    assert_eq!(exs_qcreate(0), EXS_QHANDLE_INVALID);
    assert_eq!(exs_qcreate(-5), EXS_QHANDLE_INVALID);
    assert_eq!(exs_qdelete(q), 0);
    assert_eq!((exs_qdelete(q), errno()), (-1, libc::EINVAL));
}

#[test]
fn closed_peer_gives_zero_recv_and_send_error() {
    let (a, b) = pair();
    let q = exs_qcreate(4);
    let mut buf = [0u8; 64];
    let r = unsafe {
        exs_recv(
            a.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            64,
            0,
            q,
            null_mut(),
            EXS_MHANDLE_UNREGISTERED,
        )
    };
    assert_eq!(r, 0);
    // Reset, not just close: SO_LINGER 0.
    let lin = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    unsafe {
        libc::setsockopt(
            b.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lin as *const libc::linger).cast(),
            size_of::<libc::linger>() as _,
        );
    }
    drop(b);
    let e = take(q, 1)[0];
    assert!(
        e.ev_result == 0 || e.ev_errno == libc::ECONNRESET,
        "result {} errno {}",
        e.ev_result,
        e.ev_errno
    );
    // Sends fail (EPIPE / ECONNRESET) within a few tries, without SIGPIPE.
    let data = vec![1u8; 65536];
    let mut failed = false;
    for _ in 0..64 {
        let r = unsafe {
            exs_send(
                a.as_raw_fd(),
                data.as_ptr() as *mut _,
                data.len(),
                0,
                q,
                null_mut(),
                EXS_MHANDLE_UNREGISTERED,
            )
        };
        assert_eq!(r, 0);
        let e = take(q, 1)[0];
        if e.ev_result == -1 {
            assert!(
                matches!(e.ev_errno, libc::EPIPE | libc::ECONNRESET),
                "errno {}",
                e.ev_errno
            );
            failed = true;
            break;
        }
    }
    assert!(failed);
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn qdequeue_count_semantics() {
    let (a, _b) = pair();
    let fd = a.as_raw_fd();
    let q = exs_qcreate(4);
    let mut evs = [ev0(); 8];
    let poll = |n: usize| {
        for i in 0..n {
            assert_eq!(exs_poll(fd, EXS_POLLOUT, q, i as _), 0);
        }
    };
    unsafe {
        // Zero: at once, even with nothing queued and no timeout.
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), 0, std::ptr::null()), 0);
        assert_eq!(exs_qdequeue(q, null_mut(), 0, std::ptr::null()), 0);
        // Timeout with nothing ready: 0, after about the timeout.
        let t0 = Instant::now();
        let t = ts(100);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), 3, &t), 0);
        assert!(t0.elapsed() >= Duration::from_millis(90));
        let t = ts(0);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), 3, &t), 0);
        // Negative: exactly -count.
        poll(3);
        let t = ts(10_000);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), -3, &t), 3);
        for e in &evs[..3] {
            assert_eq!(e.ev_type, EXS_EVT_POLL);
            assert!(e.ev_u.poll.po_revents & EXS_POLLOUT != 0);
            assert_eq!(e.ev_result as i16, e.ev_u.poll.po_revents);
        }
        // Never more than |count|.
        poll(4);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), -4, &t), 4);
        poll(4);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), -2, &t), 2);
        let n = exs_qdequeue(q, evs.as_mut_ptr(), 1, &t);
        assert_eq!(n, 1);
        let n = exs_qdequeue(q, evs.as_mut_ptr(), 8, &t);
        assert_eq!(n, 1);
        // Negative with fewer ready: timeout returns 0 and keeps the events.
        poll(1);
        // Wait for it to be ready without taking it: a -2 that times out.
        let short = ts(200);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), -2, &short), 0);
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), 4, &t), 1);
        // Threshold beyond the depth can never be met.
        assert_eq!(
            (exs_qdequeue(q, evs.as_mut_ptr(), -5, &t), errno()),
            (-1, libc::EINVAL)
        );
        // Depth counts undequeued events: 4 polls fill it.
        poll(4);
        assert_eq!(
            (exs_poll(fd, EXS_POLLOUT, q, null_mut()), errno()),
            (-1, libc::EAGAIN)
        );
        assert_eq!(exs_qdequeue(q, evs.as_mut_ptr(), -4, &t), 4);
    }
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn sync_mode_returns_count_and_posts_event() {
    let (a, mut b) = pair();
    let q = exs_qcreate(2);
    let data = pattern(300_000, 6);
    let reader = std::thread::spawn(move || {
        let mut v = vec![0u8; 300_000];
        b.read_exact(&mut v).unwrap();
        b.write_all(b"hello").unwrap();
        (v, b)
    });
    let r = unsafe {
        exs_send(
            a.as_raw_fd(),
            data.as_ptr() as *mut _,
            data.len(),
            EXS_MSG_SYNC,
            q,
            7 as _,
            EXS_MHANDLE_UNREGISTERED,
        )
    };
    assert_eq!(r, 300_000);
    let e = take(q, 1)[0];
    assert_eq!(
        (e.ev_type, e.ev_result, e.ev_ahandle as usize),
        (EXS_EVT_SEND, 300_000, 7)
    );
    let (v, _b) = reader.join().unwrap();
    assert!(v == data);
    let mut buf = [0u8; 5];
    let r = unsafe {
        exs_recv(
            a.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            5,
            EXS_MSG_SYNC | libc::MSG_WAITALL,
            q,
            null_mut(),
            EXS_MHANDLE_UNREGISTERED,
        )
    };
    assert_eq!(r, 5);
    assert_eq!(&buf, b"hello");
    assert_eq!(take(q, 1)[0].ev_type, EXS_EVT_RECV);
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn connect_accept_and_vectors() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let q = exs_qcreate(8);
    assert_eq!(exs_accept(l.as_raw_fd(), q, 1 as _), 0);
    let c = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(c >= 0);
    let std::net::SocketAddr::V4(v4) = addr else {
        panic!()
    };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as _,
        sin_port: v4.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*v4.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let r = unsafe {
        exs_connect(
            c,
            (&sin as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as _,
            q,
            2 as _,
        )
    };
    assert_eq!(r, 0);
    let evs = take(q, 2);
    let acc = evs.iter().find(|e| e.ev_type == EXS_EVT_ACCEPT).unwrap();
    let con = evs.iter().find(|e| e.ev_type == EXS_EVT_CONNECT).unwrap();
    assert_eq!((acc.ev_ahandle as usize, con.ev_ahandle as usize), (1, 2));
    assert_eq!((con.ev_result, con.ev_errno), (0, 0));
    let s = acc.ev_result as i32;
    assert!(s >= 0);
    assert_eq!(unsafe { acc.ev_u.accept.ac_fd }, s);
    assert_eq!(
        unsafe { acc.ev_u.accept.ac_addr.ss_family } as i32,
        libc::AF_INET
    );
    // sendv with three pieces (one registered) → recvv into two.
    let p1 = pattern(1000, 7);
    let p2 = pattern(70_000, 8);
    let p3 = pattern(5, 9);
    let mh = exs_mregister(p2.as_ptr() as *mut _, p2.len(), 0);
    let iov = [
        exs_iovec_t {
            iov_base: p1.as_ptr() as *mut _,
            iov_len: p1.len(),
            iov_mhandle: EXS_MHANDLE_UNREGISTERED,
        },
        exs_iovec_t {
            iov_base: p2.as_ptr() as *mut _,
            iov_len: p2.len(),
            iov_mhandle: mh,
        },
        exs_iovec_t {
            iov_base: p3.as_ptr() as *mut _,
            iov_len: p3.len(),
            iov_mhandle: EXS_MHANDLE_UNREGISTERED,
        },
    ];
    assert_eq!(
        unsafe { exs_sendv(c, iov.as_ptr(), 3, 0, q, null_mut()) },
        0
    );
    let mut r1 = vec![0u8; 30_000];
    let mut r2 = vec![0u8; 41_005];
    let riov = [
        exs_iovec_t {
            iov_base: r1.as_mut_ptr().cast(),
            iov_len: r1.len(),
            iov_mhandle: EXS_MHANDLE_UNREGISTERED,
        },
        exs_iovec_t {
            iov_base: r2.as_mut_ptr().cast(),
            iov_len: r2.len(),
            iov_mhandle: EXS_MHANDLE_UNREGISTERED,
        },
    ];
    assert_eq!(
        unsafe { exs_recvv(s, riov.as_ptr(), 2, libc::MSG_WAITALL, q, null_mut()) },
        0
    );
    let evs = take(q, 2);
    let sent = evs.iter().find(|e| e.ev_type == EXS_EVT_SENDMSG).unwrap();
    let rcvd = evs.iter().find(|e| e.ev_type == EXS_EVT_RECVMSG).unwrap();
    assert_eq!(sent.ev_result, 71_005);
    assert_eq!(rcvd.ev_result, 71_005);
    assert_eq!(unsafe { rcvd.ev_u.xfer.xf_iovcnt }, 2);
    let all: Vec<u8> = [p1, p2, p3].concat();
    let got: Vec<u8> = [r1, r2].concat();
    assert!(all == got);
    // Bad iovec counts.
    assert_eq!(
        (
            unsafe { exs_sendv(c, iov.as_ptr(), 0, 0, q, null_mut()) },
            errno()
        ),
        (-1, libc::EINVAL)
    );
    assert_eq!(
        (
            unsafe { exs_sendv(c, iov.as_ptr(), 65, 0, q, null_mut()) },
            errno()
        ),
        (-1, libc::EINVAL)
    );
    assert_eq!(exs_mderegister(mh), 0);
    unsafe {
        libc::close(c);
        libc::close(s);
    }
    assert_eq!(exs_qdelete(q), 0);
}

#[test]
fn connect_refused_is_an_error_event() {
    // A port with nobody listening: bind a listener, note its port, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let q = exs_qcreate(1);
    let c = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as _,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    let r = unsafe {
        exs_connect(
            c,
            (&sin as *const libc::sockaddr_in).cast(),
            size_of::<libc::sockaddr_in>() as _,
            q,
            null_mut(),
        )
    };
    assert_eq!(r, 0);
    let e = take(q, 1)[0];
    assert_eq!(
        (e.ev_type, e.ev_result, e.ev_errno),
        (EXS_EVT_CONNECT, -1, libc::ECONNREFUSED)
    );
    unsafe { libc::close(c) };
    assert_eq!(exs_qdelete(q), 0);
}
