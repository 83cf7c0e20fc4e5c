//! The shared file of a same-host rail: its layout, the mapping, and one direction's ring
//! of bytes with the copies in and out of it.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Bytes of each direction's data area: headers, small payloads and memory that is not in a
/// region file cross it; large payloads in region files go by reference and take 24 bytes.
pub(crate) const DEFAULT_RING_BYTES: usize = 1 << 20;
/// Bounds on a ring's data area (a peer's memfd outside them is refused).
pub(super) const MIN_RING_BYTES: usize = 64 << 10;
const MAX_RING_BYTES: usize = 256 << 20;
/// The control page: both directions' cursors and flags.
pub(super) const CTRL_BYTES: usize = 4096;
/// Where each direction's control block starts in the control page.
const CTRL_OFFSET: [usize; 2] = [0, 1024];
/// Marks a ring's control page ("braidshm", version 3: express answers, and a record's tag
/// published on its own, with a zero tag always after the last record).
const RING_MAGIC: u64 = u64::from_le_bytes(*b"braidsh3");
/// Answers to express requests kept apart: the producer has at most this many unanswered.
pub(super) const EXPRESS_SLOTS: usize = braid_proto::EXPRESS_WINDOW;

/// One direction's control block. The cursors sit on lines of their own: the producer
/// writes one, the consumer the other.
#[repr(C)]
pub(super) struct Ctrl {
    magic: AtomicU64,
    _pad0: [u8; 120],
    /// Ring bytes ever written (the producer's).
    pub(super) head: AtomicU64,
    /// Stream bytes ever written: inline bytes, and bytes named by reference.
    pub(super) stream_head: AtomicU64,
    _pad1: [u8; 112],
    /// Ring bytes ever read (the consumer's).
    pub(super) tail: AtomicU64,
    /// Stream bytes ever read.
    pub(super) stream_tail: AtomicU64,
    _pad2: [u8; 112],
    /// The consumer sleeps: the producer rings once `want` stream bytes wait.
    pub(super) reader_armed: AtomicU32,
    /// The producer waits for room: the consumer rings once it has read anything.
    pub(super) writer_armed: AtomicU32,
    pub(super) want: AtomicU64,
    _pad3: [u8; 112],
    /// Express requests executed (the consumer's): answered, in order.
    pub(super) express_done: AtomicU64,
    /// The status of express request `k` (a `WireStatus`) at `k % EXPRESS_SLOTS`, written
    /// before `express_done` passes `k`.
    pub(super) express_status: [AtomicU8; EXPRESS_SLOTS],
}

const _: () = assert!(std::mem::size_of::<Ctrl>() <= 1024);
// The consumer's answers sit on a line of their own.
const _: () = assert!(std::mem::offset_of!(Ctrl, express_done) == 512);

/// Which end of the pair this process is: the connecting side writes direction 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Connector,
    Acceptor,
}

/// A mapping of the shared file, unmapped on drop.
pub(super) struct Mapping {
    pub(super) base: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or copies
// bounded by the ring's size.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_shared` with this length; nothing refers to it any more.
        unsafe {
            let _ = rustix::mm::munmap(self.base.cast(), self.len);
        }
    }
}

/// Maps `len` bytes of `fd`, shared; writable unless `read_only`.
pub(super) fn map_shared(fd: &OwnedFd, len: usize, read_only: bool) -> io::Result<Mapping> {
    // SAFETY: a fresh shared mapping of a file at least `len` long (sealed against
    // shrinking), placed where the kernel chooses.
    let base = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            if read_only {
                ProtFlags::READ
            } else {
                ProtFlags::READ | ProtFlags::WRITE
            },
            MapFlags::SHARED,
            fd,
            0,
        )?
    };
    Ok(Mapping {
        base: base.cast(),
        len,
    })
}

/// A ring's shared memory, created by the connecting side: the file to pass to the peer,
/// and this side's mapping.
pub(crate) struct RingFile {
    fd: OwnedFd,
    pub(super) map: Mapping,
    pub(super) ring_bytes: usize,
}

impl RingFile {
    /// Creates and maps a sealed memfd for two rings of `ring_bytes` (a power of two).
    pub(crate) fn create(ring_bytes: usize) -> io::Result<RingFile> {
        if !ring_bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a ring holds a power of two of 64 KiB to 256 MiB, not {ring_bytes}"),
            ));
        }
        let fd = rustix::fs::memfd_create(
            "braid-shm-rail",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let len = CTRL_BYTES + 2 * ring_bytes;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // Neither side can shrink the file under the other's mapping (a fault there would
        // be SIGBUS), nor change that.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = map_shared(&fd, len, false)?;
        for off in CTRL_OFFSET {
            // SAFETY: the control page is mapped and large enough (asserted above).
            unsafe { &*(map.base.add(off) as *const Ctrl) }
                .magic
                .store(RING_MAGIC, Ordering::Release);
        }
        Ok(RingFile {
            fd,
            map,
            ring_bytes,
        })
    }

    /// Maps a ring file received from the connecting side, after checking its size, its
    /// seals and its marks.
    pub(crate) fn open(fd: OwnedFd) -> io::Result<RingFile> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::SEAL) {
            return Err(bad(
                "the peer's ring file is not sealed against shrinking".into()
            ));
        }
        let len = rustix::fs::fstat(&fd)?.st_size as usize;
        let ring_bytes = len.saturating_sub(CTRL_BYTES) / 2;
        if len != CTRL_BYTES + 2 * ring_bytes
            || !ring_bytes.is_power_of_two()
            || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(bad(format!(
                "the peer's ring file has a bad size ({len} bytes)"
            )));
        }
        let map = map_shared(&fd, len, false)?;
        for off in CTRL_OFFSET {
            // SAFETY: as in `create`.
            let magic = unsafe { &*(map.base.add(off) as *const Ctrl) }
                .magic
                .load(Ordering::Acquire);
            if magic != RING_MAGIC {
                return Err(bad("the peer's ring file is not a braid ring".into()));
            }
        }
        Ok(RingFile {
            fd,
            map,
            ring_bytes,
        })
    }

    /// The descriptor to hand to the peer.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

/// One direction as this side sees it.
pub(super) struct Ring {
    ctrl: *const Ctrl,
    data: *mut u8,
    mask: u64,
}

impl Ring {
    pub(super) fn new(map: &Mapping, ring_bytes: usize, dir: usize) -> Ring {
        // SAFETY: offsets inside the mapping, sized by `RingFile`.
        unsafe {
            Ring {
                ctrl: map.base.add(CTRL_OFFSET[dir]).cast(),
                data: map.base.add(CTRL_BYTES + dir * ring_bytes),
                mask: ring_bytes as u64 - 1,
            }
        }
    }

    pub(super) fn ctrl(&self) -> &Ctrl {
        // SAFETY: points into the mapping, which lives as long as the link.
        unsafe { &*self.ctrl }
    }

    pub(super) fn cap(&self) -> u64 {
        self.mask + 1
    }

    /// Bytes between the cursors, checked: a peer that moved its cursor past the other
    /// (or backwards) has broken the ring.
    pub(super) fn used(&self, head: u64, tail: u64) -> io::Result<u64> {
        let used = head.wrapping_sub(tail);
        if used > self.cap() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer broke the shared ring (cursors {head} and {tail})"),
            ));
        }
        Ok(used)
    }

    /// Free bytes for records after `head`: one byte of the area is kept free, for the zero
    /// tag that follows the last record (see [`Ring::end_records`]).
    pub(super) fn free(&self, head: u64, tail: u64) -> io::Result<u64> {
        Ok((self.cap() - 1).saturating_sub(self.used(head, tail)?))
    }

    /// The byte at ring position `at`, as an atomic: record tags are read and written
    /// through it while the other side may be at the same place.
    fn tag_cell(&self, at: u64) -> &AtomicU8 {
        // SAFETY: inside the data area, which lives as long as the ring; any alignment
        // suits a byte.
        unsafe { AtomicU8::from_ptr(self.data.add((at & self.mask) as usize)) }
    }

    /// The tag of the record at `at`, read with acquire ordering: an express record's tag is
    /// stored last (release), so seeing it means its bytes are there.
    pub(super) fn tag(&self, at: u64) -> u8 {
        self.tag_cell(at).load(Ordering::Acquire)
    }

    /// Publishes an express record written at `at` with its tag still zero.
    pub(super) fn publish_tag(&self, at: u64, tag: u8) {
        self.tag_cell(at).store(tag, Ordering::Release);
    }

    /// Marks `at`, where the next record will start, as no record yet (a zero tag), before
    /// the records up to it are published: a reader that reaches `at` then never mistakes
    /// the byte left there by an earlier lap for a tag. `at` is free space (see
    /// [`Ring::free`]).
    pub(super) fn end_records(&self, at: u64) {
        self.tag_cell(at).store(0, Ordering::Relaxed);
    }

    /// Where `len` bytes at stream position `at` lie in the data area: up to its end, then
    /// from its start (`len` at most the ring's size).
    pub(super) fn segments(&self, at: u64, len: usize) -> [(*const u8, usize); 2] {
        let off = (at & self.mask) as usize;
        let first = len.min(self.cap() as usize - off);
        // SAFETY: `off` is inside the data area.
        [
            (unsafe { self.data.add(off) }, first),
            (self.data, len - first),
        ]
    }

    /// Copies `len` bytes between `buf` and the ring at stream position `at` (wrapping);
    /// into the ring when `into_ring`. With `checked`, `buf` may be file pages a truncation
    /// took away: the copy goes through the kernel and stops at such a page. Returns the
    /// bytes copied (`len` unless a page stopped it).
    ///
    /// SAFETY: `buf` is valid for `len` bytes (but for truncated file pages when
    /// `checked`), and `len` does not exceed the ring's size.
    pub(super) unsafe fn copy(
        &self,
        at: u64,
        buf: *mut u8,
        len: usize,
        into_ring: bool,
        checked: bool,
    ) -> usize {
        let off = (at & self.mask) as usize;
        let first = len.min(self.cap() as usize - off);
        let mut done = 0;
        // SAFETY: `off + first` and `len - first` stay within the data area.
        for (ring, n) in unsafe { [(self.data.add(off), first), (self.data, len - first)] } {
            // SAFETY: `done + n <= len`.
            let b = unsafe { buf.add(done) };
            let (src, dst) = if into_ring {
                (b as *const u8, ring)
            } else {
                (ring as *const u8, b)
            };
            let got = if checked {
                // SAFETY: as the function's contract; the kernel checks the file pages.
                unsafe { braid_proto::mem::file::copy_checked(src, dst, n) }
            } else {
                // SAFETY: both valid for `n` bytes, and distinct memory.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
                n
            };
            done += got;
            if got < n {
                break;
            }
        }
        done
    }
}
