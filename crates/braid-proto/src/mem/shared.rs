//! Region memory that a peer process on the same host can map.
//!
//! Regions braid allocates live in sealed memfds (`MAP_SHARED`), each with a token that is
//! unique in the process. A same-host rail (the `braid` crate's shared-memory ring) looks a
//! payload's address up here and, instead of copying the bytes through its ring, hands the
//! peer the region's descriptor once and then names the bytes by (token, offset): the peer
//! copies them straight from its own mapping of the file into their destination, after its
//! protection checks, so they move once. The files are sealed against shrinking, so a peer's
//! mapping can never fault, and against writes through any mapping made after the region's
//! own, so a peer that holds the descriptor cannot change the region behind its protection
//! checks.
//!
//! **Page exchange** ([`exchange_span`], [`adopt`]): a page-aligned span can instead be
//! *frozen*: its pages are remapped copy-on-write (`MAP_PRIVATE`) over the same file pages,
//! so no mapping can write those file pages any more, and a peer maps them copy-on-write at
//! the destination instead of copying them. Both sides then see the bytes of the moment of
//! the freeze until each writes its own copy of a page (the kernel copies that one page), as
//! if the bytes had been copied. A frozen span no longer matches its region file (its
//! writes go to private pages), so the plain [`lookup`] refuses it. [`exchange_span`] finds
//! out from `/proc/self/pagemap` whether it was written since; if so, its bytes move to a
//! new file (one copy, on the sending side), which the region then maps shared and writes
//! in place, and the span goes by single copy from then on.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;

/// The page size page exchange works in.
pub const PAGE: usize = 4096;

/// A span of a region that no longer lies in the region's own file.
struct Moved {
    len: usize,
    file: SharedSpan,
    /// Frozen: copy-on-write pages of a file that nothing writes any more (exchanged).
    /// Otherwise the span is a shared mapping of `file`, written in place (its bytes were
    /// written after an exchange, so they moved to a file of their own).
    frozen: bool,
}

/// A mapped region file.
struct Entry {
    len: usize,
    fd: Arc<OwnedFd>,
    token: u64,
    /// Spans on other files or frozen, by offset in the region.
    moved: BTreeMap<usize, Moved>,
}

/// The mapped region files, by address, and the tokens of the files still in use (region
/// files, and the files behind moved spans).
#[derive(Default)]
struct Index {
    by_addr: BTreeMap<usize, Entry>,
    live: HashSet<u64>,
    /// Moved spans of all regions: each is a mapping of its own.
    moved: usize,
}

/// Most moved spans at once: each is a mapping, and a process has at most
/// `vm.max_map_count` (65530 by default) for everything it maps.
const MAX_MOVED: usize = 16 << 10;

fn index() -> &'static RwLock<Index> {
    static INDEX: OnceLock<RwLock<Index>> = OnceLock::new();
    INDEX.get_or_init(|| RwLock::new(Index::default()))
}

static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn next_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// Where a span of memory lies in a shareable file.
#[derive(Clone)]
pub struct SharedSpan {
    /// The file (sealed: its size never changes).
    pub fd: Arc<OwnedFd>,
    /// Names the file in this process, for as long as it lives.
    pub token: u64,
    /// The file's size.
    pub file_len: u64,
    /// Where the span starts in the file.
    pub offset: u64,
}

impl SharedSpan {
    fn at(&self, skip: usize) -> SharedSpan {
        SharedSpan {
            offset: self.offset + skip as u64,
            ..self.clone()
        }
    }
}

/// The region entry holding all of `[addr, addr + len)`, and the offset there.
fn entry_of(idx: &Index, addr: usize, len: usize) -> Option<(usize, usize)> {
    let (&start, e) = idx.by_addr.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + e.len).then_some((start, addr - start))
}

/// True when any moved span of `e` overlaps `[off, off + len)`.
fn overlaps_moved(e: &Entry, off: usize, len: usize) -> bool {
    let before = e.moved.range(..off + len).next_back();
    before.is_some_and(|(&s, m)| s + m.len > off)
}

/// True when every moved span of `e` that overlaps `[off, off + len)` is frozen in place:
/// on the region's own file, at its own offset.
fn frozen_in_place(e: &Entry, off: usize, len: usize) -> bool {
    e.moved
        .range(..off + len)
        .filter(|(s, m)| **s + m.len > off)
        .all(|(s, m)| m.frozen && m.file.token == e.token && m.file.offset == *s as u64)
}

/// The moved span of `e` holding all of `[off, off + len)`, as (span there, frozen).
fn moved_holder(e: &Entry, off: usize, len: usize) -> Option<(SharedSpan, bool)> {
    e.moved
        .range(..=off)
        .next_back()
        .filter(|(s, m)| **s + m.len >= off + len)
        .map(|(s, m)| (m.file.at(off - *s), m.frozen))
}

/// The file holding the bytes of all of `[ptr, ptr + len)` as they are now, if any: the
/// region's, or the one they moved to. A span on frozen pages has the region's file only
/// while it is frozen in place and not written since (`/proc/self/pagemap`); a span on a
/// peer's adopted pages has none.
pub fn lookup(ptr: *const u8, len: usize) -> Option<SharedSpan> {
    let idx = index().read();
    let (start, off) = entry_of(&idx, ptr as usize, len)?;
    let e = &idx.by_addr[&start];
    if !overlaps_moved(e, off, len) {
        return Some(SharedSpan {
            fd: e.fd.clone(),
            token: e.token,
            file_len: e.len as u64,
            offset: off as u64,
        });
    }
    match moved_holder(e, off, len) {
        Some((span, false)) => Some(span),
        // Frozen in place: the region's file still holds the bytes of pages not written
        // since (a piece cut differently from the exchanged ones, say).
        _ if frozen_in_place(e, off, len) => {
            let addr = ptr as usize;
            let from = addr & !(PAGE - 1);
            let to = (addr + len).next_multiple_of(PAGE);
            untouched(from, to - from)
                .unwrap_or(false)
                .then(|| SharedSpan {
                    fd: e.fd.clone(),
                    token: e.token,
                    file_len: e.len as u64,
                    offset: off as u64,
                })
        }
        _ => None,
    }
}

/// Regions smaller than this stay private memory: each region file holds a descriptor, and
/// small regions carry small payloads, which cross a same-host ring inline anyway.
pub(crate) const MIN_SHARED_LEN: usize = 64 << 10;

/// Raises the soft limit on open descriptors to the hard one, once: every region file holds
/// a descriptor, and every connection a listener holds (Go's runtime does the same at start).
pub fn raise_fd_limit() {
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

/// A new memfd of `len` bytes, sealed against resizing.
fn sized_memfd(len: usize) -> io::Result<OwnedFd> {
    // SAFETY: a constant NUL-terminated name and valid flags.
    let raw = unsafe {
        libc::memfd_create(
            c"braid-region".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned to us, owned from here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain system calls on our own descriptor.
    let sized = unsafe {
        libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) == 0
            && libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            ) == 0
    };
    if !sized {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Seals `fd` against writes through mappings made from now on and against further seals.
fn seal_writes(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: a plain system call on our own descriptor.
    let r = unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SEAL,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `len` bytes of `fd` from `offset` at `addr`, in place of what was there:
/// copy-on-write, or shared when `shared`.
///
/// SAFETY: `[addr, addr + len)` is page-aligned memory of a region this module knows, and
/// nothing holds a reference into it across the call (its bytes may change, as under a
/// copy).
unsafe fn map_at(
    addr: usize,
    len: usize,
    fd: &OwnedFd,
    offset: u64,
    shared: bool,
) -> io::Result<()> {
    let kind = if shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    // SAFETY: per the contract; MAP_FIXED replaces the pages of our own region only.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            kind | libc::MAP_FIXED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `len` bytes (a multiple of the page size) of a new sealed memfd, read-write and
/// shared, and makes them known to [`lookup`]. `None` when memfds are unavailable (the
/// caller then maps private anonymous memory).
pub(crate) fn map(len: usize, populate: bool) -> Option<*mut u8> {
    raise_fd_limit();
    let fail = |what: &str, e: io::Error| {
        tracing::debug!("region memory is not shareable ({what}: {e})");
        None
    };
    let fd = match sized_memfd(len) {
        Ok(fd) => fd,
        Err(e) => return fail("a sized memfd", e),
    };
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
        return fail("mmap", io::Error::last_os_error());
    }
    // Only this mapping writes the file: a peer given the descriptor cannot map it writable.
    if let Err(e) = seal_writes(&fd) {
        // SAFETY: unmapping what was just mapped.
        unsafe { libc::munmap(ptr, len) };
        return fail("sealing the memfd against writes", e);
    }
    let token = next_token();
    let mut idx = index().write();
    idx.live.insert(token);
    idx.by_addr.insert(
        ptr as usize,
        Entry {
            len,
            fd: Arc::new(fd),
            token,
            moved: BTreeMap::new(),
        },
    );
    Some(ptr.cast())
}

/// Forgets the region file mapped at `ptr` (before it is unmapped): no span of it is
/// handed to a peer any more.
pub(crate) fn forget(ptr: *mut u8) {
    let mut idx = index().write();
    if let Some(e) = idx.by_addr.remove(&(ptr as usize)) {
        idx.moved -= e.moved.len();
        idx.live.remove(&e.token);
        for m in e.moved.values() {
            idx.live.remove(&m.file.token);
        }
    }
}

/// True while the file `token` is in use here (its region not yet freed, or a moved span
/// still on it): a peer that was given it may drop its own mapping once it is not.
pub fn is_live(token: u64) -> bool {
    index().read().live.contains(&token)
}

/// Records `[off, off + len)` of `e` as moved to `file` (`frozen` or not), cutting the
/// moved spans it overlaps; the tokens of files no span uses any more leave `live`.
/// Returns the count of moved spans after, less before.
fn set_moved(
    live: &mut HashSet<u64>,
    e: &mut Entry,
    (off, len): (usize, usize),
    file: SharedSpan,
    frozen: bool,
) -> isize {
    let before = e.moved.len() as isize;
    let end = off + len;
    let cut: Vec<usize> = e
        .moved
        .range(..end)
        .filter(|(s, m)| **s + m.len > off)
        .map(|(s, _)| *s)
        .collect();
    let mut dropped = Vec::new();
    for s in cut {
        let m = e.moved.remove(&s).expect("listed");
        if s < off {
            let head = Moved {
                len: off - s,
                file: m.file.clone(),
                frozen: m.frozen,
            };
            e.moved.insert(s, head);
        }
        if s + m.len > end {
            let tail = Moved {
                len: s + m.len - end,
                file: m.file.at(end - s),
                frozen: m.frozen,
            };
            e.moved.insert(end, tail);
        }
        dropped.push(m.file.token);
    }
    if file.token != e.token {
        live.insert(file.token);
    }
    e.moved.insert(off, Moved { len, file, frozen });
    for t in dropped {
        let used = t == e.token || e.moved.values().any(|m| m.file.token == t);
        if !used {
            live.remove(&t);
        }
    }
    e.moved.len() as isize - before
}

/// True when no page of `[addr, addr + len)` (page-aligned) was written since it was
/// mapped copy-on-write: every page is still the file's, or not faulted in yet.
fn untouched(addr: usize, len: usize) -> io::Result<bool> {
    use std::os::unix::fs::FileExt;
    static PAGEMAP: OnceLock<io::Result<std::fs::File>> = OnceLock::new();
    let f = PAGEMAP
        .get_or_init(|| std::fs::File::open("/proc/self/pagemap"))
        .as_ref()
        .map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const FILE_OR_SHARED: u64 = 1 << 61;
    let mut buf = [0u8; 8 * 512];
    let pages = len / PAGE;
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(512);
        let at = ((addr / PAGE + done) * 8) as u64;
        f.read_exact_at(&mut buf[..n * 8], at)?;
        for e in buf[..n * 8].chunks_exact(8) {
            let v = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            if v & SWAPPED != 0 || (v & PRESENT != 0 && v & FILE_OR_SHARED == 0) {
                return Ok(false);
            }
        }
        done += n;
    }
    Ok(true)
}

/// A frozen file span holding the bytes of `[ptr, ptr + len)` now, which a same-host peer
/// may map copy-on-write instead of copying ([`adopt`]); `None` when the span is not
/// page-aligned whole pages of one region, when freezing failed, or when its bytes were
/// written since its last exchange (the caller then sends it by [`lookup`]: one copy).
///
/// The first time, the span's pages are remapped copy-on-write over its region file in
/// place. A span still frozen and not written since is handed out as it is. A span written
/// since (each page's first write paid a copy-on-write) moves to a new file of its own,
/// mapped shared and written in place from then on (one copy of its bytes, once): a buffer
/// rewritten between sends then goes by single copy, without a copy-on-write per page and
/// send.
///
/// Nothing may hold a reference into the span across the call (its pages are remapped; the
/// bytes stay the same).
pub fn exchange_span(ptr: *const u8, len: usize) -> Option<SharedSpan> {
    let addr = ptr as usize;
    if len == 0 || !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
        return None;
    }
    let mut guard = index().write();
    let idx = &mut *guard;
    let (start, off) = entry_of(idx, addr, len)?;
    let full = idx.moved >= MAX_MOVED;
    let e = idx.by_addr.get_mut(&start).expect("found");
    let change = match moved_holder(e, off, len) {
        // Written in place since its bytes moved: a plain reference.
        Some((_, false)) => return None,
        // Still the frozen file's bytes: hand them out again.
        Some((span, true)) if untouched(addr, len).unwrap_or(false) => return Some(span),
        None if full => return None,
        // Not moved, or only frozen in place and untouched since (a span cut differently
        // the last time: a lone operation's shares over several rails vary): freeze it all
        // in place, as one span.
        None if frozen_in_place(e, off, len)
            && (!overlaps_moved(e, off, len) || untouched(addr, len).unwrap_or(false)) =>
        {
            let span = SharedSpan {
                fd: e.fd.clone(),
                token: e.token,
                file_len: e.len as u64,
                offset: off as u64,
            };
            // SAFETY: whole pages of this region; the file holds exactly their bytes.
            if let Err(err) = unsafe { map_at(addr, len, &e.fd, off as u64, false) } {
                tracing::debug!("a span could not be frozen for page exchange: {err}");
                return None;
            }
            let change = set_moved(&mut idx.live, e, (off, len), span.clone(), true);
            idx.moved = idx.moved.saturating_add_signed(change);
            return Some(span);
        }
        _ => match rehome(addr, len) {
            Ok(span) => set_moved(&mut idx.live, e, (off, len), span, false),
            Err(err) => {
                tracing::debug!("written frozen pages could not move: {err}");
                0
            }
        },
    };
    idx.moved = idx.moved.saturating_add_signed(change);
    None
}

/// Moves the bytes of `[addr, addr + len)` to a new sealed file and maps that file shared
/// in their place.
fn rehome(addr: usize, len: usize) -> io::Result<SharedSpan> {
    let fd = sized_memfd(len)?;
    let mut done = 0;
    while done < len {
        // SAFETY: the span is mapped memory of a region (the caller checked); the kernel
        // reads it.
        let n = unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                (addr + done) as *const libc::c_void,
                len - done,
                done as libc::off_t,
            )
        };
        if n <= 0 {
            let e = io::Error::last_os_error();
            if n < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    // SAFETY: whole pages of a region; the new file holds exactly their bytes.
    unsafe { map_at(addr, len, &fd, 0, true)? };
    // As a region file: only the region's own mapping writes it.
    seal_writes(&fd)?;
    Ok(SharedSpan {
        fd: Arc::new(fd),
        token: next_token(),
        file_len: len as u64,
        offset: 0,
    })
}

/// Maps `len` bytes of a peer's frozen `file` span copy-on-write at `dest` instead of
/// copying them there; false (nothing changed) unless `dest` and `len` are whole pages of
/// one of this process's regions and the mapping succeeded. The pages `dest` had stay in
/// its region file, unused, until the region is freed.
///
/// The caller owns `[dest, dest + len)` as the destination of a copy would be.
pub fn adopt(dest: *mut u8, len: usize, file: &SharedSpan) -> bool {
    let addr = dest as usize;
    if len == 0
        || !addr.is_multiple_of(PAGE)
        || !len.is_multiple_of(PAGE)
        || !file.offset.is_multiple_of(PAGE as u64)
        || file
            .offset
            .checked_add(len as u64)
            .is_none_or(|e| e > file.file_len)
    {
        return false;
    }
    let mut guard = index().write();
    let idx = &mut *guard;
    let Some((start, off)) = entry_of(idx, addr, len) else {
        return false;
    };
    if idx.moved >= MAX_MOVED {
        return false;
    }
    // SAFETY: whole pages of one of our regions, owned by the caller as a copy's
    // destination; the file is sealed against shrinking, so the mapping cannot fault.
    if let Err(err) = unsafe { map_at(addr, len, &file.fd, file.offset, false) } {
        tracing::debug!("a peer's pages could not be mapped in place: {err}");
        return false;
    }
    let e = idx.by_addr.get_mut(&start).expect("found");
    let ours = SharedSpan {
        token: next_token(),
        ..file.clone()
    };
    let change = set_moved(&mut idx.live, e, (off, len), ours, true);
    idx.moved = idx.moved.saturating_add_signed(change);
    true
}

#[cfg(test)]
mod tests;
