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
//! the backend that moves bytes (a `Backend` trait; backends hand finished operations back
//! through a completion sink, never calling into the front): the io_uring one for plain sockets, the
//! braid one for sockets in braid mode.
//!
//! ## braid mode: how a program chooses it
//!
//! When both ends use this library, a socket can ride a braid endpoint striped over several
//! rails (one TCP connection per NIC) with the same ES-API calls. A program chooses it per
//! socket, after making an ordinary TCP connection (the *bootstrap* socket):
//!
//! ```text
//!  accepting side                                  connecting side
//!  s = accept(l)                                   s = socket(); connect(s, ...)
//!  exs_braid_attach(s, "198.18.0.2,198.18.1.2",    exs_braid_attach(s, "198.18.0.1,198.18.1.1",
//!                   EXS_BRAID_ACCEPT)                               EXS_BRAID_CONNECT)
//!  exs_recv(s, ...) ... (unchanged)                exs_send(s, ...) ... (unchanged)
//! ```
//!
//! (Rust: [`braid_attach`] with [`BraidRole`].) The accepting side lists its rail IPs (it
//! listens on ephemeral ports and sends them over the bootstrap socket); the connecting side
//! lists its own rail IPs, or `LOCAL=REMOTE:PORT` pairs. `NULL` takes `EXS_BRAID_LISTEN` /
//! `EXS_BRAID_RAILS` from the environment, and without those one rail joins the bootstrap
//! addresses. A socket never attached stays in plain-socket mode; so does a `dup` of an
//! attached descriptor (braid mode belongs to the descriptor number, checked against the
//! socket's inode on every call so that a reused number is not mistaken for it).
//!
//! Data path (rsockets-style): each `exs_recv` registers exactly its buffer with braid
//! (remote-write only; the key is revoked before the event) and *advertises* it (key, length,
//! receive number) to the peer with a braid `send`. The sender keeps a FIFO of advertised
//! buffers and `write_with_imm`s its bytes straight into them — from the socket into the
//! receiver's memory, no other copy — the immediate carrying the byte count, the receive's
//! number (mod 256) and whether it completes the receive. A send with nothing advertised waits
//! in the socket's queue (flow control: the ES-API limits still give `EAGAIN`). Stream
//! semantics: a receive completes when the queued send bytes run out or it is full
//! (`MSG_WAITALL`: only when full or at end of stream); a send may fill several receives and a
//! receive may take bytes of several queued sends. Sends complete in posting order once placed
//! at the peer; receives complete in posting order. Unlike plain mode, several sends and
//! receives of a socket are in flight at once (the braid backend orders them itself).
//! Registering per operation costs 0.63 µs (register + deregister, measured), so memory
//! handles are checked by the front as usual but braid does not need them.
//!
//! End of stream: `shutdown(fd, SHUT_WR)` or `close(fd)` on the bootstrap socket. The peer's
//! library sees end of file there (checked every 20 ms), asks over braid for the end of the
//! stream, and this side answers once its posted sends are written: the peer's receives then
//! complete with 0 after every byte. At process exit the library ends open streams the same way
//! (`atexit`, at most 2 s), like the kernel with a TCP socket. A peer that vanishes (killed,
//! rails reset) fails pending and later operations: receives `ECONNRESET`, sends `EPIPE`.
//! `exs_poll`, `exs_connect`, `exs_accept` act on the bootstrap socket itself.
//!
//! Threads: braid mode adds the braid progress engine (one per process, shared by all braid
//! sockets) and one completion thread (`exs-braid`) that drains the braid completion queue,
//! drives each socket's state and posts the ES-API events.
//!
//! Measured. Loopback, 2 shared cores, both ends in one process
//! (`cargo run --release -p braid-exs --example exs_bench -- --braid 4 --size S --seconds 2
//! --rounds 2 --depth 8`), ratio to plain `send()`/`recv()` in the same run: 1 MiB: 1 rail
//! 0.91, 4 rails 0.77 (CPU 0.37/0.38 s/GB against 0.33); 4 MiB: 1.17 / 0.96; 256 KiB: 0.61 /
//! 0.62 (per-operation advert and completion costs). On loopback the rails share the same
//! CPU, so more rails do not help. On the emulated cluster (`examples/c/run_testbed.sh`: two
//! namespaces, 4 × 1 Gbit/s tbf rails, MTU 1500, framing limit 478.2 MB/s), `exs_braid.c`
//! with 8 × 4 MiB receives and sends in flight: 1 rail 118.9 MB/s against one TCP stream's
//! 119.33; 4 rails 452.2 MB/s = 3.79 × one TCP stream (94.6 % of the framing limit) without
//! the checksum, 270.7 MB/s with the byte-wise checksum running on the same 2 cores.
//! Smaller buffers cost throughput: 8 × 1 MiB reached 153 MB/s, 16 × 1 MiB 289–356 MB/s.
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
//! Plain mode keeps one send (or one batch) per socket in the kernel at a time, for order.
//! Sends queued behind it go to the kernel together as one `sendmsg` (at most 16 sends and
//! 1 MiB). On loopback TCP a large call is cheaper per byte than several small ones, beyond
//! the syscalls saved: `exs_bench --size 65536 --depth 16 --dequeue-half --seconds 2
//! --rounds 2 --send-batch N`, whose `send()` side then writes N buffers a call, three
//! alternations at 2026-11-28 17:54 UTC: N = 16 (1 MiB a call) 5.2-5.7 GB/s at 0.25-0.27
//! CPU s/GB; N = 8 3.8-3.9 GB/s at 0.34-0.35; N = 1 (plain `send()`) 3.8-4.1 GB/s at
//! 0.33-0.35. (So an application that gathers 1 MiB into one `writev` itself gets this too.)
//!
//! An application that reaps half of its outstanding sends and reposts them would leave
//! the batches at half size: when a batch finishes, the other half is already queued and
//! goes at once, and the reposts queue behind it. So when a send's event wakes a thread
//! waiting on its queue and the sends queued behind it make at most half a batch, the front
//! holds them back for that thread's reposts. The hold ends as soon as the batch is full,
//! the thread waits on a queue again (its reposts are done), it posts a synchronous send,
//! or after 50 µs (a timer in the ring), whichever comes first. A short batch behind a send
//! whose event wakes nobody is never held.
//!
//! `exs_bench --size 65536 --depth 16 --dequeue-half --seconds 3 --rounds 3` (that
//! pattern), ten runs at 2026-11-28 18:05 UTC: 1.14-1.44x the throughput of `send()`
//! (median 1.29) at 0.69-0.86x its CPU per byte; ten at 17:50 UTC: 1.03-1.62x (median
//! 1.26) at 0.63-0.95x; before the hold (15:28 UTC, the same command)
//! 0.97-1.22x (median 1.10) at 0.84-1.02x. Sends reaped as they come (`--size 65536
//! --depth 16 --seconds 2 --rounds 3`), four alternations of the builds before and after
//! the hold, 17:48-17:50 UTC: exs 4.63-4.88 GB/s before, 4.86-5.05 after.
//!
//! ## Limits
//!
//! Operations on a socket whose descriptor was closed while they were outstanding keep the
//! socket open until they complete: `shutdown()` first. `exs_cancel` returns `ENOSYS`.
//! A thread woken by a send's event that neither sends again nor waits on a queue delays
//! the short batch held for it by up to 50 µs (see Throughput).
//! braid mode: a socket's state lingers after `close()` until the peer ends its direction
//! too (or fails); each attach makes its own endpoint (no sharing of rails between sockets);
//! `exs_braid_attach` blocks (at most 15 s) and wants no operation outstanding on the socket.

#![warn(missing_docs)]

// Layers, each using only those below it (checked by scripts/check-module-cycles.py):
//   abi, ffi, sys        C types; the `unsafe` crossings of the C boundary; socket calls
//   queue, op            event queues; operations, the backend interface, the sink
//   uring, braid_mode    the backends (they hand finished operations to the sink)
//   front                handles, ordering, flow control; owns the backends
//   api, capi            the Rust API and the C ABI over the front
pub mod abi;
mod api;
mod braid_mode;
pub mod capi;
mod ffi;
mod front;
mod op;
mod queue;
mod sys;
mod uring;

pub use abi::*;
pub use api::{
    Buffer, Event, EventKind, Flags, NextEvent, Queue, Registration, Rejected, braid_attach,
    braid_attach_timeout, init, set_zerocopy_min, zerocopy_min,
};
pub use braid_mode::BraidRole;
