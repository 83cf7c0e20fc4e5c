//! Tunables of a session and the protocol's fixed limits.

use std::time::Duration;

/// Tunables of a session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Largest payload of one chunk frame (default 1 MiB; smaller chunks cost more system
    /// calls per byte, see docs/RESULTS.md).
    pub chunk_size: usize,
    /// Most operations posted and not yet completed.
    pub max_outstanding: usize,
    /// Most receives posted and not yet consumed.
    pub max_recv: usize,
    /// Window of a rail whose rate is not known yet (default 32 KiB, as much as a link of
    /// any speed takes in one burst; at least 4 KiB). The first acknowledgements measure the
    /// rate, and a fast rail's window follows it within a few round trips. A larger first
    /// burst overflows a slow link's queue: 2 MiB on a 250 Mbit/s rail lost packets at start
    /// and stalled that rail (and the writes waiting for it) for a 200 ms TCP retransmission
    /// timeout, and 1 MiB on a 500 kbit/s rail was 16 s of its data.
    pub initial_window: u64,
    /// Smallest window of a rail fast enough to send it in 20 ms (default 1 MiB: above rate x
    /// delay up to ~2 Gbit/s, and more than a shaped 1 Gbit/s link queues). Slower rails are
    /// floored in time instead, at 20 ms of their rate (and at least 4 KiB), so a rail of
    /// any speed carries what it can deliver in about the time the fast ones take. A rail's
    /// chunks are a quarter of its window.
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
    /// placement with this depth lost a quarter of its throughput (docs/RESULTS.md).
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
    /// A rail whose link has had data in flight and heard no acknowledgement for this long
    /// (or four round trips, if longer) is declared dead at once (default 150 ms;
    /// `Duration::ZERO` turns the check off). The driver samples this from its transport
    /// (TCP: `TCP_INFO`); it catches a link that silently drops everything long before
    /// `peer_timeout`. A healthy link acknowledges something every round trip, duplicates
    /// included, however slow it is; a link that lost a whole window waits for TCP's
    /// retransmission timeout (at least 200 ms) and may be declared dead by mistake, which
    /// costs a re-dial, not data.
    pub rail_stall_timeout: Duration,
    /// A live rail whose frames have waited this long for an acknowledgement while another
    /// rail is acknowledged (default 50 ms; `Duration::ZERO` turns hedging off) is
    /// *hedged*: its unacknowledged requests and control frames are sent again on the
    /// other rails, and it gets no new data until the peer has acknowledged everything sent
    /// on it before. The peer executes whichever copy comes first and drops the other. A
    /// rail whose first window was far more than it delivers (a slow link whose token
    /// bucket passed the first burst at line rate) so holds nothing up for long, and is
    /// never given up for being slow. Read responses are not hedged (they stay on their
    /// rail): their copies would need the read's guard twice.
    pub rail_hedge_after: Duration,
    /// Relaxed placement (like verbs' `IBV_ACCESS_RELAXED_ORDERING`; default off). A write
    /// whose target range no earlier outstanding operation of this side touches (every
    /// earlier one is a write to the same key at a disjoint range) may be placed by the
    /// target as soon as its chunks arrive, ahead of the requests before it. Completions,
    /// reads, atomics and sends keep their order, and whatever is observed through them is
    /// unchanged; only a target that polls memory for a flag written after data may see the
    /// flag first. Lets rails of different speeds run at their own rates, where strict
    /// placement ties every rail to the slowest (it stalls them behind its chunk).
    pub relaxed_placement: bool,
    /// Concurrent small (one-frame) operations go on the live rail with the least in flight
    /// instead of the first rail with room (default on). More small-message throughput over
    /// several rails (4 KiB writes at depth 64 on four testbed rails: 205 against 111 MB/s)
    /// for more system calls and wake-ups per message: a latency-bound page DSM on a 2-core
    /// host ran its matrix multiply 10% slower with it (docs/DSM.md).
    pub spread_small_ops: bool,
}

impl Default for SessionConfig {
    fn default() -> SessionConfig {
        SessionConfig {
            chunk_size: 1 << 20,
            max_outstanding: 1024,
            max_recv: 1024,
            initial_window: 32 << 10,
            min_window: 1 << 20,
            max_window: 32 << 20,
            target_delay: Duration::from_millis(4),
            relaxed_target_delay: Duration::from_millis(16),
            ack_threshold: 4 << 20,
            payload_crc: false,
            max_staged: 256 << 20,
            keepalive_interval: Duration::from_millis(250),
            peer_timeout: Duration::from_secs(3),
            rail_stall_timeout: Duration::from_millis(150),
            rail_hedge_after: Duration::from_millis(50),
            relaxed_placement: false,
            spread_small_ops: true,
        }
    }
}

/// Most writes placed ahead of their turn at once, and how far ahead of the next request to
/// execute; beyond either the rail stalls as under strict placement.
pub(super) const EARLY_MAX_OPS: usize = 1024;

pub(super) const EARLY_MAX_AHEAD: u64 = 1 << 16;

/// A small operation: one that fits one chunk of any rail of 1 Gbit/s and up (see
/// `Session::next_data_is_concurrent_small_op`).
pub(super) const MIN_CHUNK: u64 = 64 << 10;

/// How long a window lasts at least at its rail's rate, below [`SessionConfig::min_window`]
/// (see `Session::window`).
pub(super) const MIN_WINDOW_TIME: Duration = Duration::from_millis(20);

/// Smallest window of any rail, however slow: a few frames.
pub(super) const MIN_WINDOW_BYTES: u64 = 4 << 10;

/// Smallest chunk of any rail: a quarter of the smallest window.
pub(super) const MIN_RAIL_CHUNK: u64 = MIN_WINDOW_BYTES / 4;

/// Unacknowledged bytes that make an idle receiver acknowledge (see `Session::on_rx_idle`);
/// windows are never smaller than four times this.
pub(super) const IDLE_ACK_MIN: u64 = 16 << 10;
