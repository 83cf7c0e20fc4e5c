//! State shared by the application threads and the service thread: requests to the service
//! thread, and what application threads wait for (barrier and gather arrivals, lock grants,
//! results of atomics and of requests), with the group's failure.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::task::Wake;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::DsmError;
use crate::proto::{HomePolicy, Msg, PageId, Rank};

/// What an application thread asks the service thread to do.
#[derive(Debug)]
pub(crate) enum Request {
    /// Send a message (collectives).
    Send { to: Rank, msg: Msg },
    /// Feed the core: this rank waits with `ticket` for `lock`.
    LockWait { lock: u32, ticket: u32 },
    /// Feed the core: `ticket` of `lock` is served next.
    LockHandoff { lock: u32, ticket: u32 },
    /// Add an allocation to the core; reply with token.
    AddAllocation {
        first: PageId,
        pages: u64,
        policy: HomePolicy,
        token: u64,
    },
    /// Remove an allocation as soon as nothing concerns it any more; reply with token.
    RemoveAllocation { first: PageId, token: u64 },
    /// Stop the service thread once idle.
    Stop,
}

#[derive(Default)]
pub(crate) struct Waits {
    pub failed: Option<String>,
    pub barrier: HashMap<(u64, u32), u32>,
    pub gather: HashMap<u64, Vec<Option<(u64, u64)>>>,
    pub grants: HashSet<(u32, u32)>,
    pub results: HashMap<u64, Result<u64, String>>,
}

/// An eventfd that wakes the service thread (from application threads and from braid's
/// completion-queue waker).
pub(crate) struct Doorbell {
    fd: OwnedFd,
}

impl Doorbell {
    fn new() -> io::Result<Doorbell> {
        // SAFETY: plain system call, result checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Ok(Doorbell {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn ring(&self) {
        let one = 1u64;
        // SAFETY: an 8-byte write to our eventfd; a full counter (EAGAIN) is already rung.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub(crate) fn clear(&self) {
        let mut v = 0u64;
        // SAFETY: an 8-byte read from our non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    pub(crate) fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }
}

impl Wake for Doorbell {
    fn wake(self: Arc<Self>) {
        self.ring();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.ring();
    }
}

pub(crate) struct Shared {
    pub waits: Mutex<Waits>,
    pub cond: Condvar,
    pub requests: Mutex<VecDeque<Request>>,
    pub doorbell: Arc<Doorbell>,
    next_token: std::sync::atomic::AtomicU64,
}

impl Shared {
    pub(crate) fn new() -> Result<Shared, DsmError> {
        Ok(Shared {
            waits: Mutex::new(Waits::default()),
            cond: Condvar::new(),
            requests: Mutex::new(VecDeque::new()),
            doorbell: Arc::new(Doorbell::new().map_err(|e| DsmError::Os("eventfd".into(), e))?),
            next_token: std::sync::atomic::AtomicU64::new(1),
        })
    }

    pub(crate) fn token(&self) -> u64 {
        self.next_token
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// Hands `r` to the service thread.
    pub(crate) fn request(&self, r: Request) {
        self.requests.lock().push_back(r);
        self.doorbell.ring();
    }

    /// Records the group's failure (the first reason wins) and wakes every waiter.
    pub(crate) fn fail(&self, why: String) {
        let mut w = self.waits.lock();
        if w.failed.is_none() {
            tracing::error!("braid-dsm: {why}");
            w.failed = Some(why);
        }
        drop(w);
        self.cond.notify_all();
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.waits.lock().failed.clone()
    }

    pub(crate) fn check(&self) -> Result<(), DsmError> {
        match self.failure() {
            Some(f) => Err(DsmError::Failed(f)),
            None => Ok(()),
        }
    }

    /// Waits until `ready` returns a value, the group fails, or `timeout` passes.
    pub(crate) fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut(&mut Waits) -> Option<T>,
    ) -> Result<T, DsmError> {
        let deadline = Instant::now() + timeout;
        let mut w = self.waits.lock();
        loop {
            if let Some(t) = ready(&mut w) {
                return Ok(t);
            }
            if let Some(f) = &w.failed {
                return Err(DsmError::Failed(f.clone()));
            }
            if self.cond.wait_until(&mut w, deadline).timed_out() {
                if let Some(t) = ready(&mut w) {
                    return Ok(t);
                }
                return Err(DsmError::Failed(format!(
                    "{what} did not complete within {timeout:?}"
                )));
            }
        }
    }

    /// Runs `f` on the waits and wakes the waiters.
    pub(crate) fn update(&self, f: impl FnOnce(&mut Waits)) {
        f(&mut self.waits.lock());
        self.cond.notify_all();
    }
}
