//! Rate-limited warnings: a peer that can make a server log once per connection or request
//! could otherwise fill the disk with its log (issue 39, finding 12).
//!
//! ```
//! use std::time::Duration;
//! static REFUSED: braid::log_limit::RateLimit = braid::log_limit::RateLimit::new(Duration::from_secs(1));
//! if let Some(suppressed) = REFUSED.check() {
//!     eprintln!("refused a peer ({suppressed} more since the last line)");
//! }
//! // Or, one limit per call site:
//! braid::warn_limited!(peer = "198.18.0.1", "refused a peer");
//! ```

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Lets one event through per interval and counts the ones it held back.
#[derive(Debug)]
pub struct RateLimit {
    interval_ns: u64,
    /// Nanoseconds since [`epoch`] before which nothing is let through.
    next: AtomicU64,
    suppressed: AtomicU64,
}

fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    // Offset by one interval's worth so that `next = 0` lets the very first event through.
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}

impl RateLimit {
    /// At most one event per `interval`.
    pub const fn new(interval: Duration) -> RateLimit {
        RateLimit {
            interval_ns: interval.as_nanos() as u64,
            next: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(n)` if an event may be reported now (`n` events were held back since the last
    /// one reported), `None` if this one is held back.
    pub fn check(&self) -> Option<u64> {
        let now = now_ns();
        let next = self.next.load(Ordering::Relaxed);
        if now >= next
            && self
                .next
                .compare_exchange(
                    next,
                    now + self.interval_ns,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::AcqRel));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// `tracing::warn!` at most once a second per call site; the line says how many were held
/// back since the last one (`suppressed = n`). Takes the same arguments as `tracing::warn!`
/// (fields, then the message).
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMIT: $crate::log_limit::RateLimit =
            $crate::log_limit::RateLimit::new(::std::time::Duration::from_secs(1));
        if let Some(suppressed) = LIMIT.check() {
            ::tracing::warn!(suppressed, $($arg)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_interval_and_the_rest_are_counted() {
        let l = RateLimit::new(Duration::from_secs(3600));
        assert_eq!(l.check(), Some(0));
        for _ in 0..1000 {
            assert_eq!(l.check(), None);
        }
        // The next window reports what was held back.
        l.next.store(0, Ordering::Relaxed);
        assert_eq!(l.check(), Some(1000));
        assert_eq!(l.check(), None);
        let open = RateLimit::new(Duration::ZERO);
        assert_eq!((open.check(), open.check()), (Some(0), Some(0)));
    }
}
