//! Express writes: a small write or send (with or without immediate) that a driver carries
//! around the session's frames, on an endpoint of one rail. Two carriages:
//! - a link that can answer beside its stream (braid's same-host ring: docs/PROTOCOL.md,
//!   "Express writes"): [`Session::post_express`], [`Session::on_express`],
//!   [`Session::express_acked`];
//! - a link of frames only (TCP: docs/PROTOCOL.md, "Express frames"): the request is one
//!   `Express` frame ([`Session::post_express_frame`], [`Session::on_express_frame`]) and
//!   its answer a counted `ExpressAnswer` control frame, or a count carried by the next
//!   `Express` frame the other way.
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

use crate::error::{Completion, CompletionKind, Status};
use crate::mem::file::copy_maybe_fragile;
use crate::mem::region::{Access, Pieces, Sge, sgl_is_fragile, sgl_len};
use crate::wire::frame::FLAG_IMM;
use crate::wire::{FrameHeader, MAX_EXPRESS_PAYLOAD, Opcode, WireStatus};

use super::initiator::wire_status;
use super::types::{Keep, PostError, ProtocolError, Transmit};
use super::{Session, sgl_pieces};

/// The largest payload an express write carries: beyond it a copy through the link costs
/// more than the frames it saves.
pub const EXPRESS_MAX: usize = MAX_EXPRESS_PAYLOAD as usize;

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
        let Some(req) = self.express_op(wr_id, local, to, imm, signaled)? else {
            return Ok(None);
        };
        let express = send(&req, &express_pieces(local));
        if !express {
            // The link had no room: it goes as frames, behind nothing (it is the only
            // operation outstanding that is not an answered express one).
            self.express.pop_back();
            self.frame_op(req.seq);
        }
        Ok(Some(express))
    }

    /// [`Session::post_express`] for a link that carries only frames (a TCP rail): the
    /// request goes as one [`Opcode::Express`] frame, returned here for the driver to send
    /// behind what [`Session::poll_transmit`] still has for the rail (its payload is the
    /// caller's memory, kept by the frame). The frame carries the answers owed to the peer's
    /// express requests when they all succeeded (otherwise they go first, as
    /// [`Opcode::ExpressAnswer`] frames). `Ok(None)`: not taken, nothing queued; also
    /// when the endpoint checks payloads with a CRC, which express frames do not carry.
    pub fn post_express_frame(
        &mut self,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<Option<Transmit>, PostError> {
        if self.cfg.payload_crc {
            return Ok(None);
        }
        let Some(req) = self.express_op(wr_id, local, to, imm, signaled)? else {
            return Ok(None);
        };
        let mut h = FrameHeader::new(Opcode::Express);
        h.payload_len = req.len;
        h.seq = req.seq;
        match to {
            ExpressTo::Region { rkey, addr } => (h.rkey, h.addr) = (rkey, addr),
            ExpressTo::Receive => h.arg1 = 1,
        }
        if let Some(imm) = imm {
            h.flags |= FLAG_IMM;
            h.aux = imm;
        }
        h.arg0 = self.take_express_answers();
        Ok(Some(Transmit {
            header: h.encode(),
            payload: express_pieces(local),
            read_response: None,
            _keep: Some(Keep::Regions(local.into())),
        }))
    }

    /// The checks of an express request, and its operation queued as an express one at the
    /// next sequence number (built in place: an operation is a few hundred bytes, and each
    /// move of it cost a copy). `None`: it does not go the express way, nothing is queued.
    fn express_op(
        &mut self,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<Option<ExpressRequest>, PostError> {
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
        let seq = self.enqueue(op, false);
        self.express.push_back(seq);
        Ok(Some(ExpressRequest {
            seq,
            to,
            imm,
            len: total as u32,
        }))
    }

    /// Answers owed to the peer's express requests, taken off the control queue to ride on
    /// an `Express` frame: their count when one `ExpressAnswer` is queued and it holds only
    /// successes; 0 otherwise (they go as frames, in order).
    fn take_express_answers(&mut self) -> u64 {
        let ctrl = &mut self.rails[0].ctrl;
        let is_ok_answer =
            |h: &FrameHeader| h.opcode == Opcode::ExpressAnswer && h.aux == WireStatus::Ok as u32;
        // The usual case in a ping-pong: that answer alone.
        if ctrl.len() == 1 && ctrl.back().is_some_and(is_ok_answer) {
            return ctrl.pop_back().map_or(0, |h| h.arg0);
        }
        let mut answers = ctrl
            .iter()
            .enumerate()
            .filter(|(_, h)| h.opcode == Opcode::ExpressAnswer);
        match (answers.next(), answers.next()) {
            (Some((i, h)), None) if h.aux == WireStatus::Ok as u32 => {
                let n = h.arg0;
                ctrl.remove(i);
                n
            }
            _ => 0,
        }
    }

    /// Queues the answer to the peer's express request that arrived in a frame: counted into
    /// the last `ExpressAnswer` queued while that one holds only successes.
    fn queue_express_answer(&mut self, rail: usize, st: WireStatus) {
        let ctrl = &mut self.rails[rail].ctrl;
        if let Some(h) = ctrl.back_mut()
            && h.opcode == Opcode::ExpressAnswer
            && h.aux == WireStatus::Ok as u32
            && h.arg0 < EXPRESS_WINDOW as u64
        {
            h.arg0 += 1;
            h.aux = st as u32;
            return;
        }
        let mut h = FrameHeader::new(Opcode::ExpressAnswer);
        h.arg0 = 1;
        h.aux = st as u32;
        ctrl.push_back(h);
    }

    /// Takes `n` answers to this side's express requests, all successes but the last, whose
    /// status is `last`. More answers than requests outstanding is a protocol error.
    pub(super) fn express_answers(
        &mut self,
        n: u64,
        last: WireStatus,
    ) -> Result<(), ProtocolError> {
        if n == 0 || n > self.express.len() as u64 {
            return Err(ProtocolError::UnknownOperation {
                opcode: Opcode::ExpressAnswer,
                seq: n,
            });
        }
        for k in 1..=n {
            self.express_acked(if k == n { last } else { WireStatus::Ok })?;
        }
        Ok(())
    }

    /// Executes the peer's [`Opcode::Express`] frame `h` that arrived on `rail` with its
    /// `payload` (see [`Session::on_express`]); the answer is queued as a control frame
    /// (see [`Session::wants_reply_transmit`]) or rides on this side's next express frame.
    /// The answers the frame carries for this side's express requests are taken first, once
    /// however often a stalled frame is offered.
    pub fn on_express_frame(
        &mut self,
        rail: usize,
        h: &FrameHeader,
        payload: &[u8],
    ) -> Result<ExpressAction, ProtocolError> {
        // Only endpoints of one rail send them, and none that checks payloads with a CRC.
        if h.opcode != Opcode::Express || self.rails.len() != 1 || self.cfg.payload_crc {
            return Err(ProtocolError::UnknownOperation {
                opcode: h.opcode,
                seq: h.seq,
            });
        }
        if h.arg0 > 0 && self.express_answers_seen != Some(h.seq) {
            self.express_answers(h.arg0, WireStatus::Ok)?;
            self.express_answers_seen = Some(h.seq);
        }
        let r = ExpressRequest {
            seq: h.seq,
            to: if h.arg1 == 1 {
                ExpressTo::Receive
            } else {
                ExpressTo::Region {
                    rkey: h.rkey,
                    addr: h.addr,
                }
            },
            imm: (h.flags & FLAG_IMM != 0).then_some(h.aux),
            len: h.payload_len,
        };
        let action = self.on_express(rail, &r, payload)?;
        if let ExpressAction::Done(st) = action {
            self.queue_express_answer(rail, st);
        }
        Ok(action)
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

/// An express request's payload pieces: plain memory, empty pieces left out.
fn express_pieces(local: &[Sge]) -> Pieces<(*const u8, usize)> {
    local
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.ptr() as *const u8, s.len))
        .collect()
}

#[cfg(test)]
mod frame_tests;
#[cfg(test)]
mod tests;
