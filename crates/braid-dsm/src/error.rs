//! Errors of the DSM, with the `errno` the C API reports for each.

use std::io;

/// Why a DSM call failed.
#[derive(Debug, thiserror::Error)]
pub enum DsmError {
    /// userfaultfd(2) is not permitted; the text names `vm.unprivileged_userfaultfd`.
    #[error("{0}")]
    UserfaultfdNotPermitted(String),
    /// The kernel lacks something braid-dsm needs.
    #[error("not supported here: {0}")]
    Unsupported(String),
    /// A system call failed.
    #[error("{0}: {1}")]
    Os(String, io::Error),
    /// Forming the group failed (launcher environment, rendezvous, peers).
    #[error("forming the group: {0}")]
    Boot(#[from] braid_boot::BootError),
    /// A braid call failed.
    #[error("braid: {0}")]
    Braid(#[from] braid::Error),
    /// An argument is not acceptable; the text says which and why.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Ranks called a collective with different arguments (e.g. `alloc` sizes).
    #[error("ranks disagree: {0}")]
    Mismatch(String),
    /// The group failed: a rank died or became unreachable, or broke the protocol. Every
    /// later call fails with this too.
    #[error("the DSM group has failed: {0}")]
    Failed(String),
    /// `init` has not been called (or `finalize` has).
    #[error("braid-dsm is not initialized in this process")]
    NotInitialized,
    /// `init` was called twice.
    #[error("braid-dsm is already initialized in this process")]
    AlreadyInitialized,
    /// The shared range has no room for the allocation.
    #[error("out of shared address space: {0}")]
    NoSpace(String),
}

impl DsmError {
    /// The `errno` value the C API sets for this error.
    pub fn errno(&self) -> i32 {
        match self {
            DsmError::UserfaultfdNotPermitted(_) => libc::EPERM,
            DsmError::Unsupported(_) => libc::ENOSYS,
            DsmError::Os(_, e) => e.raw_os_error().unwrap_or(libc::EIO),
            DsmError::Boot(_) => libc::ECONNREFUSED,
            DsmError::Braid(_) => libc::EIO,
            DsmError::InvalidArgument(_) | DsmError::Mismatch(_) => libc::EINVAL,
            DsmError::Failed(_) => libc::ECONNRESET,
            DsmError::NotInitialized => libc::ENXIO,
            DsmError::AlreadyInitialized => libc::EALREADY,
            DsmError::NoSpace(_) => libc::ENOMEM,
        }
    }
}
