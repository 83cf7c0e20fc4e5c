//! What a braid-mode socket's two ends say to each other over the endpoint: control
//! messages (braid `send`s into a ring of small receive slots) and the immediate that comes
//! with each data write.
//!
//! Control message, [`MSG_LEN`] bytes, little-endian:
//!
//! ```text
//!  0      kind (1 advert, 2 end-of-stream request, 3 end of stream)
//!  1      advert flags (1 last buffer of its receive, 2 the receive waits for all)
//!  4..8   advert: receive sequence number
//!  8..24  advert: remote key of the receive buffer
//! 24..32  advert: its length
//! 32..40  end of stream: bytes sent in the whole stream
//! ```
//!
//! Immediate of a data write: bit 31 the write completes its receive, bits 23..31 the
//! receive's sequence number modulo 256, bits 0..23 the byte count.

use bitflags::bitflags;
use braid::RemoteKey;

use crate::op::Errno;

/// Control receives each side keeps posted.
pub(crate) const CTRL_RECVS: usize = 256;
/// Control sends in flight per socket (a ring of slots after the receive slots).
pub(crate) const CTRL_SENDS: usize = 256;
/// Bytes of one control slot.
pub(crate) const SLOT: usize = 64;
/// Bytes of a control message.
pub(crate) const MSG_LEN: usize = 48;
/// Largest single `write_with_imm` (the immediate has 23 bits of length).
pub(crate) const WRITE_MAX: usize = 4 << 20;

/// The top bits of a work request id say what it was.
pub(crate) const TAG_SHIFT: u32 = 62;
pub(crate) const TAG_CTRL_RECV: u64 = 0;
pub(crate) const TAG_CTRL_SEND: u64 = 1;
pub(crate) const TAG_WRITE: u64 = 2;

const MSG_ADVERT: u8 = 1;
const MSG_FINREQ: u8 = 2;
const MSG_FIN: u8 = 3;

bitflags! {
    /// Flags of an advertised receive buffer.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) struct AdvertFlags: u8 {
        /// The last buffer of its receive.
        const LAST = 1;
        /// The receive completes only when full or at end of stream (`MSG_WAITALL`).
        const WAITALL = 2;
    }
}

/// A control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CtrlMsg {
    /// A receive buffer the peer may write into.
    Advert {
        seq: u32,
        key: RemoteKey,
        len: u64,
        flags: AdvertFlags,
    },
    /// Our bootstrap socket saw end of stream: please finish your direction.
    FinRequest,
    /// This direction ends after `total` bytes.
    Fin { total: u64 },
}

impl CtrlMsg {
    pub(crate) fn encode(&self) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        match *self {
            CtrlMsg::Advert {
                seq,
                key,
                len,
                flags,
            } => {
                m[0] = MSG_ADVERT;
                m[1] = flags.bits();
                m[4..8].copy_from_slice(&seq.to_le_bytes());
                m[8..24].copy_from_slice(&key.to_bytes());
                m[24..32].copy_from_slice(&len.to_le_bytes());
            }
            CtrlMsg::FinRequest => m[0] = MSG_FINREQ,
            CtrlMsg::Fin { total } => {
                m[0] = MSG_FIN;
                m[32..40].copy_from_slice(&total.to_le_bytes());
            }
        }
        m
    }

    /// Decode a received slot; `EPROTO` for what no peer of this version sends (unknown
    /// kind, an empty buffer, a length beyond its key's region).
    pub(crate) fn decode(m: &[u8; SLOT]) -> Result<CtrlMsg, Errno> {
        let u64_at = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().expect("8 bytes"));
        match m[0] {
            MSG_ADVERT => {
                let seq = u32::from_le_bytes(m[4..8].try_into().expect("4 bytes"));
                let key = RemoteKey::from_bytes(&m[8..24]).ok_or(libc::EPROTO)?;
                let len = u64_at(24);
                if len == 0 || len > key.len {
                    return Err(libc::EPROTO);
                }
                Ok(CtrlMsg::Advert {
                    seq,
                    key,
                    len,
                    flags: AdvertFlags::from_bits_truncate(m[1]),
                })
            }
            MSG_FINREQ => Ok(CtrlMsg::FinRequest),
            MSG_FIN => Ok(CtrlMsg::Fin { total: u64_at(32) }),
            _ => Err(libc::EPROTO),
        }
    }
}

/// The immediate of a data write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Imm {
    /// The write completes its receive.
    pub final_: bool,
    /// The receive's sequence number (only its low 8 bits travel).
    pub seq: u32,
    /// Bytes written (less than 2^23).
    pub len: usize,
}

const IMM_FINAL: u32 = 1 << 31;

impl Imm {
    pub(crate) fn encode(self) -> u32 {
        debug_assert!(self.len < (1 << 23));
        (if self.final_ { IMM_FINAL } else { 0 }) | ((self.seq & 0xff) << 23) | self.len as u32
    }

    pub(crate) fn decode(imm: u32) -> Imm {
        Imm {
            final_: imm & IMM_FINAL != 0,
            seq: (imm >> 23) & 0xff,
            len: (imm & 0x7f_ffff) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(m: [u8; MSG_LEN]) -> [u8; SLOT] {
        let mut s = [0u8; SLOT];
        s[..MSG_LEN].copy_from_slice(&m);
        s
    }

    fn key(len: u64) -> RemoteKey {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&0x1234_5678_9abc_def0u64.to_le_bytes());
        b[8..16].copy_from_slice(&len.to_le_bytes());
        RemoteKey::from_bytes(&b).unwrap()
    }

    #[test]
    fn imm_round_trip() {
        for (f, s, l) in [(true, 0, 1), (false, 255, WRITE_MAX), (true, 300, 7)] {
            let i = Imm::decode(
                Imm {
                    final_: f,
                    seq: s,
                    len: l,
                }
                .encode(),
            );
            assert_eq!((i.final_, i.seq, i.len), (f, s & 0xff, l));
        }
    }

    #[test]
    fn ctrl_round_trip() {
        for m in [
            CtrlMsg::Advert {
                seq: 7,
                key: key(4096),
                len: 4096,
                flags: AdvertFlags::LAST | AdvertFlags::WAITALL,
            },
            CtrlMsg::Advert {
                seq: u32::MAX,
                key: key(10),
                len: 1,
                flags: AdvertFlags::empty(),
            },
            CtrlMsg::FinRequest,
            CtrlMsg::Fin { total: 1 << 40 },
        ] {
            assert_eq!(CtrlMsg::decode(&slot(m.encode())), Ok(m));
        }
    }

    #[test]
    fn bad_ctrl_messages() {
        assert_eq!(CtrlMsg::decode(&[0; SLOT]), Err(libc::EPROTO));
        assert_eq!(CtrlMsg::decode(&[9; SLOT]), Err(libc::EPROTO));
        for len in [0, 11] {
            let mut m = CtrlMsg::Advert {
                seq: 1,
                key: key(10),
                len: 10,
                flags: AdvertFlags::LAST,
            }
            .encode();
            m[24..32].copy_from_slice(&(len as u64).to_le_bytes());
            assert_eq!(CtrlMsg::decode(&slot(m)), Err(libc::EPROTO), "len {len}");
        }
    }
}
