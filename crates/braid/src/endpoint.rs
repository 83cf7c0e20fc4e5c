//! Endpoints: the operations an application posts to one peer.

mod batch;

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::cq::CompletionQueue;
use crate::engine::{Command, EndpointShared, Engine};
use braid_proto::error::Error;
use braid_proto::mem::region::{RemoteKey, RemoteSge, Sge, sgl_len};
use braid_proto::{ExpressTo, PostError, Request, SessionConfig};

pub use batch::{Op, PostListError, WorkRequest};

/// Operations at most this large are written from the posting thread when a rail is idle
/// (the inline fast path); larger ones are handed to the progress engine.
const INLINE_MAX: u64 = 64 << 10;

/// One rail: a local address to bind (optional) and the peer's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailAddr {
    /// Local address (and port, usually 0) to bind before connecting; `None` lets the
    /// kernel choose.
    pub local: Option<SocketAddr>,
    /// The peer's listening address for this rail.
    pub remote: SocketAddr,
}

impl RailAddr {
    /// A rail from the given local IP (port chosen by the kernel) to `remote`.
    pub fn new(local: Option<std::net::IpAddr>, remote: SocketAddr) -> RailAddr {
        RailAddr {
            local: local.map(|ip| SocketAddr::new(ip, 0)),
            remote,
        }
    }
}

impl FromStr for RailAddr {
    type Err = Error;

    /// `REMOTE` or `LOCAL=REMOTE`, where LOCAL is an IP or IP:port and REMOTE is IP:port.
    fn from_str(s: &str) -> Result<RailAddr, Error> {
        let bad = |what: &str| Error::InvalidArgument(format!("rail `{s}`: {what}"));
        let (local, remote) = match s.split_once('=') {
            Some((l, r)) => (Some(l), r),
            None => (None, s),
        };
        let remote: SocketAddr = remote.parse().map_err(|_| bad("remote must be IP:PORT"))?;
        let local = match local {
            None => None,
            Some(l) => Some(match l.parse::<SocketAddr>() {
                Ok(a) => a,
                Err(_) => SocketAddr::new(
                    l.parse().map_err(|_| bad("local must be IP or IP:PORT"))?,
                    0,
                ),
            }),
        };
        Ok(RailAddr { local, remote })
    }
}

impl fmt::Display for RailAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.local {
            Some(l) => write!(f, "{}={}", l.ip(), self.remote),
            None => write!(f, "{}", self.remote),
        }
    }
}

/// How an endpoint is set up: its completion queues and protocol tunables.
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    /// Queue for completions of operations posted on the endpoint.
    pub send_cq: CompletionQueue,
    /// Queue for completions of posted receives.
    pub recv_cq: CompletionQueue,
    /// Chunk size, limits and windows.
    pub session: SessionConfig,
    /// Bound on connecting and on each handshake step.
    pub connect_timeout: Duration,
    /// Which transport carries the rails (by default from `BRAID_TRANSPORT`, else
    /// [`RailTransport::Auto`]).
    pub transport: RailTransport,
    /// On same-host rails, payloads of whole pages (64 KiB or more, page-aligned, in
    /// regions braid allocated) are sent by *page exchange*: the receiver maps the sender's
    /// pages copy-on-write instead of copying them (see `docs/PROTOCOL.md`, "Page
    /// exchange"). By default from `BRAID_PAGE_EXCHANGE`, else on. Each side decides for
    /// what it sends, and whether it maps what it receives: a peer could go on writing pages
    /// it exchanged through a mapping of its own made before (nothing can revoke that), so a
    /// receiver that must not see received bytes change after it checked them (a server of
    /// untrusted same-host clients) turns this off and copies instead. braid remaps pages of
    /// the regions it allocated in place for this (the addresses stay the same; `mlock` or
    /// `madvise` settings of those pages do not carry over).
    pub page_exchange: bool,
}

/// Environment variable choosing [`EndpointOptions::transport`]: `auto` or `tcp`.
pub const TRANSPORT_ENV: &str = "BRAID_TRANSPORT";

/// Environment variable choosing [`EndpointOptions::page_exchange`]: `1`/`on` or `0`/`off`.
pub const PAGE_EXCHANGE_ENV: &str = "BRAID_PAGE_EXCHANGE";

/// [`EndpointOptions::page_exchange`] as `BRAID_PAGE_EXCHANGE` says; on when unset. A value
/// that is neither on nor off is reported and taken as on.
pub(crate) fn page_exchange_from_env() -> bool {
    match std::env::var(PAGE_EXCHANGE_ENV) {
        Err(_) => true,
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "0" | "off" | "false" | "no" => false,
            "1" | "on" | "true" | "yes" | "" => true,
            other => {
                tracing::warn!("{PAGE_EXCHANGE_ENV}={other}: expected on or off; using on");
                true
            }
        },
    }
}

/// Which transport carries an endpoint's rails (as `UCX_TLS` chooses UCX's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RailTransport {
    /// A rail whose two ends run in one kernel and one network namespace moves onto a
    /// shared-memory ring after its TCP handshake (see `docs/PROTOCOL.md`, "Same-host
    /// rails"); other rails stay TCP. Both ends must allow it.
    #[default]
    Auto,
    /// Every rail stays a TCP connection (for comparisons, and tests of the TCP path).
    Tcp,
    /// Each rail moves onto raw Ethernet frames through an AF_XDP port on its device after
    /// its TCP handshake, when both ends can open one (root; see docs/RAW-ETHERNET.md);
    /// otherwise it stays TCP. For unshaped links: the frames pass the device's queueing
    /// discipline (`tbf`) by.
    Raw,
}

impl RailTransport {
    /// The choice `BRAID_TRANSPORT` names; [`RailTransport::Auto`] when unset. A value
    /// that is not `auto`, `tcp` or `raw` is reported and taken as `auto`.
    pub fn from_env() -> RailTransport {
        match std::env::var(TRANSPORT_ENV) {
            Err(_) => RailTransport::Auto,
            Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
                "tcp" => RailTransport::Tcp,
                "raw" => RailTransport::Raw,
                "auto" | "" => RailTransport::Auto,
                other => {
                    tracing::warn!(
                        "{TRANSPORT_ENV}={other}: expected auto, tcp or raw; using auto"
                    );
                    RailTransport::Auto
                }
            },
        }
    }
}

impl EndpointOptions {
    /// Options reporting every completion to `cq`, with default tunables.
    pub fn new(cq: &CompletionQueue) -> EndpointOptions {
        EndpointOptions {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            session: SessionConfig::default(),
            connect_timeout: Duration::from_secs(10),
            transport: RailTransport::from_env(),
            page_exchange: page_exchange_from_env(),
        }
    }

    /// Reports receive completions to `cq` instead.
    pub fn with_recv_cq(mut self, cq: &CompletionQueue) -> EndpointOptions {
        self.recv_cq = cq.clone();
        self
    }
}

/// A reliable connection to one peer over one or more rails.
///
/// Every operation takes a caller-chosen `wr_id` and, when the post returns `Ok`, yields
/// exactly one [`crate::Completion`] with that id. Operations complete in post order.
/// Dropping the endpoint closes it (see [`Endpoint::close`]).
pub struct Endpoint {
    pub(crate) shared: Arc<EndpointShared>,
    pub(crate) engine: Arc<Engine>,
    pub(crate) rails: Vec<(SocketAddr, SocketAddr)>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.shared.id)
            .field("peer", &self.shared.peer)
            .field("rails", &self.rails.len())
            .finish()
    }
}

fn post_error(ep: &EndpointShared, e: PostError) -> Error {
    match e {
        PostError::QueueFull { what, limit } => Error::QueueFull { what, limit },
        PostError::Closed => Error::EndpointClosed {
            peer: ep.peer.clone(),
            reason: "closed or failed".into(),
        },
        PostError::MissingRight(r) => Error::MissingRight(r),
        PostError::Invalid(s) => Error::InvalidArgument(s),
    }
}

impl Endpoint {
    /// A process-unique id, also carried in this endpoint's completions.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Number of rails.
    pub fn rail_count(&self) -> usize {
        self.shared.rails.len()
    }

    /// (local, remote) socket address of each rail.
    pub fn rail_addrs(&self) -> &[(SocketAddr, SocketAddr)] {
        &self.rails
    }

    /// Payload bytes sent on each rail so far (how the striping shared the work).
    pub fn rail_bytes_sent(&self) -> Vec<u64> {
        self.shared.session.lock().rail_data_sent()
    }

    /// Times each rail was re-established after a failure (re-dialled or re-joined).
    pub fn rail_restores(&self) -> Vec<u64> {
        self.shared.rails.iter().map(|r| r.restores()).collect()
    }

    /// The transport carrying each rail now: `tcp`, `shm` for a same-host ring, or `raw`
    /// for raw Ethernet frames (see [`RailTransport`]).
    pub fn rail_transports(&self) -> Vec<&'static str> {
        self.shared.rails.iter().map(|r| r.kind()).collect()
    }

    /// The delivery rate observed on each rail, in bytes per second (0 while unknown).
    pub fn rail_rates(&self) -> Vec<f64> {
        self.shared.session.lock().rail_rates()
    }

    /// Breaks rail `rail` as a pulled cable would: its socket is shut down in both
    /// directions, and the endpoint recovers exactly as after a real loss (chunks in flight
    /// on the rail are sent again on the others, the rail is redialled). Fault injection for
    /// failover tests and soak runs, with the `fault-injection` feature.
    #[cfg(feature = "fault-injection")]
    pub fn inject_rail_failure(&self, rail: usize) -> Result<(), Error> {
        let n = self.shared.rails.len();
        let r = self.shared.rails.get(rail).ok_or_else(|| {
            Error::InvalidArgument(format!("rail {rail} does not exist: the endpoint has {n}"))
        })?;
        r.shutdown();
        Ok(())
    }

    /// Which rails are still in use.
    pub fn rails_alive(&self) -> Vec<bool> {
        let s = self.shared.session.lock();
        (0..self.shared.rails.len())
            .map(|r| s.rail_alive(r))
            .collect()
    }

    /// True once the endpoint is closed or failed.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire) || self.shared.session.lock().is_failed()
    }

    fn post(&self, wr_id: u64, req: Request, total: u64) -> Result<(), Error> {
        self.shared.send_cq.reserve()?;
        self.post_reserved(wr_id, req, total)
    }

    /// [`Endpoint::post`] with the completion's slot reserved.
    fn post_reserved(&self, wr_id: u64, req: Request, total: u64) -> Result<(), Error> {
        let r = self.shared.session.lock().post(wr_id, req);
        if let Err(e) = r {
            self.shared.send_cq.unreserve();
            return Err(post_error(&self.shared, e));
        }
        self.push(total);
        Ok(())
    }

    /// Posts a write (`to` a region) or a send (`to` a receive): a small one on a rail that
    /// carries express requests goes straight into the link when the session lets it (see
    /// `EndpointShared::post_express`); `framed` makes the request otherwise.
    fn post_small(
        &self,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        framed: impl FnOnce() -> Request,
    ) -> Result<(), Error> {
        let total = sgl_len(local);
        self.shared.send_cq.reserve()?;
        if total <= braid_proto::EXPRESS_MAX as u64 {
            match self.shared.post_express(wr_id, local, to, imm, true) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => {
                    self.shared.send_cq.unreserve();
                    return Err(post_error(&self.shared, e));
                }
            }
        }
        self.post_reserved(wr_id, framed(), total)
    }

    fn post_write(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: &RemoteKey,
        addr: u64,
        imm: Option<u32>,
    ) -> Result<(), Error> {
        let to = ExpressTo::Region {
            rkey: remote.key,
            addr,
        };
        self.post_small(wr_id, local, to, imm, || Request::Write {
            local: local.to_vec(),
            rkey: remote.key,
            addr,
            imm,
        })
    }

    /// Gets the posted frames moving: small ones from this thread, large ones by the engine.
    fn push(&self, total: u64) {
        if total <= INLINE_MAX {
            // Anything left (a full socket) continues on the socket's writable edge; a
            // failed rail has already failed the endpoint.
            self.shared.flush_all();
        } else {
            self.engine.send(Command::Kick(self.shared.id));
        }
    }

    /// Writes the bytes of `local` to the peer's region `remote` at `remote_offset`.
    /// Completes when the peer has placed every byte.
    pub fn write(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: &RemoteKey,
        remote_offset: u64,
    ) -> Result<(), Error> {
        self.post_write(wr_id, local, remote, remote_offset, None)
    }

    /// Like [`Endpoint::write`], and the peer also gets a completion
    /// ([`crate::CompletionKind::RecvWriteImm`]) carrying `imm`; this consumes one of the
    /// peer's posted receives (its buffer is not written), as with verbs.
    pub fn write_with_imm(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: &RemoteKey,
        remote_offset: u64,
        imm: u32,
    ) -> Result<(), Error> {
        self.post_write(wr_id, local, remote, remote_offset, Some(imm))
    }

    /// Reads from the peer's region `remote` at `remote_offset` into `local` (whose total
    /// length is the read's length). The local regions need `LOCAL_WRITE`.
    pub fn read(
        &self,
        wr_id: u64,
        local: &[Sge],
        remote: &RemoteKey,
        remote_offset: u64,
    ) -> Result<(), Error> {
        self.post(
            wr_id,
            Request::Read {
                local: local.to_vec(),
                rkey: remote.key,
                addr: remote_offset,
            },
            0,
        )
    }

    /// A vectored write, like a verbs write whose scatter/gather lists are on both sides:
    /// the bytes of `local`, in order, go to the remote pieces, in order (the totals must be
    /// equal; 1 to 1024 remote pieces of at least one byte). One completion for the whole
    /// operation.
    ///
    /// The target checks every piece (key, generation, rights, range, a file region's end)
    /// before any byte moves; if one fails, none is written and the operation completes
    /// with [`crate::Status::RemoteAccessError`]. The data travels as one stream cut into
    /// chunks, so large pieces are striped over every rail and small ones share frames:
    /// 256 pieces of 4 KiB cost about what one 1 MiB write costs. If a file region's pages
    /// are truncated during the transfer the operation fails with `RemoteAccessError`, and
    /// pieces before the lost pages may have been written.
    pub fn write_v(&self, wr_id: u64, local: &[Sge], remote: &[RemoteSge]) -> Result<(), Error> {
        let total = sgl_len(local);
        self.post(
            wr_id,
            Request::WriteV {
                local: local.to_vec(),
                remote: remote.to_vec(),
            },
            total,
        )
    }

    /// A vectored read: the remote pieces, in order, into the bytes of `local`, in order
    /// (the totals must be equal; 1 to 1024 remote pieces; the local regions need
    /// `LOCAL_WRITE`). Checked like [`Endpoint::write_v`]; on failure the local bytes are
    /// unspecified.
    pub fn read_v(&self, wr_id: u64, local: &[Sge], remote: &[RemoteSge]) -> Result<(), Error> {
        self.post(
            wr_id,
            Request::ReadV {
                local: local.to_vec(),
                remote: remote.to_vec(),
            },
            0,
        )
    }

    /// Atomically adds `add` to the 8-byte word at `remote_offset` (8-byte aligned) of the
    /// peer's region; the completion's `value` is the word before the addition.
    pub fn fetch_add(
        &self,
        wr_id: u64,
        remote: &RemoteKey,
        remote_offset: u64,
        add: u64,
    ) -> Result<(), Error> {
        self.post(
            wr_id,
            Request::FetchAdd {
                rkey: remote.key,
                addr: remote_offset,
                add,
            },
            0,
        )
    }

    /// Atomically replaces the 8-byte word at `remote_offset` with `swap` if it equals
    /// `compare`; the completion's `value` is the word before (equal to `compare` on success).
    pub fn compare_swap(
        &self,
        wr_id: u64,
        remote: &RemoteKey,
        remote_offset: u64,
        compare: u64,
        swap: u64,
    ) -> Result<(), Error> {
        self.post(
            wr_id,
            Request::CompareSwap {
                rkey: remote.key,
                addr: remote_offset,
                compare,
                swap,
            },
            0,
        )
    }

    /// Sends `local` into the peer's next posted receive. If the peer has none posted, the
    /// message waits (in the peer's socket buffer) until it posts one.
    pub fn send(&self, wr_id: u64, local: &[Sge]) -> Result<(), Error> {
        self.post_small(wr_id, local, ExpressTo::Receive, None, || Request::Send {
            local: local.to_vec(),
            imm: None,
        })
    }

    /// [`Endpoint::send`] with 32-bit immediate data delivered in the receive completion.
    pub fn send_with_imm(&self, wr_id: u64, local: &[Sge], imm: u32) -> Result<(), Error> {
        self.post_small(wr_id, local, ExpressTo::Receive, Some(imm), || {
            Request::Send {
                local: local.to_vec(),
                imm: Some(imm),
            }
        })
    }

    /// Posts a buffer for the peer's next `send` (or `write_with_imm`). The regions need
    /// `LOCAL_WRITE`.
    pub fn post_recv(&self, wr_id: u64, local: &[Sge]) -> Result<(), Error> {
        self.shared.recv_cq.reserve()?;
        let kick = {
            let mut s = self.shared.session.lock();
            if let Err(e) = s.post_recv(wr_id, local) {
                drop(s);
                self.shared.recv_cq.unreserve();
                return Err(post_error(&self.shared, e));
            }
            // A send that waited (staged after a failover) may have completed into this
            // receive just now: its completion is delivered here, its Done sent by the engine.
            self.shared.deliver(&mut s);
            s.rx_retry_pending()
                || ((0..self.shared.rails.len()).any(|r| s.wants_transmit(r))
                    && !self.shared.polled_inline())
        };
        if kick {
            // A rail was stalled waiting for a receive, or frames wait and no polling
            // thread will send them soon: the engine resumes. (Reposting a receive after
            // each message must not wake the engine thread each time.)
            self.engine.send(Command::Kick(self.shared.id));
        }
        Ok(())
    }

    /// Closes the endpoint: every operation not yet completed completes with
    /// [`crate::Status::Flushed`], the peer is told, and the rails are shut down.
    pub fn close(&self) {
        {
            let mut s = self.shared.session.lock();
            s.close();
            self.shared.deliver(&mut s);
        }
        self.engine.send(Command::Close(self.shared.id));
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if !self.shared.closed.load(Ordering::Acquire) {
            self.close();
        }
    }
}
