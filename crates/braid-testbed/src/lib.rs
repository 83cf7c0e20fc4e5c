//! # braid-testbed
//!
//! An emulated cluster of hosts with several NICs each, on one Linux machine: each host is a
//! network namespace, each NIC a veth pair into a per-rail bridge namespace, each link's speed
//! a `tbf` qdisc. `braid testbed`, the benchmarks, the demo and the tests that need real
//! rails use it ([`testbed`]); [`parse`] has the rail (`LOCAL=REMOTE:PORT,...`) and rate
//! (`1gbit`) syntax that braid's commands share.

pub mod parse;
pub mod secret;
pub mod testbed;

pub use testbed::{Testbed, TestbedSpec};
