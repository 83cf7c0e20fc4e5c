//! Cluster-secret authentication, payload CRC32C and resource limits.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::{Access, Context, ContextConfig, EndpointOptions, Error, RailAddr, Region};
use braid_proto::mem::Registry;
use braid_proto::wire::handshake::{
    AuthProof, AuthRole, HANDSHAKE_LEN, Hello, HelloReply, auth_mac,
};
use braid_proto::wire::{FrameHeader, HandshakeStatus};
use braid_proto::{Request, RxAction, Session, SessionConfig};
use common::*;

fn ctx(secret: Option<&str>) -> Context {
    Context::with_config(ContextConfig {
        secret: secret.map(|s| s.as_bytes().to_vec()),
        ..ContextConfig::default()
    })
    .unwrap()
}

fn opts(c: &Context) -> EndpointOptions {
    let mut o = EndpointOptions::new(&c.create_cq(64));
    o.connect_timeout = Duration::from_secs(5);
    o
}

/// A listener accepting in the background for a bounded time; returns what accept gave.
fn serve(
    server: &Context,
) -> (
    SocketAddr,
    std::thread::JoinHandle<Result<braid::Endpoint, Error>>,
) {
    let l = server.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = l.local_addrs()[0];
    let o = opts(server);
    (
        addr,
        std::thread::spawn(move || l.accept(&o, Duration::from_secs(3))),
    )
}

fn rail(addr: SocketAddr) -> [RailAddr; 1] {
    [RailAddr {
        local: None,
        remote: addr,
    }]
}

#[test]
fn same_secret_connects_and_works() {
    let server = ctx(Some("s3cret"));
    let target = server.alloc_region(4096, Access::all()).unwrap();
    let (addr, acc) = serve(&server);
    let client = ctx(Some("s3cret"));
    let o = opts(&client);
    let ep = client.connect(&rail(addr), &o).unwrap();
    let _sep = acc.join().unwrap().unwrap();
    let src = client.alloc_region(4096, Access::all()).unwrap();
    src.fill(0, 4096, 7).unwrap();
    ep.write(1, &[src.as_sge()], &target.remote_key(), 0)
        .unwrap();
    expect_ok(&o.send_cq, 1);
    assert_eq!(target.to_vec(0, 4096).unwrap(), vec![7; 4096]);
}

#[test]
fn missing_or_wrong_secrets_are_refused_both_ways() {
    for (s, c, what) in [
        (Some("a"), None, "requires a cluster secret"),
        (None, Some("a"), "did not prove"),
        (Some("a"), Some("b"), "refused our proof"),
    ] {
        let server = ctx(s);
        let target = server.alloc_region(4096, Access::all()).unwrap();
        let (addr, acc) = serve(&server);
        let client = ctx(c);
        let err = client.connect(&rail(addr), &opts(&client)).unwrap_err();
        assert!(matches!(err, Error::Auth { .. }), "{err}");
        assert!(err.to_string().contains(what), "{err}");
        // No endpoint came out of it on the server side.
        let r = acc.join().unwrap();
        if s.is_some() {
            assert!(
                matches!(r, Err(Error::Timeout(_))),
                "server accepted an unauthenticated rail"
            );
        }
        assert_eq!(target.to_vec(0, 8).unwrap(), vec![0; 8]);
    }
}

/// Speaks the connecting side of the handshake by hand; returns the proof it sent.
fn raw_handshake(
    addr: SocketAddr,
    hello: &Hello,
    proof: Option<[u8; 32]>,
    secret: &[u8],
) -> (HandshakeStatus, [u8; 32]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(&hello.encode()).unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    let challenge = HelloReply::decode(&b).unwrap();
    assert_eq!(challenge.status, HandshakeStatus::AuthRequired);
    let n: [u8; 16] = challenge.auth[..16].try_into().unwrap();
    let mac = proof.unwrap_or_else(|| {
        auth_mac(
            secret,
            AuthRole::Connector,
            &hello.nonce,
            &n,
            hello.session_id,
            hello.rail_index,
        )
    });
    s.write_all(&AuthProof { mac }.encode()).unwrap();
    s.read_exact(&mut b).unwrap();
    (HelloReply::decode(&b).unwrap().status, mac)
}

#[test]
fn replayed_and_truncated_handshakes_are_refused() {
    let server = ctx(Some("k"));
    let l = server.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = l.local_addrs()[0];
    let o = opts(&server);
    // Accept in the background: the two-rail session below never completes, so accept ends
    // by its timeout; refused rails are logged and do not end it early.
    let acc = std::thread::spawn(move || l.accept(&o, Duration::from_secs(2)));
    let hello = Hello {
        version: braid_proto::wire::handshake::HANDSHAKE_VERSION,
        rail_index: 0,
        rail_count: 2,
        capabilities: 0,
        max_chunk: 0,
        session_id: 42,
        nonce: [5; 16],
        same_host: None,
    };
    // A genuine proof (the test knows the secret) is accepted...
    let (st, mac) = raw_handshake(addr, &hello, None, b"k");
    assert_eq!(st, HandshakeStatus::Accepted);
    // ...and the same bytes replayed on a new connection are not: the nonce is fresh.
    let replay = Hello {
        rail_index: 1,
        ..hello
    };
    let (st, _) = raw_handshake(addr, &replay, Some(mac), b"k");
    assert_eq!(st, HandshakeStatus::AuthFailed);
    // Truncated: a hello cut short, then a proof cut short.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(&hello.encode()[..20]).unwrap();
    drop(t);
    let mut t = TcpStream::connect(addr).unwrap();
    t.set_read_timeout(Some(WAIT)).unwrap();
    t.write_all(
        &Hello {
            session_id: 43,
            ..hello
        }
        .encode(),
    )
    .unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    t.read_exact(&mut b).unwrap();
    t.write_all(&[0u8; 10]).unwrap();
    drop(t);
    assert!(matches!(acc.join().unwrap(), Err(Error::Timeout(_))));
}

#[test]
fn crc_is_negotiated_and_transfers_stay_exact() {
    let server = Context::new().unwrap();
    let target = server.alloc_region(8 << 20, Access::all()).unwrap();
    let l = server.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = l.local_addrs()[0];
    let so = opts(&server); // the server does not ask for CRCs; the client does
    let acc = std::thread::spawn(move || l.accept(&so, WAIT));
    let client = Context::new().unwrap();
    let mut co = opts(&client);
    co.session.payload_crc = true;
    let ep = client.connect(&rail(addr), &co).unwrap();
    let _sep = acc.join().unwrap().unwrap();
    let src = client.alloc_region(8 << 20, Access::all()).unwrap();
    let back = client.alloc_region(8 << 20, Access::all()).unwrap();
    let data = pattern(9, 8 << 20);
    src.write_at(0, &data).unwrap();
    ep.write(1, &[src.as_sge()], &target.remote_key(), 0)
        .unwrap();
    ep.read(2, &[back.as_sge()], &target.remote_key(), 0)
        .unwrap();
    expect_ok(&co.send_cq, 1);
    expect_ok(&co.send_cq, 2);
    assert!(back.to_vec(0, 8 << 20).unwrap() == data);
}

#[test]
fn corrupted_payload_is_an_error_not_silent() {
    let cfg = SessionConfig {
        payload_crc: true,
        ..SessionConfig::default()
    };
    let (ra, rb) = (Arc::new(Registry::default()), Arc::new(Registry::default()));
    let mut a = Session::new(cfg.clone(), ra.clone(), 1, 1);
    let mut b = Session::new(cfg, rb.clone(), 1, 2);
    let src = Region::allocate_in(&ra, 4096, Access::all()).unwrap();
    let dst = Region::allocate_in(&rb, 4096, Access::all()).unwrap();
    src.fill(0, 4096, 0x11).unwrap();
    a.post(
        1,
        Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        },
    )
    .unwrap();
    let now = Instant::now();
    let t = a.poll_transmit(0, now).unwrap();
    let h = FrameHeader::decode(&t.header).unwrap();
    assert_ne!(h.crc, 0);
    let mut payload: Vec<u8> = t
        .payload
        .iter()
        .flat_map(|&(p, l)| unsafe { std::slice::from_raw_parts(p, l) }.to_vec())
        .collect();
    payload[100] ^= 0x40; // one bit flipped on the way
    let RxAction::Place(place) = b.on_frame(0, &h, now).unwrap() else {
        panic!("expected a placement")
    };
    let mut off = 0;
    for &(p, l) in &place.iov {
        unsafe { std::ptr::copy_nonoverlapping(payload[off..].as_ptr(), p, l) };
        off += l;
    }
    let err = b.payload_done(0).unwrap_err();
    assert!(err.to_string().contains("CRC32C"), "{err}");
    assert!(
        b.poll_completion().is_none(),
        "no completion for corrupted data"
    );
}

#[test]
fn registered_bytes_are_limited() {
    let c = Context::with_config(ContextConfig {
        max_registered_bytes: Some(1 << 20),
        ..ContextConfig::default()
    })
    .unwrap();
    let a = c.alloc_region(512 << 10, Access::all()).unwrap();
    let err = c.alloc_region(600 << 10, Access::all()).unwrap_err();
    assert!(
        matches!(err, Error::QueueFull { what: "registered bytes", limit } if limit == 1 << 20),
        "{err}"
    );
    drop(a);
    c.alloc_region(600 << 10, Access::all()).unwrap();
}

#[test]
fn completion_queue_capacity_refuses_posts_instead_of_losing_completions() {
    let p = pair(1);
    let r = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let s = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    // The shared test CQ holds 4096; post until the endpoint's outstanding limit or CQ says no.
    let mut posted = 0u64;
    let err = loop {
        match p
            .client
            .write(posted, &[s.slice(0, 8).unwrap()], &r.remote_key(), 0)
        {
            Ok(()) => posted += 1,
            Err(e) => break e,
        }
        assert!(posted < 100_000, "a limit must be reached");
    };
    assert!(matches!(err, Error::QueueFull { .. }), "{err}");
    for i in 0..posted {
        let c = next(&p.client_cq);
        assert_eq!(c.wr_id, i);
    }
}

#[test]
fn without_a_secret_only_loopback_listens_unless_insecure() {
    let wildcard: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let e = ctx(None).listen(&[wildcard]).unwrap_err().to_string();
    assert!(
        e.contains("without a cluster secret")
            && e.contains("BRAID_SECRET_FILE")
            && e.contains("BRAID_INSECURE=1"),
        "{e}"
    );
    // Loopback stays zero-config; a secret or explicit consent opens other addresses.
    ctx(None).listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    ctx(Some("s3cret")).listen(&[wildcard]).unwrap();
    let insecure = Context::with_config(ContextConfig {
        insecure: true,
        ..ContextConfig::default()
    })
    .unwrap();
    insecure.listen(&[wildcard]).unwrap();
}

/// Sends `hello` on a new connection to `addr` and returns the stream and the first reply.
fn hello_to(addr: SocketAddr, hello: &Hello) -> (TcpStream, HelloReply) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.write_all(&hello.encode()).unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    (s, HelloReply::decode(&b).unwrap())
}

fn reply_to(s: &mut TcpStream, mac: [u8; 32]) -> HelloReply {
    s.write_all(&AuthProof { mac }.encode()).unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    HelloReply::decode(&b).unwrap()
}

#[test]
fn a_sniffed_session_id_does_not_rejoin_without_the_join_token() {
    use braid_proto::wire::handshake::{HANDSHAKE_VERSION, caps, verify_auth_mac};
    let server = ctx(None);
    let l = server.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = l.local_addrs()[0];
    let session_id = 0x005e_ed1d_u64;
    let hello = |capabilities, nonce: u8| Hello {
        version: HANDSHAKE_VERSION,
        rail_index: 0,
        rail_count: 1,
        capabilities,
        max_chunk: 1 << 16,
        session_id,
        nonce: [nonce; 16],
        same_host: None,
    };
    // The rightful client's first join: accepted, with the session's join token.
    let (_victim, first) = hello_to(addr, &hello(0, 1));
    assert_eq!(first.status, HandshakeStatus::Accepted);
    let token = first.auth;
    assert_ne!(token, [0; 32], "a join token is handed out");
    let ep = l.accept(&opts(&server), WAIT).unwrap();
    // A stranger who sniffed the id: challenged, and refused with a wrong proof.
    let (mut s, challenge) = hello_to(addr, &hello(caps::REJOIN, 2));
    assert_eq!(challenge.status, HandshakeStatus::AuthRequired);
    assert_eq!(
        reply_to(&mut s, [7; 32]).status,
        HandshakeStatus::AuthFailed
    );
    // A replay of a proof made for another connection's nonces is refused too.
    let (mut s, c2) = hello_to(addr, &hello(caps::REJOIN, 3));
    let n2: [u8; 16] = c2.auth[..16].try_into().unwrap();
    let stale = auth_mac(&token, AuthRole::Connector, &[2; 16], &n2, session_id, 0);
    assert_eq!(reply_to(&mut s, stale).status, HandshakeStatus::AuthFailed);
    // The holder of the token re-joins, and the acceptor proves it knows the token too.
    let (mut s, c3) = hello_to(addr, &hello(caps::REJOIN, 4));
    let n3: [u8; 16] = c3.auth[..16].try_into().unwrap();
    let proof = auth_mac(&token, AuthRole::Connector, &[4; 16], &n3, session_id, 0);
    let done = reply_to(&mut s, proof);
    assert_eq!(done.status, HandshakeStatus::Accepted);
    assert!(verify_auth_mac(
        &token,
        AuthRole::Acceptor,
        &[4; 16],
        &n3,
        session_id,
        0,
        &done.auth
    ));
    drop(ep);
}
