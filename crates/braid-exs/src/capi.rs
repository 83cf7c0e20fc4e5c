//! The `extern "C"` functions of `include/sys/exs.h`. Each checks its arguments, calls the
//! front (the `front` module), and maps errors to `-1` with `errno`. No panic crosses the
//! boundary: every body runs under `catch_unwind` (a panic is reported as `EIO`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use libc::{c_int, c_short, c_void, size_t, sockaddr, socklen_t, timespec};

use crate::abi::*;
use crate::front::global;
use crate::op::{Errno, OpKind};

fn set_errno(e: Errno) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn guard<T>(err: T, f: impl FnOnce() -> Result<T, Errno>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            err
        }
        Err(_) => {
            set_errno(libc::EIO);
            err
        }
    }
}

fn sync_ret(r: Option<usize>) -> c_int {
    r.map_or(0, |n| n.min(c_int::MAX as usize) as c_int)
}

/// See `exs_init` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_init(version: c_int) -> c_int {
    guard(-1, || {
        if version < EXS_VERSION1 {
            return Err(libc::EINVAL);
        }
        global()?;
        Ok(version.min(EXS_VERSION))
    })
}

/// See `exs_qcreate` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_qcreate(depth: c_int) -> exs_qhandle_t {
    guard(EXS_QHANDLE_INVALID, || global()?.qcreate(depth))
}

/// See `exs_qdelete` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_qdelete(q: exs_qhandle_t) -> c_int {
    guard(-1, || global()?.qdelete(q, false).map(|_| 0))
}

/// See `exs_qdequeue` in `include/sys/exs.h`.
///
/// # Safety
/// `events` must point to `|count|` writable events; `timeout` is NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_qdequeue(
    q: exs_qhandle_t,
    events: *mut exs_event_t,
    count: c_int,
    timeout: *const timespec,
) -> c_int {
    guard(-1, || {
        let g = global()?;
        let queue = g.queue(q)?;
        // A thread that comes to wait has done its sending: sends held back for it go.
        g.release_held();
        if count == 0 {
            return Ok(0);
        }
        if events.is_null() {
            return Err(libc::EFAULT);
        }
        let deadline = if timeout.is_null() {
            None
        } else {
            // SAFETY: non-null, the caller promises it is valid.
            let t = unsafe { &*timeout };
            if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                return Err(libc::EINVAL);
            }
            let d = Duration::new(t.tv_sec as u64, t.tv_nsec as u32);
            // An unrepresentable deadline is as good as no limit.
            Instant::now().checked_add(d)
        };
        let got = queue.dequeue(count as i64, deadline)?;
        for (i, c) in got.iter().enumerate() {
            // SAFETY: i < |count|, the caller promises room for |count| events.
            unsafe { events.add(i).write(c.ev) };
        }
        Ok(got.len() as c_int)
    })
}

/// See `exs_mregister` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_mregister(addr: *mut c_void, len: size_t, flags: c_int) -> exs_mhandle_t {
    guard(EXS_MHANDLE_INVALID, || {
        global()?.mregister(addr.cast(), len, flags)
    })
}

/// See `exs_mderegister` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_mderegister(mh: exs_mhandle_t) -> c_int {
    guard(-1, || global()?.mderegister(mh).map(|_| 0))
}

/// See `exs_send` in `include/sys/exs.h`.
///
/// # Safety
/// `buf` must stay valid (and untouched) until the operation's event is dequeued.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_send(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
    mh: exs_mhandle_t,
) -> c_int {
    guard(-1, || {
        global()?
            .submit_xfer(
                OpKind::Send,
                false,
                fd,
                &[(buf, len, mh)],
                flags,
                q,
                ah as usize,
                &mut None,
            )
            .map(sync_ret)
    })
}

/// See `exs_recv` in `include/sys/exs.h`.
///
/// # Safety
/// `buf` must stay valid (and untouched) until the operation's event is dequeued.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_recv(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
    mh: exs_mhandle_t,
) -> c_int {
    guard(-1, || {
        global()?
            .submit_xfer(
                OpKind::Recv,
                false,
                fd,
                &[(buf, len, mh)],
                flags,
                q,
                ah as usize,
                &mut None,
            )
            .map(sync_ret)
    })
}

/// # Safety
/// `iov` must point to `iovcnt` valid iovecs.
unsafe fn xferv(
    kind: OpKind,
    fd: c_int,
    iov: *const exs_iovec_t,
    iovcnt: c_int,
    flags: c_int,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
) -> Result<c_int, Errno> {
    if iovcnt <= 0 || iovcnt > EXS_IOV_MAX {
        return Err(libc::EINVAL);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller promises iovcnt valid entries.
    let v = unsafe { std::slice::from_raw_parts(iov, iovcnt as usize) };
    let v: Vec<_> = v
        .iter()
        .map(|e| (e.iov_base, e.iov_len, e.iov_mhandle))
        .collect();
    global()?
        .submit_xfer(kind, true, fd, &v, flags, q, ah as usize, &mut None)
        .map(sync_ret)
}

/// See `exs_sendv` in `include/sys/exs.h`.
///
/// # Safety
/// `iov` must point to `iovcnt` iovecs; their buffers stay valid until the event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_sendv(
    fd: c_int,
    iov: *const exs_iovec_t,
    iovcnt: c_int,
    flags: c_int,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
) -> c_int {
    // SAFETY: forwarded caller promise.
    guard(-1, || unsafe {
        xferv(OpKind::Send, fd, iov, iovcnt, flags, q, ah)
    })
}

/// See `exs_recvv` in `include/sys/exs.h`.
///
/// # Safety
/// `iov` must point to `iovcnt` iovecs; their buffers stay valid until the event.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_recvv(
    fd: c_int,
    iov: *const exs_iovec_t,
    iovcnt: c_int,
    flags: c_int,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
) -> c_int {
    // SAFETY: forwarded caller promise.
    guard(-1, || unsafe {
        xferv(OpKind::Recv, fd, iov, iovcnt, flags, q, ah)
    })
}

/// See `exs_connect` in `include/sys/exs.h`.
///
/// # Safety
/// `addr` must point to `addrlen` readable bytes (copied before return).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_connect(
    fd: c_int,
    addr: *const sockaddr,
    addrlen: socklen_t,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
) -> c_int {
    guard(-1, || {
        if addr.is_null() {
            return Err(libc::EFAULT);
        }
        if addrlen as usize > std::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller promises addrlen readable bytes.
        let a = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), addrlen as usize) };
        global()?
            .submit_other(OpKind::Connect, fd, Some(a), 0, q, ah as usize)
            .map(|_| 0)
    })
}

/// See `exs_accept` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_accept(fd: c_int, q: exs_qhandle_t, ah: exs_ahandle_t) -> c_int {
    guard(-1, || {
        global()?
            .submit_other(OpKind::Accept, fd, None, 0, q, ah as usize)
            .map(|_| 0)
    })
}

/// See `exs_poll` in `include/sys/exs.h`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_poll(
    fd: c_int,
    events: c_short,
    q: exs_qhandle_t,
    ah: exs_ahandle_t,
) -> c_int {
    guard(-1, || {
        if events == 0 {
            return Err(libc::EINVAL);
        }
        global()?
            .submit_other(OpKind::Poll, fd, None, events, q, ah as usize)
            .map(|_| 0)
    })
}

/// See `exs_cancel` in `include/sys/exs.h`: not implemented yet, always -1 with `ENOSYS`.
#[unsafe(no_mangle)]
pub extern "C" fn exs_cancel(_fd: c_int, _ah: exs_ahandle_t, _flags: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

/// See `exs_braid_attach` in `include/sys/exs.h`: attach a connected stream socket to a
/// braid endpoint (braid mode). Blocks for the exchange with the peer (at most 15 s).
///
/// # Safety
/// `rails` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn exs_braid_attach(
    fd: c_int,
    rails: *const libc::c_char,
    flags: c_int,
) -> c_int {
    guard(-1, || {
        let role = match flags {
            EXS_BRAID_CONNECT => crate::BraidRole::Connect,
            EXS_BRAID_ACCEPT => crate::BraidRole::Accept,
            _ => return Err(libc::EINVAL),
        };
        let spec = if rails.is_null() {
            None
        } else {
            // SAFETY: non-null; the caller promises a NUL-terminated string.
            let c = unsafe { std::ffi::CStr::from_ptr(rails) };
            Some(c.to_str().map_err(|_| libc::EINVAL)?)
        };
        global()?
            .braid_attach(fd, role, spec, crate::braid_mode::ATTACH_TIMEOUT)
            .map(|_| 0)
    })
}
