//! # braid-testkit
//!
//! What braid's tests, simulators, benchmarks and soak runs share, written once:
//!
//! * [`Rng`]: a seeded generator (splitmix64), so a run is replayed from its seed;
//! * [`pattern`]: byte patterns in which every word depends on a seed and its offset, so
//!   stale, misplaced or foreign bytes show;
//! * `loopback` (feature `loopback`): two braid endpoints connected over loopback rails;
//! * [`maps::mapped_private`]: whether memory is mapped copy-on-write (page exchange).

#![warn(missing_docs)]

#[cfg(feature = "loopback")]
pub mod loopback;
pub mod maps;
pub mod pattern;
mod rng;

pub use rng::Rng;
