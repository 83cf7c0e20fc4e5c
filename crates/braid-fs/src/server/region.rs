//! File pages registered as braid regions: the server side of the one-sided data path.
//!
//! A file is mapped `MAP_SHARED`, so its registered pages are the page cache itself: a
//! client's RMA read is sent from the server's page cache, and its RMA write lands in it
//! (and reaches the disk on `fsync`). One registration per file and access kind is shared
//! by every client that has the file open; it ends when the last handle is released.
//!
//! A registration covers a capacity of at least the file's size (a power of two; if
//! writable, 16 times that and at least 4 GiB), so a file can grow through `MapRegion`
//! without a new registration each time; a file that outgrows it gets a larger one (a new
//! key and generation, which `MapRegion` returns). braid checks every remote access
//! against the file's size when it executes: bytes past the end (a file truncated by
//! anyone, on this host or through the service) are a remote access error at the client,
//! never a `SIGBUS` in the server.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use braid::{Access, Context, Region};

use super::jobs::Job;
use super::limits::warn_limited;
use super::writeback::{LAG, STEP};
use crate::proto::{Errno, RegionInfo};

/// One registration of a file's pages (`Context::register_file`): dropping it revokes the
/// key, after remote operations still using it have finished.
pub(crate) struct FileRegion {
    region: Region,
    pub(crate) info: RegionInfo,
}

impl FileRegion {
    /// Drops this process's page-table entries for `[from, to)` of the file (clipped to the
    /// registration); the pages and their dirty data stay in the page cache. The kernel's
    /// writeback write-protects every mapped dirty page before writing it, which on a
    /// process running on several CPUs costs a TLB shootdown (an inter-processor interrupt)
    /// per page; with no mapping left there is nothing to write-protect, and dropping the
    /// entries costs one shootdown for the whole range. A later remote write there faults
    /// the page back in.
    pub(crate) fn unmap_pages(&self, from: u64, to: u64) {
        let page = rustix::param::page_size() as u64;
        let start = from.next_multiple_of(page);
        let end = (to.min(self.info.len) / page) * page;
        if end <= start {
            return;
        }
        // SAFETY: [start, end) lies inside the registration's mapping; MADV_DONTNEED on a
        // shared file mapping only drops page-table entries (the data stays in the page
        // cache, dirty pages keep their dirty state), and a concurrent access faults the
        // page back in: nothing is read or written from user space here.
        let res = unsafe {
            rustix::mm::madvise(
                self.region.as_mut_ptr().add(start as usize).cast(),
                (end - start) as usize,
                rustix::mm::Advice::LinuxDontNeed,
            )
        };
        if let Err(e) = res {
            tracing::debug!("dropping the mapping of file pages {start}..{end}: {e}");
        }
    }

    /// Registers `len` bytes of the file open as `fd` from offset 0; `writable` grants
    /// remote writes (then `fd` must be open read-write).
    pub(crate) fn register(
        ctx: &Context,
        fd: BorrowedFd<'_>,
        len: u64,
        writable: bool,
        generation: u64,
    ) -> Result<FileRegion, Errno> {
        let len_usize = usize::try_from(len).map_err(|_| Errno::EFBIG)?;
        let access = if writable {
            Access::REMOTE_READ | Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let region = ctx.register_file(fd, 0, len_usize, access).map_err(|e| {
            warn_limited!("registering a file region of {len} bytes failed: {e}");
            match e {
                braid::Error::Io(io) => Errno::from(io),
                braid::Error::InvalidArgument(_) => Errno::EINVAL,
                _ => Errno::ENOMEM,
            }
        })?;
        let key = region.remote_key();
        Ok(FileRegion {
            region,
            info: RegionInfo {
                key: key.key,
                len: key.len,
                generation,
                writable,
            },
        })
    }
}

/// Bytes faulted in per system call when populating a grown range (about 1 ms here).
const POPULATE_PIECE: usize = 1 << 20;

/// Smallest registration: a new file's first writes need no new registration.
const MIN_CAPACITY: u64 = 1 << 20;

/// A writable registration covers this many times the file's size: the part past the end
/// of the file is address space only (never touched: braid checks each access against the
/// file's size), and a file being written grows into it without new registrations. Each
/// new registration of a file written at the line rate cost a dip of 100-400 ms at a third
/// to a half below the rate (1 GiB over 4 x 1 Gbit/s: 422-454 MB/s with the doubling at
/// every power of two, 473-474 with one registration; docs/FS-BENCH.md).
const WRITABLE_HEADROOM: u64 = 16;

/// Smallest writable registration, for the same reason: a file being written grows to a
/// few GiB with no new registration at all (with the headroom alone, a 1 GiB file still
/// had one, at 512 MiB, and its dip).
const MIN_WRITABLE_CAPACITY: u64 = 4 << 30;

/// The registrations of one file, shared by all its open handles on this server.
#[derive(Default)]
pub(crate) struct FileRegions {
    /// Open handles of the file (all clients).
    pub(crate) opens: usize,
    /// Read-only and read-write registrations, oldest first. Older (smaller) ones stay
    /// registered until the last handle closes, so a client's operations in flight on an
    /// older key never fail because another client grew the file.
    read_only: Vec<Arc<FileRegion>>,
    read_write: Vec<Arc<FileRegion>>,
    generation: u64,
    /// Where the last early writeback ended (see [`super::writeback`]).
    pub(crate) written_back: u64,
}

impl FileRegions {
    /// The registration for a handle of kind `writable` covering at least `size` bytes,
    /// registering a larger one (the next power of two, at least 1 MiB; if writable, times
    /// [`WRITABLE_HEADROOM`] and at least [`MIN_WRITABLE_CAPACITY`]) when the newest is too
    /// small; `None` for an empty file.
    pub(crate) fn ensure(
        &mut self,
        ctx: &Context,
        fd: impl AsFd,
        size: u64,
        writable: bool,
    ) -> Result<Option<RegionInfo>, Errno> {
        if size == 0 {
            return Ok(None);
        }
        let regs = if writable {
            &mut self.read_write
        } else {
            &mut self.read_only
        };
        if let Some(r) = regs.last()
            && r.info.len >= size
        {
            return Ok(Some(r.info));
        }
        let capacity = size
            .max(MIN_CAPACITY)
            .checked_next_power_of_two()
            .ok_or(Errno::EFBIG)?;
        let roomy = capacity
            .checked_mul(WRITABLE_HEADROOM)
            .map(|c| c.max(MIN_WRITABLE_CAPACITY))
            .filter(|_| writable)
            .unwrap_or(capacity);
        self.generation += 1;
        let r = FileRegion::register(ctx, fd.as_fd(), roomy, writable, self.generation)
            // Address space or `max_registered_bytes` short: the file's size then.
            .or_else(|_| {
                FileRegion::register(ctx, fd.as_fd(), capacity, writable, self.generation)
            })?;
        let info = r.info;
        regs.push(Arc::new(r));
        Ok(Some(info))
    }

    /// A job that faults in `[from, to)` of the newest writable registration, writable, so
    /// that clients' one-sided writes there find their pages: page allocation, zeroing and
    /// the file system's `page_mkwrite` then run on a thread of the server's, beside the
    /// engine that places the data, instead of inside its socket reads. Best effort; `None`
    /// if there is nothing to fault in.
    pub(crate) fn populate_job(&self, from: u64, to: u64) -> Option<Job> {
        let r = self.read_write.last()?.clone();
        let page = rustix::param::page_size() as u64;
        let start = from / page * page;
        let end = to.min(r.info.len).next_multiple_of(page);
        if end <= start {
            return None;
        }
        Some(Box::new(move || {
            // In pieces: MADV_POPULATE_WRITE holds the process's mmap lock for reading
            // while it faults a piece in, and a registration of a larger range (an `mmap`,
            // which takes that lock for writing, on a worker that a client's `MapRegion`
            // waits for) would wait for the whole range.
            for from in (start..end).step_by(POPULATE_PIECE) {
                let len = (end - from).min(POPULATE_PIECE as u64);
                // SAFETY: [from, from + len) lies inside the registration's mapping (end is
                // capped at its page-rounded length), which `r` keeps alive.
                // MADV_POPULATE_WRITE is a system call: pages a truncation removed make it
                // fail (EFAULT), not fault this thread; nothing is read or written from
                // user space.
                let res = unsafe {
                    rustix::mm::madvise(
                        r.region.as_mut_ptr().add(from as usize).cast(),
                        len as usize,
                        rustix::mm::Advice::LinuxPopulateWrite,
                    )
                };
                if let Err(e) = res {
                    tracing::debug!("populating file pages {from}..{}: {e}", from + len);
                    return;
                }
            }
        }))
    }

    /// The writable registrations (clients' writes land through their mappings).
    pub(crate) fn writable_mappings(&self) -> Vec<Arc<FileRegion>> {
        self.read_write.clone()
    }

    /// Ends every registration (the last handle closed).
    pub(crate) fn clear(&mut self) {
        self.read_only.clear();
        self.read_write.clear();
        self.written_back = 0;
    }

    /// The range whose writeback should start now that a client grows the file from
    /// `old` bytes: from where the last one ended to [`LAG`] bytes before `old`, if that is
    /// at least [`STEP`] bytes. Records it as started.
    pub(crate) fn writeback_range(&mut self, old: u64) -> Option<(u64, u64)> {
        self.writeback_upto(old, old.saturating_sub(LAG))
    }

    /// The range whose writeback should start now that a client's writes below `landed`
    /// have all landed in the file of `size` bytes: from where the last one ended to
    /// `landed` rounded down to a [`STEP`], if that is at least a step. Records it as
    /// started.
    pub(crate) fn writeback_upto(&mut self, size: u64, landed: u64) -> Option<(u64, u64)> {
        // Shrunk since (truncated and written again): start over from there.
        self.written_back = self.written_back.min(size / STEP * STEP);
        let to = landed.min(size) / STEP * STEP;
        if to < self.written_back + STEP {
            return None;
        }
        let from = self.written_back;
        self.written_back = to;
        Some((from, to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn writeback_trails_the_growth_in_steps_and_starts_over_after_a_shrink() {
        let mut r = FileRegions::default();
        // Nothing until the old end is a step past the lag.
        assert_eq!(r.writeback_range(0), None);
        assert_eq!(r.writeback_range(LAG + STEP - 1), None);
        assert_eq!(r.writeback_range(LAG + STEP), Some((0, STEP)));
        // Less than a step more: wait.
        assert_eq!(r.writeback_range(LAG + STEP + MIB), None);
        // Ranges follow each other without gaps or overlaps, in whole steps.
        assert_eq!(
            r.writeback_range(LAG + 3 * STEP + MIB),
            Some((STEP, 3 * STEP))
        );
        // Truncated and written again: from the new end's step on.
        assert_eq!(r.writeback_range(STEP + MIB), None);
        assert_eq!(r.written_back, STEP);
        assert_eq!(r.writeback_range(LAG + 2 * STEP), Some((STEP, 2 * STEP)));
        r.clear();
        assert_eq!(r.written_back, 0);
    }

    #[test]
    fn writeback_follows_what_landed_within_the_file() {
        let mut r = FileRegions::default();
        assert_eq!(r.writeback_upto(100 * MIB, STEP - 1), None);
        assert_eq!(r.writeback_upto(100 * MIB, STEP + MIB), Some((0, STEP)));
        // Never past the file's end, and never twice.
        assert_eq!(
            r.writeback_upto(3 * STEP, 10 * STEP),
            Some((STEP, 3 * STEP))
        );
        assert_eq!(r.writeback_upto(3 * STEP, 3 * STEP), None);
        // The growth's rule and the landings' share where the last range ended.
        assert_eq!(
            r.writeback_range(LAG + 4 * STEP),
            Some((3 * STEP, 4 * STEP))
        );
        assert_eq!(r.writeback_upto(LAG + 4 * STEP, 4 * STEP + MIB), None);
    }
}
