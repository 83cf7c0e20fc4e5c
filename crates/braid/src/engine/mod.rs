//! The progress engine: one thread per [`crate::Context`] that owns every rail's receive
//! side and services the peer's one-sided operations without the application's help.
//!
//! Transmission is shared: whoever holds a rail's transmit lock (the engine, or an
//! application thread taking the inline fast path for a small operation) writes frames
//! until the session has none left for that rail or the socket is full. A full socket is
//! picked up again by the engine on the socket's writable edge.

mod event_loop;
mod express;
pub(crate) mod io;
mod linkwatch;
mod rail_worker;
pub(crate) mod raw;
mod rx;
pub(crate) mod shm;
pub(crate) mod transport;
mod tx;

use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::cq::{CompletionQueue, RailFd};
use braid_proto::Session;
use braid_proto::error::CompletionKind;

pub(crate) use event_loop::{Command, Engine, EngineShared};
use rx::RxCore;
use transport::{ReadinessFds, Transport};
use tx::TxState;

/// An application thread that polled this recently is taken to be polling still.
const APP_POLL_HOLD_NS: u64 = 1_000_000;

/// How long a busy-polling thread holds back control frames that its reading produced,
/// for a request of the application's to carry in the same send: a ping-pong's `Done`
/// otherwise leaves alone on the next poll, a moment before the reply that could carry it
/// (one `sendmsg` and one wake-up of the peer's receive path more per message: 8 B
/// ping-pong over an unshaped testbed rail, `scripts/lat-vs-ucx.sh BRAID 3`, 7.17-10.12 µs
/// one way before the hold, 6.29-6.35 µs with it).
/// Requests, responses and retransmissions are never held; a thread going to sleep sends
/// everything first.
const CTRL_HOLD_NS: u64 = 20_000;

/// Polling threads refresh [`EndpointShared::app_polled`] once in this many polls of an
/// endpoint.
const POLL_MARK_EVERY: u32 = 32;

/// Monotonic nanoseconds (`CLOCK_MONOTONIC`, never 0). Read straight, not as an
/// `Instant` since a start: a busy-polling thread reads it on every poll, and the
/// subtraction and 128-bit conversion of `Instant::elapsed` cost more than the read.
pub(crate) fn clock_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
        .max(1)
}

/// A process-wide name for a new link (see `RailIo::link_gen`).
fn next_link_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// One rail's link (see [`transport`]) with its transmit and receive state. The link is
/// replaced when a failed rail is re-established.
pub(crate) struct RailIo {
    /// The current link's readiness descriptor, which the engine polls (read without
    /// taking a lock).
    fd: AtomicI32,
    /// What a thread asleep on the rails polls for the current link (see
    /// [`Transport::sleeper_fds`]).
    sleeper_fds: Mutex<ReadinessFds>,
    /// Frames already taken from the session wait in `tx` for the link to take them. The
    /// session then may have nothing for this rail (all handed out, or its window full),
    /// so the writable edge must resume the rail on this flag alone.
    tx_blocked: AtomicBool,
    /// A thread found this rail's transmit lock held and left its frames to the holder,
    /// which looks at the session again before it returns (see
    /// [`EndpointShared::flush_rail`]).
    tx_wanted: AtomicBool,
    /// The engine has left this rail's reads to a polling thread (see
    /// [`EndpointShared::polled_inline`]).
    muted: AtomicBool,
    /// The current link carries express requests (see `express`).
    express: AtomicBool,
    /// Names the current link, unique in the process: a new link (of this rail or of
    /// another endpoint) may reuse a closed socket's number, and whoever keeps descriptors
    /// in an epoll set must tell the two apart.
    link_gen: AtomicU64,
    /// Times a new link took the place of a failed one.
    restores: AtomicU64,
    tx: Mutex<TxState>,
    rx: Mutex<RxCore>,
}

impl RailIo {
    pub(crate) fn new(link: Arc<dyn Transport>) -> RailIo {
        RailIo {
            fd: AtomicI32::new(link.readiness_fd()),
            sleeper_fds: Mutex::new(link.sleeper_fds()),
            tx_blocked: AtomicBool::new(false),
            tx_wanted: AtomicBool::new(false),
            muted: AtomicBool::new(false),
            express: AtomicBool::new(link.carries_express()),
            link_gen: AtomicU64::new(next_link_id()),
            restores: AtomicU64::new(0),
            rx: Mutex::new(RxCore::new(link.clone())),
            tx: Mutex::new(TxState::new(link)),
        }
    }

    fn fd(&self) -> RawFd {
        self.fd.load(Ordering::Acquire)
    }

    /// Ends the current link (both directions).
    pub(crate) fn shutdown(&self) {
        self.tx.lock().link.shutdown();
    }

    /// Ends the current link as broken (see `Transport::abort`).
    fn abort(&self) {
        self.tx.lock().link.abort();
    }

    /// The current link.
    fn link(&self) -> Arc<dyn Transport> {
        self.tx.lock().link.clone()
    }

    /// The current link's transport name.
    pub(crate) fn kind(&self) -> &'static str {
        self.tx.lock().link.kind()
    }

    /// Times a new link took the place of a failed one.
    pub(crate) fn restores(&self) -> u64 {
        self.restores.load(Ordering::Acquire)
    }

    /// Puts a new link in place of the old one (which is closed when its last user lets
    /// go), with fresh transmit and receive state.
    fn replace(&self, link: Arc<dyn Transport>) {
        let mut tx = self.tx.lock();
        self.fd.store(link.readiness_fd(), Ordering::Release);
        *self.sleeper_fds.lock() = link.sleeper_fds();
        self.express
            .store(link.carries_express(), Ordering::Release);
        self.link_gen.store(next_link_id(), Ordering::Release);
        tx.link = link.clone();
        tx.batch.clear();
        tx.off = 0;
        tx.solo = false;
        self.tx_blocked.store(false, Ordering::Release);
        drop(tx);
        *self.rx.lock() = RxCore::new(link);
        self.restores.fetch_add(1, Ordering::AcqRel);
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
    /// The peer closed the endpoint (a `Close` came on some rail): the other rails' ends
    /// that follow are its closing, not failures.
    pub(crate) peer_closed: AtomicBool,
    pub(crate) kicker: Arc<EngineShared>,
    /// When an application thread last drove this endpoint's progress (nanoseconds on
    /// [`clock_ns`]; 0 = not polling). While recent, the engine leaves reads to it.
    pub(crate) app_polled: AtomicU64,
    /// Since when a polling thread has held back control frames (a `Done`, an
    /// acknowledgement) for the application's next request to carry ([`clock_ns`]; 0 =
    /// none held). See [`CTRL_HOLD_NS`].
    pub(crate) ctrl_held_since: AtomicU64,
    /// A receive completed here since the last flush: the application is likely to answer,
    /// and its request can carry the control frames that wait. Without one (the target of
    /// one-sided operations, which see no completion here), a `Done` or an atomic's
    /// response is what the peer waits for, and holding it back would only delay it.
    pub(crate) answer_due: AtomicBool,
    /// Threads sleeping on this endpoint's sockets (see `CompletionQueue::arm`): the
    /// engine leaves reads to them as to a polling thread.
    pub(crate) rail_sleepers: AtomicUsize,
    /// A read since a polling thread last asked the session for frames to send (or frames
    /// left then): the next poll asks again (see `progress_on_caller`).
    pub(crate) tx_check: AtomicBool,
    /// Polls of this endpoint by application threads, counted loosely (see
    /// [`POLL_MARK_EVERY`]).
    pub(crate) polls: std::sync::atomic::AtomicU32,
    /// On the connecting side: starts re-dialling a failed rail.
    pub(crate) redial: Option<Box<dyn Fn(usize) + Send + Sync>>,
}

impl EndpointShared {
    /// Moves the session's completions to the queues.
    pub(crate) fn deliver(&self, s: &mut Session) {
        while let Some(c) = s.poll_completion() {
            match c.kind {
                CompletionKind::Recv | CompletionKind::RecvWriteImm => {
                    self.answer_due.store(true, Ordering::Release);
                    self.recv_cq.push(c)
                }
                _ => self.send_cq.push(c),
            }
        }
        let silent = s.take_unsignaled_done();
        if silent > 0 {
            self.send_cq.unreserve_n(silent as usize);
        }
    }

    /// Fails the endpoint because `rail` broke.
    /// Gives up `rail`: the session fails over to the other rails, or fails the endpoint
    /// when it was the last one.
    pub(crate) fn fail_rail(&self, rail: usize, why: &str) {
        let mut s = self.session.lock();
        if !s.is_failed() && s.rail_alive(rail) {
            if why.contains("the peer closed the endpoint") {
                self.peer_closed.store(true, Ordering::Relaxed);
                tracing::info!(endpoint = self.id, peer = %self.peer, "the peer closed the endpoint");
            } else if self.peer_closed.load(Ordering::Relaxed) {
                // A slow rail's `Close` may still be queued behind its data when the peer's
                // socket goes.
                tracing::info!(endpoint = self.id, peer = %self.peer, rail, "rail ended after the peer closed: {why}");
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

    /// Progress driven by an application thread polling a completion queue: reads every rail
    /// no other thread is reading, and sends what that produced. This saves the hand-off from
    /// the engine thread on latency-bound loops.
    pub(crate) fn progress_inline(&self) {
        self.progress_on_caller(false);
    }

    /// [`EndpointShared::progress_inline`]; with `wait_for_readers`, a rail another thread
    /// is reading is read again once that thread is done. A thread about to sleep on the
    /// rails needs that: bytes that arrived while the other thread was finishing its read
    /// have raised their edge already and would otherwise wait for the next one.
    fn progress_on_caller(&self, wait_for_readers: bool) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        // The clock costs as much as the rest of an empty poll: a polling thread marks
        // itself every POLL_MARK_EVERY polls (and on its first), well within
        // APP_POLL_HOLD_NS at any polling rate that matters.
        // Per endpoint (a thread polling several must mark each), and not an atomic
        // increment: two polling threads that count one poll once mark a poll late.
        let k = self.polls.load(Ordering::Relaxed).wrapping_add(1);
        self.polls.store(k, Ordering::Relaxed);
        let now =
            if k.is_multiple_of(POLL_MARK_EVERY) || self.app_polled.load(Ordering::Relaxed) == 0 {
                let now = clock_ns();
                self.app_polled.store(now, Ordering::Release);
                now
            } else {
                0
            };
        // Only reading makes frames that a poll must send (a post sends its own, the
        // engine what its tick and its reads make): while no read found anything, the
        // session is not asked, nor locked.
        let ask = wait_for_readers || self.tx_check.load(Ordering::Acquire);
        if ask {
            // Cleared before the session is asked: a reader that sets it again after this
            // made its frames before, and they are seen below.
            self.tx_check.store(false, Ordering::Release);
        }
        // What the previous poll's reading produced (acknowledgements, Done frames) goes out
        // first, unless it is control frames only, a receive completed since the last
        // flush, and a busy-polling thread has held them for less than CTRL_HOLD_NS: the
        // answer the application posts meanwhile carries them in the same send. Without
        // such a receive nothing here is about to answer (see `answer_due`): a `Done` or an
        // atomic's response goes at once; acknowledgements are still held.
        let answer_due = self.answer_due.load(Ordering::Acquire);
        let (data, ctrl, urgent) = if !ask {
            (false, false, false)
        } else {
            let s = self.session.lock();
            (0..self.rails.len()).fold((false, false, false), |(d, c, u), r| {
                let c_r = s.wants_ctrl_transmit(r);
                (
                    d || s.wants_data_transmit(r),
                    c || c_r,
                    u || (c_r && !answer_due && s.wants_reply_transmit(r)),
                )
            })
        };
        if data || ctrl {
            // Held back, or not all of it may go: ask again next time.
            self.tx_check.store(true, Ordering::Release);
        }
        // Whether the session may have changed here: a read, an answer, or a flush (a read
        // response written may let a stalled rail go on). Otherwise nothing can be due for
        // a retry that this poll made due (a post_recv that makes one kicks the engine).
        let mut changed = wait_for_readers;
        if data
            || urgent
            || (ctrl
                && (wait_for_readers
                    || self.ctrl_held_long(if now == 0 { clock_ns() } else { now })))
        {
            self.flush_all();
            changed = true;
        }
        // Whether rail retries are due, as the receive loops last saw the session (`None`:
        // ask it): a loop that found something has just held its lock, and a poll that
        // found a message saves taking it again.
        let mut retry = (!changed).then_some(false);
        for rail in 0..self.rails.len() {
            if wait_for_readers {
                self.rx_run(rail);
            } else if let Some(seen) = self.rx_try_run(rail) {
                changed = true;
                retry = retry.zip(seen).map(|(a, b)| a | b);
            }
        }
        // (`tx_check` is set already: by a read that found something, or above when frames
        // waited.)
        if changed && retry.unwrap_or_else(|| self.session.lock().rx_retry_pending()) {
            self.kicker.kick(self.id);
        }
    }

    /// Retries rails whose reads waited (behind another rail, or for a receive) and
    /// flushes what that produced, until nothing is left to retry (bounded).
    pub(crate) fn settle(&self) {
        for _ in 0..64 {
            let retry = self.session.lock().take_rx_retry();
            for rail in (0..self.rails.len()).filter(|r| retry & (1 << r) != 0) {
                self.rx_run(rail);
            }
            if self.closed.load(Ordering::Acquire) || !self.flush_all() || retry == 0 {
                break;
            }
        }
    }

    /// Control frames are waiting: true once they have been held back for
    /// [`CTRL_HOLD_NS`] (the first call starts the hold).
    fn ctrl_held_long(&self, now: u64) -> bool {
        match self
            .ctrl_held_since
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => false,
            Err(since) => now.saturating_sub(since) >= CTRL_HOLD_NS,
        }
    }

    /// Shuts the sockets of rails the session has given up (`dead`, from
    /// `Session::take_dead_rails`). Called without the session lock: a shutdown takes the
    /// rail's transmit lock, which `flush_rail` holds while it takes the session lock.
    pub(crate) fn close_dead_rails(&self, dead: u64) {
        if dead == 0 {
            // The usual case, asked after every frame.
            return;
        }
        for (i, r) in self.rails.iter().enumerate() {
            if dead & (1 << i) != 0 {
                r.abort();
            }
        }
    }

    pub(crate) fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        for r in &self.rails {
            r.shutdown();
        }
    }

    /// An application thread reads this endpoint's rails: it polled recently, or it
    /// sleeps on their sockets.
    fn app_polling(&self, now_ns: u64) -> bool {
        self.rail_sleepers.load(Ordering::Acquire) > 0 || self.polled_recently(now_ns)
    }

    fn polled_recently(&self, now_ns: u64) -> bool {
        let at = self.app_polled.load(Ordering::Acquire);
        at != 0 && now_ns.saturating_sub(at) < APP_POLL_HOLD_NS
    }

    /// True while an application thread drives this endpoint by polling and the engine
    /// has left the reads to it: frames that wait to be sent (the `Done` of a receive,
    /// say) go out with that thread's next poll or post, or with the engine's check
    /// within [`APP_POLL_HOLD_NS`] of the last poll, so the engine need not be woken for
    /// them now. Not while a thread sleeps on the rails: it sends only when woken.
    pub(crate) fn polled_inline(&self) -> bool {
        self.rail_sleepers.load(Ordering::Acquire) == 0
            && self.rails.iter().all(|r| r.muted.load(Ordering::Acquire))
            && self.polled_recently(clock_ns())
    }
}

impl crate::cq::Driver for EndpointShared {
    fn drive(&self) {
        self.progress_inline();
    }

    fn drive_before_sleep(&self) {
        self.progress_on_caller(true);
    }

    fn release(&self) {
        // The polling thread is going to sleep: the engine must read again, now.
        if self.app_polled.swap(0, Ordering::AcqRel) != 0 {
            self.kicker.kick(self.id);
        }
    }

    fn rail_fds(&self, out: &mut Vec<RailFd>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        for (rail, r) in self.rails.iter().enumerate() {
            let link = r.link_gen.load(Ordering::Acquire);
            for &fd in r.sleeper_fds.lock().as_slice() {
                out.push(RailFd { fd, link, rail });
            }
        }
    }

    fn hold(&self, sleeping: bool) {
        if sleeping {
            self.rail_sleepers.fetch_add(1, Ordering::AcqRel);
        } else {
            // Counted as a poll just now: the thread usually waits again at once, and the
            // engine takes the reads back within APP_POLL_HOLD_NS if it does not.
            self.app_polled.store(clock_ns(), Ordering::Release);
            self.rail_sleepers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn read_rail(&self, rail: usize) {
        if self.closed.load(Ordering::Acquire) || rail >= self.rails.len() {
            return;
        }
        self.app_polled.store(clock_ns(), Ordering::Release);
        self.rx_run(rail);
        if self.session.lock().rx_retry_pending() {
            self.kicker.kick(self.id);
        }
    }

    fn flush(&self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        // A blocked rail is tried again too: a link that signals only when asked (the
        // same-host ring) woke this thread for room as for data.
        let want = self
            .rails
            .iter()
            .any(|r| r.tx_blocked.load(Ordering::Acquire))
            || {
                let s = self.session.lock();
                (0..self.rails.len()).any(|r| s.wants_transmit(r))
            };
        if want {
            self.flush_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_monotonic_and_never_zero() {
        let a = clock_ns();
        let b = clock_ns();
        assert!(a > 0);
        assert!(b >= a);
    }
}
