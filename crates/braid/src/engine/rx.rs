//! The receive side of a rail: frames are read from the socket and executed by the
//! session, payloads placed straight into registered memory, by whichever thread holds the
//! rail's receive lock (the engine thread, or an application thread polling a completion
//! queue).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use braid_proto::mem::file::copy_maybe_fragile;
use braid_proto::wire::{FrameHeader, HEADER_LEN, MAX_EXPRESS_PAYLOAD, Opcode};
use braid_proto::{ExpressAction, Placement, RxAction};

use super::io::Received;
use super::transport::Transport;
use super::{EndpointShared, clock_ns};

/// Receive buffer for headers and small payloads; larger payloads bypass it. An `Express`
/// frame is executed from it, so one fits whole.
const RX_BUF: usize = 1024;
const _: () = assert!(HEADER_LEN + MAX_EXPRESS_PAYLOAD as usize <= RX_BUF);
/// After a payload at least this large, read the next header exactly, so that the bulk of
/// the following chunk is not pulled through the small buffer (one copy, not two).
const BULK_PAYLOAD: u32 = 16 << 10;
/// Largest receive low-water mark set while a bulk payload arrives: the engine is woken once
/// this much (or the rest of the payload) is queued, not for every segment. Bounded so that
/// a rail that is still trickling is read (and seen alive) within milliseconds.
const LOWAT_MAX: usize = 512 << 10;

/// Receive-side state of one rail. Whoever holds its lock (the engine thread, or an
/// application thread polling a completion queue) reads the socket.
pub(crate) struct RxCore {
    /// The rail's current link.
    pub(super) link: Arc<dyn Transport>,
    /// The link carries express requests (read between frames).
    express: bool,
    buf: Box<[u8; RX_BUF]>,
    start: usize,
    end: usize,
    state: RxState,
    bulk: bool,
    /// The last read came back short: the socket was empty, no need to ask again now.
    pub(super) drained: bool,
    /// Bytes were read since the session was last told the rail is idle (an empty poll
    /// need not tell it again: a busy-polling thread polls millions of times a second).
    read_since_idle: bool,
    /// When the session last heard that payload bytes are arriving ([`clock_ns`]).
    progress_noted: u64,
    /// The socket's receive low-water mark as last set (1: the kernel's default).
    lowat: usize,
}

impl RxCore {
    pub(super) fn new(link: Arc<dyn Transport>) -> RxCore {
        RxCore {
            express: link.carries_express(),
            link,
            buf: Box::new([0u8; RX_BUF]),
            start: 0,
            end: 0,
            state: RxState::Header,
            bulk: false,
            drained: false,
            read_since_idle: false,
            progress_noted: 0,
            lowat: 1,
        }
    }
}

/// The receive loop of one rail, with its state locked.
pub(super) struct RxRail<'a> {
    pub(super) ep: &'a EndpointShared,
    pub(super) rail: usize,
    pub(super) c: &'a mut RxCore,
    /// The thread will sleep on the link when the loop ends (the engine, a thread about to
    /// sleep on the rails), so a link that signals only when asked is armed first; a
    /// busy-polling thread comes back by itself.
    pub(super) arm: bool,
    /// The time the frames of the last read are handed to the session with: read once per
    /// read, not per frame (a busy-polling ping-pong read the clock eight times a message).
    clock: Option<Instant>,
    /// An express request was executed in this loop (see `reap_express`).
    pub(super) ran_express: bool,
    /// The loop found something to read, execute or reap (see `rx_try_run`).
    pub(super) found: bool,
    /// Whether the session had rail retries due ([`Session::rx_retry_pending`]) when the
    /// loop last released its lock; `None` when the loop's last use of the session did not
    /// look (its caller then asks the session itself).
    pub(super) retry: Option<bool>,
}

enum RxState {
    Header,
    /// A header whose payload has not arrived yet: it is offered to the session once the
    /// payload is there (up to `LOWAT_MAX`), so that a frame is never half-read for long.
    /// A hedged copy of a frame waits while its original is being read (see the session's
    /// `hedge` module): on a slow rail, an original offered at its header would hold the
    /// copy, and the fast rail behind it, for as long as its payload takes to trickle in.
    Arriving(FrameHeader),
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

/// What `RxRail::run_express` (in `engine/express.rs`) found.
pub(super) enum ExpressStep {
    /// No express request next: read the link as usual.
    Read,
    /// The link is empty.
    Empty,
    /// One executed: look again.
    Ran,
    /// The loop ends (the request waits for a receive, or the rail failed).
    End(RxStep),
}

/// Whether a rail's receive loop can go on.
pub(super) enum RxStep {
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
        // Answers to this side's express requests come beside the stream, whatever holds
        // the stream up: a rail stalled on the peer's send (no receive posted yet) must still
        // complete the sends whose buffers the application reposts as receives. An express
        // request at the head runs first (in a ping-pong its completion is what the caller
        // waits for); the answers then wait for the end of the pass, the next poll, or the
        // request's stall (`stalled_express`).
        if self.c.express
            && !self.c.link.express_next()
            && let Some(step) = self.reap_express()
        {
            return step;
        }
        // Every call reads at least once: it was called because bytes may have arrived.
        self.c.drained = false;
        loop {
            match std::mem::replace(&mut self.c.state, RxState::Header) {
                RxState::Dead => {
                    self.c.state = RxState::Dead;
                    return RxStep::Dead;
                }
                RxState::Header => {
                    if self.c.express && self.buffered() == 0 {
                        match self.run_express() {
                            ExpressStep::Read => {}
                            ExpressStep::Ran => continue,
                            ExpressStep::Empty => {
                                self.set_lowat(1);
                                self.rx_idle();
                                match self.wait() {
                                    Some(step) => return step,
                                    None => continue,
                                }
                            }
                            ExpressStep::End(step) => return step,
                        }
                    }
                    if self.buffered() < HEADER_LEN {
                        self.compact();
                        if !self.c.drained {
                            let want = if self.c.bulk { HEADER_LEN } else { RX_BUF };
                            match self.fill(want.max(self.c.end + 1) - self.c.end) {
                                Ok(true) => continue,
                                Ok(false) => {}
                                Err(step) => return step,
                            }
                        }
                        self.set_lowat(1);
                        self.rx_idle();
                        match self.wait() {
                            Some(step) => return step,
                            None => continue,
                        }
                    }
                    match FrameHeader::decode(&self.c.buf[self.c.start..self.c.end]) {
                        Ok(h) if h.opcode == Opcode::Express => {
                            if let Some(step) = self.express_frame(h) {
                                return step;
                            }
                        }
                        Ok(h) => {
                            // The payload is not all here yet: wait for it before the
                            // session sees the header.
                            let rest = (h.payload_len as usize)
                                .saturating_sub(self.buffered() - HEADER_LEN)
                                .min(LOWAT_MAX);
                            if rest > 0 {
                                let waiting = if self.c.drained {
                                    Some(0)
                                } else {
                                    self.c.link.bytes_waiting()
                                };
                                if waiting.is_some_and(|w| w < rest) {
                                    self.set_lowat(rest);
                                    self.c.state = RxState::Arriving(h);
                                    match self.wait() {
                                        Some(step) => return step,
                                        None => continue,
                                    }
                                }
                            }
                            if let Some(step) = self.offer(h) {
                                return step;
                            }
                        }
                        Err(e) => return self.die(&format!("malformed frame: {e}")),
                    }
                }
                RxState::Arriving(h) => {
                    if let Some(step) = self.offer(h) {
                        return step;
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
                        self.set_lowat((len - done).min(LOWAT_MAX));
                        self.c.state = RxState::Payload { place, len, done };
                        match self.wait() {
                            Some(step) => return step,
                            None => continue,
                        }
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
                    self.clock = None;
                    match self
                        .c
                        .link
                        .recv_pieces(&place.iov, done, tail, place.fragile)
                    {
                        Ok(Received { got: 0, asked }) => {
                            return self.die(if asked > 0 {
                                "peer closed the connection"
                            } else {
                                "placement shorter than the payload"
                            });
                        }
                        Ok(Received { got: n, asked }) if done + n >= len => {
                            self.c.end += done + n - len;
                            // Only a read that got less than it asked for says the socket is
                            // empty. Without a header's room behind the payload (a small one,
                            // or more pieces than one call takes) nothing is known: taking
                            // that for empty left bytes unread with no edge to come.
                            self.c.drained = n < asked;
                            self.payload_done(len);
                        }
                        Ok(Received { got: n, asked }) => {
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
                            self.set_lowat((len - done - n).min(LOWAT_MAX));
                            // The rail is alive; telling the session costs a lock, so at most
                            // every 10 ms (its silence timeout is seconds).
                            let now = clock_ns();
                            if now - self.c.progress_noted > 10_000_000 {
                                self.c.progress_noted = now;
                                self.ep
                                    .session
                                    .lock()
                                    .on_rx_progress(self.rail, Instant::now());
                                self.retry = None;
                            }
                            self.c.state = RxState::Payload {
                                place,
                                len,
                                done: done + n,
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.set_lowat((len - done).min(LOWAT_MAX));
                            self.c.state = RxState::Payload { place, len, done };
                            match self.wait() {
                                Some(step) => return step,
                                None => continue,
                            }
                        }
                        Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                            // The destination's file pages were truncated: the operation
                            // fails, the rest of the payload is read and dropped.
                            self.ep.session.lock().payload_fault(self.rail);
                            self.retry = None;
                            self.c.state = RxState::Discard { left: len - done };
                        }
                        Err(e) => return self.die(&format!("receive failed: {e}")),
                    }
                }
                RxState::Discard { left } => {
                    let mut scratch = [0u8; 16 << 10];
                    let n = left.min(scratch.len());
                    match self.c.link.recv(&mut scratch[..n]) {
                        Ok(0) => return self.die("peer closed the connection"),
                        Ok(n) if n >= left => self.payload_done(0),
                        Ok(n) => self.c.state = RxState::Discard { left: left - n },
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            self.set_lowat(1);
                            self.c.state = RxState::Discard { left };
                            match self.wait() {
                                Some(step) => return step,
                                None => continue,
                            }
                        }
                        Err(e) => return self.die(&format!("receive failed: {e}")),
                    }
                }
            }
        }
    }

    /// An `Express` frame at the buffer's start: executed once all of it is in the buffer
    /// (it fits: see `RX_BUF`), which it leaves then; a stalled one stays for the retry.
    /// `Some` ends the receive loop; `None`: go on (executed, or more bytes read).
    fn express_frame(&mut self, h: FrameHeader) -> Option<RxStep> {
        let need = HEADER_LEN + h.payload_len as usize;
        if self.buffered() < need {
            self.compact();
            if !self.c.drained {
                match self.fill(RX_BUF - self.c.end) {
                    Ok(true) => return None,
                    Ok(false) => {}
                    Err(step) => return Some(step),
                }
            }
            self.set_lowat(need - self.buffered());
            return self.wait();
        }
        self.c.read_since_idle = true;
        self.found = true;
        let payload = &self.c.buf[self.c.start + HEADER_LEN..self.c.start + need];
        let mut s = self.ep.session.lock();
        let r = s.on_express_frame(self.rail, &h, payload);
        // Answers it carried may have completed this side's requests.
        self.ep.deliver(&mut s);
        self.retry = Some(s.rx_retry_pending());
        drop(s);
        match r {
            Ok(ExpressAction::Done(_)) => {
                self.c.start += need;
                self.c.bulk = false;
                None
            }
            Ok(ExpressAction::Stall) => Some(RxStep::Wait),
            Err(e) => Some(self.die(&format!("protocol error: {e}"))),
        }
    }

    /// Moves the bytes of the small buffer not taken yet to its start.
    fn compact(&mut self) {
        if self.c.start > 0 {
            self.c.buf.copy_within(self.c.start..self.c.end, 0);
            self.c.end -= self.c.start;
            self.c.start = 0;
        }
    }

    /// Reads up to `room` more bytes into the small buffer: `Ok(true)` when some came,
    /// `Ok(false)` when the link had none; `Err` ends the loop (the rail failed).
    fn fill(&mut self, room: usize) -> Result<bool, RxStep> {
        match self
            .c
            .link
            .recv(&mut self.c.buf[self.c.end..self.c.end + room])
        {
            Ok(0) => Err(self.die("peer closed the connection")),
            Ok(n) => {
                // The frames of this read are handed over with the time of this read.
                self.clock = None;
                self.c.end += n;
                self.c.drained = n < room;
                self.c.read_since_idle = true;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(self.die(&format!("receive failed: {e}"))),
        }
    }

    /// Offers a header to the session; `Some` ends the receive loop.
    fn offer(&mut self, h: FrameHeader) -> Option<RxStep> {
        self.c.read_since_idle = true;
        self.found = true;
        let mut s = self.ep.session.lock();
        let now = *self.clock.get_or_insert_with(Instant::now);
        let action = match s.on_frame(self.rail, &h, now) {
            Ok(a) => a,
            Err(e) => {
                drop(s);
                return Some(self.die(&format!("protocol error: {e}")));
            }
        };
        self.ep.deliver(&mut s);
        let dead = s.take_dead_rails();
        self.retry = Some(s.rx_retry_pending());
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
                    self.retry = None;
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
    fn set_lowat(&mut self, bytes: usize) {
        let bytes = bytes.max(1);
        if bytes != self.c.lowat && self.c.link.set_wake_threshold(bytes).is_ok() {
            self.c.lowat = bytes;
        }
    }

    /// Tells the session the rail has nothing more to read now, if bytes came since it was
    /// last told (it may acknowledge them).
    fn rx_idle(&mut self) {
        if std::mem::take(&mut self.c.read_since_idle) {
            let mut s = self.ep.session.lock();
            s.on_rx_idle(self.rail);
            self.retry = Some(s.rx_retry_pending());
        }
    }

    /// The link holds less than the loop waits for (`lowat` bytes): ends the loop, unless
    /// this thread is about to sleep and the link, asked to signal, has the bytes already.
    /// `None`: read again.
    fn wait(&mut self) -> Option<RxStep> {
        if self.c.express
            && let Some(step) = self.reap_express()
        {
            return Some(step);
        }
        if !self.arm {
            return Some(RxStep::Wait);
        }
        match self.c.link.arm(self.c.lowat) {
            Ok(false) => Some(RxStep::Wait),
            Ok(true) => {
                self.c.drained = false;
                None
            }
            Err(e) => Some(self.die(&format!("receive failed: {e}"))),
        }
    }

    fn payload_done(&mut self, _len: usize) {
        self.found = true;
        let mut s = self.ep.session.lock();
        let r = s.payload_done(self.rail);
        self.ep.deliver(&mut s);
        let dead = s.take_dead_rails();
        self.retry = Some(s.rx_retry_pending());
        drop(s);
        self.ep.close_dead_rails(dead);
        self.c.state = RxState::Header;
        if let Err(e) = r {
            self.die(&format!("protocol error: {e}"));
        }
    }

    pub(super) fn die(&mut self, why: &str) -> RxStep {
        self.found = true;
        if self.c.express {
            // Requests the peer answered before the rail ended (before its `Close`, say)
            // complete as answered, not as failed with it, whatever a busy poller's lazy
            // look at the control page left unreaped (errors here change nothing: the rail
            // fails anyway). Those the peer's records carried, then the control page's.
            for _ in 0..2 {
                if self.c.link.express_unanswered() == 0 || !self.c.link.express_answered(true) {
                    break;
                }
                let mut s = self.ep.session.lock();
                let _ = self.c.link.reap_express(&mut |st| {
                    let _ = s.express_acked(st);
                });
                self.ep.deliver(&mut s);
            }
        }
        self.c.state = RxState::Dead;
        self.ep.fail_rail(self.rail, why);
        // Nothing more is written into a placement of this rail: its memory may go.
        self.ep.session.lock().payload_abandoned(self.rail);
        self.retry = None;
        RxStep::Dead
    }
}

impl EndpointShared {
    /// The endpoint is gone from the engine: no rail's receive loop runs again, so the
    /// placements they were filling are given up (a region a dead peer was writing into can
    /// then be deregistered). Waits for a polling thread that is inside a loop to leave it.
    pub(super) fn rx_abandon(&self) {
        for (rail, r) in self.rails.iter().enumerate() {
            r.rx.lock().state = RxState::Dead;
            self.session.lock().payload_abandoned(rail);
        }
    }

    /// Runs `rail`'s receive loop; waits for the lock if another thread holds it.
    pub(super) fn rx_run(&self, rail: usize) -> RxStep {
        let mut c = self.rails[rail].rx.lock();
        let mut r = RxRail {
            ep: self,
            rail,
            c: &mut c,
            arm: true,
            clock: None,
            ran_express: false,
            found: false,
            retry: None,
        };
        let step = r.run();
        if r.found {
            self.tx_check.store(true, Ordering::Release);
        }
        step
    }

    /// Runs `rail`'s receive loop unless another thread holds it (that thread reads).
    /// `Some` when the loop found anything (bytes, an express request, answers), so that
    /// the session may have changed; with it, whether rail retries were due when the loop
    /// last held the session's lock (`None`: unknown).
    pub(super) fn rx_try_run(&self, rail: usize) -> Option<Option<bool>> {
        let mut c = self.rails[rail].rx.try_lock()?;
        // A busy poller's usual turn: nothing at all, told by the link at a glance, at a
        // fraction of the loop's cost (every turn of the poller's loop delays the message
        // it will find by half a turn, on average).
        if c.express
            && c.start == c.end
            && matches!(c.state, RxState::Header)
            && !c.read_since_idle
            && c.link.quiet()
        {
            return None;
        }
        let mut r = RxRail {
            ep: self,
            rail,
            c: &mut c,
            arm: false,
            clock: None,
            ran_express: false,
            found: false,
            retry: None,
        };
        r.run();
        if r.found {
            self.tx_check.store(true, Ordering::Release);
        }
        r.found.then_some(r.retry)
    }
}
