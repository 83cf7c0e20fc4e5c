//! Relaxed placement: the peer's writes that commute with every earlier request are placed
//! as their chunks arrive, ahead of their turn (see `SessionConfig::relaxed_placement`).

use std::sync::Arc;

use crate::mem::region::Access;
use crate::proto::spans::Spans;
use crate::wire::frame::FLAG_IMM;
use crate::wire::{FrameHeader, Opcode, WireStatus};

use super::config::{EARLY_MAX_AHEAD, EARLY_MAX_OPS};
use super::staging::StagingBuf;
use super::target::{Dest, PendingDesc, TargetOp};
use super::types::{Keep, Placement, ProtocolError, RxAction};
use super::{RxPending, Session, Staged};

/// A write of the peer placed (in part) ahead of its turn: what its first early chunk
/// established, so that the chunks agree and its execution uses the same access check.
pub(super) struct EarlyOp {
    pub(super) rkey: u64,
    pub(super) addr: u64,
    pub(super) total: u64,
    pub(super) imm: Option<u32>,
    pub(super) status: WireStatus,
    /// The destination; `None` when the access check failed (payload is discarded).
    pub(super) dest: Option<Arc<Spans>>,
    /// Payload bytes placed completely.
    pub(super) received: u64,
    /// A vectored write (its descriptor arrived early; its chunks are `WriteVData`).
    pub(super) vectored: bool,
}

/// A write's remote ranges `(key, start, end)`, sorted, to test others against them in
/// logarithmic time.
pub(super) struct Disjoint {
    /// Sorted by (key, start), with the largest end so far within the key.
    pub(super) sorted: Vec<(u64, u64, u64)>,
}

impl Disjoint {
    pub(super) fn new(ranges: &[(u64, u64, u64)]) -> Disjoint {
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        for i in 1..sorted.len() {
            if sorted[i].0 == sorted[i - 1].0 {
                sorted[i].2 = sorted[i].2.max(sorted[i - 1].2);
            }
        }
        Disjoint { sorted }
    }

    /// True when these ranges are all of one key, `(key, start, end)` names it too, and
    /// overlaps none of them (ranges of two keys may alias: never disjoint).
    pub(super) fn misses(&self, &(key, start, end): &(u64, u64, u64)) -> bool {
        let (Some(first), Some(last)) = (self.sorted.first(), self.sorted.last()) else {
            return true;
        };
        if first.0 != key || last.0 != key {
            return false;
        }
        let same_key = 0;
        // The ranges of this key that start before `end`; the last holds their largest end.
        let before_end = self.sorted.partition_point(|r| (r.0, r.1) < (key, end));
        before_end == same_key || self.sorted[before_end - 1].2 <= start
    }
}

impl Session {
    /// A write chunk the initiator allows ahead of its turn: checked as its execution will
    /// be, then placed (or discarded, when the check fails) at once. A vectored write's chunk
    /// waits (stalls its rail) until the write's descriptor has arrived.
    pub(super) fn place_early(
        &mut self,
        rail: usize,
        h: &FrameHeader,
    ) -> Result<RxAction, ProtocolError> {
        let imm = (h.flags & FLAG_IMM != 0).then_some(h.aux);
        let vectored = h.opcode == Opcode::WriteVData;
        if !self.early.contains_key(&h.seq)
            && (vectored
                || h.seq - self.frontier > EARLY_MAX_AHEAD
                || self.early.len() >= EARLY_MAX_OPS)
        {
            return Ok(RxAction::Stall);
        }
        if !self.early.contains_key(&h.seq) {
            let (status, dest) =
                match self
                    .registry
                    .check(h.rkey, h.addr, h.arg0, Access::REMOTE_WRITE)
                {
                    Ok(pin) => (WireStatus::Ok, Some(Spans::single(pin, h.addr, h.arg0))),
                    Err(st) => (st, None),
                };
            self.early.insert(
                h.seq,
                EarlyOp {
                    rkey: h.rkey,
                    addr: h.addr,
                    total: h.arg0,
                    imm,
                    status,
                    dest,
                    received: 0,
                    vectored: false,
                },
            );
        }
        let e = &self.early[&h.seq];
        if e.rkey != h.rkey
            || e.addr != h.addr
            || e.total != h.arg0
            || e.imm != imm
            || e.vectored != vectored
        {
            return Err(ProtocolError::InconsistentChunk { seq: h.seq });
        }
        let placing = self.placing(|p| match *p {
            RxPending::Early { seq, len } if seq == h.seq => Some(len),
            _ => None,
        });
        if e.received + placing + h.payload_len as u64 > e.total {
            return Err(ProtocolError::Overrun {
                seq: h.seq,
                total: e.total,
            });
        }
        let (action, keep) = match e.dest.clone() {
            Some(dest) => {
                // Bytes an executed read still sends from are copied aside first (or, while
                // a response frame is being written from them, the rail waits).
                if !self.reads_active.is_empty() && self.read_conflict(&dest.ranges()) {
                    return Ok(RxAction::Stall);
                }
                let iov = dest.pieces(h.arg1, h.payload_len as u64);
                let fragile = dest.fragile();
                (
                    RxAction::Place(Placement { iov, fragile }),
                    Some(Keep::Spans(dest)),
                )
            }
            None => (RxAction::Discard, None),
        };
        self.early_chunks += 1;
        self.rails[rail].rx_pending = Some(RxPending::Early {
            seq: h.seq,
            len: h.payload_len,
        });
        self.rails[rail].rx_keep = keep;
        Ok(action)
    }

    /// The descriptor of a vectored write the initiator allows ahead of its turn: its list
    /// is read into a buffer, then checked as execution will check it (`early_descriptor`).
    pub(super) fn accept_early_descriptor(
        &mut self,
        rail: usize,
        h: &FrameHeader,
    ) -> Result<RxAction, ProtocolError> {
        let pending_here = self
            .rails
            .iter()
            .any(|r| matches!(&r.rx_pending, Some(RxPending::Descriptor(st)) if st.h.seq == h.seq));
        if self.early.contains_key(&h.seq) || pending_here {
            return Err(ProtocolError::BadDescriptor { seq: h.seq });
        }
        if h.seq - self.frontier > EARLY_MAX_AHEAD || self.early.len() >= EARLY_MAX_OPS {
            return Ok(RxAction::Stall);
        }
        let data = StagingBuf::new(h.payload_len as usize);
        let iov = vec![(data.ptr, data.len)];
        self.rails[rail].rx_keep = Some(Keep::Staging(data.clone()));
        self.rails[rail].rx_pending = Some(RxPending::Descriptor(Staged { h: *h, data }));
        Ok(RxAction::Place(Placement {
            iov,
            fragile: false,
        }))
    }

    /// A vectored write's list arrived ahead of its turn: every piece is checked now, and
    /// its chunks (some may be waiting) are placed as they come.
    pub(super) fn early_descriptor(&mut self, d: PendingDesc) {
        let (status, dest) = match Spans::check(&self.registry, &d.entries, Access::REMOTE_WRITE) {
            Ok(dest) => (WireStatus::Ok, Some(dest)),
            Err(st) => (st, None),
        };
        self.early.insert(
            d.h.seq,
            EarlyOp {
                rkey: 0,
                addr: 0,
                total: d.h.arg0,
                imm: None,
                status,
                dest,
                received: 0,
                vectored: true,
            },
        );
        self.retry_stalled();
    }

    /// Makes the write `seq`, placed in part or whole ahead of its turn, the operation in
    /// execution. The caller has checked that its turn has come and a receive is there if
    /// it carries an immediate.
    pub(super) fn start_early(&mut self, seq: u64) {
        let e = self.early.remove(&seq).expect("checked by the caller");
        let recv = if e.imm.is_some() {
            self.recvs.pop_front()
        } else {
            None
        };
        self.cur = Some(TargetOp {
            seq,
            opcode: if e.vectored {
                Opcode::WriteVData
            } else {
                Opcode::Write
            },
            rkey: e.rkey,
            addr: e.addr,
            total: e.total,
            imm: e.imm,
            received: e.received,
            status: e.status,
            dest: e.dest.map(Dest::Region),
            recv,
            faulted: false,
        });
    }

    /// Executes writes placed ahead of their turn whose turn has come and whose chunks have
    /// all been placed (no frame of theirs is left to arrive and trigger it).
    pub(super) fn apply_early(&mut self) {
        while self.failed.is_none() && self.cur.is_none() {
            let seq = self.frontier;
            let Some(e) = self.early.get(&seq) else {
                return;
            };
            if e.imm.is_some() && self.recvs.is_empty() {
                return;
            }
            // Chunks still arriving or being placed complete it in their turn (placed and
            // pending bytes never exceed the total, so a full count means none is pending).
            if e.received < e.total {
                return;
            }
            let Some(rail) = self.rails.iter().position(|r| r.alive) else {
                return;
            };
            self.start_early(seq);
            self.finish_target_op(rail);
        }
    }
}
#[cfg(test)]
mod tests {
    use crate::error::Status;

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};
    use super::Disjoint;

    /// Two writes to disjoint ranges of one region, the first on a rail the target does not
    /// read yet: with `relaxed`, the second is placed on arrival.
    fn held_first_write(relaxed: bool) -> (Pair, crate::Region) {
        let cfg = SessionConfig {
            relaxed_placement: relaxed,
            ..SessionConfig::default()
        };
        let mut p = Pair::new(cfg, 2);
        let src = p.region(0, 4096, 0x5a);
        let dst = p.region(1, 8192, 0);
        let key = dst.remote_key().key;
        for (id, addr) in [(1, 0), (2, 4096)] {
            let w = Request::Write {
                local: vec![src.as_sge()],
                rkey: key,
                addr,
                imm: None,
            };
            p.post(0, id, w);
        }
        p.held[0] = true;
        p.run();
        (p, dst)
    }

    #[test]
    fn commuting_writes_are_placed_ahead_and_complete_in_order() {
        let (mut p, dst) = held_first_write(true);
        assert!(p.queued(0, 0) > 0, "the first write waits on rail 0");
        assert!(p.s[1].early_chunks() > 0);
        assert_eq!(dst.to_vec(4096, 4096).unwrap(), vec![0x5a; 4096]);
        assert_eq!(dst.to_vec(0, 4096).unwrap(), vec![0; 4096]);
        assert!(p.done[0].is_empty(), "completions keep their order");
        p.held[0] = false;
        p.run();
        let ids: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(ids, [(1, Status::Success), (2, Status::Success)]);
        assert_eq!(dst.to_vec(0, 4096).unwrap(), vec![0x5a; 4096]);
        assert!(p.s[1].early.is_empty());
    }

    #[test]
    fn strict_placement_waits_for_the_turn() {
        let (mut p, dst) = held_first_write(false);
        assert_eq!(p.s[1].early_chunks(), 0);
        assert_eq!(dst.to_vec(4096, 4096).unwrap(), vec![0; 4096]);
        p.held[0] = false;
        p.run();
        assert_eq!(p.done[0].len(), 2);
        assert_eq!(dst.to_vec(0, 8192).unwrap(), vec![0x5a; 8192]);
    }

    #[test]
    fn disjoint_ranges_of_one_key() {
        let d = Disjoint::new(&[(1, 100, 200), (1, 0, 50), (1, 120, 300)]);
        assert!(d.misses(&(1, 50, 100)));
        assert!(d.misses(&(1, 300, 400)));
        assert!(!d.misses(&(1, 49, 51)));
        assert!(!d.misses(&(1, 250, 260)), "inside the third range only");
        assert!(!d.misses(&(1, 0, 1000)));
        assert!(!d.misses(&(2, 50, 100)), "another key may alias");
        let two = Disjoint::new(&[(1, 0, 10), (2, 0, 10)]);
        assert!(
            !two.misses(&(1, 20, 30)),
            "a write over two keys commutes with nothing"
        );
    }
}
