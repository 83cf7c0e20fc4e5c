//! The accepting side: a [`Listener`], the background thread that accepts connections, and
//! the accepting side of each rail's handshake, run concurrently, one thread per connection.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::handshake::nonce;
use super::raw_rail::RawOffer;
use super::{Context, RailLink, same_host};
use crate::endpoint::{Endpoint, EndpointOptions, RailTransport};
use crate::engine::Command;
use crate::engine::transport::{Tcp, Transport};
use crate::throttle::LogThrottle;
use braid_proto::error::Error;
use braid_proto::wire::handshake::{
    AuthProof, AuthRole, HANDSHAKE_LEN, HANDSHAKE_VERSION, MAC_LEN, MAX_RAILS, NONCE_LEN, auth_mac,
    caps, verify_auth_mac,
};
use braid_proto::wire::{HandshakeStatus, Hello, HelloReply};

/// How long a rail's whole handshake may take on the accepting side.
const ACCEPT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A session whose rails do not all arrive within this time is dropped.
const PENDING_SESSION_TIMEOUT: Duration = Duration::from_secs(15);
/// Stack of a handshake thread: it only decodes 64-byte messages and computes an HMAC.
const HANDSHAKE_STACK: usize = 128 << 10;
/// At most one warning per this interval about refused connections (with the count held
/// back), so that a flood of strangers is not a flood of log lines.
const WARN_INTERVAL: Duration = Duration::from_secs(1);
/// Most rails held in sessions not yet accepted (incomplete or waiting for `accept`), at
/// most a quarter of the descriptor limit: strangers' rails cannot use up the descriptors.
const MAX_WAITING_RAILS: usize = 1024;

/// [`MAX_WAITING_RAILS`], or a quarter of the soft descriptor limit if that is lower.
fn waiting_rails_bound() -> usize {
    braid_proto::mem::shared::raise_fd_limit();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur as usize
    } else {
        4096
    };
    MAX_WAITING_RAILS.min(soft / 4).max(16)
}

/// Reads one handshake message, the whole of it before `deadline` (however the peer
/// dribbles its bytes).
fn read_handshake(
    stream: &mut TcpStream,
    buf: &mut [u8; HANDSHAKE_LEN],
    deadline: Instant,
) -> Result<(), Error> {
    let timeout = || Error::Timeout("waiting for the rail handshake".into());
    let mut got = 0;
    while got < HANDSHAKE_LEN {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timeout());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the peer closed after {got} bytes of the rail handshake"),
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timeout());
            }
            Err(e) => return Err(Error::Io(e)),
        }
    }
    Ok(())
}

/// Writes one handshake message, bounded by `deadline`.
fn write_handshake(stream: &mut TcpStream, msg: &[u8], deadline: Instant) -> Result<(), Error> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Error::Timeout("sending the rail handshake".into()));
    }
    stream.set_write_timeout(Some(left))?;
    stream.write_all(msg)?;
    Ok(())
}

struct PendingSession {
    rails: Vec<Option<RailLink>>,
    since: Instant,
    /// Handed to the connecting side (without a secret); a re-join must prove it.
    join_token: [u8; MAC_LEN],
}

/// A session whose rails have all arrived.
struct ReadySession {
    rails: Vec<RailLink>,
    crc: bool,
    session_id: u64,
    join_token: [u8; MAC_LEN],
}

/// A fresh random join token.
fn join_token() -> [u8; MAC_LEN] {
    let mut t = [0u8; MAC_LEN];
    t[..NONCE_LEN].copy_from_slice(&nonce());
    t[NONCE_LEN..].copy_from_slice(&nonce());
    t
}

/// Accepts endpoints whose rails connect to its addresses. Rails of one endpoint are joined
/// by the session id of their handshake, whichever address they arrive on.
///
/// A background thread accepts connections as long as the listener exists, so that a failed
/// rail of an endpoint accepted here can re-join it at any time. Each connection's
/// handshake runs on a thread of its own, bounded by 5 s in all (however slowly the peer
/// sends its bytes), so a connection that says nothing, or dribbles its hello, delays no
/// other peer. At most [`Listener::MAX_HALF_OPEN`] handshakes are in progress at once:
/// when another connection arrives, the oldest unfinished one is closed to make room (a
/// flood of silent connections then has to outpace real peers' handshakes, which take a
/// round trip, to hold them off). Each costs a thread with a small stack while it lasts.
pub struct Listener {
    shared: Arc<ListenerShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct ListenerShared {
    ctx: Context,
    sockets: Vec<TcpListener>,
    pending: Mutex<HashMap<u64, PendingSession>>,
    /// Sessions whose rails have all arrived.
    ready: Mutex<std::collections::VecDeque<ReadySession>>,
    ready_cv: parking_lot::Condvar,
    /// The acceptor asks for payload CRCs (set from the options of `accept`).
    want_crc: AtomicBool,
    /// Same-host offers are taken (`EndpointOptions::transport` of `accept`; before the
    /// first `accept`, `BRAID_TRANSPORT`).
    take_same_host: AtomicBool,
    /// Raw-Ethernet offers are taken (unless `EndpointOptions::transport` of `accept`, or
    /// before it `BRAID_TRANSPORT`, says TCP).
    take_raw: AtomicBool,
    /// Same-host rails send by page exchange (`EndpointOptions::page_exchange` of
    /// `accept`; before the first `accept`, `BRAID_PAGE_EXCHANGE`).
    page_exchange: AtomicBool,
    chunk_size: std::sync::atomic::AtomicU32,
    closed: AtomicBool,
    /// Connections whose handshake is in progress.
    half_open: Mutex<HalfOpen>,
    /// Only re-joins of accepted endpoints are taken (see [`Listener::refuse_new_endpoints`]).
    rejoin_only: AtomicBool,
    /// Rails held in pending and ready sessions, and their bound.
    waiting_rails: std::sync::atomic::AtomicUsize,
    max_waiting_rails: usize,
    /// Rate limit of per-connection warnings, and of accept failures.
    warn: LogThrottle,
    accept_log: LogThrottle,
}

/// The connections whose handshake is in progress, oldest first, each as a second handle of
/// its socket by which it can be closed from outside its handshake thread.
#[derive(Default)]
struct HalfOpen {
    next_id: u64,
    conns: std::collections::VecDeque<(u64, TcpStream)>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("addrs", &self.local_addrs())
            .finish()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Listener {
    /// Most handshakes in progress at once on one listener (see [`Listener`]).
    pub const MAX_HALF_OPEN: usize = 64;

    pub(super) fn start(ctx: Context, sockets: Vec<TcpListener>) -> Result<Listener, Error> {
        let shared = Arc::new(ListenerShared {
            ctx,
            sockets,
            pending: Mutex::new(HashMap::new()),
            ready: Mutex::new(std::collections::VecDeque::new()),
            ready_cv: parking_lot::Condvar::new(),
            want_crc: AtomicBool::new(false),
            take_same_host: AtomicBool::new(RailTransport::from_env() == RailTransport::Auto),
            take_raw: AtomicBool::new(RailTransport::from_env() != RailTransport::Tcp),
            page_exchange: AtomicBool::new(crate::endpoint::page_exchange_from_env()),
            chunk_size: std::sync::atomic::AtomicU32::new(
                braid_proto::SessionConfig::default().chunk_size as u32,
            ),
            closed: AtomicBool::new(false),
            half_open: Mutex::new(HalfOpen::default()),
            rejoin_only: AtomicBool::new(false),
            waiting_rails: std::sync::atomic::AtomicUsize::new(0),
            max_waiting_rails: waiting_rails_bound(),
            warn: LogThrottle::new(WARN_INTERVAL),
            accept_log: LogThrottle::new(WARN_INTERVAL),
        });
        let s2 = shared.clone();
        let thread = std::thread::Builder::new()
            .name("braid-listener".into())
            .spawn(move || s2.run())?;
        Ok(Listener {
            shared,
            thread: Some(thread),
        })
    }

    /// The bound addresses (with the ports the kernel chose for port 0).
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.shared
            .sockets
            .iter()
            .filter_map(|s| s.local_addr().ok())
            .collect()
    }

    /// Waits up to `timeout` for an endpoint whose rails have all connected and completed
    /// the handshake. Rails that fail the handshake are refused and logged, and do not end
    /// the wait.
    pub fn accept(&self, opts: &EndpointOptions, timeout: Duration) -> Result<Endpoint, Error> {
        let sh = &self.shared;
        sh.want_crc
            .store(opts.session.payload_crc, Ordering::Release);
        sh.take_same_host
            .store(opts.transport == RailTransport::Auto, Ordering::Release);
        sh.take_raw
            .store(opts.transport != RailTransport::Tcp, Ordering::Release);
        sh.page_exchange
            .store(opts.page_exchange, Ordering::Release);
        sh.chunk_size
            .store(opts.session.chunk_size as u32, Ordering::Release);
        let deadline = Instant::now() + timeout;
        let mut ready = sh.ready.lock();
        loop {
            if sh.closed.load(Ordering::Acquire) {
                return Err(Error::InvalidArgument("listener closed".into()));
            }
            if let Some(r) = ready.pop_front() {
                drop(ready);
                sh.waiting_rails.fetch_sub(r.rails.len(), Ordering::AcqRel);
                let ep = sh.ctx.start_endpoint(r.rails, opts, r.crc, None)?;
                let mut live = sh.ctx.inner.live.lock();
                live.retain(|_, (w, _)| w.strong_count() > 0);
                live.insert(r.session_id, (Arc::downgrade(&ep.shared), r.join_token));
                return Ok(ep);
            }
            if sh.ready_cv.wait_until(&mut ready, deadline).timed_out() && ready.is_empty() {
                return Err(Error::Timeout("no endpoint connected".into()));
            }
        }
    }

    /// Most rails this listener holds in sessions not yet accepted (incomplete, or complete
    /// and waiting for [`Listener::accept`]): 1024, or a quarter of the soft descriptor
    /// limit if lower. A rail beyond it is refused, so strangers that open sessions and
    /// never complete them cannot take every descriptor: at the bound, the oldest incomplete
    /// session is dropped to make room (a new rail is refused only when every held rail
    /// belongs to a complete session that `accept` has not taken yet).
    pub fn max_waiting_rails(&self) -> usize {
        self.shared.max_waiting_rails
    }

    /// Takes no new endpoints from now on, only re-joins of failed rails of endpoints
    /// already accepted: a process that has every peer it expects (a rank after its job
    /// formed) keeps no stranger's connection. Sessions not yet accepted are dropped.
    pub fn refuse_new_endpoints(&self) {
        let sh = &self.shared;
        sh.rejoin_only.store(true, Ordering::Release);
        let dropped: usize = {
            let mut p = sh.pending.lock();
            let n = p
                .values()
                .map(|s| s.rails.iter().flatten().count())
                .sum::<usize>();
            p.clear();
            n
        } + sh
            .ready
            .lock()
            .drain(..)
            .map(|r| r.rails.len())
            .sum::<usize>();
        sh.waiting_rails.fetch_sub(dropped, Ordering::AcqRel);
    }

    /// Stops accepting; rails of incomplete sessions are closed. Endpoints already accepted
    /// keep running, but their failed rails can no longer re-join.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.pending.lock().clear();
        for (_, c) in self.shared.half_open.lock().conns.drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        self.shared.ready_cv.notify_all();
    }
}

impl ListenerShared {
    /// The background loop: accept connections and start their handshakes until closed.
    fn run(self: &Arc<Self>) {
        while !self.closed.load(Ordering::Acquire) {
            self.pending.lock().retain(|id, p| {
                let keep = p.since.elapsed() < PENDING_SESSION_TIMEOUT;
                if !keep {
                    let held = p.rails.iter().flatten().count();
                    self.waiting_rails.fetch_sub(held, Ordering::AcqRel);
                    if let Some(n) = self.warn.allow() {
                        tracing::warn!(
                            session = id,
                            held_back = n,
                            "dropping a session whose rails did not all arrive"
                        );
                    }
                }
                keep
            });
            let mut fds: Vec<libc::pollfd> = self
                .sockets
                .iter()
                .map(|s| libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: fds is a valid array of pollfd; 100 ms bounds the reaction to close().
            let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 100) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!("listener poll failed: {e}");
                break;
            }
            for (i, pfd) in fds.iter().enumerate() {
                if pfd.revents == 0 {
                    continue;
                }
                let (stream, from) = match self.sockets[i].accept() {
                    Ok(x) => x,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => {
                        crate::throttle::accept_failed(&self.accept_log, "the braid listener", &e);
                        continue;
                    }
                };
                self.start_handshake(stream, from);
            }
        }
    }

    /// Runs the handshake of a connection just accepted on a thread of its own, first making
    /// room among the half-open connections if need be.
    fn start_handshake(self: &Arc<Self>, stream: TcpStream, from: SocketAddr) {
        let handle = match stream.try_clone() {
            Ok(h) => h,
            Err(e) => {
                self.refused(from, &e.to_string());
                return;
            }
        };
        let id = {
            let mut h = self.half_open.lock();
            while h.conns.len() >= Listener::MAX_HALF_OPEN {
                let (_, oldest) = h.conns.pop_front().expect("the table is full");
                if let Some(n) = self.warn.allow() {
                    tracing::warn!(
                        peer = ?oldest.peer_addr().ok(),
                        held_back = n,
                        "closing the oldest unfinished rail handshake: {} in progress",
                        Listener::MAX_HALF_OPEN
                    );
                }
                let _ = oldest.shutdown(Shutdown::Both);
            }
            let id = h.next_id;
            h.next_id += 1;
            h.conns.push_back((id, handle));
            id
        };
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("braid-handshake".into())
            .stack_size(HANDSHAKE_STACK)
            .spawn(move || {
                let deadline = Instant::now() + ACCEPT_HANDSHAKE_TIMEOUT;
                let outcome = me.handshake(stream, from, id, deadline);
                me.leave_half_open(id);
                match outcome {
                    Ok(Some(done)) => {
                        me.ready.lock().push_back(done);
                        me.ready_cv.notify_all();
                    }
                    Ok(None) => {}
                    Err(e) => me.refused(from, &e.to_string()),
                }
            });
        if let Err(e) = spawned {
            // The connection went with the closure: it is closed.
            self.leave_half_open(id);
            self.refused(from, &format!("cannot start its handshake: {e}"));
        }
    }

    /// Below the bound of waiting rails, or brought below it by dropping the oldest
    /// incomplete session (a real peer's rails all arrive within a round trip or two, so
    /// the oldest incomplete one is most likely a stranger's). False if nothing can go.
    fn make_room(&self) -> bool {
        if self.waiting_rails.load(Ordering::Acquire) < self.max_waiting_rails {
            return true;
        }
        let mut pending = self.pending.lock();
        let Some(oldest) = pending
            .iter()
            .min_by_key(|(_, p)| p.since)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        let p = pending.remove(&oldest).expect("present");
        let held = p.rails.iter().flatten().count();
        self.waiting_rails.fetch_sub(held, Ordering::AcqRel);
        if let Some(n) = self.warn.allow() {
            tracing::warn!(
                session = oldest,
                held_back = n,
                "dropped the oldest incomplete session: {} rails waiting",
                self.max_waiting_rails
            );
        }
        true
    }

    /// Logs a refused connection, at most once per [`WARN_INTERVAL`].
    fn refused(&self, from: SocketAddr, why: &str) {
        if let Some(n) = self.warn.allow() {
            tracing::warn!(peer = %from, held_back = n, "refused a rail: {why}");
        }
    }

    /// Takes connection `id` off the half-open list; false if it was no longer there (closed
    /// to make room, or by `close`).
    fn leave_half_open(&self, id: u64) -> bool {
        let mut h = self.half_open.lock();
        match h.conns.iter().position(|(i, _)| *i == id) {
            Some(p) => {
                h.conns.remove(p);
                true
            }
            None => false,
        }
    }

    /// Just before a handshake hands its connection on (to a session or an endpoint): off
    /// the half-open list, so that nothing closes it any more; an error if it was closed.
    fn commit(&self, id: u64, from: SocketAddr) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) || !self.leave_half_open(id) {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                format!("the handshake of {from} was closed before it completed"),
            )));
        }
        Ok(())
    }

    /// Runs the accepting side of one rail's handshake; returns the session's rails once
    /// they are all there.
    fn handshake(
        &self,
        mut stream: TcpStream,
        from: SocketAddr,
        id: u64,
        deadline: Instant,
    ) -> Result<Option<ReadySession>, Error> {
        stream.set_nonblocking(false)?;
        let mut buf = [0u8; HANDSHAKE_LEN];
        read_handshake(&mut stream, &mut buf, deadline)?;
        let hello =
            Hello::decode(&buf).map_err(|source| Error::Handshake { peer: from, source })?;
        let crc =
            self.want_crc.load(Ordering::Acquire) || hello.capabilities & caps::PAYLOAD_CRC32C != 0;
        let mut reply = HelloReply {
            version: HANDSHAKE_VERSION,
            rail_index: hello.rail_index,
            rail_count: hello.rail_count,
            status: HandshakeStatus::Accepted,
            capabilities: if crc { caps::PAYLOAD_CRC32C } else { 0 },
            max_chunk: self.chunk_size.load(Ordering::Acquire),
            session_id: hello.session_id,
            auth: [0; MAC_LEN],
        };
        let refuse = |mut stream: TcpStream, mut reply: HelloReply, status| {
            reply.status = status;
            let _ = write_handshake(&mut stream, &reply.encode(), deadline);
            status
        };
        if hello.version != HANDSHAKE_VERSION {
            refuse(stream, reply, HandshakeStatus::VersionUnsupported);
            return Err(Error::VersionMismatch {
                peer: from,
                ours: HANDSHAKE_VERSION,
                theirs: hello.version,
            });
        }
        if hello.rail_count == 0
            || hello.rail_count > MAX_RAILS
            || hello.rail_index >= hello.rail_count
        {
            let status = refuse(stream, reply, HandshakeStatus::BadRail);
            return Err(Error::Refused {
                peer: from,
                rail: hello.rail_index,
                status,
            });
        }
        let rejoin = hello.capabilities & caps::REJOIN != 0;
        // A re-join names an endpoint accepted here; without a secret it proves that
        // session's join token instead. Nothing is told about sessions that do not exist.
        let target = rejoin
            .then(|| {
                self.ctx
                    .inner
                    .live
                    .lock()
                    .get(&hello.session_id)
                    .and_then(|(w, t)| Some((w.upgrade()?, *t)))
                    .filter(|(e, _)| (hello.rail_index as usize) < e.rails.len())
            })
            .flatten();
        // With a secret, a stranger learns only after proving it that there is no such
        // session; without one there is no key to prove.
        let no_session = |stream, reply| {
            let status = refuse(stream, reply, HandshakeStatus::Refused);
            Err(Error::Refused {
                peer: from,
                rail: hello.rail_index,
                status,
            })
        };
        if rejoin && target.is_none() && self.ctx.inner.secret.is_none() {
            return no_session(stream, reply);
        }
        let key: Option<&[u8]> = match (self.ctx.inner.secret.as_deref(), &target) {
            (Some(s), _) => Some(s),
            (None, Some((_, token))) => Some(token),
            (None, None) => None,
        };
        if let Some(secret) = key {
            // Challenge: the connecting side must prove the key over our fresh nonce
            // before it gets anywhere near an endpoint (a re-join: before it replaces a
            // rail).
            let n = nonce();
            let mut challenge = reply;
            challenge.status = HandshakeStatus::AuthRequired;
            challenge.auth[..NONCE_LEN].copy_from_slice(&n);
            write_handshake(&mut stream, &challenge.encode(), deadline)?;
            let mut buf = [0u8; HANDSHAKE_LEN];
            let proof = read_handshake(&mut stream, &mut buf, deadline).and_then(|()| {
                AuthProof::decode(&buf).map_err(|source| Error::Handshake { peer: from, source })
            });
            let proven = |p: &AuthProof| {
                verify_auth_mac(
                    secret,
                    AuthRole::Connector,
                    &hello.nonce,
                    &n,
                    hello.session_id,
                    hello.rail_index,
                    &p.mac,
                )
            };
            match proof {
                Ok(p) if proven(&p) => {}
                other => {
                    refuse(stream, reply, HandshakeStatus::AuthFailed);
                    let reason = match other {
                        Ok(_) if rejoin && self.ctx.inner.secret.is_none() => {
                            "a re-join with a wrong proof of the session's join token".to_string()
                        }
                        Ok(_) => "wrong proof: the cluster secrets differ".to_string(),
                        Err(e) => format!("no valid proof: {e}"),
                    };
                    return Err(Error::Auth { peer: from, reason });
                }
            }
            reply.auth = auth_mac(
                secret,
                AuthRole::Acceptor,
                &hello.nonce,
                &n,
                hello.session_id,
                hello.rail_index,
            );
        }
        // A same-host offer is taken when both ends run in one kernel and one network
        // namespace (the testbed's hosts are namespaces of one machine: not them).
        let same_host = hello.same_host.filter(|o| {
            self.take_same_host.load(Ordering::Acquire)
                && same_host::host_identity() == Some(o.host)
        });
        if same_host.is_some() {
            reply.capabilities |= caps::SAME_HOST;
        }
        // A raw-Ethernet offer is taken when this side can open a port on the rail's device.
        let raw = (same_host.is_none()
            && hello.capabilities & caps::RAW != 0
            && self.take_raw.load(Ordering::Acquire))
        .then(|| RawOffer::new(&stream))
        .flatten();
        if raw.is_some() {
            reply.capabilities |= caps::RAW;
        }
        // After the reply: the link the rail runs on.
        let link = |stream: TcpStream| -> Result<RailLink, Error> {
            let addrs = (stream.local_addr()?, stream.peer_addr()?);
            let link: Arc<dyn Transport> = match (same_host, raw) {
                (Some(o), _) => Arc::new(same_host::take_ring(
                    hello.session_id,
                    hello.rail_index,
                    o,
                    &hello.nonce,
                    deadline,
                    self.page_exchange.load(Ordering::Acquire),
                )?),
                (None, Some(raw)) => Arc::new(raw.complete(stream, deadline)?),
                (None, None) => {
                    stream.set_read_timeout(None)?;
                    stream.set_write_timeout(None)?;
                    Arc::new(Tcp::new(stream)?)
                }
            };
            Ok(RailLink { link, addrs })
        };
        if rejoin {
            let Some((ep, _)) = target else {
                return no_session(stream, reply);
            };
            // A failed rail of an endpoint accepted earlier comes back, proven.
            reply.capabilities = (reply.capabilities & (caps::SAME_HOST | caps::RAW))
                | if ep.session.lock().config().payload_crc {
                    caps::PAYLOAD_CRC32C
                } else {
                    0
                };
            self.commit(id, from)?;
            write_handshake(&mut stream, &reply.encode(), deadline)?;
            self.ctx.inner.engine.send(Command::Restore {
                id: ep.id,
                rail: hello.rail_index as usize,
                link: link(stream)?.link,
            });
            return Ok(None);
        }
        if self.rejoin_only.load(Ordering::Acquire) || !self.make_room() {
            // No new endpoints wanted, or every held rail is of a complete session.
            let status = refuse(stream, reply, HandshakeStatus::Refused);
            return Err(Error::Refused {
                peer: from,
                rail: hello.rail_index,
                status,
            });
        }
        let mut pending = self.pending.lock();
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument("listener closed".into()));
        }
        let p = pending
            .entry(hello.session_id)
            .or_insert_with(|| PendingSession {
                rails: (0..hello.rail_count).map(|_| None).collect(),
                since: Instant::now(),
                join_token: join_token(),
            });
        let idx = hello.rail_index as usize;
        if p.rails.len() != hello.rail_count as usize || p.rails[idx].is_some() {
            drop(pending);
            let status = refuse(stream, reply, HandshakeStatus::BadRail);
            return Err(Error::Refused {
                peer: from,
                rail: hello.rail_index,
                status,
            });
        }
        reply.status = HandshakeStatus::Accepted;
        if self.ctx.inner.secret.is_none() {
            // Without a secret the reply's proof field carries the session's join token.
            reply.auth = p.join_token;
        }
        self.commit(id, from)?;
        write_handshake(&mut stream, &reply.encode(), deadline)?;
        // Not under the table's lock: taking a ring waits for the peer.
        drop(pending);
        let rail = link(stream)?;
        let mut pending = self.pending.lock();
        let Some(p) = pending
            .get_mut(&hello.session_id)
            .filter(|p| p.rails.len() == hello.rail_count as usize && p.rails[idx].is_none())
        else {
            return Err(Error::InvalidArgument(
                "the session was dropped while its rail was set up".into(),
            ));
        };
        p.rails[idx] = Some(rail);
        self.waiting_rails.fetch_add(1, Ordering::AcqRel);
        if p.rails.iter().all(Option::is_some) {
            let p = pending.remove(&hello.session_id).expect("present");
            return Ok(Some(ReadySession {
                rails: p
                    .rails
                    .into_iter()
                    .map(|s| s.expect("all present"))
                    .collect(),
                crc,
                session_id: hello.session_id,
                join_token: p.join_token,
            }));
        }
        Ok(None)
    }
}
