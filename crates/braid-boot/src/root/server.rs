//! The rendezvous's I/O: a listening socket, a thread per connection that authenticates the
//! rank and then reads its frames, and the thread that feeds [`RootCore`] and writes its
//! messages.

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::core::{Action, ConnId, RootCore};
use crate::auth::{self, Role};
use crate::error::{BootError, Refusal};
use crate::wire::{self, ClientMsg, ServerMsg};

/// Bound on the hello exchange of a new connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on writing one message to a rank.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The first frame (a join) is small; an unauthenticated peer gets no more room than this.
const JOIN_FRAME_LIMIT: usize = 64 * 1024;

enum Event {
    Join {
        conn: ConnId,
        job: String,
        rank: u32,
        size: u32,
        info: wire::RankInfo,
        seen: std::net::IpAddr,
        welcome: ServerMsg,
    },
    Msg(ConnId, ClientMsg),
    Closed(ConnId, String),
    /// Rank 0 is done: stop once every rank has left, or at the deadline.
    Finish(Instant),
}

struct Shared {
    stop: AtomicBool,
    /// Every open connection (a clone), so stopping can shut them all down.
    conns: Mutex<HashMap<ConnId, TcpStream>>,
    next_conn: AtomicU64,
}

/// A running rendezvous (hosted by rank 0).
pub(crate) struct RootServer {
    shared: Arc<Shared>,
    events: mpsc::Sender<Event>,
    accept: Option<JoinHandle<()>>,
    core: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

/// TCP keepalive so a vanished host (no FIN, no RST) is noticed in about 10 s.
pub(crate) fn set_keepalive(s: &TcpStream) -> std::io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(4))
        .with_interval(Duration::from_secs(1))
        .with_retries(5);
    socket2::SockRef::from(s).set_tcp_keepalive(&ka)?;
    s.set_nodelay(true)
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
        });
        let (tx, rx) = mpsc::channel();
        let secret: Option<Arc<[u8]>> = secret.map(Arc::from);
        let accept = {
            let shared = shared.clone();
            let tx = tx.clone();
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
    /// returns its error at once while late ranks still learn why the job failed.
    pub(crate) fn finish_detached(self, linger: Duration) {
        let _ = std::thread::Builder::new()
            .name("braid-boot-linger".into())
            .spawn(move || self.finish(linger));
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
    while !shared.stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; 100 ms bounds the reaction to stop.
        let r = unsafe { libc::poll(&mut pfd, 1, 100) };
        if r <= 0 {
            continue;
        }
        let (stream, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => {
                tracing::warn!("rendezvous accept failed: {e}");
                continue;
            }
        };
        let conn = shared.next_conn.fetch_add(1, Ordering::Relaxed);
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        shared.conns.lock().expect("conns lock").insert(conn, clone);
        let (tx, secret, shared2) = (tx.clone(), secret.clone(), shared.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("braid-boot-conn{conn}"))
            .spawn(move || {
                let detail = serve_conn(conn, stream, from, &tx, secret.as_deref())
                    .err()
                    .unwrap_or_else(|| "closed".into());
                let _ = tx.send(Event::Closed(conn, detail));
                shared2.conns.lock().expect("conns lock").remove(&conn);
            });
        if spawned.is_err()
            && let Some(s) = shared.conns.lock().expect("conns lock").remove(&conn)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
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

/// One connection: hello, authentication, join, then frames until it ends. Returns how it
/// ended.
fn serve_conn(
    conn: ConnId,
    mut stream: TcpStream,
    from: SocketAddr,
    tx: &mpsc::Sender<Event>,
    secret: Option<&[u8]>,
) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = set_keepalive(&stream);
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    let root_nonce = auth::nonce();
    let hello = ServerMsg::Hello {
        version: wire::VERSION,
        nonce: root_nonce,
        auth_required: secret.is_some(),
    };
    wire::write_frame(&mut stream, &hello.encode()).map_err(|e| io_detail(&e))?;
    let frame = wire::read_frame(&mut stream, JOIN_FRAME_LIMIT).map_err(|e| io_detail(&e))?;
    let refuse = |stream: &mut TcpStream, kind: Refusal, detail: String| {
        tracing::warn!(peer = %from, %kind, "rendezvous refused a connection: {detail}");
        let _ = wire::write_frame(
            stream,
            &ServerMsg::Refuse {
                kind,
                detail: detail.clone(),
            }
            .encode(),
        );
        Err(format!("refused: {detail}"))
    };
    let (version, nonce, mac, jjob, rank, rsize, info) = match ClientMsg::decode(&frame) {
        Ok(ClientMsg::Join {
            version,
            nonce,
            mac,
            job,
            rank,
            size,
            info,
        }) => (version, nonce, mac, job, rank, size, info),
        Ok(other) => return Err(format!("protocol error: {other:?} before joining")),
        Err(e) => return Err(format!("protocol error: {e}")),
    };
    if version != wire::VERSION {
        return refuse(
            &mut stream,
            Refusal::Version,
            format!(
                "rank speaks version {version}, the rendezvous {}",
                wire::VERSION
            ),
        );
    }
    let proof = match (secret, mac) {
        (Some(s), Some(m)) => {
            if !auth::verify(s, Role::Rank, &root_nonce, &nonce, &jjob, rank, rsize, &m) {
                return refuse(
                    &mut stream,
                    Refusal::Auth,
                    format!(
                        "rank {rank} ({from}) did not prove the cluster secret: the secrets differ"
                    ),
                );
            }
            Some(auth::prove(
                s,
                Role::Root,
                &root_nonce,
                &nonce,
                &jjob,
                rank,
                rsize,
            ))
        }
        (Some(_), None) => {
            return refuse(
                &mut stream,
                Refusal::Auth,
                format!(
                    "rank {rank} ({from}) has no cluster secret; the rendezvous requires one (BRAID_SECRET or BRAID_SECRET_FILE)"
                ),
            );
        }
        (None, Some(_)) => {
            return refuse(
                &mut stream,
                Refusal::Auth,
                format!(
                    "rank {rank} ({from}) has a cluster secret; the rendezvous (rank 0) has none"
                ),
            );
        }
        (None, None) => None,
    };
    tx.send(Event::Join {
        conn,
        job: jjob,
        rank,
        size: rsize,
        info,
        seen: from.ip(),
        welcome: ServerMsg::Welcome { mac: proof },
    })
    .map_err(|_| "rendezvous stopped".to_string())?;
    // Joined (or about to be refused by the core, which then closes us): read until the end.
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
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
            }) => {
                if let Some(s) = shared.conns.lock().expect("conns lock").get(&conn)
                    && let Ok(w) = s.try_clone()
                {
                    writers.insert(conn, w);
                }
                core.join(conn, &job, rank, size, info, seen, welcome);
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
