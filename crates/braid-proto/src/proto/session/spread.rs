//! Spreading work over the rails: a lone operation (the only one with data left to send)
//! over every live rail in shares proportional to their windows, so that it finishes on
//! all rails together; and small operations (one frame each) one per rail, round robin
//! over the rails with the least in flight, so that many of them use every rail.

use super::Session;
use super::config::{IDLE_ACK_MIN, MIN_CHUNK};
use super::rail::RailState;

/// The bytes each rail has carried of the operation that alone has data left to send:
/// such an operation is spread over every live rail in shares proportional to their windows,
/// so that it finishes on all rails at about the same time.
pub(super) struct LoneOp {
    /// (is a read response, seq).
    pub(super) key: (bool, u64),
    pub(super) sent: Vec<u64>,
}

/// A lone operation's shares are multiples of this (the page size).
const SHARE_ALIGN: u128 = crate::mem::shared::PAGE as u128;

impl Session {
    /// True when the session has several rails to spread work over. With one, a lone
    /// operation's share is all of it and every small operation goes on that rail, so the
    /// transmit scheduler skips the spreading (a ping-pong asks on every message).
    pub(super) fn spreads(&self) -> bool {
        self.rails.len() > 1
    }

    /// True when spreading lets `rail` take the next data frame: it has not carried its
    /// share of a lone operation while another rail can take the rest, and the next small
    /// operation among others is steered to it or to no rail in particular.
    pub(super) fn spread_lets(&self, rail: usize) -> bool {
        !self.spreads()
            || (!self.leaves_lone_share(rail) && self.small_op_rail().is_none_or(|r| r == rail))
    }

    /// The operation that alone has data left to send, as (is a read response, seq, total).
    pub(super) fn lone_op(&self) -> Option<(bool, u64, u64)> {
        match (self.tx_resp.len(), self.tx_req.len()) {
            (1, 0) => self.tx_resp.front().map(|r| (true, r.seq, r.total)),
            (0, 1) => {
                let c = self.tx_req.front()?;
                let first = self.ops.front()?.seq;
                let op = self.ops.get(c.seq.checked_sub(first)? as usize)?;
                Some((false, c.seq, op.total))
            }
            _ => None,
        }
    }

    /// What is left of `rail`'s share of the lone operation (see [`LoneOp`]); `None` when
    /// several operations have data to send (the queue keeps every rail busy then).
    pub(super) fn lone_share_left(&self, rail: usize) -> Option<u64> {
        let (resp, seq, total) = self.lone_op()?;
        // At least a small operation's worth; a rail measured slow, one of its chunks.
        let mine = self.measured_rate(rail);
        let floor = if mine > 0.0 {
            MIN_CHUNK.min(self.chunk_for(rail))
        } else {
            MIN_CHUNK
        };
        // Whole pages: the shares of a page-aligned operation then start on page boundaries,
        // where a same-host receiver can map them instead of copying (page exchange; a 16
        // MiB write over three rings split at 5592406 bytes went by copy).
        let share = if self.far_slower(rail) {
            0
        } else if total <= floor && self.rails[rail].alive {
            // The proportional part is at most `total` (this rail's window is one of those
            // summed): the floor decides, and the windows need not be summed (every small
            // operation of a ping-pong comes here).
            (floor as u128).next_multiple_of(SHARE_ALIGN) as u64
        } else {
            let alive = |r: &RailState| r.alive;
            let windows: u128 = (0..self.rails.len())
                .filter(|&r| alive(&self.rails[r]))
                .map(|r| self.window(r) as u128)
                .sum();
            (total as u128 * self.window(rail) as u128)
                .div_ceil(windows.max(1))
                .max(floor as u128)
                .next_multiple_of(SHARE_ALIGN) as u64
        };
        let sent = match &self.lone {
            Some(l) if l.key == (resp, seq) => l.sent.get(rail).copied().unwrap_or(0),
            _ => 0,
        };
        Some(share.saturating_sub(sent))
    }

    /// True when `rail` is measured under a thirty-second of the fastest live rail: it takes
    /// no part of a lone operation, not even when the others' windows are full. What it
    /// would add is small, and its chunk (with its frame and round trip) would hold the
    /// operation: a 4 MiB write at depth 1 over 1 Gbit/s and 500 kbit/s went at 56-61 MB/s,
    /// against 119.5 on the fast rail alone.
    pub(super) fn far_slower(&self, rail: usize) -> bool {
        if self.rails.len() == 1 {
            // No other rail to be slower than.
            return false;
        }
        let mine = self.measured_rate(rail);
        mine > 0.0
            && (0..self.rails.len())
                .filter(|&r| self.rails[r].alive && !self.sidelined(r))
                .any(|r| self.measured_rate(r) > 32.0 * mine)
    }

    /// True when `rail` has carried its share of the lone operation and another live rail
    /// with an open window has not: the driver offers every rail that wants to transmit in
    /// the same pass, so the shares go out on all rails at once instead of queueing behind
    /// each other on the first rail to ask (a 1 MiB write at depth 1 then takes a quarter
    /// of the time on four rails).
    pub(super) fn leaves_lone_share(&self, rail: usize) -> bool {
        if self.lone_op().is_some() && self.far_slower(rail) {
            return true;
        }
        self.lone_share_left(rail) == Some(0)
            && (0..self.rails.len()).any(|r| {
                r != rail
                    && self.rails[r].alive
                    && self.data_allowed(r)
                    && self.lone_share_left(r).is_some_and(|left| left > 0)
            })
    }

    /// True when the next data frame [`Session::poll_transmit`] hands out (no
    /// retransmission waiting) is a whole operation, a request or read response not begun
    /// yet that fits one chunk on any rail, and other operations of this side are in
    /// progress with it (see [`Session::small_op_rail`]).
    pub(super) fn next_data_is_concurrent_small_op(&self) -> bool {
        if !self.retx.is_empty() || self.ops.len() + self.tx_resp.len() <= 1 {
            return false;
        }
        let one_chunk = MIN_CHUNK.min(self.cfg.chunk_size as u64);
        if (self.prefer_resp || self.tx_req.is_empty())
            && let Some(r) = self.tx_resp.front()
        {
            return r.next_off == 0 && r.total <= one_chunk;
        }
        let Some(c) = self.tx_req.front() else {
            return false;
        };
        let op = self
            .ops
            .front()
            .and_then(|first| c.seq.checked_sub(first.seq))
            .and_then(|i| self.ops.get(i as usize));
        op.is_some_and(|op| {
            c.next_off == 0 && !c.desc_sent && !op.opcode.is_descriptor() && op.total <= one_chunk
        })
    }

    /// The rail the next data frame should go on when it is a small operation among others
    /// (see [`Session::next_data_is_concurrent_small_op`]): of the live rails whose window
    /// has room, the one with the fewest bytes in flight counted in units of
    /// [`IDLE_ACK_MIN`], a rail with control frames waiting first among equals (it writes
    /// anyway: the operation leaves in the same system call), else round robin. Concurrent
    /// small operations (a DSM's pages, say) so use every rail instead of queueing on the
    /// first one the driver offers, and a rail busy with a large operation is left alone.
    /// (The unit: a rail's last frames stay unacknowledged until the peer sends on it again
    /// or this much accumulates, so exact counts would keep choosing whichever rail happens
    /// to be acknowledged to the byte.)
    ///
    /// `None` for anything else, which goes on any rail that asks (the driver asks rail 0
    /// first): an operation that is alone keeps the rail of the conversation. Spreading
    /// those too (round robin at every operation, or in turns of 64 KiB) made a DSM fault
    /// at depth 1 over four testbed rails slower (read fault 72-92 µs against 62 µs, medians
    /// of 8 interleaved runs at load 7-9), most likely because the TCP connections'
    /// acknowledgements then no longer ride on the replies.
    pub(super) fn small_op_rail(&self) -> Option<usize> {
        if !self.cfg.spread_small_ops || !self.next_data_is_concurrent_small_op() {
            return None;
        }
        let n = self.rails.len();
        let load = |r: usize| self.rails[r].inflight() / IDLE_ACK_MIN;
        let open = (0..n)
            .map(|i| (self.small_rr + i) % n)
            .filter(|&r| self.rails[r].alive && self.data_allowed(r));
        let least = open.clone().map(load).min()?;
        let mut tied = open.filter(|&r| load(r) == least);
        tied.clone()
            .find(|&r| !self.rails[r].ctrl.is_empty())
            .or_else(|| tied.next())
    }

    /// Counts a data frame of `len` bytes of operation (`resp`, `seq`) sent on `rail` while
    /// that operation is the lone one.
    pub(super) fn note_lone_sent(&mut self, rail: usize, resp: bool, seq: u64, len: u64) {
        let n = self.rails.len();
        let l = self.lone.get_or_insert_with(|| LoneOp {
            key: (resp, seq),
            sent: vec![0; n],
        });
        if l.key != (resp, seq) {
            // The counts of the next operation reuse the vector: no allocation per message.
            l.key = (resp, seq);
            l.sent.clear();
            l.sent.resize(n, 0);
        }
        l.sent[rail] += len;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::mem::region::{Access, Region};
    use crate::mem::registry::Registry;

    use super::super::config::MIN_CHUNK;
    use super::super::testkit::Pair;
    use super::super::{Request, Session, SessionConfig};
    use crate::wire::{FrameHeader, Opcode};

    const MIB: u64 = 1 << 20;

    /// A write of all of `r` to key 7.
    fn whole_write(r: &Region) -> Request {
        Request::Write {
            local: vec![r.as_sge()],
            rkey: 7,
            addr: 0,
            imm: None,
        }
    }

    /// A session over two rails whose windows are 4 MB and 2 MB, and a write of `len` bytes.
    fn setup(len: usize) -> (Session, Region, u64) {
        let reg = Arc::new(Registry::default());
        let mut s = Session::new(SessionConfig::default(), reg.clone(), 2, 0);
        s.measure_rail(0, 1e9);
        s.measure_rail(1, 5e8);
        let r = Region::allocate_in(&reg, len, Access::all()).unwrap();
        let seq = s
            .post(
                1,
                Request::Write {
                    local: vec![r.as_sge()],
                    rkey: 7,
                    addr: 0,
                    imm: None,
                },
            )
            .unwrap();
        (s, r, seq)
    }

    #[test]
    fn a_lone_operation_is_shared_in_proportion_to_the_windows() {
        let (mut s, _r, seq) = setup(6 * MIB as usize);
        let (w0, w1) = (s.window(0), s.window(1));
        assert!(w0 > w1);
        let want0 = (6 * MIB as u128 * w0 as u128).div_ceil((w0 + w1) as u128) as u64;
        assert_eq!(s.lone_share_left(0), Some(want0));
        let left1 = s.lone_share_left(1).unwrap();
        assert!(left1.abs_diff(6 * MIB - want0) <= 1, "{left1}");

        // Rail 0 has carried its share while rail 1 has not: rail 0 leaves the rest.
        s.note_lone_sent(0, false, seq, want0);
        assert_eq!(s.lone_share_left(0), Some(0));
        assert!(s.leaves_lone_share(0));
        assert!(!s.leaves_lone_share(1));
        // Once every rail has carried its share, nobody holds back.
        s.note_lone_sent(1, false, seq, left1);
        assert!(!s.leaves_lone_share(0));
    }

    #[test]
    fn dead_rails_get_no_share_and_small_operations_a_minimum() {
        let (mut s, _r, _) = setup(6 * MIB as usize);
        s.rails[1].alive = false;
        assert_eq!(s.lone_share_left(0), Some(6 * MIB));
        let (s, _r, _) = setup(1024);
        assert_eq!(s.lone_share_left(1), Some(MIN_CHUNK));
    }

    /// A rail a thousand times slower takes no part of a lone operation, even while the
    /// fast rail's window is full; with several operations it takes chunks again.
    #[test]
    fn a_far_slower_rail_takes_no_part_of_a_lone_operation() {
        let (mut s, r, _) = setup(6 * MIB as usize);
        s.measure_rail(1, 1e6);
        assert!(s.far_slower(1) && !s.far_slower(0));
        assert_eq!(s.lone_share_left(1), Some(0));
        s.rails[0].tx_bytes = 64 << 20;
        assert!(!s.data_allowed(0), "the fast rail's window is full");
        assert!(s.leaves_lone_share(1));
        s.post(2, whole_write(&r)).unwrap();
        assert!(!s.leaves_lone_share(1), "two operations: no lone one");
    }

    #[test]
    fn shares_count_per_operation_and_only_while_one_is_alone() {
        let (mut s, r, seq) = setup(6 * MIB as usize);
        s.note_lone_sent(0, false, seq, MIB);
        let left = s.lone_share_left(0).unwrap();
        // Bytes counted for another operation do not consume this one's share.
        s.note_lone_sent(0, false, seq + 1, MIB);
        assert_eq!(s.lone_share_left(0), Some(left + MIB));
        s.post(2, whole_write(&r)).unwrap();
        assert_eq!(s.lone_share_left(0), None, "two operations: no lone one");
        assert!(!s.leaves_lone_share(0));
    }

    /// Side 0 of a pair over `rails` rails posts `n` writes of 4 KiB (pages into
    /// consecutive slots of side 1's region), or reads of 4 KiB from it with `read`.
    fn small_ops(rails: usize, n: usize, read: bool) -> (Pair, Region, Region) {
        let mut p = Pair::new(SessionConfig::default(), rails);
        let src = p.region(0, n * 4096, 0);
        let pattern: Vec<u8> = (0..n * 4096).map(|i| (i % 251) as u8).collect();
        let dst = p.region(1, n * 4096, 0);
        if read {
            dst.write_at(0, &pattern).unwrap();
        } else {
            src.write_at(0, &pattern).unwrap();
        }
        for i in 0..n {
            let local = vec![src.slice(i * 4096, 4096).unwrap()];
            let (rkey, addr) = (dst.remote_key().key, (i * 4096) as u64);
            let req = if read {
                Request::Read { local, rkey, addr }
            } else {
                Request::Write {
                    local,
                    rkey,
                    addr,
                    imm: None,
                }
            };
            p.post(0, i as u64, req);
        }
        (p, src, dst)
    }

    /// The rails side `side` sent frames of `opcode` on, as counts per rail.
    fn per_rail(p: &Pair, side: usize, opcode: Opcode, rails: usize) -> Vec<usize> {
        let mut n = vec![0; rails];
        for (rail, h) in &p.sent[side] {
            if h.opcode == opcode {
                n[*rail] += 1;
            }
        }
        n
    }

    #[test]
    fn concurrent_small_operations_spread_over_every_rail() {
        let (mut p, src, dst) = small_ops(4, 16, false);
        p.run();
        assert_eq!(p.done[0].len(), 16);
        assert!(p.done[0].iter().all(|c| c.status.is_ok()));
        assert_eq!(per_rail(&p, 0, Opcode::Write, 4), vec![4; 4]);
        assert_eq!(
            dst.to_vec(0, 16 * 4096).unwrap(),
            src.to_vec(0, 16 * 4096).unwrap()
        );

        // Read responses too: the target spreads its 4 KiB responses.
        let (mut p, src, dst) = small_ops(4, 16, true);
        p.run();
        assert_eq!(p.done[0].len(), 16);
        let resp = per_rail(&p, 1, Opcode::ReadResponse, 4);
        assert!(resp.iter().all(|&n| n > 0), "responses per rail {resp:?}");
        assert_eq!(
            src.to_vec(0, 16 * 4096).unwrap(),
            dst.to_vec(0, 16 * 4096).unwrap()
        );
    }

    #[test]
    fn a_small_operation_alone_stays_on_the_first_rail_that_asks() {
        let mut p = Pair::new(SessionConfig::default(), 4);
        let src = p.region(0, 4096, 7);
        let dst = p.region(1, 4096, 0);
        let write = || Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        };
        for i in 0..8 {
            p.post(0, i, write());
            assert_eq!(p.s[0].small_op_rail(), None, "alone: not steered");
            p.run();
        }
        assert_eq!(per_rail(&p, 0, Opcode::Write, 4), vec![8, 0, 0, 0]);
        // Two at once are spread, skipping a dead rail.
        p.lose_rail(1);
        for i in 0..4 {
            p.post(0, 10 + 2 * i, write());
            p.post(0, 11 + 2 * i, write());
            p.run();
        }
        let n = per_rail(&p, 0, Opcode::Write, 4);
        assert_eq!(n[1], 0, "{n:?}");
        assert!(n[2] > 0 && n[3] > 0, "{n:?}");
        assert_eq!(n.iter().sum::<usize>(), 16);
        assert_eq!(p.done[0].len(), 16);
        assert!(p.done[0].iter().all(|c| c.status.is_ok()));
    }

    /// `setup` with a second write of 4 KiB posted behind the first.
    fn two_small_writes() -> (Session, Region) {
        let (mut s, r, _) = setup(4096);
        s.post(2, whole_write(&r)).unwrap();
        (s, r)
    }

    #[test]
    fn a_rail_with_more_bytes_in_flight_is_passed_over_and_large_operations_are_not_steered() {
        let (mut s, _r) = two_small_writes();
        s.rails[0].tx_bytes = 100_000;
        assert_eq!(s.small_op_rail(), Some(1));
        assert!(!s.wants_transmit(0));
        assert!(s.wants_transmit(1));
        // Control frames waiting on a rail draw the operation to it (one system call).
        s.rails[0].tx_bytes = 0;
        assert_eq!(s.small_op_rail(), Some(0));
        s.rails[1].ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        assert_eq!(s.small_op_rail(), Some(1));
        // A large operation at the head goes on any rail.
        let (mut s, r, _) = setup(MIN_CHUNK as usize + 1);
        s.post(2, whole_write(&r)).unwrap();
        assert_eq!(s.small_op_rail(), None);
        assert!(s.wants_transmit(0) && s.wants_transmit(1));
    }
}
