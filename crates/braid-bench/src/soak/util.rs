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

pub(super) use braid_testkit::Rng;
pub(super) use braid_testkit::pattern::fill;

/// Peak resident set size of this process (VmHWM), in KiB.
pub fn max_rss_kib() -> u64 {
    status_kib("VmHWM:")
}

/// Resident set size of this process now (VmRSS), in KiB.
pub fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// A KiB figure of `/proc/self/status` (0 where unavailable).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
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
    fn fill_hex_and_rss() {
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
