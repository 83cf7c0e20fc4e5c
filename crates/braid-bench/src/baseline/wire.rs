//! What the baselines put on the wire: the [`Hello`] that opens every connection and the
//! [`FragHeader`] in front of every trunking fragment.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::{FRAG_MAGIC, MAGIC, VERSION};

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

impl Hello {
    /// Encoded length.
    pub const LEN: usize = 40;

    /// Encodes to the wire format (big-endian).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&self.mode.code().to_be_bytes());
        b[8..16].copy_from_slice(&self.session.to_be_bytes());
        b[16..20].copy_from_slice(&self.rail.to_be_bytes());
        b[20..24].copy_from_slice(&self.rails.to_be_bytes());
        b[24..32].copy_from_slice(&self.size.to_be_bytes());
        b[32..36].copy_from_slice(&self.frag.to_be_bytes());
        b
    }

    /// Decodes and checks a hello; never panics on bad input.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Hello> {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            bail!("not a braid baseline client (bad magic)");
        }
        let ver = u16::from_be_bytes([b[4], b[5]]);
        if ver != VERSION {
            bail!("baseline protocol version {ver}, expected {VERSION}");
        }
        let mode =
            Mode::from_code(u16::from_be_bytes([b[6], b[7]])).context("unknown baseline mode")?;
        let h = Hello {
            mode,
            session: u64_at(8),
            rail: u32_at(16),
            rails: u32_at(20),
            size: u64_at(24),
            frag: u32_at(32),
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
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.msg.to_be_bytes());
        b[8..16].copy_from_slice(&self.offset.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b[20..24].copy_from_slice(&FRAG_MAGIC.to_be_bytes());
        b
    }

    /// Decodes a header; never panics.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<FragHeader> {
        if u32::from_be_bytes(b[20..24].try_into().expect("4")) != FRAG_MAGIC {
            bail!("bad fragment header (stream out of sync)");
        }
        Ok(FragHeader {
            msg: u64::from_be_bytes(b[0..8].try_into().expect("8")),
            offset: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            len: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
