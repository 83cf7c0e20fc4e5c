//! Express writes: a small write (or write with immediate) that a driver carries around the
//! session's frames, for a link that cannot lose or reorder anything and that can answer
//! without a frame (braid's same-host ring: docs/PROTOCOL.md, "Express writes").
//!
//! An express write is an ordinary operation of the session: it takes the next sequence
//! number, sits in the queue of outstanding operations and completes in order with the
//! others. Only its carriage differs. The driver writes the request (header fields and
//! payload) straight into the link instead of asking for frames; the target executes it as
//! soon as the link hands it over ([`Session::on_express`]: the same checks of key,
//! rights, range and generation as a `Write` frame) and answers with a status the driver
//! carries back beside the stream, not a `Done` ([`Session::express_acked`]).
//!
//! Order. The link carries express requests and frames in one sequence, and the initiator
//! sends an express write only when every operation outstanding is an express write
//! ([`Session::post_express`]), so all the requests before it have executed at the target
//! or lie before it in the link: the target meets it exactly at its turn (its sequence number
//! is the target's frontier, which [`Session::on_express`] checks). Frames of requests
//! posted later follow it in the link. At the initiator, completions stay in posting
//! order whichever answer is read first: a later operation's `Done` only marks it done, and
//! it leaves the queue behind the express write.
//!
//! Loss. Only an endpoint of one rail sends express writes. When that rail fails the
//! session fails with it (no rail is left to fail over to), and every outstanding operation,
//! express writes included, completes with [`Status::TransportError`](crate::Status).

use smallvec::SmallVec;

use crate::error::{Completion, CompletionKind, Status};
use crate::mem::file::copy_maybe_fragile;
use crate::mem::region::{Access, Sge, sgl_is_fragile, sgl_len};
use crate::wire::{Opcode, WireStatus};

use super::initiator::wire_status;
use super::types::{PostError, ProtocolError};
use super::{Session, sgl_pieces};

/// The largest payload an express write carries: beyond it a copy through the link costs
/// more than the frames it saves.
pub const EXPRESS_MAX: usize = 512;

/// Most express writes outstanding at once (a driver keeps this many answers apart).
pub const EXPRESS_WINDOW: usize = 64;

/// Where an express request's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpressTo {
    /// A write: the region of key `rkey`, at `addr`.
    Region {
        /// The target region's key.
        rkey: u64,
        /// Where in the region.
        addr: u64,
    },
    /// A send: the target's next posted receive.
    Receive,
}

/// What the target needs of an express request, besides its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpressRequest {
    /// Its sequence number in the initiator's space.
    pub seq: u64,
    /// Where the payload goes.
    pub to: ExpressTo,
    /// The immediate: a write with one consumes a posted receive; a send delivers it.
    pub imm: Option<u32>,
    /// Payload bytes (at most [`EXPRESS_MAX`]).
    pub len: u32,
}

/// What the target did with an express write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpressAction {
    /// Executed (or refused with the status): the answer to carry back.
    Done(WireStatus),
    /// Not executable yet (no receive posted for its immediate, or a read being answered
    /// from the bytes it would overwrite): offer it again when the session asks the driver
    /// to retry the rail, as for a stalled frame.
    Stall,
}

impl Session {
    /// Posts a write or a send of `local` (to `to`, with immediate `imm`) the express way
    /// when it may take it now: one rail, a payload of at most [`EXPRESS_MAX`] bytes of
    /// plain memory, and nothing outstanding but express requests (fewer than
    /// [`EXPRESS_WINDOW`]). `send` puts the request and its payload's pieces into the
    /// link, false when the link has no room. `Ok(None)`: not taken, nothing queued (post
    /// it with [`Session::post_with`]); `Ok(Some(true))`: sent; `Ok(Some(false))`: queued
    /// as an ordinary operation whose frames follow. Errors are those of `post_with`.
    pub fn post_express(
        &mut self,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        signaled: bool,
        send: impl FnOnce(&ExpressRequest, &[(*const u8, usize)]) -> bool,
    ) -> Result<Option<bool>, PostError> {
        let total = sgl_len(local);
        if total > EXPRESS_MAX as u64
            || sgl_is_fragile(local)
            || self.failed.is_some()
            || self.rails.len() != 1
            || !self.rails[0].alive
            || self.ops.len() != self.express.len()
            || self.express.len() >= EXPRESS_WINDOW
        {
            return Ok(None);
        }
        let mut op = self.new_op(wr_id, signaled)?;
        (op.total, op.local, op.imm) = (total, local.into(), imm);
        match to {
            ExpressTo::Region { rkey, addr } => (op.rkey, op.addr) = (rkey, addr),
            ExpressTo::Receive => (op.kind, op.opcode) = (CompletionKind::Send, Opcode::Send),
        }
        self.finish_op(&mut op)?;
        let req = ExpressRequest {
            seq: op.seq,
            to,
            imm,
            len: total as u32,
        };
        let pieces: SmallVec<[(*const u8, usize); 2]> = local
            .iter()
            .filter(|s| s.len > 0)
            .map(|s| (s.ptr() as *const u8, s.len))
            .collect();
        let express = send(&req, &pieces);
        let seq = self.enqueue(op, !express);
        if express {
            self.express.push_back(seq);
        }
        Ok(Some(express))
    }

    /// Express writes sent and not yet answered.
    pub fn express_outstanding(&self) -> usize {
        self.express.len()
    }

    /// The answer to the oldest unanswered express write.
    pub fn express_acked(&mut self, st: WireStatus) -> Result<(), ProtocolError> {
        let Some(seq) = self.express.pop_front() else {
            return Err(ProtocolError::UnknownOperation {
                opcode: Opcode::Done,
                seq: u64::MAX,
            });
        };
        // A failed session has completed it already.
        if let Some(i) = self.op_index(seq) {
            self.complete_out(i, wire_status(st), None);
        }
        Ok(())
    }

    /// Executes the peer's express write `r` that arrived on `rail`, with `payload` (its
    /// `r.len` bytes): the checks of a `Write` frame, the bytes placed, and for a write with
    /// immediate a receive consumed and completed. A request out of turn is a protocol
    /// error (the peer sends express writes only at their turn).
    pub fn on_express(
        &mut self,
        rail: usize,
        r: &ExpressRequest,
        payload: &[u8],
    ) -> Result<ExpressAction, ProtocolError> {
        if !self.rails[rail].alive {
            return Err(ProtocolError::RailGone);
        }
        if payload.len() != r.len as usize || payload.len() > EXPRESS_MAX {
            return Err(ProtocolError::Overrun {
                seq: r.seq,
                total: r.len.into(),
            });
        }
        if self.failed.is_some() {
            return Ok(ExpressAction::Done(WireStatus::RemoteAccess));
        }
        if r.seq != self.frontier
            || self.cur.is_some()
            || self.desc.is_some()
            || !self.early.is_empty()
            || !self.staged.is_empty()
        {
            return Err(ProtocolError::DuplicateRequest {
                seq: r.seq,
                frontier: self.frontier,
            });
        }
        let needs_recv = r.imm.is_some() || r.to == ExpressTo::Receive;
        if needs_recv && self.recvs.is_empty() {
            // Receiver not ready: wait for a post_recv (verbs with infinite RNR retry).
            self.rails[rail].stalled = true;
            return Ok(ExpressAction::Stall);
        }
        let status = match r.to {
            ExpressTo::Region { rkey, addr } => {
                match self.express_write(rail, rkey, addr, r.imm, payload) {
                    Some(st) => st,
                    None => return Ok(ExpressAction::Stall),
                }
            }
            ExpressTo::Receive => self.express_send(r.imm, payload),
        };
        // Retries whatever waited for this turn, then the rail moves past its request.
        self.advance_frontier();
        self.rails[rail].stalled = false;
        Ok(ExpressAction::Done(status))
    }

    /// An express write's checks and copy, and for an immediate the receive it consumes
    /// (there is one). `None`: it must wait (a read being answered from those bytes).
    fn express_write(
        &mut self,
        rail: usize,
        rkey: u64,
        addr: u64,
        imm: Option<u32>,
        payload: &[u8],
    ) -> Option<WireStatus> {
        let len = payload.len() as u64;
        // SAFETY (both copies): `len` bytes inside the region (checked); file pages are
        // written with a system call.
        let copy = |p: *mut u8, file: bool| unsafe {
            copy_maybe_fragile(payload.as_ptr(), p, payload.len(), file)
        };
        let placed = if self.reads_active.is_empty() {
            self.registry
                .with_checked(rkey, addr, len, Access::REMOTE_WRITE, |region| {
                    copy(region.ptr_at(addr as usize), region.file().is_some())
                })
        } else {
            // Read responses are sent from regions: bytes they still name are copied aside
            // (or the write waits) first, as for a `Write` frame.
            match self.registry.check(rkey, addr, len, Access::REMOTE_WRITE) {
                Ok(pin) => {
                    let p = pin.ptr_at(addr as usize);
                    if len > 0 && self.read_conflict(&[(p as usize, p as usize + len as usize)]) {
                        self.rails[rail].stalled = true;
                        return None;
                    }
                    Ok(copy(p, pin.file().is_some()))
                }
                Err(st) => Err(st),
            }
        };
        let status = match placed {
            Ok(true) => WireStatus::Ok,
            Ok(false) => WireStatus::RemoteAccess,
            Err(st) => st,
        };
        // A write with immediate that failed consumes no receive (as a `Write` frame).
        if let (Some(imm), WireStatus::Ok) = (imm, status) {
            let recv = self.recvs.pop_front().expect("checked non-empty");
            self.completions.push_back(Completion {
                wr_id: recv.wr_id,
                kind: CompletionKind::RecvWriteImm,
                status: Status::Success,
                byte_len: len,
                imm: Some(imm),
                value: None,
                endpoint: self.endpoint_id,
            });
        }
        Some(status)
    }

    /// An express send: into the next posted receive (there is one), which completes
    /// whatever happens, as with a `Send` frame.
    fn express_send(&mut self, imm: Option<u32>, payload: &[u8]) -> WireStatus {
        let recv = self.recvs.pop_front().expect("checked non-empty");
        let len = payload.len() as u64;
        let (status, local_status) = if len > recv.capacity {
            (WireStatus::RemoteInvalidRequest, Status::LocalLengthError)
        } else {
            let fragile = sgl_is_fragile(&recv.local);
            let mut off = 0;
            let mut ok = true;
            for (p, l) in sgl_pieces(&recv.local, 0, len, |p, l| (p, l)) {
                // SAFETY: `l` bytes of a posted receive's registered memory; the payload
                // has them at `off` (the pieces cover exactly `len`).
                ok &= unsafe { copy_maybe_fragile(payload[off..].as_ptr(), p, l, fragile) };
                off += l;
            }
            if ok {
                (WireStatus::Ok, Status::Success)
            } else {
                (WireStatus::RemoteAccess, Status::LocalAccessError)
            }
        };
        self.completions.push_back(Completion {
            wr_id: recv.wr_id,
            kind: CompletionKind::Recv,
            status: local_status,
            byte_len: if local_status.is_ok() { len } else { 0 },
            imm,
            value: None,
            endpoint: self.endpoint_id,
        });
        status
    }
}

#[cfg(test)]
mod tests;
