//! Raw-Ethernet rails between two hosts of an unshaped testbed (network namespaces joined by
//! veth pairs, which this test makes and removes): the AF_XDP ports run in native mode, one
//! per device, as on real NICs. Needs root, like every testbed test.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use braid::{
    Access, CompletionQueue, Context, Endpoint, EndpointOptions, Listener, RailAddr, RailTransport,
};
use braid_testbed::testbed::spawn_in_netns;
use braid_testbed::{Testbed, TestbedSpec};
use common::*;

/// One side: its context, completion queue, endpoint (and the listener, kept for rails
/// that re-join).
struct Side {
    ctx: Context,
    cq: CompletionQueue,
    ep: Endpoint,
    _listener: Option<Listener>,
}

/// A context whose rails authenticate: the testbed's addresses are not loopback ones, and
/// braid listens there only with a cluster secret.
fn testbed_context() -> Context {
    Context::with_config(braid::ContextConfig {
        secret: Some(b"raw-rails test secret".to_vec()),
        ..braid::ContextConfig::from_env().unwrap()
    })
    .unwrap()
}

/// Host 1 accepts with `server`'s transport, host 0 connects over every rail with `client`'s;
/// each context is made in its host's namespace (so are its engine and re-dial threads).
fn connect(tb: &Testbed, client: RailTransport, server: RailTransport) -> (Side, Side) {
    let pairs = tb.rail_addrs(0, 1);
    let (addr_tx, addr_rx) = mpsc::channel();
    let listen: Vec<SocketAddr> = pairs
        .iter()
        .map(|p| SocketAddr::new(p.1.into(), 0))
        .collect();
    let srv = spawn_in_netns(&tb.host_ns(1), move || {
        let ctx = testbed_context();
        let cq = ctx.create_cq(256);
        let listener = ctx.listen(&listen).unwrap();
        addr_tx.send(listener.local_addrs()).unwrap();
        let mut o = EndpointOptions::new(&cq);
        o.transport = server;
        o.session.keepalive_interval = Duration::from_millis(50);
        let ep = listener.accept(&o, WAIT).unwrap();
        Side {
            ctx,
            cq,
            ep,
            _listener: Some(listener),
        }
    })
    .unwrap();
    let remote = addr_rx.recv_timeout(WAIT).expect("the server listens");
    let cli = spawn_in_netns(&tb.host_ns(0), move || {
        let ctx = testbed_context();
        let cq = ctx.create_cq(256);
        let rails: Vec<RailAddr> = pairs
            .iter()
            .zip(&remote)
            .map(|(p, r)| RailAddr::new(Some(p.0.into()), *r))
            .collect();
        let mut o = EndpointOptions::new(&cq);
        o.transport = client;
        o.session.keepalive_interval = Duration::from_millis(50);
        let ep = ctx.connect(&rails, &o).unwrap();
        Side {
            ctx,
            cq,
            ep,
            _listener: None,
        }
    })
    .unwrap();
    let c = cli
        .join()
        .expect("client thread")
        .expect("client namespace");
    let s = srv
        .join()
        .expect("server thread")
        .expect("server namespace");
    (c, s)
}

/// Writes, reads back, sends and adds over the endpoint, checking every byte and value.
fn exercise(c: &Side, s: &Side, seed: u64) {
    const MAX: usize = 8 << 20;
    let target = s.ctx.alloc_region(MAX, Access::all()).unwrap();
    let src = c.ctx.alloc_region(MAX, Access::all()).unwrap();
    let back = c.ctx.alloc_region(MAX, Access::all()).unwrap();
    let key = target.remote_key();
    for (i, size) in [1usize, 8, 1000, 1700, 4096, 65_536, 1 << 20, MAX]
        .into_iter()
        .enumerate()
    {
        let i = i as u64;
        let data = pattern(seed + i, size);
        src.write_at(0, &data).unwrap();
        c.ep.write(i, &[src.slice(0, size).unwrap()], &key, 0)
            .unwrap();
        expect_ok(&c.cq, i);
        assert!(
            target.to_vec(0, size).unwrap() == data,
            "write of {size} bytes"
        );
        back.fill(0, size, 0).unwrap();
        c.ep.read(100 + i, &[back.slice(0, size).unwrap()], &key, 0)
            .unwrap();
        expect_ok(&c.cq, 100 + i);
        assert!(
            back.to_vec(0, size).unwrap() == data,
            "read of {size} bytes"
        );
    }
    let rbuf = s.ctx.alloc_region(1 << 20, Access::all()).unwrap();
    for i in 0..16u64 {
        s.ep.post_recv(500 + i, &[rbuf.slice(i as usize * 65_536, 65_536).unwrap()])
            .unwrap();
    }
    for i in 0..16u64 {
        let data = pattern(seed ^ i, 1 + (i as usize * 4099) % 65_536);
        src.write_at(0, &data).unwrap();
        c.ep.send(300 + i, &[src.slice(0, data.len()).unwrap()])
            .unwrap();
        expect_ok(&c.cq, 300 + i);
        let r = expect_ok(&s.cq, 500 + i);
        assert_eq!(r.byte_len, data.len() as u64);
        assert!(
            rbuf.to_vec(i as usize * 65_536, data.len()).unwrap() == data,
            "send #{i}"
        );
    }
    let counter = s.ctx.alloc_region(4096, Access::all()).unwrap();
    for i in 0..100u64 {
        c.ep.fetch_add(1000 + i, &counter.remote_key(), 0, 3)
            .unwrap();
        expect_ok(&c.cq, 1000 + i);
    }
    assert_eq!(counter.to_vec(0, 8).unwrap(), 300u64.to_le_bytes());
}

#[test]
fn raw_rails_carry_every_operation_between_hosts() {
    let tb = Testbed::up(&TestbedSpec::unshaped("rawops", 2)).unwrap();
    let (c, s) = connect(&tb, RailTransport::Raw, RailTransport::Auto);
    assert_eq!(c.ep.rail_transports(), vec!["raw"; 2]);
    assert_eq!(s.ep.rail_transports(), vec!["raw"; 2]);
    exercise(&c, &s, 1);
    let sent = c.ep.rail_bytes_sent();
    assert!(
        sent.iter().all(|&b| b > 0),
        "both rails carried data: {sent:?}"
    );
}

#[test]
fn a_broken_raw_rail_fails_over_and_comes_back_raw() {
    let tb = Testbed::up(&TestbedSpec::unshaped("rawfail", 2)).unwrap();
    let (c, s) = connect(&tb, RailTransport::Raw, RailTransport::Auto);
    exercise(&c, &s, 2);
    // Ending the rail's control connection is how the peer learns of it: the server's
    // side of rail 1 ends, the client notices and re-dials.
    s.ep.inject_rail_failure(1).unwrap();
    let deadline = Instant::now() + WAIT;
    while !(c.ep.rails_alive().iter().all(|a| *a) && s.ep.rails_alive().iter().all(|a| *a))
        || c.ep.rail_restores() != [0, 1]
        || s.ep.rail_restores() != [0, 1]
        || c.ep.rail_transports() != vec!["raw"; 2]
    {
        assert!(
            Instant::now() < deadline,
            "rail 1 did not come back raw within {WAIT:?}: client {:?} {:?} restored {:?}, server {:?} restored {:?}",
            c.ep.rails_alive(),
            c.ep.rail_transports(),
            c.ep.rail_restores(),
            s.ep.rails_alive(),
            s.ep.rail_restores()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    exercise(&c, &s, 3);
}

#[test]
fn an_acceptor_that_wants_tcp_keeps_the_rails_on_tcp() {
    let tb = Testbed::up(&TestbedSpec::unshaped("rawno", 1)).unwrap();
    let (c, s) = connect(&tb, RailTransport::Raw, RailTransport::Tcp);
    assert_eq!(c.ep.rail_transports(), vec!["tcp"]);
    assert_eq!(s.ep.rail_transports(), vec!["tcp"]);
    exercise(&c, &s, 4);
}
