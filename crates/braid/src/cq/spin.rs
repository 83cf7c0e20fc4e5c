//! How long a thread blocked in `CompletionQueue::wait` polls before it sleeps.
//!
//! A fixed spin shorter than a wake-up lets two blocking peers fall into a mode where each
//! sleeps just before the other's message comes, so that every message costs a whole
//! wake-up (30-50 µs on these VMs against 2 µs per read over the same-host ring). So the
//! spin adapts, as Linux's haltpoll cpuidle governor adapts a CPU's idle polling: it
//! doubles, up to [`GROWTH_MAX`] times the configured spin, each time a sleep is ended by
//! data within that longest spin (a longer poll would have caught the data without a
//! wake-up), and halves back towards the configured spin each time a sleep lasts longer.

use std::time::Duration;

/// The spin grows to at most this many times the configured one.
pub(super) const GROWTH_MAX: u32 = 4;

/// The configured spin and the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SpinPolicy {
    base: Duration,
    current: Duration,
}

impl SpinPolicy {
    pub(super) fn new(base: Duration) -> SpinPolicy {
        SpinPolicy {
            base,
            current: base,
        }
    }

    /// The configured spin (zero: never spin).
    pub(super) fn base(&self) -> Duration {
        self.base
    }

    /// How long the next wait polls before it sleeps.
    pub(super) fn current(&self) -> Duration {
        self.current
    }

    /// A sleep lasted `slept`, and was ended by data or a completion (`woken`) or by its
    /// timeout.
    pub(super) fn after_sleep(&mut self, slept: Duration, woken: bool) {
        let most = self.base * GROWTH_MAX;
        if woken && slept < most {
            self.current = (self.current * 2).min(most);
        } else {
            self.current = (self.current / 2).max(self.base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Sleeps ended soon by data grow the spin to its bound; long ones shrink it back to
    /// the configured spin, never below.
    #[test]
    fn the_spin_grows_while_data_ends_sleeps_soon_and_shrinks_when_sleeps_run_long() {
        let mut p = SpinPolicy::new(20 * US);
        assert_eq!(p.current(), 20 * US);
        p.after_sleep(30 * US, true);
        assert_eq!(p.current(), 40 * US);
        for _ in 0..5 {
            p.after_sleep(30 * US, true);
        }
        assert_eq!(p.current(), 20 * US * GROWTH_MAX, "bounded");
        // Data that came after the longest spin would not have been caught by spinning.
        p.after_sleep(20 * US * GROWTH_MAX, true);
        assert_eq!(p.current(), 40 * US);
        // A sleep that timed out, however short.
        p.after_sleep(US, false);
        assert_eq!(p.current(), 20 * US);
        p.after_sleep(Duration::from_secs(1), false);
        assert_eq!(p.current(), 20 * US, "never below the configured spin");
    }

    /// A configured spin of zero stays zero: waits sleep at once, as before.
    #[test]
    fn no_spin_configured_means_none_ever() {
        let mut p = SpinPolicy::new(Duration::ZERO);
        p.after_sleep(5 * US, true);
        assert_eq!(p.current(), Duration::ZERO);
        assert_eq!(p.base(), Duration::ZERO);
    }
}
