//! Byte patterns for checking transfers: every 8-byte word depends on a seed (an iteration,
//! a slot, a file) and on its offset, so stale, misplaced or foreign data shows.

/// splitmix64's finaliser: a bijection of `u64` that scatters every input bit.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Word number `w` of the pattern whose mixed seed is `base`: one multiply and a shift per
/// word, so that verifying benchmarks at gigabytes per second costs little.
fn word(base: u64, w: u64) -> [u8; 8] {
    let v = base ^ w.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (v ^ (v >> 29)).to_le_bytes()
}

/// Fills `buf` with the pattern of `seed`, as if `buf` started at offset 0.
pub fn fill(seed: u64, buf: &mut [u8]) {
    let base = mix(seed.wrapping_add(0x9E37_79B9_7F4A_7C15));
    let mut chunks = buf.chunks_exact_mut(8);
    let mut w = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&word(base, w));
        w += 1;
    }
    let rest = chunks.into_remainder();
    let n = rest.len();
    rest.copy_from_slice(&word(base, w)[..n]);
}

/// `len` bytes of the pattern of `seed`.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill(seed, &mut v);
    v
}

/// Compares `got` with the pattern of `seed`: `Err(offset of the first wrong byte)`.
/// `scratch` is reused between calls.
pub fn check(seed: u64, got: &[u8], scratch: &mut Vec<u8>) -> Result<(), usize> {
    scratch.resize(got.len(), 0);
    fill(seed, scratch);
    match got.iter().zip(scratch.iter()).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(i),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_by_word_and_check_finds_the_first_bad_byte() {
        let a = pattern(4099, 1);
        assert_eq!(a, pattern(4099, 1));
        assert_ne!(a, pattern(4099, 2));
        assert_eq!(
            &pattern(100, 1)[..],
            &a[..100],
            "a prefix of the longer pattern"
        );
        let words: std::collections::HashSet<&[u8]> = a.chunks_exact(8).collect();
        assert_eq!(words.len(), a.len() / 8, "no word repeats");
        let mut s = Vec::new();
        assert_eq!(check(1, &a, &mut s), Ok(()));
        let mut b = a.clone();
        b[4098] ^= 1;
        assert_eq!(check(1, &b, &mut s), Err(4098));
    }
}
