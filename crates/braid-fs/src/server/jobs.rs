//! A thread that runs jobs one after another, in the order they were handed to it: the
//! server's background work (early writeback, populating grown ranges) that no request
//! should wait for.

use std::sync::Arc;
use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// One piece of background work.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The thread and its queue; dropping this runs the jobs already queued, then ends it.
pub(crate) struct JobThread {
    tx: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Jobs handed over and not finished yet, with a signal when the count falls.
    pending: Arc<(Mutex<usize>, Condvar)>,
}

impl JobThread {
    /// Starts the thread named `name`. If it cannot be started (a warning says so, with
    /// `without`: what that costs), [`JobThread::submit`] hands every job back.
    pub(crate) fn start(name: &str, without: &str) -> JobThread {
        let (tx, rx) = channel::<Job>();
        let pending = Arc::new((Mutex::new(0usize), Condvar::new()));
        let done = pending.clone();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                    let (count, fell) = &*done;
                    *count.lock() -= 1;
                    fell.notify_all();
                }
            });
        let (tx, thread) = match spawned {
            Ok(t) => (Some(tx), Some(t)),
            Err(e) => {
                tracing::warn!("starting the {name} thread: {e}; {without}");
                (None, None)
            }
        };
        JobThread {
            tx: Mutex::new(tx),
            thread: Mutex::new(thread),
            pending,
        }
    }

    /// Queues `job`; gives it back if the thread is not running.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        let tx = self.tx.lock();
        let Some(tx) = tx.as_ref() else {
            return Err(job);
        };
        *self.pending.0.lock() += 1;
        tx.send(job).map_err(|e| {
            *self.pending.0.lock() -= 1;
            e.0
        })
    }

    /// Waits until every job handed over so far has finished, or `limit` has passed;
    /// true if they have.
    pub(crate) fn wait_idle(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let (count, fell) = &*self.pending;
        let mut n = count.lock();
        while *n > 0 {
            if fell.wait_until(&mut n, deadline).timed_out() {
                return *n == 0;
            }
        }
        true
    }
}

impl Drop for JobThread {
    fn drop(&mut self) {
        self.tx.lock().take();
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn jobs_run_in_order_and_all_queued_ones_run_before_the_thread_ends() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let t = JobThread::start("test-jobs", "nothing runs");
        for i in 0..100 {
            let s = seen.clone();
            assert!(t.submit(Box::new(move || s.lock().push(i))).is_ok());
        }
        drop(t);
        assert_eq!(*seen.lock(), (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn wait_idle_returns_once_the_jobs_handed_over_have_run() {
        let t = JobThread::start("test-jobs", "nothing runs");
        assert!(t.wait_idle(Duration::ZERO), "nothing handed over");
        let (go, gate) = std::sync::mpsc::channel::<()>();
        let ran = Arc::new(Mutex::new(false));
        let r = ran.clone();
        assert!(
            t.submit(Box::new(move || {
                let _ = gate.recv();
                *r.lock() = true;
            }))
            .is_ok()
        );
        assert!(!t.wait_idle(Duration::from_millis(20)), "the job is held");
        go.send(()).unwrap();
        assert!(t.wait_idle(Duration::from_secs(10)));
        assert!(*ran.lock());
    }
}
