//! How many descriptors the server lets connections and clients use, derived from the
//! process's descriptor limit (issue 39, findings 6 and 8).
//!
//! At start the soft `RLIMIT_NOFILE` is raised to the hard one; of that limit `L`:
//!
//! - a **reserve** of `max(64, L/8)` is never handed out: the server's own descriptors
//!   (listening sockets, completion queues, threads' files), the transient ones of requests
//!   in progress, and the handshakes of new clients, so a new client can always connect;
//! - a quarter of the rest goes to **endpoints**: at most that many descriptors divided by
//!   [`FDS_PER_ENDPOINT_RAIL`] times the rails (a client has two endpoints);
//! - the rest is the **object pool**: open files and directories (one descriptor each) and
//!   the objects clients have looked up (one `O_PATH` descriptor each). A client may hold at
//!   most 1/8 of the pool in open handles and 1/2 of it in looked-up objects; beyond that its
//!   `Open`/`Create`/`OpenDir` (or lookup) get `EMFILE`. When the pool is used up, everyone's
//!   get `ENFILE`.
//!
//! With `L` = 1,024 and one rail: reserve 128, 56 endpoints, pool 672, 84 handles and 336
//! objects per client. With `L` = 1,048,576: reserve 131,072, the endpoint cap is that of
//! `max_clients`, pool 688,128, 86,016 handles and 344,064 objects per client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::proto::Errno;

/// `tracing::warn!` at most once a second per call site (`braid::throttle::LogThrottle`),
/// with the number of lines held back since (`held_back`): a peer that can make the server
/// warn once per connection or request cannot flood its log.
macro_rules! warn_limited {
    ($($arg:tt)+) => {{
        static LIMIT: braid::throttle::LogThrottle =
            braid::throttle::LogThrottle::new(std::time::Duration::from_secs(1));
        if let Some(held_back) = LIMIT.allow() {
            tracing::warn!(held_back, $($arg)+);
        }
    }};
}
pub(crate) use warn_limited;

/// Descriptors one endpoint may cost per rail: its socket, and on the same host its ring's
/// memory file and doorbell; a meta endpoint's buffers are two memory files more.
pub(crate) const FDS_PER_ENDPOINT_RAIL: u64 = 4;

/// An endpoint that has not said `Hello` within this time is closed (the default of
/// `ServerConfig::hello_timeout`).
pub(crate) const HELLO_DEADLINE: Duration = Duration::from_secs(5);

/// Most a `MapRegion` grows a file by: a client writing further asks again (one round
/// trip per GiB; sparse files cost no space, but each request's growth is bounded anyway).
pub(crate) const MAX_GROWTH: u64 = 1 << 30;

/// Most bytes of a grown range whose pages a `MapRegion` faults in ahead of the client's
/// writes (the end of the range, where queued writes land): what the mount has in flight
/// at most. Beyond that, pages are allocated when data lands in them.
pub(crate) const POPULATE_AHEAD: u64 = 64 << 20;

/// Raises the soft descriptor limit to the hard one; returns the soft limit now in force
/// (`None`: unlimited or unknown).
pub(crate) fn raise_nofile() -> Option<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let l = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (l.current, l.maximum) else {
        return None;
    };
    if hard.is_none_or(|h| h > soft) {
        let want = Rlimit {
            current: hard.or(Some(soft)),
            maximum: hard,
        };
        match setrlimit(Resource::Nofile, want) {
            Ok(()) => return hard.or(Some(soft)),
            Err(e) => tracing::info!("raising the descriptor limit from {soft}: {e}"),
        }
    }
    Some(soft)
}

/// The numbers derived from a descriptor limit (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Descriptors never handed out.
    pub(crate) reserve: u64,
    /// Most endpoints (of all clients, with or without `Hello`) at once.
    pub(crate) endpoints: usize,
    /// Open files and directories plus looked-up objects, of all clients.
    pub(crate) pool: usize,
    /// Open files and directories of one client.
    pub(crate) handles_per_client: usize,
    /// Looked-up objects of one client.
    pub(crate) objects_per_client: usize,
}

impl Limits {
    /// The limits for a descriptor limit of `fd_limit` (`None`: unlimited, taken as 2^20)
    /// and `rails` rails, with at most `max_clients` clients.
    pub(crate) fn derive(fd_limit: Option<u64>, rails: usize, max_clients: usize) -> Limits {
        let l = fd_limit.unwrap_or(1 << 20).clamp(256, 1 << 30);
        let reserve = (l / 8).max(64);
        let usable = l - reserve;
        let for_endpoints = usable / 4;
        let per_endpoint = FDS_PER_ENDPOINT_RAIL * rails.max(1) as u64;
        // Two per client, and room for as many more that have not said Hello yet.
        let wanted = 4 * max_clients.max(1) as u64;
        let endpoints = (for_endpoints / per_endpoint).clamp(2, wanted.max(2)) as usize;
        let pool = (usable - for_endpoints) as usize;
        Limits {
            reserve,
            endpoints,
            pool,
            handles_per_client: (pool / 8).max(16),
            objects_per_client: (pool / 2).max(16),
        }
    }
}

/// Counts the descriptors held for clients' open handles, in all and per client.
#[derive(Clone)]
pub(crate) struct HandleBudget {
    limits: Limits,
    handles: Arc<AtomicUsize>,
}

/// One open handle's share of the budget; given back when dropped.
pub(crate) struct Ticket {
    all: Arc<AtomicUsize>,
    client: Arc<AtomicUsize>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.all.fetch_sub(1, Ordering::AcqRel);
        self.client.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes one from `c` if that leaves it at most `max`.
fn take_one(c: &AtomicUsize, max: usize) -> bool {
    c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
        (n < max).then_some(n + 1)
    })
    .is_ok()
}

impl HandleBudget {
    pub(crate) fn new(limits: Limits) -> HandleBudget {
        HandleBudget {
            limits,
            handles: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A ticket for one more handle of the client whose count is `client`, taken before the
    /// descriptor is opened; `objects` is the number of looked-up objects the server holds.
    pub(crate) fn take(&self, client: &Arc<AtomicUsize>, objects: usize) -> Result<Ticket, Errno> {
        if !take_one(client, self.limits.handles_per_client) {
            return Err(Errno::EMFILE);
        }
        let room = self.limits.pool.saturating_sub(objects);
        if !take_one(&self.handles, room) {
            client.fetch_sub(1, Ordering::AcqRel);
            return Err(Errno::ENFILE);
        }
        Ok(Ticket {
            all: self.handles.clone(),
            client: client.clone(),
        })
    }

    /// Whether a client holding `held` looked-up objects may look up a new one, with
    /// `objects` held by all.
    pub(crate) fn may_look_up(&self, held: usize, objects: usize) -> Result<(), Errno> {
        if held >= self.limits.objects_per_client {
            return Err(Errno::EMFILE);
        }
        if objects + self.handles.load(Ordering::Acquire) >= self.limits.pool {
            return Err(Errno::ENFILE);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_of_the_docs() {
        let small = Limits::derive(Some(1024), 1, 64);
        assert_eq!(
            small,
            Limits {
                reserve: 128,
                endpoints: 56,
                pool: 672,
                handles_per_client: 84,
                objects_per_client: 336,
            }
        );
        let big = Limits::derive(Some(1 << 20), 1, 64);
        assert_eq!(big.reserve, 131_072);
        assert_eq!(big.endpoints, 256);
        assert_eq!(big.pool, 688_128);
        assert_eq!(big.handles_per_client, 86_016);
        assert_eq!(big.objects_per_client, 344_064);
        // Everything handed out stays below the limit.
        for l in [256u64, 1024, 4096, 20_000, 1 << 20] {
            for rails in 1..=4 {
                let d = Limits::derive(Some(l), rails, 64);
                let used = d.reserve
                    + d.endpoints as u64 * FDS_PER_ENDPOINT_RAIL * rails as u64
                    + d.pool as u64;
                assert!(used <= l, "{l} {rails}: {d:?}");
            }
        }
    }

    #[test]
    fn tickets_bound_each_client_and_all_of_them() {
        let b = HandleBudget::new(Limits {
            reserve: 0,
            endpoints: 4,
            pool: 10,
            handles_per_client: 4,
            objects_per_client: 5,
        });
        let (c1, c2, c3) = Default::default();
        let c1: Arc<AtomicUsize> = c1;
        let (c2, c3): (Arc<AtomicUsize>, Arc<AtomicUsize>) = (c2, c3);
        let t1: Vec<Ticket> = (0..4).map(|_| b.take(&c1, 0).unwrap()).collect();
        assert_eq!(b.take(&c1, 0).err(), Some(Errno::EMFILE));
        let t2: Vec<Ticket> = (0..4).map(|_| b.take(&c2, 0).unwrap()).collect();
        // Two objects looked up: the pool of 10 is full.
        assert_eq!(b.take(&c3, 2).err(), Some(Errno::ENFILE));
        assert_eq!(c3.load(Ordering::Acquire), 0);
        assert_eq!(b.may_look_up(0, 2), Err(Errno::ENFILE));
        drop(t1);
        assert_eq!(c1.load(Ordering::Acquire), 0);
        assert!(b.take(&c3, 2).is_ok());
        assert_eq!(b.may_look_up(5, 0), Err(Errno::EMFILE));
        drop(t2);
    }
}
