//! Which addresses a rank offers, and which rails a pair of ranks uses.
//!
//! The rule (also in `docs/LAUNCH.md`):
//!
//! * A rank offers the IPv4 addresses of its network namespace's interfaces (loopback
//!   excluded), sorted, each with its prefix length; `BRAID_RAILS` replaces them.
//! * Two ranks in the same network namespace of the same machine (and no `BRAID_RAILS`) use
//!   one loopback rail.
//! * Otherwise the pair uses one rail per pair of addresses in a common subnet (equal network
//!   under the longer of the two prefixes), matched greedily in address order so that each
//!   address carries at most one rail of the pair.
//! * With no common subnet, one rail to the address the rendezvous saw the peer connect from
//!   (if the peer offers it; else its first address), the kernel choosing the local address.

use std::net::Ipv4Addr;
use std::str::FromStr;

use crate::error::BootError;

/// One entry of `BRAID_RAILS`: an IPv4 address, with its prefix length if given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailSpec {
    /// The address.
    pub ip: Ipv4Addr,
    /// Prefix length; `None` takes it from the interface whose subnet holds the address.
    pub prefix: Option<u8>,
}

impl FromStr for RailSpec {
    type Err = String;

    /// `IP` or `IP/PREFIX`.
    fn from_str(s: &str) -> Result<RailSpec, String> {
        let (ip, prefix) = match s.split_once('/') {
            Some((ip, p)) => {
                let p: u8 = p
                    .parse()
                    .ok()
                    .filter(|p| *p <= 32)
                    .ok_or_else(|| format!("{s:?}: prefix must be 0..32"))?;
                (ip, Some(p))
            }
            None => (s, None),
        };
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| format!("{s:?} is not an IPv4 address"))?;
        if ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() {
            return Err(format!("{s:?} cannot carry a rail"));
        }
        Ok(RailSpec { ip, prefix })
    }
}

/// An address a rank offers, with its subnet's prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostAddr {
    /// The address.
    pub ip: Ipv4Addr,
    /// Its prefix length (0..=32).
    pub prefix: u8,
}

impl HostAddr {
    fn network(ip: Ipv4Addr, prefix: u8) -> u32 {
        let mask = if prefix == 0 {
            0
        } else {
            u32::MAX << (32 - prefix.min(32))
        };
        u32::from(ip) & mask
    }

    /// True when both addresses lie in one subnet: equal network under the longer of the two
    /// prefixes (so 10.0.0.5/24 and 10.0.0.9/16 do, 10.0.1.5/24 and 10.0.0.9/16 do not).
    pub fn shares_subnet(&self, other: &HostAddr) -> bool {
        let p = self.prefix.max(other.prefix);
        Self::network(self.ip, p) == Self::network(other.ip, p)
    }
}

impl std::fmt::Display for HostAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.ip, self.prefix)
    }
}

/// The IPv4 addresses (with prefixes) of this network namespace's interfaces, sorted.
pub fn interface_addrs(include_loopback: bool) -> Result<Vec<HostAddr>, BootError> {
    let mut v: Vec<HostAddr> = if_addrs::get_if_addrs()?
        .into_iter()
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) if include_loopback || !a.ip.is_loopback() => Some(HostAddr {
                ip: a.ip,
                prefix: a.prefixlen,
            }),
            _ => None,
        })
        .collect();
    v.sort();
    v.dedup();
    Ok(v)
}

/// The local addresses of `BRAID_RAILS` entries; a missing prefix comes from the interface
/// whose subnet holds the address (loopback included), else it is /32.
pub fn resolve_rail_specs(specs: &[RailSpec]) -> Result<Vec<HostAddr>, BootError> {
    let ifs = interface_addrs(true)?;
    let mut out = Vec::new();
    for s in specs {
        let prefix = s.prefix.unwrap_or_else(|| {
            ifs.iter()
                .filter(|i| {
                    i.shares_subnet(&HostAddr {
                        ip: s.ip,
                        prefix: i.prefix,
                    })
                })
                .map(|i| i.prefix)
                .max()
                .unwrap_or(32)
        });
        let a = HostAddr { ip: s.ip, prefix };
        if !out.contains(&a) {
            out.push(a);
        }
    }
    Ok(out)
}

/// Greedy one-to-one matching of `a`'s and `b`'s addresses by common subnet, in `a`'s order:
/// each `a[i]` takes the first unused `b[j]` in its subnet. Returns `(i, j)` pairs.
pub fn match_subnets(a: &[HostAddr], b: &[HostAddr]) -> Vec<(usize, usize)> {
    let mut used = vec![false; b.len()];
    let mut out = Vec::new();
    for (i, x) in a.iter().enumerate() {
        if let Some(j) = (0..b.len()).find(|&j| !used[j] && x.shares_subnet(&b[j])) {
            used[j] = true;
            out.push((i, j));
        }
    }
    out
}

/// Identifies this machine and network namespace: two ranks with equal keys can use
/// loopback between them. The machine's boot id plus the namespace's inode.
pub fn host_key() -> String {
    use std::os::unix::fs::MetadataExt;
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let ns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| format!("{}:{}", m.dev(), m.ino()))
        .unwrap_or_default();
    let host = hostname();
    format!("{host}/{boot}/{ns}")
}

/// This machine's host name (for messages).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &str) -> HostAddr {
        let r: RailSpec = s.parse().unwrap();
        HostAddr {
            ip: r.ip,
            prefix: r.prefix.unwrap(),
        }
    }

    #[test]
    fn subnets() {
        assert!(h("10.0.0.5/24").shares_subnet(&h("10.0.0.9/24")));
        assert!(!h("10.0.1.5/24").shares_subnet(&h("10.0.0.9/24")));
        assert!(h("10.0.0.5/24").shares_subnet(&h("10.0.0.9/16")));
        assert!(!h("10.0.1.5/24").shares_subnet(&h("10.0.0.9/16")));
        assert!(h("1.2.3.4/0").shares_subnet(&h("5.6.7.8/0")));
        assert!(!h("1.2.3.4/32").shares_subnet(&h("1.2.3.5/32")));
        assert!(h("127.0.0.1/8").shares_subnet(&h("127.0.0.2/8")));
    }

    #[test]
    fn testbed_pairs_match_per_link() {
        // Host 0 of a 3-host, 2-rail testbed: links (0,1) are 198.18.0/1, (0,2) 198.18.2/3.
        let h0 = [
            h("198.18.0.1/24"),
            h("198.18.1.1/24"),
            h("198.18.2.1/24"),
            h("198.18.3.1/24"),
        ];
        let h1 = [
            h("198.18.0.2/24"),
            h("198.18.1.2/24"),
            h("198.18.4.2/24"),
            h("198.18.5.2/24"),
        ];
        let h2 = [
            h("198.18.2.3/24"),
            h("198.18.3.3/24"),
            h("198.18.4.3/24"),
            h("198.18.5.3/24"),
        ];
        assert_eq!(match_subnets(&h0, &h1), vec![(0, 0), (1, 1)]);
        assert_eq!(match_subnets(&h0, &h2), vec![(2, 0), (3, 1)]);
        assert_eq!(match_subnets(&h1, &h2), vec![(2, 2), (3, 3)]);
        assert_eq!(match_subnets(&h2, &h1), vec![(2, 2), (3, 3)]);
    }

    #[test]
    fn one_rail_per_address() {
        let a = [h("127.0.0.1/8"), h("127.0.0.2/8"), h("127.0.0.3/8")];
        let b = [h("127.0.0.1/8"), h("127.0.0.2/8")];
        assert_eq!(match_subnets(&a, &b), vec![(0, 0), (1, 1)]);
        assert!(match_subnets(&a, &[h("10.1.1.1/8")]).is_empty());
        assert!(match_subnets(&[], &b).is_empty());
    }

    #[test]
    fn rail_specs() {
        assert_eq!(
            "10.0.0.1/16".parse::<RailSpec>().unwrap(),
            RailSpec {
                ip: Ipv4Addr::new(10, 0, 0, 1),
                prefix: Some(16)
            }
        );
        for bad in [
            "10.0.0.1/33",
            "x",
            "0.0.0.0",
            "224.0.0.1",
            "::1",
            "10.0.0.1/",
        ] {
            assert!(bad.parse::<RailSpec>().is_err(), "{bad}");
        }
        // A loopback address without a prefix takes the loopback interface's /8.
        let r = resolve_rail_specs(&["127.0.0.2".parse().unwrap()]).unwrap();
        assert_eq!(r, vec![h("127.0.0.2/8")]);
    }

    #[test]
    fn host_key_is_stable_here() {
        assert_eq!(host_key(), host_key());
        assert!(!host_key().is_empty());
    }
}
