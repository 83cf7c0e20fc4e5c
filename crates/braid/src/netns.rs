//! The network namespace an endpoint's rails were dialled in.
//!
//! Network namespaces belong to threads in Linux, and a new thread starts in its creator's.
//! A failed rail is re-dialled on a thread started by whichever thread noticed the failure
//! (the progress engine, or an application thread polling a completion queue), which may
//! live in another namespace than the one `connect` ran in: there the rail's local address
//! does not exist or routes elsewhere ("Network is unreachable", "Cannot assign requested
//! address"), or, worse, the same addresses reach another host. The endpoint therefore
//! remembers its namespace, and the re-dial thread enters it first.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// The calling thread's network namespace (a magic link of procfs).
const THREAD_NETNS: &str = "/proc/thread-self/ns/net";

/// A handle on a network namespace; it keeps the namespace alive.
#[derive(Debug)]
pub(crate) struct NetNs {
    file: File,
    /// (device, inode) of the namespace: equal for equal namespaces.
    id: (u64, u64),
}

impl NetNs {
    /// The calling thread's network namespace, or `None` where procfs cannot tell.
    pub(crate) fn current() -> Option<NetNs> {
        let file = File::open(THREAD_NETNS).ok()?;
        let m = file.metadata().ok()?;
        Some(NetNs {
            id: (m.dev(), m.ino()),
            file,
        })
    }

    /// Moves the calling thread into this namespace. A thread already there stays put
    /// (`setns` needs `CAP_SYS_ADMIN` even then).
    pub(crate) fn enter(&self) -> std::io::Result<()> {
        let here = std::fs::metadata(THREAD_NETNS)?;
        if (here.dev(), here.ino()) == self.id {
            return Ok(());
        }
        move_into_link_name_space(self.file.as_fd(), Some(LinkNameSpaceType::Network))?;
        Ok(())
    }
}
