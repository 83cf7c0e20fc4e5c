//! The payload of a vectored request (`WriteV`, `ReadV`): the remote scatter/gather list.
//!
//! Entries of [`SGE_LEN`] bytes, little-endian: the region key (u64), the offset in that
//! region (u64), the length (u64). The header's `arg1` is the entry count and `arg0` the
//! sum of the lengths; see `docs/PROTOCOL.md`.

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

/// Encodes `entries` as a descriptor payload.
pub fn encode(entries: &[WireSge]) -> Vec<u8> {
    let mut b = Vec::with_capacity(entries.len() * SGE_LEN);
    for e in entries {
        b.extend_from_slice(&e.rkey.to_le_bytes());
        b.extend_from_slice(&e.addr.to_le_bytes());
        b.extend_from_slice(&e.len.to_le_bytes());
    }
    b
}

/// Decodes a descriptor payload that must hold `count` entries summing to `total` bytes,
/// none of whose ranges overflows; `None` when it does not.
pub fn decode(b: &[u8], count: u64, total: u64) -> Option<Vec<WireSge>> {
    if count == 0 || count > MAX_REMOTE_SGE as u64 || b.len() != count as usize * SGE_LEN {
        return None;
    }
    let u = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let mut sum = 0u64;
    let mut out = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let o = i * SGE_LEN;
        let e = WireSge {
            rkey: u(o),
            addr: u(o + 8),
            len: u(o + 16),
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
