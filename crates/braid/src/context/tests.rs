//! The transport seam: an endpoint runs over a link that is not TCP (a Unix socket pair,
//! a second implementation of [`Transport`] kept here), with the same protocol core.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::*;
use crate::engine::io::{Received, recv_into, recv_pieces, send_pieces};
use crate::engine::transport::LinkSample;

/// A rail over one end of a Unix stream socket pair.
struct UnixLink(UnixStream);

impl Transport for UnixLink {
    fn readiness_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
    fn send(
        &self,
        pieces: &[(*const u8, usize)],
        skip: usize,
        _fragile: bool,
        _stable: &[bool],
    ) -> std::io::Result<usize> {
        send_pieces(self.0.as_raw_fd(), pieces, skip)
    }
    fn recv_pieces(
        &self,
        pieces: &[(*mut u8, usize)],
        skip: usize,
        tail: Option<(*mut u8, usize)>,
        _fragile: bool,
    ) -> std::io::Result<Received> {
        recv_pieces(self.0.as_raw_fd(), pieces, skip, tail)
    }
    fn recv(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        recv_into(self.0.as_raw_fd(), buf)
    }
    fn set_wake_threshold(&self, _bytes: usize) -> std::io::Result<()> {
        // Readable on every byte: more wake-ups, same result.
        Ok(())
    }
    fn sample(&self) -> Option<LinkSample> {
        None
    }
    fn kind(&self) -> &'static str {
        "unix"
    }
    fn shutdown(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

fn unix_pair() -> (Arc<dyn Transport>, Arc<dyn Transport>) {
    let (a, b) = UnixStream::pair().expect("socketpair");
    a.set_nonblocking(true).expect("non-blocking");
    b.set_nonblocking(true).expect("non-blocking");
    (Arc::new(UnixLink(a)), Arc::new(UnixLink(b)))
}

/// Two endpoints of `ctx` joined by two rails of Unix socket pairs.
fn two_rail_pair(
    ctx: &Context,
    cq_a: &CompletionQueue,
    cq_b: &CompletionQueue,
) -> (Endpoint, Endpoint) {
    let none: SocketAddr = "0.0.0.0:0".parse().expect("address");
    let (a0, b0) = unix_pair();
    let (a1, b1) = unix_pair();
    let addrs = vec![(none, none); 2];
    let ea = ctx
        .start_endpoint_on(
            vec![a0, a1],
            addrs.clone(),
            &EndpointOptions::new(cq_a),
            true,
            None,
        )
        .expect("endpoint a");
    let eb = ctx
        .start_endpoint_on(vec![b0, b1], addrs, &EndpointOptions::new(cq_b), true, None)
        .expect("endpoint b");
    (ea, eb)
}

#[test]
fn an_endpoint_runs_over_a_link_that_is_not_tcp() {
    const LEN: usize = 3 << 20;
    let ctx = Context::new().expect("context");
    let (cq_a, cq_b) = (ctx.create_cq(64), ctx.create_cq(64));
    // Two rails, so a large write is striped over both links.
    let (ea, eb) = two_rail_pair(&ctx, &cq_a, &cq_b);

    let src = ctx.alloc_region(LEN, Access::all()).expect("source");
    let dst = ctx.alloc_region(LEN, Access::all()).expect("destination");
    let pattern: Vec<u8> = (0..LEN).map(|i| (i * 131 + i / 4096) as u8).collect();
    src.write_at(0, &pattern).expect("fill");
    let wait = Duration::from_secs(20);

    // A striped one-sided write, then the same bytes read back the other way.
    ea.write(1, &[src.slice(0, LEN).expect("sge")], &dst.remote_key(), 0)
        .expect("post write");
    let c = cq_a.wait(wait).expect("the write completes");
    assert!(c.status.is_ok(), "write: {c:?}");
    let mut got = vec![0u8; LEN];
    dst.read_at(0, &mut got).expect("read destination");
    assert!(got == pattern, "the written bytes differ");
    assert!(
        ea.rail_bytes_sent().iter().all(|&b| b > 0),
        "both links carried the write: {:?}",
        ea.rail_bytes_sent()
    );

    let back = ctx.alloc_region(LEN, Access::all()).expect("read target");
    eb.read(2, &[back.slice(0, LEN).expect("sge")], &src.remote_key(), 0)
        .expect("post read");
    let c = cq_b.wait(wait).expect("the read completes");
    assert!(c.status.is_ok(), "read: {c:?}");
    back.read_at(0, &mut got).expect("read back");
    assert!(got == pattern, "the read bytes differ");

    // Two-sided: a send into a posted receive.
    let msg = ctx.alloc_region(64, Access::all()).expect("message");
    msg.write_at(0, b"over the seam").expect("fill message");
    let inbox = ctx.alloc_region(64, Access::all()).expect("inbox");
    eb.post_recv(3, &[inbox.slice(0, 64).expect("sge")])
        .expect("post receive");
    ea.send(4, &[msg.slice(0, 13).expect("sge")])
        .expect("post send");
    let r = cq_b.wait(wait).expect("the receive completes");
    assert!(r.status.is_ok(), "receive: {r:?}");
    let mut text = [0u8; 13];
    inbox.read_at(0, &mut text).expect("read inbox");
    assert_eq!(&text, b"over the seam");
    assert!(cq_a.wait(wait).expect("the send completes").status.is_ok());
}

/// Posting while another thread is in the middle of a send on every rail: the post skips
/// the held rails instead of waiting for them, leaves its frames to their holder (the
/// rail's `tx_wanted` flag), and the holder's flush sends them.
#[test]
fn a_post_skips_rails_another_thread_is_writing_and_their_holder_sends_its_frames() {
    let ctx = Context::new().expect("context");
    let (cq_a, cq_b) = (ctx.create_cq(64), ctx.create_cq(64));
    let (ea, _eb) = two_rail_pair(&ctx, &cq_a, &cq_b);
    let src = ctx.alloc_region(4096, Access::all()).expect("source");
    let dst = ctx.alloc_region(4096, Access::all()).expect("destination");
    src.write_at(0, b"left to the holder").expect("fill");
    let key = dst.remote_key();
    let sent_before = ea.rail_bytes_sent();
    let held: Vec<_> = (0..2).map(|r| ea.shared.hold_tx(r)).collect();
    let (posted_tx, posted) = std::sync::mpsc::channel();
    let held = std::thread::scope(|s| {
        let (ea, src, key) = (&ea, &src, &key);
        s.spawn(move || {
            let r = ea.write(7, &[src.slice(0, 18).expect("sge")], key, 0);
            let _ = posted_tx.send(r);
        });
        // A post that waits for a held lock returns only once the guards go: let them go
        // before failing, so that the scope can end.
        match posted.recv_timeout(Duration::from_secs(10)) {
            Ok(r) => r.expect("post write"),
            Err(_) => {
                drop(held);
                panic!("the post waited for a rail another thread was writing");
            }
        }
        held
    });
    assert_eq!(
        ea.rail_bytes_sent(),
        sent_before,
        "nothing was taken for a held rail"
    );
    assert!(
        (0..2).any(|r| ea.shared.tx_wanted(r)),
        "the post left its frames to a holder"
    );
    for h in held {
        h.finish().expect("the holder's flush");
    }
    let c = cq_a
        .wait(Duration::from_secs(20))
        .expect("the write completes");
    assert!(c.status.is_ok() && c.wr_id == 7, "{c:?}");
    let mut got = [0u8; 18];
    dst.read_at(0, &mut got).expect("read destination");
    assert_eq!(&got, b"left to the holder");
}

#[test]
fn engine_thread_counts_outside_the_bounds_are_refused_with_a_reason() {
    assert_eq!(parse_engine_threads(" 4\n").expect("4 threads"), 4);
    assert_eq!(
        parse_engine_threads("64").expect("the most"),
        MAX_ENGINE_THREADS
    );
    for bad in ["0", "65", "-1", "four", ""] {
        let e = parse_engine_threads(bad).expect_err(bad).to_string();
        assert!(
            e.contains(ENGINE_THREADS_ENV) && e.contains("1 to 64"),
            "{bad}: {e}"
        );
    }
    let e = Context::with_config(ContextConfig {
        engine_threads: MAX_ENGINE_THREADS + 1,
        ..ContextConfig::default()
    })
    .expect_err("too many threads");
    assert!(e.to_string().contains("at most 64"), "{e}");
    let three = Context::with_config(ContextConfig {
        engine_threads: 3,
        ..ContextConfig::default()
    })
    .expect("three threads");
    assert_eq!(three.engine_threads(), 3);
    let zero = Context::with_config(ContextConfig::default()).expect("the default");
    assert_eq!(zero.engine_threads(), 1, "0 counts as 1");
}
