//! Library side of the `braid` command: `braid run`, the launcher of braid-boot jobs
//! ([`run`]). The benchmarks, baselines, demo and soak runs are in the `braid-bench` crate,
//! the emulated cluster in `braid-testbed`; the binary (`src/main.rs`) is a thin clap front
//! end over them.

pub mod run;
