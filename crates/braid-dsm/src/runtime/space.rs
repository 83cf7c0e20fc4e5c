//! The shared address range: reserved at one address in every rank, and carved into
//! allocations by a deterministic first-fit allocator (every rank makes the same calls in
//! the same order, so every rank gets the same addresses).

use std::collections::BTreeMap;
use std::io;

use crate::error::DsmError;

/// The system page size.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// An inaccessible reservation of address space, unmapped on drop.
pub(crate) struct Reservation {
    pub base: *mut u8,
    pub len: usize,
}

// SAFETY: the reservation is an address range; access goes through the runtime's rules.
unsafe impl Send for Reservation {}
// SAFETY: as above.
unsafe impl Sync for Reservation {}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

const RESERVE_FLAGS: i32 = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;

impl Reservation {
    /// `len` bytes wherever the kernel puts them.
    pub(crate) fn anywhere(len: usize) -> Result<Reservation, DsmError> {
        // SAFETY: anonymous inaccessible mapping, result checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                RESERVE_FLAGS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(DsmError::Os(
                format!("reserving {len} bytes of address space"),
                io::Error::last_os_error(),
            ));
        }
        Ok(Reservation {
            base: p.cast(),
            len,
        })
    }

    /// `len` bytes at exactly `addr`, or `None` if anything is mapped there.
    pub(crate) fn at(addr: usize, len: usize) -> Option<Reservation> {
        let flags = RESERVE_FLAGS | libc::MAP_FIXED_NOREPLACE;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; result checked.
        let p = unsafe { libc::mmap(addr as *mut _, len, libc::PROT_NONE, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return None;
        }
        let r = Reservation {
            base: p.cast(),
            len,
        };
        // Kernels before 4.17 ignore the flag and may map elsewhere.
        (p as usize == addr).then_some(r)
    }

    /// Makes `len` bytes at `offset` accessible (an allocation) or not (freed).
    pub(crate) fn protect(&self, offset: usize, len: usize, accessible: bool) -> io::Result<()> {
        let prot = if accessible {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_NONE
        };
        // SAFETY: inside our reservation.
        if unsafe { libc::mprotect(self.base.add(offset).cast(), len, prot) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

/// First-fit allocation of page-aligned blocks of the range.
#[derive(Debug)]
pub(crate) struct Allocator {
    len: usize,
    page: usize,
    /// Live allocations: offset -> length (both multiples of the page size).
    live: BTreeMap<usize, usize>,
}

impl Allocator {
    pub(crate) fn new(len: usize, page: usize) -> Allocator {
        Allocator {
            len,
            page,
            live: BTreeMap::new(),
        }
    }

    /// The offset of a new block of `bytes` (rounded up to pages), or `None` when no gap is
    /// large enough. A guard page stays free between blocks, so running off the end of an
    /// allocation is a SIGSEGV rather than a write into the next one.
    pub(crate) fn alloc(&mut self, bytes: usize) -> Option<(usize, usize)> {
        let len = bytes.checked_next_multiple_of(self.page)?.max(self.page);
        let mut start = 0;
        for (&off, &l) in &self.live {
            if off >= start && off - start >= len + self.page {
                break;
            }
            start = off + l + self.page;
        }
        if start.checked_add(len)? > self.len {
            return None;
        }
        self.live.insert(start, len);
        Some((start, len))
    }

    /// Length of the live block at `offset`.
    pub(crate) fn len_at(&self, offset: usize) -> Option<usize> {
        self.live.get(&offset).copied()
    }

    /// Frees the block at `offset`.
    pub(crate) fn free(&mut self, offset: usize) -> Option<usize> {
        self.live.remove(&offset)
    }

    /// Live blocks.
    pub(crate) fn blocks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.live.iter().map(|(&o, &l)| (o, l))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_with_guard_pages() {
        let mut a = Allocator::new(100 * 4096, 4096);
        assert_eq!(a.alloc(1), Some((0, 4096)));
        assert_eq!(a.alloc(8192), Some((2 * 4096, 8192)));
        assert_eq!(a.alloc(4096), Some((5 * 4096, 4096)));
        assert_eq!(a.free(2 * 4096), Some(8192));
        // The freed gap (pages 1..5 minus guards) takes a one-page block.
        assert_eq!(a.alloc(100), Some((2 * 4096, 4096)));
        assert_eq!(a.alloc(200 * 4096), None);
        assert_eq!(a.alloc(0), Some((7 * 4096, 4096)));
        assert_eq!(a.alloc(usize::MAX), None);
        assert_eq!(a.blocks().count(), 4);
    }

    #[test]
    fn reservations_at_a_fixed_address() {
        let r = Reservation::anywhere(1 << 20).unwrap();
        assert!(
            Reservation::at(r.base as usize, 1 << 20).is_none(),
            "occupied"
        );
        let addr = r.base as usize;
        drop(r);
        let r2 = Reservation::at(addr, 1 << 20).expect("free again");
        r2.protect(0, 4096, true).unwrap();
        // SAFETY: just made accessible.
        unsafe { r2.base.write(1) };
    }
}
