//! The transmit side of a rail: frames taken from the session are gathered into batches
//! and written with one system call each, by whichever thread holds the rail's transmit
//! lock (the engine, or an application thread on the inline fast path).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::Instant;

use braid_proto::wire::HEADER_LEN;
use braid_proto::{Session, Transmit};

use super::EndpointShared;
use super::transport::Transport;

/// Most frames, and bytes, gathered into one send system call.
const BATCH_FRAMES: usize = 16;
const BATCH_BYTES: usize = 256 << 10;
/// Passes of [`EndpointShared::flush_all`] over the rails before it leaves the rest to
/// the engine thread.
const FLUSH_PASSES: usize = 64;

/// One rail's transmit state, behind [`super::RailIo`]'s transmit lock.
pub(super) struct TxState {
    /// The rail's current link.
    pub(super) link: Arc<dyn Transport>,
    /// Frames being written, in order; `off` bytes of the first are already sent.
    pub(super) batch: VecDeque<Transmit>,
    pub(super) off: usize,
    /// The last send failed with `EFAULT` (file pages truncated under a frame): the first
    /// frame is sent alone until it is out, to tell which frame it was.
    pub(super) solo: bool,
    /// The gather list of one send, kept between sends so that a send allocates nothing.
    scratch: Scratch,
}

/// The pieces of one send and whether each is stable (see `Transport::send`).
#[derive(Default)]
struct Scratch {
    pieces: Vec<(*const u8, usize)>,
    stable: Vec<bool>,
}

// SAFETY: the pointers are only used while the frames they come from are in the batch
// beside them (cleared before each send is built), under the rail's transmit lock.
unsafe impl Send for Scratch {}

impl TxState {
    pub(super) fn new(link: Arc<dyn Transport>) -> TxState {
        TxState {
            link,
            batch: VecDeque::new(),
            off: 0,
            solo: false,
            scratch: Scratch::default(),
        }
    }
}

/// Zeros that stand in for file pages a truncation took away after a frame's header
/// promised them (see [`pad_frame`]).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Replaces the payload of a frame with zeros of the same length: the bytes already sent
/// stay sent, the stream stays in step, and the session has been told the frame is void.
fn pad_frame(t: &mut Transmit) {
    t.payload = zero_pieces(t.payload.iter().map(|p| p.1).sum()).into();
}

/// Payload pieces of `len` zero bytes, each at most [`ZEROS`] long.
fn zero_pieces(len: usize) -> Vec<(*const u8, usize)> {
    let mut left = len;
    let mut pieces = Vec::with_capacity(left.div_ceil(ZEROS.len()));
    while left > 0 {
        let n = left.min(ZEROS.len());
        pieces.push((ZEROS.as_ptr(), n));
        left -= n;
    }
    pieces
}

/// Outcome of writing frames on one rail.
pub(super) enum Flush {
    /// Nothing left to send.
    Idle,
    /// The link is full; the writable edge will resume.
    Blocked,
}

impl EndpointShared {
    /// Writes frames on `rail` until none is left or the socket is full, waiting for the
    /// rail's transmit lock if another thread holds it.
    pub(super) fn flush_rail(&self, rail: usize) -> std::io::Result<Flush> {
        let tx = self.rails[rail].tx.lock();
        self.flush_held(rail, tx)
    }

    /// As [`EndpointShared::flush_rail`], unless another thread is writing the rail: that
    /// thread then sends this caller's frames too, and this one returns `None` at once.
    /// Threads that flush every rail in turn so write different rails side by side, instead
    /// of queueing behind the one in a long send. Endpoints of several rails only: a lone
    /// rail waits for its lock, and its holder need not look again (see `flush_held`).
    fn try_flush_rail(&self, rail: usize) -> Option<std::io::Result<Flush>> {
        let io = &self.rails[rail];
        io.tx_wanted.store(true, Ordering::Relaxed);
        // Pairs with the holder's fence after it lets the lock go: either this sees the
        // lock free, or the holder sees `tx_wanted`.
        fence(Ordering::SeqCst);
        let tx = io.tx.try_lock()?;
        Some(self.flush_held(rail, tx))
    }

    /// Flushes with the transmit lock held, and again after letting it go while a thread
    /// that found it held left frames behind (bounded: past that the engine goes on).
    fn flush_held<'a>(
        &'a self,
        rail: usize,
        mut tx: parking_lot::MutexGuard<'a, TxState>,
    ) -> std::io::Result<Flush> {
        let io = &self.rails[rail];
        let skippable = self.rails.len() > 1;
        for _ in 0..FLUSH_PASSES {
            // Frames a skipping thread left are in the session before its flag: cleared
            // here, before the session is asked, the flag can only mean newer ones.
            if skippable && io.tx_wanted.load(Ordering::Relaxed) {
                io.tx_wanted.store(false, Ordering::Relaxed);
            }
            let r = self.flush_locked(rail, &mut tx);
            io.tx_blocked
                .store(matches!(r, Ok(Flush::Blocked)), Ordering::Release);
            drop(tx);
            if !skippable || !matches!(r, Ok(Flush::Idle)) {
                return r;
            }
            fence(Ordering::SeqCst);
            if !io.tx_wanted.load(Ordering::Relaxed) {
                return r;
            }
            match io.tx.try_lock() {
                Some(t) => tx = t,
                // The thread that took it looks again itself.
                None => return r,
            }
        }
        self.kicker.kick(self.id);
        Ok(Flush::Idle)
    }

    /// Tops the batch up with the session's frames for `rail`: several small frames (a
    /// `Done` and the next request, say) leave in one system call. True when the session
    /// had no more.
    pub(super) fn top_up(&self, rail: usize, tx: &mut TxState, s: &mut Session) -> bool {
        let mut bytes: usize = tx.batch.iter().map(Transmit::len).sum::<usize>() - tx.off;
        // One clock read per batch: a batch leaves in one system call.
        let now = Instant::now();
        while tx.batch.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
            match s.poll_transmit(rail, now) {
                Some(t) => {
                    bytes += t.len();
                    tx.batch.push_back(t);
                }
                None => return true,
            }
        }
        false
    }

    pub(super) fn flush_locked(&self, rail: usize, tx: &mut TxState) -> std::io::Result<Flush> {
        loop {
            // The session had nothing more when the batch was topped up: once the batch is
            // out, there is no need to ask again (a thread that gives the session more
            // frames flushes them itself, after this one lets the transmit lock go), unless
            // a read response went out, whose news may free more.
            let mut exhausted = {
                let mut s = self.session.lock();
                if !s.rail_alive(rail) {
                    // Whatever was half-written is in the session's log, to be sent elsewhere.
                    tx.batch.clear();
                    tx.off = 0;
                    tx.solo = false;
                    return Ok(Flush::Idle);
                }
                self.top_up(rail, tx, &mut s)
            };
            if tx.batch.is_empty() {
                return Ok(Flush::Idle);
            }
            let mut scratch = std::mem::take(&mut tx.scratch);
            scratch.pieces.clear();
            scratch.stable.clear();
            let mut fragile = false;
            for t in tx.batch.iter().take(if tx.solo { 1 } else { usize::MAX }) {
                scratch.pieces.push((t.header.as_ptr(), HEADER_LEN));
                scratch.pieces.extend_from_slice(&t.payload);
                // A read response's source is released once the frame is written, and the
                // target's next requests may change it: only requests' payloads are stable.
                let keeps = t.read_response.is_none();
                scratch.stable.push(false);
                scratch
                    .stable
                    .extend(std::iter::repeat_n(keeps, t.payload.len()));
                fragile |= t.fragile();
            }
            let sent = tx
                .link
                .send(&scratch.pieces, tx.off, fragile, &scratch.stable);
            tx.scratch = scratch;
            match sent {
                Ok(n) => {
                    tx.off += n;
                    if tx.solo && tx.batch.front().is_some_and(|t| t.len() <= tx.off) {
                        tx.solo = false;
                    }
                    while tx.batch.front().is_some_and(|t| t.len() <= tx.off) {
                        let t = tx.batch.pop_front().expect("checked");
                        tx.off -= t.len();
                        if let Some(seq) = t.read_response {
                            // The session may have more once it knows (a read's trailer):
                            // ask it again below.
                            exhausted = false;
                            let mut s = self.session.lock();
                            s.transmitted(seq);
                            if s.rx_retry_pending() {
                                // A request waited for this read response; the engine resumes it.
                                drop(s);
                                self.kicker.kick(self.id);
                            }
                        }
                    }
                    if exhausted && tx.batch.is_empty() {
                        return Ok(Flush::Idle);
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
    ///
    /// The session hands each small operation to one chosen rail (the one with the fewest
    /// bytes in flight, round robin among equals), so a rail earlier in the pass may be
    /// chosen for the next one after a later rail took its own: passes repeat while a rail
    /// that is not blocked still has frames (each pass sends at least one; bounded anyway).
    pub(crate) fn flush_all(&self) -> bool {
        // Whatever a polling thread held back goes now.
        self.ctrl_held_since.store(0, Ordering::Release);
        self.answer_due.store(false, Ordering::Release);
        // One rail: no pass can find it chosen again behind another rail, and asking the
        // session first whether it wants to send costs what the flush's own asking costs.
        let single = self.rails.len() == 1;
        for _ in 0..FLUSH_PASSES {
            let mut again = false;
            // Rails another thread is writing: it takes their frames, not this pass.
            let mut busy = 0u64;
            for rail in 0..self.rails.len() {
                if !single
                    && !self.rails[rail].tx_blocked.load(Ordering::Acquire)
                    && !self.session.lock().wants_transmit(rail)
                {
                    continue;
                }
                let flushed = if single {
                    Some(self.flush_rail(rail))
                } else {
                    self.try_flush_rail(rail)
                };
                match flushed {
                    Some(Ok(Flush::Idle)) => again = true,
                    Some(Ok(Flush::Blocked)) => {}
                    None => busy |= 1 << rail,
                    Some(Err(e)) => {
                        self.fail_rail(rail, &format!("send failed: {e}"));
                        return false;
                    }
                }
            }
            let more = again && !single && {
                let s = self.session.lock();
                (0..self.rails.len()).any(|r| {
                    busy & (1 << r) == 0
                        && !self.rails[r].tx_blocked.load(Ordering::Acquire)
                        && s.wants_transmit(r)
                })
            };
            if !more {
                return true;
            }
        }
        // Still more after every pass (a long queue of small operations): the engine
        // thread goes on with it.
        self.kicker.kick(self.id);
        true
    }
}

/// Test hook: a rail's transmit lock held as by a thread in the middle of a send.
#[cfg(test)]
pub(crate) struct HeldTx<'a> {
    ep: &'a EndpointShared,
    rail: usize,
    tx: parking_lot::MutexGuard<'a, TxState>,
}

#[cfg(test)]
impl EndpointShared {
    /// Takes `rail`'s transmit lock until [`HeldTx::finish`].
    pub(crate) fn hold_tx(&self, rail: usize) -> HeldTx<'_> {
        HeldTx {
            ep: self,
            rail,
            tx: self.rails[rail].tx.lock(),
        }
    }

    /// A thread that found `rail`'s transmit lock held left its frames to the holder.
    pub(crate) fn tx_wanted(&self, rail: usize) -> bool {
        self.rails[rail].tx_wanted.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
impl HeldTx<'_> {
    /// Ends the holder's send as a flush does: what the session has for the rail goes out.
    pub(crate) fn finish(self) -> std::io::Result<()> {
        self.ep.flush_held(self.rail, self.tx).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pieces_cover_the_length_in_bounded_pieces_of_zeros() {
        for len in [
            0,
            1,
            4096,
            ZEROS.len() - 1,
            ZEROS.len(),
            ZEROS.len() + 1,
            200 << 10,
        ] {
            let pieces = zero_pieces(len);
            assert_eq!(pieces.iter().map(|p| p.1).sum::<usize>(), len, "len {len}");
            assert_eq!(pieces.len(), len.div_ceil(ZEROS.len()), "len {len}");
            for &(p, n) in &pieces {
                assert_eq!(p, ZEROS.as_ptr());
                assert!(n > 0 && n <= ZEROS.len());
            }
        }
        assert!(ZEROS.iter().all(|&b| b == 0));
    }
}
