//! The progress engine: one thread per [`crate::Context`] that owns every rail's receive
//! side and services the peer's one-sided operations without the application's help.
//!
//! Transmission is shared: whoever holds a rail's transmit lock (the engine, or an
//! application thread taking the inline fast path for a small operation) writes frames
//! until the session has none left for that rail or the socket is full. A full socket is
//! picked up again by the engine on the socket's writable edge.

pub(crate) mod io;

use std::collections::HashMap;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;

use crate::cq::CompletionQueue;
use crate::error::CompletionKind;
use crate::mem::file::copy_maybe_fragile;
use crate::proto::{Placement, RxAction, Session, Transmit};
use crate::wire::{FrameHeader, HEADER_LEN};

const WAKER: Token = Token(usize::MAX);
/// An application thread that polled this recently is taken to be polling still.
const APP_POLL_HOLD_NS: u64 = 1_000_000;

/// Monotonic nanoseconds since the first call (never 0).
pub(crate) fn clock_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64 + 1
}
/// Period of keepalive and dead-peer checks.
const TICK: std::time::Duration = std::time::Duration::from_millis(100);
/// Most frames, and bytes, gathered into one send system call.
const BATCH_FRAMES: usize = 16;
const BATCH_BYTES: usize = 256 << 10;
/// Receive buffer for headers and small payloads; larger payloads bypass it.
const RX_BUF: usize = 1024;
/// After a payload at least this large, read the next header exactly, so that the bulk of
/// the following chunk is not pulled through the small buffer (one copy, not two).
const BULK_PAYLOAD: u32 = 16 << 10;
/// Largest receive low-water mark set while a bulk payload arrives: the engine is woken once
/// this much (or the rest of the payload) is queued, not for every segment. Bounded so that
/// a rail that is still trickling is read (and seen alive) within milliseconds.
const LOWAT_MAX: usize = 512 << 10;

/// One rail's socket and transmit state. The socket is replaced when a failed rail is
/// re-established.
pub(crate) struct RailIo {
    /// Descriptor of the current socket (read by the engine without taking the lock).
    fd: AtomicI32,
    /// Frames already taken from the session wait in `tx` for the socket to take them. The
    /// session then may have nothing for this rail (all handed out, or its window full),
    /// so the writable edge must resume the rail on this flag alone.
    tx_blocked: AtomicBool,
    /// The engine has left this rail's reads to a polling thread (see
    /// [`EndpointShared::polled_inline`]).
    muted: AtomicBool,
    tx: Mutex<TxState>,
    rx: Mutex<RxCore>,
}

struct TxState {
    stream: TcpStream,
    /// Frames being written, in order; `off` bytes of the first are already sent.
    batch: std::collections::VecDeque<Transmit>,
    off: usize,
    /// The last send failed with `EFAULT` (file pages truncated under a frame): the first
    /// frame is sent alone until it is out, to tell which frame it was.
    solo: bool,
}

/// Zeros that stand in for file pages a truncation took away after a frame's header
/// promised them (see [`pad_frame`]).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Replaces the payload of a frame with zeros of the same length: the bytes already sent
/// stay sent, the stream stays in step, and the session has been told the frame is void.
fn pad_frame(t: &mut Transmit) {
    let mut left: usize = t.payload.iter().map(|p| p.1).sum();
    let mut pieces = Vec::with_capacity(left.div_ceil(ZEROS.len()));
    while left > 0 {
        let n = left.min(ZEROS.len());
        pieces.push((ZEROS.as_ptr(), n));
        left -= n;
    }
    t.payload = pieces;
}

impl RailIo {
    pub(crate) fn new(stream: TcpStream) -> RailIo {
        RailIo {
            fd: AtomicI32::new(stream.as_raw_fd()),
            tx_blocked: AtomicBool::new(false),
            muted: AtomicBool::new(false),
            tx: Mutex::new(TxState {
                stream,
                batch: std::collections::VecDeque::new(),
                off: 0,
                solo: false,
            }),
            rx: Mutex::new(RxCore::new()),
        }
    }

    fn fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire)
    }

    /// Shuts the current socket down (both directions).
    pub(crate) fn shutdown(&self) {
        let _ = self.tx.lock().stream.shutdown(std::net::Shutdown::Both);
    }

    /// Puts a new connection in place of the old one (which is closed).
    fn replace(&self, stream: TcpStream) {
        let mut tx = self.tx.lock();
        self.fd.store(stream.as_raw_fd(), Ordering::Release);
        tx.stream = stream;
        tx.batch.clear();
        tx.off = 0;
        tx.solo = false;
        self.tx_blocked.store(false, Ordering::Release);
    }
}

/// State shared by an [`crate::Endpoint`] handle and the engine.
pub(crate) struct EndpointShared {
    pub(crate) id: u64,
    pub(crate) peer: String,
    pub(crate) session: Mutex<Session>,
    pub(crate) rails: Vec<RailIo>,
    pub(crate) send_cq: CompletionQueue,
    pub(crate) recv_cq: CompletionQueue,
    pub(crate) closed: AtomicBool,
    pub(crate) kicker: Arc<EngineShared>,
    /// When an application thread last drove this endpoint's progress (nanoseconds on
    /// [`clock_ns`]; 0 = not polling). While recent, the engine leaves reads to it.
    pub(crate) app_polled: AtomicU64,
    /// On the connecting side: starts re-dialling a failed rail.
    pub(crate) redial: Option<Box<dyn Fn(usize) + Send + Sync>>,
}

/// Outcome of writing frames on one rail.
enum Flush {
    /// Nothing left to send.
    Idle,
    /// The socket is full; the writable edge will resume.
    Blocked,
}

impl EndpointShared {
    /// Moves the session's completions to the queues.
    pub(crate) fn deliver(&self, s: &mut Session) {
        while let Some(c) = s.poll_completion() {
            match c.kind {
                CompletionKind::Recv | CompletionKind::RecvWriteImm => self.recv_cq.push(c),
                _ => self.send_cq.push(c),
            }
        }
    }

    /// Writes frames on `rail` until none is left or the socket is full.
    fn flush_rail(&self, rail: usize) -> std::io::Result<Flush> {
        let io = &self.rails[rail];
        let mut tx = io.tx.lock();
        let r = self.flush_locked(rail, &mut tx);
        io.tx_blocked
            .store(matches!(r, Ok(Flush::Blocked)), Ordering::Release);
        r
    }

    fn flush_locked(&self, rail: usize, tx: &mut TxState) -> std::io::Result<Flush> {
        loop {
            {
                // Top the batch up: several small frames (a Done and the next request, say)
                // leave in one system call.
                let mut s = self.session.lock();
                if !s.rail_alive(rail) {
                    // Whatever was half-written is in the session's log, to be sent elsewhere.
                    tx.batch.clear();
                    tx.off = 0;
                    tx.solo = false;
                    return Ok(Flush::Idle);
                }
                let mut bytes: usize = tx.batch.iter().map(Transmit::len).sum::<usize>() - tx.off;
                while tx.batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
                    match s.poll_transmit(rail, Instant::now()) {
                        Some(t) => {
                            bytes += t.len();
                            tx.batch.push_back(t);
                        }
                        None => break,
                    }
                }
            }
            if tx.batch.is_empty() {
                return Ok(Flush::Idle);
            }
            let mut pieces = Vec::with_capacity(2 * tx.batch.len());
            for t in tx.batch.iter().take(if tx.solo { 1 } else { usize::MAX }) {
                pieces.push((t.header.as_ptr(), HEADER_LEN));
                pieces.extend_from_slice(&t.payload);
            }
            match io::send_pieces(tx.stream.as_raw_fd(), &pieces, tx.off) {
                Ok(n) => {
                    tx.off += n;
                    if tx.solo && tx.batch.front().is_some_and(|t| t.len() <= tx.off) {
                        tx.solo = false;
                    }
                    while tx.batch.front().is_some_and(|t| t.len() <= tx.off) {
                        let t = tx.batch.pop_front().expect("checked");
                        tx.off -= t.len();
                        if let Some(seq) = t.read_response {
                            let mut s = self.session.lock();
                            s.transmitted(seq);
                            if s.rx_retry_pending() {
                                // A request waited for this read response; the engine resumes it.
                                drop(s);
                                self.kicker.kick(self.id);
                            }
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(Flush::Blocked),
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    // File pages under a payload were truncated (frames from ordinary memory
                    // cannot fault). Find the frame: the first one alone, then pad it.
                    if !tx.solo && tx.batch.len() > 1 {
                        tx.solo = true;
                        continue;
                    }
                    let t = tx.batch.front_mut().expect("a frame was being sent");
                    self.session.lock().transmit_faulted(&t.header);
                    pad_frame(t);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Flushes every rail that has something to send, in the session or in its transmit
    /// batch. Returns false when a rail failed.
    pub(crate) fn flush_all(&self) -> bool {
        for rail in 0..self.rails.len() {
            if !self.rails[rail].tx_blocked.load(Ordering::Acquire)
                && !self.session.lock().wants_transmit(rail)
            {
                continue;
            }
            if let Err(e) = self.flush_rail(rail) {
                self.fail_rail(rail, &format!("send failed: {e}"));
                return false;
            }
        }
        true
    }

    /// Fails the endpoint because `rail` broke.
    /// Gives up `rail`: the session fails over to the other rails, or fails the endpoint
    /// when it was the last one.
    pub(crate) fn fail_rail(&self, rail: usize, why: &str) {
        let mut s = self.session.lock();
        if !s.is_failed() && s.rail_alive(rail) {
            if why.contains("the peer closed the endpoint") {
                tracing::info!(endpoint = self.id, peer = %self.peer, "the peer closed the endpoint");
            } else {
                tracing::warn!(endpoint = self.id, peer = %self.peer, rail, "rail failed: {why}");
            }
        }
        s.on_rail_lost(rail);
        self.deliver(&mut s);
        let dead = s.take_dead_rails();
        let failed = s.is_failed();
        drop(s);
        self.close_dead_rails(dead);
        if failed {
            self.shutdown();
        } else {
            // Retransmissions wait on the surviving rails.
            self.kicker.kick(self.id);
            if let Some(re) = &self.redial {
                re(rail);
            }
        }
    }

    /// Runs `rail`'s receive loop; waits for the lock if another thread holds it.
    fn rx_run(&self, rail: usize) -> RxStep {
        let mut c = self.rails[rail].rx.lock();
        RxRail {
            ep: self,
            rail,
            c: &mut c,
        }
        .run()
    }

    /// Progress driven by an application thread polling a completion queue: reads every rail
    /// no other thread is reading, and sends what that produced. This saves the hand-off from
    /// the engine thread on latency-bound loops.
    pub(crate) fn progress_inline(&self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        self.app_polled.store(clock_ns(), Ordering::Release);
        // What the previous poll's reading produced (acknowledgements, Done frames) goes out
        // first: a request the application posted in between carries it in the same send.
        let want_tx = {
            let s = self.session.lock();
            (0..self.rails.len()).any(|r| s.wants_transmit(r))
        };
        if want_tx {
            self.flush_all();
        }
        for rail in 0..self.rails.len() {
            if let Some(mut c) = self.rails[rail].rx.try_lock() {
                RxRail {
                    ep: self,
                    rail,
                    c: &mut c,
                }
                .run();
            }
        }
        if self.session.lock().rx_retry_pending() {
            self.kicker.kick(self.id);
        }
    }

    /// Shuts the sockets of rails the session has given up (`dead`, from
    /// `Session::take_dead_rails`). Called without the session lock: a shutdown takes the
    /// rail's transmit lock, which `flush_rail` holds while it takes the session lock.
    pub(crate) fn close_dead_rails(&self, dead: u64) {
        for (i, r) in self.rails.iter().enumerate() {
            if dead & (1 << i) != 0 {
                r.shutdown();
            }
        }
    }

    pub(crate) fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        for r in &self.rails {
            r.shutdown();
        }
    }
}

/// Receive-side state of one rail. Whoever holds its lock (the engine thread, or an
/// application thread polling a completion queue) reads the socket.
pub(crate) struct RxCore {
    buf: Box<[u8; RX_BUF]>,
    start: usize,
    end: usize,
    state: RxState,
    bulk: bool,
    /// The last read came back short: the socket was empty, no need to ask again now.
    drained: bool,
    /// When the session last heard that payload bytes are arriving ([`clock_ns`]).
    progress_noted: u64,
    /// The socket's receive low-water mark as last set (1: the kernel's default).
    lowat: usize,
}

impl RxCore {
    fn new() -> RxCore {
        RxCore {
            buf: Box::new([0u8; RX_BUF]),
            start: 0,
            end: 0,
            state: RxState::Header,
            bulk: false,
            drained: false,
            progress_noted: 0,
            lowat: 1,
        }
    }
}

/// The receive loop of one rail, with its state locked.
struct RxRail<'a> {
    ep: &'a EndpointShared,
    rail: usize,
    c: &'a mut RxCore,
}

enum RxState {
    Header,
    Stalled(FrameHeader),
    Payload {
        place: Placement,
        len: usize,
        done: usize,
    },
    Discard {
        left: usize,
    },
    Dead,
}

/// Whether a rail's receive loop can go on.
enum RxStep {
    /// The socket has no more bytes, or the rail is stalled.
    Wait,
    /// The endpoint failed.
    Dead,
}

impl RxRail<'_> {
    fn buffered(&self) -> usize {
        self.c.end - self.c.start
    }

    /// Reads and executes frames until the socket is empty, the rail stalls, or it fails.
    fn run(&mut self) -> RxStep {
        let fd = self.ep.rails[self.rail].fd();
        // Every call reads at least once: it was called because bytes may have arrived.
        self.c.drained = false;
        loop {
            match std::mem::replace(&mut self.c.state, RxState::Header) {
                RxState::Dead => {
                    self.c.state = RxState::Dead;
                    return RxStep::Dead;
                }
                RxState::Header => {
                    if self.buffered() < HEADER_LEN {
                        if self.c.start > 0 {
                            self.c.buf.copy_within(self.c.start..self.c.end, 0);
                            self.c.end -= self.c.start;
                            self.c.start = 0;
                        }
                        if self.c.drained {
                            self.set_lowat(fd, 1);
                            self.ep.session.lock().on_rx_idle(self.rail);
                            return RxStep::Wait;
                        }
                        let want = if self.c.bulk { HEADER_LEN } else { RX_BUF };
                        let room = want.max(self.c.end + 1) - self.c.end;
                        match io::recv_into(fd, &mut self.c.buf[self.c.end..self.c.end + room]) {
                            Ok(0) => return self.die("peer closed the connection"),
                            Ok(n) => {
                                self.c.end += n;
                                self.c.drained = n < room;
                                continue;
                            }
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                                self.set_lowat(fd, 1);
                                self.ep.session.lock().on_rx_idle(self.rail);
                                return RxStep::Wait;
                            }
                            Err(e) => return self.die(&format!("receive failed: {e}")),
                        }
                    }
                    match FrameHeader::decode(&self.c.buf[self.c.start..self.c.end]) {
                        Ok(h) => {
                            if let Some(step) = self.offer(h) {
                                return step;
                            }
                        }
                        Err(e) => return self.die(&format!("malformed frame: {e}")),
                    }
                }
                RxState::Stalled(h) => {
                    if let Some(step) = self.offer(h) {
                        return step;
                    }
                }
                RxState::Payload { place, len, done } => {
                    // A short read into file pages may have stopped at a truncated page rather
                    // than at the end of the socket's data: such a placement always asks
                    // again, which answers EFAULT or EAGAIN (edge-triggered polling would not
                    // wake us for bytes already there).
                    if self.c.drained && !place.fragile {
                        self.set_lowat(fd, (len - done).min(LOWAT_MAX));
                        self.c.state = RxState::Payload { place, len, done };
                        return RxStep::Wait;
                    }
                    // The next frame's header comes in the same read (one system call less
                    // per frame, and a short read then tells that the socket is empty);
                    // whatever of it arrives goes to the buffer. Behind a bulk payload exactly
                    // one header, so that the next chunk's bulk is not pulled through the
                    // buffer; behind a small one as much as the buffer holds.
                    if self.buffered() == 0 {
                        (self.c.start, self.c.end) = (0, 0);
                    }
                    let end = self.c.end;
                    let room = if self.c.bulk {
                        HEADER_LEN
                    } else {
                        RX_BUF - end
                    };
                    let tail = (room > 0 && end + room <= RX_BUF)
                        .then(|| (self.c.buf[end..end + room].as_mut_ptr(), room));
                    match io::recv_pieces(fd, &place.iov, done, tail) {
                        Ok(io::Received { got: 0, asked }) => {
                            return self.die(if asked > 0 {
                                "peer closed the connection"
                            } else {
                                "placement shorter than the payload"
                            });
                        }
                        Ok(io::Received { got: n, asked }) if done + n >= len => {
                            self.c.end += done + n - len;
                            // Only a read that got less than it asked for says the socket is
                            // empty. Without a header's room behind the payload (a small one,
                            // or more pieces than one call takes) nothing is known: taking
                            // that for empty left bytes unread with no edge to come.
                            self.c.drained = n < asked;
                            self.payload_done(len);
                        }
                        Ok(io::Received { got: n, asked }) => {
                            self.c.drained = n < asked;
                            if !self.c.drained {
                                // The pieces needed more than one call: go on reading.
                                self.c.state = RxState::Payload {
                                    place,
                                    len,
                                    done: done + n,
                                };
                                continue;
                            }
                            // A short read means the socket is empty for now. Wake up again
                            // when much more of the payload is there: a receiver woken per
                            // segment spent 1.5x a TCP receiver's CPU per GB.
                            self.set_lowat(fd, (len - done - n).min(LOWAT_MAX));
                            // The rail is alive; telling the session costs a lock, so at most
                            // every 10 ms (its silence timeout is seconds).
                            let now = clock_ns();
                            if now - self.c.progress_noted > 10_000_000 {
                                self.c.progress_noted = now;
                                self.ep
                                    .session
                                    .lock()
                                    .on_rx_progress(self.rail, Instant::now());
                            }
                            self.c.state = RxState::Payload {
                                place,
                                len,
                                done: done + n,
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.set_lowat(fd, (len - done).min(LOWAT_MAX));
                            self.c.state = RxState::Payload { place, len, done };
                            return RxStep::Wait;
                        }
                        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                            // The destination's file pages were truncated: the operation
                            // fails, the rest of the payload is read and dropped.
                            self.ep.session.lock().payload_fault(self.rail);
                            self.c.state = RxState::Discard { left: len - done };
                        }
                        Err(e) => return self.die(&format!("receive failed: {e}")),
                    }
                }
                RxState::Discard { left } => {
                    let mut scratch = [0u8; 16 << 10];
                    let n = left.min(scratch.len());
                    match io::recv_into(fd, &mut scratch[..n]) {
                        Ok(0) => return self.die("peer closed the connection"),
                        Ok(n) if n >= left => self.payload_done(0),
                        Ok(n) => self.c.state = RxState::Discard { left: left - n },
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.set_lowat(fd, 1);
                            self.c.state = RxState::Discard { left };
                            return RxStep::Wait;
                        }
                        Err(e) => return self.die(&format!("receive failed: {e}")),
                    }
                }
            }
        }
    }

    /// Offers a header to the session; `Some` ends the receive loop.
    fn offer(&mut self, h: FrameHeader) -> Option<RxStep> {
        let mut s = self.ep.session.lock();
        let action = match s.on_frame(self.rail, &h, Instant::now()) {
            Ok(a) => a,
            Err(e) => {
                drop(s);
                return Some(self.die(&format!("protocol error: {e}")));
            }
        };
        self.ep.deliver(&mut s);
        let dead = s.take_dead_rails();
        drop(s);
        self.ep.close_dead_rails(dead);
        if matches!(action, RxAction::Stall) {
            self.c.state = RxState::Stalled(h);
            return Some(RxStep::Wait);
        }
        // The header (also a stalled one: nothing is read while stalled) starts the buffer.
        self.c.start += HEADER_LEN;
        let len = h.payload_len as usize;
        self.c.bulk = h.payload_len >= BULK_PAYLOAD;
        match action {
            RxAction::Stall => unreachable!("handled above"),
            RxAction::Done => {}
            RxAction::Place(place) => {
                // Bytes of the payload already in the small buffer go first.
                let have = self.buffered().min(len);
                let mut copied = 0;
                let mut ok = true;
                for &(p, l) in &place.iov {
                    if copied == have {
                        break;
                    }
                    let n = l.min(have - copied);
                    // SAFETY: p points at l writable bytes of pinned registered memory (file
                    // pages, which may be gone, are written with a system call).
                    ok &= unsafe {
                        copy_maybe_fragile(
                            self.c.buf[self.c.start + copied..].as_ptr(),
                            p,
                            n,
                            place.fragile,
                        )
                    };
                    copied += n;
                }
                self.c.start += have;
                if !ok {
                    self.ep.session.lock().payload_fault(self.rail);
                    if have == len {
                        self.payload_done(0);
                    } else {
                        self.c.state = RxState::Discard { left: len - have };
                    }
                    return None;
                }
                if have == len {
                    self.payload_done(len);
                } else {
                    self.c.state = RxState::Payload {
                        place,
                        len,
                        done: have,
                    };
                }
            }
            RxAction::Discard => {
                let have = self.buffered().min(len);
                self.c.start += have;
                if have == len {
                    self.payload_done(0);
                } else {
                    self.c.state = RxState::Discard { left: len - have };
                }
            }
        }
        None
    }

    /// Sets the socket's receive low-water mark to `bytes` when it differs. Every wait for
    /// readiness sets it first, never above what the current frame still has to deliver:
    /// the peer always sends whole frames, so those bytes come (or the connection ends, which
    /// is reported whatever the mark). Between frames it stays raised while bytes keep
    /// coming: one system call less per chunk on a busy rail.
    fn set_lowat(&mut self, fd: RawFd, bytes: usize) {
        let bytes = bytes.max(1);
        if bytes != self.c.lowat && io::set_rcvlowat(fd, bytes).is_ok() {
            self.c.lowat = bytes;
        }
    }

    fn payload_done(&mut self, _len: usize) {
        let mut s = self.ep.session.lock();
        let r = s.payload_done(self.rail);
        self.ep.deliver(&mut s);
        let dead = s.take_dead_rails();
        drop(s);
        self.ep.close_dead_rails(dead);
        self.c.state = RxState::Header;
        if let Err(e) = r {
            self.die(&format!("protocol error: {e}"));
        }
    }

    fn die(&mut self, why: &str) -> RxStep {
        self.c.state = RxState::Dead;
        self.ep.fail_rail(self.rail, why);
        RxStep::Dead
    }
}

/// Requests from application threads to the engine thread.
pub(crate) enum Command {
    /// Start servicing a new endpoint.
    Add(Arc<EndpointShared>),
    /// Flush the endpoint's rails and retry its stalled rails.
    Kick(u64),
    /// Send the endpoint's final frames, then drop it.
    Close(u64),
    /// A new connection for a failed rail of an endpoint.
    Restore {
        /// The endpoint.
        id: u64,
        /// The rail.
        rail: usize,
        /// The connection, handshake done.
        stream: TcpStream,
    },
    /// Stop the thread.
    Stop,
}

/// The way into the engine thread from other threads.
pub(crate) struct EngineShared {
    commands: Mutex<Vec<Command>>,
    waker: Waker,
}

impl EngineShared {
    pub(crate) fn send(&self, c: Command) {
        self.commands.lock().push(c);
        if let Err(e) = self.waker.wake() {
            tracing::error!("cannot wake the progress engine: {e}");
        }
    }

    pub(crate) fn kick(&self, endpoint: u64) {
        self.send(Command::Kick(endpoint));
    }
}

/// Handle to a context's engine thread; dropping the last one stops the thread.
pub(crate) struct Engine {
    shared: Arc<EngineShared>,
    thread: Option<JoinHandle<()>>,
}

impl Engine {
    pub(crate) fn start(name: String) -> std::io::Result<Engine> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(EngineShared {
            commands: Mutex::new(Vec::new()),
            waker,
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || EngineLoop::new(poll, s2).run())?;
        Ok(Engine {
            shared,
            thread: Some(thread),
        })
    }

    pub(crate) fn send(&self, c: Command) {
        self.shared.send(c);
    }

    pub(crate) fn kicker(&self) -> Arc<EngineShared> {
        self.shared.clone()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct EngineLoop {
    poll: Poll,
    shared: Arc<EngineShared>,
    /// Receive state per token.
    rx: HashMap<usize, (Arc<EndpointShared>, usize)>,
    /// Tokens of each endpoint's rails.
    endpoints: HashMap<u64, (Arc<EndpointShared>, Vec<usize>)>,
    /// Endpoints whose reads are left to an application thread polling them (their
    /// sockets are registered for writability only).
    muted: Vec<u64>,
    next_token: usize,
}

impl EngineLoop {
    fn new(poll: Poll, shared: Arc<EngineShared>) -> EngineLoop {
        EngineLoop {
            poll,
            shared,
            rx: HashMap::new(),
            endpoints: HashMap::new(),
            muted: Vec::new(),
            next_token: 0,
        }
    }

    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut next_tick = Instant::now() + TICK;
        loop {
            let mut timeout = next_tick.saturating_duration_since(Instant::now());
            if !self.muted.is_empty() {
                // Check back soon whether the polling thread is still there.
                timeout = timeout.min(std::time::Duration::from_nanos(APP_POLL_HOLD_NS));
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("progress engine poll failed: {e}");
                break;
            }
            let mut touched: Vec<u64> = Vec::new();
            for ev in events.iter() {
                if ev.token() == WAKER {
                    continue;
                }
                let token = ev.token().0;
                let Some((ep, rail)) = self.rx.get(&token).cloned() else {
                    continue;
                };
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    if ep.app_polling(clock_ns()) && !ev.is_read_closed() && !ev.is_error() {
                        self.mute(&ep);
                    } else {
                        ep.rx_run(rail);
                    }
                }
                if ev.is_writable() && !ep.closed.load(Ordering::Acquire) {
                    ep.flush_all();
                }
                if !touched.contains(&ep.id) {
                    touched.push(ep.id);
                }
            }
            let cmds = std::mem::take(&mut *self.shared.commands.lock());
            for c in cmds {
                match c {
                    Command::Add(ep) => self.add(ep),
                    Command::Kick(id) => touched.push(id),
                    Command::Close(id) => self.close(id),
                    Command::Restore { id, rail, stream } => {
                        self.restore(id, rail, stream);
                        touched.push(id);
                    }
                    Command::Stop => {
                        for id in self.endpoints.keys().copied().collect::<Vec<_>>() {
                            self.close(id);
                        }
                        return;
                    }
                }
            }
            touched.extend(self.unmute_idle());
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + TICK;
                touched.extend(self.tick(now));
            }
            touched.sort_unstable();
            touched.dedup();
            for id in touched {
                self.progress(id);
            }
            self.reap();
        }
    }

    fn set_interest(&self, ep: &EndpointShared, interest: Interest) {
        if let Some((_, tokens)) = self.endpoints.get(&ep.id) {
            for (rail, t) in tokens.iter().enumerate() {
                let fd = ep.rails[rail].fd();
                let _ = self
                    .poll
                    .registry()
                    .reregister(&mut SourceFd(&fd), Token(*t), interest);
            }
        }
    }

    /// Leaves the endpoint's reads to the application thread polling it.
    fn mute(&mut self, ep: &EndpointShared) {
        if !self.muted.contains(&ep.id) {
            self.set_interest(ep, Interest::WRITABLE);
            for r in &ep.rails {
                r.muted.store(true, Ordering::Release);
            }
            self.muted.push(ep.id);
        }
    }

    /// Takes reads back from endpoints no longer polled; returns them (their sockets may
    /// hold bytes that arrived unannounced).
    fn unmute_idle(&mut self) -> Vec<u64> {
        let now = clock_ns();
        let mut back = Vec::new();
        let muted = std::mem::take(&mut self.muted);
        for id in muted {
            let Some((ep, _)) = self.endpoints.get(&id).cloned() else {
                continue;
            };
            if ep.app_polling(now) && !ep.closed.load(Ordering::Acquire) {
                self.muted.push(id);
                continue;
            }
            self.set_interest(&ep, Interest::READABLE | Interest::WRITABLE);
            for r in &ep.rails {
                r.muted.store(false, Ordering::Release);
            }
            for rail in 0..ep.rails.len() {
                ep.rx_run(rail);
            }
            back.push(id);
        }
        back
    }

    /// Keepalives and dead-peer detection for every endpoint; returns those with frames to send.
    fn tick(&mut self, now: Instant) -> Vec<u64> {
        let mut touched = Vec::new();
        for (id, (ep, _)) in &self.endpoints {
            for rail in 0..ep.rails.len() {
                let Some(t) = io::tcp_sample(ep.rails[rail].fd()) else {
                    continue;
                };
                let mut s = ep.session.lock();
                if let Some(rate) = t.delivery_rate {
                    s.set_rail_capacity(rail, rate);
                }
                // Bytes the kernel holds for a payload still arriving are not read until the
                // low-water mark is reached: the rail is alive all the same.
                if let Some(at) = now.checked_sub(t.since_data_recv) {
                    s.on_rx_progress(rail, at);
                }
            }
            let dead = ep.session.lock().on_tick(now);
            let t = ep.session.lock().config().peer_timeout;
            for rail in (0..ep.rails.len()).filter(|r| dead & (1 << r) != 0) {
                ep.fail_rail(
                    rail,
                    &format!("nothing received for {t:?}: peer or link is gone"),
                );
            }
            touched.push(*id);
        }
        touched
    }

    fn add(&mut self, ep: Arc<EndpointShared>) {
        let mut tokens = Vec::new();
        for (i, r) in ep.rails.iter().enumerate() {
            let token = self.next_token;
            self.next_token += 1;
            let fd = r.fd();
            if let Err(e) = self.poll.registry().register(
                &mut SourceFd(&fd),
                Token(token),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                ep.fail_rail(i, &format!("cannot register with the progress engine: {e}"));
            }
            self.rx.insert(token, (ep.clone(), i));
            tokens.push(token);
        }
        let id = ep.id;
        self.endpoints.insert(id, (ep, tokens));
        // Data may have arrived before registration: edge-triggered polling would not report it.
        self.progress_rx_all(id);
        self.progress(id);
    }

    fn restore(&mut self, id: u64, rail: usize, stream: TcpStream) {
        let Some((ep, tokens)) = self.endpoints.get(&id) else {
            return;
        };
        let (ep, token) = (ep.clone(), tokens[rail]);
        if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
            return;
        }
        let old = ep.rails[rail].fd();
        let _ = self.poll.registry().deregister(&mut SourceFd(&old));
        let fd = stream.as_raw_fd();
        ep.rails[rail].replace(stream);
        *ep.rails[rail].rx.lock() = RxCore::new();
        let restored = {
            let mut s = ep.session.lock();
            let ok = s.on_rail_restored(rail);
            ep.deliver(&mut s);
            ok
        };
        let registered = self.poll.registry().register(
            &mut SourceFd(&fd),
            Token(token),
            Interest::READABLE | Interest::WRITABLE,
        );
        if !restored || registered.is_err() {
            ep.rails[rail].shutdown();
            return;
        }
        ep.rx_run(rail);
    }

    fn progress_rx_all(&mut self, id: u64) {
        let Some((_, tokens)) = self.endpoints.get(&id) else {
            return;
        };
        for t in tokens.clone() {
            if let Some((ep, rail)) = self.rx.get(&t).cloned() {
                ep.rx_run(rail);
            }
        }
    }

    /// Retries stalled rails and flushes transmit work of one endpoint until it settles.
    fn progress(&mut self, id: u64) {
        let Some((ep, tokens)) = self.endpoints.get(&id) else {
            return;
        };
        let (ep, tokens) = (ep.clone(), tokens.clone());
        for _ in 0..64 {
            let retry = ep.session.lock().take_rx_retry();
            if retry != 0 {
                for (i, _) in tokens.iter().enumerate() {
                    if retry & (1 << i) != 0 {
                        ep.rx_run(i);
                    }
                }
            }
            if ep.closed.load(Ordering::Acquire) || !ep.flush_all() {
                break;
            }
            if retry == 0 {
                break;
            }
        }
    }

    fn close(&mut self, id: u64) {
        if let Some((ep, _)) = self.endpoints.get(&id) {
            // Best effort: the Close frames go out if the sockets take them now.
            for rail in 0..ep.rails.len() {
                let _ = ep.flush_rail(rail);
            }
            ep.shutdown();
        }
        self.remove(id);
    }

    fn remove(&mut self, id: u64) {
        self.muted.retain(|m| *m != id);
        if let Some((ep, tokens)) = self.endpoints.remove(&id) {
            for (i, t) in tokens.into_iter().enumerate() {
                self.rx.remove(&t);
                let fd = ep.rails[i].fd();
                let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
            }
        }
    }

    /// Drops endpoints that failed.
    fn reap(&mut self) {
        let dead: Vec<u64> = self
            .endpoints
            .iter()
            .filter(|(_, (ep, _))| ep.closed.load(Ordering::Acquire))
            .map(|(id, _)| *id)
            .collect();
        for id in dead {
            self.remove(id);
        }
    }
}

impl EndpointShared {
    fn app_polling(&self, now_ns: u64) -> bool {
        let at = self.app_polled.load(Ordering::Acquire);
        at != 0 && now_ns.saturating_sub(at) < APP_POLL_HOLD_NS
    }

    /// True while an application thread drives this endpoint by polling and the engine
    /// has left the reads to it: frames that wait to be sent (the `Done` of a receive,
    /// say) go out with that thread's next poll or post, or with the engine's check
    /// within [`APP_POLL_HOLD_NS`] of the last poll, so the engine need not be woken for
    /// them now.
    pub(crate) fn polled_inline(&self) -> bool {
        self.rails.iter().all(|r| r.muted.load(Ordering::Acquire)) && self.app_polling(clock_ns())
    }
}

impl crate::cq::Driver for EndpointShared {
    fn drive(&self) {
        self.progress_inline();
    }

    fn release(&self) {
        // The polling thread is going to sleep: the engine must read again, now.
        if self.app_polled.swap(0, Ordering::AcqRel) != 0 {
            self.kicker.kick(self.id);
        }
    }
}
