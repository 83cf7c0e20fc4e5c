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
//! `BRAID_EXS_ZC_MIN`; 0 = off, the default): on loopback the receiver has to copy
//! zero-copy pages anyway and the notification costs a second completion, so it measured
//! slower there (see `docs` in the report and `examples/exs_bench.rs`).

#![warn(missing_docs)]

pub mod abi;
mod api;
pub mod capi;
mod core;
mod uring;

pub use abi::*;
pub use api::{
    Buffer, Event, EventKind, Flags, NextEvent, Queue, Registration, Rejected, init,
    set_zerocopy_min, zerocopy_min,
};
