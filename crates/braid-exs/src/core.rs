//! The ES-API front: handle tables, event queues, per-socket ordering and flow control,
//! argument checking. Independent of how bytes move: that is a [`Backend`]'s job.
//!
//! Locks: one `Core` mutex for the tables and socket states, then (never the other way
//! round) a queue's own mutex. Waiters on a queue take only that queue's mutex.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::abi::*;
use crate::braid_mode::{BraidBackend, BraidRole};
use crate::uring::UringBackend;

/// An error number (`errno` value).
pub(crate) type Errno = i32;

// ---------------------------------------------------------------------------------------
// Backend interface

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

/// One operation, owned by the front until started, then by the backend until
/// it hands it back through [`complete`].
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
    // --- front side ---
    pub(crate) ev_type: i32,
    pub(crate) user_flags: i32,
    pub(crate) first_buf: *mut libc::c_void,
    pub(crate) iovcnt: i32,
    pub(crate) queue: Arc<QueueShared>,
    pub(crate) ahandle: usize,
    pub(crate) sync: Option<Arc<SyncSlot>>,
    pub(crate) owner: Option<Box<dyn Any + Send>>,
    pub(crate) regs: Vec<u32>,
    /// Plain-mode send batching: sends of the same socket that ride along with this one in
    /// one `sendmsg`, in order. While it is non-empty, `iov` holds this op's remaining
    /// buffers followed by all of theirs; each follower keeps its own (untouched) `iov`.
    pub batch: VecDeque<Box<Op>>,
}

/// Most sends one batch carries, and most bytes: enough to amortise the per-operation
/// hand-off, small enough to keep the completion of the first op prompt.
const BATCH_OPS: usize = 16;
const BATCH_BYTES: usize = 1 << 20;
/// `sendmsg` refuses more than `UIO_MAXIOV` buffers.
const BATCH_IOVS: usize = 1024;

impl Op {
    /// Append `f` to this op's batch: its buffers go after everything this op still sends.
    pub(crate) fn ride(&mut self, f: Box<Op>) {
        self.iov.extend_from_slice(&f.iov);
        self.batch.push_back(f);
    }
}

// SAFETY: the raw pointers in an Op refer to memory the application handed to the library
// until the op's event; the op moves between the caller and the progress thread.
unsafe impl Send for Op {}

/// A transport that moves the bytes of operations. The plain-socket io_uring backend is
/// [`UringBackend`]; braid mode (a socket riding a braid endpoint) will be a second one.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Start an operation. The front guarantees at most one `Send` (or one batch of them, see
    /// [`Backend::batchable`]) and one `Recv` in flight per socket, so a backend may resubmit
    /// a short transfer's remainder before anything else.
    /// The backend must eventually hand the op back through [`complete`], exactly once, and
    /// never from inside `start` (the caller holds the front's lock).
    fn start(&self, op: Box<Op>);
    /// May `op` (a send queued behind another) share one submission with its neighbours?
    /// A backend that says yes must handle [`Op::batch`] and finish the batch's ops in
    /// order, calling [`complete_held`] for all but the last.
    fn batchable(&self, _op: &Op) -> bool {
        false
    }
    /// Memory was registered: return a cookie for [`Op::fixed`] if the backend can use it
    /// (e.g. an io_uring fixed-buffer slot). `Err(errno)` refuses the registration.
    fn register(&self, addr: *mut u8, len: usize) -> Result<Option<u32>, Errno>;
    /// Forget a cookie returned by `register` (no op uses it any more).
    fn deregister(&self, cookie: u32);
}

/// How a socket's bytes travel. Plain sockets use the io_uring backend; a socket attached
/// with `exs_braid_attach` rides a braid endpoint ([`BraidBackend`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SockMode {
    Plain,
    /// Sends and receives of the socket are started as soon as they are submitted (the
    /// braid backend keeps several receives advertised and several sends queued, and
    /// completes them in order itself).
    Braid,
}

// ---------------------------------------------------------------------------------------
// Handle tables

/// A table of generation-checked `int` handles: `(generation << 16) | index`, always >= 0x10000.
pub(crate) struct Table<T> {
    slots: Vec<(u16, Option<T>)>,
    free: Vec<u32>,
}

impl<T> Table<T> {
    const MAX: usize = 0x1_0000;

    fn new() -> Self {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    fn insert(&mut self, v: T) -> Option<i32> {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None if self.slots.len() < Self::MAX => {
                self.slots.push((0, None));
                self.slots.len() - 1
            }
            None => return None,
        };
        let slot = &mut self.slots[idx];
        slot.0 = if slot.0 >= 0x7fff { 1 } else { slot.0 + 1 };
        slot.1 = Some(v);
        Some(((slot.0 as i32) << 16) | idx as i32)
    }

    fn index(h: i32) -> Option<(usize, u16)> {
        if h < 0x1_0000 {
            return None;
        }
        Some(((h & 0xffff) as usize, (h >> 16) as u16))
    }

    fn get(&self, h: i32) -> Option<&T> {
        let (i, g) = Self::index(h)?;
        match self.slots.get(i) {
            Some((generation, Some(v))) if *generation == g => Some(v),
            _ => None,
        }
    }

    fn get_mut(&mut self, h: i32) -> Option<&mut T> {
        let (i, g) = Self::index(h)?;
        match self.slots.get_mut(i) {
            Some((generation, Some(v))) if *generation == g => Some(v),
            _ => None,
        }
    }

    fn remove(&mut self, h: i32) -> Option<T> {
        let (i, g) = Self::index(h)?;
        match self.slots.get_mut(i) {
            Some((generation, v @ Some(_))) if *generation == g => {
                self.free.push(i as u32);
                v.take()
            }
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Queues

/// An event as stored in a queue: the C event plus, for Rust-API operations, the buffer
/// that the operation owned.
pub(crate) struct Completion {
    pub ev: exs_event_t,
    pub owner: Option<Box<dyn Any + Send>>,
}

struct QState {
    depth: usize,
    /// Operations outstanding plus events not yet dequeued.
    reserved: usize,
    events: VecDeque<Completion>,
    deleted: bool,
    wakers: Vec<Waker>,
}

/// An event queue.
pub(crate) struct QueueShared {
    state: Mutex<QState>,
    cond: Condvar,
}

impl QueueShared {
    fn post(&self, c: Completion) {
        let wakers = {
            let mut st = self.state.lock();
            if st.deleted {
                // Nobody can dequeue it any more; the owned buffer (if any) is freed here.
                st.reserved -= 1;
                return;
            }
            st.events.push_back(c);
            std::mem::take(&mut st.wakers)
        };
        self.cond.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    /// Dequeue: `count > 0`: 1..=count events, waiting while none; `count < 0`: exactly
    /// `-count`, waiting until that many; `deadline` None waits without limit. Returns an
    /// empty vector on timeout. `Err(EINVAL)` if the queue was deleted meanwhile.
    pub(crate) fn dequeue(
        &self,
        count: i64,
        deadline: Option<Instant>,
    ) -> Result<Vec<Completion>, Errno> {
        let need = if count < 0 {
            count.unsigned_abs() as usize
        } else {
            1
        };
        let max = count.unsigned_abs() as usize;
        let mut st = self.state.lock();
        if need > st.depth {
            return Err(libc::EINVAL);
        }
        loop {
            if st.deleted {
                return Err(libc::EINVAL);
            }
            if st.events.len() >= need {
                let n = st.events.len().min(max);
                st.reserved -= n;
                return Ok(st.events.drain(..n).collect());
            }
            match deadline {
                None => self.cond.wait(&mut st),
                Some(d) => {
                    if Instant::now() >= d || self.cond.wait_until(&mut st, d).timed_out() {
                        if st.events.len() >= need && !st.deleted {
                            continue;
                        }
                        return Ok(Vec::new());
                    }
                }
            }
        }
    }

    /// Non-blocking dequeue of one event for the async API; registers `waker` if none.
    pub(crate) fn poll_one(&self, waker: &Waker) -> Option<Result<Completion, Errno>> {
        let mut st = self.state.lock();
        if st.deleted {
            return Some(Err(libc::EINVAL));
        }
        if let Some(c) = st.events.pop_front() {
            st.reserved -= 1;
            return Some(Ok(c));
        }
        if !st.wakers.iter().any(|w| w.will_wake(waker)) {
            st.wakers.push(waker.clone());
        }
        None
    }

    fn reserve(&self) -> Result<(), Errno> {
        let mut st = self.state.lock();
        if st.deleted {
            return Err(libc::EINVAL);
        }
        if st.reserved >= st.depth {
            return Err(libc::EAGAIN);
        }
        st.reserved += 1;
        Ok(())
    }
}

/// Where a synchronous (`EXS_MSG_SYNC`) caller waits for its operation.
pub(crate) struct SyncSlot {
    done: Mutex<Option<(isize, i32)>>,
    cond: Condvar,
}

// ---------------------------------------------------------------------------------------
// Core state

struct RegEntry {
    addr: usize,
    len: usize,
    inflight: usize,
    cookie: Option<u32>,
}

#[derive(Default)]
struct Sock {
    outstanding: usize,
    send_busy: bool,
    send_fifo: VecDeque<Box<Op>>,
    recv_busy: bool,
    recv_fifo: VecDeque<Box<Op>>,
}

struct Core {
    queues: Table<Arc<QueueShared>>,
    regs: Table<RegEntry>,
    socks: HashMap<RawFd, (SockMode, Sock)>,
}

pub(crate) struct Global {
    core: Mutex<Core>,
    plain: Arc<UringBackend>,
    /// Started by the first `exs_braid_attach`.
    braid: OnceLock<Arc<BraidBackend>>,
    braid_start: Mutex<()>,
}

static GLOBAL: OnceLock<Result<Global, Errno>> = OnceLock::new();

/// The braid-mode backend, if a socket was ever attached.
pub(crate) fn braid_backend() -> Option<&'static Arc<BraidBackend>> {
    GLOBAL.get()?.as_ref().ok()?.braid.get()
}

/// The library state, started on first use (the progress thread and its ring).
pub(crate) fn global() -> Result<&'static Global, Errno> {
    GLOBAL
        .get_or_init(|| {
            let plain = UringBackend::start()?;
            Ok(Global {
                core: Mutex::new(Core {
                    queues: Table::new(),
                    regs: Table::new(),
                    socks: HashMap::new(),
                }),
                plain,
                braid: OnceLock::new(),
                braid_start: Mutex::new(()),
            })
        })
        .as_ref()
        .map_err(|e| *e)
}

impl Global {
    fn backend(&self, mode: SockMode) -> &dyn Backend {
        match mode {
            SockMode::Plain => &*self.plain,
            SockMode::Braid => &**self.braid.get().expect("braid mode implies the backend"),
        }
    }

    /// The mode of a socket that has no operation outstanding.
    fn mode_of(&self, fd: RawFd) -> Option<SockMode> {
        match self.braid.get() {
            Some(b) if b.is_attached(fd) => Some(SockMode::Braid),
            _ => None,
        }
    }

    /// Attach a connected stream socket to a braid endpoint (blocking, bounded by
    /// `timeout`). The socket must have no operation outstanding.
    pub(crate) fn braid_attach(
        &self,
        fd: RawFd,
        role: BraidRole,
        spec: Option<&str>,
        timeout: std::time::Duration,
    ) -> Result<(), Errno> {
        crate::braid_mode::check_bootstrap(fd)?;
        if self.core.lock().socks.contains_key(&fd) {
            return Err(libc::EBUSY);
        }
        let b = match self.braid.get() {
            Some(b) => b,
            None => {
                let _g = self.braid_start.lock();
                if self.braid.get().is_none() {
                    let b = BraidBackend::start()?;
                    let _ = self.braid.set(b);
                }
                self.braid.get().expect("set above")
            }
        };
        b.attach(fd, role, spec, timeout)
    }

    /// Set the zero-copy threshold of the plain backend (0: never).
    pub(crate) fn set_zerocopy_min(&self, n: usize) {
        self.plain.set_zc_min(n)
    }

    pub(crate) fn zerocopy_min(&self) -> usize {
        self.plain.zc_min()
    }

    pub(crate) fn qcreate(&self, depth: i32) -> Result<i32, Errno> {
        if depth <= 0 || depth > EXS_QDEPTH_MAX {
            return Err(libc::EINVAL);
        }
        let q = Arc::new(QueueShared {
            state: Mutex::new(QState {
                depth: depth as usize,
                reserved: 0,
                events: VecDeque::new(),
                deleted: false,
                wakers: Vec::new(),
            }),
            cond: Condvar::new(),
        });
        self.core.lock().queues.insert(q).ok_or(libc::ENOMEM)
    }

    /// Delete a queue. Unless `force`, refuses with EBUSY while operations are outstanding.
    pub(crate) fn qdelete(&self, h: i32, force: bool) -> Result<(), Errno> {
        let mut core = self.core.lock();
        let q = core.queues.get(h).ok_or(libc::EINVAL)?.clone();
        let wakers = {
            let mut st = q.state.lock();
            if !force && st.reserved > st.events.len() {
                return Err(libc::EBUSY);
            }
            st.deleted = true;
            st.reserved -= st.events.len();
            st.events.clear();
            std::mem::take(&mut st.wakers)
        };
        core.queues.remove(h);
        drop(core);
        q.cond.notify_all();
        for w in wakers {
            w.wake();
        }
        Ok(())
    }

    pub(crate) fn queue(&self, h: i32) -> Result<Arc<QueueShared>, Errno> {
        self.core.lock().queues.get(h).cloned().ok_or(libc::EINVAL)
    }

    pub(crate) fn mregister(&self, addr: *mut u8, len: usize, flags: i32) -> Result<i32, Errno> {
        if addr.is_null() || len == 0 || flags & !EXS_MRF_SHARED != 0 {
            return Err(libc::EINVAL);
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(libc::EINVAL);
        }
        let cookie = self.plain.register(addr, len)?;
        let h = self.core.lock().regs.insert(RegEntry {
            addr: addr as usize,
            len,
            inflight: 0,
            cookie,
        });
        match h {
            Some(h) => Ok(h),
            None => {
                if let Some(c) = cookie {
                    self.plain.deregister(c);
                }
                Err(libc::ENOMEM)
            }
        }
    }

    pub(crate) fn mderegister(&self, h: i32) -> Result<(), Errno> {
        let mut core = self.core.lock();
        let r = core.regs.get(h).ok_or(libc::EINVAL)?;
        if r.inflight > 0 {
            return Err(libc::EBUSY);
        }
        let r = core.regs.remove(h).expect("checked above");
        drop(core);
        if let Some(c) = r.cookie {
            self.plain.deregister(c);
        }
        Ok(())
    }

    /// Submit a send or receive. `iov` are (base, len, mhandle). Returns `Ok(None)` when
    /// queued, `Ok(Some(n))` when `EXS_MSG_SYNC` completed with `n` bytes. `owner` (a Rust
    /// buffer) is taken only if the operation was accepted.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn submit_xfer(
        &self,
        kind: OpKind,
        vectored: bool,
        fd: RawFd,
        iov: &[(*mut libc::c_void, usize, i32)],
        flags: i32,
        qh: i32,
        ahandle: usize,
        owner: &mut Option<Box<dyn Any + Send>>,
    ) -> Result<Option<usize>, Errno> {
        let sync = flags & EXS_MSG_SYNC != 0;
        let kflags = flags & !EXS_MSG_SYNC;
        let (allowed, ev_type) = match (kind, vectored) {
            (OpKind::Send, v) => (
                libc::MSG_OOB
                    | libc::MSG_DONTROUTE
                    | libc::MSG_EOR
                    | libc::MSG_MORE
                    | libc::MSG_NOSIGNAL
                    | libc::MSG_CONFIRM,
                if v { EXS_EVT_SENDMSG } else { EXS_EVT_SEND },
            ),
            (OpKind::Recv, v) => (
                libc::MSG_WAITALL | libc::MSG_OOB,
                if v { EXS_EVT_RECVMSG } else { EXS_EVT_RECV },
            ),
            _ => return Err(libc::EINVAL),
        };
        if kflags & !allowed != 0 {
            return Err(libc::EINVAL);
        }
        if fd < 0 {
            return Err(libc::EBADF);
        }
        if iov.is_empty() || iov.len() > EXS_IOV_MAX as usize {
            return Err(libc::EINVAL);
        }
        let mut total = 0usize;
        for &(b, l, _) in iov {
            if b.is_null() && l > 0 {
                return Err(libc::EFAULT);
            }
            total = total.checked_add(l).ok_or(libc::EINVAL)?;
        }
        if kind == OpKind::Recv && total == 0 {
            return Err(libc::EINVAL);
        }
        let (msg_flags, waitall) = match kind {
            OpKind::Send => (kflags | libc::MSG_NOSIGNAL | libc::MSG_WAITALL, true),
            _ => (kflags, kflags & libc::MSG_WAITALL != 0),
        };
        let slot = sync.then(|| {
            Arc::new(SyncSlot {
                done: Mutex::new(None),
                cond: Condvar::new(),
            })
        });
        if sync && crate::uring::on_progress_thread() {
            return Err(libc::EDEADLK);
        }

        let mut core = self.core.lock();
        let q = core.queues.get(qh).ok_or(libc::EINVAL)?.clone();
        // Memory handles: each buffer inside its registration, or explicitly unregistered.
        let mut regs = Vec::new();
        let mut fixed = None;
        for &(b, l, mh) in iov {
            if mh == EXS_MHANDLE_UNREGISTERED {
                continue;
            }
            let r = core.regs.get(mh).ok_or(libc::EINVAL)?;
            let (b, end) = (b as usize, b as usize + l);
            if b < r.addr || end > r.addr + r.len {
                return Err(libc::EINVAL);
            }
            if iov.len() == 1 {
                fixed = r.cookie;
            }
            regs.push(mh);
        }
        let mode = match core.socks.get(&fd) {
            Some((m, _)) => *m,
            None => match self.mode_of(fd) {
                Some(m) => m,
                None => {
                    probe_stream_socket(fd)?;
                    SockMode::Plain
                }
            },
        };
        let sock_outstanding = core.socks.get(&fd).map_or(0, |s| s.1.outstanding);
        if sock_outstanding >= EXS_SOCK_OUTSTANDING_MAX as usize {
            return Err(libc::EAGAIN);
        }
        q.reserve()?;
        for &mh in &regs {
            core.regs.get_mut(mh).expect("checked above").inflight += 1;
        }
        let op = Box::new(Op {
            kind,
            fd,
            msg_flags,
            waitall,
            iov: iov
                .iter()
                .filter(|x| x.1 > 0 || iov.len() == 1)
                .map(|&(b, l, _)| libc::iovec {
                    iov_base: b,
                    iov_len: l,
                })
                .collect(),
            fixed,
            total,
            done: 0,
            // SAFETY: sockaddr_storage and msghdr are plain C structs; zero is valid.
            addr: unsafe { std::mem::zeroed() },
            addrlen: 0,
            poll_events: 0,
            scratch: None,
            polling: false,
            // SAFETY: as above.
            msg: unsafe { std::mem::zeroed() },
            ev_type,
            user_flags: flags,
            first_buf: iov[0].0,
            iovcnt: iov.len() as i32,
            queue: q,
            ahandle,
            sync: slot.clone(),
            owner: owner.take(),
            regs: regs.iter().map(|&h| h as u32).collect(),
            batch: VecDeque::new(),
        });
        let (_, sock) = core
            .socks
            .entry(fd)
            .or_insert_with(|| (mode, Sock::default()));
        sock.outstanding += 1;
        let (busy, fifo) = if kind == OpKind::Send {
            (&mut sock.send_busy, &mut sock.send_fifo)
        } else {
            (&mut sock.recv_busy, &mut sock.recv_fifo)
        };
        if mode == SockMode::Braid {
            // The braid backend orders its operations itself.
            self.backend(mode).start(op);
        } else if *busy {
            fifo.push_back(op);
        } else {
            *busy = true;
            self.backend(mode).start(op);
        }
        drop(core);
        match slot {
            None => Ok(None),
            Some(s) => {
                let mut d = s.done.lock();
                while d.is_none() {
                    s.cond.wait(&mut d);
                }
                let (res, err) = d.expect("loop ends when set");
                if err != 0 {
                    Err(err)
                } else {
                    Ok(Some(res as usize))
                }
            }
        }
    }

    /// Submit a connect, accept or poll.
    pub(crate) fn submit_other(
        &self,
        kind: OpKind,
        fd: RawFd,
        addr: Option<&[u8]>,
        poll_events: i16,
        qh: i32,
        ahandle: usize,
    ) -> Result<(), Errno> {
        if fd < 0 {
            return Err(libc::EBADF);
        }
        let ev_type = match kind {
            OpKind::Connect => EXS_EVT_CONNECT,
            OpKind::Accept => EXS_EVT_ACCEPT,
            OpKind::Poll => EXS_EVT_POLL,
            _ => return Err(libc::EINVAL),
        };
        // SAFETY: zero is a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut addrlen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if let Some(a) = addr {
            if a.len() > std::mem::size_of::<libc::sockaddr_storage>() || a.len() < 2 {
                return Err(libc::EINVAL);
            }
            // SAFETY: a.len() <= size of storage; both are plain bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    a.as_ptr(),
                    (&mut storage as *mut libc::sockaddr_storage).cast::<u8>(),
                    a.len(),
                )
            };
            addrlen = a.len() as libc::socklen_t;
        }
        let mut core = self.core.lock();
        let q = core.queues.get(qh).ok_or(libc::EINVAL)?.clone();
        let mode = match core.socks.get(&fd) {
            Some((m, _)) => *m,
            None => match self.mode_of(fd) {
                Some(m) => m,
                None => {
                    probe_socket(fd)?;
                    SockMode::Plain
                }
            },
        };
        if core.socks.get(&fd).map_or(0, |s| s.1.outstanding) >= EXS_SOCK_OUTSTANDING_MAX as usize {
            return Err(libc::EAGAIN);
        }
        q.reserve()?;
        let op = Box::new(Op {
            kind,
            fd,
            msg_flags: 0,
            waitall: false,
            iov: Vec::new(),
            fixed: None,
            total: 0,
            done: 0,
            addr: storage,
            addrlen,
            poll_events,
            scratch: None,
            polling: false,
            // SAFETY: zero is a valid msghdr.
            msg: unsafe { std::mem::zeroed() },
            ev_type,
            user_flags: 0,
            first_buf: std::ptr::null_mut(),
            iovcnt: 0,
            queue: q,
            ahandle,
            sync: None,
            owner: None,
            regs: Vec::new(),
            batch: VecDeque::new(),
        });
        core.socks
            .entry(fd)
            .or_insert_with(|| (mode, Sock::default()))
            .1
            .outstanding += 1;
        // Connect, accept and poll act on the socket itself (for a braid-mode socket: the
        // idle bootstrap connection), so the plain backend serves them in every mode.
        self.plain.start(op);
        Ok(())
    }
}

fn sockopt_type(fd: RawFd) -> Result<i32, Errno> {
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the right size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF))
    } else {
        Ok(ty)
    }
}

fn probe_socket(fd: RawFd) -> Result<(), Errno> {
    sockopt_type(fd).map(drop)
}

fn probe_stream_socket(fd: RawFd) -> Result<(), Errno> {
    if sockopt_type(fd)? != libc::SOCK_STREAM {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

/// Called by a backend when an operation finished: `Ok(n)` (bytes, new fd, revents) or
/// `Err(errno)`. Releases the socket's ordering slot, starts the next operation of that
/// socket and direction, and posts the event.
pub(crate) fn complete(op: Box<Op>, res: Result<usize, Errno>) {
    finish(op, res, true)
}

/// Like [`complete`] for a batched send that is not the batch's last op: posts the event
/// but keeps the socket's send slot, which the rest of the batch still holds.
pub(crate) fn complete_held(op: Box<Op>, res: Result<usize, Errno>) {
    finish(op, res, false)
}

/// Let `lead` carry the sends queued behind it that the backend can batch (same flags,
/// within the batch limits), so they go to the kernel in one submission.
fn gather_sends(backend: &dyn Backend, lead: &mut Op, fifo: &mut VecDeque<Box<Op>>) {
    if !backend.batchable(lead) {
        return;
    }
    let (mut bytes, mut iovs) = (lead.total, lead.iov.len());
    while let Some(f) = fifo.front() {
        if lead.batch.len() + 1 >= BATCH_OPS
            || f.msg_flags != lead.msg_flags
            || bytes + f.total > BATCH_BYTES
            || iovs + f.iov.len() > BATCH_IOVS
            || !backend.batchable(f)
        {
            break;
        }
        bytes += f.total;
        iovs += f.iov.len();
        let f = fifo.pop_front().expect("front exists");
        lead.ride(f);
    }
}

fn finish(mut op: Box<Op>, res: Result<usize, Errno>, release: bool) {
    let Ok(g) = global() else { return };
    {
        let mut core = g.core.lock();
        for &r in &op.regs {
            if let Some(e) = core.regs.get_mut(r as i32) {
                e.inflight -= 1;
            }
        }
        let mut next = None;
        let mut remove = false;
        let mut mode = SockMode::Plain;
        if let Some((m, sock)) = core.socks.get_mut(&op.fd) {
            mode = *m;
            sock.outstanding -= 1;
            match op.kind {
                _ if !release => {}
                OpKind::Send => {
                    next = sock.send_fifo.pop_front();
                    sock.send_busy = next.is_some();
                    if let Some(n) = next.as_mut() {
                        gather_sends(g.backend(mode), n, &mut sock.send_fifo);
                    }
                }
                OpKind::Recv => {
                    next = sock.recv_fifo.pop_front();
                    sock.recv_busy = next.is_some();
                }
                _ => {}
            }
            remove = sock.outstanding == 0;
        }
        if remove {
            core.socks.remove(&op.fd);
        }
        if let Some(n) = next {
            g.backend(mode).start(n);
        }
    }
    let mut ev = exs_event_t::zeroed();
    ev.ev_type = op.ev_type;
    ev.ev_fd = op.fd;
    ev.ev_ahandle = op.ahandle as exs_ahandle_t;
    match res {
        Ok(n) => ev.ev_result = n as isize,
        Err(e) => {
            ev.ev_result = -1;
            ev.ev_errno = e;
        }
    }
    match op.kind {
        OpKind::Send | OpKind::Recv => {
            ev.ev_u.xfer = exs_evt_xfer_t {
                xf_buf: op.first_buf,
                xf_len: op.total,
                xf_flags: op.user_flags,
                xf_iovcnt: op.iovcnt,
            }
        }
        OpKind::Accept => {
            ev.ev_u.accept = exs_evt_accept_t {
                ac_fd: if res.is_ok() { ev.ev_result as i32 } else { -1 },
                ac_addrlen: op.addrlen,
                ac_addr: op.addr,
            }
        }
        OpKind::Poll => {
            ev.ev_u.poll = exs_evt_poll_t {
                po_events: op.poll_events,
                po_revents: if res.is_ok() { ev.ev_result as i16 } else { 0 },
            }
        }
        OpKind::Connect => {}
    }
    let sync = op.sync.take();
    let queue = op.queue.clone();
    let owner = op.owner.take();
    drop(op);
    queue.post(Completion { ev, owner });
    if let Some(s) = sync {
        *s.done.lock() = Some((ev.ev_result, ev.ev_errno));
        s.cond.notify_all();
    }
}
