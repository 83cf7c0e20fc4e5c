//! The engine over loopback, with 1 to 4 rails, on raw-Ethernet rails (`RailTransport::Raw`:
//! the rails' bytes in Ethernet frames through one AF_XDP port on `lo`, generic mode). Needs
//! root; skips, saying why, elsewhere.

mod common;

#[path = "loopback/cases.rs"]
mod cases;

use braid::{EndpointOptions, RailTransport};
use common::Pair;

fn pair(rails: usize) -> Pair {
    pair_with(rails, |_| {})
}

fn pair_with(rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    common::pair_over(RailTransport::Raw, "raw", rails, tune)
}
