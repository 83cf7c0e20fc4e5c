//! File pages registered as braid regions: the server side of the one-sided data path.
//!
//! A file is mapped `MAP_SHARED`, so its registered pages are the page cache itself: a
//! client's RMA read is sent from the server's page cache, and its RMA write lands in it
//! (and reaches the disk on `fsync`). One registration per file and access kind is shared
//! by every client that has the file open; it ends when the last handle is released.
//!
//! A registration covers a capacity of at least the file's size (a power of two), so a file
//! can grow through `MapRegion` (an `ftruncate`) without a new registration each time; a
//! file that outgrows it gets a larger one (a new key and generation, which `MapRegion`
//! returns). Pages past the file's end are never touched by braid from user space: an access
//! there fails with an error completion instead of a `SIGBUS`.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::Arc;

use braid::{Access, Context, Region};

use crate::proto::{Errno, RegionInfo};

/// One registration of a file's pages.
pub(crate) struct FileRegion {
    region: Option<Region>,
    ptr: *mut libc::c_void,
    map_len: usize,
    pub(crate) info: RegionInfo,
}

// SAFETY: the pointer is only used to unmap the mapping in Drop, after the region is gone.
unsafe impl Send for FileRegion {}
// SAFETY: as above; no shared access goes through the pointer.
unsafe impl Sync for FileRegion {}

impl Drop for FileRegion {
    fn drop(&mut self) {
        // Revokes the key and waits for remote operations still using the pages.
        drop(self.region.take());
        // SAFETY: ptr/map_len came from a successful mmap, unmapped once, after the
        // registration (the only other user of the memory) ended.
        unsafe { libc::munmap(self.ptr, self.map_len) };
    }
}

impl FileRegion {
    /// Maps `len` bytes of the file open as `fd` and registers them; `writable` grants
    /// remote writes (then `fd` must be open read-write).
    pub(crate) fn register(
        ctx: &Context,
        fd: BorrowedFd<'_>,
        len: u64,
        writable: bool,
        generation: u64,
    ) -> Result<FileRegion, Errno> {
        if len == 0 {
            return Err(Errno::EINVAL);
        }
        let len_usize = usize::try_from(len).map_err(|_| Errno::EFBIG)?;
        let page = rustix::param::page_size();
        let map_len = len_usize
            .checked_next_multiple_of(page)
            .ok_or(Errno::EFBIG)?;
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks the address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Errno::from(std::io::Error::last_os_error()));
        }
        let access = if writable {
            Access::REMOTE_READ | Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        // SAFETY: the mapping stays valid until Drop, which ends the registration first. The
        // pages are never viewed as Rust references on this side.
        let region = match unsafe { ctx.register(ptr.cast(), len_usize, access) } {
            Ok(r) => r,
            Err(e) => {
                // SAFETY: the mapping just made, not registered.
                unsafe { libc::munmap(ptr, map_len) };
                tracing::warn!("registering a file region of {len} bytes failed: {e}");
                return Err(Errno::ENOMEM);
            }
        };
        let key = region.remote_key();
        Ok(FileRegion {
            region: Some(region),
            ptr,
            map_len,
            info: RegionInfo {
                key: key.key,
                len: key.len,
                generation,
                writable,
            },
        })
    }
}

/// Smallest registration: a new file's first writes need no new registration.
const MIN_CAPACITY: u64 = 1 << 20;

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
}

impl FileRegions {
    /// The registration for a handle of kind `writable` covering at least `size` bytes,
    /// registering a larger one (the next power of two, at least 1 MiB) when the newest is
    /// too small; `None` for an empty file.
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
        self.generation += 1;
        let r = FileRegion::register(ctx, fd.as_fd(), capacity, writable, self.generation)?;
        let info = r.info;
        regs.push(Arc::new(r));
        Ok(Some(info))
    }

    /// Ends every registration (the last handle closed).
    pub(crate) fn clear(&mut self) {
        self.read_only.clear();
        self.read_write.clear();
    }
}
