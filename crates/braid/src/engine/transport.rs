//! The transport seam: what the engine needs of a rail's connection, so that a rail need
//! not be a TCP socket. TCP ([`Tcp`]) is the implementation today; a same-host
//! shared-memory ring or a raw-Ethernet link would be others, under the same protocol core
//! (as UCX keeps its transports, UCT, under its protocols, UCP).
//!
//! A transport is a reliable, ordered byte stream: the session's frames go in whole and come
//! out in order, or the link reports an error. Receives place bytes straight into the
//! pieces they are given (registered memory), so a transport that copies must copy once.

use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use braid_proto::ExpressRequest;
use braid_proto::wire::WireStatus;

use super::io::{
    Received, bytes_waiting, recv_into, recv_pieces, send_pieces, set_rcvlowat, tcp_info,
};

/// Executes an express request that arrived (with its payload): its status, or `None` when
/// it cannot execute yet.
pub(crate) type ExpressExec<'a> = dyn FnMut(&ExpressRequest, &[u8]) -> Option<WireStatus> + 'a;

/// What [`Transport::take_express`] found at the read cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpressTake {
    /// Nothing at all: the link is empty.
    Empty,
    /// Stream bytes (or nothing the transport can tell apart).
    Other,
    /// An express request, executed; more stream follows.
    Ran,
    /// An express request, executed, and the link is empty now.
    RanEmpty,
    /// An express request that cannot execute yet: it stays.
    Stalled,
}

/// What a transport can tell of its link: capacity and liveness, sampled by the engine's
/// periodic tick.
pub(crate) struct LinkSample {
    /// Most recent delivery rate, bytes per second; `None` when not measured yet.
    pub(crate) delivery_rate: Option<f64>,
    /// Time since data last arrived on the link, whether or not it has been read.
    pub(crate) since_data_recv: Duration,
    /// Segments sent and not yet acknowledged (0 where the transport cannot tell).
    pub(crate) unacked: u32,
    /// Time since the peer last acknowledged anything.
    pub(crate) since_ack_recv: Duration,
    /// Smoothed round-trip time.
    pub(crate) rtt: Duration,
}

/// Most descriptors a sleeper polls for one link (see [`Transport::sleeper_fds`]).
pub(crate) const MAX_READINESS_FDS: usize = 4;

/// The descriptors a thread asleep on the rails polls for one link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReadinessFds {
    fds: [RawFd; MAX_READINESS_FDS],
    n: usize,
}

impl ReadinessFds {
    /// The descriptors in `fds` (at most [`MAX_READINESS_FDS`]; more are a bug).
    pub(crate) fn new(fds: &[RawFd]) -> ReadinessFds {
        assert!(
            !fds.is_empty() && fds.len() <= MAX_READINESS_FDS,
            "a sleeper polls 1 to {MAX_READINESS_FDS} descriptors per link"
        );
        let mut r = ReadinessFds {
            fds: [-1; MAX_READINESS_FDS],
            n: fds.len(),
        };
        r.fds[..fds.len()].copy_from_slice(fds);
        r
    }

    /// The descriptors.
    pub(crate) fn as_slice(&self) -> &[RawFd] {
        &self.fds[..self.n]
    }
}

/// One rail's connection as the engine drives it. Every call is non-blocking.
pub(crate) trait Transport: Send + Sync {
    /// The descriptor the engine polls: readable when bytes (or an error) wait, writable
    /// when [`Transport::send`] can take more. Edge-triggered; stable for the link's life.
    fn readiness_fd(&self) -> RawFd;
    /// The descriptors a thread asleep on the rails (`cq::rails`) polls for the link, for
    /// reading; by default [`Transport::readiness_fd`]. A link whose readiness descriptor
    /// is an epoll set of several sources lists the sources themselves: a sleeper woken
    /// through a set nested in its own missed wake-ups (docs/RAW-ETHERNET.md,
    /// "Readiness"). They may be shared with other links (the sleeper then reads every
    /// link that lists the one that turned ready). A sleeper's set outlives links, so none
    /// may be a duplicate that closes with the link while its file lives on: the kernel
    /// keeps such an entry, out of reach, until the file goes.
    fn sleeper_fds(&self) -> ReadinessFds {
        ReadinessFds::new(&[self.readiness_fd()])
    }
    /// Sends from `pieces` starting `skip` bytes in; returns the bytes taken.
    /// `WouldBlock` when the link is full; `EFAULT` when a piece's file page was truncated
    /// (before any byte was taken; a count short of it otherwise). `fragile`: some pieces
    /// may be file pages, which a transport must not read from user space. `stable[i]`:
    /// piece `i`'s memory stays as it is until the peer has taken the frame (a request's
    /// payload, kept by its operation until the peer's `Done`); a transport may then let the
    /// peer read it later instead of copying it now.
    fn send(
        &self,
        pieces: &[(*const u8, usize)],
        skip: usize,
        fragile: bool,
        stable: &[bool],
    ) -> io::Result<usize>;
    /// Receives into `pieces` starting `skip` bytes in, then into `tail`. `fragile`: the
    /// pieces may be file pages (see [`Transport::send`]); `EFAULT` as there.
    fn recv_pieces(
        &self,
        pieces: &[(*mut u8, usize)],
        skip: usize,
        tail: Option<(*mut u8, usize)>,
        fragile: bool,
    ) -> io::Result<Received>;
    /// Receives into `buf`; 0 when the peer closed the link. `WouldBlock` when empty.
    fn recv(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Reports readability only once `bytes` are waiting (or on end or error): the receive
    /// loop asks for no more than the current frame still has to deliver.
    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()>;
    /// Bytes received and not read yet, if the transport can tell.
    fn bytes_waiting(&self) -> Option<usize> {
        None
    }
    /// The caller found the link empty and is about to sleep on [`Transport::readiness_fd`]
    /// until `want` bytes wait: a transport that signals readiness itself (the same-host
    /// ring) asks the peer to ring from now on. True when that many bytes are there already
    /// (read again instead of sleeping); an error once the link has ended. Kernel sockets
    /// always signal, so the default does nothing. A busy-polling reader does not arm, and
    /// its peer then writes with no system call.
    fn arm(&self, _want: usize) -> io::Result<bool> {
        Ok(false)
    }
    /// True when readiness is signalled only after [`Transport::arm`]: the engine then keeps
    /// reading readiness while an application thread polls (it is woken only when it armed
    /// the link itself, or when the peer made room for a blocked send).
    fn signals_when_armed(&self) -> bool {
        false
    }
    /// True when the link carries express requests (see
    /// [`braid_proto::Session::post_express`]): a link that loses and reorders nothing and
    /// can answer beside its stream (the same-host ring).
    fn carries_express(&self) -> bool {
        false
    }
    /// Writes express request `r` with its payload `pieces` (plain memory) as one unit
    /// between frames; false when the link has no room for it now (it goes as frames).
    fn send_express(
        &self,
        _r: &ExpressRequest,
        _pieces: &[(*const u8, usize)],
    ) -> io::Result<bool> {
        Ok(false)
    }
    /// At a frame boundary: executes the express request that comes next, if one does,
    /// with `exec` (its status, or `None` when it cannot execute yet and stays).
    fn take_express(&self, _exec: &mut ExpressExec<'_>) -> io::Result<ExpressTake> {
        Ok(ExpressTake::Other)
    }
    /// True when a busy poller would find nothing now: no bytes, no express request, no
    /// answers it would reap (a hint: false is always safe).
    fn quiet(&self) -> bool {
        false
    }
    /// True when an express request heads the link (a hint: the reader executes it before
    /// it reaps answers, so that the completion it brings is not held up by them).
    fn express_next(&self) -> bool {
        false
    }
    /// Express requests sent on this link whose answers have not been reaped.
    fn express_unanswered(&self) -> u64 {
        0
    }
    /// Answers to express requests wait to be reaped. A busy poller (not `eager`) may be
    /// told of them some polls late, where looking costs the peer.
    fn express_answered(&self, _eager: bool) -> bool {
        false
    }
    /// A reader about to sleep while an express request it cannot execute yet heads the
    /// link asks to be woken for answers (see [`Transport::arm`]); true when some are there.
    fn arm_for_answers(&self) -> io::Result<bool> {
        Ok(false)
    }
    /// Hands the statuses of newly answered express requests to `f`, oldest first.
    fn reap_express(&self, _f: &mut dyn FnMut(WireStatus)) -> io::Result<()> {
        Ok(())
    }
    /// The transport's name, as reports show it (`tcp`, `shm`).
    fn kind(&self) -> &'static str;
    /// Capacity and liveness of the link, if the transport knows them.
    fn sample(&self) -> Option<LinkSample>;
    /// What is wrong with the local device under the link, if anything (see
    /// [`super::linkwatch`]); `None` when all is well or the transport cannot tell.
    fn local_fault(&self) -> Option<String> {
        None
    }
    /// The link's pending error (TCP: `SO_ERROR`, e.g. a reset from the peer), cleared.
    fn take_error(&self) -> Option<io::Error> {
        None
    }
    /// Ends the link in both directions, as a pulled cable would.
    fn shutdown(&self);
    /// Ends a link given up as broken: as [`Transport::shutdown`], and the peer is told at
    /// once if the link still carries anything (TCP: a reset). A graceful end would wait
    /// behind data the link cannot deliver, and the peer would notice only by its own
    /// timeout.
    fn abort(&self) {
        self.shutdown();
    }
}

/// A rail over a TCP connection (one per NIC).
pub(crate) struct Tcp {
    stream: TcpStream,
}

impl Tcp {
    /// Takes a connected stream whose handshake is done; makes it non-blocking, without
    /// Nagle's delay.
    pub(crate) fn new(stream: TcpStream) -> io::Result<Tcp> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        Ok(Tcp { stream })
    }
}

impl Transport for Tcp {
    fn readiness_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    fn kind(&self) -> &'static str {
        "tcp"
    }

    fn send(
        &self,
        pieces: &[(*const u8, usize)],
        skip: usize,
        _fragile: bool,
        _stable: &[bool],
    ) -> io::Result<usize> {
        send_pieces(self.stream.as_raw_fd(), pieces, skip)
    }

    fn recv_pieces(
        &self,
        pieces: &[(*mut u8, usize)],
        skip: usize,
        tail: Option<(*mut u8, usize)>,
        _fragile: bool,
    ) -> io::Result<Received> {
        recv_pieces(self.stream.as_raw_fd(), pieces, skip, tail)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        recv_into(self.stream.as_raw_fd(), buf)
    }

    fn set_wake_threshold(&self, bytes: usize) -> io::Result<()> {
        set_rcvlowat(self.stream.as_raw_fd(), bytes)
    }

    fn bytes_waiting(&self) -> Option<usize> {
        bytes_waiting(self.stream.as_raw_fd()).ok()
    }

    fn sample(&self) -> Option<LinkSample> {
        tcp_info(self.stream.as_raw_fd()).map(|t| LinkSample {
            delivery_rate: t.delivery_rate,
            since_data_recv: t.since_data_recv,
            unacked: t.unacked,
            since_ack_recv: t.since_ack_recv,
            rtt: t.rtt,
        })
    }

    fn local_fault(&self) -> Option<String> {
        super::linkwatch::local_fault(self.stream.as_raw_fd())
    }

    fn take_error(&self) -> Option<io::Error> {
        self.stream.take_error().ok().flatten()
    }

    fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn abort(&self) {
        // connect(AF_UNSPEC) disconnects a TCP socket, with a reset to the peer (as close
        // with a zero linger would), while the descriptor stays ours: the engine may still
        // be polling it.
        // SAFETY: a zeroed sockaddr with family AF_UNSPEC, of the size given.
        let r = unsafe {
            let mut sa: libc::sockaddr = std::mem::zeroed();
            sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
            libc::connect(
                self.stream.as_raw_fd(),
                &sa,
                std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
            )
        };
        if r != 0 {
            tracing::debug!("resetting a rail: {}", io::Error::last_os_error());
        }
        self.shutdown();
    }
}
