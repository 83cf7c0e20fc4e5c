//! Hedging a slow rail (see [`SessionConfig::rail_hedge_after`]): the sender copies the
//! frames waiting on a live rail that makes no progress onto the others and gives it no new
//! data until they are acknowledged; the receiver executes whichever copy of a frame comes
//! first and drops the other, the late original included.
//!
//! A copy names its original by (rail, end offset there), as a retransmission after a rail
//! loss does, and carries [`FLAG_HEDGE`] so that the receiver keeps the rail. The receiver
//! knows a frame of a live rail as done when it consumed the rail past its end (the
//! original came first) or recorded the copy in `retx_seen` (the copy came first; the
//! original, when it comes, is dropped and the record removed). A copy that arrives while
//! the original's payload is being read waits for it, and an original that arrives while a
//! copy's payload is being read waits for that: the second one is then a duplicate.
//!
//! [`SessionConfig::rail_hedge_after`]: super::SessionConfig::rail_hedge_after
//! [`FLAG_HEDGE`]: crate::wire::frame::FLAG_HEDGE

use std::time::Instant;

use crate::wire::FrameHeader;
use crate::wire::frame::{FLAG_ACK_REQ, HEADER_LEN};

use super::types::RxAction;
use super::{RxPending, Sent, Session};

/// Counts of [`Session::hedge_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HedgeStats {
    /// Times this side hedged a rail.
    pub hedges: u64,
    /// Frames it sent again on other rails for that.
    pub frames_resent: u64,
    /// Frames it received and dropped: a hedged copy whose original had executed, or a late
    /// original whose copy had.
    pub duplicates_dropped: u64,
}

impl Session {
    /// True while `rail` is hedged and another live rail is not: it takes no new data.
    /// (When every live rail is hedged, they all carry on: there is nowhere else to go.)
    pub(super) fn sidelined(&self, rail: usize) -> bool {
        self.rails[rail].hedged_to.is_some()
            && self
                .rails
                .iter()
                .enumerate()
                .any(|(i, o)| i != rail && o.alive && o.hedged_to.is_none())
    }

    /// A rail for a reply that belongs to no rail in particular (the `Done` of a write whose
    /// chunks were all placed early): a live one not sidelined that received last (a slow
    /// rail rarely has; one that is quiet both ways may be slow too), else the first live.
    pub(super) fn reply_rail(&self) -> Option<usize> {
        (0..self.rails.len())
            .filter(|&r| self.rails[r].alive && !self.sidelined(r))
            .max_by_key(|&r| (self.rails[r].last_rx, std::cmp::Reverse(r)))
            .or_else(|| self.rails.iter().position(|r| r.alive))
    }

    /// Notes that `rail` made progress at `now` (an acknowledgement came, or logged frames
    /// began to wait on it), and ends its hedge once everything sent before is acknowledged.
    pub(super) fn note_progress(&mut self, rail: usize, now: Instant) {
        let r = &mut self.rails[rail];
        r.progress_at = Some(now);
        r.hedge_not_before = None;
        if r.hedged_to.is_some_and(|to| r.acked >= to) {
            r.hedged_to = None;
            // It was busy all the while: what it delivered since the hedge is its rate, and
            // the estimate that gave it more than it could carry (a token bucket's burst,
            // say) is replaced. Only a drain that took long says so: one that ended soon
            // after the hedge was a rail the peer held back (its reads waiting for a copy's
            // original, say): measured so, a healthy 1 Gbit/s rail came out at 6.5 MB/s.
            let mut rate = 0.0;
            let long = (self.cfg.rail_hedge_after * 4).as_secs_f64();
            if let Some((t0, acked0)) = r.hedged_at.take() {
                let secs = now.saturating_duration_since(t0).as_secs_f64();
                if secs >= long && r.acked > acked0 {
                    rate = (r.acked - acked0) as f64 / secs;
                    r.rate.reset_to(rate);
                    if r.capacity > rate {
                        r.capacity = rate;
                    }
                }
            }
            tracing::debug!(
                endpoint = self.endpoint_id,
                rail,
                rate,
                "hedged rail caught up"
            );
        }
    }

    /// When the next hedge may be due: the earliest time a live, unhedged rail with frames
    /// waiting would have waited [`SessionConfig::rail_hedge_after`].
    ///
    /// [`SessionConfig::rail_hedge_after`]: super::SessionConfig::rail_hedge_after
    pub(super) fn hedge_due(&self) -> Option<Instant> {
        let after = self.cfg.rail_hedge_after;
        if after.is_zero() || self.rails.len() < 2 {
            return None;
        }
        self.rails
            .iter()
            .filter(|r| {
                r.alive && !r.awaiting_restore && r.hedged_to.is_none() && !r.log.is_empty()
            })
            .filter_map(|r| {
                let due = r.progress_at? + after;
                Some(r.hedge_not_before.map_or(due, |t| due.max(t)))
            })
            .min()
    }

    /// Hedges every live rail whose logged frames have waited `rail_hedge_after` without an
    /// acknowledgement while the peer shows life on another rail: a frame received there, or
    /// an acknowledgement, after this one's wait began. (When nothing comes, the peer is
    /// slow, not the rail, and copies would only add to its work; the rail is looked at
    /// again half that time later.)
    pub(super) fn hedge_slow_rails(&mut self, now: Instant) {
        let after = self.cfg.rail_hedge_after;
        if after.is_zero() || self.failed.is_some() {
            return;
        }
        for rail in 0..self.rails.len() {
            let r = &self.rails[rail];
            let waited = r
                .progress_at
                .is_some_and(|t| now.saturating_duration_since(t) >= after)
                && r.hedge_not_before.is_none_or(|t| now >= t);
            if !r.alive || r.awaiting_restore || r.hedged_to.is_some() || r.log.is_empty() {
                continue;
            }
            if !waited {
                continue;
            }
            let since = r.progress_at;
            let moving = self.rails.iter().enumerate().any(|(i, o)| {
                i != rail
                    && o.alive
                    && !o.awaiting_restore
                    && o.hedged_to.is_none()
                    && (o.progress_at > since || o.last_rx > since)
            });
            if moving {
                self.hedge(rail);
            } else {
                self.rails[rail].hedge_not_before = Some(now + after / 2);
            }
        }
    }

    /// Sends `rail`'s unacknowledged requests, descriptors and control frames again on the
    /// other rails; `rail` takes no new data until all it carried is acknowledged.
    pub(super) fn hedge(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        r.hedged_to = Some(r.tx_bytes);
        r.hedged_at = r.progress_at.map(|t| (t, r.acked));
        let copies: Vec<_> = r
            .log
            .iter()
            .filter(|e| !matches!(e.frame, Sent::Response { .. }))
            .cloned()
            .collect();
        tracing::debug!(
            endpoint = self.endpoint_id,
            rail,
            frames = copies.len(),
            "rail slow to acknowledge: its frames go again on the others"
        );
        self.hedged_frames += copies.len() as u64;
        self.hedges += 1;
        self.retx.extend(copies);
    }

    /// Hedging so far: how often this side hedged a rail, how many frames it sent again for
    /// that, and how many frames it received and dropped because another copy of them (a
    /// hedged copy, or the late original of one) had executed.
    pub fn hedge_stats(&self) -> HedgeStats {
        HedgeStats {
            hedges: self.hedges,
            frames_resent: self.hedged_frames,
            duplicates_dropped: self.hedge_dups,
        }
    }

    /// An original frame of live `rail` (`h`, starting at the rail's consumed count): `Some`
    /// when a hedged copy of it is done (dropped) or being read (the rail waits for it).
    pub(super) fn original_already_hedged(
        &mut self,
        rail: usize,
        h: &FrameHeader,
    ) -> Option<RxAction> {
        if self.retx_seen.is_empty() && !self.rails.iter().any(|r| r.rx_retx.is_some()) {
            return None;
        }
        let key = (
            rail,
            self.rails[rail].rx_bytes + HEADER_LEN as u64 + h.payload_len as u64,
        );
        if self.retx_seen.contains(&key) {
            self.hedge_dups += 1;
            // The record goes once the original is consumed whole (`payload_done`): a
            // further copy arriving meanwhile must still find it done.
            let action = self.drop_frame(rail, h);
            if matches!(action, RxAction::Discard) {
                self.rails[rail].rx_frame_end = Some(key.1);
            } else {
                self.retx_seen.remove(&key);
            }
            return Some(action);
        }
        if self.rails.iter().any(|r| r.alive && r.rx_retx == Some(key)) {
            self.rails[rail].stalled = true;
            return Some(RxAction::Stall);
        }
        None
    }

    /// Consumes frame `h` of `rail` without executing it (a copy already executed), and
    /// answers its acknowledgement request.
    pub(super) fn drop_frame(&mut self, rail: usize, h: &FrameHeader) -> RxAction {
        self.rails[rail].stalled = false;
        self.consumed(rail, HEADER_LEN as u64);
        let ack = h.flags & FLAG_ACK_REQ != 0;
        if h.payload_len > 0 {
            let r = &mut self.rails[rail];
            r.rx_pending = Some(RxPending::Dropped { len: h.payload_len });
            r.crc_check = None;
            r.ack_after_payload |= ack;
            return RxAction::Discard;
        }
        if ack {
            self.ack_now(rail);
        }
        RxAction::Done
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::error::Status;
    use crate::wire::frame::{FLAG_HEDGE, FLAG_RETX};

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};

    fn cfg() -> SessionConfig {
        SessionConfig {
            chunk_size: 64 << 10,
            rail_hedge_after: Duration::from_millis(100),
            peer_timeout: Duration::from_secs(30),
            relaxed_placement: true,
            ..SessionConfig::default()
        }
    }

    fn write(src: &crate::mem::region::Region, off: usize, len: usize, key: u64) -> Request {
        Request::Write {
            local: vec![src.slice(off, len).unwrap()],
            rkey: key,
            addr: off as u64,
            imm: None,
        }
    }

    /// Rail 0 holds its frames (a slow link) while rail 1 delivers: after the hedge delay
    /// its frames go again on rail 1, every operation completes once, the held originals
    /// are dropped when they finally arrive, and rail 0 stays in use.
    #[test]
    fn a_held_rail_is_hedged_and_its_late_frames_are_dropped() {
        const LEN: usize = 1 << 20;
        let mut p = Pair::new(cfg(), 2);
        p.advance(Duration::ZERO);
        let src = p.region(0, LEN, 3);
        let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 % 251) as u8).collect();
        src.write_at(0, &pattern).unwrap();
        let dst = p.region(1, LEN, 0);
        let key = dst.remote_key().key;
        p.held[0] = true;
        p.post(0, 1, write(&src, 0, LEN / 2, key));
        p.run();
        assert!(p.queued(0, 0) > 0, "frames wait on rail 0");
        assert!(p.done[0].is_empty(), "rail 0 holds the write up");
        // 50 ms on, another write goes on rail 1 and is acknowledged there.
        p.advance(Duration::from_millis(50));
        p.post(0, 2, write(&src, LEN / 2, LEN / 2, key));
        p.run();
        assert_eq!(p.s[0].hedge_stats().hedges, 0, "not yet");
        // Once rail 0's frames have waited 100 ms, a tick hedges it.
        p.advance(Duration::from_millis(51));
        p.run();
        assert_eq!(p.s[0].hedge_stats().hedges, 1, "one hedge");
        let st: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(st, [(1, Status::Success), (2, Status::Success)]);
        assert!(
            p.sent[0]
                .iter()
                .any(|(r, h)| *r == 1
                    && h.flags & (FLAG_RETX | FLAG_HEDGE) == FLAG_RETX | FLAG_HEDGE),
            "copies went on rail 1, flagged as hedges"
        );
        // The originals arrive late: dropped, nothing executes twice (a later write to the
        // same bytes is not overwritten by them).
        let newer: Vec<u8> = pattern.iter().map(|b| b ^ 0xff).collect();
        src.write_at(0, &newer[..LEN / 2]).unwrap();
        p.post(0, 3, write(&src, 0, LEN / 2, key));
        p.run();
        p.held[0] = false;
        p.run();
        p.assert_no_errors("after the late originals");
        assert_eq!(p.done[0].len(), 3, "no completion twice");
        assert_eq!(dst.to_vec(0, LEN / 2).unwrap(), newer[..LEN / 2]);
        assert_eq!(dst.to_vec(LEN / 2, LEN / 2).unwrap(), pattern[LEN / 2..]);
        assert!(
            p.s[0].rail_alive(0) && p.s[1].rail_alive(0),
            "the rail stays"
        );
        assert!(
            p.s[1].retx_seen.is_empty(),
            "each record went with its original"
        );
        // Everything acknowledged: rail 0 carries data again.
        p.advance(Duration::from_millis(1));
        p.run();
        assert!(p.s[0].rails[0].hedged_to.is_none(), "caught up");
        let sent_before = p.sent[0].iter().filter(|(r, _)| *r == 0).count();
        p.post(0, 4, write(&src, 0, LEN, key));
        p.run();
        p.assert_no_errors("after the rejoin");
        assert!(p.sent[0].iter().filter(|(r, _)| *r == 0).count() > sent_before);
        assert_eq!(p.done[0].len(), 4);
    }

    /// When every rail is held (the peer is slow, not a rail), nothing is hedged.
    #[test]
    fn no_hedge_while_no_rail_moves() {
        let mut p = Pair::new(cfg(), 2);
        p.advance(Duration::ZERO);
        let src = p.region(0, 1 << 20, 1);
        let dst = p.region(1, 1 << 20, 0);
        p.post(0, 1, write(&src, 0, 1 << 20, dst.remote_key().key));
        p.held = vec![true, true];
        p.run();
        p.advance(Duration::from_millis(150));
        p.run();
        assert_eq!(p.s[0].hedge_stats().hedges, 0);
        p.held = vec![false, false];
        p.run();
        assert_eq!(p.done[0].len(), 1);
    }
}
