//! The plain-socket backend: one io_uring owned by one progress thread.
//!
//! * Callers never touch the ring's queues: [`UringBackend::start`] pushes the op on a
//!   mutex-protected list and, if the progress thread is not already notified, writes an
//!   eventfd that the ring always has a read posted on. (Only the progress thread submits,
//!   so requests never die with the thread that posted them, and there is one submitter.)
//! * The progress thread drains the list, turns ops into SQEs (the op's `Box` pointer is the
//!   `user_data`), submits and waits in one `io_uring_enter`, then turns CQEs into either a
//!   resubmission (short transfer, `EAGAIN`) or a completion handed to the front's
//!   [`CompletionSink`].
//! * Memory registration fills a slot of a sparse fixed-buffer table, so zero-copy sends
//!   (`SEND_ZC` with `IORING_RECVSEND_FIXED_BUF`) of registered buffers need no page pinning
//!   per send. Whether zero-copy is used depends on the buffer size (`BRAID_EXS_ZC_MIN`).

use std::cell::Cell;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use io_uring::{IoUring, cqueue, opcode, squeue, types, types::Fd};
use parking_lot::Mutex;

use crate::op::{Backend, CompletionSink, Errno, Op, OpKind, advance};

thread_local! {
    static ON_PROGRESS: Cell<bool> = const { Cell::new(false) };
}

/// True on the progress thread (where blocking for an operation would deadlock).
pub(crate) fn on_progress_thread() -> bool {
    ON_PROGRESS.with(|c| c.get())
}

const WAKE: u64 = 0;
/// The `user_data` of the flush timer (op pointers are never 1).
const FLUSH: u64 = 1;
const FIXED_SLOTS: u32 = 1024;
const MAX_CHUNK: usize = 1 << 30;
/// Default zero-copy threshold (0 = never); see the crate docs for the measurements.
pub(crate) const DEFAULT_ZC_MIN: usize = 0;

/// The io_uring plain-socket backend.
pub(crate) struct UringBackend {
    ring: IoUring,
    // Boxed on purpose: the box pointer becomes the SQE user_data and must not move.
    #[allow(clippy::vec_box)]
    pending: Mutex<Vec<Box<Op>>>,
    notified: AtomicBool,
    efd: OwnedFd,
    slots: Mutex<Vec<u32>>,
    zc_min: AtomicUsize,
    sink: &'static dyn CompletionSink,
    /// A flush timer is in the ring; `flush_after` is what it was armed with (the kernel
    /// reads it at submission, and it is not rewritten until the timer has fired).
    flush_armed: AtomicBool,
    flush_after: Mutex<types::Timespec>,
}

impl UringBackend {
    /// Create the ring and start the progress thread.
    pub(crate) fn start(sink: &'static dyn CompletionSink) -> Result<Arc<Self>, Errno> {
        let ring = IoUring::builder()
            .setup_cqsize(8192)
            .setup_coop_taskrun()
            .build(512)
            .or_else(|_| IoUring::builder().build(512))
            .map_err(|e| e.raw_os_error().unwrap_or(libc::ENOSYS))?;
        let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
            .map_err(|e| e.raw_os_error())?;
        let slots = if ring
            .submitter()
            .register_buffers_sparse(FIXED_SLOTS)
            .is_ok()
        {
            (0..FIXED_SLOTS).rev().collect()
        } else {
            Vec::new()
        };
        let zc_min = std::env::var("BRAID_EXS_ZC_MIN")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(DEFAULT_ZC_MIN);
        let me = Arc::new(UringBackend {
            ring,
            pending: Mutex::new(Vec::new()),
            notified: AtomicBool::new(false),
            efd,
            slots: Mutex::new(slots),
            zc_min: AtomicUsize::new(zc_min),
            sink,
            flush_armed: AtomicBool::new(false),
            flush_after: Mutex::new(types::Timespec::new()),
        });
        let th = me.clone();
        std::thread::Builder::new()
            .name("exs-progress".into())
            .spawn(move || th.run())
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
        Ok(me)
    }

    pub(crate) fn set_zc_min(&self, n: usize) {
        self.zc_min.store(n, Ordering::Relaxed)
    }

    pub(crate) fn zc_min(&self) -> usize {
        self.zc_min.load(Ordering::Relaxed)
    }

    /// Queue an entry for the next submission; `false` if the queue stayed full.
    fn push(&self, e: squeue::Entry) -> bool {
        // Bounded: each round either pushes or submits (which frees SQ space).
        for _ in 0..1000 {
            // SAFETY: only the progress thread touches the submission queue.
            let mut sq = unsafe { self.ring.submission_shared() };
            // SAFETY: the entry's pointers live in a boxed Op, the thread's wake buffer or
            // `flush_after`, each alive until the entry's CQE is reaped.
            if unsafe { sq.push(&e) }.is_ok() {
                return true;
            }
            drop(sq);
            let _ = self.ring.submit();
        }
        tracing::error!("exs: submission queue stuck full");
        false
    }

    fn run(self: Arc<Self>) {
        ON_PROGRESS.with(|c| c.set(true));
        let mut wake_buf = Box::new(0u64);
        let mut arm_wake = true;
        let mut local: Vec<Box<Op>> = Vec::new();
        let mut cqes: Vec<(u64, i32, u32)> = Vec::with_capacity(512);
        loop {
            if arm_wake {
                let e = opcode::Read::new(
                    Fd(self.efd.as_raw_fd()),
                    &mut *wake_buf as *mut u64 as *mut u8,
                    8,
                )
                .build()
                .user_data(WAKE);
                // Retried at the next turn if the queue stayed full.
                arm_wake = !self.push(e);
            }
            std::mem::swap(&mut local, &mut *self.pending.lock());
            for op in local.drain(..) {
                self.issue(op);
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EBUSY | libc::EAGAIN)
                    ) => {}
                Err(e) => {
                    tracing::error!("exs: io_uring_enter: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            cqes.clear();
            {
                // SAFETY: only the progress thread touches the completion queue.
                let cq = unsafe { self.ring.completion_shared() };
                cqes.extend(cq.map(|c| (c.user_data(), c.result(), c.flags())));
            }
            for &(ud, res, flags) in &cqes {
                if ud == WAKE {
                    self.notified.store(false, Ordering::SeqCst);
                    arm_wake = true;
                    continue;
                }
                if ud == FLUSH {
                    self.flush_armed.store(false, Ordering::Relaxed);
                    self.sink.flush_held();
                    continue;
                }
                self.on_cqe(ud, res, flags);
            }
        }
    }

    /// Turn an op into an SQE, or finish it if nothing is left to do.
    fn issue(&self, mut op: Box<Op>) {
        let fd = Fd(op.fd);
        let e = if op.polling {
            let ev = if op.kind == OpKind::Send {
                libc::POLLOUT
            } else {
                libc::POLLIN
            };
            opcode::PollAdd::new(fd, ev as u32).build()
        } else {
            match op.kind {
                OpKind::Send | OpKind::Recv
                    if op.iov.is_empty() || op.done >= op.total && op.total > 0 =>
                {
                    let n = op.done;
                    self.sink.complete(op, Ok(n));
                    return;
                }
                // A batch always goes as one sendmsg (below).
                OpKind::Send if op.iov.len() == 1 && op.batch.is_empty() => {
                    let len = op.iov[0].iov_len.min(MAX_CHUNK) as u32;
                    let base = op.iov[0].iov_base as *const u8;
                    let zc = self.zc_min();
                    match op.fixed {
                        Some(slot) if zc != 0 && len as usize >= zc => {
                            opcode::SendZc::new(fd, base, len)
                                .buf_index(Some(slot as u16))
                                .flags(op.msg_flags)
                                .build()
                        }
                        _ => opcode::Send::new(fd, base, len).flags(op.msg_flags).build(),
                    }
                }
                OpKind::Recv if op.iov.len() == 1 => {
                    let len = op.iov[0].iov_len.min(MAX_CHUNK) as u32;
                    opcode::Recv::new(fd, op.iov[0].iov_base as *mut u8, len)
                        .flags(op.msg_flags)
                        .build()
                }
                OpKind::Send | OpKind::Recv => {
                    op.msg.msg_iov = op.iov.as_mut_ptr();
                    op.msg.msg_iovlen = op.iov.len();
                    if op.kind == OpKind::Send {
                        opcode::SendMsg::new(fd, &op.msg)
                            .flags(op.msg_flags as u32)
                            .build()
                    } else {
                        opcode::RecvMsg::new(fd, &mut op.msg)
                            .flags(op.msg_flags as u32)
                            .build()
                    }
                }
                OpKind::Connect => opcode::Connect::new(
                    fd,
                    (&op.addr as *const libc::sockaddr_storage).cast(),
                    op.addrlen,
                )
                .build(),
                OpKind::Accept => opcode::Accept::new(
                    fd,
                    (&mut op.addr as *mut libc::sockaddr_storage).cast(),
                    &mut op.addrlen,
                )
                .flags(libc::SOCK_CLOEXEC)
                .build(),
                OpKind::Poll => opcode::PollAdd::new(fd, op.poll_events as u16 as u32).build(),
            }
        };
        let ud = Box::into_raw(op) as u64;
        if !self.push(e.user_data(ud)) {
            // SAFETY: the entry never reached the ring: the op is still ours. It fails (with
            // its batch, op by op) rather than never completing.
            let op = unsafe { Box::from_raw(ud as *mut Op) };
            self.fail(op, libc::EBUSY);
        }
    }

    fn on_cqe(&self, ud: u64, res: i32, flags: u32) {
        let ptr = ud as *mut Op;
        if cqueue::more(flags) {
            // First CQE of a zero-copy send: keep the result until the buffer is released.
            // SAFETY: ud is an Op we leaked in `issue`, still owned by the ring.
            unsafe { (*ptr).scratch = Some(res) };
            return;
        }
        // SAFETY: this is the op's last CQE: take it back.
        let mut op = unsafe { Box::from_raw(ptr) };
        let res = if cqueue::notif(flags) {
            op.scratch.take().unwrap_or(0)
        } else {
            res
        };
        if op.polling {
            op.polling = false;
            if res < 0 && res != -libc::EINTR {
                self.sink.complete(op, Err(-res));
            } else {
                self.issue(op);
            }
            return;
        }
        match op.kind {
            OpKind::Send | OpKind::Recv => {
                if res == -libc::EINTR {
                    return self.issue(op);
                }
                if res == -libc::EAGAIN {
                    op.polling = true;
                    return self.issue(op);
                }
                if res < 0 {
                    return self.fail(op, -res);
                }
                let n = res as usize;
                advance(&mut op.iov, n);
                if !op.batch.is_empty() {
                    return self.batch_progress(op, n);
                }
                op.done += n;
                let finished =
                    op.done >= op.total || (op.kind == OpKind::Recv && (n == 0 || !op.waitall));
                if finished {
                    let d = op.done;
                    self.sink.complete(op, Ok(d));
                } else if n == 0 {
                    self.sink.complete(op, Err(libc::EPIPE));
                } else {
                    self.issue(op);
                }
            }
            _ => {
                if res < 0 {
                    self.sink.complete(op, Err(-res))
                } else {
                    self.sink.complete(op, Ok(res as usize))
                }
            }
        }
    }

    /// A batched send moved `n` more bytes (already taken off `op.iov`): credit them to the
    /// batch's ops in order, complete every op whose bytes are all sent (the last one
    /// releases the socket's send slot), and resubmit the remainder before anything else.
    fn batch_progress(&self, mut op: Box<Op>, mut n: usize) {
        if n == 0 {
            // The stream refuses bytes: the same as an unbatched send.
            return self.fail(op, libc::EPIPE);
        }
        loop {
            let take = n.min(op.total - op.done);
            op.done += take;
            n -= take;
            if op.done < op.total {
                break;
            }
            let done = op.done;
            let Some(mut next) = op.batch.pop_front() else {
                return self.sink.complete(op, Ok(done));
            };
            // The remaining buffers (all of them the followers') and the rest of the batch
            // move to the next op, which now leads.
            next.iov = std::mem::take(&mut op.iov);
            next.batch = std::mem::take(&mut op.batch);
            self.sink.complete_held(op, Ok(done));
            op = next;
        }
        debug_assert_eq!(n, 0);
        self.issue(op);
    }

    /// A send or receive failed. In a batch only the leading op (the one the error hit, as
    /// without batching) fails; the ops behind it are resubmitted as a new batch, so each
    /// meets the socket's state on its own, exactly as if they had been queued one by one.
    fn fail(&self, mut op: Box<Op>, err: Errno) {
        let mut rest = std::mem::take(&mut op.batch);
        let Some(mut lead) = rest.pop_front() else {
            return self.sink.complete(op, Err(err));
        };
        self.sink.complete_held(op, Err(err));
        // Followers behind the leader have sent nothing yet: their own `iov` is intact.
        for f in rest {
            lead.ride(f);
        }
        self.issue(lead);
    }

    /// Would `op` go zero-copy from its fixed buffer (see `issue`)?
    fn zc_eligible(&self, op: &Op) -> bool {
        let zc = self.zc_min();
        op.fixed.is_some() && zc != 0 && op.total >= zc
    }
}

impl Backend for UringBackend {
    fn start(&self, op: Box<Op>) {
        self.pending.lock().push(op);
        if !on_progress_thread() && !self.notified.swap(true, Ordering::SeqCst) {
            let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
        }
    }

    /// Plain stream sends join a batch (one `sendmsg` over all their buffers) unless they
    /// would go zero-copy from a fixed buffer, carry urgent data (`MSG_OOB` marks only the
    /// last byte of a call), are empty, or are waiting for readiness.
    fn batchable(&self, op: &Op) -> bool {
        op.kind == OpKind::Send
            && op.total > 0
            && !op.polling
            && op.done == 0
            && op.batch.is_empty()
            && op.msg_flags & libc::MSG_OOB == 0
            && !self.zc_eligible(op)
    }

    /// One timer serves every socket: a flush that comes early only ends a hold sooner.
    fn arm_flush(&self, after: std::time::Duration) -> bool {
        if !on_progress_thread() {
            return false;
        }
        if self.flush_armed.swap(true, Ordering::Relaxed) {
            return true;
        }
        let mut ts = self.flush_after.lock();
        *ts = types::Timespec::from(after);
        let ptr: *const types::Timespec = &*ts;
        // SAFETY: the timespec lives in `self` and is not written again before this
        // timer's completion clears `flush_armed`; the kernel reads it when it is submitted.
        let armed = self.push(opcode::Timeout::new(ptr).build().user_data(FLUSH));
        if !armed {
            self.flush_armed.store(false, Ordering::Relaxed);
        }
        armed
    }

    fn register(&self, addr: *mut u8, len: usize) -> Result<Option<u32>, Errno> {
        if len > MAX_CHUNK {
            return Ok(None);
        }
        let Some(slot) = self.slots.lock().pop() else {
            return Ok(None);
        };
        let iov = libc::iovec {
            iov_base: addr.cast(),
            iov_len: len,
        };
        // SAFETY: the application promises the memory stays valid until exs_mderegister,
        // which clears the slot.
        match unsafe {
            self.ring
                .submitter()
                .register_buffers_update(slot, &[iov], None)
        } {
            Ok(()) => Ok(Some(slot)),
            Err(e) => {
                self.slots.lock().push(slot);
                match e.raw_os_error() {
                    Some(libc::EFAULT) => Err(libc::EFAULT),
                    _ => Ok(None),
                }
            }
        }
    }

    fn deregister(&self, cookie: u32) {
        let iov = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        // SAFETY: an empty iovec clears the slot.
        let r = unsafe {
            self.ring
                .submitter()
                .register_buffers_update(cookie, &[iov], None)
        };
        if r.is_ok() {
            self.slots.lock().push(cookie);
        }
    }
}
