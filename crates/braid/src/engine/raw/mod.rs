//! Raw-Ethernet rails: the session's byte stream as [`braid_proto::link`] datagrams in
//! Ethernet frames of their own type, through the device's AF_XDP port ([`hub`]), with no
//! IP and no TCP on the data path (docs/RAW-ETHERNET.md). The rail's TCP connection stays
//! open beside it, carrying nothing: its end tells that the peer closed or died.
//!
//! Timers are serviced whenever the link is touched: every send and receive, every empty
//! poll, and the engine's periodic sample. A timer descriptor among the rail's readiness
//! descriptors makes sure it is touched when its next deadline comes (a resend, or an
//! acknowledgement due), even if nothing else wakes a reader. Acknowledgements ride on
//! data (braid's session answers every operation, so data flows both ways), go alone after
//! 50 µs when the link is polled (at most [`TIMER_FLOOR`] later otherwise), and at once for
//! a quarter window or for data out of order.

pub(crate) mod hub;

use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_proto::link::{LINK_HEADER, Link, LinkConfig};
use parking_lot::Mutex;

use super::io::Received;
use super::transport::{LinkSample, ReadinessFds, Transport};
use hub::{Hub, Inbox};

/// How often a busy poller looks at the control connection for the peer's end.
const CONTROL_LOOK: Duration = Duration::from_millis(1);
/// Empty polls closer together than this are a busy poller's.
const BUSY_GAP: Duration = Duration::from_micros(20);
/// The timer descriptor fires no sooner than this after it is set: a delayed
/// acknowledgement is usually sent with the reply well before, and a wake-up per message
/// would cost more than it saves. Resends (2 ms and more) are not delayed by it.
const TIMER_FLOOR: Duration = Duration::from_micros(500);

/// The parts of `pieces` from `skip` bytes in, as (start, length); `at` offsets a start.
fn from_skip<P: Copy>(
    pieces: &[(P, usize)],
    mut skip: usize,
    at: fn(P, usize) -> P,
) -> impl Iterator<Item = (P, usize)> + '_ {
    pieces.iter().filter_map(move |&(p, len)| {
        if skip >= len {
            skip -= len;
            return None;
        }
        let part = (at(p, skip), len - skip);
        skip = 0;
        Some(part)
    })
}

struct State {
    link: Link,
    /// One datagram being built or received.
    scratch: Vec<u8>,
    /// Bytes moved between the link and the caller's pieces.
    bounce: Vec<u8>,
    last_rx: Instant,
    last_ack: Instant,
    unacked: usize,
    last_empty: Instant,
    control_looked: Instant,
    /// When the timer descriptor is set to fire (it is not disarmed when the deadline it
    /// was set for goes away: it then fires once for nothing).
    timer_at: Option<Instant>,
    /// The peer closed (its control connection ended).
    ended: bool,
    error: Option<io::Error>,
}

/// One raw rail.
pub(crate) struct RawLink {
    hub: Arc<Hub>,
    inbox: Arc<Mutex<Inbox>>,
    state: Mutex<State>,
    peer: [u8; 6],
    /// Our tag for this rail (frames to us carry it).
    tag: u32,
    /// The peer's tag for this rail (frames we send carry it).
    peer_tag: u32,
    control: TcpStream,
    /// An epoll set of the rail's own duplicate of the port's socket, the control
    /// connection, the bell and the timer: what the engine polls. (A sleeper polls the
    /// sources themselves, see [`Transport::sleeper_fds`].)
    readiness: OwnedFd,
    /// The duplicate in `readiness` (kept open: closing it would take it out).
    _port_fd: OwnedFd,
    /// The inbox's bell (see [`Inbox`]).
    bell: RawFd,
    /// Fires at the link's next deadline (see the module's docs).
    timer: OwnedFd,
}

impl RawLink {
    /// A rail over `hub` to the peer at hardware address `peer`, which tags its frames for
    /// us with `tag` (`inbox`'s) and wants ours tagged `peer_tag`; `control` is the rail's
    /// TCP connection, handshake done.
    pub(crate) fn new(
        hub: Arc<Hub>,
        (tag, inbox): (u32, Arc<Mutex<Inbox>>),
        peer: [u8; 6],
        peer_tag: u32,
        control: TcpStream,
    ) -> io::Result<RawLink> {
        control.set_nonblocking(true)?;
        let port_fd = hub.readiness()?;
        let bell = inbox.lock().bell();
        let timer = rustix::time::timerfd_create(
            rustix::time::TimerfdClockId::Monotonic,
            rustix::time::TimerfdFlags::NONBLOCK | rustix::time::TimerfdFlags::CLOEXEC,
        )?;
        // SAFETY: plain epoll creation; owned at once.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel just returned it.
        let readiness = unsafe { OwnedFd::from_raw_fd(ep) };
        for fd in [
            port_fd.as_raw_fd(),
            control.as_raw_fd(),
            bell,
            timer.as_raw_fd(),
        ] {
            let mut ev = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
                u64: fd as u64,
            };
            // SAFETY: valid descriptors and event.
            if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        let max_payload = hub.max_datagram() - LINK_HEADER;
        let cfg = LinkConfig {
            max_payload,
            send_buffer: 2 << 20,
            recv_buffer: 1 << 20,
            ack_every: 256 << 10,
            ..LinkConfig::default()
        };
        let now = Instant::now();
        Ok(RawLink {
            state: Mutex::new(State {
                link: Link::new(cfg),
                scratch: vec![0; LINK_HEADER + max_payload],
                bounce: Vec::new(),
                last_rx: now,
                last_ack: now,
                unacked: 0,
                last_empty: now,
                control_looked: now,
                timer_at: None,
                ended: false,
                error: None,
            }),
            hub,
            inbox,
            peer,
            tag,
            peer_tag,
            control,
            readiness,
            _port_fd: port_fd,
            bell,
            timer,
        })
    }

    /// Takes what came, then sends what is due (acknowledgements, resends).
    fn service(&self, st: &mut State, now: Instant) -> io::Result<()> {
        self.hub.pump(self.tag);
        let mut bad = None;
        let mut any = false;
        self.inbox.lock().drain(|d| {
            any = true;
            if bad.is_none()
                && let Err(e) = st.link.on_datagram(now, d)
            {
                bad = Some(e);
            }
        });
        if let Some(e) = bad {
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
        if any {
            st.last_rx = now;
        }
        let unacked = st.link.unacknowledged();
        if unacked < st.unacked || unacked == 0 {
            st.last_ack = now;
        }
        st.unacked = unacked;
        self.transmit(st, now)
    }

    /// [`RawLink::service`] for a thread that is not the rail's reader (a sender, the
    /// engine's tick). Bytes it moves into the link may be what a sleeping reader waits
    /// for, announced by an edge that is spent: it rings the rail's own bell, so that the
    /// reader looks again. (Found with state dumps of 25-50 ms stalls of blocking 64 KiB
    /// ping-pongs: the reader asleep, the whole rest of its frame in the link.)
    fn service_aside(&self, st: &mut State, now: Instant) -> io::Result<()> {
        let before = st.link.readable();
        let r = self.service(st, now);
        if st.link.readable() > before {
            self.inbox.lock().ring();
        }
        r
    }

    /// Sends every datagram the link has due.
    fn transmit(&self, st: &mut State, now: Instant) -> io::Result<()> {
        let mut sent = false;
        loop {
            let n = match st.link.poll_datagram(now, &mut st.scratch) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) => return Err(io::Error::new(io::ErrorKind::TimedOut, e)),
            };
            // A datagram the device cannot take now is as good as lost: the link resends.
            self.hub.send(self.peer, self.peer_tag, &st.scratch[..n])?;
            sent = true;
        }
        if sent {
            self.hub.flush()?;
        }
        self.set_timer(st, now)
    }

    /// Sets the timer descriptor for the link's next deadline, if it is not set for that
    /// or sooner already; clears a timer that fired.
    fn set_timer(&self, st: &mut State, now: Instant) -> io::Result<()> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        if st.timer_at.is_some_and(|t| t <= now) {
            let mut b = [0u8; 8];
            // Read, the descriptor is quiet again (the count itself does not matter).
            let _ = rustix::io::read(&self.timer, &mut b);
            st.timer_at = None;
        }
        let Some(due) = st.link.poll_timeout() else {
            return Ok(());
        };
        let due = due.max(now + TIMER_FLOOR);
        if st.timer_at.is_some_and(|t| t <= due) {
            return Ok(());
        }
        let d = due - now;
        let spec = Itimerspec {
            it_interval: Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: Timespec {
                tv_sec: d.as_secs() as _,
                tv_nsec: d.subsec_nanos() as _,
            },
        };
        timerfd_settime(&self.timer, TimerfdTimerFlags::empty(), &spec)?;
        st.timer_at = Some(due);
        Ok(())
    }

    /// Whether the peer ended the control connection (looked at most every
    /// [`CONTROL_LOOK`] by a busy poller, at every empty read otherwise).
    fn peer_ended(&self, st: &mut State, now: Instant) -> bool {
        if st.ended {
            return true;
        }
        let busy = now.duration_since(st.last_empty) < BUSY_GAP;
        st.last_empty = now;
        if busy && now.duration_since(st.control_looked) < CONTROL_LOOK {
            return false;
        }
        st.control_looked = now;
        let mut b = [0u8; 1];
        // SAFETY: a one-byte peek into a local buffer.
        let r = unsafe {
            libc::recv(
                self.control.as_raw_fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r == 0 {
            st.ended = true;
        } else if r > 0 {
            // Nothing may come on the connection once the rail is raw.
            st.error = Some(io::Error::new(
                io::ErrorKind::InvalidData,
                "bytes on a raw rail's control connection",
            ));
            st.ended = true;
        } else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                st.error = Some(e);
                st.ended = true;
            }
        }
        st.ended
    }

    /// Reads into the `dst` pieces (`want` bytes in all); `Ok(0)` when the link is empty
    /// (or ended: see the callers).
    fn read_into(
        &self,
        st: &mut State,
        dst: impl Iterator<Item = (*mut u8, usize)>,
        want: usize,
        fragile: bool,
    ) -> io::Result<usize> {
        let n = st.link.readable().min(want);
        if n == 0 {
            return Ok(0);
        }
        st.bounce.resize(n, 0);
        let now = Instant::now();
        let got = st.link.read(now, &mut st.bounce[..n]);
        let mut off = 0;
        for (p, len) in dst {
            if off == got {
                break;
            }
            let take = len.min(got - off);
            // SAFETY: the caller's pieces are valid for their lengths (file pages may be
            // truncated when `fragile`: the checked copy reports them).
            let done = unsafe {
                if fragile {
                    braid_proto::mem::file::copy_checked(st.bounce.as_ptr().add(off), p, take)
                } else {
                    std::ptr::copy_nonoverlapping(st.bounce.as_ptr().add(off), p, take);
                    take
                }
            };
            if done < take {
                return Err(io::Error::from_raw_os_error(libc::EFAULT));
            }
            off += take;
        }
        // Reading may reopen the window: the peer hears of it now.
        self.transmit(st, now)?;
        Ok(got)
    }
}

impl Transport for RawLink {
    fn readiness_fd(&self) -> RawFd {
        self.readiness.as_raw_fd()
    }

    /// The sources of [`RawLink::readiness`] (the port, the control connection, the bell
    /// and the timer), with the device's shared port descriptor in place of this rail's
    /// duplicate (which closes with the rail while the port lives on).
    fn sleeper_fds(&self) -> ReadinessFds {
        ReadinessFds::new(&[
            self.hub.shared_readiness(),
            self.control.as_raw_fd(),
            self.bell,
            self.timer.as_raw_fd(),
        ])
    }

    fn kind(&self) -> &'static str {
        "raw"
    }

    fn send(
        &self,
        pieces: &[(*const u8, usize)],
        skip: usize,
        fragile: bool,
        _stable: &[bool],
    ) -> io::Result<usize> {
        let mut st = self.state.lock();
        let st = &mut *st;
        if let Some(e) = st.link.error() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, e.clone()));
        }
        let mut taken = 0;
        for (p, len) in from_skip(pieces, skip, <*const u8>::wrapping_add) {
            let len = len.min(st.link.writable());
            if len == 0 {
                break;
            }
            st.bounce.resize(len, 0);
            // SAFETY: the caller's piece is valid for its length (file pages may be
            // truncated when `fragile`: the checked copy reports them).
            let done = unsafe {
                if fragile {
                    braid_proto::mem::file::copy_checked(p, st.bounce.as_mut_ptr(), len)
                } else {
                    std::ptr::copy_nonoverlapping(p, st.bounce.as_mut_ptr(), len);
                    len
                }
            };
            taken += st.link.write(&st.bounce[..done]);
            if done < len {
                // A truncated file page: an error before any byte, a short count after.
                if taken == 0 {
                    return Err(io::Error::from_raw_os_error(libc::EFAULT));
                }
                break;
            }
        }
        let now = Instant::now();
        self.service_aside(st, now)?;
        if taken == 0 && pieces.iter().map(|p| p.1).sum::<usize>() > 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(taken)
    }

    fn recv_pieces(
        &self,
        pieces: &[(*mut u8, usize)],
        skip: usize,
        tail: Option<(*mut u8, usize)>,
        fragile: bool,
    ) -> io::Result<Received> {
        let dst = || from_skip(pieces, skip, <*mut u8>::wrapping_add).chain(tail);
        let asked = dst().map(|p| p.1).sum();
        let mut st = self.state.lock();
        let st = &mut *st;
        let now = Instant::now();
        self.service(st, now)?;
        let got = self.read_into(st, dst(), asked, fragile)?;
        if got == 0 && asked > 0 {
            if self.peer_ended(st, now) {
                return match st.error.take() {
                    Some(e) => Err(e),
                    None => Ok(Received { got: 0, asked }),
                };
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(Received { got, asked })
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_pieces(&[], 0, Some((buf.as_mut_ptr(), buf.len())), false)
            .map(|r| r.got)
    }

    fn set_wake_threshold(&self, _bytes: usize) -> io::Result<()> {
        // Readiness comes with every frame; the reader reads what is there.
        Ok(())
    }

    fn bytes_waiting(&self) -> Option<usize> {
        // Frames still in the port count too: a reader that finds too few bytes here goes
        // back to sleep, and the edge that announced those frames is spent.
        let mut st = self.state.lock();
        let st = &mut *st;
        if let Err(e) = self.service(st, Instant::now()) {
            st.error = Some(e);
            return None;
        }
        Some(st.link.readable())
    }

    fn arm(&self, want: usize) -> io::Result<bool> {
        let mut st = self.state.lock();
        let st = &mut *st;
        self.service(st, Instant::now())?;
        Ok(st.link.readable() >= want.max(1))
    }

    fn sample(&self) -> Option<LinkSample> {
        let mut st = self.state.lock();
        let now = Instant::now();
        // The engine's tick: the moment a sleeping link's resend timer is looked at.
        if let Err(e) = self.service_aside(&mut st, now) {
            st.error = Some(e);
        }
        let unacked = st.link.unacknowledged();
        Some(LinkSample {
            delivery_rate: None,
            since_data_recv: now.duration_since(st.last_rx),
            unacked: unacked.div_ceil(self.hub.max_datagram()) as u32,
            since_ack_recv: now.duration_since(st.last_ack),
            rtt: Duration::from_micros(50),
        })
    }

    fn local_fault(&self) -> Option<String> {
        super::linkwatch::local_fault(self.control.as_raw_fd())
    }

    fn take_error(&self) -> Option<io::Error> {
        let mut st = self.state.lock();
        if let Some(e) = st.error.take() {
            return Some(e);
        }
        if let Some(e) = st.link.error() {
            return Some(io::Error::new(io::ErrorKind::TimedOut, e.clone()));
        }
        self.control.take_error().ok().flatten()
    }

    fn shutdown(&self) {
        let _ = self.control.shutdown(Shutdown::Both);
        self.state.lock().ended = true;
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    /// A raw link on `hub` whose control connection goes nowhere useful (its peer end is
    /// returned, to keep it open).
    fn link_on(hub: &Arc<Hub>) -> (RawLink, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (theirs, _) = l.accept().unwrap();
        let joined = hub.join([0; 6]).unwrap();
        (
            RawLink::new(hub.clone(), joined, [0; 6], 1, ours).unwrap(),
            theirs,
        )
    }

    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    /// The port of `lo` (generic mode), or `None` where none can be opened (not root).
    fn lo_hub() -> Option<Arc<Hub>> {
        let probe = TcpListener::bind("127.0.0.1:0").unwrap();
        let hub = Hub::for_socket(probe.as_raw_fd()).ok();
        if hub.is_none() {
            eprintln!("SKIPPED: no AF_XDP port on lo here (needs root)");
        }
        hub
    }

    /// Sends a data datagram carrying `abc` over lo to ourselves, for the rail tagged `tag`.
    fn send_abc_to(hub: &Hub, tag: u32) {
        let mut d = [0u8; LINK_HEADER + 3];
        d[0] = 1; // data
        d[2] = 3; // three bytes
        d[LINK_HEADER..].copy_from_slice(b"abc");
        assert!(hub.send([0; 6], tag, &d).unwrap());
        hub.flush().unwrap();
    }

    #[test]
    fn frames_another_rail_took_off_the_port_wake_their_own_rail() {
        let Some(hub) = lo_hub() else { return };
        let (a, _ka) = link_on(&hub);
        let (b, _kb) = link_on(&hub);
        assert!(!readable(b.bell));
        // A datagram for b, sent over lo to ourselves; a's reader takes it off the port.
        send_abc_to(&hub, b.tag);
        let deadline = Instant::now() + Duration::from_secs(5);
        while b.inbox.lock().bytes_waiting() == 0 {
            hub.pump(a.tag);
            assert!(
                Instant::now() < deadline,
                "the frame never came back over lo"
            );
        }
        // The port is empty now, yet b's readiness says there is something to read.
        assert!(
            !readable(hub.shared_readiness()),
            "the port should be empty"
        );
        assert!(
            readable(b.readiness_fd()),
            "the engine's set misses the bell"
        );
        assert!(
            b.sleeper_fds().as_slice().contains(&b.bell) && readable(b.bell),
            "b's reader would sleep past its frame"
        );
        let mut buf = [0u8; 8];
        assert_eq!(b.recv(&mut buf).unwrap(), 3);
        assert_eq!(&buf[..3], b"abc");
        // Read, the bell is quiet again (a level-triggered sleeper does not spin).
        assert!(!readable(b.bell));
    }

    #[test]
    fn a_sender_that_takes_the_readers_bytes_off_the_port_rings_its_bell() {
        let Some(hub) = lo_hub() else { return };
        let (a, _ka) = link_on(&hub);
        // A datagram for a, sent over lo to ourselves.
        send_abc_to(&hub, a.tag);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !readable(hub.shared_readiness()) {
            assert!(
                Instant::now() < deadline,
                "the frame never came back over lo"
            );
        }
        assert!(!readable(a.bell));
        // a's sending side takes the frame off the port into the link (as a flush on
        // another thread would while a's reader sleeps): the reader is told.
        let x = [1u8; 4];
        a.send(&[(x.as_ptr(), x.len())], 0, false, &[true]).unwrap();
        assert!(readable(a.bell), "a sleeping reader would not look again");
        let mut buf = [0u8; 8];
        assert_eq!(a.recv(&mut buf).unwrap(), 3);
        assert!(!readable(a.bell));
    }

    #[test]
    fn an_unacknowledged_send_wakes_its_rail_at_the_resend_deadline() {
        let Some(hub) = lo_hub() else { return };
        let (a, _ka) = link_on(&hub);
        let timer = a.timer.as_raw_fd();
        assert!(a.sleeper_fds().as_slice().contains(&timer));
        assert!(!readable(timer), "nothing is due yet");
        // Nobody answers (no rail has the peer's tag): only the timer can bring the resend.
        let data = [7u8; 100];
        assert_eq!(
            a.send(&[(data.as_ptr(), data.len())], 0, false, &[true])
                .unwrap(),
            100
        );
        let mut p = libc::pollfd {
            fd: timer,
            events: libc::POLLIN,
            revents: 0,
        };
        let t0 = Instant::now();
        // SAFETY: one valid pollfd; waits at most 5 s.
        let n = unsafe { libc::poll(&mut p, 1, 5000) };
        assert_eq!(n, 1, "the timer never fired");
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "fired late: {:?}",
            t0.elapsed()
        );
        assert!(
            readable(a.readiness_fd()),
            "the engine's set misses the timer"
        );
        // Touched now, the link resends, clears the timer and sets it for the next timeout.
        let mut buf = [0u8; 8];
        assert!(
            a.recv(&mut buf)
                .is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock)
        );
        assert!(
            !readable(timer),
            "a fired timer is cleared when the link is touched"
        );
        assert!(
            a.state.lock().timer_at.is_some(),
            "the resend is still unacknowledged"
        );
    }
}
