//! One of an AF_XDP socket's four single-producer, single-consumer rings, mapped from the
//! kernel. Each side owns one counter; the other side's is read with acquire ordering and
//! ours published with release ordering, so a descriptor is written before it is counted.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// A mapped ring of `T` descriptors (`u64` frame addresses or `xdp_desc`).
pub(crate) struct Ring<T: Copy> {
    base: NonNull<libc::c_void>,
    map_len: usize,
    producer: *const AtomicU32,
    consumer: *const AtomicU32,
    desc: *mut T,
    mask: u32,
    /// Our counter: the producer's for rings we fill, the consumer's for rings we drain.
    ours: u32,
}

// SAFETY: the ring is memory shared with the kernel only; the owning `Port` is `Send` but
// not `Sync`, so one thread at a time uses it.
unsafe impl<T: Copy> Send for Ring<T> {}

impl<T: Copy> Ring<T> {
    /// Maps the ring of `size` entries described by `off` at page offset `pgoff` of `sock`.
    pub(crate) fn map(
        sock: &OwnedFd,
        off: &libc::xdp_ring_offset,
        pgoff: libc::off_t,
        size: u32,
        producing: bool,
    ) -> io::Result<Ring<T>> {
        let map_len = off.desc as usize + size as usize * size_of::<T>();
        // SAFETY: a fresh shared mapping of the socket's ring; the kernel checks the length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                sock.as_raw_fd(),
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(p).expect("mmap returned null");
        let at = |o: u64| (p as usize + o as usize) as *mut u8;
        let producer = at(off.producer) as *const AtomicU32;
        let consumer = at(off.consumer) as *const AtomicU32;
        let mut ring = Ring {
            base,
            map_len,
            producer,
            consumer,
            desc: at(off.desc) as *mut T,
            mask: size - 1,
            ours: 0,
        };
        ring.ours = if producing {
            ring.producer().load(Ordering::Relaxed)
        } else {
            ring.consumer().load(Ordering::Relaxed)
        };
        Ok(ring)
    }

    fn producer(&self) -> &AtomicU32 {
        // SAFETY: inside the mapping, 4-byte aligned (the kernel's layout), alive with self.
        unsafe { &*self.producer }
    }

    fn consumer(&self) -> &AtomicU32 {
        // SAFETY: as for `producer`.
        unsafe { &*self.consumer }
    }

    fn slot(&self, i: u32) -> *mut T {
        // SAFETY: masked into the ring's `mask + 1` entries.
        unsafe { self.desc.add((i & self.mask) as usize) }
    }

    // --- rings we fill (fill, transmit) ---

    /// Entries we may write now.
    pub(crate) fn room(&self) -> u32 {
        let consumed = self.consumer().load(Ordering::Acquire);
        self.mask + 1 - self.ours.wrapping_sub(consumed)
    }

    /// Writes the `i`-th entry after the last submitted one (`i < room()`).
    pub(crate) fn put(&mut self, i: u32, v: T) {
        // SAFETY: the slot is ours until submitted (the caller checked `room`).
        unsafe { self.slot(self.ours.wrapping_add(i)).write_volatile(v) }
    }

    /// Hands the next `n` written entries to the kernel.
    pub(crate) fn submit(&mut self, n: u32) {
        self.ours = self.ours.wrapping_add(n);
        self.producer().store(self.ours, Ordering::Release);
    }

    /// Entries submitted that the kernel has not consumed yet.
    pub(crate) fn in_kernel(&self) -> u32 {
        self.ours
            .wrapping_sub(self.consumer().load(Ordering::Acquire))
    }

    // --- rings we drain (receive, completion) ---

    /// Entries the kernel has produced that we have not released.
    pub(crate) fn ready(&self) -> u32 {
        self.producer()
            .load(Ordering::Acquire)
            .wrapping_sub(self.ours)
    }

    /// Reads the `i`-th ready entry (`i < ready()`).
    pub(crate) fn get(&self, i: u32) -> T {
        // SAFETY: the kernel published the slot (acquire in `ready`) and will not reuse it
        // until we release it.
        unsafe { self.slot(self.ours.wrapping_add(i)).read_volatile() }
    }

    /// Gives the next `n` read entries back to the kernel.
    pub(crate) fn release(&mut self, n: u32) {
        self.ours = self.ours.wrapping_add(n);
        self.consumer().store(self.ours, Ordering::Release);
    }
}

impl<T: Copy> Drop for Ring<T> {
    fn drop(&mut self) {
        // SAFETY: our own mapping, unmapped once; nothing points into it any more.
        unsafe { libc::munmap(self.base.as_ptr(), self.map_len) };
    }
}
