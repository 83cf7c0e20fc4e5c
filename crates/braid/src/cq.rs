//! Completion queues: poll, wait with a timeout, or await.

mod rails;
mod spin;

use std::collections::VecDeque;
use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use braid_proto::error::{Completion, Error};

pub use rails::ArmedQueue;
use rails::RailSet;
use spin::SpinPolicy;

struct CqState {
    items: VecDeque<Completion>,
    wakers: Vec<Waker>,
    sleepers: usize,
}

/// One descriptor a sleeping thread polls for an endpoint's rail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RailFd {
    pub(crate) fd: RawFd,
    /// The process-wide id of the link the descriptor belongs to: a descriptor number can
    /// come back for another link.
    pub(crate) link: u64,
    /// The rail, as [`Driver::read_rail`] numbers it.
    pub(crate) rail: usize,
}

/// An endpoint reporting into a queue, whose receive progress a polling thread may drive.
pub(crate) trait Driver: Send + Sync {
    /// Reads whatever has arrived and sends what that produced, without blocking.
    fn drive(&self);
    /// [`Driver::drive`], but a rail another thread is reading is read again once it is
    /// done, so that nothing that arrived meanwhile is left for a sleeper's next wake-up.
    fn drive_before_sleep(&self);
    /// The polling thread stops polling: progress goes back to the engine thread.
    fn release(&self);
    /// Appends each live rail's readiness descriptors (none once the endpoint is closed).
    fn rail_fds(&self, out: &mut Vec<RailFd>);
    /// A thread starts (`true`) or stops sleeping on the rails; meanwhile the engine
    /// leaves their reads to it.
    fn hold(&self, sleeping: bool);
    /// Sends the frames that wait, without blocking.
    fn flush(&self);
    /// Reads one rail (waiting for another thread's read of it to end), as the engine
    /// does on the rail's readable edge.
    fn read_rail(&self, rail: usize);
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
    spin: Mutex<SpinPolicy>,
    /// The epoll set a waiting thread sleeps in (`None`: the set could not be made, or
    /// sleeping on the rails is turned off).
    rails: Option<Mutex<RailSet>>,
    rails_waker: Option<mio::Waker>,
    sleep_on_rails: AtomicBool,
    /// A thread has armed the queue: pushes ring `rails_waker`.
    rail_sleeper: AtomicBool,
    /// The armed thread is one blocked in [`CompletionQueue::wait`]: it takes what is
    /// pushed itself and passes what it leaves on, so pushes need not wake a thread
    /// sleeping on the condition variable too.
    waiter_armed: AtomicBool,
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
        let (rails, rails_waker) = match RailSet::new() {
            Ok((set, waker)) => (Some(Mutex::new(set)), Some(waker)),
            Err(e) => {
                tracing::warn!("no epoll set for sleeping on the rails: {e}");
                (None, None)
            }
        };
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
                spin: Mutex::new(SpinPolicy::new(Duration::from_micros(20))),
                rails,
                rails_waker,
                sleep_on_rails: AtomicBool::new(true),
                rail_sleeper: AtomicBool::new(false),
                waiter_armed: AtomicBool::new(false),
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
    /// on latency-bound loops, sleeping saves CPU. A waiter woken by data that completed
    /// nothing in this queue (a peer's read or fetch-add, which the waiter serves) polls
    /// again before it sleeps again. The spin adapts: while sleeps end soon with data it
    /// doubles, up to four times this setting, and it halves back to it when sleeps run
    /// long (so two blocking peers do not each sleep just before the other's message comes,
    /// paying a wake-up per message). Zero turns spinning off.
    pub fn set_spin(&self, spin: Duration) {
        *self.inner.spin.lock() = SpinPolicy::new(spin);
    }

    /// Whether a thread blocked in [`CompletionQueue::wait`] sleeps on the endpoints'
    /// sockets and reads them itself when data arrives (the default), or sleeps until the
    /// engine thread has read them and wakes it (two wake-ups instead of one, but the
    /// engine thread alone reads).
    pub fn set_sleep_on_rails(&self, on: bool) {
        self.inner.sleep_on_rails.store(on, Ordering::Release);
    }

    /// Arms the queue for a thread that sleeps in its own `poll(2)` or epoll set, with
    /// the descriptor of the returned [`ArmedQueue`] among its own (as a verbs
    /// completion channel). Arming reads what has arrived and sends what that produced;
    /// when [`CompletionQueue::is_empty`] is still true afterwards, the thread may sleep
    /// until the descriptor is readable, then poll. `None` when the queue has no
    /// endpoints, another thread holds it armed, or sleeping on the rails is off: sleep
    /// on [`CompletionQueue::next`]'s waker instead.
    pub fn arm(&self) -> Option<ArmedQueue<'_>> {
        if !self.inner.sleep_on_rails.load(Ordering::Acquire) {
            return None;
        }
        let set = self.inner.rails.as_ref()?.try_lock()?;
        let drivers = self.live_drivers();
        if drivers.is_empty() {
            return None;
        }
        Some(ArmedQueue::new(self, set, drivers))
    }

    pub(crate) fn same(&self, other: &CompletionQueue) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn attach(&self, d: Weak<dyn Driver>) {
        let mut ds = self.inner.drivers.lock();
        ds.retain(|w| w.strong_count() > 0);
        ds.push(d);
    }

    /// The attached endpoints that still exist.
    fn live_drivers(&self) -> Vec<Arc<dyn Driver>> {
        self.inner
            .drivers
            .lock()
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// Lets the attached endpoints make progress on this thread.
    fn drive(&self) {
        let drivers = self.inner.drivers.lock();
        if drivers.len() == 1 {
            // The usual case, on every poll of a busy-polling thread: no list to build.
            let d = drivers[0].upgrade();
            drop(drivers);
            if let Some(d) = d {
                d.drive();
            }
            return;
        }
        drop(drivers);
        for d in self.live_drivers() {
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
        self.unreserve_n(1);
    }

    /// Frees the slots of `n` operations that completed without a completion entry.
    pub(crate) fn unreserve_n(&self, n: usize) {
        self.inner.reserved.fetch_sub(n, Ordering::AcqRel);
    }

    pub(crate) fn push(&self, c: Completion) {
        let wakers = {
            let mut st = self.inner.state.lock();
            st.items.push_back(c);
            self.inner.len.store(st.items.len(), Ordering::Release);
            // A waiter sleeping on the rails takes this itself: waking a second one as
            // well would only have the two race for it (with four server workers on two
            // cores, that race made each request cost two wake-ups).
            if st.sleepers > 0 && !self.inner.waiter_armed.load(Ordering::SeqCst) {
                self.inner.ready.notify_one();
            }
            std::mem::take(&mut st.wakers)
        };
        for w in wakers {
            w.wake();
        }
        // Pairs with the armed thread's check of `len` after it set `rail_sleeper`.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.inner.rail_sleeper.load(Ordering::SeqCst)
            && let Some(w) = &self.inner.rails_waker
            && let Err(e) = w.wake()
        {
            tracing::warn!("cannot wake the thread sleeping on the rails: {e}");
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
        let deadline = Instant::now() + timeout;
        loop {
            // Poll without arming the rails (a same-host peer then rings no doorbell per
            // message), for the current spin.
            let spin = self.inner.spin.lock().current();
            if !spin.is_zero() {
                let until = (Instant::now() + spin).min(deadline);
                loop {
                    if let Some(c) = self.poll() {
                        return Some(c);
                    }
                    if Instant::now() >= until {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            if Instant::now() >= deadline {
                break;
            }
            let Some(armed) = self.arm() else {
                break;
            };
            match self.sleep_armed(armed, deadline) {
                Slept::Got(c) => return Some(c),
                Slept::TimedOut => return None,
                Slept::Data => {}
            }
        }
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

    /// Sleeps on the armed rails until a completion, the deadline, or (with a spin
    /// configured) data that completed nothing here: a peer's read or fetch-add, served
    /// by this thread, is often followed by more, which the caller's next spin takes
    /// without a wake-up.
    fn sleep_armed(&self, mut armed: ArmedQueue<'_>, deadline: Instant) -> Slept {
        self.inner.waiter_armed.store(true, Ordering::SeqCst);
        let got = loop {
            if let Some(c) = self.pop_locked(&mut self.inner.state.lock()) {
                break Slept::Got(c);
            }
            std::sync::atomic::fence(Ordering::SeqCst);
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                break Slept::TimedOut;
            }
            if self.is_empty() {
                let data = armed.sleep(left);
                let slept = now.elapsed();
                let mut spin = self.inner.spin.lock();
                spin.after_sleep(slept, slept < left);
                if data && !spin.base().is_zero() && self.is_empty() {
                    break Slept::Data;
                }
            }
        };
        self.inner.waiter_armed.store(false, Ordering::SeqCst);
        drop(armed);
        // Pushes while this thread was armed woke no other waiter: hand on what is left.
        let st = self.inner.state.lock();
        if !st.items.is_empty() && st.sleepers > 0 {
            self.inner.ready.notify_one();
        }
        got
    }

    /// A future resolving to the next completion; works with any async runtime.
    pub fn next(&self) -> NextCompletion<'_> {
        NextCompletion { cq: self }
    }
}

/// How a sleep on the armed rails ended.
enum Slept {
    Got(Completion),
    TimedOut,
    /// Data arrived that completed nothing here.
    Data,
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
