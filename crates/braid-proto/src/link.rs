//! A reliable, ordered byte stream over datagrams that may be lost, duplicated or
//! reordered: what a raw-Ethernet rail needs under the session, which expects every rail
//! to be such a stream (docs/RAW-ETHERNET.md). Sans-IO: the driver feeds received
//! datagrams to [`Link::on_datagram`], asks [`Link::poll_datagram`] for the next one to
//! send, and wakes at [`Link::poll_timeout`]. braid's raw rails drive it
//! (`braid::engine::raw`).
//!
//! The protocol is go-back-N, which suits links that lose little and never reorder (a
//! veth, a switched LAN): every datagram carries a header of 16 bytes, little-endian:
//!
//! | offset | field | meaning |
//! |---|---|---|
//! | 0 | kind `u8` | 1 data, 2 acknowledgement only |
//! | 1 | `u8` | zero |
//! | 2 | len `u16` | payload bytes after the header |
//! | 4 | seq `u32` | stream offset of the first payload byte (the sender's next offset in an acknowledgement) |
//! | 8 | ack `u32` | the next stream offset this side expects |
//! | 12 | window `u32` | bytes this side can take beyond `ack` |
//!
//! Offsets wrap at 2^32 and are compared within half of that. The receiver keeps only
//! in-order data: anything else is dropped and answered with an immediate acknowledgement.
//! The sender resends everything from the oldest unacknowledged byte when its timer runs
//! out, doubling the timer each time, and gives up ([`LinkError::PeerSilent`]) after
//! [`LinkConfig::max_retries`] timeouts without progress. Acknowledgements ride on data;
//! one goes alone when [`LinkConfig::ack_delay`] passes without data to carry it, or
//! [`LinkConfig::ack_every`] bytes came since the last.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Bytes of the header before each datagram's payload.
pub const LINK_HEADER: usize = 16;

const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;

/// Sizes and timers of a link.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// Most payload bytes per datagram (the path's datagram size minus [`LINK_HEADER`]).
    pub max_payload: usize,
    /// Bytes written but not yet acknowledged that the link holds.
    pub send_buffer: usize,
    /// Bytes received in order but not yet read that the link holds (the window).
    pub recv_buffer: usize,
    /// First retransmission timeout.
    pub rto: Duration,
    /// Longest retransmission timeout (the doubling stops there).
    pub max_rto: Duration,
    /// Timeouts in a row without progress before the link fails.
    pub max_retries: u32,
    /// How long an acknowledgement waits for data to ride on; `None`: it waits for data
    /// (or for [`LinkConfig::ack_every`] bytes), and a driver without timers then relies on
    /// the reverse traffic, as braid's session always has some (its `Done` frames).
    pub ack_delay: Option<Duration>,
    /// Received bytes after which an acknowledgement goes at once, data or not.
    pub ack_every: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            max_payload: 1500 - LINK_HEADER,
            send_buffer: 1 << 20,
            recv_buffer: 1 << 20,
            rto: Duration::from_millis(2),
            max_rto: Duration::from_millis(200),
            max_retries: 12,
            ack_delay: Some(Duration::from_micros(50)),
            ack_every: 1 << 18,
        }
    }
}

/// Why a link stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    /// A datagram that breaks the format or acknowledges bytes never sent.
    #[error("malformed link datagram: {0}")]
    Malformed(&'static str),
    /// No acknowledgement of outstanding data through `max_retries` timeouts.
    #[error("the peer acknowledged nothing through {0} retransmission timeouts")]
    PeerSilent(u32),
}

/// `a - b` as a signed distance in the wrapping offset space.
fn diff(a: u32, b: u32) -> i64 {
    a.wrapping_sub(b) as i32 as i64
}

/// One end of a link.
#[derive(Debug)]
pub struct Link {
    cfg: LinkConfig,
    /// Written bytes from `snd_una` on: acknowledged ones leave the front.
    sendq: VecDeque<u8>,
    /// Oldest unacknowledged offset (the offset of `sendq[0]`).
    snd_una: u32,
    /// Next offset to send (resets to `snd_una` on a timeout).
    snd_nxt: u32,
    /// Highest offset ever sent: no acknowledgement may pass it.
    snd_max: u32,
    /// The peer's `ack + window`: no byte at or past it may go.
    snd_limit: u32,
    rto: Duration,
    /// When the oldest outstanding byte is due again.
    rto_at: Option<Instant>,
    retries: u32,
    /// A zero-length data datagram is due: it makes a peer whose window we saw closed
    /// say whether it opened.
    probe: bool,
    /// Received in-order bytes not yet read.
    recvq: VecDeque<u8>,
    rcv_nxt: u32,
    /// An acknowledgement is owed; `Some(t)`: send one alone at `t` if no data carries it.
    ack_at: Option<Instant>,
    /// Bytes received since our last acknowledgement went.
    unacked_in: usize,
    failed: Option<LinkError>,
    /// Datagrams sent again after a timeout (for tests and statistics).
    resent: u64,
}

impl Link {
    /// A fresh link; both ends start at offset 0 and assume the peer's window is its
    /// `recv_buffer`, the same as ours, until the peer says otherwise.
    pub fn new(cfg: LinkConfig) -> Link {
        let window = cfg.recv_buffer as u32;
        Link {
            rto: cfg.rto,
            cfg,
            sendq: VecDeque::new(),
            snd_una: 0,
            snd_nxt: 0,
            snd_max: 0,
            snd_limit: window,
            rto_at: None,
            retries: 0,
            probe: false,
            recvq: VecDeque::new(),
            rcv_nxt: 0,
            ack_at: None,
            unacked_in: 0,
            failed: None,
            resent: 0,
        }
    }

    /// Queues as much of `data` as the send buffer takes; returns how much.
    pub fn write(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.cfg.send_buffer - self.sendq.len());
        self.sendq.extend(&data[..n]);
        n
    }

    /// Bytes [`Link::write`] would take now.
    pub fn writable(&self) -> usize {
        self.cfg.send_buffer - self.sendq.len()
    }

    /// Bytes received in order and not read yet.
    pub fn readable(&self) -> usize {
        self.recvq.len()
    }

    /// Moves received bytes into `buf`; returns how many. Reading may open the window, and
    /// then the peer is told at once when it had been full.
    pub fn read(&mut self, now: Instant, buf: &mut [u8]) -> usize {
        let was_closed = self.window() < self.cfg.max_payload as u32;
        let n = buf.len().min(self.recvq.len());
        for (d, s) in buf.iter_mut().zip(self.recvq.drain(..n)) {
            *d = s;
        }
        if n > 0 && was_closed {
            self.ack_at = Some(now);
        }
        n
    }

    /// Why the link failed, if it did; a failed link sends and accepts nothing.
    pub fn error(&self) -> Option<&LinkError> {
        self.failed.as_ref()
    }

    /// Bytes written that the peer has not acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.sendq.len()
    }

    /// Datagrams sent again after timeouts.
    pub fn resent(&self) -> u64 {
        self.resent
    }

    fn window(&self) -> u32 {
        (self.cfg.recv_buffer - self.recvq.len()) as u32
    }

    /// Takes one received datagram. A malformed one fails the link (the rail then fails
    /// over, as a broken TCP connection does).
    pub fn on_datagram(&mut self, now: Instant, d: &[u8]) -> Result<(), LinkError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.take(now, d);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn take(&mut self, now: Instant, d: &[u8]) -> Result<(), LinkError> {
        if d.len() < LINK_HEADER {
            return Err(LinkError::Malformed("shorter than the header"));
        }
        let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap());
        let (kind, len) = (d[0], u16::from_le_bytes([d[2], d[3]]) as usize);
        let (seq, ack, window) = (u32_at(4), u32_at(8), u32_at(12));
        if d[1] != 0 || !(kind == KIND_DATA || kind == KIND_ACK) {
            return Err(LinkError::Malformed("unknown kind"));
        }
        if len != d.len() - LINK_HEADER || (kind == KIND_ACK && len != 0) {
            return Err(LinkError::Malformed("length does not match the datagram"));
        }
        // The acknowledgement: it may not pass what we ever sent; an older one (a late
        // duplicate) tells nothing new.
        let acked = diff(ack, self.snd_una);
        if acked > diff(self.snd_max, self.snd_una) {
            return Err(LinkError::Malformed("acknowledges bytes never sent"));
        }
        if acked >= 0 {
            // The peer is alive: timeouts count again from zero.
            self.retries = 0;
            if acked > 0 {
                self.sendq.drain(..acked as usize);
                self.snd_una = ack;
                if diff(self.snd_nxt, ack) < 0 {
                    self.snd_nxt = ack;
                }
                self.rto = self.cfg.rto;
                self.rto_at = (!self.sendq.is_empty()).then(|| now + self.rto);
            }
            self.snd_limit = ack.wrapping_add(window);
        }
        if kind == KIND_DATA {
            let payload = &d[LINK_HEADER..];
            if seq == self.rcv_nxt && payload.len() <= self.window() as usize {
                if !payload.is_empty() {
                    self.recvq.extend(payload);
                    self.rcv_nxt = self.rcv_nxt.wrapping_add(payload.len() as u32);
                    self.unacked_in += payload.len();
                    let due = if self.unacked_in >= self.cfg.ack_every {
                        Some(now)
                    } else {
                        self.cfg.ack_delay.map(|d| now + d)
                    };
                    if let Some(due) = due {
                        self.ack_at = Some(self.ack_at.map_or(due, |t| t.min(due)));
                    }
                } else {
                    self.ack_at = Some(now); // a probe: answer it
                }
            } else {
                // Out of order, a duplicate, or no room: say where we stand, now.
                self.ack_at = Some(now);
            }
        }
        Ok(())
    }

    /// When the driver must call [`Link::poll_datagram`] again even if nothing arrives.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.failed.is_some() {
            return None;
        }
        match (self.rto_at, self.ack_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Writes the next datagram to send into `out` (at least `LINK_HEADER + max_payload`
    /// bytes) and returns its length, or `None` when nothing is due. Call until `None`.
    pub fn poll_datagram(
        &mut self,
        now: Instant,
        out: &mut [u8],
    ) -> Result<Option<usize>, LinkError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if let Some(at) = self.rto_at
            && now >= at
        {
            self.retries += 1;
            if self.retries > self.cfg.max_retries {
                let e = LinkError::PeerSilent(self.cfg.max_retries);
                self.failed = Some(e.clone());
                return Err(e);
            }
            // Go back: everything outstanding goes again; probe a closed window.
            if self.snd_nxt != self.snd_una {
                self.resent += 1;
            }
            self.snd_nxt = self.snd_una;
            self.probe = diff(self.snd_limit, self.snd_una) <= 0 && !self.sendq.is_empty();
            self.rto = (self.rto * 2).min(self.cfg.max_rto);
            self.rto_at = Some(now + self.rto);
        }
        let unsent = diff(
            self.snd_una.wrapping_add(self.sendq.len() as u32),
            self.snd_nxt,
        );
        let room = diff(self.snd_limit, self.snd_nxt);
        let n = unsent.min(room).clamp(0, self.cfg.max_payload as i64) as usize;
        if n > 0 || self.probe {
            self.probe = false;
            let from = diff(self.snd_nxt, self.snd_una) as usize;
            for (d, s) in out[LINK_HEADER..LINK_HEADER + n]
                .iter_mut()
                .zip(self.sendq.range(from..from + n))
            {
                *d = *s;
            }
            self.header(out, KIND_DATA, n, self.snd_nxt);
            self.snd_nxt = self.snd_nxt.wrapping_add(n as u32);
            if diff(self.snd_nxt, self.snd_max) > 0 {
                self.snd_max = self.snd_nxt;
            }
            if self.rto_at.is_none() {
                self.rto_at = Some(now + self.rto);
            }
            return Ok(Some(LINK_HEADER + n));
        }
        if let Some(at) = self.ack_at
            && now >= at
        {
            self.header(out, KIND_ACK, 0, self.snd_nxt);
            return Ok(Some(LINK_HEADER));
        }
        Ok(None)
    }

    /// Fills the header; every datagram carries our acknowledgement, which is then paid.
    fn header(&mut self, out: &mut [u8], kind: u8, len: usize, seq: u32) {
        out[0] = kind;
        out[1] = 0;
        out[2..4].copy_from_slice(&(len as u16).to_le_bytes());
        out[4..8].copy_from_slice(&seq.to_le_bytes());
        out[8..12].copy_from_slice(&self.rcv_nxt.to_le_bytes());
        out[12..16].copy_from_slice(&self.window().to_le_bytes());
        self.ack_at = None;
        self.unacked_in = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever arrives, the link answers with an error or takes it; it never panics,
        /// and what it then reads or sends stays within its buffers.
        #[test]
        fn any_datagrams_are_taken_or_refused_without_a_panic(
            ds in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..20),
            kinds in proptest::collection::vec(1u8..3, 20),
        ) {
            let (mut a, _, t) = pair();
            a.write(&[9; 500]);
            let mut buf = [0u8; 200];
            let _ = a.poll_datagram(t, &mut buf);
            for (mut d, k) in ds.into_iter().zip(kinds) {
                // Half of them well framed, so the checks past the header run too.
                if d.len() >= LINK_HEADER && k == 1 {
                    d[0] = KIND_DATA;
                    d[1] = 0;
                    let len = (d.len() - LINK_HEADER) as u16;
                    d[2..4].copy_from_slice(&len.to_le_bytes());
                }
                let _ = a.on_datagram(t, &d);
                let mut sink = [0u8; 64];
                a.read(t, &mut sink);
                let _ = a.poll_datagram(t, &mut buf);
            }
        }
    }

    fn pair() -> (Link, Link, Instant) {
        let cfg = LinkConfig {
            max_payload: 100,
            send_buffer: 1000,
            recv_buffer: 300,
            ..LinkConfig::default()
        };
        (Link::new(cfg.clone()), Link::new(cfg), Instant::now())
    }

    #[test]
    fn a_write_crosses_and_is_acknowledged_once_the_delay_passes() {
        let (mut a, mut b, t) = pair();
        assert_eq!(a.write(&[7; 250]), 250);
        let mut buf = [0u8; 200];
        let mut sent = 0;
        while let Some(n) = a.poll_datagram(t, &mut buf).unwrap() {
            b.on_datagram(t, &buf[..n]).unwrap();
            sent += 1;
        }
        assert_eq!(sent, 3);
        assert_eq!(b.readable(), 250);
        // No acknowledgement before the delay; one after it.
        assert_eq!(b.poll_datagram(t, &mut buf).unwrap(), None);
        let later = t + LinkConfig::default().ack_delay.unwrap();
        let n = b.poll_datagram(later, &mut buf).unwrap().unwrap();
        a.on_datagram(later, &buf[..n]).unwrap();
        assert_eq!(a.unacknowledged(), 0);
        assert_eq!(a.poll_timeout(), None);
    }

    #[test]
    fn the_window_holds_the_sender_back_and_a_read_reopens_it() {
        let (mut a, mut b, t) = pair();
        a.write(&[1; 1000]);
        let mut buf = [0u8; 200];
        while let Some(n) = a.poll_datagram(t, &mut buf).unwrap() {
            b.on_datagram(t, &buf[..n]).unwrap();
        }
        assert_eq!(b.readable(), 300, "the window is the receive buffer");
        let mut sink = [0u8; 300];
        assert_eq!(b.read(t, &mut sink), 300);
        // The full receiver says at once that it opened.
        let n = b.poll_datagram(t, &mut buf).unwrap().unwrap();
        a.on_datagram(t, &buf[..n]).unwrap();
        assert!(a.poll_datagram(t, &mut buf).unwrap().is_some());
    }

    #[test]
    fn malformed_datagrams_fail_the_link_with_a_reason() {
        let (mut a, _, t) = pair();
        assert_eq!(
            a.on_datagram(t, &[1; 5]),
            Err(LinkError::Malformed("shorter than the header"))
        );
        let (mut a, _, t) = pair();
        let mut d = [0u8; LINK_HEADER];
        d[0] = KIND_ACK;
        d[8..12].copy_from_slice(&5u32.to_le_bytes()); // acknowledges 5 bytes never sent
        assert_eq!(
            a.on_datagram(t, &d),
            Err(LinkError::Malformed("acknowledges bytes never sent"))
        );
        assert!(a.error().is_some());
        let mut buf = [0u8; 200];
        assert!(
            a.poll_datagram(t, &mut buf).is_err(),
            "a failed link sends nothing"
        );
        let (mut a, _, t) = pair();
        d[0] = KIND_DATA;
        d[2] = 9; // claims 9 payload bytes that are not there
        d[8..12].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(
            a.on_datagram(t, &d),
            Err(LinkError::Malformed("length does not match the datagram"))
        );
    }

    #[test]
    fn a_silent_peer_fails_the_link_after_the_retries() {
        let (mut a, _, mut t) = pair();
        a.write(&[1; 10]);
        let mut buf = [0u8; 200];
        assert!(a.poll_datagram(t, &mut buf).unwrap().is_some());
        let mut timeouts = 0;
        loop {
            t = a
                .poll_timeout()
                .expect("a timer runs while data is outstanding");
            match a.poll_datagram(t, &mut buf) {
                Ok(Some(_)) => timeouts += 1,
                Ok(None) => panic!("the timer fired without a resend"),
                Err(e) => {
                    assert_eq!(e, LinkError::PeerSilent(LinkConfig::default().max_retries));
                    break;
                }
            }
        }
        assert_eq!(timeouts, LinkConfig::default().max_retries);
    }
}
