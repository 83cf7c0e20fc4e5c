//! # braid-proto
//!
//! braid's sans-IO core, as quinn-proto is to quinn: everything that decides what goes on
//! the wire and what a peer's frame may do, with no sockets, threads or clock.
//!
//! * [`wire`]: the rail handshake and the frame header (`docs/PROTOCOL.md`).
//! * [`mem`]: registered memory ([`Region`]) and the [`Registry`] that the target side
//!   checks every access against (key, rights, range, generation).
//! * [`Session`]: one endpoint's protocol state over all its rails, fed with frame headers
//!   and payloads by a driver and drained of frames to send, placements and completions.
//!
//! * [`link`]: a reliable ordered byte stream over lossy datagrams, which raw-Ethernet
//!   rails run on.
//!
//! Applications use the `braid` crate, which drives a [`Session`] per endpoint from its
//! progress engine and re-exports the user-facing types of this crate. The simulator tests
//! and the fuzz targets drive a [`Session`] directly.

#![warn(missing_docs)]

pub mod error;
pub mod link;
pub mod mem;
mod proto;
pub mod wire;

pub use error::{Completion, CompletionKind, Error, Status};
pub use mem::{Access, Region, RegionOptions, Registry, RemoteKey, RemoteSge, Sge};
pub use proto::{
    EXPRESS_MAX, EXPRESS_WINDOW, ExpressAction, ExpressRequest, ExpressTo, HedgeStats, Placement,
    PostError, ProtocolError, Request, RxAction, Session, SessionConfig, Transmit, rate, session,
};
