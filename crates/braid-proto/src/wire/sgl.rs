//! The payload of a vectored request (`WriteV`, `ReadV`): the remote scatter/gather list.
//!
//! Entries of [`SGE_LEN`] bytes, little-endian: the region key (u64), the offset in that
//! region (u64), the length (u64). The header's `arg1` is the entry count and `arg0` the
//! sum of the lengths; see `docs/PROTOCOL.md`.

use super::layout::{get_u64, put};

/// Bytes of one encoded entry.
pub const SGE_LEN: usize = 24;

/// Most entries in one vectored request (and the payload of its descriptor frame is then
/// `MAX_REMOTE_SGE * SGE_LEN` = 24 KiB).
pub const MAX_REMOTE_SGE: usize = 1024;

/// One remote piece as carried on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireSge {
    /// Remote key of the region.
    pub rkey: u64,
    /// Offset in the region.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
}

/// An entry's layout: byte ranges of its fields, little-endian integers.
mod field {
    use std::ops::Range;
    pub(super) const RKEY: Range<usize> = 0..8;
    pub(super) const ADDR: Range<usize> = 8..16;
    pub(super) const LEN: Range<usize> = 16..24;
}

/// Encodes `entries` as a descriptor payload.
pub fn encode(entries: &[WireSge]) -> Vec<u8> {
    let mut b = vec![0u8; entries.len() * SGE_LEN];
    for (e, out) in entries.iter().zip(b.chunks_exact_mut(SGE_LEN)) {
        put(out, field::RKEY, &e.rkey.to_le_bytes());
        put(out, field::ADDR, &e.addr.to_le_bytes());
        put(out, field::LEN, &e.len.to_le_bytes());
    }
    b
}

/// Decodes a descriptor payload that must hold `count` entries summing to `total` bytes,
/// none of whose ranges overflows; `None` when it does not.
pub fn decode(b: &[u8], count: u64, total: u64) -> Option<Vec<WireSge>> {
    if count == 0 || count > MAX_REMOTE_SGE as u64 || b.len() != count as usize * SGE_LEN {
        return None;
    }
    let mut sum = 0u64;
    let mut out = Vec::with_capacity(count as usize);
    for entry in b.chunks_exact(SGE_LEN) {
        let e = WireSge {
            rkey: get_u64(entry, field::RKEY),
            addr: get_u64(entry, field::ADDR),
            len: get_u64(entry, field::LEN),
        };
        e.addr.checked_add(e.len)?;
        sum = sum.checked_add(e.len)?;
        out.push(e);
    }
    (sum == total).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_tile_an_entry() {
        use field::*;
        assert!(super::super::layout::tiles(&[RKEY, ADDR, LEN], SGE_LEN));
    }

    #[test]
    fn round_trip_and_refusals() {
        let v = vec![
            WireSge {
                rkey: 1,
                addr: 2,
                len: 3,
            },
            WireSge {
                rkey: 4,
                addr: 5,
                len: 6,
            },
        ];
        let b = encode(&v);
        assert_eq!(decode(&b, 2, 9), Some(v));
        assert_eq!(decode(&b, 2, 10), None, "wrong total");
        assert_eq!(decode(&b, 1, 3), None, "wrong count");
        assert_eq!(decode(&[], 0, 0), None, "empty");
        let o = encode(&[WireSge {
            rkey: 1,
            addr: u64::MAX,
            len: 2,
        }]);
        assert_eq!(decode(&o, 1, 2), None, "overflowing range");
    }
}
