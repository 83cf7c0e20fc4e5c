//! A client that connects again when its connection fails (a server restart, a cut rail).
//!
//! [`Reconnecting`] dereferences to the current [`Client`]. When that client's connection
//! is dead, the next use connects a new one over all the rails of the same configuration,
//! with bounded backoff: for as long as it takes by default (NFS's `hard`), or until
//! [`ClientConfig::reconnect_timeout`] (NFS's `soft`): then the dead client is handed out
//! and the call fails (`ENOTCONN`), and the next use tries again for as long.
//!
//! What carries over: node ids (they survive a server restart, see `server/handles.rs`), so
//! names looked up before still work. What does not (yet): requests in flight when the
//! connection broke fail (`EIO`/`ENOTCONN`) rather than being resent; server-side open
//! handles, mapped regions and locks belong to the old connection, so files open across
//! the restart fail and must be opened again.
//!
//! Old clients are kept (closed) for as long as this value lives: callers may still hold
//! references to them. Each costs its request and reply buffers (about
//! `2 * max_outstanding * MAX_MSG` bytes) until then.

use std::ops::Deref;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use braid::Context;
use parking_lot::Mutex;

use super::{Client, ClientConfig, Error};

/// First pause between connection attempts; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between connection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A [`Client`] that is replaced by a new connection when its own fails.
pub struct Reconnecting {
    current: AtomicPtr<Client>,
    /// Every client made, the current one last; never shrinks (see the module doc). Boxed:
    /// `current` points at a client, which must not move when the vector grows.
    #[allow(clippy::vec_box)]
    all: Mutex<Vec<Box<Client>>>,
    /// Held while connecting: one thread connects, the others wait for its result.
    connecting: Mutex<()>,
    reconnects: AtomicU64,
    ctx: Context,
    cfg: ClientConfig,
}

impl Reconnecting {
    /// Connects (once, failing at once if the server cannot be reached).
    pub fn connect(ctx: &Context, cfg: &ClientConfig) -> Result<Reconnecting, Error> {
        Ok(Reconnecting::new(Client::connect(ctx, cfg)?))
    }

    /// Wraps a connected client; later connections use its context and configuration.
    pub fn new(client: Client) -> Reconnecting {
        let ctx = client.inner.ctx.clone();
        let cfg = client.inner.cfg.clone();
        let mut b = Box::new(client);
        let p: *mut Client = &mut *b;
        Reconnecting {
            current: AtomicPtr::new(p),
            all: Mutex::new(vec![b]),
            connecting: Mutex::new(()),
            reconnects: AtomicU64::new(0),
            ctx,
            cfg,
        }
    }

    /// The current client, without waiting for a reconnection.
    pub fn current(&self) -> &Client {
        // SAFETY: `current` always points into a box in `all`, which is never shrunk nor
        // dropped before `self`; boxes do not move when the vector grows.
        unsafe { &*self.current.load(Ordering::Acquire) }
    }

    /// How many times a new connection replaced a failed one.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// A connected client: the current one, or a new one when it has failed (waiting as
    /// the configuration says). `Err` with the last connection error when a soft timeout
    /// passed.
    pub fn connected(&self) -> Result<&Client, Error> {
        let c = self.current();
        if c.is_connected() {
            return Ok(c);
        }
        let _one = self.connecting.lock();
        let c = self.current();
        if c.is_connected() {
            // Another thread reconnected while this one waited.
            return Ok(c);
        }
        let deadline = self.cfg.reconnect_timeout.map(|t| Instant::now() + t);
        let mut pause = FIRST_BACKOFF;
        loop {
            match Client::connect(&self.ctx, &self.cfg) {
                Ok(new) => {
                    tracing::info!("braid-fs client: connected again to the server");
                    let mut b = Box::new(new);
                    let p: *mut Client = &mut *b;
                    self.all.lock().push(b);
                    self.current.store(p, Ordering::Release);
                    self.reconnects.fetch_add(1, Ordering::Relaxed);
                    // After the swap: callbacks this runs see the new client.
                    c.close();
                    return Ok(self.current());
                }
                Err(e) => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now + pause > d) {
                        tracing::warn!("braid-fs client: the server is still unreachable: {e}");
                        return Err(e);
                    }
                    tracing::debug!("braid-fs client: reconnecting: {e}");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_BACKOFF);
                }
            }
        }
    }
}

impl Deref for Reconnecting {
    type Target = Client;

    /// The client to use now: a dead one is replaced first (see [`Reconnecting::connected`]);
    /// after a soft timeout, the dead one (its calls fail).
    fn deref(&self) -> &Client {
        self.connected().unwrap_or_else(|_| self.current())
    }
}

impl std::fmt::Debug for Reconnecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconnecting")
            .field("current", self.current())
            .field("reconnects", &self.reconnects())
            .finish()
    }
}
