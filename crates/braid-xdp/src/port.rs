//! A port: one AF_XDP socket on one receive queue of one interface, its frame area (UMEM)
//! and the steering program that feeds it.
//!
//! Frames move in copy mode (`XDP_COPY`): the kernel copies a received frame into a UMEM
//! slot and a sent one out of it, so any driver works and no frame is ever shared with the
//! device. Half of the slots are lent to the kernel for receiving (the fill ring), half
//! are the send pool, which the completion ring returns.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

use crate::bpf::{Attached, SocketMap};
use crate::error::XdpError;
use crate::mode::XdpMode;
use crate::ring::Ring;

/// The Ethernet type braid's raw rails use by default: 0x88B5, "local experimental
/// Ethertype 1" of IEEE 802, which no standard protocol claims.
pub const ETHERTYPE: u16 = 0x88b5;

/// Length of an Ethernet header (no VLAN tag).
pub const ETHER_HEADER: usize = 14;

/// Attempts to bind a queue that is busy, 10 ms apart.
const BIND_TRIES: u32 = 100;

/// Room the kernel keeps before a received frame in its slot (`XDP_PACKET_HEADROOM`): a
/// frame longer than the slot less this is dropped on receipt.
const XDP_PACKET_HEADROOM: u32 = 256;

/// How to open a [`Port`].
#[derive(Clone, Debug)]
pub struct PortConfig {
    /// The receive queue whose frames this port takes (a veth sends on queue 0 and its
    /// peer receives there).
    pub queue: u32,
    /// UMEM frame slots, a power of two from 64: half receive, half send.
    pub frames: u32,
    /// Bytes per slot: 2048 or 4096 (the largest frame is a slot).
    pub frame_size: u32,
    /// The Ethernet type steered to the port; frames of other types reach the kernel.
    pub ethertype: u16,
    /// Where the steering program runs.
    pub mode: XdpMode,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            queue: 0,
            frames: 4096,
            frame_size: 2048,
            ethertype: ETHERTYPE,
            mode: XdpMode::Native,
        }
    }
}

/// The kernel's counters for a port (`XDP_STATISTICS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct PortStats {
    /// Frames dropped for reasons other than below.
    pub rx_dropped: u64,
    /// Receive descriptors the kernel found invalid.
    pub rx_invalid_descs: u64,
    /// Send descriptors the kernel found invalid.
    pub tx_invalid_descs: u64,
    /// Frames dropped because the receive ring was full.
    pub rx_ring_full: u64,
    /// Times the fill ring was empty when a frame came.
    pub rx_fill_ring_empty_descs: u64,
    /// Times a send kick found the transmit ring empty.
    pub tx_ring_empty_descs: u64,
}

/// The frame area, shared with the kernel.
struct Umem {
    base: NonNull<u8>,
    len: usize,
}

impl Umem {
    fn new(len: usize) -> io::Result<Umem> {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Umem {
            base: NonNull::new(p.cast()).expect("mmap returned null"),
            len,
        })
    }
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: our mapping; the socket that pinned it was closed before (field order).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// An AF_XDP socket steered the frames of one Ethernet type on one interface queue.
///
/// Dropping it detaches the steering program. One port per interface: the kernel keeps one
/// XDP program per interface, so a second port on it fails with [`XdpError::Attach`]
/// (`EBUSY`).
pub struct Port {
    // Fields drop in this order: rings and socket before the program and the frame area.
    rx: Ring<libc::xdp_desc>,
    tx: Ring<libc::xdp_desc>,
    fill: Ring<u64>,
    done: Ring<u64>,
    sock: OwnedFd,
    _attached: Attached,
    _map: SocketMap,
    umem: Umem,
    /// Send slots not in the kernel's hands.
    free: Vec<u64>,
    frame_size: u32,
    /// The longest frame sent: the interface's MTU plus a header, at most a slot less the
    /// receive headroom.
    max_frame: usize,
    /// Frames submitted to the transmit ring since the last successful kick.
    unkicked: bool,
    mac: [u8; 6],
    queue: u32,
}

impl Drop for Port {
    fn drop(&mut self) {
        // Before the socket closes: the queue is free again as soon as it has.
        self._map.clear(self.queue);
    }
}

// SAFETY: every pointer in a port points into mappings it owns; it is not `Sync`, so one
// thread at a time drives it.
unsafe impl Send for Port {}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("sock", &self.sock)
            .field("frame_size", &self.frame_size)
            .field("free_send_slots", &self.free.len())
            .finish_non_exhaustive()
    }
}

fn sock_err(what: &'static str) -> impl FnOnce(io::Error) -> XdpError {
    move |e| XdpError::Socket(what, e)
}

fn setsockopt<T>(
    sock: &OwnedFd,
    opt: libc::c_int,
    v: &T,
    what: &'static str,
) -> Result<(), XdpError> {
    // SAFETY: `v` is a live value of the type the option expects.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(XdpError::Socket(what, io::Error::last_os_error()));
    }
    Ok(())
}

/// Reads option `opt` into a `T`, which must be plain data (all-zero bytes are a value).
fn getsockopt<T: Copy>(
    sock: &OwnedFd,
    opt: libc::c_int,
    what: &'static str,
) -> Result<T, XdpError> {
    // SAFETY: the callers' types are C structs of integers, for which zero is a value.
    let mut v: T = unsafe { std::mem::zeroed() };
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_XDP,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(XdpError::Socket(what, io::Error::last_os_error()));
    }
    Ok(v)
}

/// The hardware address and the MTU of `ifname`, asked in the calling thread's network
/// namespace.
fn interface_facts(ifname: &str) -> io::Result<([u8; 6], u32)> {
    // SAFETY: plain socket creation; the descriptor is owned right away.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned it.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: an all-zero ifreq is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, b) in req.ifr_name.iter_mut().zip(ifname.bytes()) {
        *d = b as libc::c_char;
    }
    // SAFETY: SIOCGIFHWADDR fills `req`'s address union.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl set the hardware-address member of the union.
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    let mut mac = [0u8; 6];
    for (m, d) in mac.iter_mut().zip(data) {
        *m = d as u8;
    }
    // SAFETY: SIOCGIFMTU fills the MTU member of `req`'s union.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl set the MTU member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok((mac, mtu.max(0) as u32))
}

impl Port {
    /// Opens a port on `ifname` (in the calling thread's network namespace): loads and
    /// attaches the steering program, makes the socket and its frame area, and lends the
    /// receive half of the slots to the kernel. Needs root (`CAP_NET_ADMIN`, `CAP_BPF`).
    pub fn open(ifname: &str, cfg: &PortConfig) -> Result<Port, XdpError> {
        if !cfg.frames.is_power_of_two() || cfg.frames < 64 {
            return Err(XdpError::Config(format!(
                "frames {} is not a power of two from 64",
                cfg.frames
            )));
        }
        if cfg.frame_size != 2048 && cfg.frame_size != 4096 {
            return Err(XdpError::Config(format!(
                "frame size {} is not 2048 or 4096",
                cfg.frame_size
            )));
        }
        let name = CString::new(ifname).map_err(|_| XdpError::NoInterface(ifname.into()))?;
        // SAFETY: a valid C string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(XdpError::NoInterface(ifname.into()));
        }
        let (mac, mtu) =
            interface_facts(ifname).map_err(sock_err("reading the interface's address and MTU"))?;
        let map = SocketMap::new(cfg.queue + 1)?;
        let attached = Attached::new(ifindex, cfg.ethertype, &map, cfg.mode)?;

        // SAFETY: plain socket creation; owned right away.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(XdpError::Socket("creating it", io::Error::last_os_error()));
        }
        // SAFETY: the kernel just returned it.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let umem = Umem::new(cfg.frames as usize * cfg.frame_size as usize)
            .map_err(sock_err("allocating the frame area"))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.base.as_ptr() as u64,
            len: umem.len as u64,
            chunk_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(
            &sock,
            libc::XDP_UMEM_REG,
            &reg,
            "registering the frame area",
        )?;
        let half = cfg.frames / 2;
        for (opt, what) in [
            (libc::XDP_UMEM_FILL_RING, "sizing the fill ring"),
            (libc::XDP_UMEM_COMPLETION_RING, "sizing the completion ring"),
            (libc::XDP_RX_RING, "sizing the receive ring"),
            (libc::XDP_TX_RING, "sizing the transmit ring"),
        ] {
            setsockopt(&sock, opt, &half, what)?;
        }
        let off: libc::xdp_mmap_offsets =
            getsockopt(&sock, libc::XDP_MMAP_OFFSETS, "reading the ring offsets")?;
        let rx = Ring::map(&sock, &off.rx, libc::XDP_PGOFF_RX_RING, half, false)
            .map_err(sock_err("mapping the receive ring"))?;
        let tx = Ring::map(&sock, &off.tx, libc::XDP_PGOFF_TX_RING, half, true)
            .map_err(sock_err("mapping the transmit ring"))?;
        let mut fill = Ring::map(
            &sock,
            &off.fr,
            libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
            half,
            true,
        )
        .map_err(sock_err("mapping the fill ring"))?;
        let done = Ring::map(
            &sock,
            &off.cr,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
            half,
            false,
        )
        .map_err(sock_err("mapping the completion ring"))?;
        // The receive half goes to the kernel before the socket can receive.
        for i in 0..half {
            fill.put(i, i as u64 * cfg.frame_size as u64);
        }
        fill.submit(half);
        let addr = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: libc::XDP_COPY,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: cfg.queue,
            sxdp_shared_umem_fd: 0,
        };
        // A socket closed a moment ago leaves the queue bound until a kernel work item
        // runs (`EBUSY`): wait for it, boundedly (a queue another socket holds stays busy).
        let mut tries = 0;
        loop {
            // SAFETY: a valid sockaddr_xdp of its own size.
            let r = unsafe {
                libc::bind(
                    sock.as_raw_fd(),
                    (&addr as *const libc::sockaddr_xdp).cast(),
                    size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
                )
            };
            if r == 0 {
                break;
            }
            let e = io::Error::last_os_error();
            tries += 1;
            if e.raw_os_error() != Some(libc::EBUSY) || tries >= BIND_TRIES {
                return Err(XdpError::Socket("binding it to the queue", e));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        map.set(cfg.queue, sock.as_raw_fd())?;
        let free = (half..cfg.frames)
            .map(|i| i as u64 * cfg.frame_size as u64)
            .collect();
        Ok(Port {
            rx,
            tx,
            fill,
            done,
            sock,
            _attached: attached,
            _map: map,
            umem,
            free,
            frame_size: cfg.frame_size,
            max_frame: (mtu as usize + ETHER_HEADER)
                .min((cfg.frame_size - XDP_PACKET_HEADROOM) as usize),
            unkicked: false,
            mac,
            queue: cfg.queue,
        })
    }

    /// The interface's hardware address (the source of the frames this port sends).
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The longest frame the port sends: the interface's MTU plus the Ethernet header
    /// (read when the port opened), at most a slot less the kernel's receive headroom
    /// (256 bytes), since the peer's port could not take more.
    pub fn max_frame(&self) -> usize {
        self.max_frame
    }

    fn frame_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        debug_assert!(addr as usize + len <= self.umem.len);
        // SAFETY: a send slot inside the frame area that the kernel does not hold.
        unsafe { std::slice::from_raw_parts_mut(self.umem.base.as_ptr().add(addr as usize), len) }
    }

    /// Takes back the send slots whose frames the kernel has sent.
    fn reclaim(&mut self) {
        let n = self.done.ready();
        if n == 0 {
            return;
        }
        for i in 0..n {
            let addr = self.done.get(i);
            self.free.push(addr);
        }
        self.done.release(n);
    }

    /// Queues one whole Ethernet frame (header included, at most [`Port::max_frame`]
    /// bytes) for sending; `Ok(false)` when no
    /// send slot is free (call [`Port::flush`] and try again). Nothing leaves before
    /// `flush`.
    pub fn send(&mut self, frame: &[u8]) -> Result<bool, XdpError> {
        self.send_with(frame.len(), |b| b.copy_from_slice(frame))
    }

    /// Like [`Port::send`], but `fill` writes the `len`-byte frame straight into its slot.
    pub fn send_with(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, XdpError> {
        if !(ETHER_HEADER..=self.max_frame).contains(&len) {
            return Err(XdpError::FrameSize {
                len,
                max: self.max_frame,
            });
        }
        if self.free.is_empty() {
            self.reclaim();
        }
        if self.tx.room() == 0 {
            return Ok(false);
        }
        let Some(addr) = self.free.pop() else {
            return Ok(false);
        };
        fill(self.frame_mut(addr, len));
        self.tx.put(
            0,
            libc::xdp_desc {
                addr,
                len: len as u32,
                options: 0,
            },
        );
        self.tx.submit(1);
        self.unkicked = true;
        Ok(true)
    }

    /// Asks the kernel to send what is queued. In copy mode it sends a bounded batch per
    /// call; frames left over go with the next `flush`, which [`Port::pending`] tells.
    pub fn flush(&mut self) -> Result<(), XdpError> {
        if !self.unkicked {
            return Ok(());
        }
        // SAFETY: a zero-length send on our socket: the kick that drains the ring.
        let r = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                std::ptr::null(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                // The kernel is busy or out of buffers: the frames stay queued.
                Some(libc::EAGAIN | libc::EBUSY | libc::ENOBUFS) => {}
                _ => return Err(XdpError::Socket("sending", e)),
            }
        }
        self.unkicked = self.tx.in_kernel() > 0;
        Ok(())
    }

    /// Frames queued that the kernel has not taken yet.
    pub fn pending(&self) -> u32 {
        self.tx.in_kernel()
    }

    /// Hands up to `max` received frames to `f`, in arrival order, and lends their slots
    /// back to the kernel; returns how many there were.
    pub fn recv(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let n = self.rx.ready().min(max as u32);
        if n == 0 {
            // No stores on an empty poll: the counters' lines stay shared with the kernel.
            return 0;
        }
        let chunk_mask = !(self.frame_size as u64 - 1);
        for i in 0..n {
            let d = self.rx.get(i);
            let len = (d.len as usize).min(self.frame_size as usize);
            let start = (d.addr as usize).min(self.umem.len - len);
            // SAFETY: the kernel wrote this frame into our area and does not touch the
            // slot until it is back in the fill ring (below).
            let frame =
                unsafe { std::slice::from_raw_parts(self.umem.base.as_ptr().add(start), len) };
            f(frame);
            // Lent back at once: the fill ring has room for every receive slot.
            self.fill.put(i, d.addr & chunk_mask);
        }
        self.rx.release(n);
        self.fill.submit(n);
        n as usize
    }

    /// Whether a received frame is waiting (no system call).
    pub fn readable(&self) -> bool {
        self.rx.ready() > 0
    }

    /// Sleeps until a frame is waiting or `timeout` passes; returns whether one is.
    pub fn wait_readable(&self, timeout: Duration) -> io::Result<bool> {
        if self.readable() {
            return Ok(true);
        }
        let mut p = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(self.readable())
            } else {
                Err(e)
            };
        }
        Ok(self.readable())
    }

    /// The kernel's drop and error counters for this socket.
    pub fn stats(&self) -> Result<PortStats, XdpError> {
        getsockopt(&self.sock, libc::XDP_STATISTICS, "reading its statistics")
    }
}

impl AsFd for Port {
    /// The socket: readable (`poll`, `epoll`) when a received frame is waiting.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// An Ethernet header: destination, source, type.
pub fn ether_header(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> [u8; ETHER_HEADER] {
    let mut h = [0u8; ETHER_HEADER];
    h[..6].copy_from_slice(&dst);
    h[6..12].copy_from_slice(&src);
    h[12..].copy_from_slice(&ethertype.to_be_bytes());
    h
}
