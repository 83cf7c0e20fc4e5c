//! Receive dispatch: frames offered by the driver, responses to this side's operations, payload
//! completion with its CRC check, and placement faults.

use std::time::Instant;

use crate::error::Status;
use crate::mem::file::crc32c_maybe_fragile;
use crate::mem::region::sgl_is_fragile;
use crate::wire::frame::{FLAG_ACK_REQ, FLAG_HEDGE, FLAG_RETX, FLAG_TRAILER, HEADER_LEN};
use crate::wire::{FrameHeader, Opcode, WireStatus};

use super::initiator::wire_status;
use super::rail::RailState;
use super::read_guard::unlog_response;
use super::target::parse_descriptor;
use super::types::{Keep, Placement, ProtocolError, RxAction};
use super::{RxPending, Sent, Session, sgl_pieces};

impl Session {
    /// Offers a decoded frame header that arrived on `rail`.
    pub fn on_frame(
        &mut self,
        rail: usize,
        h: &FrameHeader,
        now: Instant,
    ) -> Result<RxAction, ProtocolError> {
        if !self.rails[rail].alive {
            return Err(ProtocolError::RailGone);
        }
        if self.rails[rail].awaiting_restore {
            if h.opcode != Opcode::RailRestore {
                return Err(ProtocolError::UnknownOperation {
                    opcode: h.opcode,
                    seq: h.seq,
                });
            }
            let r = &mut self.rails[rail];
            r.awaiting_restore = false;
            r.rx_bytes = h.arg0;
            r.conn_start = h.arg0;
            r.rx_advertised = h.arg0;
            r.last_rx = Some(now);
            self.consumed(rail, HEADER_LEN as u64);
            return Ok(RxAction::Done);
        }
        {
            let limit = self.window(rail);
            let r = &mut self.rails[rail];
            r.last_rx = Some(now);
            if h.flags & FLAG_RETX != 0 {
                // rail_ack names the original position, not an acknowledgement.
            } else if h.rail_ack > r.tx_bytes {
                return Err(ProtocolError::BadAck {
                    ack: h.rail_ack,
                    sent: r.tx_bytes,
                });
            } else if h.rail_ack > r.acked {
                let busy = r.inflight() * 2 >= limit;
                r.rate.on_ack(h.rail_ack - r.acked, now, busy);
                r.acked = h.rail_ack;
                while r.log.front().is_some_and(|e| e.end <= r.acked) {
                    let e = r.log.pop_front().expect("checked");
                    // A response frame sent from the region no longer needs its bytes.
                    if let Sent::Response {
                        seq, copy: None, ..
                    } = e.frame
                    {
                        unlog_response(&mut self.reads_active, seq);
                    }
                }
                self.note_progress(rail, now);
            }
        }
        if self.failed.is_some() {
            return Ok(if h.payload_len > 0 {
                self.rails[rail].rx_pending = Some(RxPending::Request { len: h.payload_len });
                RxAction::Discard
            } else {
                RxAction::Done
            });
        }
        if let Some((orig_rail, orig_end)) = h.retransmission_of() {
            // A frame of an earlier connection of a rail re-established since (the peer may
            // resend it on any rail, the new connection included): that connection is
            // gone already, the new one stays.
            let earlier = self
                .rails
                .get(orig_rail)
                .is_some_and(|o| o.alive && (o.awaiting_restore || orig_end <= o.conn_start));
            if orig_rail >= self.rails.len() || (orig_rail == rail && !earlier) {
                return Err(ProtocolError::UnknownOperation {
                    opcode: h.opcode,
                    seq: h.seq,
                });
            }
            // A hedged copy: the peer still uses the original rail (see `hedge`).
            let hedge = h.flags & FLAG_HEDGE != 0 && !earlier && self.rails[orig_rail].alive;
            // Otherwise the peer gave the rail up: so do we, freezing how much of it we
            // consumed.
            if !earlier && !hedge {
                self.rail_down(orig_rail);
            }
            let o = &self.rails[orig_rail];
            let consumed = if hedge {
                o.rx_bytes
            } else {
                o.dead_consumed.unwrap_or(0)
            };
            if orig_end <= consumed || self.retx_seen.contains(&(orig_rail, orig_end)) {
                // Already received on its own rail (or already retransmitted): drop it.
                self.hedge_dups += u64::from(hedge);
                return Ok(self.drop_frame(rail, h));
            }
            // An earlier copy of the same frame is still being read on another rail: the peer
            // resent it again because it gave that rail up too, which we may not know yet.
            // Wait until that copy is complete (then this one is a duplicate) or its rail
            // dies (then this one counts). The same for a hedged original being read.
            let reading = |r: &RailState| r.alive && r.rx_retx == Some((orig_rail, orig_end));
            if self.rails.iter().any(reading)
                || (hedge && self.rails[orig_rail].rx_frame_end == Some(orig_end))
            {
                self.rails[rail].stalled = true;
                return Ok(RxAction::Stall);
            }
        } else if let Some(action) = self.original_already_hedged(rail, h) {
            return Ok(action);
        }
        let action = if h.opcode.is_request() {
            self.on_request(rail, h)?
        } else {
            self.on_response(rail, h)?
        };
        if let (true, RxAction::Place(p)) = (self.cfg.payload_crc, &action) {
            let pieces = p
                .iov
                .iter()
                .map(|&(ptr, len)| (ptr as usize, len))
                .collect();
            self.rails[rail].crc_check = Some((*h, pieces, p.fragile));
        }
        if matches!(action, RxAction::Stall) {
            self.rails[rail].stalled = true;
        } else {
            self.rails[rail].stalled = false;
            self.consumed(rail, HEADER_LEN as u64);
            if h.flags & FLAG_ACK_REQ != 0 {
                if matches!(action, RxAction::Done) {
                    self.ack_now(rail);
                } else {
                    self.rails[rail].ack_after_payload = true;
                }
            }
        }
        if h.flags & FLAG_RETX == 0 && matches!(action, RxAction::Place(_) | RxAction::Discard) {
            let r = &mut self.rails[rail];
            r.rx_frame_end = Some(r.rx_bytes + h.payload_len as u64);
        }
        // A retransmission counts as received once it is consumed whole: not when it stalls,
        // and not if its rail dies in the middle of its payload.
        if let Some(key) = h.retransmission_of() {
            match action {
                RxAction::Done => {
                    self.retx_seen.insert(key);
                }
                RxAction::Place(_) | RxAction::Discard => self.rails[rail].rx_retx = Some(key),
                RxAction::Stall => {}
            }
        }
        // A request without payload may have advanced the frontier to staged ones.
        if matches!(action, RxAction::Done) {
            self.run_due();
        }
        Ok(action)
    }

    pub(super) fn on_response(
        &mut self,
        rail: usize,
        h: &FrameHeader,
    ) -> Result<RxAction, ProtocolError> {
        let unknown = || ProtocolError::UnknownOperation {
            opcode: h.opcode,
            seq: h.seq,
        };
        // A response to a request not completely handed out yet is a peer bug (accepting it
        // would complete an operation a transmit cursor still points at).
        if matches!(
            h.opcode,
            Opcode::Done | Opcode::AtomicResponse | Opcode::ReadResponse
        ) && self.tx_req.front().is_some_and(|c| c.seq <= h.seq)
        {
            return Err(unknown());
        }
        match h.opcode {
            Opcode::RailAck => Ok(RxAction::Done),
            Opcode::ExpressAnswer => {
                let st = WireStatus::from_u32(h.aux).ok_or(ProtocolError::BadStatus(h.aux))?;
                self.express_answers(h.arg0, st)?;
                Ok(RxAction::Done)
            }
            // Executed by the driver with its payload (`on_express_frame`), never offered.
            Opcode::Express => Err(unknown()),
            Opcode::Close => Err(ProtocolError::PeerClosed),
            // Only valid as the first frame of a re-established rail (handled above).
            Opcode::RailRestore => Err(unknown()),
            Opcode::RailDown => {
                let r = h.arg0 as usize;
                if r >= self.rails.len() || r == rail {
                    return Err(unknown());
                }
                self.peer_rail_down(r, h.arg1);
                Ok(RxAction::Done)
            }
            Opcode::Done | Opcode::AtomicResponse => {
                let st = WireStatus::from_u32(h.aux).ok_or(ProtocolError::BadStatus(h.aux))?;
                let status = wire_status(st);
                let i = self.op_index(h.seq).ok_or_else(unknown)?;
                let op = &self.ops[i];
                let is_read = matches!(op.opcode, Opcode::ReadRequest | Opcode::ReadV);
                if h.opcode == Opcode::Done && h.flags & FLAG_TRAILER != 0 {
                    // The status of a read served from file pages, sent once all of its
                    // response bytes were: it completes when they are placed.
                    if !is_read || op.done.is_some() || op.trailer.is_some() || op.total == 0 {
                        return Err(unknown());
                    }
                    let op = &mut self.ops[i];
                    op.trailer = Some(status);
                    op.expect_trailer = true;
                    if op.received == op.total {
                        self.complete_out(i, status, None);
                    }
                    return Ok(RxAction::Done);
                }
                let fits = match h.opcode {
                    Opcode::Done => matches!(
                        op.opcode,
                        Opcode::Write
                            | Opcode::Send
                            | Opcode::ReadRequest
                            | Opcode::WriteV
                            | Opcode::ReadV
                    ),
                    _ => matches!(op.opcode, Opcode::FetchAdd | Opcode::CompareSwap),
                };
                // A successful Done for a read is only valid for a zero-length read.
                let read_ok = !is_read || st != WireStatus::Ok || op.total == 0;
                if !fits || op.done.is_some() || !read_ok || op.received > 0 || op.expect_trailer {
                    return Err(unknown());
                }
                let value =
                    (h.opcode == Opcode::AtomicResponse && status.is_ok()).then_some(h.arg0);
                self.complete_out(i, status, value);
                Ok(RxAction::Done)
            }
            Opcode::ReadResponse => {
                let i = self.op_index(h.seq).ok_or_else(unknown)?;
                let op = &self.ops[i];
                let is_read = matches!(op.opcode, Opcode::ReadRequest | Opcode::ReadV);
                if !is_read || op.done.is_some() || h.arg0 != op.total {
                    return Err(unknown());
                }
                // A chunk resent from a copy of file pages that were gone says so itself.
                let st = WireStatus::from_u32(h.aux).ok_or(ProtocolError::BadStatus(h.aux))?;
                let op = &mut self.ops[i];
                if st != WireStatus::Ok && op.fault.is_none() {
                    op.fault = Some(wire_status(st));
                }
                op.expect_trailer |= h.flags & FLAG_TRAILER != 0;
                let op = &self.ops[i];
                // Count payloads of this read other rails are still placing (see on_request).
                let placing = self.placing(|p| match *p {
                    RxPending::ReadResponse { seq, len } if seq == h.seq => Some(len),
                    _ => None,
                });
                if op.received + placing + h.payload_len as u64 > op.total {
                    return Err(ProtocolError::Overrun {
                        seq: h.seq,
                        total: op.total,
                    });
                }
                if h.payload_len == 0 {
                    return Ok(RxAction::Done);
                }
                self.rails[rail].rx_pending = Some(RxPending::ReadResponse {
                    seq: h.seq,
                    len: h.payload_len,
                });
                self.rails[rail].rx_keep = Some(Keep::Regions(op.local.clone()));
                Ok(RxAction::Place(Placement {
                    iov: sgl_pieces(&op.local, h.arg1, h.payload_len as u64, |p, l| (p, l)),
                    fragile: sgl_is_fragile(&op.local),
                }))
            }
            _ => Err(unknown()),
        }
    }

    /// The driver has stopped placing the payload of the last frame offered on `rail` and
    /// will not write into that placement again: its connection ended mid-payload, or the
    /// endpoint is gone. Once the rail is dead (or the session failed), what kept the
    /// placement's memory is let go, so a region whose peer died mid-transfer can be
    /// deregistered and freed. On a live rail nothing changes (the payload is still owed).
    pub fn payload_abandoned(&mut self, rail: usize) {
        let failed = self.failed.is_some();
        if let Some(r) = self.rails.get_mut(rail)
            && (failed || !r.alive)
        {
            r.rx_keep = None;
            r.rx_pending = None;
        }
    }

    /// Reports that the payload of the last frame offered on `rail` has been placed (or
    /// discarded) completely. With payload CRCs, a mismatch is an error and the operation
    /// does not complete.
    pub fn payload_done(&mut self, rail: usize) -> Result<(), ProtocolError> {
        // Released before the operation may finish below (which can then reuse its spans):
        // the driver is done with the placement, and a CRC check reads memory the
        // operation in progress still pins.
        let keep = self.rails[rail].rx_keep.take();
        if !self.rails[rail].alive {
            return Err(ProtocolError::RailGone);
        }
        let Some(p) = self.rails[rail].rx_pending.take() else {
            return Ok(());
        };
        if std::mem::take(&mut self.rails[rail].ack_after_payload) {
            let len = match &p {
                RxPending::Request { len }
                | RxPending::ReadResponse { len, .. }
                | RxPending::Dropped { len }
                | RxPending::Early { len, .. } => *len as u64,
                RxPending::Staged(st) | RxPending::Descriptor(st) => st.data.len as u64,
            };
            // Count the payload first, so that the acknowledgement covers it.
            self.rails[rail].rx_bytes += len;
            self.ack_now(rail);
            self.rails[rail].rx_bytes -= len;
        }
        if let Some(key) = self.rails[rail].rx_retx.take() {
            self.retx_seen.insert(key);
            // Another copy of it may be waiting (see on_frame): it is now a duplicate.
            self.retry_stalled();
        }
        if let Some(end) = self.rails[rail].rx_frame_end.take() {
            // An original whose copy came first is consumed: its record may go. (Mostly there
            // is none: the empty test saves hashing the key on every frame.)
            if !self.retx_seen.is_empty() {
                self.retx_seen.remove(&(rail, end));
            }
            if self.rails.iter().any(|r| r.stalled) {
                // A hedged copy of it may be waiting: it is now a duplicate.
                self.retry_stalled();
            }
        }
        if let Some((h, pieces, fragile)) = self.rails[rail].crc_check.take() {
            let mut got = Some(0);
            for (ptr, len) in pieces {
                // SAFETY: the pieces are the placement this session handed out; their memory
                // is pinned by the operation still in progress.
                got = got.and_then(|c| unsafe {
                    crc32c_maybe_fragile(c, ptr as *const u8, len, fragile)
                });
            }
            match got {
                // File pages gone since they were placed: the operation fails as if the
                // placement had faulted.
                None => self.fault_pending(rail, &p),
                Some(got) if got != h.crc => {
                    return Err(ProtocolError::Corrupt {
                        opcode: h.opcode,
                        seq: h.seq,
                        sent: h.crc,
                        got,
                    });
                }
                Some(_) => {}
            }
        }
        drop(keep);
        match p {
            RxPending::Request { len } => {
                self.consumed(rail, len as u64);
                if self.failed.is_some() {
                    return Ok(());
                }
                // A pending request payload always belongs to the operation in execution.
                if let Some(op) = self.cur.as_mut() {
                    op.received += len as u64;
                    if op.received == op.total {
                        self.finish_target_op(rail);
                    }
                }
            }
            RxPending::Early { seq, len } => {
                self.consumed(rail, len as u64);
                if self.failed.is_some() {
                    return Ok(());
                }
                match self.cur.as_mut() {
                    Some(op) if op.seq == seq => {
                        op.received += len as u64;
                        if op.received == op.total {
                            self.finish_target_op(rail);
                        }
                    }
                    _ => {
                        if let Some(e) = self.early.get_mut(&seq) {
                            e.received += len as u64;
                        }
                    }
                }
            }
            RxPending::Dropped { len } => self.consumed(rail, len as u64),
            RxPending::Staged(st) => {
                self.consumed(rail, st.data.len as u64);
                self.stage(st);
            }
            RxPending::Descriptor(st) => {
                self.consumed(rail, st.data.len as u64);
                if self.failed.is_some() {
                    return Ok(());
                }
                let d = parse_descriptor(st, rail)?;
                if d.h.seq > self.frontier {
                    // Accepted ahead of its turn (a vectored write allowed early).
                    self.early_descriptor(d);
                } else {
                    self.desc = Some(d);
                }
            }
            RxPending::ReadResponse { seq, len } => {
                self.consumed(rail, len as u64);
                if self.failed.is_some() {
                    return Ok(());
                }
                if let Some(i) = self.op_index(seq) {
                    let op = &mut self.ops[i];
                    op.received += len as u64;
                    // A read served from file pages also waits for its trailing status.
                    if op.received == op.total && (!op.expect_trailer || op.trailer.is_some()) {
                        let status = op.trailer.unwrap_or(Status::Success);
                        self.complete_out(i, status, None);
                    }
                }
            }
        }
        self.run_due();
        Ok(())
    }

    /// The driver could not place the payload of the last frame offered on `rail`: its
    /// destination is file pages that a truncation took away (`EFAULT`). It reads and drops
    /// the rest of the payload and then calls [`Session::payload_done`] as usual. The
    /// operation fails: a write or send here answers [`WireStatus::RemoteAccess`] (bytes
    /// before the fault may have been placed), a read posted here completes with
    /// [`Status::LocalAccessError`].
    pub fn payload_fault(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        r.crc_check = None;
        let Some(p) = r.rx_pending.take() else {
            return;
        };
        self.fault_pending(rail, &p);
        self.rails[rail].rx_pending = Some(p);
    }

    pub(super) fn fault_pending(&mut self, _rail: usize, p: &RxPending) {
        if self.failed.is_some() {
            return;
        }
        match *p {
            RxPending::Request { .. } => self.fault_target_op(),
            RxPending::Early { seq, .. } => {
                if self.cur.as_ref().is_some_and(|op| op.seq == seq) {
                    self.fault_target_op();
                } else if let Some(e) = self.early.get_mut(&seq) {
                    e.status = WireStatus::RemoteAccess;
                    e.dest = None;
                }
            }
            RxPending::ReadResponse { seq, .. } => {
                if let Some(i) = self.op_index(seq) {
                    self.ops[i].fault = Some(Status::LocalAccessError);
                }
            }
            RxPending::Staged(_) | RxPending::Dropped { .. } | RxPending::Descriptor(_) => {}
        }
    }

    /// The operation in execution lost destination pages: it fails, the rest of its data
    /// is discarded.
    pub(super) fn fault_target_op(&mut self) {
        if let Some(op) = self.cur.as_mut() {
            tracing::debug!(
                endpoint = self.endpoint_id,
                seq = op.seq,
                "file pages gone under an incoming payload"
            );
            op.faulted = true;
            op.dest = None;
            if op.status == WireStatus::Ok {
                op.status = WireStatus::RemoteAccess;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::wire::frame::HEADER_LEN;
    use crate::wire::{FrameHeader, Opcode};

    use super::super::testkit::Pair;
    use super::super::{ProtocolError, Request, SessionConfig};

    fn crc_pair() -> Pair {
        let cfg = SessionConfig {
            payload_crc: true,
            ..SessionConfig::default()
        };
        Pair::new(cfg, 1)
    }

    fn write(p: &mut Pair, len: usize) -> crate::Region {
        let src = p.region(0, len, 0x3c);
        let dst = p.region(1, len, 0);
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        dst
    }

    #[test]
    fn a_payload_corrupted_on_the_way_fails_its_crc() {
        let mut p = crc_pair();
        p.tamper = Some(Box::new(|side, _, bytes: &mut Vec<u8>| {
            if side == 0 && bytes.len() > HEADER_LEN + 100 {
                bytes[HEADER_LEN + 100] ^= 1;
            }
        }));
        let _dst = write(&mut p, 4096);
        p.run();
        assert!(
            matches!(
                p.errors[1].as_slice(),
                [(
                    0,
                    ProtocolError::Corrupt {
                        opcode: Opcode::Write,
                        ..
                    }
                )]
            ),
            "{:?}",
            p.errors[1]
        );
        assert!(p.done[0].is_empty(), "the corrupted write did not complete");
    }

    #[test]
    fn intact_payloads_pass_their_crc() {
        let mut p = crc_pair();
        let dst = write(&mut p, 3 << 20);
        p.run();
        assert!(p.errors[1].is_empty());
        assert_eq!(p.done[0].len(), 1);
        assert_eq!(dst.to_vec(0, 3 << 20).unwrap(), vec![0x3c; 3 << 20]);
    }

    #[test]
    fn bad_frames_are_refused() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let now = p.now;
        let mut h = FrameHeader::new(Opcode::ReadResponse);
        h.seq = 5;
        h.payload_len = 8;
        assert!(matches!(
            p.s[0].on_frame(0, &h, now),
            Err(ProtocolError::UnknownOperation { seq: 5, .. })
        ));
        let mut ack = FrameHeader::new(Opcode::RailAck);
        ack.rail_ack = 1 << 30;
        assert!(matches!(
            p.s[0].on_frame(0, &ack, now),
            Err(ProtocolError::BadAck { .. })
        ));
        p.lose_rail(1);
        let ok = FrameHeader::new(Opcode::RailAck);
        assert!(matches!(
            p.s[0].on_frame(1, &ok, now),
            Err(ProtocolError::RailGone)
        ));
    }
}
