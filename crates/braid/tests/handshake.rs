//! Rail handshake over real sockets: peers that do not speak braid, or speak another version.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use braid::{Context, EndpointOptions, Error, RailAddr};
use braid_proto::wire::handshake::{HANDSHAKE_LEN, HANDSHAKE_VERSION, Hello, HelloReply};
use braid_proto::wire::{HandshakeError, HandshakeStatus};
use common::WAIT;

fn opts(ctx: &Context) -> EndpointOptions {
    let mut o = EndpointOptions::new(&ctx.create_cq(16));
    o.connect_timeout = Duration::from_secs(5);
    o
}

#[test]
fn client_gets_clear_error_from_a_non_braid_server() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; HANDSHAKE_LEN];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .unwrap();
    });
    let ctx = Context::new().unwrap();
    let err = ctx
        .connect(
            &[RailAddr {
                local: None,
                remote: addr,
            }],
            &opts(&ctx),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Handshake {
                source: HandshakeError::BadMagic(_),
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("does not speak the braid protocol"),
        "{err}"
    );
    server.join().unwrap();
}

#[test]
fn client_gets_version_mismatch() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; HANDSHAKE_LEN];
        s.read_exact(&mut b).unwrap();
        let h = Hello::decode(&b).unwrap();
        let r = HelloReply {
            version: 9,
            rail_index: h.rail_index,
            rail_count: h.rail_count,
            status: HandshakeStatus::VersionUnsupported,
            capabilities: 0,
            max_chunk: 0,
            session_id: h.session_id,
            auth: [0; 32],
        };
        s.write_all(&r.encode()).unwrap();
    });
    let ctx = Context::new().unwrap();
    let err = ctx
        .connect(
            &[RailAddr {
                local: None,
                remote: addr,
            }],
            &opts(&ctx),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::VersionMismatch {
                ours: braid_proto::wire::handshake::HANDSHAKE_VERSION,
                theirs: 9,
                ..
            }
        ),
        "{err}"
    );
    server.join().unwrap();
}

fn listener() -> (Context, braid::Listener, SocketAddr) {
    let ctx = Context::new().unwrap();
    let l = ctx.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let a = l.local_addrs()[0];
    (ctx, l, a)
}

#[test]
fn server_refuses_foreign_version_and_garbage_then_still_accepts() {
    let (sctx, l, addr) = listener();
    let sopts = opts(&sctx);
    let acceptor = std::thread::spawn(move || l.accept(&sopts, WAIT));

    // A peer speaking version 1 (before vectored operations and file regions) gets a reply
    // naming ours, then the connection closes.
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let h = Hello {
        version: 1,
        rail_index: 0,
        rail_count: 1,
        capabilities: 0,
        max_chunk: 0,
        session_id: 5,
        nonce: [1; 16],
        same_host: None,
    };
    s.write_all(&h.encode()).unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    let r = HelloReply::decode(&b).unwrap();
    assert_eq!(
        (r.status, r.version),
        (HandshakeStatus::VersionUnsupported, HANDSHAKE_VERSION)
    );
    assert_eq!(s.read(&mut b).unwrap(), 0, "closed after the refusal");

    // Garbage: closed without a reply.
    let mut g = TcpStream::connect(addr).unwrap();
    g.set_read_timeout(Some(WAIT)).unwrap();
    g.write_all(&[0x42; HANDSHAKE_LEN]).unwrap();
    assert_eq!(g.read(&mut b).unwrap_or(0), 0);

    // A truncated handshake followed by a close: refused, the listener carries on.
    let mut t = TcpStream::connect(addr).unwrap();
    t.write_all(&h.encode()[..10]).unwrap();
    drop(t);

    // Bad rail numbering.
    let mut bad = TcpStream::connect(addr).unwrap();
    bad.set_read_timeout(Some(WAIT)).unwrap();
    let hb = Hello {
        version: braid_proto::wire::handshake::HANDSHAKE_VERSION,
        rail_index: 3,
        rail_count: 2,
        ..h
    };
    bad.write_all(&hb.encode()).unwrap();
    bad.read_exact(&mut b).unwrap();
    assert_eq!(
        HelloReply::decode(&b).unwrap().status,
        HandshakeStatus::BadRail
    );

    // A real client still gets in.
    let cctx = Context::new().unwrap();
    let ep = cctx
        .connect(
            &[RailAddr {
                local: None,
                remote: addr,
            }],
            &opts(&cctx),
        )
        .unwrap();
    let server_ep = acceptor.join().unwrap().unwrap();
    assert_eq!(ep.rail_count(), 1);
    assert_eq!(server_ep.rail_count(), 1);
}

#[test]
fn accept_times_out_without_clients() {
    let (sctx, l, _) = listener();
    let err = l
        .accept(&opts(&sctx), Duration::from_millis(50))
        .unwrap_err();
    assert!(matches!(err, Error::Timeout(_)), "{err}");
}
