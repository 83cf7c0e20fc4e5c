//! File pages as registered memory: a range of an open file mapped `MAP_SHARED`, so that
//! peers' one-sided reads are served from the page cache and their writes land in it.
//!
//! A mapped file page can disappear under braid: when the file is truncated, loads and
//! stores to pages wholly past the new end raise `SIGBUS`. System calls that touch such a
//! page (`readv`/`sendmsg` on a socket, `process_vm_readv`) fail with `EFAULT` or return a
//! short count instead. So braid never loads or stores file-region bytes from user space:
//! sockets move them, and every copy braid itself makes of them (read-response snapshots,
//! staged payloads, payload CRCs, [`crate::Region::read_at`]) goes through the *fragile*
//! copies of this module, which report a fault instead of raising a signal.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use crate::error::Error;

/// The file behind a file region: a duplicate of the caller's descriptor (so the size can be
/// asked for as long as the region lives) and the file offset of the region's first byte.
pub(crate) struct FileMap {
    fd: OwnedFd,
    /// File offset of the region's byte 0.
    offset: u64,
    /// The mapping as made (page-aligned start and length), for `munmap`.
    pub(crate) map_ptr: *mut u8,
    pub(crate) map_len: usize,
}

impl FileMap {
    /// The file's current size.
    pub(crate) fn file_size(&self) -> io::Result<u64> {
        // SAFETY: a zeroed stat is valid; fstat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a valid pointer.
        if unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st.st_size as u64)
    }

    /// Bytes of the region (from its byte 0) that lie before the file's end now.
    pub(crate) fn readable_len(&self) -> io::Result<u64> {
        Ok(self.file_size()?.saturating_sub(self.offset))
    }

    /// File offset of the region's byte 0.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: map_ptr/map_len came from a successful mmap; no reference outlives the
        // region that owns this map.
        unsafe { libc::munmap(self.map_ptr.cast(), self.map_len) };
    }
}

/// The system's page size (4096 if it cannot be asked).
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 { p as usize } else { 4096 }
}

/// Maps `[offset, offset + len)` of `file` `MAP_SHARED`; returns the map and the pointer to
/// byte `offset` (the mapping starts at the page boundary below it).
pub(crate) fn map_file(
    file: impl AsFd,
    offset: u64,
    len: usize,
    writable: bool,
) -> Result<(FileMap, *mut u8), Error> {
    let bad = |s: String| Error::InvalidArgument(s);
    if len == 0 {
        return Err(bad("a file region must be at least 1 byte long".into()));
    }
    probe_fragile_copies()?;
    let raw = file.as_fd().as_raw_fd();
    // SAFETY: a zeroed stat is valid; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and pointer.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(bad("only regular files can be registered".into()));
    }
    // SAFETY: F_GETFL on a valid descriptor.
    let fl = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if fl < 0 {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    let mode = fl & libc::O_ACCMODE;
    if mode == libc::O_WRONLY {
        return Err(bad(
            "the file is open write-only; mapping needs read access".into(),
        ));
    }
    if writable && mode != libc::O_RDWR {
        return Err(bad(
            "LOCAL_WRITE or REMOTE_WRITE on a file region needs the file open read-write".into(),
        ));
    }
    let page = page_size() as u64;
    let start = offset - offset % page;
    let delta = (offset - start) as usize;
    let map_len = delta
        .checked_add(len)
        .and_then(|l| l.checked_next_multiple_of(page as usize))
        .filter(|_| {
            offset
                .checked_add(len as u64)
                .is_some_and(|e| e <= i64::MAX as u64)
        })
        .ok_or_else(|| bad(format!("file range {offset}+{len} too large")))?;
    let fd = file
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| Error::Io(io::Error::new(e.kind(), format!("dup of the file: {e}"))))?;
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh shared mapping of a regular file with no address hint; checked below.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            start as libc::off_t,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(Error::Io(io::Error::last_os_error()));
    }
    let map_ptr: *mut u8 = ptr.cast();
    let map = FileMap {
        fd,
        offset,
        map_ptr,
        map_len,
    };
    // SAFETY: delta < page <= map_len.
    Ok((map, unsafe { map_ptr.add(delta) }))
}

/// Checks once that `process_vm_readv` works on this process (seccomp may forbid it):
/// without it braid cannot copy file pages without risking `SIGBUS`.
fn probe_fragile_copies() -> Result<(), Error> {
    static OK: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    OK.get_or_init(|| {
        let src = [7u8; 8];
        let mut dst = [0u8; 8];
        match read_fragile(src.as_ptr(), &mut dst) {
            Ok(8) if dst == src => Ok(()),
            Ok(n) => Err(format!("process_vm_readv copied {n} of 8 bytes")),
            Err(e) => Err(format!("process_vm_readv is not usable here: {e}")),
        }
    })
    .clone()
    .map_err(|e| Error::InvalidArgument(format!("file regions are unavailable: {e}")))
}

/// One `process_vm_readv` or `process_vm_writev` on this process, retried on `EINTR`.
fn vm_copy(local: *mut u8, remote: *mut u8, len: usize, write: bool) -> io::Result<usize> {
    let l = libc::iovec {
        iov_base: local.cast(),
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote.cast(),
        iov_len: len,
    };
    loop {
        // SAFETY: both iovecs describe `len` bytes; the kernel checks every access and reports
        // an unmapped or truncated page as EFAULT (or a short count) instead of a signal.
        let n = unsafe {
            // SAFETY: getpid has no preconditions.
            let pid = libc::getpid();
            if write {
                libc::process_vm_writev(pid, &l, 1, &r, 1, 0)
            } else {
                libc::process_vm_readv(pid, &l, 1, &r, 1, 0)
            }
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Copies `dst.len()` bytes from `src` (possibly file pages) into `dst`; returns how many
/// were copied before a page could not be read (`Ok(dst.len())` when all were), or the
/// error of a first call that copied nothing for another reason than a bad page.
pub(crate) fn read_fragile(src: *const u8, dst: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < dst.len() {
        // SAFETY: done < dst.len(), inside both ranges.
        let (d, s) = unsafe { (dst.as_mut_ptr().add(done), src.add(done)) };
        match vm_copy(d, s as *mut u8, dst.len() - done, false) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => break,
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

/// Copies `src` into `dst` (possibly file pages); true when every byte was stored.
pub(crate) fn write_fragile(dst: *mut u8, src: &[u8]) -> bool {
    let mut done = 0;
    while done < src.len() {
        // SAFETY: done < src.len(), inside both ranges.
        let (d, s) = unsafe { (dst.add(done), src.as_ptr().add(done)) };
        match vm_copy(s as *mut u8, d, src.len() - done, true) {
            Ok(0) | Err(_) => return false,
            Ok(n) => done += n,
        }
    }
    true
}

/// Copies `len` bytes between two raw places, either of which may be file pages when
/// `fragile`; true when every byte was copied (a plain `memcpy` otherwise).
///
/// # Safety
/// Both ranges must be mapped memory of at least `len` bytes (file pages may be truncated
/// when `fragile`), and must not overlap.
pub unsafe fn copy_maybe_fragile(src: *const u8, dst: *mut u8, len: usize, fragile: bool) -> bool {
    if !fragile {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return true;
    }
    // Bounce through a buffer: either side may be a file page.
    let mut buf = vec![0u8; len.min(256 << 10)];
    let mut off = 0;
    while off < len {
        let n = buf.len().min(len - off);
        // SAFETY: off + n <= len.
        let got = read_fragile(unsafe { src.add(off) }, &mut buf[..n]).unwrap_or(0);
        // SAFETY: as above.
        if got < n || !write_fragile(unsafe { dst.add(off) }, &buf[..n]) {
            return false;
        }
        off += n;
    }
    true
}

/// Copies up to `len` bytes from `src` to `dst`, either of which may be file pages a
/// truncation took away; returns how many were copied before the first page that could not
/// be touched (`len` when all were). The copy goes through the kernel (`process_vm_writev`
/// on this process), which reports such a page instead of raising `SIGBUS`.
///
/// # Safety
/// Both ranges must be mapped memory of at least `len` bytes (file pages may be truncated),
/// and must not overlap.
pub unsafe fn copy_checked(src: *const u8, dst: *mut u8, len: usize) -> usize {
    let mut done = 0;
    while done < len {
        // SAFETY: done < len, inside both ranges.
        let (s, d) = unsafe { (src.add(done), dst.add(done)) };
        match vm_copy(s as *mut u8, d, len - done, true) {
            Ok(0) | Err(_) => break,
            Ok(n) => done += n,
        }
    }
    done
}

/// Bytes [`crc32c_raw`] copies out and sums at a time: small enough to stay in the first
/// level cache between the copy and the sum.
const CRC_BLOCK: usize = 16 << 10;

/// CRC32C of `len` bytes of registered memory at `ptr` that a peer (or the local user) may
/// be writing meanwhile. Following the rule of [`crate::mem::region`], no `&[u8]` is ever
/// formed over such memory: the bytes are copied out a block at a time with the raw copy
/// [`crate::Region::read_at`] uses, and each private block is summed. A concurrent write
/// makes the sum that of some mix of old and new bytes (which the peer's check then reports
/// as corruption), as with a NIC computing a CRC over memory being written.
///
/// # Safety
/// `ptr` must be `len` bytes of mapped memory that is not file pages (see
/// [`crc32c_maybe_fragile`] for those).
pub(crate) unsafe fn crc32c_raw(crc: u32, ptr: *const u8, len: usize) -> u32 {
    let mut buf = [0u8; CRC_BLOCK];
    let (mut off, mut crc) = (0, crc);
    while off < len {
        let n = CRC_BLOCK.min(len - off);
        // SAFETY: off + n <= len (the caller's range); `buf` is private and n <= its size.
        unsafe { std::ptr::copy_nonoverlapping(ptr.add(off), buf.as_mut_ptr(), n) };
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        off += n;
    }
    crc
}

/// CRC32C of `len` bytes at `ptr`, read without loads when `fragile`; `None` if a page
/// could not be read.
///
/// # Safety
/// `ptr` must be `len` bytes of mapped memory (file pages may be truncated when `fragile`).
pub(crate) unsafe fn crc32c_maybe_fragile(
    crc: u32,
    ptr: *const u8,
    len: usize,
    fragile: bool,
) -> Option<u32> {
    if !fragile {
        // SAFETY: the caller's contract.
        return Some(unsafe { crc32c_raw(crc, ptr, len) });
    }
    let mut buf = vec![0u8; len.min(64 << 10)];
    let (mut off, mut crc) = (0, crc);
    while off < len {
        let n = buf.len().min(len - off);
        // SAFETY: off + n <= len.
        if read_fragile(unsafe { ptr.add(off) }, &mut buf[..n]).ok()? < n {
            return None;
        }
        crc = crc32c::crc32c_append(crc, &buf[..n]);
        off += n;
    }
    Some(crc)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use crate::mem::region::{Access, Region};
    use crate::mem::registry::Registry;

    use super::{CRC_BLOCK, crc32c_maybe_fragile, crc32c_raw};

    #[test]
    fn raw_crc_matches_across_block_boundaries_and_continues() {
        let data: Vec<u8> = (0..4 * CRC_BLOCK + 17)
            .map(|i| (i * 31 % 257) as u8)
            .collect();
        for len in [0, 1, CRC_BLOCK - 1, CRC_BLOCK, CRC_BLOCK + 1, data.len()] {
            let want = crc32c::crc32c(&data[..len]);
            // SAFETY: `data` has at least `len` bytes.
            assert_eq!(unsafe { crc32c_raw(0, data.as_ptr(), len) }, want, "{len}");
            // SAFETY: as above.
            let got = unsafe { crc32c_maybe_fragile(0, data.as_ptr(), len, false) };
            assert_eq!(got, Some(want));
            let (a, b) = data[..len].split_at(len / 3);
            // SAFETY: both halves lie within `data`.
            let split =
                unsafe { crc32c_raw(crc32c_raw(0, a.as_ptr(), a.len()), b.as_ptr(), b.len()) };
            assert_eq!(split, want, "continued at {}", len / 3);
        }
    }

    /// The CRC path reads registered memory that another thread writes at the same time
    /// (here with the bytes it already holds, so the sum is known).
    #[test]
    fn raw_crc_over_memory_being_written() {
        const LEN: usize = 3 * CRC_BLOCK + 5;
        let reg = Arc::new(Registry::default());
        let r = Region::allocate_in(&reg, LEN, Access::all()).unwrap();
        let data: Vec<u8> = (0..LEN).map(|i| (i % 199) as u8).collect();
        r.write_at(0, &data).unwrap();
        let want = crc32c::crc32c(&data);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (r, data, stop) = (r.clone(), data.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    r.write_at(0, &data).unwrap();
                }
            })
        };
        // SAFETY: test-only raw pointer to the region, alive for the loop.
        let ptr = unsafe { r.as_mut_ptr() } as *const u8;
        for _ in 0..200 {
            // SAFETY: the region has LEN bytes and outlives the loop.
            assert_eq!(unsafe { crc32c_raw(0, ptr, LEN) }, want);
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }
}
