//! # braid-boot
//!
//! Forms a group of N processes with a braid endpoint between every pair, from what the
//! launcher put in the environment (`docs/LAUNCH.md` in the repository has the contract):
//!
//! * rank and size from Open MPI (`OMPI_COMM_WORLD_RANK/SIZE`), PMI (`PMI_RANK/SIZE`),
//!   Slurm (`SLURM_PROCID/NTASKS`) or braid's own `BRAID_RANK/SIZE`;
//! * the rendezvous `BRAID_ROOT=host:port`: rank 0 listens there, every rank connects and
//!   publishes its rail addresses, rank 0 hands out the table. Under `mpirun` and `srun` it
//!   defaults to one derived from the launcher's own environment ([`launcher`]);
//! * the job's identity (`BRAID_JOB`, else the launcher's job id), so two jobs on one port
//!   are told apart, and the cluster secret (`BRAID_SECRET`, `BRAID_SECRET_FILE`), which
//!   authenticates the rendezvous as it does braid's rails.
//!
//! Each pair of ranks then gets one rail per pair of their addresses in a common subnet (one
//! loopback rail within one host), see [`addrs`]. The connection to the rendezvous stays open
//! for the job's life: [`World::barrier`], [`World::allgather`], and a rank that dies is
//! reported to every other ([`World::check`]).
//!
//! ```no_run
//! use braid_boot::{LaunchEnv, World, WorldOptions};
//!
//! let ctx = braid::Context::new()?;
//! let cq = ctx.create_cq(256);
//! let world = World::join(&ctx, &LaunchEnv::from_env()?, &WorldOptions::new(&cq))?;
//! let names = world.allgather(format!("rank {}", world.rank()).as_bytes())?;
//! assert_eq!(names.len(), world.size());
//! if let Some(ep) = world.endpoint((world.rank() + 1) % world.size()) {
//!     // braid operations to the next rank: ep.write(...), ep.send(...), ...
//! #   let _ = ep;
//! }
//! world.finalize()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

pub mod addrs;
mod auth;
mod client;
mod env;
mod error;
pub mod hostlist;
pub mod launcher;
mod port;
mod root;
pub mod wire;
mod world;

pub use addrs::{HostAddr, RailSpec};
pub use env::{
    JOB_ENV, JOIN_TIMEOUT_ENV, LAUNCHER_JOB_VARS, LaunchEnv, RAILS_ENV, RANK_SIZE_VARS, ROOT_ENV,
};
pub use error::{BootError, Refusal};
pub use port::rendezvous_port;
pub use world::{World, WorldOptions};
