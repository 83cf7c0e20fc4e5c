//! Heap buffers for payloads and read-response bytes copied aside.

use std::sync::Arc;

use crate::proto::spans::Spans;

/// Heap memory for a staged payload, written through raw pointers by the driver.
pub(super) struct StagingBuf {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    /// A copy of file pages that could not all be read (truncated): the bytes are not what
    /// the operation saw, and the frames sent from it say so.
    pub(super) faulted: bool,
}

// SAFETY: plain heap memory; access goes through raw pointers under the session's protocol.
unsafe impl Send for StagingBuf {}

// SAFETY: as above.
unsafe impl Sync for StagingBuf {}

impl StagingBuf {
    pub(super) fn new(len: usize) -> Arc<StagingBuf> {
        let b = vec![0u8; len].into_boxed_slice();
        let len = b.len();
        Arc::new(StagingBuf {
            ptr: Box::into_raw(b).cast(),
            len,
            faulted: false,
        })
    }

    /// A copy of the bytes `[off, off + len)` of `src`; `faulted` when file pages were gone.
    pub(super) fn copy_of(src: &Spans, off: u64, len: u64) -> Arc<StagingBuf> {
        let mut b = vec![0u8; len as usize].into_boxed_slice();
        // SAFETY: the buffer has `len` bytes and is not part of any region.
        let ok = unsafe { src.copy_out(off, len, b.as_mut_ptr()) };
        let len = b.len();
        Arc::new(StagingBuf {
            ptr: Box::into_raw(b).cast(),
            len,
            faulted: !ok,
        })
    }

    /// # Safety
    /// No write to the buffer may be in progress.
    pub(super) unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: ptr/len came from a boxed slice that lives as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for StagingBuf {
    fn drop(&mut self) {
        // SAFETY: reconstructs the box leaked in `new`.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.len)) });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::mem::region::{Access, Region};
    use crate::mem::registry::Registry;
    use crate::proto::spans::Spans;

    use super::StagingBuf;

    #[test]
    fn a_new_buffer_is_zeroed_and_sized() {
        for len in [0, 1, 4096, 100_003] {
            let b = StagingBuf::new(len);
            // SAFETY: nothing writes the buffer.
            let bytes = unsafe { b.bytes() };
            assert_eq!(bytes.len(), len);
            assert!(bytes.iter().all(|&x| x == 0));
            assert!(!b.faulted);
        }
    }

    #[test]
    fn a_copy_holds_the_bytes_as_they_were() {
        let reg = Arc::new(Registry::default());
        let r = Region::allocate_in(&reg, 10_000, Access::all()).unwrap();
        let data: Vec<u8> = (0..10_000).map(|i| i as u8).collect();
        r.write_at(0, &data).unwrap();
        let pin = reg.lookup(r.remote_key().key).unwrap();
        let spans = Spans::single(pin, 0, 10_000);
        let copy = StagingBuf::copy_of(&spans, 1000, 5000);
        r.fill(0, 10_000, 0xff).unwrap();
        // SAFETY: nothing writes the buffer.
        assert_eq!(unsafe { copy.bytes() }, &data[1000..6000]);
        assert!(!copy.faulted);
    }
}
