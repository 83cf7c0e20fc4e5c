//! Library side of the `braid` command: `braid run`, the launcher of braid-boot jobs
//! ([`run`]), `braid info`, what braid sees and can use on this host ([`info`]), and how the
//! command reports errors and logs ([`diag`]). The benchmarks, baselines, demo and soak runs
//! are in the `braid-bench` crate, the emulated cluster in `braid-testbed`; the binary
//! (`src/main.rs`) is a thin clap front end over them.

pub mod diag;
pub mod info;
pub mod run;
