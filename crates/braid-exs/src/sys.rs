//! The system calls the front and the braid backend make on the application's sockets,
//! as safe functions over `socket2` and `rustix`: what kind of socket a descriptor is, its
//! addresses and identity, readiness, and non-blocking sends and receives with a deadline.
//! Errors are `errno` values, as the ES-API reports them.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{RecvFlags, SendFlags};
use socket2::{SockRef, Type};

use crate::abi::Errno;
use crate::ffi::borrow_fd;

fn errno(e: std::io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// The socket type of `fd` (`SO_TYPE`); `ENOTSOCK`, `EBADF` for what is not a socket.
pub(crate) fn socket_type(fd: RawFd) -> Result<Type, Errno> {
    SockRef::from(&borrow_fd(&fd)?).r#type().map_err(errno)
}

/// `Ok` if `fd` is a socket (of any type).
pub(crate) fn probe_socket(fd: RawFd) -> Result<(), Errno> {
    socket_type(fd).map(drop)
}

/// `Ok` if `fd` is a stream socket, `EOPNOTSUPP` for another kind of socket.
pub(crate) fn probe_stream_socket(fd: RawFd) -> Result<(), Errno> {
    if socket_type(fd)? != Type::STREAM {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

/// The peer's address of a connected socket (`ENOTCONN` if none); `None` inside for an
/// address that is not IPv4 or IPv6 (a Unix socket).
pub(crate) fn peer_addr(fd: RawFd) -> Result<Option<SocketAddr>, Errno> {
    let a = SockRef::from(&borrow_fd(&fd)?).peer_addr().map_err(errno)?;
    Ok(a.as_socket())
}

/// The local IP address of a bound IPv4 or IPv6 socket (an IPv4-mapped IPv6 address as
/// IPv4); `EOPNOTSUPP` for other families.
pub(crate) fn local_ip(fd: RawFd) -> Result<IpAddr, Errno> {
    let a = SockRef::from(&borrow_fd(&fd)?)
        .local_addr()
        .map_err(errno)?;
    a.as_socket()
        .map(|s| canonical_ip(s.ip()))
        .ok_or(libc::EOPNOTSUPP)
}

/// An IPv4-mapped IPv6 address as the IPv4 address it maps; others unchanged.
pub(crate) fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// (device, inode) of the file behind `fd`: tells a descriptor number reused for another
/// socket from the one it was.
pub(crate) fn file_id(fd: RawFd) -> Option<(u64, u64)> {
    let st = rustix::fs::fstat(borrow_fd(&fd).ok()?).ok()?;
    Some((st.st_dev as u64, st.st_ino as u64))
}

/// One `poll` of `fd` for `events`, waiting at most `ms` milliseconds; the events that
/// occurred (empty on timeout). `EINTR` is returned, not retried.
fn poll_once(fd: RawFd, events: PollFlags, ms: u64) -> Result<PollFlags, Errno> {
    let b = borrow_fd(&fd)?;
    let mut fds = [PollFd::new(&b, events)];
    let t = Timespec {
        tv_sec: (ms / 1000) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as _,
    };
    match rustix::event::poll(&mut fds, Some(&t)) {
        Ok(0) => Ok(PollFlags::empty()),
        Ok(_) => Ok(fds[0].revents()),
        Err(e) => Err(e.raw_os_error()),
    }
}

/// Whether `fd` has bytes (or end of stream) to read now.
pub(crate) fn readable(fd: RawFd) -> bool {
    poll_once(fd, PollFlags::IN, 0).is_ok_and(|r| !r.is_empty())
}

/// What the far end of a stream socket did, as seen without reading from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hangup {
    /// Nothing (or only data to read).
    None,
    /// The peer shut down its direction, or the connection broke.
    Peer,
    /// The descriptor is no longer open here.
    Closed,
}

/// Check `fd` for the peer's end of stream without waiting (`POLLRDHUP`).
pub(crate) fn hangup(fd: RawFd) -> Hangup {
    match poll_once(fd, PollFlags::RDHUP, 0) {
        Err(libc::EBADF) => Hangup::Closed,
        Ok(r) if r.contains(PollFlags::NVAL) => Hangup::Closed,
        Ok(r) if r.intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR) => Hangup::Peer,
        _ => Hangup::None,
    }
}

/// Wait until `fd` is ready for `events` or `deadline` passes (`ETIMEDOUT`).
fn wait(fd: RawFd, events: PollFlags, deadline: Instant) -> Result<(), Errno> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(libc::ETIMEDOUT);
        }
        let ms = (left.as_millis() as u64).clamp(1, 1000);
        match poll_once(fd, events, ms) {
            Ok(r) if r.contains(PollFlags::NVAL) => return Err(libc::EBADF),
            Ok(r) if !r.is_empty() => return Ok(()),
            Ok(_) | Err(libc::EINTR) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Send all of `b` on the stream socket `fd` (never raising `SIGPIPE`), waiting for room
/// until `deadline`.
pub(crate) fn write_all(fd: RawFd, mut b: &[u8], deadline: Instant) -> Result<(), Errno> {
    while !b.is_empty() {
        let r = rustix::net::send(
            borrow_fd(&fd)?,
            b,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        );
        match r {
            Ok(n) => b = &b[n..],
            Err(rustix::io::Errno::AGAIN) => wait(fd, PollFlags::OUT, deadline)?,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.raw_os_error()),
        }
    }
    Ok(())
}

/// Fill `b` from the stream socket `fd`, waiting for bytes until `deadline`;
/// `ECONNRESET` if the stream ends first.
pub(crate) fn read_exact(fd: RawFd, mut b: &mut [u8], deadline: Instant) -> Result<(), Errno> {
    while !b.is_empty() {
        match rustix::net::recv(borrow_fd(&fd)?, &mut *b, RecvFlags::DONTWAIT) {
            // The peer closed during the exchange (or is not speaking this protocol).
            Ok((0, _)) => return Err(libc::ECONNRESET),
            Ok((n, _)) => b = &mut b[n..],
            Err(rustix::io::Errno::AGAIN) => wait(fd, PollFlags::IN, deadline)?,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.raw_os_error()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    #[test]
    fn kinds_of_descriptor() {
        let (a, _b) = pair();
        assert_eq!(probe_stream_socket(a.as_raw_fd()), Ok(()));
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(probe_socket(u.as_raw_fd()), Ok(()));
        assert_eq!(probe_stream_socket(u.as_raw_fd()), Err(libc::EOPNOTSUPP));
        let f = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(probe_socket(f.as_raw_fd()), Err(libc::ENOTSOCK));
        assert_eq!(probe_socket(-1), Err(libc::EBADF));
        assert_eq!(local_ip(a.as_raw_fd()), Ok("127.0.0.1".parse().unwrap()));
        assert_eq!(peer_addr(a.as_raw_fd()), Ok(Some(a.peer_addr().unwrap())));
        assert_eq!(peer_addr(u.as_raw_fd()), Err(libc::ENOTCONN));
        assert!(file_id(a.as_raw_fd()).is_some());
        assert_ne!(file_id(a.as_raw_fd()), file_id(u.as_raw_fd()));
        assert_eq!(file_id(-5), None);
    }

    #[test]
    fn exchange_with_deadlines() {
        let (a, mut b) = pair();
        let fd = a.as_raw_fd();
        let soon = || Instant::now() + Duration::from_secs(10);
        assert!(!readable(fd));
        assert_eq!(hangup(fd), Hangup::None);
        b.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        read_exact(fd, &mut got, soon()).unwrap();
        assert_eq!(&got, b"hello");
        // Nothing more arrives: the deadline ends the wait.
        let t = Instant::now();
        let mut one = [0u8; 1];
        assert_eq!(
            read_exact(fd, &mut one, t + Duration::from_millis(30)),
            Err(libc::ETIMEDOUT)
        );
        write_all(fd, b"back", soon()).unwrap();
        b.shutdown(Shutdown::Write).unwrap();
        assert!(readable(fd));
        assert_eq!(hangup(fd), Hangup::Peer);
        assert_eq!(read_exact(fd, &mut one, soon()), Err(libc::ECONNRESET));
        let mut back = [0u8; 4];
        std::io::Read::read_exact(&mut b, &mut back).unwrap();
        assert_eq!(&back, b"back");
    }
}
