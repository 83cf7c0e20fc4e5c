//! Moving a rail onto raw Ethernet frames after its TCP handshake (docs/PROTOCOL.md,
//! "Raw-Ethernet rails"). The connecting side offers it ([`caps::RAW`]) when it can open an
//! AF_XDP port on the device under the rail's local address; the accepting side takes it
//! when it can too. After the reply, each side sends, over the rail's TCP connection, a
//! raw hello: `BRW1`, its hardware address, two zero bytes, and the tag its frames for this
//! rail must carry (`u32`, little-endian). The connection then carries nothing more; its
//! end tells the other side that this one closed or died.
//!
//! [`caps::RAW`]: braid_proto::wire::handshake::caps::RAW

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use crate::engine::raw::RawLink;
use crate::engine::raw::hub::Hub;
use braid_proto::error::Error;

const MAGIC: [u8; 4] = *b"BRW1";
const HELLO_LEN: usize = 16;

/// This side's half of a raw rail: the port of the rail's device.
pub(super) struct RawOffer {
    hub: Arc<Hub>,
}

impl RawOffer {
    /// The offer for the rail on `stream`, if this process can open (or already has) a port
    /// on its device; why not is logged.
    pub(super) fn new(stream: &TcpStream) -> Option<RawOffer> {
        match Hub::for_socket(stream.as_raw_fd()) {
            Ok(hub) => Some(RawOffer { hub }),
            Err(e) => {
                tracing::info!("rail stays on TCP: {e}");
                None
            }
        }
    }

    /// Both sides, once the offer is taken: exchange the raw hellos (bounded by the
    /// handshake's deadline) and make the link.
    pub(super) fn complete(
        self,
        mut stream: TcpStream,
        deadline: Instant,
    ) -> Result<RawLink, Error> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout("the raw rail's hello".into()));
        }
        stream.set_read_timeout(Some(left))?;
        stream.set_write_timeout(Some(left))?;
        // The peer's address is not known yet: until it is, the tag alone admits frames.
        let (tag, inbox) = self.hub.join([0; 6])?;
        let mut hello = [0u8; HELLO_LEN];
        hello[..4].copy_from_slice(&MAGIC);
        hello[4..10].copy_from_slice(&self.hub.mac());
        hello[12..16].copy_from_slice(&tag.to_le_bytes());
        stream.write_all(&hello)?;
        let mut peer = [0u8; HELLO_LEN];
        stream.read_exact(&mut peer).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                Error::Timeout("the raw rail's hello".into())
            }
            _ => e.into(),
        })?;
        if peer[..4] != MAGIC || peer[10..12] != [0, 0] {
            return Err(Error::InvalidArgument(format!(
                "the peer's raw rail hello is malformed ({:02x?})",
                &peer[..12]
            )));
        }
        let mac: [u8; 6] = peer[4..10].try_into().expect("6 bytes");
        let peer_tag = u32::from_le_bytes(peer[12..16].try_into().expect("4 bytes"));
        inbox.lock().set_peer(mac);
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(None)?;
        Ok(RawLink::new(self.hub, (tag, inbox), mac, peer_tag, stream)?)
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::time::Duration;

    use super::*;

    /// A connected pair on loopback: (ours, the peer's end).
    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (theirs, _) = l.accept().unwrap();
        (ours, theirs)
    }

    #[test]
    fn a_malformed_or_missing_raw_hello_is_a_clear_error() {
        let (ours, mut theirs) = pair();
        let Some(offer) = RawOffer::new(&ours) else {
            eprintln!("SKIPPED: no AF_XDP port on lo here (needs root)");
            return;
        };
        theirs.write_all(b"NOTBRAIDATALL123").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        match offer.complete(ours, deadline) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("malformed"), "{m}"),
            Err(e) => panic!("a malformed hello gave {e}"),
            Ok(_) => panic!("a malformed hello was taken"),
        }
        // A peer that says nothing is waited for until the deadline, not longer.
        let (ours, _silent) = pair();
        let offer = RawOffer {
            hub: Hub::for_socket(ours.as_raw_fd()).expect("the port opened a moment ago"),
        };
        let t = Instant::now();
        match offer.complete(ours, t + Duration::from_millis(200)) {
            Err(Error::Timeout(_)) => {}
            Err(e) => panic!("a silent peer gave {e}"),
            Ok(_) => panic!("a silent peer's rail was made"),
        }
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
