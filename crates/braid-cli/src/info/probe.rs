//! Facts read from this host for `braid info`: its interfaces, and whether each transport and
//! kernel feature braid uses works here, found by trying what braid itself does (creating the
//! socket, the memfd, the ring) and releasing it at once. Nothing here changes the system.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use serde::Serialize;

/// One network interface of this network namespace.
#[derive(Debug, Clone, Serialize)]
pub struct Interface {
    /// Its name (`eth0`, `lo`, ...).
    pub name: String,
    /// Its index.
    pub index: u32,
    /// Administratively up (`IFF_UP`).
    pub up: bool,
    /// Carrier present and operational (`IFF_RUNNING`).
    pub running: bool,
    /// The loopback interface.
    pub loopback: bool,
    /// MTU in bytes.
    pub mtu: Option<u32>,
    /// Link speed in Mbit/s, where the driver reports one (`/sys/class/net/*/speed`).
    pub speed_mbps: Option<u64>,
    /// The kernel driver (`ethtool -i`), else the one sysfs names.
    pub driver: Option<String>,
    /// Addresses with prefix length (`198.18.0.1/24`, `fe80::1/64`).
    pub addresses: Vec<String>,
}

/// Whether a transport or kernel feature works here, and why not.
#[derive(Debug, Clone, Serialize)]
pub struct Facility {
    /// Short name (`tcp`, `shm`, `af_xdp`, `io_uring`, `userfaultfd`, `fuse`).
    pub name: &'static str,
    /// What braid uses it for.
    pub used_for: &'static str,
    /// It works on this host, for this process.
    pub usable: bool,
    /// What was found: where it lives when usable, the reason when not.
    pub detail: String,
}

fn prefix_len(mask: &[u8]) -> u32 {
    mask.iter().map(|b| b.count_ones()).sum()
}

/// The address and prefix length of one `getifaddrs` entry, if it is IPv4 or IPv6.
///
/// # Safety
/// `addr` and `mask` are null or point at socket addresses of their `sa_family`.
unsafe fn ip_of(addr: *const libc::sockaddr, mask: *const libc::sockaddr) -> Option<(IpAddr, u32)> {
    if addr.is_null() {
        return None;
    }
    // SAFETY: the caller vouches for the pointers; the family says which structure it is.
    unsafe {
        match (*addr).sa_family as i32 {
            libc::AF_INET => {
                let a = &*addr.cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                let p = if mask.is_null() {
                    32
                } else {
                    prefix_len(
                        &(*mask.cast::<libc::sockaddr_in>())
                            .sin_addr
                            .s_addr
                            .to_ne_bytes(),
                    )
                };
                Some((IpAddr::V4(ip), p))
            }
            libc::AF_INET6 => {
                let a = &*addr.cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                let p = if mask.is_null() {
                    128
                } else {
                    prefix_len(&(*mask.cast::<libc::sockaddr_in6>()).sin6_addr.s6_addr)
                };
                Some((IpAddr::V6(ip), p))
            }
            _ => None,
        }
    }
}

/// A datagram socket for interface ioctls.
fn ioctl_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mtu_of(sock: &OwnedFd, name: &str) -> Option<u32> {
    if name.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: ifreq is plain C data; all zeroes is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU reads the name and fills the MTU member of `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return None;
    }
    // SAFETY: the ioctl set the MTU member.
    Some(unsafe { req.ifr_ifru.ifru_mtu }.max(0) as u32)
}

/// `struct ethtool_drvinfo` of `<linux/ethtool.h>` (no crate of the build carries it).
#[repr(C)]
struct EthtoolDrvinfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `ETHTOOL_GDRVINFO` of `<linux/ethtool.h>`.
const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// The interface's driver as `ethtool -i` names it (`veth`, `virtio_net`, `mlx5_core`),
/// asked of the kernel in the caller's network namespace.
fn ethtool_driver(sock: &OwnedFd, name: &str) -> Option<String> {
    if name.len() >= libc::IFNAMSIZ {
        return None;
    }
    // SAFETY: plain C data; all zeroes is valid for both.
    let mut info: EthtoolDrvinfo = unsafe { std::mem::zeroed() };
    info.cmd = ETHTOOL_GDRVINFO;
    // SAFETY: as above.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut info as *mut EthtoolDrvinfo).cast();
    // SAFETY: SIOCETHTOOL with ETHTOOL_GDRVINFO fills the `ethtool_drvinfo` that `req`
    // points at, which lives until the call returns.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) } < 0 {
        return None;
    }
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    let d = String::from_utf8_lossy(&info.driver[..end]).into_owned();
    (!d.is_empty()).then_some(d)
}

/// Speed and driver from sysfs, when the sysfs mounted here shows this namespace's device of
/// that name (its `ifindex` matches; a process that entered a namespace with `setns` may see
/// another namespace's sysfs).
fn sysfs_facts(name: &str, index: u32) -> (Option<u64>, Option<String>) {
    let dir = std::path::Path::new("/sys/class/net").join(name);
    let same = std::fs::read_to_string(dir.join("ifindex"))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        == Some(index);
    if !same {
        return (None, None);
    }
    // Reading `speed` fails (EINVAL) for a link that is down; -1 means unknown.
    let speed = std::fs::read_to_string(dir.join("speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .map(|s| s as u64);
    let driver = std::fs::read_link(dir.join("device/driver"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    (speed, driver)
}

/// Every interface of this network namespace (`getifaddrs`, which asks the kernel over
/// netlink in the caller's namespace), sorted by index.
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out: Vec<Interface> = Vec::new();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: a node of the list getifaddrs made, alive until freeifaddrs.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name of the node.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let i = match out.iter().position(|i| i.name == name) {
            Some(i) => i,
            None => {
                let flags = ifa.ifa_flags as i32;
                out.push(Interface {
                    index: 0,
                    up: flags & libc::IFF_UP != 0,
                    running: flags & libc::IFF_RUNNING != 0,
                    loopback: flags & libc::IFF_LOOPBACK != 0,
                    name,
                    mtu: None,
                    speed_mbps: None,
                    driver: None,
                    addresses: Vec::new(),
                });
                out.len() - 1
            }
        };
        // SAFETY: the node's address and mask, of the family the address says.
        if let Some((ip, prefix)) = unsafe { ip_of(ifa.ifa_addr, ifa.ifa_netmask) } {
            out[i].addresses.push(format!("{ip}/{prefix}"));
        }
    }
    // SAFETY: the list getifaddrs made, freed once; no reference into it survives.
    unsafe { libc::freeifaddrs(list) };
    let sock = ioctl_socket()?;
    for i in &mut out {
        let c = std::ffi::CString::new(i.name.clone()).unwrap_or_default();
        // SAFETY: a valid C string.
        i.index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        i.mtu = mtu_of(&sock, &i.name);
        let (speed, driver) = sysfs_facts(&i.name, i.index);
        i.speed_mbps = speed;
        i.driver = ethtool_driver(&sock, &i.name).or(driver);
    }
    out.sort_by_key(|i| i.index);
    Ok(out)
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain C data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: a valid utsname to fill.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "?".into();
    }
    // SAFETY: uname NUL-terminates the field.
    unsafe { CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// (major, minor) of the running kernel.
pub fn kernel_version() -> Option<(u32, u32)> {
    let r = kernel_release();
    let mut it = r.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Capabilities braid's features need, by bit number (linux/capability.h).
pub const CAPS: [(u32, &str); 6] = [
    (12, "CAP_NET_ADMIN"),
    (13, "CAP_NET_RAW"),
    (19, "CAP_SYS_PTRACE"),
    (21, "CAP_SYS_ADMIN"),
    (38, "CAP_PERFMON"),
    (39, "CAP_BPF"),
];

/// The effective capability set (`CapEff` of /proc/self/status), 0 when unreadable.
pub fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Names of the capabilities of [`CAPS`] this process has.
pub fn cap_names(eff: u64) -> Vec<&'static str> {
    CAPS.iter()
        .filter(|(bit, _)| eff & (1 << bit) != 0)
        .map(|(_, n)| *n)
        .collect()
}

fn has_cap(eff: u64, name: &str) -> bool {
    CAPS.iter()
        .any(|(bit, n)| *n == name && eff & (1 << bit) != 0)
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// TCP: every rail's handshake and the fallback of every other transport.
pub fn tcp() -> Facility {
    let r = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0));
    Facility {
        name: "tcp",
        used_for: "every rail (handshake, and the data path unless moved below)",
        usable: r.is_ok(),
        detail: match r {
            Ok(_) => "TCP sockets work (checked on 127.0.0.1)".into(),
            Err(e) => format!("cannot open a TCP socket: {e}"),
        },
    }
}

/// Same-host rings: a sealed memfd passed over an abstract Unix socket, as
/// braid's `context::same_host` and `engine::shm` make them.
pub fn shm() -> Facility {
    let f = |usable, detail| Facility {
        name: "shm",
        used_for: "rails between processes of one kernel and network namespace",
        usable,
        detail,
    };
    let Some(boot) = read_trim("/proc/sys/kernel/random/boot_id") else {
        return f(
            false,
            "/proc/sys/kernel/random/boot_id is unreadable: the host cannot be identified".into(),
        );
    };
    let ns = match rustix::fs::stat("/proc/thread-self/ns/net") {
        Ok(s) => s,
        Err(e) => {
            return f(
                false,
                format!(
                    "/proc/thread-self/ns/net: {e}: the network namespace cannot be identified"
                ),
            );
        }
    };
    use rustix::fs::{MemfdFlags, SealFlags};
    let memfd = rustix::fs::memfd_create(
        "braid-info",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )
    .and_then(|fd| {
        rustix::fs::ftruncate(&fd, 4096)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
    });
    if let Err(e) = memfd {
        return f(
            false,
            format!("a sealed memfd (memfd_create, F_ADD_SEALS) cannot be made: {e}"),
        );
    }
    use std::os::linux::net::SocketAddrExt;
    let name = format!("braid-shm.info.{}", std::process::id());
    let bound = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| std::os::unix::net::UnixListener::bind_addr(&a));
    if let Err(e) = bound {
        return f(
            false,
            format!("an abstract Unix socket cannot be bound: {e}"),
        );
    }
    f(
        true,
        format!(
            "rings in a sealed memfd, passed over the abstract Unix socket \
             @braid-shm.<session>.<rail>.<token>; host identity: boot {boot}, net namespace {}:{}",
            ns.st_dev, ns.st_ino
        ),
    )
}

/// AF_XDP raw-Ethernet rails (`BRAID_TRANSPORT=raw`), checked as braid-xdp needs them:
/// Linux 5.9+ (BPF links for XDP), an AF_XDP socket, and `CAP_NET_ADMIN` with `CAP_BPF` (or
/// `CAP_SYS_ADMIN`). Whether a driver has native XDP is only known by attaching (braid falls
/// back to generic mode), which this does not do.
pub fn af_xdp(ifs: &[Interface]) -> Facility {
    let f = |usable, detail| Facility {
        name: "af_xdp",
        used_for: "raw-Ethernet rails (BRAID_TRANSPORT=raw)",
        usable,
        detail,
    };
    match kernel_version() {
        Some(v) if v >= (5, 9) => {}
        Some((a, b)) => {
            return f(
                false,
                format!("Linux {a}.{b} is older than 5.9 (no BPF links for XDP)"),
            );
        }
        None => return f(false, "the kernel version cannot be read".into()),
    }
    // SAFETY: plain socket creation; closed at once below.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return f(
            false,
            match e.raw_os_error() {
                Some(libc::EAFNOSUPPORT) => {
                    "this kernel has no AF_XDP sockets (CONFIG_XDP_SOCKETS)".into()
                }
                Some(libc::EPERM) | Some(libc::EACCES) => {
                    format!(
                        "not permitted to open an AF_XDP socket ({e}): run as root \
                         (CAP_NET_RAW, CAP_NET_ADMIN and CAP_BPF)"
                    )
                }
                _ => format!("an AF_XDP socket cannot be opened: {e}"),
            },
        );
    }
    // SAFETY: the descriptor just made, owned and closed here.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    let eff = effective_caps();
    let admin = has_cap(eff, "CAP_NET_ADMIN");
    let bpf = has_cap(eff, "CAP_BPF") || has_cap(eff, "CAP_SYS_ADMIN");
    if !(admin && bpf) {
        return f(
            false,
            "loading the XDP steering program needs CAP_NET_ADMIN and CAP_BPF (or root), which this process lacks".into(),
        );
    }
    let devices: Vec<String> = ifs
        .iter()
        .filter(|i| !i.loopback && i.up)
        .map(|i| format!("{} ({})", i.name, i.driver.as_deref().unwrap_or("virtual")))
        .collect();
    if devices.is_empty() {
        return f(false, "no interface but loopback is up".into());
    }
    f(
        true,
        format!(
            "kernel, socket and capabilities allow it; native mode where the driver has it, else generic: {}",
            devices.join(", ")
        ),
    )
}

/// io_uring, which libexs (the ES-API) drives plain sockets with.
pub fn io_uring() -> Facility {
    let f = |usable, detail| Facility {
        name: "io_uring",
        used_for: "the ES-API (libexs) on plain sockets",
        usable,
        detail,
    };
    let disabled = read_trim("/proc/sys/kernel/io_uring_disabled");
    // SAFETY: io_uring_params is plain C data; zero asks for defaults.
    let mut params: linux_raw_sys::io_uring::io_uring_params = unsafe { std::mem::zeroed() };
    // SAFETY: io_uring_setup(entries, params) reads and fills `params`; the descriptor it
    // returns is owned and closed right away.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, &mut params) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        let why = match (e.raw_os_error(), disabled.as_deref()) {
            (Some(libc::ENOSYS), _) => {
                "this kernel has no io_uring (Linux 5.6+ with CONFIG_IO_URING)".to_string()
            }
            (_, Some(d)) if d != "0" => {
                format!("io_uring is disabled (kernel.io_uring_disabled = {d}): {e}")
            }
            _ => format!("io_uring_setup failed: {e}"),
        };
        return f(false, why);
    }
    // SAFETY: the descriptor just made, owned and closed here.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    f(
        true,
        format!("io_uring_setup works (features {:#x})", params.features),
    )
}

/// userfaultfd with write-protect faults, as braid-dsm opens it (Linux 5.7+).
pub fn userfaultfd(user_mode_only: bool) -> Facility {
    use linux_raw_sys::general as sys;
    let f = |usable, detail| Facility {
        name: "userfaultfd",
        used_for: "the distributed shared memory (braid-dsm)",
        usable,
        detail,
    };
    let sysctl = read_trim("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_else(|| "?".into());
    let mut flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    if user_mode_only {
        flags |= sys::UFFD_USER_MODE_ONLY as i32;
    }
    // SAFETY: userfaultfd(2) takes one integer; the result is checked.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return f(
            false,
            match e.raw_os_error() {
                Some(libc::ENOSYS) => "this kernel has no userfaultfd (CONFIG_USERFAULTFD)".into(),
                Some(libc::EPERM) => format!(
                    "not permitted ({e}; vm.unprivileged_userfaultfd = {sysctl}): run as root, or \
                     set the sysctl to 1, or BRAID_DSM_USER_FAULTS_ONLY=1"
                ),
                _ => format!("userfaultfd(2): {e}"),
            },
        );
    }
    // SAFETY: the descriptor just made, owned and closed when `fd` drops.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut api = sys::uffdio_api {
        api: sys::UFFD_API.into(),
        features: sys::UFFD_FEATURE_PAGEFAULT_FLAG_WP.into(),
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes one `uffdio_api`, which `api` is.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            linux_raw_sys::ioctl::UFFDIO_API as _,
            &mut api,
        )
    } < 0
    {
        return f(
            false,
            format!(
                "no write-protect faults (UFFD_FEATURE_PAGEFAULT_FLAG_WP, Linux 5.7+): {}",
                io::Error::last_os_error()
            ),
        );
    }
    let mode = if user_mode_only {
        "user-mode faults only"
    } else {
        "user and kernel-mode faults"
    };
    f(
        true,
        format!("with write-protect faults, {mode} (vm.unprivileged_userfaultfd = {sysctl})"),
    )
}

/// FUSE, which `braid fs mount` mounts through.
pub fn fuse() -> Facility {
    let f = |usable, detail| Facility {
        name: "fuse",
        used_for: "braid fs mount",
        usable,
        detail,
    };
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        let hint = match e.kind() {
            io::ErrorKind::NotFound => "load the fuse module, or allow the device in the container",
            io::ErrorKind::PermissionDenied => "this user may not open it (see its mode and group)",
            _ => "FUSE is unavailable",
        };
        return f(false, format!("/dev/fuse: {e} ({hint})"));
    }
    let root = has_cap(effective_caps(), "CAP_SYS_ADMIN");
    let fusermount = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("fusermount3"))
            .find(|p| p.is_file())
    });
    match (root, fusermount) {
        (true, _) => f(
            true,
            "/dev/fuse opens; mounting directly (CAP_SYS_ADMIN)".into(),
        ),
        (false, Some(p)) => f(
            true,
            format!("/dev/fuse opens; mounting through {}", p.display()),
        ),
        (false, None) => f(
            false,
            "not root and no fusermount3 in PATH (install fuse3)".into(),
        ),
    }
}
