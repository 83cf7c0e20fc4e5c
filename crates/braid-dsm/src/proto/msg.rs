//! The DSM's messages and their fixed 32-byte wire form.
//!
//! Every control message is one braid `send` of [`MSG_LEN`] bytes. A [`Msg::Grant`] whose
//! payload is [`Payload::Data`] travels instead as one `write_with_imm` of the message
//! followed by the page into the requester's staging slot (see `docs/DSM.md`).

use super::{PageId, Rank};

/// Bytes of an encoded message.
pub const MSG_LEN: usize = 32;

/// Version of this encoding; a peer speaking another is a protocol error.
pub const WIRE_VERSION: u8 = 1;

/// What comes with a [`Msg::Grant`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Nothing: the requester already holds the current contents (an upgrade).
    None,
    /// The page has never been written: the requester installs zeros.
    Zero,
    /// The page's contents arrive with the grant, in the requester's staging slot.
    Data,
}

/// One message between ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// Requester to home: a read copy of `page`, data into staging slot `slot`.
    ReadReq {
        /// The page.
        page: PageId,
        /// The requester's staging slot for the data.
        slot: u32,
    },
    /// Requester to home: exclusive (writable) access to `page`.
    WriteReq {
        /// The page.
        page: PageId,
        /// The requester's staging slot for the data.
        slot: u32,
    },
    /// Home to owner: send a read copy to `to` (downgrading a writable copy first).
    FwdRead {
        /// The page.
        page: PageId,
        /// The requester.
        to: Rank,
        /// The requester's staging slot.
        slot: u32,
    },
    /// Home to owner: give up the page to `to`; `data` says whether `to` needs the
    /// contents; `to` will also wait for `acks` invalidation acknowledgements.
    FwdWrite {
        /// The page.
        page: PageId,
        /// The requester.
        to: Rank,
        /// The requester's staging slot.
        slot: u32,
        /// Invalidation acknowledgements the requester waits for besides the grant.
        acks: u32,
        /// Whether the requester needs the page's contents.
        data: bool,
    },
    /// Home to a reader: drop your copy and acknowledge to `ack_to`.
    Invalidate {
        /// The page.
        page: PageId,
        /// Who waits for the acknowledgement (the new writer).
        ack_to: Rank,
    },
    /// Former reader to the new writer: my copy is gone.
    InvAck {
        /// The page.
        page: PageId,
    },
    /// Owner or home to requester: access granted.
    Grant {
        /// The page.
        page: PageId,
        /// Writable (exclusive) rather than read-only.
        write: bool,
        /// Invalidation acknowledgements to wait for before using the page.
        acks: u32,
        /// What comes with the grant.
        payload: Payload,
    },
    /// Requester to home: the grant is installed; the home may serve the next request.
    Confirm {
        /// The page.
        page: PageId,
    },
    /// Waiter to a lock's home: I hold `ticket` and wait for it to be served.
    LockWait {
        /// The lock.
        lock: u32,
        /// The waiter's ticket.
        ticket: u32,
    },
    /// Releaser to a lock's home: `ticket` is now served.
    LockHandoff {
        /// The lock.
        lock: u32,
        /// The ticket now served.
        ticket: u32,
    },
    /// Lock home to waiter: your `ticket` is served, you hold the lock.
    LockGrant {
        /// The lock.
        lock: u32,
        /// The ticket.
        ticket: u32,
    },
    /// Dissemination barrier: round `round` of barrier number `epoch`.
    Barrier {
        /// Barrier number (counts barriers since start-up).
        epoch: u64,
        /// Round within the barrier.
        round: u32,
    },
    /// A rank's contribution to collective number `seq` (allocation agreement and the like).
    Gather {
        /// Collective number.
        seq: u64,
        /// First value.
        a: u64,
        /// Second value.
        b: u64,
    },
}

/// A message that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not [`MSG_LEN`] bytes.
    #[error("message of {0} bytes, expected {MSG_LEN}")]
    Length(usize),
    /// Another encoding version.
    #[error("message of wire version {0}, this build speaks {WIRE_VERSION}")]
    Version(u8),
    /// Unknown message kind.
    #[error("unknown message kind {0}")]
    Kind(u8),
    /// A field out of its range.
    #[error("malformed {0} message")]
    Field(&'static str),
}

mod kind {
    pub const READ_REQ: u8 = 1;
    pub const WRITE_REQ: u8 = 2;
    pub const FWD_READ: u8 = 3;
    pub const FWD_WRITE: u8 = 4;
    pub const INVALIDATE: u8 = 5;
    pub const INV_ACK: u8 = 6;
    pub const GRANT: u8 = 7;
    pub const CONFIRM: u8 = 8;
    pub const LOCK_WAIT: u8 = 9;
    pub const LOCK_HANDOFF: u8 = 10;
    pub const LOCK_GRANT: u8 = 11;
    pub const BARRIER: u8 = 12;
    pub const GATHER: u8 = 13;
}

/// Field layout: kind, flags, version, reserved, then u32 `a` at 4, u64 `x` at 8, u32 `b`
/// at 16, u32 `c` at 20, u64 `y` at 24; all little-endian.
struct Fields {
    kind: u8,
    flags: u8,
    a: u32,
    x: u64,
    b: u32,
    c: u32,
    y: u64,
}

const FLAG_WRITE: u8 = 1;
const FLAG_DATA: u8 = 2;
const FLAG_ZERO: u8 = 4;

impl Msg {
    fn fields(&self) -> Fields {
        let f = |kind, flags, a, x, b, c, y| Fields {
            kind,
            flags,
            a,
            x,
            b,
            c,
            y,
        };
        match *self {
            Msg::ReadReq { page, slot } => f(kind::READ_REQ, 0, slot, page, 0, 0, 0),
            Msg::WriteReq { page, slot } => f(kind::WRITE_REQ, 0, slot, page, 0, 0, 0),
            Msg::FwdRead { page, to, slot } => f(kind::FWD_READ, 0, slot, page, to, 0, 0),
            Msg::FwdWrite {
                page,
                to,
                slot,
                acks,
                data,
            } => {
                let flags = if data { FLAG_DATA } else { 0 };
                f(kind::FWD_WRITE, flags, slot, page, to, acks, 0)
            }
            Msg::Invalidate { page, ack_to } => f(kind::INVALIDATE, 0, 0, page, ack_to, 0, 0),
            Msg::InvAck { page } => f(kind::INV_ACK, 0, 0, page, 0, 0, 0),
            Msg::Grant {
                page,
                write,
                acks,
                payload,
            } => {
                let mut flags = if write { FLAG_WRITE } else { 0 };
                flags |= match payload {
                    Payload::None => 0,
                    Payload::Zero => FLAG_ZERO,
                    Payload::Data => FLAG_DATA,
                };
                f(kind::GRANT, flags, 0, page, 0, acks, 0)
            }
            Msg::Confirm { page } => f(kind::CONFIRM, 0, 0, page, 0, 0, 0),
            Msg::LockWait { lock, ticket } => f(kind::LOCK_WAIT, 0, ticket, lock as u64, 0, 0, 0),
            Msg::LockHandoff { lock, ticket } => {
                f(kind::LOCK_HANDOFF, 0, ticket, lock as u64, 0, 0, 0)
            }
            Msg::LockGrant { lock, ticket } => f(kind::LOCK_GRANT, 0, ticket, lock as u64, 0, 0, 0),
            Msg::Barrier { epoch, round } => f(kind::BARRIER, 0, round, epoch, 0, 0, 0),
            Msg::Gather { seq, a, b } => Fields {
                kind: kind::GATHER,
                flags: 0,
                a: 0,
                x: seq,
                b: a as u32,
                c: (a >> 32) as u32,
                y: b,
            },
        }
    }

    /// The 32-byte wire form.
    pub fn encode(&self) -> [u8; MSG_LEN] {
        let f = self.fields();
        let mut out = [0u8; MSG_LEN];
        out[0] = f.kind;
        out[1] = f.flags;
        out[2] = WIRE_VERSION;
        out[4..8].copy_from_slice(&f.a.to_le_bytes());
        out[8..16].copy_from_slice(&f.x.to_le_bytes());
        out[16..20].copy_from_slice(&f.b.to_le_bytes());
        out[20..24].copy_from_slice(&f.c.to_le_bytes());
        out[24..32].copy_from_slice(&f.y.to_le_bytes());
        out
    }

    /// Parses [`Msg::encode`]'s output; anything else is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Msg, DecodeError> {
        if b.len() != MSG_LEN {
            return Err(DecodeError::Length(b.len()));
        }
        if b[2] != WIRE_VERSION {
            return Err(DecodeError::Version(b[2]));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let (kind, flags) = (b[0], b[1]);
        let (a, x, rb, c, y) = (u32_at(4), u64_at(8), u32_at(16), u32_at(20), u64_at(24));
        let lock = |name| u32::try_from(x).map_err(|_| DecodeError::Field(name));
        let known_flags = match kind {
            kind::FWD_WRITE => FLAG_DATA,
            kind::GRANT => FLAG_WRITE | FLAG_DATA | FLAG_ZERO,
            _ => 0,
        };
        if flags & !known_flags != 0 || b[3] != 0 {
            return Err(DecodeError::Field("flags of a"));
        }
        Ok(match kind {
            kind::READ_REQ => Msg::ReadReq { page: x, slot: a },
            kind::WRITE_REQ => Msg::WriteReq { page: x, slot: a },
            kind::FWD_READ => Msg::FwdRead {
                page: x,
                to: rb,
                slot: a,
            },
            kind::FWD_WRITE => Msg::FwdWrite {
                page: x,
                to: rb,
                slot: a,
                acks: c,
                data: flags & FLAG_DATA != 0,
            },
            kind::INVALIDATE => Msg::Invalidate {
                page: x,
                ack_to: rb,
            },
            kind::INV_ACK => Msg::InvAck { page: x },
            kind::GRANT => {
                let payload = match (flags & FLAG_DATA != 0, flags & FLAG_ZERO != 0) {
                    (false, false) => Payload::None,
                    (false, true) => Payload::Zero,
                    (true, false) => Payload::Data,
                    (true, true) => return Err(DecodeError::Field("grant")),
                };
                Msg::Grant {
                    page: x,
                    write: flags & FLAG_WRITE != 0,
                    acks: c,
                    payload,
                }
            }
            kind::CONFIRM => Msg::Confirm { page: x },
            kind::LOCK_WAIT => Msg::LockWait {
                lock: lock("lock wait")?,
                ticket: a,
            },
            kind::LOCK_HANDOFF => Msg::LockHandoff {
                lock: lock("lock handoff")?,
                ticket: a,
            },
            kind::LOCK_GRANT => Msg::LockGrant {
                lock: lock("lock grant")?,
                ticket: a,
            },
            kind::BARRIER => Msg::Barrier { epoch: x, round: a },
            kind::GATHER => Msg::Gather {
                seq: x,
                a: rb as u64 | (c as u64) << 32,
                b: y,
            },
            k => return Err(DecodeError::Kind(k)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Msg> {
        let mut v = vec![
            Msg::ReadReq { page: 7, slot: 3 },
            Msg::WriteReq {
                page: u64::MAX,
                slot: u32::MAX,
            },
            Msg::FwdRead {
                page: 1 << 40,
                to: 9,
                slot: 1,
            },
            Msg::Invalidate { page: 2, ack_to: 5 },
            Msg::InvAck { page: 3 },
            Msg::Confirm { page: 4 },
            Msg::LockWait {
                lock: u32::MAX,
                ticket: 17,
            },
            Msg::LockHandoff { lock: 0, ticket: 0 },
            Msg::LockGrant { lock: 8, ticket: 9 },
            Msg::Barrier {
                epoch: 123,
                round: 4,
            },
            Msg::Gather {
                seq: 5,
                a: u64::MAX - 1,
                b: 1 << 63,
            },
        ];
        for data in [false, true] {
            v.push(Msg::FwdWrite {
                page: 11,
                to: 2,
                slot: 6,
                acks: 3,
                data,
            });
        }
        for write in [false, true] {
            for payload in [Payload::None, Payload::Zero, Payload::Data] {
                v.push(Msg::Grant {
                    page: 12,
                    write,
                    acks: 2,
                    payload,
                });
            }
        }
        v
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            assert_eq!(Msg::decode(&m.encode()), Ok(m), "{m:?}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let good = Msg::Confirm { page: 1 }.encode();
        assert_eq!(Msg::decode(&good[..31]), Err(DecodeError::Length(31)));
        let mut b = good;
        b[2] = 9;
        assert_eq!(Msg::decode(&b), Err(DecodeError::Version(9)));
        let mut b = good;
        b[0] = 200;
        assert_eq!(Msg::decode(&b), Err(DecodeError::Kind(200)));
        let mut b = good;
        b[1] = FLAG_WRITE;
        assert!(Msg::decode(&b).is_err());
        let mut b = Msg::LockGrant { lock: 1, ticket: 2 }.encode();
        b[12] = 1; // lock id above u32
        assert!(Msg::decode(&b).is_err());
        // Arbitrary bytes never panic.
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..100_000 {
            let mut b = [0u8; MSG_LEN];
            for c in b.chunks_mut(8) {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                c.copy_from_slice(&x.to_le_bytes());
            }
            b[2] = WIRE_VERSION;
            let _ = Msg::decode(&b);
        }
    }
}
