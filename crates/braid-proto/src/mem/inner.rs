//! The memory behind a region, shared by its handles, the registry and in-flight
//! operations: [`RegionInner`] and the pins that keep it mapped.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::mem::access::Access;
use crate::mem::file::FileMap;

/// How a region's memory was obtained.
pub(super) enum Backing {
    /// braid mapped it and unmaps it when the last reference goes; `shared`: a region file
    /// a same-host peer may map (see [`crate::mem::shared`]).
    Mapped { map_len: usize, shared: bool },
    /// The caller owns it (see `braid::Context::register`).
    Borrowed,
    /// Pages of a file, mapped `MAP_SHARED` (see `braid::Context::register_file`); the map
    /// is undone when the last reference goes.
    File(FileMap),
}

/// The memory and bookkeeping behind a region, shared by every handle and in-flight operation.
pub(crate) struct RegionInner {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) access: Access,
    pub(super) key: u64,
    pub(super) backing: Backing,
    /// Remote operations currently using the region at this side.
    pub(super) pins: Mutex<usize>,
    pub(super) unpinned: Condvar,
}

// SAFETY: the pointer is only dereferenced through methods that document their
// concurrency contract; the memory is not tied to any thread.
unsafe impl Send for RegionInner {}
// SAFETY: as above; all bookkeeping is behind a mutex.
unsafe impl Sync for RegionInner {}

impl Drop for RegionInner {
    fn drop(&mut self) {
        if let Backing::Mapped { map_len, shared } = self.backing {
            if shared {
                crate::mem::shared::forget(self.ptr);
            }
            // SAFETY: ptr/map_len came from a successful mmap; no reference outlives `self`.
            unsafe { libc::munmap(self.ptr.cast(), map_len) };
        }
    }
}

impl RegionInner {
    pub(crate) fn len(&self) -> usize {
        self.len
    }
    pub(crate) fn access(&self) -> Access {
        self.access
    }
    /// The file behind a file region.
    pub(crate) fn file(&self) -> Option<&FileMap> {
        match &self.backing {
            Backing::File(f) => Some(f),
            _ => None,
        }
    }
    /// True for file pages, which truncation can take away: braid touches them only through
    /// system calls (see [`crate::mem::file`]).
    pub(crate) fn is_file(&self) -> bool {
        matches!(self.backing, Backing::File(_))
    }
    /// Pointer to byte `offset`. The caller has checked `offset <= len`.
    pub(crate) fn ptr_at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        // SAFETY: offset is within the mapping (or one past its end).
        unsafe { self.ptr.add(offset) }
    }
}

/// A remote operation's hold on a region: memory stays mapped, and deregistration of
/// caller-owned memory waits, until every pin is dropped.
pub(crate) struct RegionPin(Arc<RegionInner>);

impl RegionPin {
    pub(crate) fn new(inner: Arc<RegionInner>) -> RegionPin {
        *inner.pins.lock() += 1;
        RegionPin(inner)
    }
}

impl Clone for RegionPin {
    fn clone(&self) -> RegionPin {
        RegionPin::new(self.0.clone())
    }
}

impl std::ops::Deref for RegionPin {
    type Target = RegionInner;
    fn deref(&self) -> &RegionInner {
        &self.0
    }
}

impl Drop for RegionPin {
    fn drop(&mut self) {
        let mut pins = self.0.pins.lock();
        *pins -= 1;
        if *pins == 0 {
            self.0.unpinned.notify_all();
        }
    }
}
