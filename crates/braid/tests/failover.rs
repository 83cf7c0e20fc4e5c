//! Rail failover on real sockets: one rail of four breaks in the middle of a stream of
//! writes, reads, sends and atomics; everything completes, exactly once, byte-exact.

mod common;

use std::sync::atomic::Ordering;

use braid::{Access, CompletionKind, Status};
use common::*;

#[test]
fn one_rail_breaks_mid_transfer_and_everything_completes_exactly_once() {
    for broken in [0usize, 2] {
        let p = pair(4);
        const SIZE: usize = 4 << 20;
        const N: usize = 24;
        let target = p
            .server_ctx
            .alloc_region(N * SIZE + 4096, Access::all())
            .unwrap();
        let src = p.client_ctx.alloc_region(N * SIZE, Access::all()).unwrap();
        let inbox = p.server_ctx.alloc_region(N * 64, Access::all()).unwrap();
        let data = pattern(broken as u64, N * SIZE);
        src.write_at(0, &data).unwrap();
        for i in 0..N {
            p.server
                .post_recv(500 + i as u64, &[inbox.slice(i * 64, 64).unwrap()])
                .unwrap();
        }
        let key = target.remote_key();
        let counter_off = (N * SIZE) as u64;
        let mut wr = 0u64;
        for i in 0..N {
            p.client
                .write(
                    wr,
                    &[src.slice(i * SIZE, SIZE).unwrap()],
                    &key,
                    (i * SIZE) as u64,
                )
                .unwrap();
            wr += 1;
            p.client.fetch_add(wr, &key, counter_off, 1).unwrap();
            wr += 1;
            p.client
                .send(wr, &[src.slice(i * SIZE, 64).unwrap()])
                .unwrap();
            wr += 1;
        }
        // Let the first operations through, then pull the cable of one rail.
        let first = next(&p.client_cq);
        assert_eq!((first.wr_id, first.status), (0, Status::Success));
        p.client.inject_rail_failure(broken).unwrap();
        let mut olds = Vec::new();
        for id in 1..wr {
            let c = next(&p.client_cq);
            assert_eq!(c.wr_id, id, "completions in post order");
            assert_eq!(c.status, Status::Success, "{c:?}");
            if c.kind == CompletionKind::FetchAdd {
                olds.push(c.value.unwrap());
            }
        }
        // Every atomic took effect exactly once: old values 0..N, final value N.
        olds.sort_unstable();
        assert_eq!(olds, (0..N as u64).collect::<Vec<_>>());
        assert_eq!(
            target
                .atomic_u64(counter_off as usize)
                .unwrap()
                .load(Ordering::SeqCst),
            N as u64
        );
        assert!(
            target.to_vec(0, N * SIZE).unwrap() == data,
            "every byte placed"
        );
        // Every send delivered exactly once, in order.
        for i in 0..N {
            let c = next(&p.server_cq);
            assert_eq!(
                (c.wr_id, c.status, c.byte_len),
                (500 + i as u64, Status::Success, 64)
            );
            assert_eq!(
                inbox.to_vec(i * 64, 64).unwrap(),
                data[i * SIZE..i * SIZE + 64]
            );
        }
        assert!(p.server_cq.poll().is_none(), "no duplicate receive");
        let alive = p.client.rails_alive();
        assert!(
            !alive[broken] && alive.iter().filter(|a| **a).count() == 3,
            "{alive:?}"
        );
        // The endpoint keeps working on three rails, reads included.
        let back = p.client_ctx.alloc_region(SIZE, Access::all()).unwrap();
        p.client
            .read(wr, &[back.as_sge()], &key, SIZE as u64)
            .unwrap();
        expect_ok(&p.client_cq, wr);
        assert!(back.to_vec(0, SIZE).unwrap() == data[SIZE..2 * SIZE]);
    }
}

#[test]
fn losing_every_rail_fails_every_operation_once() {
    let p = pair(2);
    let target = p.server_ctx.alloc_region(8 << 20, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(8 << 20, Access::all()).unwrap();
    for i in 0..16 {
        p.client
            .write(i, &[src.as_sge()], &target.remote_key(), 0)
            .unwrap();
    }
    p.client.inject_rail_failure(0).unwrap();
    p.client.inject_rail_failure(1).unwrap();
    let mut seen = Vec::new();
    for _ in 0..16 {
        let c = next(&p.client_cq);
        assert!(
            matches!(c.status, Status::Success | Status::TransportError),
            "{c:?}"
        );
        seen.push(c.wr_id);
    }
    assert_eq!(seen, (0..16).collect::<Vec<_>>());
    assert!(
        p.client_cq
            .wait(std::time::Duration::from_millis(100))
            .is_none()
    );
    assert!(p.client.is_closed());
}

#[test]
fn a_broken_rail_rejoins_and_carries_traffic_again() {
    use braid::{Context, EndpointOptions, RailAddr};
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};
    let server = Context::new().unwrap();
    let client = Context::new().unwrap();
    let (scq, ccq) = (server.create_cq(1024), client.create_cq(1024));
    let addrs: Vec<SocketAddr> = (0..3).map(|i| SocketAddr::new(rail_ip(i), 0)).collect();
    // The listener stays alive: re-joining rails come back through it.
    let listener = server.listen(&addrs).unwrap();
    let rails: Vec<RailAddr> = listener
        .local_addrs()
        .iter()
        .enumerate()
        .map(|(i, a)| RailAddr::new(Some(rail_ip(i)), *a))
        .collect();
    let mut copts = EndpointOptions::new(&ccq);
    copts.session.keepalive_interval = Duration::from_millis(50);
    // Small fixed windows: every rail must carry part of each write (on loopback a single
    // rail with a rate-sized window could take it all).
    copts.session.max_window = 2 << 20;
    let c = std::thread::spawn(move || (client.connect(&rails, &copts).unwrap(), client));
    let sep = listener.accept(&EndpointOptions::new(&scq), WAIT).unwrap();
    let (cep, client) = c.join().unwrap();
    let target = server.alloc_region(16 << 20, Access::all()).unwrap();
    let src = client.alloc_region(16 << 20, Access::all()).unwrap();
    let data = pattern(11, 16 << 20);
    src.write_at(0, &data).unwrap();

    cep.inject_rail_failure(1).unwrap();
    // Bounded waits on the rail state (polling a condition, not sleeping for a result):
    // first the break is noticed, then the re-dialled rail is back on both sides.
    let deadline = Instant::now() + WAIT;
    while cep.rails_alive()[1] {
        assert!(Instant::now() < deadline, "the break was not noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    while !(cep.rails_alive().iter().all(|a| *a) && sep.rails_alive().iter().all(|a| *a)) {
        assert!(
            Instant::now() < deadline,
            "rail did not come back: {:?} {:?}",
            cep.rails_alive(),
            sep.rails_alive()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = cep.rail_bytes_sent()[1];
    for i in 0..8u64 {
        cep.write(i, &[src.as_sge()], &target.remote_key(), 0)
            .unwrap();
    }
    for i in 0..8u64 {
        expect_ok(&ccq, i);
    }
    assert!(target.to_vec(0, 16 << 20).unwrap() == data);
    assert!(
        cep.rail_bytes_sent()[1] > before,
        "the re-joined rail carries data: {:?}",
        cep.rail_bytes_sent()
    );
    drop(listener);
}
