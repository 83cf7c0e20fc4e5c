//! Event queues and the slot a synchronous (`EXS_MSG_SYNC`) caller waits in.
//!
//! A queue's depth bounds the operations outstanding on it plus the events not yet
//! dequeued: [`QueueShared::reserve`] takes a place when an operation is accepted,
//! dequeueing gives it back. Waiters take only the queue's own mutex.

use std::any::Any;
use std::collections::VecDeque;
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::abi::Errno;
use crate::abi::exs_event_t;

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
    /// How many events each thread blocked in `dequeue` needs: a post wakes them only once
    /// one of them can go. Waking a waiter for every event (it looks, and sleeps again) cost
    /// a dequeue of half of 16 outstanding sends eight wake-ups instead of one.
    needs: Vec<usize>,
}

/// An event queue.
pub(crate) struct QueueShared {
    state: Mutex<QState>,
    cond: Condvar,
}

impl QueueShared {
    /// A queue of `depth` places (the caller checked the range).
    pub(crate) fn new(depth: usize) -> QueueShared {
        QueueShared {
            state: Mutex::new(QState {
                depth,
                reserved: 0,
                events: VecDeque::new(),
                deleted: false,
                wakers: Vec::new(),
                needs: Vec::new(),
            }),
            cond: Condvar::new(),
        }
    }

    /// Post the event of an operation that held a place (a deleted queue drops it).
    pub(crate) fn post(&self, c: Completion) {
        let wakers = {
            let mut st = self.state.lock();
            if st.deleted {
                // Nobody can dequeue it any more; the owned buffer (if any) is freed here.
                st.reserved -= 1;
                return;
            }
            st.events.push_back(c);
            let ready = st.events.len();
            if st.needs.iter().any(|&n| n <= ready) {
                self.cond.notify_all();
            }
            std::mem::take(&mut st.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Would one more event wake a thread blocked in `dequeue` on this queue?
    pub(crate) fn would_wake(&self) -> bool {
        let st = self.state.lock();
        let ready = st.events.len() + 1;
        st.needs.iter().any(|&n| n <= ready)
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
            st.needs.push(need);
            let timed_out = match deadline {
                None => {
                    self.cond.wait(&mut st);
                    false
                }
                Some(d) => Instant::now() >= d || self.cond.wait_until(&mut st, d).timed_out(),
            };
            if let Some(i) = st.needs.iter().position(|&n| n == need) {
                st.needs.swap_remove(i);
            }
            if timed_out && (st.events.len() < need || st.deleted) {
                return Ok(Vec::new());
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

    /// Take a place for an operation; `EAGAIN` when the queue is full.
    pub(crate) fn reserve(&self) -> Result<(), Errno> {
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

    /// Mark the queue deleted: waiters get `EINVAL`, events still queued are dropped, later
    /// ones are discarded. Unless `force`, refuses with `EBUSY` while operations are
    /// outstanding.
    pub(crate) fn delete(&self, force: bool) -> Result<(), Errno> {
        let wakers = {
            let mut st = self.state.lock();
            if !force && st.reserved > st.events.len() {
                return Err(libc::EBUSY);
            }
            st.deleted = true;
            st.reserved -= st.events.len();
            st.events.clear();
            std::mem::take(&mut st.wakers)
        };
        self.cond.notify_all();
        for w in wakers {
            w.wake();
        }
        Ok(())
    }
}

/// Where a synchronous (`EXS_MSG_SYNC`) caller waits for its operation.
pub(crate) struct SyncSlot {
    done: Mutex<Option<(isize, i32)>>,
    cond: Condvar,
}

impl SyncSlot {
    pub(crate) fn new() -> SyncSlot {
        SyncSlot {
            done: Mutex::new(None),
            cond: Condvar::new(),
        }
    }

    /// The operation finished with this result and error number.
    pub(crate) fn set(&self, result: isize, errno: i32) {
        *self.done.lock() = Some((result, errno));
        self.cond.notify_all();
    }

    /// Wait for [`SyncSlot::set`]; its result, or its error number.
    pub(crate) fn wait(&self) -> Result<usize, Errno> {
        let mut d = self.done.lock();
        while d.is_none() {
            self.cond.wait(&mut d);
        }
        match d.expect("loop ends when set") {
            (_, e) if e != 0 => Err(e),
            (r, _) => Ok(r as usize),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn event(n: isize) -> Completion {
        let mut ev = exs_event_t::zeroed();
        ev.ev_result = n;
        Completion { ev, owner: None }
    }

    #[test]
    fn depth_bounds_outstanding_plus_undequeued() {
        let q = QueueShared::new(2);
        q.reserve().unwrap();
        q.reserve().unwrap();
        assert_eq!(q.reserve(), Err(libc::EAGAIN));
        q.post(event(1));
        // Posted but not dequeued still holds its place.
        assert_eq!(q.reserve(), Err(libc::EAGAIN));
        let got = q.dequeue(8, Some(Instant::now())).unwrap();
        assert_eq!(got.len(), 1);
        q.reserve().unwrap();
    }

    #[test]
    fn waiters_wake_once_their_count_is_there() {
        let q = std::sync::Arc::new(QueueShared::new(8));
        let wait = |need: i64| {
            let q = q.clone();
            std::thread::spawn(move || {
                q.dequeue(need, Some(Instant::now() + Duration::from_secs(20)))
                    .unwrap()
                    .len()
            })
        };
        let (three, one) = (wait(-3), wait(1));
        for i in 0..4 {
            q.reserve().unwrap();
            q.post(event(i));
        }
        // The waiter for one goes at the first post; the waiter for three once three are
        // there, whichever order they take them in: four events serve both.
        assert_eq!(three.join().unwrap(), 3);
        assert_eq!(one.join().unwrap(), 1);
        assert!(q.state.lock().needs.is_empty(), "no waiter left registered");
    }

    #[test]
    fn would_wake_says_whether_one_more_event_lets_a_waiter_go() {
        let q = Arc::new(QueueShared::new(4));
        assert!(!q.would_wake(), "nobody waits");
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || {
                q.dequeue(-2, Some(Instant::now() + Duration::from_secs(20)))
                    .unwrap()
                    .len()
            })
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while q.state.lock().needs.is_empty() {
            assert!(Instant::now() < deadline, "the waiter never waited");
            std::thread::yield_now();
        }
        assert!(!q.would_wake(), "it needs two");
        q.reserve().unwrap();
        q.post(event(1));
        assert!(q.would_wake(), "one more makes two");
        q.reserve().unwrap();
        q.post(event(2));
        assert_eq!(waiter.join().unwrap(), 2);
        assert!(!q.would_wake(), "nobody waits any more");
    }

    #[test]
    fn dequeue_counts_and_timeouts() {
        let q = QueueShared::new(4);
        for i in 0..3 {
            q.reserve().unwrap();
            q.post(event(i));
        }
        assert_eq!(
            q.dequeue(-5, None).err(),
            Some(libc::EINVAL),
            "more than the depth"
        );
        let soon = Some(Instant::now() + Duration::from_millis(20));
        assert!(
            q.dequeue(-4, soon).unwrap().is_empty(),
            "exactly 4: only 3 there"
        );
        let two = q.dequeue(2, None).unwrap();
        assert_eq!(
            two.iter().map(|c| c.ev.ev_result).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(q.dequeue(-1, None).unwrap()[0].ev.ev_result, 2);
        assert!(q.dequeue(1, Some(Instant::now())).unwrap().is_empty());
    }

    #[test]
    fn a_waiter_wakes_on_post_and_on_delete() {
        let q = Arc::new(QueueShared::new(4));
        q.reserve().unwrap();
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.dequeue(1, None).map(|v| v.len()));
        q.post(event(7));
        assert_eq!(t.join().unwrap(), Ok(1));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.dequeue(1, None).map(|v| v.len()));
        q.reserve().unwrap();
        assert_eq!(
            q.delete(false),
            Err(libc::EBUSY),
            "an operation is outstanding"
        );
        q.delete(true).unwrap();
        assert_eq!(t.join().unwrap(), Err(libc::EINVAL));
        // The outstanding operation's event is discarded, not queued.
        q.post(event(9));
        assert_eq!(q.reserve(), Err(libc::EINVAL));
    }

    #[test]
    fn sync_slot() {
        let s = Arc::new(SyncSlot::new());
        let s2 = s.clone();
        let t = std::thread::spawn(move || s2.wait());
        s.set(-1, libc::EPIPE);
        assert_eq!(t.join().unwrap(), Err(libc::EPIPE));
        let s = SyncSlot::new();
        s.set(42, 0);
        assert_eq!(s.wait(), Ok(42));
    }
}
