//! What the mount coordinates with other clients through the server: `O_APPEND` writes
//! placed at the server's end of file, and POSIX, OFD and `flock` locks held by the server.
//!
//! A blocking lock (`F_SETLKW`, `flock` without `LOCK_NB`) holds no thread: the request
//! goes out and the kernel is answered from the reply's callback whenever the server grants
//! it. It does hold one of the client's request slots, so at most [`MAX_LOCK_WAITS`] wait
//! at once (more fail with `ENOLCK`), leaving the others to the rest of the mount.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use fuser::{ReplyEmpty, ReplyLock, ReplyWrite};
use parking_lot::Mutex;

use super::{Handle, Shared, errno};
use crate::client::Error;
use crate::proto::{
    COMMIT_SYNC, Errno, LockKind, LockRange, LockRequest, MAX_INLINE_WRITE, Reply, Request,
};

/// Most lock waits outstanding at once (each holds a request slot of the client).
pub(crate) const MAX_LOCK_WAITS: usize = 16;
/// How long an append may wait for a free buffer (as a write does).
const BUFFER_WAIT: Duration = Duration::from_secs(30);

/// The mount's lock bookkeeping.
#[derive(Default)]
pub(crate) struct MountLocks {
    /// Nodes this client has taken locks on: only their closes send the owner's release.
    locked: Mutex<HashSet<u64>>,
    /// Lock waits outstanding.
    waiting: AtomicUsize,
}

impl MountLocks {
    /// The kernel forgot `node`: no descriptor of it is open, so it holds no lock here.
    pub(crate) fn forget(&self, node: u64) {
        self.locked.lock().remove(&node);
    }
}

/// A lock range for the server, from what the kernel hands over.
pub(crate) struct KernelLock {
    pub(crate) owner: u64,
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) typ: i32,
    pub(crate) pid: u32,
}

impl KernelLock {
    fn request(&self, fh: u64) -> Result<LockRequest, fuser::Errno> {
        let kind = match self.typ {
            libc::F_RDLCK => LockKind::Read,
            libc::F_WRLCK => LockKind::Write,
            libc::F_UNLCK => LockKind::Unlock,
            _ => return Err(fuser::Errno::EINVAL),
        };
        if self.end < self.start {
            return Err(fuser::Errno::EINVAL);
        }
        Ok(LockRequest {
            fh,
            owner: self.owner,
            range: LockRange {
                kind,
                start: self.start,
                // u64::MAX is the mount's own "release the owner"; the kernel's to-EOF is
                // i64::MAX.
                end: self.end.min(i64::MAX as u64),
                pid: self.pid,
            },
        })
    }
}

fn lock_errno(e: &Error) -> fuser::Errno {
    match e.errno() {
        // The owner closed the file while it waited.
        Errno::ECANCELED => fuser::Errno::EINTR,
        _ => errno(e),
    }
}

/// An append that failed: its buffer back, the error to the kernel.
fn failed(s: &Shared, slot: Option<usize>, e: fuser::Errno, reply: ReplyWrite) {
    if let Some(slot) = slot {
        s.pool.give(slot);
    }
    reply.error(e)
}

impl Shared {
    /// An `O_APPEND` write: after this client's earlier writes of the file, the server
    /// places the bytes at its end of file (small ones inside the request; larger ones in
    /// a range it reserves, written one-sided), whatever offset the kernel computed from
    /// its cached size.
    pub(crate) fn append(self: &Arc<Self>, h: &Handle, data: &[u8], reply: ReplyWrite) {
        let len = data.len();
        let inline = len <= MAX_INLINE_WRITE;
        let slot = if inline {
            None
        } else {
            let Some(slot) = self.pool.take(BUFFER_WAIT) else {
                return reply.error(fuser::Errno::EAGAIN);
            };
            if self.pool.fill(slot, data).is_err() {
                self.pool.give(slot);
                return reply.error(fuser::Errno::EIO);
            }
            Some(slot)
        };
        let req = Request::Append {
            fh: h.fh,
            data: if inline { data.to_vec() } else { Vec::new() },
            reserve: if inline { 0 } else { len as u64 },
        };
        let (s, state, srv_fh, node) = (self.clone(), h.state.clone(), h.fh, h.node);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        h.state.when_idle(Box::new(move || {
            s.known.forget(&[node]);
            let epoch = s.known.epoch();
            let s2 = s.clone();
            s.send(
                &req,
                move |r| match r {
                    Ok(Reply::Appended(at, a)) => {
                        s2.known.learn(epoch, node, &a);
                        state.grown(a.size);
                        let Some(slot) = slot else {
                            return reply.written(len as u32);
                        };
                        let pool = s2.pool.clone();
                        let sge = pool.sge(slot, len);
                        state.write(
                            &s2.client.inner,
                            srv_fh,
                            at,
                            sge,
                            Box::new(move |r| {
                                pool.give(slot);
                                match r {
                                    Ok(()) => reply.written(len as u32),
                                    Err(e) => reply.error(errno(&e)),
                                }
                            }),
                        );
                    }
                    Ok(_) => failed(&s2, slot, fuser::Errno::EIO, reply),
                    Err(e) => failed(&s2, slot, errno(&e), reply),
                },
                d,
            );
        }));
        self.help(&done);
    }

    /// `F_GETLK`: the first conflicting lock, or the range back with `F_UNLCK`.
    pub(crate) fn getlk(&self, h: &Handle, l: KernelLock, reply: ReplyLock) {
        let req = match l.request(h.fh) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let done = Arc::new(AtomicBool::new(false));
        self.send(
            &Request::GetLock(req),
            move |r| match r {
                Ok(Reply::Lock(c)) => {
                    let typ = match c.kind {
                        LockKind::Read => libc::F_RDLCK,
                        LockKind::Write => libc::F_WRLCK,
                        LockKind::Unlock => libc::F_UNLCK,
                    };
                    reply.locked(c.start, c.end, typ, c.pid)
                }
                Ok(_) => reply.error(fuser::Errno::EIO),
                Err(e) => reply.error(errno(&e)),
            },
            done.clone(),
        );
        self.help(&done);
    }

    /// `F_SETLK` / `F_SETLKW` (and `flock`, which the kernel hands over as a lock of the
    /// whole file owned by the open file). As NFS does, a lock brings what others wrote
    /// under it and an unlock hands over what this client wrote: an unlock goes out once
    /// this client's writes of the file have landed on the server, and a granted lock drops
    /// the kernel's cached pages and attributes of the file, so the next read asks the
    /// server.
    pub(crate) fn setlk(self: &Arc<Self>, h: &Handle, l: KernelLock, sleep: bool, r: ReplyEmpty) {
        let req = match l.request(h.fh) {
            Ok(req) => req,
            Err(e) => return r.error(e),
        };
        let node = h.node;
        let unlock = req.range.kind == LockKind::Unlock;
        if !unlock {
            self.locks.locked.lock().insert(node);
        }
        let granted = {
            let s = self.clone();
            move |x: Result<Reply, Error>, r: ReplyEmpty| match x {
                Ok(_) => {
                    if !unlock {
                        s.drop_cached(node);
                    }
                    r.ok()
                }
                Err(e) => r.error(lock_errno(&e)),
            }
        };
        if !sleep || unlock {
            let (s, done) = (self.clone(), Arc::new(AtomicBool::new(false)));
            let d = done.clone();
            h.state.when_idle(Box::new(move || {
                s.send(&Request::SetLock(req), move |x| granted(x, r), d);
            }));
            return self.help(&done);
        }
        if self.locks.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_LOCK_WAITS {
            self.locks.waiting.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!("{MAX_LOCK_WAITS} lock waits outstanding; refusing another");
            return r.error(fuser::Errno::ENOLCK);
        }
        let s = self.clone();
        self.client
            .call_async(&Request::SetLockWait(req), move |x| {
                s.locks.waiting.fetch_sub(1, Ordering::AcqRel);
                granted(x, r)
            });
    }

    /// Drops what the kernel and this mount cached of `node`'s pages and attributes.
    fn drop_cached(&self, node: u64) {
        self.known.forget(&[node]);
        if let Some(n) = self.notifier.lock().as_ref()
            && let Err(e) = n.inval_inode(fuser::INodeNo(node), 0, 0)
        {
            tracing::debug!("dropping cached pages of {node}: {e}");
        }
    }

    /// A close by the POSIX lock owner `owner` (FUSE flush), after its writes were
    /// committed: its locks on the file go, as `close(2)` of any descriptor of the file
    /// releases them; `then` runs once the server has answered, so another client can take
    /// them once `close` returns.
    pub(crate) fn release_lock_owner(
        &self,
        h: &Handle,
        owner: u64,
        then: impl FnOnce() + Send + 'static,
    ) {
        if !self.locks.locked.lock().contains(&h.node) {
            return then();
        }
        let req = Request::SetLock(LockRequest {
            fh: h.fh,
            owner,
            range: LockRange {
                kind: LockKind::Unlock,
                start: 0,
                end: u64::MAX,
                pid: 0,
            },
        });
        self.client.call_async(&req, move |r| {
            if let Err(e) = r {
                tracing::debug!("releasing the locks of a closing owner: {e}");
            }
            then()
        });
    }

    /// A close (FUSE flush) by `owner`: this client's writes of the file committed (close-
    /// to-open), then the owner's locks on the file released (an unlock hands them over).
    pub(crate) fn close(self: &Arc<Self>, h: Arc<Handle>, owner: u64, reply: ReplyEmpty) {
        let always = self.sync_on_close;
        let flags = if always { COMMIT_SYNC } else { 0 };
        let done = Arc::new(AtomicBool::new(false));
        let (d, s, hh) = (done.clone(), self.clone(), h.clone());
        self.commit(h, flags, always, move |r| {
            s.release_lock_owner(&hh, owner, move || {
                match r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(errno(&e)),
                }
                d.store(true, Ordering::Release);
            })
        });
        self.help(&done);
    }
}
