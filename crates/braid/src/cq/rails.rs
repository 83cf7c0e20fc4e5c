//! Sleeping on the rails: a thread that waits for a completion sleeps on its endpoints'
//! sockets and reads them itself when the kernel wakes it, instead of being woken by the
//! engine thread after that thread read them (one wake-up on the latency path, not two).
//!
//! One thread at a time arms a queue. While it is armed, the queue's endpoints keep the
//! engine thread off their reads (as for a busy-polling thread), and a completion pushed
//! by another thread rings the queue's waker, which is in the same epoll set as the
//! sockets.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use parking_lot::MutexGuard;

use super::{CompletionQueue, Driver, RailFd};

const WAKER: Token = Token(usize::MAX);

/// The epoll set of a queue's rail sockets, edge triggered, and its waker.
pub(super) struct RailSet {
    poll: Poll,
    events: Events,
    /// Descriptors in the set, with the link (a process-wide id) each belonged to when
    /// added: a descriptor number can come back for another endpoint's link.
    registered: HashMap<RawFd, u64>,
}

impl RailSet {
    pub(super) fn new() -> io::Result<(RailSet, mio::Waker)> {
        let poll = Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), WAKER)?;
        Ok((
            RailSet {
                poll,
                events: Events::with_capacity(64),
                registered: HashMap::new(),
            },
            waker,
        ))
    }

    /// Makes the set hold exactly `fds`: a replaced link, or another endpoint's, may have a
    /// new socket under an old number.
    fn sync(&mut self, fds: &[RailFd]) {
        let RailSet {
            poll, registered, ..
        } = self;
        let reg = poll.registry();
        registered.retain(|fd, link| {
            let keep = fds.iter().any(|f| f.fd == *fd && f.link == *link);
            if !keep {
                // The socket may be closed already (then the kernel dropped it from the set).
                let _ = reg.deregister(&mut SourceFd(fd));
            }
            keep
        });
        for &RailFd { fd, link, .. } in fds {
            if registered.contains_key(&fd) {
                continue;
            }
            let token = Token(fd as usize);
            let r = match reg.register(&mut SourceFd(&fd), token, Interest::READABLE) {
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                    reg.reregister(&mut SourceFd(&fd), token, Interest::READABLE)
                }
                r => r,
            };
            if r.is_ok() {
                registered.insert(fd, link);
            }
        }
    }

    /// Waits up to `timeout` for an edge (data on a socket, or the waker); takes every
    /// edge that is queued, so that the set's descriptor is quiet afterwards, and appends
    /// the sockets that had one to `ready`.
    fn wait(&mut self, timeout: Duration, ready: &mut Vec<RawFd>) {
        let mut timeout = Some(timeout);
        for _ in 0..16 {
            match self.poll.poll(&mut self.events, timeout) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!("waiting on the rails failed: {e}");
                    return;
                }
            }
            let mut n = 0;
            for ev in self.events.iter() {
                n += 1;
                if ev.token() != WAKER {
                    ready.push(ev.token().0 as RawFd);
                }
            }
            if n < self.events.capacity() {
                return;
            }
            timeout = Some(Duration::ZERO);
        }
    }
}

/// A completion queue armed for a thread that sleeps on its endpoints' sockets (from
/// [`CompletionQueue::arm`]).
///
/// Arming reads what has arrived and sends what that produced; then the caller checks
/// [`CompletionQueue::is_empty`] before it sleeps until [`ArmedQueue::as_fd`] is readable.
/// While the armed queue lives, its endpoints leave their reads to the thread holding it:
/// after waking, that thread polls the queue (which reads the sockets), or drops the armed
/// queue and then polls. Dropping it hands the reads back to the engine thread (within a
/// millisecond, unless the thread polls again).
pub struct ArmedQueue<'a> {
    cq: &'a CompletionQueue,
    set: MutexGuard<'a, RailSet>,
    drivers: Vec<Arc<dyn Driver>>,
    /// Which driver and rail each descriptor of the set belongs to.
    sockets: Vec<(RawFd, usize, usize)>,
    /// Sockets with an edge from the last sleep.
    ready: Vec<RawFd>,
}

impl<'a> ArmedQueue<'a> {
    pub(super) fn new(
        cq: &'a CompletionQueue,
        mut set: MutexGuard<'a, RailSet>,
        drivers: Vec<Arc<dyn Driver>>,
    ) -> ArmedQueue<'a> {
        let mut fds = Vec::new();
        let mut sockets = Vec::new();
        for (i, d) in drivers.iter().enumerate() {
            let from = fds.len();
            d.rail_fds(&mut fds);
            sockets.extend(fds[from..].iter().map(|f| (f.fd, i, f.rail)));
        }
        set.sync(&fds);
        // Edges left from the last time: their bytes are read by the full pass below.
        let mut ready = Vec::new();
        set.wait(Duration::ZERO, &mut ready);
        ready.clear();
        for d in &drivers {
            d.hold(true);
        }
        // From here a completion pushed by another thread rings the waker (see push).
        cq.inner.rail_sleeper.store(true, Ordering::SeqCst);
        let armed = ArmedQueue {
            cq,
            set,
            drivers,
            sockets,
            ready,
        };
        armed.progress();
        armed
    }

    /// Reads what has arrived on every rail, then sends what that produced
    /// (acknowledgements, read responses), so that nothing waits while this thread sleeps.
    pub(super) fn progress(&self) {
        for d in &self.drivers {
            d.drive_before_sleep();
        }
        for d in &self.drivers {
            d.flush();
        }
    }

    /// Sleeps until data arrives on a rail, a completion is pushed, or `timeout` passes;
    /// then reads the rails that had data (each with the blocking receive lock, so bytes
    /// another thread left behind are read too) and sends what that produced.
    /// Returns whether a rail had data.
    pub(super) fn sleep(&mut self, timeout: Duration) -> bool {
        self.ready.clear();
        self.set.wait(timeout, &mut self.ready);
        let mut touched: Vec<usize> = Vec::new();
        // A rail of several descriptors is read once however many of them had an edge.
        let mut read: Vec<(usize, usize)> = Vec::new();
        for fd in &self.ready {
            // A descriptor may be shared by several rails (a raw device's port).
            for &(_, d, rail) in self.sockets.iter().filter(|s| s.0 == *fd) {
                if read.contains(&(d, rail)) {
                    continue;
                }
                read.push((d, rail));
                self.drivers[d].read_rail(rail);
                if !touched.contains(&d) {
                    touched.push(d);
                }
            }
        }
        for d in touched {
            self.drivers[d].flush();
        }
        !self.ready.is_empty()
    }
}

impl AsFd for ArmedQueue<'_> {
    /// A descriptor (an epoll set) that becomes readable when data arrives on one of the
    /// queue's rails or another thread pushes a completion: put it in a `poll(2)` set
    /// beside the caller's own descriptors, then poll the queue.
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the epoll descriptor lives as long as the set, which outlives the borrow.
        unsafe { BorrowedFd::borrow_raw(self.set.poll.as_raw_fd()) }
    }
}

impl Drop for ArmedQueue<'_> {
    fn drop(&mut self) {
        self.cq.inner.rail_sleeper.store(false, Ordering::SeqCst);
        for d in &self.drivers {
            d.hold(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    use parking_lot::Mutex;

    use super::*;

    /// Two rails polled through one shared descriptor (as raw rails share their device's
    /// port), recording which rails the sleeper reads.
    struct SharedFd {
        fd: OwnedFd,
        read: Mutex<Vec<usize>>,
    }

    impl Driver for SharedFd {
        fn drive(&self) {}
        fn drive_before_sleep(&self) {}
        fn release(&self) {}
        fn rail_fds(&self, out: &mut Vec<RailFd>) {
            for rail in 0..2 {
                out.push(RailFd {
                    fd: self.fd.as_raw_fd(),
                    link: 7,
                    rail,
                });
            }
        }
        fn hold(&self, _sleeping: bool) {}
        fn flush(&self) {}
        fn read_rail(&self, rail: usize) {
            self.read.lock().push(rail);
        }
    }

    #[test]
    fn an_edge_on_a_shared_descriptor_reads_every_rail_that_lists_it() {
        let cq = CompletionQueue::new(4);
        // SAFETY: plain eventfd creation; owned at once.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_NONBLOCK)) };
        let shared = fd.as_raw_fd();
        let d = Arc::new(SharedFd {
            fd,
            read: Mutex::new(Vec::new()),
        });
        let as_driver: Arc<dyn Driver> = d.clone();
        cq.attach(Arc::downgrade(&as_driver));
        let mut armed = cq.arm().expect("a queue with an endpoint arms");
        // SAFETY: an 8-byte write from a local buffer to our eventfd.
        unsafe { libc::write(shared, 1u64.to_ne_bytes().as_ptr().cast(), 8) };
        assert!(
            armed.sleep(Duration::from_secs(5)),
            "the edge did not wake the sleeper"
        );
        drop(armed);
        assert_eq!(*d.read.lock(), vec![0, 1]);
    }
}
