//! The emulated cluster: network namespaces joined by shaped veth pairs, one per NIC ("rail").
//!
//! # Shape
//!
//! Host `i` of testbed `NAME` is the namespace `NAME-h<i>`. Every pair of hosts `a < b` is
//! joined by `rails` veth pairs. The veth end in host `a` towards host `b` on rail `r` is named
//! `p<b>r<r>` (peer `b`, rail `r`), so names stay below the 15-character limit and only need to
//! be unique inside one namespace.
//!
//! # Addresses (all inside 198.18.0.0/15, the range reserved for benchmarks)
//!
//! Unordered pairs are numbered `p = 0, 1, ...` in the order (0,1), (0,2), .., (1,2), ...; the
//! link (p, r) gets subnet number `i = p * rails + r` and the /24 `198.(18 + i / 256).(i % 256).0/24`;
//! host `h` has address `.(h + 1)` in it. With two hosts, rail r is `198.18.<r>.0/24`, host 0
//! is `198.18.<r>.1` and host 1 is `198.18.<r>.2`. The scheme holds `pairs * rails <= 512`
//! subnets (e.g. 8 hosts with 16 rails is 448).
//!
//! # Shaping
//!
//! Both veth ends of every rail carry `tc qdisc ... root tbf rate R burst 256kb latency 5ms`.
//! DESIGN.md records that smaller buckets or a 1 ms queue caused tens of thousands of
//! retransmissions. The bucket is 256 KiB = 262144 bytes, i.e. 29 jumbo frames at MTU 9000 or
//! 4 full 64 KiB GSO super-packets, so it is large enough at either MTU (tbf drops any packet
//! larger than its bucket, and veth hands it GSO packets of up to 64 KiB). tbf counts each
//! Ethernet frame without FCS, preamble or gap: a 1448-byte TCP segment (MTU 1500 with
//! timestamps) costs 1514 bytes, so the framing limit of one 1 Gbit/s rail is
//! 1448/1514 × 125 MB/s = 119.55 MB/s; at MTU 9000 it is 8948/9014 × 125 = 124.08 MB/s.
//! Offloads (GSO/GRO/TSO) are left on: tbf accounts GSO packets by their on-wire size, and
//! the measurements below reach the framing limit with them on. A GSO packet holds at most
//! 1 ms of the rail's rate (`gso_max_segs`; no limit in practice from 1 Gbit/s on): tbf
//! releases a GSO packet whole, and on a 500 kbit/s rail a 34 KB one left after 0.55 s with
//! nothing before it, where a NIC sends its segments one by one.
//!
//! An unshaped testbed ([`TestbedSpec::unshaped`], `braid testbed up --unshaped`) has no
//! qdisc at all: the rails are plain veth pairs, as fast as the CPUs move packets, for
//! measurements that are bound by CPU rather than by the link.
//!
//! # Measured (release build, 2-core VM, BBR, `braid baseline tcp` through this testbed)
//!
//! Testbed `braid testbed up --name bm --rail-count 4` (4 × 1gbit, MTU 1500), server
//! `ip netns exec bm-h1 braid baseline MODE server --listen 198.18.0.2[,198.18.1.2,...]`,
//! client `ip netns exec bm-h0 braid baseline MODE client --rails 198.18.0.1=198.18.0.2[,...] -s 4M -D SECS`:
//!
//! | what                                  | goodput MB/s | framing limit | % of limit |
//! |---------------------------------------|-------------:|--------------:|-----------:|
//! | tcp, 1 rail, -D 10                    |       119.52 |        119.55 |      99.97 |
//! | tcp, 1 rail, `-s 64K -D 5`            |       119.59 |        119.55 |     100.0  |
//! | tcp, 1 rail, MTU 9000 (`--mtu 9000`), -D 10 | 123.61 |        124.08 |      99.6  |
//! | tcp, 4 parallel streams, -D 10        |       474.94 |        478.20 |      99.3  |
//! | trunking 1 / 2 / 3 / 4 rails, -D 5    | 119.27 / 236.70 / 356.85 / 477.39 | 119.55 / 239.1 / 358.7 / 478.2 | 99.8 / 99.0 / 99.5 / 99.8 |
//! | rates 1gbit,1gbit,1gbit,250mbit: tcp 4 streams / trunking 4 rails, -D 5 | 385.67 / 119.57 | 388.5 | 99.3 / 30.8 |
//!
//! TCP RetransSegs in the sending namespace stayed 0 over the 1-rail runs; the tbf on the
//! sender reported 198 drops out of 408440 packets in the first 5 s run (BBR's start-up probe
//! overshooting the 5 ms queue). Runs of 2 s (the demo's default) lose about 0.5-1% to the
//! start-up. Trunking over equal rails is as fast as parallel streams here: a modern CPU
//! copies 480 MB/s through the reorder buffer easily; it costs CPU instead (server 0.62-0.91
//! CPU s/GB against 0.26-0.43 for plain TCP), and round-robin striping is pinned to N × the
//! slowest rail on unequal rails (the 250mbit row).
//!
//! # Lifetime
//!
//! [`Testbed::up`] returns a guard. If this call created the namespaces, dropping the guard
//! deletes them (also when a test panics). If an identical testbed of the same name already
//! existed (recorded in `/run/braid/testbed-NAME.json`), it is reused and left standing on
//! drop. An existing testbed of the same name with a different shape is an error: it may be in
//! use by someone else, so `up` never rebuilds it silently; run `braid testbed down --name NAME`
//! first. [`Testbed::persist`] turns the guard into a standing testbed (`braid testbed up`).

use std::fs;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Output};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::parse::Rate;

pub use crate::secret::harness_secret;

/// What a testbed looks like; two equal specs describe the same testbed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestbedSpec {
    /// Name of the testbed; namespaces are `NAME-h<i>`. Letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// Number of hosts (namespaces), at least 2.
    pub hosts: usize,
    /// Shaped rate of each rail; its length is the number of rails per host pair.
    pub rates: Vec<Rate>,
    /// MTU of every veth end.
    pub mtu: u32,
    /// No `tbf` on the rails: each veth runs as fast as the CPUs move packets (`rates` then
    /// only count the rails). For CPU-bound measurements.
    #[serde(default)]
    pub unshaped: bool,
}

impl TestbedSpec {
    /// `rails` rails of `rate` each between 2 hosts, MTU 1500.
    pub fn new(name: impl Into<String>, rails: usize, rate: Rate) -> Self {
        TestbedSpec {
            name: name.into(),
            hosts: 2,
            rates: vec![rate; rails],
            mtu: 1500,
            unshaped: false,
        }
    }

    /// `rails` unshaped rails between 2 hosts, MTU 1500 (see [`TestbedSpec::unshaped`]).
    pub fn unshaped(name: impl Into<String>, rails: usize) -> Self {
        TestbedSpec {
            unshaped: true,
            ..TestbedSpec::new(name, rails, Rate::from_bits(1_000_000_000))
        }
    }

    /// Number of rails per host pair.
    pub fn rails(&self) -> usize {
        self.rates.len()
    }

    fn validate(&self) -> Result<()> {
        let n = &self.name;
        if n.is_empty()
            || n.len() > 40
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            bail!("testbed name {n:?}: use 1..40 letters, digits, '-', '_' or '.'");
        }
        if self.hosts < 2 || self.hosts > 64 {
            bail!("testbed needs 2..64 hosts, got {}", self.hosts);
        }
        if self.rates.is_empty() || self.rates.len() > 64 {
            bail!("testbed needs 1..64 rails, got {}", self.rates.len());
        }
        let pairs = self.hosts * (self.hosts - 1) / 2;
        if pairs * self.rails() > 512 {
            bail!(
                "{} hosts x {} rails needs {} subnets; 198.18.0.0/15 holds 512 /24s",
                self.hosts,
                self.rails(),
                pairs * self.rails()
            );
        }
        if !(576..=65000).contains(&self.mtu) {
            bail!("MTU {} out of range 576..65000", self.mtu);
        }
        Ok(())
    }
}

/// Runs a command and returns its output; a failure carries the command line and its stderr.
pub fn run(cmd: &mut Command) -> Result<Output> {
    let line = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow::anyhow!(
                "{line}: program not found ({e}); the testbed needs iproute2 (`ip`, `tc`)"
            )
        } else {
            anyhow::anyhow!("{line}: {e}")
        }
    })?;
    if !out.status.success() {
        bail!(
            "{line} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

fn ip(args: &[&str]) -> Result<Output> {
    run(Command::new("ip").args(args))
}

fn tc(args: &[&str]) -> Result<Output> {
    run(Command::new("tc").args(args))
}

/// Names of all network namespaces (`ip netns list`).
pub fn list_netns() -> Result<Vec<String>> {
    let out = ip(&["netns", "list"])?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// Checks that namespaces can be made here (root, `ip` present, netns permitted) by creating
/// and deleting a probe namespace. The error says why not, for tests to print when skipping.
pub fn probe() -> Result<()> {
    let euid = rustix::process::geteuid().as_raw();
    if euid != 0 {
        bail!("network namespaces need root (euid is {euid})");
    }
    // Unique per call: tests probe from parallel threads of one process.
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let name = format!(
        "braid-probe-{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    ip(&["netns", "add", &name]).context("cannot create a network namespace")?;
    ip(&["netns", "del", &name]).context("cannot delete the probe namespace")?;
    Ok(())
}

fn state_dir() -> PathBuf {
    PathBuf::from("/run/braid")
}

fn state_path(name: &str) -> PathBuf {
    state_dir().join(format!("testbed-{name}.json"))
}

/// Namespace name of host `i` of testbed `name`.
pub fn ns_name(name: &str, i: usize) -> String {
    format!("{name}-h{i}")
}

/// A standing testbed. Dropping it removes the namespaces if this guard made them.
#[derive(Debug)]
pub struct Testbed {
    spec: TestbedSpec,
    owned: bool,
}

impl Testbed {
    /// Brings the testbed up (or reuses an identical one); see the module docs.
    pub fn up(spec: &TestbedSpec) -> Result<Testbed> {
        spec.validate()?;
        let existing = list_netns()?;
        let ours: Vec<&String> = existing
            .iter()
            .filter(|n| is_host_ns(&spec.name, n))
            .collect();
        if !ours.is_empty() {
            let recorded: Option<TestbedSpec> = fs::read(state_path(&spec.name))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            match recorded {
                Some(r)
                    if r == *spec
                        && (0..spec.hosts).all(|i| existing.contains(&ns_name(&spec.name, i))) =>
                {
                    tracing::info!(name = %spec.name, "reusing the existing identical testbed");
                    return Ok(Testbed {
                        spec: spec.clone(),
                        owned: false,
                    });
                }
                Some(r) => bail!(
                    "a testbed named {:?} already exists with a different shape ({} hosts, rails {:?}, MTU {}); \
                     run `braid testbed down --name {}` first",
                    spec.name,
                    r.hosts,
                    r.rates.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
                    r.mtu,
                    spec.name
                ),
                None => bail!(
                    "namespaces {:?} exist but no testbed record {} does; remove them with `braid testbed down --name {}`",
                    ours,
                    state_path(&spec.name).display(),
                    spec.name
                ),
            }
        }
        // From here on the guard owns whatever exists, so an error half-way tears it down.
        let tb = Testbed {
            spec: spec.clone(),
            owned: true,
        };
        owned_names().push(spec.name.clone());
        tb.build()
            .with_context(|| format!("bringing up testbed {:?}", spec.name))?;
        Ok(tb)
    }

    fn build(&self) -> Result<()> {
        let s = &self.spec;
        for h in 0..s.hosts {
            let ns = self.host_ns(h);
            ip(&["netns", "add", &ns]).with_context(|| {
                format!("cannot create network namespace {ns} (are you root? is netns permitted?)")
            })?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        let mtu = s.mtu.to_string();
        for (a, b) in self.pairs() {
            for r in 0..s.rails() {
                let (nsa, nsb) = (self.host_ns(a), self.host_ns(b));
                let (ia, ib) = (ifname(b, r), ifname(a, r));
                ip(&[
                    "-n", &nsa, "link", "add", &ia, "mtu", &mtu, "type", "veth", "peer", "name",
                    &ib, "netns", &nsb, "mtu", &mtu,
                ])?;
                let (aa, ab) = self.link_addrs(a, b, r);
                for (ns, ifn, addr) in [(&nsa, &ia, aa), (&nsb, &ib, ab)] {
                    ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", ifn])?;
                    if !s.unshaped {
                        shape(ns, ifn, s.rates[r])?;
                    }
                    ip(&["-n", ns, "link", "set", ifn, "up"])?;
                }
            }
        }
        fs::create_dir_all(state_dir()).context("creating /run/braid")?;
        fs::write(state_path(&s.name), serde_json::to_vec_pretty(s)?)
            .context("writing the testbed record")?;
        Ok(())
    }

    /// Opens a standing testbed by name from its record (for `status` and `down`); the
    /// returned guard does not remove it on drop.
    pub fn open(name: &str) -> Result<Testbed> {
        let p = state_path(name);
        let b = fs::read(&p)
            .with_context(|| format!("no testbed named {name:?} (no record {})", p.display()))?;
        let spec: TestbedSpec =
            serde_json::from_slice(&b).with_context(|| format!("bad record {}", p.display()))?;
        Ok(Testbed { spec, owned: false })
    }

    /// Removes the testbed named `name`: every namespace `NAME-h<i>` and its record. Returns the
    /// namespaces removed. Deleting a namespace deletes its veth ends and qdiscs with it.
    pub fn down_by_name(name: &str) -> Result<Vec<String>> {
        let mut removed = Vec::new();
        let mut errors = Vec::new();
        for ns in list_netns()?.into_iter().filter(|n| is_host_ns(name, n)) {
            match ip(&["netns", "del", &ns]) {
                Ok(_) => removed.push(ns),
                Err(e) => errors.push(e.to_string()),
            }
        }
        let _ = fs::remove_file(state_path(name));
        if !errors.is_empty() {
            bail!("removing testbed {name:?}: {}", errors.join("; "));
        }
        Ok(removed)
    }

    /// Tears the testbed down now (whether or not this guard made it).
    pub fn down(mut self) -> Result<Vec<String>> {
        self.owned = false;
        Self::down_by_name(&self.spec.name)
    }

    /// Keeps the testbed standing after this guard is dropped.
    pub fn persist(mut self) {
        self.owned = false;
        owned_names().retain(|n| *n != self.spec.name);
    }

    /// Whether dropping this guard removes the testbed.
    pub fn owned(&self) -> bool {
        self.owned
    }

    /// The spec this testbed was made from.
    pub fn spec(&self) -> &TestbedSpec {
        &self.spec
    }

    /// Namespace of host `i`.
    pub fn host_ns(&self, i: usize) -> String {
        ns_name(&self.spec.name, i)
    }

    /// Number of rails per host pair.
    pub fn rails(&self) -> usize {
        self.spec.rails()
    }

    /// Shaped rate of rail `r` in bytes per second.
    pub fn rail_rate_bytes(&self, r: usize) -> u64 {
        self.spec.rates[r].bytes_per_s()
    }

    /// Shaped rates of all rails in bytes per second.
    pub fn rail_rates_bytes(&self) -> Vec<u64> {
        self.spec.rates.iter().map(Rate::bytes_per_s).collect()
    }

    fn pairs(&self) -> Vec<(usize, usize)> {
        let n = self.spec.hosts;
        (0..n)
            .flat_map(|a| (a + 1..n).map(move |b| (a, b)))
            .collect()
    }

    fn link_addrs(&self, a: usize, b: usize, r: usize) -> (Ipv4Addr, Ipv4Addr) {
        let (lo, hi) = (a.min(b), a.max(b));
        let p = self
            .pairs()
            .iter()
            .position(|&x| x == (lo, hi))
            .expect("valid pair");
        let i = p * self.rails() + r;
        let (o2, o3) = ((18 + i / 256) as u8, (i % 256) as u8);
        (
            Ipv4Addr::new(198, o2, o3, a as u8 + 1),
            Ipv4Addr::new(198, o2, o3, b as u8 + 1),
        )
    }

    /// `(address of host_a, address of host_b)` on each rail between the two hosts, rail 0 first.
    pub fn rail_addrs(&self, host_a: usize, host_b: usize) -> Vec<(Ipv4Addr, Ipv4Addr)> {
        assert!(
            host_a != host_b && host_a < self.spec.hosts && host_b < self.spec.hosts,
            "bad host pair"
        );
        (0..self.rails())
            .map(|r| self.link_addrs(host_a, host_b, r))
            .collect()
    }

    /// A command that runs `program` inside host `i`'s namespace (`ip netns exec NS program`),
    /// with [`harness_secret`] as its cluster secret (`BRAID_SECRET`): the testbed's
    /// addresses are not loopback ones, where braid listens only with a secret.
    pub fn command(&self, host: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec"])
            .arg(self.host_ns(host))
            .arg(program)
            .env("BRAID_SECRET", harness_secret())
            .env_remove("BRAID_SECRET_FILE");
        c
    }

    /// Runs `f` on a new thread that has entered host `host`'s network namespace (`setns`),
    /// so every socket `f` makes lives in that namespace: in-process servers and clients for
    /// tests, without subprocesses. Join the handle to get `f`'s result.
    pub fn spawn_in<T, F>(&self, host: usize, f: F) -> Result<std::thread::JoinHandle<Result<T>>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        spawn_in_netns(&self.host_ns(host), f)
    }

    /// Sets host `host`'s end of rail `rail` (towards every peer) down or up. Taking one end
    /// down also drops the carrier of its veth peer and removes the rail's connected route.
    pub fn set_rail_link(&self, host: usize, rail: usize, up: bool) -> Result<()> {
        if host >= self.spec.hosts || rail >= self.rails() {
            bail!("no rail {rail} on host {host}");
        }
        let ns = self.host_ns(host);
        for peer in (0..self.spec.hosts).filter(|&p| p != host) {
            ip(&[
                "-n",
                &ns,
                "link",
                "set",
                &ifname(peer, rail),
                if up { "up" } else { "down" },
            ])?;
        }
        Ok(())
    }

    /// Makes host `host`'s end of rail `rail` (towards every peer) drop every packet it
    /// sends, silently: its root qdisc becomes `pfifo limit 0`. The link stays up, so
    /// neither end sees a local event: the far end only notices that nothing comes back.
    /// `false` puts the rail's shaping (or no qdisc) back.
    pub fn set_rail_blackhole(&self, host: usize, rail: usize, on: bool) -> Result<()> {
        if host >= self.spec.hosts || rail >= self.rails() {
            bail!("no rail {rail} on host {host}");
        }
        let ns = self.host_ns(host);
        for peer in (0..self.spec.hosts).filter(|&p| p != host) {
            let ifn = ifname(peer, rail);
            if on {
                tc(&[
                    "-n", &ns, "qdisc", "replace", "dev", &ifn, "root", "pfifo", "limit", "0",
                ])?;
            } else if self.spec.unshaped {
                tc(&["-n", &ns, "qdisc", "del", "dev", &ifn, "root"])?;
            } else {
                shape(&ns, &ifn, self.spec.rates[rail])?;
            }
        }
        Ok(())
    }

    /// Human-readable description: hosts, rails, addresses, rates, and the live qdiscs.
    pub fn status(&self) -> Result<String> {
        use std::fmt::Write;
        let s = &self.spec;
        let live = list_netns()?;
        let mut o = String::new();
        writeln!(
            o,
            "testbed {:?}: {} hosts, {} rails per pair, MTU {}",
            s.name,
            s.hosts,
            s.rails(),
            s.mtu
        )?;
        for h in 0..s.hosts {
            let ns = self.host_ns(h);
            writeln!(
                o,
                "  host {h}: namespace {ns} ({})",
                if live.contains(&ns) { "up" } else { "MISSING" }
            )?;
        }
        for (a, b) in self.pairs() {
            for (r, (aa, ab)) in self.rail_addrs(a, b).into_iter().enumerate() {
                let rate = s.rates[r];
                let state = |h: usize, p: usize| -> String {
                    ip(&["-n", &self.host_ns(h), "-br", "link", "show", &ifname(p, r)])
                        .map(|o| {
                            String::from_utf8_lossy(&o.stdout)
                                .split_whitespace()
                                .nth(1)
                                .unwrap_or("?")
                                .to_owned()
                        })
                        .unwrap_or_else(|_| "missing".into())
                };
                let shaping = if s.unshaped {
                    "unshaped (no tbf)".to_string()
                } else {
                    format!(
                        "tbf {rate} = {:.2} MB/s, framing limit {:.2} MB/s",
                        rate.mb_per_s(),
                        framing_limit_mb_s(rate, s.mtu)
                    )
                };
                writeln!(
                    o,
                    "  rail {r} h{a}-h{b}: {aa} ({} {}) <-> {ab} ({} {})  {shaping}",
                    ifname(b, r),
                    state(a, b),
                    ifname(a, r),
                    state(b, a),
                )?;
            }
        }
        Ok(o)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.owned {
            owned_names().retain(|n| *n != self.spec.name);
            match Self::down_by_name(&self.spec.name) {
                Ok(v) => tracing::debug!(?v, "testbed removed"),
                Err(e) => eprintln!(
                    "braid: failed to remove testbed {:?}: {e:#}",
                    self.spec.name
                ),
            }
        }
    }
}

/// Names of the testbeds this process brought up and still owns (see [`remove_on_signal`]).
fn owned_names() -> std::sync::MutexGuard<'static, Vec<String>> {
    static OWNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes SIGINT, SIGTERM and SIGHUP remove every testbed this process owns before it ends
/// (exit status 128 + the signal), as dropping the guards would: a benchmark stopped half-way
/// leaves no namespaces behind. For commands with no signal handling of their own; the
/// children they confined to the namespaces die with them (`confine_child`).
pub fn remove_on_signal() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing signal handlers")?;
    std::thread::Builder::new()
        .name("braid-testbed-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let names = std::mem::take(&mut *owned_names());
                for name in names {
                    match Testbed::down_by_name(&name) {
                        Ok(_) => eprintln!("braid: signal {sig}: removed testbed {name:?}"),
                        Err(e) => {
                            eprintln!("braid: signal {sig}: removing testbed {name:?}: {e:#}")
                        }
                    }
                }
                std::process::exit(128 + sig);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Prepares `cmd` so that its child enters the named network namespace (`None`: it stays in
/// the caller's) and is killed when the process that spawns it dies: a launcher's children
/// never outlive it. The namespace is opened now; the descriptor lives as long as `cmd`.
pub fn confine_child(cmd: &mut Command, netns: Option<&str>) -> Result<()> {
    use std::os::fd::{AsFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let ns: Option<OwnedFd> = match netns {
        Some(ns) => {
            let path = format!("/run/netns/{ns}");
            Some(
                fs::File::open(&path)
                    .with_context(|| format!("opening {path}"))?
                    .into(),
            )
        }
        None => None,
    };
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and makes only
    // async-signal-safe system calls (prctl, getppid, setns), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::other("the launcher is gone"));
            }
            if let Some(fd) = &ns {
                rustix::thread::move_into_link_name_space(
                    fd.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )?;
            }
            Ok(())
        });
    }
    Ok(())
}

/// Runs `f` on a new thread inside the named network namespace (see [`Testbed::spawn_in`]).
pub fn spawn_in_netns<T, F>(ns: &str, f: F) -> Result<std::thread::JoinHandle<Result<T>>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    use std::os::fd::AsFd;
    let path = format!("/run/netns/{ns}");
    let file = fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    let ns = ns.to_owned();
    Ok(std::thread::spawn(move || {
        // CLONE_NEWNET only changes this thread.
        if let Err(e) = rustix::thread::move_into_link_name_space(
            file.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        ) {
            bail!("setns into {ns}: {}", std::io::Error::from(e));
        }
        drop(file);
        Ok(f())
    }))
}

/// Shapes device `ifn` of namespace `ns` to `rate` (see the module docs for the figures).
fn shape(ns: &str, ifn: &str, rate: Rate) -> Result<()> {
    tc(&[
        "-n",
        ns,
        "qdisc",
        "replace",
        "dev",
        ifn,
        "root",
        "tbf",
        "rate",
        &rate.tc_arg(),
        "burst",
        "256kb",
        "latency",
        "5ms",
    ])?;
    let segs = gso_segs_for(rate).to_string();
    ip(&["-n", ns, "link", "set", "dev", ifn, "gso_max_segs", &segs])?;
    Ok(())
}

/// Most TCP segments per GSO packet on a rail of `rate`: as many as it sends in 1 ms (at
/// least one). tbf releases a GSO packet whole once the bucket holds its size, where a NIC
/// puts its segments on the wire one by one: at 500 kbit/s a 23-segment packet left after
/// 0.55 s with nothing before it, and the peer, hearing nothing (its acknowledgements
/// waiting behind it too), gave a live rail up. From 1 Gbit/s on the cap (82) is above
/// what TCP builds (64 KiB: 45 segments), so fast rails are as before.
fn gso_segs_for(rate: Rate) -> u64 {
    (rate.bytes_per_s() / 1000 / 1514).clamp(1, 65535)
}

fn ifname(peer: usize, rail: usize) -> String {
    format!("p{peer}r{rail}")
}

fn is_host_ns(name: &str, ns: &str) -> bool {
    ns.strip_prefix(name)
        .and_then(|rest| rest.strip_prefix("-h"))
        .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
}

/// TCP goodput ceiling of a rail shaped to `rate` at `mtu`, in MB/s (10^6 bytes): tbf counts
/// the 14-byte Ethernet header, and TCP/IP with timestamps uses 52 bytes of each MTU.
pub fn framing_limit_mb_s(rate: Rate, mtu: u32) -> f64 {
    let payload = mtu as f64 - 52.0;
    rate.mb_per_s() * payload / (mtu as f64 + 14.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_packets_hold_a_millisecond_of_the_rate() {
        assert_eq!(gso_segs_for(Rate::from_bits(500_000)), 1);
        assert_eq!(gso_segs_for(Rate::from_bits(100_000_000)), 8);
        assert_eq!(gso_segs_for(Rate::from_bits(1_000_000_000)), 82);
    }

    #[test]
    fn addressing_two_hosts() {
        let tb = Testbed {
            spec: TestbedSpec::new("x", 4, Rate::from_bits(1_000_000_000)),
            owned: false,
        };
        let a = tb.rail_addrs(0, 1);
        assert_eq!(
            a[0],
            (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2))
        );
        assert_eq!(
            a[3],
            (Ipv4Addr::new(198, 18, 3, 1), Ipv4Addr::new(198, 18, 3, 2))
        );
        assert_eq!(
            tb.rail_addrs(1, 0)[2],
            (Ipv4Addr::new(198, 18, 2, 2), Ipv4Addr::new(198, 18, 2, 1))
        );
        assert_eq!(tb.rail_rate_bytes(0), 125_000_000);
    }

    #[test]
    fn addressing_many_hosts_stays_in_range() {
        let mut spec = TestbedSpec::new("x", 16, Rate::from_bits(1_000_000_000));
        spec.hosts = 8;
        spec.validate().unwrap();
        let tb = Testbed { spec, owned: false };
        let mut seen = std::collections::HashSet::new();
        for a in 0..8 {
            for b in a + 1..8 {
                for (x, y) in tb.rail_addrs(a, b) {
                    let o = x.octets();
                    assert!(o[0] == 198 && (o[1] == 18 || o[1] == 19));
                    assert_eq!(o[3] as usize, a + 1);
                    assert_eq!(y.octets()[3] as usize, b + 1);
                    assert!(seen.insert([o[1], o[2]]), "subnet reused");
                }
            }
        }
        assert_eq!(seen.len(), 28 * 16);
    }

    #[test]
    fn names_and_limits() {
        assert!(is_host_ns("braid", "braid-h0"));
        assert!(is_host_ns("braid", "braid-h12"));
        assert!(!is_host_ns("braid", "braid-test-1-h0"));
        assert!(!is_host_ns("braid", "braid-hx"));
        assert!(
            TestbedSpec::new("bad name", 1, Rate::from_bits(1_000_000))
                .validate()
                .is_err()
        );
        let l = framing_limit_mb_s(Rate::from_bits(1_000_000_000), 1500);
        assert!((l - 119.55).abs() < 0.01, "{l}");
        let l9 = framing_limit_mb_s(Rate::from_bits(1_000_000_000), 9000);
        assert!((l9 - 124.08).abs() < 0.01, "{l9}");
    }
}
