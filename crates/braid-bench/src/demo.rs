//! `braid demo`: the seed's trunking experiment on the emulated cluster.
//!
//! Brings up a testbed, runs each measurement as a server subprocess in host 1 and a client
//! subprocess in host 0 (both the current executable, under `ip netns exec`), tears the
//! testbed down (the guard also does so on error or Ctrl-C), and prints the table: for 1..N
//! NICs one plain TCP stream, N parallel TCP streams, trunking and braid RMA write, against
//! the shaped rate and the TCP framing limit.
//!
//! The rma column runs `braid bench server` / `braid bench write` (see [`Runner::run_rma`]); while
//! `bench` does not exist its cells print "n/a" with the error.
//!
//! Where namespaces cannot be made, the same table runs on loopback rails 127.0.0.1..N,
//! unshaped; efficiency is then relative to N × the 1-stream TCP goodput.

use std::fs;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::report::{Report, Row};
use braid_testbed::parse::{RailSpec, Rate, format_addrs, format_rails};
use braid_testbed::testbed::{self, Testbed, TestbedSpec, framing_limit_mb_s};

/// Options of `braid demo`.
#[derive(Debug, Clone)]
pub struct DemoOpts {
    /// Rate of each rail (its length is the rail count).
    pub rates: Vec<Rate>,
    /// MTU of the rails.
    pub mtu: u32,
    /// Duration of each measurement.
    pub duration: Duration,
    /// Message size of the table.
    pub size: usize,
    /// Extra sizes for the size chart (trunking and rma).
    pub sizes: Vec<usize>,
    /// Where to write `{"rows": [...]}`.
    pub json: Option<PathBuf>,
    /// Where to write the SVG chart.
    pub chart: PathBuf,
    /// Use loopback rails even where namespaces work.
    pub loopback: bool,
    /// Testbed rails without tbf (`--rate none`): the CPUs are the limit, as on 10-100 GbE
    /// NICs; efficiency is then relative to rails x the 1-stream TCP goodput.
    pub unshaped: bool,
}

/// One measurement's figures, as read from a client's JSON.
#[derive(Debug, Clone, Deserialize)]
pub struct Measurement {
    /// Message size.
    pub size: usize,
    /// Messages moved.
    #[serde(default)]
    pub iterations: u64,
    /// Goodput in MB/s.
    pub bw_mb_s: f64,
    /// Messages per second.
    #[serde(default)]
    pub msg_rate: Option<f64>,
    /// Client CPU s per GB.
    #[serde(default)]
    pub client_cpu_s_per_gb: Option<f64>,
    /// Server CPU s per GB.
    #[serde(default)]
    pub server_cpu_s_per_gb: Option<f64>,
}

/// Parses a client's JSON: one object, or `{"results": [...]}` (the element of `size` is
/// taken, else the last).
pub fn parse_measurement(text: &str, size: usize) -> Result<Measurement> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).context("client JSON")?;
    let obj = match v.get("results").and_then(|r| r.as_array()) {
        Some(arr) => arr
            .iter()
            .find(|e| e.get("size").and_then(|s| s.as_u64()) == Some(size as u64))
            .or(arr.last())
            .cloned()
            .context("empty \"results\"")?,
        None => v,
    };
    serde_json::from_value(obj).context("client JSON lacks size/bw_mb_s")
}

/// Set by SIGINT/SIGTERM once [`install_signal_flag`] has run.
static INTERRUPTED: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// Turns SIGINT/SIGTERM into a flag the demo polls, so it unwinds and the testbed guard
/// removes the namespaces instead of the process dying with them standing.
fn install_signal_flag() {
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // As signal(2) did: a failure leaves the default action (the demo then just dies).
        let _ = signal_hook::flag::register(sig, Arc::clone(&INTERRUPTED));
    }
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Where the measurements run.
enum Env {
    Netns(Testbed),
    Loopback,
}

impl Env {
    fn command(&self, host: usize, exe: &Path) -> Command {
        match self {
            Env::Netns(tb) => tb.command(host, exe),
            Env::Loopback => {
                // The demo measures rails, not memory: processes on one host would otherwise
                // move their rails onto shared-memory rings (braid::RailTransport).
                let mut c = Command::new(exe);
                c.env(braid::TRANSPORT_ENV, "tcp");
                c
            }
        }
    }

    /// (client rails, server listen addresses) for `k` rails on `port`.
    fn rails(&self, k: usize, port: u16) -> (Vec<RailSpec>, Vec<SocketAddrV4>) {
        let pairs: Vec<(Ipv4Addr, Ipv4Addr)> = match self {
            Env::Netns(tb) => tb.rail_addrs(0, 1).into_iter().take(k).collect(),
            Env::Loopback => (0..k)
                .map(|r| {
                    (
                        Ipv4Addr::new(127, 0, 0, r as u8 + 1),
                        Ipv4Addr::new(127, 0, 0, r as u8 + 1),
                    )
                })
                .collect(),
        };
        let listen: Vec<SocketAddrV4> = pairs
            .iter()
            .map(|&(_, b)| SocketAddrV4::new(b, port))
            .collect();
        let rails = pairs
            .iter()
            .zip(&listen)
            .map(|(&(a, _), &remote)| RailSpec { local: a, remote })
            .collect();
        (rails, listen)
    }
}

/// Context shared by the measurements of one demo run.
pub struct Runner<'a> {
    env: &'a Env,
    exe: PathBuf,
    dir: PathBuf,
    duration: Duration,
    next_port: u16,
}

fn kill(child: &mut Child) {
    // Only our own child, by pid.
    let _ = child.kill();
    let _ = child.wait();
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(st);
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            kill(child);
            bail!("interrupted");
        }
        if Instant::now() >= deadline {
            kill(child);
            bail!("timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether `/proc/PID/net/tcp` (the socket table of the process's network namespace) shows
/// a listener on every address.
fn listening(pid: u32, addrs: &[SocketAddrV4]) -> bool {
    let Ok(t) = fs::read_to_string(format!("/proc/{pid}/net/tcp")) else {
        return false;
    };
    let mut l = Vec::new();
    for line in t.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 3
            && f[3] == "0A"
            && let Some((ip, port)) = f[1].split_once(':')
            && let (Ok(ip), Ok(port)) = (u32::from_str_radix(ip, 16), u16::from_str_radix(port, 16))
        {
            // The kernel prints the address as a native-endian word of network-order bytes.
            l.push(SocketAddrV4::new(Ipv4Addr::from(u32::from_be(ip)), port));
        }
    }
    addrs.iter().all(|a| {
        l.iter()
            .any(|x| x == a || (x.port() == a.port() && x.ip().is_unspecified()))
    })
}

fn tail(path: &Path) -> String {
    let s = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

impl Runner<'_> {
    fn port(&mut self) -> u16 {
        self.next_port = self.next_port.wrapping_add(1).max(1024);
        self.next_port
    }

    /// Runs one server/client pair: `server_args` get `--listen ADDRS`, `client_args` get
    /// `--rails ... -s SIZE -D SECS --json FILE`.
    fn pair(
        &mut self,
        tag: &str,
        server_args: &[&str],
        client_args: &[&str],
        k: usize,
        size: usize,
    ) -> Result<Measurement> {
        check_interrupt()?;
        let port = self.port();
        let (rails, listen) = self.env.rails(k, port);
        let json = self.dir.join(format!("{tag}-{k}-{size}.json"));
        let serr = self.dir.join(format!("{tag}-{k}-{size}.server.log"));
        let cerr = self.dir.join(format!("{tag}-{k}-{size}.client.log"));
        let _ = fs::remove_file(&json);
        let mut server = self
            .env
            .command(1, &self.exe)
            .args(server_args)
            .args(["--listen", &format_addrs(&listen)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&serr)?)
            .spawn()
            .context("spawning the server")?;
        let ready_by = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = server.try_wait()? {
                bail!("server exited ({st}) before listening: {}", tail(&serr));
            }
            if listening(server.id(), &listen) {
                break;
            }
            if Instant::now() >= ready_by || INTERRUPTED.load(Ordering::SeqCst) {
                kill(&mut server);
                bail!(
                    "server not listening on {} within 10 s",
                    format_addrs(&listen)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let secs = format!("{}", self.duration.as_secs_f64());
        let client = self
            .env
            .command(0, &self.exe)
            .args(client_args)
            .args([
                "--rails",
                &format_rails(&rails),
                "-s",
                &size.to_string(),
                "-D",
                &secs,
                "--json",
            ])
            .arg(&json)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&cerr)?)
            .spawn();
        let mut client = match client {
            Ok(c) => c,
            Err(e) => {
                kill(&mut server);
                return Err(e).context("spawning the client");
            }
        };
        let st = match wait_timeout(&mut client, self.duration + Duration::from_secs(40)) {
            Ok(st) => st,
            Err(e) => {
                kill(&mut server);
                return Err(e).context("client");
            }
        };
        let sst = wait_timeout(&mut server, Duration::from_secs(15));
        if !st.success() {
            bail!(
                "client failed ({st}): {} / server: {}",
                tail(&cerr),
                tail(&serr)
            );
        }
        if let Ok(s) = sst
            && !s.success()
        {
            tracing::warn!("server exited with {s}: {}", tail(&serr));
        }
        let text =
            fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?;
        parse_measurement(&text, size)
    }

    /// One plain TCP stream per rail (`braid baseline tcp`).
    pub fn run_tcp(&mut self, k: usize, size: usize) -> Result<Measurement> {
        self.pair(
            "tcp",
            &["baseline", "tcp", "server"],
            &["baseline", "tcp", "client"],
            k,
            size,
        )
    }

    /// Trunking (`braid baseline trunking`).
    pub fn run_trunking(&mut self, k: usize, size: usize) -> Result<Measurement> {
        self.pair(
            "trunking",
            &["baseline", "trunking", "server"],
            &["baseline", "trunking", "client"],
            k,
            size,
        )
    }

    /// braid RMA write with direct placement. Runs, in host 1,
    /// `<exe> bench server --listen A:P,...` and, once it listens, in host 0,
    /// `<exe> bench write --rails L=A:P,... -s SIZE -D SECS --json FILE`, and reads FILE
    /// (one object or `{"results": [...]}` with `size`, `iterations`, `bw_mb_s`, `msg_rate`,
    /// `client_cpu_s_per_gb`, `server_cpu_s_per_gb`).
    ///
    /// The endpoints use braid's chunking and windows, [`rma_depth`] operations in flight and
    /// bench's relaxed placement (its writes go to disjoint slots, so a rail slower than the
    /// others does not hold up the placement of later writes on the fast ones; the windows
    /// are then about 16 ms of each rail's rate and chunks a quarter of that).
    pub fn run_rma(&mut self, k: usize, size: usize) -> Result<Measurement> {
        let depth = rma_depth(size).to_string();
        self.pair(
            "rma",
            &["bench", "server"],
            &["bench", "write", "-q", &depth],
            k,
            size,
        )
    }
}

/// Operations in flight for `size`-byte rma writes, and `braid bench`'s default `-q`: at
/// least 16 MiB in flight, 16 to 1000 operations (bench's limit). Operations no larger than a
/// chunk each go to the first rail whose window has room, so 16 x 64 KiB = 1 MiB in flight ran
/// on one rail of four (111-119 MB/s on 4 x 1 Gbit/s); 256 in flight use all four.
pub fn rma_depth(size: usize) -> usize {
    ((16usize << 20) / size.max(1)).clamp(16, 1000)
}

/// Removes the scratch directory on every exit path (error, Ctrl-C).
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Runs the demo and prints the table.
pub fn run(opts: &DemoOpts) -> Result<Report> {
    install_signal_flag();
    let n = opts.rates.len();
    if n == 0 || n > 250 {
        bail!("--rail-count must be 1..250");
    }
    let exe = std::env::current_exe().context("finding the braid executable")?;
    let dir = std::env::temp_dir().join(format!("braid-demo-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let _dir_guard = RemoveDir(dir.clone());
    let env = if opts.loopback {
        println!(
            "running on loopback rails 127.0.0.1..{n} (--loopback): unshaped; efficiency is relative to {n} x the 1-stream TCP goodput"
        );
        Env::Loopback
    } else {
        match testbed::probe() {
            Ok(()) => {
                let spec = TestbedSpec {
                    name: format!("braid-demo-{}", std::process::id()),
                    hosts: 2,
                    rates: opts.rates.clone(),
                    mtu: opts.mtu,
                    unshaped: opts.unshaped,
                };
                let tb = Testbed::up(&spec)?;
                print!("{}", tb.status()?);
                Env::Netns(tb)
            }
            Err(e) => {
                println!("network namespaces unavailable ({e:#});");
                println!(
                    "running on loopback rails 127.0.0.1..127.0.0.{n} instead: unshaped, so efficiency is relative to rails x the 1-stream TCP goodput"
                );
                Env::Loopback
            }
        }
    };
    let netns = matches!(env, Env::Netns(_));
    let shaped = netns && !opts.unshaped;
    // Loopback ports are shared with everything else on the machine: start from a pid-derived
    // base to keep parallel runs apart, below the ephemeral range (32768 and up by default),
    // where a connection's local port could take one first. Namespaces are private.
    let base = if netns {
        18514
    } else {
        20000 + (std::process::id() % 10000) as u16
    };
    let mut runner = Runner {
        env: &env,
        exe,
        dir: dir.clone(),
        duration: opts.duration,
        next_port: base,
    };

    let mut sizes: Vec<usize> = opts.sizes.clone();
    sizes.push(opts.size);
    sizes.sort_unstable();
    sizes.dedup();
    let mut plan: Vec<(&str, usize, usize)> = (1..=n).map(|k| ("tcp", k, opts.size)).collect();
    for mode in ["trunking", "rma"] {
        for &s in &sizes {
            plan.extend((1..=n).map(|k| (mode, k, s)));
        }
    }
    // A bar on a terminal; elsewhere (a pipe, CI's log) a line per measurement.
    let plain = !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let cells = plan.len();
    let pb = indicatif::ProgressBar::new(plan.len() as u64);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .expect("valid template"),
    );
    let mut rows = Vec::new();
    let mut rma_missing: Option<String> = None;
    for (mode, k, size) in plan {
        pb.set_message(format!("{mode} {k} rail(s) {size} B"));
        let res = if mode == "rma"
            && let Some(e) = &rma_missing
        {
            // bench is absent: one failure says so; do not spawn it for every cell.
            Err(anyhow::anyhow!("{e}"))
        } else {
            match mode {
                "tcp" => runner.run_tcp(k, size),
                "trunking" => runner.run_trunking(k, size),
                _ => runner.run_rma(k, size),
            }
        };
        check_interrupt()?;
        let rates: Vec<Rate> = opts.rates[..k].to_vec();
        let shaped_mb_s = shaped.then(|| rates.iter().map(Rate::mb_per_s).sum::<f64>());
        let framing_mb_s = shaped.then(|| {
            rates
                .iter()
                .map(|&r| framing_limit_mb_s(r, opts.mtu))
                .sum::<f64>()
        });
        let mut row = Row {
            rails: k,
            mode: mode.into(),
            mtu: opts.mtu,
            size,
            goodput_mb_s: None,
            shaped_mb_s,
            framing_mb_s,
            efficiency: None,
            msg_rate: None,
            client_cpu_s_per_gb: None,
            server_cpu_s_per_gb: None,
            error: None,
        };
        match res {
            Ok(m) => {
                row.goodput_mb_s = Some(m.bw_mb_s);
                row.msg_rate = m.msg_rate;
                row.client_cpu_s_per_gb = m.client_cpu_s_per_gb;
                row.server_cpu_s_per_gb = m.server_cpu_s_per_gb;
            }
            Err(e) => {
                let msg = format!("{e:#}");
                tracing::debug!("{mode} {k} rails {size} B: {msg}");
                if mode == "rma" && (msg.contains("before listening") || msg.contains("not built"))
                {
                    rma_missing = Some(msg.clone());
                }
                row.error = Some(msg);
            }
        }
        if plain {
            eprintln!(
                "braid demo: {}/{cells} {mode} {k} rail(s) {size} B: {}",
                rows.len() + 1,
                match (&row.goodput_mb_s, &row.error) {
                    (Some(g), _) => format!("{g:.1} MB/s"),
                    (None, Some(e)) => format!("failed: {e}"),
                    (None, None) => "no result".into(),
                }
            );
        }
        rows.push(row);
        pb.inc(1);
    }
    pb.finish_and_clear();
    // Tear down before printing, so the namespaces are gone even if printing fails.
    let testbed_kind = match (netns, shaped) {
        (true, true) => "netns",
        (true, false) => "netns-unshaped",
        _ => "loopback",
    };
    if let Env::Netns(tb) = env {
        let removed = tb.down()?;
        tracing::info!(?removed, "testbed removed");
    }
    let mut report = Report {
        testbed: testbed_kind.into(),
        efficiency_basis: match testbed_kind {
            "netns" => "goodput / sum of the rails' shaped rates".into(),
            "netns-unshaped" => {
                "goodput / (rails x 1-stream TCP goodput), testbed rails without tbf".into()
            }
            _ => "goodput / (rails x 1-stream TCP goodput), loopback is unshaped".into(),
        },
        rail_rates_bit_s: if shaped {
            opts.rates.iter().map(|r| r.bits_per_s).collect()
        } else {
            vec![]
        },
        table_size: opts.size,
        rows,
    };
    report.fill_efficiency();
    println!("{}", report.table());
    if let Some(p) = &opts.json {
        fs::write(p, report.to_json()).with_context(|| format!("writing {}", p.display()))?;
        println!("rows written to {}", p.display());
    }
    if let Some(parent) = opts.chart.parent()
        && !parent.as_os_str().is_empty()
    {
        fs::create_dir_all(parent)?;
    }
    fs::write(&opts.chart, crate::chart::render(&report))
        .with_context(|| format!("writing {}", opts.chart.display()))?;
    println!("chart written to {}", opts.chart.display());
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rma_depth_keeps_16_mib_in_flight() {
        assert_eq!(rma_depth(64 << 10), 256);
        assert_eq!(rma_depth(1 << 20), 16);
        assert_eq!(rma_depth(4 << 20), 16);
        assert_eq!(rma_depth(2), 1000);
    }

    #[test]
    fn measurement_json_forms() {
        let one = r#"{"size":4194304,"iterations":10,"bw_mb_s":470.5,"msg_rate":112.1,"client_cpu_s_per_gb":0.4,"server_cpu_s_per_gb":0.6}"#;
        let m = parse_measurement(one, 4194304).unwrap();
        assert_eq!(m.bw_mb_s, 470.5);
        let many = r#"{"results":[{"size":65536,"bw_mb_s":100.0},{"size":4194304,"bw_mb_s":400.0},{"size":8388608,"bw_mb_s":450.0}]}"#;
        assert_eq!(parse_measurement(many, 4194304).unwrap().bw_mb_s, 400.0);
        assert_eq!(parse_measurement(many, 1).unwrap().bw_mb_s, 450.0);
        assert!(parse_measurement("{}", 1).is_err());
        assert!(parse_measurement(r#"{"results":[]}"#, 1).is_err());
    }

    #[test]
    fn proc_net_tcp_parsing_finds_own_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = match l.local_addr().unwrap() {
            std::net::SocketAddr::V4(a) => a,
            _ => unreachable!(),
        };
        assert!(listening(std::process::id(), &[a]));
        drop(l);
    }
}
