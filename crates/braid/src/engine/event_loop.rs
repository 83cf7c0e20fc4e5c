//! The progress engine's thread: an event loop over every rail's socket (mio, edge
//! triggered), the commands application threads send it, keepalive ticks, local link
//! events and stalled-link checks, and the hand-over of reads to an application thread that
//! polls an endpoint.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use parking_lot::Mutex;

use super::linkwatch::LinkWatch;
use super::rail_worker::{RailWorker, on_rail_event};
use super::transport::{LinkSample, Transport};
use super::{APP_POLL_HOLD_NS, EndpointShared, clock_ns};

const WAKER: Token = Token(usize::MAX);
/// Tokens of link watches: this plus the watch's descriptor (rails count up from 0).
const LINK_WATCH: usize = usize::MAX / 2;
/// Longest sleep before timer work for an endpoint whose session names no deadline yet
/// (see `Session::poll_timeout`).
const TICK: std::time::Duration = std::time::Duration::from_millis(100);
/// Longest sleep with no endpoint at all.
const IDLE_TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// Period of the rails' delivery-rate samples handed to the sessions.
const CAPACITY_PERIOD: std::time::Duration = std::time::Duration::from_millis(100);
/// The period while some rail has data in flight, whose acknowledgements are watched
/// (see `SessionConfig::rail_stall_timeout`).
const STALL_TICK: std::time::Duration = std::time::Duration::from_millis(25);

/// Requests from application threads to the engine thread.
pub(crate) enum Command {
    /// Start servicing a new endpoint.
    Add(Arc<EndpointShared>),
    /// Flush the endpoint's rails and retry its stalled rails.
    Kick(u64),
    /// Send the endpoint's final frames, then drop it.
    Close(u64),
    /// An application thread polls the endpoint: leave its reads to it (from a worker
    /// that saw a rail of it readable).
    Mute(u64),
    /// A new connection for a failed rail of an endpoint.
    Restore {
        /// The endpoint.
        id: u64,
        /// The rail.
        rail: usize,
        /// The new link, handshake done.
        link: Arc<dyn Transport>,
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
    /// Starts the engine thread `name`, and `threads - 1` workers beside it (`workers-1`,
    /// ...) over which the rails of its endpoints are spread. (Linux keeps 15 bytes of a
    /// thread's name.)
    pub(crate) fn start(name: &str, workers: &str, threads: usize) -> std::io::Result<Engine> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let shared = Arc::new(EngineShared {
            commands: Mutex::new(Vec::new()),
            waker,
        });
        let mut rail_workers = Vec::new();
        for i in 1..threads.max(1) {
            let s = shared.clone();
            rail_workers.push(RailWorker::start(
                format!("{workers}-{i}"),
                Box::new(move |id| s.send(Command::Mute(id))),
            )?);
        }
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || EngineLoop::new(poll, s2, rail_workers).run())?;
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

/// Where a rail's readiness is watched: its token, and which thread owns it (0: the engine
/// thread, `i`: worker `i - 1`).
#[derive(Clone, Copy)]
struct RailSlot {
    token: usize,
    owner: usize,
}

struct EngineLoop {
    poll: Poll,
    shared: Arc<EngineShared>,
    /// The extra receive threads; rails are dealt to this thread and them in turn.
    workers: Vec<RailWorker>,
    /// Owner of the next rail registered (see [`RailSlot`]), modulo the thread count.
    next_owner: usize,
    /// Receive state per token.
    rx: HashMap<usize, (Arc<EndpointShared>, usize)>,
    /// Where each endpoint's rails are watched.
    endpoints: HashMap<u64, (Arc<EndpointShared>, Vec<RailSlot>)>,
    /// Endpoints whose reads are left to an application thread polling them (their
    /// sockets are registered for writability only).
    muted: Vec<u64>,
    next_token: usize,
    /// rtnetlink sockets of the rails' namespaces.
    links: LinkWatch,
    /// Since when each rail (endpoint, rail) has been seen with data in flight.
    in_flight_since: HashMap<(u64, usize), Instant>,
    /// When rail capacities were last sampled: every [`CAPACITY_PERIOD`], however often
    /// the tick runs (the session smooths per sample).
    capacity_at: Option<Instant>,
    /// Some rail received data within [`TICK`] at the last tick: its peer is sending, and a
    /// rail that falls quiet meanwhile is looked at every [`STALL_TICK`].
    receiving: bool,
}

impl EngineLoop {
    fn new(poll: Poll, shared: Arc<EngineShared>, workers: Vec<RailWorker>) -> EngineLoop {
        EngineLoop {
            poll,
            shared,
            workers,
            next_owner: 0,
            rx: HashMap::new(),
            endpoints: HashMap::new(),
            muted: Vec::new(),
            next_token: 0,
            links: LinkWatch::default(),
            in_flight_since: HashMap::new(),
            capacity_at: None,
            receiving: false,
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
            let mut links_changed = false;
            for ev in events.iter() {
                if ev.token() == WAKER {
                    continue;
                }
                let token = ev.token().0;
                if token >= LINK_WATCH {
                    self.links.drain((token - LINK_WATCH) as RawFd);
                    links_changed = true;
                    continue;
                }
                let Some((ep, rail)) = self.rx.get(&token).cloned() else {
                    continue;
                };
                if on_rail_event(&ep, rail, ev) {
                    self.mute(&ep);
                }
                if !touched.contains(&ep.id) {
                    touched.push(ep.id);
                }
            }
            let cmds = std::mem::take(&mut *self.shared.commands.lock());
            for c in cmds {
                match c {
                    Command::Add(ep) => {
                        self.add(ep);
                        // Its clocks start with its first tick.
                        next_tick = Instant::now();
                    }
                    Command::Kick(id) => {
                        // A thread that polls the endpoint kicks it too (a receive posted
                        // while frames wait): the reads are left to it again at once, or
                        // each of its posts would wake this thread to read beside it.
                        if let Some((ep, _)) = self.endpoints.get(&id).cloned()
                            && ep.app_polling(clock_ns())
                        {
                            self.mute(&ep);
                        }
                        touched.push(id);
                    }
                    Command::Close(id) => self.close(id),
                    Command::Mute(id) => {
                        if let Some((ep, _)) = self.endpoints.get(&id).cloned() {
                            if ep.app_polling(clock_ns()) {
                                self.mute(&ep);
                            } else {
                                // The poller left before this came: what the worker left
                                // to it is read now (its edge is gone).
                                for rail in 0..ep.rails.len() {
                                    ep.rx_run(rail);
                                }
                                touched.push(id);
                            }
                        }
                    }
                    Command::Restore { id, rail, link } => {
                        self.restore(id, rail, link);
                        touched.push(id);
                        next_tick = Instant::now();
                    }
                    Command::Stop => {
                        for id in self.endpoints.keys().copied().collect::<Vec<_>>() {
                            self.close(id);
                        }
                        return;
                    }
                }
            }
            if links_changed {
                touched.extend(self.check_links());
            }
            touched.extend(self.unmute_idle());
            let now = Instant::now();
            let ticked = now >= next_tick;
            if ticked {
                touched.extend(self.tick(now));
            }
            touched.sort_unstable();
            touched.dedup();
            for id in touched {
                self.progress(id);
            }
            if ticked {
                // After the keepalives the tick queued went out: they move the deadlines.
                next_tick = self.next_tick(now);
            }
            self.reap();
        }
    }

    /// The epoll set of the thread that owns a rail.
    fn registry(&self, owner: usize) -> &Registry {
        match owner {
            0 => self.poll.registry(),
            i => self.workers[i - 1].registry(),
        }
    }

    fn set_interest(&self, ep: &EndpointShared, interest: Interest) {
        if let Some((_, slots)) = self.endpoints.get(&ep.id) {
            for (rail, slot) in slots.iter().enumerate() {
                let fd = ep.rails[rail].fd();
                // Such a link wakes the engine only when asked to, or when a blocked send
                // has room again (which a writable-only interest would not see).
                let interest = if ep.rails[rail].link().signals_when_armed() {
                    Interest::READABLE | Interest::WRITABLE
                } else {
                    interest
                };
                let _ = self.registry(slot.owner).reregister(
                    &mut SourceFd(&fd),
                    Token(slot.token),
                    interest,
                );
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
            // A poller that comes back (one preempted for longer than the hold, on a busy
            // machine) marks its next poll at once, so that the reads return to it then.
            let at = ep.app_polled.load(Ordering::Acquire);
            let _ = ep
                .app_polled
                .compare_exchange(at, 0, Ordering::AcqRel, Ordering::Acquire);
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

    /// When timer work is due next: the sessions' own deadlines (keepalives, peer
    /// timeouts), and [`STALL_TICK`] while a rail has data in flight, whose link is watched,
    /// or data is coming in or a rail's reads wait behind another: a rail may go quiet.
    /// A rail that starts sending after a quiet spell is seen at the next of these.
    fn next_tick(&self, now: Instant) -> Instant {
        let mut due = now + IDLE_TICK;
        let mut busy = self.receiving || !self.in_flight_since.is_empty();
        for (ep, _) in self.endpoints.values() {
            let s = ep.session.lock();
            match s.poll_timeout() {
                Some(t) => due = due.min(t),
                None if !s.is_failed() => due = due.min(now + TICK),
                None => {}
            }
            busy |= s.rx_stalled();
        }
        if busy {
            due = due.min(now + STALL_TICK);
        }
        due.max(now + std::time::Duration::from_millis(1))
    }

    /// Keepalives, dead-peer and stalled-link detection for every endpoint; returns those
    /// with frames to send.
    fn tick(&mut self, now: Instant) -> Vec<u64> {
        let mut touched = Vec::new();
        let capacity = self
            .capacity_at
            .is_none_or(|t| now.duration_since(t) >= CAPACITY_PERIOD);
        if capacity {
            self.capacity_at = Some(now);
        }
        let in_flight = &mut self.in_flight_since;
        let mut receiving = false;
        for (id, (ep, _)) in &self.endpoints {
            let mut stalled = Vec::new();
            for rail in 0..ep.rails.len() {
                let Some(t) = ep.rails[rail].link().sample() else {
                    continue;
                };
                receiving |= t.since_data_recv < TICK;
                let mut s = ep.session.lock();
                if let Some(rate) = t.delivery_rate.filter(|_| capacity) {
                    s.set_rail_capacity(rail, rate);
                }
                // Bytes the kernel holds for a payload still arriving are not read until the
                // low-water mark is reached: the rail is alive all the same.
                if let Some(at) = now.checked_sub(t.since_data_recv) {
                    s.on_rx_progress(rail, at);
                }
                let bound = s.config().rail_stall_timeout;
                let spare = s.rail_alive(rail) && others_alive(&s, rail);
                drop(s);
                if let Some(why) = stall_check(in_flight, now, (*id, rail), &t, bound, spare) {
                    stalled.push((rail, why));
                } else if spare && !bound.is_zero() && t.since_data_recv >= STALL_TICK {
                    // A quiet rail's device is looked at on every tick: the event of a
                    // carrier lost at the far end of the cable may come a second late.
                    if let Some(why) = ep.rails[rail].link().local_fault() {
                        stalled.push((rail, why));
                    }
                }
            }
            for (rail, why) in stalled {
                ep.fail_rail(rail, &why);
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
        self.receiving = receiving;
        touched
    }

    /// Fails every live rail whose local device went down, lost its carrier or its
    /// address, unless it is the last (see [`others_alive`]); returns the endpoints touched.
    fn check_links(&mut self) -> Vec<u64> {
        let mut touched = Vec::new();
        for (id, (ep, _)) in &self.endpoints {
            for rail in 0..ep.rails.len() {
                {
                    let s = ep.session.lock();
                    if !s.rail_alive(rail) || !others_alive(&s, rail) {
                        continue;
                    }
                }
                if let Some(why) = ep.rails[rail].link().local_fault() {
                    ep.fail_rail(rail, &why);
                    touched.push(*id);
                }
            }
        }
        touched
    }

    /// Watches the namespace of rail socket `fd` for link events, if not yet watched.
    fn watch_links(&mut self, fd: RawFd) {
        if let Some(w) = self.links.watch(fd)
            && let Err(e) = self.poll.registry().register(
                &mut SourceFd(&w),
                Token(LINK_WATCH + w as usize),
                Interest::READABLE,
            )
        {
            tracing::debug!("cannot poll link events: {e}");
        }
    }

    fn add(&mut self, ep: Arc<EndpointShared>) {
        let mut slots = Vec::new();
        for (i, r) in ep.rails.iter().enumerate() {
            let slot = RailSlot {
                token: self.next_token,
                owner: self.next_owner % (self.workers.len() + 1),
            };
            self.next_token += 1;
            self.next_owner += 1;
            if slot.owner > 0 {
                self.workers[slot.owner - 1].adopt(slot.token, ep.clone(), i);
            }
            let fd = r.fd();
            if let Err(e) = self.registry(slot.owner).register(
                &mut SourceFd(&fd),
                Token(slot.token),
                Interest::READABLE | Interest::WRITABLE,
            ) {
                ep.fail_rail(i, &format!("cannot register with the progress engine: {e}"));
            }
            self.rx.insert(slot.token, (ep.clone(), i));
            slots.push(slot);
            self.watch_links(fd);
        }
        let id = ep.id;
        self.endpoints.insert(id, (ep, slots));
        // Data may have arrived before registration: edge-triggered polling would not report it.
        self.progress_rx_all(id);
        self.progress(id);
    }

    fn restore(&mut self, id: u64, rail: usize, link: Arc<dyn Transport>) {
        let Some((ep, slots)) = self.endpoints.get(&id) else {
            return;
        };
        let (ep, slot) = (ep.clone(), slots[rail]);
        let old = ep.rails[rail].fd();
        let _ = self.registry(slot.owner).deregister(&mut SourceFd(&old));
        let fd = link.readiness_fd();
        ep.rails[rail].replace(link);
        self.in_flight_since.remove(&(id, rail));
        self.watch_links(fd);
        let restored = {
            let mut s = ep.session.lock();
            let ok = s.on_rail_restored(rail);
            ep.deliver(&mut s);
            ok
        };
        let registered = self.registry(slot.owner).register(
            &mut SourceFd(&fd),
            Token(slot.token),
            Interest::READABLE | Interest::WRITABLE,
        );
        if !restored || registered.is_err() {
            ep.rails[rail].shutdown();
            return;
        }
        ep.rx_run(rail);
    }

    fn progress_rx_all(&mut self, id: u64) {
        let Some((ep, _)) = self.endpoints.get(&id).cloned() else {
            return;
        };
        for rail in 0..ep.rails.len() {
            ep.rx_run(rail);
        }
    }

    /// Retries stalled rails and flushes transmit work of one endpoint until it settles.
    fn progress(&mut self, id: u64) {
        if let Some((ep, _)) = self.endpoints.get(&id).cloned() {
            ep.settle();
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
        self.in_flight_since.retain(|(e, _), _| *e != id);
        if let Some((ep, slots)) = self.endpoints.remove(&id) {
            for (i, slot) in slots.into_iter().enumerate() {
                self.rx.remove(&slot.token);
                let fd = ep.rails[i].fd();
                let _ = self.registry(slot.owner).deregister(&mut SourceFd(&fd));
                if slot.owner > 0 {
                    self.workers[slot.owner - 1].release(slot.token);
                }
            }
            ep.rx_abandon();
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

/// Whether a live rail's link has had data in flight and heard no acknowledgement, and no
/// data either, for `bound` (or four round trips, if longer); why, if so. Only a `spare` rail (not the
/// last) is judged. Keeps `in_flight`: since when each rail has had data in flight.
fn stall_check(
    in_flight: &mut HashMap<(u64, usize), Instant>,
    now: Instant,
    key: (u64, usize),
    t: &LinkSample,
    bound: std::time::Duration,
    spare: bool,
) -> Option<String> {
    if bound.is_zero() || !spare || t.unacked == 0 {
        in_flight.remove(&key);
        return None;
    }
    let since = *in_flight.entry(key).or_insert(now);
    let bound = bound.max(t.rtt * 4);
    // Both: an acknowledgement long ago says nothing of data sent just now. And a rail the
    // peer is sending on lives: on a slow link the acknowledgements of what we sent wait in
    // the peer's queue behind its own data (on a 500 kbit/s testbed rail, a `RailAck`
    // waited 168 ms behind the peer's writes).
    if now.duration_since(since) < bound || t.since_ack_recv < bound || t.since_data_recv < bound {
        return None;
    }
    in_flight.remove(&key);
    Some(format!(
        "no acknowledgement for {:?} (and no data for {:?}) with {} segments in flight (round trip {:?})",
        t.since_ack_recv, t.since_data_recv, t.unacked, t.rtt
    ))
}

/// True if a rail other than `rail` is alive. The fast signals (a local link event, a
/// stalled link) fail only a rail the session can do without: failing the last one fails
/// the endpoint, which is left to `peer_timeout`, as before them (a link that comes back
/// within it, or a stall that was a lost window after all, then costs nothing).
fn others_alive(s: &braid_proto::Session, rail: usize) -> bool {
    (0..s.rail_count()).any(|r| r != rail && s.rail_alive(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_for_unknown_endpoints_are_ignored_and_stop_ends_the_thread() {
        let engine = Engine::start("braid-eng-test", "braid-eng-w", 2).expect("engine starts");
        engine.send(Command::Kick(7));
        engine.kicker().kick(8);
        engine.send(Command::Close(9));
        let (a, _b) = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            let a = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
            (a, l.accept().expect("accept").0)
        };
        engine.send(Command::Restore {
            id: 10,
            rail: 0,
            link: Arc::new(super::super::transport::Tcp::new(a).expect("tcp link")),
        });
        // Stop ends the loop once it has taken every command above without falling over.
        let mut engine = engine;
        let thread = engine.thread.take().expect("running");
        engine.send(Command::Stop);
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while !thread.is_finished() {
            assert!(Instant::now() < deadline, "the engine thread did not stop");
            std::thread::yield_now();
        }
        assert!(thread.join().is_ok(), "the engine thread panicked");
    }

    /// Names of this process's threads.
    fn thread_names() -> Vec<String> {
        std::fs::read_dir("/proc/self/task")
            .expect("/proc/self/task")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|n| n.trim().to_string())
            .collect()
    }

    #[test]
    fn workers_start_with_the_engine_and_stop_with_it() {
        let engine = Engine::start("bt-eng", "bt-eng-rx", 3).expect("engine starts");
        // A new thread names itself once it runs.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let mut names = thread_names();
        for w in ["bt-eng", "bt-eng-rx-1", "bt-eng-rx-2"] {
            while !names.iter().any(|n| n == w) {
                assert!(Instant::now() < deadline, "{w} missing from {names:?}");
                std::thread::yield_now();
                names = thread_names();
            }
        }
        assert!(!names.iter().any(|n| n == "bt-eng-rx-3"), "{names:?}");
        drop(engine);
        // Dropping joins the engine thread, which drops (and joins) its workers.
        let names = thread_names();
        assert!(!names.iter().any(|n| n.starts_with("bt-eng")), "{names:?}");
    }
}
