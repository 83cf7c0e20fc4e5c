//! The file server: exports one directory tree to braid clients.
//!
//! Threads: an acceptor takes new endpoints from a [`braid::Listener`]; a few workers share
//! one completion queue, and each carries out the request whose receive it took (blocking
//! system calls such as `fsync` hold up only that worker). Requests of one client may run
//! concurrently and are answered in any order; the request id pairs replies with requests.
//!
//! ```no_run
//! use braid_fs::server::{Server, ServerConfig};
//! let ctx = braid::Context::new()?;
//! let cfg = ServerConfig::new("/srv/data", vec!["127.0.0.1:7100".parse()?]);
//! let server = Server::start(&ctx, cfg)?;
//! // ... until a signal:
//! server.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod conn;
mod creds;
mod export;
mod filetype;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod inode;
mod jobs;
mod limits;
mod locks;
mod lockserv;
mod region;
mod writeback;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::{Completion, CompletionKind, CompletionQueue, Context, EndpointOptions, Listener};
use parking_lot::RwLock;

use crate::proto::{
    self, Errno, HelloReply, MAX_MSG, Op, Reply, Request, Role, decode_request, encode_reply,
};
use conn::{Buffers, Conn, HELLO, HELLO_LEN, RECV, SEND};
use creds::CallerMap;
pub use creds::{ANON_ID, Squash};
use export::Export;
pub use filetype::ExportPolicy;
use limits::{HELLO_DEADLINE, Limits, warn_limited};

/// How a server is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The directory to export.
    pub export: PathBuf,
    /// One listening address per rail.
    pub listen: Vec<SocketAddr>,
    /// Refuse every change (`EROFS`) and register file pages read-only.
    pub read_only: bool,
    /// Devices and set-user-id bits (default: neither, as an NFS export's `nodev,nosuid`).
    pub policy: ExportPolicy,
    /// Threads carrying out requests (default 4).
    pub workers: usize,
    /// Most clients connected at once (default 64); fewer if the descriptor limit allows
    /// fewer endpoints (see `docs/FS.md`).
    pub max_clients: usize,
    /// Descriptors the server may use in all (default `None`: the process's limit, whose
    /// soft value is raised to the hard one at start). Endpoint and handle caps are derived
    /// from it (`docs/FS.md`, "Limits").
    pub fd_limit: Option<u64>,
    /// An endpoint that has not said `Hello` this long after it connected is closed
    /// (default 5 s).
    pub hello_timeout: Duration,
    /// Requests one client may have outstanding (default 32): the receive buffers posted
    /// for it.
    pub max_outstanding: usize,
    /// Endpoint tunables (peer timeout, chunk sizes).
    pub session: braid::SessionConfig,
    /// How long an idle worker busy-polls for the next request before sleeping (default
    /// 20 µs): a request that arrives meanwhile is read by the worker itself, without
    /// waking the progress engine and then the worker. Longer spins cost CPU that, on a
    /// small host, the threads doing the work miss.
    pub poll_spin: Duration,
    /// Which callers become the anonymous user (default [`Squash::Root`], as NFS's
    /// `root_squash`). A server running as root carries each request out as its (mapped)
    /// caller; see [`Server::acts_as_callers`].
    pub squash: Squash,
    /// The anonymous user squashed callers become (default [`ANON_ID`], `nobody`).
    pub anon_uid: u32,
    /// The anonymous group (default [`ANON_ID`]).
    pub anon_gid: u32,
}

impl ServerConfig {
    /// Defaults for exporting `export` on `listen`.
    pub fn new(export: impl Into<PathBuf>, listen: Vec<SocketAddr>) -> ServerConfig {
        ServerConfig {
            export: export.into(),
            listen,
            read_only: false,
            policy: ExportPolicy::default(),
            workers: 4,
            max_clients: 64,
            fd_limit: None,
            hello_timeout: HELLO_DEADLINE,
            max_outstanding: 32,
            session: braid::SessionConfig::default(),
            poll_spin: Duration::from_micros(20),
            squash: Squash::Root,
            anon_uid: ANON_ID,
            anon_gid: ANON_ID,
        }
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The export cannot be opened or lacks something the server needs.
    #[error("{0}")]
    Export(String),
    /// Listening failed.
    #[error("listening: {0}")]
    Listen(braid::Error),
    /// A thread could not be started.
    #[error("starting a thread: {0}")]
    Thread(std::io::Error),
}

// The cause is in the message, so it is not also the `source()`: a chain printed with
// `{:#}` would say it twice.
impl From<braid::Error> for ServerError {
    fn from(e: braid::Error) -> Self {
        ServerError::Listen(e)
    }
}

impl From<std::io::Error> for ServerError {
    fn from(e: std::io::Error) -> Self {
        ServerError::Thread(e)
    }
}

/// A client's session token: 64 bits from the operating system's generator (never 0), so
/// that another client cannot guess it and attach a data endpoint of its own.
fn session_token() -> Result<u64, Errno> {
    let mut b = [0u8; 8];
    match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) {
        Ok(8) if b != [0; 8] => Ok(u64::from_le_bytes(b)),
        _ => Err(Errno::EAGAIN),
    }
}

/// The remote addresses (without ports) of an endpoint's rails, sorted.
fn peer_hosts(ep: &braid::Endpoint) -> Vec<std::net::IpAddr> {
    let mut v: Vec<_> = ep.rail_addrs().iter().map(|(_, r)| r.ip()).collect();
    v.sort();
    v
}

/// How often the acceptor looks for endpoints past their hello deadline.
const SWEEP_INTERVAL: Duration = Duration::from_millis(200);

struct Shared {
    ctx: Context,
    cfg: ServerConfig,
    export: Export,
    callers: CallerMap,
    cq: CompletionQueue,
    conns: RwLock<HashMap<u64, Arc<Conn>>>,
    stop: AtomicBool,
    limits: Limits,
    /// Byte-range and `flock` locks of every client.
    locks: lockserv::Locks,
}

/// A running file server; [`Server::shutdown`] (or dropping it) stops it.
pub struct Server {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("export", &self.shared.cfg.export)
            .field("listen", &self.local_addrs())
            .finish()
    }
}

impl Server {
    /// Opens the export, listens and starts serving.
    pub fn start(ctx: &Context, cfg: ServerConfig) -> Result<Server, ServerError> {
        let fd_limit = cfg.fd_limit.or_else(limits::raise_nofile);
        let limits = Limits::derive(fd_limit, cfg.listen.len(), cfg.max_clients);
        tracing::info!(
            "descriptor limit {fd_limit:?}: at most {} endpoints, {} objects and handles in all, \
             {} handles and {} objects per client",
            limits.endpoints,
            limits.pool,
            limits.handles_per_client,
            limits.objects_per_client
        );
        let export = Export::new(ctx.clone(), &cfg.export, cfg.read_only)
            .map_err(ServerError::Export)?
            .with_policy(cfg.policy)
            .with_limits(limits);
        let listener = Arc::new(ctx.listen(&cfg.listen)?);
        let per_client = 2 * cfg.max_outstanding.max(1) + 4;
        let cq = ctx.create_cq(cfg.max_clients.max(1) * 2 * per_client + 64);
        cq.set_spin(cfg.poll_spin);
        let callers = CallerMap::new(cfg.squash, cfg.anon_uid, cfg.anon_gid);
        if !callers.switches() {
            tracing::warn!(
                "not running as root (no CAP_SETUID and CAP_SETGID): every request is carried \
                 out as uid {}, whoever the caller is; permissions are this user's",
                rustix::process::geteuid().as_raw()
            );
        }
        let shared = Arc::new(Shared {
            ctx: ctx.clone(),
            export,
            callers,
            cq,
            conns: RwLock::new(HashMap::new()),
            stop: AtomicBool::new(false),
            limits,
            locks: Default::default(),
            cfg,
        });
        let mut threads = Vec::new();
        {
            let (s, l) = (shared.clone(), listener.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("fs-accept".into())
                    .spawn(move || s.accept_loop(&l))?,
            );
        }
        for i in 0..shared.cfg.workers.max(1) {
            let s = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fs-worker-{i}"))
                    .spawn(move || s.work_loop())?,
            );
        }
        Ok(Server {
            shared,
            listener,
            threads,
        })
    }

    /// The bound addresses, one per rail.
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listener.local_addrs()
    }

    /// Endpoints connected now (a client has two: requests and data).
    pub fn endpoints(&self) -> usize {
        self.shared.conns.read().len()
    }

    /// Whether requests are carried out as their callers (a server running as root), not
    /// as the server's own user.
    pub fn acts_as_callers(&self) -> bool {
        self.shared.callers.switches()
    }

    /// Objects the server holds handles for (the root included).
    pub fn inodes(&self) -> usize {
        self.shared.export.inode_count()
    }

    /// Stops accepting, closes every client endpoint and waits for the threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.listener.close();
        let conns: Vec<Arc<Conn>> = self.shared.conns.read().values().cloned().collect();
        for c in conns {
            self.shared.drop_conn(&c);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop();
        }
    }
}

impl Shared {
    fn accept_loop(&self, listener: &Listener) {
        let opts = EndpointOptions {
            session: self.cfg.session.clone(),
            ..EndpointOptions::new(&self.cq)
        };
        let mut swept = Instant::now();
        while !self.stop.load(Ordering::Acquire) {
            if swept.elapsed() >= SWEEP_INTERVAL {
                self.close_silent();
                swept = Instant::now();
            }
            let ep = match listener.accept(&opts, SWEEP_INTERVAL) {
                Ok(ep) => ep,
                Err(braid::Error::Timeout(_)) => continue,
                Err(e) => {
                    if !self.stop.load(Ordering::Acquire) {
                        warn_limited!("accept failed: {e}");
                        // Out of descriptors: wait for some to be closed, never spin.
                        if matches!(&e, braid::Error::Io(io) if braid::throttle::out_of_descriptors(io))
                        {
                            std::thread::sleep(braid::throttle::ACCEPT_BACKOFF);
                        }
                    }
                    continue;
                }
            };
            if !self.make_room() {
                warn_limited!(
                    "refusing an endpoint: {} connected, all of them clients",
                    self.limits.endpoints
                );
                ep.close();
                continue;
            }
            let id = ep.id();
            let conn = match Conn::new(&self.ctx, ep) {
                Ok(c) => c,
                Err(e) => {
                    warn_limited!("setting up an endpoint failed: {e}");
                    continue;
                }
            };
            // In the table before the first receive is posted: its completion looks it up.
            self.conns.write().insert(id, conn.clone());
            match conn.post_hello() {
                Ok(()) => tracing::debug!(endpoint = id, "client endpoint connected"),
                Err(e) => {
                    warn_limited!("posting the hello receive failed: {e}");
                    self.drop_conn(&conn);
                }
            }
        }
    }

    /// Makes room for one more endpoint if the table is full, by closing the oldest one that
    /// has not said `Hello`; false if all are clients'.
    fn make_room(&self) -> bool {
        let oldest = {
            let conns = self.conns.read();
            if conns.len() < self.limits.endpoints {
                return true;
            }
            conns
                .values()
                .filter(|c| c.session().is_none())
                .min_by_key(|c| c.accepted)
                .cloned()
        };
        match oldest {
            Some(c) => {
                warn_limited!(
                    endpoint = c.ep.id(),
                    "closing the oldest endpoint without a hello: {} endpoints connected",
                    self.limits.endpoints
                );
                self.drop_conn(&c);
                true
            }
            None => false,
        }
    }

    /// Closes the endpoints that have not said `Hello` within the configured time.
    fn close_silent(&self) {
        let silent: Vec<Arc<Conn>> = self
            .conns
            .read()
            .values()
            .filter(|c| c.session().is_none() && c.accepted.elapsed() > self.cfg.hello_timeout)
            .cloned()
            .collect();
        for c in silent {
            warn_limited!(
                endpoint = c.ep.id(),
                "closing an endpoint that said no hello within {:?}",
                self.cfg.hello_timeout
            );
            self.drop_conn(&c);
        }
    }

    fn work_loop(&self) {
        while !self.stop.load(Ordering::Acquire) {
            if let Some(c) = self.cq.wait(Duration::from_millis(100)) {
                self.on_completion(c);
            }
        }
        // Completions of closed endpoints may still arrive; they need no handling.
        while self.cq.poll().is_some() {}
    }

    fn on_completion(&self, c: Completion) {
        let Some(conn) = self.conns.read().get(&c.endpoint).cloned() else {
            return;
        };
        if !c.status.is_ok() {
            if !conn.is_dead() {
                tracing::debug!(endpoint = c.endpoint, status = ?c.status, "client endpoint ended");
            }
            self.drop_conn(&conn);
            return;
        }
        match c.kind {
            CompletionKind::Recv if c.wr_id == HELLO => self.on_hello(&conn, &c),
            CompletionKind::Recv if c.wr_id & RECV != 0 => {
                self.on_request(&conn, (c.wr_id & !RECV) as usize, c.byte_len as usize)
            }
            CompletionKind::Send if c.wr_id & SEND != 0 => {
                if let Some(b) = conn.bufs.get()
                    && b.sent(&conn.ep, (c.wr_id & !SEND) as usize).is_err()
                {
                    self.drop_conn(&conn);
                }
            }
            CompletionKind::Send => {} // the hello reply
            other => {
                warn_limited!(
                    endpoint = c.endpoint,
                    ?other,
                    "unexpected completion; closing"
                );
                self.drop_conn(&conn);
            }
        }
    }

    /// Ends a connection and releases everything its client held. A meta endpoint takes
    /// its client's data endpoint with it.
    fn drop_conn(&self, conn: &Arc<Conn>) {
        if !conn.kill() {
            return;
        }
        conn.ep.close();
        self.conns.write().remove(&conn.ep.id());
        self.export.disconnect(&conn.client);
        self.drop_client_locks(conn);
        if let Some((Role::Meta, session)) = conn.session() {
            let data: Vec<Arc<Conn>> = self
                .conns
                .read()
                .values()
                .filter(|c| c.session() == Some((Role::Data, session)))
                .cloned()
                .collect();
            for d in data {
                self.drop_conn(&d);
            }
        }
    }

    fn meta_clients(&self) -> usize {
        self.conns
            .read()
            .values()
            .filter(|c| matches!(c.session(), Some((Role::Meta, _))))
            .count()
    }

    fn on_hello(&self, conn: &Arc<Conn>, c: &Completion) {
        let len = (c.byte_len as usize).min(HELLO_LEN);
        let bytes = match conn.hello_buf.to_vec(0, len) {
            Ok(b) => b,
            Err(_) => return self.drop_conn(conn),
        };
        let (id, _caller, req) = match decode_request(&bytes) {
            Ok(x) => x,
            Err(e) => {
                warn_limited!(endpoint = c.endpoint, "bad hello: {e}; closing");
                return self.drop_conn(conn);
            }
        };
        let Request::Hello {
            version,
            role,
            session,
        } = req
        else {
            warn_limited!(
                endpoint = c.endpoint,
                "first message is not a hello; closing"
            );
            return self.drop_conn(conn);
        };
        let reply = self.hello(conn, version, role, session);
        let refused = reply.is_err();
        let sent = encode_reply(id, Op::Hello, &reply)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                conn.hello_buf
                    .write_at(0, &m)
                    .map(|()| m.len())
                    .map_err(|e| e.to_string())
            })
            .and_then(|n| {
                let sge = conn.hello_buf.slice(0, n).map_err(|e| e.to_string())?;
                conn.ep.send(HELLO, &[sge]).map_err(|e| e.to_string())
            });
        if let Err(e) = sent {
            warn_limited!(endpoint = c.endpoint, "hello reply failed: {e}");
            return self.drop_conn(conn);
        }
        if refused {
            // The reply goes out before the close (operations complete in order).
            self.drop_conn(conn);
        }
    }

    fn hello(
        &self,
        conn: &Arc<Conn>,
        version: u8,
        role: Role,
        session: u64,
    ) -> Result<Reply, Errno> {
        if version < proto::VERSION {
            return Err(Errno::EPROTO);
        }
        let session = match role {
            Role::Meta => {
                if self.meta_clients() >= self.cfg.max_clients {
                    warn_limited!("refusing a client: {} connected", self.cfg.max_clients);
                    return Err(Errno::EAGAIN);
                }
                let bufs =
                    Buffers::new(&self.ctx, self.cfg.max_outstanding.max(1)).map_err(|e| {
                        warn_limited!("allocating client buffers failed: {e}");
                        Errno::ENOMEM
                    })?;
                let slots = bufs.slots;
                if conn.bufs.set(bufs).is_err() {
                    return Err(Errno::EPROTO);
                }
                for i in 0..slots {
                    conn.repost(i).map_err(|_| Errno::ENOTCONN)?;
                }
                // Under the table's lock: no other meta endpoint takes the same token.
                let conns = self.conns.write();
                let token = loop {
                    let t = session_token()?;
                    if !conns
                        .values()
                        .any(|c| c.session().is_some_and(|s| s.1 == t))
                    {
                        break t;
                    }
                };
                *conn.role.lock() = Some((role, token));
                token
            }
            Role::Data => {
                // One data endpoint per client, from the hosts of its meta endpoint; under
                // the table's lock, so two endpoints with the token cannot both be taken.
                let conns = self.conns.write();
                let meta = conns
                    .values()
                    .find(|c| c.session() == Some((Role::Meta, session)))
                    .ok_or(Errno::EACCES)?;
                let taken = conns
                    .values()
                    .any(|c| c.session() == Some((Role::Data, session)));
                if taken || peer_hosts(&meta.ep) != peer_hosts(&conn.ep) {
                    return Err(Errno::EACCES);
                }
                *conn.role.lock() = Some((role, session));
                session
            }
        };
        Ok(Reply::Hello(HelloReply {
            version: proto::VERSION,
            root: self.export.root()?,
            read_only: self.export.read_only(),
            session,
            max_outstanding: self.cfg.max_outstanding.max(1) as u32,
            max_msg: MAX_MSG as u32,
        }))
    }

    fn on_request(&self, conn: &Arc<Conn>, slot: usize, len: usize) {
        let Some(bufs) = conn.bufs.get() else {
            return self.drop_conn(conn);
        };
        let bytes = match bufs.recv.to_vec(slot * MAX_MSG, len.min(MAX_MSG)) {
            Ok(b) => b,
            Err(_) => return self.drop_conn(conn),
        };
        // Post the buffer again before answering, so the client's next request finds it.
        if conn.repost(slot).is_err() {
            return self.drop_conn(conn);
        }
        let (id, caller, req) = match decode_request(&bytes) {
            Ok(x) => x,
            Err(e) => {
                warn_limited!(endpoint = conn.ep.id(), "malformed request: {e}; closing");
                return self.drop_conn(conn);
            }
        };
        let op = req.op();
        let reply = match self.callers.enter(&caller, &req) {
            Ok(_acting) => self.dispatch(conn, id, req),
            Err(e) => Some(Err(e)),
        };
        let Some(reply) = reply else {
            return; // a lock wait, answered when granted
        };
        let msg = match encode_reply(id, op, &reply) {
            Ok(m) => m,
            Err(e) => {
                warn_limited!("encoding the reply to {op:?}: {e}");
                encode_reply(id, op, &Err(Errno::EIO)).unwrap_or_default()
            }
        };
        if bufs.send_reply(&conn.ep, msg).is_err() {
            warn_limited!(
                endpoint = conn.ep.id(),
                "a reply could not be sent (connection failed, or the client exceeded its outstanding requests); closing"
            );
            self.drop_conn(conn);
        }
    }
}

#[cfg(test)]
mod creds_tests;
#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
