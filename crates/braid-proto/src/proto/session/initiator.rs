//! The initiator side: posting operations and receives, and completing them.

use std::sync::Arc;

use smallvec::{SmallVec, smallvec};

use crate::error::{Completion, CompletionKind, Status};
use crate::mem::region::{Access, RemoteSge, Sge, sgl_len};
use crate::wire::sgl::{MAX_REMOTE_SGE, WireSge};
use crate::wire::{Opcode, WireStatus};

use super::transmit::ReqCursor;
use super::types::{PostError, Request, SgeList};
use super::{PostedRecv, Session};

/// An operation posted here and not yet completed.
pub(super) struct OutOp {
    pub(super) seq: u64,
    pub(super) wr_id: u64,
    pub(super) kind: CompletionKind,
    pub(super) opcode: Opcode,
    pub(super) local: SgeList,
    pub(super) rkey: u64,
    pub(super) addr: u64,
    pub(super) arg0: u64,
    pub(super) arg1: u64,
    pub(super) imm: Option<u32>,
    pub(super) total: u64,
    /// Read: response bytes placed so far.
    pub(super) received: u64,
    pub(super) done: Option<(Status, Option<u64>)>,
    /// A write the target may place ahead of its turn (see `SessionConfig::relaxed_placement`).
    pub(super) early: bool,
    /// Vectored operations: the encoded remote scatter/gather list (the descriptor payload).
    pub(super) desc: Option<Arc<[u8]>>,
    /// Writes: the remote ranges `(key, start, end)` it writes (to tell whether a later
    /// write commutes with it; see `SessionConfig::relaxed_placement`).
    pub(super) ranges: SmallVec<[(u64, u64, u64); 1]>,
    /// The key and bounding interval of `ranges` when they name one key.
    pub(super) bounds: Option<(u64, u64, u64)>,
    /// Read: the target serves it from file pages and ends it with a trailing `Done`.
    pub(super) expect_trailer: bool,
    /// Read: the status the trailing `Done` carried.
    pub(super) trailer: Option<Status>,
    /// A failure found on the way (a local file page gone while sending or placing, or a
    /// response chunk flagged by the target); the completion reports it.
    pub(super) fault: Option<Status>,
    /// Report a successful completion (`false`: only a failure is reported).
    pub(super) signaled: bool,
}

impl OutOp {
    /// The key a write with one-key bounds writes to: later writes to that key may commute
    /// with it. `None`: no write may pass this operation while it is outstanding.
    fn commuting_key(&self) -> Option<u64> {
        match self.opcode {
            Opcode::Write | Opcode::WriteV => self.bounds.map(|b| b.0),
            _ => None,
        }
    }

    pub(super) fn completion(
        &self,
        status: Status,
        value: Option<u64>,
        endpoint: u64,
    ) -> Completion {
        Completion {
            wr_id: self.wr_id,
            kind: self.kind,
            status,
            byte_len: if status.is_ok() { self.total } else { 0 },
            imm: self.imm,
            value,
            endpoint,
        }
    }
}

/// The key and bounding interval of ranges `(key, start, end)` that all name one key.
pub(super) fn bounds(ranges: &[(u64, u64, u64)]) -> Option<(u64, u64, u64)> {
    let (&(key, mut start, mut end), rest) = ranges.split_first()?;
    for &(k, s, e) in rest {
        if k != key {
            return None;
        }
        (start, end) = (start.min(s), end.max(e));
    }
    Some((key, start, end))
}

/// The checks of a vectored post: 1 to [`MAX_REMOTE_SGE`] remote pieces of at least one
/// byte each, none overflowing, totalling the local list's length.
pub(super) fn check_vectored(local: &[Sge], remote: &[RemoteSge]) -> Result<(), PostError> {
    if remote.is_empty() || remote.len() > MAX_REMOTE_SGE {
        return Err(PostError::Invalid(format!(
            "a vectored operation takes 1 to {MAX_REMOTE_SGE} remote pieces, got {}",
            remote.len()
        )));
    }
    let mut total = 0u64;
    for (i, r) in remote.iter().enumerate() {
        if r.len == 0 || r.offset.checked_add(r.len).is_none() {
            return Err(PostError::Invalid(format!(
                "remote piece {i} is empty or its range overflows"
            )));
        }
        total = total
            .checked_add(r.len)
            .ok_or_else(|| PostError::Invalid("remote pieces overflow".into()))?;
    }
    if total != sgl_len(local) {
        return Err(PostError::Invalid(format!(
            "remote pieces total {total} bytes, local ones {}",
            sgl_len(local)
        )));
    }
    Ok(())
}

pub(super) fn encode_remote(remote: &[RemoteSge]) -> Arc<[u8]> {
    let entries: Vec<WireSge> = remote
        .iter()
        .map(|r| WireSge {
            rkey: r.key.key,
            addr: r.offset,
            len: r.len,
        })
        .collect();
    crate::wire::sgl::encode(&entries).into()
}

pub(super) fn wire_status(st: WireStatus) -> Status {
    match st {
        WireStatus::Ok => Status::Success,
        WireStatus::RemoteAccess => Status::RemoteAccessError,
        WireStatus::RemoteInvalidRequest => Status::RemoteInvalidRequest,
    }
}

impl Session {
    /// Queues an operation. On success exactly one completion for `wr_id` will follow.
    pub fn post(&mut self, wr_id: u64, req: Request) -> Result<u64, PostError> {
        self.post_with(wr_id, req, true)
    }

    /// [`Session::post`]; unless `signaled`, a success produces no completion (as a verbs
    /// work request without `IBV_SEND_SIGNALED`): it is counted for
    /// [`Session::take_unsignaled_done`] instead. A failure is always reported. Operations
    /// complete in order, so a later signaled completion also says that every earlier
    /// unsignaled operation succeeded.
    pub fn post_with(
        &mut self,
        wr_id: u64,
        req: Request,
        signaled: bool,
    ) -> Result<u64, PostError> {
        let op = self.build_op(wr_id, req, signaled)?;
        Ok(self.enqueue(op, true))
    }

    /// A blank operation under the next sequence number (a write of nothing), if one may be
    /// posted now.
    pub(super) fn new_op(&self, wr_id: u64, signaled: bool) -> Result<OutOp, PostError> {
        if self.failed.is_some() {
            return Err(PostError::Closed);
        }
        if self.ops.len() >= self.cfg.max_outstanding {
            return Err(PostError::QueueFull {
                what: "outstanding operations",
                limit: self.cfg.max_outstanding,
            });
        }
        Ok(OutOp {
            seq: self.next_seq,
            wr_id,
            kind: CompletionKind::Write,
            opcode: Opcode::Write,
            local: SgeList::default(),
            rkey: 0,
            addr: 0,
            arg0: 0,
            arg1: 0,
            imm: None,
            total: 0,
            received: 0,
            done: None,
            early: false,
            desc: None,
            ranges: SmallVec::new(),
            bounds: None,
            expect_trailer: false,
            trailer: None,
            fault: None,
            signaled,
        })
    }

    /// The operation [`Session::post_with`] would queue, checked, not queued yet (its
    /// sequence number is the next one: queue it before anything else is posted).
    pub(super) fn build_op(
        &mut self,
        wr_id: u64,
        req: Request,
        signaled: bool,
    ) -> Result<OutOp, PostError> {
        let mut op = self.new_op(wr_id, signaled)?;
        if let Request::WriteV { local, remote } | Request::ReadV { local, remote } = &req {
            check_vectored(local, remote)?;
        }
        // One remote piece needs no scatter/gather list: the plain operation is cheaper and
        // may be placed early.
        let req = match req {
            Request::WriteV { local, remote } if remote.len() == 1 => Request::Write {
                local,
                rkey: remote[0].key.key,
                addr: remote[0].offset,
                imm: None,
            },
            Request::ReadV { local, remote } if remote.len() == 1 => Request::Read {
                local,
                rkey: remote[0].key.key,
                addr: remote[0].offset,
            },
            r => r,
        };
        match req {
            Request::Write {
                local,
                rkey,
                addr,
                imm,
            } => {
                op.total = sgl_len(&local);
                (op.local, op.rkey, op.addr, op.imm) = (local.into(), rkey, addr, imm);
            }
            Request::Read { local, rkey, addr } => {
                if local
                    .iter()
                    .any(|s| !s.region.access().contains(Access::LOCAL_WRITE))
                {
                    return Err(PostError::MissingRight("LOCAL_WRITE"));
                }
                op.total = sgl_len(&local);
                op.arg0 = op.total;
                (op.kind, op.opcode, op.local, op.rkey, op.addr) = (
                    CompletionKind::Read,
                    Opcode::ReadRequest,
                    local.into(),
                    rkey,
                    addr,
                );
            }
            Request::FetchAdd { rkey, addr, add } => {
                (op.kind, op.opcode, op.rkey, op.addr, op.arg0) =
                    (CompletionKind::FetchAdd, Opcode::FetchAdd, rkey, addr, add);
                op.total = 8;
            }
            Request::CompareSwap {
                rkey,
                addr,
                compare,
                swap,
            } => {
                (op.kind, op.opcode, op.rkey, op.addr, op.arg0, op.arg1) = (
                    CompletionKind::CompareSwap,
                    Opcode::CompareSwap,
                    rkey,
                    addr,
                    compare,
                    swap,
                );
                op.total = 8;
            }
            Request::Send { local, imm } => {
                op.total = sgl_len(&local);
                (op.kind, op.opcode, op.local, op.imm) =
                    (CompletionKind::Send, Opcode::Send, local.into(), imm);
            }
            Request::WriteV { local, remote } => {
                op.ranges = remote
                    .iter()
                    .map(|r| (r.key.key, r.offset, r.offset + r.len))
                    .collect();
                op.total = sgl_len(&local);
                (op.opcode, op.local, op.arg0) = (Opcode::WriteV, local.into(), op.total);
                (op.arg1, op.desc) = (remote.len() as u64, Some(encode_remote(&remote)));
            }
            Request::ReadV { local, remote } => {
                if local
                    .iter()
                    .any(|s| !s.region.access().contains(Access::LOCAL_WRITE))
                {
                    return Err(PostError::MissingRight("LOCAL_WRITE"));
                }
                op.total = sgl_len(&local);
                (op.kind, op.opcode, op.local, op.arg0) =
                    (CompletionKind::Read, Opcode::ReadV, local.into(), op.total);
                (op.arg1, op.desc) = (remote.len() as u64, Some(encode_remote(&remote)));
            }
        }
        self.finish_op(&mut op)?;
        Ok(op)
    }

    /// The checks common to every operation, and what a write needs for relaxed placement.
    pub(super) fn finish_op(&self, op: &mut OutOp) -> Result<(), PostError> {
        if matches!(op.opcode, Opcode::FetchAdd | Opcode::CompareSwap) && !op.addr.is_multiple_of(8)
        {
            return Err(PostError::Invalid(format!(
                "atomic target offset {} is not 8-byte aligned",
                op.addr
            )));
        }
        if op.addr.checked_add(op.total).is_none() {
            return Err(PostError::Invalid("remote range overflows".into()));
        }
        if op.opcode == Opcode::Write {
            op.ranges = smallvec![(op.rkey, op.addr, op.addr + op.total)];
        }
        if self.relaxed() && matches!(op.opcode, Opcode::Write | Opcode::WriteV) && op.total > 0 {
            // Completed operations have executed at the target; every other earlier one must
            // commute with this write: a write to this write's key at disjoint ranges
            // (another key may name the same memory).
            op.bounds = bounds(&op.ranges);
            op.early = self.pending_writes.commutes(&op.ranges, op.bounds);
        }
        Ok(())
    }

    /// Queues an operation from [`Session::build_op`]; `send`: its frames are to be sent
    /// (not for an express write, which went around them).
    pub(super) fn enqueue(&mut self, op: OutOp, send: bool) -> u64 {
        let seq = op.seq;
        debug_assert_eq!(seq, self.next_seq, "built for the next sequence number");
        self.next_seq += 1;
        if self.relaxed() {
            self.pending_writes.add(seq, op.commuting_key(), &op.ranges);
        }
        self.ops.push_back(op);
        if send {
            self.tx_req.push_back(ReqCursor {
                seq,
                next_off: 0,
                desc_sent: false,
            });
        }
        seq
    }

    /// Operation `seq`, queued without frames (an express one), is to be sent as frames
    /// after all.
    pub(super) fn frame_op(&mut self, seq: u64) {
        self.tx_req.push_back(ReqCursor {
            seq,
            next_off: 0,
            desc_sent: false,
        });
    }

    /// Posts a receive buffer for the peer's next send (or write-with-immediate). The
    /// pieces are taken by reference: one piece is kept without an allocation.
    pub fn post_recv(&mut self, wr_id: u64, local: impl AsRef<[Sge]>) -> Result<(), PostError> {
        let local = local.as_ref();
        if self.failed.is_some() {
            return Err(PostError::Closed);
        }
        if self.recvs.len() >= self.cfg.max_recv {
            return Err(PostError::QueueFull {
                what: "posted receives",
                limit: self.cfg.max_recv,
            });
        }
        if local
            .iter()
            .any(|s| !s.region.access().contains(Access::LOCAL_WRITE))
        {
            return Err(PostError::MissingRight("LOCAL_WRITE"));
        }
        let capacity = sgl_len(local);
        self.recvs.push_back(PostedRecv {
            wr_id,
            local: SgeList::from(local),
            capacity,
        });
        // A rail, or a staged send, may be waiting for a receive.
        self.retry_stalled();
        self.run_due();
        Ok(())
    }

    pub(super) fn op_index(&self, seq: u64) -> Option<usize> {
        let first = self.ops.front()?.seq;
        let i = seq.checked_sub(first)? as usize;
        (i < self.ops.len()).then_some(i)
    }

    pub(super) fn complete_out(&mut self, i: usize, status: Status, value: Option<u64>) {
        // A failure found on the way wins over a remote success; a local file fault over
        // anything the peer said.
        let status = match self.ops[i].fault {
            Some(Status::LocalAccessError) => Status::LocalAccessError,
            Some(f) if status.is_ok() => f,
            _ => status,
        };
        if self.relaxed() && self.ops[i].done.is_none() {
            let op = &self.ops[i];
            self.pending_writes
                .remove(op.seq, op.commuting_key(), &op.ranges);
        }
        self.ops[i].done = Some((status, value));
        while self.ops.front().is_some_and(|o| o.done.is_some()) {
            let op = self.ops.pop_front().expect("front exists");
            let (status, value) = op.done.expect("checked");
            if op.signaled || !status.is_ok() {
                let c = op.completion(status, value, self.endpoint_id);
                self.completions.push_back(c);
            } else {
                self.unsignaled_done += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Status;
    use crate::mem::region::{Access, Region, RemoteKey, RemoteSge};
    use crate::wire::sgl::MAX_REMOTE_SGE;

    use super::super::testkit::Pair;
    use super::super::{PostError, Request, SessionConfig};
    use super::{bounds, check_vectored};

    fn remote(off: u64, len: u64) -> RemoteSge {
        RemoteSge::new(
            RemoteKey {
                key: 9,
                len: 1 << 20,
            },
            off,
            len,
        )
    }

    #[test]
    fn vectored_posts_are_checked() {
        let p = Pair::new(SessionConfig::default(), 1);
        let r = p.region(0, 100, 0);
        let local = [r.as_sge()];
        assert!(check_vectored(&local, &[remote(0, 60), remote(500, 40)]).is_ok());
        let invalid = |res: Result<(), PostError>| matches!(res, Err(PostError::Invalid(_)));
        assert!(invalid(check_vectored(&local, &[])));
        let many = vec![remote(0, 1); MAX_REMOTE_SGE + 1];
        assert!(invalid(check_vectored(&local, &many)));
        assert!(invalid(check_vectored(
            &local,
            &[remote(0, 0), remote(0, 100)]
        )));
        assert!(invalid(check_vectored(&local, &[remote(u64::MAX, 100)])));
        assert!(invalid(check_vectored(&local, &[remote(0, 99)])));
    }

    #[test]
    fn bounds_of_one_key_only() {
        assert_eq!(bounds(&[]), None);
        assert_eq!(bounds(&[(1, 10, 20), (1, 0, 5)]), Some((1, 0, 20)));
        assert_eq!(bounds(&[(1, 10, 20), (2, 0, 5)]), None);
    }

    /// Unsignaled operations complete silently when they succeed (counted for the driver)
    /// and report when they fail; the rest keep their order.
    #[test]
    fn unsignaled_successes_are_counted_and_failures_reported() {
        let mut p = Pair::new(SessionConfig::default(), 1);
        let src = p.region(0, 64, 1);
        let dst = p.region(1, 64, 0);
        let key = dst.remote_key().key;
        let write = |addr| Request::Write {
            local: vec![src.as_sge()],
            rkey: key,
            addr,
            imm: None,
        };
        p.s[0].post_with(1, write(0), false).unwrap();
        p.s[0].post_with(2, write(4096), false).unwrap();
        p.s[0].post_with(3, write(0), false).unwrap();
        p.s[0].post_with(4, write(0), true).unwrap();
        p.run();
        let got: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, [(2, Status::RemoteAccessError), (4, Status::Success)]);
        assert_eq!(p.s[0].take_unsignaled_done(), 2);
        assert_eq!(p.s[0].take_unsignaled_done(), 0);
    }

    #[test]
    fn posts_are_refused_when_full_or_closed_or_lacking_rights() {
        let cfg = SessionConfig {
            max_outstanding: 2,
            max_recv: 1,
            ..SessionConfig::default()
        };
        let mut p = Pair::new(cfg, 1);
        let src = p.region(0, 64, 1);
        let write = |r: &Region| Request::Write {
            local: vec![r.as_sge()],
            rkey: 1,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, write(&src));
        p.post(0, 2, write(&src));
        assert!(matches!(
            p.s[0].post(3, write(&src)),
            Err(PostError::QueueFull { limit: 2, .. })
        ));
        let dst = p.region(0, 64, 0);
        p.s[0].post_recv(4, vec![dst.as_sge()]).unwrap();
        assert!(matches!(
            p.s[0].post_recv(5, vec![dst.as_sge()]),
            Err(PostError::QueueFull { limit: 1, .. })
        ));
        let mut q = Pair::new(SessionConfig::default(), 1);
        let ro = Region::allocate_in(&q.reg[0], 64, Access::NONE).unwrap();
        let read = Request::Read {
            local: vec![ro.as_sge()],
            rkey: 1,
            addr: 0,
        };
        assert!(matches!(
            q.s[0].post(6, read),
            Err(PostError::MissingRight("LOCAL_WRITE"))
        ));
        assert_eq!(q.s[0].outstanding(), 0, "nothing queued");
        p.s[0].close();
        assert!(matches!(
            p.s[0].post(7, write(&src)),
            Err(PostError::Closed)
        ));
    }

    #[test]
    fn operations_complete_once_each_in_posting_order() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let src = p.region(0, 3 << 20, 0xab);
        let back = p.region(0, 3 << 20, 0);
        let dst = p.region(1, 3 << 20, 0);
        let key = dst.remote_key().key;
        let write = Request::Write {
            local: vec![src.as_sge()],
            rkey: key,
            addr: 0,
            imm: None,
        };
        p.post(0, 10, write);
        let read = Request::Read {
            local: vec![back.as_sge()],
            rkey: key,
            addr: 0,
        };
        p.post(0, 11, read);
        p.post(
            0,
            12,
            Request::FetchAdd {
                rkey: key,
                addr: 8,
                add: 5,
            },
        );
        p.run();
        let ids: Vec<u64> = p.done[0].iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [10, 11, 12]);
        assert!(p.done[0].iter().all(|c| c.status == Status::Success));
        assert_eq!(p.done[0][0].byte_len, 3 << 20);
        assert_eq!(p.done[0][2].value, Some(0xabab_abab_abab_abab));
        assert_eq!(back.to_vec(0, 3 << 20).unwrap(), vec![0xab; 3 << 20]);
        assert_eq!(p.s[0].outstanding(), 0);
    }
}
