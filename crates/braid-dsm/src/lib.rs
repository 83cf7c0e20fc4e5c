//! # braid-dsm
//!
//! A sequentially consistent, page-based distributed shared memory on braid: every rank of
//! a job maps one shared range at the same virtual address, and plain loads and stores to
//! it are coherent across ranks, page by page.
//!
//! * **Protocol**: IVY's single writer / multiple readers invalidation with a fixed
//!   distributed manager (each page has a home that knows its owner and copy set), as a
//!   sans-IO state machine in [`proto`] that a deterministic simulator drives too.
//! * **Faults**: `userfaultfd` catches reads of absent pages (a copy is fetched) and writes
//!   to read-only pages (ownership is taken and every other copy invalidated first); one
//!   service thread per process serves them and the other ranks' requests.
//! * **Transport**: braid endpoints between every pair of ranks (formed by `braid-boot`
//!   from the launcher's environment); page data moves by `write_with_imm` into the
//!   requester's registered staging slot, control by `send`, lock words by `fetch_add`.
//! * **Synchronisation**: fair ticket locks on braid atomics (waiters are told by message)
//!   and a dissemination barrier.
//!
//! ```no_run
//! use braid_dsm::Dsm;
//!
//! let dsm = Dsm::init()?; // rank, size and BRAID_ROOT from the launcher
//! let a = dsm.alloc(1 << 20)?; // collective: same size on every rank, same address
//! if dsm.rank() == 0 {
//!     a.write::<u64>(0, 42);
//! }
//! dsm.barrier()?;
//! assert_eq!(a.read::<u64>(0), 42);
//! dsm.lock(7)?;
//! a.write::<u64>(8, a.read::<u64>(8) + 1);
//! dsm.unlock(7)?;
//! dsm.free(a)?;
//! dsm.finalize()?;
//! # Ok::<(), braid_dsm::DsmError>(())
//! ```
//!
//! The C API (`include/braid/dsm.h`, `libbraid_dsm.so`/`.a`) offers the same calls. The
//! repository's `docs/DSM.md` has the protocol, the consistency argument and the limits.

#![warn(missing_docs)]

mod api;
pub mod capi;
mod config;
mod error;
pub mod litmus;
pub mod proto;
mod runtime;

pub use api::{Allocation, Dsm, DsmStats};
pub use config::{
    DsmConfig, HOME_ENV, LOCKS_ENV, SLOTS_ENV, SPACE_ENV, SPIN_ENV, SPIN_WAIT_ENV,
    SPREAD_RAILS_ENV, USER_FAULTS_ONLY_ENV, parse_policy,
};
pub use error::DsmError;
pub use proto::HomePolicy;
pub use runtime::EXIT_STATUS_UNSERVABLE;
