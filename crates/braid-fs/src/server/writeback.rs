//! Early writeback of files that clients are writing.
//!
//! Clients write with one-sided RMA into the server's page cache, so the kernel sees dirty
//! pages but no `write(2)`, and (with gigabytes of memory) starts writing them back only
//! when the client commits with `fsync`: then the whole file goes to the disk after the
//! transfer instead of during it. So each time a client grows a file (`MapRegion`, which it
//! sends before writing the new range), the range it has had time to fill, all but the
//! last [`LAG`] bytes before the old end, is handed to one thread that starts its writeback
//! with `sync_file_range(SYNC_FILE_RANGE_WRITE)` (asynchronous, but it may block on a busy
//! disk queue: hence a thread of its own, not the worker answering requests). Clients also
//! say how far their writes have landed (`Landed`), which moves the writeback up to there. A page that is
//! still being written when its writeback starts is only written twice: the kernel marks it
//! dirty again when the client's data lands. A job may first unmap the range's pages from
//! the server (`FileRegion::unmap_pages`), so the writeback has no mapping to
//! write-protect page by page. Best effort throughout: the `fsync` of a commit is what
//! makes data durable.

use std::os::fd::{AsFd, AsRawFd};

use super::jobs::JobThread;

/// Bytes before the end of the file left for the final commit: the client may still be
/// writing there (the mount has up to 64 MiB in flight, the library 16 MiB per transfer).
/// Starting the writeback of a page still being written makes the writer fault on it and
/// the page go to the disk twice: with 16 MiB the transfer itself took 10-30% longer on
/// the loaded test host, with 64 MiB it did not (docs/FS-BENCH.md).
pub(crate) const LAG: u64 = 64 << 20;

/// Smallest range worth a system call.
pub(crate) const STEP: u64 = 8 << 20;

/// The writeback thread; dropping this ends it.
pub(crate) struct Writeback {
    thread: JobThread,
}

impl Writeback {
    /// Starts the thread (a warning if it cannot be started: writes then reach the disk at
    /// commit only).
    pub(crate) fn start() -> Writeback {
        Writeback {
            thread: JobThread::start("fs-writeback", "writes reach the disk at commit"),
        }
    }

    /// Asks for the writeback of `[from, to)` of the file open as `fd` to start, on the
    /// writeback thread after `before` has run there.
    pub(crate) fn request(
        &self,
        fd: impl AsFd,
        before: Box<dyn FnOnce() + Send>,
        from: u64,
        to: u64,
    ) {
        if to <= from {
            return;
        }
        let fd = match fd.as_fd().try_clone_to_owned() {
            Ok(fd) => fd,
            Err(e) => return tracing::debug!("duplicating a descriptor for writeback: {e}"),
        };
        let job = move || {
            before();
            // SAFETY: sync_file_range only reads its arguments; the descriptor is open.
            let r = unsafe {
                libc::sync_file_range(
                    fd.as_raw_fd(),
                    from as libc::off64_t,
                    (to - from) as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
            if r != 0 {
                tracing::debug!(
                    "starting writeback of {from}..{to}: {}",
                    std::io::Error::last_os_error()
                );
            }
        };
        // Not running: the commit's fsync writes it.
        let _ = self.thread.submit(Box::new(job));
    }
}
