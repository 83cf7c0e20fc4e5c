//! Same-host rails: the session's byte stream through a pair of rings in shared memory (a
//! sealed memfd both processes map), with the Unix socket the memfd came over kept as the
//! doorbell and the liveness signal. See docs/PROTOCOL.md, "Same-host rails".
//!
//! Each direction is a single-producer, single-consumer byte ring. Its cursors are byte
//! counts that only grow (`head` by the producer, `tail` by the consumer); the data area's
//! size is a power of two. A side that is about to sleep *arms* the ring: it sets a flag in
//! shared memory and re-checks the cursors, and the other side, after moving its cursor,
//! writes one byte on its end of the Unix socket when it finds the flag set (a Dekker pair of
//! sequentially consistent fences orders the two). A busy-polling reader never arms, so a
//! ping-pong between pollers makes no system call at all. The peer's death closes its end of
//! the socket: the reader sees the end at its next arm, the engine at once (a hang-up).
//!
//! The peer's memory is not trusted: cursors read from the shared page are checked against
//! the ring's size before use (a peer that breaks them fails the rail, never this process),
//! and the memfd is sealed against shrinking, so no access can fault.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use super::io::Received;
use super::transport::{LinkSample, Transport};

/// Bytes of each direction's data area unless configured otherwise.
pub(crate) const DEFAULT_RING_BYTES: usize = 4 << 20;
/// Bounds on a ring's data area (a peer's memfd outside them is refused).
const MIN_RING_BYTES: usize = 64 << 10;
const MAX_RING_BYTES: usize = 256 << 20;
/// The control page: both directions' cursors and flags.
const CTRL_BYTES: usize = 4096;
/// Where each direction's control block starts in the control page.
const CTRL_OFFSET: [usize; 2] = [0, 1024];
/// Marks a ring's control page ("braidshm", version 1).
const RING_MAGIC: u64 = u64::from_le_bytes(*b"braidsh1");

/// One direction's control block. The cursors sit on lines of their own: the producer
/// writes one, the consumer the other.
#[repr(C)]
struct Ctrl {
    magic: AtomicU64,
    _pad0: [u8; 120],
    /// Bytes ever written (the producer's).
    head: AtomicU64,
    _pad1: [u8; 120],
    /// Bytes ever read (the consumer's).
    tail: AtomicU64,
    _pad2: [u8; 120],
    /// The consumer sleeps: the producer rings once `want` bytes wait.
    reader_armed: AtomicU32,
    /// The producer waits for room: the consumer rings once it has read anything.
    writer_armed: AtomicU32,
    want: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Ctrl>() <= 1024);

/// Which end of the pair this process is: the connecting side writes direction 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    Connector,
    Acceptor,
}

/// A mapping of the shared file, unmapped on drop.
struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or copies
// bounded by the ring's size.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `map_shared` with this length; nothing refers to it any more.
        unsafe {
            let _ = rustix::mm::munmap(self.base.cast(), self.len);
        }
    }
}

fn map_shared(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
    // SAFETY: a fresh shared mapping of a file at least `len` long (sealed against
    // shrinking), placed where the kernel chooses.
    let base = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )?
    };
    Ok(Mapping {
        base: base.cast(),
        len,
    })
}

/// A ring's shared memory, created by the connecting side: the file to pass to the peer,
/// and this side's mapping.
pub(crate) struct RingFile {
    fd: OwnedFd,
    map: Mapping,
    ring_bytes: usize,
}

impl RingFile {
    /// Creates and maps a sealed memfd for two rings of `ring_bytes` (a power of two).
    pub(crate) fn create(ring_bytes: usize) -> io::Result<RingFile> {
        if !ring_bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a ring holds a power of two of 64 KiB to 256 MiB, not {ring_bytes}"),
            ));
        }
        let fd = rustix::fs::memfd_create(
            "braid-shm-rail",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let len = CTRL_BYTES + 2 * ring_bytes;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // Neither side can shrink the file under the other's mapping (a fault there would
        // be SIGBUS), nor change that.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let map = map_shared(&fd, len)?;
        for off in CTRL_OFFSET {
            // SAFETY: the control page is mapped and large enough (asserted above).
            unsafe { &*(map.base.add(off) as *const Ctrl) }
                .magic
                .store(RING_MAGIC, Ordering::Release);
        }
        Ok(RingFile {
            fd,
            map,
            ring_bytes,
        })
    }

    /// Maps a ring file received from the connecting side, after checking its size, its
    /// seals and its marks.
    pub(crate) fn open(fd: OwnedFd) -> io::Result<RingFile> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let seals = rustix::fs::fcntl_get_seals(&fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::SEAL) {
            return Err(bad(
                "the peer's ring file is not sealed against shrinking".into()
            ));
        }
        let len = rustix::fs::fstat(&fd)?.st_size as usize;
        let ring_bytes = len.saturating_sub(CTRL_BYTES) / 2;
        if len != CTRL_BYTES + 2 * ring_bytes
            || !ring_bytes.is_power_of_two()
            || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(bad(format!(
                "the peer's ring file has a bad size ({len} bytes)"
            )));
        }
        let map = map_shared(&fd, len)?;
        for off in CTRL_OFFSET {
            // SAFETY: as in `create`.
            let magic = unsafe { &*(map.base.add(off) as *const Ctrl) }
                .magic
                .load(Ordering::Acquire);
            if magic != RING_MAGIC {
                return Err(bad("the peer's ring file is not a braid ring".into()));
            }
        }
        Ok(RingFile {
            fd,
            map,
            ring_bytes,
        })
    }

    /// The descriptor to hand to the peer.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

/// One direction as this side sees it.
struct Ring {
    ctrl: *const Ctrl,
    data: *mut u8,
    mask: u64,
    /// This side's own cursor (`head` when producing, `tail` when consuming): kept here,
    /// not trusted from shared memory.
    mine: AtomicU64,
}

impl Ring {
    fn new(map: &Mapping, ring_bytes: usize, dir: usize) -> Ring {
        // SAFETY: offsets inside the mapping, sized by `RingFile`.
        unsafe {
            Ring {
                ctrl: map.base.add(CTRL_OFFSET[dir]).cast(),
                data: map.base.add(CTRL_BYTES + dir * ring_bytes),
                mask: ring_bytes as u64 - 1,
                mine: AtomicU64::new(0),
            }
        }
    }

    fn ctrl(&self) -> &Ctrl {
        // SAFETY: points into the mapping, which lives as long as the link.
        unsafe { &*self.ctrl }
    }

    fn cap(&self) -> u64 {
        self.mask + 1
    }

    /// Bytes between the cursors, checked: a peer that moved its cursor past the other
    /// (or backwards) has broken the ring.
    fn used(&self, head: u64, tail: u64) -> io::Result<u64> {
        let used = head.wrapping_sub(tail);
        if used > self.cap() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the peer broke the shared ring (cursors {head} and {tail})"),
            ));
        }
        Ok(used)
    }

    /// Copies `len` bytes between `buf` and the ring at stream position `at` (wrapping);
    /// into the ring when `into_ring`. With `checked`, `buf` may be file pages a truncation
    /// took away: the copy goes through the kernel and stops at such a page. Returns the
    /// bytes copied (`len` unless a page stopped it).
    ///
    /// SAFETY: `buf` is valid for `len` bytes (but for truncated file pages when
    /// `checked`), and `len` does not exceed the ring's size.
    unsafe fn copy(
        &self,
        at: u64,
        buf: *mut u8,
        len: usize,
        into_ring: bool,
        checked: bool,
    ) -> usize {
        let off = (at & self.mask) as usize;
        let first = len.min(self.cap() as usize - off);
        let mut done = 0;
        // SAFETY: `off + first` and `len - first` stay within the data area.
        for (ring, n) in unsafe { [(self.data.add(off), first), (self.data, len - first)] } {
            // SAFETY: `done + n <= len`.
            let b = unsafe { buf.add(done) };
            let (src, dst) = if into_ring {
                (b as *const u8, ring)
            } else {
                (ring as *const u8, b)
            };
            let got = if checked {
                // SAFETY: as the function's contract; the kernel checks the file pages.
                unsafe { braid_proto::mem::file::copy_checked(src, dst, n) }
            } else {
                // SAFETY: both valid for `n` bytes, and distinct memory.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
                n
            };
            done += got;
            if got < n {
                break;
            }
        }
        done
    }
}

/// A same-host rail: a ring each way in shared memory, and the Unix socket to the peer as
/// doorbell (a byte written wakes the peer's poll) and liveness signal.
pub(crate) struct ShmLink {
    tx: Ring,
    rx: Ring,
    bell: UnixStream,
    /// Shut down here, or the peer's end of the socket closed.
    ended: AtomicBool,
    _map: Mapping,
}

// SAFETY: the raw pointers are into the mapping the link owns; producing and consuming are
// each serialised by the engine's transmit and receive locks.
unsafe impl Send for ShmLink {}
unsafe impl Sync for ShmLink {}

impl ShmLink {
    /// A link over `file`'s rings, this side being `side`, with `bell` connected to the
    /// peer.
    pub(crate) fn new(file: RingFile, side: Side, bell: UnixStream) -> io::Result<ShmLink> {
        bell.set_nonblocking(true)?;
        let (tx, rx) = match side {
            Side::Connector => (0, 1),
            Side::Acceptor => (1, 0),
        };
        let tx = Ring::new(&file.map, file.ring_bytes, tx);
        let rx = Ring::new(&file.map, file.ring_bytes, rx);
        // Both start armed: data may arrive before this side's first read.
        for r in [&tx, &rx] {
            r.ctrl().want.store(1, Ordering::Relaxed);
            r.ctrl().reader_armed.store(1, Ordering::Release);
        }
        Ok(ShmLink {
            tx,
            rx,
            bell,
            ended: AtomicBool::new(false),
            _map: file.map,
        })
    }

    /// Wakes the peer. A full socket means the peer has doorbells unread already.
    fn ring_bell(&self) {
        // SAFETY: one byte from a valid buffer on our socket.
        unsafe {
            libc::send(
                self.bell.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
    }

    /// Reads the doorbells that woke us; an error once the peer's end is closed.
    fn drain_bell(&self) -> io::Result<()> {
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: reads into a valid local buffer.
            let n = unsafe {
                libc::recv(
                    self.bell.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => {
                    self.ended.store(true, Ordering::Release);
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "the peer process closed its end of the shared-memory rail",
                    ));
                }
                n if n > 0 => continue,
                _ => {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(()),
                        io::ErrorKind::Interrupted => continue,
                        _ => {
                            self.ended.store(true, Ordering::Release);
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    fn check_open(&self) -> io::Result<()> {
        if self.ended.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the shared-memory rail is closed",
            ));
        }
        Ok(())
    }

    /// After the consumer moved `tail`: wakes a producer waiting for room.
    fn consumed(&self, tail: u64) {
        let c = self.rx.ctrl();
        c.tail.store(tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if c.writer_armed.load(Ordering::Relaxed) != 0
            && c.writer_armed.swap(0, Ordering::AcqRel) != 0
        {
            self.ring_bell();
        }
    }

    /// Copies out up to `len` bytes into the pieces; `WouldBlock` when the ring is empty.
    fn take(
        &self,
        mut out: impl FnMut(&Ring, u64, usize) -> usize,
        len: usize,
    ) -> io::Result<usize> {
        let tail = self.rx.mine.load(Ordering::Relaxed);
        let head = self.rx.ctrl().head.load(Ordering::Acquire);
        let avail = self.rx.used(head, tail)?;
        if avail == 0 {
            if self.ended.load(Ordering::Acquire) {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = out(&self.rx, tail, (avail as usize).min(len));
        let tail = tail + n as u64;
        self.rx.mine.store(tail, Ordering::Relaxed);
        self.consumed(tail);
        Ok(n)
    }
}

/// The pieces after `skip` bytes, as (pointer, length) runs.
fn runs<P: Copy>(
    pieces: &[(P, usize)],
    mut skip: usize,
) -> impl Iterator<Item = (P, usize, usize)> + '_ {
    pieces.iter().filter_map(move |&(p, l)| {
        if skip >= l {
            skip -= l;
            None
        } else {
            let s = skip;
            skip = 0;
            Some((p, s, l - s))
        }
    })
}

impl Transport for ShmLink {
    fn readiness_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    fn send(&self, pieces: &[(*const u8, usize)], skip: usize, fragile: bool) -> io::Result<usize> {
        self.check_open()?;
        let c = self.tx.ctrl();
        let head = self.tx.mine.load(Ordering::Relaxed);
        let mut room = self.tx.cap() - self.tx.used(head, c.tail.load(Ordering::Acquire))?;
        if room == 0 {
            c.writer_armed.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            room = self.tx.cap() - self.tx.used(head, c.tail.load(Ordering::Acquire))?;
            if room == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        let mut n = 0usize;
        for (p, off, len) in runs(pieces, skip) {
            let take = len.min(room as usize - n);
            // SAFETY: the piece is valid for `off + len` bytes (the caller's contract);
            // `take` fits the ring's free space.
            let got = unsafe {
                self.tx
                    .copy(head + n as u64, p.add(off) as *mut u8, take, true, fragile)
            };
            n += got;
            if got < take {
                // A truncated file page: what came before it goes; the fault is reported
                // when it is all that is left.
                if n == 0 {
                    return Err(io::Error::from_raw_os_error(libc::EFAULT));
                }
                break;
            }
            if n == room as usize {
                break;
            }
        }
        let head = head + n as u64;
        self.tx.mine.store(head, Ordering::Relaxed);
        c.head.store(head, Ordering::Release);
        fence(Ordering::SeqCst);
        if c.reader_armed.load(Ordering::Relaxed) != 0 {
            let waiting = head.wrapping_sub(c.tail.load(Ordering::Acquire));
            if waiting >= c.want.load(Ordering::Relaxed).max(1)
                && c.reader_armed.swap(0, Ordering::AcqRel) != 0
            {
                self.ring_bell();
            }
        }
        Ok(n)
    }

    fn recv_pieces(
        &self,
        pieces: &[(*mut u8, usize)],
        skip: usize,
        tail: Option<(*mut u8, usize)>,
        fragile: bool,
    ) -> io::Result<Received> {
        let asked: usize = runs(pieces, skip).map(|r| r.2).sum::<usize>() + tail.map_or(0, |t| t.1);
        let got = self.take(
            |ring, at, mut n| {
                let mut pos = at;
                for (p, off, len) in runs(pieces, skip).chain(tail.map(|(p, l)| (p, 0, l))) {
                    if n == 0 {
                        break;
                    }
                    let take = len.min(n);
                    // SAFETY: the caller's pieces are valid for their lengths (file pages
                    // aside, when `fragile`); `take` is within both the piece and the bytes
                    // available.
                    let got = unsafe { ring.copy(pos, p.add(off), take, false, fragile) };
                    pos += got as u64;
                    n -= got;
                    if got < take {
                        break;
                    }
                }
                (pos - at) as usize
            },
            asked,
        )?;
        if got == 0 && asked > 0 {
            // The bytes are there (`take` saw them) but the first page took none.
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        Ok(Received { got, asked })
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let p = buf.as_mut_ptr();
        self.take(
            |ring, at, n| {
                // SAFETY: `n` is at most the buffer's length.
                unsafe { ring.copy(at, p, n, false, false) }
            },
            buf.len(),
        )
    }

    fn set_wake_threshold(&self, _bytes: usize) -> io::Result<()> {
        // The threshold goes with arming (`arm`), where the sleeping side names it.
        Ok(())
    }

    fn bytes_waiting(&self) -> Option<usize> {
        let tail = self.rx.mine.load(Ordering::Relaxed);
        let head = self.rx.ctrl().head.load(Ordering::Acquire);
        self.rx.used(head, tail).ok().map(|u| u as usize)
    }

    fn arm(&self, want: usize) -> io::Result<bool> {
        self.drain_bell()?;
        let c = self.rx.ctrl();
        // Never more than half the ring: a producer with a full ring must still wake us.
        let want = (want as u64).clamp(1, self.rx.cap() / 2);
        c.want.store(want, Ordering::Relaxed);
        c.reader_armed.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let tail = self.rx.mine.load(Ordering::Relaxed);
        if self.rx.used(c.head.load(Ordering::Acquire), tail)? >= want {
            c.reader_armed.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    fn signals_when_armed(&self) -> bool {
        true
    }

    fn sample(&self) -> Option<LinkSample> {
        None
    }

    fn kind(&self) -> &'static str {
        "shm"
    }

    fn shutdown(&self) {
        self.ended.store(true, Ordering::Release);
        let _ = self.bell.shutdown(std::net::Shutdown::Both);
    }
}

/// Sends `file`'s descriptor over `sock` with `msg` as the bytes it rides on.
pub(crate) fn send_ring_file(sock: &UnixStream, file: &RingFile, msg: &[u8]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let fds = [file.fd().as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    cmsg.push(SendAncillaryMessage::ScmRights(&fds));
    let n = rustix::net::sendmsg(
        sock,
        &[io::IoSlice::new(msg)],
        &mut cmsg,
        SendFlags::NOSIGNAL,
    )?;
    if n != msg.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short send of the ring file",
        ));
    }
    Ok(())
}

/// Receives one descriptor and exactly `msg.len()` bytes with it from `sock`.
pub(crate) fn recv_ring_file(sock: &UnixStream, msg: &mut [u8]) -> io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock,
        &mut [io::IoSliceMut::new(msg)],
        &mut cmsg,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            for f in fds {
                // Only the first is ours to keep; any other closes here.
                fd.get_or_insert(f);
            }
        }
    }
    match fd {
        Some(fd) if r.bytes == msg.len() => Ok(fd),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the peer sent no ring file, or a short message with it",
        )),
    }
}

#[cfg(test)]
mod tests;
