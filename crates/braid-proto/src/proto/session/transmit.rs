//! The transmit scheduler: which frame a rail sends next (control, retransmissions, request
//! and read-response chunks), with its payload CRC and acknowledgement requests.

use std::sync::Arc;
use std::time::Instant;

use crate::error::Status;
use crate::mem::file::{crc32c_raw, read_fragile};
use crate::proto::spans::Spans;
use crate::wire::frame::{
    FLAG_ACK_REQ, FLAG_EARLY, FLAG_HEDGE, FLAG_IMM, FLAG_RETX, FLAG_TRAILER, HEADER_LEN,
};
use crate::wire::{FrameHeader, Opcode, WireStatus};

use super::staging::StagingBuf;
use super::types::{Keep, Transmit};
use super::{LogEntry, Sent, Session, sgl_pieces};
use crate::mem::region::Pieces;

/// Transmit cursor over the requests whose frames are not all handed to rails yet.
pub(super) struct ReqCursor {
    pub(super) seq: u64,
    pub(super) next_off: u64,
    /// Vectored operations: the descriptor frame has been handed out.
    pub(super) desc_sent: bool,
}

/// Transmit cursor over a read response being sent from pinned regions.
pub(super) struct RespCursor {
    pub(super) seq: u64,
    pub(super) src: Arc<Spans>,
    pub(super) total: u64,
    pub(super) next_off: u64,
    /// A private copy of the bytes from offset `.1` on, taken when a later request wanted to
    /// modify them before they were sent.
    pub(super) copy: Option<(Arc<StagingBuf>, u64)>,
}

/// A read-response frame the driver is writing.
pub(super) struct TxFrame {
    /// Token given to the driver.
    pub(super) token: u64,
    /// The read.
    pub(super) seq: u64,
    pub(super) rail: usize,
    /// Sent from the region itself (holds the read's guard).
    pub(super) guard: bool,
    /// Counts for the read's trailer.
    pub(super) trailer: bool,
}

/// A frame to send: header, payload pieces, memory to keep alive, and what to log.
pub(super) type Frame = (
    FrameHeader,
    Pieces<(*const u8, usize)>,
    Option<Keep>,
    Option<Sent>,
);

pub(super) fn response_frame(
    src: &Arc<Spans>,
    copy: &Option<(Arc<StagingBuf>, u64)>,
    seq: u64,
    total: u64,
    off: u64,
    len: u64,
) -> (FrameHeader, Pieces<(*const u8, usize)>, Option<Keep>) {
    let mut h = FrameHeader::new(Opcode::ReadResponse);
    h.seq = seq;
    h.arg0 = total;
    h.arg1 = off;
    h.payload_len = len as u32;
    if src.fragile() {
        h.flags |= FLAG_TRAILER;
    }
    match copy {
        Some((buf, base)) if off >= *base => {
            if buf.faulted {
                // Known before the header goes: the chunk itself says the read failed.
                h.aux = WireStatus::RemoteAccess as u32;
            }
            // SAFETY: off - base + len <= buf.len: the copy covers [base, total).
            let ptr = unsafe { buf.ptr.add((off - base) as usize) } as *const u8;
            (
                h,
                smallvec::smallvec![(ptr, len as usize)],
                Some(Keep::Staging(buf.clone())),
            )
        }
        _ => {
            let pieces = src
                .pieces(off, len)
                .into_iter()
                .map(|(p, l)| (p as *const u8, l))
                .collect();
            (h, pieces, Some(Keep::Spans(src.clone())))
        }
    }
}

impl Session {
    /// True when [`Session::poll_transmit`] would return a frame for `rail`.
    pub fn wants_transmit(&self, rail: usize) -> bool {
        self.wants_ctrl_transmit(rail) || self.wants_data_transmit(rail)
    }

    /// True when control frames (a `Done`, an acknowledgement, a notice) wait to go on
    /// `rail`.
    pub fn wants_ctrl_transmit(&self, rail: usize) -> bool {
        let r = &self.rails[rail];
        r.alive && (!r.ctrl.is_empty() || self.needs_ack_req(rail))
    }

    /// True when `rail` has a `Done`, an atomic's response or an express answer queued:
    /// control frames that complete an operation the peer waits for, unlike an
    /// acknowledgement. A driver that
    /// holds control frames back for the application's next request to carry holds these
    /// only when that request is likely to come soon.
    pub fn wants_reply_transmit(&self, rail: usize) -> bool {
        let r = &self.rails[rail];
        r.alive
            && !r.ctrl.is_empty()
            && r.ctrl.iter().any(|h| {
                matches!(
                    h.opcode,
                    Opcode::Done | Opcode::AtomicResponse | Opcode::ExpressAnswer
                )
            })
    }

    /// True when `rail` may send no more data, has bytes unacknowledged, and none of them
    /// asked for an acknowledgement: a window that shrank under what was in flight (a
    /// rate estimate fell) or is smaller than the receiver's unasked thresholds would wait
    /// for ever. A `RailAck` that asks for one goes then.
    fn needs_ack_req(&self, rail: usize) -> bool {
        let r = &self.rails[rail];
        !r.awaiting_restore
            && r.inflight() > 0
            && r.acked >= r.ack_req_end
            && !self.data_allowed(rail)
    }

    /// True when [`Session::poll_transmit`] would return a request, response or
    /// retransmission for `rail` (not only control frames such as a `Done` or an
    /// acknowledgement, which a driver may hold back briefly for the next request to carry).
    pub fn wants_data_transmit(&self, rail: usize) -> bool {
        // The cheap tests first: a polling thread asks this on every poll.
        self.rails[rail].alive
            && ((self.retx_waiting(rail) && self.data_allowed(rail))
                || ((!self.tx_req.is_empty() || !self.tx_resp.is_empty())
                    && self.data_allowed(rail)
                    && self.spread_lets(rail)))
    }

    /// The next frame to write on `rail`, if any. The driver writes it completely (in as many
    /// partial writes as it takes) before asking for the next one on the same rail.
    pub fn poll_transmit(&mut self, rail: usize, now: Instant) -> Option<Transmit> {
        if !self.rails[rail].alive {
            return None;
        }
        let mut orig = None;
        let (mut hdr, mut payload, mut keep, logged) =
            if let Some(h) = self.rails[rail].ctrl.pop_front() {
                let logged = matches!(h.opcode, Opcode::Done | Opcode::AtomicResponse)
                    .then_some(Sent::Control(h));
                (h, Pieces::new(), None, logged)
            } else if self.needs_ack_req(rail) {
                let mut h = FrameHeader::new(Opcode::RailAck);
                h.flags |= FLAG_ACK_REQ;
                (h, Pieces::new(), None, None)
            } else if let Some((frame, e)) = self
                .data_allowed(rail)
                .then(|| self.next_retransmission(rail))
                .flatten()
            {
                orig = Some(e.orig);
                frame
            } else if (!self.tx_req.is_empty() || !self.tx_resp.is_empty())
                && self.data_allowed(rail)
                && self.spread_lets(rail)
            {
                let spreads = self.spreads();
                if spreads && self.next_data_is_concurrent_small_op() {
                    self.small_rr = (rail + 1) % self.rails.len();
                }
                let resp_first = self.prefer_resp || self.tx_req.is_empty();
                self.prefer_resp = !self.prefer_resp;
                let lone = self.lone_op().filter(|_| spreads);
                // A rail past its share goes on only when no other rail can take the rest.
                let share = lone
                    .and_then(|_| self.lone_share_left(rail))
                    .filter(|&left| left > 0);
                let chunk = self.chunk_for(rail).min(share.unwrap_or(u64::MAX));
                let frame = if resp_first && !self.tx_resp.is_empty() {
                    self.next_response_chunk(chunk)
                } else {
                    self.next_request_frame(chunk)
                };
                if let Some((resp, seq, _)) = lone {
                    self.note_lone_sent(rail, resp, seq, frame.0.payload_len as u64);
                }
                frame
            } else {
                return None;
            };
        // A response sent straight from the region (its read's guard counted it).
        let from_region = hdr.opcode == Opcode::ReadResponse
            && orig.is_none()
            && matches!(keep, Some(Keep::Spans(_)));
        if self.cfg.payload_crc && !payload.is_empty() {
            if keep.as_ref().is_some_and(Keep::fragile) {
                // A CRC reads the bytes in user space, which file pages do not allow; and a
                // truncation between the CRC and the send would send zeros under the CRC of
                // the real bytes. So the bytes are taken once, by a system call, into a
                // private copy that is both summed and sent.
                let total: usize = payload.iter().map(|p| p.1).sum();
                let buf = StagingBuf::new(total);
                let mut at = 0;
                let mut ok = true;
                for &(p, l) in &payload {
                    // SAFETY: the buffer has `total` bytes, of which these `l` are free.
                    let dst = unsafe { std::slice::from_raw_parts_mut(buf.ptr.add(at), l) };
                    ok &= read_fragile(p, dst).is_ok_and(|n| n == l);
                    at += l;
                }
                if !ok {
                    self.note_tx_fault(&mut hdr, true);
                }
                payload = smallvec::smallvec![(buf.ptr as *const u8, total)];
                keep = Some(Keep::Staging(buf));
            }
            let mut crc = 0;
            for &(p, l) in &payload {
                // SAFETY: the pieces point into memory kept alive by `keep` (never file
                // pages: those were copied just above); registered memory that may be
                // written meanwhile is read through raw copies, never as a slice.
                crc = unsafe { crc32c_raw(crc, p, l) };
            }
            hdr.crc = crc;
        }
        let half_window = self.window(rail) / 2;
        let r = &mut self.rails[rail];
        r.last_tx = Some(now);
        let len = HEADER_LEN as u64 + hdr.payload_len as u64;
        // The initiator paces acknowledgements by its own window: one is asked for when
        // the unacknowledged bytes cross half of it, and then every half window sent. Two
        // per window keep it moving (the first arrives while half is still queued), and no
        // more: on a shaped 1 Gbit/s veth rail each `RailAck` costs the receiver about 16 µs
        // of `sendmsg` and the peer's receive processing (`perf record` of the bench server:
        // 10% of 1.18 CPU s in 7426 `sendmsg` calls).
        if (r.inflight() < half_window && r.inflight() + len >= half_window)
            || r.tx_bytes + len >= r.next_ack_req
        {
            hdr.flags |= FLAG_ACK_REQ;
            r.next_ack_req = r.tx_bytes + len + half_window;
        }
        if hdr.flags & FLAG_ACK_REQ != 0 {
            r.ack_req_end = r.tx_bytes + len;
        }
        r.tx_bytes += len;
        if let Some((orig_rail, orig_end)) = orig {
            hdr.flags |= FLAG_RETX | ((orig_rail as u16) << 8);
            hdr.rail_ack = orig_end;
        } else {
            hdr.rail_ack = r.rx_bytes;
            r.rx_advertised = r.rx_bytes;
        }
        if let Some(frame) = logged {
            let end = r.tx_bytes;
            let waits_alone = r.log.is_empty();
            r.log.push_back(LogEntry {
                end,
                orig: orig.unwrap_or((rail, end)),
                frame,
            });
            if waits_alone {
                self.rails[rail].progress_at = Some(now);
                self.rails[rail].hedge_not_before = None;
            }
        }
        // A copy of a frame whose own rail this side still uses: a hedge (see `hedge`).
        if let Some((orig_rail, _)) = orig
            && self.rails.get(orig_rail).is_some_and(|o| o.alive)
        {
            hdr.flags |= FLAG_HEDGE;
        }
        let r = &mut self.rails[rail];
        if hdr.opcode.is_chunk() {
            r.data_sent += hdr.payload_len as u64;
        }
        let trailer = hdr.opcode == Opcode::ReadResponse
            && orig.is_none()
            && self.trailers.iter().any(|t| t.seq == hdr.seq);
        let read_response = (from_region || trailer).then(|| {
            let token = self.next_token;
            self.next_token += 1;
            self.tx_frames.push(TxFrame {
                token,
                seq: hdr.seq,
                rail,
                guard: from_region,
                trailer,
            });
            token
        });
        Some(Transmit {
            header: hdr.encode(),
            payload,
            read_response,
            _keep: keep,
        })
    }

    pub(super) fn next_request_frame(&mut self, max_len: u64) -> Frame {
        let cur = self.tx_req.front_mut().expect("checked non-empty");
        let (seq, off, desc_sent) = (cur.seq, cur.next_off, cur.desc_sent);
        let i = (seq - self.ops.front().expect("op of cursor").seq) as usize;
        let (opcode, total) = (self.ops[i].opcode, self.ops[i].total);
        if opcode.is_descriptor() && !desc_sent {
            let (h, payload, keep) = self.descriptor_frame(i);
            let cur = self.tx_req.front_mut().expect("checked non-empty");
            cur.desc_sent = true;
            if opcode == Opcode::ReadV || total == 0 {
                self.tx_req.pop_front();
            }
            return (h, payload, keep, Some(Sent::Descriptor { seq }));
        }
        let (h, payload, keep, len) = self.request_frame(i, off, max_len);
        let cur = self.tx_req.front_mut().expect("checked non-empty");
        cur.next_off += len;
        let chunked = opcode.is_chunk() || opcode == Opcode::WriteV;
        if !chunked || cur.next_off >= total {
            self.tx_req.pop_front();
        }
        (h, payload, keep, Some(Sent::Request { seq, off, len }))
    }

    /// The first frame of vectored operation `ops[i]`: its remote scatter/gather list.
    pub(super) fn descriptor_frame(
        &self,
        i: usize,
    ) -> (FrameHeader, Pieces<(*const u8, usize)>, Option<Keep>) {
        let op = &self.ops[i];
        let desc = op
            .desc
            .clone()
            .expect("vectored operations carry a descriptor");
        let mut h = FrameHeader::new(op.opcode);
        h.seq = op.seq;
        h.arg0 = op.total;
        h.arg1 = op.arg1;
        h.payload_len = desc.len() as u32;
        if op.early {
            h.flags |= FLAG_EARLY;
        }
        (
            h,
            smallvec::smallvec![(desc.as_ptr(), desc.len())],
            Some(Keep::Bytes(desc)),
        )
    }

    /// The frame of operation `ops[i]` starting at byte `off`, and its payload length.
    pub(super) fn request_frame(
        &self,
        i: usize,
        off: u64,
        max_len: u64,
    ) -> (FrameHeader, Pieces<(*const u8, usize)>, Option<Keep>, u64) {
        let op = &self.ops[i];
        // A vectored write's data chunks name no region: the descriptor did.
        let opcode = match op.opcode {
            Opcode::WriteV => Opcode::WriteVData,
            o => o,
        };
        let mut h = FrameHeader::new(opcode);
        h.seq = op.seq;
        if opcode != Opcode::WriteVData {
            h.rkey = op.rkey;
            h.addr = op.addr;
        }
        h.arg0 = op.arg0;
        h.arg1 = op.arg1;
        if let Some(imm) = op.imm {
            h.flags |= FLAG_IMM;
            h.aux = imm;
        }
        if !opcode.is_chunk() {
            return (h, Pieces::new(), None, 0);
        }
        let len = (op.total - off).min(max_len);
        if op.early {
            h.flags |= FLAG_EARLY;
        }
        h.arg0 = op.total;
        h.arg1 = off;
        h.payload_len = len as u32;
        let pieces = sgl_pieces(&op.local, off, len, |p, l| (p as *const u8, l));
        (h, pieces, Some(Keep::Regions(op.local.clone())), len)
    }

    pub(super) fn next_response_chunk(&mut self, max_len: u64) -> Frame {
        let cur = self.tx_resp.front_mut().expect("checked non-empty");
        let len = (cur.total - cur.next_off).min(max_len);
        let (h, payload, keep) =
            response_frame(&cur.src, &cur.copy, cur.seq, cur.total, cur.next_off, len);
        let from_region = !matches!(&cur.copy, Some((_, base)) if cur.next_off >= *base);
        let logged = Sent::Response {
            src: cur.src.clone(),
            copy: cur.copy.clone(),
            seq: cur.seq,
            total: cur.total,
            off: cur.next_off,
            len,
        };
        cur.next_off += len;
        let (seq, finished) = (cur.seq, cur.next_off >= cur.total);
        if finished {
            self.tx_resp.pop_front();
        }
        if let Some(g) = self.reads_active.iter_mut().find(|g| g.seq == seq) {
            // Only frames read from the region itself hold its guard.
            g.frames += from_region as u32;
            g.logged += from_region as u32;
            g.assigned |= finished;
        }
        if let Some(t) = self.trailers.iter_mut().find(|t| t.seq == seq) {
            t.frames += 1;
            t.assigned |= finished;
        }
        (h, payload, keep, Some(logged))
    }

    /// Reports that the read-response frame given `token` (its [`Transmit::read_response`])
    /// has been completely written.
    pub fn transmitted(&mut self, token: u64) {
        let Some(i) = self.tx_frames.iter().position(|f| f.token == token) else {
            // Its rail died meanwhile (or the session failed): already accounted.
            return;
        };
        let f = self.tx_frames.swap_remove(i);
        self.tx_frame_gone(&f);
        if f.guard && self.frame_written(f.seq) {
            // A request (maybe a staged one) may have waited for this frame.
            self.retry_stalled();
            self.run_due();
        }
    }

    /// A tracked response frame is written (or its rail died): a read served from file
    /// pages sends its trailing `Done` once all of its frames are.
    pub(super) fn tx_frame_gone(&mut self, f: &TxFrame) {
        if !f.trailer {
            return;
        }
        let Some(i) = self.trailers.iter().position(|t| t.seq == f.seq) else {
            return;
        };
        let t = &mut self.trailers[i];
        t.frames = t.frames.saturating_sub(1);
        if t.frames > 0 || !t.assigned {
            return;
        }
        let t = self.trailers.swap_remove(i);
        let rail = if self.rails[f.rail].alive {
            Some(f.rail)
        } else {
            self.rails.iter().position(|r| r.alive)
        };
        if let Some(rail) = rail {
            let mut d = FrameHeader::new(Opcode::Done);
            d.seq = t.seq;
            d.aux = t.status as u32;
            d.flags = FLAG_TRAILER;
            self.rails[rail].ctrl.push_back(d);
        }
    }

    /// A frame's payload could not all be read from local file pages (truncated), found
    /// before its header was sent (`before`, so the header can still say so) or after.
    pub(super) fn note_tx_fault(&mut self, h: &mut FrameHeader, before: bool) {
        match h.opcode {
            Opcode::ReadResponse => {
                if before {
                    h.aux = WireStatus::RemoteAccess as u32;
                }
                if let Some(t) = self.trailers.iter_mut().find(|t| t.seq == h.seq) {
                    t.status = WireStatus::RemoteAccess;
                }
            }
            Opcode::Write | Opcode::WriteVData | Opcode::Send => {
                if let Some(i) = self.op_index(h.seq) {
                    self.ops[i].fault = Some(Status::LocalAccessError);
                }
            }
            _ => {}
        }
    }

    /// The driver could not send the payload of the frame with this header from file pages
    /// (`EFAULT`: the file was truncated under it) and pads the rest of it with zeros. The
    /// operation fails: a write or send completes with [`Status::LocalAccessError`], a read
    /// served from here gets a remote access error through its trailing `Done`.
    pub fn transmit_faulted(&mut self, header: &[u8; HEADER_LEN]) {
        if let Ok(mut h) = FrameHeader::decode(header) {
            tracing::debug!(endpoint = self.endpoint_id, opcode = ?h.opcode, seq = h.seq,
                "file pages gone under a frame being sent; padded");
            self.note_tx_fault(&mut h, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use crate::wire::frame::{FLAG_ACK_REQ, HEADER_LEN};
    use crate::wire::{FrameHeader, Opcode};

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};

    /// What a driver must not hold back for the application's next request: the answer
    /// to an atomic, and the `Done` of an operation executed here.
    #[test]
    fn an_atomics_response_and_a_writes_done_are_replies() {
        let mut p = Pair::new(SessionConfig::default(), 1);
        let target = p.region(1, 128, 0);
        let key = target.remote_key().key;
        p.post(
            0,
            1,
            Request::FetchAdd {
                rkey: key,
                addr: 0,
                add: 5,
            },
        );
        assert!(p.tx_one(0, 0));
        assert!(!p.s[1].wants_reply_transmit(0));
        assert!(p.rx_one(1, 0));
        assert!(p.s[1].wants_reply_transmit(0));
        assert!(!p.s[1].wants_data_transmit(0));
        assert!(p.tx_one(1, 0));
        assert!(!p.s[1].wants_reply_transmit(0));
        let src = p.region(0, 64, 7);
        p.post(
            0,
            2,
            Request::Write {
                local: vec![src.as_sge()],
                rkey: key,
                addr: 64,
                imm: None,
            },
        );
        assert!(p.tx_one(0, 0));
        assert!(p.rx_one(1, 0));
        assert!(p.s[1].wants_reply_transmit(0));
        assert!(p.tx_one(1, 0));
        assert!(!p.s[1].wants_reply_transmit(0));
        p.run();
        p.assert_no_errors("replies");
        let done: Vec<(u64, Option<u64>)> = p.done[0].iter().map(|c| (c.wr_id, c.value)).collect();
        assert_eq!(done, vec![(1, Some(0)), (2, None)]);
        assert_eq!(target.to_vec(64, 64).unwrap(), vec![7; 64]);
    }

    #[test]
    fn a_write_goes_in_chunks_of_at_most_a_quarter_window_with_crcs() {
        const LEN: usize = (5 << 20) + 123;
        let cfg = SessionConfig {
            payload_crc: true,
            chunk_size: 1 << 20,
            ..SessionConfig::default()
        };
        let mut p = Pair::new(cfg, 1);
        let seen: Rc<RefCell<Vec<(FrameHeader, u32)>>> = Rc::default();
        let log = seen.clone();
        p.tamper = Some(Box::new(move |side, _, bytes: &mut Vec<u8>| {
            if side == 0 {
                let h = FrameHeader::decode(&bytes[..HEADER_LEN]).unwrap();
                log.borrow_mut()
                    .push((h, crc32c::crc32c(&bytes[HEADER_LEN..])));
            }
        }));
        let src = p.region(0, LEN, 0);
        let pattern: Vec<u8> = (0..LEN).map(|i| (i % 253) as u8).collect();
        src.write_at(0, &pattern).unwrap();
        let dst = p.region(1, LEN, 0);
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        let window = p.s[0].window(0);
        p.run();
        let seen = seen.borrow();
        let chunks: Vec<_> = seen
            .iter()
            .filter(|(h, _)| h.opcode == Opcode::Write)
            .collect();
        assert!(chunks.len() >= 6);
        let mut next = 0;
        for (h, crc) in &chunks {
            assert_eq!(h.arg1, next, "chunks go in order on one rail");
            assert!(h.payload_len as u64 <= (window / 4).min(1 << 20));
            assert_eq!(h.crc, *crc);
            next += h.payload_len as u64;
        }
        assert_eq!(next, LEN as u64);
        assert!(chunks.iter().any(|(h, _)| h.flags & FLAG_ACK_REQ != 0));
        assert_eq!(dst.to_vec(0, LEN).unwrap(), pattern);
    }

    #[test]
    fn nothing_to_send_means_no_frame() {
        let mut p = Pair::new(SessionConfig::default(), 1);
        let now = p.now;
        assert!(!p.s[0].wants_transmit(0));
        assert!(p.s[0].poll_transmit(0, now).is_none());
    }
}
