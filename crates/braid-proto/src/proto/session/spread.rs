//! Spreading a lone operation (the only one with data left to send) over every live rail
//! in shares proportional to their windows, so that it finishes on all rails together.

use super::Session;
use super::config::MIN_CHUNK;
use super::rail::RailState;

/// The bytes each rail has carried of the operation that alone has data left to send:
/// such an operation is spread over every live rail in shares proportional to their windows,
/// so that it finishes on all rails at about the same time.
pub(super) struct LoneOp {
    /// (is a read response, seq).
    pub(super) key: (bool, u64),
    pub(super) sent: Vec<u64>,
}

impl Session {
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
        let alive = |r: &RailState| r.alive;
        let windows: u128 = (0..self.rails.len())
            .filter(|&r| alive(&self.rails[r]))
            .map(|r| self.window(r) as u128)
            .sum();
        let share = (total as u128 * self.window(rail) as u128)
            .div_ceil(windows.max(1))
            .max(MIN_CHUNK as u128) as u64;
        let sent = match &self.lone {
            Some(l) if l.key == (resp, seq) => l.sent.get(rail).copied().unwrap_or(0),
            _ => 0,
        };
        Some(share.saturating_sub(sent))
    }

    /// True when `rail` has carried its share of the lone operation and another live rail
    /// with an open window has not: the driver offers every rail that wants to transmit in
    /// the same pass, so the shares go out on all rails at once instead of queueing behind
    /// each other on the first rail to ask (a 1 MiB write at depth 1 then takes a quarter
    /// of the time on four rails).
    pub(super) fn leaves_lone_share(&self, rail: usize) -> bool {
        self.lone_share_left(rail) == Some(0)
            && (0..self.rails.len()).any(|r| {
                r != rail
                    && self.rails[r].alive
                    && self.data_allowed(r)
                    && self.lone_share_left(r).is_some_and(|left| left > 0)
            })
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
            *l = LoneOp {
                key: (resp, seq),
                sent: vec![0; n],
            };
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
    use super::super::{Request, Session, SessionConfig};

    const MIB: u64 = 1 << 20;

    /// A session over two rails whose windows are 4 MB and 2 MB, and a write of `len` bytes.
    fn setup(len: usize) -> (Session, Region, u64) {
        let reg = Arc::new(Registry::default());
        let mut s = Session::new(SessionConfig::default(), reg.clone(), 2, 0);
        s.set_rail_capacity(0, 1e9);
        s.set_rail_capacity(1, 5e8);
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

    #[test]
    fn shares_count_per_operation_and_only_while_one_is_alone() {
        let (mut s, r, seq) = setup(6 * MIB as usize);
        s.note_lone_sent(0, false, seq, MIB);
        let left = s.lone_share_left(0).unwrap();
        // Bytes counted for another operation do not consume this one's share.
        s.note_lone_sent(0, false, seq + 1, MIB);
        assert_eq!(s.lone_share_left(0), Some(left + MIB));
        let write = Request::Write {
            local: vec![r.as_sge()],
            rkey: 7,
            addr: 0,
            imm: None,
        };
        s.post(2, write).unwrap();
        assert_eq!(s.lone_share_left(0), None, "two operations: no lone one");
        assert!(!s.leaves_lone_share(0));
    }
}
