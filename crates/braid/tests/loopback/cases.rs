//! The engine on real sockets over loopback, with 1 and 4 rails: the cases, run once per
//! transport (`loopback.rs`: same-host rings, `loopback_tcp.rs`: TCP).

use braid::{Access, CompletionKind, Status};

use super::{pair, pair_with};
use crate::common::*;

fn write_read_sizes(rails: usize) {
    let p = pair(rails);
    const MAX: usize = 64 << 20;
    let target = p
        .server_ctx
        .alloc_region(MAX + 4096, Access::all())
        .unwrap();
    let src = p.client_ctx.alloc_region(MAX, Access::all()).unwrap();
    let back = p.client_ctx.alloc_region(MAX, Access::all()).unwrap();
    let key = target.remote_key();
    let mut sizes = vec![1usize, 7, 64, 4095, 65_536, 1 << 20, (4 << 20) + 3, MAX];
    sizes.dedup();
    for (i, &size) in sizes.iter().enumerate() {
        let data = pattern(i as u64, size);
        src.write_at(0, &data).unwrap();
        let off = ((i * 7919) % 4096) as u64;
        p.client
            .write(10 + i as u64, &[src.slice(0, size).unwrap()], &key, off)
            .unwrap();
        expect_ok(&p.client_cq, 10 + i as u64);
        assert!(
            target.to_vec(off as usize, size).unwrap() == data,
            "write of {size} bytes over {rails} rails"
        );
        back.fill(0, size, 0).unwrap();
        p.client
            .read(100 + i as u64, &[back.slice(0, size).unwrap()], &key, off)
            .unwrap();
        let c = expect_ok(&p.client_cq, 100 + i as u64);
        assert_eq!(c.kind, CompletionKind::Read);
        assert_eq!(c.byte_len, size as u64);
        assert!(
            back.to_vec(0, size).unwrap() == data,
            "read of {size} bytes over {rails} rails"
        );
    }
    if rails > 1 {
        let sent = p.client.rail_bytes_sent();
        assert!(
            sent.iter().all(|&b| b > 0),
            "every rail carried data: {sent:?}"
        );
    }
}

#[test]
fn write_read_one_rail() {
    write_read_sizes(1);
}

#[test]
fn write_read_four_rails() {
    write_read_sizes(4);
}

#[test]
fn access_violations_leave_memory_unchanged() {
    let p = pair(2);
    let target = p.server_ctx.alloc_region(8192, Access::all()).unwrap();
    let readonly = p
        .server_ctx
        .alloc_region(8192, Access::REMOTE_READ)
        .unwrap();
    target.fill(0, 8192, 0xAA).unwrap();
    readonly.fill(0, 8192, 0xAA).unwrap();
    let src = p.client_ctx.alloc_region(8192, Access::all()).unwrap();
    src.fill(0, 8192, 0x55).unwrap();
    let key = target.remote_key();
    let wrong = braid::RemoteKey {
        key: key.key ^ 0x1_0000,
        len: key.len,
    };
    // Wrong key.
    p.client
        .write(1, &[src.slice(0, 100).unwrap()], &wrong, 0)
        .unwrap();
    // Outside the range.
    p.client
        .write(2, &[src.slice(0, 200).unwrap()], &key, 8100)
        .unwrap();
    // Missing right.
    p.client
        .write(3, &[src.slice(0, 10).unwrap()], &readonly.remote_key(), 0)
        .unwrap();
    p.client.fetch_add(4, &readonly.remote_key(), 0, 1).unwrap();
    // A good write afterwards still works.
    p.client
        .write(5, &[src.slice(0, 10).unwrap()], &key, 0)
        .unwrap();
    for id in 1..=4 {
        let c = next(&p.client_cq);
        assert_eq!(c.wr_id, id);
        assert_eq!(c.status, Status::RemoteAccessError, "{c:?}");
    }
    expect_ok(&p.client_cq, 5);
    assert_eq!(target.to_vec(0, 10).unwrap(), vec![0x55; 10]);
    assert_eq!(target.to_vec(10, 8182).unwrap(), vec![0xAA; 8182]);
    assert_eq!(readonly.to_vec(0, 8192).unwrap(), vec![0xAA; 8192]);
    // Deregistered region.
    let rk = readonly.remote_key();
    readonly.deregister(WAIT).unwrap();
    p.client
        .read(6, &[src.slice(0, 8).unwrap()], &rk, 0)
        .unwrap();
    let c = next(&p.client_cq);
    assert_eq!((c.wr_id, c.status), (6, Status::RemoteAccessError));
}

#[test]
fn send_recv_and_imm_in_order() {
    let p = pair(4);
    let rbuf = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let target = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    for i in 0..8u64 {
        p.server
            .post_recv(1000 + i, &[rbuf.slice(i as usize * 65536, 65536).unwrap()])
            .unwrap();
    }
    for i in 0..8u64 {
        let data = pattern(i, 1000 + i as usize);
        src.write_at(i as usize * 65536, &data).unwrap();
        if i % 2 == 0 {
            p.client
                .send(i, &[src.slice(i as usize * 65536, data.len()).unwrap()])
                .unwrap();
        } else {
            p.client
                .write_with_imm(
                    i,
                    &[src.slice(i as usize * 65536, data.len()).unwrap()],
                    &target.remote_key(),
                    i * 65536,
                    i as u32,
                )
                .unwrap();
        }
    }
    for i in 0..8u64 {
        expect_ok(&p.client_cq, i);
        let c = expect_ok(&p.server_cq, 1000 + i);
        let data = pattern(i, 1000 + i as usize);
        assert_eq!(c.byte_len, data.len() as u64);
        if i % 2 == 0 {
            assert_eq!(c.kind, CompletionKind::Recv);
            assert_eq!(rbuf.to_vec(i as usize * 65536, data.len()).unwrap(), data);
        } else {
            assert_eq!(c.kind, CompletionKind::RecvWriteImm);
            assert_eq!(c.imm, Some(i as u32));
            assert_eq!(target.to_vec(i as usize * 65536, data.len()).unwrap(), data);
        }
    }
}

#[test]
fn atomics_from_threads_and_endpoints_sum_exactly() {
    use braid::{Context, EndpointOptions, RailAddr};
    use std::net::SocketAddr;
    // One server region, three client endpoints (each its own context, as three processes
    // would have), two threads per endpoint, plus the server's own local atomic adds.
    let server = Context::new().unwrap();
    let counter = server.alloc_region(4096, Access::all()).unwrap();
    let key = counter.remote_key();
    let addrs: Vec<SocketAddr> = (0..2).map(|i| SocketAddr::new(rail_ip(i), 0)).collect();
    let listener = server.listen(&addrs).unwrap();
    let rails: Vec<RailAddr> = listener
        .local_addrs()
        .iter()
        .enumerate()
        .map(|(i, a)| RailAddr::new(Some(rail_ip(i)), *a))
        .collect();
    let scq = server.create_cq(64);
    const ENDPOINTS: usize = 3;
    const THREADS: u64 = 2;
    const PER: u64 = 400;
    let clients: Vec<_> = (0..ENDPOINTS)
        .map(|_| {
            let ctx = Context::new().unwrap();
            let cq = ctx.create_cq(4096);
            let rails = rails.clone();
            let opts = EndpointOptions::new(&cq);
            let h = std::thread::spawn(move || ctx.connect(&rails, &opts).map(|ep| (ctx, ep)));
            (h, cq)
        })
        .collect();
    let _server_eps: Vec<_> = (0..ENDPOINTS)
        .map(|_| listener.accept(&EndpointOptions::new(&scq), WAIT).unwrap())
        .collect();
    let clients: Vec<_> = clients
        .into_iter()
        .map(|(h, cq)| (h.join().unwrap().unwrap(), cq))
        .collect();
    std::thread::scope(|s| {
        for (e, ((_, ep), _)) in clients.iter().enumerate() {
            for t in 0..THREADS {
                s.spawn(move || {
                    for i in 0..PER {
                        let wr = ((e as u64 * THREADS + t) * PER) + i;
                        loop {
                            match ep.fetch_add(wr, &key, 0, 1) {
                                Ok(()) => break,
                                Err(braid::Error::QueueFull { .. }) => std::thread::yield_now(),
                                Err(err) => panic!("{err}"),
                            }
                        }
                    }
                });
            }
        }
        s.spawn(|| {
            for _ in 0..PER {
                counter
                    .atomic_u64(0)
                    .unwrap()
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        });
    });
    let mut olds = Vec::new();
    for (_, cq) in &clients {
        for _ in 0..THREADS * PER {
            let c = next(cq);
            assert_eq!(c.status, Status::Success);
            olds.push(c.value.unwrap());
        }
    }
    // Every remote add saw a distinct old value: none was lost or applied twice.
    olds.sort_unstable();
    olds.dedup();
    assert_eq!(olds.len() as u64, ENDPOINTS as u64 * THREADS * PER);
    let total = counter
        .atomic_u64(0)
        .unwrap()
        .load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(total, (ENDPOINTS as u64 * THREADS + 1) * PER);
}

/// Threads posting large writes on one endpoint at once: a flush that finds a rail's
/// transmit lock held leaves its frames to the thread holding it, so threads write
/// different rails side by side. Every byte must still land in its slot, every write
/// complete once.
#[test]
fn large_writes_posted_from_several_threads_all_arrive() {
    const THREADS: usize = 3;
    const PER: usize = 6;
    const SIZE: usize = (1 << 20) + 13;
    const SLOTS: usize = THREADS * PER;
    let p = pair(4);
    let target = p
        .server_ctx
        .alloc_region(SLOTS * SIZE, Access::all())
        .unwrap();
    let src = p
        .client_ctx
        .alloc_region(SLOTS * SIZE, Access::all())
        .unwrap();
    for slot in 0..SLOTS {
        src.write_at(slot * SIZE, &pattern(slot as u64, SIZE))
            .unwrap();
    }
    let key = target.remote_key();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (ep, src, key) = (&p.client, &src, &key);
            s.spawn(move || {
                for slot in t * PER..(t + 1) * PER {
                    let piece = src.slice(slot * SIZE, SIZE).unwrap();
                    loop {
                        match ep.write(
                            slot as u64,
                            std::slice::from_ref(&piece),
                            key,
                            (slot * SIZE) as u64,
                        ) {
                            Ok(()) => break,
                            Err(braid::Error::QueueFull { .. }) => std::thread::yield_now(),
                            Err(err) => panic!("{err}"),
                        }
                    }
                }
            });
        }
    });
    let mut done = [false; SLOTS];
    for _ in 0..SLOTS {
        let c = next(&p.client_cq);
        assert_eq!(c.status, Status::Success, "{c:?}");
        let slot = c.wr_id as usize;
        assert!(
            !std::mem::replace(&mut done[slot], true),
            "completed twice: {c:?}"
        );
    }
    for slot in 0..SLOTS {
        assert!(
            target.to_vec(slot * SIZE, SIZE).unwrap() == pattern(slot as u64, SIZE),
            "slot {slot}"
        );
    }
}

#[test]
fn caller_registered_memory_is_reachable_and_released() {
    let p = pair(1);
    let mut backing = vec![0u8; 1 << 20];
    // SAFETY: `backing` outlives the region: the region is dropped below, before it.
    let r = unsafe {
        p.server_ctx
            .register(backing.as_mut_ptr(), backing.len(), Access::all())
    }
    .unwrap();
    let src = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let data = pattern(5, 1 << 20);
    src.write_at(0, &data).unwrap();
    p.client
        .write(1, &[src.as_sge()], &r.remote_key(), 0)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    let key = r.remote_key();
    drop(r);
    assert!(backing == data, "the write landed in the caller's memory");
    // The registration is gone: a late write is refused and the memory is untouched.
    backing.fill(0);
    p.client.write(2, &[src.as_sge()], &key, 0).unwrap();
    assert_eq!(next(&p.client_cq).status, Status::RemoteAccessError);
    assert!(backing.iter().all(|b| *b == 0));
}

#[test]
fn compare_swap_and_read_after_write() {
    let p = pair(4);
    let r = p.server_ctx.alloc_region(16 << 20, Access::all()).unwrap();
    let key = r.remote_key();
    let src = p.client_ctx.alloc_region(16 << 20, Access::all()).unwrap();
    let dst = p.client_ctx.alloc_region(16 << 20, Access::all()).unwrap();
    let data = pattern(77, 16 << 20);
    src.write_at(0, &data).unwrap();
    // Post the write and the read back-to-back: the read must see the whole write.
    p.client.write(1, &[src.as_sge()], &key, 0).unwrap();
    p.client.read(2, &[dst.as_sge()], &key, 0).unwrap();
    p.client
        .compare_swap(
            3,
            &key,
            8,
            u64::from_le_bytes(data[8..16].try_into().unwrap()),
            42,
        )
        .unwrap();
    p.client.compare_swap(4, &key, 8, 7, 99).unwrap();
    expect_ok(&p.client_cq, 1);
    expect_ok(&p.client_cq, 2);
    assert!(dst.to_vec(0, 16 << 20).unwrap() == data);
    let c = expect_ok(&p.client_cq, 3);
    assert_eq!(
        c.value,
        Some(u64::from_le_bytes(data[8..16].try_into().unwrap()))
    );
    let c = expect_ok(&p.client_cq, 4);
    assert_eq!(c.value, Some(42));
    assert_eq!(r.to_vec(8, 8).unwrap(), 42u64.to_le_bytes());
}

#[test]
fn scatter_gather_write_read_send() {
    let p = pair(2);
    let target = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let a = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let b = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let da = pattern(1, 300_000);
    let db = pattern(2, 500_001);
    a.write_at(5, &da).unwrap();
    b.write_at(11, &db).unwrap();
    let gather = [
        a.slice(5, da.len()).unwrap(),
        b.slice(11, db.len()).unwrap(),
    ];
    p.client
        .write(1, &gather, &target.remote_key(), 100)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    let mut want = da.clone();
    want.extend_from_slice(&db);
    assert!(target.to_vec(100, want.len()).unwrap() == want);
    // Scatter the read back into three pieces.
    let x = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let scatter = [
        x.slice(0, 1).unwrap(),
        x.slice(1000, 400_000).unwrap(),
        x.slice(500_000, want.len() - 400_001).unwrap(),
    ];
    p.client
        .read(2, &scatter, &target.remote_key(), 100)
        .unwrap();
    expect_ok(&p.client_cq, 2);
    assert_eq!(x.to_vec(0, 1).unwrap(), want[..1]);
    assert!(x.to_vec(1000, 400_000).unwrap() == want[1..400_001]);
    assert!(x.to_vec(500_000, want.len() - 400_001).unwrap() == want[400_001..]);
    // Send gathered into a scattered receive.
    let r = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    p.server
        .post_recv(
            9,
            &[r.slice(0, 10).unwrap(), r.slice(4096, 900_000).unwrap()],
        )
        .unwrap();
    p.client.send(3, &gather).unwrap();
    expect_ok(&p.client_cq, 3);
    let c = expect_ok(&p.server_cq, 9);
    assert_eq!(c.byte_len, want.len() as u64);
    assert_eq!(r.to_vec(0, 10).unwrap(), want[..10]);
    assert!(r.to_vec(4096, want.len() - 10).unwrap() == want[10..]);
}

#[test]
fn send_longer_than_receive_fails_both_sides() {
    let p = pair(1);
    let r = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let s = p.client_ctx.alloc_region(8192, Access::all()).unwrap();
    p.server.post_recv(1, &[r.slice(0, 100).unwrap()]).unwrap();
    p.client.send(2, &[s.slice(0, 101).unwrap()]).unwrap();
    let c = next(&p.client_cq);
    assert_eq!((c.wr_id, c.status), (2, Status::RemoteInvalidRequest));
    let c = next(&p.server_cq);
    assert_eq!((c.wr_id, c.status), (1, Status::LocalLengthError));
}

#[test]
fn close_flushes_and_peer_sees_transport_error() {
    let p = pair(2);
    let r = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    p.server.post_recv(1, &[r.as_sge()]).unwrap();
    p.server.post_recv(2, &[r.as_sge()]).unwrap();
    let cr = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    p.client.post_recv(7, &[cr.as_sge()]).unwrap();
    p.server.close();
    for id in [1, 2] {
        let c = next(&p.server_cq);
        assert_eq!((c.wr_id, c.status), (id, Status::Flushed));
    }
    assert!(p.server.post_recv(3, &[r.as_sge()]).is_err());
    // The client learns of the close and flushes its receive with an error.
    let c = next(&p.client_cq);
    assert_eq!(c.wr_id, 7);
    assert_ne!(c.status, Status::Success);
    assert!(
        p.client
            .write(8, &[cr.as_sge()], &r.remote_key(), 0)
            .is_err()
            || {
                let c = next(&p.client_cq);
                c.status != Status::Success
            }
    );
}

/// A small payload read exactly (no room for the next header behind it) says nothing about
/// whether more is queued. The engine used to take it for "socket empty" and waited for an
/// edge that never came when the peer had nothing more to send: the atomic behind a bulk
/// write and a small send sat unread until a keepalive (here: never) woke the rail.
#[test]
fn frames_queued_behind_a_small_payload_are_read_without_new_arrivals() {
    let p = pair_with(1, |o| {
        o.session.keepalive_interval = std::time::Duration::from_secs(3600);
        o.session.peer_timeout = std::time::Duration::from_secs(3600);
    });
    let target = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    src.write_at(0, &pattern(7, 1 << 20)).unwrap();
    let key = target.remote_key();
    for round in 0..24u64 {
        p.server.post_recv(1000 + round, &[inbox.as_sge()]).unwrap();
        let wr = round * 3;
        // A bulk chunk (the next header is read exactly behind it), a 64-byte send, an atomic.
        p.client
            .write(wr, &[src.slice(0, 256 << 10).unwrap()], &key, 0)
            .unwrap();
        p.client.send(wr + 1, &[src.slice(0, 64).unwrap()]).unwrap();
        p.client.fetch_add(wr + 2, &key, 1 << 19, 1).unwrap();
        expect_ok(&p.client_cq, wr);
        expect_ok(&p.client_cq, wr + 1);
        let c = expect_ok(&p.client_cq, wr + 2);
        assert_eq!(c.value, Some(round));
        expect_ok(&p.server_cq, 1000 + round);
    }
}

/// A frame the socket took only in part waits in the rail's transmit batch, while the session
/// may have nothing more for the rail (everything handed out). The writable edge must resume
/// it all the same: it used to be skipped, and the rest of the frame went out only with the
/// next keepalive (here: never).
#[test]
fn a_partly_written_frame_resumes_when_the_session_has_nothing_more() {
    let p = pair_with(1, |o| {
        o.session.keepalive_interval = std::time::Duration::from_secs(3600);
        o.session.peer_timeout = std::time::Duration::from_secs(3600);
        // The whole write is handed out at once, so the session is empty while its tail waits.
        o.session.initial_window = 64 << 20;
        o.session.min_window = 64 << 20;
    });
    const LEN: usize = 16 << 20;
    let target = p.server_ctx.alloc_region(LEN, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(LEN, Access::all()).unwrap();
    let data = pattern(11, LEN);
    src.write_at(0, &data).unwrap();
    for round in 0..32u64 {
        p.client
            .write(round, &[src.as_sge()], &target.remote_key(), 0)
            .unwrap();
        expect_ok(&p.client_cq, round);
    }
    assert!(target.to_vec(0, LEN).unwrap() == data);
}

/// A receiver that busy-polls, and reposts its receive from the polling loop, leaves the
/// `Done` of each message to its next poll rather than waking the engine (the repost of a
/// DSM-style service loop); when it then stops polling without sleeping in `wait`, the
/// engine still sends that `Done`, so the sender's send completes (bounded wait).
#[test]
fn sends_complete_when_the_polling_receiver_stops_after_reposting() {
    let p = pair(2);
    let rbuf = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    p.server
        .post_recv(1000, &[rbuf.slice(0, 64).unwrap()])
        .unwrap();
    for i in 0..50u64 {
        src.write_at(0, &pattern(i, 64)).unwrap();
        p.client.send(i, &[src.slice(0, 64).unwrap()]).unwrap();
        let start = std::time::Instant::now();
        let c = loop {
            if let Some(c) = p.server_cq.poll() {
                break c;
            }
            assert!(start.elapsed() < WAIT, "message {i} not received");
            std::hint::spin_loop();
        };
        assert_eq!((c.wr_id, c.status), (1000, Status::Success), "{c:?}");
        assert_eq!(rbuf.to_vec(0, 64).unwrap(), pattern(i, 64));
        p.server
            .post_recv(1000, &[rbuf.slice(0, 64).unwrap()])
            .unwrap();
        // Nobody polls the server's queue now: the engine must take the Done over.
        expect_ok(&p.client_cq, i);
    }
}
