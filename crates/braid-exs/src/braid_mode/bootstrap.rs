//! The messages of the attach exchange over the bootstrap socket.
//!
//! ```text
//!  0..8    magic "EXSBRAID"
//!  8..10   version (1), little-endian
//! 10       kind: 1 hello from the connecting side, 2 hello from the accepting side (with
//!          its listening addresses), 3 the rails made (local, remote pairs), 4 done
//! 11       status: 0 ok, else the sender failed
//! 12..14   address count (at most 128), little-endian
//! 14..16   zero
//! then per address: 16-byte IPv6 (IPv4 as v4-mapped), 2-byte big-endian port
//! ```

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::time::Instant;

use crate::op::Errno;
use crate::sys;

const MAGIC: &[u8; 8] = b"EXSBRAID";
const VERSION: u16 = 1;
const HDR: usize = 16;
const ADDR: usize = 18;
const MAX_ADDRS: usize = 128;

/// The kind of a bootstrap message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    HelloConnect = 1,
    HelloAccept = 2,
    Rails = 3,
    Done = 4,
}

/// A bootstrap message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Msg {
    /// What the message is; `None` for a kind this version does not know.
    pub kind: Option<Kind>,
    /// 0 when the sender's step succeeded.
    pub status: u8,
    pub addrs: Vec<SocketAddr>,
}

impl Msg {
    /// A message without addresses.
    pub(crate) fn new(kind: Kind, status: u8) -> Msg {
        Msg::with_addrs(kind, status, Vec::new())
    }

    pub(crate) fn with_addrs(kind: Kind, status: u8, addrs: Vec<SocketAddr>) -> Msg {
        Msg {
            kind: Some(kind),
            status,
            addrs,
        }
    }

    /// Whether this is `kind` with status 0.
    pub(crate) fn is_ok(&self, kind: Kind) -> bool {
        self.kind == Some(kind) && self.status == 0
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HDR + self.addrs.len() * ADDR);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.push(self.kind.map_or(0, |k| k as u8));
        b.push(self.status);
        b.extend_from_slice(&(self.addrs.len() as u16).to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        for a in &self.addrs {
            let ip = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            b.extend_from_slice(&ip.octets());
            b.extend_from_slice(&a.port().to_be_bytes());
        }
        b
    }

    /// The header: (kind, status, address count), or why it is not one of ours.
    fn decode_header(h: &[u8; HDR]) -> Result<(Option<Kind>, u8, usize), Errno> {
        if &h[..8] != MAGIC {
            return Err(libc::EPROTO);
        }
        if u16::from_le_bytes([h[8], h[9]]) != VERSION {
            return Err(libc::EPROTONOSUPPORT);
        }
        let n = u16::from_le_bytes([h[12], h[13]]) as usize;
        if n > MAX_ADDRS {
            return Err(libc::EPROTO);
        }
        let kind = match h[10] {
            1 => Some(Kind::HelloConnect),
            2 => Some(Kind::HelloAccept),
            3 => Some(Kind::Rails),
            4 => Some(Kind::Done),
            _ => None,
        };
        Ok((kind, h[11], n))
    }

    fn decode_addrs(body: &[u8]) -> Vec<SocketAddr> {
        body.chunks_exact(ADDR)
            .map(|c| {
                let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&c[..16]).expect("16 bytes"));
                let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
                SocketAddr::new(ip, u16::from_be_bytes([c[16], c[17]]))
            })
            .collect()
    }

    /// Send the message on `fd`, waiting for room until `deadline`.
    pub(crate) fn write(&self, fd: RawFd, deadline: Instant) -> Result<(), Errno> {
        sys::write_all(fd, &self.encode(), deadline)
    }

    /// Read one message from `fd`, waiting until `deadline`.
    pub(crate) fn read(fd: RawFd, deadline: Instant) -> Result<Msg, Errno> {
        let mut h = [0u8; HDR];
        sys::read_exact(fd, &mut h, deadline)?;
        let (kind, status, n) = Msg::decode_header(&h)?;
        let mut body = vec![0u8; n * ADDR];
        sys::read_exact(fd, &mut body, deadline)?;
        Ok(Msg {
            kind,
            status,
            addrs: Msg::decode_addrs(&body),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(b: &[u8]) -> Result<Msg, Errno> {
        let (kind, status, n) = Msg::decode_header(b[..HDR].try_into().unwrap())?;
        assert_eq!(b.len(), HDR + n * ADDR);
        Ok(Msg {
            kind,
            status,
            addrs: Msg::decode_addrs(&b[HDR..]),
        })
    }

    #[test]
    fn round_trip() {
        let a: Vec<SocketAddr> = vec!["127.0.0.3:77".parse().unwrap(), "[::1]:5".parse().unwrap()];
        let m = Msg::with_addrs(Kind::Rails, 0, a);
        let b = m.encode();
        assert_eq!(b.len(), HDR + 2 * ADDR);
        assert_eq!(&b[..8], MAGIC);
        assert_eq!(decode(&b), Ok(m));
        let m = Msg::new(Kind::Done, 1);
        assert_eq!(decode(&m.encode()), Ok(m.clone()));
        assert!(!m.is_ok(Kind::Done));
        assert!(Msg::new(Kind::Done, 0).is_ok(Kind::Done));
    }

    #[test]
    fn bad_headers() {
        let good = Msg::new(Kind::HelloAccept, 0).encode();
        let mut b = good.clone();
        b[0] = b'X';
        assert_eq!(decode(&b), Err(libc::EPROTO));
        let mut b = good.clone();
        b[8] = 2;
        assert_eq!(decode(&b), Err(libc::EPROTONOSUPPORT));
        let mut b = good.clone();
        b[12..14].copy_from_slice(&129u16.to_le_bytes());
        assert_eq!(
            Msg::decode_header(b[..HDR].try_into().unwrap()),
            Err(libc::EPROTO)
        );
        let mut b = good;
        b[10] = 9;
        assert_eq!(decode(&b).unwrap().kind, None);
    }
}
