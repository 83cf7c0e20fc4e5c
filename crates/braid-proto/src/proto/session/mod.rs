//! The protocol state machine of one endpoint: both its initiator side (operations posted
//! here) and its target side (the peer's operations executed here).
//!
//! Sans-IO: the driver feeds it decoded frame headers and payload-placement results, and
//! drains frames to transmit per rail and completions. It never touches a socket, a thread
//! or a clock (time is passed in as `now`).
//!
//! Ordering. Requests carry a sequence number in their initiator's space. The target
//! executes requests strictly in that order: a chunk of request `k` is placed only after
//! every request before `k` has completed; a rail whose next frame belongs to a later
//! request is *stalled* (the driver stops reading it and the bytes wait in the kernel's
//! socket buffer, not in a staging buffer). Each rail carries its requests in sequence
//! order, so the chunk the target waits for is always reachable: no deadlock. This gives
//! the ordering of a reliable-connected queue pair: a read after a write sees it, a flag
//! written after data is seen after the data, sends match receives in order.
//!
//! Striping. Chunks are not assigned to rails up front: a rail pulls the next chunk when
//! its window of unacknowledged bytes has room. The window of each rail follows its observed
//! delivery rate (bytes acknowledged per unit of time) times a target queueing delay, so
//! every rail holds about the same *time* worth of data and the rails of one operation
//! finish together even when their speeds differ.
//!
//! Failover. Every frame handed to a rail is logged until the peer's `rail_ack` covers it.
//! When a rail fails, its logged frames are sent again on the surviving rails, marked as
//! retransmissions of (original rail, original end offset); the receiver knows exactly how
//! much of the dead rail it had consumed and drops the copies it already has, so every
//! operation, atomics and sends included, takes effect exactly once. A retransmitted chunk
//! may sit behind a later request on its new rail; so once a rail has been lost, a request
//! that arrives ahead of its turn is copied aside (staged, within a budget) instead of
//! stalling its rail, and executed when its turn comes. Read responses are sent from the
//! region; the bytes of logged response frames are copied aside before a later request
//! modifies them (or when they are resent), so a retransmitted response is exact.

mod config;
mod express;
mod failover;
mod hedge;
mod initiator;
mod rail;
mod read_guard;
mod receive;
mod relaxed;
mod spread;
mod staging;
mod target;
mod transmit;
mod types;
mod window;

#[cfg(test)]
mod testkit;

pub use crate::mem::region::Pieces;
pub use config::SessionConfig;
pub use express::{EXPRESS_MAX, EXPRESS_WINDOW, ExpressAction, ExpressRequest, ExpressTo};
pub use hedge::HedgeStats;
use types::SgeList;
pub use types::{Placement, PostError, ProtocolError, Request, RxAction, Transmit};

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{Completion, CompletionKind, Status};
use crate::mem::region::Sge;
use crate::mem::registry::Registry;
use crate::proto::spans::{Spans, Trailer};
use crate::wire::{FrameHeader, Opcode};

use self::config::{MIN_CHUNK, MIN_WINDOW_BYTES};

use self::initiator::OutOp;
use self::rail::RailState;
use self::read_guard::ReadGuard;
use self::relaxed::EarlyOp;
use self::spread::LoneOp;
use self::staging::StagingBuf;
use self::target::{PendingDesc, TargetOp};
use self::transmit::{ReqCursor, RespCursor, TxFrame};

/// The per-endpoint protocol state machine (see the module documentation).
pub struct Session {
    cfg: SessionConfig,
    /// [`Session::target_delay`] in seconds, computed once: windows are asked for several
    /// times per frame.
    delay_secs: f64,
    registry: Arc<Registry>,
    endpoint_id: u64,
    rails: Vec<RailState>,
    next_seq: u64,
    ops: VecDeque<OutOp>,
    /// Sequence numbers of the express writes in `ops` not answered yet, oldest first (see
    /// `express`).
    express: VecDeque<u64>,
    /// The peer's last `Express` frame whose answers to this side were taken (a frame
    /// offered again after a stall must not count them twice).
    express_answers_seen: Option<u64>,
    tx_req: VecDeque<ReqCursor>,
    tx_resp: VecDeque<RespCursor>,
    /// Alternates data frames between requests and responses.
    prefer_resp: bool,
    /// Shares of the operation that alone has data left to send.
    lone: Option<LoneOp>,
    /// Where the round robin of concurrent small operations over tied rails starts next
    /// (see `Session::small_op_rail`).
    small_rr: usize,
    frontier: u64,
    cur: Option<TargetOp>,
    recvs: VecDeque<PostedRecv>,
    completions: VecDeque<Completion>,
    /// Unsignaled operations that succeeded since the driver last asked.
    unsignaled_done: u64,
    /// The ranges of outstanding writes (with relaxed placement).
    pending_writes: relaxed::PendingWrites,
    rx_retry: u64,
    failed: Option<Status>,
    reads_active: Vec<ReadGuard>,
    /// Read-response frames handed to the driver and not yet reported written.
    tx_frames: Vec<TxFrame>,
    /// Reads served from file pages whose trailing `Done` has not been queued yet.
    trailers: Vec<Trailer>,
    /// A vectored request's descriptor, waiting for its turn.
    desc: Option<PendingDesc>,
    next_token: u64,
    /// Frames of dead rails to send again.
    retx: VecDeque<LogEntry>,
    /// A rail has been lost: requests ahead of their turn are staged instead of stalling
    /// (and none is placed early), until the peer's requests from before the loss have all
    /// executed (see `end_recovery`).
    recovering: bool,
    /// The peer's first sequence number after its last rail loss (from its `RailDown`s):
    /// every request that may still come as a retransmission is below it.
    recover_until: u64,
    /// Dead rails whose `RailDown` from the peer has not arrived yet (a bit per rail).
    down_unheard: u64,
    staged: BTreeMap<u64, VecDeque<Staged>>,
    /// Writes placed (in part) ahead of their turn, by sequence number.
    early: BTreeMap<u64, EarlyOp>,
    /// The emptied spans of the last finished write, for the next one to fill (see
    /// `Spans::single_in`).
    spare_spans: Option<Arc<Spans>>,
    /// Chunks placed ahead of their turn so far (statistics).
    early_chunks: u64,
    staged_bytes: u64,
    /// Retransmissions already applied, by original (rail, end): of dead rails, and hedged
    /// copies whose originals have not arrived yet.
    retx_seen: HashSet<(usize, u64)>,
    /// Rails hedged, and frames sent again for them (statistics).
    hedges: u64,
    hedged_frames: u64,
    hedge_dups: u64,
    /// Rails that died and whose sockets the driver must close (a bit per rail).
    dead_pending: u64,
    /// When [`Session::on_tick`] last ran.
    last_tick: Option<Instant>,
}

impl Session {
    /// A session over `rails` rails whose target side resolves keys in `registry`.
    pub fn new(
        cfg: SessionConfig,
        registry: Arc<Registry>,
        rails: usize,
        endpoint_id: u64,
    ) -> Session {
        assert!((1..=64).contains(&rails), "1 to 64 rails");
        let mut cfg = cfg;
        cfg.min_window = cfg.min_window.max(2 * MIN_CHUNK);
        // Chunks are a quarter of the window (see `chunk_for`), so any window holds several.
        cfg.initial_window = cfg.initial_window.max(MIN_WINDOW_BYTES);
        cfg.max_window = cfg.max_window.max(cfg.min_window);
        let delay_secs = if cfg.relaxed_placement {
            cfg.relaxed_target_delay
        } else {
            cfg.target_delay
        }
        .as_secs_f64();
        Session {
            cfg,
            delay_secs,
            registry,
            endpoint_id,
            rails: (0..rails).map(|_| RailState::new()).collect(),
            next_seq: 0,
            ops: VecDeque::new(),
            express: VecDeque::new(),
            express_answers_seen: None,
            tx_req: VecDeque::new(),
            tx_resp: VecDeque::new(),
            prefer_resp: false,
            lone: None,
            small_rr: 0,
            frontier: 0,
            cur: None,
            recvs: VecDeque::new(),
            completions: VecDeque::new(),
            unsignaled_done: 0,
            pending_writes: Default::default(),
            rx_retry: 0,
            failed: None,
            reads_active: Vec::new(),
            tx_frames: Vec::new(),
            trailers: Vec::new(),
            desc: None,
            next_token: 0,
            retx: VecDeque::new(),
            recovering: false,
            recover_until: 0,
            down_unheard: 0,
            staged: BTreeMap::new(),
            early: BTreeMap::new(),
            spare_spans: None,
            early_chunks: 0,
            staged_bytes: 0,
            retx_seen: HashSet::new(),
            hedges: 0,
            hedged_frames: 0,
            hedge_dups: 0,
            dead_pending: 0,
            last_tick: None,
        }
    }

    /// Writes may be placed ahead of their turn: relaxed placement, over several rails
    /// (one rail carries them in order, so none ever arrives early and nothing need be
    /// indexed for it).
    fn relaxed(&self) -> bool {
        self.cfg.relaxed_placement && self.rails.len() > 1
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.cfg
    }

    /// Number of rails (alive or not).
    pub fn rail_count(&self) -> usize {
        self.rails.len()
    }

    /// Operations posted and not yet completed.
    pub fn outstanding(&self) -> usize {
        self.ops.len()
    }

    /// True once the session has failed or been closed.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// Payload bytes of data frames sent on each rail so far.
    pub fn rail_data_sent(&self) -> Vec<u64> {
        self.rails.iter().map(|r| r.data_sent).collect()
    }

    /// How many of the peer's write chunks were placed ahead of their turn (relaxed
    /// placement, see [`SessionConfig::relaxed_placement`]).
    pub fn early_chunks(&self) -> u64 {
        self.early_chunks
    }

    /// The delivery rate observed on each rail, in bytes per second (0 while unknown).
    pub fn rail_rates(&self) -> Vec<f64> {
        self.rails.iter().map(|r| r.rate.rate()).collect()
    }

    /// The next completion, in order.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Unsignaled operations (see [`Session::post_with`]) that succeeded since the last
    /// call: they hold no completion, so the driver frees what it reserved for them.
    pub fn take_unsignaled_done(&mut self) -> u64 {
        std::mem::take(&mut self.unsignaled_done)
    }

    /// Number of completions waiting to be polled.
    pub fn pending_completions(&self) -> usize {
        self.completions.len()
    }

    /// Local close: queues a `Close` frame on every rail and flushes all operations with
    /// [`Status::Flushed`].
    pub fn close(&mut self) {
        if self.failed.is_none() {
            for r in self.rails.iter_mut().filter(|r| r.alive) {
                // Answers to what the peer asked and this side did go before the `Close`
                // (a busy poller holds them for its next request to carry): without them
                // the peer fails operations that took effect here.
                r.ctrl.retain(|h| answers_peer(h.opcode));
                r.ctrl.push_back(FrameHeader::new(Opcode::Close));
            }
        }
        self.fail(Status::Flushed);
    }

    /// Fails every outstanding operation and posted receive with `status`.
    pub fn fail(&mut self, status: Status) {
        if self.failed.is_some() {
            return;
        }
        self.failed = Some(status);
        self.tx_req.clear();
        self.tx_resp.clear();
        self.reads_active.clear();
        self.tx_frames.clear();
        self.trailers.clear();
        self.desc = None;
        self.retx.clear();
        self.staged.clear();
        self.staged_bytes = 0;
        self.early.clear();
        // A receive taken by a send still arriving is flushed like the others.
        if let Some(recv) = self.cur.take().and_then(|op| op.recv) {
            self.recvs.push_front(recv);
        }
        for r in &mut self.rails {
            // A side that closes still answers what it did (see `close`).
            let closing = r.ctrl.iter().any(|h| h.opcode == Opcode::Close);
            r.ctrl
                .retain(|h| h.opcode == Opcode::Close || (closing && answers_peer(h.opcode)));
        }
        self.pending_writes.clear();
        for op in self.ops.drain(..) {
            let (status, value) = op.done.unwrap_or((status, None));
            let c = op.completion(status, value, self.endpoint_id);
            self.completions.push_back(c);
        }
        for r in self.recvs.drain(..) {
            self.completions.push_back(Completion {
                wr_id: r.wr_id,
                kind: CompletionKind::Recv,
                status: Status::Flushed,
                byte_len: 0,
                imm: None,
                value: None,
                endpoint: self.endpoint_id,
            });
        }
    }
}

/// A frame handed to a rail and not yet acknowledged: enough to send it again elsewhere.
#[derive(Clone)]
enum Sent {
    /// Request `seq`; for chunks, the bytes `[off, off + len)` of the operation.
    Request { seq: u64, off: u64, len: u64 },
    /// The descriptor frame of vectored request `seq`.
    Descriptor { seq: u64 },
    /// A read-response chunk.
    Response {
        src: Arc<Spans>,
        copy: Option<(Arc<StagingBuf>, u64)>,
        seq: u64,
        total: u64,
        off: u64,
        len: u64,
    },
    /// A `Done` or `AtomicResponse`.
    Control(FrameHeader),
}

#[derive(Clone)]
struct LogEntry {
    /// Offset on the rail it was sent on, after the frame.
    end: u64,
    /// Where it was first sent: (rail, end offset there).
    orig: (usize, u64),
    frame: Sent,
}

/// A request that arrived ahead of its turn after a rail failure, with its payload.
struct Staged {
    h: FrameHeader,
    data: Arc<StagingBuf>,
}

/// What the payload being read on a rail belongs to.
enum RxPending {
    Request {
        len: u32,
    },
    ReadResponse {
        seq: u64,
        len: u32,
    },
    /// Payload being copied aside for a request that is not yet due.
    Staged(Staged),
    /// Payload of a frame that is dropped (a duplicate).
    Dropped {
        len: u32,
    },
    /// Payload of a write placed ahead of its turn (relaxed placement).
    Early {
        seq: u64,
        len: u32,
    },
    /// The scatter/gather list of a vectored request due now.
    Descriptor(Staged),
}

/// A payload to check against its header's CRC once placed: the header, the placement
/// pieces (address, length), and whether they are file pages (read without loads).
type CrcCheck = (FrameHeader, Vec<(usize, usize)>, bool);

fn sgl_pieces<T>(
    sgl: &[Sge],
    mut off: u64,
    mut len: u64,
    mk: impl Fn(*mut u8, usize) -> T,
) -> Pieces<T> {
    let mut out = Pieces::new();
    for s in sgl {
        if len == 0 {
            break;
        }
        let sl = s.len as u64;
        if off >= sl {
            off -= sl;
            continue;
        }
        let take = (sl - off).min(len);
        // SAFETY: within the entry, which was range-checked when it was made.
        out.push(mk(unsafe { s.ptr().add(off as usize) }, take as usize));
        len -= take;
        off = 0;
    }
    out
}

/// A receive posted here, waiting for the peer's send or write with immediate.
struct PostedRecv {
    wr_id: u64,
    local: SgeList,
    capacity: u64,
}

/// A control frame that tells the peer what became of its request (done, an atomic's old
/// value, express answers): sent even by a side that is closing.
fn answers_peer(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Done | Opcode::AtomicResponse | Opcode::ExpressAnswer
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::error::Status;
    use crate::mem::registry::Registry;

    use super::config::{MIN_CHUNK, MIN_WINDOW_BYTES};
    use super::testkit::Pair;
    use super::{ProtocolError, Request, Session, SessionConfig};

    #[test]
    fn new_sessions_keep_their_windows_consistent() {
        let cfg = SessionConfig {
            min_window: 1,
            initial_window: 0,
            max_window: 0,
            ..SessionConfig::default()
        };
        let s = Session::new(cfg, Arc::new(Registry::default()), 3, 9);
        let c = s.config();
        assert_eq!(c.min_window, 2 * MIN_CHUNK);
        assert_eq!(
            (c.initial_window, c.max_window),
            (MIN_WINDOW_BYTES, c.min_window)
        );
        assert_eq!(s.rail_count(), 3);
        assert!(!s.is_failed());
    }

    #[test]
    fn a_closing_side_still_sends_the_answers_it_owes() {
        let mut p = Pair::new(SessionConfig::default(), 1);
        let src = p.region(0, 4096, 7);
        let dst = p.region(1, 4096, 0);
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: dst.remote_key().key,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        // Side 1 executes the write; its `Done` waits in its control queue, unsent, when
        // it closes.
        while p.tx_one(0, 0) {}
        while p.rx_one(1, 0) {}
        assert_eq!(dst.to_vec(0, 4096).unwrap(), vec![7; 4096]);
        p.s[1].close();
        p.run();
        let got: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(got, [(1, Status::Success)]);
        assert!(
            p.errors[0]
                .iter()
                .any(|(_, e)| matches!(e, ProtocolError::PeerClosed)),
            "{:?}",
            p.errors[0]
        );
    }

    #[test]
    fn closing_flushes_everything_once_and_tells_the_peer() {
        let mut p = Pair::new(SessionConfig::default(), 2);
        let src = p.region(0, 1 << 20, 1);
        let dst = p.region(0, 4096, 0);
        let w = Request::Write {
            local: vec![src.as_sge()],
            rkey: 12345,
            addr: 0,
            imm: None,
        };
        p.post(0, 1, w);
        p.s[0].post_recv(2, vec![dst.as_sge()]).unwrap();
        p.s[0].close();
        assert!(p.s[0].is_failed());
        p.run();
        let mut got: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
        got.sort_unstable_by_key(|g| g.0);
        assert_eq!(got, [(1, Status::Flushed), (2, Status::Flushed)]);
        assert_eq!(p.s[0].outstanding(), 0);
        assert!(
            p.errors[1]
                .iter()
                .any(|(_, e)| matches!(e, ProtocolError::PeerClosed)),
            "{:?}",
            p.errors[1]
        );
        p.s[0].close();
        assert_eq!(
            p.s[0].pending_completions(),
            0,
            "a second close flushes nothing"
        );
    }
}
