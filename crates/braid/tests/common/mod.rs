//! Shared set-up for the loopback integration tests: two contexts (as two processes would
//! have) joined by an endpoint of N rails, rail i from 127.0.0.(i+1) to 127.0.0.(i+1).

#![allow(dead_code)]

pub mod tmpfile;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use braid::{Completion, CompletionQueue, Context, Endpoint, EndpointOptions, RailAddr, Status};

pub const WAIT: Duration = Duration::from_secs(20);

pub struct Pair {
    pub server_ctx: Context,
    pub client_ctx: Context,
    pub server_cq: CompletionQueue,
    pub client_cq: CompletionQueue,
    pub server: Endpoint,
    pub client: Endpoint,
}

pub fn rail_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, (i + 1) as u8))
}

pub fn pair(rails: usize) -> Pair {
    pair_with(rails, |_| {})
}

pub fn pair_with(rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    let server_ctx = Context::new().unwrap();
    let client_ctx = Context::new().unwrap();
    let server_cq = server_ctx.create_cq(4096);
    let client_cq = client_ctx.create_cq(4096);
    let addrs: Vec<SocketAddr> = (0..rails).map(|i| SocketAddr::new(rail_ip(i), 0)).collect();
    let listener = server_ctx.listen(&addrs).unwrap();
    let bound = listener.local_addrs();
    let mut sopts = EndpointOptions::new(&server_cq);
    tune(&mut sopts);
    let accept = std::thread::spawn(move || listener.accept(&sopts, WAIT).unwrap());
    let rail_addrs: Vec<RailAddr> = bound
        .iter()
        .enumerate()
        .map(|(i, r)| RailAddr::new(Some(rail_ip(i)), *r))
        .collect();
    let mut copts = EndpointOptions::new(&client_cq);
    tune(&mut copts);
    let client = client_ctx.connect(&rail_addrs, &copts).unwrap();
    let server = accept.join().unwrap();
    Pair {
        server_ctx,
        client_ctx,
        server_cq,
        client_cq,
        server,
        client,
    }
}

/// Waits for the next completion, failing the test after a bounded time.
pub fn next(cq: &CompletionQueue) -> Completion {
    cq.wait(WAIT)
        .expect("no completion within the bounded wait")
}

/// Waits for a completion with `wr_id` and success.
pub fn expect_ok(cq: &CompletionQueue, wr_id: u64) -> Completion {
    let c = next(cq);
    assert_eq!(c.wr_id, wr_id, "completion order: {c:?}");
    assert_eq!(c.status, Status::Success, "{c:?}");
    c
}

/// A deterministic byte pattern.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
