//! Delivery-rate estimation of one rail, from the peer's rail acknowledgements.

use std::time::{Duration, Instant};

/// Shortest interval a rate sample may cover: shorter ones are too noisy.
const MIN_SAMPLE: Duration = Duration::from_millis(2);

/// Estimates a rail's delivery rate in bytes per second.
///
/// Samples are acknowledged bytes over at least `MIN_SAMPLE` (2 ms). A sample above the estimate
/// is always taken (the rail can do at least that); a sample below it only when the rail
/// was kept busy, so that idle periods of the application do not shrink the estimate.
#[derive(Debug, Default, Clone)]
pub struct RateEstimator {
    epoch_start: Option<Instant>,
    epoch_bytes: u64,
    epoch_busy: bool,
    rate: f64,
}

impl RateEstimator {
    /// `bytes` newly acknowledged at `now`; `busy` when the rail's window was at least half full.
    pub fn on_ack(&mut self, bytes: u64, now: Instant, busy: bool) {
        let Some(start) = self.epoch_start else {
            self.epoch_start = Some(now);
            self.epoch_busy = busy;
            return;
        };
        self.epoch_bytes += bytes;
        self.epoch_busy &= busy;
        let elapsed = now.saturating_duration_since(start);
        if elapsed < MIN_SAMPLE {
            return;
        }
        let sample = self.epoch_bytes as f64 / elapsed.as_secs_f64();
        if self.rate == 0.0 {
            self.rate = sample;
        } else if sample > self.rate || self.epoch_busy {
            self.rate = 0.75 * self.rate + 0.25 * sample;
        }
        self.epoch_start = Some(now);
        self.epoch_bytes = 0;
        self.epoch_busy = busy;
    }

    /// Replaces the estimate with `rate` (bytes per second) measured elsewhere over a long
    /// busy period, and starts a new sample.
    pub fn reset_to(&mut self, rate: f64) {
        *self = RateEstimator {
            rate,
            ..RateEstimator::default()
        };
    }

    /// The estimate in bytes per second; 0 while unknown.
    pub fn rate(&self) -> f64 {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn converges_and_ignores_idle_periods() {
        let t0 = Instant::now();
        let mut e = RateEstimator::default();
        // 100 MB/s for 100 ms, acknowledged every millisecond.
        for ms in 0..=100u64 {
            e.on_ack(100_000, t0 + Duration::from_millis(ms), true);
        }
        assert!((e.rate() - 1e8).abs() < 1e7, "rate {}", e.rate());
        // The application goes quiet: tiny acks while not busy leave the estimate alone.
        for ms in 101..=200u64 {
            e.on_ack(10, t0 + Duration::from_millis(ms), false);
        }
        assert!((e.rate() - 1e8).abs() < 1e7, "rate {}", e.rate());
    }
}
