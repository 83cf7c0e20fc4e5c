//! Region memory that a peer process on the same host can map.
//!
//! Regions braid allocates live in sealed memfds (`MAP_SHARED`), each with a token that is
//! unique in the process. A same-host rail (the `braid` crate's shared-memory ring) looks a
//! payload's address up here and, instead of copying the bytes through its ring, hands the
//! peer the region's descriptor once and then names the bytes by (token, offset): the peer
//! copies them straight from its own mapping of the file into their destination, after its
//! protection checks, so they move once. The files are sealed against shrinking, so a peer's
//! mapping can never fault.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

/// A mapped region file.
struct Entry {
    len: usize,
    fd: Arc<OwnedFd>,
    token: u64,
}

/// The mapped region files, by address, and the tokens of those still mapped.
#[derive(Default)]
struct Index {
    by_addr: BTreeMap<usize, Entry>,
    live: HashSet<u64>,
}

fn index() -> &'static RwLock<Index> {
    static INDEX: OnceLock<RwLock<Index>> = OnceLock::new();
    INDEX.get_or_init(|| RwLock::new(Index::default()))
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// Where a span of memory lies in a shareable region file.
#[derive(Clone)]
pub struct SharedSpan {
    /// The region's file (sealed: its size never changes).
    pub fd: Arc<OwnedFd>,
    /// Names the file in this process, for as long as it lives.
    pub token: u64,
    /// The file's size.
    pub file_len: u64,
    /// Where the span starts in the file.
    pub offset: u64,
}

/// The shareable region file holding all of `[ptr, ptr + len)`, if any.
pub fn lookup(ptr: *const u8, len: usize) -> Option<SharedSpan> {
    let addr = ptr as usize;
    let idx = index().read();
    let (&start, e) = idx.by_addr.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + e.len).then(|| SharedSpan {
        fd: e.fd.clone(),
        token: e.token,
        file_len: e.len as u64,
        offset: (addr - start) as u64,
    })
}

/// Regions smaller than this stay private memory: each region file holds a descriptor, and
/// small regions carry small payloads, which cross a same-host ring inline anyway.
pub(crate) const MIN_SHARED_LEN: usize = 64 << 10;

/// Raises the soft limit on open descriptors to the hard one, once: every region file holds
/// a descriptor (Go's runtime does the same at start).
fn raise_fd_limit() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: reading and setting this process's own limit with a valid struct.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
                l.rlim_cur = l.rlim_max;
                libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            }
        }
    });
}

/// Maps `len` bytes (a multiple of the page size) of a new sealed memfd, read-write and
/// shared, and makes them known to [`lookup`]. `None` when memfds are unavailable (the
/// caller then maps private anonymous memory).
pub(crate) fn map(len: usize, populate: bool) -> Option<*mut u8> {
    raise_fd_limit();
    let fail = |what: &str| {
        tracing::debug!(
            "region memory is not shareable ({what}: {})",
            io::Error::last_os_error()
        );
        None
    };
    // SAFETY: a constant NUL-terminated name and valid flags.
    let raw = unsafe {
        libc::memfd_create(
            c"braid-region".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return fail("memfd_create");
    }
    // SAFETY: a descriptor just returned to us, owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    use std::os::fd::AsRawFd;
    // SAFETY: plain system calls on our own descriptor.
    let sized = unsafe {
        libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) == 0
            && libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            ) == 0
    };
    if !sized {
        return fail("sizing and sealing the memfd");
    }
    let mut flags = libc::MAP_SHARED;
    if populate {
        flags |= libc::MAP_POPULATE;
    }
    // SAFETY: a new shared mapping of a file of exactly `len` bytes; the result is checked.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return fail("mmap");
    }
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let mut idx = index().write();
    idx.live.insert(token);
    idx.by_addr.insert(
        ptr as usize,
        Entry {
            len,
            fd: Arc::new(fd),
            token,
        },
    );
    Some(ptr.cast())
}

/// Forgets the region file mapped at `ptr` (before it is unmapped): no span of it is
/// handed to a peer any more.
pub(crate) fn forget(ptr: *mut u8) {
    let mut idx = index().write();
    if let Some(e) = idx.by_addr.remove(&(ptr as usize)) {
        idx.live.remove(&e.token);
    }
}

/// True while the region file `token` is mapped here (its region not yet freed): a peer
/// that was given it may drop its own mapping once it is not.
pub fn is_live(token: u64) -> bool {
    index().read().live.contains(&token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_found_inside_their_file_only() {
        let len = 64 << 10;
        let p = map(len, false).expect("memfds work here");
        let s = lookup(p, len).expect("the whole file");
        assert_eq!((s.offset, s.file_len), (0, len as u64));
        // SAFETY: offsets inside the mapping.
        let s = lookup(unsafe { p.add(4096) }, 100).expect("inside");
        assert_eq!(s.offset, 4096);
        assert!(
            lookup(unsafe { p.add(4096) }, len).is_none(),
            "past the end"
        );
        assert!(lookup(unsafe { p.add(len) }, 1).is_none(), "after the file");
        let other = lookup(p, 1).expect("again");
        assert_eq!(other.token, s.token);
        assert!(is_live(s.token));
        forget(p);
        assert!(lookup(p, 1).is_none());
        assert!(!is_live(s.token));
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(p.cast(), len) };
    }
}
