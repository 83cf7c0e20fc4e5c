//! The engine's extra receive threads (`ContextConfig::engine_threads` beyond the first):
//! each owns the readiness of the rails the engine thread hands it, in an epoll set of its
//! own, and reads and writes them as the engine thread does its own. Four rails can then
//! use four cores for their receive copies.
//!
//! Everything else stays with the engine thread (`event_loop.rs`): endpoints, commands,
//! timers, link events, and which rails an application thread reads instead (it changes a
//! worker's interest in a rail through the worker's registry). Ordering and exactly-once
//! do not depend on which thread reads: a rail's receive state is behind its lock and every
//! frame goes through the session's lock, as when an application thread reads.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use mio::event::Event;
use mio::{Events, Poll, Registry, Token, Waker};
use parking_lot::Mutex;

use super::{EndpointShared, clock_ns};

const WAKER: Token = Token(usize::MAX);

/// What the thread that owns a rail does with a readiness event of it (the engine thread
/// and the workers alike). Returns true when an application thread polls the endpoint:
/// the bytes are left to it, and the engine thread should stop watching the endpoint's
/// reads (`EngineLoop::mute`).
pub(super) fn on_rail_event(ep: &EndpointShared, rail: usize, ev: &Event) -> bool {
    let mut leave_reads = false;
    // A rail whose reads wait behind another rail (strict placement) reads nothing, and
    // would not see a reset from the peer until it resumes.
    if ev.is_error()
        && let Some(e) = ep.rails[rail].link().take_error()
    {
        ep.fail_rail(rail, &format!("link error: {e}"));
    }
    if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
        if ep.app_polling(clock_ns()) && !ev.is_read_closed() && !ev.is_error() {
            leave_reads = true;
        } else {
            ep.rx_run(rail);
        }
    }
    if ev.is_writable() && !ep.closed.load(Ordering::Acquire) {
        ep.flush_all();
    }
    leave_reads
}

/// The rails a worker serves, by token (tokens are the engine thread's, unique across its
/// workers).
type RailMap = HashMap<usize, (Arc<EndpointShared>, usize)>;

struct WorkerShared {
    rails: Mutex<RailMap>,
    stop: AtomicBool,
    waker: Waker,
}

/// Tells the engine thread that an application thread polls endpoint `id` (see
/// [`on_rail_event`]).
pub(super) type LeaveReads = Box<dyn Fn(u64) + Send>;

/// One extra receive thread; dropping it stops and joins the thread.
pub(super) struct RailWorker {
    /// The worker's epoll set, through which the engine thread registers, re-registers
    /// (mutes) and deregisters the rails it hands over.
    registry: Registry,
    shared: Arc<WorkerShared>,
    thread: Option<JoinHandle<()>>,
}

impl RailWorker {
    /// Starts a worker; it calls `leave_reads` when an application thread polls one of its
    /// endpoints.
    pub(super) fn start(name: String, leave_reads: LeaveReads) -> std::io::Result<RailWorker> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        let shared = Arc::new(WorkerShared {
            rails: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            waker: Waker::new(poll.registry(), WAKER)?,
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(poll, &s2, &leave_reads))?;
        Ok(RailWorker {
            registry,
            shared,
            thread: Some(thread),
        })
    }

    pub(super) fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Serves `rail` of `ep` under `token` from now on (its descriptor is registered by the
    /// caller, after this).
    pub(super) fn adopt(&self, token: usize, ep: Arc<EndpointShared>, rail: usize) {
        self.shared.rails.lock().insert(token, (ep, rail));
    }

    /// Stops serving `token` (its descriptor was deregistered by the caller).
    pub(super) fn release(&self, token: usize) {
        self.shared.rails.lock().remove(&token);
    }
}

impl Drop for RailWorker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Err(e) = self.shared.waker.wake() {
            tracing::error!("cannot wake an engine worker to stop it: {e}");
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(mut poll: Poll, shared: &WorkerShared, leave_reads: &LeaveReads) {
    let mut events = Events::with_capacity(256);
    let mut touched: Vec<Arc<EndpointShared>> = Vec::new();
    loop {
        // No timeout: timers are the engine thread's; this thread only reads and writes.
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("engine worker poll failed: {e}");
            return;
        }
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        for ev in events.iter() {
            if ev.token() == WAKER {
                continue;
            }
            let Some((ep, rail)) = shared.rails.lock().get(&ev.token().0).cloned() else {
                continue;
            };
            if on_rail_event(&ep, rail, ev) {
                leave_reads(ep.id);
            }
            if !touched.iter().any(|t| Arc::ptr_eq(t, &ep)) {
                touched.push(ep);
            }
        }
        for ep in touched.drain(..) {
            ep.settle();
        }
    }
}
