//! `braid run`: a job launcher for one machine, like `torchrun`. Starts N ranks of a program
//! on loopback, or spread over the hosts (network namespaces) of a standing `braid testbed`,
//! with the environment `braid_boot::LaunchEnv` reads; forwards their output line by line
//! with a `[rank] ` prefix; ends the job when a rank fails, on a signal, or at a timeout.
//!
//! Only processes it started are signalled: each rank runs in a process group of its own
//! (whose id is the rank's pid), so that ending a rank ends what it started too; and each
//! rank gets `SIGKILL` if `braid run` itself dies (`PR_SET_PDEATHSIG`).

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal, kill_process_group};

use braid_testbed::testbed::{Testbed, confine_child, spawn_in_netns};

/// Variables of other launchers that `braid_boot` would read before `BRAID_RANK`: removed
/// from the ranks' environment so an outer launcher cannot override `braid run`'s ranks.
const OUTER_LAUNCHER_VARS: [&str; 7] = [
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "OMPI_MCA_ess_base_jobid",
];

/// What to launch and how.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// Number of ranks.
    pub ranks: usize,
    /// Spread the ranks over this standing testbed's hosts (rank i on host i % K).
    pub testbed: Option<String>,
    /// End the job after this long (exit status 124).
    pub timeout: Option<Duration>,
    /// Rendezvous port (default: a free one).
    pub port: Option<u16>,
    /// Job id (default: `run-<pid>-<random>`).
    pub job: Option<String>,
    /// `BRAID_RAILS` for every rank.
    pub rails: Option<String>,
    /// Between `SIGTERM` and `SIGKILL` when ending ranks.
    pub grace: Duration,
    /// The program and its arguments.
    pub program: Vec<OsString>,
}

/// Where one rank runs and what it is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Network namespace (`None`: braid run's own).
    pub netns: Option<String>,
    /// Environment variables set for the rank.
    pub env: Vec<(String, String)>,
}

/// The placement of every rank: host, `BRAID_ROOT` reachable from it, and the variables.
pub fn plan(opts: &RunOpts, testbed: Option<&Testbed>, port: u16, job: &str) -> Vec<Placement> {
    let n = opts.ranks;
    let hosts = testbed.map_or(1, |t| t.spec().hosts);
    (0..n)
        .map(|rank| {
            let host = rank % hosts;
            let (netns, root_ip) = match testbed {
                None => (None, Ipv4Addr::LOCALHOST),
                Some(tb) => {
                    // Host 0's address on the link from this rank's host (rail 0); ranks on
                    // host 0 use its address towards host 1, a local one.
                    let ip = if host == 0 {
                        tb.rail_addrs(0, 1)[0].0
                    } else {
                        tb.rail_addrs(0, host)[0].0
                    };
                    (Some(tb.host_ns(host)), ip)
                }
            };
            let local_size = (n - host).div_ceil(hosts);
            let mut env = vec![
                ("BRAID_RANK".to_string(), rank.to_string()),
                ("BRAID_SIZE".to_string(), n.to_string()),
                (
                    "BRAID_ROOT".to_string(),
                    SocketAddr::new(root_ip.into(), port).to_string(),
                ),
                ("BRAID_JOB".to_string(), job.to_string()),
                ("BRAID_LOCAL_RANK".to_string(), (rank / hosts).to_string()),
                ("BRAID_LOCAL_SIZE".to_string(), local_size.to_string()),
            ];
            if let Some(r) = &opts.rails {
                env.push(("BRAID_RAILS".to_string(), r.clone()));
            }
            Placement { netns, env }
        })
        .collect()
}

/// A port that is free now in namespace `netns` (or here), for the rendezvous (see
/// [`braid_boot::rendezvous_port`]: not one of the ephemeral range).
fn free_port(netns: Option<&str>) -> Result<u16> {
    let pick = |ip: Ipv4Addr| braid_boot::rendezvous_port(ip.into());
    match netns {
        None => Ok(pick(Ipv4Addr::LOCALHOST)?),
        Some(ns) => Ok(spawn_in_netns(ns, move || pick(Ipv4Addr::UNSPECIFIED))?
            .join()
            .map_err(|_| anyhow::anyhow!("port probe thread panicked"))???),
    }
}

enum Event {
    Exited(usize, std::io::Result<ExitStatus>),
    OutputDone,
    Signal(i32),
}

/// Copies `from` to `to` line by line, each line prefixed; long lines are cut at 64 KiB.
fn forward(from: impl Read, prefix: String, mut to: impl Write) {
    let mut r = BufReader::new(from);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        match r.by_ref().take(64 * 1024).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                if line.last() != Some(&b'\n') {
                    line.push(b'\n');
                }
                // One write per line, so lines of different ranks do not interleave.
                let mut out = Vec::with_capacity(prefix.len() + line.len());
                out.extend_from_slice(prefix.as_bytes());
                out.extend_from_slice(&line);
                if to.write_all(&out).and_then(|()| to.flush()).is_err() {
                    break;
                }
            }
        }
    }
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), st.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(s)) => format!("was killed by {}", signal_name(s)),
        _ => format!("{st}"),
    }
}

fn signal_name(s: i32) -> String {
    match s {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        s => format!("signal {s}"),
    }
}

/// The exit status a shell would show for `st`.
fn shell_code(st: &ExitStatus) -> i32 {
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

struct Rank {
    pid: i32,
    running: bool,
}

/// Signals rank `r`'s process group (it is ours: the rank leads it).
fn signal_rank(r: &Rank, sig: i32) {
    // The group is the rank's own (a pid of 0 would mean our own group: never signalled).
    if r.running
        && let (Some(pid), Some(sig)) = (Pid::from_raw(r.pid), Signal::from_named_raw(sig))
    {
        let _ = kill_process_group(pid, sig);
    }
}

/// Launches the job and waits for it; returns the exit status for `braid run` (0 when every
/// rank exited 0; else the first failing rank's status; 124 on timeout; 128+signal when
/// ended by a signal).
pub fn run(opts: &RunOpts) -> Result<i32> {
    if opts.ranks == 0 || opts.ranks > 4096 {
        bail!("-n must be 1..4096");
    }
    if opts.program.is_empty() {
        bail!("no program given (braid run -n N -- PROGRAM ARGS...)");
    }
    let testbed = match &opts.testbed {
        Some(name) => Some(Testbed::open(name).with_context(|| {
            format!("--testbed {name}: bring it up first with `braid testbed up --name {name}`")
        })?),
        None => None,
    };
    let job = opts.job.clone().unwrap_or_else(|| {
        let mut b = [0u8; 4];
        let _ = getrandom_bytes(&mut b);
        format!("run-{}-{:08x}", std::process::id(), u32::from_le_bytes(b))
    });
    let port = match opts.port {
        Some(p) => p,
        None => free_port(testbed.as_ref().map(|t| t.host_ns(0)).as_deref())?,
    };
    let places = plan(opts, testbed.as_ref(), port, &job);
    let secret = job_secret()?;

    let (tx, rx) = mpsc::channel::<Event>();
    // Signals first, so that one arriving during start-up is not lost.
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
            .context("installing signal handlers")?;
    let sig_handle = signals.handle();
    {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("braid-run-signals".into())
            .spawn(move || {
                for s in signals.forever() {
                    if tx.send(Event::Signal(s)).is_err() {
                        break;
                    }
                }
            })?;
    }

    let mut ranks: Vec<Rank> = Vec::with_capacity(opts.ranks);
    let mut outputs = 0usize;
    for (i, p) in places.iter().enumerate() {
        let mut cmd = Command::new(&opts.program[0]);
        cmd.args(&opts.program[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        for v in OUTER_LAUNCHER_VARS {
            cmd.env_remove(v);
        }
        for (k, v) in &p.env {
            cmd.env(k, v);
        }
        if let Some(s) = &secret {
            cmd.env(braid::SECRET_ENV, s);
        }
        confine_child(&mut cmd, p.netns.as_deref())?;
        let spawned = cmd.spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                let what = match &p.netns {
                    Some(ns) => format!(" in namespace {ns}"),
                    None => String::new(),
                };
                for r in &ranks {
                    signal_rank(r, libc::SIGKILL);
                }
                sig_handle.close();
                bail!(
                    "starting rank {i} ({}){what}: {e}",
                    opts.program[0].to_string_lossy()
                );
            }
        };
        let pid = child.id() as i32;
        for (pipe, is_err) in [
            (
                child
                    .stdout
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
                false,
            ),
            (
                child
                    .stderr
                    .take()
                    .map(|p| Box::new(p) as Box<dyn Read + Send>),
                true,
            ),
        ] {
            let Some(pipe) = pipe else { continue };
            let tx = tx.clone();
            let prefix = format!("[{i}] ");
            outputs += 1;
            std::thread::Builder::new()
                .name(format!("braid-run-out{i}"))
                .spawn(move || {
                    if is_err {
                        forward(pipe, prefix, std::io::stderr());
                    } else {
                        forward(pipe, prefix, std::io::stdout());
                    }
                    let _ = tx.send(Event::OutputDone);
                })?;
        }
        {
            let tx = tx.clone();
            std::thread::Builder::new()
                .name(format!("braid-run-wait{i}"))
                .spawn(move || {
                    let st = child.wait();
                    let _ = tx.send(Event::Exited(i, st));
                })?;
        }
        ranks.push(Rank { pid, running: true });
    }
    drop(tx);
    let where_ = match &testbed {
        Some(tb) => format!(
            "over the {} hosts of testbed {:?}",
            tb.spec().hosts,
            tb.spec().name
        ),
        None => "on loopback".into(),
    };
    tracing::info!(ranks = opts.ranks, %job, port, "braid run: started {where_}");

    let started = Instant::now();
    let deadline = opts.timeout.map(|t| started + t);
    let mut code: Option<i32> = None; // the job's outcome, once decided
    let mut kill_at: Option<Instant> = None;
    let mut running = ranks.len();
    let mut outputs_left = outputs;
    let mut output_deadline: Option<Instant> = None;
    let end_all = |ranks: &[Rank], sig: i32| {
        for r in ranks {
            signal_rank(r, sig);
        }
    };
    loop {
        if running == 0 {
            if outputs_left == 0 {
                break;
            }
            // A rank's own children may hold its pipes open: bounded wait for the rest.
            let d = *output_deadline.get_or_insert(Instant::now() + Duration::from_secs(2));
            if Instant::now() >= d {
                break;
            }
        }
        let now = Instant::now();
        let wake = [deadline, kill_at, output_deadline]
            .into_iter()
            .flatten()
            .min()
            .map(|d| d.saturating_duration_since(now))
            .unwrap_or(Duration::from_secs(3600));
        match rx.recv_timeout(wake) {
            Ok(Event::Exited(i, st)) => {
                ranks[i].running = false;
                running -= 1;
                let st = match st {
                    Ok(st) => st,
                    Err(e) => {
                        eprintln!("braid run: waiting for rank {i}: {e}");
                        ExitStatus::from_raw(1 << 8)
                    }
                };
                if code.is_none() && !st.success() {
                    let others: Vec<String> = ranks
                        .iter()
                        .enumerate()
                        .filter(|(_, r)| r.running)
                        .map(|(j, _)| j.to_string())
                        .collect();
                    eprintln!(
                        "braid run: rank {i} {}{}",
                        describe(&st),
                        if others.is_empty() {
                            String::new()
                        } else {
                            format!("; ending ranks {}", others.join(", "))
                        }
                    );
                    code = Some(shell_code(&st));
                    end_all(&ranks, libc::SIGTERM);
                    kill_at = Some(Instant::now() + opts.grace);
                }
            }
            Ok(Event::OutputDone) => outputs_left -= 1,
            Ok(Event::Signal(s)) => {
                if code.is_none() {
                    eprintln!("braid run: got {}; ending the job", signal_name(s));
                    code = Some(128 + s);
                    end_all(&ranks, s);
                    kill_at = Some(Instant::now() + opts.grace);
                } else {
                    // A second signal: no more grace.
                    end_all(&ranks, libc::SIGKILL);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let now = Instant::now();
                if let Some(d) = deadline
                    && now >= d
                    && code.is_none()
                {
                    eprintln!(
                        "braid run: timed out after {:.1} s; ending the job",
                        (now - started).as_secs_f64()
                    );
                    code = Some(124);
                    end_all(&ranks, libc::SIGTERM);
                    kill_at = Some(now + opts.grace);
                }
                if kill_at.is_some_and(|k| now >= k) {
                    end_all(&ranks, libc::SIGKILL);
                    kill_at = None;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    sig_handle.close();
    Ok(code.unwrap_or(0))
}

/// The secret `braid run` hands its ranks (`BRAID_SECRET`) when the user gave none: fresh for
/// every job, so the rendezvous and the ranks' rails authenticate without any setup, and no
/// other job (or stranger) can join. `None` when `BRAID_SECRET` or `BRAID_SECRET_FILE` is
/// set: the ranks then use the user's (it may be needed to reach their servers).
fn job_secret() -> Result<Option<String>> {
    if std::env::var_os(braid::SECRET_ENV).is_some()
        || std::env::var_os(braid::SECRET_FILE_ENV).is_some()
    {
        return Ok(None);
    }
    let mut b = [0u8; 32];
    getrandom_bytes(&mut b).context("making the job's secret from /dev/urandom")?;
    Ok(Some(b.iter().map(|x| format!("{x:02x}")).collect()))
}

fn getrandom_bytes(b: &mut [u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::open("/dev/urandom")?;
    f.read_exact(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(n: usize) -> RunOpts {
        RunOpts {
            ranks: n,
            testbed: None,
            timeout: None,
            port: None,
            job: None,
            rails: None,
            grace: Duration::from_secs(1),
            program: vec!["true".into()],
        }
    }

    fn var<'a>(p: &'a Placement, k: &str) -> &'a str {
        &p.env.iter().find(|(n, _)| n == k).unwrap().1
    }

    #[test]
    fn loopback_plan() {
        let p = plan(&opts(3), None, 29500, "j");
        assert_eq!(p.len(), 3);
        for (i, x) in p.iter().enumerate() {
            assert_eq!(x.netns, None);
            assert_eq!(var(x, "BRAID_RANK"), i.to_string());
            assert_eq!(var(x, "BRAID_SIZE"), "3");
            assert_eq!(var(x, "BRAID_ROOT"), "127.0.0.1:29500");
            assert_eq!(var(x, "BRAID_JOB"), "j");
            assert_eq!(var(x, "BRAID_LOCAL_RANK"), i.to_string());
            assert_eq!(var(x, "BRAID_LOCAL_SIZE"), "3");
        }
    }

    #[test]
    fn forwarding_prefixes_every_line() {
        let mut out = Vec::new();
        forward(&b"a\nbb\n\nlast"[..], "[3] ".into(), &mut out);
        assert_eq!(out, b"[3] a\n[3] bb\n[3] \n[3] last\n");
        let long = vec![b'x'; 70 * 1024];
        let mut out = Vec::new();
        forward(&long[..], "[0] ".into(), &mut out);
        assert_eq!(out.iter().filter(|&&c| c == b'\n').count(), 2);
    }
}
