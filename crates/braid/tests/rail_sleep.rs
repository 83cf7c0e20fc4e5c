//! Threads that block in `CompletionQueue::wait` sleep on the rails' sockets and read them
//! themselves (`CompletionQueue::arm`): messages, one-sided operations they are the target
//! of, completions pushed by other threads, and their own `poll(2)` sets.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use braid::{Access, CompletionKind, Status};
use common::{WAIT, expect_ok, pair, pattern};

/// Ping-pong of `rounds` messages, both sides blocking in `wait` with no spinning.
fn blocked_ping_pong(rounds: u64, sleep_on_rails: bool) {
    let p = pair(2);
    for cq in [&p.server_cq, &p.client_cq] {
        cq.set_spin(Duration::ZERO);
        cq.set_sleep_on_rails(sleep_on_rails);
    }
    let sbuf = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let cbuf = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    p.server
        .post_recv(0, &[sbuf.slice(0, 256).unwrap()])
        .unwrap();
    p.client
        .post_recv(0, &[cbuf.slice(0, 256).unwrap()])
        .unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            // The client's next message may come before the completion of our reply (the
            // peer's `Done` and its next send are not ordered across rails): counted apart.
            let (mut recvs, mut sends) = (0u64, 0u64);
            for i in 0..rounds {
                while recvs <= i {
                    let c = common::next(&p.server_cq);
                    assert_eq!(c.status, Status::Success, "{c:?}");
                    match c.wr_id {
                        0 => {
                            assert_eq!(c.kind, CompletionKind::Recv);
                            recvs += 1;
                        }
                        _ => sends += 1,
                    }
                }
                assert_eq!(sbuf.to_vec(0, 100).unwrap(), pattern(i, 100));
                p.server
                    .post_recv(0, &[sbuf.slice(0, 256).unwrap()])
                    .unwrap();
                sbuf.write_at(1024, &pattern(i + 1_000_000, 100)).unwrap();
                p.server.send(1, &[sbuf.slice(1024, 100).unwrap()]).unwrap();
            }
            while sends < rounds {
                expect_ok(&p.server_cq, 1);
                sends += 1;
            }
        });
        for i in 0..rounds {
            cbuf.write_at(1024, &pattern(i, 100)).unwrap();
            p.client.send(1, &[cbuf.slice(1024, 100).unwrap()]).unwrap();
            // The send's and the reply's completions, in either order.
            let mut got = [false; 2];
            while !(got[0] && got[1]) {
                let c = common::next(&p.client_cq);
                assert_eq!(c.status, Status::Success, "{c:?}");
                got[c.wr_id as usize] = true;
            }
            assert_eq!(cbuf.to_vec(0, 100).unwrap(), pattern(i + 1_000_000, 100));
            p.client
                .post_recv(0, &[cbuf.slice(0, 256).unwrap()])
                .unwrap();
        }
    });
}

#[test]
fn blocked_waiters_ping_pong_sleeping_on_the_rails() {
    blocked_ping_pong(2000, true);
}

#[test]
fn blocked_waiters_ping_pong_woken_by_the_engine() {
    blocked_ping_pong(500, false);
}

/// The target of one-sided writes has one thread, asleep in `wait` on its receive queue:
/// it places the writes itself, and its sender sees every write complete.
#[test]
fn writes_land_while_the_targets_only_thread_sleeps_on_the_rails() {
    let p = pair(4);
    p.server_cq.set_spin(Duration::ZERO);
    let target = p.server_ctx.alloc_region(4 << 20, Access::all()).unwrap();
    let rbuf = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(4 << 20, Access::all()).unwrap();
    p.server
        .post_recv(7, &[rbuf.slice(0, 64).unwrap()])
        .unwrap();
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            ready.wait();
            let c = expect_ok(&p.server_cq, 7);
            assert_eq!(c.byte_len, 8);
        });
        ready.wait();
        let data = pattern(42, 4 << 20);
        src.write_at(0, &data).unwrap();
        let rk = target.remote_key();
        for i in 0..64u64 {
            let off = i as usize * 65536;
            p.client
                .write(i, &[src.slice(off, 65536).unwrap()], &rk, off as u64)
                .unwrap();
        }
        for i in 0..64u64 {
            expect_ok(&p.client_cq, i);
        }
        p.client.send(100, &[src.slice(0, 8).unwrap()]).unwrap();
        expect_ok(&p.client_cq, 100);
        assert_eq!(target.to_vec(0, 4 << 20).unwrap(), data);
    });
}

/// The target's only thread waits in `wait` with its default spin: woken by a peer's read
/// or fetch-add, which completes nothing in its queue, it serves it and polls the rails
/// for the spin before sleeping again. Every operation is served in order, the message
/// at the end still completes its wait, and a wait with nothing coming still times out.
#[test]
fn reads_and_fetch_adds_are_served_by_a_waiting_target_thread_that_spins_after_each() {
    let p = pair(2);
    let target = p.server_ctx.alloc_region(1 << 16, Access::all()).unwrap();
    let rbuf = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let dst = p.client_ctx.alloc_region(1 << 16, Access::all()).unwrap();
    let data = pattern(11, 1 << 16);
    target.write_at(0, &data[..]).unwrap();
    target.write_at(0, &[0u8; 8]).unwrap();
    p.server
        .post_recv(5, &[rbuf.slice(0, 64).unwrap()])
        .unwrap();
    let ready = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            ready.wait();
            let c = expect_ok(&p.server_cq, 5);
            assert_eq!(c.byte_len, 8);
            let t = Instant::now();
            assert!(p.server_cq.wait(Duration::from_millis(50)).is_none());
            assert!(t.elapsed() >= Duration::from_millis(50));
        });
        ready.wait();
        let rk = target.remote_key();
        for i in 0..300u64 {
            if i % 2 == 0 {
                let off = 4096 + (i as usize % 15) * 4096;
                p.client
                    .read(i, &[dst.slice(off, 4096).unwrap()], &rk, off as u64)
                    .unwrap();
                expect_ok(&p.client_cq, i);
                assert_eq!(dst.to_vec(off, 4096).unwrap(), data[off..off + 4096]);
            } else {
                p.client.fetch_add(i, &rk, 0, 1).unwrap();
                let c = expect_ok(&p.client_cq, i);
                assert_eq!(c.kind, CompletionKind::FetchAdd);
                assert_eq!(c.value, Some(i / 2));
            }
        }
        p.client.send(300, &[dst.slice(0, 8).unwrap()]).unwrap();
        expect_ok(&p.client_cq, 300);
    });
    assert_eq!(target.atomic_u64(0).unwrap().load(Ordering::SeqCst), 150);
}

/// An armed queue's descriptor, in the caller's own `poll(2)` set, becomes readable when a
/// message arrives; polling the queue then finds it.
#[test]
fn an_armed_queues_descriptor_wakes_a_poll_set() {
    let p = pair(2);
    let rbuf = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    p.server
        .post_recv(9, &[rbuf.slice(0, 64).unwrap()])
        .unwrap();
    let first_armed = Barrier::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            let deadline = Instant::now() + WAIT;
            let mut first = true;
            loop {
                let armed = p.server_cq.arm().expect("the queue has an endpoint");
                if first {
                    assert!(p.server_cq.arm().is_none(), "one thread at a time");
                    first_armed.wait();
                    first = false;
                }
                if p.server_cq.is_empty() {
                    let mut fds = [libc::pollfd {
                        fd: armed.as_fd().as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    }];
                    let left = deadline.saturating_duration_since(Instant::now());
                    assert!(!left.is_zero(), "the descriptor never became readable");
                    // SAFETY: one valid pollfd entry.
                    unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis() as i32 + 1) };
                }
                drop(armed);
                // Woken by bytes that were not a whole message yet: arm again.
                if let Some(c) = p.server_cq.poll() {
                    assert_eq!((c.wr_id, c.status), (9, Status::Success));
                    return;
                }
            }
        });
        first_armed.wait();
        src.write_at(0, &pattern(3, 64)).unwrap();
        p.client.send(1, &[src.slice(0, 64).unwrap()]).unwrap();
        expect_ok(&p.client_cq, 1);
    });
    assert_eq!(rbuf.to_vec(0, 64).unwrap(), pattern(3, 64));
}

/// Two threads block on one queue (one sleeps on the rails, the other on the queue's
/// condition variable): every message is received exactly once.
#[test]
fn two_waiters_on_one_queue_receive_every_message_once() {
    waiters_receive_every_message_once(2);
}

/// As a server's worker pool waits: one waiter sleeps on the rails and takes what it reads
/// itself, the others sleep on the queue and are woken only for what it leaves.
#[test]
fn four_waiters_on_one_queue_receive_every_message_once() {
    waiters_receive_every_message_once(4);
}

fn waiters_receive_every_message_once(waiters: usize) {
    const N: u64 = 1000;
    const SLOTS: u64 = 16;
    let p = pair(2);
    p.server_cq.set_spin(Duration::ZERO);
    let rbuf = p
        .server_ctx
        .alloc_region(SLOTS as usize * 64, Access::all())
        .unwrap();
    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    for slot in 0..SLOTS {
        p.server
            .post_recv(slot, &[rbuf.slice(slot as usize * 64, 64).unwrap()])
            .unwrap();
    }
    let seen = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    let received = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..waiters {
            s.spawn(|| {
                let start = Instant::now();
                while received.load(Ordering::Acquire) < N {
                    assert!(start.elapsed() < WAIT * 4, "messages missing");
                    let Some(c) = p.server_cq.wait(Duration::from_millis(50)) else {
                        continue;
                    };
                    assert_eq!(c.status, Status::Success, "{c:?}");
                    let slot = c.wr_id as usize;
                    let msg = rbuf.to_vec(slot * 64, 8).unwrap();
                    let n = u64::from_le_bytes(msg.try_into().unwrap());
                    seen[n as usize].fetch_add(1, Ordering::AcqRel);
                    p.server
                        .post_recv(c.wr_id, &[rbuf.slice(slot * 64, 64).unwrap()])
                        .unwrap();
                    received.fetch_add(1, Ordering::AcqRel);
                }
            });
        }
        // At most SLOTS messages in flight; one that finds no receive posted yet waits
        // for the repost.
        let mut done = 0u64;
        for n in 0..N {
            while n - done >= SLOTS {
                expect_ok(&p.client_cq, done);
                done += 1;
            }
            src.write_at(n as usize % 64 * 64, &n.to_le_bytes())
                .unwrap();
            p.client
                .send(n, &[src.slice(n as usize % 64 * 64, 8).unwrap()])
                .unwrap();
        }
        while done < N {
            expect_ok(&p.client_cq, done);
            done += 1;
        }
    });
    for (n, c) in seen.iter().enumerate() {
        assert_eq!(c.load(Ordering::Acquire), 1, "message {n}");
    }
}

/// Endpoints made one after another on one completion queue, each dropped before the next:
/// a new endpoint's socket may get a closed one's descriptor number, and the thread that
/// sleeps on the queue's rails must still hear it (it once kept the old registration, which
/// the kernel had dropped, and slept through the new endpoint's replies).
#[test]
fn a_new_endpoint_under_a_reused_descriptor_still_wakes_the_sleeping_thread() {
    use braid::{Context, EndpointOptions, RailAddr, RailTransport};
    let server = Context::new().unwrap();
    let scq = server.create_cq(64);
    let listener = server.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = listener.local_addrs()[0];
    let target = server.alloc_region(1 << 20, Access::all()).unwrap();
    let key = target.remote_key();
    const ENDPOINTS: usize = 6;
    let sopts = EndpointOptions::new(&scq);
    let acceptor = std::thread::spawn(move || {
        (0..ENDPOINTS)
            .map(|_| listener.accept(&sopts, WAIT).unwrap())
            .collect::<Vec<_>>()
    });
    let client = Context::new().unwrap();
    let cq = client.create_cq(64);
    cq.set_spin(Duration::ZERO);
    cq.set_sleep_on_rails(true);
    let src = client.alloc_region(1 << 20, Access::all()).unwrap();
    for i in 0..ENDPOINTS {
        let mut opts = EndpointOptions::new(&cq);
        opts.transport = if i % 2 == 0 {
            RailTransport::Auto
        } else {
            RailTransport::Tcp
        };
        let ep = client.connect(&[RailAddr::new(None, addr)], &opts).unwrap();
        ep.write(i as u64, &[src.as_sge()], &key, 0).unwrap();
        let c = cq.wait(WAIT).expect("the write completes");
        assert_eq!(c.status, Status::Success, "endpoint {i}: {c:?}");
        drop(ep);
    }
    acceptor.join().unwrap();
}
