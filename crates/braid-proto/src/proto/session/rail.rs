//! Per-rail state, acknowledgements, keepalive and liveness.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::proto::rate::RateEstimator;
use crate::wire::{FrameHeader, Opcode};

use super::config::IDLE_ACK_MIN;
use super::types::Keep;
use super::{CrcCheck, LogEntry, RxPending, Session};

/// Per-rail state.
pub(super) struct RailState {
    pub(super) alive: bool,
    /// Control frames queued on this rail; they go before data.
    pub(super) ctrl: VecDeque<FrameHeader>,
    /// Bytes handed to the driver for this rail.
    pub(super) tx_bytes: u64,
    /// Bytes of this rail the peer has consumed.
    pub(super) acked: u64,
    /// Bytes consumed from this rail.
    pub(super) rx_bytes: u64,
    /// Last `rx_bytes` told to the peer.
    pub(super) rx_advertised: u64,
    /// Payload bytes of data frames sent on this rail (statistics).
    pub(super) data_sent: u64,
    pub(super) rate: RateEstimator,
    pub(super) stalled: bool,
    pub(super) rx_pending: Option<RxPending>,
    /// Keeps the memory of the pending payload's placement alive until `payload_done`,
    /// whatever happens to its operation meanwhile (failure, a duplicated chunk).
    pub(super) rx_keep: Option<Keep>,
    /// When the rail last received a frame / handed out a frame (set on the first tick).
    pub(super) last_rx: Option<Instant>,
    pub(super) last_tx: Option<Instant>,
    /// With payload CRCs: the frame whose payload is being placed, and where it goes.
    pub(super) crc_check: Option<CrcCheck>,
    /// Frames sent and not yet acknowledged.
    pub(super) log: VecDeque<LogEntry>,
    /// For a dead rail: how much of it this side had consumed when it died.
    pub(super) dead_consumed: Option<u64>,
    /// Where the current connection's bytes start in the rail's count (the peer's
    /// `RailRestore`; 0 for the first connection): a retransmission ending at or before it
    /// is a frame of an earlier connection.
    pub(super) conn_start: u64,
    /// A re-established rail whose first frame (`RailRestore`) has not arrived yet.
    pub(super) awaiting_restore: bool,
    /// The retransmission whose payload is being read, by original (rail, end).
    pub(super) rx_retx: Option<(usize, u64)>,
    /// Delivery rate reported by the driver (bytes per second; 0 = unknown).
    pub(super) capacity: f64,
    /// The frame being received asked for an acknowledgement once consumed.
    pub(super) ack_after_payload: bool,
    /// Sent-byte position at which the next frame asks for an acknowledgement.
    pub(super) next_ack_req: u64,
    /// Where the last frame that asked for an acknowledgement ends.
    pub(super) ack_req_end: u64,
    /// Where this side's bytes of the current connection start in the rail's count (0 for
    /// the first connection).
    pub(super) tx_conn_start: u64,
    /// When logged frames last started to wait on an idle rail, or an acknowledgement last
    /// came: how long the oldest frame has waited without progress.
    pub(super) progress_at: Option<Instant>,
    /// A hedged rail (see `SessionConfig::rail_hedge_after`): its frames up to this sent
    /// count went again on other rails, and it takes no new data until they are
    /// acknowledged.
    pub(super) hedged_to: Option<u64>,
    /// When the rail was hedged, and how much of it was acknowledged then: the rail drains
    /// what it holds until it catches up, which measures its rate.
    pub(super) hedged_at: Option<(Instant, u64)>,
    /// A rail found overdue while the peer showed no life elsewhere is looked at again then.
    pub(super) hedge_not_before: Option<Instant>,
    /// Where the frame whose payload is being read ends, in the rail's count (original
    /// frames only): a hedged copy of it waits until it is complete.
    pub(super) rx_frame_end: Option<u64>,
}

impl RailState {
    pub(super) fn new() -> RailState {
        RailState {
            alive: true,
            ctrl: VecDeque::new(),
            tx_bytes: 0,
            acked: 0,
            rx_bytes: 0,
            rx_advertised: 0,
            data_sent: 0,
            rate: RateEstimator::default(),
            stalled: false,
            rx_pending: None,
            rx_keep: None,
            last_rx: None,
            last_tx: None,
            crc_check: None,
            log: VecDeque::new(),
            dead_consumed: None,
            conn_start: 0,
            awaiting_restore: false,
            rx_retx: None,
            capacity: 0.0,
            ack_after_payload: false,
            next_ack_req: 0,
            ack_req_end: 0,
            tx_conn_start: 0,
            progress_at: None,
            hedged_to: None,
            hedged_at: None,
            hedge_not_before: None,
            rx_frame_end: None,
        }
    }

    pub(super) fn inflight(&self) -> u64 {
        self.tx_bytes - self.acked
    }
}

impl Session {
    /// Queues a `RailAck` unless a control frame (which carries the acknowledgement too) is
    /// already waiting.
    pub(super) fn ack_now(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        if r.rx_bytes > r.rx_advertised && r.ctrl.is_empty() {
            r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        }
    }

    pub(super) fn consumed(&mut self, rail: usize, n: u64) {
        let r = &mut self.rails[rail];
        r.rx_bytes += n;
        if r.rx_bytes - r.rx_advertised >= self.cfg.ack_threshold && r.ctrl.is_empty() {
            r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        }
    }

    /// Timer work; the driver calls it at least every [`SessionConfig::keepalive_interval`]
    /// (and at [`Session::poll_timeout`]). Hedges rails slow to acknowledge (see
    /// `SessionConfig::rail_hedge_after`), queues keepalives on rails that have been quiet,
    /// and returns the rails (a bit per rail)
    /// that received nothing for [`SessionConfig::peer_timeout`]: the driver fails them.
    ///
    /// Only silence this side observed counts. A gap between two calls longer than the
    /// larger of `keepalive_interval` and a quarter of `peer_timeout` means this side itself
    /// stopped (its process stopped or starved of CPU, its machine paused); the excess is
    /// not counted as the peer's silence. Both ends of a test on a loaded 2-core machine
    /// starved together for 2.7 s, and every rail was declared dead at the next tick.
    ///
    /// [`SessionConfig::keepalive_interval`]: super::SessionConfig::keepalive_interval
    /// [`SessionConfig::peer_timeout`]: super::SessionConfig::peer_timeout
    pub fn on_tick(&mut self, now: Instant) -> u64 {
        let mut dead = 0;
        if self.failed.is_some() {
            return 0;
        }
        self.hedge_slow_rails(now);
        let slack = self.cfg.keepalive_interval.max(self.cfg.peer_timeout / 4);
        let unobserved = self.last_tick.map_or(Duration::ZERO, |t| {
            now.saturating_duration_since(t).saturating_sub(slack)
        });
        self.last_tick = Some(now);
        for (i, r) in self.rails.iter_mut().enumerate() {
            if !r.alive {
                continue;
            }
            if let Some(l) = &mut r.last_rx {
                *l = (*l + unobserved).min(now);
            }
            let last_rx = *r.last_rx.get_or_insert(now);
            let last_tx = *r.last_tx.get_or_insert(now);
            // A rail braid itself stopped reading is not silent: its bytes wait in the kernel.
            // A rail in the middle of a payload is: `on_rx_progress` keeps `last_rx` fresh
            // while its bytes keep coming.
            if !r.stalled && now.saturating_duration_since(last_rx) >= self.cfg.peer_timeout {
                dead |= 1 << i;
            }
            if now.saturating_duration_since(last_tx) >= self.cfg.keepalive_interval
                && r.ctrl.is_empty()
            {
                r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
            }
        }
        dead
    }

    /// When [`Session::on_tick`] is due next (as quinn-proto's `Connection::poll_timeout`):
    /// the earliest keepalive of a live rail (one `keepalive_interval` after it last handed
    /// out a frame, unless one waits to be sent already), `peer_timeout` after a rail that
    /// is not stalled last received, or when a rail's frames will have waited long enough
    /// to be hedged (`rail_hedge_after`). A time in the past means now: a rail whose clocks have
    /// not started (before the first tick, after a rail is restored) gives the last tick's
    /// time. `None` before the first tick (the driver ticks at once, or within its longest
    /// period) and once the session has failed.
    ///
    /// Only this side's state moves the deadline, and only later (frames go out, frames
    /// come in), except where a rail is restored: a driver may compute it after each tick
    /// and after a restore, and tick early at no cost but the call.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.failed.is_some() {
            return None;
        }
        let mut due: Option<Instant> = None;
        let mut at = |t: Instant| due = Some(due.map_or(t, |d| d.min(t)));
        for r in self.rails.iter().filter(|r| r.alive) {
            let (Some(rx), Some(tx)) = (r.last_rx, r.last_tx) else {
                return self.last_tick;
            };
            if r.ctrl.is_empty() {
                at(tx + self.cfg.keepalive_interval);
            }
            if !r.stalled {
                at(rx + self.cfg.peer_timeout);
            }
        }
        if let Some(t) = self.hedge_due() {
            at(t);
        }
        due
    }

    /// The driver found no more bytes to read on `rail` for now. If enough of it is still
    /// unacknowledged, an acknowledgement goes out even though the threshold was not reached,
    /// so a sender whose window is smaller than our threshold is never left waiting.
    pub fn on_rx_idle(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        if r.alive
            && !r.awaiting_restore
            && r.rx_bytes - r.rx_advertised >= IDLE_ACK_MIN
            && r.ctrl.is_empty()
        {
            r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        }
    }

    /// Notes that payload bytes are arriving on `rail` (a large chunk on a slow rail takes
    /// a while; the rail is not silent).
    ///
    /// Before the first [`Session::on_tick`] (which starts the silence clock at its own time)
    /// there is nothing to refresh: the kernel's time of the last data of a rail that has
    /// only done its handshake is the handshake's, and an endpoint whose last rail took longer
    /// than `peer_timeout` to connect had its first rails declared dead at once.
    pub fn on_rx_progress(&mut self, rail: usize, now: Instant) {
        if let Some(l) = &mut self.rails[rail].last_rx {
            *l = (*l).max(now);
        }
    }

    /// Rails that were stalled and may now proceed (a bit per rail); clears the set.
    pub fn take_rx_retry(&mut self) -> u64 {
        std::mem::take(&mut self.rx_retry)
    }

    /// True when [`Session::take_rx_retry`] would name a rail.
    pub fn rx_retry_pending(&self) -> bool {
        self.rx_retry != 0
    }

    /// True while the rail is in use.
    pub fn rail_alive(&self, rail: usize) -> bool {
        self.rails[rail].alive
    }

    /// True while a live rail's reads wait behind another rail (a request that is not
    /// executable yet: see [`crate::RxAction::Stall`]). A driver watches the other rails
    /// closely then: one that has gone silent holds everything up.
    pub fn rx_stalled(&self) -> bool {
        self.rails.iter().any(|r| r.alive && r.stalled)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::wire::Opcode;

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};

    fn cfg() -> SessionConfig {
        SessionConfig {
            keepalive_interval: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(3),
            ..SessionConfig::default()
        }
    }

    #[test]
    fn a_quiet_rail_sends_keepalives_and_stays_alive() {
        let mut p = Pair::new(cfg(), 2);
        p.advance(Duration::ZERO);
        for _ in 0..20 {
            assert_eq!(p.advance(Duration::from_millis(300)), [0, 0]);
            p.run();
        }
        let keepalives = p.sent[0]
            .iter()
            .filter(|(_, h)| h.opcode == Opcode::RailAck)
            .count();
        assert!(
            keepalives >= 2 * 19,
            "one per rail and interval: {keepalives}"
        );
        assert!(p.s[0].rail_alive(0) && p.s[0].rail_alive(1));
    }

    #[test]
    fn a_silent_peer_is_found_dead_after_the_timeout() {
        let mut p = Pair::new(cfg(), 2);
        p.held[1] = true;
        p.advance(Duration::ZERO);
        let mut dead = [0; 2];
        for _ in 0..12 {
            let d = p.advance(Duration::from_millis(300));
            dead[0] |= d[0];
            dead[1] |= d[1];
            p.run();
        }
        assert_eq!(dead, [0b10, 0b10], "only the rail nobody reads");
    }

    /// A driver that ticks only when `poll_timeout` says keeps quiet rails alive with
    /// keepalives, finds a silent peer dead in time, and sleeps more than a fixed tick would.
    #[test]
    fn ticking_at_poll_timeout_keeps_alive_and_finds_the_silent_peer() {
        let mut p = Pair::new(cfg(), 2);
        assert_eq!(p.s[0].poll_timeout(), None, "never ticked");
        p.advance(Duration::ZERO);
        p.held[1] = true;
        let start = p.now;
        let (mut ticks, mut dead) = (0, 0);
        while dead == 0 && p.now < start + Duration::from_secs(10) {
            let due = p.s[0].poll_timeout().expect("a deadline");
            assert!(due > p.now, "due in the future once ticked");
            assert!(
                due <= p.now + cfg().keepalive_interval,
                "no later than the next keepalive"
            );
            p.now = due;
            dead = p.s[0].on_tick(p.now);
            ticks += 1;
            p.run();
        }
        assert_eq!(dead, 0b10, "only the rail nobody reads");
        let waited = p.now - start;
        assert!(
            waited >= cfg().peer_timeout && waited < cfg().peer_timeout + cfg().keepalive_interval,
            "found dead {waited:?} after it fell silent"
        );
        assert!(
            ticks <= 13,
            "{ticks} ticks: one per keepalive interval, not per 100 ms"
        );
        assert!(p.s[0].rail_alive(0));
    }

    #[test]
    fn a_long_pause_of_the_whole_process_is_not_silence() {
        let mut p = Pair::new(cfg(), 1);
        p.advance(Duration::ZERO);
        assert_eq!(p.advance(Duration::from_secs(60)), [0, 0]);
    }

    #[test]
    fn received_bytes_are_acknowledged_once_the_rail_goes_idle() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let src = p.region(0, 2 << 20, 1);
        let dst = p.region(1, 2 << 20, 0);
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        p.run();
        for r in 0..2 {
            assert_eq!(p.s[0].rails[r].inflight(), 0, "rail {r}");
            assert!(p.s[0].rails[r].log.is_empty());
        }
    }
}
