//! braid mode: an ES-API stream socket riding a braid endpoint over several rails.
//!
//! * **Attach.** Both ends hold a connected TCP socket (the *bootstrap*) and call
//!   `BraidBackend::attach` on it, one as [`BraidRole::Connect`], the other as
//!   [`BraidRole::Accept`]. The accepting side listens on its rail addresses (port 0 by
//!   default) and sends them over the bootstrap socket; the connecting side opens one rail
//!   to each (binding its own rail IPs if given), reports the rails it made, the accepting
//!   side checks that the endpoint it accepted is the same one, and both mark the socket.
//!   The bootstrap socket then stays idle; the library watches it for end of stream.
//! * **Data path (rsockets-style direct placement).** A receive registers its buffer
//!   (exactly that range, remote-write only, revoked when the receive completes) and sends
//!   an *advertisement* (key, length, receive sequence number) to the peer with a braid
//!   `send`. The sender keeps a FIFO of advertised buffers and writes its bytes with
//!   `write_with_imm` straight into them; the 32-bit immediate says how many bytes, which
//!   receive (its sequence number modulo 256) and whether that receive is now complete.
//!   Both sides keep `CTRL_RECVS` small receives posted for advertisements, immediates
//!   and end-of-stream messages.
//! * **Completions.** One thread (`exs-braid`) drains the shared braid completion queue,
//!   drives each socket's state machine, and hands finished operations to
//!   the front's [`CompletionSink`], which posts the ES-API events.
//!
//! Files: `attach` (the exchange that makes the endpoint) over `bootstrap` (its messages)
//! and `spec` (the rail lists); `sock` (one socket's state machine) over `ctrl` (the
//! control messages and immediates between the two ends); this file the backend: the
//! tables of attached sockets and the completion thread.
//!
//! Locks: the front's `Core` lock, then `BraidBackend::tables`, then a socket's own
//! mutex; the sink is only called with none of them held.

mod attach;
mod bootstrap;
mod ctrl;
mod sock;
mod spec;

use std::collections::HashMap;
use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::{Arc, OnceLock, Weak};
use std::task::{Context as TaskCx, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use braid::{Completion, CompletionQueue, Context, Error as BraidError};
use parking_lot::Mutex;

pub(crate) use attach::check_bootstrap;
use sock::{BSock, Done};

use crate::ffi;
use crate::op::{Backend, CompletionSink, Errno, Op, OpKind};

/// Which side of the bootstrap connection a program is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BraidRole {
    /// The side that called `connect()`: it opens the rails (`EXS_BRAID_CONNECT`).
    Connect,
    /// The side that called `accept()`: it listens for the rails (`EXS_BRAID_ACCEPT`).
    Accept,
}

/// How often the bootstrap sockets are checked for end of stream or reuse.
const WATCH: Duration = Duration::from_millis(20);
/// Bound on the whole attach exchange.
pub(crate) const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Default)]
struct Tables {
    by_fd: HashMap<RawFd, Arc<Mutex<BSock>>>,
    by_ep: HashMap<u64, Arc<Mutex<BSock>>>,
}

/// The braid-mode backend: one braid [`Context`] and completion queue per process, one
/// endpoint per attached socket, one completion thread.
pub(crate) struct BraidBackend {
    ctx: Context,
    cq: CompletionQueue,
    tables: Mutex<Tables>,
    attention: Mutex<Vec<Arc<Mutex<BSock>>>>,
    orphans: Mutex<Done>,
    thread: Thread,
    /// Where finished operations go.
    sink: &'static dyn CompletionSink,
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

fn braid_errno(e: &BraidError) -> Errno {
    match e {
        BraidError::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        BraidError::InvalidArgument(_) => libc::EINVAL,
        BraidError::Timeout(_) => libc::ETIMEDOUT,
        BraidError::Handshake { .. } | BraidError::VersionMismatch { .. } => libc::EPROTO,
        BraidError::Refused { .. } => libc::ECONNREFUSED,
        BraidError::QueueFull { .. } => libc::EAGAIN,
        _ => libc::EIO,
    }
}

impl BraidBackend {
    pub(crate) fn start(sink: &'static dyn CompletionSink) -> Result<Arc<Self>, Errno> {
        let ctx = Context::new().map_err(|e| braid_errno(&e))?;
        let cq = ctx.create_cq(1 << 22);
        let (tx, rx) = std::sync::mpsc::channel::<Arc<BraidBackend>>();
        let th = std::thread::Builder::new()
            .name("exs-braid".into())
            .spawn(move || {
                if let Ok(me) = rx.recv() {
                    me.run();
                }
            })
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
        let me = Arc::new(BraidBackend {
            ctx,
            cq,
            tables: Mutex::new(Tables::default()),
            attention: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
            thread: th.thread().clone(),
            sink,
        });
        tx.send(me.clone()).map_err(|_| libc::EAGAIN)?;
        if AT_EXIT.set(Arc::downgrade(&me)).is_ok() {
            ffi::at_exit(at_exit);
        }
        Ok(me)
    }

    /// At process exit every attached socket's stream is ended as the kernel ends a TCP
    /// stream: the end-of-stream message goes out once the sends already posted are written
    /// (bounded by `timeout`), so the peer's receives complete with 0 rather than failing.
    fn flush_at_exit(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let Some(t) = self.tables.try_lock_for(Duration::from_millis(100)) else {
            return;
        };
        let socks: Vec<_> = t.by_ep.values().cloned().collect();
        drop(t);
        for s in &socks {
            if let Some(mut st) = s.try_lock_for(Duration::from_millis(100)) {
                st.want_fin();
            }
            self.kick(s.clone());
        }
        while Instant::now() < deadline {
            let done = socks.iter().all(|s| {
                s.try_lock_for(Duration::from_millis(10))
                    .is_none_or(|st| st.flushed())
            });
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether `fd` is attached (and still the same socket as when it was attached).
    pub(crate) fn is_attached(&self, fd: RawFd) -> bool {
        let mut t = self.tables.lock();
        let Some(s) = t.by_fd.get(&fd).cloned() else {
            return false;
        };
        let same = {
            let mut st = s.lock();
            if st.same_socket() {
                true
            } else {
                st.mark_local_closed();
                false
            }
        };
        if !same {
            t.by_fd.remove(&fd);
            drop(t);
            self.kick(s);
        }
        same
    }

    fn kick(&self, s: Arc<Mutex<BSock>>) {
        self.attention.lock().push(s);
        self.thread.unpark();
    }

    fn run(self: Arc<Self>) {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = TaskCx::from_waker(&waker);
        let mut batch = Vec::with_capacity(256);
        let mut last_watch = Instant::now();
        loop {
            batch.clear();
            self.cq.poll_many(&mut batch, 256);
            let got = !batch.is_empty();
            for c in batch.drain(..) {
                self.on_completion(c);
            }
            let att = std::mem::take(&mut *self.attention.lock());
            for s in att {
                self.service(&s, None);
            }
            let orphans = std::mem::take(&mut *self.orphans.lock());
            for (op, r) in orphans {
                self.sink.complete(op, r);
            }
            if last_watch.elapsed() >= WATCH {
                last_watch = Instant::now();
                self.watch();
            }
            if got {
                continue;
            }
            let mut next = self.cq.next();
            match Pin::new(&mut next).poll(&mut cx) {
                Poll::Ready(c) => self.on_completion(c),
                Poll::Pending => std::thread::park_timeout(WATCH),
            }
        }
    }

    fn on_completion(&self, c: Completion) {
        let s = self.tables.lock().by_ep.get(&c.endpoint).cloned();
        if let Some(s) = s {
            self.service(&s, Some(&c));
        }
    }

    /// Feed a completion (if any) to a socket, move it on, complete what finished, and
    /// forget the socket once it is done.
    fn service(&self, s: &Arc<Mutex<BSock>>, c: Option<&Completion>) {
        let mut out = Vec::new();
        let (finished, fd, ep) = {
            let mut st = s.lock();
            if let Some(c) = c {
                st.on_completion(c, &mut out);
            }
            st.progress(&mut out);
            (st.finished(), st.fd(), st.endpoint_id())
        };
        for (op, r) in out {
            self.sink.complete(op, r);
        }
        if finished {
            let mut t = self.tables.lock();
            t.by_ep.remove(&ep);
            if t.by_fd.get(&fd).is_some_and(|x| Arc::ptr_eq(x, s)) {
                t.by_fd.remove(&fd);
            }
            tracing::debug!(fd, "exs braid socket detached");
        }
    }

    /// Check the bootstrap sockets: end of stream from the peer, or closed here.
    fn watch(&self) {
        let socks: Vec<_> = self.tables.lock().by_ep.values().cloned().collect();
        for s in socks {
            let changed = s.lock().watch_bootstrap();
            if changed {
                let fd = s.lock().fd();
                {
                    let mut t = self.tables.lock();
                    if s.lock().local_closed()
                        && t.by_fd.get(&fd).is_some_and(|x| Arc::ptr_eq(x, &s))
                    {
                        t.by_fd.remove(&fd);
                    }
                }
                self.service(&s, None);
            }
        }
    }
}

/// The backend, for the hook at process exit.
static AT_EXIT: OnceLock<Weak<BraidBackend>> = OnceLock::new();

extern "C" fn at_exit() {
    if let Some(b) = AT_EXIT.get().and_then(Weak::upgrade) {
        b.flush_at_exit(Duration::from_secs(2));
    }
}

impl Backend for BraidBackend {
    fn start(&self, op: Box<Op>) {
        let s = self.tables.lock().by_fd.get(&op.fd).cloned();
        let Some(s) = s else {
            // Detached between the front's check and here.
            let e = if op.kind == OpKind::Send {
                libc::EPIPE
            } else {
                libc::ECONNRESET
            };
            self.orphans.lock().push((op, Err(e)));
            self.thread.unpark();
            return;
        };
        let kick = {
            let mut st = s.lock();
            match op.kind {
                OpKind::Recv => st.start_recv(op, &self.ctx),
                OpKind::Send => {
                    st.start_send(op, &self.ctx);
                    st.pump();
                }
                _ => st.defer(op, libc::EOPNOTSUPP),
            }
            // Failures, refusals and zero-length sends finish on the completion thread.
            st.needs_service()
        };
        if kick {
            self.kick(s);
        }
    }

    fn register(&self, _addr: *mut u8, _len: usize) -> Result<Option<u32>, Errno> {
        // Every operation registers exactly its own buffer with braid (see the crate docs).
        Ok(None)
    }

    fn deregister(&self, _cookie: u32) {}
}
