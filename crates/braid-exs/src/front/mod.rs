//! The ES-API front: handle tables, per-socket ordering and flow control,
//! argument checking. Independent of how bytes move: that is a [`Backend`]'s job. The
//! backends hand finished operations back through [`SINK`] (see `complete`).
//!
//! Locks: one `Core` mutex for the tables and socket states, then (never the other way
//! round) a queue's own mutex. Waiters on a queue take only that queue's mutex.

mod complete;
mod table;

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::abi::*;
use crate::braid_mode::{BraidBackend, BraidRole};
use crate::op::{Backend, Errno, Op, OpFront, OpKind};
use crate::queue::{QueueShared, SyncSlot};
use crate::uring::UringBackend;
use crate::{ffi, sys};
pub(crate) use complete::SINK;
use table::Table;

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
    /// The sends in `send_fifo` are held back (the slot stays busy) for the sends of the
    /// thread their predecessor's completion woke, so that both go in one batch; see
    /// `complete::hold_short_batch`.
    send_held: bool,
    send_fifo: VecDeque<Box<Op>>,
    recv_busy: bool,
    recv_fifo: VecDeque<Box<Op>>,
}

struct Core {
    queues: Table<Arc<QueueShared>>,
    regs: Table<RegEntry>,
    socks: HashMap<RawFd, (SockMode, Sock)>,
    /// Sockets whose sends may be held back (a socket may be listed after its hold ended).
    held: Vec<RawFd>,
}

pub(crate) struct Global {
    core: Mutex<Core>,
    /// `core.held` is not empty: a dequeue must release the holds.
    any_held: AtomicBool,
    plain: Arc<UringBackend>,
    /// Started by the first `exs_braid_attach`.
    braid: OnceLock<Arc<BraidBackend>>,
    braid_start: Mutex<()>,
}

static GLOBAL: OnceLock<Result<Global, Errno>> = OnceLock::new();

/// The library state, started on first use (the progress thread and its ring).
pub(crate) fn global() -> Result<&'static Global, Errno> {
    GLOBAL
        .get_or_init(|| {
            let plain = UringBackend::start(&SINK)?;
            Ok(Global {
                core: Mutex::new(Core {
                    queues: Table::new(),
                    regs: Table::new(),
                    socks: HashMap::new(),
                    held: Vec::new(),
                }),
                any_held: AtomicBool::new(false),
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
                    let b = BraidBackend::start(&SINK)?;
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
        let q = Arc::new(QueueShared::new(depth as usize));
        self.core.lock().queues.insert(q).ok_or(libc::ENOMEM)
    }

    /// Delete a queue. Unless `force`, refuses with EBUSY while operations are outstanding.
    /// Delete a queue. Unless `force`, refuses with EBUSY while operations are outstanding.
    pub(crate) fn qdelete(&self, h: i32, force: bool) -> Result<(), Errno> {
        let mut core = self.core.lock();
        let q = core.queues.get(h).ok_or(libc::EINVAL)?.clone();
        q.delete(force)?;
        core.queues.remove(h);
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
        let slot = sync.then(|| Arc::new(SyncSlot::new()));
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
                    sys::probe_stream_socket(fd)?;
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
            addr: ffi::sockaddr_zeroed(),
            addrlen: 0,
            poll_events: 0,
            scratch: None,
            polling: false,
            msg: ffi::msghdr_zeroed(),
            batch: VecDeque::new(),
            front: OpFront {
                ev_type,
                user_flags: flags,
                first_buf: iov[0].0 as usize,
                iovcnt: iov.len() as i32,
                queue: q,
                ahandle,
                sync: slot.clone(),
                owner: owner.take(),
                regs: regs.iter().map(|&h| h as u32).collect(),
            },
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
            // A held batch goes once it is full, or when its sender is about to block.
            if kind == OpKind::Send
                && sock.send_held
                && (sync || complete::batch_is_full(&sock.send_fifo))
                && let Some(n) = complete::next_send(self.backend(mode), sock)
            {
                self.backend(mode).start(n);
            }
        } else {
            *busy = true;
            self.backend(mode).start(op);
        }
        drop(core);
        match slot {
            None => Ok(None),
            Some(s) => s.wait().map(Some),
        }
    }

    /// Start the sends held back for the reposts of a woken thread. Called when a thread
    /// comes to wait for events (its reposts are done) and when the hold's time is up.
    pub(crate) fn release_held(&self) {
        if !self.any_held.load(Ordering::Acquire) {
            return;
        }
        let mut core = self.core.lock();
        self.any_held.store(false, Ordering::Release);
        for fd in std::mem::take(&mut core.held) {
            let Some((mode, sock)) = core.socks.get_mut(&fd) else {
                continue;
            };
            if sock.send_held
                && let Some(n) = complete::next_send(self.backend(*mode), sock)
            {
                self.backend(*mode).start(n);
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
        let (storage, addrlen) = match addr {
            Some(a) => ffi::sockaddr_from_bytes(a)?,
            None => (
                ffi::sockaddr_zeroed(),
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t,
            ),
        };
        let mut core = self.core.lock();
        let q = core.queues.get(qh).ok_or(libc::EINVAL)?.clone();
        let mode = match core.socks.get(&fd) {
            Some((m, _)) => *m,
            None => match self.mode_of(fd) {
                Some(m) => m,
                None => {
                    sys::probe_socket(fd)?;
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
            msg: ffi::msghdr_zeroed(),
            batch: VecDeque::new(),
            front: OpFront {
                ev_type,
                user_flags: 0,
                first_buf: 0,
                iovcnt: 0,
                queue: q,
                ahandle,
                sync: None,
                owner: None,
                regs: Vec::new(),
            },
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
