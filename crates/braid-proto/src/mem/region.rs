//! Registered memory: [`Region`], its access rights, remote keys and scatter/gather entries.
//!
//! A region's bytes may be changed by a peer at any moment while remote access is enabled,
//! so safe code never gets a plain `&[u8]` to them: it copies in and out, or uses the
//! atomic view of an aligned word. Raw access is `unsafe` and documented as such.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::Error;
pub use crate::mem::access::Access;
use crate::mem::file::{FileMap, page_size, read_fragile, write_fragile};
use crate::mem::inner::Backing;
use crate::mem::inner::RegionInner;
use crate::mem::registry::Registry;

/// Memory pieces of one frame, as (pointer, length): inline up to two (a small frame's
/// payload, or its placement, is one piece), so that a message allocates no list for them.
pub type Pieces<T> = smallvec::SmallVec<[T; 2]>;

/// What a peer needs to reach a region: its key and its length.
///
/// The key is 48 random bits from the operating system's generator followed by a 16-bit
/// registration generation, so it cannot be guessed and a key never names memory
/// registered after it was revoked. Send it to the peer out of band (for example in a
/// `send`), as the 16 bytes of [`RemoteKey::to_bytes`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteKey {
    /// The key as carried in frame headers.
    pub key: u64,
    /// The region's length in bytes.
    pub len: u64,
}

impl RemoteKey {
    /// Serialised size.
    pub const BYTES: usize = 16;

    /// Little-endian key then length.
    pub fn to_bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.key.to_le_bytes());
        b[8..].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Parses [`RemoteKey::to_bytes`]; `None` when fewer than 16 bytes are given.
    pub fn from_bytes(b: &[u8]) -> Option<RemoteKey> {
        if b.len() < 16 {
            return None;
        }
        Some(RemoteKey {
            key: u64::from_le_bytes(b[..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..16].try_into().ok()?),
        })
    }

    /// The registration generation encoded in the key.
    pub fn generation(&self) -> u16 {
        self.key as u16
    }
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteKey({:#018x}, len {})", self.key, self.len)
    }
}

/// The registration: removes the key when the last [`Region`] handle goes.
struct Registration {
    inner: Arc<RegionInner>,
    registry: Arc<Registry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.remove(self.inner.key);
        self.registry.uncharge(self.inner.len as u64);
        if matches!(self.inner.backing, Backing::Borrowed) {
            // The caller may free the memory as soon as we return: wait for remote operations
            // still placing data. They end when their transfer ends or their endpoint fails.
            let mut pins = self.inner.pins.lock();
            while *pins > 0 {
                self.inner.unpinned.wait(&mut pins);
            }
        }
    }
}

/// Registered memory that local operations use and peers may reach through its
/// [`RemoteKey`]. Cloning is cheap and shares the registration; the registration ends when
/// the last clone (including those held by in-flight operations) is dropped, or at
/// [`Region::deregister`].
#[derive(Clone)]
pub struct Region {
    reg: Arc<Registration>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("len", &self.len())
            .field("access", &self.access())
            .field("key", &self.remote_key())
            .finish()
    }
}

/// Options for `braid::Context::alloc_region_with`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegionOptions {
    /// Back the region with huge pages (`MAP_HUGETLB`); allocation fails if none are free.
    pub huge_pages: bool,
    /// Fault every page in at allocation (`MAP_POPULATE`), as RDMA registration pins memory:
    /// the first transfers into the region then take no page faults (on a benchmark's
    /// 64 MiB target, 16 Ki faults on the receive path).
    pub populate: bool,
}

impl Region {
    /// [`Region::allocate`] with default options: for drivers of a bare [`crate::Session`]
    /// such as simulations.
    pub fn allocate_in(
        registry: &Arc<Registry>,
        len: usize,
        access: Access,
    ) -> Result<Region, Error> {
        Self::allocate(registry, len, access, RegionOptions::default())
    }

    /// Allocates `len` bytes of page-aligned, zeroed memory registered in `registry` with
    /// `access` (what `braid::Context::alloc_region_with` does with its context's registry).
    pub fn allocate(
        registry: &Arc<Registry>,
        len: usize,
        access: Access,
        opts: RegionOptions,
    ) -> Result<Region, Error> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "region length must be at least 1 byte".into(),
            ));
        }
        let page = if opts.huge_pages {
            2 << 20
        } else {
            page_size()
        };
        let map_len = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| Error::InvalidArgument(format!("region length {len} too large")))?;
        registry.charge(len as u64)?;
        // Ordinary pages live in a region file a same-host peer can map (single-copy
        // transfers); huge pages, small regions, or a system without memfds, get private
        // memory.
        if !opts.huge_pages
            && map_len >= crate::mem::shared::MIN_SHARED_LEN
            && let Some(ptr) = crate::mem::shared::map(map_len, opts.populate)
        {
            return Ok(Self::install(
                registry,
                ptr,
                len,
                access,
                Backing::Mapped {
                    map_len,
                    shared: true,
                },
            ));
        }
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        if opts.huge_pages {
            flags |= libc::MAP_HUGETLB;
        }
        if opts.populate {
            flags |= libc::MAP_POPULATE;
        }
        // SAFETY: anonymous mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            registry.uncharge(len as u64);
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        Ok(Self::install(
            registry,
            ptr.cast(),
            len,
            access,
            Backing::Mapped {
                map_len,
                shared: false,
            },
        ))
    }

    /// Registers caller-owned memory in `registry` (what `braid::Context::register` does).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes until the last handle of the
    /// returned region is dropped; while the region exists, peers and the driver may write
    /// the memory at any moment, so the caller must not hold Rust references to it that
    /// assume exclusive or unchanging contents.
    pub unsafe fn register_in(
        registry: &Arc<Registry>,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Region, Error> {
        if ptr.is_null() || len == 0 {
            return Err(Error::InvalidArgument(
                "null or empty memory cannot be registered".into(),
            ));
        }
        registry.charge(len as u64)?;
        Ok(Self::install(registry, ptr, len, access, Backing::Borrowed))
    }

    /// Maps and registers `len` bytes of a regular file from `offset` in `registry` (what
    /// `braid::Context::register_file` does; its documentation has the rules).
    pub fn register_file_in(
        registry: &Arc<Registry>,
        file: impl std::os::fd::AsFd,
        offset: u64,
        len: usize,
        access: Access,
    ) -> Result<Region, Error> {
        if access.contains(Access::REMOTE_ATOMIC) {
            return Err(Error::InvalidArgument(
                "REMOTE_ATOMIC is not available on file regions: an atomic is a load and a \
                 store in user space, which a truncated file page would answer with SIGBUS"
                    .into(),
            ));
        }
        let writable =
            access.contains(Access::LOCAL_WRITE) || access.contains(Access::REMOTE_WRITE);
        let (map, ptr) = crate::mem::file::map_file(file, offset, len, writable)?;
        registry.charge(len as u64)?;
        Ok(Self::install(
            registry,
            ptr,
            len,
            access,
            Backing::File(map),
        ))
    }

    fn install(
        registry: &Arc<Registry>,
        ptr: *mut u8,
        len: usize,
        access: Access,
        backing: Backing,
    ) -> Region {
        let inner = registry.insert_with(|key| {
            Arc::new(RegionInner {
                ptr,
                len,
                access,
                key,
                backing,
                pins: Mutex::new(0),
                unpinned: Condvar::new(),
            })
        });
        Region {
            reg: Arc::new(Registration {
                inner,
                registry: registry.clone(),
            }),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.reg.inner.len
    }

    /// Always false: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The rights granted at registration.
    pub fn access(&self) -> Access {
        self.reg.inner.access
    }

    /// The key and length a peer needs to reach this region.
    pub fn remote_key(&self) -> RemoteKey {
        RemoteKey {
            key: self.reg.inner.key,
            len: self.reg.inner.len as u64,
        }
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), Error> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(Error::OutOfRange {
                offset: offset as u64,
                len: len as u64,
                region_len: self.len() as u64,
            });
        }
        Ok(())
    }

    /// A scatter/gather entry naming `len` bytes at `offset`.
    pub fn slice(&self, offset: usize, len: usize) -> Result<Sge, Error> {
        self.check(offset, len)?;
        Ok(Sge {
            region: self.clone(),
            offset,
            len,
        })
    }

    /// The whole region as one scatter/gather entry.
    /// The address of the region's first byte (as `ibv_mr::addr` in verbs). Peers and the
    /// engine may write the memory at any moment: reach it through raw pointers only, never
    /// a Rust reference (the rule of this module).
    pub fn addr(&self) -> *mut u8 {
        self.reg.inner.ptr_at(0)
    }

    /// The whole region as one scatter-gather entry.
    pub fn as_sge(&self) -> Sge {
        Sge {
            region: self.clone(),
            offset: 0,
            len: self.len(),
        }
    }

    /// Copies `src` into the region at `offset`. If a peer writes the same bytes at the same
    /// time, the result is some mix of both (as with RDMA hardware).
    ///
    /// On a file region the bytes must lie before the file's end ([`Error::PastEndOfFile`]
    /// otherwise; this call never grows the file), and a page truncated during the copy
    /// gives the same error instead of a `SIGBUS`.
    pub fn write_at(&self, offset: usize, src: &[u8]) -> Result<(), Error> {
        self.check(offset, src.len())?;
        let dst = self.reg.inner.ptr_at(offset);
        if let Some(f) = self.reg.inner.file() {
            self.check_file_end(f, offset, src.len())?;
            if !write_fragile(dst, src) {
                return Err(self.past_end(f, offset, src.len()));
            }
            return Ok(());
        }
        // SAFETY: range checked; the region memory is never handed out as a Rust reference.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies bytes at `offset` out into `dst` (see [`Region::write_at`] on concurrency and
    /// on file regions).
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        self.check(offset, dst.len())?;
        let src = self.reg.inner.ptr_at(offset);
        if let Some(f) = self.reg.inner.file() {
            self.check_file_end(f, offset, dst.len())?;
            if read_fragile(src, dst)? < dst.len() {
                return Err(self.past_end(f, offset, dst.len()));
            }
            return Ok(());
        }
        // SAFETY: as in write_at.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn past_end(&self, f: &FileMap, offset: usize, len: usize) -> Error {
        Error::PastEndOfFile {
            offset: offset as u64,
            len: len as u64,
            readable: f.readable_len().unwrap_or(0),
        }
    }

    fn check_file_end(&self, f: &FileMap, offset: usize, len: usize) -> Result<(), Error> {
        if (offset + len) as u64 > f.readable_len()? {
            return Err(self.past_end(f, offset, len));
        }
        Ok(())
    }

    /// Copies `len` bytes at `offset` into a new vector.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, Error> {
        let mut v = vec![0u8; len];
        self.read_at(offset, &mut v)?;
        Ok(v)
    }

    /// Sets `len` bytes at `offset` to `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), Error> {
        self.check(offset, len)?;
        if self.is_file() {
            let block = vec![byte; len.min(64 << 10)];
            let mut off = 0;
            while off < len {
                let n = block.len().min(len - off);
                self.write_at(offset + off, &block[..n])?;
                off += n;
            }
            return Ok(());
        }
        // SAFETY: as in write_at.
        unsafe { std::ptr::write_bytes(self.reg.inner.ptr_at(offset), byte, len) };
        Ok(())
    }

    /// True for a file region (`braid::Context::register_file`).
    pub fn is_file(&self) -> bool {
        self.reg.inner.is_file()
    }

    /// For a file region: the file offset of the region's byte 0.
    pub fn file_offset(&self) -> Option<u64> {
        self.reg.inner.file().map(FileMap::offset)
    }

    /// For a file region: how many of its bytes (from byte 0) lie before the file's end now,
    /// at most [`Region::len`]. Peers can reach only these.
    pub fn file_readable_len(&self) -> Option<Result<u64, Error>> {
        self.reg.inner.file().map(|f| {
            f.readable_len()
                .map(|n| n.min(self.len() as u64))
                .map_err(Error::Io)
        })
    }

    /// The aligned 8-byte word at `offset`, as the atomic that remote atomics also operate on.
    /// Not available on file regions (a truncated page would raise `SIGBUS`).
    pub fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, Error> {
        if self.is_file() {
            return Err(Error::InvalidArgument(
                "atomics are not available on file regions".into(),
            ));
        }
        self.check(offset, 8)?;
        let p = self.reg.inner.ptr_at(offset);
        if !(p as usize).is_multiple_of(8) {
            return Err(Error::InvalidArgument(format!(
                "offset {offset} is not 8-byte aligned"
            )));
        }
        // SAFETY: aligned, in range, and lives as long as &self (the registration holds the memory).
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// Pointer to the first byte.
    ///
    /// # Safety
    /// The memory may be written by peers at any time (if the region grants remote rights)
    /// and by braid while local operations are in flight. The caller must not create
    /// references that assume exclusive or unchanging contents, and must not use the
    /// pointer after the last handle is dropped. On a file region, a load or store to a
    /// page past the file's end (after a truncation) raises `SIGBUS`.
    pub unsafe fn as_mut_ptr(&self) -> *mut u8 {
        self.reg.inner.ptr
    }

    /// Ends the registration now: peers lose access at once, then this call waits up to
    /// `timeout` for remote operations still using the region. On timeout the region is
    /// returned with [`Error::RegionBusy`]: it is no longer reachable by peers, but memory
    /// stays valid until the in-flight operations finish.
    pub fn deregister(self, timeout: Duration) -> Result<(), (Region, Error)> {
        self.reg.registry.remove(self.reg.inner.key);
        let deadline = Instant::now() + timeout;
        let mut pins = self.reg.inner.pins.lock();
        while *pins > 0 {
            if self
                .reg
                .inner
                .unpinned
                .wait_until(&mut pins, deadline)
                .timed_out()
                && *pins > 0
            {
                let n = *pins;
                drop(pins);
                return Err((self, Error::RegionBusy { in_flight: n }));
            }
        }
        Ok(())
    }

    /// True while peers can reach the region.
    pub fn is_registered(&self) -> bool {
        self.reg.registry.contains(self.reg.inner.key)
    }
}

/// A scatter/gather entry: `len` bytes at `offset` of a registered region.
#[derive(Clone, Debug)]
pub struct Sge {
    /// The region.
    pub region: Region,
    /// First byte within the region.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
}

impl Sge {
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.region.reg.inner.ptr_at(self.offset)
    }
}

/// True when any entry names file pages (see [`crate::mem::file`]).
pub(crate) fn sgl_is_fragile(sgl: &[Sge]) -> bool {
    sgl.iter().any(|s| s.region.is_file())
}

/// A remote scatter/gather entry: `len` bytes at `offset` of the peer's region `key`, one
/// piece of the remote side of `braid::Endpoint::write_v` and `braid::Endpoint::read_v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSge {
    /// The peer's region.
    pub key: RemoteKey,
    /// First byte within it.
    pub offset: u64,
    /// Number of bytes (at least 1).
    pub len: u64,
}

impl RemoteSge {
    /// `len` bytes at `offset` of the region `key`.
    pub fn new(key: RemoteKey, offset: u64, len: u64) -> RemoteSge {
        RemoteSge { key, offset, len }
    }
}

impl From<&Region> for Sge {
    fn from(r: &Region) -> Sge {
        r.as_sge()
    }
}

/// Total bytes named by a list of entries.
pub fn sgl_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| s.len as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_in_out_and_bounds() {
        let reg = Arc::new(Registry::default());
        let r = Region::allocate(&reg, 10_000, Access::all(), RegionOptions::default()).unwrap();
        r.write_at(9_996, b"abcd").unwrap();
        assert_eq!(r.to_vec(9_996, 4).unwrap(), b"abcd");
        assert!(matches!(
            r.write_at(9_997, b"abcd"),
            Err(Error::OutOfRange { .. })
        ));
        assert!(r.slice(usize::MAX, 2).is_err());
        assert!(r.atomic_u64(3).is_err());
        r.atomic_u64(8)
            .unwrap()
            .fetch_add(5, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(r.to_vec(8, 8).unwrap(), 5u64.to_le_bytes());
    }

    #[test]
    fn keys_are_distinct_and_revoked() {
        let reg = Arc::new(Registry::default());
        let a = Region::allocate(&reg, 4096, Access::all(), RegionOptions::default()).unwrap();
        let b = Region::allocate(&reg, 4096, Access::all(), RegionOptions::default()).unwrap();
        assert_ne!(a.remote_key().key, b.remote_key().key);
        assert_ne!(a.remote_key().generation(), b.remote_key().generation());
        let k = a.remote_key();
        assert!(reg.lookup(k.key).is_some());
        a.deregister(Duration::from_secs(1)).unwrap();
        assert!(reg.lookup(k.key).is_none());
        let kb = b.remote_key();
        drop(b);
        assert!(reg.lookup(kb.key).is_none());
        assert_eq!(RemoteKey::from_bytes(&k.to_bytes()), Some(k));
    }

    /// Pages resident (per `mincore`) out of those of `r`.
    fn resident_pages(r: &Region) -> usize {
        let page = page_size();
        let pages = r.len().div_ceil(page);
        let mut vec = vec![0u8; pages];
        // SAFETY: the region's mapping is page-aligned and `pages` pages long; vec has one
        // byte per page.
        let rc = unsafe { libc::mincore(r.as_mut_ptr().cast(), pages * page, vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|&&b| b & 1 != 0).count()
    }

    #[test]
    fn populate_makes_every_page_resident() {
        let reg = Arc::new(Registry::default());
        let len = 64 * page_size();
        let lazy = Region::allocate(&reg, len, Access::all(), RegionOptions::default()).unwrap();
        assert_eq!(resident_pages(&lazy), 0);
        let opts = RegionOptions {
            populate: true,
            ..RegionOptions::default()
        };
        let eager = Region::allocate(&reg, len, Access::all(), opts).unwrap();
        assert_eq!(resident_pages(&eager), 64);
    }

    #[test]
    fn deregister_waits_for_pins() {
        let reg = Arc::new(Registry::default());
        let a = Region::allocate(&reg, 4096, Access::all(), RegionOptions::default()).unwrap();
        let pin = reg.lookup(a.remote_key().key).unwrap();
        let (a, err) = a.deregister(Duration::from_millis(20)).unwrap_err();
        assert!(matches!(err, Error::RegionBusy { in_flight: 1 }));
        assert!(!a.is_registered());
        drop(pin);
        a.deregister(Duration::from_secs(1)).unwrap();
    }
}
