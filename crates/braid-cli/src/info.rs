//! `braid info`: what braid sees and would use on this host, like `fi_info` or `ucx_info`:
//! the interfaces and the rail addresses a rank here offers, the transports and kernel
//! features that work (with the reason when one does not), every setting read from the
//! environment with its value or default, and the versions. Everything is read from the
//! running system and from the libraries' own parsers; `--json` prints the same as one
//! object.

use std::fmt::Write as _;

use serde::Serialize;

mod config;
pub mod probe;

pub use config::TEST_ONLY;
pub use probe::{Facility, Interface};

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Info {
    /// Versions of braid and its wire protocol.
    pub versions: Versions,
    /// This host and process.
    pub host: Host,
    /// Every interface of this network namespace.
    pub interfaces: Vec<Interface>,
    /// The rail addresses a rank here offers its peers.
    pub rails: Rails,
    /// Transports of braid's rails: `tcp`, `shm`, `af_xdp`.
    pub transports: Vec<Facility>,
    /// Kernel features other parts use: `io_uring`, `userfaultfd`, `fuse`.
    pub features: Vec<Facility>,
    /// Every environment variable braid reads, with its value or default.
    pub config: Vec<Setting>,
}

/// Versions.
#[derive(Debug, Serialize)]
pub struct Versions {
    /// braid's version (the library and this command are built together).
    pub braid: &'static str,
    /// The wire protocol's version byte (every frame header carries it).
    pub protocol: u8,
}

/// This host and process.
#[derive(Debug, Serialize)]
pub struct Host {
    /// Host name.
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Effective user id 0.
    pub root: bool,
    /// Capabilities braid's features need that this process has.
    pub capabilities: Vec<&'static str>,
}

/// The rail addresses a rank here offers.
#[derive(Debug, Serialize)]
pub struct Rails {
    /// `interfaces` (every non-loopback IPv4 address) or `BRAID_RAILS`.
    pub source: &'static str,
    /// The addresses, each with the interface that holds it.
    pub addresses: Vec<Rail>,
    /// Why there are none: the reason `BRAID_RAILS` or the interfaces could not be read.
    pub refused: Option<String>,
    /// How a pair of ranks picks its rails from these.
    pub rule: &'static str,
}

/// One rail address.
#[derive(Debug, Serialize)]
pub struct Rail {
    /// `IP/PREFIX`.
    pub address: String,
    /// The interface holding it, if any here does.
    pub interface: Option<String>,
}

/// One environment variable.
#[derive(Debug, Serialize)]
pub struct Setting {
    /// Its name.
    pub name: &'static str,
    /// What reads it.
    pub read_by: &'static str,
    /// Its value when set (a secret shows as `(set)`).
    pub value: Option<String>,
    /// The default when unset.
    pub default: String,
    /// What the reader makes of it here: the value in effect, or why it is refused.
    pub effective: String,
    /// What it means.
    pub meaning: &'static str,
}

fn var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// The rail addresses a rank here offers (`braid_boot`'s own choice, `BRAID_RAILS` parsed by
/// its own parser: a lookup that answers that variable alone).
fn rails(ifs: &[Interface]) -> Rails {
    let only_rails = |k: &str| var(k).filter(|_| k == braid_boot::RAILS_ENV);
    let picked = braid_boot::LaunchEnv::from_vars(only_rails)
        .map_err(|e| e.to_string())
        .and_then(|env| match env.rails {
            Some(specs) => braid_boot::addrs::resolve_rail_specs(&specs)
                .map(|a| ("BRAID_RAILS", a))
                .map_err(|e| e.to_string()),
            None => braid_boot::addrs::interface_addrs(false)
                .map(|a| ("interfaces", a))
                .map_err(|e| e.to_string()),
        });
    let (source, addrs, refused) = match picked {
        Ok((source, addrs)) => (source, addrs, None),
        Err(e) => ("BRAID_RAILS", Vec::new(), Some(e)),
    };
    let addresses = addrs
        .iter()
        .map(|a| Rail {
            address: a.to_string(),
            interface: ifs
                .iter()
                .find(|i| i.addresses.contains(&a.to_string()))
                .map(|i| i.name.clone()),
        })
        .collect();
    Rails {
        source,
        addresses,
        refused,
        rule: "two ranks use one rail per pair of addresses in a common subnet; ranks in one \
               kernel and network namespace use one loopback rail (moved to shared memory)",
    }
}

/// Gathers the report.
pub fn gather() -> anyhow::Result<Info> {
    let interfaces = probe::interfaces()?;
    let rails = rails(&interfaces);
    let eff = probe::effective_caps();
    let user_faults_only = braid_dsm::DsmConfig::from_env()
        .map(|c| c.user_faults_only)
        .unwrap_or(false);
    Ok(Info {
        versions: Versions {
            braid: env!("CARGO_PKG_VERSION"),
            protocol: braid_proto::wire::PROTOCOL_VERSION,
        },
        host: Host {
            hostname: braid_boot::addrs::hostname(),
            kernel: probe::kernel_release(),
            // SAFETY: geteuid has no preconditions.
            root: unsafe { libc::geteuid() } == 0,
            capabilities: probe::cap_names(eff),
        },
        transports: vec![probe::tcp(), probe::shm(), probe::af_xdp(&interfaces)],
        features: vec![
            probe::io_uring(),
            probe::userfaultfd(user_faults_only),
            probe::fuse(),
        ],
        interfaces,
        rails,
        config: config::settings(),
    })
}

/// The report as text.
pub fn render(info: &Info) -> String {
    let mut s = String::new();
    let v = &info.versions;
    let h = &info.host;
    let _ = writeln!(
        s,
        "braid {} (wire protocol version {})",
        v.braid, v.protocol
    );
    let caps = if h.capabilities.is_empty() {
        "none".to_string()
    } else {
        h.capabilities.join(" ")
    };
    let _ = writeln!(
        s,
        "host {}, Linux {}, {}; capabilities: {caps}",
        h.hostname,
        h.kernel,
        if h.root { "root" } else { "not root" }
    );
    let _ = writeln!(s, "\ninterfaces:");
    for i in &info.interfaces {
        let state = match (i.up, i.running) {
            (true, true) => "up",
            (true, false) => "up, no carrier",
            _ => "down",
        };
        let mtu = i.mtu.map(|m| format!("mtu {m}")).unwrap_or_default();
        let speed = i
            .speed_mbps
            .map(|m| format!(", {m} Mbit/s"))
            .unwrap_or_default();
        let driver = i
            .driver
            .as_deref()
            .map(|d| format!(", driver {d}"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "  {:<12} #{:<3} {state}, {mtu}{speed}{driver}",
            i.name, i.index
        );
        for a in &i.addresses {
            let _ = writeln!(s, "      {a}");
        }
    }
    let r = &info.rails;
    let _ = writeln!(
        s,
        "\nrails offered ({} address(es), from {}):",
        r.addresses.len(),
        r.source
    );
    for a in &r.addresses {
        let _ = writeln!(
            s,
            "  {:<20} {}",
            a.address,
            a.interface.as_deref().unwrap_or("(no interface here)")
        );
    }
    if let Some(e) = &r.refused {
        let _ = writeln!(s, "  none: {e}");
    }
    let _ = writeln!(s, "  ({})", r.rule);
    for (title, list) in [
        ("transports", &info.transports),
        ("kernel features", &info.features),
    ] {
        let _ = writeln!(s, "\n{title}:");
        for f in list {
            let _ = writeln!(
                s,
                "  {:<12} {:<4} {} [{}]",
                f.name,
                if f.usable { "yes" } else { "no" },
                f.detail,
                f.used_for
            );
        }
    }
    let _ = writeln!(
        s,
        "\nconfiguration (environment; value in effect after ->):"
    );
    let mut reader = "";
    for c in &info.config {
        if c.read_by != reader {
            reader = c.read_by;
            let _ = writeln!(s, "  {reader}:");
        }
        let shown = match &c.value {
            Some(v) => format!("{}={v}", c.name),
            None => format!("{} unset (default {})", c.name, c.default),
        };
        let _ = writeln!(s, "    {shown} -> {}\n        {}", c.effective, c.meaning);
    }
    s
}
