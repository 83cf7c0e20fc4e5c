//! A thread that runs jobs one after another, in the order they were handed to it: the
//! server's background work (early writeback, populating grown ranges) that no request
//! should wait for.

use std::sync::mpsc::{Sender, channel};
use std::thread::JoinHandle;

use parking_lot::Mutex;

/// One piece of background work.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The thread and its queue; dropping this runs the jobs already queued, then ends it.
pub(crate) struct JobThread {
    tx: Mutex<Option<Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl JobThread {
    /// Starts the thread named `name`. If it cannot be started (a warning says so, with
    /// `without`: what that costs), [`JobThread::submit`] hands every job back.
    pub(crate) fn start(name: &str, without: &str) -> JobThread {
        let (tx, rx) = channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
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
        }
    }

    /// Queues `job`; gives it back if the thread is not running.
    pub(crate) fn submit(&self, job: Job) -> Result<(), Job> {
        match self.tx.lock().as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
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
}
