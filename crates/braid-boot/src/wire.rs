//! The bootstrap protocol's messages and their encoding (described in `docs/LAUNCH.md`).
//!
//! Every message is a frame: a 4-byte big-endian length (of what follows), a type byte and a
//! body. Decoding is checked: a short, long or malformed frame is an error, never a panic.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::addrs::HostAddr;
use crate::error::Refusal;

/// Protocol version; both hellos carry it.
pub const VERSION: u16 = 1;
/// First bytes of both hellos.
pub const MAGIC: [u8; 8] = *b"BRAIDBT\0";
/// Length of the handshake nonces.
pub const NONCE_LEN: usize = 16;
/// Length of an HMAC-SHA256 proof.
pub const MAC_LEN: usize = 32;
/// Largest contribution of one rank to an allgather.
pub const MAX_CONTRIBUTION: usize = 1 << 20;
/// Most addresses one rank may offer.
pub const MAX_ADDRS: usize = 256;

/// An address a rank listens on for braid rails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Address and prefix.
    pub addr: HostAddr,
    /// The braid listener's port on it.
    pub port: u16,
}

/// What a rank tells the rendezvous about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankInfo {
    /// Host name, for messages.
    pub hostname: String,
    /// Process id, for messages.
    pub pid: u32,
    /// Machine and network namespace (see [`crate::addrs::host_key`]).
    pub host_key: String,
    /// Rail addresses with their listening ports.
    pub addrs: Vec<Published>,
    /// Port of the braid listener on 127.0.0.1 (0: none).
    pub loopback_port: u16,
    /// The addresses come from `BRAID_RAILS`.
    pub rails_override: bool,
}

/// One rank's row of the address table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableEntry {
    /// What the rank sent.
    pub info: RankInfo,
    /// The address the rendezvous saw it connect from.
    pub seen: IpAddr,
}

/// Why the job failed, as the rendezvous tells every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A rank's connection ended without a goodbye.
    RankDied {
        /// The rank.
        rank: u32,
        /// What was seen.
        detail: String,
    },
    /// A rank reported its own error.
    RankAborted {
        /// The rank.
        rank: u32,
        /// Its error.
        reason: String,
    },
    /// A collective needs a rank that said goodbye.
    RankLeft {
        /// The rank.
        rank: u32,
    },
    /// Ranks missing at the join timeout.
    JoinTimeout {
        /// The missing ranks.
        missing: Vec<u32>,
        /// The timeout in milliseconds.
        waited_ms: u64,
    },
    /// A rank joined twice.
    DuplicateRank {
        /// The rank.
        rank: u32,
        /// First claimant.
        first: String,
        /// Second claimant.
        second: String,
    },
    /// A rank's size differs from rank 0's.
    SizeMismatch {
        /// The rank.
        rank: u32,
        /// Its size.
        size: u32,
        /// Rank 0's size.
        root_size: u32,
    },
    /// Ranks disagree on the collective being run.
    CollectiveMismatch(String),
}

/// Messages from a rank to the rendezvous.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientMsg {
    /// The first message: who this rank is.
    Join {
        /// Protocol version.
        version: u16,
        /// The rank's nonce.
        nonce: [u8; NONCE_LEN],
        /// Proof of the secret over both nonces and the identity (when the rank has one).
        mac: Option<[u8; MAC_LEN]>,
        /// Job id.
        job: String,
        /// Rank.
        rank: u32,
        /// Size.
        size: u32,
        /// Addresses and identity.
        info: RankInfo,
    },
    /// A contribution to collective number `seq` (allgather; a barrier contributes nothing).
    Collective {
        /// Sequence number, from 0, one per collective.
        seq: u64,
        /// 0 barrier, 1 allgather.
        kind: u8,
        /// The contribution.
        data: Vec<u8>,
    },
    /// This rank failed; the job cannot go on.
    Abort {
        /// Its error.
        reason: String,
    },
    /// This rank leaves cleanly.
    Bye,
}

/// Messages from the rendezvous to a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerMsg {
    /// The first message, before the rank says anything.
    Hello {
        /// Protocol version.
        version: u16,
        /// The rendezvous's nonce.
        nonce: [u8; NONCE_LEN],
        /// The rendezvous has a cluster secret and requires a proof.
        auth_required: bool,
    },
    /// The rank is in; the proof is the rendezvous's own (when it has a secret).
    Welcome {
        /// Proof of the secret.
        mac: Option<[u8; MAC_LEN]>,
    },
    /// The rank is refused; the connection closes.
    Refuse {
        /// Why.
        kind: Refusal,
        /// In words.
        detail: String,
    },
    /// Everyone joined: the address table, indexed by rank.
    Table(Vec<TableEntry>),
    /// Collective `seq` completed: every rank's contribution, by rank.
    Done {
        /// Sequence number.
        seq: u64,
        /// Contributions.
        parts: Vec<Vec<u8>>,
    },
    /// The job failed.
    Failed(Failure),
}

/// A decoding error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed bootstrap message: {0}")]
pub struct DecodeError(pub String);

struct Enc(Vec<u8>);

impl Enc {
    fn new(ty: u8) -> Enc {
        Enc(vec![0, 0, 0, 0, ty])
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn raw(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.raw(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => {
                self.u8(4);
                self.raw(&a.octets());
            }
            IpAddr::V6(a) => {
                self.u8(6);
                self.raw(&a.octets());
            }
        }
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
        self.0
    }
}

struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError(format!(
                "needs {n} more bytes, {} left",
                self.0.len()
            )));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        Ok(self.take(N)?.try_into().expect("length checked"))
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.arr()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.arr()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.arr()?))
    }
    fn bytes(&mut self, limit: usize) -> Result<Vec<u8>, DecodeError> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(DecodeError(format!("field of {n} bytes (limit {limit})")));
        }
        Ok(self.take(n)?.to_vec())
    }
    fn str(&mut self, limit: usize) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes(limit)?).map_err(|_| DecodeError("text is not UTF-8".into()))
    }
    fn count(&mut self, limit: usize, what: &str) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n > limit {
            return Err(DecodeError(format!("{n} {what} (limit {limit})")));
        }
        Ok(n)
    }
    fn ip(&mut self) -> Result<IpAddr, DecodeError> {
        match self.u8()? {
            4 => Ok(IpAddr::V4(Ipv4Addr::from(self.arr::<4>()?))),
            6 => Ok(IpAddr::V6(Ipv6Addr::from(self.arr::<16>()?))),
            t => Err(DecodeError(format!("address family {t}"))),
        }
    }
    fn end(&self) -> Result<(), DecodeError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(DecodeError(format!("{} trailing bytes", self.0.len())))
        }
    }
}

const TEXT: usize = 4096;

fn enc_info(e: &mut Enc, i: &RankInfo) {
    e.str(&i.hostname);
    e.u32(i.pid);
    e.str(&i.host_key);
    e.u32(i.addrs.len() as u32);
    for p in &i.addrs {
        e.raw(&p.addr.ip.octets());
        e.u8(p.addr.prefix);
        e.u16(p.port);
    }
    e.u16(i.loopback_port);
    e.u8(i.rails_override as u8);
}

fn dec_info(d: &mut Dec) -> Result<RankInfo, DecodeError> {
    let hostname = d.str(TEXT)?;
    let pid = d.u32()?;
    let host_key = d.str(TEXT)?;
    let n = d.count(MAX_ADDRS, "addresses")?;
    let mut addrs = Vec::with_capacity(n);
    for _ in 0..n {
        let ip = Ipv4Addr::from(d.arr::<4>()?);
        let prefix = d.u8()?;
        if prefix > 32 {
            return Err(DecodeError(format!("prefix /{prefix}")));
        }
        let port = d.u16()?;
        addrs.push(Published {
            addr: HostAddr { ip, prefix },
            port,
        });
    }
    Ok(RankInfo {
        hostname,
        pid,
        host_key,
        addrs,
        loopback_port: d.u16()?,
        rails_override: d.u8()? != 0,
    })
}

fn refusal_code(r: Refusal) -> u8 {
    match r {
        Refusal::WrongJob => 1,
        Refusal::DuplicateRank => 2,
        Refusal::SizeMismatch => 3,
        Refusal::Auth => 4,
        Refusal::JobFormed => 5,
        Refusal::BadRank => 6,
        Refusal::Version => 7,
    }
}

fn refusal_from(c: u8) -> Result<Refusal, DecodeError> {
    Ok(match c {
        1 => Refusal::WrongJob,
        2 => Refusal::DuplicateRank,
        3 => Refusal::SizeMismatch,
        4 => Refusal::Auth,
        5 => Refusal::JobFormed,
        6 => Refusal::BadRank,
        7 => Refusal::Version,
        c => return Err(DecodeError(format!("refusal code {c}"))),
    })
}

impl ClientMsg {
    /// The frame of this message.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ClientMsg::Join {
                version,
                nonce,
                mac,
                job,
                rank,
                size,
                info,
            } => {
                let mut e = Enc::new(1);
                e.raw(&MAGIC);
                e.u16(*version);
                e.raw(nonce);
                match mac {
                    Some(m) => {
                        e.u8(1);
                        e.raw(m);
                    }
                    None => e.u8(0),
                }
                e.str(job);
                e.u32(*rank);
                e.u32(*size);
                enc_info(&mut e, info);
                e.finish()
            }
            ClientMsg::Collective { seq, kind, data } => {
                let mut e = Enc::new(2);
                e.u64(*seq);
                e.u8(*kind);
                e.bytes(data);
                e.finish()
            }
            ClientMsg::Abort { reason } => {
                let mut e = Enc::new(3);
                e.str(reason);
                e.finish()
            }
            ClientMsg::Bye => Enc::new(4).finish(),
        }
    }

    /// Decodes a frame's type and body (the length already removed).
    pub fn decode(frame: &[u8]) -> Result<ClientMsg, DecodeError> {
        let mut d = Dec(frame);
        let m = match d.u8()? {
            1 => {
                if d.arr::<8>()? != MAGIC {
                    return Err(DecodeError("not a braid bootstrap peer".into()));
                }
                let version = d.u16()?;
                if version != VERSION {
                    // The rest may be laid out differently: report the version alone.
                    return Ok(ClientMsg::Join {
                        version,
                        nonce: [0; NONCE_LEN],
                        mac: None,
                        job: String::new(),
                        rank: 0,
                        size: 0,
                        info: RankInfo {
                            hostname: String::new(),
                            pid: 0,
                            host_key: String::new(),
                            addrs: vec![],
                            loopback_port: 0,
                            rails_override: false,
                        },
                    });
                }
                let nonce = d.arr()?;
                let mac = match d.u8()? {
                    0 => None,
                    1 => Some(d.arr()?),
                    f => return Err(DecodeError(format!("mac flag {f}"))),
                };
                ClientMsg::Join {
                    version,
                    nonce,
                    mac,
                    job: d.str(255)?,
                    rank: d.u32()?,
                    size: d.u32()?,
                    info: dec_info(&mut d)?,
                }
            }
            2 => ClientMsg::Collective {
                seq: d.u64()?,
                kind: match d.u8()? {
                    k @ (0 | 1) => k,
                    k => return Err(DecodeError(format!("collective kind {k}"))),
                },
                data: d.bytes(MAX_CONTRIBUTION)?,
            },
            3 => ClientMsg::Abort {
                reason: d.str(TEXT)?,
            },
            4 => ClientMsg::Bye,
            t => return Err(DecodeError(format!("client message type {t}"))),
        };
        d.end()?;
        Ok(m)
    }
}

impl ServerMsg {
    /// The frame of this message.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            ServerMsg::Hello {
                version,
                nonce,
                auth_required,
            } => {
                let mut e = Enc::new(1);
                e.raw(&MAGIC);
                e.u16(*version);
                e.raw(nonce);
                e.u8(*auth_required as u8);
                e.finish()
            }
            ServerMsg::Welcome { mac } => {
                let mut e = Enc::new(2);
                match mac {
                    Some(m) => {
                        e.u8(1);
                        e.raw(m);
                    }
                    None => e.u8(0),
                }
                e.finish()
            }
            ServerMsg::Refuse { kind, detail } => {
                let mut e = Enc::new(3);
                e.u8(refusal_code(*kind));
                e.str(detail);
                e.finish()
            }
            ServerMsg::Table(entries) => {
                let mut e = Enc::new(4);
                e.u32(entries.len() as u32);
                for t in entries {
                    enc_info(&mut e, &t.info);
                    e.ip(t.seen);
                }
                e.finish()
            }
            ServerMsg::Done { seq, parts } => {
                let mut e = Enc::new(5);
                e.u64(*seq);
                e.u32(parts.len() as u32);
                for p in parts {
                    e.bytes(p);
                }
                e.finish()
            }
            ServerMsg::Failed(f) => {
                let mut e = Enc::new(6);
                match f {
                    Failure::RankDied { rank, detail } => {
                        e.u8(1);
                        e.u32(*rank);
                        e.str(detail);
                    }
                    Failure::RankAborted { rank, reason } => {
                        e.u8(2);
                        e.u32(*rank);
                        e.str(reason);
                    }
                    Failure::RankLeft { rank } => {
                        e.u8(3);
                        e.u32(*rank);
                    }
                    Failure::JoinTimeout { missing, waited_ms } => {
                        e.u8(4);
                        e.u32(missing.len() as u32);
                        for m in missing {
                            e.u32(*m);
                        }
                        e.u64(*waited_ms);
                    }
                    Failure::DuplicateRank {
                        rank,
                        first,
                        second,
                    } => {
                        e.u8(5);
                        e.u32(*rank);
                        e.str(first);
                        e.str(second);
                    }
                    Failure::SizeMismatch {
                        rank,
                        size,
                        root_size,
                    } => {
                        e.u8(6);
                        e.u32(*rank);
                        e.u32(*size);
                        e.u32(*root_size);
                    }
                    Failure::CollectiveMismatch(s) => {
                        e.u8(7);
                        e.str(s);
                    }
                }
                e.finish()
            }
        }
    }

    /// Decodes a frame's type and body; `max_ranks` bounds tables and results.
    pub fn decode(frame: &[u8], max_ranks: usize) -> Result<ServerMsg, DecodeError> {
        let mut d = Dec(frame);
        let m = match d.u8()? {
            1 => {
                if d.arr::<8>()? != MAGIC {
                    return Err(DecodeError("not a braid bootstrap rendezvous".into()));
                }
                let version = d.u16()?;
                let nonce = d.arr()?;
                ServerMsg::Hello {
                    version,
                    nonce,
                    auth_required: d.u8()? != 0,
                }
            }
            2 => ServerMsg::Welcome {
                mac: match d.u8()? {
                    0 => None,
                    1 => Some(d.arr()?),
                    f => return Err(DecodeError(format!("mac flag {f}"))),
                },
            },
            3 => ServerMsg::Refuse {
                kind: refusal_from(d.u8()?)?,
                detail: d.str(TEXT)?,
            },
            4 => {
                let n = d.count(max_ranks, "table entries")?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let info = dec_info(&mut d)?;
                    v.push(TableEntry {
                        info,
                        seen: d.ip()?,
                    });
                }
                ServerMsg::Table(v)
            }
            5 => {
                let seq = d.u64()?;
                let n = d.count(max_ranks, "contributions")?;
                let mut parts = Vec::with_capacity(n);
                for _ in 0..n {
                    parts.push(d.bytes(MAX_CONTRIBUTION)?);
                }
                ServerMsg::Done { seq, parts }
            }
            6 => ServerMsg::Failed(match d.u8()? {
                1 => Failure::RankDied {
                    rank: d.u32()?,
                    detail: d.str(TEXT)?,
                },
                2 => Failure::RankAborted {
                    rank: d.u32()?,
                    reason: d.str(TEXT)?,
                },
                3 => Failure::RankLeft { rank: d.u32()? },
                4 => {
                    let n = d.count(max_ranks, "missing ranks")?;
                    let missing = (0..n).map(|_| d.u32()).collect::<Result<_, _>>()?;
                    Failure::JoinTimeout {
                        missing,
                        waited_ms: d.u64()?,
                    }
                }
                5 => Failure::DuplicateRank {
                    rank: d.u32()?,
                    first: d.str(TEXT)?,
                    second: d.str(TEXT)?,
                },
                6 => Failure::SizeMismatch {
                    rank: d.u32()?,
                    size: d.u32()?,
                    root_size: d.u32()?,
                },
                7 => Failure::CollectiveMismatch(d.str(TEXT)?),
                k => return Err(DecodeError(format!("failure kind {k}"))),
            }),
            t => return Err(DecodeError(format!("server message type {t}"))),
        };
        d.end()?;
        Ok(m)
    }
}

/// Reads one frame (type and body) of at most `limit` bytes.
pub fn read_frame(r: &mut impl Read, limit: usize) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bootstrap frame of {len} bytes (limit {limit})"),
        ));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// Writes one encoded frame.
pub fn write_frame(w: &mut impl Write, frame: &[u8]) -> std::io::Result<()> {
    w.write_all(frame)?;
    w.flush()
}

/// Largest frame a rendezvous accepts from a rank.
pub const CLIENT_FRAME_LIMIT: usize = MAX_CONTRIBUTION + 64 * 1024;

/// Largest frame a rank accepts from a rendezvous of `size` ranks.
pub fn server_frame_limit(size: usize) -> usize {
    size.saturating_mul(MAX_CONTRIBUTION + 64 * 1024)
        .saturating_add(64 * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RankInfo {
        RankInfo {
            hostname: "h".into(),
            pid: 42,
            host_key: "k".into(),
            addrs: vec![Published {
                addr: HostAddr {
                    ip: Ipv4Addr::new(198, 18, 0, 1),
                    prefix: 24,
                },
                port: 5000,
            }],
            loopback_port: 6000,
            rails_override: false,
        }
    }

    fn client_msgs() -> Vec<ClientMsg> {
        vec![
            ClientMsg::Join {
                version: VERSION,
                nonce: [7; NONCE_LEN],
                mac: Some([9; MAC_LEN]),
                job: "j".into(),
                rank: 1,
                size: 2,
                info: info(),
            },
            ClientMsg::Collective {
                seq: 3,
                kind: 1,
                data: vec![1, 2, 3],
            },
            ClientMsg::Abort { reason: "x".into() },
            ClientMsg::Bye,
        ]
    }

    fn server_msgs() -> Vec<ServerMsg> {
        vec![
            ServerMsg::Hello {
                version: VERSION,
                nonce: [1; NONCE_LEN],
                auth_required: true,
            },
            ServerMsg::Welcome { mac: None },
            ServerMsg::Refuse {
                kind: Refusal::WrongJob,
                detail: "d".into(),
            },
            ServerMsg::Table(vec![TableEntry {
                info: info(),
                seen: "::1".parse().unwrap(),
            }]),
            ServerMsg::Done {
                seq: 1,
                parts: vec![vec![], vec![5]],
            },
            ServerMsg::Failed(Failure::JoinTimeout {
                missing: vec![2, 3],
                waited_ms: 10,
            }),
            ServerMsg::Failed(Failure::DuplicateRank {
                rank: 1,
                first: "a".into(),
                second: "b".into(),
            }),
            ServerMsg::Failed(Failure::SizeMismatch {
                rank: 1,
                size: 3,
                root_size: 2,
            }),
            ServerMsg::Failed(Failure::RankDied {
                rank: 1,
                detail: "eof".into(),
            }),
            ServerMsg::Failed(Failure::RankLeft { rank: 1 }),
        ]
    }

    #[test]
    fn round_trips() {
        for m in client_msgs() {
            let f = m.encode();
            let got = read_frame(&mut &f[..], CLIENT_FRAME_LIMIT).unwrap();
            assert_eq!(ClientMsg::decode(&got).unwrap(), m);
        }
        for m in server_msgs() {
            let f = m.encode();
            let got = read_frame(&mut &f[..], server_frame_limit(4)).unwrap();
            assert_eq!(ServerMsg::decode(&got, 4).unwrap(), m);
        }
    }

    #[test]
    fn truncated_and_garbage_frames_are_errors() {
        for m in client_msgs() {
            let f = m.encode();
            for cut in 5..f.len() {
                assert!(ClientMsg::decode(&f[4..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut long = f[4..].to_vec();
            long.push(0);
            assert!(ClientMsg::decode(&long).is_err());
        }
        for m in server_msgs() {
            let f = m.encode();
            for cut in 5..f.len() {
                assert!(
                    ServerMsg::decode(&f[4..cut], 4).is_err(),
                    "{m:?} cut at {cut}"
                );
            }
        }
        // Deterministic pseudo-random garbage never panics.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let len = (x % 64) as usize;
            let mut b = Vec::with_capacity(len);
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.push((x % 9) as u8);
            }
            let _ = ClientMsg::decode(&b);
            let _ = ServerMsg::decode(&b, 8);
        }
        // Length prefixes are bounded.
        let big = [0xff, 0xff, 0xff, 0xff, 1];
        assert!(read_frame(&mut &big[..], CLIENT_FRAME_LIMIT).is_err());
        assert!(read_frame(&mut &[0u8, 0, 0, 0][..], 10).is_err());
        // A table longer than the job is refused.
        let t = ServerMsg::Table(vec![
            TableEntry {
                info: info(),
                seen: "10.0.0.1".parse().unwrap(),
            };
            3
        ])
        .encode();
        assert!(ServerMsg::decode(&t[4..], 2).is_err());
    }
}
