//! # braid-bench
//!
//! What `braid bench`, `braid baseline`, `braid demo`, `braid soak` and `braid fs bench` run:
//! perftest-style benchmarks of braid's operations ([`bench`](mod@bench)), the plain TCP and
//! PM/Ethernet-style trunking baselines they are compared with ([`baseline`]), the trunking
//! demo with its table and chart ([`demo`], [`report`], [`chart`]), the verified random mix
//! with rail failures ([`soak`]) and the file service against sshfs ([`fsbench`]). The
//! `braid` binary is a thin front end over these modules; each is usable from tests.

pub mod args;
pub mod baseline;
pub mod bench;
pub mod chart;
pub mod demo;
pub mod fsbench;
pub mod report;
pub mod soak;
