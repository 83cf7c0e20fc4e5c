//! Helpers of the FUSE request handlers (`fs.rs`): the kernel's configuration,
//! conversions, directory listing, and removals.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{INodeNo, InitFlags, KernelConfig, ReplyDirectory, ReplyEmpty, TimeOrNow};

use super::BraidFs;
use crate::mount::shared::{errno, kind};
use crate::proto::{DirEntry, Reply, Request, TimeSet, Timestamp};

pub(crate) fn timeset(t: Option<TimeOrNow>) -> TimeSet {
    match t {
        None => TimeSet::Omit,
        Some(TimeOrNow::Now) => TimeSet::Now,
        Some(TimeOrNow::SpecificTime(t)) => TimeSet::At(Timestamp::from_system_time(t)),
    }
}

/// Adds entries to a kernel readdir reply until it is full.
pub(crate) fn fill(entries: &[DirEntry], reply: &mut ReplyDirectory) {
    for e in entries {
        if reply.add(
            INodeNo(e.ino),
            e.next_offset,
            kind(e.file_type),
            OsStr::from_bytes(&e.name),
        ) {
            break;
        }
    }
}

impl BraidFs {
    /// What the mount asks of the kernel at `init`.
    pub(crate) fn configure_kernel(&self, config: &mut KernelConfig) {
        let slot = self.shared.pool.slot_size() as u32;
        if let Err(max) = config.set_max_write(slot) {
            let _ = config.set_max_write(max);
        }
        if let Err(max) = config.set_max_readahead(self.readahead.max(slot)) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let _ = config.set_congestion_threshold(48);
        // Not FUSE_ATOMIC_O_TRUNC: with it the kernel hands O_TRUNC to our open and checks
        // for a running executable (ETXTBSY) only afterwards, so `open(O_RDONLY|O_TRUNC)` of
        // a program being run emptied it on the server and the program crashed (SIGSEGV);
        // pjdfstest's open::etxtbsy failed intermittently. Without it the kernel refuses
        // first and truncates with a SETATTR of its own.
        for cap in [
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_MAX_PAGES,
            // Locks go to the server, which holds them for every client.
            InitFlags::FUSE_POSIX_LOCKS,
            InitFlags::FUSE_FLOCK_LOCKS,
            // Shared mappings of files opened with FOPEN_DIRECT_IO (appending ones).
            InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP,
        ] {
            if config.add_capabilities(cap).is_err() {
                tracing::debug!("kernel lacks {cap:?}");
            }
        }
    }

    /// Unlink or rmdir: sends `request(parent, name)` and keeps the known attributes right.
    pub(crate) fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
        request: impl FnOnce(crate::proto::NodeId, Vec<u8>) -> Request,
    ) {
        let s = self.shared.clone();
        let name = Self::name(name);
        // The removed object's link count and times change too, and it is known here
        // only by name.
        s.known.forget_all();
        let epoch = s.known.epoch();
        let r = request(s.node(parent), name.clone());
        self.shared.call(&r, move |r| match r {
            Ok(reply_body) => {
                if let Reply::Attr(a) = &reply_body {
                    s.known.learn(epoch, parent.0, a);
                }
                s.removed(parent.0, &name);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        });
    }
}
