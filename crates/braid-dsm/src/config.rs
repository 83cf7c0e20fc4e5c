//! Settings of a DSM, from the environment or given explicitly.

use std::time::Duration;

use crate::error::DsmError;
use crate::proto::HomePolicy;

/// Environment variable: default home policy of allocations, `block` or `cyclic`.
pub const HOME_ENV: &str = "BRAID_DSM_HOME";
/// Environment variable: size of the shared address range (bytes; `K`, `M`, `G`, `T`).
pub const SPACE_ENV: &str = "BRAID_DSM_SPACE";
/// Environment variable: number of global locks (ids `0..n`).
pub const LOCKS_ENV: &str = "BRAID_DSM_LOCKS";
/// Environment variable: page requests a rank may have in flight at once.
pub const SLOTS_ENV: &str = "BRAID_DSM_SLOTS";
/// Environment variable: how long the service thread polls after activity (microseconds)
/// before it sleeps.
pub const SPIN_ENV: &str = "BRAID_DSM_SPIN_US";
/// Environment variable: how long the service thread polls (microseconds) while a page
/// request of its own is in flight, before it sleeps until the answer wakes it.
pub const SPIN_WAIT_ENV: &str = "BRAID_DSM_SPIN_WAIT_US";
/// Environment variable: `1` accepts a userfaultfd for user-mode faults only (see
/// [`DsmConfig::user_faults_only`]).
pub const USER_FAULTS_ONLY_ENV: &str = "BRAID_DSM_USER_FAULTS_ONLY";
/// Environment variable: `1` spreads concurrent page transfers over every rail, `0` (the
/// default) keeps each on the first rail with room (see [`DsmConfig::spread_rails`]).
pub const SPREAD_RAILS_ENV: &str = "BRAID_DSM_SPREAD_RAILS";

/// Settings of a DSM.
#[derive(Clone, Debug)]
pub struct DsmConfig {
    /// Bytes of virtual address space reserved at the same address in every rank; the sum
    /// of live allocations (rounded up to pages) cannot exceed it. Only address space: pages
    /// take memory when touched. Default 64 GiB.
    pub space: usize,
    /// Home policy of [`crate::Dsm::alloc`] (default [`HomePolicy::Block`]).
    pub home: HomePolicy,
    /// Global locks: ids `0..locks` (default 65536).
    pub locks: u32,
    /// Page requests a rank may have in flight at once; further faults wait (default 256).
    pub slots: u32,
    /// How long the service thread keeps polling after activity before it sleeps (default
    /// 200 µs). Polling yields the processor to any other runnable thread (`sched_yield`),
    /// so it costs little on a busy machine.
    pub spin: Duration,
    /// How long it keeps polling while a request of this rank is in flight (default 2 ms;
    /// at least `spin`), so the answer needs no thread wake-up. When the cores are all
    /// busy with computation and many requests are in flight (prefetching threads), a
    /// shorter wait leaves the processor to the computation instead (docs/DSM.md,
    /// "Applications", has a measurement).
    pub spin_wait: Duration,
    /// Accept a userfaultfd that handles user-mode faults only, as an unprivileged process
    /// gets with `vm.unprivileged_userfaultfd = 0`. System calls that touch an absent shared
    /// page then fail with `EFAULT` instead of waiting for it (default false: such a
    /// process gets a clear start-up error instead).
    pub user_faults_only: bool,
    /// Spread concurrent page transfers over every rail (braid's
    /// `SessionConfig::spread_small_ops`). Default off: pages are 4 KiB and a DSM on a
    /// small host is bound by its cores, not the wire; spreading cost the matrix multiply
    /// 10% of its time on 2 cores and 4 rails, with no bandwidth to gain (docs/DSM.md).
    pub spread_rails: bool,
}

impl Default for DsmConfig {
    fn default() -> DsmConfig {
        DsmConfig {
            space: 64 << 30,
            home: HomePolicy::Block,
            locks: 65536,
            slots: 256,
            spin: Duration::from_micros(200),
            spin_wait: Duration::from_millis(2),
            user_faults_only: false,
            spread_rails: false,
        }
    }
}

/// Parses `123`, `4K`, `16M`, `64G`, `1T` (powers of 1024).
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 10),
        (i, 'm' | 'M') => (&s[..i], 20),
        (i, 'g' | 'G') => (&s[..i], 30),
        (i, 't' | 'T') => (&s[..i], 40),
        _ => (s, 0),
    };
    num.trim()
        .parse::<usize>()
        .ok()?
        .checked_mul(1usize << shift)
}

/// Parses a home policy name.
pub fn parse_policy(s: &str) -> Option<HomePolicy> {
    match s.trim().to_ascii_lowercase().as_str() {
        "block" => Some(HomePolicy::Block),
        "cyclic" => Some(HomePolicy::Cyclic),
        _ => None,
    }
}

impl DsmConfig {
    /// Defaults, overridden by the `BRAID_DSM_*` environment variables.
    pub fn from_env() -> Result<DsmConfig, DsmError> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// [`DsmConfig::from_env`] over any variable lookup.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<DsmConfig, DsmError> {
        let mut c = DsmConfig::default();
        let bad = |var: &str, v: &str, what: &str| {
            DsmError::InvalidArgument(format!("{var}={v:?}: expected {what}"))
        };
        if let Some(v) = get(HOME_ENV) {
            c.home = parse_policy(&v).ok_or_else(|| bad(HOME_ENV, &v, "block or cyclic"))?;
        }
        if let Some(v) = get(SPACE_ENV) {
            c.space = parse_size(&v)
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(SPACE_ENV, &v, "a size such as 64G"))?;
        }
        if let Some(v) = get(LOCKS_ENV) {
            c.locks = v
                .trim()
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(LOCKS_ENV, &v, "a positive number"))?;
        }
        if let Some(v) = get(SLOTS_ENV) {
            c.slots = v
                .trim()
                .parse()
                .ok()
                .filter(|n| (1..=65536).contains(n))
                .ok_or_else(|| bad(SLOTS_ENV, &v, "1 to 65536"))?;
        }
        if let Some(v) = get(SPIN_ENV) {
            let us: u64 = v
                .trim()
                .parse()
                .map_err(|_| bad(SPIN_ENV, &v, "microseconds"))?;
            c.spin = Duration::from_micros(us);
        }
        if let Some(v) = get(SPIN_WAIT_ENV) {
            let us: u64 = v
                .trim()
                .parse()
                .map_err(|_| bad(SPIN_WAIT_ENV, &v, "microseconds"))?;
            c.spin_wait = Duration::from_micros(us);
        }
        if let Some(v) = get(USER_FAULTS_ONLY_ENV) {
            c.user_faults_only = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" | "" => false,
                _ => return Err(bad(USER_FAULTS_ONLY_ENV, &v, "0 or 1")),
            };
        }
        if let Some(v) = get(SPREAD_RAILS_ENV) {
            c.spread_rails = match v.trim() {
                "1" | "true" | "yes" => true,
                "0" | "false" | "no" | "" => false,
                _ => return Err(bad(SPREAD_RAILS_ENV, &v, "0 or 1")),
            };
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_is_parsed_and_checked() {
        let c = DsmConfig::from_vars(|k| match k {
            HOME_ENV => Some("Cyclic".into()),
            SPACE_ENV => Some("2G".into()),
            LOCKS_ENV => Some("10".into()),
            SPIN_ENV => Some("0".into()),
            SPIN_WAIT_ENV => Some("150".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(c.home, HomePolicy::Cyclic);
        assert_eq!(c.space, 2 << 30);
        assert_eq!(c.locks, 10);
        assert_eq!(c.spin, Duration::ZERO);
        assert_eq!(c.spin_wait, Duration::from_micros(150));
        assert_eq!(DsmConfig::default().spin_wait, Duration::from_millis(2));
        for (k, v) in [
            (HOME_ENV, "round"),
            (SPACE_ENV, "lots"),
            (SLOTS_ENV, "0"),
            (SPIN_WAIT_ENV, "soon"),
        ] {
            let e = DsmConfig::from_vars(|x| (x == k).then(|| v.to_string())).unwrap_err();
            assert!(e.to_string().contains(k), "{e}");
        }
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1T"), Some(1 << 40));
    }
}
