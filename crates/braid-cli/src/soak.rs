//! `braid soak`: the reliability checks of braid on the emulated cluster.
//!
//! Three modes, each on a testbed the command makes itself (a unique name, torn down on every
//! exit path by the [`Testbed`] guard) or, where network namespaces cannot be made (or with
//! `--loopback`), on unshaped loopback rails 127.0.0.1..N:
//!
//! * **soak** (default): `--threads` threads post a random mix of `write`, `read`,
//!   `write_with_imm`, `send`, `fetch_add`, `compare_swap` and scatter/gather writes and reads
//!   over `--endpoints` endpoints of `--rails` rails each, for `--duration` seconds, while one
//!   rail's link is taken down (`--flap-at`, for `--flap-for` seconds) and brought back up.
//!   Every byte is checked against a model of each target region (reads at completion, a
//!   read-back over braid at the end, and the server's memory directly), atomics are counted
//!   exactly (the fetch-add results chain without gap or repeat; compare-swap answers are
//!   predicted), every receive is matched to its send (per thread, in order, content checked),
//!   and every posted `wr_id` gets exactly one completion, in post order per endpoint.
//!   Memory is bounded: the process's peak RSS (`VmHWM`) must stay below `--max-rss-mb`.
//! * **`--failover-transfer`**: one endpoint writes `--transfer-size` (1 GiB) in `--op-size`
//!   (4 MiB) operations; `--fail-after` seconds in, rail `--fail-rail`'s link goes down for
//!   good. Reports goodput before the failure and after its detection, and checks every byte
//!   and that the ratio is at least `--min-ratio` (0.70; on the testbed only).
//! * **`--kill-peer`**: the target runs as a separate process (`braid soak-peer`, in host 1);
//!   during a stream of writes it is sent `--kill-signal` (`kill`: SIGKILL, the kernel closes
//!   its sockets; `stop`: SIGSTOP, nothing more arrives and only the timeout can tell). Every
//!   operation must complete exactly once, the outstanding ones with an error, within
//!   `peer_timeout` + 1 s of the signal.
//!
//! Threads that use braid run inside the namespace of their host (created with
//! [`Testbed::spawn_in`]). A failed rail is re-dialled from the namespace its endpoint was
//! connected in, whichever thread (of whichever namespace) noticed the failure.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use braid::{
    Access, Completion, CompletionKind, CompletionQueue, Context, Endpoint, EndpointOptions,
    Listener, RailAddr, Region, RegionOptions, RemoteKey, SessionConfig, Sge, Status,
};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::parse::{self, Rate};
use crate::testbed::{self, Testbed, TestbedSpec};

/// Size of each server receive buffer; sends are at most this long.
const RECV_LEN: usize = 64 << 10;
/// Receives each server endpoint keeps posted.
const RECVS_PER_EP: usize = 64;
/// Header of a send's payload: magic, thread, endpoint, sequence, length, seed.
const SEND_HDR: usize = 32;
const SEND_MAGIC: u32 = 0x534F_414B;
/// Bounded waits for set-up steps.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Regions whose pages are resident from the start (`MAP_POPULATE`), as verbs registration
/// pins memory.
const RESIDENT: RegionOptions = RegionOptions {
    huge_pages: false,
    populate: true,
};
/// Gap between the pieces of a scatter/gather list in the local slot.
const SG_GAP: usize = 64;

/// `braid soak` options.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Seconds of random operations (soak mode).
    #[arg(short = 'D', long, default_value_t = 60.0)]
    pub duration: f64,
    /// Threads posting operations; each uses every endpoint.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Endpoints between the two hosts.
    #[arg(long, default_value_t = 2)]
    pub endpoints: usize,
    /// Rails per endpoint (veth pairs of the testbed).
    #[arg(long, default_value_t = 4)]
    pub rails: usize,
    /// Shaped rate of every rail.
    #[arg(long, default_value = "1gbit", value_parser = parse::parse_rate)]
    pub rate: Rate,
    /// Seconds into the run at which the flapped rail's link goes down (default: a quarter
    /// of the duration).
    #[arg(long)]
    pub flap_at: Option<f64>,
    /// Seconds the link stays down.
    #[arg(long, default_value_t = 3.0)]
    pub flap_for: f64,
    /// Repeat the flap every this many seconds after --flap-at (while the run lasts).
    #[arg(long)]
    pub flap_every: Option<f64>,
    /// Which rail to flap (and, with --failover-transfer, to fail).
    #[arg(long, alias = "fail-rail", default_value_t = 0)]
    pub flap_rail: usize,
    /// No flap: a soak of the healthy cluster.
    #[arg(long)]
    pub no_flap: bool,
    /// Largest RMA operation (bytes; K/M suffixes).
    #[arg(long, default_value = "1M", value_parser = parse::parse_size)]
    pub max_size: usize,
    /// Bytes of each thread's area in each endpoint's target region.
    #[arg(long, default_value = "4M", value_parser = parse::parse_size)]
    pub area: usize,
    /// Operations in flight per thread.
    #[arg(short = 'q', long, default_value_t = 8)]
    pub depth: usize,
    /// SessionConfig::peer_timeout of every endpoint, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub peer_timeout: f64,
    /// Fail when the peak RSS exceeds this many MiB (default: twice the planned memory
    /// plus 256 MiB).
    #[arg(long)]
    pub max_rss_mb: Option<u64>,
    /// Seed of the operation mix (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use unshaped loopback rails even where namespaces work.
    #[arg(long)]
    pub loopback: bool,
    /// Write the summary as JSON to FILE ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Mode: a large verified write during which one rail's link goes down for good.
    #[arg(long, conflicts_with = "kill_peer")]
    pub failover_transfer: bool,
    /// Bytes written by --failover-transfer.
    #[arg(long, default_value = "1G", value_parser = parse::parse_size)]
    pub transfer_size: usize,
    /// Size of each write of --failover-transfer and --kill-peer.
    #[arg(long, default_value = "4M", value_parser = parse::parse_size)]
    pub op_size: usize,
    /// Seconds into the transfer at which the link goes down (--failover-transfer) or the
    /// peer is signalled (--kill-peer).
    #[arg(long, alias = "kill-after", default_value_t = 1.0)]
    pub fail_after: f64,
    /// --failover-transfer: least goodput after / before the failure (testbed only).
    #[arg(long, default_value_t = 0.70)]
    pub min_ratio: f64,

    /// Mode: the target is a separate process, signalled during a transfer.
    #[arg(long)]
    pub kill_peer: bool,
    /// Signal for --kill-peer.
    #[arg(long, value_enum, default_value_t = KillSignal::Kill)]
    pub kill_signal: KillSignal,
}

/// How the peer process is taken out.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KillSignal {
    /// SIGKILL: the kernel closes the process's sockets.
    Kill,
    /// SIGSTOP: the process hangs with its sockets open; only the timeout notices.
    Stop,
}

/// `braid soak-peer` (internal): the target process of `braid soak --kill-peer`.
#[derive(Args, Debug, Clone)]
pub struct PeerArgs {
    /// Addresses to listen on, IP:PORT[,IP:PORT...] (port 0: any).
    #[arg(long, value_delimiter = ',')]
    pub listen: Vec<SocketAddr>,
    /// Bytes of the target region.
    #[arg(long, default_value = "64M", value_parser = parse::parse_size)]
    pub size: usize,
    /// SessionConfig::peer_timeout, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub peer_timeout: f64,
    /// Exit after this many seconds at the latest.
    #[arg(long, default_value_t = 60.0)]
    pub max_seconds: f64,
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    if !(s > 0.0 && s <= 86_400.0) {
        bail!("{what} must be between 0 and 86400 seconds, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

// ------------------------------------------------------------------ small helpers

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with bytes determined by `seed` and the position.
fn fill(seed: u64, buf: &mut [u8]) {
    let base = mix(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    let mut i = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&mix(base ^ i).to_le_bytes());
        i += 1;
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let b = mix(base ^ i).to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&b[..n]);
    }
}

/// xorshift64* generator.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(mix(seed) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    /// Roughly log-uniform in `lo..=hi`.
    fn size(&mut self, lo: usize, hi: usize) -> usize {
        let top = usize::BITS - hi.leading_zeros();
        let bits = self.range(0, top as usize - 1);
        let a = (1usize << bits).max(lo);
        let b = ((2usize << bits) - 1).min(hi).max(a);
        self.range(a, b)
    }
}

/// Peak resident set size of this process (VmHWM), in KiB.
pub fn max_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn first_diff(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn write_json(path: &PathBuf, value: &impl Serialize) -> Result<()> {
    let line = serde_json::to_string(value)?;
    if path.as_os_str() == "-" {
        println!("{line}");
    } else {
        std::fs::write(path, line + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

// ------------------------------------------------------------------ the network

type Job<T> = JoinHandle<Result<Result<T>>>;

fn join<T>(h: Job<T>) -> Result<T> {
    h.join()
        .map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow!("a soak thread panicked: {msg}")
        })?
        .and_then(|r| r)
}

/// Where the two hosts are: a testbed made for this run, or loopback.
pub struct Net {
    tb: Option<Testbed>,
    rails: usize,
}

impl Net {
    /// Makes a testbed `soak-<pid>-<n>` of `rails` rails of `rate`, or falls back to loopback
    /// (saying so) where namespaces are unavailable.
    pub fn new(rails: usize, rate: Rate, loopback: bool) -> Result<Net> {
        if rails == 0 || rails > 16 {
            bail!("--rails must be 1..16");
        }
        if loopback {
            eprintln!(
                "braid soak: --loopback: rails 127.0.0.1..127.0.0.{rails}, unshaped; a link flap is a socket break (Endpoint::break_rail_for_test)"
            );
            return Ok(Net { tb: None, rails });
        }
        match testbed::probe() {
            Ok(()) => {
                static N: AtomicU32 = AtomicU32::new(0);
                let name = format!(
                    "soak-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                );
                let tb = Testbed::up(&TestbedSpec::new(name, rails, rate))?;
                eprintln!(
                    "braid soak: testbed {} up: 2 hosts, {rails} rails of {rate} (removed at exit)",
                    tb.spec().name
                );
                Ok(Net {
                    tb: Some(tb),
                    rails,
                })
            }
            Err(e) => {
                eprintln!(
                    "braid soak: network namespaces unavailable ({e:#}); running on loopback rails 127.0.0.1..127.0.0.{rails} instead: unshaped, and a link flap becomes a socket break (Endpoint::break_rail_for_test)"
                );
                Ok(Net { tb: None, rails })
            }
        }
    }

    /// "netns" or "loopback".
    pub fn kind(&self) -> &'static str {
        if self.tb.is_some() {
            "netns"
        } else {
            "loopback"
        }
    }

    fn lo(i: usize) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, (i + 1) as u8))
    }

    /// Host 1's rail addresses (port 0).
    fn server_addrs(&self) -> Vec<SocketAddr> {
        match &self.tb {
            Some(tb) => tb
                .rail_addrs(1, 0)
                .iter()
                .map(|(a, _)| SocketAddr::new((*a).into(), 0))
                .collect(),
            None => (0..self.rails)
                .map(|i| SocketAddr::new(Self::lo(i), 0))
                .collect(),
        }
    }

    /// Host 0's rail addresses.
    fn client_ips(&self) -> Vec<IpAddr> {
        match &self.tb {
            Some(tb) => tb
                .rail_addrs(0, 1)
                .iter()
                .map(|(a, _)| (*a).into())
                .collect(),
            None => (0..self.rails).map(Self::lo).collect(),
        }
    }

    /// Runs `f` on a new thread inside host `host`'s namespace.
    fn spawn<T, F>(&self, host: usize, f: F) -> Result<Job<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        match &self.tb {
            Some(tb) => tb.spawn_in(host, f),
            None => Ok(std::thread::spawn(move || Ok(f()))),
        }
    }

    /// Takes rail `rail`'s link of host 0 down or up; on loopback, breaks the rail's sockets
    /// of `eps` instead (and does nothing on "up": the rail re-joins by itself).
    fn set_link(&self, rail: usize, up: bool, eps: &[Arc<Endpoint>]) -> Result<()> {
        match &self.tb {
            Some(tb) => tb.set_rail_link(0, rail, up),
            None => {
                if !up {
                    for e in eps {
                        e.break_rail_for_test(rail);
                    }
                }
                Ok(())
            }
        }
    }

    fn command(&self, host: usize, exe: &std::path::Path) -> Command {
        match &self.tb {
            Some(tb) => tb.command(host, exe),
            None => Command::new(exe),
        }
    }
}

/// Both ends of `n` endpoints: server (host 1) and client (host 0).
struct Pair {
    sctx: Context,
    cctx: Context,
    listener: Listener,
    seps: Vec<Arc<Endpoint>>,
    ceps: Vec<Arc<Endpoint>>,
}

fn session_config(peer_timeout: Duration) -> SessionConfig {
    SessionConfig {
        peer_timeout,
        ..SessionConfig::default()
    }
}

/// The contexts of host 1 (server) and host 0 (client), each made in its host's namespace.
fn contexts(net: &Net) -> Result<(Context, Context)> {
    let s = join(net.spawn(1, || Ok(Context::new()?))?)?;
    let c = join(net.spawn(0, || Ok(Context::new()?))?)?;
    Ok((s, c))
}

/// Connects `n` endpoints of the contexts `sctx` (host 1) and `cctx` (host 0);
/// `sopts`/`copts` name the queues of each side.
fn connect_pair(
    net: &Net,
    n: usize,
    (sctx, cctx): (Context, Context),
    sopts: EndpointOptions,
    copts: EndpointOptions,
) -> Result<Pair> {
    let addrs = net.server_addrs();
    let (tx, rx) = mpsc::channel::<Vec<SocketAddr>>();
    let server = net.spawn(1, move || -> Result<(Context, Listener, Vec<Endpoint>)> {
        let ctx = sctx;
        let listener = ctx.listen(&addrs).context("listening in host 1")?;
        let _ = tx.send(listener.local_addrs());
        let mut eps = Vec::new();
        for _ in 0..n {
            eps.push(
                listener
                    .accept(&sopts, SETUP_TIMEOUT)
                    .context("accepting an endpoint")?,
            );
        }
        Ok((ctx, listener, eps))
    })?;
    let ips = net.client_ips();
    let client = net.spawn(0, move || -> Result<(Context, Vec<Endpoint>)> {
        let bound = rx
            .recv_timeout(SETUP_TIMEOUT)
            .map_err(|_| anyhow!("the server side did not start listening"))?;
        let rails: Vec<RailAddr> = bound
            .iter()
            .zip(&ips)
            .map(|(a, ip)| RailAddr::new(Some(*ip), *a))
            .collect();
        let ctx = cctx;
        let mut eps = Vec::new();
        for _ in 0..n {
            eps.push(
                ctx.connect(&rails, &copts)
                    .context("connecting an endpoint")?,
            );
        }
        Ok((ctx, eps))
    })?;
    let c = join(client);
    let s = join(server);
    let (cctx, ceps) = c?;
    let (sctx, listener, seps) = s?;
    // Pair the server's endpoints with the client's by their addresses.
    let mut seps: Vec<Option<Endpoint>> = seps.into_iter().map(Some).collect();
    let mut ordered = Vec::new();
    for ce in &ceps {
        let me = ce.rail_addrs()[0].0;
        let i = seps
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.rail_addrs()[0].1 == me))
            .ok_or_else(|| anyhow!("no server endpoint matches client rail {me}"))?;
        ordered.push(Arc::new(seps[i].take().expect("present")));
    }
    Ok(Pair {
        sctx,
        cctx,
        listener,
        seps: ordered,
        ceps: ceps.into_iter().map(Arc::new).collect(),
    })
}

// ------------------------------------------------------------------ soak: operations

/// Operation kinds of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Read,
    WriteImm,
    Send,
    FetchAdd,
    CompareSwap,
    WriteSg,
    ReadSg,
}

const KINDS: [(Kind, &str, u32); 8] = [
    (Kind::Write, "write", 22),
    (Kind::Read, "read", 18),
    (Kind::WriteImm, "write_with_imm", 10),
    (Kind::Send, "send", 14),
    (Kind::FetchAdd, "fetch_add", 12),
    (Kind::CompareSwap, "compare_swap", 10),
    (Kind::WriteSg, "write_sg", 7),
    (Kind::ReadSg, "read_sg", 7),
];

impl Kind {
    fn index(self) -> usize {
        KINDS.iter().position(|k| k.0 == self).expect("listed")
    }
    fn completion(self) -> CompletionKind {
        match self {
            Kind::Write | Kind::WriteImm | Kind::WriteSg => CompletionKind::Write,
            Kind::Read | Kind::ReadSg => CompletionKind::Read,
            Kind::Send => CompletionKind::Send,
            Kind::FetchAdd => CompletionKind::FetchAdd,
            Kind::CompareSwap => CompletionKind::CompareSwap,
        }
    }
}

enum Check {
    Nothing,
    /// A read: the bytes expected in the local pieces (slot offsets, lengths).
    Bytes {
        expect: Vec<u8>,
        pieces: Vec<(usize, usize)>,
        target: u64,
    },
    FetchAdd {
        add: u64,
    },
    Cas {
        old: u64,
    },
}

struct Pending {
    wr: u64,
    kind: Kind,
    slot: usize,
    check: Check,
    readback: bool,
}

/// Completions of one worker thread, filled by the dispatcher.
#[derive(Default)]
struct Mailbox {
    q: Mutex<VecDeque<Completion>>,
    cv: Condvar,
}

impl Mailbox {
    fn push(&self, c: Completion) {
        self.q.lock().expect("mailbox").push_back(c);
        self.cv.notify_one();
    }
    fn try_pop(&self) -> Option<Completion> {
        self.q.lock().expect("mailbox").pop_front()
    }
    fn wait(&self, timeout: Duration) -> Option<Completion> {
        let deadline = Instant::now() + timeout;
        let mut q = self.q.lock().expect("mailbox");
        loop {
            if let Some(c) = q.pop_front() {
                return Some(c);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            q = self.cv.wait_timeout(q, left).expect("mailbox").0;
        }
    }
}

/// What a worker did and what it believes the target memory holds.
#[derive(Default)]
struct WorkerReport {
    ops: [u64; 8],
    readback_ops: u64,
    completions: u64,
    bytes_written: u64,
    bytes_read_verified: u64,
    bytes_readback_verified: u64,
    /// Per endpoint: the model of this thread's area.
    models: Vec<Vec<u8>>,
    /// Per endpoint: this thread's compare-swap word.
    cas: Vec<u64>,
    /// Per endpoint: (old value, addend) of each fetch-add.
    fetch_adds: Vec<Vec<(u64, u64)>>,
    /// Per endpoint: sends and writes-with-immediate that completed (receives consumed).
    recv_ops: Vec<u64>,
}

struct Worker {
    t: usize,
    eps: Vec<Arc<Endpoint>>,
    ep_index: HashMap<u64, usize>,
    keys: Vec<RemoteKey>,
    area: usize,
    threads: usize,
    max_size: usize,
    depth: usize,
    slot_len: usize,
    src: Region,
    dst: Region,
    free: Vec<usize>,
    fifo: Vec<VecDeque<Pending>>,
    next_wr: u64,
    rng: Rng,
    mailbox: Arc<Mailbox>,
    stall: Duration,
    rep: WorkerReport,
    scratch: Vec<u8>,
}

impl Worker {
    fn area_base(&self) -> u64 {
        (self.t * self.area) as u64
    }
    /// Offset of the atomics page in each target region.
    fn atomics(area: usize, threads: usize) -> usize {
        area * threads
    }
    fn cas_off(&self) -> u64 {
        (Self::atomics(self.area, self.threads) + 8 * (1 + self.t)) as u64
    }
    fn inflight(&self) -> usize {
        self.fifo.iter().map(VecDeque::len).sum()
    }

    fn wr(&mut self) -> u64 {
        self.next_wr += 1;
        ((self.t as u64) << 48) | self.next_wr
    }

    fn push(&mut self, e: usize, p: Pending) {
        self.fifo[e].push_back(p);
    }

    /// Random pieces (slot offset, length) of a scatter/gather list of `len` bytes.
    fn sg_pieces(&mut self, len: usize) -> Vec<(usize, usize)> {
        let n = self.rng.range(2, 4).min(len);
        let mut cuts: Vec<usize> = (1..n).map(|_| self.rng.range(1, len - 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::new();
        let (mut prev, mut off) = (0, 0);
        for c in cuts.into_iter().chain(std::iter::once(len)) {
            pieces.push((off, c - prev));
            off += c - prev + SG_GAP;
            prev = c;
        }
        pieces
    }

    fn sges(region: &Region, base: usize, pieces: &[(usize, usize)]) -> Result<Vec<Sge>> {
        pieces
            .iter()
            .map(|&(o, l)| Ok(region.slice(base + o, l)?))
            .collect()
    }

    /// Posts one random operation.
    fn post_random(&mut self) -> Result<()> {
        let total: u32 = KINDS.iter().map(|k| k.2).sum();
        let mut pick = (self.rng.next() % total as u64) as u32;
        let kind = KINDS
            .iter()
            .find(|k| {
                if pick < k.2 {
                    true
                } else {
                    pick -= k.2;
                    false
                }
            })
            .expect("weights")
            .0;
        let e = self.rng.range(0, self.eps.len() - 1);
        let slot = self.free.pop().expect("a free slot below depth");
        let r = self.post(kind, e, slot);
        if r.is_err() {
            self.free.push(slot);
        }
        r
    }

    fn post(&mut self, kind: Kind, e: usize, slot: usize) -> Result<()> {
        let base = slot * self.slot_len;
        let wr = self.wr();
        let key = self.keys[e];
        let ep = self.eps[e].clone();
        let posted = |r: std::result::Result<(), braid::Error>| {
            r.with_context(|| format!("posting {kind:?} on endpoint {e}"))
        };
        let check = match kind {
            Kind::Write | Kind::WriteImm | Kind::WriteSg => {
                let len = self.rng.size(1, self.max_size);
                let off = self.rng.range(0, self.area - len);
                let pieces = if kind == Kind::WriteSg && len >= 2 {
                    self.sg_pieces(len)
                } else {
                    vec![(0, len)]
                };
                self.scratch.resize(len, 0);
                fill(self.rng.next(), &mut self.scratch);
                let mut at = 0;
                for &(o, l) in &pieces {
                    self.src.write_at(base + o, &self.scratch[at..at + l])?;
                    at += l;
                }
                self.rep.models[e][off..off + len].copy_from_slice(&self.scratch);
                let sges = Self::sges(&self.src, base, &pieces)?;
                let target = self.area_base() + off as u64;
                if kind == Kind::WriteImm {
                    let seq = self.rep.recv_ops[e];
                    let imm = ((self.t as u32) << 24) | (seq as u32 & 0xFF_FFFF);
                    posted(ep.write_with_imm(wr, &sges, &key, target, imm))?;
                    self.rep.recv_ops[e] += 1;
                } else {
                    posted(ep.write(wr, &sges, &key, target))?;
                }
                self.rep.bytes_written += len as u64;
                Check::Nothing
            }
            Kind::Read | Kind::ReadSg => {
                let len = self.rng.size(1, self.max_size);
                let off = self.rng.range(0, self.area - len);
                return self.post_read(e, slot, off, len, kind == Kind::ReadSg, false);
            }
            Kind::Send => {
                let len = self
                    .rng
                    .size(SEND_HDR, RECV_LEN.min(self.max_size.max(SEND_HDR)));
                let seq = self.rep.recv_ops[e];
                let seed = self.rng.next();
                self.scratch.resize(len, 0);
                fill(seed, &mut self.scratch[SEND_HDR..]);
                let h = &mut self.scratch[..SEND_HDR];
                h[0..4].copy_from_slice(&SEND_MAGIC.to_le_bytes());
                h[4..6].copy_from_slice(&(self.t as u16).to_le_bytes());
                h[6..8].copy_from_slice(&(e as u16).to_le_bytes());
                h[8..16].copy_from_slice(&seq.to_le_bytes());
                h[16..24].copy_from_slice(&(len as u64).to_le_bytes());
                h[24..32].copy_from_slice(&seed.to_le_bytes());
                self.src.write_at(base, &self.scratch)?;
                posted(ep.send(wr, &[self.src.slice(base, len)?]))?;
                self.rep.recv_ops[e] += 1;
                Check::Nothing
            }
            Kind::FetchAdd => {
                let add = self.rng.range(1, 1000) as u64;
                let off = Self::atomics(self.area, self.threads) as u64;
                posted(ep.fetch_add(wr, &key, off, add))?;
                Check::FetchAdd { add }
            }
            Kind::CompareSwap => {
                let old = self.rep.cas[e];
                let swap = self.rng.next();
                let compare = if self.rng.next().is_multiple_of(2) {
                    old
                } else {
                    old ^ (1 + self.rng.next() % 255)
                };
                posted(ep.compare_swap(wr, &key, self.cas_off(), compare, swap))?;
                if compare == old {
                    self.rep.cas[e] = swap;
                }
                Check::Cas { old }
            }
        };
        self.rep.ops[kind.index()] += 1;
        self.push(
            e,
            Pending {
                wr,
                kind,
                slot,
                check,
                readback: false,
            },
        );
        Ok(())
    }

    /// Posts a read of `len` bytes at `off` of this thread's area on endpoint `e`, checked at
    /// completion against the model as it is now (operations on one endpoint execute in order).
    fn post_read(
        &mut self,
        e: usize,
        slot: usize,
        off: usize,
        len: usize,
        sg: bool,
        readback: bool,
    ) -> Result<()> {
        let base = slot * self.slot_len;
        let kind = if sg { Kind::ReadSg } else { Kind::Read };
        let pieces = if sg && len >= 2 {
            self.sg_pieces(len)
        } else {
            vec![(0, len)]
        };
        let sges = Self::sges(&self.dst, base, &pieces)?;
        let expect = self.rep.models[e][off..off + len].to_vec();
        let wr = self.wr();
        let target = self.area_base() + off as u64;
        self.eps[e]
            .read(wr, &sges, &self.keys[e], target)
            .with_context(|| format!("posting a read on endpoint {e}"))?;
        if readback {
            self.rep.readback_ops += 1;
        } else {
            self.rep.ops[kind.index()] += 1;
        }
        self.push(
            e,
            Pending {
                wr,
                kind,
                slot,
                check: Check::Bytes {
                    expect,
                    pieces,
                    target,
                },
                readback,
            },
        );
        Ok(())
    }

    /// Accounts for and checks one completion.
    fn complete(&mut self, c: Completion) -> Result<()> {
        self.rep.completions += 1;
        let e = *self
            .ep_index
            .get(&c.endpoint)
            .ok_or_else(|| anyhow!("completion of an unknown endpoint: {c:?}"))?;
        let Some(p) = self.fifo[e].pop_front() else {
            bail!("completion with nothing outstanding on endpoint {e} (a duplicate?): {c:?}");
        };
        if p.wr != c.wr_id {
            bail!(
                "completion out of post order or duplicated on endpoint {e}: expected wr_id {:#x}, got {c:?}",
                p.wr
            );
        }
        if c.status != Status::Success {
            bail!("{:?} on endpoint {e} failed: {c:?}", p.kind);
        }
        if c.kind != p.kind.completion() {
            bail!(
                "{:?} completed as {:?} on endpoint {e}: {c:?}",
                p.kind,
                c.kind
            );
        }
        let base = p.slot * self.slot_len;
        match p.check {
            Check::Nothing => {}
            Check::Bytes {
                expect,
                pieces,
                target,
            } => {
                self.scratch.clear();
                for (o, l) in pieces {
                    let at = self.scratch.len();
                    self.scratch.resize(at + l, 0);
                    self.dst.read_at(base + o, &mut self.scratch[at..])?;
                }
                if self.scratch != expect {
                    let d = first_diff(&self.scratch, &expect);
                    bail!(
                        "read of {} bytes at target offset {target} on endpoint {e} returned wrong data: first difference at byte {d} (got {:#04x}, model {:#04x}){}",
                        expect.len(),
                        self.scratch[d],
                        expect[d],
                        if p.readback { " [final read-back]" } else { "" }
                    );
                }
                if c.byte_len != expect.len() as u64 {
                    bail!(
                        "read completion byte_len {} != {}",
                        c.byte_len,
                        expect.len()
                    );
                }
                if p.readback {
                    self.rep.bytes_readback_verified += expect.len() as u64;
                } else {
                    self.rep.bytes_read_verified += expect.len() as u64;
                }
            }
            Check::FetchAdd { add } => {
                let old = c
                    .value
                    .ok_or_else(|| anyhow!("fetch-add without a value: {c:?}"))?;
                self.rep.fetch_adds[e].push((old, add));
            }
            Check::Cas { old } => {
                let got = c
                    .value
                    .ok_or_else(|| anyhow!("compare-swap without a value: {c:?}"))?;
                if got != old {
                    bail!(
                        "compare-swap on endpoint {e} returned {got:#x}, the model says {old:#x}"
                    );
                }
            }
        }
        self.free.push(p.slot);
        Ok(())
    }

    fn wait_one(&mut self) -> Result<()> {
        match self.mailbox.wait(self.stall) {
            Some(c) => self.complete(c),
            None => bail!(
                "thread {}: no completion within {:?} with {} operation(s) outstanding",
                self.t,
                self.stall,
                self.inflight()
            ),
        }
    }

    fn run(mut self, end: Instant, abort: &AtomicBool) -> Result<WorkerReport> {
        let r = self.run_inner(end, abort);
        if r.is_err() {
            abort.store(true, Ordering::Release);
        }
        r.map(|()| self.rep)
    }

    fn run_inner(&mut self, end: Instant, abort: &AtomicBool) -> Result<()> {
        while Instant::now() < end && !abort.load(Ordering::Acquire) {
            while let Some(c) = self.mailbox.try_pop() {
                self.complete(c)?;
            }
            if self.inflight() < self.depth {
                self.post_random()?;
            } else {
                self.wait_one()?;
            }
        }
        while self.inflight() > 0 {
            self.wait_one()?;
        }
        if abort.load(Ordering::Acquire) {
            return Ok(());
        }
        // Final read-back of the whole area on every endpoint.
        for e in 0..self.eps.len() {
            let mut off = 0;
            while off < self.area {
                if self.inflight() >= self.depth {
                    self.wait_one()?;
                }
                let len = self.max_size.min(self.area - off);
                let slot = self.free.pop().expect("a free slot below depth");
                self.post_read(e, slot, off, len, false, true)?;
                off += len;
            }
        }
        while self.inflight() > 0 {
            self.wait_one()?;
        }
        Ok(())
    }
}

// ------------------------------------------------------------------ soak: the target side

/// What the server's receive thread saw.
#[derive(Default)]
struct RecvState {
    /// Per endpoint, per thread: receives matched so far (= next expected sequence).
    next: Vec<Vec<u64>>,
    bytes_verified: u64,
    error: Option<String>,
}

fn serve_receives(
    eps: Vec<Arc<Endpoint>>,
    bufs: Vec<Region>,
    rcq: CompletionQueue,
    state: Arc<Mutex<RecvState>>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let ids: HashMap<u64, usize> = eps.iter().enumerate().map(|(i, e)| (e.id(), i)).collect();
    for (e, ep) in eps.iter().enumerate() {
        for s in 0..RECVS_PER_EP {
            ep.post_recv(
                ((e as u64) << 32) | s as u64,
                &[bufs[e].slice(s * RECV_LEN, RECV_LEN)?],
            )?;
        }
    }
    let mut buf = Vec::new();
    let mut want = Vec::new();
    let r = (|| -> Result<()> {
        while !stop.load(Ordering::Acquire) {
            let Some(c) = rcq.wait(Duration::from_millis(50)) else {
                continue;
            };
            let (e, s) = ((c.wr_id >> 32) as usize, (c.wr_id & 0xFFFF_FFFF) as usize);
            if ids.get(&c.endpoint) != Some(&e) || s >= RECVS_PER_EP {
                bail!("receive completion of an unknown buffer: {c:?}");
            }
            if c.status != Status::Success {
                bail!("receive on endpoint {e} failed: {c:?}");
            }
            let mut st = state.lock().expect("recv state");
            let threads = st.next[e].len();
            match c.kind {
                CompletionKind::Recv => {
                    let len = c.byte_len as usize;
                    if !(SEND_HDR..=RECV_LEN).contains(&len) {
                        bail!("receive of {len} bytes on endpoint {e}: {c:?}");
                    }
                    buf.resize(len, 0);
                    bufs[e].read_at(s * RECV_LEN, &mut buf)?;
                    let u = |a: usize, b: usize| -> u64 {
                        let mut w = [0u8; 8];
                        w[..b - a].copy_from_slice(&buf[a..b]);
                        u64::from_le_bytes(w)
                    };
                    let (magic, t, ep, seq, hlen, seed) = (
                        u(0, 4) as u32,
                        u(4, 6) as usize,
                        u(6, 8) as usize,
                        u(8, 16),
                        u(16, 24) as usize,
                        u(24, 32),
                    );
                    if magic != SEND_MAGIC || ep != e || t >= threads || hlen != len {
                        bail!(
                            "receive on endpoint {e} has a bad header (magic {magic:#x}, thread {t}, endpoint {ep}, length {hlen} of {len})"
                        );
                    }
                    if seq != st.next[e][t] {
                        bail!(
                            "receive on endpoint {e} from thread {t}: sequence {seq}, expected {} (lost, duplicated or reordered)",
                            st.next[e][t]
                        );
                    }
                    want.resize(len - SEND_HDR, 0);
                    fill(seed, &mut want);
                    if buf[SEND_HDR..] != want[..] {
                        bail!(
                            "send {seq} of thread {t} on endpoint {e} arrived corrupted at byte {}",
                            SEND_HDR + first_diff(&buf[SEND_HDR..], &want)
                        );
                    }
                    st.next[e][t] += 1;
                    st.bytes_verified += len as u64;
                }
                CompletionKind::RecvWriteImm => {
                    let imm = c
                        .imm
                        .ok_or_else(|| anyhow!("write-with-imm receive without imm: {c:?}"))?;
                    let (t, seq) = ((imm >> 24) as usize, (imm & 0xFF_FFFF) as u64);
                    if t >= threads || seq != st.next[e][t] & 0xFF_FFFF {
                        bail!(
                            "write-with-imm on endpoint {e}: immediate {imm:#x} (thread {t}, sequence {seq}), expected sequence {} (lost, duplicated or reordered)",
                            st.next.get(e).and_then(|v| v.get(t)).copied().unwrap_or(0)
                        );
                    }
                    st.next[e][t] += 1;
                }
                other => bail!("unexpected receive completion kind {other:?}: {c:?}"),
            }
            drop(st);
            eps[e].post_recv(c.wr_id, &[bufs[e].slice(s * RECV_LEN, RECV_LEN)?])?;
        }
        Ok(())
    })();
    if let Err(e) = &r {
        state.lock().expect("recv state").error = Some(format!("{e:#}"));
        stop.store(true, Ordering::Release);
    }
    r
}

// ------------------------------------------------------------------ soak: the run

/// The soak's summary (printed and written with `--json`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SoakSummary {
    /// "soak".
    pub mode: String,
    /// "netns" or "loopback".
    pub network: String,
    /// Rails per endpoint.
    pub rails: usize,
    /// Worker threads.
    pub threads: usize,
    /// Endpoints.
    pub endpoints: usize,
    /// Seed of the mix.
    pub seed: u64,
    /// Seconds of random operations.
    pub duration_s: f64,
    /// Seconds of the whole run (set-up to teardown).
    pub wall_s: f64,
    /// Operations posted, by kind.
    pub ops: BTreeMap<String, u64>,
    /// All random operations.
    pub ops_total: u64,
    /// Reads of the final read-back.
    pub readback_ops: u64,
    /// Completions received (each matched to exactly one posted wr_id).
    pub completions: u64,
    /// Bytes written (write, write_with_imm, write_sg).
    pub bytes_written: u64,
    /// Bytes returned by reads during the run and checked against the model.
    pub bytes_read_verified: u64,
    /// Bytes of the final read-back over braid, checked against the model.
    pub bytes_readback_verified: u64,
    /// Bytes of the server's memory compared with the model directly at the end.
    pub bytes_memory_verified: u64,
    /// Bytes of received messages checked.
    pub bytes_received_verified: u64,
    /// Sum of the verified byte counts.
    pub bytes_verified: u64,
    /// Receives matched (sends and writes-with-immediate), each exactly once and in order.
    pub receives_matched: u64,
    /// Fetch-adds whose results chain exactly (no gap, no repeat) to the final counter.
    pub fetch_adds_checked: u64,
    /// Link downs (or socket breaks on loopback) injected.
    pub failures_injected: u64,
    /// Rail failures seen on the client's endpoints (alive -> dead).
    pub rail_failures_client: u64,
    /// Rail failures seen on the server's endpoints.
    pub rail_failures_server: u64,
    /// Rails re-joined on the client's endpoints (dead -> alive).
    pub rails_rejoined_client: u64,
    /// Rails re-joined on the server's endpoints.
    pub rails_rejoined_server: u64,
    /// Seconds from each link-up (loopback: break) until every rail of every endpoint was
    /// alive again on both sides.
    pub rejoin_s: Vec<f64>,
    /// Per client endpoint: payload bytes sent per rail.
    pub rail_bytes_client: Vec<Vec<u64>>,
    /// Per client endpoint: bytes sent on the flapped rail after its last re-join.
    pub flapped_rail_bytes_after_rejoin: Vec<u64>,
    /// Peak RSS (VmHWM) of the process, MiB.
    pub max_rss_mb: f64,
    /// The bound it was checked against, MiB.
    pub rss_bound_mb: u64,
    /// What went wrong.
    pub errors: Vec<String>,
    /// True when every check passed.
    pub passed: bool,
}

/// `braid soak ...`: runs the selected mode, prints its summary, fails when a check failed.
pub fn main(a: &SoakArgs) -> Result<()> {
    if a.kill_peer {
        let r = kill_peer(a)?;
        if let Some(p) = &a.json {
            write_json(p, &r)?;
        }
        if !r.passed {
            bail!("kill-peer check failed: {}", r.errors.join("; "));
        }
        return Ok(());
    }
    if a.failover_transfer {
        let r = failover_transfer(a)?;
        if let Some(p) = &a.json {
            write_json(p, &r)?;
        }
        if !r.passed {
            bail!("failover transfer failed: {}", r.errors.join("; "));
        }
        return Ok(());
    }
    let s = soak(a)?;
    if let Some(p) = &a.json {
        write_json(p, &s)?;
    }
    if !s.passed {
        bail!("soak failed: {}", s.errors.join("; "));
    }
    Ok(())
}

fn print_summary(s: &SoakSummary) {
    println!(
        "soak on {} ({} rails, {} endpoints, {} threads, seed {}): {:.1} s of operations, {:.1} s in all",
        s.network, s.rails, s.endpoints, s.threads, s.seed, s.duration_s, s.wall_s
    );
    let ops: Vec<String> = s.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "  operations: {} ({}); read-back reads {}",
        s.ops_total,
        ops.join(", "),
        s.readback_ops
    );
    println!(
        "  completions {} (one per wr_id, in order); receives matched {}; fetch-adds chained {}",
        s.completions, s.receives_matched, s.fetch_adds_checked
    );
    println!(
        "  bytes written {}; verified {} (reads {}, read-back {}, memory {}, received {})",
        s.bytes_written,
        s.bytes_verified,
        s.bytes_read_verified,
        s.bytes_readback_verified,
        s.bytes_memory_verified,
        s.bytes_received_verified
    );
    println!(
        "  failures injected {}; rail failures seen client {} / server {}; rails re-joined client {} / server {}; re-join after {:?} s",
        s.failures_injected,
        s.rail_failures_client,
        s.rail_failures_server,
        s.rails_rejoined_client,
        s.rails_rejoined_server,
        s.rejoin_s
            .iter()
            .map(|x| (x * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    println!(
        "  rail bytes (client endpoints) {:?}; flapped rail after re-join {:?}",
        s.rail_bytes_client, s.flapped_rail_bytes_after_rejoin
    );
    println!(
        "  max RSS {:.1} MiB (bound {} MiB)",
        s.max_rss_mb, s.rss_bound_mb
    );
    if s.passed {
        println!("  PASSED");
    } else {
        for e in &s.errors {
            println!("  ERROR: {e}");
        }
        println!("  FAILED");
    }
}

/// Counts alive/dead transitions of every rail of some endpoints.
struct RailWatch {
    prev: Vec<Vec<bool>>,
    failures: u64,
    rejoins: u64,
}

impl RailWatch {
    fn new(eps: &[Arc<Endpoint>]) -> RailWatch {
        RailWatch {
            prev: eps.iter().map(|e| e.rails_alive()).collect(),
            failures: 0,
            rejoins: 0,
        }
    }
    fn sample(&mut self, eps: &[Arc<Endpoint>]) -> bool {
        let mut all = true;
        for (i, e) in eps.iter().enumerate() {
            let now = e.rails_alive();
            for (r, &a) in now.iter().enumerate() {
                match (self.prev[i][r], a) {
                    (true, false) => self.failures += 1,
                    (false, true) => self.rejoins += 1,
                    _ => {}
                }
                all &= a;
            }
            self.prev[i] = now;
        }
        all
    }
}

/// Runs the soak.
pub fn soak(a: &SoakArgs) -> Result<SoakSummary> {
    let t_start = Instant::now();
    let duration = secs(a.duration, "--duration")?;
    let peer_timeout = secs(a.peer_timeout, "--peer-timeout")?;
    if a.threads == 0 || a.threads > 64 {
        bail!("--threads must be 1..64");
    }
    if a.endpoints == 0 || a.endpoints > 64 {
        bail!("--endpoints must be 1..64");
    }
    if a.depth == 0 || a.depth > 256 {
        bail!("--depth must be 1..256");
    }
    if a.max_size < 8 || a.max_size > 16 << 20 || a.area < a.max_size || a.area > 256 << 20 {
        bail!("need 8 <= --max-size <= 16M and --max-size <= --area <= 256M");
    }
    if a.flap_rail >= a.rails {
        bail!("--flap-rail {} but only {} rails", a.flap_rail, a.rails);
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let flap_for = secs(a.flap_for, "--flap-for")?;
    let flap_at = match a.flap_at {
        Some(x) => secs(x, "--flap-at")?,
        None => duration / 4,
    };
    let flap_every = a.flap_every.map(|x| secs(x, "--flap-every")).transpose()?;
    // The schedule of (down, up) times from the start of the operations.
    let mut flaps = Vec::new();
    if !a.no_flap {
        let mut at = flap_at;
        while at < duration && flaps.len() < 1000 {
            flaps.push((at, at + flap_for));
            match flap_every {
                Some(p) if p > flap_for => at += p,
                Some(_) => bail!("--flap-every must exceed --flap-for"),
                None => break,
            }
        }
    }

    let (t, n) = (a.threads, a.endpoints);
    let region_len = (Worker::atomics(a.area, t) + 4096 + 8 * t).next_multiple_of(4096);
    let slot_len = a.max_size + 4 * SG_GAP;
    let planned = n * (region_len + RECVS_PER_EP * RECV_LEN + t * a.area)
        + t * (2 * a.depth * slot_len + a.depth * a.max_size + a.max_size);
    let rss_bound_mb = a.max_rss_mb.unwrap_or(((2 * planned) >> 20) as u64 + 256);

    let net = Net::new(a.rails, a.rate, a.loopback)?;
    let cfg = session_config(peer_timeout);
    // Server queues: receives only. Client: one send queue shared by every endpoint.
    let sctx_cq_cap = n * RECVS_PER_EP + 16;
    let (ssq, srq) = (CompletionQueue::new(16), CompletionQueue::new(sctx_cq_cap));
    let (csq, crq) = (
        CompletionQueue::new(t * a.depth + 16),
        CompletionQueue::new(16),
    );
    let mut sopts = EndpointOptions::new(&ssq).with_recv_cq(&srq);
    sopts.session = cfg.clone();
    let mut copts = EndpointOptions::new(&csq).with_recv_cq(&crq);
    copts.session = cfg;
    copts.connect_timeout = Duration::from_secs(5);
    let pair = connect_pair(&net, n, contexts(&net)?, sopts, copts)?;

    let targets: Vec<Region> = (0..n)
        .map(|_| pair.sctx.alloc_region(region_len, Access::all()))
        .collect::<Result<_, _>>()?;
    let keys: Vec<RemoteKey> = targets.iter().map(Region::remote_key).collect();
    let recv_bufs: Vec<Region> = (0..n)
        .map(|_| {
            pair.sctx
                .alloc_region(RECVS_PER_EP * RECV_LEN, Access::LOCAL_WRITE)
        })
        .collect::<Result<_, _>>()?;

    let mut summary = SoakSummary {
        mode: "soak".into(),
        network: net.kind().into(),
        rails: a.rails,
        threads: t,
        endpoints: n,
        seed,
        rss_bound_mb,
        ..Default::default()
    };
    let mut errors = Vec::new();

    // Receive side (host 1).
    let rstate = Arc::new(Mutex::new(RecvState {
        next: vec![vec![0; t]; n],
        ..Default::default()
    }));
    let rstop = Arc::new(AtomicBool::new(false));
    let recv_job = {
        let (eps, bufs, rcq, st, stop) = (
            pair.seps.clone(),
            recv_bufs.clone(),
            srq.clone(),
            rstate.clone(),
            rstop.clone(),
        );
        net.spawn(1, move || serve_receives(eps, bufs, rcq, st, stop))?
    };

    // Client side (host 0): the dispatcher and the workers.
    let boxes: Vec<Arc<Mailbox>> = (0..t).map(|_| Arc::new(Mailbox::default())).collect();
    let dstop = Arc::new(AtomicBool::new(false));
    let strays = Arc::new(Mutex::new(Vec::<Completion>::new()));
    let dispatch_job = {
        let (cq, boxes, stop, strays) = (csq.clone(), boxes.clone(), dstop.clone(), strays.clone());
        net.spawn(0, move || -> Result<()> {
            let mut got = Vec::new();
            while !stop.load(Ordering::Acquire) {
                if let Some(c) = cq.wait(Duration::from_millis(20)) {
                    got.push(c);
                    cq.poll_many(&mut got, 256);
                }
                for c in got.drain(..) {
                    match boxes.get((c.wr_id >> 48) as usize) {
                        Some(b) => b.push(c),
                        None => strays.lock().expect("strays").push(c),
                    }
                }
            }
            Ok(())
        })?
    };
    let abort = Arc::new(AtomicBool::new(false));
    let stall = Duration::from_secs(15).max(peer_timeout * 10);
    let t_ops = Instant::now();
    let end = t_ops + duration;
    let mut workers = Vec::new();
    for (w, mailbox) in boxes.iter().enumerate() {
        let worker = Worker {
            t: w,
            eps: pair.ceps.clone(),
            ep_index: pair
                .ceps
                .iter()
                .enumerate()
                .map(|(i, e)| (e.id(), i))
                .collect(),
            keys: keys.clone(),
            area: a.area,
            threads: t,
            max_size: a.max_size,
            depth: a.depth,
            slot_len,
            src: pair.cctx.alloc_region(a.depth * slot_len, Access::all())?,
            dst: pair.cctx.alloc_region(a.depth * slot_len, Access::all())?,
            free: (0..a.depth).collect(),
            fifo: (0..n).map(|_| VecDeque::new()).collect(),
            next_wr: 0,
            rng: Rng::new(seed ^ ((w as u64 + 1) << 40)),
            mailbox: mailbox.clone(),
            stall,
            rep: WorkerReport {
                models: vec![vec![0; a.area]; n],
                cas: vec![0; n],
                fetch_adds: vec![Vec::new(); n],
                recv_ops: vec![0; n],
                ..Default::default()
            },
            scratch: Vec::new(),
        };
        let abort = abort.clone();
        workers.push(net.spawn(0, move || worker.run(end, &abort))?);
    }

    // Fault injection and rail watching (this thread), until the workers are done.
    let mut cwatch = RailWatch::new(&pair.ceps);
    let mut swatch = RailWatch::new(&pair.seps);
    let mut down = false;
    let mut next_flap = 0;
    let mut awaiting_rejoin: Option<Instant> = None;
    let mut rejoin_bytes: Vec<u64> = vec![0; n];
    let hard_end = end + stall * 3 + Duration::from_secs(60);
    let flap_rail = a.flap_rail;
    let set_link = |up: bool| -> Result<()> { net.set_link(flap_rail, up, &pair.ceps) };
    while workers.iter().any(|w| !w.is_finished()) {
        let now = Instant::now();
        if now > hard_end {
            abort.store(true, Ordering::Release);
            errors.push("the workers did not finish in time".to_string());
            break;
        }
        let el = now.duration_since(t_ops);
        if let Some(&(d, u)) = flaps.get(next_flap) {
            if !down && el >= d && !abort.load(Ordering::Acquire) {
                set_link(false)?;
                summary.failures_injected += 1;
                down = true;
                if net.tb.is_none() {
                    // Loopback: the break is the whole failure.
                    down = false;
                    next_flap += 1;
                    awaiting_rejoin = Some(now);
                }
            } else if down && el >= u {
                set_link(true)?;
                down = false;
                next_flap += 1;
                awaiting_rejoin = Some(now);
            }
        }
        let c_all = cwatch.sample(&pair.ceps);
        let s_all = swatch.sample(&pair.seps);
        if let Some(since) = awaiting_rejoin
            && c_all
            && s_all
        {
            summary.rejoin_s.push(since.elapsed().as_secs_f64());
            awaiting_rejoin = None;
            rejoin_bytes = pair
                .ceps
                .iter()
                .map(|e| e.rail_bytes_sent()[flap_rail])
                .collect();
        }
        // A sampling period, not synchronisation: the rails are polled for transitions.
        std::thread::sleep(Duration::from_millis(10));
    }
    let t_ops_done = Instant::now();
    if down {
        set_link(true)?;
        awaiting_rejoin = Some(Instant::now());
    }
    let mut reports = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        match join(w) {
            Ok(r) => reports.push(r),
            Err(e) => errors.push(format!("thread {i}: {e:#}")),
        }
    }
    summary.duration_s = t_ops_done.duration_since(t_ops).as_secs_f64();

    // Every rail back, on both sides (bounded).
    if let Some(since) = awaiting_rejoin {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c_all = cwatch.sample(&pair.ceps);
            let s_all = swatch.sample(&pair.seps);
            if c_all && s_all {
                summary.rejoin_s.push(since.elapsed().as_secs_f64());
                break;
            }
            if Instant::now() > deadline {
                errors.push(format!(
                    "rail {flap_rail} did not re-join within 20 s of the link coming back: client {:?}, server {:?}",
                    pair.ceps.iter().map(|e| e.rails_alive()).collect::<Vec<_>>(),
                    pair.seps.iter().map(|e| e.rails_alive()).collect::<Vec<_>>()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    // Every receive matched (bounded wait for the last receive completions).
    let want: Vec<Vec<u64>> = (0..n)
        .map(|e| reports.iter().map(|r| r.recv_ops[e]).collect())
        .collect();
    if reports.len() == t {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = rstate.lock().expect("recv state");
            if st.error.is_some() || st.next == want {
                break;
            }
            drop(st);
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // A quiet period for duplicates: nothing more may arrive at either side.
    if let Some(c) = srq.wait(Duration::from_millis(200)) {
        errors.push(format!("an extra receive completion arrived: {c:?}"));
    }
    rstop.store(true, Ordering::Release);
    if let Err(e) = join(recv_job) {
        errors.push(format!("receive side: {e:#}"));
    }
    dstop.store(true, Ordering::Release);
    if let Err(e) = join(dispatch_job) {
        errors.push(format!("dispatcher: {e:#}"));
    }
    if let Some(c) = csq.poll() {
        errors.push(format!("an extra completion arrived: {c:?}"));
    }
    for c in strays.lock().expect("strays").iter() {
        errors.push(format!("a completion of no thread: {c:?}"));
    }
    for (i, b) in boxes.iter().enumerate() {
        if let Some(c) = b.try_pop() {
            errors.push(format!("an extra completion for thread {i}: {c:?}"));
        }
    }
    {
        let st = rstate.lock().expect("recv state");
        summary.bytes_received_verified = st.bytes_verified;
        summary.receives_matched = st.next.iter().flatten().sum();
        if reports.len() == t && st.next != want {
            errors.push(format!(
                "receives matched per endpoint and thread {:?}, but the client completed {:?}",
                st.next, want
            ));
        }
    }

    // The client's figures, the server's memory against the models, the atomics.
    if reports.len() == t {
        for (w, r) in reports.iter().enumerate() {
            for (e, target) in targets.iter().enumerate() {
                let got = target.to_vec(w * a.area, a.area)?;
                if got != r.models[e] {
                    let d = first_diff(&got, &r.models[e]);
                    errors.push(format!(
                        "server memory of thread {w}'s area on endpoint {e} differs from the model at byte {d}"
                    ));
                } else {
                    summary.bytes_memory_verified += a.area as u64;
                }
                let cas = target
                    .atomic_u64(Worker::atomics(a.area, t) + 8 * (1 + w))?
                    .load(Ordering::SeqCst);
                if cas != r.cas[e] {
                    errors.push(format!(
                        "compare-swap word of thread {w} on endpoint {e} is {cas:#x}, the model says {:#x}",
                        r.cas[e]
                    ));
                }
            }
        }
        for (e, target) in targets.iter().enumerate() {
            let mut fa: Vec<(u64, u64)> = reports
                .iter()
                .flat_map(|r| r.fetch_adds[e].iter().copied())
                .collect();
            fa.sort_unstable();
            let mut cur = 0u64;
            for &(old, add) in &fa {
                if old != cur {
                    errors.push(format!(
                        "fetch-add results on endpoint {e} do not chain: an old value {old} where {cur} was due (an add lost or applied twice)"
                    ));
                    break;
                }
                cur += add;
            }
            let fin = target
                .atomic_u64(Worker::atomics(a.area, t))?
                .load(Ordering::SeqCst);
            if fin != cur {
                errors.push(format!(
                    "fetch-add counter on endpoint {e} is {fin}, the completed adds sum to {cur}"
                ));
            }
            summary.fetch_adds_checked += fa.len() as u64;
        }
    }
    for r in &reports {
        for (i, k) in KINDS.iter().enumerate() {
            *summary.ops.entry(k.1.to_string()).or_default() += r.ops[i];
        }
        summary.ops_total += r.ops.iter().sum::<u64>();
        summary.readback_ops += r.readback_ops;
        summary.completions += r.completions;
        summary.bytes_written += r.bytes_written;
        summary.bytes_read_verified += r.bytes_read_verified;
        summary.bytes_readback_verified += r.bytes_readback_verified;
    }
    summary.bytes_verified = summary.bytes_read_verified
        + summary.bytes_readback_verified
        + summary.bytes_memory_verified
        + summary.bytes_received_verified;
    summary.rail_failures_client = cwatch.failures;
    summary.rail_failures_server = swatch.failures;
    summary.rails_rejoined_client = cwatch.rejoins;
    summary.rails_rejoined_server = swatch.rejoins;
    summary.rail_bytes_client = pair.ceps.iter().map(|e| e.rail_bytes_sent()).collect();
    if summary.failures_injected > 0 {
        summary.flapped_rail_bytes_after_rejoin = pair
            .ceps
            .iter()
            .zip(&rejoin_bytes)
            .map(|(e, b)| e.rail_bytes_sent()[flap_rail].saturating_sub(*b))
            .collect();
        if summary.rail_failures_client == 0 {
            errors.push("a failure was injected but no client rail was seen failing".into());
        }
    }
    for e in pair.ceps.iter().chain(&pair.seps) {
        if e.is_closed() {
            errors.push(format!(
                "endpoint {} failed or closed during the soak",
                e.id()
            ));
        }
    }
    if summary.ops_total == 0 {
        errors.push("no operation was posted".into());
    }

    // Teardown: client first, then the server; then memory.
    for e in &pair.ceps {
        e.close();
    }
    for e in &pair.seps {
        e.close();
    }
    drop(pair.listener);
    summary.max_rss_mb = max_rss_kib() as f64 / 1024.0;
    if summary.max_rss_mb > rss_bound_mb as f64 {
        errors.push(format!(
            "peak RSS {:.1} MiB exceeds the bound of {rss_bound_mb} MiB",
            summary.max_rss_mb
        ));
    }
    drop(net);
    summary.wall_s = t_start.elapsed().as_secs_f64();
    summary.passed = errors.is_empty();
    summary.errors = errors;
    print_summary(&summary);
    Ok(summary)
}

// ------------------------------------------------------------------ failover transfer

/// Result of `--failover-transfer`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TransferReport {
    /// "failover-transfer".
    pub mode: String,
    /// "netns" or "loopback".
    pub network: String,
    /// Rails of the endpoint.
    pub rails: usize,
    /// The failed rail.
    pub failed_rail: usize,
    /// Bytes written.
    pub bytes: u64,
    /// Size of each write.
    pub op_size: usize,
    /// Writes in flight.
    pub depth: usize,
    /// Seconds from the first post to the failure.
    pub fail_at_s: f64,
    /// Seconds from the link going down to the client seeing the rail dead.
    pub detect_s: f64,
    /// Goodput before the failure (first completion to the failure), MB/s.
    pub before_mb_s: f64,
    /// Goodput after detection, over writes posted after it, MB/s.
    pub after_mb_s: f64,
    /// after / before.
    pub ratio: f64,
    /// Framing limit of the surviving rails (testbed), MB/s.
    pub surviving_limit_mb_s: f64,
    /// after / that limit.
    pub after_of_limit: f64,
    /// Whole transfer, MB/s.
    pub overall_mb_s: f64,
    /// Longest time between two completions, seconds.
    pub longest_gap_s: f64,
    /// Bytes checked in the target's memory.
    pub bytes_verified: u64,
    /// Payload bytes sent per rail.
    pub rail_bytes: Vec<u64>,
    /// Rails alive at the end (client side).
    pub rails_alive: Vec<bool>,
    /// Least acceptable ratio (checked on the testbed only).
    pub min_ratio: f64,
    /// What went wrong.
    pub errors: Vec<String>,
    /// True when every check passed.
    pub passed: bool,
}

/// Stamps the write number into every KiB of a source buffer, so every write's data is unique.
fn stamp(buf: &mut [u8], i: u64) {
    for c in buf.chunks_mut(1024) {
        let n = c.len().min(8);
        c[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    }
}

/// Seconds of writes the failover transfer must have left to measure after the failure is
/// detected, at the least.
const FAILOVER_MEASURE_S: f64 = 0.5;

/// Fewest bytes a failover transfer on `spec` needs so that, even at the framing limit of
/// every rail (tbf lets nothing go faster), writes are still posted after the failure of
/// `rail` at `fail_after` has been detected, `peer_timeout` later, and go on for
/// [`FAILOVER_MEASURE_S`]. A smaller transfer passes or fails by chance: when the failed rail
/// happens to have nothing in flight as its link goes down, nothing waits for the detection,
/// and the writes may all be done before it.
fn least_failover_bytes(
    spec: &TestbedSpec,
    rail: usize,
    fail_after: Duration,
    peer_timeout: Duration,
) -> f64 {
    let limit = |skip: Option<usize>| -> f64 {
        (0..spec.rails())
            .filter(|&i| Some(i) != skip)
            .map(|i| testbed::framing_limit_mb_s(spec.rates[i], spec.mtu) * 1e6)
            .sum()
    };
    limit(None) * fail_after.as_secs_f64()
        + limit(Some(rail)) * (peer_timeout.as_secs_f64() + FAILOVER_MEASURE_S)
}

/// A stream of verified writes over one endpoint while one rail's link goes down for good.
pub fn failover_transfer(a: &SoakArgs) -> Result<TransferReport> {
    let peer_timeout = secs(a.peer_timeout, "--peer-timeout")?;
    let fail_after = secs(a.fail_after, "--fail-after")?;
    let op = a.op_size;
    if op == 0 || op > 64 << 20 || a.transfer_size < op || a.transfer_size > 16 << 30 {
        bail!("need 0 < --op-size <= 64M and --op-size <= --transfer-size <= 16G");
    }
    if a.flap_rail >= a.rails || a.rails < 2 {
        bail!("--fail-rail must name one of at least 2 rails");
    }
    let depth = a.depth.clamp(1, 64);
    let nops = a.transfer_size / op;
    let total = nops * op;
    let net = Net::new(a.rails, a.rate, a.loopback)?;
    if let Some(tb) = &net.tb {
        let least = least_failover_bytes(tb.spec(), a.flap_rail, fail_after, peer_timeout);
        if (total as f64) < least {
            bail!(
                "--transfer-size {total} is too small: even at the rails' framing limit the writes must outlast the failure at {:.2} s, its detection (up to --peer-timeout {:.2} s of silence) and {FAILOVER_MEASURE_S} s measured after it, which takes at least {:.0} bytes",
                fail_after.as_secs_f64(),
                peer_timeout.as_secs_f64(),
                least.ceil()
            );
        }
    }
    let (ssq, csq) = (CompletionQueue::new(16), CompletionQueue::new(depth + 16));
    let mut sopts = EndpointOptions::new(&ssq);
    sopts.session = session_config(peer_timeout);
    let mut copts = EndpointOptions::new(&csq);
    copts.session = session_config(peer_timeout);
    let (sctx, cctx) = contexts(&net)?;
    // Resident from the start, as verbs registration pins memory: the goodput figures measure
    // the rails, not the first-touch page faults of the target, which the receiving engine
    // thread would otherwise take inside the measured intervals (on a VM whose host backs
    // guest memory lazily, 2-3x dearer for pages the guest never touched, so "before" and
    // "after" would each pay a different, unpredictable share). Made before the endpoints:
    // populating 1 GiB takes seconds on a loaded machine, and nothing is to run meanwhile.
    let target = sctx.alloc_region_with(total, Access::all(), RESIDENT)?;
    let key = target.remote_key();
    // Source buffers: NSRC patterns; a buffer is rewritten (stamped) only while unused.
    const NSRC: usize = 16;
    let depth = depth.min(NSRC / 2);
    let src = cctx.alloc_region_with(NSRC * op, Access::all(), RESIDENT)?;
    let mut pat = vec![0u8; op];
    for s in 0..NSRC {
        fill(0xFA11_0000 + s as u64, &mut pat);
        src.write_at(s * op, &pat)?;
    }
    let pair = connect_pair(&net, 1, (sctx, cctx), sopts, copts)?;
    let ep = pair.ceps[0].clone();
    let t_fail_cell = Arc::new(Mutex::new(None::<Instant>));
    let job = {
        let (ep, src, cq) = (ep.clone(), src.clone(), csq.clone());
        net.spawn(0, move || -> Result<(Instant, Vec<(Instant, Instant)>)> {
            let t0 = Instant::now();
            let mut times = Vec::with_capacity(nops);
            let mut posted_at = VecDeque::new();
            let mut next = 0usize;
            while times.len() < nops {
                while next < nops && posted_at.len() < depth {
                    let s = next % NSRC;
                    // Stamp the write number into the first 8 bytes of each KiB, in place
                    // (the buffer is not in flight: depth <= NSRC / 2).
                    let stamp_bytes = (next as u64).to_le_bytes();
                    for k in (0..op).step_by(1024) {
                        let n = (op - k).min(8);
                        src.write_at(s * op + k, &stamp_bytes[..n])?;
                    }
                    ep.write(
                        next as u64,
                        &[src.slice(s * op, op)?],
                        &key,
                        (next * op) as u64,
                    )
                    .with_context(|| format!("posting write {next}"))?;
                    posted_at.push_back(Instant::now());
                    next += 1;
                }
                let c = cq.wait(Duration::from_secs(30)).ok_or_else(|| {
                    anyhow!(
                        "no completion within 30 s after {} of {nops} writes (client rails alive {:?}): the transfer hangs",
                        times.len(),
                        ep.rails_alive()
                    )
                })?;
                let want = times.len() as u64;
                if c.wr_id != want || c.status != Status::Success {
                    bail!("write {want}: unexpected completion {c:?}");
                }
                times.push((posted_at.pop_front().expect("posted"), Instant::now()));
            }
            Ok((t0, times))
        })?
    };
    // Fault injection and detection (this thread).
    let t0 = Instant::now();
    let mut t_fail = None;
    let mut t_detect = None;
    while !job.is_finished() {
        let now = Instant::now();
        if t_fail.is_none() && now >= t0 + fail_after {
            net.set_link(a.flap_rail, false, &pair.ceps)?;
            t_fail = Some(Instant::now());
            *t_fail_cell.lock().expect("cell") = t_fail;
        }
        if t_fail.is_some() && t_detect.is_none() && !ep.rails_alive()[a.flap_rail] {
            t_detect = Some(Instant::now());
        }
        if now > t0 + Duration::from_secs(600) {
            bail!("the transfer did not finish within 600 s");
        }
        // A sampling period for the rail state, not synchronisation.
        std::thread::sleep(Duration::from_millis(2));
    }
    let (tw0, times) = join(job)?;
    let mut r = TransferReport {
        mode: "failover-transfer".into(),
        network: net.kind().into(),
        rails: a.rails,
        failed_rail: a.flap_rail,
        bytes: total as u64,
        op_size: op,
        depth,
        min_ratio: a.min_ratio,
        rail_bytes: ep.rail_bytes_sent(),
        rails_alive: ep.rails_alive(),
        ..Default::default()
    };
    let mut errors = Vec::new();
    // Every byte: write i's piece is pattern (i % NSRC) stamped with i.
    for i in 0..nops {
        fill(0xFA11_0000 + (i % NSRC) as u64, &mut pat);
        stamp(&mut pat, i as u64);
        let got = target.to_vec(i * op, op)?;
        if got != pat {
            errors.push(format!(
                "write {i} (target offset {}) is wrong at byte {}",
                i * op,
                first_diff(&got, &pat)
            ));
            break;
        }
        r.bytes_verified += op as u64;
    }
    let mb = |n: usize, d: Duration| n as f64 * op as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    let last = times.last().expect("at least one write").1;
    r.overall_mb_s = mb(nops, last.duration_since(tw0));
    r.longest_gap_s = times
        .windows(2)
        .map(|w| w[1].1.duration_since(w[0].1).as_secs_f64())
        .fold(0.0, f64::max);
    match (t_fail, t_detect) {
        (Some(f), Some(d)) => {
            r.fail_at_s = f.duration_since(tw0).as_secs_f64();
            r.detect_s = d.duration_since(f).as_secs_f64();
            let before: Vec<Instant> = times.iter().map(|x| x.1).filter(|c| *c <= f).collect();
            if before.len() >= 2 {
                r.before_mb_s = mb(
                    before.len() - 1,
                    before[before.len() - 1].duration_since(before[0]),
                );
            } else {
                errors.push("fewer than 2 writes completed before the failure".into());
            }
            // After: writes posted after detection, from the completion of the first of them.
            match times.iter().position(|x| x.0 >= d) {
                Some(k) if nops - 1 > k + 1 => {
                    r.after_mb_s = mb(nops - 1 - k, last.duration_since(times[k].1));
                }
                _ => errors.push(
                    "too few writes after the failure was detected to measure (use a larger --transfer-size)"
                        .into(),
                ),
            }
            if r.before_mb_s > 0.0 {
                r.ratio = r.after_mb_s / r.before_mb_s;
            }
            if let Some(tb) = &net.tb {
                let spec = tb.spec();
                r.surviving_limit_mb_s = (0..a.rails)
                    .filter(|&i| i != a.flap_rail)
                    .map(|i| testbed::framing_limit_mb_s(spec.rates[i], spec.mtu))
                    .sum();
                r.after_of_limit = r.after_mb_s / r.surviving_limit_mb_s;
            }
            if net.tb.is_some() && r.ratio < a.min_ratio {
                errors.push(format!(
                    "goodput after the failure is {:.1}% of before, below {:.0}%",
                    r.ratio * 100.0,
                    a.min_ratio * 100.0
                ));
            }
        }
        (None, _) => errors.push(
            "the transfer ended before the failure was injected (use a larger --transfer-size)"
                .into(),
        ),
        (Some(f), None) => errors.push(format!(
            "the failed rail was never seen dead: the writes ended {:.2} s after its link went down (peer timeout {:.2} s)",
            last.saturating_duration_since(f).as_secs_f64(),
            peer_timeout.as_secs_f64()
        )),
    }
    if !r.rails_alive.iter().any(|x| *x) || ep.is_closed() {
        errors.push("the endpoint failed".into());
    }
    println!(
        "failover transfer on {} ({} rails, rail {} fails): {} bytes in {} writes of {} (depth {})",
        r.network, r.rails, r.failed_rail, r.bytes, nops, op, depth
    );
    println!(
        "  link down at {:.2} s, detected after {:.2} s; longest gap between completions {:.2} s",
        r.fail_at_s, r.detect_s, r.longest_gap_s
    );
    println!(
        "  goodput before {:.1} MB/s, after detection {:.1} MB/s ({:.1}%), whole transfer {:.1} MB/s",
        r.before_mb_s,
        r.after_mb_s,
        r.ratio * 100.0,
        r.overall_mb_s
    );
    if r.surviving_limit_mb_s > 0.0 {
        println!(
            "  after detection = {:.1}% of the surviving rails' framing limit ({:.1} MB/s)",
            r.after_of_limit * 100.0,
            r.surviving_limit_mb_s
        );
    }
    println!(
        "  verified {} bytes; rail bytes {:?}; rails alive {:?}",
        r.bytes_verified, r.rail_bytes, r.rails_alive
    );
    if net.tb.is_some() {
        // The link comes back before teardown, so the rail's re-join is exercised too.
        net.set_link(a.flap_rail, true, &pair.ceps)?;
    }
    for e in pair.ceps.iter().chain(&pair.seps) {
        e.close();
    }
    drop(pair.listener);
    drop(net);
    r.passed = errors.is_empty();
    for e in &errors {
        println!("  ERROR: {e}");
    }
    println!("  {}", if r.passed { "PASSED" } else { "FAILED" });
    r.errors = errors;
    Ok(r)
}

// ------------------------------------------------------------------ killed peer

/// Result of `--kill-peer`.
#[derive(Debug, Default, Serialize)]
pub struct KillReport {
    /// "kill-peer".
    pub mode: String,
    /// "netns" or "loopback".
    pub network: String,
    /// The signal sent.
    pub signal: Option<KillSignal>,
    /// The configured peer_timeout, seconds.
    pub peer_timeout_s: f64,
    /// Writes posted.
    pub posted: u64,
    /// Completions received (one per posted write).
    pub completions: u64,
    /// Writes that succeeded.
    pub succeeded: u64,
    /// Writes that completed with an error.
    pub failed: u64,
    /// Error statuses seen.
    pub statuses: Vec<String>,
    /// Seconds from the signal to the first error completion.
    pub first_error_s: f64,
    /// Seconds from the signal to the last completion.
    pub last_completion_s: f64,
    /// The bound: peer_timeout + 1 s.
    pub bound_s: f64,
    /// What went wrong.
    pub errors: Vec<String>,
    /// True when every check passed.
    pub passed: bool,
}

/// One completion: wr_id, status, when.
type Done = (u64, Status, Instant);

/// Kills (by its pid) and reaps a child this run started.
fn kill_child(child: &mut Child) {
    // SAFETY: kill(2) on the pid of our own child; SIGKILL also ends a stopped process.
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "braid soak: child {} did not exit after SIGKILL",
        child.id()
    );
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            kill_child(&mut self.0);
        }
    }
}

/// The peer's announcement on its stdout.
#[derive(Serialize, Deserialize)]
struct PeerHello {
    addrs: Vec<SocketAddr>,
    key: String,
}

/// `braid soak-peer`: listens, prints its addresses and region key, serves one endpoint.
pub fn peer_main(a: &PeerArgs) -> Result<()> {
    if a.listen.is_empty() {
        bail!("--listen needs at least one address");
    }
    let max = secs(a.max_seconds, "--max-seconds")?;
    let ctx = Context::new()?;
    let listener = ctx.listen(&a.listen)?;
    let region = ctx.alloc_region(a.size, Access::all())?;
    let hello = PeerHello {
        addrs: listener.local_addrs(),
        key: hex(&region.remote_key().to_bytes()),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&hello)?)?;
    out.flush()?;
    drop(out);
    let cq = ctx.create_cq(64);
    let mut opts = EndpointOptions::new(&cq);
    opts.session = session_config(secs(a.peer_timeout, "--peer-timeout")?);
    let ep = listener.accept(&opts, SETUP_TIMEOUT)?;
    let t0 = Instant::now();
    // Serve until the client goes away or the time is up (a bounded poll of the state).
    while !ep.is_closed() && t0.elapsed() < max {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A stream of writes to a peer process that is killed (or stopped) part-way.
pub fn kill_peer(a: &SoakArgs) -> Result<KillReport> {
    let peer_timeout = secs(a.peer_timeout, "--peer-timeout")?;
    let kill_after = secs(a.fail_after, "--kill-after")?;
    let op = a.op_size.clamp(4096, 16 << 20);
    let depth = a.depth.clamp(1, 64);
    let net = Net::new(a.rails, a.rate, a.loopback)?;
    let exe = std::env::current_exe().context("locating the braid executable")?;
    let addrs: Vec<String> = net.server_addrs().iter().map(|a| a.to_string()).collect();
    let region = 16 * op;
    let mut cmd = net.command(1, &exe);
    cmd.args(["soak-peer", "--listen", &addrs.join(",")])
        .arg("--size")
        .arg(region.to_string())
        .arg("--peer-timeout")
        .arg(a.peer_timeout.to_string())
        .arg("--max-seconds")
        .arg("60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = ChildGuard(cmd.spawn().context("starting the peer process")?);
    let pid = child.0.id();
    let stdout = child.0.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    let line = rx
        .recv_timeout(SETUP_TIMEOUT)
        .map_err(|_| anyhow!("the peer process did not announce itself within {SETUP_TIMEOUT:?}"))?
        .context("reading the peer's announcement")?;
    let hello: PeerHello = serde_json::from_str(line.trim())
        .with_context(|| format!("bad announcement from the peer: {line:?}"))?;
    let key = unhex(&hello.key)
        .and_then(|b| RemoteKey::from_bytes(&b))
        .ok_or_else(|| anyhow!("bad key from the peer"))?;
    // `ip netns exec` execs the program in place, so the pid is the peer's own.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() == "ip" {
        bail!("pid {pid} is `ip`, not the peer: cannot signal the peer by pid");
    }

    let cq = CompletionQueue::new(depth + 16);
    let mut copts = EndpointOptions::new(&cq);
    copts.session = session_config(peer_timeout);
    let ips = net.client_ips();
    let rails: Vec<RailAddr> = hello
        .addrs
        .iter()
        .zip(&ips)
        .map(|(r, ip)| RailAddr::new(Some(*ip), *r))
        .collect();
    let signalled = Arc::new(AtomicBool::new(false));
    let job = {
        let signalled = signalled.clone();
        net.spawn(0, move || -> Result<(u64, Vec<Done>)> {
            let ctx = Context::new()?;
            let ep = ctx.connect(&rails, &copts)?;
            let src = ctx.alloc_region(op, Access::all())?;
            let mut pat = vec![0u8; op];
            fill(7, &mut pat);
            src.write_at(0, &pat)?;
            let mut done = Vec::new();
            let mut posted = 0u64;
            let mut outstanding = 0usize;
            let mut failed = false;
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                while !failed && outstanding < depth {
                    let off = ((posted as usize) % 16 * op) as u64;
                    match ep.write(posted, &[src.as_sge()], &key, off) {
                        Ok(()) => {
                            posted += 1;
                            outstanding += 1;
                        }
                        Err(_) if signalled.load(Ordering::Acquire) => {
                            failed = true;
                        }
                        Err(e) => return Err(e).context("posting a write before the signal"),
                    }
                }
                if outstanding == 0 {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{outstanding} write(s) still outstanding after 120 s");
                }
                if let Some(c) = cq.wait(Duration::from_millis(100)) {
                    outstanding -= 1;
                    if c.status != Status::Success {
                        if !signalled.load(Ordering::Acquire) {
                            bail!("a write failed before the peer was signalled: {c:?}");
                        }
                        failed = true;
                    }
                    done.push((c.wr_id, c.status, Instant::now()));
                }
            }
            // Nothing more may arrive.
            if let Some(c) = cq.wait(Duration::from_millis(200)) {
                bail!("an extra completion arrived: {c:?}");
            }
            drop(ep);
            Ok((posted, done))
        })?
    };
    let t0 = Instant::now();
    let mut t_sig = None;
    while !job.is_finished() {
        if t_sig.is_none() && t0.elapsed() >= kill_after {
            let sig = match a.kill_signal {
                KillSignal::Kill => libc::SIGKILL,
                KillSignal::Stop => libc::SIGSTOP,
            };
            // SAFETY: kill(2) on the pid of the child this run started.
            if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
                bail!("kill({pid}): {}", std::io::Error::last_os_error());
            }
            t_sig = Some(Instant::now());
            signalled.store(true, Ordering::Release);
        }
        if t0.elapsed() > Duration::from_secs(150) {
            bail!("the writer did not finish within 150 s");
        }
        // The schedule of the signal, not synchronisation.
        std::thread::sleep(Duration::from_millis(2));
    }
    let res = join(job);
    drop(child);
    let (posted, done) = res?;
    let t_sig = t_sig.ok_or_else(|| anyhow!("the writes ended before the peer was signalled"))?;
    let mut r = KillReport {
        mode: "kill-peer".into(),
        network: net.kind().into(),
        signal: Some(a.kill_signal),
        peer_timeout_s: peer_timeout.as_secs_f64(),
        posted,
        completions: done.len() as u64,
        bound_s: peer_timeout.as_secs_f64() + 1.0,
        ..Default::default()
    };
    let mut errors = Vec::new();
    let ids: Vec<u64> = done.iter().map(|d| d.0).collect();
    if ids != (0..posted).collect::<Vec<_>>() {
        errors.push(format!(
            "completions are not exactly one per posted write in order ({} for {posted})",
            ids.len()
        ));
    }
    let mut statuses = std::collections::BTreeSet::new();
    for (_, s, at) in &done {
        if *s == Status::Success {
            r.succeeded += 1;
        } else {
            r.failed += 1;
            statuses.insert(format!("{s:?}"));
            if r.failed == 1 {
                r.first_error_s = at.saturating_duration_since(t_sig).as_secs_f64();
            }
        }
    }
    r.statuses = statuses.into_iter().collect();
    r.last_completion_s = done
        .last()
        .map(|d| d.2.saturating_duration_since(t_sig).as_secs_f64())
        .unwrap_or(0.0);
    if r.failed == 0 {
        errors.push("no write failed after the peer was signalled".into());
    }
    if r.last_completion_s > r.bound_s {
        errors.push(format!(
            "the last completion came {:.2} s after the signal, beyond peer_timeout + 1 s = {:.2} s",
            r.last_completion_s, r.bound_s
        ));
    }
    drop(net);
    r.passed = errors.is_empty();
    println!(
        "kill-peer on {} (SIG{}, peer_timeout {:.2} s): {} writes posted, {} ok, {} failed ({}); first error {:.3} s after the signal, last completion {:.3} s (bound {:.2} s)",
        r.network,
        match a.kill_signal {
            KillSignal::Kill => "KILL",
            KillSignal::Stop => "STOP",
        },
        r.peer_timeout_s,
        r.posted,
        r.succeeded,
        r.failed,
        r.statuses.join(","),
        r.first_error_s,
        r.last_completion_s,
        r.bound_s
    );
    for e in &errors {
        println!("  ERROR: {e}");
    }
    println!("  {}", if r.passed { "PASSED" } else { "FAILED" });
    r.errors = errors;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_fill() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let s = r.size(1, 1 << 20);
            assert!((1..=1 << 20).contains(&s));
            let s = r.size(32, 65536);
            assert!((32..=65536).contains(&s));
        }
        let mut a = vec![0u8; 13];
        let mut b = vec![0u8; 13];
        fill(5, &mut a);
        fill(5, &mut b);
        assert_eq!(a, b);
        fill(6, &mut b);
        assert_ne!(a, b);
        assert_eq!(unhex(&hex(&[1, 0xab, 0xff])), Some(vec![1, 0xab, 0xff]));
        assert!(max_rss_kib() > 0);
    }
}
