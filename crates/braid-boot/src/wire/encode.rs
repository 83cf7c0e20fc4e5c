//! Each message's layout: how [`ClientMsg`] and [`ServerMsg`] are encoded to a frame and
//! decoded from one.

use std::net::Ipv4Addr;

use crate::addrs::HostAddr;
use crate::error::Refusal;

use super::codec::{Dec, DecodeError, Enc};
use super::msg::{ClientMsg, Failure, Published, RankInfo, ServerMsg, TableEntry};
use super::{MAGIC, MAX_ADDRS, MAX_CONTRIBUTION, NONCE_LEN, VERSION};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{CLIENT_FRAME_LIMIT, MAC_LEN, read_frame, server_frame_limit};

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
