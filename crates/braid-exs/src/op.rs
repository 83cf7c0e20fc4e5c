//! The bottom of the crate (over `queue`, `sys` and `ffi`): an operation ([`Op`]) as the front hands it to a backend, the
//! interface of a backend ([`Backend`]), and where a backend hands a finished operation
//! back ([`CompletionSink`]). The front depends on the backends; the backends depend only on
//! this module (and `sys`, `ffi`), never on the front.

use std::any::Any;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::queue::{QueueShared, SyncSlot};

pub(crate) use crate::abi::Errno;

/// What kind of work an [`Op`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// Stream send (plain or vectored).
    Send,
    /// Stream receive (plain or vectored).
    Recv,
    /// Asynchronous connect.
    Connect,
    /// Asynchronous accept.
    Accept,
    /// Asynchronous poll.
    Poll,
}

/// The front's part of an op: what it needs to post the event once the op is done. Opaque
/// to backends.
pub(crate) struct OpFront {
    /// `EXS_EVT_*` of the event.
    pub(crate) ev_type: i32,
    /// Flags as the caller passed them (for the event).
    pub(crate) user_flags: i32,
    /// The caller's first buffer (handed back in the event, never dereferenced).
    pub(crate) first_buf: usize,
    pub(crate) iovcnt: i32,
    /// The queue the event goes to.
    pub(crate) queue: Arc<QueueShared>,
    pub(crate) ahandle: usize,
    /// Where an `EXS_MSG_SYNC` caller waits.
    pub(crate) sync: Option<Arc<SyncSlot>>,
    /// The Rust buffer the op owns, handed back in the event.
    pub(crate) owner: Option<Box<dyn Any + Send>>,
    /// Memory handles whose in-flight counts this op holds.
    pub(crate) regs: Vec<u32>,
}

/// One operation, owned by the front until started, then by the backend until it hands it
/// back through its [`CompletionSink`]. `Send` (see `ffi`): its raw pointers are the
/// application's lent buffers.
pub(crate) struct Op {
    pub kind: OpKind,
    pub fd: RawFd,
    /// `MSG_*` flags for the kernel (EXS-only bits removed, `MSG_NOSIGNAL` added for sends).
    pub msg_flags: i32,
    /// Send/recv: keep going until the whole buffer moved (always for sends).
    pub waitall: bool,
    /// Remaining buffers (the backend advances them on short transfers).
    pub iov: Vec<libc::iovec>,
    /// Backend cookie of the registration covering `iov[0]` when there is exactly one buffer.
    pub fixed: Option<u32>,
    /// Total bytes asked for.
    pub total: usize,
    /// Bytes moved so far.
    pub done: usize,
    /// Connect/accept address.
    pub addr: libc::sockaddr_storage,
    pub addrlen: libc::socklen_t,
    /// Poll events asked for.
    pub poll_events: i16,
    /// Backend scratch (e.g. a zero-copy result waiting for its notification).
    pub scratch: Option<i32>,
    /// Backend scratch: the op is waiting for readiness after an `EAGAIN`.
    pub polling: bool,
    /// Backend scratch: the `msghdr` of vectored operations (stable: the op is boxed).
    pub msg: libc::msghdr,
    /// Plain-mode send batching: sends of the same socket that ride along with this one in
    /// one `sendmsg`, in order. While it is non-empty, `iov` holds this op's remaining
    /// buffers followed by all of theirs; each follower keeps its own (untouched) `iov`.
    pub batch: VecDeque<Box<Op>>,
    /// The front's bookkeeping.
    pub(crate) front: OpFront,
}

impl Op {
    /// Append `f` to this op's batch: its buffers go after everything this op still sends.
    pub(crate) fn ride(&mut self, f: Box<Op>) {
        self.iov.extend_from_slice(&f.iov);
        self.batch.push_back(f);
    }
}

/// Where a backend hands back a finished operation: `Ok(n)` (bytes, new fd, revents) or
/// `Err(errno)`. Every op a backend was given goes back exactly once, and never from inside
/// [`Backend::start`] (the front holds its lock there).
pub(crate) trait CompletionSink: Send + Sync {
    /// The op finished: release its socket's ordering slot (start the next op of that socket
    /// and direction) and post its event.
    fn complete(&self, op: Box<Op>, res: Result<usize, Errno>);
    /// Like [`CompletionSink::complete`] for a batched send that is not the batch's last op:
    /// posts the event but keeps the socket's send slot, which the rest of the batch holds.
    fn complete_held(&self, op: Box<Op>, res: Result<usize, Errno>);
    /// The time a backend was asked for with [`Backend::arm_flush`] is up: start the sends
    /// held back for it.
    fn flush_held(&self);
}

/// A transport that moves the bytes of operations: the io_uring backend for plain sockets,
/// the braid backend for sockets in braid mode.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Start an operation. The front guarantees at most one `Send` (or one batch of them, see
    /// [`Backend::batchable`]) and one `Recv` in flight per plain socket, so a backend may
    /// resubmit a short transfer's remainder before anything else. The backend hands the op
    /// back through its [`CompletionSink`], exactly once, never from inside `start`.
    fn start(&self, op: Box<Op>);
    /// May `op` (a send queued behind another) share one submission with its neighbours?
    /// A backend that says yes must handle [`Op::batch`] and finish the batch's ops in
    /// order, calling [`CompletionSink::complete_held`] for all but the last.
    fn batchable(&self, _op: &Op) -> bool {
        false
    }
    /// Call [`CompletionSink::flush_held`] within `after`, from the thread that completes
    /// this backend's operations. Asked only on that thread; `false` if the backend cannot,
    /// and then the front holds nothing back.
    fn arm_flush(&self, _after: std::time::Duration) -> bool {
        false
    }
    /// Memory was registered: return a cookie for [`Op::fixed`] if the backend can use it
    /// (e.g. an io_uring fixed-buffer slot). `Err(errno)` refuses the registration.
    fn register(&self, addr: *mut u8, len: usize) -> Result<Option<u32>, Errno>;
    /// Forget a cookie returned by `register` (no op uses it any more).
    fn deregister(&self, cookie: u32);
}

/// Advance `iov` past `n` bytes that moved: whole buffers are dropped, a partly moved one
/// starts after its moved bytes.
pub(crate) fn advance(iov: &mut Vec<libc::iovec>, mut n: usize) {
    let mut i = 0;
    while n > 0 && i < iov.len() {
        let l = iov[i].iov_len;
        if n >= l {
            n -= l;
            i += 1;
        } else {
            // Address arithmetic only (wrapping_add is safe): the new base stays inside the
            // same buffer since n < l.
            iov[i].iov_base = iov[i].iov_base.cast::<u8>().wrapping_add(n).cast();
            iov[i].iov_len -= n;
            n = 0;
        }
    }
    iov.drain(..i);
}

/// A bare op of `kind` over one buffer of `total` bytes (at an address never touched), for
/// unit tests of the front and the backends.
#[cfg(test)]
pub(crate) fn test_op(kind: OpKind, total: usize) -> Box<Op> {
    Box::new(Op {
        kind,
        fd: -1,
        msg_flags: 0,
        waitall: kind == OpKind::Send,
        iov: vec![libc::iovec {
            iov_base: 0x1000 as *mut libc::c_void,
            iov_len: total,
        }],
        fixed: None,
        total,
        done: 0,
        addr: crate::ffi::sockaddr_zeroed(),
        addrlen: 0,
        poll_events: 0,
        scratch: None,
        polling: false,
        msg: crate::ffi::msghdr_zeroed(),
        batch: VecDeque::new(),
        front: OpFront {
            ev_type: 0,
            user_flags: 0,
            first_buf: 0x1000,
            iovcnt: 1,
            queue: Arc::new(QueueShared::new(1)),
            ahandle: 0,
            sync: None,
            owner: None,
            regs: Vec::new(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iov(base: usize, len: usize) -> libc::iovec {
        libc::iovec {
            iov_base: base as *mut libc::c_void,
            iov_len: len,
        }
    }

    #[test]
    fn advance_over_buffers() {
        let mut v = vec![iov(1000, 10), iov(2000, 5), iov(3000, 7)];
        advance(&mut v, 0);
        assert_eq!(v.len(), 3);
        advance(&mut v, 4);
        assert_eq!((v[0].iov_base as usize, v[0].iov_len), (1004, 6));
        advance(&mut v, 6);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].iov_base as usize, v[0].iov_len), (2000, 5));
        advance(&mut v, 8);
        assert_eq!((v[0].iov_base as usize, v[0].iov_len), (3003, 4));
        advance(&mut v, 4);
        assert!(v.is_empty());
        advance(&mut v, 9);
        assert!(v.is_empty());
    }
}
