//! The rendezvous's I/O: a listening socket, a small fixed pool of handshake workers that
//! authenticate each connection within a whole-message deadline, a reader thread per
//! admitted rank, and the thread that feeds [`RootCore`] and writes its messages. A
//! stranger costs a queue slot for at most the handshake deadline, never a thread.

use std::collections::{HashMap, VecDeque};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::throttle::LogThrottle;

use super::core::{Action, ConnId, RootCore};
use super::event::Event;
use super::greet::{Greeting, Progress};
use crate::error::BootError;
use crate::wire::{self, ClientMsg};

/// Bound on the whole hello exchange of a new connection (however its bytes dribble in),
/// counted from its accept.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections whose greeting is in progress at once (served by the accept thread's poll,
/// no thread each); when full, the oldest is closed.
const MAX_GREETING: usize = 256;
/// Reader threads of admitted connections beyond the job's size (refused ones end at once).
const EXTRA_READERS: usize = 16;
/// At most one warning per this interval about refused or dropped connections.
const WARN_INTERVAL: Duration = Duration::from_secs(1);
/// Bound on writing one message to a rank.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

struct Shared {
    stop: AtomicBool,
    /// Every open connection (a clone), so stopping can shut them all down.
    conns: Mutex<HashMap<ConnId, TcpStream>>,
    next_conn: AtomicU64,
    /// Reader threads running (admitted connections).
    readers: AtomicUsize,
    max_readers: usize,
    /// Rate limit of warnings about strangers' connections.
    warn: LogThrottle,
    accept_log: LogThrottle,
}

impl Shared {
    fn forget(&self, conn: ConnId) {
        if let Some(s) = self.conns.lock().expect("conns lock").remove(&conn) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// A warning about one connection, at most one per [`WARN_INTERVAL`].
    fn warn(&self, from: SocketAddr, what: &str) {
        if let Some(held) = self.warn.allow() {
            tracing::warn!(peer = %from, held_back = held, "rendezvous: {what}");
        }
    }
}

/// A running rendezvous (hosted by rank 0).
pub(crate) struct RootServer {
    shared: Arc<Shared>,
    events: mpsc::Sender<Event>,
    accept: Option<JoinHandle<()>>,
    core: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl RootServer {
    /// Listens on `bind` and serves the rendezvous of `job` (`size` ranks).
    pub(crate) fn start(
        bind: SocketAddr,
        job: &str,
        size: usize,
        secret: Option<Vec<u8>>,
        join_timeout: Duration,
    ) -> Result<RootServer, BootError> {
        let listen_err = |error| BootError::RootListen {
            addr: bind.to_string(),
            error,
        };
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(bind),
            socket2::Type::STREAM,
            None,
        )
        .map_err(listen_err)?;
        sock.set_reuse_address(true).map_err(listen_err)?;
        if bind.is_ipv6() {
            // Dual stack: IPv4 ranks reach an IPv6 wildcard too.
            let _ = sock.set_only_v6(false);
        }
        sock.bind(&bind.into()).map_err(listen_err)?;
        sock.listen(1024).map_err(listen_err)?;
        let listener: TcpListener = sock.into();
        listener.set_nonblocking(true).map_err(listen_err)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            readers: AtomicUsize::new(0),
            max_readers: size.saturating_add(EXTRA_READERS),
            warn: LogThrottle::new(WARN_INTERVAL),
            accept_log: LogThrottle::new(WARN_INTERVAL),
        });
        let (tx, rx) = mpsc::channel();
        let secret: Option<Arc<[u8]>> = secret.map(Arc::from);
        let accept = {
            let (shared, tx) = (shared.clone(), tx.clone());
            std::thread::Builder::new()
                .name("braid-boot-accept".into())
                .spawn(move || accept_loop(listener, shared, tx, secret))?
        };
        let core = {
            let shared = shared.clone();
            let core = RootCore::new(job, size, Instant::now(), join_timeout);
            std::thread::Builder::new()
                .name("braid-boot-root".into())
                .spawn(move || core_loop(core, rx, shared))?
        };
        tracing::debug!(%addr, job, size, "rendezvous listening");
        Ok(RootServer {
            shared,
            events: tx,
            accept: Some(accept),
            core: Some(core),
            addr,
        })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Keeps serving until every rank has left (or the job failed), at most `linger`, then
    /// stops.
    pub(crate) fn finish(mut self, linger: Duration) {
        let _ = self.events.send(Event::Finish(Instant::now() + linger));
        self.stop_threads();
    }

    /// [`RootServer::finish`] on a thread of its own, so that a rank 0 whose join failed
    /// returns its error at once while late ranks still learn why the job failed. The
    /// process's exit (a return from `main`, `std::process::exit`) waits for that thread:
    /// a rank 0 that exits on its error still serves late ranks the cause, up to `linger`.
    pub(crate) fn finish_detached(self, linger: Duration) {
        let spawned = std::thread::Builder::new()
            .name("braid-boot-linger".into())
            .spawn(move || self.finish(linger));
        if let Ok(h) = spawned {
            LINGERING.lock().expect("lingering lock").push(h);
            static AT_EXIT: std::sync::Once = std::sync::Once::new();
            AT_EXIT.call_once(|| {
                // SAFETY: registers a plain function with no captured state.
                unsafe { libc::atexit(wait_lingering) };
            });
        }
    }

    fn stop_threads(&mut self) {
        if let Some(c) = self.core.take() {
            let _ = c.join();
        }
        self.shared.stop.store(true, Ordering::Release);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        for (_, s) in self.shared.conns.lock().expect("conns lock").drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Rendezvous still serving late ranks after their rank 0's join failed.
static LINGERING: Mutex<Vec<JoinHandle<()>>> = Mutex::new(Vec::new());

/// Run at process exit: waits (each bounded by its linger) for lingering rendezvous.
extern "C" fn wait_lingering() {
    let handles = match LINGERING.lock() {
        Ok(mut l) => std::mem::take(&mut *l),
        Err(_) => return,
    };
    for h in handles {
        let _ = h.join();
    }
}

impl Drop for RootServer {
    fn drop(&mut self) {
        if self.core.is_some() {
            let _ = self.events.send(Event::Finish(Instant::now()));
            self.stop_threads();
        }
    }
}

fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Event>,
    secret: Option<Arc<[u8]>>,
) {
    // Connections whose greeting (hello out, join in) is in progress, oldest first.
    let mut greeting: VecDeque<Greeting> = VecDeque::new();
    while !shared.stop.load(Ordering::Acquire) {
        let now = Instant::now();
        greeting.retain(|g| {
            let alive = g.deadline > now;
            if !alive {
                shared.warn(g.from, "closed a connection that did not join within 5 s");
                shared.forget(g.conn);
            }
            alive
        });
        let mut fds: Vec<libc::pollfd> = std::iter::once(listener.as_raw_fd())
            .chain(greeting.iter().map(|g| g.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: fds is a valid array of pollfd; 100 ms bounds the reaction to stop and
        // to deadlines.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
        if r <= 0 {
            continue;
        }
        // Greetings first (by index, before the accept below changes the list).
        let mut done = Vec::new();
        for (i, pfd) in fds.iter().enumerate().skip(1) {
            if pfd.revents != 0 {
                done.push(i - 1);
            }
        }
        for i in done.into_iter().rev() {
            match greeting[i].on_readable() {
                Progress::Pending => {}
                Progress::Failed(why) => {
                    let g = greeting.remove(i).expect("index in range");
                    shared.warn(g.from, &format!("closed a connection: {why}"));
                    shared.forget(g.conn);
                }
                Progress::Frame(frame) => {
                    let g = greeting.remove(i).expect("index in range");
                    let (conn, from) = (g.conn, g.from);
                    match g.admit(&frame, &tx, secret.as_deref()) {
                        Ok(stream) => start_reader(&shared, &tx, conn, from, stream),
                        Err(why) => {
                            shared.warn(from, &format!("refused a connection: {why}"));
                            shared.forget(conn);
                        }
                    }
                }
            }
        }
        if fds[0].revents == 0 {
            continue;
        }
        let (stream, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                braid::throttle::accept_failed(&shared.accept_log, "the rendezvous", &e);
                continue;
            }
        };
        let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        shared.conns.lock().expect("conns lock").insert(conn, clone);
        if greeting.len() >= MAX_GREETING
            && let Some(oldest) = greeting.pop_front()
        {
            shared.warn(
                oldest.from,
                &format!("closed the oldest connection that had not joined: {MAX_GREETING} open"),
            );
            shared.forget(oldest.conn);
        }
        match Greeting::start(
            conn,
            stream,
            from,
            secret.is_some(),
            now + HANDSHAKE_TIMEOUT,
        ) {
            Ok(g) => greeting.push_back(g),
            Err(why) => {
                shared.warn(from, &format!("closed a connection: {why}"));
                shared.forget(conn);
            }
        }
    }
}

/// Hands an admitted connection to a reader thread of its own (bounded in number).
fn start_reader(
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<Event>,
    conn: ConnId,
    from: SocketAddr,
    stream: TcpStream,
) {
    if shared.readers.fetch_add(1, Ordering::AcqRel) >= shared.max_readers {
        shared.readers.fetch_sub(1, Ordering::AcqRel);
        shared.warn(from, "closed a joined connection: too many connections");
        shared.forget(conn);
        let _ = tx.send(Event::Closed(conn, "too many connections".into()));
        return;
    }
    let (tx2, shared2) = (tx.clone(), shared.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("braid-boot-conn{conn}"))
        .spawn(move || {
            let detail = read_frames(conn, stream, &tx2)
                .err()
                .unwrap_or_else(|| "closed".into());
            let _ = tx2.send(Event::Closed(conn, detail));
            shared2.conns.lock().expect("conns lock").remove(&conn);
            shared2.readers.fetch_sub(1, Ordering::AcqRel);
        });
    if spawned.is_err() {
        shared.readers.fetch_sub(1, Ordering::AcqRel);
        shared.forget(conn);
        let _ = tx.send(Event::Closed(conn, "no thread for the connection".into()));
    }
}

fn io_detail(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "connection closed without a goodbye".into(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            "timed out (no answer; keepalive or handshake timeout)".into()
        }
        _ => e.to_string(),
    }
}

/// An admitted connection's frames, to the core, until it ends. Returns how it ended.
fn read_frames(
    conn: ConnId,
    mut stream: TcpStream,
    tx: &mpsc::Sender<Event>,
) -> Result<(), String> {
    stream
        .set_read_timeout(None)
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    loop {
        let frame = match wire::read_frame(&mut stream, wire::CLIENT_FRAME_LIMIT) {
            Ok(f) => f,
            Err(e) => return Err(io_detail(&e)),
        };
        match ClientMsg::decode(&frame) {
            Ok(m) => {
                let bye = m == ClientMsg::Bye;
                if tx.send(Event::Msg(conn, m)).is_err() {
                    return Ok(());
                }
                if bye {
                    return Ok(());
                }
            }
            Err(e) => {
                let _ = stream.shutdown(Shutdown::Both);
                return Err(format!("protocol error: {e}"));
            }
        }
    }
}

fn core_loop(mut core: RootCore, rx: mpsc::Receiver<Event>, shared: Arc<Shared>) {
    let mut finish_by: Option<Instant> = None;
    // Writers of joined (or being refused) connections.
    let mut writers: HashMap<ConnId, TcpStream> = HashMap::new();
    loop {
        let now = Instant::now();
        if let Some(f) = finish_by
            && (core.finished() || now >= f)
        {
            break;
        }
        let wake = [core.deadline(), finish_by]
            .into_iter()
            .flatten()
            .min()
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        match rx.recv_timeout(wake) {
            Ok(Event::Join {
                conn,
                job,
                rank,
                size,
                info,
                seen,
                welcome,
                authenticated,
            }) => {
                if let Some(s) = shared.conns.lock().expect("conns lock").get(&conn)
                    && let Ok(w) = s.try_clone()
                {
                    writers.insert(conn, w);
                }
                core.join(conn, &job, rank, size, info, seen, welcome, authenticated);
            }
            Ok(Event::Msg(conn, m)) => core.message(conn, m),
            Ok(Event::Closed(conn, detail)) => {
                core.closed(conn, &detail);
                writers.remove(&conn);
            }
            Ok(Event::Finish(by)) => finish_by = Some(by),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        core.tick(Instant::now());
        // Writing may fail; a failed write is a closed connection, which may add actions.
        loop {
            let actions = core.take_actions();
            if actions.is_empty() {
                break;
            }
            for a in actions {
                match a {
                    Action::Send(conn, msg) => {
                        let ok = writers
                            .get_mut(&conn)
                            .map(|w| wire::write_frame(w, &msg.encode()));
                        if let Some(Err(e)) = ok {
                            if let Some(w) = writers.remove(&conn) {
                                let _ = w.shutdown(Shutdown::Both);
                            }
                            core.closed(conn, &format!("write failed: {}", io_detail(&e)));
                        }
                    }
                    Action::Close(conn) => {
                        if let Some(w) = writers.remove(&conn) {
                            let _ = w.shutdown(Shutdown::Both);
                        }
                    }
                }
            }
        }
    }
    for (_, w) in writers {
        let _ = w.shutdown(Shutdown::Both);
    }
}
