//! `braid bench`: perftest-style benchmarks of braid's operations (`ib_write_bw`,
//! `ib_read_bw`, `ib_send_bw`, `ib_atomic_bw`, `ib_write_lat`, `ib_send_lat`,
//! `ib_read_lat`, `ib_atomic_lat`).
//!
//! A `bench server` listens on one address per rail and serves one client run (or runs
//! forever); a client (`bench write|read|send|fetch-add|write-lat|send-lat|read-lat|
//! atomic-lat`) connects an
//! endpoint over its rails and runs one *test* per message size over it.
//!
//! # Control protocol
//!
//! Control messages are small JSON documents carried by braid itself: `send_with_imm` with
//! the immediate [`CTRL_IMM`] into a posted receive of the peer (data `send`s carry no
//! immediate, data `write_with_imm`s an immediate below 2^31, so the kinds never mix).
//! Per test:
//!
//! 1. client → server `Setup` (operation, size, depth, verify, ...);
//! 2. the server registers a region (bw: `slots × size`, slots = min(depth, 64 MiB / size)),
//!    fills it with the pattern for `read`, posts receives for `send`/latency tests, and
//!    answers `SetupReply` (remote key, slots, the TCP baseline port);
//! 3. the client runs the operation loop;
//! 4. client → server `Done` (iterations); the server checks the region (write + verify,
//!    fetch-add counter) and answers `Report` (CPU seconds, per-rail bytes, verification,
//!    and how many of its posted receives are left over);
//! 5. the client sends that many 1-byte *pads* ([`PAD_IMM`]) to consume the leftovers, so
//!    that the next test's messages land in the receives that test posts.
//!
//! A `Bye` ends the run. Every wait is bounded; an error completion (the peer vanished) is an
//! error, never a hang.

use std::io::IsTerminal;
use std::net::SocketAddrV4;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use braid::{Completion, Region, Status};
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};

use braid_testbed::parse::{self, RailSpec};

/// A busy-polling latency loop yields its core once in this many empty polls (not on every
/// one: a system call per poll; the ring alone carries an 8 B message one way in 111-116 ns,
/// `ring_ping_pong_one_way_latency` in `crates/braid/src/engine/shm/tests.rs`).
pub(crate) const YIELD_EVERY: u32 = 256;

mod client;
mod output;
mod peer;
mod server;
mod tcp;

pub use peer::{Peer, RecvPool};

/// Size of a control message buffer.
pub const CTRL_LEN: usize = 4096;
/// Immediate of control messages.
pub const CTRL_IMM: u32 = 0xC7A1_B00C;
/// Immediate of pads (consume a leftover receive, carry nothing).
pub const PAD_IMM: u32 = 0xC7A1_FADE;
/// Data immediates stay below this.
pub const DATA_IMM_MASK: u32 = 0x7FFF_FFFF;
const CTRL_WR: u64 = u64::MAX - 1;
const PAD_WR: u64 = u64::MAX - 2;
/// Most bytes of data buffers per side and test.
pub const BUF_CAP: usize = 64 << 20;

/// Data regions of both sides: pages resident from the start (as verbs registration pins
/// them), so that no run pays for first-touch page faults.
pub const POPULATED: braid::RegionOptions = braid::RegionOptions {
    huge_pages: false,
    populate: true,
};

/// Largest message size accepted.
pub const MAX_SIZE: usize = 1 << 30;
/// Largest depth (the session's default outstanding limit is 1024).
pub const MAX_DEPTH: usize = 1000;
const CQ_CAP: usize = 4096;
const PROTO_VERSION: u32 = 1;
/// Seed offset of the read test's server pattern.
pub const READ_SEED: u64 = 0x5EED_0000_0000;

/// `braid bench ...`
#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Serve benchmark clients: listen on one address per rail, serve one client run, exit.
    Server(ServerArgs),
    /// RDMA write bandwidth (ib_write_bw).
    Write(ClientArgs),
    /// RDMA read bandwidth (ib_read_bw).
    Read(ClientArgs),
    /// Send/receive bandwidth (ib_send_bw).
    Send(ClientArgs),
    /// 8-byte fetch-add rate (ib_atomic_bw).
    FetchAdd(ClientArgs),
    /// Write-with-immediate ping-pong latency (ib_write_lat).
    WriteLat(ClientArgs),
    /// Send/receive ping-pong latency (ib_send_lat).
    SendLat(ClientArgs),
    /// One read at a time: time from posting to its completion (ib_read_lat).
    ReadLat(ClientArgs),
    /// One 8-byte fetch-add at a time: time from posting to its completion (ib_atomic_lat).
    AtomicLat(ClientArgs),
}

/// Server options.
#[derive(Args, Debug, Clone)]
pub struct ServerArgs {
    /// Addresses to listen on, `IP[:PORT]` (default port 18515), one per rail.
    #[arg(long, value_name = "IP[:PORT],...", value_parser = parse::parse_addrs)]
    pub listen: std::vec::Vec<SocketAddrV4>,
    /// Serve exactly one client run and exit (the default).
    #[arg(long, conflicts_with = "forever")]
    pub once: bool,
    /// Serve client runs until killed.
    #[arg(long)]
    pub forever: bool,
    /// Seconds to wait for a client (and for its next message); exit with an error after.
    #[arg(long = "accept-timeout", value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,
    /// Chunk size of the server's endpoint (read responses are cut in chunks of this size).
    #[arg(long, value_parser = parse::parse_size)]
    pub chunk: Option<usize>,
    /// Per-rail window settings of the server's endpoint (they govern read responses).
    #[command(flatten)]
    pub window: WindowArgs,
    /// Busy-poll this long (µs) in completion-queue waits before sleeping.
    #[arg(long = "poll-spin-us", value_name = "US", alias = "spin-us")]
    pub spin_us: Option<u64>,
    /// Serve read and write tests from the pages of this file (registered with
    /// `Context::register_file`, read-write when the file allows it) instead of memory:
    /// the client's operations cycle through the file in message-size slots. The file is
    /// read once before each test so that its pages are in the page cache; with --verify the
    /// server writes the read pattern into it first.
    #[arg(long)]
    pub file: Option<PathBuf>,
}

/// Client options (perftest's letters where they exist).
#[derive(Args, Debug, Clone)]
pub struct ClientArgs {
    /// Rails: LOCAL=REMOTE:PORT[,LOCAL=REMOTE:PORT...], one per NIC.
    #[arg(long, value_name = "LOCAL=REMOTE[:PORT],...", value_parser = parse::parse_rails)]
    pub rails: std::vec::Vec<RailSpec>,
    /// Message size in bytes (K/M/G suffixes are powers of 1024). Default 65536 for
    /// bandwidth tests, 2 for latency tests, 8 for fetch-add.
    #[arg(short = 's', long, value_parser = parse::parse_size)]
    pub size: Option<usize>,
    /// All sizes from 2 B to 8 MiB, powers of two.
    #[arg(short = 'a', long = "all", conflicts_with = "size")]
    pub all: bool,
    /// Iterations per size (default 5000 for bandwidth, 1000 for latency, unless -D is given).
    #[arg(long = "iters", value_name = "N")]
    pub iters: Option<u64>,
    /// Seconds per size: run until D seconds or --iters iterations, whichever comes first.
    #[arg(short = 'D', long = "duration")]
    pub duration: Option<f64>,
    /// Operations in flight (bandwidth tests). Default: enough for 16 MiB in flight, 16 to
    /// 1000 operations (256 at 64 KiB, 16 from 1 MiB up); see `default_depth`.
    #[arg(short = 'q', long = "depth")]
    pub depth: Option<usize>,
    /// Fill sources with a per-iteration pattern and check every byte at the destination.
    #[arg(long)]
    pub verify: bool,
    /// Write and send tests: before each operation the client writes its whole source slot
    /// (a memset), as an application producing new data would. With page exchange on a
    /// same-host rail, each page's first write after a send pays its copy-on-write.
    #[arg(long, conflicts_with = "verify")]
    pub rewrite: bool,
    /// Send tests: the server reads one byte of every page of each message it receives,
    /// as an application using the data would (pages received by page exchange are mapped
    /// on that first touch).
    #[arg(long)]
    pub touch: bool,
    /// Write the results as JSON ({"results": [...]}) to FILE ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also measure plain TCP on rail 0's path (stream or ping-pong) and report ratios.
    /// Latency tests ping-pong in both of braid's modes (busy poll: non-blocking `recv` in a
    /// spin loop; blocking) and divide like by like.
    #[arg(long)]
    pub baseline: bool,
    /// With --baseline on bandwidth tests: alternate braid and TCP this many times (each
    /// gets -D/ROUNDS and --iters/ROUNDS per round), so load changes on a shared machine hit both.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Chunk size of the endpoint (SessionConfig.chunk_size).
    #[arg(long, value_parser = parse::parse_size)]
    pub chunk: Option<usize>,
    /// Per-rail window settings of the endpoint (they govern writes and sends).
    #[command(flatten)]
    pub window: WindowArgs,
    /// Busy-poll this long (µs) in completion-queue waits before sleeping (both sides).
    #[arg(long = "poll-spin-us", value_name = "US", alias = "spin-us")]
    pub spin_us: Option<u64>,
    /// Latency tests: skip the blocking-wait variant (measure busy polling only).
    #[arg(long)]
    pub poll_only: bool,
    /// Seconds without any completion after which the server is declared gone.
    #[arg(
        long = "peer-timeout",
        value_name = "SECS",
        alias = "op-timeout",
        default_value_t = 10.0
    )]
    pub op_timeout: f64,
    /// Read and write tests: post every operation as a vectored one (`write_v`/`read_v`)
    /// of this many pieces on both sides (the message size split evenly; the pieces of an
    /// operation are adjacent in memory, so --verify checks them as one slot).
    #[arg(short = 'v', long = "pieces")]
    pub pieces: Option<usize>,
    /// Bandwidth tests: post operations in lists of this many (`Endpoint::post_list`: one
    /// lock and one flush per list), only the last of each list signaled (the others
    /// complete silently, as verbs work requests without `IBV_SEND_SIGNALED`).
    #[arg(long)]
    pub post_list: Option<usize>,
    /// Bandwidth tests: message-size buffer slots of the client's sources and of the
    /// server's region (writes and reads; a send test's server keeps its ring of posted
    /// receives). Default: one per operation in flight (at most 64 MiB), so operations in
    /// flight use distinct memory. 1 reuses one buffer for every operation, as `ib_write_bw`
    /// does and as iperf3 re-sends its one 128 KiB buffer: the data then stays in the caches
    /// instead of streaming through DRAM.
    #[arg(long)]
    pub slots: Option<usize>,
}

/// The striping window of each rail (`SessionConfig`): a rail takes the next chunk while its
/// unacknowledged bytes are below `clamp(rate x delay, min_window, max_window)` (delay:
/// `target_delay`, or `relaxed_target_delay` with relaxed placement), or
/// `initial_window` while its rate is unknown; its chunks are at most a quarter of that
/// window. Unset: braid's defaults. The session raises `min_window` to at least 128 KiB and
/// `initial_window` to at least `min_window`.
#[derive(Args, Debug, Clone, Default)]
pub struct WindowArgs {
    /// SessionConfig.initial_window (bytes, K/M suffixes).
    #[arg(long, value_parser = parse::parse_size)]
    pub initial_window: Option<usize>,
    /// SessionConfig.min_window.
    #[arg(long, value_parser = parse::parse_size)]
    pub min_window: Option<usize>,
    /// SessionConfig.max_window.
    #[arg(long, value_parser = parse::parse_size)]
    pub max_window: Option<usize>,
    /// SessionConfig.target_delay and relaxed_target_delay, in milliseconds (defaults 4 and
    /// 16: the second applies with relaxed placement, bench's default).
    #[arg(long)]
    pub target_delay_ms: Option<f64>,
    /// SessionConfig.ack_threshold: received bytes after which this side acknowledges a rail
    /// unasked (bytes, K/M suffixes).
    #[arg(long, value_parser = parse::parse_size)]
    pub ack_threshold: Option<usize>,
    /// Turn SessionConfig.relaxed_placement off. bench turns it on: its writes go to
    /// disjoint slots, so the target may place them as they arrive (they still complete in
    /// order); braid's own default is off.
    #[arg(long)]
    pub strict_placement: bool,
}

impl WindowArgs {
    /// Applies the settings given to `cfg`.
    pub fn apply(&self, cfg: &mut braid::SessionConfig) -> Result<()> {
        const MAX: usize = 1 << 30;
        for (v, what) in [
            (self.initial_window, "--initial-window"),
            (self.min_window, "--min-window"),
            (self.max_window, "--max-window"),
            (self.ack_threshold, "--ack-threshold"),
        ] {
            if v.is_some_and(|v| v == 0 || v > MAX) {
                bail!("{what} must be 1 byte .. 1 GiB");
            }
        }
        if let Some(v) = self.initial_window {
            cfg.initial_window = v as u64;
        }
        if let Some(v) = self.min_window {
            cfg.min_window = v as u64;
        }
        if let Some(v) = self.max_window {
            cfg.max_window = v as u64;
        }
        if let Some(v) = self.ack_threshold {
            cfg.ack_threshold = v as u64;
        }
        if let Some(ms) = self.target_delay_ms {
            if !(ms > 0.0 && ms <= 10_000.0) {
                bail!("--target-delay-ms must be between 0 and 10000");
            }
            cfg.target_delay = Duration::from_secs_f64(ms / 1000.0);
            cfg.relaxed_target_delay = cfg.target_delay;
        }
        cfg.relaxed_placement = !self.strict_placement;
        Ok(())
    }
}

/// What one test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// RDMA write bandwidth.
    Write,
    /// RDMA read bandwidth.
    Read,
    /// Send bandwidth.
    Send,
    /// Fetch-add rate.
    FetchAdd,
    /// Write-with-imm ping-pong.
    WriteLat,
    /// Send ping-pong.
    SendLat,
    /// One read at a time.
    ReadLat,
    /// One fetch-add at a time.
    AtomicLat,
    /// Plain TCP stream on rail 0's path.
    TcpStream,
    /// Plain TCP ping-pong on rail 0's path.
    TcpPingPong,
}

impl Op {
    /// Name as in the CLI and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Op::Write => "write",
            Op::Read => "read",
            Op::Send => "send",
            Op::FetchAdd => "fetch-add",
            Op::WriteLat => "write-lat",
            Op::SendLat => "send-lat",
            Op::ReadLat => "read-lat",
            Op::AtomicLat => "atomic-lat",
            Op::TcpStream => "tcp-stream",
            Op::TcpPingPong => "tcp-ping-pong",
        }
    }

    /// A latency test: one operation at a time.
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Op::WriteLat | Op::SendLat | Op::ReadLat | Op::AtomicLat | Op::TcpPingPong
        )
    }

    /// A latency test of one-sided operations that the client alone drives (read,
    /// fetch-add): each sample is the whole operation, a round trip, not half of one.
    pub fn is_op_lat(self) -> bool {
        matches!(self, Op::ReadLat | Op::AtomicLat)
    }

    /// The test whose target side serves this one: the latency tests of one-sided
    /// operations need from the server what their bandwidth tests need.
    pub fn served_as(self) -> Op {
        match self {
            Op::ReadLat => Op::Read,
            Op::AtomicLat => Op::FetchAdd,
            op => op,
        }
    }
}

/// Control messages.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case")]
pub enum Ctrl {
    /// Client → server: start a test.
    Setup(Setup),
    /// Server → client: ready (or why not).
    SetupReply(SetupReply),
    /// Client → server: the loop is over.
    Done(Done),
    /// Server → client: the server's figures.
    Report(Report),
    /// Client → server: no more tests.
    Bye,
}

/// A test's parameters.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Setup {
    /// Control protocol version.
    pub version: u32,
    /// Operation.
    pub op: Op,
    /// Message size.
    pub size: usize,
    /// Operations in flight.
    pub depth: usize,
    /// Check data.
    pub verify: bool,
    /// Send tests: read one byte per page of each received message.
    #[serde(default)]
    pub touch: bool,
    /// Latency tests: block in `cq.wait` instead of busy-polling.
    pub wait_mode: bool,
    /// Longest the client will run the loop (the server waits this plus its timeout).
    pub max_seconds: f64,
    /// Spin of CQ waits, µs.
    pub spin_us: Option<u64>,
    /// The client's region key (write-lat: where the server writes back).
    pub client_key: Option<Vec<u8>>,
    /// Buffer slots asked for (`--slots`); `None`: one per operation in flight.
    #[serde(default)]
    pub slots: Option<usize>,
}

/// The server's answer to [`Setup`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SetupReply {
    /// Why the test cannot run.
    pub error: Option<String>,
    /// RemoteKey bytes of the server's region.
    pub key: Vec<u8>,
    /// Message-size slots in the region.
    pub slots: usize,
    /// Receives the server keeps posted.
    pub recvs: usize,
    /// Port of the TCP baseline listener (on rail 0's listen address).
    pub tcp_port: Option<u16>,
    /// The server's region is the pages of this file (`bench server --file`).
    #[serde(default)]
    pub file: Option<String>,
}

/// End of a test's loop.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Done {
    /// Operations the client completed (including latency warm-up).
    pub iterations: u64,
}

/// The server's figures of one test.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Report {
    /// Set when the server failed the test.
    pub error: Option<String>,
    /// CPU seconds (user + system, whole process) from the setup reply to `Done`.
    pub cpu_s: f64,
    /// Wall seconds over the same span.
    pub seconds: f64,
    /// Payload bytes the server sent per rail during the test.
    pub rail_bytes: Vec<u64>,
    /// Result of the server's check (write + verify, send + verify, fetch-add, latency + verify).
    pub verified: Option<bool>,
    /// What the check found.
    pub verify_detail: Option<String>,
    /// Messages the server received (send, latency) or served (tcp).
    pub messages: u64,
    /// Bytes the server received (send, tcp).
    pub bytes: u64,
    /// Receives still posted at the server; the client sends this many pads.
    pub leftover_recvs: usize,
}

/// Dispatches `braid bench ...`.
pub fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Server(a) => server::run(&a),
        BenchCmd::Write(a) => client::run(Op::Write, &a),
        BenchCmd::Read(a) => client::run(Op::Read, &a),
        BenchCmd::Send(a) => client::run(Op::Send, &a),
        BenchCmd::FetchAdd(a) => client::run(Op::FetchAdd, &a),
        BenchCmd::WriteLat(a) => client::run(Op::WriteLat, &a),
        BenchCmd::SendLat(a) => client::run(Op::SendLat, &a),
        BenchCmd::ReadLat(a) => client::run(Op::ReadLat, &a),
        BenchCmd::AtomicLat(a) => client::run(Op::AtomicLat, &a),
    }
}

/// Validates a seconds argument.
pub fn secs(s: f64, what: &str) -> Result<Duration> {
    if !(s > 0.0 && s <= 86_400.0) {
        bail!("{what} must be between 0 and 86400 seconds, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

/// The test kit's pattern: every 8-byte word depends on the seed (iteration or slot) and
/// its offset, so stale, misplaced or foreign data shows; `check_pattern` gives the first
/// bad offset.
pub use braid_testkit::pattern::{check as check_pattern, fill as fill_pattern};

/// Writes the pattern of `seed` into `len` bytes of `region` at `off`.
pub fn write_pattern(
    region: &Region,
    off: usize,
    len: usize,
    seed: u64,
    scratch: &mut Vec<u8>,
) -> Result<()> {
    scratch.resize(len, 0);
    fill_pattern(seed, scratch);
    region.write_at(off, scratch)?;
    Ok(())
}

/// Checks `len` bytes of `region` at `off` against the pattern of `seed`.
pub fn region_matches(
    region: &Region,
    off: usize,
    len: usize,
    seed: u64,
    got: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> Result<Result<(), usize>> {
    got.resize(len, 0);
    region.read_at(off, got)?;
    Ok(check_pattern(seed, got, scratch))
}

/// Operations in flight of a bandwidth test of `size`-byte operations when `-q` is not
/// given: the demo's ([`crate::demo::rma_depth`], at least 16 MiB in flight).
pub fn default_depth(size: usize) -> usize {
    crate::demo::rma_depth(size)
}

/// Number of message-size slots of a bandwidth test's buffers.
pub fn slots_for(size: usize, depth: usize) -> usize {
    depth.clamp(1, (BUF_CAP / size.max(1)).max(1))
}

/// A completion's failure as an error.
pub fn check_status(c: &Completion, what: &str) -> Result<()> {
    match c.status {
        Status::Success => Ok(()),
        Status::TransportError => {
            bail!("{what}: the connection to the peer failed (peer gone?) [{c:?}]")
        }
        Status::Flushed => bail!("{what}: the endpoint was closed (peer gone?) [{c:?}]"),
        s => bail!("{what}: operation failed with {s:?} [{c:?}]"),
    }
}

/// Per-rail difference.
pub fn rail_delta(after: &[u64], before: &[u64]) -> Vec<u64> {
    after
        .iter()
        .enumerate()
        .map(|(i, a)| a.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect()
}

/// A progress bar that appears once a test has run for ~2 s, on stderr, only on a terminal.
pub struct Progress {
    t0: Instant,
    last: Instant,
    bar: Option<indicatif::ProgressBar>,
    duration: Option<Duration>,
    iters: u64,
    label: String,
    enabled: bool,
}

impl Progress {
    /// Starts timing a test bounded by `duration` and/or `iters`.
    pub fn new(label: String, duration: Option<Duration>, iters: u64) -> Progress {
        let now = Instant::now();
        Progress {
            t0: now,
            last: now,
            bar: None,
            duration,
            iters,
            label,
            enabled: std::io::stderr().is_terminal(),
        }
    }

    /// Updates with `done` iterations (cheap; redraws at most every 100 ms).
    pub fn tick(&mut self, done: u64) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.last) < Duration::from_millis(100) {
            return;
        }
        self.last = now;
        let el = now.duration_since(self.t0);
        if self.bar.is_none() {
            if el < Duration::from_secs(2) {
                return;
            }
            let b = indicatif::ProgressBar::new(1000);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:30}] {percent}% {elapsed}/{duration}",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            b.set_message(self.label.clone());
            self.bar = Some(b);
        }
        let by_time = self
            .duration
            .map_or(0.0, |d| el.as_secs_f64() / d.as_secs_f64());
        let by_iter = if self.iters == u64::MAX {
            0.0
        } else {
            done as f64 / self.iters.max(1) as f64
        };
        if let Some(b) = &self.bar {
            b.set_position((by_time.max(by_iter).min(1.0) * 1000.0) as u64);
        }
    }

    /// Removes the bar.
    pub fn finish(self) {
        if let Some(b) = self.bar {
            b.finish_and_clear();
        }
    }
}

/// CPU seconds of this process (user + system).
pub fn cpu_seconds() -> f64 {
    crate::baseline::cpu_seconds()
}
