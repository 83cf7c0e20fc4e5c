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

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::error::{Completion, CompletionKind, Status};
use crate::mem::file::{copy_maybe_fragile, crc32c_maybe_fragile, read_fragile};
use crate::mem::region::{Access, RegionPin, RemoteSge, Sge, sgl_is_fragile, sgl_len};
use crate::mem::registry::Registry;
use crate::proto::rate::RateEstimator;
use crate::proto::spans::{Spans, Trailer};
use crate::wire::frame::{FLAG_ACK_REQ, FLAG_EARLY, FLAG_IMM, FLAG_RETX, FLAG_TRAILER, HEADER_LEN};
use crate::wire::sgl::{MAX_REMOTE_SGE, WireSge};
use crate::wire::{FrameHeader, Opcode, WireStatus};

/// Tunables of a session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Largest payload of one chunk frame (default 1 MiB; smaller chunks cost more system
    /// calls per byte, see the benchmark notes in the README).
    pub chunk_size: usize,
    /// Most operations posted and not yet completed.
    pub max_outstanding: usize,
    /// Most receives posted and not yet consumed.
    pub max_recv: usize,
    /// Window of a rail whose rate is not known yet (default 1 MiB; at least `min_window`).
    /// A larger first burst overflowed a shaped link's queue: 2 MiB on a 250 Mbit/s rail lost
    /// packets at start and stalled that rail (and the writes waiting for it) for a 200 ms
    /// TCP retransmission timeout.
    pub initial_window: u64,
    /// Smallest window of a rail (default 1 MiB: above rate x delay up to ~2 Gbit/s, and
    /// more than a shaped 1 Gbit/s link queues). A rail's chunks are at most a quarter of its
    /// window, so lowering this (e.g. to 128 KiB) gives slow rails proportionally smaller
    /// windows and chunks when rails differ in speed.
    pub min_window: u64,
    /// Largest window of a rail.
    pub max_window: u64,
    /// Queueing delay each rail's window aims at (window = rate x delay; default 4 ms).
    /// Strict placement needs shallow windows: the target executes in order, so every rail
    /// waits behind the chunk a deeper queue holds back on another.
    pub target_delay: Duration,
    /// The same with [`SessionConfig::relaxed_placement`] (default 16 ms). Chunks placed on
    /// arrival wait for no other rail, so a deeper window costs no throughput, and it halves
    /// the acknowledgements and receiver wake-ups per byte (chunks are a quarter of the
    /// window): on 4 x 1 Gbit/s the receiver's CPU per GB fell by about a tenth, where strict
    /// placement with this depth lost a quarter of its throughput (README, "Goals").
    pub relaxed_target_delay: Duration,
    /// Unacknowledged received bytes on a rail after which an explicit acknowledgement is
    /// sent unasked (default 4 MiB). A backstop: the sending side asks for acknowledgements
    /// twice per window (`FLAG_ACK_REQ`), a rail that goes quiet is acknowledged at once, and
    /// every frame sent carries the acknowledgement too.
    pub ack_threshold: u64,
    /// Carry a CRC32C of every frame payload, checked before the operation completes.
    /// Negotiated at connection time: on when either side asks for it.
    pub payload_crc: bool,
    /// After a rail failure, most bytes of later requests that may be held in memory while an
    /// earlier request's retransmission is awaited (see the module docs).
    pub max_staged: u64,
    /// A rail that has sent nothing for this long sends a keepalive.
    pub keepalive_interval: Duration,
    /// A rail that has received nothing for this long (while not stalled by braid itself)
    /// is declared dead: the peer crashed, hangs, or the link is gone.
    pub peer_timeout: Duration,
    /// Relaxed placement (like verbs' `IBV_ACCESS_RELAXED_ORDERING`; default off). A write
    /// whose target range no earlier outstanding operation of this side touches (every
    /// earlier one is a write to the same key at a disjoint range) may be placed by the
    /// target as soon as its chunks arrive, ahead of the requests before it. Completions,
    /// reads, atomics and sends keep their order, and whatever is observed through them is
    /// unchanged; only a target that polls memory for a flag written after data may see the
    /// flag first. Lets rails of different speeds run at their own rates, where strict
    /// placement ties every rail to the slowest (it stalls them behind its chunk).
    pub relaxed_placement: bool,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            chunk_size: 1 << 20,
            max_outstanding: 1024,
            max_recv: 1024,
            initial_window: 1 << 20,
            min_window: 1 << 20,
            max_window: 32 << 20,
            target_delay: Duration::from_millis(4),
            relaxed_target_delay: Duration::from_millis(16),
            ack_threshold: 4 << 20,
            payload_crc: false,
            max_staged: 256 << 20,
            keepalive_interval: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(3),
            relaxed_placement: false,
        }
    }
}

/// A protocol violation by the peer. The driver closes the rail (and, in this version,
/// fails the endpoint) with this error logged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// A request for an operation that has already been executed.
    #[error("duplicate request {seq} (next expected {frontier})")]
    DuplicateRequest {
        /// Its sequence number.
        seq: u64,
        /// The next sequence number the target expects.
        frontier: u64,
    },
    /// A chunk that disagrees with earlier chunks of the same operation.
    #[error("chunk of request {seq} disagrees with its operation's first chunk")]
    InconsistentChunk {
        /// Its sequence number.
        seq: u64,
    },
    /// More bytes arrived for an operation than it has.
    #[error("operation {seq} received more than its {total} bytes")]
    Overrun {
        /// Its sequence number.
        seq: u64,
        /// Its length.
        total: u64,
    },
    /// A response for no outstanding operation, or for one of another kind.
    #[error("{opcode:?} response for unknown or mismatched operation {seq}")]
    UnknownOperation {
        /// Response kind.
        opcode: Opcode,
        /// The sequence number it names.
        seq: u64,
    },
    /// An unknown status code.
    #[error("unknown status code {0}")]
    BadStatus(u32),
    /// The peer acknowledged bytes never sent on the rail.
    #[error("rail acknowledgement {ack} beyond the {sent} bytes sent")]
    BadAck {
        /// What it acknowledged.
        ack: u64,
        /// What was sent.
        sent: u64,
    },
    /// A vectored request whose scatter/gather list disagrees with its header (entry count,
    /// total length, overflowing range), or a second descriptor for one operation.
    #[error("malformed scatter/gather list of vectored request {seq}")]
    BadDescriptor {
        /// Its sequence number.
        seq: u64,
    },
    /// The peer closed the endpoint.
    #[error("the peer closed the endpoint")]
    PeerClosed,
    /// The rail has been given up (by this side or the peer); stop using it.
    #[error("the rail has been given up")]
    RailGone,
    /// A payload's CRC32C did not match: the data was corrupted on the way.
    #[error(
        "payload of {opcode:?} {seq} failed its CRC32C check (sent {sent:#010x}, got {got:#010x})"
    )]
    Corrupt {
        /// Frame kind.
        opcode: Opcode,
        /// Its sequence number.
        seq: u64,
        /// CRC in the header.
        sent: u32,
        /// CRC of the bytes placed.
        got: u32,
    },
}

/// Why a post was refused; nothing was queued and no completion will come.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PostError {
    /// The outstanding-operation or receive limit is reached.
    #[error("{what} full (limit {limit})")]
    QueueFull {
        /// Which queue.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The session has failed or been closed.
    #[error("endpoint closed")]
    Closed,
    /// A local buffer lacks a right.
    #[error("local region lacks the {0} right")]
    MissingRight(&'static str),
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
}

/// What a posted operation asks for.
#[derive(Debug, Clone)]
pub enum Request {
    /// Write the local list to `rkey` at `addr`; with `imm`, also consume a receive at the target.
    Write {
        /// Local source.
        local: Vec<Sge>,
        /// Target region key.
        rkey: u64,
        /// Target offset.
        addr: u64,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Read `rkey` at `addr` into the local list (its total length is the read's length).
    Read {
        /// Local destination.
        local: Vec<Sge>,
        /// Target region key.
        rkey: u64,
        /// Target offset.
        addr: u64,
    },
    /// Fetch-and-add on the word at `rkey`/`addr`.
    FetchAdd {
        /// Target region key.
        rkey: u64,
        /// Target offset (8-byte aligned).
        addr: u64,
        /// Value added.
        add: u64,
    },
    /// Compare-and-swap on the word at `rkey`/`addr`.
    CompareSwap {
        /// Target region key.
        rkey: u64,
        /// Target offset (8-byte aligned).
        addr: u64,
        /// Expected value.
        compare: u64,
        /// New value if the word equals `compare`.
        swap: u64,
    },
    /// Send the local list into the peer's next posted receive.
    Send {
        /// Local source.
        local: Vec<Sge>,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Write the local list to the remote pieces, in order (the totals must be equal).
    WriteV {
        /// Local source.
        local: Vec<Sge>,
        /// Remote destination pieces (1 to 1024).
        remote: Vec<RemoteSge>,
    },
    /// Read the remote pieces, in order, into the local list (the totals must be equal).
    ReadV {
        /// Local destination.
        local: Vec<Sge>,
        /// Remote source pieces (1 to 1024).
        remote: Vec<RemoteSge>,
    },
}

/// An operation posted here and not yet completed.
struct OutOp {
    seq: u64,
    wr_id: u64,
    kind: CompletionKind,
    opcode: Opcode,
    local: Arc<[Sge]>,
    rkey: u64,
    addr: u64,
    arg0: u64,
    arg1: u64,
    imm: Option<u32>,
    total: u64,
    /// Read: response bytes placed so far.
    received: u64,
    done: Option<(Status, Option<u64>)>,
    /// A write the target may place ahead of its turn (see `SessionConfig::relaxed_placement`).
    early: bool,
    /// Vectored operations: the encoded remote scatter/gather list (the descriptor payload).
    desc: Option<Arc<[u8]>>,
    /// Writes: the remote ranges `(key, start, end)` it writes (to tell whether a later
    /// write commutes with it; see `SessionConfig::relaxed_placement`).
    ranges: Vec<(u64, u64, u64)>,
    /// The key and bounding interval of `ranges` when they name one key.
    bounds: Option<(u64, u64, u64)>,
    /// Read: the target serves it from file pages and ends it with a trailing `Done`.
    expect_trailer: bool,
    /// Read: the status the trailing `Done` carried.
    trailer: Option<Status>,
    /// A failure found on the way (a local file page gone while sending or placing, or a
    /// response chunk flagged by the target); the completion reports it.
    fault: Option<Status>,
}

impl OutOp {
    fn completion(&self, status: Status, value: Option<u64>, endpoint: u64) -> Completion {
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

/// Transmit cursor over the requests whose frames are not all handed to rails yet.
struct ReqCursor {
    seq: u64,
    next_off: u64,
    /// Vectored operations: the descriptor frame has been handed out.
    desc_sent: bool,
}

/// Transmit cursor over a read response being sent from pinned regions.
/// The bytes each rail has carried of the operation that alone has data left to send:
/// such an operation is spread over every live rail in shares proportional to their windows,
/// so that it finishes on all rails at about the same time.
struct LoneOp {
    /// (is a read response, seq).
    key: (bool, u64),
    sent: Vec<u64>,
}

struct RespCursor {
    seq: u64,
    src: Arc<Spans>,
    total: u64,
    next_off: u64,
    /// A private copy of the bytes from offset `.1` on, taken when a later request wanted to
    /// modify them before they were sent.
    copy: Option<(Arc<StagingBuf>, u64)>,
}

/// A read response some of whose bytes are still read from the region: chunks not handed
/// out yet, frames being written, and frames logged for retransmission until acknowledged.
/// The read must return the memory as it was when the read executed, not as a later request
/// left it, so a request that modifies those bytes first has them copied aside (see
/// `Session::read_conflict`); it waits only for frames being written.
struct ReadGuard {
    seq: u64,
    /// Address ranges `[start, end)` the read sends from.
    ranges: Vec<(usize, usize)>,
    /// Frames handed out from the region and not yet reported written.
    frames: u32,
    /// Every chunk has been handed out.
    assigned: bool,
    /// Frames sent from the region and still logged (on a rail or awaiting retransmission).
    logged: u32,
}

struct PostedRecv {
    wr_id: u64,
    local: Arc<[Sge]>,
    capacity: u64,
}

/// A frame handed to a rail and not yet acknowledged: enough to send it again elsewhere.
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

/// A write of the peer placed (in part) ahead of its turn: what its first early chunk
/// established, so that the chunks agree and its execution uses the same access check.
struct EarlyOp {
    rkey: u64,
    addr: u64,
    total: u64,
    imm: Option<u32>,
    status: WireStatus,
    /// The destination; `None` when the access check failed (payload is discarded).
    dest: Option<Arc<Spans>>,
    /// Payload bytes placed completely.
    received: u64,
    /// A vectored write (its descriptor arrived early; its chunks are `WriteVData`).
    vectored: bool,
}

/// The peer's request currently being executed here (always request number `frontier`).
struct TargetOp {
    seq: u64,
    opcode: Opcode,
    rkey: u64,
    addr: u64,
    total: u64,
    imm: Option<u32>,
    received: u64,
    status: WireStatus,
    /// Where the payload goes; `None` when the op failed its checks and payload is discarded.
    dest: Option<Dest>,
    /// A receive consumed by a send or write-with-immediate.
    recv: Option<PostedRecv>,
    /// A file page of the destination could not be written (truncated under the operation).
    faulted: bool,
}

enum Dest {
    Region(Arc<Spans>),
    Recv,
}

/// A vectored request whose descriptor has arrived and waits for its turn to execute.
struct PendingDesc {
    h: FrameHeader,
    entries: Vec<WireSge>,
    /// Where it arrived (its `Done` goes there, if the rail is still alive).
    rail: usize,
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

/// Per-rail state.
struct RailState {
    alive: bool,
    /// Control frames queued on this rail; they go before data.
    ctrl: VecDeque<FrameHeader>,
    /// Bytes handed to the driver for this rail.
    tx_bytes: u64,
    /// Bytes of this rail the peer has consumed.
    acked: u64,
    /// Bytes consumed from this rail.
    rx_bytes: u64,
    /// Last `rx_bytes` told to the peer.
    rx_advertised: u64,
    /// Payload bytes of data frames sent on this rail (statistics).
    data_sent: u64,
    rate: RateEstimator,
    stalled: bool,
    rx_pending: Option<RxPending>,
    /// Keeps the memory of the pending payload's placement alive until `payload_done`,
    /// whatever happens to its operation meanwhile (failure, a duplicated chunk).
    rx_keep: Option<Keep>,
    /// When the rail last received a frame / handed out a frame (set on the first tick).
    last_rx: Option<Instant>,
    last_tx: Option<Instant>,
    /// With payload CRCs: the frame whose payload is being placed, and where it goes.
    crc_check: Option<CrcCheck>,
    /// Frames sent and not yet acknowledged.
    log: VecDeque<LogEntry>,
    /// For a dead rail: how much of it this side had consumed when it died.
    dead_consumed: Option<u64>,
    /// A re-established rail whose first frame (`RailRestore`) has not arrived yet.
    awaiting_restore: bool,
    /// The retransmission whose payload is being read, by original (rail, end).
    rx_retx: Option<(usize, u64)>,
    /// Delivery rate reported by the driver (bytes per second; 0 = unknown).
    capacity: f64,
    /// The frame being received asked for an acknowledgement once consumed.
    ack_after_payload: bool,
    /// Sent-byte position at which the next frame asks for an acknowledgement.
    next_ack_req: u64,
}

impl RailState {
    fn new() -> RailState {
        RailState {
            alive: true,
            ctrl: VecDeque::new(),
            tx_bytes: 0,
            acked: 0,
            rx_bytes: 0,
            rx_advertised: 0,
            data_sent: 0,
            rate: RateEstimator::default(),
            stalled: false,
            rx_pending: None,
            rx_keep: None,
            last_rx: None,
            last_tx: None,
            crc_check: None,
            log: VecDeque::new(),
            dead_consumed: None,
            awaiting_restore: false,
            rx_retx: None,
            capacity: 0.0,
            ack_after_payload: false,
            next_ack_req: 0,
        }
    }

    fn inflight(&self) -> u64 {
        self.tx_bytes - self.acked
    }
}

/// A payload to check against its header's CRC once placed: the header, the placement
/// pieces (address, length), and whether they are file pages (read without loads).
type CrcCheck = (FrameHeader, Vec<(usize, usize)>, bool);

/// Memory the driver must keep alive while it writes a frame's payload.
#[derive(Clone)]
#[allow(dead_code)] // held only for its Drop
enum Keep {
    Regions(Arc<[Sge]>),
    Pin(RegionPin),
    Spans(Arc<Spans>),
    Staging(Arc<StagingBuf>),
    Bytes(Arc<[u8]>),
}

impl Keep {
    /// The memory is file pages, which only system calls may touch.
    fn fragile(&self) -> bool {
        match self {
            Keep::Regions(sgl) => sgl_is_fragile(sgl),
            Keep::Pin(pin) => pin.is_file(),
            Keep::Spans(s) => s.fragile(),
            Keep::Staging(_) | Keep::Bytes(_) => false,
        }
    }
}

/// Heap memory for a staged payload, written through raw pointers by the driver.
struct StagingBuf {
    ptr: *mut u8,
    len: usize,
    /// A copy of file pages that could not all be read (truncated): the bytes are not what
    /// the operation saw, and the frames sent from it say so.
    faulted: bool,
}

// SAFETY: plain heap memory; access goes through raw pointers under the session's protocol.
unsafe impl Send for StagingBuf {}
// SAFETY: as above.
unsafe impl Sync for StagingBuf {}

impl StagingBuf {
    fn new(len: usize) -> Arc<StagingBuf> {
        let b = vec![0u8; len].into_boxed_slice();
        let len = b.len();
        Arc::new(StagingBuf {
            ptr: Box::into_raw(b).cast(),
            len,
            faulted: false,
        })
    }

    /// A copy of the bytes `[off, off + len)` of `src`; `faulted` when file pages were gone.
    fn copy_of(src: &Spans, off: u64, len: u64) -> Arc<StagingBuf> {
        let mut b = vec![0u8; len as usize].into_boxed_slice();
        // SAFETY: the buffer has `len` bytes and is not part of any region.
        let ok = unsafe { src.copy_out(off, len, b.as_mut_ptr()) };
        let len = b.len();
        Arc::new(StagingBuf {
            ptr: Box::into_raw(b).cast(),
            len,
            faulted: !ok,
        })
    }

    /// # Safety
    /// No write to the buffer may be in progress.
    unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len came from a boxed slice that lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        // SAFETY: reconstructs the box leaked in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

/// A frame ready for one rail: header bytes then payload read straight from registered memory.
pub struct Transmit {
    /// The encoded header.
    pub header: [u8; HEADER_LEN],
    /// Payload pieces, in order, as (pointer, length).
    pub payload: Vec<(*const u8, usize)>,
    /// For a read-response chunk the session tracks (sent straight from the target's region,
    /// or of a read served from file pages): a token the driver hands back to
    /// [`Session::transmitted`] once the frame is completely written.
    pub read_response: Option<u64>,
    _keep: Option<Keep>,
}

// SAFETY: the pointers refer to registered memory kept alive by `_keep`.
unsafe impl Send for Transmit {}

impl Transmit {
    /// Total bytes of the frame.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.iter().map(|p| p.1).sum::<usize>()
    }

    /// Never true: a frame has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// Where an incoming payload goes: memory pieces in order, kept alive by the session
/// until [`Session::payload_done`].
pub struct Placement {
    /// Destination pieces, as (pointer, length).
    pub iov: Vec<(*mut u8, usize)>,
    /// The pieces are file pages, which a truncation can take away: the driver must not
    /// store into them from user space (a `SIGBUS`), only with system calls, and reports a
    /// failed one ( `EFAULT`) with [`Session::payload_fault`].
    pub fragile: bool,
}

// SAFETY: the pointers refer to registered memory pinned by the session.
unsafe impl Send for Placement {}

/// What the driver must do with the frame it just offered.
pub enum RxAction {
    /// Handled; no payload follows.
    Done,
    /// Read the payload into these places, then call [`Session::payload_done`].
    Place(Placement),
    /// Read the payload and drop it, then call [`Session::payload_done`].
    Discard,
    /// Not executable yet: keep the header, stop reading this rail, and offer the same
    /// header again when [`Session::take_rx_retry`] names the rail.
    Stall,
}

/// The per-endpoint protocol state machine (see the module documentation).
pub struct Session {
    cfg: SessionConfig,
    registry: Arc<Registry>,
    endpoint_id: u64,
    rails: Vec<RailState>,
    next_seq: u64,
    ops: VecDeque<OutOp>,
    tx_req: VecDeque<ReqCursor>,
    tx_resp: VecDeque<RespCursor>,
    /// Alternates data frames between requests and responses.
    prefer_resp: bool,
    /// Shares of the operation that alone has data left to send.
    lone: Option<LoneOp>,
    frontier: u64,
    cur: Option<TargetOp>,
    recvs: VecDeque<PostedRecv>,
    completions: VecDeque<Completion>,
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
    /// A rail has been lost: requests ahead of their turn are staged instead of stalling.
    recovering: bool,
    staged: BTreeMap<u64, VecDeque<Staged>>,
    /// Writes placed (in part) ahead of their turn, by sequence number.
    early: BTreeMap<u64, EarlyOp>,
    /// Chunks placed ahead of their turn so far (statistics).
    early_chunks: u64,
    staged_bytes: u64,
    /// Retransmissions already applied, by original (rail, end).
    retx_seen: HashSet<(usize, u64)>,
    /// Rails that died and whose sockets the driver must close (a bit per rail).
    dead_pending: u64,
    /// When [`Session::on_tick`] last ran.
    last_tick: Option<Instant>,
}

/// A read-response frame the driver is writing.
struct TxFrame {
    /// Token given to the driver.
    token: u64,
    /// The read.
    seq: u64,
    rail: usize,
    /// Sent from the region itself (holds the read's guard).
    guard: bool,
    /// Counts for the read's trailer.
    trailer: bool,
}

/// Most writes placed ahead of their turn at once, and how far ahead of the next request to
/// execute; beyond either the rail stalls as under strict placement.
const EARLY_MAX_OPS: usize = 1024;
const EARLY_MAX_AHEAD: u64 = 1 << 16;

/// Smallest chunk a slow rail is given (see `Session::chunk_for`).
const MIN_CHUNK: u64 = 64 << 10;

/// Unacknowledged bytes that make an idle receiver acknowledge (see `Session::on_rx_idle`);
/// windows are never smaller than four times this.
const IDLE_ACK_MIN: u64 = 16 << 10;

/// A frame to send: header, payload pieces, memory to keep alive, and what to log.
type Frame = (
    FrameHeader,
    Vec<(*const u8, usize)>,
    Option<Keep>,
    Option<Sent>,
);

fn response_frame(
    src: &Arc<Spans>,
    copy: &Option<(Arc<StagingBuf>, u64)>,
    seq: u64,
    total: u64,
    off: u64,
    len: u64,
) -> (FrameHeader, Vec<(*const u8, usize)>, Option<Keep>) {
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
                vec![(ptr, len as usize)],
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

/// A logged frame of read `seq` sent from the region is acknowledged, or now has a private
/// copy: its guard lets go of it (and goes once nothing else holds it).
fn unlog_response(guards: &mut Vec<ReadGuard>, seq: u64) {
    if let Some(i) = guards.iter().position(|g| g.seq == seq) {
        let g = &mut guards[i];
        g.logged = g.logged.saturating_sub(1);
        if g.frames == 0 && g.assigned && g.logged == 0 {
            guards.swap_remove(i);
        }
    }
}

/// The key and bounding interval of ranges `(key, start, end)` that all name one key.
fn bounds(ranges: &[(u64, u64, u64)]) -> Option<(u64, u64, u64)> {
    let (&(key, mut start, mut end), rest) = ranges.split_first()?;
    for &(k, s, e) in rest {
        if k != key {
            return None;
        }
        (start, end) = (start.min(s), end.max(e));
    }
    Some((key, start, end))
}

/// A write's remote ranges `(key, start, end)`, sorted, to test others against them in
/// logarithmic time.
struct Disjoint {
    /// Sorted by (key, start), with the largest end so far within the key.
    sorted: Vec<(u64, u64, u64)>,
}

impl Disjoint {
    fn new(ranges: &[(u64, u64, u64)]) -> Disjoint {
        let mut sorted = ranges.to_vec();
        sorted.sort_unstable();
        for i in 1..sorted.len() {
            if sorted[i].0 == sorted[i - 1].0 {
                sorted[i].2 = sorted[i].2.max(sorted[i - 1].2);
            }
        }
        Disjoint { sorted }
    }

    /// True when these ranges are all of one key, `(key, start, end)` names it too, and
    /// overlaps none of them (ranges of two keys may alias: never disjoint).
    fn misses(&self, &(key, start, end): &(u64, u64, u64)) -> bool {
        let (Some(first), Some(last)) = (self.sorted.first(), self.sorted.last()) else {
            return true;
        };
        if first.0 != key || last.0 != key {
            return false;
        }
        let same_key = 0;
        // The ranges of this key that start before `end`; the last holds their largest end.
        let before_end = self.sorted.partition_point(|r| (r.0, r.1) < (key, end));
        before_end == same_key || self.sorted[before_end - 1].2 <= start
    }
}

/// The checks of a vectored post: 1 to [`MAX_REMOTE_SGE`] remote pieces of at least one
/// byte each, none overflowing, totalling the local list's length.
fn check_vectored(local: &[Sge], remote: &[RemoteSge]) -> Result<(), PostError> {
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

fn encode_remote(remote: &[RemoteSge]) -> Arc<[u8]> {
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

fn wire_status(st: WireStatus) -> Status {
    match st {
        WireStatus::Ok => Status::Success,
        WireStatus::RemoteAccess => Status::RemoteAccessError,
        WireStatus::RemoteInvalidRequest => Status::RemoteInvalidRequest,
    }
}

/// The scatter/gather list of a descriptor whose payload has arrived.
fn parse_descriptor(st: Staged, rail: usize) -> Result<PendingDesc, ProtocolError> {
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

fn sgl_pieces<T>(
    sgl: &[Sge],
    mut off: u64,
    mut len: u64,
    mk: impl Fn(*mut u8, usize) -> T,
) -> Vec<T> {
    let mut out = Vec::new();
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
        cfg.initial_window = cfg.initial_window.max(cfg.min_window);
        cfg.max_window = cfg.max_window.max(cfg.min_window);
        Session {
            cfg,
            registry,
            endpoint_id,
            rails: (0..rails).map(|_| RailState::new()).collect(),
            next_seq: 0,
            ops: VecDeque::new(),
            tx_req: VecDeque::new(),
            tx_resp: VecDeque::new(),
            prefer_resp: false,
            lone: None,
            frontier: 0,
            cur: None,
            recvs: VecDeque::new(),
            completions: VecDeque::new(),
            rx_retry: 0,
            failed: None,
            reads_active: Vec::new(),
            tx_frames: Vec::new(),
            trailers: Vec::new(),
            desc: None,
            next_token: 0,
            retx: VecDeque::new(),
            recovering: false,
            staged: BTreeMap::new(),
            early: BTreeMap::new(),
            early_chunks: 0,
            staged_bytes: 0,
            retx_seen: HashSet::new(),
            dead_pending: 0,
            last_tick: None,
        }
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

    // ---------------------------------------------------------------- initiator side

    /// Queues an operation. On success exactly one completion for `wr_id` will follow.
    pub fn post(&mut self, wr_id: u64, req: Request) -> Result<u64, PostError> {
        if self.failed.is_some() {
            return Err(PostError::Closed);
        }
        if self.ops.len() >= self.cfg.max_outstanding {
            return Err(PostError::QueueFull {
                what: "outstanding operations",
                limit: self.cfg.max_outstanding,
            });
        }
        let seq = self.next_seq;
        let mut op = OutOp {
            seq,
            wr_id,
            kind: CompletionKind::Write,
            opcode: Opcode::Write,
            local: Arc::from([]),
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
            ranges: Vec::new(),
            bounds: None,
            expect_trailer: false,
            trailer: None,
            fault: None,
        };
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
            op.ranges = vec![(op.rkey, op.addr, op.addr + op.total)];
        }
        if self.cfg.relaxed_placement
            && matches!(op.opcode, Opcode::Write | Opcode::WriteV)
            && op.total > 0
        {
            // Completed operations have executed at the target; every other earlier one must
            // commute with this write: a write to this write's keys at disjoint ranges
            // (another key may name the same memory). Past a budget of ranges, assume not.
            // Bounding intervals settle the usual case (separate slots) without looking at
            // the pieces.
            op.bounds = bounds(&op.ranges);
            let bounds = op.bounds;
            let mut mine: Option<Disjoint> = None;
            let mut budget: usize = 1 << 16;
            op.early = bounds.is_some()
                && self.ops.iter().all(|o| {
                    if o.done.is_some() {
                        return true;
                    }
                    if !matches!(o.opcode, Opcode::Write | Opcode::WriteV) {
                        return false;
                    }
                    match (bounds, o.bounds) {
                        (Some((k, s, e)), Some((k2, s2, e2))) if k == k2 => {
                            if e <= s2 || e2 <= s {
                                return true;
                            }
                        }
                        _ => return false,
                    }
                    budget = budget.saturating_sub(o.ranges.len());
                    let mine = mine.get_or_insert_with(|| Disjoint::new(&op.ranges));
                    budget > 0 && o.ranges.iter().all(|r| mine.misses(r))
                });
        }
        self.next_seq += 1;
        self.ops.push_back(op);
        self.tx_req.push_back(ReqCursor {
            seq,
            next_off: 0,
            desc_sent: false,
        });
        Ok(seq)
    }

    /// Posts a receive buffer for the peer's next send (or write-with-immediate).
    pub fn post_recv(&mut self, wr_id: u64, local: Vec<Sge>) -> Result<(), PostError> {
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
        let capacity = sgl_len(&local);
        self.recvs.push_back(PostedRecv {
            wr_id,
            local: local.into(),
            capacity,
        });
        // A rail, or a staged send, may be waiting for a receive.
        self.retry_stalled();
        self.run_due();
        Ok(())
    }

    fn op_index(&self, seq: u64) -> Option<usize> {
        let first = self.ops.front()?.seq;
        let i = seq.checked_sub(first)? as usize;
        (i < self.ops.len()).then_some(i)
    }

    fn window(&self, rail: usize) -> u64 {
        let r = &self.rails[rail];
        // The kernel's view of the connection's delivery rate, when the driver reports it, is
        // not distorted by braid's own stalls; acknowledgement timing is the fallback.
        let rate = if r.capacity > 0.0 {
            r.capacity
        } else {
            r.rate.rate()
        };
        match rate {
            x if x <= 0.0 => self.cfg.initial_window,
            rate => ((rate * self.target_delay().as_secs_f64()) as u64)
                .clamp(self.cfg.min_window, self.cfg.max_window),
        }
    }

    /// The queueing delay windows aim at (see [`SessionConfig::relaxed_target_delay`]).
    fn target_delay(&self) -> Duration {
        if self.cfg.relaxed_placement {
            self.cfg.relaxed_target_delay
        } else {
            self.cfg.target_delay
        }
    }

    /// Largest chunk for `rail`: a quarter of its window, so that four chunks are in flight;
    /// a slow rail takes small chunks instead of holding up an operation with a large one.
    /// The target executes chunks in order, so a chunk is also how long the other rails may
    /// wait behind this one: at 1 Gbit/s (1 MiB window) 256 KiB chunks kept four rails at
    /// 478 MB/s where 512 KiB chunks (half the window) gave 454 and 1 MiB chunks 394-478
    /// (`braid bench write -s 4190211 -D 5 -q 8 [--chunk 256K] [--min-window 1M]` on
    /// `braid testbed up --rails 4`, README "Goals").
    fn chunk_for(&self, rail: usize) -> u64 {
        let max = self.cfg.chunk_size as u64;
        (self.window(rail) / 4).clamp(MIN_CHUNK.min(max), max)
    }

    /// The operation that alone has data left to send, as (is a read response, seq, total).
    fn lone_op(&self) -> Option<(bool, u64, u64)> {
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
    fn lone_share_left(&self, rail: usize) -> Option<u64> {
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
    fn leaves_lone_share(&self, rail: usize) -> bool {
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
    fn note_lone_sent(&mut self, rail: usize, resp: bool, seq: u64, len: u64) {
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

    /// The delivery rate the transport measures for `rail` (bytes per second; e.g. Linux's
    /// `tcpi_delivery_rate`), reported by the driver from time to time.
    pub fn set_rail_capacity(&mut self, rail: usize, bytes_per_sec: f64) {
        if bytes_per_sec <= 0.0 || !bytes_per_sec.is_finite() {
            return;
        }
        let r = &mut self.rails[rail];
        // Smoothed: single samples swing with token-bucket bursts and idle periods.
        r.capacity = if r.capacity <= 0.0 {
            bytes_per_sec
        } else {
            0.8 * r.capacity + 0.2 * bytes_per_sec
        };
    }

    fn data_allowed(&self, rail: usize) -> bool {
        self.rails[rail].inflight() < self.window(rail)
    }

    /// True when [`Session::poll_transmit`] would return a frame for `rail`.
    pub fn wants_transmit(&self, rail: usize) -> bool {
        let r = &self.rails[rail];
        r.alive
            && (!r.ctrl.is_empty()
                || (!self.retx.is_empty() && self.data_allowed(rail))
                || ((!self.tx_req.is_empty() || !self.tx_resp.is_empty())
                    && self.data_allowed(rail)
                    && !self.leaves_lone_share(rail)))
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
                (h, Vec::new(), None, logged)
            } else if !self.retx.is_empty() && self.data_allowed(rail) {
                let (frame, e) = self.next_retransmission()?;
                orig = Some(e.orig);
                frame
            } else if (!self.tx_req.is_empty() || !self.tx_resp.is_empty())
                && self.data_allowed(rail)
                && !self.leaves_lone_share(rail)
            {
                let resp_first = self.prefer_resp || self.tx_req.is_empty();
                self.prefer_resp = !self.prefer_resp;
                let lone = self.lone_op();
                // A rail past its share goes on only when no other rail can take the rest.
                let share = self.lone_share_left(rail).filter(|&left| left > 0);
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
                payload = vec![(buf.ptr as *const u8, total)];
                keep = Some(Keep::Staging(buf));
            }
            let mut crc = 0;
            for &(p, l) in &payload {
                // SAFETY: the pieces point into memory kept alive by `keep` (never file
                // pages: those were copied just above).
                crc = crc32c::crc32c_append(crc, unsafe { std::slice::from_raw_parts(p, l) });
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
            r.log.push_back(LogEntry {
                end,
                orig: orig.unwrap_or((rail, end)),
                frame,
            });
        }
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

    fn next_request_frame(&mut self, max_len: u64) -> Frame {
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
    fn descriptor_frame(&self, i: usize) -> (FrameHeader, Vec<(*const u8, usize)>, Option<Keep>) {
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
            vec![(desc.as_ptr(), desc.len())],
            Some(Keep::Bytes(desc)),
        )
    }

    /// The frame of operation `ops[i]` starting at byte `off`, and its payload length.
    fn request_frame(
        &self,
        i: usize,
        off: u64,
        max_len: u64,
    ) -> (FrameHeader, Vec<(*const u8, usize)>, Option<Keep>, u64) {
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
            return (h, Vec::new(), None, 0);
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

    /// The next frame of a dead rail still worth sending, with its log entry.
    fn next_retransmission(&mut self) -> Option<(Frame, LogEntry)> {
        while let Some(e) = self.retx.pop_front() {
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
                Sent::Control(h) => (*h, Vec::new(), None, Some(Sent::Control(*h))),
            };
            return Some((frame, e));
        }
        None
    }

    fn next_response_chunk(&mut self, max_len: u64) -> Frame {
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
    fn tx_frame_gone(&mut self, f: &TxFrame) {
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
    fn note_tx_fault(&mut self, h: &mut FrameHeader, before: bool) {
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

    /// One frame of read `seq` no longer reads the region; true when a request waiting for
    /// the read's frames may go ahead.
    fn frame_written(&mut self, seq: u64) -> bool {
        let Some(i) = self.reads_active.iter().position(|g| g.seq == seq) else {
            return false;
        };
        let g = &mut self.reads_active[i];
        g.frames = g.frames.saturating_sub(1);
        let released = g.frames == 0 && g.assigned;
        if released && g.logged == 0 {
            self.reads_active.swap_remove(i);
        }
        released
    }

    /// Takes a private copy of every logged response frame of read `seq` that is still sent
    /// from the region and overlaps the region bytes `[start, end)`, so that a
    /// retransmission sends the bytes the read saw. Returns how many it copied.
    fn copy_logged_responses(&mut self, seq: u64, start: usize, end: usize) -> u32 {
        let mut n = 0;
        let logs = self.rails.iter_mut().flat_map(|r| r.log.iter_mut());
        for e in logs.chain(self.retx.iter_mut()) {
            let Sent::Response {
                src,
                copy: copy @ None,
                seq: s,
                off,
                len,
                ..
            } = &mut e.frame
            else {
                continue;
            };
            if *s != seq || !src.overlaps(*off, *len, start, end) {
                continue;
            }
            // The source is unchanged since the read executed (every overlapping request
            // comes here first).
            *copy = Some((StagingBuf::copy_of(src, *off, *len), *off));
            n += 1;
        }
        n
    }

    /// A request wants to modify `[start, end)`. Read responses that would still read those
    /// bytes from the region take a private copy of what they have not handed out yet, and
    /// of the logged frames a retransmission would send, so the request can go ahead; it
    /// waits (true) only for frames already handed to the driver, which need no
    /// acknowledgement to finish.
    fn read_conflict(&mut self, ranges: &[(usize, usize)]) -> bool {
        let mut wait = false;
        let mut i = 0;
        while i < self.reads_active.len() {
            let (seq, assigned, logged) = {
                let g = &self.reads_active[i];
                (g.seq, g.assigned, g.logged)
            };
            let hit = ranges.iter().copied().find(|&(start, end)| {
                self.reads_active[i]
                    .ranges
                    .iter()
                    .any(|&(gs, ge)| start < ge && gs < end)
            });
            let Some((start, end)) = hit else {
                i += 1;
                continue;
            };
            if !assigned
                && let Some(c) = self
                    .tx_resp
                    .iter_mut()
                    .find(|c| c.seq == seq && c.copy.is_none())
            {
                let buf = StagingBuf::copy_of(&c.src, c.next_off, c.total - c.next_off);
                c.copy = Some((buf, c.next_off));
            }
            if logged > 0 {
                let mut n = self.copy_logged_responses(seq, start, end);
                for &(s2, e2) in ranges {
                    if (s2, e2) != (start, end) {
                        n += self.copy_logged_responses(seq, s2, e2);
                    }
                }
                self.reads_active[i].logged -= n;
            }
            let g = &mut self.reads_active[i];
            g.assigned = true;
            wait |= g.frames > 0;
            if g.frames == 0 && g.logged == 0 {
                self.reads_active.swap_remove(i);
            } else {
                i += 1;
            }
        }
        wait
    }

    fn complete_out(&mut self, i: usize, status: Status, value: Option<u64>) {
        // A failure found on the way wins over a remote success; a local file fault over
        // anything the peer said.
        let status = match self.ops[i].fault {
            Some(Status::LocalAccessError) => Status::LocalAccessError,
            Some(f) if status.is_ok() => f,
            _ => status,
        };
        self.ops[i].done = Some((status, value));
        while self.ops.front().is_some_and(|o| o.done.is_some()) {
            let op = self.ops.pop_front().expect("front exists");
            let (status, value) = op.done.expect("checked");
            let c = op.completion(status, value, self.endpoint_id);
            self.completions.push_back(c);
        }
    }

    // ---------------------------------------------------------------- receive side

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
            if orig_rail >= self.rails.len() || orig_rail == rail {
                return Err(ProtocolError::UnknownOperation {
                    opcode: h.opcode,
                    seq: h.seq,
                });
            }
            // The peer gave the rail up: so do we, freezing how much of it we consumed.
            self.rail_down(orig_rail);
            let consumed = self.rails[orig_rail].dead_consumed.unwrap_or(0);
            if orig_end <= consumed || self.retx_seen.contains(&(orig_rail, orig_end)) {
                // Already received on the dead rail (or already retransmitted): drop it.
                self.consumed(rail, HEADER_LEN as u64);
                if h.payload_len > 0 {
                    self.rails[rail].rx_pending = Some(RxPending::Dropped { len: h.payload_len });
                    self.rails[rail].crc_check = None;
                    return Ok(RxAction::Discard);
                }
                return Ok(RxAction::Done);
            }
            // An earlier copy of the same frame is still being read on another rail: the peer
            // resent it again because it gave that rail up too, which we may not know yet.
            // Wait until that copy is complete (then this one is a duplicate) or its rail
            // dies (then this one counts).
            if self
                .rails
                .iter()
                .any(|r| r.alive && r.rx_retx == Some((orig_rail, orig_end)))
            {
                self.rails[rail].stalled = true;
                return Ok(RxAction::Stall);
            }
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

    /// Queues a `RailAck` unless a control frame (which carries the acknowledgement too) is
    /// already waiting.
    fn ack_now(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        if r.rx_bytes > r.rx_advertised && r.ctrl.is_empty() {
            r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        }
    }

    fn consumed(&mut self, rail: usize, n: u64) {
        let r = &mut self.rails[rail];
        r.rx_bytes += n;
        if r.rx_bytes - r.rx_advertised >= self.cfg.ack_threshold && r.ctrl.is_empty() {
            r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        }
    }

    fn on_request(&mut self, rail: usize, h: &FrameHeader) -> Result<RxAction, ProtocolError> {
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
                let iov = vec![(data.ptr, data.len)];
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
                        let dest = Spans::single(pin, h.addr, h.arg0);
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

    /// After a rail loss, a request that cannot execute yet is copied aside (within
    /// `max_staged`) instead of stalling its rail, which may carry what it waits for.
    fn stage_incoming(&mut self, rail: usize, h: &FrameHeader) -> Option<RxAction> {
        if !self.recovering || self.staged_bytes + h.payload_len as u64 > self.cfg.max_staged {
            return None;
        }
        let data = StagingBuf::new(h.payload_len as usize);
        if h.payload_len == 0 {
            self.stage(Staged { h: *h, data });
            return Some(RxAction::Done);
        }
        self.staged_bytes += h.payload_len as u64;
        let iov = vec![(data.ptr, data.len)];
        self.rails[rail].rx_keep = Some(Keep::Staging(data.clone()));
        self.rails[rail].rx_pending = Some(RxPending::Staged(Staged { h: *h, data }));
        Some(RxAction::Place(Placement {
            iov,
            fragile: false,
        }))
    }

    /// A write chunk the initiator allows ahead of its turn: checked as its execution will
    /// be, then placed (or discarded, when the check fails) at once. A vectored write's chunk
    /// waits (stalls its rail) until the write's descriptor has arrived.
    fn place_early(&mut self, rail: usize, h: &FrameHeader) -> Result<RxAction, ProtocolError> {
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
                    Ok(pin) => (WireStatus::Ok, Some(Spans::single(pin, h.addr, h.arg0))),
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
    fn accept_early_descriptor(
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
        let iov = vec![(data.ptr, data.len)];
        self.rails[rail].rx_keep = Some(Keep::Staging(data.clone()));
        self.rails[rail].rx_pending = Some(RxPending::Descriptor(Staged { h: *h, data }));
        Ok(RxAction::Place(Placement {
            iov,
            fragile: false,
        }))
    }

    /// A vectored write's list arrived ahead of its turn: every piece is checked now, and
    /// its chunks (some may be waiting) are placed as they come.
    fn early_descriptor(&mut self, d: PendingDesc) {
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
    fn start_early(&mut self, seq: u64) {
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
    fn apply_early(&mut self) {
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
            let Some(rail) = self.rails.iter().position(|r| r.alive) else {
                return;
            };
            self.start_early(seq);
            self.finish_target_op(rail);
        }
    }

    /// Executes what became due: writes placed ahead, vectored requests whose descriptor
    /// arrived, and requests staged after a rail loss.
    fn run_due(&mut self) {
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
    fn start_read(&mut self, rail: usize, seq: u64, src: Result<Arc<Spans>, WireStatus>) {
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
    fn exec_descriptor(&mut self) {
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
    fn placing(&self, of: impl Fn(&RxPending) -> Option<u32>) -> u64 {
        self.rails
            .iter()
            .filter_map(|r| r.rx_pending.as_ref().and_then(&of))
            .map(u64::from)
            .sum()
    }

    fn queue_done(&mut self, rail: usize, seq: u64, st: WireStatus) {
        let mut d = FrameHeader::new(Opcode::Done);
        d.seq = seq;
        d.aux = st as u32;
        self.rails[rail].ctrl.push_back(d);
    }

    fn advance_frontier(&mut self) {
        self.frontier += 1;
        self.retry_stalled();
    }

    fn retry_stalled(&mut self) {
        for (i, r) in self.rails.iter().enumerate() {
            if r.stalled {
                self.rx_retry |= 1 << i;
            }
        }
    }

    fn finish_target_op(&mut self, rail: usize) {
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
        self.queue_done(rail, op.seq, op.status);
        self.advance_frontier();
    }

    fn on_response(&mut self, rail: usize, h: &FrameHeader) -> Result<RxAction, ProtocolError> {
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
            Opcode::Close => Err(ProtocolError::PeerClosed),
            // Only valid as the first frame of a re-established rail (handled above).
            Opcode::RailRestore => Err(unknown()),
            Opcode::RailDown => {
                let r = h.arg0 as usize;
                if r >= self.rails.len() || r == rail {
                    return Err(unknown());
                }
                self.rail_down(r);
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

    /// Reports that the payload of the last frame offered on `rail` has been placed (or
    /// discarded) completely. With payload CRCs, a mismatch is an error and the operation
    /// does not complete.
    pub fn payload_done(&mut self, rail: usize) -> Result<(), ProtocolError> {
        // Released when this call returns: the driver is done with the placement.
        let _keep = self.rails[rail].rx_keep.take();
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

    fn fault_pending(&mut self, _rail: usize, p: &RxPending) {
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
    fn fault_target_op(&mut self) {
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

    /// Keeps a request that arrived ahead of its turn; a descriptor goes before the data
    /// chunks of its operation (they cannot execute without it).
    fn stage(&mut self, st: Staged) {
        let list = self.staged.entry(st.h.seq).or_default();
        if st.h.opcode.is_descriptor() {
            list.push_front(st);
        } else {
            list.push_back(st);
        }
    }

    /// Executes staged requests whose turn has come.
    fn apply_staged(&mut self) {
        while self.failed.is_none() {
            let Some(list) = self.staged.get_mut(&self.frontier) else {
                return;
            };
            let Some(st) = list.pop_front() else {
                self.staged.remove(&self.frontier);
                return;
            };
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

    /// Timer work; the driver calls it at least every [`SessionConfig::keepalive_interval`].
    /// Queues keepalives on rails that have been quiet, and returns the rails (a bit per rail)
    /// that received nothing for [`SessionConfig::peer_timeout`]: the driver fails them.
    ///
    /// Only silence this side observed counts. A gap between two calls longer than the
    /// larger of `keepalive_interval` and a quarter of `peer_timeout` means this side itself
    /// stopped (its process stopped or starved of CPU, its machine paused); the excess is
    /// not counted as the peer's silence. Both ends of a test on a loaded 2-core machine
    /// starved together for 2.7 s, and every rail was declared dead at the next tick.
    pub fn on_tick(&mut self, now: Instant) -> u64 {
        let mut dead = 0;
        if self.failed.is_some() {
            return 0;
        }
        let slack = self.cfg.keepalive_interval.max(self.cfg.peer_timeout / 4);
        let unobserved = self.last_tick.map_or(Duration::ZERO, |t| {
            now.saturating_duration_since(t).saturating_sub(slack)
        });
        self.last_tick = Some(now);
        for (i, r) in self.rails.iter_mut().enumerate() {
            if !r.alive {
                continue;
            }
            if let Some(l) = &mut r.last_rx {
                *l = (*l + unobserved).min(now);
            }
            let last_rx = *r.last_rx.get_or_insert(now);
            let last_tx = *r.last_tx.get_or_insert(now);
            // A rail braid itself stopped reading is not silent: its bytes wait in the kernel.
            // A rail in the middle of a payload is: `on_rx_progress` keeps `last_rx` fresh
            // while its bytes keep coming.
            if !r.stalled && now.saturating_duration_since(last_rx) >= self.cfg.peer_timeout {
                dead |= 1 << i;
            }
            if now.saturating_duration_since(last_tx) >= self.cfg.keepalive_interval
                && r.ctrl.is_empty()
            {
                r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
            }
        }
        dead
    }

    /// The driver found no more bytes to read on `rail` for now. If enough of it is still
    /// unacknowledged, an acknowledgement goes out even though the threshold was not reached,
    /// so a sender whose window is smaller than our threshold is never left waiting.
    pub fn on_rx_idle(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        if r.alive
            && !r.awaiting_restore
            && r.rx_bytes - r.rx_advertised >= IDLE_ACK_MIN
            && r.ctrl.is_empty()
        {
            r.ctrl.push_back(FrameHeader::new(Opcode::RailAck));
        }
    }

    /// Notes that payload bytes are arriving on `rail` (a large chunk on a slow rail takes
    /// a while; the rail is not silent).
    ///
    /// Before the first [`Session::on_tick`] (which starts the silence clock at its own time)
    /// there is nothing to refresh: the kernel's time of the last data of a rail that has
    /// only done its handshake is the handshake's, and an endpoint whose last rail took longer
    /// than `peer_timeout` to connect had its first rails declared dead at once.
    pub fn on_rx_progress(&mut self, rail: usize, now: Instant) {
        if let Some(l) = &mut self.rails[rail].last_rx {
            *l = (*l).max(now);
        }
    }

    /// Rails that were stalled and may now proceed (a bit per rail); clears the set.
    pub fn take_rx_retry(&mut self) -> u64 {
        std::mem::take(&mut self.rx_retry)
    }

    /// True when [`Session::take_rx_retry`] would name a rail.
    pub fn rx_retry_pending(&self) -> bool {
        self.rx_retry != 0
    }

    /// The next completion, in order.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Number of completions waiting to be polled.
    pub fn pending_completions(&self) -> usize {
        self.completions.len()
    }

    /// A rail failed (reset, closed, silent, or corrupted data). Its unacknowledged frames
    /// are sent again on the surviving rails and the peer is told with a `RailDown`; only
    /// when no rail is left does every outstanding operation complete with
    /// [`Status::TransportError`] and every posted receive with [`Status::Flushed`].
    pub fn on_rail_lost(&mut self, rail: usize) {
        self.rail_down(rail);
    }

    fn rail_down(&mut self, rail: usize) {
        let r = &mut self.rails[rail];
        if !r.alive {
            return;
        }
        r.alive = false;
        r.dead_consumed = Some(r.rx_bytes);
        r.stalled = false;
        r.crc_check = None;
        r.rx_retx = None;
        // The driver may still be writing into the pending placement: `rx_keep` keeps its
        // memory until it reports back; the payload is simply never accounted.
        // `rx_pending` goes (it must not count as "being placed" any more).
        if let Some(RxPending::Staged(st)) = r.rx_pending.take() {
            self.staged_bytes -= st.data.len as u64;
        }
        let r = &mut self.rails[rail];
        let log = std::mem::take(&mut r.log);
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
        self.retx.extend(log);
        let heir_ctrl = &mut self.rails[heir].ctrl;
        heir_ctrl.extend(
            ctrl.into_iter()
                .filter(|h| matches!(h.opcode, Opcode::Done | Opcode::AtomicResponse)),
        );
        let mut down = FrameHeader::new(Opcode::RailDown);
        down.arg0 = rail as u64;
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

    /// Rails that died since the last call (a bit per rail): the driver closes their sockets.
    pub fn take_dead_rails(&mut self) -> u64 {
        std::mem::take(&mut self.dead_pending)
    }

    /// True while the rail is in use.
    pub fn rail_alive(&self, rail: usize) -> bool {
        self.rails[rail].alive
    }

    /// Local close: queues a `Close` frame on every rail and flushes all operations with
    /// [`Status::Flushed`].
    pub fn close(&mut self) {
        if self.failed.is_none() {
            for r in self.rails.iter_mut().filter(|r| r.alive) {
                r.ctrl.clear();
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
            r.ctrl.retain(|h| h.opcode == Opcode::Close);
        }
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

#[cfg(test)]
mod tests {
    use super::Disjoint;

    #[test]
    fn disjoint_ranges_of_one_key() {
        let d = Disjoint::new(&[(1, 100, 200), (1, 0, 50), (1, 120, 300)]);
        assert!(d.misses(&(1, 50, 100)));
        assert!(d.misses(&(1, 300, 400)));
        assert!(!d.misses(&(1, 49, 51)));
        assert!(!d.misses(&(1, 250, 260)), "inside the third range only");
        assert!(!d.misses(&(1, 0, 1000)));
        assert!(!d.misses(&(2, 50, 100)), "another key may alias");
        let two = Disjoint::new(&[(1, 0, 10), (2, 0, 10)]);
        assert!(
            !two.misses(&(1, 20, 30)),
            "a write over two keys commutes with nothing"
        );
    }
}
