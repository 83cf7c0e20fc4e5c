//! The client library: metadata calls and zero-copy reads and writes into the caller's
//! registered memory, without FUSE.
//!
//! A [`Client`] holds two braid endpoints to the server over the same rails: one carries the
//! RPCs, the other only one-sided reads and writes of file pages, so a large transfer never
//! delays a metadata reply. One thread per client takes every completion and runs the
//! callbacks; the blocking calls here wait for those callbacks.
//!
//! ```no_run
//! use braid::{Access, Context};
//! use braid_fs::client::{Client, ClientConfig};
//!
//! let ctx = Context::new()?;
//! let cfg = ClientConfig::new(vec!["127.0.0.1=127.0.0.1:7100".parse()?]);
//! let client = Client::connect(&ctx, &cfg)?;
//! let file = client.open_path("data/big.bin", libc::O_RDONLY)?;
//! let buf = ctx.alloc_region(64 << 20, Access::LOCAL_WRITE)?;
//! // An RMA read from the server's page cache straight into `buf`, striped over the rails.
//! let n = file.read_at(0, &buf, 0, 64 << 20)?;
//! # let _ = n;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod api;
mod caller;
mod coord;
mod data;
mod file;
mod reconnect;
mod rpc;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::{Access, Completion, CompletionQueue, Context, EndpointOptions, RailAddr, Region};
use parking_lot::Mutex;

pub use api::{DirIter, File};
pub use caller::{ActingAs, act_as};
pub use data::MAX_DATA_OPS;
pub use reconnect::Reconnecting;
pub use rpc::MAX_BACKLOG;

use crate::proto::{self, Entry, Errno, HelloReply, MAX_MSG, NodeId, Op, Reply, Request, Role};
use data::DataOps;
pub(crate) use file::FileState;
use rpc::Rpc;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The server carried the request out and answered with an error number.
    #[error("{0}")]
    Remote(Errno),
    /// The client is not connected (any more): nothing was sent.
    #[error("not connected: {0}")]
    NotConnected(String),
    /// The connection failed while the operation was outstanding: its outcome is unknown.
    #[error("connection lost: {0}")]
    Lost(String),
    /// A bounded queue is full; retry later.
    #[error("busy: {0}")]
    Busy(String),
    /// The server broke the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// An argument was refused before anything was sent.
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A blocking call waited longer than `ClientConfig::op_timeout`.
    #[error("timed out: {0}")]
    Timeout(String),
    /// Connecting or the hello failed.
    #[error("connecting: {0}")]
    Connect(String),
    /// The server refused a one-sided access (a stale key or a range past the file's end).
    #[error("remote access refused")]
    Access,
}

impl Error {
    /// The error number an application (or the kernel, through FUSE) should see.
    pub fn errno(&self) -> Errno {
        match self {
            Error::Remote(e) => *e,
            Error::NotConnected(_) | Error::Connect(_) => Errno::ENOTCONN,
            Error::Lost(_) | Error::Protocol(_) | Error::Access => Errno::EIO,
            Error::Busy(_) => Errno::EAGAIN,
            Error::Invalid(_) => Errno::EINVAL,
            Error::Timeout(_) => Errno::ETIMEDOUT,
        }
    }

    pub(crate) fn from_post(e: braid::Error) -> Error {
        match e {
            braid::Error::QueueFull { .. } => Error::Busy(e.to_string()),
            braid::Error::EndpointClosed { .. } | braid::Error::EngineStopped => {
                Error::NotConnected(e.to_string())
            }
            braid::Error::InvalidArgument(_)
            | braid::Error::OutOfRange { .. }
            | braid::Error::MissingRight(_) => Error::Invalid(e.to_string()),
            other => Error::NotConnected(other.to_string()),
        }
    }
}

impl From<braid::Error> for Error {
    fn from(e: braid::Error) -> Error {
        Error::from_post(e)
    }
}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        std::io::Error::from_raw_os_error(e.errno().raw())
    }
}

/// How a client connects and moves data.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// One rail per NIC pair: `LOCAL=REMOTE:PORT`.
    pub rails: Vec<RailAddr>,
    /// Endpoint tunables. The data endpoint always uses relaxed placement (its writes go to
    /// disjoint ranges of a file or are ordered by this client).
    pub session: braid::SessionConfig,
    /// Most requests outstanding (at most what the server allows; default 32).
    pub max_outstanding: usize,
    /// Largest one-sided operation a large read or write is cut into (default 1 MiB).
    pub piece_size: usize,
    /// Pieces of one `read_at`/`write_at` in flight at once (default 16).
    pub window: usize,
    /// Bound on a request's wait for its reply (default 60 s): a blocking call returns
    /// [`Error::Timeout`] then, and a request of any kind still unanswered fails the
    /// connection (every outstanding request fails), so nothing waits forever on a server
    /// that is alive but stopped answering. A flush, fsync or close that has waited this
    /// long for the file's one-sided writes goes on and reports `ETIMEDOUT`. The
    /// connection's own peer timeout (3 s by default) fails every operation of a dead
    /// server long before.
    pub op_timeout: Duration,
    /// Bound on connecting and the hello (default 10 s).
    pub connect_timeout: Duration,
    /// How long the completion thread busy-polls before sleeping (default 20 µs): a reply
    /// that arrives meanwhile is read by that thread itself, without waking the progress
    /// engine and then the completion thread. Longer spins cost CPU that, on a small host,
    /// the threads doing the work miss (200 µs halved the metadata rate on 2 cores).
    pub poll_spin: Duration,
    /// How long a blocking call ([`Client::call`] and the metadata calls built on it)
    /// busy-polls for its reply on the calling thread before sleeping (default 300 µs;
    /// zero: never): a reply read there wakes neither the progress engine nor the
    /// completion thread.
    pub reply_spin: Duration,
    /// How long a [`Reconnecting`] client tries to connect again after its connection
    /// failed before a call fails (NFS's `soft`); `None` (the default): for as long as it
    /// takes (NFS's `hard`).
    pub reconnect_timeout: Option<Duration>,
}

impl ClientConfig {
    /// Defaults over `rails`.
    pub fn new(rails: Vec<RailAddr>) -> ClientConfig {
        ClientConfig {
            rails,
            session: braid::SessionConfig::default(),
            max_outstanding: 32,
            piece_size: 1 << 20,
            window: 16,
            op_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(10),
            poll_spin: Duration::from_micros(20),
            reply_spin: Duration::from_micros(300),
            reconnect_timeout: None,
        }
    }
}

/// What the completion thread and the callbacks share.
pub(crate) struct Inner {
    pub(crate) ctx: Context,
    pub(crate) cfg: ClientConfig,
    pub(crate) rpc: Rpc,
    pub(crate) data: DataOps,
    cq: CompletionQueue,
    hello: HelloReply,
    files: Mutex<HashMap<u64, Weak<FileState>>>,
    stop: AtomicBool,
}

impl Inner {
    /// The shared data-path state of a file, made on first use.
    pub(crate) fn file_state(&self, node: NodeId) -> Arc<FileState> {
        let mut files = self.files.lock();
        if let Some(f) = files.get(&node.id).and_then(Weak::upgrade) {
            return f;
        }
        files.retain(|_, w| w.strong_count() > 0);
        let f = FileState::new();
        files.insert(node.id, Arc::downgrade(&f));
        f
    }

    /// The data-path state of a file this client has open, if any.
    pub(crate) fn existing_file_state(&self, node: NodeId) -> Option<Arc<FileState>> {
        self.files.lock().get(&node.id).and_then(Weak::upgrade)
    }

    /// Lets flushes that have waited longer than `timeout` for a file's writes go on with
    /// `ETIMEDOUT` (see [`FileState::expire_idle`]).
    fn expire_idle_files(&self, timeout: Duration) {
        // Collected first: the callbacks may look files up again.
        let files: Vec<Arc<FileState>> = self
            .files
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for f in files {
            if f.expire_idle(timeout) {
                tracing::warn!(
                    "a flush waited more than {timeout:?} for a file's writes; it fails with ETIMEDOUT"
                );
            }
        }
    }

    fn dispatch(&self, c: Completion) {
        if c.wr_id & rpc::RECV != 0 {
            self.rpc.on_recv(
                (c.wr_id & !rpc::RECV) as usize,
                c.byte_len as usize,
                c.status,
            );
        } else if c.wr_id & rpc::SEND != 0 {
            self.rpc.on_send((c.wr_id & !rpc::SEND) as usize, c.status);
        } else if c.wr_id & data::DATA != 0 && self.data.on_completion(c.wr_id, c.status) {
            self.rpc
                .fail(format!("the data connection ended ({:?})", c.status));
        }
        if self.rpc.dead().is_some() && !self.data.endpoint().is_closed() {
            self.data.endpoint().close();
        }
    }
}

struct Guard {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// A connection to a braid-fs server. Cheap to clone; the connection ends when the last
/// clone and the last [`File`] are dropped.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
    _guard: Arc<Guard>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("rails", &self.inner.cfg.rails.len())
            .field("connected", &self.is_connected())
            .finish()
    }
}

const HELLO_SEND: u64 = 1;
const HELLO_RECV: u64 = 2;

/// Sends a hello on `ep` and waits for the reply (before the completion thread runs).
fn hello(
    cq: &CompletionQueue,
    ep: &braid::Endpoint,
    buf: &Region,
    role: Role,
    session: u64,
    timeout: Duration,
) -> Result<HelloReply, Error> {
    let (send_at, recv_at) = (0, 4096);
    ep.post_recv(HELLO_RECV, &[buf.slice(recv_at, 4096)?])?;
    let msg = proto::encode_request(
        0,
        &caller::current(),
        &Request::Hello {
            version: proto::VERSION,
            role,
            session,
        },
    )
    .map_err(|e| Error::Invalid(e.to_string()))?;
    buf.write_at(send_at, &msg)?;
    ep.send(HELLO_SEND, &[buf.slice(send_at, msg.len())?])?;
    let deadline = Instant::now() + timeout;
    let (mut sent, mut reply) = (false, None);
    while !(sent && reply.is_some()) {
        let left = deadline.saturating_duration_since(Instant::now());
        let c = cq
            .wait(left)
            .ok_or_else(|| Error::Timeout("waiting for the server's hello".into()))?;
        if !c.status.is_ok() {
            return Err(Error::Connect(format!("the hello failed: {:?}", c.status)));
        }
        match c.wr_id {
            HELLO_SEND => sent = true,
            HELLO_RECV => reply = Some(buf.to_vec(recv_at, (c.byte_len as usize).min(4096))?),
            _ => {}
        }
    }
    let bytes = reply.unwrap_or_default();
    match proto::decode_reply(&bytes) {
        Ok((_, Op::Hello, Ok(Reply::Hello(h)))) => Ok(h),
        Ok((_, _, Err(e))) => Err(Error::Connect(format!("the server refused: {e}"))),
        Ok(other) => Err(Error::Protocol(format!("unexpected hello reply {other:?}"))),
        Err(e) => Err(Error::Protocol(format!("malformed hello reply: {e}"))),
    }
}

impl Client {
    /// Connects to a server over `cfg.rails` (two endpoints, each over every rail).
    pub fn connect(ctx: &Context, cfg: &ClientConfig) -> Result<Client, Error> {
        let slots_max = cfg.max_outstanding.max(1);
        let cq = ctx.create_cq(2 * slots_max + MAX_DATA_OPS + 16);
        cq.set_spin(cfg.poll_spin);
        let conn = |relaxed: bool| {
            let mut opts = EndpointOptions::new(&cq);
            opts.session = cfg.session.clone();
            opts.session.relaxed_placement |= relaxed;
            opts.connect_timeout = cfg.connect_timeout;
            ctx.connect(&cfg.rails, &opts)
                .map_err(|e| Error::Connect(e.to_string()))
        };
        let meta = conn(false)?;
        let data_ep = conn(true)?;
        let hello_buf = ctx.alloc_region(8192, Access::LOCAL_WRITE)?;
        let h = hello(&cq, &meta, &hello_buf, Role::Meta, 0, cfg.connect_timeout)?;
        hello(
            &cq,
            &data_ep,
            &hello_buf,
            Role::Data,
            h.session,
            cfg.connect_timeout,
        )?;
        let slots = slots_max.min(h.max_outstanding.max(1) as usize);
        let req_buf = ctx.alloc_region(slots * MAX_MSG, Access::LOCAL_WRITE)?;
        let rep_buf = ctx.alloc_region(slots * MAX_MSG, Access::LOCAL_WRITE)?;
        let inner = Arc::new(Inner {
            ctx: ctx.clone(),
            cfg: cfg.clone(),
            rpc: Rpc::new(meta, req_buf, rep_buf, slots)?,
            data: DataOps::new(data_ep),
            cq,
            hello: h,
            files: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
        });
        let i2 = inner.clone();
        let thread = std::thread::Builder::new()
            .name("braid-fs-client".into())
            .spawn(move || completion_loop(&i2))
            .map_err(|e| Error::Connect(format!("starting the completion thread: {e}")))?;
        Ok(Client {
            inner: inner.clone(),
            _guard: Arc::new(Guard {
                inner,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// The export's root.
    pub fn root(&self) -> Entry {
        self.inner.hello.root
    }

    /// True when the server exports read-only.
    pub fn read_only(&self) -> bool {
        self.inner.hello.read_only
    }

    /// The braid context the client runs in (regions for `read_at` come from it).
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    /// False once the connection has failed or been closed.
    pub fn is_connected(&self) -> bool {
        self.inner.rpc.dead().is_none()
    }

    /// Requests outstanding or waiting for a slot.
    pub fn outstanding(&self) -> usize {
        self.inner.rpc.outstanding()
    }

    /// Sends a request; `cb` gets the reply on the client's completion thread (it must not
    /// block). An immediate failure runs `cb` on this thread.
    pub fn call_async(
        &self,
        req: &Request,
        cb: impl FnOnce(Result<Reply, Error>) + Send + 'static,
    ) {
        self.inner.rpc.call_then(req, Box::new(cb));
    }

    /// Busy-polls this client's completions on the calling thread, running their
    /// callbacks, until `done` is set or `spin` has passed (then the completion thread
    /// takes over). For a thread that has just sent a request and has nothing else to do:
    /// the reply is read here as soon as it arrives, instead of waking the progress engine
    /// and then the completion thread. Call it with no lock held that a callback takes.
    pub fn help_until(&self, done: &AtomicBool, spin: Duration) {
        self.help_until_with(done, spin, false)
    }

    /// [`Client::help_until`]; with `yielding`, the thread yields the CPU between polls, so
    /// that on a small host the threads that produce the reply (the progress engine, a
    /// server on the same machine) are not kept waiting by the poller.
    pub(crate) fn help_until_with(&self, done: &AtomicBool, spin: Duration, yielding: bool) {
        if spin.is_zero() {
            return;
        }
        let start = Instant::now();
        while !done.load(Ordering::Acquire) {
            if start.elapsed() >= spin {
                // While a thread polls, the progress engine leaves the reading to it (for up
                // to a millisecond after the last poll); a zero wait hands it back at once,
                // as a thread going to sleep in `wait` does, so a late reply is not left
                // unread.
                if let Some(c) = self.inner.cq.wait(Duration::ZERO) {
                    self.inner.dispatch(c);
                }
                return;
            }
            match self.inner.cq.poll() {
                Some(c) => self.inner.dispatch(c),
                None if yielding => std::thread::yield_now(),
                None => std::hint::spin_loop(),
            }
        }
    }

    /// Sends a request and waits for its reply.
    pub fn call(&self, req: &Request) -> Result<Reply, Error> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        self.call_async(req, move |r| {
            let _ = tx.send(r);
            d.store(true, Ordering::Release);
        });
        self.help_until(&done, self.inner.cfg.reply_spin);
        wait(&rx, self.inner.cfg.op_timeout, req.op())
    }

    /// Closes the connection: every operation in flight fails, and every later one.
    pub fn close(&self) {
        self.inner.rpc.close("closed by the application".into());
        self.inner.data.endpoint().close();
    }
}

pub(crate) fn wait<T>(
    rx: &std::sync::mpsc::Receiver<Result<T, Error>>,
    timeout: Duration,
    op: Op,
) -> Result<T, Error> {
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::Timeout(format!(
            "{op:?} got no reply in {timeout:?}"
        ))),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            Err(Error::Lost(format!("{op:?} was dropped")))
        }
    }
}

fn completion_loop(inner: &Inner) {
    // Unanswered requests are looked for every 50 ms, not after every completion.
    let mut next_expiry_check = Instant::now();
    while !inner.stop.load(Ordering::Acquire) {
        if let Some(c) = inner.cq.wait(Duration::from_millis(50)) {
            inner.dispatch(c);
        }
        if Instant::now() >= next_expiry_check {
            inner.rpc.expire(inner.cfg.op_timeout);
            inner.expire_idle_files(inner.cfg.op_timeout);
            next_expiry_check = Instant::now() + Duration::from_millis(50);
        }
    }
    // Closing flushes everything in flight; run those callbacks (bounded).
    inner.rpc.close("the client was dropped".into());
    inner.data.endpoint().close();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && (inner.data.in_flight() > 0 || !inner.cq.is_empty()) {
        if let Some(c) = inner.cq.wait(Duration::from_millis(20)) {
            inner.dispatch(c);
        }
    }
}
