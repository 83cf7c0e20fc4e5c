//! Thin socket I/O for rails: vectored non-blocking send and receive on raw descriptors.

use std::io;
use std::os::fd::RawFd;

/// Most iovec entries handed to one system call: a 1 MiB chunk of a vectored operation of
/// 256 pieces of 4 KiB (plus its header and the next one's) goes in one call.
const MAX_IOV: usize = 512;

/// An iovec array for one system call, not zeroed: small frames pay nothing for it.
type IovArray = [std::mem::MaybeUninit<libc::iovec>; MAX_IOV];

/// Writes the iovecs for `pieces` minus their first `skip` bytes (at most [`MAX_IOV`]) into
/// `iov` and returns how many: the first `n` entries are then initialised. The array is the
/// caller's, filled in place: returned by value, its 8 KiB were copied on every call (16%
/// of a busy-polling TCP ping-pong's time went to that copy).
fn iovecs(
    iov: &mut IovArray,
    pieces: impl Iterator<Item = (*mut u8, usize)>,
    mut skip: usize,
) -> usize {
    let mut n = 0;
    for (p, l) in pieces {
        if skip >= l {
            skip -= l;
            continue;
        }
        if n == MAX_IOV {
            break;
        }
        // SAFETY: skip < l, so the pointer stays inside the piece.
        iov[n].write(libc::iovec {
            iov_base: unsafe { p.add(skip) }.cast(),
            iov_len: l - skip,
        });
        skip = 0;
        n += 1;
    }
    n
}

/// Retries a system call interrupted by a signal.
fn retry(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let r = call();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Sends from `pieces` starting `skip` bytes in; returns bytes sent. `WouldBlock` when the
/// socket buffer is full.
pub(crate) fn send_pieces(
    fd: RawFd,
    pieces: &[(*const u8, usize)],
    skip: usize,
) -> io::Result<usize> {
    let mut iov: IovArray = [std::mem::MaybeUninit::uninit(); MAX_IOV];
    let n = iovecs(
        &mut iov,
        pieces.iter().map(|&(p, l)| (p as *mut u8, l)),
        skip,
    );
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is valid; iov points at n initialised entries.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr().cast();
    msg.msg_iovlen = n as _;
    // SAFETY: msg is fully initialised; the pieces are kept alive by the caller.
    retry(|| unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) })
}

/// Bytes one vectored receive asked for and got.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Bytes received (0 = peer closed).
    pub(crate) got: usize,
    /// Bytes the call had room for: fewer than all of `pieces` and `tail` when they need
    /// more than [`MAX_IOV`] entries. Only `got < asked` says the socket is empty.
    pub(crate) asked: usize,
}

/// Receives into `pieces` starting `skip` bytes in, then into `tail` (if any room is left
/// in the iovec array).
pub(crate) fn recv_pieces(
    fd: RawFd,
    pieces: &[(*mut u8, usize)],
    skip: usize,
    tail: Option<(*mut u8, usize)>,
) -> io::Result<Received> {
    let mut iov: IovArray = [std::mem::MaybeUninit::uninit(); MAX_IOV];
    let n = iovecs(&mut iov, pieces.iter().copied().chain(tail), skip);
    // SAFETY: the first n entries are initialised.
    let asked = iov[..n]
        .iter()
        .map(|v| unsafe { v.assume_init_ref() }.iov_len)
        .sum();
    if n == 0 {
        return Ok(Received { got: 0, asked });
    }
    // SAFETY: iov has n initialised entries pointing into pinned registered memory.
    let got = retry(|| unsafe { libc::readv(fd, iov.as_ptr().cast(), n as i32) })?;
    Ok(Received { got, asked })
}

/// Receives into `buf`; returns bytes received (0 = peer closed).
pub(crate) fn recv_into(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid writable slice.
    retry(|| unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) })
}

/// Bytes waiting in the socket's receive queue (`FIONREAD`).
pub(crate) fn bytes_waiting(fd: RawFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer.
    let r = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
    if r == 0 {
        Ok(n.max(0) as usize)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets the socket's receive low-water mark: readiness (and the wakeup) is reported only
/// once `bytes` are queued, or on end of stream or error.
pub(crate) fn set_rcvlowat(fd: RawFd, bytes: usize) -> io::Result<()> {
    let v = bytes.min(i32::MAX as usize / 2) as libc::c_int;
    // SAFETY: a valid pointer to an int of the stated size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// What the kernel knows of a TCP connection (from `TCP_INFO`).
pub(crate) struct TcpInfo {
    /// Most recent delivery-rate sample, bytes per second (`tcpi_delivery_rate`); `None`
    /// when not measured yet.
    pub(crate) delivery_rate: Option<f64>,
    /// Time since data last arrived on the connection (`tcpi_last_data_recv`), whether or
    /// not it has been read.
    pub(crate) since_data_recv: std::time::Duration,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub(crate) unacked: u32,
    /// Time since an acknowledgement last arrived, duplicates included
    /// (`tcpi_last_ack_recv`).
    pub(crate) since_ack_recv: std::time::Duration,
    /// Smoothed round-trip time (`tcpi_rtt`).
    pub(crate) rtt: std::time::Duration,
}

/// Samples `TCP_INFO` of a socket; `None` when unavailable.
pub(crate) fn tcp_info(fd: RawFd) -> Option<TcpInfo> {
    // SAFETY: tcp_info is plain data; the kernel fills at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: valid pointers to `info` and `len`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return None;
    }
    let have_rate = std::mem::offset_of!(libc::tcp_info, tcpi_delivery_rate) + 8;
    Some(TcpInfo {
        delivery_rate: (len as usize >= have_rate && info.tcpi_delivery_rate > 0)
            .then_some(info.tcpi_delivery_rate as f64),
        since_data_recv: std::time::Duration::from_millis(info.tcpi_last_data_recv as u64),
        unacked: info.tcpi_unacked,
        since_ack_recv: std::time::Duration::from_millis(info.tcpi_last_ack_recv as u64),
        rtt: std::time::Duration::from_micros(info.tcpi_rtt as u64),
    })
}
