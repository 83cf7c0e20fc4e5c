//! Shared set-up for the loopback integration tests: the test kit's connected pairs (two
//! contexts, as two processes would have, joined by an endpoint of N rails, rail i from
//! 127.0.0.(i+1) to 127.0.0.(i+1)), its patterns, and a temporary file.

#![allow(dead_code)]

pub mod tmpfile;

// Each test binary includes this module and uses a part of it.
#[allow(unused_imports)]
pub use braid_testkit::loopback::{Pair, WAIT, expect_ok, next, pair, pair_with, rail_ip};

/// A deterministic byte pattern of `len` bytes for `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    braid_testkit::pattern::pattern(len, seed)
}

/// A pair whose rails all use `transport`, checked to be carried by `kind` (`shm` or `tcp`)
/// on both sides: the loopback cases run once per transport.
pub fn pair_over(
    transport: braid::RailTransport,
    kind: &str,
    rails: usize,
    tune: impl Fn(&mut braid::EndpointOptions),
) -> Pair {
    let cfg = braid::ContextConfig::from_env().expect("context settings from the environment");
    pair_over_in(&cfg, transport, kind, rails, tune)
}

/// [`pair_over`], both contexts made with `cfg`.
pub fn pair_over_in(
    cfg: &braid::ContextConfig,
    transport: braid::RailTransport,
    kind: &str,
    rails: usize,
    tune: impl Fn(&mut braid::EndpointOptions),
) -> Pair {
    let p = braid_testkit::loopback::pair_in(cfg, rails, |o| {
        o.transport = transport;
        tune(o)
    });
    for ep in [&p.client, &p.server] {
        assert_eq!(ep.rail_transports(), vec![kind; rails]);
    }
    p
}
