//! `braid`: the command-line front end (run, fs, bench, baseline, demo, soak, testbed).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};

use braid_bench::args::{RailRate, rail_rate};
use braid_bench::baseline::{self, ClientOpts, Mode, ServerOpts};
use braid_bench::{bench, demo};
use braid_testbed::parse::{self, RailSpec, Rate};
use braid_testbed::testbed::{Testbed, TestbedSpec};

// perftest-style benchmarks (braid-bench's bench module). The demo runs, as subprocesses:
//   <exe> bench server --listen A:P[,A:P...]          (in host 1; listens, serves one run, exits)
//   <exe> bench write --rails L=A:P[,...] -s SIZE -D SECS --json FILE   (in host 0)
// FILE: {"results":[...]} with size, iterations, bw_mb_s, msg_rate, client_cpu_s_per_gb,
// server_cpu_s_per_gb (and more).
mod fs_cmd;

#[cfg(test)]
mod cli_check;

/// braid: RMA striped over several Ethernet NICs — launch jobs (run), a remote file
/// service (fs), benchmarks and baselines, the demo, soaks, an emulated testbed.
#[derive(Parser, Debug)]
#[command(name = "braid", version, about, after_help = CONVENTIONS)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The flag vocabulary every subcommand shares, and the exit statuses (`braid --help`).
const CONVENTIONS: &str = "\
Flags mean the same in every subcommand:
  --rail-count N                    how many rails (veth pairs of a testbed)
  --rails LOCAL=REMOTE[:PORT],...   the rails to use, as pairs of addresses
  --listen IP[:PORT],...            where a server listens, one address per rail
  -n, --ranks N                     ranks of a job (braid run only)
  --iters N                         iterations;  -D, --duration SECS  seconds of measurement
  -s, --size BYTES                  K/M/G are powers of 1024;  -q, --depth N  operations in flight
  --timeout SECS                    bound on the whole command (braid run, fs posix-suite)
  --accept-timeout SECS             how long a server waits for a client
  --peer-timeout SECS               silence after which a peer is declared gone
  --poll-spin-us US                 busy-polling before a wait sleeps
  --json FILE                       results as JSON (\"-\": stdout)
  (fs mount's --attr-timeout, --entry-timeout, --negative-timeout are FUSE's cache lifetimes)

Exit status:
  0        success
  1        an error (one line on stderr: `braid: error: ...`) or a failed check
  2        bad usage
  124      braid run: the job's --timeout expired
  128+N    braid run: ended by signal N, or a rank was killed by it
  other    braid run: the exit status of the first rank that failed

Logs: RUST_LOG (default warn,fuser=error) to stderr; colour only when stderr is a terminal.";

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Emulated cluster: network namespaces joined by tbf-shaped veth rails.
    Testbed {
        #[command(subcommand)]
        cmd: TestbedCmd,
    },
    /// Plain TCP and trunking baselines (server and client).
    Baseline {
        /// Which baseline.
        kind: BaselineKind,
        #[command(subcommand)]
        role: Role,
    },
    /// The trunking comparison: tcp, trunking and rma over 1..N shaped rails.
    Demo(DemoArgs),
    /// braid RMA benchmarks (perftest-style: ib_write_bw, ib_write_lat, ...).
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
    },
    /// The remote file service: `fs serve` exports a directory, `fs mount` mounts it (FUSE),
    /// `fs bench` measures it against sshfs, `fs posix-suite` runs pjdfstest on it.
    Fs {
        #[command(subcommand)]
        cmd: FsCmd,
    },
    /// Reliability soak on a testbed it makes itself: a random verified operation mix under a
    /// link flap; or --failover-transfer (goodput before/after a rail's loss); or --kill-peer.
    Soak(braid_bench::soak::SoakArgs),
    /// Launch N ranks of a program (like torchrun): on loopback, or spread over the hosts of
    /// a standing testbed, with BRAID_RANK/SIZE/ROOT/JOB set; output prefixed by `[rank] `.
    /// Exit status: the first failing rank's, 124 on --timeout, 128+N on signal N.
    Run(RunArgs),
    /// What braid sees and would use on this host: interfaces and rail addresses, usable
    /// transports (with why one is not), every BRAID_* setting in effect, versions.
    Info {
        /// Print one JSON object instead of text (to FILE if given; `--json FILE` as
        /// everywhere, bare `--json` is stdout).
        #[arg(long, value_name = "JSON", num_args = 0..=1, default_missing_value = "-")]
        json: Option<PathBuf>,
    },
    /// Internal: the target process of `braid soak --kill-peer`.
    #[command(hide = true)]
    SoakPeer(braid_bench::soak::PeerArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Number of ranks.
    #[arg(short = 'n', long = "ranks", value_name = "N", alias = "np")]
    ranks: usize,
    /// Spread the ranks over this standing testbed's hosts (rank i on host i % K, each
    /// inside its host's network namespace).
    #[arg(long)]
    testbed: Option<String>,
    /// End the job after this many seconds (exit status 124).
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    /// Rendezvous port on rank 0's host (default: a free one).
    #[arg(long)]
    port: Option<u16>,
    /// Job id (default: run-<pid>-<random>).
    #[arg(long)]
    job: Option<String>,
    /// BRAID_RAILS for every rank: its local rail addresses IP[/PREFIX],... (default: each
    /// host's interfaces).
    #[arg(long = "rail-ips", value_name = "IP[/PREFIX],...")]
    rails: Option<String>,
    /// Seconds between SIGTERM and SIGKILL when ending ranks.
    #[arg(long, default_value_t = 5.0)]
    grace: f64,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    program: Vec<std::ffi::OsString>,
}

#[derive(Args, Debug, Clone)]
struct ShapeArgs {
    /// Number of rails (veth pairs) per host pair.
    #[arg(long = "rail-count", value_name = "N", default_value_t = 4)]
    rails: usize,
    /// Rate of every rail (tc units: 1gbit, 250mbit, ...), or `none` for unshaped rails (no
    /// tbf: plain veth, as fast as the CPUs move packets, like a 10-100 GbE NIC).
    #[arg(long, default_value = "1gbit", value_parser = rail_rate)]
    rate: RailRate,
    /// Per-rail rates, overriding --rail-count and --rate (e.g. 1gbit,1gbit,1gbit,250mbit).
    #[arg(long, value_parser = parse::parse_rates)]
    rates: Option<std::vec::Vec<Rate>>,
    /// MTU of every rail.
    #[arg(long, default_value_t = 1500)]
    mtu: u32,
}

impl ShapeArgs {
    /// The rails' rates (with `--rate none`, placeholders that only count rails).
    fn rates(&self) -> Vec<Rate> {
        self.rates.clone().unwrap_or_else(|| {
            vec![self.rate.0.unwrap_or(Rate::from_bits(1_000_000_000)); self.rails]
        })
    }

    /// `--rate none` without `--rates`: no tbf on the rails.
    fn unshaped(&self) -> bool {
        self.rate.0.is_none() && self.rates.is_none()
    }
}

#[derive(Subcommand, Debug)]
enum FsCmd {
    #[command(flatten)]
    Service(fs_cmd::FsCmd),
    /// Sequential and random reads, writes with fsync and a metadata loop through the braid
    /// mount, the braid client library and sshfs on a testbed of its own; JSON with ratios.
    Bench(braid_bench::fsbench::FsBenchArgs),
    /// The external POSIX suite (pjdfstest) on a braid mount over a testbed, beside the same
    /// suite on a bindfs passthrough; exits 1 on a failure neither explains nor the docs list.
    PosixSuite(braid_bench::fsbench::posix::PosixArgs),
}

#[derive(Subcommand, Debug)]
enum TestbedCmd {
    /// Create the namespaces and rails (reuses an identical testbed of the same name).
    Up {
        /// Testbed name; namespaces are NAME-h0, NAME-h1, ...
        #[arg(long, default_value = "braid")]
        name: String,
        /// Number of hosts.
        #[arg(long, default_value_t = 2)]
        hosts: usize,
        #[command(flatten)]
        shape: ShapeArgs,
        /// No tbf on the rails (plain veth, CPU-bound), as `--rate none`; --rate and --rates
        /// then only count rails.
        #[arg(long)]
        unshaped: bool,
    },
    /// Remove the namespaces of a testbed.
    Down {
        /// Testbed name.
        #[arg(long, default_value = "braid")]
        name: String,
    },
    /// Print hosts, rails, addresses and rates.
    Status {
        /// Testbed name.
        #[arg(long, default_value = "braid")]
        name: String,
    },
}

#[derive(ValueEnum, Debug, Clone, Copy)]
enum BaselineKind {
    /// One plain TCP stream per rail.
    Tcp,
    /// Round-robin fragments over all rails, reassembled through a reorder buffer.
    Trunking,
}

#[derive(Subcommand, Debug)]
enum Role {
    /// Serve client runs (by default exactly one) and exit.
    Server {
        /// Addresses to listen on, IP[:PORT] (default port 18515), one per rail.
        #[arg(long, value_name = "IP[:PORT],...", value_parser = parse::parse_addrs)]
        listen: std::vec::Vec<std::net::SocketAddrV4>,
        /// Serve exactly one client run and exit (the default).
        #[arg(long, conflicts_with = "runs")]
        once: bool,
        /// Number of client runs to serve before exiting.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Seconds to wait for a client.
        #[arg(long, value_name = "SECS", default_value_t = 30.0)]
        accept_timeout: f64,
        /// Write the server report(s) as JSON to FILE ("-" for stdout).
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Connect, send for -D seconds, print the result.
    Client {
        /// Rails: LOCAL=REMOTE[:PORT][,...]; several rails = parallel streams / trunking.
        #[arg(long, value_name = "LOCAL=REMOTE[:PORT],...", value_parser = parse::parse_rails)]
        rails: std::vec::Vec<RailSpec>,
        /// Message size (bytes; K/M/G suffixes are powers of 1024).
        #[arg(short = 's', long, default_value = "4M", value_parser = parse::parse_size)]
        size: usize,
        /// Duration in seconds.
        #[arg(short = 'D', long, default_value_t = 3.0)]
        duration: f64,
        /// Stop after this many messages.
        #[arg(long, value_name = "N")]
        iters: Option<u64>,
        /// Trunking fragment size.
        #[arg(long, default_value = "64K", value_parser = parse::parse_size)]
        frag: usize,
        /// Write the result as one JSON line to FILE ("-" for stdout).
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    shape: ShapeArgs,
    /// Seconds per measurement.
    #[arg(short = 'D', long, default_value_t = 2.0)]
    duration: f64,
    /// Message size of the table.
    #[arg(short = 's', long, default_value = "4M", value_parser = parse::parse_size)]
    size: usize,
    /// Message sizes for the size chart (trunking and rma).
    #[arg(long, default_value = "64K,1M,4M", value_parser = parse::parse_sizes)]
    sizes: std::vec::Vec<usize>,
    /// Write {"rows": [...]} to FILE.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the SVG chart to FILE.
    #[arg(long, default_value = "target/braid-demo.svg")]
    chart: PathBuf,
    /// Use unshaped loopback rails even where namespaces work.
    #[arg(long)]
    loopback: bool,
}

fn secs(s: f64, what: &str) -> Result<Duration> {
    if !(s > 0.0 && s <= 86_400.0) {
        bail!("{what} must be between 0 and 86400 seconds");
    }
    Ok(Duration::from_secs_f64(s))
}

fn write_json(path: &PathBuf, value: &impl serde::Serialize) -> Result<()> {
    let line = serde_json::to_string(value)?;
    if path.as_os_str() == "-" {
        println!("{line}");
    } else {
        std::fs::write(path, line + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn baseline_cmd(kind: BaselineKind, role: Role) -> Result<()> {
    let mode = match kind {
        BaselineKind::Tcp => Mode::Tcp,
        BaselineKind::Trunking => Mode::Trunking,
    };
    match role {
        Role::Server {
            listen,
            once,
            runs,
            accept_timeout,
            json,
        } => {
            let runs = if once { 1 } else { runs };
            if runs == 0 || runs > 100_000 {
                bail!("--runs must be 1..100000");
            }
            let ls = baseline::bind(&listen)?;
            let bound: Vec<String> = ls
                .iter()
                .map(|l| {
                    l.local_addr()
                        .map(|a: SocketAddr| a.to_string())
                        .unwrap_or_default()
                })
                .collect();
            eprintln!(
                "braid baseline {} server listening on {}",
                mode.as_str(),
                bound.join(",")
            );
            let opts = ServerOpts {
                listen,
                accept_timeout: secs(accept_timeout, "--accept-timeout")?,
                runs,
            };
            let reports = baseline::serve(mode, &ls, &opts)?;
            for r in &reports {
                eprintln!(
                    "server: {} bytes, {} messages in {:.2} s, {:.3} CPU s ({:.2} CPU s/GB){}",
                    r.bytes,
                    r.messages,
                    r.seconds,
                    r.cpu_s,
                    r.cpu_s / (r.bytes as f64 / 1e9),
                    if r.verified {
                        ", last message verified"
                    } else {
                        ""
                    }
                );
            }
            if let Some(p) = json {
                if reports.len() == 1 {
                    write_json(&p, &reports[0])?;
                } else {
                    write_json(&p, &serde_json::json!({ "results": reports }))?;
                }
            }
        }
        Role::Client {
            rails,
            size,
            duration,
            iters,
            frag,
            json,
        } => {
            let opts = ClientOpts {
                rails,
                size,
                duration: secs(duration, "-D")?,
                max_messages: iters,
                frag,
            };
            let r = match mode {
                Mode::Tcp => baseline::run_tcp_client(&opts)?,
                Mode::Trunking => baseline::run_trunking_client(&opts)?,
            };
            let to_stdout = json.as_ref().is_some_and(|p| p.as_os_str() == "-");
            if !to_stdout {
                println!(
                    "{} {} rail(s) {} B: {:.2} MB/s, {} msgs, {} bytes in {:.3} s; CPU s/GB client {:.3} server {:.3}",
                    mode.as_str(),
                    r.rails,
                    r.size,
                    r.bw_mb_s,
                    r.iterations,
                    r.bytes,
                    r.seconds,
                    r.client_cpu_s_per_gb,
                    r.server_cpu_s_per_gb
                );
            }
            if let Some(p) = json {
                write_json(&p, &r)?;
            }
        }
    }
    Ok(())
}

fn testbed_cmd(cmd: TestbedCmd) -> Result<()> {
    match cmd {
        TestbedCmd::Up {
            name,
            hosts,
            shape,
            unshaped,
        } => {
            braid_testbed::testbed::probe()?;
            let spec = TestbedSpec {
                name,
                hosts,
                rates: shape.rates(),
                mtu: shape.mtu,
                unshaped: unshaped || shape.unshaped(),
            };
            let tb = Testbed::up(&spec)?;
            print!("{}", tb.status()?);
            tb.persist();
        }
        TestbedCmd::Down { name } => {
            let removed = Testbed::down_by_name(&name)?;
            if removed.is_empty() {
                println!("no namespaces of testbed {name:?} found");
            } else {
                println!("removed {}", removed.join(" "));
            }
        }
        TestbedCmd::Status { name } => print!("{}", Testbed::open(&name)?.status()?),
    }
    Ok(())
}

fn main() {
    if let Err(e) = real_main() {
        eprintln!("braid: error: {}", braid_cli::diag::error_line(&e));
        std::process::exit(1);
    }
}

fn real_main() -> Result<()> {
    braid_cli::diag::init_logging();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Testbed { cmd } => testbed_cmd(cmd),
        Cmd::Baseline { kind, role } => baseline_cmd(kind, role),
        Cmd::Demo(a) => {
            braid_testbed::testbed::remove_on_signal()?;
            let opts = demo::DemoOpts {
                rates: a.shape.rates(),
                mtu: a.shape.mtu,
                duration: secs(a.duration, "-D")?,
                size: a.size,
                sizes: a.sizes,
                json: a.json,
                chart: a.chart,
                loopback: a.loopback,
                unshaped: a.shape.unshaped(),
            };
            demo::run(&opts).map(|_| ())
        }
        Cmd::Bench { cmd } => bench::run(cmd),
        Cmd::Fs {
            cmd: FsCmd::Service(c),
        } => fs_cmd::run(c),
        Cmd::Fs {
            cmd: FsCmd::Bench(a),
        } => braid_bench::fsbench::run(&a).map(|_| ()),
        Cmd::Fs {
            cmd: FsCmd::PosixSuite(a),
        } => {
            if !braid_bench::fsbench::posix::run(&a)?.ok() {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Soak(a) => {
            braid_testbed::testbed::remove_on_signal()?;
            braid_bench::soak::main(&a)
        }
        Cmd::SoakPeer(a) => braid_bench::soak::peer_main(&a),
        Cmd::Info { json } => {
            let info = braid_cli::info::gather()?;
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&info)?;
                if path.as_os_str() == "-" {
                    println!("{text}");
                } else {
                    std::fs::write(&path, text + "\n")
                        .with_context(|| format!("writing {}", path.display()))?;
                }
            } else {
                print!("{}", braid_cli::info::render(&info));
            }
            Ok(())
        }
        Cmd::Run(a) => {
            let opts = braid_cli::run::RunOpts {
                ranks: a.ranks,
                testbed: a.testbed,
                timeout: a.timeout.map(|t| secs(t, "--timeout")).transpose()?,
                port: a.port,
                job: a.job,
                rails: a.rails,
                grace: secs(a.grace, "--grace")?,
                program: a.program,
            };
            let code = braid_cli::run::run(&opts)?;
            std::process::exit(code);
        }
    }
}
