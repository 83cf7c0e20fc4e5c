//! One AF_XDP port per network device per process, shared by every raw rail on the device:
//! the kernel keeps one XDP program per device, so rails cannot each have their own.
//!
//! Frames carry, after the Ethernet header, the receiving rail's tag (`u32`, little-endian,
//! random and chosen by the receiver), then one link datagram. Whichever rail's reader
//! pumps the port sorts what came into each rail's inbox by tag; a rail takes its inbox
//! under its own lock. Lock order: a rail's link state, then the port, then the tag table
//! and an inbox (pumping takes only the last three, so it never waits for a rail).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Weak};

use braid_xdp::{ETHER_HEADER, ETHERTYPE, Port, PortConfig, XdpMode, ether_header};
use parking_lot::Mutex;

/// Bytes between the Ethernet header and the link datagram: the receiver's tag.
pub(crate) const TAG_LEN: usize = 4;
/// Frames one pump takes per batch.
const PUMP_BATCH: usize = 64;
/// Batches one pump takes at most: the whole receive ring (2,048 frames).
const PUMP_BATCHES: usize = 32;
/// Most bytes an inbox holds; frames past it are dropped (the link resends them).
const INBOX_MAX: usize = 8 << 20;

/// Received datagrams of one rail, each as its length (`u16`) then its bytes.
pub(crate) struct Inbox {
    bytes: Vec<u8>,
    /// Source address each datagram must come from (the peer's), set when the rail joins.
    peer: [u8; 6],
    /// An eventfd in the rail's readiness set: rung when a thread other than this rail's
    /// reader took the rail's frames off the port (another rail's reader, which put them
    /// here; a sender or the tick, which moved them into the link). The port's own
    /// readiness would not do: the port is empty by then, and a reader asleep on this rail
    /// would not wake for frames already taken off it.
    bell: OwnedFd,
    rung: bool,
}

impl Inbox {
    /// Admits frames from `peer` only (before, the tag alone admits them).
    pub(crate) fn set_peer(&mut self, peer: [u8; 6]) {
        self.peer = peer;
    }

    /// Bytes of datagrams (with their length prefixes) waiting.
    #[cfg(test)]
    pub(crate) fn bytes_waiting(&self) -> usize {
        self.bytes.len()
    }

    /// The bell's descriptor, for the rail's readiness set.
    pub(crate) fn bell(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    /// Wakes the rail's reader (once until it drains the inbox).
    pub(crate) fn ring(&mut self) {
        if !self.rung {
            self.rung = true;
            let one = 1u64.to_ne_bytes();
            // SAFETY: an 8-byte write from a local buffer to our eventfd.
            unsafe { libc::write(self.bell.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
    }

    /// Hands every datagram to `f` in arrival order and empties the inbox.
    pub(crate) fn drain(&mut self, mut f: impl FnMut(&[u8])) {
        if std::mem::take(&mut self.rung) {
            let mut b = [0u8; 8];
            // SAFETY: an 8-byte read into a local buffer from our (non-blocking) eventfd.
            unsafe { libc::read(self.bell.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        }
        let mut at = 0;
        while at + 2 <= self.bytes.len() {
            let n = u16::from_le_bytes([self.bytes[at], self.bytes[at + 1]]) as usize;
            f(&self.bytes[at + 2..at + 2 + n]);
            at += 2 + n;
        }
        self.bytes.clear();
    }
}

/// The port of one device and the rails on it.
pub(crate) struct Hub {
    port: Mutex<Port>,
    rails: Mutex<HashMap<u32, Weak<Mutex<Inbox>>>>,
    mac: [u8; 6],
    max_frame: usize,
    /// The port's socket, duplicated: what rails on this device poll for readiness.
    fd: OwnedFd,
}

/// Hubs by (network namespace device, inode, device name).
type Key = (u64, u64, String);

fn hubs() -> &'static Mutex<HashMap<Key, Weak<Hub>>> {
    static HUBS: std::sync::OnceLock<Mutex<HashMap<Key, Weak<Hub>>>> = std::sync::OnceLock::new();
    HUBS.get_or_init(Default::default)
}

impl Hub {
    /// The hub of the device that holds the local address of socket `sock`, opened on
    /// first use (in the calling thread's namespace, which must be the socket's).
    pub(crate) fn for_socket(sock: RawFd) -> io::Result<Arc<Hub>> {
        let (ns, ifname) = super::super::linkwatch::device_of_socket(sock)?;
        let meta = std::fs::File::from(ns).metadata()?;
        let key = (meta.dev(), meta.ino(), ifname.clone());
        let mut table = hubs().lock();
        if let Some(h) = table.get(&key).and_then(Weak::upgrade) {
            return Ok(h);
        }
        table.retain(|_, w| w.strong_count() > 0);
        // Native mode where the driver has it (veth, most NICs), generic elsewhere (lo).
        let port = Port::open(&ifname, &PortConfig::default())
            .or_else(|_| {
                let generic = PortConfig {
                    mode: XdpMode::Generic,
                    ..PortConfig::default()
                };
                Port::open(&ifname, &generic)
            })
            .map_err(|e| io::Error::other(format!("raw rail on {ifname}: {e}")))?;
        let fd = port.as_fd().try_clone_to_owned()?;
        let hub = Arc::new(Hub {
            mac: port.mac(),
            max_frame: port.max_frame(),
            port: Mutex::new(port),
            rails: Mutex::new(HashMap::new()),
            fd,
        });
        table.insert(key, Arc::downgrade(&hub));
        Ok(hub)
    }

    /// The device's hardware address.
    pub(crate) fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// Most datagram bytes a frame carries.
    pub(crate) fn max_datagram(&self) -> usize {
        self.max_frame - ETHER_HEADER - TAG_LEN
    }

    /// The hub's own descriptor that turns readable when frames come to the device: open
    /// as long as the hub, shared by its rails.
    pub(crate) fn shared_readiness(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A new descriptor that turns readable when frames come to the device.
    pub(crate) fn readiness(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Registers a rail that takes frames from `peer` under a fresh tag; returns the tag
    /// and the rail's inbox (the rail leaves the table when the inbox is dropped).
    pub(crate) fn join(&self, peer: [u8; 6]) -> io::Result<(u32, Arc<Mutex<Inbox>>)> {
        // SAFETY: plain eventfd creation; owned at once.
        let bell = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if bell < 0 {
            return Err(io::Error::last_os_error());
        }
        let inbox = Arc::new(Mutex::new(Inbox {
            bytes: Vec::new(),
            peer,
            // SAFETY: the kernel just returned it.
            bell: unsafe { OwnedFd::from_raw_fd(bell) },
            rung: false,
        }));
        let mut rails = self.rails.lock();
        rails.retain(|_, w| w.strong_count() > 0);
        let tag = loop {
            let t = braid_proto::mem::registry::random_u64() as u32;
            if t != 0 && !rails.contains_key(&t) {
                break t;
            }
        };
        rails.insert(tag, Arc::downgrade(&inbox));
        Ok((tag, inbox))
    }

    /// Moves waiting frames into their rails' inboxes, ringing the bells of rails other
    /// than `own` (the caller's tag). Frames for unknown tags, from the wrong source or too
    /// short are dropped.
    pub(crate) fn pump(&self, own: u32) {
        let mut port = self.port.lock();
        if !port.readable() {
            return;
        }
        let rails = self.rails.lock();
        // Until the port is empty: the edge that announced these frames is spent, and a
        // reader that leaves some behind (waiting for more bytes of a frame) would sleep
        // past them.
        let mut batches = 0;
        while batches < PUMP_BATCHES
            && port.recv(PUMP_BATCH, |f| {
                if f.len() < ETHER_HEADER + TAG_LEN {
                    return;
                }
                let tag = u32::from_le_bytes(f[ETHER_HEADER..ETHER_HEADER + 4].try_into().unwrap());
                let Some(inbox) = rails.get(&tag).and_then(Weak::upgrade) else {
                    return;
                };
                let mut inbox = inbox.lock();
                let d = &f[ETHER_HEADER + TAG_LEN..];
                if (inbox.peer != [0; 6] && f[6..12] != inbox.peer)
                    || inbox.bytes.len() + 2 + d.len() > INBOX_MAX
                {
                    return;
                }
                inbox
                    .bytes
                    .extend_from_slice(&(d.len() as u16).to_le_bytes());
                inbox.bytes.extend_from_slice(d);
                if tag != own {
                    inbox.ring();
                }
            }) == PUMP_BATCH
        {
            batches += 1;
        }
    }

    /// Sends one datagram to the rail tagged `tag` at `peer`; false when the device's send
    /// slots stay full (the datagram is then lost, and the link resends it).
    pub(crate) fn send(&self, peer: [u8; 6], tag: u32, datagram: &[u8]) -> io::Result<bool> {
        let h = ether_header(peer, self.mac, ETHERTYPE);
        let len = ETHER_HEADER + TAG_LEN + datagram.len();
        let mut port = self.port.lock();
        for _ in 0..64 {
            let sent = port
                .send_with(len, |b| {
                    b[..ETHER_HEADER].copy_from_slice(&h);
                    b[ETHER_HEADER..ETHER_HEADER + TAG_LEN].copy_from_slice(&tag.to_le_bytes());
                    b[ETHER_HEADER + TAG_LEN..].copy_from_slice(datagram);
                })
                .map_err(io::Error::other)?;
            if sent {
                return Ok(true);
            }
            port.flush().map_err(io::Error::other)?;
        }
        Ok(false)
    }

    /// Kicks the device until it has taken what is queued (copy mode takes a bounded
    /// batch per kick; bounded here too: what is left goes with the next flush).
    pub(crate) fn flush(&self) -> io::Result<()> {
        let mut port = self.port.lock();
        for _ in 0..64 {
            port.flush().map_err(io::Error::other)?;
            if port.pending() == 0 {
                break;
            }
        }
        Ok(())
    }
}
