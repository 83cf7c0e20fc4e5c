//! # braid
//!
//! Remote memory access, messaging and completion queues over several commodity Ethernet
//! NICs at once: what an RDMA NIC gives a program, on ordinary TCP/IP networks.
//!
//! * A [`Context`] per process owns the progress engine thread and the registered memory.
//! * [`Region`]s are registered memory with [`Access`] rights; peers reach them through a
//!   [`RemoteKey`].
//! * An [`Endpoint`] connects to one peer over one or more *rails* (TCP connections, ideally
//!   one per NIC); large operations are cut into chunks striped over all rails and placed
//!   straight into the destination memory.
//! * Operations (`write`, `write_with_imm`, `read`, `fetch_add`, `compare_swap`, `send`,
//!   `post_recv`) complete into a [`CompletionQueue`] that can be polled, waited on or
//!   awaited.
//!
//! ```no_run
//! use braid::{Access, Context, EndpointOptions, RailAddr};
//! use std::time::Duration;
//!
//! let ctx = Context::new()?;
//! let cq = ctx.create_cq(64);
//! let buf = ctx.alloc_region(1 << 20, Access::all())?;
//! let rails: Vec<RailAddr> = vec!["127.0.0.1=127.0.0.1:7000".parse()?];
//! let ep = ctx.connect(&rails, &EndpointOptions::new(&cq))?;
//! # let remote_key: braid::RemoteKey = unimplemented!();
//! ep.write(1, &[buf.slice(0, 4096)?], &remote_key, 0)?;
//! let c = cq.wait(Duration::from_secs(5)).expect("completion");
//! assert!(c.status.is_ok());
//! # Ok::<(), braid::Error>(())
//! ```
//!
//! The protocol core is sans-IO and lives in the `braid-proto` crate, which a simulator or a
//! fuzz target can drive without sockets; the wire format is described in the repository's
//! `docs/PROTOCOL.md`.

#![warn(missing_docs)]

mod context;
mod cq;
mod endpoint;
mod engine;
mod netns;
pub mod throttle;

pub use braid_proto::wire::handshake::MAX_RAILS;
pub use braid_proto::wire::sgl::MAX_REMOTE_SGE;
pub use braid_proto::{
    Access, Completion, CompletionKind, Error, Region, RegionOptions, RemoteKey, RemoteSge,
    SessionConfig, Sge, Status,
};
pub use context::policy::INSECURE_ENV;
pub use context::{
    Context, ContextConfig, ENGINE_THREADS_ENV, Listener, MAX_ENGINE_THREADS, SECRET_ENV,
    SECRET_FILE_ENV, policy,
};
pub use cq::{ArmedQueue, CompletionQueue, NextCompletion};
pub use endpoint::{
    Endpoint, EndpointOptions, Op, PAGE_EXCHANGE_ENV, PostListError, RailAddr, RailTransport,
    TRANSPORT_ENV, WorkRequest,
};
