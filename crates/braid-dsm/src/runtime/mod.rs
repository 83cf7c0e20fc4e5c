//! The runtime: one per process. It joins the group (braid-boot), reserves the shared range
//! at an address every rank agrees on, registers it with userfaultfd, and runs the service
//! thread. Application threads call the collectives, locks and allocation from here.

mod service;
mod shared;
pub(crate) mod space;
mod trace;
mod transport;
pub(crate) mod uffd;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use braid::{Context, EndpointOptions, Region, RemoteKey};
use braid_boot::{LaunchEnv, World, WorldOptions};
use parking_lot::Mutex;

pub use service::ServiceStats;
use service::{EXIT_UNSERVABLE, Service};
use shared::{Request, Shared};
use space::{Allocator, Reservation, page_size};
use transport::{Keys, RECV_DEPTH, Transport, WR_ATOMIC, wr};
use uffd::Faults;

use crate::config::DsmConfig;
use crate::error::DsmError;
use crate::proto::{HomePolicy, Msg, Node, NodeConfig, Rank};

/// Collectives wait this long at most (a rank that is alive but never arrives is a bug in
/// the program; a rank that dies fails the wait much sooner).
const COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Bound on one atomic or request served locally by the service thread.
const OP_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Collectives {
    barrier_epoch: u64,
    gather_seq: u64,
}

pub(crate) struct Runtime {
    pub rank: usize,
    pub size: usize,
    pub cfg: DsmConfig,
    pub page: usize,
    pub user_faults_only: bool,
    space: Reservation,
    allocator: Mutex<Allocator>,
    policies: Mutex<HashMap<usize, HomePolicy>>,
    shared: Arc<Shared>,
    world: Arc<World>,
    lock_keys: Vec<RemoteKey>,
    lock_words: Region,
    held: Mutex<HashMap<u32, u32>>,
    coll: Mutex<Collectives>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<Mutex<ServiceStats>>,
    _ctx: Context,
}

fn policy_code(p: HomePolicy) -> u64 {
    match p {
        HomePolicy::Block => 0,
        HomePolicy::Cyclic => 1,
    }
}

/// Addresses tried first for the shared range: the middle of the 47-bit user address space
/// (16 to 80 TiB), between where Linux puts executables and heaps (near 85 TiB) and where
/// it puts `mmap`s (down from 128 TiB). Usually free in every process.
const HINTS: [usize; 5] = [
    0x2000_0000_0000,
    0x3000_0000_0000,
    0x1000_0000_0000,
    0x4000_0000_0000,
    0x2800_0000_0000,
];

/// True when every rank reports `ok`.
fn all_agree(world: &World, ok: bool) -> Result<bool, DsmError> {
    Ok(world
        .allgather(&[ok as u8])?
        .iter()
        .all(|v| v.as_slice() == [1]))
}

/// Agrees with every rank on one address for the shared range: first the fixed hints,
/// then each rank's proposal (where the kernel put a reservation of its own), each mapped
/// with `MAP_FIXED_NOREPLACE` in every rank; the first that every rank could map wins.
fn agree_on_space(world: &World, len: usize) -> Result<Reservation, DsmError> {
    for hint in HINTS {
        if hint
            .checked_add(len)
            .is_none_or(|end| end > 0x7000_0000_0000)
        {
            continue;
        }
        let r = Reservation::at(hint, len);
        if all_agree(world, r.is_some())? {
            return Ok(r.expect("this rank mapped it"));
        }
    }
    let own = Reservation::anywhere(len)?;
    let all = world.allgather(&(own.base as u64).to_le_bytes())?;
    // Free our own spot: another rank's proposal may overlap it.
    drop(own);
    let mut candidates: Vec<usize> = Vec::new();
    for b in &all {
        let a = u64::from_le_bytes(
            b.as_slice()
                .try_into()
                .map_err(|_| DsmError::Failed("malformed address proposal".into()))?,
        ) as usize;
        if !candidates.contains(&a) {
            candidates.push(a);
        }
    }
    for cand in candidates {
        let r = Reservation::at(cand, len);
        if all_agree(world, r.is_some())? {
            return Ok(r.expect("this rank mapped it"));
        }
    }
    Err(DsmError::NoSpace(format!(
        "no address range of {len} bytes is free at the same address in every rank (set BRAID_DSM_SPACE smaller)"
    )))
}

impl Runtime {
    pub(crate) fn init(cfg: DsmConfig) -> Result<Runtime, DsmError> {
        let page = page_size();
        // First what can fail locally, so a rank without userfaultfd says so at once.
        let faults = Faults::open(cfg.user_faults_only)?;
        let user_faults_only = faults.user_mode_only;
        let env = LaunchEnv::from_env()?;
        let ctx = Context::new()?;
        let size = env.size;
        let rank = env.rank;
        let cq = ctx.create_cq(size.saturating_sub(1) * RECV_DEPTH + 16384);
        let mut endpoint = EndpointOptions::new(&cq);
        endpoint.session.spread_small_ops = cfg.spread_rails;
        let world = Arc::new(World::join(
            &ctx,
            &env,
            &WorldOptions::with_endpoint(endpoint),
        )?);
        let len = cfg
            .space
            .checked_next_multiple_of(page)
            .ok_or_else(|| DsmError::InvalidArgument("BRAID_DSM_SPACE too large".into()))?;
        let space = agree_on_space(&world, len)?;
        // Small pages only: a huge page would move 2 MiB per fault.
        // SAFETY: advice on our own reservation.
        unsafe { libc::madvise(space.base.cast(), len, libc::MADV_NOHUGEPAGE) };
        faults.register(space.base, len)?;
        let lock_words = cfg.locks.div_ceil(size as u32) as usize;
        let mut tx = Transport::new(&ctx, world.clone(), cfg.slots, lock_words, page)?;
        tx.post_receives()?;
        let keys = world.allgather(&tx.keys().to_bytes())?;
        tx.peers = keys
            .iter()
            .map(|b| Keys::from_bytes(b))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| DsmError::Failed("malformed region keys from a peer".into()))?;
        let lock_keys = tx.peers.iter().map(|k| k.locks).collect();
        let lock_words = tx.locks.clone();
        let shared = Arc::new(Shared::new()?);
        let stats = Arc::new(Mutex::new(ServiceStats::default()));
        let node = Node::new(NodeConfig {
            rank: rank as Rank,
            size: size as u32,
            slots: cfg.slots,
        });
        let svc = Service::new(
            node,
            faults,
            tx,
            cq,
            shared.clone(),
            space.base as usize,
            len,
            page,
            (cfg.spin, cfg.spin_wait.max(cfg.spin)),
            stats.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("braid-dsm".into())
            .spawn(move || svc.run())
            .map_err(|e| DsmError::Os("starting the service thread".into(), e))?;
        let rt = Runtime {
            rank,
            size,
            cfg,
            page,
            user_faults_only,
            space,
            allocator: Mutex::new(Allocator::new(len, page)),
            policies: Mutex::new(HashMap::new()),
            shared,
            world,
            lock_keys,
            lock_words,
            held: Mutex::new(HashMap::new()),
            coll: Mutex::new(Collectives::default()),
            thread: Mutex::new(Some(thread)),
            stats,
            _ctx: ctx,
        };
        rt.world.barrier()?;
        Ok(rt)
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.space.base
    }

    pub(crate) fn space_len(&self) -> usize {
        self.space.len
    }

    pub(crate) fn stats(&self) -> ServiceStats {
        *self.stats.lock()
    }

    /// Payload bytes braid sent on each rail index, summed over the endpoints to every peer.
    pub(crate) fn rail_bytes_sent(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for p in 0..self.size {
            if let Some(ep) = self.world.endpoint(p) {
                for (i, b) in ep.rail_bytes_sent().into_iter().enumerate() {
                    if out.len() <= i {
                        out.resize(i + 1, 0);
                    }
                    out[i] += b;
                }
            }
        }
        out
    }

    // ------------------------------------------------------------------ collectives

    fn barrier_locked(&self, c: &mut Collectives) -> Result<(), DsmError> {
        self.shared.check()?;
        let epoch = c.barrier_epoch;
        c.barrier_epoch += 1;
        let (n, me) = (self.size, self.rank);
        let (mut dist, mut round) = (1usize, 0u32);
        while dist < n {
            let to = ((me + dist) % n) as Rank;
            self.shared.request(Request::Send {
                to,
                msg: Msg::Barrier { epoch, round },
            });
            self.shared.wait_for("barrier", COLLECTIVE_TIMEOUT, |w| {
                w.barrier.remove(&(epoch, round)).map(|_| ())
            })?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }

    /// Returns when every rank has called it (a dissemination barrier over braid).
    pub(crate) fn barrier(&self) -> Result<(), DsmError> {
        self.barrier_locked(&mut self.coll.lock())
    }

    /// Every rank's `(a, b)`, by rank.
    fn gather_locked(
        &self,
        c: &mut Collectives,
        a: u64,
        b: u64,
    ) -> Result<Vec<(u64, u64)>, DsmError> {
        self.shared.check()?;
        let seq = c.gather_seq;
        c.gather_seq += 1;
        for p in (0..self.size).filter(|&p| p != self.rank) {
            self.shared.request(Request::Send {
                to: p as Rank,
                msg: Msg::Gather { seq, a, b },
            });
        }
        let (me, size) = (self.rank, self.size);
        self.shared.wait_for("collective", COLLECTIVE_TIMEOUT, |w| {
            let v = w.gather.entry(seq).or_insert_with(|| vec![None; size]);
            v[me] = Some((a, b));
            if v.iter().all(Option::is_some) {
                let v = w.gather.remove(&seq).expect("present");
                Some(v.into_iter().map(|x| x.expect("all present")).collect())
            } else {
                None
            }
        })
    }

    fn service_result(&self, what: &str, token: u64) -> Result<(), DsmError> {
        self.shared
            .wait_for(what, OP_TIMEOUT, |w| w.results.remove(&token))?
            .map(|_| ())
            .map_err(DsmError::Failed)
    }

    // ------------------------------------------------------------------ allocation

    /// Collective allocation; see `Dsm::alloc_with`.
    pub(crate) fn alloc(&self, bytes: usize, policy: HomePolicy) -> Result<*mut u8, DsmError> {
        let mut c = self.coll.lock();
        self.shared.check()?;
        let placed = if bytes == 0 {
            None
        } else {
            self.allocator.lock().alloc(bytes)
        };
        if let Some((off, len)) = placed {
            self.space
                .protect(off, len, true)
                .map_err(|e| DsmError::Os("mprotect".into(), e))?;
            let token = self.shared.token();
            self.shared.request(Request::AddAllocation {
                first: (off / self.page) as u64,
                pages: (len / self.page) as u64,
                policy,
                token,
            });
            self.service_result("allocation", token)?;
        }
        let all = self.gather_locked(&mut c, bytes as u64, policy_code(policy))?;
        let agree = all
            .iter()
            .all(|&v| v == (bytes as u64, policy_code(policy)));
        if !agree || bytes == 0 || placed.is_none() {
            if let Some((off, len)) = placed {
                self.undo_alloc(off, len)?;
            }
            if !agree {
                let list: Vec<String> = all
                    .iter()
                    .enumerate()
                    .map(|(r, (b, p))| {
                        let p = if *p == 0 { "block" } else { "cyclic" };
                        format!("rank {r}: {b} bytes {p}")
                    })
                    .collect();
                return Err(DsmError::Mismatch(format!(
                    "alloc called with different arguments ({})",
                    list.join(", ")
                )));
            }
            if bytes == 0 {
                return Err(DsmError::InvalidArgument("alloc of 0 bytes".into()));
            }
            return Err(DsmError::NoSpace(format!(
                "{bytes} bytes do not fit the shared range of {} bytes (BRAID_DSM_SPACE)",
                self.space.len
            )));
        }
        let (off, _) = placed.expect("checked");
        self.policies.lock().insert(off, policy);
        // SAFETY: inside the reservation.
        Ok(unsafe { self.space.base.add(off) })
    }

    fn undo_alloc(&self, off: usize, len: usize) -> Result<(), DsmError> {
        let token = self.shared.token();
        self.shared.request(Request::RemoveAllocation {
            first: (off / self.page) as u64,
            token,
        });
        self.service_result("undoing an allocation", token)?;
        self.release_range(off, len)
    }

    fn release_range(&self, off: usize, len: usize) -> Result<(), DsmError> {
        // SAFETY: inside the reservation.
        uffd::drop_pages(unsafe { self.space.base.add(off) }, len)
            .map_err(|e| DsmError::Os("madvise".into(), e))?;
        self.space
            .protect(off, len, false)
            .map_err(|e| DsmError::Os("mprotect".into(), e))?;
        self.allocator.lock().free(off);
        self.policies.lock().remove(&off);
        Ok(())
    }

    /// Collective free of the allocation at `ptr`.
    pub(crate) fn free(&self, ptr: *mut u8) -> Result<(), DsmError> {
        let mut c = self.coll.lock();
        self.shared.check()?;
        let off = (ptr as usize).wrapping_sub(self.space.base as usize);
        let len = self.allocator.lock().len_at(off);
        let mine = if len.is_some() { off as u64 } else { u64::MAX };
        let all = self.gather_locked(&mut c, mine, 0)?;
        if all.iter().any(|&(o, _)| o != mine) {
            return Err(DsmError::Mismatch(format!(
                "free called with different allocations (offsets {:?})",
                all.iter().map(|v| v.0 as i64).collect::<Vec<_>>()
            )));
        }
        let Some(len) = len else {
            return Err(DsmError::InvalidArgument(format!(
                "{ptr:p} is not the start of a live allocation"
            )));
        };
        self.undo_alloc(off, len)
    }

    /// Offsets of the live allocations, in order.
    fn live(&self) -> Vec<usize> {
        self.allocator.lock().blocks().map(|(o, _)| o).collect()
    }

    // ------------------------------------------------------------------ locks

    fn lock_place(&self, id: u32) -> Result<(usize, u64), DsmError> {
        if id >= self.cfg.locks {
            return Err(DsmError::InvalidArgument(format!(
                "lock {id}: ids go up to {} (BRAID_DSM_LOCKS)",
                self.cfg.locks - 1
            )));
        }
        let n = self.size as u32;
        Ok(((id % n) as usize, (id / n) as u64 * 8))
    }

    fn fetch_add(&self, home: usize, off: u64, add: u64) -> Result<u64, DsmError> {
        self.shared.check()?;
        if home == self.rank {
            return Ok(self
                .lock_words
                .atomic_u64(off as usize)?
                .fetch_add(add, Ordering::SeqCst));
        }
        let token = self.shared.token();
        let ep = self
            .world
            .endpoint(home)
            .ok_or_else(|| DsmError::Failed(format!("no endpoint to rank {home}")))?;
        let mut tries = 0;
        loop {
            match ep.fetch_add(wr(WR_ATOMIC, token), &self.lock_keys[home], off, add) {
                Ok(()) => break,
                Err(braid::Error::QueueFull { .. }) if tries < 1000 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(e) => return Err(DsmError::Failed(format!("rank {home}: {e}"))),
            }
        }
        self.shared
            .wait_for("lock atomic", OP_TIMEOUT, |w| w.results.remove(&token))?
            .map_err(DsmError::Failed)
    }

    /// Acquires global lock `id` (FIFO among waiters; waiters sleep until told).
    pub(crate) fn lock(&self, id: u32) -> Result<(), DsmError> {
        let (home, off) = self.lock_place(id)?;
        let old = self.fetch_add(home, off, 1 << 32)?;
        let (ticket, serving) = ((old >> 32) as u32, old as u32);
        if ticket != serving {
            self.shared.request(Request::LockWait { lock: id, ticket });
            self.shared.wait_for("lock", COLLECTIVE_TIMEOUT, |w| {
                w.grants.remove(&(id, ticket)).then_some(())
            })?;
        }
        self.held.lock().insert(id, ticket);
        Ok(())
    }

    /// Releases global lock `id`, held by a thread of this rank.
    pub(crate) fn unlock(&self, id: u32) -> Result<(), DsmError> {
        let (home, off) = self.lock_place(id)?;
        let ticket = self.held.lock().remove(&id).ok_or_else(|| {
            DsmError::InvalidArgument(format!("lock {id} is not held by this rank"))
        })?;
        // Serving is the low half; its wrap must not carry into the ticket half.
        let add = if ticket == u32::MAX {
            1u64.wrapping_sub(1 << 32)
        } else {
            1
        };
        let old = self.fetch_add(home, off, add)?;
        if old as u32 != ticket {
            return Err(DsmError::Failed(format!(
                "lock {id}: served ticket {} while this rank released {ticket}",
                old as u32
            )));
        }
        let next = ticket.wrapping_add(1);
        if (old >> 32) as u32 != next {
            self.shared.request(Request::LockHandoff {
                lock: id,
                ticket: next,
            });
        }
        Ok(())
    }

    // ------------------------------------------------------------------ end

    /// Frees what is left, waits for every rank, stops the service thread and leaves the
    /// group. After a failure, only the local part.
    pub(crate) fn finalize(&self) -> Result<(), DsmError> {
        let mut result = Ok(());
        if self.shared.check().is_ok() {
            for off in self.live() {
                // SAFETY: inside the reservation.
                if let Err(e) = self.free(unsafe { self.space.base.add(off) }) {
                    result = Err(e);
                    break;
                }
            }
            if result.is_ok() {
                result = self.barrier();
            }
        } else {
            result = self.shared.check();
        }
        self.stop();
        if result.is_ok() {
            result = self.world.barrier().map_err(DsmError::from);
        }
        result
    }

    fn stop(&self) {
        self.shared.request(Request::Stop);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Exit status of a process that had a page fault the failed group could not serve.
pub const EXIT_STATUS_UNSERVABLE: i32 = EXIT_UNSERVABLE;
