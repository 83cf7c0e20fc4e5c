//! Completion queues: poll, wait with a timeout, or await.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use braid_proto::error::{Completion, Error};

struct CqState {
    items: VecDeque<Completion>,
    wakers: Vec<Waker>,
    sleepers: usize,
}

/// An endpoint reporting into a queue, whose receive progress a polling thread may drive.
pub(crate) trait Driver: Send + Sync {
    /// Reads whatever has arrived and sends what that produced, without blocking.
    fn drive(&self);
    /// The polling thread stops polling: progress goes back to the engine thread.
    fn release(&self);
}

struct CqInner {
    /// Endpoints reporting here: polling drives their progress (no engine hand-off).
    drivers: Mutex<Vec<Weak<dyn Driver>>>,
    state: Mutex<CqState>,
    ready: Condvar,
    capacity: usize,
    /// Slots promised to posted operations; a post that finds none is refused, so a
    /// completion never has to be dropped.
    reserved: AtomicUsize,
    /// Completions waiting; read without the lock by spinning waiters.
    len: AtomicUsize,
    spin: Mutex<Duration>,
}

/// A queue of [`Completion`]s shared by the endpoints that report into it.
///
/// Every posted operation reserves a slot at post time (a post that finds the queue's
/// capacity taken fails with [`Error::QueueFull`]), so completions are never lost.
/// Clones share the queue.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Arc<CqInner>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("capacity", &self.inner.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl CompletionQueue {
    /// A queue holding up to `capacity` completions (posted and not yet polled).
    pub fn new(capacity: usize) -> CompletionQueue {
        CompletionQueue {
            inner: Arc::new(CqInner {
                drivers: Mutex::new(Vec::new()),
                state: Mutex::new(CqState {
                    items: VecDeque::new(),
                    wakers: Vec::new(),
                    sleepers: 0,
                }),
                ready: Condvar::new(),
                capacity: capacity.max(1),
                reserved: AtomicUsize::new(0),
                len: AtomicUsize::new(0),
                spin: Mutex::new(Duration::from_micros(20)),
            }),
        }
    }

    /// Capacity given at creation.
    pub fn capacity(&self) -> usize {
        self.inner.capacity
    }

    /// Completions ready to be polled.
    pub fn len(&self) -> usize {
        self.inner.len.load(Ordering::Acquire)
    }

    /// True when no completion is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long [`CompletionQueue::wait`] busy-polls (driving progress itself, see
    /// [`CompletionQueue::poll`]) before sleeping (default 20 µs): spinning saves a wake-up
    /// on latency-bound loops, sleeping saves CPU.
    pub fn set_spin(&self, spin: Duration) {
        *self.inner.spin.lock() = spin;
    }

    pub(crate) fn same(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn attach(&self, d: Weak<dyn Driver>) {
        let mut ds = self.inner.drivers.lock();
        ds.retain(|w| w.strong_count() > 0);
        ds.push(d);
    }

    /// Lets the attached endpoints make progress on this thread.
    fn drive(&self) {
        let ds: Vec<Arc<dyn Driver>> = self
            .inner
            .drivers
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for d in ds {
            d.drive();
        }
    }

    pub(crate) fn reserve(&self) -> Result<(), Error> {
        let cap = self.inner.capacity;
        self.inner
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r < cap).then_some(r + 1)
            })
            .map(|_| ())
            .map_err(|_| Error::QueueFull {
                what: "completion queue",
                limit: cap,
            })
    }

    pub(crate) fn unreserve(&self) {
        self.inner.reserved.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn push(&self, c: Completion) {
        let wakers = {
            let mut st = self.inner.state.lock();
            st.items.push_back(c);
            self.inner.len.store(st.items.len(), Ordering::Release);
            if st.sleepers > 0 {
                self.inner.ready.notify_one();
            }
            std::mem::take(&mut st.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    fn pop_locked(&self, st: &mut CqState) -> Option<Completion> {
        let c = st.items.pop_front()?;
        self.inner.len.store(st.items.len(), Ordering::Release);
        self.inner.reserved.fetch_sub(1, Ordering::AcqRel);
        Some(c)
    }

    /// The next completion, if one is ready. Never blocks; when none is ready, it first reads
    /// whatever has arrived for the queue's endpoints on the calling thread, so a busy-polling
    /// loop sees a completion without waiting for the progress engine's thread. While a
    /// thread keeps polling, the engine leaves those reads to it; it takes them back within
    /// a millisecond of the last poll (at once when the thread sleeps in
    /// [`CompletionQueue::wait`]). [`CompletionQueue::next`] leaves progress to the engine.
    pub fn poll(&self) -> Option<Completion> {
        if self.is_empty() {
            self.drive();
            if self.is_empty() {
                return None;
            }
        }
        self.pop_locked(&mut self.inner.state.lock())
    }

    /// Moves up to `max` ready completions into `out`; returns how many.
    pub fn poll_many(&self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.is_empty() {
            self.drive();
            if self.is_empty() {
                return 0;
            }
        }
        let mut st = self.inner.state.lock();
        let mut n = 0;
        while n < max {
            match self.pop_locked(&mut st) {
                Some(c) => out.push(c),
                None => break,
            }
            n += 1;
        }
        n
    }

    /// Waits up to `timeout` for a completion; `None` when none came.
    pub fn wait(&self, timeout: Duration) -> Option<Completion> {
        let start = Instant::now();
        let spin = (*self.inner.spin.lock()).min(timeout);
        while start.elapsed() < spin {
            if let Some(c) = self.poll() {
                return Some(c);
            }
            std::hint::spin_loop();
        }
        let deadline = start + timeout;
        for d in self.inner.drivers.lock().iter().filter_map(Weak::upgrade) {
            d.release();
        }
        let mut st = self.inner.state.lock();
        loop {
            if let Some(c) = self.pop_locked(&mut st) {
                return Some(c);
            }
            st.sleepers += 1;
            let timed_out = self.inner.ready.wait_until(&mut st, deadline).timed_out();
            st.sleepers -= 1;
            if timed_out {
                return self.pop_locked(&mut st);
            }
        }
    }

    /// A future resolving to the next completion; works with any async runtime.
    pub fn next(&self) -> NextCompletion<'_> {
        NextCompletion { cq: self }
    }
}

/// Future returned by [`CompletionQueue::next`].
pub struct NextCompletion<'a> {
    cq: &'a CompletionQueue,
}

impl Future for NextCompletion<'_> {
    type Output = Completion;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Completion> {
        // No inline progress here: an awaiting task is woken by the engine thread, which
        // keeps reading for it (driving here would hand reads back and forth each time).
        let mut st = self.cq.inner.state.lock();
        if let Some(c) = self.cq.pop_locked(&mut st) {
            return Poll::Ready(c);
        }
        if !st.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}
