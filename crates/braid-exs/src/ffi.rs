//! Where the C boundary needs `unsafe`, in one place: descriptors and memory that the
//! application lends the library through the ES-API, C structs zeroed, and a hook at
//! process exit. Everything above this module (the front, the braid backend, `sys`) is safe
//! code; the io_uring backend is the only other module with `unsafe`.

use std::os::fd::{BorrowedFd, RawFd};

use braid::{Access, Context, Region};

use crate::abi::Errno;

/// The descriptor number `fd`, as the application gave it (the ES-API names sockets by
/// number), borrowed for one call. `EBADF` for a negative number.
pub(crate) fn borrow_fd(fd: &RawFd) -> Result<BorrowedFd<'_>, Errno> {
    if *fd < 0 {
        return Err(libc::EBADF);
    }
    // SAFETY: not -1 (checked). The number is the application's; the ES-API contract is that
    // it stays open while the library works on it. If the application closed it anyway, the
    // kernel answers the calls made with it with EBADF (or acts on the file now under that
    // number, which braid mode detects by the socket's inode): no memory is at stake.
    Ok(unsafe { BorrowedFd::borrow_raw(*fd) })
}

// SAFETY: the raw pointers in an Op (`iov`, `msg`) refer to memory the application lent the
// library until the op's event (the ES-API contract); the op moves between the caller's
// thread and the backend's, and only one of them holds it at a time.
unsafe impl Send for crate::op::Op {}

/// A zeroed `sockaddr_storage` (a valid value: an unspecified address family).
pub(crate) fn sockaddr_zeroed() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is a plain C struct of integers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// A zeroed `msghdr` (no name, no buffers, no control data).
pub(crate) fn msghdr_zeroed() -> libc::msghdr {
    // SAFETY: msghdr is a plain C struct of integers and pointers; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// The bytes of a socket address the application passed (`exs_connect`) as a
/// `sockaddr_storage` and its length; `EINVAL` for a length that no address has.
pub(crate) fn sockaddr_from_bytes(a: &[u8]) -> Result<(libc::sockaddr_storage, u32), Errno> {
    let mut storage = sockaddr_zeroed();
    if a.len() > std::mem::size_of::<libc::sockaddr_storage>() || a.len() < 2 {
        return Err(libc::EINVAL);
    }
    // SAFETY: a.len() <= size of storage (checked); both are plain bytes, not overlapping.
    unsafe {
        std::ptr::copy_nonoverlapping(
            a.as_ptr(),
            (&mut storage as *mut libc::sockaddr_storage).cast::<u8>(),
            a.len(),
        )
    };
    Ok((storage, a.len() as u32))
}

/// Register with braid the buffer `v` that the application lent for one operation.
///
/// The caller keeps the region no longer than the operation: it drops it (revoking the key
/// and waiting for placements still using the memory) before the operation's event hands the
/// buffer back.
pub(crate) fn register_lent(
    ctx: &Context,
    v: &libc::iovec,
    access: Access,
) -> Result<Region, braid::Error> {
    // SAFETY: the ES-API contract: the application lends [iov_base, +iov_len) to the library
    // until the operation's event, and touches it meanwhile only as a buffer in flight may be
    // touched; the region is dropped before that event (see above).
    unsafe { ctx.register(v.iov_base.cast(), v.iov_len, access) }
}

/// Run `f` when the process exits normally (`exit()` or returning from `main`), as C's
/// `atexit`. Failure to register (the table is full) is ignored: the hook is best effort.
pub(crate) fn at_exit(f: extern "C" fn()) {
    // SAFETY: registering a plain extern "C" function that takes nothing and never unwinds.
    unsafe { libc::atexit(f) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_descriptors_are_ebadf() {
        assert_eq!(borrow_fd(&-1).err(), Some(libc::EBADF));
        assert!(borrow_fd(&0).is_ok());
    }

    #[test]
    fn sockaddr_bytes() {
        assert_eq!(sockaddr_from_bytes(&[1]).err(), Some(libc::EINVAL));
        assert_eq!(sockaddr_from_bytes(&[0; 200]).err(), Some(libc::EINVAL));
        let (s, len) = sockaddr_from_bytes(&[2, 0, 0x1f, 0x90]).unwrap();
        assert_eq!(len, 4);
        assert_eq!(s.ss_family, 2);
    }
}
