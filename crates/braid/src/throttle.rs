//! Keeping a flood of strangers from becoming a flood of log lines or a hot loop: a
//! rate limit for per-connection warnings, and the back-off of an accept loop that ran out
//! of descriptors.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long an accept loop pauses after the process or the system ran out of descriptors
/// (the connection stays in the kernel's backlog, so without a pause `poll` wakes at once
/// and the loop spins).
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Lets one log line through per interval and counts the ones it held back.
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    /// When the last line went through, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogThrottle {
    /// At most one line per `interval`.
    pub const fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(held back since the last line)` when a line may be written now; `None` (and
    /// counted) otherwise.
    pub fn allow(&self) -> Option<u64> {
        let mut st = self.state.lock();
        let now = Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < self.interval => {
                st.1 += 1;
                None
            }
            _ => {
                let held = st.1;
                *st = (Some(now), 0);
                Some(held)
            }
        }
    }
}

/// Whether an `accept` error means descriptors (or kernel memory for them) ran out:
/// `EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`. The caller should pause [`ACCEPT_BACKOFF`].
pub fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// One accept failure: logged at most once per second (with the count held back), and a
/// pause of [`ACCEPT_BACKOFF`] when descriptors ran out. `what` names the listener.
pub fn accept_failed(log: &LogThrottle, what: &str, e: &std::io::Error) {
    let exhausted = out_of_descriptors(e);
    if let Some(held) = log.allow() {
        if exhausted {
            tracing::warn!(
                "{what}: accept failed: {e} (pausing accepts; {held} more failures since the \
                 last report); raise the descriptor limit (ulimit -n) or find what holds them"
            );
        } else {
            tracing::warn!("{what}: accept failed: {e} ({held} more since the last report)");
        }
    }
    if exhausted {
        std::thread::sleep(ACCEPT_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_and_the_rest_counted() {
        let t = LogThrottle::new(Duration::from_secs(3600));
        assert_eq!(t.allow(), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.allow(), None);
        }
        let t = LogThrottle::new(Duration::ZERO);
        assert_eq!(t.allow(), Some(0));
        assert_eq!(t.allow(), Some(0));
    }

    #[test]
    fn descriptor_exhaustion_is_recognised() {
        assert!(out_of_descriptors(&std::io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(out_of_descriptors(&std::io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!out_of_descriptors(&std::io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }
}
