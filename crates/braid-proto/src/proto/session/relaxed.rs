//! Relaxed placement: the peer's writes that commute with every earlier request are placed
//! as their chunks arrive, ahead of their turn (see `SessionConfig::relaxed_placement`).

use std::collections::BTreeMap;
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

/// The remote ranges of this side's outstanding operations, so that whether a new write
/// commutes with every one of them (then the peer may place it early) costs a logarithmic
/// lookup, not a scan of everything in flight (at a depth of a thousand small writes the
/// scan took 43% of the posting thread's time).
#[derive(Default)]
pub(super) struct PendingWrites {
    /// `(key, start, seq, piece) -> end` of every range of outstanding writes.
    ranges: BTreeMap<(u64, u64, u64, u32), u64>,
    /// The longest range in `ranges` since it was last empty: a range overlapping
    /// `[start, end)` starts at or after `start - longest`.
    longest: u64,
    /// Outstanding writes per key (a write to another key may name the same memory): a
    /// handful of keys at most in practice, so a list, not a hash map, on the posting path.
    keys: Vec<(u64, usize)>,
    /// Outstanding operations no write may pass: not writes, or writes without bounds
    /// (several keys, or nothing to write).
    blockers: usize,
}

impl PendingWrites {
    /// An operation was posted (`key` from its bounds, `None` for a blocker).
    pub(super) fn add(&mut self, seq: u64, key: Option<u64>, ranges: &[(u64, u64, u64)]) {
        let Some(key) = key else {
            self.blockers += 1;
            return;
        };
        match self.keys.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.keys.push((key, 1)),
        }
        for (piece, &(k, start, end)) in ranges.iter().enumerate() {
            if end > start {
                self.ranges.insert((k, start, seq, piece as u32), end);
                self.longest = self.longest.max(end - start);
            }
        }
    }

    /// An operation added with the same arguments completed.
    pub(super) fn remove(&mut self, seq: u64, key: Option<u64>, ranges: &[(u64, u64, u64)]) {
        let Some(key) = key else {
            self.blockers -= 1;
            return;
        };
        if let Some(i) = self.keys.iter().position(|(k, _)| *k == key) {
            self.keys[i].1 -= 1;
            if self.keys[i].1 == 0 {
                self.keys.swap_remove(i);
            }
        }
        for (piece, &(k, start, _)) in ranges.iter().enumerate() {
            self.ranges.remove(&(k, start, seq, piece as u32));
        }
        if self.ranges.is_empty() {
            self.longest = 0;
        }
    }

    /// Whether a write to `ranges` of one key (`bounds`) overlaps no outstanding operation
    /// and no outstanding write names another key.
    pub(super) fn commutes(
        &self,
        ranges: &[(u64, u64, u64)],
        bounds: Option<(u64, u64, u64)>,
    ) -> bool {
        let Some((key, _, _)) = bounds else {
            return false;
        };
        if self.blockers > 0 || self.keys.iter().any(|&(k, _)| k != key) {
            return false;
        }
        ranges.iter().all(|&(k, start, end)| {
            let from = start.saturating_sub(self.longest);
            self.ranges
                .range((k, from, 0, 0)..(k, end, 0, 0))
                .all(|(&(_, s2, _, _), &e2)| e2 <= start || s2 >= end)
        })
    }

    pub(super) fn clear(&mut self) {
        *self = PendingWrites::default();
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
                    Ok(pin) => {
                        let spans = Spans::single_in(self.spare_spans.take(), pin, h.addr, h.arg0);
                        (WireStatus::Ok, Some(spans))
                    }
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
        let iov = smallvec::smallvec![(data.ptr, data.len)];
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
            let Some(rail) = self.reply_rail() else {
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
    use super::PendingWrites;

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
    fn pending_writes_commute_only_when_disjoint_and_of_one_key() {
        let mut p = PendingWrites::default();
        let ok = |p: &PendingWrites, r: (u64, u64, u64)| p.commutes(&[r], Some(r));
        p.add(1, Some(1), &[(1, 100, 200)]);
        p.add(2, Some(1), &[(1, 0, 50), (1, 120, 300)]);
        assert!(ok(&p, (1, 50, 100)));
        assert!(ok(&p, (1, 300, 400)));
        assert!(!ok(&p, (1, 49, 51)));
        assert!(!ok(&p, (1, 250, 260)), "inside the longer range only");
        assert!(!ok(&p, (1, 0, 1000)));
        assert!(!ok(&p, (2, 50, 100)), "another key may alias");
        assert!(
            !p.commutes(&[(1, 20, 30), (2, 0, 10)], None),
            "a write over two keys commutes with nothing"
        );
        // A range far before a long one still overlaps it.
        p.add(3, Some(1), &[(1, 1000, 100_000)]);
        assert!(!ok(&p, (1, 90_000, 90_001)));
        p.remove(3, Some(1), &[(1, 1000, 100_000)]);
        assert!(ok(&p, (1, 90_000, 90_001)));
        // An outstanding read (or any non-write) blocks every write until it completes.
        p.add(4, None, &[]);
        assert!(!ok(&p, (1, 5000, 5001)));
        p.remove(4, None, &[]);
        p.remove(1, Some(1), &[(1, 100, 200)]);
        p.remove(2, Some(1), &[(1, 0, 50), (1, 120, 300)]);
        assert!(ok(&p, (1, 0, 1000)));
        assert!(ok(&p, (2, 0, 1000)), "nothing outstanding: any key");
        assert!(p.ranges.is_empty() && p.keys.is_empty() && p.longest == 0);
    }
}
