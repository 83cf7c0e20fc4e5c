//! `braid fs bench`: the remote file service against sshfs, on an emulated testbed it makes
//! itself, in one run.
//!
//! For each network (the shaped `RAILS x RATE` testbed and an unshaped one) the bench starts
//! the file services between host 1 (server, exporting a directory on the machine's real
//! disk) and host 0 (client), then runs every workload on every system in turn, so load
//! changes on a shared machine hit all of them:
//!
//! - systems: `local` (the exported directory itself: the server's disk, the ceiling of
//!   writes with fsync), `sshfs` (`sshfs -o cache=no` over one ssh connection on rail 0, sshd
//!   of our own in the server's namespace), `braid-mount` and `braid-lib` over 1 and N rails;
//! - workloads: `seq-read` (`dd bs=1M` of a 1 GiB file, client cache dropped before),
//!   `seq-write` (`dd bs=1M conv=fsync`, data on the server's disk when it ends), `rand-read`
//!   (4 KiB `pread`s at random aligned offsets, one at a time, each block checked) and
//!   `metadata` (create + write 1 B + close + stat + unlink, one file after another, in this
//!   process).
//!
//! CPU is counted per side from `/proc` (application, client processes, server processes) and
//! for the whole machine (`/proc/stat`, less the background rate measured before the run).
//! Rows carry ratios against sshfs of the same round; the goals of issue 11 are judged on the
//! medians over rounds.

pub mod braidfs;
pub mod libclient;
pub mod mounts;
pub mod pjd_c;
pub mod posix;
pub mod procs;
pub mod rows;
pub mod sshfs;
pub mod systems;
pub mod workload;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;

use braid_testbed::parse;
use braid_testbed::testbed::{self, Testbed, TestbedSpec};
use mounts::TempDir;
use procs::Side;
use rows::{Goal, Row};
use workload::Measured;

/// Which networks to run on.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetKind {
    /// `--rail-count` rails shaped to `--rate` by tbf.
    Shaped,
    /// The same rails without tbf (CPU-bound).
    Unshaped,
}

/// File services to measure.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemKind {
    /// The exported directory itself (the server's disk).
    Local,
    /// sshfs -o cache=no.
    Sshfs,
    /// braid fs mount.
    BraidMount,
    /// The braid-fs client library (no FUSE).
    BraidLib,
}

/// Workloads.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestKind {
    /// dd bs=1M of the whole file.
    SeqRead,
    /// dd bs=1M conv=fsync.
    SeqWrite,
    /// 4 KiB preads at random offsets.
    RandRead,
    /// create + write(1 B) + close + stat + unlink loop.
    Metadata,
}

impl TestKind {
    fn name(self) -> &'static str {
        match self {
            TestKind::SeqRead => "seq-read",
            TestKind::SeqWrite => "seq-write",
            TestKind::RandRead => "rand-read",
            TestKind::Metadata => "metadata",
        }
    }
}

/// How a read starts cold.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheDrop {
    /// The client's cached pages of the file are dropped (`POSIX_FADV_DONTNEED` through the
    /// mount, checked with `mincore`); the server's copy is read once beforehand, so every
    /// system reads from a warm server, as a file server serving a hot file does.
    Client,
    /// `sync; echo 3 > /proc/sys/vm/drop_caches`: client and server cold (the server then
    /// reads its disk too; one kernel plays both hosts).
    All,
}

/// `braid fs bench` options.
#[derive(Args, Debug, Clone)]
pub struct FsBenchArgs {
    /// Size of the sequentially read and written file (K/M/G are powers of 1024).
    #[arg(short = 's', long, default_value = "1G", value_parser = parse::parse_size)]
    pub size: usize,
    /// Networks to run on.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "shaped,unshaped"
    )]
    pub nets: Vec<NetKind>,
    /// Rails of the testbed.
    #[arg(long = "rail-count", value_name = "N", default_value_t = 4)]
    pub rails: usize,
    /// Rate of every shaped rail (tc units; unshaped rails are `--nets unshaped`).
    #[arg(long, default_value = "1gbit", value_parser = crate::args::rail_rate)]
    pub rate: crate::args::RailRate,
    /// Rail counts braid runs with (each at most --rail-count).
    #[arg(
        long = "rail-counts",
        value_name = "N,N",
        value_delimiter = ',',
        default_value = "1,4"
    )]
    pub braid_rails: Vec<usize>,
    /// Systems to measure.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "local,sshfs,braid-mount,braid-lib"
    )]
    pub systems: Vec<SystemKind>,
    /// Workloads to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "seq-read,seq-write,rand-read,metadata"
    )]
    pub tests: Vec<TestKind>,
    /// Rounds; every system runs every workload once per round.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Random reads per run at most.
    #[arg(long, default_value_t = 20_000)]
    pub rand_ops: u64,
    /// Files of the metadata loop per run at most.
    #[arg(long, default_value_t = 20_000)]
    pub meta_files: u64,
    /// Seconds per random-read or metadata run at most.
    #[arg(long, default_value_t = 10.0)]
    pub op_seconds: f64,
    /// How reads start cold.
    #[arg(long, value_enum, default_value = "client")]
    pub cache_drop: CacheDrop,
    /// Region the client library reads into and writes from (one `read_at`/`write_at` each).
    #[arg(long, default_value = "256M", value_parser = parse::parse_size)]
    pub lib_buffer: usize,
    /// Extra arguments for every `braid fs mount` (one string, split at spaces), e.g.
    /// "--reply-spin-us 300 --threads 1".
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub mount_args: String,
    /// Parent of the run's temp dir: must be on a real disk, not tmpfs.
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Write {"results": [...], "goals": [...], ...} to FILE ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The whole document `--json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Every measurement.
    pub results: Vec<Row>,
    /// Issue 11's goals judged on this run.
    pub goals: Vec<Goal>,
    /// Size of the sequential file, bytes.
    pub size: u64,
    /// How reads started cold.
    pub cache_drop: String,
    /// Load average (1 min) at the start and the end.
    pub loadavg: [f64; 2],
    /// Busy CPUs of the machine before the run (background, subtracted from machine CPU).
    pub background_cpus: f64,
    /// File system of the exported directory.
    pub export_fs: String,
    /// Notes on what could not be measured.
    pub notes: Vec<String>,
}

/// One system as a workload sees it: where the application works and which processes count.
struct Target {
    system: &'static str,
    rails: usize,
    /// Directory the application works in (a mount point, or the export itself).
    dir: PathBuf,
    client: Side,
    server: Side,
    /// The library client, for `braid-lib` (the workloads then use it instead of `dir`).
    lib: Option<std::sync::Arc<libclient::LibClient>>,
}

/// The run's shared state.
struct Ctx<'a> {
    args: &'a FsBenchArgs,
    export: PathBuf,
    bg_cpus: f64,
    limit: Duration,
}

fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Busy CPUs of the machine while nothing of ours runs, over `d`.
fn background_cpus(d: Duration) -> f64 {
    let m0 = procs::machine_busy_seconds();
    let t0 = Instant::now();
    std::thread::sleep(d);
    (procs::machine_busy_seconds() - m0) / t0.elapsed().as_secs_f64()
}

fn validate(a: &FsBenchArgs) -> Result<()> {
    if a.size < 1 << 20 || a.size > 64 << 30 {
        bail!("--size must be 1 MiB .. 64 GiB");
    }
    if a.rails == 0 || a.rails > 16 {
        bail!("--rail-count must be 1..16");
    }
    if a.braid_rails.iter().any(|&r| r == 0 || r > a.rails) {
        bail!("--rail-counts must each be 1..--rail-count ({})", a.rails);
    }
    if a.rounds == 0 || a.rounds > 100 {
        bail!("--rounds must be 1..100");
    }
    if !(a.op_seconds > 0.0 && a.op_seconds <= 600.0) {
        bail!("--op-seconds must be in (0, 600]");
    }
    if a.lib_buffer < 1 << 20
        || a.lib_buffer > 4 << 30
        || !a.lib_buffer.is_multiple_of(workload::BLOCK)
    {
        bail!("--lib-buffer must be 1 MiB .. 4 GiB, a multiple of 4 KiB");
    }
    if a.rand_ops == 0 || a.meta_files == 0 {
        bail!("--rand-ops and --meta-files must be at least 1");
    }
    Ok(())
}

/// Runs the benchmark; prints the table and writes `--json`.
pub fn run(args: &FsBenchArgs) -> Result<Report> {
    validate(args)?;
    testbed::probe().context("braid fs bench makes network namespaces")?;
    if args.systems.contains(&SystemKind::Sshfs)
        && let Some(why) = sshfs::unavailable()
    {
        bail!("the sshfs baseline cannot run: {why} (apt-get install sshfs openssh-server fuse3)");
    }
    procs::become_subreaper();
    let load0 = loadavg();
    let tmp = TempDir::new_in(&args.dir, "braid-fsbench")?;
    let export = tmp.path().join("export");
    std::fs::create_dir_all(&export)?;
    let export_fs = mounts::fs_kind(&export)?.to_string();
    let mut notes = Vec::new();
    if export_fs == "tmpfs" {
        notes.push(format!(
            "the export {} is on tmpfs: writes do not reach a disk",
            export.display()
        ));
    }
    let size = args.size as u64;
    eprintln!(
        "fs bench: writing the {size}-byte read file in {}",
        export.display()
    );
    workload::make_read_file(&export.join("read.dat"), size)?;
    let bg_cpus = background_cpus(Duration::from_secs(1));
    let ctx = Ctx {
        args,
        export: export.clone(),
        bg_cpus,
        limit: Duration::from_secs_f64((size as f64 / 5e6).max(120.0)),
    };
    let mut results = Vec::new();
    let rate = args.rate.shaped("unshaped rails are --nets unshaped")?;
    let shaped_name = format!("{}x{}", args.rails, rate);
    for &net in &args.nets {
        let (name, spec) = match net {
            NetKind::Shaped => (
                shaped_name.clone(),
                TestbedSpec::new(format!("fsb{}s", std::process::id()), args.rails, rate),
            ),
            NetKind::Unshaped => (
                "unshaped".to_string(),
                TestbedSpec::unshaped(format!("fsb{}u", std::process::id()), args.rails),
            ),
        };
        let tb = Testbed::up(&spec)?;
        run_net(&ctx, &tb, &name, tmp.path(), &mut results)?;
        drop(tb);
    }
    rows::fill_ratios(&mut results);
    let framing = testbed::framing_limit_mb_s(rate, 1500) * args.rails as f64;
    let goals = rows::goals(&results, &shaped_name, args.rails, framing);
    let report = Report {
        results,
        goals,
        size,
        cache_drop: format!("{:?}", args.cache_drop).to_lowercase(),
        loadavg: [load0, loadavg()],
        background_cpus: bg_cpus,
        export_fs,
        notes,
    };
    print!("{}", rows::table(&report.results, &report.goals));
    for n in &report.notes {
        println!("note: {n}");
    }
    println!(
        "load average {:.2} at the start, {:.2} at the end; background {:.2} CPUs busy before the run",
        report.loadavg[0], report.loadavg[1], report.background_cpus
    );
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        if p.as_os_str() == "-" {
            println!("{text}");
        } else {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
        }
    }
    Ok(report)
}

/// Starts the systems on one testbed, runs every round, and ends the systems.
fn run_net(ctx: &Ctx, tb: &Testbed, net: &str, tmp: &Path, out: &mut Vec<Row>) -> Result<()> {
    let args = ctx.args;
    let mut targets = Vec::new();
    let mut libs = Vec::new();
    // Mounts and servers live until the end of this function: library clients go first,
    // then the mounts, then the servers, then (in the caller) the testbed.
    let mut services = Vec::new();
    let mut braid_fs = None;
    for &sys in &args.systems {
        match sys {
            SystemKind::Local => targets.push(Target {
                system: "local",
                rails: 1,
                dir: ctx.export.clone(),
                client: Side::default(),
                server: Side::default(),
                lib: None,
            }),
            SystemKind::Sshfs => {
                services.push(systems::start_sshfs(tb, tmp, &ctx.export, net, &[])?);
            }
            SystemKind::BraidMount | SystemKind::BraidLib => {
                if braid_fs.is_none() {
                    let exe = std::env::current_exe().context("finding the braid executable")?;
                    braid_fs = Some((
                        systems::start_braid_server(&exe, tb, tmp, &ctx.export, net)?,
                        exe,
                    ));
                }
                let (fs, exe) = braid_fs.as_ref().expect("started above");
                for &r in &args.braid_rails {
                    if sys == SystemKind::BraidMount {
                        let tag = format!("{net}-{r}");
                        let extra: Vec<&str> = args.mount_args.split_whitespace().collect();
                        services.push(systems::start_braid_mount(
                            exe, tb, fs, tmp, r, &tag, &extra,
                        )?);
                    } else {
                        let c = libclient::LibClient::connect(tb, r, &fs.secret, args.lib_buffer)?;
                        libs.push(Target {
                            system: "braid-lib",
                            rails: r,
                            dir: ctx.export.clone(),
                            client: Side::default(),
                            server: fs.server.side(),
                            lib: Some(std::sync::Arc::new(c)),
                        });
                    }
                }
            }
        }
    }
    for s in &services {
        targets.push(Target {
            system: s.system,
            rails: s.rails,
            dir: s.mountpoint.clone(),
            client: s.client.clone(),
            server: s.server.clone(),
            lib: None,
        });
    }
    targets.append(&mut libs);
    for round in 0..args.rounds {
        for &test in &args.tests {
            for t in &targets {
                let row = run_one(ctx, t, test, net, round, tb);
                match &row.error {
                    Some(e) => eprintln!("fs bench: {net} {} {}: {e}", t.system, test.name()),
                    None => eprintln!(
                        "fs bench: {net} {} {} rail(s) {} round {}: {} {:.1} ops/s",
                        t.system,
                        t.rails,
                        test.name(),
                        round,
                        row.mb_s.map_or(String::new(), |m| format!("{m:.1} MB/s,")),
                        row.ops_s
                    ),
                }
                out.push(row);
            }
        }
    }
    drop(targets);
    drop(services);
    drop(braid_fs);
    Ok(())
}

/// Removes a written file through the system under test (the mount), as its user would,
/// then on the server if it is still there. Removed only on the server, behind the
/// client's back, a file stays open on the server for as long as the client's kernel
/// remembers its inode (a FUSE server serves an inode by an open descriptor until the
/// kernel forgets it; sshfs's and braid's alike), and with it its 1 GiB of page cache: the
/// next round's writes then take fresh memory, which on the test VM costs several times
/// more to touch the first time (docs/FS-BENCH.md: braid's mount wrote 336-391 MB/s in
/// runs after such removals, 452-473 after removals through the mount).
fn remove_written(through_system: &Path, server_view: &Path) {
    if let Err(e) = std::fs::remove_file(through_system) {
        tracing::debug!("removing {}: {e}", through_system.display());
    }
    let _ = std::fs::remove_file(server_view);
}

/// Runs one workload on one target and makes its row (an error becomes the row's `error`).
fn run_one(ctx: &Ctx, t: &Target, test: TestKind, net: &str, round: u32, tb: &Testbed) -> Row {
    let mut row = Row {
        net: net.into(),
        system: t.system.into(),
        rails: t.rails,
        test: test.name().into(),
        round,
        ..Default::default()
    };
    let shaped = !tb.spec().unshaped;
    if shaped && t.system != "local" {
        let f = testbed::framing_limit_mb_s(tb.spec().rates[0], tb.spec().mtu);
        row.framing_limit_mb_s = Some(f * t.rails as f64);
    }
    match measure(ctx, t, test, &mut row) {
        Ok(m) => fill(&mut row, &m),
        Err(e) => row.error = Some(format!("{e:#}")),
    }
    row
}

/// CPU snapshot of a run's sides.
struct Cpu {
    client: f64,
    server: f64,
    server_faults: u64,
    machine: f64,
    at: Instant,
}

impl Cpu {
    fn now(t: &Target) -> Cpu {
        let (server, server_faults) = t.server.cpu_and_faults();
        Cpu {
            client: t.client.cpu_seconds(),
            server,
            server_faults,
            machine: procs::machine_busy_seconds(),
            at: Instant::now(),
        }
    }
}

fn measure(ctx: &Ctx, t: &Target, test: TestKind, row: &mut Row) -> Result<Measured> {
    let a = ctx.args;
    let size = a.size as u64;
    let tag = format!("{}-{}", t.system, t.rails);
    let ops_limit = Duration::from_secs_f64(a.op_seconds);
    let read_file = t.dir.join("read.dat");
    let server_read_file = ctx.export.join("read.dat");
    let prepare_read = |row: &mut Row| -> Result<()> {
        match ctx.args.cache_drop {
            CacheDrop::Client if t.system == "local" => {
                // The server's own disk: cold.
                row.resident_before = Some(workload::evict(&server_read_file)?);
            }
            CacheDrop::Client => {
                workload::warm(&server_read_file)?;
                // The library keeps no cache of its own: every read_at goes to the server.
                if t.lib.is_none() {
                    row.resident_before = Some(workload::evict(&read_file)?);
                }
            }
            CacheDrop::All => procs::drop_caches()?,
        }
        Ok(())
    };
    if let Some(lib) = &t.lib {
        let (m, c0, c1) = match test {
            TestKind::SeqRead => {
                prepare_read(row)?;
                let c0 = Cpu::now(t);
                let m = lib.seq_read("read.dat", size)?;
                (m, c0, Cpu::now(t))
            }
            TestKind::RandRead => {
                prepare_read(row)?;
                let c0 = Cpu::now(t);
                let m = lib.rand_read("read.dat", a.rand_ops, ops_limit)?;
                (m, c0, Cpu::now(t))
            }
            TestKind::SeqWrite => {
                let name = format!("write-{tag}.dat");
                let server_view = ctx.export.join(&name);
                let _ = std::fs::remove_file(&server_view);
                // Earlier writes must not flush into this run.
                rustix::fs::sync();
                let c0 = Cpu::now(t);
                let r = lib.seq_write(&name, &server_view, size);
                let c1 = Cpu::now(t);
                // Through the service, as its user would: see `remove_written`.
                if let Err(e) = lib.remove(&name) {
                    tracing::debug!("removing {name} through the library: {e}");
                }
                let _ = std::fs::remove_file(&server_view);
                (r?, c0, c1)
            }
            TestKind::Metadata => {
                let c0 = Cpu::now(t);
                let m = lib.metadata(&tag, a.meta_files, ops_limit)?;
                (m, c0, Cpu::now(t))
            }
        };
        account(ctx, row, &c0, &c1);
        return Ok(m);
    }
    let (m, cpu0, cpu1) = match test {
        TestKind::SeqRead => {
            prepare_read(row)?;
            let c0 = Cpu::now(t);
            let m = workload::seq_read(&read_file, size, ctx.limit)?;
            (m, c0, Cpu::now(t))
        }
        TestKind::RandRead => {
            prepare_read(row)?;
            let c0 = Cpu::now(t);
            let m = workload::rand_read(&read_file, a.rand_ops, ops_limit)?;
            (m, c0, Cpu::now(t))
        }
        TestKind::SeqWrite => {
            let name = format!("write-{tag}.dat");
            let server_view = ctx.export.join(&name);
            let _ = std::fs::remove_file(&server_view);
            // Earlier writes must not flush into this run.
            rustix::fs::sync();
            let c0 = Cpu::now(t);
            let r = workload::seq_write(&t.dir.join(&name), &server_view, size, ctx.limit);
            let c1 = Cpu::now(t);
            remove_written(&t.dir.join(&name), &server_view);
            (r?, c0, c1)
        }
        TestKind::Metadata => {
            let dir = t.dir.join(format!("meta-{tag}"));
            let c0 = Cpu::now(t);
            let r = workload::metadata_loop(&dir, a.meta_files, ops_limit);
            let c1 = Cpu::now(t);
            let _ = std::fs::remove_dir_all(ctx.export.join(format!("meta-{tag}")));
            (r?, c0, c1)
        }
    };
    account(ctx, row, &cpu0, &cpu1);
    Ok(m)
}

/// The sides' CPU between two snapshots.
fn account(ctx: &Ctx, row: &mut Row, cpu0: &Cpu, cpu1: &Cpu) {
    row.client_cpu_s = cpu1.client - cpu0.client;
    row.server_cpu_s = cpu1.server - cpu0.server;
    row.server_faults = cpu1.server_faults.saturating_sub(cpu0.server_faults);
    let wall = cpu1.at.duration_since(cpu0.at).as_secs_f64();
    row.machine_cpu_s = (cpu1.machine - cpu0.machine - ctx.bg_cpus * wall).max(0.0);
}

fn fill(row: &mut Row, m: &Measured) {
    row.bytes = m.bytes;
    row.ops = m.ops;
    row.seconds = m.seconds;
    row.app_cpu_s = m.app_cpu_s;
    row.ops_s = m.ops as f64 / m.seconds.max(1e-9);
    row.lat_us_median = m.lat_us_median;
    row.lat_us_p99 = m.lat_us_p99;
    row.check = m.check.clone();
    row.phases_us = m.phases_us.clone();
    if m.bytes > 0 && row.test != "metadata" {
        let gb = m.bytes as f64 / 1e9;
        row.mb_s = Some(m.bytes as f64 / 1e6 / m.seconds.max(1e-9));
        row.client_cpu_s_per_gb = Some((row.app_cpu_s + row.client_cpu_s) / gb);
        row.server_cpu_s_per_gb = Some(row.server_cpu_s / gb);
        row.machine_cpu_s_per_gb = Some(row.machine_cpu_s / gb);
        row.of_framing_limit = row.framing_limit_mb_s.zip(row.mb_s).map(|(f, v)| v / f);
    }
}
