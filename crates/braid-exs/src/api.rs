//! The idiomatic Rust API over the same machinery as the C ABI.

use std::fmt;
use std::future::Future;
use std::io;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::front::global;
use crate::op::OpKind;
use crate::queue::{Completion, QueueShared};

fn err(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

/// Start the library (the progress thread and its io_uring). Optional: every other call
/// starts it too. Fails if io_uring is unavailable.
pub fn init() -> io::Result<()> {
    global().map(drop).map_err(err)
}

/// Zero-copy sends (`SEND_ZC`) are used for registered buffers of at least `bytes` bytes;
/// 0 turns them off (the default, see the crate documentation for why).
pub fn set_zerocopy_min(bytes: usize) -> io::Result<()> {
    global().map_err(err)?.set_zerocopy_min(bytes);
    Ok(())
}

/// The current zero-copy threshold (0: off).
pub fn zerocopy_min() -> io::Result<usize> {
    Ok(global().map_err(err)?.zerocopy_min())
}

/// Put the connected stream socket `sock` (the *bootstrap* connection) in **braid mode**:
/// from now on [`Queue::send`]/[`Queue::recv`] (and `exs_send`/`exs_recv`/`exs_sendv`/
/// `exs_recvv` from C) on it travel over a braid endpoint striped over several rails, the
/// sender writing straight into the receive buffers the receiving side posted.
///
/// Both ends call it, one with [`BraidRole::Connect`](crate::BraidRole::Connect) (the side that called `connect()`),
/// the other with [`BraidRole::Accept`](crate::BraidRole::Accept); it blocks until the endpoint is up (at most 15 s,
/// see [`braid_attach_timeout`]). `rails`:
///
/// * connecting side: comma-separated `LOCAL` (a rail from this local IP to the accepting
///   side's next listening address) or `LOCAL=REMOTE:PORT` (a rail to an explicit address).
///   `None`: the environment variable `EXS_BRAID_RAILS`, and if that is unset or empty, one
///   rail to each of the accepting side's addresses.
/// * accepting side: comma-separated `ADDR` (listen on an ephemeral port) or `ADDR:PORT`, one
///   per rail; the addresses are sent to the connecting side over `sock`. `None`: the
///   environment variable `EXS_BRAID_LISTEN`, and if that is unset or empty, the local
///   address of `sock` (one rail).
///
/// The socket must have no operation outstanding. It then stays open and idle: do not
/// read or write it directly. `shutdown(SHUT_WR)` or `close()` on it ends the stream as on
/// TCP: the peer's receives complete with 0 bytes after every byte sent before.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use exs::{BraidRole, Queue, braid_attach};
/// let s = std::net::TcpStream::connect("198.18.0.2:5000")?;
/// braid_attach(&s, BraidRole::Connect, Some("198.18.0.1,198.18.1.1,198.18.2.1,198.18.3.1"))?;
/// let q = Queue::new(16)?;
/// q.send(&s, vec![7u8; 1 << 20], 1).map_err(|r| r.error)?;
/// # Ok(()) }
/// ```
pub fn braid_attach(
    sock: &impl AsFd,
    role: crate::BraidRole,
    rails: Option<&str>,
) -> io::Result<()> {
    braid_attach_timeout(sock, role, rails, crate::braid_mode::ATTACH_TIMEOUT)
}

/// [`braid_attach`] with a bound on the exchange other than 15 s.
pub fn braid_attach_timeout(
    sock: &impl AsFd,
    role: crate::BraidRole,
    rails: Option<&str>,
    timeout: Duration,
) -> io::Result<()> {
    global()
        .map_err(err)?
        .braid_attach(sock.as_fd().as_raw_fd(), role, rails, timeout)
        .map_err(err)
}

/// Memory registered with the library. Owns its bytes; deregistered on drop.
///
/// Registration lets the backend pin the pages once (an io_uring fixed buffer), so
/// zero-copy sends need no per-send pinning.
pub struct Registration {
    handle: exs_mhandle_t,
    mem: Box<[u8]>,
}

impl Registration {
    /// Register `mem` (must not be empty).
    pub fn new(mem: impl Into<Box<[u8]>>) -> io::Result<Self> {
        let mut mem = mem.into();
        let h = global()
            .map_err(err)?
            .mregister(mem.as_mut_ptr(), mem.len(), 0)
            .map_err(err)?;
        Ok(Registration { handle: h, mem })
    }

    /// Allocate and register `len` zeroed bytes.
    pub fn zeroed(len: usize) -> io::Result<Self> {
        Self::new(vec![0u8; len])
    }

    /// The `exs_mhandle_t` of this registration.
    pub fn handle(&self) -> exs_mhandle_t {
        self.handle
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// Whether the registration is empty (never: registering nothing fails).
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.mem
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.mem
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(g) = global() {
            // Cannot be busy: an operation using it owns it until its event.
            let _ = g.mderegister(self.handle);
        }
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("handle", &self.handle)
            .field("len", &self.mem.len())
            .finish()
    }
}

enum Storage {
    Plain(Vec<u8>),
    Registered(Registration),
}

/// A buffer handed to the library for one operation and handed back in its [`Event`]:
/// a plain `Vec<u8>` (sent as `EXS_MHANDLE_UNREGISTERED`) or a range of a [`Registration`].
pub struct Buffer {
    storage: Storage,
    range: Range<usize>,
}

impl Buffer {
    /// A plain vector; the whole vector is sent, or filled by a receive.
    pub fn plain(v: Vec<u8>) -> Self {
        let range = 0..v.len();
        Buffer {
            storage: Storage::Plain(v),
            range,
        }
    }

    /// A range of a registration. A range outside the registration is refused (EINVAL) when
    /// the buffer is submitted.
    pub fn registered(reg: Registration, range: Range<usize>) -> Self {
        Buffer {
            storage: Storage::Registered(reg),
            range,
        }
    }

    /// The range of the storage that the operation uses.
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The whole storage.
    pub fn as_slice(&self) -> &[u8] {
        match &self.storage {
            Storage::Plain(v) => v,
            Storage::Registered(r) => r.as_slice(),
        }
    }

    /// The whole storage, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Plain(v) => v,
            Storage::Registered(r) => r.as_mut_slice(),
        }
    }

    /// The plain vector, if this is one.
    pub fn into_vec(self) -> Option<Vec<u8>> {
        match self.storage {
            Storage::Plain(v) => Some(v),
            Storage::Registered(_) => None,
        }
    }

    /// The registration, if this is one.
    pub fn into_registration(self) -> Option<Registration> {
        match self.storage {
            Storage::Registered(r) => Some(r),
            Storage::Plain(_) => None,
        }
    }

    /// (pointer, length, memory handle) for the front, or EINVAL if a plain range is out of bounds.
    fn parts(&mut self) -> Result<(*mut libc::c_void, usize, exs_mhandle_t), i32> {
        let (base, cap, mh) = match &mut self.storage {
            Storage::Plain(v) => (v.as_mut_ptr(), v.len(), EXS_MHANDLE_UNREGISTERED),
            Storage::Registered(r) => (r.mem.as_mut_ptr(), r.len(), r.handle),
        };
        let Range { start, end } = self.range;
        if start > end || (mh == EXS_MHANDLE_UNREGISTERED && end > cap) {
            return Err(libc::EINVAL);
        }
        // Registered ranges are checked against the registration by the front; wrapping_add
        // keeps an out-of-range pointer from being UB before that check refuses it.
        Ok((base.wrapping_add(start).cast(), end - start, mh))
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Self {
        Buffer::plain(v)
    }
}

impl From<Registration> for Buffer {
    fn from(r: Registration) -> Self {
        let range = 0..r.len();
        Buffer::registered(r, range)
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.storage {
            Storage::Plain(_) => "plain",
            Storage::Registered(_) => "registered",
        };
        f.debug_struct("Buffer")
            .field("kind", &kind)
            .field("range", &self.range)
            .finish()
    }
}

/// An operation the library refused at submission (`EAGAIN` for flow control, or a real
/// error); the buffer comes back.
#[derive(Debug, thiserror::Error)]
#[error("exs submission refused: {error}")]
pub struct Rejected {
    /// Why. `ErrorKind::WouldBlock` (EAGAIN): dequeue events, then retry.
    pub error: io::Error,
    /// The buffer, unchanged.
    pub buffer: Buffer,
}

impl Rejected {
    /// Whether this is flow control (`EAGAIN`): dequeue, then retry.
    pub fn is_would_block(&self) -> bool {
        self.error.raw_os_error() == Some(libc::EAGAIN)
    }
}

bitflags::bitflags! {
    /// Flags of a send or receive, combined with `|`.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct Flags: i32 {
        /// Receive: complete only when the buffer is full or the stream ended (`MSG_WAITALL`).
        const WAITALL = libc::MSG_WAITALL;
        /// Send: more data follows (`MSG_MORE`).
        const MORE = libc::MSG_MORE;
        /// Complete before returning (the event is still posted): [`EXS_MSG_SYNC`].
        const SYNC = EXS_MSG_SYNC;
    }
}

impl Flags {
    /// No flags.
    pub const NONE: Flags = Flags::empty();
}

/// What kind of operation an [`Event`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A send.
    Send,
    /// A receive.
    Recv,
    /// A vectored send.
    SendMsg,
    /// A vectored receive.
    RecvMsg,
    /// A connect.
    Connect,
    /// An accept.
    Accept,
    /// A poll.
    Poll,
    /// Another `EXS_EVT_*` value.
    Other(i32),
}

/// A completion event.
pub struct Event {
    raw: exs_event_t,
    buffer: Option<Buffer>,
}

impl Event {
    fn from_completion(c: Completion) -> Self {
        let buffer = c
            .owner
            .and_then(|o| o.downcast::<Buffer>().ok())
            .map(|b| *b);
        Event { raw: c.ev, buffer }
    }

    /// The kind of operation.
    pub fn kind(&self) -> EventKind {
        match self.raw.ev_type {
            EXS_EVT_SEND => EventKind::Send,
            EXS_EVT_RECV => EventKind::Recv,
            EXS_EVT_SENDMSG => EventKind::SendMsg,
            EXS_EVT_RECVMSG => EventKind::RecvMsg,
            EXS_EVT_CONNECT => EventKind::Connect,
            EXS_EVT_ACCEPT => EventKind::Accept,
            EXS_EVT_POLL => EventKind::Poll,
            o => EventKind::Other(o),
        }
    }

    /// The socket.
    pub fn fd(&self) -> RawFd {
        self.raw.ev_fd
    }

    /// The `user` value given with the operation.
    pub fn user(&self) -> u64 {
        self.raw.ev_ahandle as usize as u64
    }

    /// Bytes moved (0 for a receive: the peer closed), or the error.
    pub fn result(&self) -> io::Result<usize> {
        if self.raw.ev_errno != 0 {
            Err(err(self.raw.ev_errno))
        } else {
            Ok(self.raw.ev_result as usize)
        }
    }

    /// The buffer of a send or receive submitted through this API.
    pub fn buffer(&self) -> Option<&Buffer> {
        self.buffer.as_ref()
    }

    /// Take the buffer back.
    pub fn into_buffer(self) -> Option<Buffer> {
        self.buffer
    }

    /// The C event.
    pub fn raw(&self) -> &exs_event_t {
        &self.raw
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("kind", &self.kind())
            .field("fd", &self.fd())
            .field("user", &self.user())
            .field("result", &self.result())
            .field("buffer", &self.buffer)
            .finish()
    }
}

/// An event queue. Its depth bounds the operations outstanding on it plus the events not
/// yet dequeued: past it, submissions are refused with `EAGAIN`.
///
/// Dropping the queue deletes it; events of operations still in flight are then discarded
/// (their buffers freed).
pub struct Queue {
    handle: exs_qhandle_t,
    shared: Arc<QueueShared>,
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("handle", &self.handle)
            .finish()
    }
}

impl Queue {
    /// Create a queue of the given depth (1..=65536).
    pub fn new(depth: usize) -> io::Result<Self> {
        let g = global().map_err(err)?;
        let depth = i32::try_from(depth).map_err(|_| err(libc::EINVAL))?;
        let handle = g.qcreate(depth).map_err(err)?;
        let shared = g.queue(handle).map_err(err)?;
        Ok(Queue { handle, shared })
    }

    /// The `exs_qhandle_t` (for mixing with the C API).
    pub fn handle(&self) -> exs_qhandle_t {
        self.handle
    }

    fn xfer(
        &self,
        kind: OpKind,
        fd: RawFd,
        mut buf: Buffer,
        flags: Flags,
        user: u64,
    ) -> Result<Option<usize>, Rejected> {
        let parts = match buf.parts() {
            Ok(p) => p,
            Err(e) => {
                return Err(Rejected {
                    error: err(e),
                    buffer: buf,
                });
            }
        };
        let g = match global() {
            Ok(g) => g,
            Err(e) => {
                return Err(Rejected {
                    error: err(e),
                    buffer: buf,
                });
            }
        };
        // The buffer moves into the op; its heap memory (what `parts` points at) does not move.
        let mut owner: Option<Box<dyn std::any::Any + Send>> = Some(Box::new(buf));
        match g.submit_xfer(
            kind,
            false,
            fd,
            &[parts],
            flags.bits(),
            self.handle,
            user as usize,
            &mut owner,
        ) {
            Ok(r) => Ok(r),
            Err(e) => match owner.and_then(|o| o.downcast::<Buffer>().ok()) {
                Some(buffer) => Err(Rejected {
                    error: err(e),
                    buffer: *buffer,
                }),
                // Accepted, then failed synchronously: the outcome and buffer are in the event.
                None => Ok(None),
            },
        }
    }

    /// Send the buffer's range on the stream socket `fd`. The buffer is the library's until
    /// the event, which hands it back. Sends of one socket never interleave their bytes.
    pub fn send(&self, fd: &impl AsFd, buf: impl Into<Buffer>, user: u64) -> Result<(), Rejected> {
        self.send_with(fd, buf, Flags::NONE, user)
    }

    /// [`send`](Self::send) with flags. With [`Flags::SYNC`] it returns after the operation
    /// completed; the outcome and the buffer are in the event, which is still posted.
    pub fn send_with(
        &self,
        fd: &impl AsFd,
        buf: impl Into<Buffer>,
        flags: Flags,
        user: u64,
    ) -> Result<(), Rejected> {
        self.xfer(
            OpKind::Send,
            fd.as_fd().as_raw_fd(),
            buf.into(),
            flags,
            user,
        )
        .map(drop)
    }

    /// Receive into the buffer's range: completes when at least one byte arrived, with 0 when
    /// the peer closed. Receives of one socket complete in order.
    pub fn recv(&self, fd: &impl AsFd, buf: impl Into<Buffer>, user: u64) -> Result<(), Rejected> {
        self.recv_with(fd, buf, Flags::NONE, user)
    }

    /// [`recv`](Self::recv) with flags ([`Flags::WAITALL`]: fill the whole range unless the stream ends).
    pub fn recv_with(
        &self,
        fd: &impl AsFd,
        buf: impl Into<Buffer>,
        flags: Flags,
        user: u64,
    ) -> Result<(), Rejected> {
        self.xfer(
            OpKind::Recv,
            fd.as_fd().as_raw_fd(),
            buf.into(),
            flags,
            user,
        )
        .map(drop)
    }

    /// Up to `max` events, waiting (up to `timeout`, `None`: without limit) while none is
    /// ready. Empty on timeout or when `max` is 0.
    pub fn dequeue(&self, max: usize, timeout: Option<Duration>) -> io::Result<Vec<Event>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let max = max.min(i32::MAX as usize) as i64;
        self.dequeue_raw(max, timeout)
    }

    /// Exactly `n` events, waiting (up to `timeout`) until `n` are ready; empty on timeout.
    /// `n` larger than the depth is refused (EINVAL).
    pub fn dequeue_exact(&self, n: usize, timeout: Option<Duration>) -> io::Result<Vec<Event>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let n = i64::try_from(n).map_err(|_| err(libc::EINVAL))?;
        self.dequeue_raw(-n, timeout)
    }

    /// One event, or `None` on timeout.
    pub fn dequeue_one(&self, timeout: Option<Duration>) -> io::Result<Option<Event>> {
        Ok(self.dequeue(1, timeout)?.pop())
    }

    fn dequeue_raw(&self, count: i64, timeout: Option<Duration>) -> io::Result<Vec<Event>> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        // A thread that comes to wait has done its sending: sends held back for it go.
        global().map_err(err)?.release_held();
        let got = self.shared.dequeue(count, deadline).map_err(err)?;
        Ok(got.into_iter().map(Event::from_completion).collect())
    }

    /// A future resolving to the next event; works with any executor (the progress thread
    /// wakes the task's `Waker`).
    pub fn next_event(&self) -> NextEvent<'_> {
        NextEvent { queue: self }
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        if let Ok(g) = global() {
            let _ = g.qdelete(self.handle, true);
        }
    }
}

/// Future returned by [`Queue::next_event`].
#[derive(Debug)]
pub struct NextEvent<'a> {
    queue: &'a Queue,
}

impl Future for NextEvent<'_> {
    type Output = io::Result<Event>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Ok(g) = global() {
            g.release_held();
        }
        match self.queue.shared.poll_one(cx.waker()) {
            Some(Ok(c)) => Poll::Ready(Ok(Event::from_completion(c))),
            Some(Err(e)) => Poll::Ready(Err(err(e))),
            None => Poll::Pending,
        }
    }
}
