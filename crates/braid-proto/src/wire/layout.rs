//! Little-endian fields at named byte ranges. Each wire format names its fields' ranges once
//! (a `field` module beside it) and its encoder and decoder both go through them, so no byte
//! offset is written twice.

use std::ops::Range;

/// The `u16` at `r` (2 bytes) of `b`.
pub(crate) fn get_u16(b: &[u8], r: Range<usize>) -> u16 {
    u16::from_le_bytes(b[r].try_into().expect("a 2-byte field"))
}

/// The `u32` at `r` (4 bytes) of `b`.
pub(crate) fn get_u32(b: &[u8], r: Range<usize>) -> u32 {
    u32::from_le_bytes(b[r].try_into().expect("a 4-byte field"))
}

/// The `u64` at `r` (8 bytes) of `b`.
pub(crate) fn get_u64(b: &[u8], r: Range<usize>) -> u64 {
    u64::from_le_bytes(b[r].try_into().expect("an 8-byte field"))
}

/// The bytes at `r` of `b` as an array of their length.
pub(crate) fn get_array<const N: usize>(b: &[u8], r: Range<usize>) -> [u8; N] {
    b[r].try_into().expect("a field of the array's length")
}

/// Writes `bytes` at `r` of `b` (their lengths are equal).
pub(crate) fn put(b: &mut [u8], r: Range<usize>, bytes: &[u8]) {
    b[r].copy_from_slice(bytes);
}

/// True when `fields` cover `0..len` in order, without gap or overlap.
#[cfg(test)]
pub(crate) fn tiles(fields: &[Range<usize>], len: usize) -> bool {
    let mut at = 0;
    for f in fields {
        if f.start != at || f.end <= f.start {
            return false;
        }
        at = f.end;
    }
    at == len
}
