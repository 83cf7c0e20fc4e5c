//! Moving a rail whose two ends share a kernel and a network namespace onto a shared-memory
//! ring ([`crate::engine::shm`]).
//!
//! The rail is dialled and authenticated over TCP as any other. The connecting side's hello
//! carries an offer ([`SameHostOffer`]): its host identity, and a token naming an abstract
//! Unix socket it listens on. An acceptor with the same identity grants the offer in its
//! reply, connects to that socket and proves itself with the hello's nonce (which only the
//! TCP peer has seen); the connecting side then creates the ring file and passes it over
//! the socket (`SCM_RIGHTS`). The TCP connection is closed; the Unix socket stays as the
//! rail's doorbell. Separate network namespaces (the testbed's hosts) never share a ring:
//! their rails keep measuring NICs.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::OnceLock;
use std::time::Instant;

use crate::engine::shm::{self, RingFile, ShmLink, Side};
use braid_proto::error::Error;
use braid_proto::mem::registry::random_u64;
use braid_proto::wire::SameHostOffer;
use braid_proto::wire::handshake::NONCE_LEN;

/// What the ring file's message says (and a version for it).
const RING_MSG: &[u8; 8] = b"braidrg1";

/// This thread's kernel and network namespace as one number: FNV-1a over the boot id and
/// the namespace's device and inode. `None` when procfs cannot tell.
pub(super) fn host_identity() -> Option<u64> {
    static BOOT: OnceLock<Option<String>> = OnceLock::new();
    let boot = BOOT
        .get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok())
        .as_ref()?;
    let ns = rustix::fs::stat("/proc/thread-self/ns/net").ok()?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = boot
        .trim()
        .as_bytes()
        .iter()
        .copied()
        .chain(ns.st_dev.to_le_bytes())
        .chain(ns.st_ino.to_le_bytes());
    for b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Some(h)
}

fn socket_name(session_id: u64, rail: u16, token: u64) -> Result<SocketAddr, Error> {
    let name = format!("braid-shm.{session_id:016x}.{rail}.{token:016x}");
    Ok(SocketAddr::from_abstract_name(name.as_bytes())?)
}

fn timed_out(what: &str) -> Error {
    Error::Timeout(format!("{what} of a same-host rail"))
}

/// The connecting side's offer, with the socket it listens on until the acceptor comes.
pub(super) struct Offer {
    listener: UnixListener,
    wire: SameHostOffer,
    ring_bytes: usize,
    /// This side sends page-aligned payloads by page exchange.
    exchange: bool,
}

impl Offer {
    /// An offer for rail `rail` of session `session_id` (`exchange`: this side sends by page
    /// exchange); `None` (the rail stays TCP) when the host cannot be identified or the
    /// socket cannot be made.
    pub(super) fn new(
        session_id: u64,
        rail: u16,
        ring_bytes: usize,
        exchange: bool,
    ) -> Option<Offer> {
        let host = host_identity()?;
        let token = random_u64();
        let listener = socket_name(session_id, rail, token)
            .and_then(|a| Ok(UnixListener::bind_addr(&a)?))
            .map_err(|e| tracing::debug!(rail, "no same-host offer: {e}"))
            .ok()?;
        listener.set_nonblocking(true).ok()?;
        Some(Offer {
            listener,
            wire: SameHostOffer { host, token },
            ring_bytes,
            exchange,
        })
    }

    /// What the hello says.
    pub(super) fn wire(&self) -> SameHostOffer {
        self.wire
    }

    /// The acceptor took the offer: waits for it on the socket (until `deadline`, or until
    /// the TCP connection ends), checks its proof (the hello's `nonce`), and hands it the
    /// ring. Connections that cannot prove the nonce are closed and the wait goes on.
    pub(super) fn complete(
        self,
        nonce: &[u8; NONCE_LEN],
        tcp: &TcpStream,
        deadline: Instant,
    ) -> Result<ShmLink, Error> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out("the acceptor's connection"));
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.listener.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: tcp.as_raw_fd(),
                    events: libc::POLLIN | libc::POLLRDHUP,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, left.as_millis().max(1) as i32) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e.into());
            }
            if fds[1].revents != 0 {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the acceptor closed the rail instead of taking the same-host ring",
                )));
            }
            if fds[0].revents == 0 {
                continue;
            }
            let sock = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e.into()),
            };
            sock.set_nonblocking(false)?;
            let left = deadline.saturating_duration_since(Instant::now());
            sock.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))?;
            let mut proof = [0u8; NONCE_LEN];
            if (&sock).read_exact(&mut proof).is_err() || &proof != nonce {
                tracing::warn!("a connection to a same-host rail's socket without the proof");
                continue;
            }
            let file = RingFile::create(self.ring_bytes)?;
            let (files, files_end) = UnixStream::pair()?;
            shm::send_ring_file(&sock, &file, &files_end, RING_MSG)?;
            return Ok(ShmLink::new(
                file,
                Side::Connector,
                sock,
                files,
                self.exchange,
            )?);
        }
    }
}

/// The acceptor's side: takes the ring `offer` names, proving itself with the hello's
/// `nonce`, by `deadline` (`exchange`: this side sends by page exchange).
pub(super) fn take_ring(
    session_id: u64,
    rail: u16,
    offer: SameHostOffer,
    nonce: &[u8; NONCE_LEN],
    deadline: Instant,
    exchange: bool,
) -> Result<ShmLink, Error> {
    let addr = socket_name(session_id, rail, offer.token)?;
    let sock = UnixStream::connect_addr(&addr)?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out("taking the ring"));
    }
    sock.set_read_timeout(Some(left))?;
    sock.set_write_timeout(Some(left))?;
    (&sock).write_all(nonce)?;
    let mut msg = [0u8; RING_MSG.len()];
    let fd = shm::recv_ring_file(&sock, &mut msg).map_err(|e| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            timed_out("receiving the ring")
        } else {
            e.into()
        }
    })?;
    if &msg != RING_MSG {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the peer's same-host ring is of another version",
        )));
    }
    let (ring, files) = fd;
    let file = RingFile::open(ring)?;
    Ok(ShmLink::new(file, Side::Acceptor, sock, files, exchange)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::transport::Transport;
    use std::net::TcpListener;
    use std::time::Duration;

    fn tcp_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    #[test]
    fn one_namespace_is_one_identity_and_a_new_one_is_another() {
        let here = host_identity().expect("procfs tells");
        let same = std::thread::spawn(host_identity).join().expect("thread");
        assert_eq!(same, Some(here));
        let other = std::thread::spawn(|| {
            // SAFETY: unshare(2) only moves this thread into a new network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return None;
            }
            Some(host_identity())
        })
        .join()
        .expect("thread");
        match other {
            Some(id) => assert_ne!(id, Some(here), "a new namespace is another host"),
            None => eprintln!("skipped the namespace half: unshare needs root"),
        }
    }

    #[test]
    fn the_ring_goes_to_the_peer_with_the_proof_and_not_to_an_impostor() {
        const SESSION: u64 = 0xfeed;
        let offer = Offer::new(SESSION, 2, shm::DEFAULT_RING_BYTES, true).expect("offer");
        let wire = offer.wire();
        let nonce = [7u8; NONCE_LEN];
        let (tcp, _tcp_peer) = tcp_pair();
        let deadline = Instant::now() + Duration::from_secs(20);
        let connector = std::thread::spawn(move || offer.complete(&nonce, &tcp, deadline));
        // An impostor in the namespace finds the socket and guesses the proof wrong: it gets
        // nothing and the offer stands.
        let addr = socket_name(SESSION, 2, wire.token).expect("name");
        let mut impostor = UnixStream::connect_addr(&addr).expect("impostor connects");
        impostor.write_all(&[0u8; NONCE_LEN]).expect("guess");
        let mut b = [0u8; 1];
        impostor
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        assert_eq!(
            impostor.read(&mut b).unwrap_or(0),
            0,
            "closed, nothing sent"
        );
        let acceptor = take_ring(SESSION, 2, wire, &nonce, deadline, true).expect("take the ring");
        let connector = connector.join().expect("thread").expect("handed over");
        assert_eq!(
            connector
                .send(&[(b"ping".as_ptr(), 4)], 0, false, &[])
                .expect("send"),
            4
        );
        let mut got = [0u8; 4];
        assert_eq!(acceptor.recv(&mut got).expect("recv"), 4);
        assert_eq!(&got, b"ping");
    }

    #[test]
    fn the_connector_stops_waiting_when_the_acceptor_closes_the_rail() {
        let offer = Offer::new(0xbeef, 0, shm::DEFAULT_RING_BYTES, true).expect("offer");
        let (tcp, tcp_peer) = tcp_pair();
        drop(tcp_peer);
        let deadline = Instant::now() + Duration::from_secs(20);
        let r = offer.complete(&[1; NONCE_LEN], &tcp, deadline);
        assert!(
            matches!(r, Err(Error::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionAborted)
        );
    }
}
