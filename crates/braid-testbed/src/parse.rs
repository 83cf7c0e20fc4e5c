//! Parsers for the command-line values shared by `testbed`, `baseline`, `demo` and `bench`:
//! link rates (`1gbit`, `250mbit`), message sizes (`64K`, `4MiB`, `4194304`) and rail lists
//! (`LOCAL=REMOTE,...`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use anyhow::{Context, Result, bail};

/// Default TCP port of braid's benchmarks; the same as perftest's `ib_write_bw` (18515).
pub const DEFAULT_PORT: u16 = 18515;

/// A link rate in bits per second, as `tc` understands it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Rate {
    /// Bits per second.
    pub bits_per_s: u64,
}

impl Rate {
    /// A rate of `bits_per_s` bits per second.
    pub const fn from_bits(bits_per_s: u64) -> Self {
        Rate { bits_per_s }
    }

    /// Bytes per second (what goodput is compared against).
    pub fn bytes_per_s(&self) -> u64 {
        self.bits_per_s / 8
    }

    /// Megabytes (10^6 bytes) per second.
    pub fn mb_per_s(&self) -> f64 {
        self.bits_per_s as f64 / 8e6
    }

    /// The argument for `tc ... rate`: exact, in bits per second.
    pub fn tc_arg(&self) -> String {
        format!("{}bit", self.bits_per_s)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.bits_per_s;
        for (div, unit) in [
            (1_000_000_000_000, "tbit"),
            (1_000_000_000, "gbit"),
            (1_000_000, "mbit"),
            (1_000, "kbit"),
        ] {
            if b >= div && b.is_multiple_of(div) {
                return write!(f, "{}{}", b / div, unit);
            }
        }
        write!(f, "{b}bit")
    }
}

impl std::str::FromStr for Rate {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        parse_rate(s)
    }
}

/// Parses a rate with `tc`'s units: `bit`, `kbit`, `mbit`, `gbit`, `tbit` (powers of 1000),
/// `kibit`, `mibit`, `gibit` (powers of 1024), and bytes per second as `bps`, `kbps`, `mbps`,
/// `gbps` (as in `tc`, "bps" means bytes). A bare number is bits per second.
pub fn parse_rate(s: &str) -> Result<Rate> {
    let t = s.trim().to_ascii_lowercase();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("rate {s:?}: expected a number followed by a unit such as 1gbit or 250mbit");
    }
    let n: f64 = num
        .parse()
        .with_context(|| format!("rate {s:?}: bad number"))?;
    let mult: f64 = match unit {
        "" | "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "kibit" => 1024.0,
        "mibit" => 1024.0 * 1024.0,
        "gibit" => 1024.0 * 1024.0 * 1024.0,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        other => bail!(
            "rate {s:?}: unknown unit {other:?} (use bit, kbit, mbit, gbit, tbit, kibit, mibit, gibit, bps, kbps, mbps, gbps)"
        ),
    };
    let bits = (n * mult).round();
    if !(1000.0..1e15).contains(&bits) {
        bail!("rate {s:?}: out of range (1kbit .. 1000tbit)");
    }
    Ok(Rate::from_bits(bits as u64))
}

/// Parses a rate, or `none` for rails without a rate limit (no `tbf`: each veth runs as
/// fast as the CPUs move packets, as on a 10-100 GbE NIC): `None`.
pub fn parse_rate_or_none(s: &str) -> Result<Option<Rate>> {
    if s.trim().eq_ignore_ascii_case("none") {
        Ok(None)
    } else {
        parse_rate(s).map(Some)
    }
}

/// Parses a comma-separated list of rates (`1gbit,1gbit,250mbit`).
pub fn parse_rates(s: &str) -> Result<Vec<Rate>> {
    s.split(',').map(parse_rate).collect()
}

/// Parses a byte size: a number with an optional binary suffix `K`/`KiB`/`KB`, `M`/`MiB`/`MB`,
/// `G`/`GiB`/`GB` (all powers of 1024, as message sizes are). `4194304` = `4M` = `4MiB`.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("size {s:?}: expected a number such as 65536, 64K or 4MiB");
    }
    let n: u64 = num
        .parse()
        .with_context(|| format!("size {s:?}: bad number"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => bail!("size {s:?}: unknown suffix {other:?} (use K, M or G, powers of 1024)"),
    };
    let v = n
        .checked_mul(mult)
        .with_context(|| format!("size {s:?}: too large"))?;
    if v == 0 || v > (1u64 << 32) {
        bail!("size {s:?}: must be between 1 byte and 4 GiB");
    }
    Ok(v as usize)
}

/// Parses a comma-separated list of sizes (`64K,1M,4M`).
pub fn parse_sizes(s: &str) -> Result<Vec<usize>> {
    s.split(',').map(parse_size).collect()
}

/// Parses `IP[:PORT]`; a missing port is [`DEFAULT_PORT`].
pub fn parse_addr(s: &str) -> Result<SocketAddrV4> {
    let t = s.trim();
    if let Ok(sa) = t.parse::<SocketAddrV4>() {
        return Ok(sa);
    }
    let ip: Ipv4Addr = t
        .parse()
        .with_context(|| format!("address {s:?}: expected IPv4[:PORT]"))?;
    Ok(SocketAddrV4::new(ip, DEFAULT_PORT))
}

/// Parses a comma-separated list of listen addresses `IP[:PORT],...`.
pub fn parse_addrs(s: &str) -> Result<Vec<SocketAddrV4>> {
    s.split(',').map(parse_addr).collect()
}

/// One rail as the client sees it: bind to `local`, connect to `remote`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailSpec {
    /// Local address to bind (port 0: any).
    pub local: Ipv4Addr,
    /// Remote listen address.
    pub remote: SocketAddrV4,
}

impl RailSpec {
    /// The remote address as a generic socket address.
    pub fn remote_sa(&self) -> SocketAddr {
        SocketAddr::V4(self.remote)
    }
}

/// Parses `LOCAL=REMOTE[,LOCAL=REMOTE...]` where LOCAL is an IPv4 address and REMOTE is
/// `IPv4[:PORT]` (default port [`DEFAULT_PORT`]).
pub fn parse_rails(s: &str) -> Result<Vec<RailSpec>> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (l, r) = part.split_once('=').with_context(|| {
            format!("rail {part:?}: expected LOCAL=REMOTE, e.g. 198.18.0.1=198.18.0.2:18515")
        })?;
        let local: Ipv4Addr = l
            .trim()
            .parse()
            .with_context(|| format!("rail {part:?}: bad local address {l:?}"))?;
        let remote = parse_addr(r).with_context(|| format!("rail {part:?}"))?;
        out.push(RailSpec { local, remote });
    }
    if out.is_empty() {
        bail!("no rails given");
    }
    Ok(out)
}

/// Formats rails back into the `LOCAL=REMOTE,...` form (for spawning clients).
pub fn format_rails(rails: &[RailSpec]) -> String {
    rails
        .iter()
        .map(|r| format!("{}={}", r.local, r.remote))
        .collect::<Vec<_>>()
        .join(",")
}

/// Formats addresses into the `IP:PORT,...` form.
pub fn format_addrs(addrs: &[SocketAddrV4]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("1gbit").unwrap().bits_per_s, 1_000_000_000);
        assert_eq!(parse_rate("250mbit").unwrap().bits_per_s, 250_000_000);
        assert_eq!(parse_rate("1Gbit").unwrap().bytes_per_s(), 125_000_000);
        assert_eq!(parse_rate("1.5gbit").unwrap().bits_per_s, 1_500_000_000);
        assert_eq!(parse_rate("100kbps").unwrap().bits_per_s, 800_000);
        assert_eq!(parse_rate("1mibit").unwrap().bits_per_s, 1 << 20);
        assert_eq!(parse_rate("5000000").unwrap().bits_per_s, 5_000_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("1gbyte").is_err());
        assert!(parse_rate("0bit").is_err());
        let v = parse_rates("1gbit,1gbit,1gbit,250mbit").unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v[3].to_string(), "250mbit");
        assert_eq!(v[0].to_string(), "1gbit");
        assert_eq!(v[0].tc_arg(), "1000000000bit");
        assert_eq!(parse_rate_or_none("none").unwrap(), None);
        assert_eq!(parse_rate_or_none(" None ").unwrap(), None);
        assert_eq!(
            parse_rate_or_none("1gbit").unwrap().map(|r| r.bits_per_s),
            Some(1_000_000_000)
        );
        assert!(parse_rate_or_none("nothing").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4194304").unwrap(), 4 << 20);
        assert_eq!(parse_size("4M").unwrap(), 4 << 20);
        assert_eq!(parse_size("4MiB").unwrap(), 4 << 20);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert!(parse_size("0").is_err());
        assert!(parse_size("12T").is_err());
        assert_eq!(
            parse_sizes("64K,1M,4M").unwrap(),
            vec![65536, 1 << 20, 4 << 20]
        );
    }

    #[test]
    fn rails() {
        let r = parse_rails("198.18.0.1=198.18.0.2:7000,198.18.1.1=198.18.1.2").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].local, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r[0].remote, "198.18.0.2:7000".parse().unwrap());
        assert_eq!(r[1].remote.port(), DEFAULT_PORT);
        assert_eq!(
            format_rails(&r),
            "198.18.0.1=198.18.0.2:7000,198.18.1.1=198.18.1.2:18515"
        );
        assert!(parse_rails("198.18.0.1").is_err());
        assert!(parse_rails("x=198.18.0.2").is_err());
        assert!(parse_rails("198.18.0.1=198.18.0.2:99999").is_err());
        assert_eq!(
            parse_addrs("127.0.0.1:0,127.0.0.2").unwrap()[1].port(),
            DEFAULT_PORT
        );
    }
}
