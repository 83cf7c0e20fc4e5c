//! The Rust API against plain std sockets on loopback.

mod common;

use std::io::{Read, Write};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::*;
use exs::{Buffer, EventKind, Flags, Queue, Registration};

const T: Option<Duration> = Some(Duration::from_secs(20));

#[test]
fn round_trip_registered_and_plain() {
    let (a, mut b) = pair();
    let q = Queue::new(8).unwrap();
    let data = pattern(1 << 20, 11);
    let mut reg = Registration::zeroed(1 << 20).unwrap();
    reg.as_mut_slice().copy_from_slice(&data);
    // First half from the registration, second half from a plain Vec.
    q.send(&a, Buffer::registered(reg, 0..(1 << 19)), 1)
        .unwrap();
    q.send(&a, data[1 << 19..].to_vec(), 2).unwrap();
    let mut got = vec![0u8; 1 << 20];
    b.read_exact(&mut got).unwrap();
    assert!(got == data);
    let evs = q.dequeue_exact(2, T).unwrap();
    assert_eq!(evs.len(), 2);
    assert_eq!((evs[0].user(), evs[0].kind()), (1, EventKind::Send));
    assert_eq!(evs[0].result().unwrap(), 1 << 19);
    let reg = evs
        .into_iter()
        .next()
        .unwrap()
        .into_buffer()
        .unwrap()
        .into_registration()
        .unwrap();
    assert_eq!(reg.as_slice(), &data[..]);

    // Back: plain write → exs recv into the registration with WAITALL.
    b.write_all(&data[..4096]).unwrap();
    q.recv_with(&a, Buffer::registered(reg, 100..4196), Flags::WAITALL, 3)
        .unwrap();
    let e = q.dequeue_one(T).unwrap().unwrap();
    assert_eq!(
        (e.kind(), e.user(), e.result().unwrap()),
        (EventKind::Recv, 3, 4096)
    );
    let buf = e.into_buffer().unwrap();
    assert_eq!(&buf.as_slice()[100..4196], &data[..4096]);
}

#[test]
fn eagain_returns_the_buffer() {
    let (a, b) = pair();
    let q = Queue::new(1).unwrap();
    q.send(&a, vec![1u8; 10], 0).unwrap();
    let r = q.send(&a, vec![2u8; 20], 0).unwrap_err();
    assert!(r.is_would_block());
    assert_eq!(r.buffer.into_vec().unwrap(), vec![2u8; 20]);
    assert_eq!(q.dequeue(4, T).unwrap().len(), 1);
    drop(b);
}

#[test]
fn out_of_range_registration_is_refused() {
    let (a, _b) = pair();
    let q = Queue::new(2).unwrap();
    let reg = Registration::zeroed(100).unwrap();
    let r = q.send(&a, Buffer::registered(reg, 50..101), 0).unwrap_err();
    assert_eq!(r.error.raw_os_error(), Some(libc::EINVAL));
    let reg = r.buffer.into_registration().unwrap();
    // The same registration is fine in range; and deregisters on drop afterwards.
    q.send(&a, Buffer::registered(reg, 50..100), 0).unwrap();
    assert_eq!(q.dequeue_one(T).unwrap().unwrap().result().unwrap(), 50);
    assert!(Registration::new(Vec::new()).is_err());
}

#[test]
fn closed_peer_recv_is_zero() {
    let (a, b) = pair();
    let q = Queue::new(2).unwrap();
    q.recv(&a, vec![0u8; 100], 9).unwrap();
    drop(b);
    let e = q.dequeue_one(T).unwrap().unwrap();
    assert_eq!(e.result().unwrap(), 0);
}

#[test]
fn dequeue_timeout_and_zero() {
    let q = Queue::new(2).unwrap();
    assert!(q.dequeue(0, None).unwrap().is_empty());
    let t0 = Instant::now();
    assert!(
        q.dequeue(2, Some(Duration::from_millis(50)))
            .unwrap()
            .is_empty()
    );
    assert!(t0.elapsed() >= Duration::from_millis(45));
    assert_eq!(
        q.dequeue_exact(3, T).unwrap_err().raw_os_error(),
        Some(libc::EINVAL)
    );
}

struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal executor: enough to show `next_event` needs no particular runtime.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(Instant::now() < deadline, "future did not complete");
        std::thread::park_timeout(Duration::from_millis(100));
    }
}

#[test]
fn async_next_event() {
    let (a, mut b) = pair();
    let q = Queue::new(4).unwrap();
    q.recv(&a, vec![0u8; 16], 5).unwrap();
    let w = std::thread::spawn(move || {
        b.write_all(b"async!").unwrap();
        b
    });
    let e = block_on(q.next_event()).unwrap();
    assert_eq!((e.user(), e.result().unwrap()), (5, 6));
    assert_eq!(&e.into_buffer().unwrap().as_slice()[..6], b"async!");
    drop(w.join().unwrap());
}

#[test]
fn sync_flag_in_rust() {
    let (a, mut b) = pair();
    let q = Queue::new(2).unwrap();
    q.send_with(&a, vec![3u8; 1000], Flags::SYNC, 1).unwrap();
    let mut v = vec![0u8; 1000];
    b.read_exact(&mut v).unwrap();
    // Completed before send_with returned: the event is already there.
    let e = q.dequeue(1, Some(Duration::ZERO)).unwrap();
    assert_eq!(e.len(), 1);
    assert_eq!(e[0].result().unwrap(), 1000);
}

#[test]
fn dropping_a_queue_with_work_in_flight_is_safe() {
    let (a, b) = pair();
    let q = Queue::new(2).unwrap();
    q.recv(&a, vec![0u8; 100], 0).unwrap();
    drop(q);
    drop(b); // completes the recv; its event (and buffer) are discarded
    // The library still works.
    let q = Queue::new(1).unwrap();
    let (c, _d) = pair();
    q.send(&c, vec![1u8; 3], 0).unwrap();
    assert_eq!(q.dequeue_one(T).unwrap().unwrap().result().unwrap(), 3);
}

/// Sends queued behind a busy one go to the kernel together (one sendmsg per batch), mixing
/// registered and plain buffers of uneven sizes behind a small send buffer and a reader of
/// small pieces: every op completes in order with its full length and the stream is intact.
/// (A 4 KiB send buffer works too, but large writes into one stall for seconds on loopback,
/// with or without batching.)
#[test]
fn queued_sends_keep_order_and_lengths() {
    use std::os::fd::AsRawFd;
    let (a, mut b) = pair();
    let sz: libc::c_int = 65536;
    // SAFETY: valid option pointer and length.
    let r = unsafe {
        libc::setsockopt(
            a.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&sz as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    let n = 200usize;
    let sizes: Vec<usize> = (0..n).map(|i| 1 + (i * 7919) % 70_000).collect();
    let total: usize = sizes.iter().sum();
    let data = pattern(total, 5);
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; total];
        let mut off = 0;
        while off < total {
            // Small reads keep the sender's batches short.
            let end = (off + 3000).min(total);
            let k = b.read(&mut got[off..end]).unwrap();
            assert!(k > 0, "early EOF");
            off += k;
        }
        got
    });
    let q = Queue::new(n).unwrap();
    let mut off = 0;
    for (i, &s) in sizes.iter().enumerate() {
        let chunk = data[off..off + s].to_vec();
        if i % 3 == 0 {
            let mut reg = Registration::zeroed(s).unwrap();
            reg.as_mut_slice().copy_from_slice(&chunk);
            q.send(&a, Buffer::registered(reg, 0..s), i as u64).unwrap();
        } else {
            q.send(&a, chunk, i as u64).unwrap();
        }
        off += s;
    }
    let evs = q.dequeue_exact(n, T).unwrap();
    assert_eq!(evs.len(), n);
    for (i, e) in evs.iter().enumerate() {
        assert_eq!((e.kind(), e.user()), (EventKind::Send, i as u64));
        assert_eq!(e.result().unwrap(), sizes[i]);
    }
    assert!(reader.join().unwrap() == data);
}

/// When the peer goes away under a batch (here: mid-stream, with data unread, so it resets
/// the connection), the op the error hits fails; the ops behind it still get one event
/// each, in order, and no op succeeds after a failed one. The bytes that did arrive are the
/// stream's prefix. (This is also where a batch typically comes back short and its
/// remainder is resubmitted.)
#[test]
fn queued_sends_after_reset_fail_in_order() {
    let (a, mut b) = pair();
    // More than loopback's socket buffers hold, so the reset finds sends queued.
    let n = 200usize;
    let data = pattern(n * 65536, 9);
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; 300_000];
        b.read_exact(&mut got).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        got // dropping `b` with unread data resets the connection
    });
    let q = Queue::new(n).unwrap();
    for i in 0..n {
        q.send(&a, data[i * 65536..(i + 1) * 65536].to_vec(), i as u64)
            .unwrap();
    }
    let got = reader.join().unwrap();
    assert!(got[..] == data[..got.len()]);
    let evs = q.dequeue_exact(n, T).unwrap();
    assert_eq!(evs.len(), n);
    let mut failed = false;
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e.user(), i as u64);
        match e.result() {
            Ok(k) => {
                assert!(!failed, "op {i} succeeded after a failure");
                assert_eq!(k, 65536);
            }
            Err(_) => failed = true,
        }
    }
    assert!(failed);
}

/// The ES-API stream pattern of the benchmarks: 16 sends of 64 KiB outstanding, the sender
/// reaping at least half of them at a time and reposting each buffer with the next piece
/// of the stream. Sends queued behind a finished batch are held back for the reposts of the
/// woken sender (so both go as one batch); every byte must still arrive, in order, and every
/// event come back with its full length.
#[test]
fn reap_half_and_repost_keeps_the_stream_intact() {
    let (a, mut b) = pair();
    const PIECE: usize = 65536;
    const DEPTH: usize = 16;
    let pieces = 600usize;
    let data = Arc::new(pattern(pieces * PIECE, 21));
    let want = data.clone();
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; want.len()];
        b.read_exact(&mut got).unwrap();
        got == *want
    });
    let q = Queue::new(DEPTH).unwrap();
    let (mut next, mut inflight, mut done) = (0usize, 0usize, 0usize);
    let mut free: Vec<Vec<u8>> = (0..DEPTH).map(|_| vec![0u8; PIECE]).collect();
    while done < pieces {
        while next < pieces {
            let Some(mut buf) = free.pop() else { break };
            buf.copy_from_slice(&data[next * PIECE..(next + 1) * PIECE]);
            q.send(&a, buf, next as u64).unwrap();
            next += 1;
            inflight += 1;
        }
        let evs = q.dequeue_exact((inflight / 2).max(1), T).unwrap();
        assert!(!evs.is_empty(), "send events did not arrive");
        for e in evs {
            assert_eq!(e.user(), done as u64, "events in order");
            assert_eq!(e.result().unwrap(), PIECE);
            done += 1;
            inflight -= 1;
            free.push(e.into_buffer().unwrap().into_vec().unwrap());
        }
    }
    assert!(reader.join().unwrap(), "the stream arrived intact");
}

/// A sender that is woken by a send's event and then does not send again (nor wait on its
/// queue) must not leave the sends queued behind it held back: they go when the hold's
/// time is up. The reader, not the sender, proves it here.
#[test]
fn held_sends_go_without_reposts() {
    use std::sync::mpsc;
    let (a, mut b) = pair();
    // The first send is larger than loopback buffers before the reader reads, so it is
    // still in the kernel when the sender waits for it; three short ones queue behind it.
    const FIRST: usize = 8 << 20;
    const PIECE: usize = 65536;
    let data = Arc::new(pattern(FIRST + 3 * PIECE, 23));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (got_tx, got_rx) = mpsc::channel::<bool>();
    let want = data.clone();
    let reader = std::thread::spawn(move || {
        go_rx.recv().unwrap();
        let mut got = vec![0u8; want.len()];
        b.read_exact(&mut got).unwrap();
        got_tx.send(got == *want).unwrap();
        b
    });
    let q = Queue::new(4).unwrap();
    q.send(&a, data[..FIRST].to_vec(), 0).unwrap();
    for i in 0..3 {
        let at = FIRST + i * PIECE;
        q.send(&a, data[at..at + PIECE].to_vec(), i as u64 + 1)
            .unwrap();
    }
    go_tx.send(()).unwrap();
    let first = q.dequeue_exact(1, T).unwrap();
    assert_eq!((first.len(), first[0].result().unwrap()), (1, FIRST));
    // No dequeue and no send from here until the reader has everything.
    let intact = got_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("held sends were never started");
    assert!(intact);
    let rest = q.dequeue_exact(3, T).unwrap();
    assert_eq!(rest.len(), 3);
    drop(reader.join().unwrap());
}
