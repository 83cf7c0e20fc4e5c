//! The engine over loopback, with 1 to 4 rails, on same-host rails (shared-memory rings), as two processes on one host get by default.

mod common;

#[path = "loopback/cases.rs"]
mod cases;

use braid::{EndpointOptions, RailTransport};
use common::Pair;

const TRANSPORT: RailTransport = RailTransport::Auto;

/// A pair whose rails are all carried by [`TRANSPORT`].
fn pair(rails: usize) -> Pair {
    pair_with(rails, |_| {})
}

fn pair_with(rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    let p = common::pair_with(rails, |o| {
        o.transport = TRANSPORT;
        tune(o)
    });
    for ep in [&p.client, &p.server] {
        assert_eq!(ep.rail_transports(), vec!["shm"; rails]);
    }
    p
}
