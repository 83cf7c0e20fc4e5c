//! Library side of the `braid` command: the emulated multi-NIC testbed, the plain TCP and
//! trunking baselines, the demo and its table and chart. The binary (`src/main.rs`) is a thin
//! clap front end over these modules; tests use them directly.

pub mod baseline;
pub mod chart;
pub mod demo;
pub mod fsbench;
pub mod parse;
pub mod report;
pub mod run;
pub mod soak;
pub mod testbed;
