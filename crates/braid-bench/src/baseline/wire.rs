//! What the baselines put on the wire: the [`Hello`] that opens every connection and the
//! [`FragHeader`] in front of every trunking fragment.

use std::ops::Range;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::FRAG_MAGIC;

/// Which baseline a connection belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Plain TCP stream(s).
    Tcp,
    /// Round-robin fragments with a reorder buffer.
    Trunking,
}

impl Mode {
    fn code(self) -> u16 {
        match self {
            Mode::Tcp => 1,
            Mode::Trunking => 2,
        }
    }
    fn from_code(c: u16) -> Option<Mode> {
        match c {
            1 => Some(Mode::Tcp),
            2 => Some(Mode::Trunking),
            _ => None,
        }
    }
    /// Name as used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::Trunking => "trunking",
        }
    }
}

/// First bytes on every baseline connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Baseline.
    pub mode: Mode,
    /// Random id shared by the rails of one run.
    pub session: u64,
    /// Index of this connection's rail.
    pub rail: u32,
    /// Number of rails in the run.
    pub rails: u32,
    /// Message size in bytes.
    pub size: u64,
    /// Fragment size (trunking; 0 for tcp).
    pub frag: u32,
}

/// Byte ranges of the hello's fields (big-endian); bytes 36..40 are zero.
mod hello_field {
    use std::ops::Range;
    pub(super) const MAGIC: Range<usize> = 0..4;
    pub(super) const VERSION: Range<usize> = 4..6;
    pub(super) const MODE: Range<usize> = 6..8;
    pub(super) const SESSION: Range<usize> = 8..16;
    pub(super) const RAIL: Range<usize> = 16..20;
    pub(super) const RAILS: Range<usize> = 20..24;
    pub(super) const SIZE: Range<usize> = 24..32;
    pub(super) const FRAG: Range<usize> = 32..36;
}

/// Byte ranges of a fragment header's fields (big-endian).
mod frag_field {
    use std::ops::Range;
    pub(super) const MSG: Range<usize> = 0..8;
    pub(super) const OFFSET: Range<usize> = 8..16;
    pub(super) const LEN: Range<usize> = 16..20;
    pub(super) const MAGIC: Range<usize> = 20..24;
}

fn be_u16(b: &[u8], r: Range<usize>) -> u16 {
    u16::from_be_bytes(b[r].try_into().expect("a 2-byte field"))
}
fn be_u32(b: &[u8], r: Range<usize>) -> u32 {
    u32::from_be_bytes(b[r].try_into().expect("a 4-byte field"))
}
fn be_u64(b: &[u8], r: Range<usize>) -> u64 {
    u64::from_be_bytes(b[r].try_into().expect("an 8-byte field"))
}

impl Hello {
    /// Encoded length.
    pub const LEN: usize = 40;

    /// Encodes to the wire format (big-endian).
    pub fn encode(&self) -> [u8; Self::LEN] {
        use hello_field::*;
        let mut b = [0u8; Self::LEN];
        b[MAGIC].copy_from_slice(&super::MAGIC.to_be_bytes());
        b[VERSION].copy_from_slice(&super::VERSION.to_be_bytes());
        b[MODE].copy_from_slice(&self.mode.code().to_be_bytes());
        b[SESSION].copy_from_slice(&self.session.to_be_bytes());
        b[RAIL].copy_from_slice(&self.rail.to_be_bytes());
        b[RAILS].copy_from_slice(&self.rails.to_be_bytes());
        b[SIZE].copy_from_slice(&self.size.to_be_bytes());
        b[FRAG].copy_from_slice(&self.frag.to_be_bytes());
        b
    }

    /// Decodes and checks a hello; never panics on bad input.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Hello> {
        use hello_field::*;
        if be_u32(b, MAGIC) != super::MAGIC {
            bail!("not a braid baseline client (bad magic)");
        }
        let ver = be_u16(b, VERSION);
        if ver != super::VERSION {
            bail!(
                "baseline protocol version {ver}, expected {}",
                super::VERSION
            );
        }
        let mode = Mode::from_code(be_u16(b, MODE)).context("unknown baseline mode")?;
        let h = Hello {
            mode,
            session: be_u64(b, SESSION),
            rail: be_u32(b, RAIL),
            rails: be_u32(b, RAILS),
            size: be_u64(b, SIZE),
            frag: be_u32(b, FRAG),
        };
        if h.rails == 0 || h.rails > 64 || h.rail >= h.rails {
            bail!("bad rail {} of {}", h.rail, h.rails);
        }
        if h.size == 0 || h.size > 1 << 32 {
            bail!("bad message size {}", h.size);
        }
        if mode == Mode::Trunking && (h.frag == 0 || h.frag > 16 << 20) {
            bail!("bad fragment size {}", h.frag);
        }
        Ok(h)
    }
}

/// Header in front of every trunking fragment (24 bytes, big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragHeader {
    /// Message number, counted from 0 in each run.
    pub msg: u64,
    /// Offset of the fragment inside its message.
    pub offset: u64,
    /// Payload length.
    pub len: u32,
}

impl FragHeader {
    /// Encoded length.
    pub const LEN: usize = 24;

    /// Encodes to the wire format.
    pub fn encode(&self) -> [u8; Self::LEN] {
        use frag_field::*;
        let mut b = [0u8; Self::LEN];
        b[MSG].copy_from_slice(&self.msg.to_be_bytes());
        b[OFFSET].copy_from_slice(&self.offset.to_be_bytes());
        b[LEN].copy_from_slice(&self.len.to_be_bytes());
        b[MAGIC].copy_from_slice(&FRAG_MAGIC.to_be_bytes());
        b
    }

    /// Decodes a header; never panics.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<FragHeader> {
        use frag_field::*;
        if be_u32(b, MAGIC) != FRAG_MAGIC {
            bail!("bad fragment header (stream out of sync)");
        }
        Ok(FragHeader {
            msg: be_u64(b, MSG),
            offset: be_u64(b, OFFSET),
            len: be_u32(b, LEN),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_tile_each_header() {
        let tiles = |fields: &[Range<usize>], len: usize| {
            fields.windows(2).all(|w| w[0].end == w[1].start)
                && fields.first().map(|f| f.start) == Some(0)
                && fields.last().map(|f| f.end) == Some(len)
        };
        use hello_field as h;
        let hello = [
            h::MAGIC,
            h::VERSION,
            h::MODE,
            h::SESSION,
            h::RAIL,
            h::RAILS,
            h::SIZE,
            h::FRAG,
        ];
        assert!(tiles(&hello, 36), "the hello's fields, then 4 zero bytes");
        use frag_field as f;
        assert!(tiles(
            &[f::MSG, f::OFFSET, f::LEN, f::MAGIC],
            FragHeader::LEN
        ));
    }

    #[test]
    fn hello_roundtrip_and_rejects() {
        let h = Hello {
            mode: Mode::Trunking,
            session: 42,
            rail: 1,
            rails: 4,
            size: 1 << 20,
            frag: 65536,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[0] = 0;
        assert!(Hello::decode(&b).is_err());
        let bad = Hello { rail: 4, ..h };
        assert!(Hello::decode(&bad.encode()).is_err());
        let f = FragHeader {
            msg: 7,
            offset: 65536,
            len: 100,
        };
        assert_eq!(FragHeader::decode(&f.encode()).unwrap(), f);
        let mut fb = f.encode();
        fb[23] ^= 1;
        assert!(FragHeader::decode(&fb).is_err());
    }
}
