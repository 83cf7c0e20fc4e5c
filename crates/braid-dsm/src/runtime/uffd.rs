//! The process's userfaultfd: creation with a clear error when it is not permitted, and the
//! operations the service thread needs (install a page read-only or writable, write-protect,
//! unprotect, drop, wake, read fault events).
//!
//! Ranges are registered for missing and write-protect faults. A missing fault (any access
//! to an absent page) or a write-protect fault (a write to a page installed read-only) blocks
//! the thread until the service thread resolves it with `UFFDIO_COPY` or
//! `UFFDIO_WRITEPROTECT`, both of which wake every thread waiting on the page.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use linux_raw_sys::general as sys;
use linux_raw_sys::ioctl as nr;

use crate::error::DsmError;

/// `UFFDIO_WRITEPROTECT_MODE_WP` of `<linux/userfaultfd.h>` (`(__u64)1 << 0`): set write
/// protection; without it the ioctl clears it (and wakes the waiters unless
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`). `linux-raw-sys` does not carry this constant (bindgen
/// drops the casted shift): the only number here not taken from that crate.
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// Size of one kernel fault message.
const MSG_LEN: usize = std::mem::size_of::<sys::uffd_msg>();

/// Room for the fault messages one `read(2)` may return.
pub(crate) struct EventBuffer(Vec<u8>);

impl EventBuffer {
    /// Room for `messages` fault messages.
    pub(crate) fn new(messages: usize) -> EventBuffer {
        EventBuffer(vec![0; messages.max(1) * MSG_LEN])
    }
}

/// One fault read from the userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault {
    /// Faulting address.
    pub addr: usize,
    /// A write (to an absent or write-protected page).
    pub write: bool,
}

/// The process's userfaultfd.
pub(crate) struct Faults {
    fd: OwnedFd,
    /// Kernel-mode faults (system calls touching absent pages) are not handled: they fail
    /// with `EFAULT` instead.
    pub user_mode_only: bool,
}

fn not_permitted(errno: i32, user_mode_only: bool) -> DsmError {
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    let how = if user_mode_only {
        "even for user-mode faults only (BRAID_DSM_USER_FAULTS_ONLY=1)"
    } else {
        "with kernel-mode faults (needed so that system calls may touch shared pages)"
    };
    DsmError::UserfaultfdNotPermitted(format!(
        "userfaultfd(2) is not permitted for this process {how}: {} (vm.unprivileged_userfaultfd = {sysctl}). \
         Run as root or with CAP_SYS_PTRACE, or let unprivileged users handle faults with \
         `sysctl vm.unprivileged_userfaultfd=1`; with the sysctl at 0, BRAID_DSM_USER_FAULTS_ONLY=1 \
         accepts user-mode faults only (system calls on absent shared pages then fail with EFAULT). \
         Containers may also forbid userfaultfd in their seccomp profile.",
        io::Error::from_raw_os_error(errno)
    ))
}

/// A range as the kernel takes it.
fn range(addr: *mut u8, len: usize) -> sys::uffdio_range {
    sys::uffdio_range {
        start: addr as u64,
        len: len as u64,
    }
}

impl Faults {
    /// Creates the userfaultfd (non-blocking, close-on-exec) with write-protect faults.
    pub(crate) fn open(user_mode_only: bool) -> Result<Faults, DsmError> {
        let mut flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        if user_mode_only {
            flags |= sys::UFFD_USER_MODE_ONLY as i32;
        }
        // SAFETY: userfaultfd(2) takes one integer and touches no memory of ours; the result
        // is checked.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as RawFd;
        if fd < 0 {
            let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(match errno {
                libc::EPERM | libc::EACCES => not_permitted(errno, user_mode_only),
                libc::ENOSYS => DsmError::Unsupported(
                    "this kernel has no userfaultfd(2) (CONFIG_USERFAULTFD)".into(),
                ),
                _ => DsmError::Os("userfaultfd(2)".into(), io::Error::from_raw_os_error(errno)),
            });
        }
        // SAFETY: a fresh descriptor nobody else owns; OwnedFd closes it once.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut api = sys::uffdio_api {
            api: sys::UFFD_API.into(),
            features: sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP.into(),
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes one `uffdio_api`, which `api` is, on our
        // descriptor.
        if unsafe { libc::ioctl(fd.as_raw_fd(), nr::UFFDIO_API as _, &mut api) } < 0 {
            return Err(DsmError::Unsupported(format!(
                "userfaultfd write-protect faults (UFFD_FEATURE_PAGEFAULT_FLAG_WP, Linux 5.7+): {}",
                io::Error::last_os_error()
            )));
        }
        Ok(Faults { fd, user_mode_only })
    }

    /// The descriptor, readable when faults wait.
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `len` bytes at `base` for missing and write-protect faults.
    pub(crate) fn register(&self, base: *mut u8, len: usize) -> Result<(), DsmError> {
        let mut reg = sys::uffdio_register {
            range: range(base, len),
            mode: (sys::UFFDIO_REGISTER_MODE_MISSING | sys::UFFDIO_REGISTER_MODE_WP).into(),
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes one `uffdio_register`, which `reg` is; the
        // kernel checks the range (a bad one is EINVAL/ENOMEM, not undefined behaviour).
        if unsafe { libc::ioctl(self.fd(), nr::UFFDIO_REGISTER as _, &mut reg) } < 0 {
            return Err(DsmError::Unsupported(format!(
                "registering the shared range with userfaultfd: {}",
                io::Error::last_os_error()
            )));
        }
        let needed = (1u64 << sys::_UFFDIO_COPY) | (1u64 << sys::_UFFDIO_WRITEPROTECT);
        if reg.ioctls & needed != needed {
            return Err(DsmError::Unsupported(format!(
                "userfaultfd offers ioctls {:#x} on anonymous memory, braid-dsm needs COPY and WRITEPROTECT ({needed:#x})",
                reg.ioctls
            )));
        }
        Ok(())
    }

    /// Maps the absent page at `dst` with the `len` bytes at `src`, write-protected unless
    /// `writable`, and wakes the threads waiting on it.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes; `dst` a registered page-aligned range.
    pub(crate) unsafe fn install(
        &self,
        dst: *mut u8,
        src: *const u8,
        len: usize,
        writable: bool,
    ) -> io::Result<()> {
        let mut copy = sys::uffdio_copy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if writable {
                0
            } else {
                sys::UFFDIO_COPY_MODE_WP.into()
            },
            copy: 0,
        };
        loop {
            // SAFETY: UFFDIO_COPY reads and writes one `uffdio_copy`, which `copy` is; the
            // caller vouches for the source and destination ranges.
            let r = unsafe { libc::ioctl(self.fd(), nr::UFFDIO_COPY as _, &mut copy) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            // EAGAIN: the mapping changed under the copy; retry the rest.
            if e.raw_os_error() == Some(libc::EAGAIN) && copy.copy >= 0 {
                let done = copy.copy as u64;
                copy.dst += done;
                copy.src += done;
                copy.len -= done;
                copy.copy = 0;
                if copy.len == 0 {
                    return Ok(());
                }
                continue;
            }
            return Err(e);
        }
    }

    /// `UFFDIO_WRITEPROTECT` on the page(s) at `addr` with `mode`.
    fn write_protect(&self, addr: *mut u8, len: usize, mode: u64, what: &str) -> io::Result<()> {
        let mut wp = sys::uffdio_writeprotect {
            range: range(addr, len),
            mode,
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads one `uffdio_writeprotect`, which `wp` is; it only
        // changes protection inside the registered range the kernel checks.
        if unsafe { libc::ioctl(self.fd(), nr::UFFDIO_WRITEPROTECT as _, &mut wp) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
        }
        Ok(())
    }

    /// Write-protects the present page(s) at `addr`: later writes fault.
    pub(crate) fn protect(&self, addr: *mut u8, len: usize) -> io::Result<()> {
        self.write_protect(addr, len, WRITEPROTECT_MODE_WP, "UFFDIO_WRITEPROTECT")
    }

    /// Lifts write protection of the page(s) at `addr` and wakes their waiters.
    pub(crate) fn unprotect(&self, addr: *mut u8, len: usize) -> io::Result<()> {
        // No WP bit: clear; no DONTWAKE bit: wake the waiters.
        self.write_protect(addr, len, 0, "UFFDIO_WRITEPROTECT (clear)")
    }

    /// Wakes threads waiting on the page(s) at `addr`.
    pub(crate) fn wake(&self, addr: *mut u8, len: usize) -> io::Result<()> {
        let mut r = range(addr, len);
        // SAFETY: UFFDIO_WAKE reads one `uffdio_range`, which `r` is.
        if unsafe { libc::ioctl(self.fd(), nr::UFFDIO_WAKE as _, &mut r) } < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(e.kind(), format!("UFFDIO_WAKE: {e}")));
        }
        Ok(())
    }

    /// Reads the faults waiting (none when the queue is empty) into `out`.
    pub(crate) fn read(&self, buf: &mut EventBuffer, out: &mut Vec<Fault>) -> io::Result<()> {
        // SAFETY: read(2) into our buffer of exactly `buf.0.len()` bytes.
        let n = unsafe { libc::read(self.fd(), buf.0.as_mut_ptr().cast(), buf.0.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) => Ok(()),
                _ => Err(e),
            };
        }
        let n = n as usize;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "userfaultfd read returned end of file",
            ));
        }
        if !n.is_multiple_of(MSG_LEN) {
            return Err(io::Error::other(format!(
                "userfaultfd read {n} bytes, not a whole number of {MSG_LEN}-byte messages"
            )));
        }
        for chunk in buf.0[..n].chunks_exact(MSG_LEN) {
            // SAFETY: `chunk` holds MSG_LEN bytes the kernel wrote as a `uffd_msg`, a plain
            // (packed, alignment 1) C structure valid for any bit pattern.
            let msg = unsafe { chunk.as_ptr().cast::<sys::uffd_msg>().read_unaligned() };
            if u32::from(msg.event) != sys::UFFD_EVENT_PAGEFAULT {
                continue; // no other event was asked for (no UFFD_FEATURE_EVENT_*)
            }
            // SAFETY: a page-fault message carries the `pagefault` member of the union.
            let pf = unsafe { msg.arg.pagefault };
            out.push(Fault {
                addr: pf.address as usize,
                write: pf.flags & u64::from(sys::UFFD_PAGEFAULT_FLAG_WRITE) != 0,
            });
        }
        Ok(())
    }
}

/// Discards the pages at `addr` (their next access faults as missing).
pub(crate) fn drop_pages(addr: *mut u8, len: usize) -> io::Result<()> {
    // SAFETY: the range is inside our reservation; discarding anonymous pages is defined.
    if unsafe { libc::madvise(addr.cast(), len, libc::MADV_DONTNEED) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The kernel behaviour the runtime relies on, checked on this kernel.

    use super::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    const PAGE: usize = 4096;

    struct Reservation(*mut u8, usize);
    impl Drop for Reservation {
        fn drop(&mut self) {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(self.0.cast(), self.1) };
        }
    }

    fn wait_fault(f: &Faults, buf: &mut EventBuffer) -> Fault {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mut out = Vec::new();
            f.read(buf, &mut out).unwrap();
            if let Some(x) = out.pop() {
                return x;
            }
            assert!(std::time::Instant::now() < deadline, "no fault within 10 s");
            std::thread::yield_now();
        }
    }

    #[test]
    fn missing_and_write_protect_faults_on_a_reserved_range() {
        let f = match Faults::open(false) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let len = 16 * PAGE;
        // SAFETY: fresh anonymous reservation, checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base.cast::<u8>();
        let _guard = Reservation(base, len);
        f.register(base, len).unwrap();
        // SAFETY: inside our reservation.
        assert_eq!(
            unsafe { libc::mprotect(base.cast(), 8 * PAGE, libc::PROT_READ | libc::PROT_WRITE) },
            0
        );
        let addr = base as usize;
        let p0 = move || unsafe { AtomicU8::from_ptr(addr as *mut u8) };
        let mut buf = EventBuffer::new(16);
        let src = vec![7u8; PAGE];

        // A read of an absent page faults as a read; install read-only.
        let t = std::thread::spawn(move || p0().load(Ordering::SeqCst));
        let x = wait_fault(&f, &mut buf);
        assert_eq!((x.addr & !(PAGE - 1), x.write), (addr, false));
        unsafe { f.install(base, src.as_ptr(), PAGE, false) }.unwrap();
        assert_eq!(t.join().unwrap(), 7);

        // A write to it faults as write-protect; lifting the protection lets it through.
        let t = std::thread::spawn(move || p0().store(9, Ordering::SeqCst));
        let x = wait_fault(&f, &mut buf);
        assert_eq!((x.addr & !(PAGE - 1), x.write), (addr, true));
        f.unprotect(base, PAGE).unwrap();
        t.join().unwrap();
        assert_eq!(p0().load(Ordering::SeqCst), 9);

        // Protecting again makes the next write fault.
        f.protect(base, PAGE).unwrap();
        let t = std::thread::spawn(move || p0().store(10, Ordering::SeqCst));
        let x = wait_fault(&f, &mut buf);
        assert!(x.write);
        f.unprotect(base, PAGE).unwrap();
        t.join().unwrap();

        // Dropping makes the next access a missing fault again; a write to an absent page
        // faults as a write.
        drop_pages(base, PAGE).unwrap();
        let t = std::thread::spawn(move || p0().store(11, Ordering::SeqCst));
        let x = wait_fault(&f, &mut buf);
        assert!(x.write);
        unsafe { f.install(base, src.as_ptr(), PAGE, true) }.unwrap();
        t.join().unwrap();
        assert_eq!(p0().load(Ordering::SeqCst), 11);

        // Installing over a present page is refused, not silently done.
        let e = unsafe { f.install(base, src.as_ptr(), PAGE, true) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        // Nothing else is queued.
        let mut out = Vec::new();
        f.read(&mut buf, &mut out).unwrap();
        assert!(out.is_empty());
    }
}

#[cfg(test)]
mod costs {
    //! `cargo test -p braid-dsm --release --lib uffd_costs -- --ignored --nocapture`:
    //! what each primitive costs on this machine (no waiters involved).
    use super::*;
    use std::time::Instant;

    #[test]
    #[ignore]
    fn uffd_costs() {
        let f = Faults::open(false).unwrap();
        const PAGE: usize = 4096;
        let n = 20_000;
        let len = n * PAGE;
        // SAFETY: fresh mapping, checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        } as *mut u8;
        f.register(base, len).unwrap();
        let src = vec![1u8; PAGE];
        let per = |t: Instant| t.elapsed().as_nanos() as f64 / n as f64 / 1000.0;
        let t = Instant::now();
        for i in 0..n {
            unsafe { f.install(base.add(i * PAGE), src.as_ptr(), PAGE, false) }.unwrap();
        }
        println!("UFFDIO_COPY (WP) fresh page: {:.2} us", per(t));
        let t = Instant::now();
        for i in 0..n {
            f.unprotect(unsafe { base.add(i * PAGE) }, PAGE).unwrap();
        }
        println!("unprotect: {:.2} us", per(t));
        let t = Instant::now();
        for i in 0..n {
            f.protect(unsafe { base.add(i * PAGE) }, PAGE).unwrap();
        }
        println!("protect: {:.2} us", per(t));
        let mut dst = vec![0u8; PAGE];
        let t = Instant::now();
        for i in 0..n {
            unsafe { std::ptr::copy_nonoverlapping(base.add(i * PAGE), dst.as_mut_ptr(), PAGE) };
        }
        println!("memcpy out of a page: {:.2} us", per(t));
        let t = Instant::now();
        for i in 0..n {
            drop_pages(unsafe { base.add(i * PAGE) }, PAGE).unwrap();
        }
        println!("MADV_DONTNEED: {:.2} us", per(t));
        let t = Instant::now();
        for i in 0..n {
            unsafe { f.install(base.add(i * PAGE), src.as_ptr(), PAGE, true) }.unwrap();
        }
        println!("UFFDIO_COPY again (after drop): {:.2} us", per(t));
        let t = Instant::now();
        for i in 0..n {
            f.wake(unsafe { base.add(i * PAGE) }, PAGE).unwrap();
        }
        println!("UFFDIO_WAKE (no waiter): {:.2} us", per(t));
        unsafe { libc::munmap(base.cast(), len) };
    }
}
