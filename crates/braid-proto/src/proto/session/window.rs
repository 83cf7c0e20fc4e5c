//! Per-rail windows: how many unacknowledged bytes a rail may carry, and its chunk size.

use std::time::Duration;

use super::Session;
use super::config::MIN_CHUNK;

impl Session {
    pub(super) fn window(&self, rail: usize) -> u64 {
        let r = &self.rails[rail];
        // The kernel's view of the connection's delivery rate, when the driver reports it, is
        // not distorted by braid's own stalls; acknowledgement timing is the fallback.
        let rate = if r.capacity > 0.0 {
            r.capacity
        } else {
            r.rate.rate()
        };
        match rate {
            x if x <= 0.0 => self.cfg.initial_window,
            rate => ((rate * self.target_delay().as_secs_f64()) as u64)
                .clamp(self.cfg.min_window, self.cfg.max_window),
        }
    }

    /// The queueing delay windows aim at (see [`SessionConfig::relaxed_target_delay`]).
    pub(super) fn target_delay(&self) -> Duration {
        if self.cfg.relaxed_placement {
            self.cfg.relaxed_target_delay
        } else {
            self.cfg.target_delay
        }
    }

    /// Largest chunk for `rail`: a quarter of its window, so that four chunks are in flight;
    /// a slow rail takes small chunks instead of holding up an operation with a large one.
    /// The target executes chunks in order, so a chunk is also how long the other rails may
    /// wait behind this one: at 1 Gbit/s (1 MiB window) 256 KiB chunks kept four rails at
    /// 478 MB/s where 512 KiB chunks (half the window) gave 454 and 1 MiB chunks 394-478
    /// (`braid bench write -s 4190211 -D 5 -q 8 [--chunk 256K] [--min-window 1M]` on
    /// `braid testbed up --rails 4`, README "Goals").
    pub(super) fn chunk_for(&self, rail: usize) -> u64 {
        let max = self.cfg.chunk_size as u64;
        (self.window(rail) / 4).clamp(MIN_CHUNK.min(max), max)
    }

    /// The delivery rate the transport measures for `rail` (bytes per second; e.g. Linux's
    /// `tcpi_delivery_rate`), reported by the driver from time to time.
    pub fn set_rail_capacity(&mut self, rail: usize, bytes_per_sec: f64) {
        if bytes_per_sec <= 0.0 || !bytes_per_sec.is_finite() {
            return;
        }
        let r = &mut self.rails[rail];
        // Smoothed: single samples swing with token-bucket bursts and idle periods.
        r.capacity = if r.capacity <= 0.0 {
            bytes_per_sec
        } else {
            0.8 * r.capacity + 0.2 * bytes_per_sec
        };
    }

    pub(super) fn data_allowed(&self, rail: usize) -> bool {
        self.rails[rail].inflight() < self.window(rail)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::mem::registry::Registry;

    use super::super::{Session, SessionConfig};

    fn session(cfg: SessionConfig) -> Session {
        Session::new(cfg, Arc::new(Registry::default()), 2, 0)
    }

    fn cfg() -> SessionConfig {
        SessionConfig {
            initial_window: 8 << 20,
            min_window: 1 << 20,
            max_window: 32 << 20,
            chunk_size: 4 << 20,
            target_delay: Duration::from_millis(4),
            ..SessionConfig::default()
        }
    }

    #[test]
    fn unknown_rate_gives_the_initial_window_and_quarter_chunks() {
        let s = session(cfg());
        assert_eq!(s.window(0), 8 << 20);
        assert_eq!(s.chunk_for(0), 2 << 20);
    }

    #[test]
    fn window_is_capacity_times_delay_within_its_bounds() {
        let mut s = session(cfg());
        s.set_rail_capacity(0, 1e9);
        assert!(s.window(0).abs_diff(4_000_000) <= 1, "{}", s.window(0));
        assert!(s.chunk_for(0).abs_diff(1_000_000) <= 1);
        // 4 KB of rate x delay: the floor.
        s.set_rail_capacity(1, 1e6);
        assert_eq!(s.window(1), 1 << 20);
        assert_eq!(s.chunk_for(1), 256 << 10);
        // Smoothed towards a huge sample: the ceiling.
        s.set_rail_capacity(0, 1e12);
        assert_eq!(s.window(0), 32 << 20);
        assert_eq!(s.chunk_for(0), 4 << 20, "chunks never exceed chunk_size");
    }

    #[test]
    fn capacity_samples_are_smoothed_and_bad_ones_ignored() {
        let mut s = session(cfg());
        s.set_rail_capacity(0, 1e9);
        for bad in [0.0, -5.0, f64::NAN, f64::INFINITY] {
            s.set_rail_capacity(0, bad);
        }
        assert_eq!(s.rails[0].capacity, 1e9);
        s.set_rail_capacity(0, 2e9);
        assert!((s.rails[0].capacity - 1.2e9).abs() < 1.0);
    }

    #[test]
    fn relaxed_placement_aims_at_its_own_delay() {
        let mut s = session(SessionConfig {
            relaxed_placement: true,
            relaxed_target_delay: Duration::from_millis(16),
            ..cfg()
        });
        assert_eq!(s.target_delay(), Duration::from_millis(16));
        s.set_rail_capacity(0, 1e8);
        assert!(s.window(0).abs_diff(1_600_000) <= 1, "{}", s.window(0));
    }

    #[test]
    fn data_is_allowed_while_the_window_has_room() {
        let mut s = session(cfg());
        assert!(s.data_allowed(0));
        s.rails[0].tx_bytes = 8 << 20;
        assert!(!s.data_allowed(0));
        s.rails[0].acked = 1;
        assert!(s.data_allowed(0));
        assert!(s.data_allowed(1), "windows are per rail");
    }
}
