//! # braid-exs: the Extended Sockets API (ES-API) for Rust and C
//!
//! The Open Group's Extended Sockets API adds memory registration, asynchronous
//! send/receive/connect/accept/poll and event queues to Berkeley sockets. This crate
//! implements it, with UNH EXS's extensions (synchronous mode, unregistered buffers), as
//!
//! * a C library (`libexs.so`, `libexs.a`, header `include/sys/exs.h`), see [`capi`];
//! * an idiomatic Rust API: [`Queue`], [`Registration`], [`Buffer`], [`Event`].
//!
//! ## Plain-socket mode
//!
//! A socket made with `socket()`/`connect()`/`accept()` works with the `exs_*` calls while
//! the peer uses plain `send()`/`recv()`. Bytes move through one io_uring owned by one
//! progress thread (`exs-progress`):
//!
//! ```text
//!  caller threads                          exs-progress thread
//!  exs_send ─ check args, handles ─┐
//!           flow control (EAGAIN)  │ per-socket FIFO: one send + one recv in flight
//!           push op, eventfd ──────┼──▶ drain ops → SQEs → io_uring_enter(submit+wait)
//!                                  │    CQE: short? resubmit remainder : complete(op)
//!  exs_qdequeue ◀── condvar/waker ─┴─── post event to the op's queue, start next op
//! ```
//!
//! The front (handles, queues, events, argument checks, ordering, C ABI) is separate from
//! the backend that moves bytes (a `Backend` trait; the io_uring one is the only backend
//! today). braid mode — a socket riding a braid endpoint over several rails — plugs in as a
//! second backend chosen per socket.
//!
//! ## Zero-copy
//!
//! Registered memory fills an io_uring fixed-buffer slot, so `SEND_ZC` needs no per-send
//! pinning. Whether zero-copy is used is the threshold [`set_zerocopy_min`] (environment
//! `BRAID_EXS_ZC_MIN`; 0 = off, the default). On loopback the receiver copies zero-copy
//! pages anyway and each send costs a second (notification) completion, so it measured
//! slower: 1 MiB sends 0.87 of `send()` with zero-copy against 1.04 without; 64 KiB sends
//! 0.49 against 0.87 (`examples/exs_bench.rs`, same run, alternating rounds). Re-measure on a
//! real NIC before turning it on.
//!
//! ## Throughput (loopback, 2 shared cores, noisy)
//!
//! `cargo run --release -p braid-exs --example exs_bench -- --size N --seconds 2 --rounds 3`:
//! exs/`send()` throughput ratio 1.04–1.09 at 1 MiB, 1.06 at 128 KiB, 1.31 at 256 KiB,
//! 1.34 at 4 MiB, but 0.85–0.87 at 64 KiB, where the per-operation hand-off to the progress
//! thread and one-send-in-flight-per-socket dominate (batching queued sends of a socket into
//! one `sendmsg` is the next step).
//!
//! ## Limits
//!
//! Operations on a socket whose descriptor was closed while they were outstanding keep the
//! socket open until they complete: `shutdown()` first. `exs_cancel` returns `ENOSYS`.

#![warn(missing_docs)]

pub mod abi;
mod api;
mod braid_mode;
pub mod capi;
mod core;
mod uring;

pub use abi::*;
pub use api::{
    Buffer, Event, EventKind, Flags, NextEvent, Queue, Registration, Rejected, braid_attach,
    braid_attach_timeout, init, set_zerocopy_min, zerocopy_min,
};
pub use braid_mode::BraidRole;
