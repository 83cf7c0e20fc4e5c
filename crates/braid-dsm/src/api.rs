//! The Rust API: [`Dsm`] and [`Allocation`].

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::DsmConfig;
use crate::error::DsmError;
use crate::proto::HomePolicy;
use crate::runtime::{Runtime, ServiceStats};

/// One DSM per process: userfaultfd, the shared range and the group are process-wide.
static LIVE: AtomicBool = AtomicBool::new(false);

/// This process's membership in a DSM group.
///
/// Created by [`Dsm::init`] (collective: every rank of the job calls it), ended by
/// [`Dsm::finalize`] (collective too). It can be shared by the threads of the process
/// (`&Dsm` is `Sync`); the collectives (`alloc`, `free`, `barrier`, `finalize`) must be
/// called by one thread of each rank at a time, in the same order on every rank, like MPI's.
/// Locks may be taken by any thread.
pub struct Dsm {
    rt: Arc<Runtime>,
    finalized: bool,
}

impl std::fmt::Debug for Dsm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dsm")
            .field("rank", &self.rt.rank)
            .field("size", &self.rt.size)
            .finish()
    }
}

/// Memory from [`Dsm::alloc`]: at the same address in every rank.
///
/// Accesses are plain loads and stores through [`Allocation::as_ptr`]; they are
/// sequentially consistent across ranks at page granularity (see the crate docs). Other
/// ranks may change the memory at any moment, so Rust references to it are only sound
/// where the program itself excludes concurrent writers (with locks or barriers), exactly
/// as for memory shared between threads.
#[derive(Debug)]
pub struct Allocation {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the allocation is an address range valid in every thread of the process.
unsafe impl Send for Allocation {}
// SAFETY: as above; access rules are those of shared memory.
unsafe impl Sync for Allocation {}

impl Allocation {
    /// First byte (page aligned, identical in every rank).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The first byte as a typed pointer (page aligned).
    pub fn cast<T>(&self) -> *mut T {
        self.ptr.as_ptr().cast()
    }

    /// Bytes requested.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: allocations have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Reads the `T` at byte `offset` (volatile: every call is a real load).
    ///
    /// # Panics
    /// If `offset` is out of range or not aligned for `T`.
    pub fn read<T: Copy>(&self, offset: usize) -> T {
        let p = self.at::<T>(offset);
        // SAFETY: in range and aligned (checked); the memory is valid for the allocation's
        // life, and `T: Copy` has no drop.
        unsafe { p.read_volatile() }
    }

    /// Writes `v` at byte `offset` (volatile: every call is a real store).
    ///
    /// # Panics
    /// If `offset` is out of range or not aligned for `T`.
    pub fn write<T: Copy>(&self, offset: usize, v: T) {
        let p = self.at::<T>(offset);
        // SAFETY: as in `read`.
        unsafe { p.write_volatile(v) }
    }

    fn at<T>(&self, offset: usize) -> *mut T {
        let size = std::mem::size_of::<T>();
        assert!(
            offset.checked_add(size).is_some_and(|e| e <= self.len),
            "offset {offset} + {size} beyond an allocation of {} bytes",
            self.len
        );
        assert!(
            offset.is_multiple_of(std::mem::align_of::<T>()),
            "offset {offset} misaligned"
        );
        // SAFETY: in range (checked above).
        unsafe { self.ptr.as_ptr().add(offset).cast() }
    }
}

/// Counters of this rank's service thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct DsmStats {
    /// Page faults handled.
    pub faults: u64,
    /// Pages installed (copies fetched, or zero-filled on first touch).
    pub installs: u64,
    /// Pages this rank sent to others.
    pub pages_sent: u64,
    /// Copies dropped (invalidated or handed over).
    pub drops: u64,
    /// Protocol messages received.
    pub messages: u64,
    /// Page requests this rank sent.
    pub requests: u64,
    /// Mean µs from reading a fault to having posted its request.
    pub fault_to_request_us: f64,
    /// Mean µs from posting a request to its grant's arrival (network and the serving rank).
    pub request_to_grant_us: f64,
    /// Mean µs installing a granted page (`UFFDIO_COPY` or unprotect, which wakes the thread).
    pub install_us: f64,
    /// Mean µs this rank took to serve a page (request arrival to page posted).
    pub serve_us: f64,
}

impl From<ServiceStats> for DsmStats {
    fn from(s: ServiceStats) -> DsmStats {
        let mean = |ns: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1000.0
            }
        };
        DsmStats {
            faults: s.faults,
            installs: s.installs,
            pages_sent: s.pages_sent,
            drops: s.drops,
            messages: s.messages,
            requests: s.requests,
            fault_to_request_us: mean(s.fault_to_request_ns, s.requests),
            request_to_grant_us: mean(s.request_to_grant_ns, s.requests),
            install_us: mean(s.install_ns, s.installs),
            serve_us: mean(s.serve_ns, s.pages_sent),
        }
    }
}

/// The runtime behind a [`Dsm`] (for the C API, which must not hold a lock while a call
/// blocks).
pub(crate) fn runtime_of(d: &Dsm) -> Arc<Runtime> {
    d.rt.clone()
}

impl Dsm {
    /// Joins the group described by the launcher's environment (`docs/LAUNCH.md`: rank,
    /// size and `BRAID_ROOT`), with settings from the `BRAID_DSM_*` variables
    /// ([`DsmConfig::from_env`]). Collective.
    pub fn init() -> Result<Dsm, DsmError> {
        Self::init_with(DsmConfig::from_env()?)
    }

    /// [`Dsm::init`] with explicit settings.
    pub fn init_with(cfg: DsmConfig) -> Result<Dsm, DsmError> {
        if LIVE.swap(true, Ordering::AcqRel) {
            return Err(DsmError::AlreadyInitialized);
        }
        match Runtime::init(cfg) {
            Ok(rt) => Ok(Dsm {
                rt: Arc::new(rt),
                finalized: false,
            }),
            Err(e) => {
                LIVE.store(false, Ordering::Release);
                Err(e)
            }
        }
    }

    /// This process's rank, `0..size`.
    pub fn rank(&self) -> usize {
        self.rt.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.rt.size
    }

    /// The system page size: the unit of coherence.
    pub fn page_size(&self) -> usize {
        self.rt.page
    }

    /// Whether the userfaultfd handles user-mode faults only (see
    /// [`DsmConfig::user_faults_only`]).
    pub fn user_faults_only(&self) -> bool {
        self.rt.user_faults_only
    }

    /// The shared range: (first address, bytes). Accesses in it outside a live allocation
    /// are a SIGSEGV.
    pub fn range(&self) -> (*mut u8, usize) {
        (self.rt.base(), self.rt.space_len())
    }

    /// Collective allocation of `bytes` with the configured home policy (`BRAID_DSM_HOME`,
    /// default block). Every rank must call it with the same size; otherwise every rank
    /// gets [`DsmError::Mismatch`].
    pub fn alloc(&self, bytes: usize) -> Result<Allocation, DsmError> {
        self.alloc_with(bytes, self.rt.cfg.home)
    }

    /// [`Dsm::alloc`] with an explicit home policy for its pages.
    pub fn alloc_with(&self, bytes: usize, policy: HomePolicy) -> Result<Allocation, DsmError> {
        let p = self.rt.alloc(bytes, policy)?;
        Ok(Allocation {
            ptr: NonNull::new(p).expect("the shared range is not at address 0"),
            len: bytes,
        })
    }

    /// Collective free. Every rank frees the same allocation; nobody may access it afterwards
    /// (an access is a SIGSEGV until the range is allocated again).
    pub fn free(&self, a: Allocation) -> Result<(), DsmError> {
        self.rt.free(a.as_ptr())
    }

    /// Collective free by address (as the C API does).
    ///
    /// # Safety
    /// No reference into the allocation may be used afterwards.
    pub unsafe fn free_ptr(&self, p: *mut u8) -> Result<(), DsmError> {
        self.rt.free(p)
    }

    /// Returns once every rank has called it. Memory needs no flushing: the DSM is
    /// sequentially consistent, every write is visible everywhere once it happened.
    pub fn barrier(&self) -> Result<(), DsmError> {
        self.rt.barrier()
    }

    /// Acquires global lock `id` (`0..BRAID_DSM_LOCKS`). Fair (first come, first served);
    /// a waiter sleeps until the releaser's hand-off reaches it.
    pub fn lock(&self, id: u32) -> Result<(), DsmError> {
        self.rt.lock(id)
    }

    /// Releases global lock `id`, held by a thread of this rank.
    pub fn unlock(&self, id: u32) -> Result<(), DsmError> {
        self.rt.unlock(id)
    }

    /// This rank's counters.
    pub fn stats(&self) -> DsmStats {
        self.rt.stats().into()
    }

    /// Payload bytes braid has sent on each rail (index = rail), over all peers.
    pub fn rail_bytes_sent(&self) -> Vec<u64> {
        self.rt.rail_bytes_sent()
    }

    /// Collective end: frees every allocation left, waits for every rank, stops the service
    /// thread and leaves the group.
    pub fn finalize(mut self) -> Result<(), DsmError> {
        self.finalized = true;
        let r = self.rt.finalize();
        LIVE.store(false, Ordering::Release);
        r
    }
}

impl Drop for Dsm {
    fn drop(&mut self) {
        if !self.finalized {
            LIVE.store(false, Ordering::Release);
        }
    }
}
