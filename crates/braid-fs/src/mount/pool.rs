//! Registered buffers for the kernel's reads and writes: one-sided reads land here before
//! the reply to the kernel copies them out; writes are copied in before going out.

use std::time::{Duration, Instant};

use braid::{Access, Context, Region, Sge};
use parking_lot::{Condvar, Mutex};

/// A region cut into equal slots.
pub(crate) struct Pool {
    region: Region,
    slot: usize,
    free: Mutex<Vec<usize>>,
    freed: Condvar,
}

impl Pool {
    pub(crate) fn new(ctx: &Context, slots: usize, slot: usize) -> Result<Pool, braid::Error> {
        Ok(Pool {
            region: ctx.alloc_region(slots * slot, Access::LOCAL_WRITE)?,
            slot,
            free: Mutex::new((0..slots).rev().collect()),
            freed: Condvar::new(),
        })
    }

    /// Size of one slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot
    }

    /// A free slot, waiting up to `timeout` for one.
    pub(crate) fn take(&self, timeout: Duration) -> Option<usize> {
        let deadline = Instant::now() + timeout;
        let mut free = self.free.lock();
        loop {
            if let Some(i) = free.pop() {
                return Some(i);
            }
            if self.freed.wait_until(&mut free, deadline).timed_out() {
                return free.pop();
            }
        }
    }

    pub(crate) fn give(&self, i: usize) {
        self.free.lock().push(i);
        self.freed.notify_one();
    }

    /// `len` bytes of slot `i`.
    pub(crate) fn sge(&self, i: usize, len: usize) -> Sge {
        Sge {
            region: self.region.clone(),
            offset: i * self.slot,
            len: len.min(self.slot),
        }
    }

    /// Copies `data` into slot `i`.
    pub(crate) fn fill(&self, i: usize, data: &[u8]) -> Result<(), braid::Error> {
        self.region.write_at(i * self.slot, data)
    }

    /// Runs `f` on the first `len` bytes of slot `i`.
    ///
    /// Only for a slot whose one-sided read has completed and that no operation uses: the
    /// region grants no remote rights, so nothing else writes those bytes meanwhile.
    pub(crate) fn with_bytes<R>(&self, i: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        let len = len.min(self.slot);
        // SAFETY: slot i lies inside the region (i < slots, len <= slot); the region has
        // only LOCAL_WRITE, its read completed, and the slot is not handed out again before
        // `give`, so the bytes do not change while `f` borrows them.
        let bytes =
            unsafe { std::slice::from_raw_parts(self.region.as_mut_ptr().add(i * self.slot), len) };
        f(bytes)
    }
}
