//! Small helpers of the soak: the seeded fill pattern and PRNG, peak RSS, hex, JSON output.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use serde::Serialize;

pub(super) fn secs(s: f64, what: &str) -> Result<Duration> {
    if !(s > 0.0 && s <= 86_400.0) {
        bail!("{what} must be between 0 and 86400 seconds, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

// ------------------------------------------------------------------ small helpers

pub(super) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with bytes determined by `seed` and the position.
pub(super) fn fill(seed: u64, buf: &mut [u8]) {
    let base = mix(seed);
    let mut chunks = buf.chunks_exact_mut(8);
    let mut i = 0u64;
    for c in &mut chunks {
        c.copy_from_slice(&mix(base ^ i).to_le_bytes());
        i += 1;
    }
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let b = mix(base ^ i).to_le_bytes();
        let n = rest.len();
        rest.copy_from_slice(&b[..n]);
    }
}

/// xorshift64* generator.
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng(mix(seed) | 1)
    }
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `lo..=hi`.
    pub(super) fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
    /// Roughly log-uniform in `lo..=hi`.
    pub(super) fn size(&mut self, lo: usize, hi: usize) -> usize {
        let top = usize::BITS - hi.leading_zeros();
        let bits = self.range(0, top as usize - 1);
        let a = (1usize << bits).max(lo);
        let b = ((2usize << bits) - 1).min(hi).max(a);
        self.range(a, b)
    }
}

/// Peak resident set size of this process (VmHWM), in KiB.
pub fn max_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub(super) fn first_diff(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0)
}

pub(super) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub(super) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

pub(super) fn write_json(path: &PathBuf, value: &impl Serialize) -> Result<()> {
    let line = serde_json::to_string(value)?;
    if path.as_os_str() == "-" {
        println!("{line}");
    } else {
        std::fs::write(path, line + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_fill() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let s = r.size(1, 1 << 20);
            assert!((1..=1 << 20).contains(&s));
            let s = r.size(32, 65536);
            assert!((32..=65536).contains(&s));
        }
        let mut a = vec![0u8; 13];
        let mut b = vec![0u8; 13];
        fill(5, &mut a);
        fill(5, &mut b);
        assert_eq!(a, b);
        fill(6, &mut b);
        assert_ne!(a, b);
        assert_eq!(unhex(&hex(&[1, 0xab, 0xff])), Some(vec![1, 0xab, 0xff]));
        assert!(max_rss_kib() > 0);
    }
}
