//! The target side: the peer's requests executed here strictly in their sequence order.

use std::sync::Arc;

use crate::error::{Completion, CompletionKind, Status};
use crate::mem::region::{Access, sgl_is_fragile};
use crate::proto::spans::{Spans, Trailer};
use crate::wire::frame::{FLAG_EARLY, FLAG_IMM};
use crate::wire::sgl::WireSge;
use crate::wire::{FrameHeader, Opcode, WireStatus};

use super::read_guard::ReadGuard;
use super::staging::StagingBuf;
use super::transmit::RespCursor;
use super::types::{Keep, Placement, ProtocolError, RxAction};
use super::{PostedRecv, RxPending, Session, Staged, sgl_pieces};

/// The peer's request currently being executed here (always request number `frontier`).
pub(super) struct TargetOp {
    pub(super) seq: u64,
    pub(super) opcode: Opcode,
    pub(super) rkey: u64,
    pub(super) addr: u64,
    pub(super) total: u64,
    pub(super) imm: Option<u32>,
    pub(super) received: u64,
    pub(super) status: WireStatus,
    /// Where the payload goes; `None` when the op failed its checks and payload is discarded.
    pub(super) dest: Option<Dest>,
    /// A receive consumed by a send or write-with-immediate.
    pub(super) recv: Option<PostedRecv>,
    /// A file page of the destination could not be written (truncated under the operation).
    pub(super) faulted: bool,
}

pub(super) enum Dest {
    Region(Arc<Spans>),
    Recv,
}

/// A vectored request whose descriptor has arrived and waits for its turn to execute.
pub(super) struct PendingDesc {
    pub(super) h: FrameHeader,
    pub(super) entries: Vec<WireSge>,
    /// Where it arrived (its `Done` goes there, if the rail is still alive).
    pub(super) rail: usize,
}

/// The scatter/gather list of a descriptor whose payload has arrived.
pub(super) fn parse_descriptor(st: Staged, rail: usize) -> Result<PendingDesc, ProtocolError> {
    // SAFETY: the payload is complete; nothing writes the buffer any more.
    let data = unsafe { st.data.bytes() };
    let entries = crate::wire::sgl::decode(data, st.h.arg1, st.h.arg0)
        .ok_or(ProtocolError::BadDescriptor { seq: st.h.seq })?;
    Ok(PendingDesc {
        h: st.h,
        entries,
        rail,
    })
}

impl Session {
    pub(super) fn on_request(
        &mut self,
        rail: usize,
        h: &FrameHeader,
    ) -> Result<RxAction, ProtocolError> {
        if h.seq < self.frontier {
            return Err(ProtocolError::DuplicateRequest {
                seq: h.seq,
                frontier: self.frontier,
            });
        }
        if h.seq > self.frontier {
            if let Some(action) = self.stage_incoming(rail, h) {
                return Ok(action);
            }
            if !self.recovering && h.flags & FLAG_EARLY != 0 && h.payload_len > 0 {
                match h.opcode {
                    Opcode::Write | Opcode::WriteVData => return self.place_early(rail, h),
                    Opcode::WriteV => return self.accept_early_descriptor(rail, h),
                    _ => {}
                }
            }
            return Ok(RxAction::Stall);
        }
        if let Some(e) = self.early.get(&h.seq) {
            // A write arrived early under this number: only its own chunks may follow.
            let fits = if e.vectored {
                h.opcode == Opcode::WriteVData
            } else {
                h.opcode == Opcode::Write
            };
            if !fits {
                return Err(ProtocolError::InconsistentChunk { seq: h.seq });
            }
        }
        let imm = (h.flags & FLAG_IMM != 0).then_some(h.aux);
        match h.opcode {
            Opcode::ReadRequest => {
                let src = self
                    .registry
                    .check(h.rkey, h.addr, h.arg0, Access::REMOTE_READ)
                    .map(|pin| Spans::single(pin, h.addr, h.arg0));
                self.start_read(rail, h.seq, src);
                self.advance_frontier();
                return Ok(RxAction::Done);
            }
            Opcode::WriteV | Opcode::ReadV => {
                // The list is read into a buffer; the operation executes once it is there
                // (`exec_descriptor`).
                let pending_here = self.rails.iter().any(|r| {
                    matches!(&r.rx_pending, Some(RxPending::Descriptor(st)) if st.h.seq == h.seq)
                });
                if self.cur.is_some()
                    || self.desc.is_some()
                    || pending_here
                    || self.early.contains_key(&h.seq)
                {
                    return Err(ProtocolError::BadDescriptor { seq: h.seq });
                }
                let data = StagingBuf::new(h.payload_len as usize);
                let iov = smallvec::smallvec![(data.ptr, data.len)];
                self.rails[rail].rx_keep = Some(Keep::Staging(data.clone()));
                self.rails[rail].rx_pending = Some(RxPending::Descriptor(Staged { h: *h, data }));
                return Ok(RxAction::Place(Placement {
                    iov,
                    fragile: false,
                }));
            }
            Opcode::FetchAdd | Opcode::CompareSwap => {
                let mut resp = FrameHeader::new(Opcode::AtomicResponse);
                resp.seq = h.seq;
                match self
                    .registry
                    .check(h.rkey, h.addr, 8, Access::REMOTE_ATOMIC)
                {
                    Ok(pin) => {
                        let p = pin.ptr_at(h.addr as usize);
                        if self.read_conflict(&[(p as usize, p as usize + 8)]) {
                            return Ok(RxAction::Stall);
                        }
                        if !(p as usize).is_multiple_of(8) {
                            resp.aux = WireStatus::RemoteInvalidRequest as u32;
                        } else {
                            // SAFETY: aligned, inside the pinned region; all remote atomics and
                            // Region::atomic_u64 use the same atomic view of the word.
                            let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) };
                            use std::sync::atomic::Ordering::SeqCst;
                            resp.arg0 = if h.opcode == Opcode::FetchAdd {
                                word.fetch_add(h.arg0, SeqCst)
                            } else {
                                match word.compare_exchange(h.arg0, h.arg1, SeqCst, SeqCst) {
                                    Ok(v) | Err(v) => v,
                                }
                            };
                        }
                    }
                    Err(st) => resp.aux = st as u32,
                }
                self.rails[rail].ctrl.push_back(resp);
                self.advance_frontier();
                return Ok(RxAction::Done);
            }
            _ => {}
        }
        // Write or Send chunk.
        if self.cur.is_none()
            && let Some(e) = self.early.get(&h.seq)
        {
            if e.imm.is_some() && self.recvs.is_empty() {
                return Ok(RxAction::Stall);
            }
            self.start_early(h.seq);
        }
        if self.cur.is_none() && h.opcode == Opcode::WriteVData {
            // Its descriptor has not arrived, or waits (see `exec_descriptor`). After a rail
            // loss the descriptor may be resent behind this very chunk: copy it aside.
            if let Some(action) = self.stage_incoming(rail, h) {
                return Ok(action);
            }
            return Ok(RxAction::Stall);
        }
        if self.cur.is_none() {
            let needs_recv = h.opcode == Opcode::Send || imm.is_some();
            if needs_recv && self.recvs.is_empty() {
                // Receiver not ready: wait for a post_recv (like verbs with infinite RNR retry).
                return Ok(RxAction::Stall);
            }
            let mut op = TargetOp {
                seq: h.seq,
                opcode: h.opcode,
                rkey: h.rkey,
                addr: h.addr,
                total: h.arg0,
                imm,
                received: 0,
                status: WireStatus::Ok,
                dest: None,
                recv: None,
                faulted: false,
            };
            if h.opcode == Opcode::Write {
                match self
                    .registry
                    .check(h.rkey, h.addr, h.arg0, Access::REMOTE_WRITE)
                {
                    Ok(pin) => {
                        let dest = Spans::single_in(self.spare_spans.take(), pin, h.addr, h.arg0);
                        if !self.reads_active.is_empty() && self.read_conflict(&dest.ranges()) {
                            return Ok(RxAction::Stall);
                        }
                        op.dest = Some(Dest::Region(dest))
                    }
                    Err(st) => op.status = st,
                }
                if imm.is_some() {
                    op.recv = self.recvs.pop_front();
                }
            } else {
                let recv = self.recvs.pop_front().expect("checked non-empty");
                if h.arg0 > recv.capacity {
                    op.status = WireStatus::RemoteInvalidRequest;
                } else {
                    op.dest = Some(Dest::Recv);
                }
                op.recv = Some(recv);
            }
            self.cur = Some(op);
        }
        // Payloads other rails are still placing count as received: otherwise a duplicated
        // chunk could complete the operation while another rail still writes into its memory.
        let placing = self.placing(|p| match *p {
            RxPending::Request { len } => Some(len),
            RxPending::Early { seq, len } if seq == h.seq => Some(len),
            _ => None,
        });
        let op = self.cur.as_mut().expect("set above");
        if op.seq != h.seq
            || op.opcode != h.opcode
            || op.rkey != h.rkey
            || op.addr != h.addr
            || op.total != h.arg0
            || op.imm != imm
        {
            return Err(ProtocolError::InconsistentChunk { seq: h.seq });
        }
        if op.received + placing + h.payload_len as u64 > op.total {
            return Err(ProtocolError::Overrun {
                seq: h.seq,
                total: op.total,
            });
        }
        if h.payload_len == 0 {
            if op.received == op.total {
                self.finish_target_op(rail);
            }
            return Ok(RxAction::Done);
        }
        self.rails[rail].rx_pending = Some(RxPending::Request { len: h.payload_len });
        let off = h.arg1;
        let len = h.payload_len as u64;
        let (action, keep) = match &op.dest {
            Some(Dest::Region(dest)) => (
                RxAction::Place(Placement {
                    iov: dest.pieces(off, len),
                    fragile: dest.fragile(),
                }),
                Some(Keep::Spans(dest.clone())),
            ),
            Some(Dest::Recv) => {
                let local = &op.recv.as_ref().expect("recv of a send").local;
                (
                    RxAction::Place(Placement {
                        iov: sgl_pieces(local, off, len, |p, l| (p, l)),
                        fragile: sgl_is_fragile(local),
                    }),
                    Some(Keep::Regions(local.clone())),
                )
            }
            None => (RxAction::Discard, None),
        };
        self.rails[rail].rx_keep = keep;
        Ok(action)
    }

    /// Executes what became due: writes placed ahead, vectored requests whose descriptor
    /// arrived, and requests staged after a rail loss.
    pub(super) fn run_due(&mut self) {
        if self.early.is_empty() && self.desc.is_none() && self.staged.is_empty() {
            // Nothing placed ahead, described or staged (every request of a ping-pong comes
            // here twice): all that could be due is the end of a recovery.
            self.end_recovery();
            return;
        }
        loop {
            let before = (self.frontier, self.cur.is_some(), self.desc.is_some());
            self.apply_early();
            self.exec_descriptor();
            self.apply_staged();
            if (self.frontier, self.cur.is_some(), self.desc.is_some()) == before {
                return;
            }
        }
    }

    /// Starts read `seq` from the checked source (or answers its failed check): response
    /// chunks from memory, plus a trailing `Done` when the source is file pages.
    pub(super) fn start_read(
        &mut self,
        rail: usize,
        seq: u64,
        src: Result<Arc<Spans>, WireStatus>,
    ) {
        match src {
            Ok(src) if src.total() > 0 => {
                self.reads_active.push(ReadGuard {
                    seq,
                    ranges: src.ranges(),
                    frames: 0,
                    assigned: false,
                    logged: 0,
                });
                if src.fragile() {
                    self.trailers.push(Trailer {
                        seq,
                        frames: 0,
                        assigned: false,
                        status: WireStatus::Ok,
                    });
                }
                self.tx_resp.push_back(RespCursor {
                    seq,
                    total: src.total(),
                    src,
                    next_off: 0,
                    copy: None,
                })
            }
            Ok(_) => self.queue_done(rail, seq, WireStatus::Ok),
            Err(st) => self.queue_done(rail, seq, st),
        }
    }

    /// Executes the vectored request whose scatter/gather list has arrived, when its turn
    /// has come: every piece is checked before any byte moves (one failed check fails the
    /// whole operation, and its data is discarded).
    pub(super) fn exec_descriptor(&mut self) {
        let Some(d) = &self.desc else {
            return;
        };
        if self.failed.is_some() || self.cur.is_some() || d.h.seq != self.frontier {
            return;
        }
        let rail = if self.rails[d.rail].alive {
            d.rail
        } else {
            match self.rails.iter().position(|r| r.alive) {
                Some(r) => r,
                None => return,
            }
        };
        let h = d.h;
        let need = if h.opcode == Opcode::ReadV {
            Access::REMOTE_READ
        } else {
            Access::REMOTE_WRITE
        };
        let checked = Spans::check(&self.registry, &d.entries, need);
        if h.opcode == Opcode::ReadV {
            self.desc = None;
            self.start_read(rail, h.seq, checked);
            self.advance_frontier();
            return;
        }
        let (status, dest) = match checked {
            Ok(dest) => {
                if !self.reads_active.is_empty() && self.read_conflict(&dest.ranges()) {
                    // A response frame is being written from these bytes: `transmitted`
                    // brings us back here.
                    return;
                }
                (WireStatus::Ok, Some(Dest::Region(dest)))
            }
            Err(st) => (st, None),
        };
        self.desc = None;
        self.cur = Some(TargetOp {
            seq: h.seq,
            opcode: Opcode::WriteVData,
            rkey: 0,
            addr: 0,
            total: h.arg0,
            imm: None,
            received: 0,
            status,
            dest,
            recv: None,
            faulted: false,
        });
        if h.arg0 == 0 {
            self.finish_target_op(rail);
        }
        // Data chunks that arrived first are waiting.
        self.retry_stalled();
    }

    /// Payload bytes the rails are still placing, of the pending payloads `of` selects.
    pub(super) fn placing(&self, of: impl Fn(&RxPending) -> Option<u32>) -> u64 {
        self.rails
            .iter()
            .filter_map(|r| r.rx_pending.as_ref().and_then(&of))
            .map(u64::from)
            .sum()
    }

    pub(super) fn queue_done(&mut self, rail: usize, seq: u64, st: WireStatus) {
        let mut d = FrameHeader::new(Opcode::Done);
        d.seq = seq;
        d.aux = st as u32;
        self.rails[rail].ctrl.push_back(d);
    }

    pub(super) fn advance_frontier(&mut self) {
        self.frontier += 1;
        self.retry_stalled();
        if self.recovering && self.frontier >= self.recover_until {
            self.end_recovery();
        }
    }

    pub(super) fn retry_stalled(&mut self) {
        for (i, r) in self.rails.iter().enumerate() {
            if r.stalled {
                self.rx_retry |= 1 << i;
            }
        }
    }

    pub(super) fn finish_target_op(&mut self, rail: usize) {
        let op = self.cur.take().expect("op in execution");
        if let Some(recv) = op.recv {
            let (kind, status, byte_len) = match (op.opcode, op.status) {
                (Opcode::Write, _) => (CompletionKind::RecvWriteImm, Status::Success, op.total),
                (_, WireStatus::Ok) => (CompletionKind::Recv, Status::Success, op.total),
                _ if op.faulted => (CompletionKind::Recv, Status::LocalAccessError, 0),
                _ => (CompletionKind::Recv, Status::LocalLengthError, 0),
            };
            // A write-with-immediate that failed its access check consumes no receive.
            if op.opcode == Opcode::Write && op.status != WireStatus::Ok {
                self.recvs.push_front(recv);
            } else {
                self.completions.push_back(Completion {
                    wr_id: recv.wr_id,
                    kind,
                    status,
                    byte_len,
                    imm: op.imm,
                    value: None,
                    endpoint: self.endpoint_id,
                });
            }
        }
        if let Some(Dest::Region(spans)) = op.dest {
            self.spare_spans = Spans::release(spans).or(self.spare_spans.take());
        }
        self.queue_done(rail, op.seq, op.status);
        self.advance_frontier();
    }
}

#[cfg(test)]
mod tests {
    use crate::error::{CompletionKind, Status};
    use crate::mem::region::Access;
    use crate::mem::region::Region;

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};

    #[test]
    fn a_refused_request_leaves_memory_alone_and_later_ones_run() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let src = p.region(0, 4096, 7);
        let ro = Region::allocate_in(&p.reg[1], 4096, Access::REMOTE_READ).unwrap();
        ro.fill(0, 4096, 1).unwrap();
        let rw = p.region(1, 4096, 1);
        for (id, key) in [(1, ro.remote_key().key), (2, rw.remote_key().key)] {
            let w = Request::Write {
                local: vec![src.as_sge()],
                rkey: key,
                addr: 0,
                imm: None,
            };
            p.post(0, id, w);
        }
        p.run();
        let st: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(st, [(1, Status::RemoteAccessError), (2, Status::Success)]);
        assert_eq!(ro.to_vec(0, 4096).unwrap(), vec![1; 4096]);
        assert_eq!(rw.to_vec(0, 4096).unwrap(), vec![7; 4096]);
        assert!(p.errors[1].is_empty());
    }

    #[test]
    fn atomics_run_in_order_on_the_target() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let word = p.region(1, 64, 0);
        let key = word.remote_key().key;
        p.post(
            0,
            1,
            Request::FetchAdd {
                rkey: key,
                addr: 0,
                add: 3,
            },
        );
        p.post(
            0,
            2,
            Request::CompareSwap {
                rkey: key,
                addr: 0,
                compare: 3,
                swap: 10,
            },
        );
        p.post(
            0,
            3,
            Request::CompareSwap {
                rkey: key,
                addr: 0,
                compare: 3,
                swap: 99,
            },
        );
        let misaligned = Request::FetchAdd {
            rkey: key,
            addr: 4,
            add: 1,
        };
        assert!(
            p.s[0].post(4, misaligned).is_err(),
            "refused before it goes"
        );
        p.run();
        let v: Vec<_> = p.done[0].iter().map(|c| (c.status, c.value)).collect();
        assert_eq!(v[0], (Status::Success, Some(0)));
        assert_eq!(v[1], (Status::Success, Some(3)));
        assert_eq!(v[2], (Status::Success, Some(10)), "compare failed: no swap");
        let mut b = [0u8; 8];
        word.read_at(0, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), 10);
    }

    #[test]
    fn a_send_waits_for_its_receive() {
        let mut p = Pair::new(SessionConfig::default(), 1);
        let src = p.region(0, 1000, 5);
        let dst = p.region(1, 4096, 0);
        let send = Request::Send {
            local: vec![src.as_sge()],
            imm: Some(42),
        };
        p.post(0, 1, send);
        p.run();
        assert!(
            p.done[0].is_empty() && p.done[1].is_empty(),
            "no receive yet"
        );
        p.s[1].post_recv(77, vec![dst.as_sge()]).unwrap();
        p.run();
        assert_eq!(p.done[0].len(), 1);
        assert_eq!(p.done[0][0].status, Status::Success);
        let c = &p.done[1][0];
        assert_eq!(
            (c.wr_id, c.kind, c.byte_len, c.imm),
            (77, CompletionKind::Recv, 1000, Some(42))
        );
        assert_eq!(dst.to_vec(0, 1001).unwrap()[999..], [5, 0]);
    }
}
