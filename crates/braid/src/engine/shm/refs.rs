//! Single copy between same-host processes: payloads that lie in shareable region files
//! ([`braid_proto::mem::shared`]) cross the ring as references, and the receiving side
//! copies them straight from its read-only mapping of the sender's file into their
//! destination (after its protection checks, which ran on the frame's header).
//!
//! A region file goes to the peer once per link, over a socket of its own beside the
//! doorbell (16 bytes: token and size, with the descriptor), always before the first ring
//! record that names it. The receiver checks its seals and size before mapping it, and maps
//! at most [`MAX_PEER_FILES`] at once. When the sender has freed a region it gave, it says
//! so (the token and size 0, no descriptor) before it gives the next file, and the receiver
//! unmaps it. A file is let go only once the receiver has read past the last record that
//! named it (the ring's `tail` against where that record ended): a file can stop being in
//! use while a record naming it still waits in the ring (a span whose bytes moved to
//! another file while an earlier send of it was in flight).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::fs::SealFlags;

use super::ring::{Mapping, map_shared};
use braid_proto::mem::shared::{PAGE, SharedSpan};

/// Region files of the peer's a link maps at most.
pub(super) const MAX_PEER_FILES: usize = 4096;

fn bad(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// Sends `fds` over `sock` with `msg` as the bytes they ride on.
pub(super) fn send_fds(
    sock: &UnixStream,
    fds: &[std::os::fd::BorrowedFd<'_>],
    msg: &[u8],
) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    cmsg.push(SendAncillaryMessage::ScmRights(fds));
    let n = rustix::net::sendmsg(
        sock,
        &[io::IoSlice::new(msg)],
        &mut cmsg,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    )?;
    if n != msg.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short send of descriptors",
        ));
    }
    Ok(())
}

/// Receives one message of exactly `msg.len()` bytes and the descriptors that came with
/// it.
fn recv_msg(
    sock: &UnixStream,
    msg: &mut [u8],
    flags: rustix::net::RecvFlags,
) -> io::Result<Vec<OwnedFd>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let r = rustix::net::recvmsg(
        sock,
        &mut [io::IoSliceMut::new(msg)],
        &mut cmsg,
        flags | RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut got = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = m {
            got.extend(fds);
        }
    }
    match r.bytes {
        n if n == msg.len() => Ok(got),
        0 => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the peer closed the socket",
        )),
        n => Err(bad(format!("a short message of {n} bytes"))),
    }
}

/// Receives exactly `msg.len()` bytes and the `N` descriptors that came with them (more
/// close here).
pub(super) fn recv_fds<const N: usize>(
    sock: &UnixStream,
    msg: &mut [u8],
) -> io::Result<[OwnedFd; N]> {
    let mut fds = recv_msg(sock, msg, rustix::net::RecvFlags::empty())?;
    let n = fds.len();
    fds.truncate(N);
    <[OwnedFd; N]>::try_from(fds).map_err(|_| bad(format!("{n} descriptor(s) came, {N} expected")))
}

/// The sending half: which of this process's region files the peer has, each with the
/// ring position where the last record naming it ends.
pub(super) struct Sharer {
    sock: UnixStream,
    given: Mutex<HashMap<u64, u64>>,
}

impl Sharer {
    pub(super) fn new(sock: UnixStream) -> Sharer {
        Sharer {
            sock,
            given: Mutex::new(HashMap::new()),
        }
    }

    /// How many region files the peer has been given.
    #[cfg(test)]
    pub(super) fn given_count(&self) -> usize {
        self.given.lock().len()
    }

    /// Makes sure the peer has `span`'s file, for a record that ends at ring position
    /// `record_end`; `read_to` is how far the peer has read the ring. False when the file
    /// cannot be given now (the payload then goes inline).
    pub(super) fn give(&self, span: &SharedSpan, record_end: u64, read_to: u64) -> bool {
        let mut given = self.given.lock();
        if let Some(end) = given.get_mut(&span.token) {
            *end = record_end;
            return true;
        }
        // Files no longer in use here, and no longer named by a record the peer has yet to
        // read: the peer may let them go.
        given.retain(|&t, &mut end| {
            if braid_proto::mem::shared::is_live(t) || read_to < end {
                return true;
            }
            let mut msg = [0u8; 16];
            msg[..8].copy_from_slice(&t.to_le_bytes());
            // SAFETY: 16 bytes from a local buffer; a full socket keeps the token for later.
            let n = unsafe {
                libc::send(
                    self.sock.as_raw_fd(),
                    msg.as_ptr().cast(),
                    16,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            n != 16
        });
        let mut msg = [0u8; 16];
        msg[..8].copy_from_slice(&span.token.to_le_bytes());
        msg[8..].copy_from_slice(&span.file_len.to_le_bytes());
        match send_fds(&self.sock, &[span.fd.as_fd()], &msg) {
            Ok(()) => {
                given.insert(span.token, record_end);
                true
            }
            Err(e) => {
                tracing::debug!("a region file was not handed to the peer: {e}");
                false
            }
        }
    }
}

/// A peer's region file: this side's read-only mapping, and the file itself (for page
/// exchange).
pub(super) struct PeerFile {
    pub(super) map: Mapping,
    pub(super) file: SharedSpan,
}

/// The receiving half: the peer's region files mapped here, by token.
pub(super) struct PeerFiles {
    sock: UnixStream,
    maps: HashMap<u64, Arc<PeerFile>>,
}

impl PeerFiles {
    pub(super) fn new(sock: UnixStream) -> PeerFiles {
        PeerFiles {
            sock,
            maps: HashMap::new(),
        }
    }

    /// The mapping of the peer's file `token`, after reading the files it has sent (and
    /// those it let go) meanwhile.
    pub(super) fn get(&mut self, token: u64) -> io::Result<Arc<PeerFile>> {
        loop {
            let mut msg = [0u8; 16];
            let fd = match recv_one(&self.sock, &mut msg) {
                Ok(fd) => fd,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            let t = u64::from_le_bytes(msg[..8].try_into().expect("8 bytes"));
            let len = u64::from_le_bytes(msg[8..].try_into().expect("8 bytes"));
            let Some(fd) = fd else {
                if len != 0 {
                    return Err(bad(format!("region file {t} came without its descriptor")));
                }
                // Freed by the peer: no record names it any more.
                self.maps.remove(&t);
                continue;
            };
            if self.maps.len() >= MAX_PEER_FILES {
                return Err(bad(format!(
                    "the peer shared more than {MAX_PEER_FILES} region files at once"
                )));
            }
            let seals = rustix::fs::fcntl_get_seals(&fd)?;
            let size = rustix::fs::fstat(&fd)?.st_size as u64;
            if !seals.contains(SealFlags::SHRINK) || size != len || len == 0 {
                return Err(bad(format!(
                    "the peer's region file {t} is unsealed or not {len} bytes"
                )));
            }
            let map = map_shared(&fd, len as usize, true)?;
            let file = SharedSpan {
                fd: Arc::new(fd),
                token: t,
                file_len: len,
                offset: 0,
            };
            self.maps.insert(t, Arc::new(PeerFile { map, file }));
        }
        self.maps.get(&token).cloned().ok_or_else(|| {
            bad(format!(
                "the peer named region file {token} without sending it"
            ))
        })
    }

    /// How many of the peer's files are mapped.
    #[cfg(test)]
    pub(super) fn mapped(&self) -> usize {
        self.maps.len()
    }
}

/// Receives one message of exactly `msg.len()` bytes without waiting, and the descriptor
/// that came with it, if any.
fn recv_one(sock: &UnixStream, msg: &mut [u8]) -> io::Result<Option<OwnedFd>> {
    Ok(recv_msg(sock, msg, rustix::net::RecvFlags::DONTWAIT)?
        .into_iter()
        .next())
}

/// Where received bytes go: the destination pieces in order, then nothing.
pub(super) struct Dest<'a> {
    runs: &'a [(*mut u8, usize)],
    idx: usize,
    off: usize,
    /// The pieces may be file pages (copies go through the kernel).
    fragile: bool,
    /// A copy stopped at a page that could not be written.
    pub(super) faulted: bool,
}

impl<'a> Dest<'a> {
    pub(super) fn new(runs: &'a [(*mut u8, usize)], fragile: bool) -> Dest<'a> {
        Dest {
            runs,
            idx: 0,
            off: 0,
            fragile,
            faulted: false,
        }
    }

    /// Room left.
    pub(super) fn room(&self) -> usize {
        self.runs[self.idx.min(self.runs.len())..]
            .iter()
            .map(|r| r.1)
            .sum::<usize>()
            - self.off
    }

    /// Maps whole pages of `file` from `off` on (at most `n` bytes) copy-on-write where the
    /// next bytes go, instead of copying them: only where that place and `off` are
    /// page-aligned and the place is region memory of this process's (never file pages or
    /// an application's own memory). Returns the bytes placed, 0 when none could be.
    pub(super) fn adopt(&mut self, file: &SharedSpan, off: u64, n: usize) -> usize {
        if self.fragile || self.faulted || self.idx >= self.runs.len() {
            return 0;
        }
        let (p, len) = self.runs[self.idx];
        let k = (len - self.off).min(n) / PAGE * PAGE;
        let at = SharedSpan {
            offset: off,
            ..file.clone()
        };
        if k == 0 || !braid_proto::mem::shared::adopt(p.wrapping_add(self.off), k, &at) {
            return 0;
        }
        self.off += k;
        if self.off == len {
            self.idx += 1;
            self.off = 0;
        }
        k
    }

    /// Copies up to `n` bytes from `src`; returns how many were stored.
    ///
    /// SAFETY: `src` is valid for `n` bytes; the runs are valid for their lengths (file pages
    /// aside, when fragile).
    pub(super) unsafe fn put(&mut self, src: *const u8, n: usize) -> usize {
        let mut done = 0;
        while done < n && self.idx < self.runs.len() && !self.faulted {
            let (p, len) = self.runs[self.idx];
            let take = (len - self.off).min(n - done);
            // SAFETY: within the run and the source, per the contract.
            let got = unsafe {
                let (s, d) = (src.add(done), p.add(self.off));
                if self.fragile {
                    braid_proto::mem::file::copy_checked(s, d, take)
                } else {
                    copy_large(s, d, take);
                    take
                }
            };
            done += got;
            self.off += got;
            if got < take {
                self.faulted = true;
            } else if self.off == len {
                self.idx += 1;
                self.off = 0;
            }
        }
        done
    }
}

/// Copies at least this long bypass the cache on their stores. 16 MiB writes at depth 1
/// (`braid bench write -s 16M -q 1 --poll-spin-us 1000000`, the receiver's copy): 17.1-19.2 GB/s
/// with glibc's non-temporal threshold at 1 MiB, 9.6-14.0 at its default (240 MiB on this
/// VM, from a reported 320 MiB cache); 4 MiB writes to one destination at depth 1 were
/// slower so (19.9-20.7 against 28.4-28.5 GB/s: they stay in cache), hence 8 MiB.
const STREAM_MIN: usize = 8 << 20;

/// Copies `n` bytes from `src` to `dst` (not overlapping); long copies with non-temporal
/// stores, which do not read the destination's lines in first nor evict the cache for
/// bytes the copier does not read again.
///
/// SAFETY: `src` valid for reads and `dst` for writes of `n` bytes, not overlapping.
unsafe fn copy_large(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if n >= STREAM_MIN {
        // SAFETY: the caller's contract.
        unsafe { copy_streaming(src, dst, n) };
        return;
    }
    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

/// [`copy_large`]'s streaming copy: the destination aligned to 64 bytes by a plain copy of
/// its head, then 64 bytes per step with SSE2's non-temporal stores (SSE2 is part of
/// x86_64), a store fence, and the tail.
///
/// SAFETY: as [`copy_large`].
#[cfg(target_arch = "x86_64")]
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    let head = dst.align_offset(64).min(n);
    // SAFETY: within the caller's ranges; the stores are 16-byte aligned (`dst + i` is
    // 64-byte aligned after the head), the loads unaligned.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 64 <= n {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let (a, b) = (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)));
            let (c, e) = (_mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            i += 64;
        }
        // The streamed stores are weakly ordered: fenced before anyone learns they are done.
        _mm_sfence();
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    #[test]
    fn the_streaming_copy_is_exact_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..9000u32).map(|i| (i * 7 + 3) as u8).collect();
        for s_off in [0usize, 1, 15, 64] {
            for d_off in [0usize, 1, 17, 63, 64] {
                for len in [0usize, 1, 63, 64, 65, 127, 128, 1000, 8191] {
                    let mut dst = vec![0xeeu8; len + 200];
                    // SAFETY: in-bounds ranges of two distinct vectors.
                    unsafe {
                        super::copy_streaming(
                            src.as_ptr().add(s_off),
                            dst.as_mut_ptr().add(d_off),
                            len,
                        )
                    };
                    assert_eq!(&dst[d_off..d_off + len], &src[s_off..s_off + len]);
                    assert!(dst[..d_off].iter().all(|&b| b == 0xee), "before");
                    assert!(dst[d_off + len..].iter().all(|&b| b == 0xee), "after");
                }
            }
        }
    }
}
