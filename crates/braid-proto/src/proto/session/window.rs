//! Per-rail windows: how many unacknowledged bytes a rail may carry, and its chunk size.

use std::time::Duration;

use super::Session;
use super::config::{MIN_RAIL_CHUNK, MIN_WINDOW_BYTES, MIN_WINDOW_TIME};

/// The page size chunks are whole multiples of (see [`Session::chunk_for`]).
const PAGE: u64 = crate::mem::shared::PAGE as u64;

/// How far the transport's delivery rate may exceed the rate braid's own acknowledgements
/// show before it is not believed (see `Session::measured_rate`).
const CAPACITY_OVER_ACKED: f64 = 4.0;

const MIN_WINDOW_SECS: f64 = MIN_WINDOW_TIME.as_secs_f64();

impl Session {
    pub(super) fn window(&self, rail: usize) -> u64 {
        let rate = self.measured_rate(rail);
        if rate <= 0.0 {
            return self.cfg.initial_window;
        }
        // Floored in time, not only in bytes: a rail far slower than `min_window` per
        // `MIN_WINDOW_TIME` gets what it delivers in that time, so what it carries never
        // holds an operation (and the fast rails' completions behind it) for long.
        let floor = self
            .cfg
            .min_window
            .min((rate * MIN_WINDOW_SECS) as u64)
            .max(MIN_WINDOW_BYTES);
        debug_assert_eq!(self.delay_secs, self.target_delay().as_secs_f64());
        ((rate * self.delay_secs) as u64).clamp(floor, self.cfg.max_window.max(floor))
    }

    /// The rate `rail`'s window follows (bytes per second; 0 while no acknowledgement has
    /// measured it).
    pub(super) fn measured_rate(&self, rail: usize) -> f64 {
        let r = &self.rails[rail];
        // The kernel's view of the connection's delivery rate, when the driver reports it, is
        // not distorted by braid's own stalls; acknowledgement timing checks it. The kernel
        // keeps its highest rate sample while the connection is application-limited, which
        // a small window makes it: on a 500 kbit/s rail behind a 256 KB token bucket, the
        // first burst's 1 Gbit/s stood for seconds and gave that rail a 2 MB window.
        let acked = r.rate.rate();
        if acked <= 0.0 {
            0.0
        } else if r.capacity > 0.0 {
            r.capacity.min(acked * CAPACITY_OVER_ACKED)
        } else {
            acked
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
    /// a slow rail takes small chunks instead of holding up an operation with a large one
    /// (at 500 kbit/s, the smallest window: 4 KiB in 1 KiB chunks).
    /// The target executes chunks in order, so a chunk is also how long the other rails may
    /// wait behind this one: at 1 Gbit/s (1 MiB window) 256 KiB chunks kept four rails at
    /// 478 MB/s where 512 KiB chunks (half the window) gave 454 and 1 MiB chunks 394-478
    /// (`braid bench write -s 4190211 -D 5 -q 8 [--chunk 256K] [--min-window 1M]` on
    /// `braid testbed up --rail-count 4`, docs/RESULTS.md).
    /// A chunk of two pages or more is whole pages: the chunks of a page-aligned operation
    /// then start on page boundaries, where a same-host receiver can map them instead of
    /// copying (page exchange; 16 MiB writes over four rings with 16 MiB in flight went at
    /// 3.7-5.5 GB/s in most runs in chunks cut anywhere, single copy 11.9-13.5).
    pub(super) fn chunk_for(&self, rail: usize) -> u64 {
        let max = self.cfg.chunk_size as u64;
        let c = (self.window(rail) / 4).clamp(MIN_RAIL_CHUNK.min(max), max);
        if c >= 2 * PAGE { c / PAGE * PAGE } else { c }
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
        // No window is below MIN_WINDOW_BYTES: a rail carrying less needs no window worked
        // out (a polling thread asks this on every poll).
        let inflight = self.rails[rail].inflight();
        (inflight < MIN_WINDOW_BYTES || inflight < self.window(rail)) && !self.sidelined(rail)
    }

    /// Makes `rail`'s measured rates (acknowledgements and the transport's) `bytes_per_sec`.
    #[cfg(test)]
    pub(super) fn measure_rail(&mut self, rail: usize, bytes_per_sec: f64) {
        let t0 = std::time::Instant::now();
        let r = &mut self.rails[rail];
        r.rate = crate::proto::rate::RateEstimator::default();
        r.rate.on_ack(0, t0, true);
        r.rate.on_ack(
            (bytes_per_sec / 100.0) as u64,
            t0 + Duration::from_millis(10),
            true,
        );
        r.capacity = 0.0;
        self.set_rail_capacity(rail, bytes_per_sec);
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
        s.measure_rail(0, 1e9);
        assert!(s.window(0).abs_diff(4_000_000) <= 1, "{}", s.window(0));
        assert_eq!(s.chunk_for(0), s.window(0) / 4 / 4096 * 4096, "whole pages");
        assert!(s.chunk_for(0).abs_diff(1_000_000) < 4096);
        // 200 MB/s: rate x delay is 800 KB, below the floor of 1 MiB (which it sends in
        // less than 20 ms).
        s.measure_rail(1, 2e8);
        assert_eq!(s.window(1), 1 << 20);
        assert_eq!(s.chunk_for(1), 256 << 10);
        // Smoothed towards a huge sample: believed up to 4x the acknowledged rate.
        s.set_rail_capacity(0, 1e12);
        assert!(s.window(0).abs_diff(16_000_000) <= 1, "{}", s.window(0));
        s.measure_rail(0, 1e12);
        assert_eq!(s.window(0), 32 << 20, "the ceiling");
        assert_eq!(s.chunk_for(0), 4 << 20, "chunks never exceed chunk_size");
    }

    /// A slow rail's window is 20 ms of its rate, not `min_window`; and never below 4 KiB.
    #[test]
    fn slow_rails_are_floored_in_time() {
        let mut s = session(cfg());
        s.measure_rail(0, 1e6);
        assert!(s.window(0).abs_diff(20_000) <= 1, "{}", s.window(0));
        assert!(s.chunk_for(0).abs_diff(5_000) <= 1);
        // 500 kbit/s: 1250 B in 20 ms; the floor in bytes.
        s.measure_rail(1, 62_500.0);
        assert_eq!(s.window(1), 4096);
        assert_eq!(s.chunk_for(1), 1024);
    }

    /// The transport's rate counts only once acknowledgements confirm it, and only up to
    /// four times what they show (a token bucket's first burst, kept by the kernel while the
    /// window limits the connection).
    #[test]
    fn the_transport_rate_is_checked_against_acknowledgements() {
        let mut s = session(cfg());
        s.set_rail_capacity(0, 125e6);
        assert_eq!(
            s.window(0),
            8 << 20,
            "no acknowledgement yet: the initial window"
        );
        s.measure_rail(0, 62_500.0);
        s.set_rail_capacity(0, 125e6);
        assert_eq!(s.window(0), 5000, "believed up to 250 KB/s: 20 ms of it");
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
        s.measure_rail(0, 1e8);
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
