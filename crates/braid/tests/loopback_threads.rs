//! The engine over loopback, with 1 to 4 rails, on TCP rails, with four engine threads per
//! context (`ContextConfig::engine_threads`): the rails of a 4-rail pair are then read and
//! written by a thread each, on both sides, and every case must hold as with one thread.

mod common;

#[path = "loopback/cases.rs"]
mod cases;

use braid::{ContextConfig, EndpointOptions, RailTransport};
use common::Pair;

fn pair(rails: usize) -> Pair {
    pair_with(rails, |_| {})
}

fn pair_with(rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    let cfg = ContextConfig {
        engine_threads: 4,
        ..ContextConfig::from_env().expect("context settings from the environment")
    };
    common::pair_over_in(&cfg, RailTransport::Tcp, "tcp", rails, tune)
}
