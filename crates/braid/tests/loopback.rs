//! The engine over loopback, with 1 to 4 rails, on same-host rails (shared-memory rings), as two processes on one host get by default.

mod common;

#[path = "loopback/cases.rs"]
mod cases;

use braid::{EndpointOptions, RailTransport};
use common::Pair;

fn pair(rails: usize) -> Pair {
    pair_with(rails, |_| {})
}

fn pair_with(rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    common::pair_over(RailTransport::Auto, "shm", rails, tune)
}
