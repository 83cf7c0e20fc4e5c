//! A deterministic simulator for braid's sans-IO protocol core, in the manner of
//! quinn-proto's test harness.
//!
//! Two [`Session`]s (side 0 = "A", side 1 = "B"), each with its own [`Registry`], are joined
//! by N simulated rails. Each rail has two byte streams (one per direction) modelled as a
//! link with an optional rate (bytes per virtual microsecond) and latency. The simulator
//! plays the progress engine's part exactly as the real driver does:
//!
//! * transmit: `wants_transmit` / `poll_transmit`, copying header and payload (read through
//!   the raw pointers while the `Transmit` is alive) into the rail's stream, then reporting
//!   read-response frames with `transmitted`;
//! * receive: reassemble 64-byte headers (possibly from several short reads), decode them,
//!   `on_frame`, then copy payload bytes straight into the `Placement` pieces (again possibly
//!   in several short reads), `payload_done`; `Discard` consumes and drops; `Stall` keeps
//!   the header and stops reading the rail until `take_rx_retry` names it;
//! * completions are drained with `poll_completion` after every action.
//!
//! There is no wall clock: `now` is a fixed `Instant` base plus a virtual `Duration` that the
//! simulator advances. All randomness comes from a seeded [`Rng`], so a seed replays exactly.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::mem::Registry;
use braid_proto::wire::{FrameError, FrameHeader, HEADER_LEN};
use braid_proto::{Access, Completion, Region, Sge};
use braid_proto::{ProtocolError, RxAction, Session, SessionConfig};

// ------------------------------------------------------------------------------ PRNG

/// The test kit's generator; a simulation's seed is salted so that its streams stay those
/// of the recorded surveys.
pub use braid_testkit::Rng;

/// The generator of simulation `seed`.
pub fn rng(seed: u64) -> Rng {
    Rng::new(seed ^ 0x5EED_B4A1_D000_0000)
}

/// The seeds a "many seeds" test runs: `BRAID_SIM_SEED=n` replays one, `BRAID_SIM_SEEDS=n`
/// runs `n` seeds instead of `default`.
pub fn seeds(default: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("BRAID_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("BRAID_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

// ------------------------------------------------------------------------------ links

/// Bytes written at once: they arrive linearly over `[start, end]`.
struct Segment {
    data: Vec<u8>,
    start: Duration,
    end: Duration,
}

impl Segment {
    fn arrived(&self, now: Duration) -> usize {
        if now >= self.end {
            self.data.len()
        } else if now <= self.start {
            0
        } else {
            let f =
                (now - self.start).as_nanos() as f64 / (self.end - self.start).as_nanos() as f64;
            // Complete only at `end` (rounding must not finish a segment early).
            ((self.data.len() as f64 * f) as usize).min(self.data.len() - 1)
        }
    }
}

/// One direction of one rail: a byte stream through a link of some rate and latency.
///
/// Segments arrive in order (each starts arriving no earlier than the previous one ends),
/// so the arrived prefix of the stream is tracked with a cursor that only moves forward:
/// every query is O(1) amortised, however many frames are on the wire.
pub struct Pipe {
    segs: VecDeque<Segment>,
    /// Bytes of the front segment already read.
    front_read: usize,
    /// Number of front segments known to have arrived completely (time only moves forward).
    full: std::cell::Cell<usize>,
    /// Bytes of those segments.
    full_bytes: std::cell::Cell<u64>,
    /// Stream offset of the front segment's first byte.
    front_off: u64,
    link_free: Duration,
    /// Link rate in bytes per virtual microsecond; `None` for an infinitely fast link.
    pub rate: Option<f64>,
    /// One-way latency.
    pub latency: Duration,
    /// Bytes written so far.
    pub written: u64,
    /// Bytes read so far.
    pub read: u64,
    /// The writer closed its socket: once the bytes left are read, the reader sees EOF.
    pub eof: bool,
}

impl Pipe {
    fn new(rate: Option<f64>, latency: Duration) -> Pipe {
        Pipe {
            segs: VecDeque::new(),
            front_read: 0,
            full: std::cell::Cell::new(0),
            full_bytes: std::cell::Cell::new(0),
            front_off: 0,
            link_free: Duration::ZERO,
            rate,
            latency,
            written: 0,
            read: 0,
            eof: false,
        }
    }

    /// Keeps only the first `keep` unread bytes (the rest is lost with the connection).
    pub fn truncate_unread(&mut self, keep: u64) {
        let mut left = keep + self.front_read as u64;
        let mut n = 0;
        for seg in self.segs.iter_mut() {
            if left == 0 {
                break;
            }
            let l = seg.data.len() as u64;
            if l > left {
                // The kept bytes arrive when they would have: the segment ends earlier, in
                // proportion (rounded down, so bytes already read stay arrived).
                let span = (seg.end - seg.start).as_nanos() as u64;
                seg.end = seg.start + Duration::from_nanos(span * left / l);
                seg.data.truncate(left as usize);
            }
            left -= (seg.data.len() as u64).min(left);
            n += 1;
        }
        self.segs.truncate(n);
        self.written = self.read + keep.min(self.written - self.read);
        let full = self.full.get().min(self.segs.len());
        self.full.set(full);
        self.full_bytes.set(
            self.segs
                .iter()
                .take(full)
                .map(|s| s.data.len() as u64)
                .sum(),
        );
    }

    /// Appends raw bytes (a frame, or anything a test injects).
    pub fn push(&mut self, data: Vec<u8>, now: Duration) {
        if data.is_empty() {
            return;
        }
        let start = self.link_free.max(now);
        let tx = match self.rate {
            Some(r) => Duration::from_nanos((data.len() as f64 * 1000.0 / r).ceil() as u64),
            None => Duration::ZERO,
        };
        self.link_free = start + tx;
        self.written += data.len() as u64;
        self.segs.push_back(Segment {
            data,
            start: start + self.latency,
            end: start + tx + self.latency,
        });
    }

    /// Stream offset up to which bytes have arrived at `now`.
    fn arrived_end(&self, now: Duration) -> u64 {
        let (mut full, mut bytes) = (self.full.get(), self.full_bytes.get());
        while let Some(s) = self.segs.get(full) {
            if now < s.end {
                break;
            }
            full += 1;
            bytes += s.data.len() as u64;
        }
        self.full.set(full);
        self.full_bytes.set(bytes);
        let partial = self.segs.get(full).map_or(0, |s| s.arrived(now) as u64);
        self.front_off + bytes + partial
    }

    /// Bytes readable at `now`.
    pub fn available(&self, now: Duration) -> usize {
        (self.arrived_end(now) - self.read) as usize
    }

    /// Bytes written and not yet arrived at the reader at `now` (what is "on the wire").
    pub fn in_flight(&self, now: Duration) -> usize {
        (self.written - self.arrived_end(now)) as usize
    }

    /// Bytes written and not yet read.
    pub fn unread(&self) -> u64 {
        self.written - self.read
    }

    /// The earliest time after `now` at which more bytes become readable.
    pub fn next_arrival(&self, now: Duration) -> Option<Duration> {
        self.arrived_end(now);
        self.segs.get(self.full.get()).map(|s| {
            if s.start > now {
                s.start
            } else {
                s.end.max(now + Duration::from_nanos(1))
            }
        })
    }

    /// Reads up to `len` readable bytes to `dst`; returns how many.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes.
    pub unsafe fn read_raw(&mut self, now: Duration, dst: *mut u8, len: usize) -> usize {
        let len = len.min(self.available(now));
        let mut done = 0;
        while done < len {
            let s = self.segs.front().expect("available bytes are in segments");
            let n = (s.data.len() - self.front_read).min(len - done);
            // SAFETY: source inside the segment; destination valid per the caller.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    s.data.as_ptr().add(self.front_read),
                    dst.add(done),
                    n,
                )
            };
            done += n;
            self.front_read += n;
            if self.front_read == s.data.len() {
                let l = s.data.len() as u64;
                self.segs.pop_front();
                self.front_read = 0;
                self.front_off += l;
                // The popped segment had arrived completely (it was read to its end).
                self.full.set(self.full.get() - 1);
                self.full_bytes.set(self.full_bytes.get() - l);
            }
        }
        self.read += done as u64;
        done
    }
}

// ------------------------------------------------------------------------------ receive state

enum Rx {
    /// Reassembling a header.
    Header { buf: [u8; HEADER_LEN], have: usize },
    /// Reading a payload into placement pieces (or discarding it).
    Payload {
        iov: Vec<(*mut u8, usize)>,
        idx: usize,
        off: usize,
        left: usize,
    },
    /// The session said `Stall`: the header is kept until the rail is named by `take_rx_retry`.
    Stalled { hdr: FrameHeader, retry: bool },
    /// The session reported a protocol error (or the header did not decode): the rail is dead.
    Dead,
}

impl Rx {
    fn fresh() -> Rx {
        Rx::Header {
            buf: [0; HEADER_LEN],
            have: 0,
        }
    }
}

/// What happened when a side received on a rail; [`Sim::observe`] gets one per event.
#[derive(Debug, Clone)]
pub enum Event {
    /// `on_frame` was called with this header (and returned without error).
    Frame {
        side: usize,
        rail: usize,
        hdr: FrameHeader,
    },
    /// `payload_done` was called after a payload was fully placed or discarded.
    PayloadDone { side: usize, rail: usize },
}

/// A callback run after every receive event.
pub type Observer = Box<dyn FnMut(&Event, &[Side; 2])>;

/// One endpoint of the simulated connection.
pub struct Side {
    /// The protocol state machine.
    pub session: Session,
    /// Its registry (target side key lookups).
    pub registry: Arc<Registry>,
    rx: Vec<Rx>,
    /// Every completion polled so far, in order.
    pub completions: Vec<Completion>,
    /// Protocol errors returned by `on_frame`, with their rail.
    pub errors: Vec<(usize, ProtocolError)>,
    /// Headers that failed to decode, with their rail.
    pub decode_errors: Vec<(usize, FrameError)>,
    /// Frames this side transmitted, when [`Sim::capture`] is on: (rail, bytes).
    pub captured: Vec<(usize, Vec<u8>)>,
    /// Number of `Stall` answers.
    pub stalls: u64,
    /// Address ranges of file regions: frames sent from them may get an injected fault
    /// (see [`SimOptions::fault_rate`]).
    pub fragile: Vec<(usize, usize)>,
    /// Faults injected at this side: the header of the frame whose payload could not be
    /// sent (`tx`) or placed (`!tx`).
    pub faults: Vec<(bool, FrameHeader)>,
}

impl Side {
    /// Allocates a region registered in this side's registry.
    pub fn alloc(&self, len: usize, access: Access) -> Region {
        Region::allocate_in(&self.registry, len, access).expect("region allocation")
    }

    /// Registers `len` bytes of `file` in this side's registry; its pages count as fragile
    /// (faults may be injected on them).
    pub fn alloc_file(&mut self, file: &std::fs::File, len: usize, access: Access) -> Region {
        let r = Region::register_file_in(&self.registry, file, 0, len, access)
            .expect("file registration");
        // SAFETY: only the address is taken.
        let start = unsafe { r.as_mut_ptr() } as usize;
        self.fragile.push((start, start + len));
        r
    }

    fn is_fragile(&self, p: *const u8, len: usize) -> bool {
        let (a, b) = (p as usize, p as usize + len);
        self.fragile.iter().any(|&(s, e)| a < e && s < b)
    }

    /// Pulls every waiting completion out of the session.
    pub fn drain(&mut self) {
        while let Some(c) = self.session.poll_completion() {
            self.completions.push(c);
        }
    }

    /// True when the rail's receive side is stalled (and not yet released).
    pub fn is_stalled(&self, rail: usize) -> bool {
        matches!(self.rx[rail], Rx::Stalled { retry: false, .. })
    }

    /// True when the rail's receive side is dead after an error.
    pub fn is_dead(&self, rail: usize) -> bool {
        matches!(self.rx[rail], Rx::Dead)
    }

    /// True when a payload is half-read on the rail.
    pub fn mid_payload(&self, rail: usize) -> bool {
        matches!(self.rx[rail], Rx::Payload { .. })
    }
}

/// How the simulator reads.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Split reads at random sizes (short reads), including inside headers.
    pub short_reads: bool,
    /// Largest single read.
    pub max_read: usize,
    /// Largest number of bytes on the wire (not yet arrived) per rail and direction before
    /// the sender stops polling for frames: the socket send buffer.
    pub sndbuf: usize,
    /// Virtual time each random step advances, at most.
    pub max_step: Duration,
    /// Chance that a frame whose payload is file pages (of [`Side::alloc_file`] regions,
    /// or a fragile placement) meets a truncated page, as the engine sees it: the sender
    /// pads the payload with zeros from a random point on and calls `transmit_faulted`;
    /// the receiver calls `payload_fault` and drops the payload from a random point on.
    pub fault_rate: f64,
    /// Tick both sessions (`on_tick`) every this much virtual time, as the engine does,
    /// which hedges slow rails (`SessionConfig::rail_hedge_after`); `None`: never (the
    /// default; keepalives and timeouts stay out of the frame streams).
    pub tick_every: Option<Duration>,
}

impl Default for SimOptions {
    fn default() -> SimOptions {
        SimOptions {
            short_reads: true,
            max_read: 256 << 10,
            sndbuf: 4 << 20,
            max_step: Duration::from_micros(20),
            fault_rate: 0.0,
            tick_every: None,
        }
    }
}

/// Two sessions joined by simulated rails.
pub struct Sim {
    /// Side 0 ("A") and side 1 ("B").
    pub sides: [Side; 2],
    /// `pipes[rail][from]`: the stream from side `from` to side `1 - from`.
    pub pipes: Vec<[Pipe; 2]>,
    base: Instant,
    /// Virtual time since the start.
    pub now: Duration,
    /// The simulation's randomness.
    pub rng: Rng,
    /// The seed, for failure messages.
    pub seed: u64,
    /// Reading behaviour.
    pub opts: SimOptions,
    /// Record every transmitted frame in [`Side::captured`].
    pub capture: bool,
    /// Called after every receive event (with the sides in their state right after it).
    pub observe: Option<Observer>,
    /// Actions taken.
    pub steps: u64,
    /// Print every receive event (set `BRAID_SIM_TRACE=1`).
    pub trace: bool,
    /// With [`SimOptions::tick_every`]: the virtual time of the next tick, and ticks in a
    /// row during which nothing else could happen.
    next_tick: Duration,
    idle_ticks: u32,
}

fn new_side(cfg: SessionConfig, rails: usize, id: u64) -> Side {
    let registry = Arc::new(Registry::default());
    Side {
        session: Session::new(cfg, registry.clone(), rails, id),
        registry,
        rx: (0..rails).map(|_| Rx::fresh()).collect(),
        completions: Vec::new(),
        errors: Vec::new(),
        decode_errors: Vec::new(),
        captured: Vec::new(),
        stalls: 0,
        fragile: Vec::new(),
        faults: Vec::new(),
    }
}

impl Sim {
    /// A pair of sessions with the same configuration over `rails` infinitely fast rails.
    pub fn new(seed: u64, rails: usize, cfg: SessionConfig) -> Sim {
        Sim::with(seed, vec![None; rails], Duration::ZERO, cfg.clone(), cfg)
    }

    /// A pair over rails of the given rates (bytes per virtual microsecond, `None` =
    /// infinite) and one-way latency.
    pub fn with(
        seed: u64,
        rates: Vec<Option<f64>>,
        latency: Duration,
        cfg_a: SessionConfig,
        cfg_b: SessionConfig,
    ) -> Sim {
        let rails = rates.len();
        Sim {
            sides: [new_side(cfg_a, rails, 1), new_side(cfg_b, rails, 2)],
            pipes: rates
                .iter()
                .map(|&r| [Pipe::new(r, latency), Pipe::new(r, latency)])
                .collect(),
            base: Instant::now(),
            now: Duration::ZERO,
            rng: rng(seed),
            seed,
            opts: SimOptions::default(),
            capture: false,
            observe: None,
            steps: 0,
            trace: std::env::var_os("BRAID_SIM_TRACE").is_some(),
            next_tick: Duration::ZERO,
            idle_ticks: 0,
        }
    }

    /// Ticks both sessions if the clock has reached the next tick; fails the rails a
    /// session finds dead. True if it ticked.
    fn tick_due(&mut self) -> bool {
        let Some(every) = self.opts.tick_every else {
            return false;
        };
        if self.now < self.next_tick {
            return false;
        }
        self.next_tick = self.now + every;
        let at = self.base + self.now;
        for s in 0..2 {
            let dead = self.sides[s].session.on_tick(at);
            for rail in (0..self.rails()).filter(|r| dead & (1 << r) != 0) {
                self.lose_rail(s, rail);
            }
        }
        true
    }

    /// Number of rails.
    pub fn rails(&self) -> usize {
        self.pipes.len()
    }

    /// The simulated `Instant`.
    pub fn instant(&self) -> Instant {
        self.base + self.now
    }

    /// Side `s`.
    pub fn side(&mut self, s: usize) -> &mut Side {
        &mut self.sides[s]
    }

    /// Posts a receive on side `s`, then collects the rails it released and the completions
    /// it produced (as the driver must).
    pub fn post_recv(
        &mut self,
        s: usize,
        wr_id: u64,
        local: Vec<Sge>,
    ) -> Result<(), braid_proto::PostError> {
        let r = self.sides[s].session.post_recv(wr_id, local);
        self.process_dead(s);
        self.collect_retry(s);
        // A staged send or write-with-immediate waiting for this receive may have completed.
        self.drain_side(s);
        r
    }

    /// Collects `take_rx_retry` of side `s` into its stalled rails.
    pub fn collect_retry(&mut self, s: usize) {
        let bits = self.sides[s].session.take_rx_retry();
        for (rail, rx) in self.sides[s].rx.iter_mut().enumerate() {
            if bits & (1 << rail) != 0
                && let Rx::Stalled { retry, .. } = rx
            {
                *retry = true;
            }
        }
    }

    /// Drains the completions of side `s` (tracing them).
    fn drain_side(&mut self, s: usize) {
        let before = self.sides[s].completions.len();
        self.sides[s].drain();
        if self.trace {
            for c in &self.sides[s].completions[before..] {
                eprintln!("[{:?}] side {s} completion {c:?}", self.now);
            }
        }
    }

    /// Drains the completions of both sides.
    pub fn drain(&mut self) {
        for s in &mut self.sides {
            s.drain();
        }
    }

    /// True when side `s` may transmit a frame on `rail` now.
    pub fn can_tx(&self, s: usize, rail: usize) -> bool {
        self.sides[s].session.wants_transmit(rail)
            && self.pipes[rail][s].in_flight(self.now) < self.opts.sndbuf
    }

    /// Side `s` transmits one frame on `rail`, if the session has one; true if it did.
    pub fn tx_one(&mut self, s: usize, rail: usize) -> bool {
        let now = self.instant();
        let Some(t) = self.sides[s].session.poll_transmit(rail, now) else {
            return false;
        };
        let mut bytes = Vec::with_capacity(t.len());
        bytes.extend_from_slice(&t.header);
        for &(p, l) in &t.payload {
            // SAFETY: the Transmit keeps the registered memory behind its pointers alive.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(p, l) });
        }
        let fragile = t
            .payload
            .iter()
            .any(|&(p, l)| self.sides[s].is_fragile(p, l));
        if fragile && self.opts.fault_rate > 0.0 && self.rng.chance(self.opts.fault_rate) {
            // A truncated page under the payload: zeros from there on, and the session
            // is told before the frame counts as written.
            let cut = self.rng.urange(HEADER_LEN, bytes.len() - 1);
            bytes[cut..].fill(0);
            self.sides[s].session.transmit_faulted(&t.header);
            let h = FrameHeader::decode(&t.header).expect("own header");
            self.sides[s].faults.push((true, h));
        }
        let read_response = t.read_response;
        drop(t);
        // The frame is completely "written": report read-response frames, as the driver must.
        if let Some(seq) = read_response {
            self.sides[s].session.transmitted(seq);
            self.collect_retry(s);
        }
        if self.capture {
            self.sides[s].captured.push((rail, bytes.clone()));
        }
        self.pipes[rail][s].push(bytes, self.now);
        true
    }

    /// True when side `s` can make receive progress on `rail` now.
    pub fn can_rx(&self, s: usize, rail: usize) -> bool {
        match &self.sides[s].rx[rail] {
            Rx::Dead => false,
            // A rail not being read still notices its peer hanging up (EPOLLRDHUP).
            Rx::Stalled { retry, .. } => *retry || self.pipes[rail][1 - s].eof,
            _ => {
                let p = &self.pipes[rail][1 - s];
                let avail = p.available(self.now);
                avail > 0 || (p.eof && p.unread() == 0)
            }
        }
    }

    /// Side `s` learns that `rail` failed (as its driver would on a reset or EOF).
    pub fn lose_rail(&mut self, s: usize, rail: usize) {
        if self.trace {
            eprintln!("[{:?}] side {s} loses rail {rail}", self.now);
        }
        self.sides[s].session.on_rail_lost(rail);
        self.sides[s].rx[rail] = Rx::Dead;
        self.process_dead(s);
        self.collect_retry(s);
        self.drain_side(s);
    }

    /// Like [`Sim::lose_rail`], but everything `s` wrote on the rail still reaches the peer
    /// before EOF (the connection closed cleanly after the failure was decided).
    pub fn lose_rail_delivering(&mut self, s: usize, rail: usize) {
        if self.trace {
            eprintln!(
                "[{:?}] side {s} loses rail {rail} (output delivered)",
                self.now
            );
        }
        self.sides[s].session.on_rail_lost(rail);
        self.pipes[rail][s].eof = true;
        self.lose_rail(s, rail);
    }

    /// Closes the sockets of the rails side `s`'s session gave up: `s` stops reading them,
    /// and the peer reads a random prefix of what was on its way, then EOF.
    pub fn process_dead(&mut self, s: usize) {
        let bits = self.sides[s].session.take_dead_rails();
        for rail in 0..self.rails() {
            if bits & (1 << rail) == 0 {
                continue;
            }
            self.sides[s].rx[rail] = Rx::Dead;
            self.pipes[rail][1 - s].truncate_unread(0);
            let out = &mut self.pipes[rail][s];
            if !out.eof {
                let unread = out.unread();
                let keep = self.rng.range(0, unread);
                out.truncate_unread(keep);
                out.eof = true;
            }
        }
    }

    fn read_len(&mut self, want: usize) -> usize {
        let want = want.min(self.opts.max_read).max(1);
        if self.opts.short_reads && self.rng.chance(0.5) {
            let n = match self.rng.below(3) {
                0 => self.rng.urange(1, 16),
                1 => self.rng.urange(1, 4096),
                _ => self.rng.urange(1, want),
            };
            n.min(want)
        } else {
            want
        }
    }

    /// Side `s` does one receive action on `rail`: one read (or a re-offered header).
    /// Returns true if anything happened. Like the engine, a side that is waiting for a
    /// header and finds nothing more to read tells its session (`on_rx_idle`).
    pub fn rx_one(&mut self, s: usize, rail: usize) -> bool {
        let did = self.rx_read(s, rail);
        if matches!(self.sides[s].rx[rail], Rx::Header { .. })
            && self.pipes[rail][1 - s].available(self.now) == 0
        {
            self.sides[s].session.on_rx_idle(rail);
        }
        did
    }

    fn rx_read(&mut self, s: usize, rail: usize) -> bool {
        let from = 1 - s;
        let state = std::mem::replace(&mut self.sides[s].rx[rail], Rx::Dead);
        match state {
            Rx::Dead => false,
            Rx::Stalled { hdr, retry: false } => {
                if self.pipes[rail][from].eof {
                    self.lose_rail(s, rail);
                    return true;
                }
                self.sides[s].rx[rail] = Rx::Stalled { hdr, retry: false };
                false
            }
            Rx::Stalled { hdr, retry: true } => {
                self.offer(s, rail, hdr);
                true
            }
            Rx::Header { mut buf, mut have } => {
                let avail = self.pipes[rail][from].available(self.now);
                if avail == 0 && self.pipes[rail][from].eof && self.pipes[rail][from].unread() == 0
                {
                    self.lose_rail(s, rail);
                    return true;
                }
                if avail == 0 {
                    self.sides[s].rx[rail] = Rx::Header { buf, have };
                    return false;
                }
                let n = self.read_len((HEADER_LEN - have).min(avail));
                // SAFETY: within `buf`.
                let got = unsafe {
                    self.pipes[rail][from].read_raw(self.now, buf.as_mut_ptr().add(have), n)
                };
                have += got;
                if have < HEADER_LEN {
                    self.sides[s].rx[rail] = Rx::Header { buf, have };
                    return got > 0;
                }
                match FrameHeader::decode(&buf) {
                    Ok(hdr) => self.offer(s, rail, hdr),
                    Err(e) => {
                        self.sides[s].decode_errors.push((rail, e));
                        self.sides[s].rx[rail] = Rx::Dead;
                    }
                }
                true
            }
            Rx::Payload {
                iov,
                mut idx,
                mut off,
                mut left,
            } => {
                let avail = self.pipes[rail][from].available(self.now);
                if avail == 0 && self.pipes[rail][from].eof && self.pipes[rail][from].unread() == 0
                {
                    // EOF in the middle of a payload: the rail is lost with it.
                    self.lose_rail(s, rail);
                    return true;
                }
                if avail == 0 {
                    self.sides[s].rx[rail] = Rx::Payload {
                        iov,
                        idx,
                        off,
                        left,
                    };
                    return false;
                }
                let mut n = self.read_len(left.min(avail));
                // One "readv": may span several pieces.
                while n > 0 {
                    let (p, l) = iov[idx];
                    let k = (l - off).min(n);
                    let got = if p.is_null() {
                        // Discard: read into a scratch buffer.
                        let mut scratch = vec![0u8; k];
                        // SAFETY: scratch is k bytes.
                        unsafe {
                            self.pipes[rail][from].read_raw(self.now, scratch.as_mut_ptr(), k)
                        }
                    } else {
                        // SAFETY: the session keeps the placement's memory alive until payload_done.
                        unsafe { self.pipes[rail][from].read_raw(self.now, p.add(off), k) }
                    };
                    assert_eq!(got, k, "seed {}: short pipe read", self.seed);
                    off += k;
                    left -= k;
                    n -= k;
                    if off == l {
                        idx += 1;
                        off = 0;
                    }
                }
                if left == 0 {
                    self.payload_done(s, rail);
                } else {
                    self.sides[s].rx[rail] = Rx::Payload {
                        iov,
                        idx,
                        off,
                        left,
                    };
                }
                true
            }
        }
    }

    /// Offers a decoded header to side `s` on `rail` and sets up what follows.
    pub fn offer(&mut self, s: usize, rail: usize, hdr: FrameHeader) {
        let now = self.instant();
        let res = self.sides[s].session.on_frame(rail, &hdr, now);
        let len = hdr.payload_len as usize;
        match res {
            Err(e) => {
                if self.trace {
                    eprintln!(
                        "[{:?}] side {s} rail {rail}: {hdr:?} refused: {e}",
                        self.now
                    );
                }
                self.sides[s].errors.push((rail, e));
                self.sides[s].rx[rail] = Rx::Dead;
                self.collect_retry(s);
                self.drain_side(s);
                return;
            }
            Ok(RxAction::Done) => {
                self.sides[s].rx[rail] = Rx::fresh();
            }
            Ok(RxAction::Stall) => {
                self.sides[s].stalls += 1;
                self.sides[s].rx[rail] = Rx::Stalled { hdr, retry: false };
            }
            Ok(RxAction::Place(pl)) => {
                let total: usize = pl.iov.iter().map(|p| p.1).sum();
                assert_eq!(
                    total, len,
                    "seed {}: placement of {total} bytes for a payload of {len}",
                    self.seed
                );
                let mut iov: Vec<_> = pl.iov.into_iter().filter(|p| p.1 > 0).collect();
                if pl.fragile && self.opts.fault_rate > 0.0 && self.rng.chance(self.opts.fault_rate)
                {
                    // A truncated page in the destination: bytes before it are placed, the
                    // rest is read and dropped.
                    let mut cut = self.rng.urange(0, len - 1);
                    let mut kept = Vec::new();
                    for (p, l) in iov {
                        if cut == 0 {
                            break;
                        }
                        kept.push((p, l.min(cut)));
                        cut -= l.min(cut);
                    }
                    let placed: usize = kept.iter().map(|p| p.1).sum();
                    kept.push((std::ptr::null_mut(), len - placed));
                    iov = kept;
                    self.sides[s].session.payload_fault(rail);
                    self.sides[s].faults.push((false, hdr));
                }
                self.sides[s].rx[rail] = Rx::Payload {
                    iov,
                    idx: 0,
                    off: 0,
                    left: len,
                };
            }
            Ok(RxAction::Discard) => {
                self.sides[s].rx[rail] = Rx::Payload {
                    iov: vec![(std::ptr::null_mut(), len)],
                    idx: 0,
                    off: 0,
                    left: len,
                };
            }
        }
        self.after_event(Event::Frame { side: s, rail, hdr });
        if let Rx::Payload { left: 0, .. } = self.sides[s].rx[rail] {
            self.payload_done(s, rail);
        }
    }

    /// The payload on `rail` is complete: tell side `s`'s session.
    fn payload_done(&mut self, s: usize, rail: usize) {
        match self.sides[s].session.payload_done(rail) {
            Ok(()) => {
                self.sides[s].rx[rail] = Rx::fresh();
                self.after_event(Event::PayloadDone { side: s, rail });
            }
            Err(e) => {
                if self.trace {
                    eprintln!(
                        "[{:?}] side {s} rail {rail}: payload refused: {e}",
                        self.now
                    );
                }
                self.sides[s].errors.push((rail, e));
                self.sides[s].rx[rail] = Rx::Dead;
                self.collect_retry(s);
                self.drain_side(s);
            }
        }
    }

    fn after_event(&mut self, ev: Event) {
        let s = match ev {
            Event::Frame { side, .. } | Event::PayloadDone { side, .. } => side,
        };
        if self.trace {
            let st = match &self.sides[s].rx[match ev {
                Event::Frame { rail, .. } | Event::PayloadDone { rail, .. } => rail,
            }] {
                Rx::Stalled { .. } => "stalled",
                Rx::Payload { .. } => "payload",
                _ => "",
            };
            eprintln!("[{:?}] {ev:?} {st}", self.now);
        }
        self.process_dead(s);
        self.collect_retry(s);
        self.drain_side(s);
        if let Some(obs) = self.observe.as_mut() {
            obs(&ev, &self.sides);
        }
    }

    /// One random action: transmit or receive on a random side and rail (random
    /// interleaving of rails), advancing the clock by a random small amount. Returns false
    /// when nothing at all can happen any more (everything idle, or deadlocked).
    pub fn step(&mut self) -> bool {
        let rails = self.rails();
        let mut enabled = Vec::new();
        for s in 0..2 {
            for r in 0..rails {
                if self.can_tx(s, r) {
                    enabled.push((s, r, true));
                }
                if self.can_rx(s, r) {
                    enabled.push((s, r, false));
                }
            }
        }
        self.steps += 1;
        let dt = self.rng.range(0, self.opts.max_step.as_nanos() as u64);
        if enabled.is_empty() {
            // Wait for bytes still on the wire, if any.
            let next = (0..rails)
                .flat_map(|r| (0..2).map(move |d| (r, d)))
                .filter_map(|(r, d)| self.pipes[r][d].next_arrival(self.now))
                .min();
            return match next {
                Some(t) if self.opts.tick_every.is_none() || t < self.next_tick => {
                    self.now = t.max(self.now + Duration::from_nanos(dt));
                    true
                }
                // Nothing before the next tick: a hedge may be due then. Quiet for 200
                // ticks in a row (and nothing on the wire) is quiet for good.
                _ if self.opts.tick_every.is_some() => {
                    self.now = self.now.max(self.next_tick);
                    self.tick_due();
                    self.idle_ticks += 1;
                    next.is_some() || self.idle_ticks < 200
                }
                _ => false,
            };
        }
        self.idle_ticks = 0;
        self.now += Duration::from_nanos(dt);
        self.tick_due();
        let (s, r, tx) = *self.rng.pick(&enabled);
        if tx {
            self.tx_one(s, r);
        } else {
            self.rx_one(s, r);
        }
        true
    }

    /// Steps randomly until `done` holds; panics (naming the seed) if the simulation
    /// stops making progress or runs past `max_steps`.
    pub fn run_until(&mut self, max_steps: u64, mut done: impl FnMut(&mut Sim) -> bool) {
        let start = self.steps;
        let mut idle = 0u32;
        while !done(self) {
            assert!(
                self.steps - start < max_steps,
                "seed {}: not done after {max_steps} steps\n{}",
                self.seed,
                self.describe()
            );
            if self.step() {
                idle = 0;
            } else {
                // Nothing can happen; `done` may still change that (e.g. post a receive).
                idle += 1;
                assert!(
                    idle < 10_000,
                    "seed {}: simulation idle or deadlocked before done\n{}",
                    self.seed,
                    self.describe()
                );
            }
        }
    }

    /// Runs random steps until nothing more can happen.
    pub fn run_idle(&mut self, max_steps: u64) {
        let start = self.steps;
        while self.step() {
            assert!(
                self.steps - start < max_steps,
                "seed {}: still busy after {max_steps} steps\n{}",
                self.seed,
                self.describe()
            );
        }
    }

    /// A deterministic, rate-driven tick: every side transmits on every rail while its
    /// session and the send buffer allow, and reads everything that has arrived; then the
    /// clock advances by `dt`.
    pub fn tick(&mut self, dt: Duration) {
        let rails = self.rails();
        for s in 0..2 {
            for r in 0..rails {
                while self.can_tx(s, r) && self.tx_one(s, r) {}
            }
        }
        for s in 0..2 {
            for r in 0..rails {
                while self.can_rx(s, r) && self.rx_one(s, r) {}
            }
        }
        self.now += dt;
        self.steps += 1;
    }

    /// Asserts neither side saw a protocol or decode error.
    pub fn assert_no_errors(&self) {
        for (i, s) in self.sides.iter().enumerate() {
            assert!(
                s.errors.is_empty() && s.decode_errors.is_empty(),
                "seed {}: side {i} errors {:?} decode errors {:?}",
                self.seed,
                s.errors,
                s.decode_errors
            );
        }
    }

    /// A summary of the state, for failure messages.
    pub fn describe(&self) -> String {
        let mut out = format!("now {:?}, steps {}\n", self.now, self.steps);
        for (i, s) in self.sides.iter().enumerate() {
            out += &format!(
                "side {i}: outstanding {}, completions {}, errors {:?}, decode errors {:?}\n",
                s.session.outstanding(),
                s.completions.len(),
                s.errors,
                s.decode_errors
            );
            for r in 0..self.rails() {
                let st = match &s.rx[r] {
                    Rx::Header { have, .. } => format!("header({have})"),
                    Rx::Payload { left, .. } => format!("payload(left {left})"),
                    Rx::Stalled { hdr, retry } => {
                        format!("stalled(seq {} {:?}, retry {retry})", hdr.seq, hdr.opcode)
                    }
                    Rx::Dead => "dead".into(),
                };
                out += &format!(
                    "  rail {r}: rx {st}, incoming unread {}, wants_transmit {}\n",
                    self.pipes[r][1 - i].unread(),
                    s.session.wants_transmit(r)
                );
            }
        }
        out
    }
}

/// Splits `len` bytes of `region` starting at `offset` into 1 to `max_pieces` scatter/gather
/// entries at random boundaries (some may be empty).
pub fn random_sgl(
    rng: &mut Rng,
    region: &Region,
    offset: usize,
    len: usize,
    max_pieces: usize,
) -> Vec<Sge> {
    let pieces = rng.urange(1, max_pieces.max(1));
    let mut cuts: Vec<usize> = (1..pieces).map(|_| rng.urange(0, len)).collect();
    cuts.sort_unstable();
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts.into_iter().chain(std::iter::once(len)) {
        out.push(region.slice(offset + at, c - at).expect("slice in range"));
        at = c;
    }
    out
}
