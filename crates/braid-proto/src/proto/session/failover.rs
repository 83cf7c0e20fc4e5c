//! Failover: the log of unacknowledged frames, their retransmission when a rail dies, the
//! staging of requests that arrive ahead of their turn meanwhile, and rail restoration.

use crate::error::Status;
use crate::mem::file::copy_maybe_fragile;
use crate::proto::rate::RateEstimator;
use crate::wire::{FrameHeader, Opcode};

use super::read_guard::unlog_response;
use super::staging::StagingBuf;
use super::target::parse_descriptor;
use super::transmit::{Frame, response_frame};
use super::types::{Keep, Placement, RxAction};
use super::{LogEntry, RxPending, Sent, Session, Staged};

impl Session {
    /// True when a log entry waiting in `retx` may go on `rail`: not a copy of a frame this
    /// very connection of `rail` carries (a hedge never goes on the rail it hedges).
    pub(super) fn retx_fits(&self, e: &LogEntry, rail: usize) -> bool {
        let (orig_rail, orig_end) = e.orig;
        !(orig_rail == rail && orig_end > self.rails[rail].tx_conn_start)
    }

    /// True when the original of log entry `e` is known delivered: its rail is alive on
    /// the connection that carried it and the peer acknowledged it (a hedged rail caught
    /// up before its copy went).
    fn retx_needless(&self, e: &LogEntry) -> bool {
        let (orig_rail, orig_end) = e.orig;
        let o = &self.rails[orig_rail];
        o.alive && orig_end > o.tx_conn_start && orig_end <= o.acked
    }

    /// True when [`Session::next_retransmission`] has something for `rail`.
    pub(super) fn retx_waiting(&self, rail: usize) -> bool {
        self.retx
            .iter()
            .any(|e| self.retx_fits(e, rail) && !self.retx_needless(e))
    }

    /// The next frame of a dead (or hedged) rail still worth sending on `rail`, with its
    /// log entry.
    pub(super) fn next_retransmission(&mut self, rail: usize) -> Option<(Frame, LogEntry)> {
        let mut i = 0;
        while i < self.retx.len() {
            if self.retx_needless(&self.retx[i]) {
                self.retx.remove(i);
                continue;
            }
            if !self.retx_fits(&self.retx[i], rail) {
                i += 1;
                continue;
            }
            let e = self.retx.remove(i).expect("in range");
            let frame = match &e.frame {
                Sent::Request { seq, off, len } => {
                    // A completed operation was fully received: nothing to resend.
                    let Some(i) = self.op_index(*seq) else {
                        continue;
                    };
                    if self.ops[i].done.is_some() {
                        continue;
                    }
                    let (h, payload, keep, l) = self.request_frame(i, *off, *len);
                    debug_assert_eq!(l, *len);
                    (
                        h,
                        payload,
                        keep,
                        Some(Sent::Request {
                            seq: *seq,
                            off: *off,
                            len: *len,
                        }),
                    )
                }
                Sent::Descriptor { seq } => {
                    let Some(i) = self.op_index(*seq) else {
                        continue;
                    };
                    if self.ops[i].done.is_some() {
                        continue;
                    }
                    let (h, payload, keep) = self.descriptor_frame(i);
                    (h, payload, keep, Some(Sent::Descriptor { seq: *seq }))
                }
                Sent::Response {
                    src,
                    copy,
                    seq,
                    total,
                    off,
                    len,
                } => {
                    // Resent from a private copy of the bytes the read saw: taken now if no
                    // request has modified them yet (else `read_conflict` took it then).
                    // Taken before the header is built, so a copy of file pages that were
                    // truncated meanwhile is flagged in the frame itself.
                    let copy = match copy {
                        Some(c) => Some(c.clone()),
                        None => {
                            let buf = StagingBuf::copy_of(src, *off, *len);
                            unlog_response(&mut self.reads_active, *seq);
                            Some((buf, *off))
                        }
                    };
                    let (h, payload, keep) = response_frame(src, &copy, *seq, *total, *off, *len);
                    let logged = Sent::Response {
                        src: src.clone(),
                        copy: copy.clone(),
                        seq: *seq,
                        total: *total,
                        off: *off,
                        len: *len,
                    };
                    (h, payload, keep, Some(logged))
                }
                Sent::Control(h) => (*h, super::Pieces::new(), None, Some(Sent::Control(*h))),
            };
            return Some((frame, e));
        }
        None
    }

    /// After a rail loss, a request that cannot execute yet is copied aside (within
    /// `max_staged`) instead of stalling its rail, which may carry what it waits for.
    pub(super) fn stage_incoming(&mut self, rail: usize, h: &FrameHeader) -> Option<RxAction> {
        if !self.recovering || self.staged_bytes + h.payload_len as u64 > self.cfg.max_staged {
            return None;
        }
        let data = StagingBuf::new(h.payload_len as usize);
        if h.payload_len == 0 {
            self.stage(Staged { h: *h, data });
            return Some(RxAction::Done);
        }
        self.staged_bytes += h.payload_len as u64;
        let iov = smallvec::smallvec![(data.ptr, data.len)];
        self.rails[rail].rx_keep = Some(Keep::Staging(data.clone()));
        self.rails[rail].rx_pending = Some(RxPending::Staged(Staged { h: *h, data }));
        Some(RxAction::Place(Placement {
            iov,
            fragile: false,
        }))
    }

    /// Keeps a request that arrived ahead of its turn; a descriptor goes before the data
    /// chunks of its operation (they cannot execute without it).
    pub(super) fn stage(&mut self, st: Staged) {
        let list = self.staged.entry(st.h.seq).or_default();
        if st.h.opcode.is_descriptor() {
            list.push_front(st);
        } else {
            list.push_back(st);
        }
    }

    /// Executes staged requests whose turn has come.
    pub(super) fn apply_staged(&mut self) {
        while self.failed.is_none() {
            let Some(list) = self.staged.get_mut(&self.frontier) else {
                self.end_recovery();
                return;
            };
            let Some(st) = list.pop_front() else {
                self.staged.remove(&self.frontier);
                continue;
            };
            if list.is_empty() {
                self.staged.remove(&st.h.seq);
            }
            let Some(rail) = self.rails.iter().position(|r| r.alive) else {
                return;
            };
            if st.h.opcode.is_descriptor() {
                // Its list is all there: it executes as one that just arrived.
                self.staged_bytes -= st.data.len as u64;
                if self.cur.is_some() || self.desc.is_some() {
                    tracing::warn!(endpoint = self.endpoint_id, "second descriptor staged");
                    self.fail(Status::TransportError);
                    return;
                }
                match parse_descriptor(st, rail) {
                    Ok(d) => self.desc = Some(d),
                    Err(e) => {
                        tracing::warn!(endpoint = self.endpoint_id, "staged request refused: {e}");
                        self.fail(Status::TransportError);
                    }
                }
                return;
            }
            if st.h.opcode == Opcode::WriteVData
                && self.cur.is_none()
                && !self.early.contains_key(&st.h.seq)
            {
                // Its descriptor has not executed yet; that brings us back here.
                self.staged.entry(st.h.seq).or_default().push_front(st);
                return;
            }
            // Run the request as if it had just arrived, without disturbing the rail's own
            // payload in progress.
            let saved = self.rails[rail].rx_pending.take();
            let saved_crc = self.rails[rail].crc_check.take();
            let saved_keep = self.rails[rail].rx_keep.take();
            let action = self.on_request(rail, &st.h);
            let placed = self.rails[rail].rx_pending.take();
            self.rails[rail].rx_pending = saved;
            self.rails[rail].crc_check = saved_crc;
            self.rails[rail].rx_keep = saved_keep;
            match action {
                Ok(RxAction::Stall) => {
                    // Waiting for a receive to be posted: keep it first in line.
                    self.staged.entry(st.h.seq).or_default().push_front(st);
                    return;
                }
                Ok(RxAction::Place(p)) => {
                    // SAFETY: the staged payload is complete (no write in progress).
                    let data = unsafe { st.data.bytes() };
                    let mut off = 0;
                    let mut ok = true;
                    for &(ptr, len) in &p.iov {
                        // SAFETY: the placement is pinned memory of the operation (file pages
                        // are written with a system call); `data` holds exactly the payload.
                        ok &= unsafe {
                            copy_maybe_fragile(data[off..].as_ptr(), ptr, len, p.fragile)
                        };
                        off += len;
                    }
                    if !ok {
                        self.fault_target_op();
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(endpoint = self.endpoint_id, "staged request refused: {e}");
                    self.fail(Status::TransportError);
                    return;
                }
            }
            self.staged_bytes -= st.data.len as u64;
            if let Some(RxPending::Request { len }) = placed
                && let Some(op) = self.cur.as_mut()
            {
                op.received += len as u64;
                if op.received == op.total {
                    self.finish_target_op(rail);
                }
            }
        }
    }

    /// A rail failed (reset, closed, silent, or corrupted data). Its unacknowledged frames
    /// are sent again on the surviving rails and the peer is told with a `RailDown`; only
    /// when no rail is left does every outstanding operation complete with
    /// [`Status::TransportError`] and every posted receive with [`Status::Flushed`].
    pub fn on_rail_lost(&mut self, rail: usize) {
        self.rail_down(rail);
    }

    pub(super) fn rail_down(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        if !r.alive {
            return;
        }
        r.alive = false;
        r.dead_consumed = Some(r.rx_bytes);
        r.stalled = false;
        r.crc_check = None;
        r.rx_retx = None;
        r.rx_frame_end = None;
        r.progress_at = None;
        // Frames hedged already have their copies on other rails (or in `retx`).
        let hedged_to = r.hedged_to.take().unwrap_or(0);
        r.hedged_at = None;
        // The driver may still be writing into the pending placement: `rx_keep` keeps its
        // memory until it reports back; the payload is simply never accounted.
        // `rx_pending` goes (it must not count as "being placed" any more).
        if let Some(RxPending::Staged(st)) = r.rx_pending.take() {
            self.staged_bytes -= st.data.len as u64;
        }
        let r = &mut self.rails[rail];
        let mut log = std::mem::take(&mut r.log);
        log.retain(|e| e.end > hedged_to || matches!(e.frame, Sent::Response { .. }));
        let ctrl = std::mem::take(&mut r.ctrl);
        self.dead_pending |= 1 << rail;
        let Some(heir) = self.rails.iter().position(|r| r.alive) else {
            self.fail(Status::TransportError);
            return;
        };
        tracing::info!(
            endpoint = self.endpoint_id,
            rail,
            "rail lost; failing over to the surviving rails"
        );
        self.recovering = true;
        self.down_unheard |= 1 << rail;
        self.retx.extend(log);
        let heir_ctrl = &mut self.rails[heir].ctrl;
        heir_ctrl.extend(
            ctrl.into_iter()
                .filter(|h| matches!(h.opcode, Opcode::Done | Opcode::AtomicResponse)),
        );
        let mut down = FrameHeader::new(Opcode::RailDown);
        down.arg0 = rail as u64;
        // Requests from here on are posted after the loss: the peer's recovery ends once
        // everything below has executed.
        down.arg1 = self.next_seq;
        heir_ctrl.push_front(down);
        // A response frame the driver was writing on the dead rail no longer matters (its log
        // entry is resent from a copy); requests waiting for it may go ahead.
        while let Some(i) = self.tx_frames.iter().position(|f| f.rail == rail) {
            let f = self.tx_frames.swap_remove(i);
            self.tx_frame_gone(&f);
            if f.guard {
                self.frame_written(f.seq);
            }
        }
        self.retry_stalled();
    }

    /// The peer gave rail `rail` up, and every request it posted before that carries a
    /// sequence number below `boundary`.
    pub(super) fn peer_rail_down(&mut self, rail: usize, boundary: u64) {
        // A rail that awaits its `RailRestore` is a new connection: this notice is of the
        // old one (had the peer given the new one up too, its socket tells).
        let r = &self.rails[rail];
        if !(r.alive && r.awaiting_restore) {
            self.rail_down(rail);
        }
        self.down_unheard &= !(1 << rail);
        self.recover_until = self.recover_until.max(boundary);
        self.end_recovery();
    }

    /// Leaves recovery once nothing the peer sent before its rail losses can still arrive
    /// out of turn: both sides have told each other of every dead rail, every request
    /// below the peer's boundary has executed (later copies of them are dropped as
    /// retransmissions already received), and nothing is staged. Requests ahead of their
    /// turn then stall or are placed early again, as before the loss, instead of being
    /// copied aside.
    pub(super) fn end_recovery(&mut self) {
        if self.recovering
            && self.down_unheard == 0
            && self.frontier >= self.recover_until
            && self.staged.is_empty()
        {
            self.recovering = false;
            tracing::debug!(endpoint = self.endpoint_id, "recovered from rail loss");
        }
    }

    /// A new connection replaces failed `rail` (if the rail was still considered alive, it is
    /// failed over first). Both sides start by sending `RailRestore` with their byte count on
    /// the rail, so offsets of the new connection never repeat those of the old one.
    pub fn on_rail_restored(&mut self, rail: usize) -> bool {
        if self.failed.is_some() {
            return false;
        }
        self.rail_down(rail);
        if self.failed.is_some() {
            return false;
        }
        self.dead_pending &= !(1 << rail);
        let r = &mut self.rails[rail];
        r.alive = true;
        r.awaiting_restore = true;
        r.acked = r.tx_bytes;
        r.tx_conn_start = r.tx_bytes;
        r.rate = RateEstimator::default();
        r.last_rx = None;
        r.last_tx = None;
        r.rx_pending = None;
        r.rx_keep = None;
        let mut restore = FrameHeader::new(Opcode::RailRestore);
        restore.arg0 = r.tx_bytes;
        r.ctrl.push_front(restore);
        tracing::info!(endpoint = self.endpoint_id, rail, "rail re-established");
        true
    }

    /// Log entries of dead rails still to be sent again (tests).
    #[cfg(test)]
    pub(super) fn retx_pending(&self) -> usize {
        self.retx.len()
    }

    /// Rails that died since the last call (a bit per rail): the driver closes their sockets.
    pub fn take_dead_rails(&mut self) -> u64 {
        std::mem::take(&mut self.dead_pending)
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Status;
    use crate::wire::Opcode;
    use crate::wire::frame::FLAG_RETX;

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};

    /// A rail dies with frames on it: they are sent again on the other, and every
    /// operation (the atomic included) takes effect exactly once.
    #[test]
    fn frames_of_a_lost_rail_are_resent_and_applied_once() {
        const LEN: usize = 3 << 20;
        let cfg = SessionConfig {
            chunk_size: 128 << 10,
            ..SessionConfig::default()
        };
        let mut p = Pair::new(cfg, 2);
        let src = p.region(0, LEN, 0);
        let pattern: Vec<u8> = (0..LEN).map(|i| (i * 7 % 251) as u8).collect();
        src.write_at(0, &pattern).unwrap();
        let dst = p.region(1, LEN + 8, 0);
        let key = dst.remote_key().key;
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: key,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        let add = Request::FetchAdd {
            rkey: key,
            addr: LEN as u64,
            add: 1,
        };
        p.post(0, 2, add);
        p.held[0] = true;
        for _ in 0..3 {
            p.step();
        }
        assert!(p.queued(0, 0) > 0, "frames are on the rail when it dies");
        let sent_before = p.sent[0].len();
        p.lose_rail(0);
        assert!(p.s[0].recovering && p.s[1].recovering);
        p.run();
        p.assert_no_errors("after the loss");
        let st: Vec<_> = p.done[0]
            .iter()
            .map(|c| (c.wr_id, c.status, c.value))
            .collect();
        assert_eq!(
            st,
            [(1, Status::Success, None), (2, Status::Success, Some(0))]
        );
        assert_eq!(dst.to_vec(0, LEN).unwrap(), pattern);
        assert_eq!(dst.to_vec(LEN, 8).unwrap(), 1u64.to_le_bytes());
        let resent = p.sent[0][sent_before..]
            .iter()
            .filter(|(rail, h)| *rail == 1 && h.flags & FLAG_RETX != 0)
            .count();
        assert!(resent > 0, "the lost frames went again on rail 1");
        assert!(p.s[0].retx.is_empty());
        assert!(p.s[0].rails[1].log.is_empty(), "all acknowledged");
    }

    /// Recovery ends once the requests from before the loss have executed: later writes
    /// are placed ahead of their turn again (relaxed placement), not copied aside.
    #[test]
    fn recovery_ends_and_early_placement_resumes_after_a_rail_loss() {
        let cfg = SessionConfig {
            relaxed_placement: true,
            ..SessionConfig::default()
        };
        let mut p = Pair::new(cfg, 3);
        let src = p.region(0, 1 << 20, 5);
        let dst = p.region(1, 1 << 20, 0);
        let key = dst.remote_key().key;
        // Two commuting 4 KiB writes, the first held on rail 0: the second is placed early.
        let pair_of_writes = |p: &mut Pair, first_id: u64| {
            for (id, addr) in [(first_id, 0), (first_id + 1, 4096)] {
                let w = Request::Write {
                    local: vec![src.slice(0, 4096).unwrap()],
                    rkey: key,
                    addr,
                    imm: None,
                };
                p.post(0, id, w);
            }
            p.held[0] = true;
            p.run();
            p.held[0] = false;
            p.run();
            p.assert_no_errors("protocol errors");
        };
        pair_of_writes(&mut p, 1);
        let early = p.s[1].early_chunks();
        assert!(early > 0, "the pattern exercises early placement");
        // A 1 MiB write in flight on every rail when rail 2 dies.
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: key,
            addr: 0,
            imm: None,
        };
        p.post(0, 10, w);
        for _ in 0..3 {
            p.step();
        }
        p.lose_rail(2);
        assert!(p.s[0].recovering && p.s[1].recovering);
        pair_of_writes(&mut p, 11);
        assert!(
            !p.s[0].recovering && !p.s[1].recovering,
            "both sides told each other and executed what came before"
        );
        let early = p.s[1].early_chunks();
        pair_of_writes(&mut p, 21);
        assert!(
            p.s[1].early_chunks() > early,
            "writes after the recovery are placed early again"
        );
        let ids: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        let want: Vec<_> = [1, 2, 10, 11, 12, 21, 22]
            .into_iter()
            .map(|id| (id, Status::Success))
            .collect();
        assert_eq!(ids, want);
        assert_eq!(dst.to_vec(0, 1 << 20).unwrap(), vec![5; 1 << 20]);
    }

    #[test]
    fn a_restored_rail_opens_with_its_restore_frame_and_carries_data_again() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let src = p.region(0, 8 << 20, 3);
        let dst = p.region(1, 8 << 20, 0);
        p.lose_rail(1);
        assert!(!p.s[0].rail_alive(1));
        // The sides tell each other (on rail 0) before the rail is redialled.
        p.run();
        p.restore_rail(1);
        assert!(p.s[0].rail_alive(1));
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        p.run();
        p.assert_no_errors("protocol errors");
        assert_eq!(p.done[0][0].status, Status::Success);
        let first = p.sent[0].iter().find(|(rail, _)| *rail == 1).unwrap();
        assert_eq!(first.1.opcode, Opcode::RailRestore);
        assert!(p.s[0].rail_data_sent()[1] > 0);
        assert_eq!(dst.to_vec(0, 8 << 20).unwrap(), vec![3; 8 << 20]);
    }

    /// A rail dies with read responses on it and is re-established before they are all
    /// sent again: their retransmissions may then travel on the new connection of their own
    /// rail, or on another while it awaits its `RailRestore`. Neither may be taken for a
    /// frame of the new connection (a protocol error, or giving the new connection up).
    /// A 64-hour soak with a rail flapping every 5 s met it once (2026-11-26).
    #[test]
    fn retransmissions_of_an_old_connection_travel_on_its_restored_rail() {
        const LEN: usize = 4 << 20;
        for first_rail in [0, 1] {
            let cfg = SessionConfig {
                chunk_size: 64 << 10,
                ..SessionConfig::default()
            };
            let mut p = Pair::new(cfg, 2);
            let pattern: Vec<u8> = (0..LEN).map(|i| (i * 13 % 251) as u8).collect();
            let src = p.region(1, LEN, 0);
            src.write_at(0, &pattern).unwrap();
            let dst = p.region(0, LEN, 0);
            p.post(
                0,
                1,
                Request::Read {
                    local: vec![dst.as_sge()],
                    rkey: src.remote_key().key,
                    addr: 0,
                },
            );
            // Responses flow on both rails; rail 0's vanish with its connection.
            for _ in 0..6 {
                p.step();
            }
            p.lose_rail(0);
            // Each side hears of the loss (`RailDown` on rail 1) and some retransmissions go
            // out before rail 0 is back; the rest are still to send.
            p.step();
            p.step();
            assert!(p.s[1].retx_pending() > 0, "first rail {first_rail}");
            p.restore_rail(0);
            if first_rail == 1 {
                // The other rail is polled first: retransmissions go there while rail 0
                // still awaits its restore frame.
                p.held[0] = true;
                for _ in 0..4 {
                    p.step();
                }
                p.held[0] = false;
            }
            p.run();
            p.assert_no_errors(&format!("first rail {first_rail}"));
            assert_eq!(p.done[0].len(), 1, "first rail {first_rail}");
            assert_eq!(p.done[0][0].status, Status::Success);
            assert!(p.s[0].rail_alive(0) && p.s[1].rail_alive(0));
            assert_eq!(dst.to_vec(0, LEN).unwrap(), pattern);
        }
    }

    /// The sides re-establish a rail before they have read each other's `RailDown` for
    /// it: a notice read while the rail awaits its `RailRestore` is of the old connection and
    /// leaves the new one up.
    #[test]
    fn a_rail_down_notice_of_the_old_connection_leaves_the_new_one_up() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let src = p.region(0, 1 << 20, 9);
        let dst = p.region(1, 1 << 20, 0);
        p.lose_rail(0);
        p.restore_rail(0);
        // Rail 1 (with the notices) is read first; rail 0 (with the restore frames) later.
        p.held[0] = true;
        for _ in 0..4 {
            p.step();
        }
        p.held[0] = false;
        p.post(
            0,
            1,
            Request::Write {
                local: vec![src.as_sge()],
                rkey: dst.remote_key().key,
                addr: 0,
                imm: None,
            },
        );
        p.run();
        p.assert_no_errors("protocol errors");
        assert!(p.s[0].rail_alive(0) && p.s[1].rail_alive(0));
        assert_eq!(p.done[0][0].status, Status::Success);
        assert_eq!(dst.to_vec(0, 1 << 20).unwrap(), vec![9; 1 << 20]);
    }

    #[test]
    fn a_payload_abandoned_on_a_dead_rail_releases_its_region() {
        use std::time::Duration;
        let mut p = Pair::new(SessionConfig::default(), 1);
        let src = p.region(0, 4096, 7);
        let dst = p.region(1, 4096, 0);
        p.post(
            0,
            1,
            Request::Write {
                local: vec![src.as_sge()],
                rkey: dst.remote_key().key,
                addr: 0,
                imm: None,
            },
        );
        let t = p.s[0].poll_transmit(0, p.now).expect("the write's frame");
        let h = crate::wire::FrameHeader::decode(&t.header).expect("header");
        drop(t);
        // The target is told where the payload goes; then the connection ends before it.
        let placed = p.s[1].on_frame(0, &h, p.now).expect("a valid frame");
        assert!(matches!(placed, super::super::RxAction::Place(_)));
        p.s[1].on_rail_lost(0);
        assert!(p.s[1].is_failed(), "its only rail");
        // The driver may still be writing: the memory stays held until it says it stopped.
        let dst = match dst.deregister(Duration::ZERO) {
            Err((dst, e)) => {
                assert!(matches!(e, crate::error::Error::RegionBusy { .. }), "{e:?}");
                dst
            }
            Ok(()) => panic!("the placement's memory was released while it could be written"),
        };
        p.s[1].payload_abandoned(0);
        assert!(
            dst.deregister(Duration::ZERO).is_ok(),
            "a failed endpoint's abandoned placement must not hold the region"
        );
    }
}
