//! Local link events: a rail whose network device goes down, loses its carrier or loses
//! its address is failed at once, instead of after [`braid_proto::SessionConfig::peer_timeout`]
//! of silence.
//!
//! The engine keeps one rtnetlink socket per network namespace its rails live in,
//! subscribed to link, address and route changes. Any message on one makes the engine look
//! at the device under each live rail's local address. The look is taken through ioctls on
//! the rail's own socket, so in the rail's namespace, whichever namespace the engine thread
//! is in. The messages themselves are not parsed: they are rare, and asking the kernel
//! again is simpler than keeping a copy of its tables.

use std::collections::HashMap;
use std::ffi::CStr;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;

use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// Link, address and route changes, IPv4 and IPv6.
const GROUPS: u32 = (libc::RTMGRP_LINK
    | libc::RTMGRP_IPV4_IFADDR
    | libc::RTMGRP_IPV6_IFADDR
    | libc::RTMGRP_IPV4_ROUTE
    | libc::RTMGRP_IPV6_ROUTE) as u32;

/// Most interface addresses looked through (`SIOCGIFCONF`).
const MAX_IFADDRS: usize = 256;

/// `SIOCETHTOOL` and its `ETHTOOL_GLINK` command (linux/sockios.h, linux/ethtool.h).
const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GLINK: u32 = 0x0000_000a;

/// `struct ethtool_value`.
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// The rtnetlink sockets of the namespaces the engine's rails live in.
#[derive(Default)]
pub(crate) struct LinkWatch {
    /// By namespace (device, inode); `None` where no socket could be made there.
    by_ns: HashMap<(u64, u64), Option<OwnedFd>>,
}

impl LinkWatch {
    /// Makes sure the namespace of socket `fd` is watched. Returns the descriptor of a new
    /// watch, for the caller to poll; `None` when the namespace is watched already or cannot
    /// be (the rail then relies on its other failure signals).
    pub(crate) fn watch(&mut self, fd: RawFd) -> Option<RawFd> {
        let ns = socket_netns(fd).ok()?;
        let m = std::fs::File::from(ns.try_clone().ok()?).metadata().ok()?;
        let id = (m.dev(), m.ino());
        if self.by_ns.contains_key(&id) {
            return None;
        }
        let sock = match route_socket_in(&ns, id) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!("no link events for a rail's namespace: {e}");
                None
            }
        };
        let raw = sock.as_ref().map(|s| s.as_raw_fd());
        self.by_ns.insert(id, sock);
        raw
    }

    /// Reads every message waiting on watch `fd` (their content does not matter).
    pub(crate) fn drain(&self, fd: RawFd) {
        let Some(sock) = self.by_ns.values().flatten().find(|s| s.as_raw_fd() == fd) else {
            return;
        };
        let mut buf = [0u8; 8192];
        loop {
            match rustix::net::recv(sock, &mut buf, RecvFlags::DONTWAIT) {
                Ok((0, _)) => return,
                Ok(_) => {}
                // Overrun: messages were lost, which the full look that follows covers.
                Err(rustix::io::Errno::NOBUFS) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
        }
    }
}

/// The network namespace of socket `fd` (`SIOCGSKNS`).
fn socket_netns(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor or -1.
    let r = unsafe { libc::ioctl(fd, libc::SIOCGSKNS as _) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor the kernel just handed us.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

/// An rtnetlink socket in namespace `ns` (identified by `id`), subscribed to [`GROUPS`].
/// A socket belongs to the namespace of the thread that makes it: in another namespace a
/// short-lived thread enters it (`setns`, which needs `CAP_SYS_ADMIN`) and makes it there.
fn route_socket_in(ns: &OwnedFd, id: (u64, u64)) -> io::Result<OwnedFd> {
    let here = std::fs::metadata("/proc/thread-self/ns/net")?;
    if (here.dev(), here.ino()) == id {
        return route_socket();
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))?;
            route_socket()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })
}

fn route_socket() -> io::Result<OwnedFd> {
    let fd = rustix::net::socket_with(
        AddressFamily::NETLINK,
        SocketType::RAW,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        // NETLINK_ROUTE is protocol 0.
        None,
    )?;
    rustix::net::bind(&fd, &SocketAddrNetlink::new(0, GROUPS))?;
    Ok(fd)
}

/// What is wrong with the local device under socket `fd`, if anything: it is down, has no
/// carrier, or the socket's local address is on no device any more. `None` when all is
/// well or nothing can be told (IPv6: `SIOCGIFCONF` lists IPv4 addresses only).
///
/// The carrier is asked of the driver (`ETHTOOL_GLINK`), which knows at once; the
/// operational state (`IFF_RUNNING`) only where the driver does not say. That state and the
/// rtnetlink event follow the kernel's link-watch work, which delays a change by up to a
/// second after the previous one (the far end of a veth pair whose near end went down
/// showed `NO-CARRIER` 200 ms late in one of three tries here), and on the testbed it once
/// showed a rail's device not running, under load, while another rail went down (in 1 of
/// 14 runs of `braid soak --failover-transfer`; its driver said the carrier was there).
pub(crate) fn local_fault(fd: RawFd) -> Option<String> {
    // SAFETY: `fd` is a socket the caller holds open for the duration of the call.
    let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let local = rustix::net::getsockname(sock).ok()?;
    let ip = match std::net::SocketAddr::try_from(local).ok()? {
        std::net::SocketAddr::V4(a) => *a.ip(),
        std::net::SocketAddr::V6(_) => return None,
    };
    match device_of(fd, ip) {
        Ok(Some((name, flags))) => {
            if flags & libc::IFF_UP == 0 {
                Some(format!("local device {name} of {ip} is down"))
            } else if !carrier(fd, &name).unwrap_or(flags & libc::IFF_RUNNING != 0) {
                Some(format!("local device {name} of {ip} has no carrier"))
            } else {
                None
            }
        }
        // Every 127/8 address is local through lo without being listed.
        Ok(None) if !ip.is_loopback() => Some(format!("local address {ip} is on no device")),
        _ => None,
    }
}

/// The network namespace of socket `fd` and the name of the device holding its local
/// (IPv4) address: where a raw rail under the socket's connection opens its port.
pub(crate) fn device_of_socket(fd: RawFd) -> io::Result<(OwnedFd, String)> {
    // SAFETY: `fd` is a socket the caller holds open for the duration of the call.
    let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let local = rustix::net::getsockname(sock)?;
    let ip = match std::net::SocketAddr::try_from(local).map_err(io::Error::other)? {
        std::net::SocketAddr::V4(a) => *a.ip(),
        std::net::SocketAddr::V6(a) => {
            return Err(io::Error::other(format!("{a}: raw rails are IPv4 only")));
        }
    };
    let name = match device_of(fd, ip)? {
        Some((name, _)) => name,
        // Every 127/8 address is local through lo without being listed.
        None if ip.is_loopback() => "lo".to_string(),
        None => {
            return Err(io::Error::other(format!(
                "local address {ip} is on no device"
            )));
        }
    };
    Ok((socket_netns(fd)?, name))
}

/// Whether device `name` (in the namespace of socket `fd`) has a carrier, as its driver
/// tells; `None` when it does not say.
fn carrier(fd: RawFd, name: &str) -> Option<bool> {
    let mut value = EthtoolValue {
        cmd: ETHTOOL_GLINK,
        data: 0,
    };
    // SAFETY: ifreq is plain data.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return None;
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
    // SAFETY: `req` names the device and points at `value`, which outlives the call.
    if unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &mut req) } < 0 {
        return None;
    }
    Some(value.data != 0)
}

/// The device holding address `ip` in the namespace of socket `fd`, with its flags.
fn device_of(fd: RawFd, ip: Ipv4Addr) -> io::Result<Option<(String, i32)>> {
    // SAFETY: ifreq is plain data.
    let mut reqs: Vec<libc::ifreq> = vec![unsafe { std::mem::zeroed() }; MAX_IFADDRS];
    let mut conf = libc::ifconf {
        ifc_len: (reqs.len() * std::mem::size_of::<libc::ifreq>()) as libc::c_int,
        ifc_ifcu: libc::__c_anonymous_ifc_ifcu {
            ifcu_req: reqs.as_mut_ptr(),
        },
    };
    // SAFETY: `conf` describes `reqs`, which the kernel fills up to `ifc_len` bytes.
    if unsafe { libc::ioctl(fd, libc::SIOCGIFCONF as _, &mut conf) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = conf.ifc_len.max(0) as usize / std::mem::size_of::<libc::ifreq>();
    for req in reqs.iter_mut().take(n) {
        // SAFETY: SIOCGIFCONF fills `ifru_addr` of every entry with an AF_INET address.
        let sa = unsafe { req.ifr_ifru.ifru_addr };
        if sa.sa_family as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET sockaddr is a sockaddr_in, which fits in a sockaddr.
        let sin: libc::sockaddr_in = unsafe { std::mem::transmute_copy(&sa) };
        if Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)) != ip {
            continue;
        }
        // SAFETY: the name is NUL-terminated within IFNAMSIZ, as the kernel wrote it.
        let name = unsafe { CStr::from_ptr(req.ifr_name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: SIOCGIFFLAGS reads `ifr_name` and writes `ifru_flags` of `req`.
        if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS as _, req as *mut libc::ifreq) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: just written by SIOCGIFFLAGS.
        let flags = unsafe { req.ifr_ifru.ifru_flags } as u16 as i32;
        return Ok(Some((name, flags)));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_socket_has_no_fault_and_its_namespace_is_watched_once() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let b = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        assert_eq!(local_fault(a.as_raw_fd()), None);
        let mut w = LinkWatch::default();
        let first = w.watch(a.as_raw_fd());
        if let Some(fd) = first {
            w.drain(fd);
        }
        assert_eq!(w.watch(b.as_raw_fd()), None, "one watch per namespace");
    }

    #[test]
    fn a_descriptor_that_is_not_a_socket_is_neither_watched_nor_faulted() {
        let f = std::fs::File::open("/proc/self/stat").expect("open");
        let mut w = LinkWatch::default();
        assert_eq!(w.watch(f.as_raw_fd()), None);
        assert_eq!(local_fault(f.as_raw_fd()), None);
    }
}
