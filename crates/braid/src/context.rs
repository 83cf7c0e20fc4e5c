//! The per-process [`Context`]: registered memory, completion queues, and connection setup
//! (the rail handshake) for endpoints served by its progress engine. The accepting side (the
//! [`Listener`]) is in `listener`.

mod handshake;
mod listener;
pub mod policy;
mod raw_rail;
mod redial;
mod same_host;
#[cfg(test)]
mod tests;

pub use listener::Listener;

use handshake::connect_rail;
use redial::Redial;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use socket2::{Domain, Socket, Type};

use crate::cq::CompletionQueue;
use crate::endpoint::{Endpoint, EndpointOptions, RailAddr};
use crate::engine::transport::Transport;
use crate::engine::{Command, EndpointShared, Engine, RailIo};
use crate::netns::NetNs;
use braid_proto::Session;
use braid_proto::error::Error;
use braid_proto::mem::registry::random_u64;
use braid_proto::mem::{Access, Region, RegionOptions, Registry};
use braid_proto::wire::handshake::{MAC_LEN, MAX_RAILS, caps};

static NEXT_ENDPOINT: AtomicU64 = AtomicU64::new(1);

/// Chunk size of an endpoint whose rails are all same-host rings, unless the options chose
/// another than the default: the largest frame payload.
const SAME_HOST_CHUNK: usize = braid_proto::wire::frame::MAX_FRAME_PAYLOAD as usize;

/// Environment variable holding the cluster secret itself.
pub const SECRET_ENV: &str = "BRAID_SECRET";
/// Environment variable naming a file that holds the cluster secret.
pub const SECRET_FILE_ENV: &str = "BRAID_SECRET_FILE";
/// Environment variable giving [`ContextConfig::engine_threads`] to contexts made with
/// [`Context::new`] (or configured by [`ContextConfig::from_env`]).
pub const ENGINE_THREADS_ENV: &str = "BRAID_ENGINE_THREADS";
/// Most progress threads a context may have.
pub const MAX_ENGINE_THREADS: usize = 64;

/// Settings of a [`Context`].
#[derive(Clone, Default)]
pub struct ContextConfig {
    /// The cluster secret. When set, every rail handshake, in both directions, must prove
    /// knowledge of it (HMAC-SHA256 challenge-response); peers that cannot are refused before
    /// any frame is read. See `docs/SECURITY.md`.
    pub secret: Option<Vec<u8>>,
    /// Most bytes that may be registered at once in this context; `None` for no limit.
    pub max_registered_bytes: Option<u64>,
    /// Progress threads of the context (0 counts as 1, at most [`MAX_ENGINE_THREADS`]).
    /// The first owns the timers, commands and link events; the rails of the context's
    /// endpoints are dealt to all of them in turn, and each thread reads and writes its
    /// rails, so that rails that each fill a core (unshaped 10-100 GbE links) are received
    /// on several cores. One (the default) serves every rail from one thread, which costs
    /// the least CPU when rails are slow or a thread polls its queue itself (its reads
    /// take the place of the engine's). See docs/ARCHITECTURE.md, "Progress engine".
    pub engine_threads: usize,
    /// Listen on non-loopback addresses without a secret (unauthenticated peers accepted).
    /// Off by default: without a secret, [`Context::listen`] then refuses any address that
    /// is not a loopback one, with an error that says how to make a secret. Set from
    /// `BRAID_INSECURE=1` by [`ContextConfig::from_env`]; a warning is printed once.
    pub insecure: bool,
}

impl std::fmt::Debug for ContextConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextConfig")
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("max_registered_bytes", &self.max_registered_bytes)
            .field("engine_threads", &self.engine_threads)
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl ContextConfig {
    /// Defaults, with the secret taken from `BRAID_SECRET`, or from the file named by
    /// `BRAID_SECRET_FILE` (trailing newline removed), if either is set, and the engine
    /// threads from `BRAID_ENGINE_THREADS` (1 if unset), and [`ContextConfig::insecure`]
    /// from `BRAID_INSECURE`.
    pub fn from_env() -> Result<ContextConfig, Error> {
        let secret = if let Some(s) = std::env::var_os(SECRET_ENV) {
            Some(s.into_encoded_bytes())
        } else if let Some(path) = std::env::var_os(SECRET_FILE_ENV) {
            let mut b = std::fs::read(&path).map_err(|e| {
                Error::Io(std::io::Error::new(
                    e.kind(),
                    format!(
                        "reading the cluster secret from {}: {e}",
                        path.to_string_lossy()
                    ),
                ))
            })?;
            while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                b.pop();
            }
            Some(b)
        } else {
            None
        };
        if secret.as_ref().is_some_and(|s| s.is_empty()) {
            return Err(Error::InvalidArgument("the cluster secret is empty".into()));
        }
        let engine_threads = match std::env::var(ENGINE_THREADS_ENV) {
            Ok(v) => parse_engine_threads(&v)?,
            Err(_) => 1,
        };
        Ok(ContextConfig {
            secret,
            max_registered_bytes: None,
            engine_threads,
            insecure: policy::insecure_from_env(),
        })
    }
}

/// The value of [`ENGINE_THREADS_ENV`]: a count from 1 to [`MAX_ENGINE_THREADS`].
fn parse_engine_threads(v: &str) -> Result<usize, Error> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=MAX_ENGINE_THREADS).contains(n))
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{ENGINE_THREADS_ENV}={v:?}: expected a thread count from 1 to {MAX_ENGINE_THREADS}"
            ))
        })
}

/// A rail whose handshake is done: its link, and the TCP addresses it was dialled over (a
/// same-host ring keeps them as its name).
pub(crate) struct RailLink {
    pub(crate) link: Arc<dyn Transport>,
    pub(crate) addrs: (SocketAddr, SocketAddr),
}

/// An endpoint accepted here, by which a rail re-joins: the endpoint and its join token.
type LiveSession = (Weak<EndpointShared>, [u8; MAC_LEN]);

struct ContextInner {
    registry: Arc<Registry>,
    engine: Arc<Engine>,
    /// Progress threads (see [`ContextConfig::engine_threads`]).
    engine_threads: usize,
    secret: Option<Arc<[u8]>>,
    /// [`ContextConfig::insecure`].
    insecure: bool,
    /// Endpoints accepted here, by their session id: where re-joining rails go, with the
    /// join token a re-join must prove when there is no secret.
    live: Mutex<HashMap<u64, LiveSession>>,
}

/// braid's per-process state: the registry of regions and the progress engine thread that
/// services every endpoint made from it. Cheap to clone; the engine stops when the last
/// clone and the last endpoint are gone.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("regions", &self.inner.registry.len())
            .finish()
    }
}

impl Context {
    /// Starts a context and its progress engine, configured by [`ContextConfig::from_env`].
    pub fn new() -> Result<Context, Error> {
        Context::with_config(ContextConfig::from_env()?)
    }

    /// Starts a context with explicit settings.
    pub fn with_config(cfg: ContextConfig) -> Result<Context, Error> {
        if cfg.engine_threads > MAX_ENGINE_THREADS {
            return Err(Error::InvalidArgument(format!(
                "{} engine threads: at most {MAX_ENGINE_THREADS}",
                cfg.engine_threads
            )));
        }
        let engine = Engine::start("braid-progress", "braid-rx", cfg.engine_threads)?;
        Ok(Context {
            inner: Arc::new(ContextInner {
                registry: Arc::new(Registry::with_limit(cfg.max_registered_bytes)),
                engine: Arc::new(engine),
                engine_threads: cfg.engine_threads.max(1),
                secret: cfg.secret.map(Arc::from),
                insecure: cfg.insecure,
                live: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Allocates `len` bytes of page-aligned, zeroed memory and registers it with `access`.
    ///
    /// A region of 64 KiB or more lives in a sealed memfd mapped `MAP_SHARED` (it holds a
    /// descriptor; braid raises the soft limit on open descriptors to the hard one): a peer
    /// process on the same host then reads what this process writes or sends from it
    /// straight from its own mapping, one copy (docs/PROTOCOL.md, "Same-host rails"). Such
    /// memory stays shared with a child after `fork`.
    pub fn alloc_region(&self, len: usize, access: Access) -> Result<Region, Error> {
        Region::allocate_in(&self.inner.registry, len, access)
    }

    /// [`Context::alloc_region`] with options (huge pages, populated pages).
    pub fn alloc_region_with(
        &self,
        len: usize,
        access: Access,
        opts: RegionOptions,
    ) -> Result<Region, Error> {
        Region::allocate(&self.inner.registry, len, access, opts)
    }

    /// Registers caller-owned memory.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until the last handle of the
    /// returned region is dropped (that drop waits for remote operations still using it).
    /// While the region exists, peers (if `access` grants remote rights) and braid may write
    /// the memory at any moment: the caller must not hold Rust references to it that assume
    /// exclusive or unchanging contents.
    pub unsafe fn register(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Region, Error> {
        // SAFETY: forwarded contract.
        unsafe { Region::register_in(&self.inner.registry, ptr, len, access) }
    }

    /// Registers `len` bytes of a regular file, starting at file offset `offset`, as a region:
    /// the range is mapped `MAP_SHARED`, so a peer's RMA read is served from this host's page
    /// cache and a peer's RMA write lands in it (the kernel writes it back as for any mapped
    /// file; `fsync` the file to make it durable). Transfers are striped over every rail as
    /// for any region, and the data moves in one copy between the socket and the page cache.
    ///
    /// `access` may hold `REMOTE_READ`, `REMOTE_WRITE` and `LOCAL_WRITE`; the writable rights
    /// need the file open read-write (read-only rights map it read-only). `REMOTE_ATOMIC` is
    /// refused, since atomics are loads and stores that a truncated page answers with
    /// `SIGBUS`. The descriptor is duplicated (the caller may close its own); any `offset`
    /// works (the mapping starts at the page below it).
    ///
    /// **File size.** The range may extend past the file's current end. Every remote access
    /// is checked, when it executes, against the file's size at that moment: bytes at or
    /// past the end of the file are a remote access error
    /// ([`crate::Status::RemoteAccessError`] at the initiator), never a fault. So a file
    /// grows under a registration without a new key: extend it (`ftruncate`, `fallocate`,
    /// `write`) and the new bytes, up to the registered length, become reachable. To reach
    /// beyond the registered length, register again (a new key).
    ///
    /// **Truncation under a transfer.** Pages the file loses while a transfer uses them make
    /// that operation fail cleanly: the initiator gets `RemoteAccessError` (or, for its own
    /// file pages, [`crate::Status::LocalAccessError`]), the endpoint stays usable, and no
    /// thread of this process takes a `SIGBUS`: braid touches file pages only through
    /// system calls. Local access goes through [`Region::read_at`] and
    /// [`Region::write_at`], which follow the same rules; [`Region::as_mut_ptr`] does not.
    ///
    /// The memory counts against [`ContextConfig::max_registered_bytes`] with its length.
    pub fn register_file(
        &self,
        file: impl std::os::fd::AsFd,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Region, Error> {
        Region::register_file_in(&self.inner.registry, file, offset, len, access)
    }

    /// The context's progress threads: the engine thread and its workers (see
    /// [`ContextConfig::engine_threads`]).
    pub fn engine_threads(&self) -> usize {
        self.inner.engine_threads
    }

    /// Number of regions registered in this context.
    pub fn region_count(&self) -> usize {
        self.inner.registry.len()
    }

    /// A completion queue with room for `capacity` completions.
    pub fn create_cq(&self, capacity: usize) -> CompletionQueue {
        CompletionQueue::new(capacity)
    }

    /// Whether this context has a cluster secret (its rails authenticate).
    pub fn has_secret(&self) -> bool {
        self.inner.secret.is_some()
    }

    /// Whether [`Context::listen`] accepts addresses other than loopback ones: the context
    /// has a secret, or was configured [`ContextConfig::insecure`].
    pub fn may_listen_beyond_loopback(&self) -> bool {
        self.inner.secret.is_some() || self.inner.insecure
    }

    /// Listens for endpoints on each of `addrs` (one address per rail; port 0 picks one).
    ///
    /// Without a cluster secret, only loopback addresses are allowed unless
    /// [`ContextConfig::insecure`] (see [`policy::check_listen`]).
    pub fn listen(&self, addrs: &[SocketAddr]) -> Result<Listener, Error> {
        if addrs.is_empty() {
            return Err(Error::InvalidArgument(
                "listen needs at least one address".into(),
            ));
        }
        policy::check_listen(
            "the braid listener",
            addrs,
            self.inner.secret.is_some(),
            self.inner.insecure,
        )?;
        let mut sockets = Vec::new();
        for a in addrs {
            let s = Socket::new(Domain::for_address(*a), Type::STREAM, None)?;
            s.set_reuse_address(true)?;
            s.bind(&(*a).into())?;
            s.listen(128)?;
            let l: TcpListener = s.into();
            l.set_nonblocking(true)?;
            sockets.push(l);
        }
        Listener::start(self.clone(), sockets)
    }

    /// Opens an endpoint to a peer over `rails` (one TCP connection each, rail `i` from
    /// `rails[i].local` to `rails[i].remote`).
    pub fn connect(&self, rails: &[RailAddr], opts: &EndpointOptions) -> Result<Endpoint, Error> {
        if rails.is_empty() || rails.len() > MAX_RAILS as usize {
            return Err(Error::InvalidArgument(format!(
                "an endpoint needs 1 to {MAX_RAILS} rails, got {}",
                rails.len()
            )));
        }
        let session_id = random_u64();
        // Before dialling: the rails are dialled from this thread's namespace.
        let netns = NetNs::current();
        let mut links = Vec::new();
        let mut crc = opts.session.payload_crc;
        let mut join_token = [0; MAC_LEN];
        for (i, r) in rails.iter().enumerate() {
            let (link, peer_caps, token) = connect_rail(
                r,
                i as u16,
                rails.len() as u16,
                session_id,
                opts,
                self.inner.secret.as_deref(),
                false,
                None,
            )?;
            crc = peer_caps & caps::PAYLOAD_CRC32C != 0;
            // One token per session: every rail's reply carries the same.
            join_token = token;
            links.push(link);
        }
        let redial = Redial {
            rails: rails.to_vec(),
            session_id,
            opts: opts.clone(),
            secret: self.inner.secret.clone(),
            join_token,
            engine: self.inner.engine.kicker(),
            busy: Mutex::new(0),
            netns,
        };
        self.start_endpoint(links, opts, crc, Some(redial))
    }

    fn start_endpoint(
        &self,
        rails: Vec<RailLink>,
        opts: &EndpointOptions,
        crc: bool,
        redial: Option<Redial>,
    ) -> Result<Endpoint, Error> {
        let (links, addrs) = rails.into_iter().map(|r| (r.link, r.addrs)).unzip();
        self.start_endpoint_on(links, addrs, opts, crc, redial)
    }

    /// Starts an endpoint over links whose handshake is done, whatever their transport.
    fn start_endpoint_on(
        &self,
        links: Vec<Arc<dyn Transport>>,
        addrs: Vec<(SocketAddr, SocketAddr)>,
        opts: &EndpointOptions,
        crc: bool,
        redial: Option<Redial>,
    ) -> Result<Endpoint, Error> {
        let all_same_host = links.iter().all(|l| l.kind() == "shm");
        let rails: Vec<RailIo> = links.into_iter().map(RailIo::new).collect();
        let id = NEXT_ENDPOINT.fetch_add(1, Ordering::Relaxed);
        let mut cfg = opts.session.clone();
        cfg.payload_crc = crc;
        let defaults = braid_proto::SessionConfig::default();
        if all_same_host && cfg.chunk_size == defaults.chunk_size {
            // A referenced chunk is one memcpy by the receiver: large ones copy faster
            // (16 MiB writes at depth 1, `braid bench write -s 16M -q 1 --poll-spin-us 1000000
            // --chunk C`, three pairs: 1 MiB chunks 7.1-12.3 GB/s, 16 MiB 11.8-13.7).
            cfg.chunk_size = SAME_HOST_CHUNK;
        }
        if all_same_host
            && cfg.initial_window == defaults.initial_window
            && cfg.min_window == defaults.min_window
        {
            // No network to probe: a ring's window starts (and stays) at two chunks, so the
            // first chunks are whole ones (a 32 KiB start gives 8 KiB chunks until
            // acknowledgements have measured a rate). No gain measured: the `same_host`
            // example's first 64 MiB write took 77-78 ms before and after; its slowness was
            // the first touch of the pages, since populated.
            cfg.initial_window = 2 * cfg.chunk_size as u64;
            cfg.min_window = 2 * cfg.chunk_size as u64;
        }
        let session = Session::new(cfg, self.inner.registry.clone(), rails.len(), id);
        let redial = redial.map(Arc::new);
        let shared = Arc::new_cyclic(|weak: &Weak<EndpointShared>| EndpointShared {
            id,
            peer: addrs[0].1.to_string(),
            redial: redial.map(|r| {
                let weak = weak.clone();
                Box::new(move |rail| r.start(weak.clone(), rail))
                    as Box<dyn Fn(usize) + Send + Sync>
            }),
            session: Mutex::new(session),
            rails,
            send_cq: opts.send_cq.clone(),
            recv_cq: opts.recv_cq.clone(),
            closed: AtomicBool::new(false),
            peer_closed: AtomicBool::new(false),
            kicker: self.inner.engine.kicker(),
            app_polled: std::sync::atomic::AtomicU64::new(0),
            ctrl_held_since: std::sync::atomic::AtomicU64::new(0),
            answer_due: std::sync::atomic::AtomicBool::new(false),
            rail_sleepers: std::sync::atomic::AtomicUsize::new(0),
            tx_check: std::sync::atomic::AtomicBool::new(true),
            polls: std::sync::atomic::AtomicU32::new(0),
        });
        let weak: Weak<dyn crate::cq::Driver> = Arc::downgrade(&shared) as Weak<EndpointShared>;
        opts.send_cq.attach(weak.clone());
        if !opts.recv_cq.same(&opts.send_cq) {
            opts.recv_cq.attach(weak);
        }
        self.inner.engine.send(Command::Add(shared.clone()));
        tracing::debug!(endpoint = id, peer = %shared.peer, rails = addrs.len(), "endpoint up");
        Ok(Endpoint {
            shared,
            engine: self.inner.engine.clone(),
            rails: addrs,
        })
    }
}
