//! `braid run` and `mpirun` launching braid jobs: on loopback, and across the hosts of a
//! testbed made here (namespaces named with the pid, removed on drop). Uses the `ring`
//! example of `braid-boot`, which `cargo test --workspace` builds beside the `braid` binary;
//! tests that need it skip, saying so, when it is not there.
//!
//! Every child is bounded: it is killed (by pid, it is ours) after its limit.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use braid_testbed::parse::Rate;
use braid_testbed::testbed::{self, Testbed, TestbedSpec};

const EXE: &str = env!("CARGO_BIN_EXE_braid");

struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs `cmd` to completion, killing it after `limit`.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Output {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {limit:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
        took,
    }
}

/// The `ring` example, built by `cargo test --workspace` next to the `braid` binary.
fn ring() -> Option<PathBuf> {
    let p = PathBuf::from(EXE).parent()?.join("examples").join("ring");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "SKIPPED: {} is not built (cargo test --workspace builds it; or cargo build -p braid-boot --example ring)",
            p.display()
        );
        None
    }
}

fn braid() -> Command {
    Command::new(EXE)
}

/// True if process `pid` no longer exists.
fn gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) != 0 }
}

#[test]
fn ring_of_three_on_loopback() {
    let Some(ring) = ring() else { return };
    let o = run_bounded(
        braid()
            .args(["run", "-n", "3", "--timeout", "60", "--"])
            .arg(&ring),
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    for r in 0..3 {
        let prefix = format!("[{r}] ring: rank {r}/3 ");
        let line = o
            .stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no line of rank {r}:\n{}", o.stdout));
        assert!(line.contains(" ok, writes from ranks "), "{line}");
    }
    assert!(o.stdout.contains("token 6 ok"), "{}", o.stdout);
}

#[test]
fn braid_run_gives_its_ranks_a_fresh_job_secret() {
    let secret_of = || {
        let o = run_bounded(
            braid()
                .env_remove("BRAID_SECRET")
                .env_remove("BRAID_SECRET_FILE")
                .args(["run", "-n", "2", "--timeout", "30", "--"])
                .args(["sh", "-c", "echo secret=$BRAID_SECRET"]),
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
        let mut seen: Vec<String> = o
            .stdout
            .lines()
            .filter_map(|l| l.split_once("secret=").map(|(_, s)| s.to_string()))
            .collect();
        assert_eq!(seen.len(), 2, "{}", o.stdout);
        seen.dedup();
        assert_eq!(seen.len(), 1, "both ranks get the same secret: {seen:?}");
        seen.pop().unwrap()
    };
    let (a, b) = (secret_of(), secret_of());
    assert_eq!(a.len(), 64, "{a:?}");
    assert_ne!(a, b, "every job has its own secret");
}

/// A shell rank script: every rank but `bad` writes its pid into DIR/pid.N and sleeps; rank
/// `bad` waits (bounded by braid run's timeout) until the others have, then exits 3.
fn failing_job_script(dir: &std::path::Path, n: usize, bad: usize) -> String {
    let others: Vec<String> = (0..n)
        .filter(|&r| r != bad)
        .map(|r| format!("[ -e {0}/pid.{r} ]", dir.display()))
        .collect();
    format!(
        "if [ \"$BRAID_RANK\" = {bad} ]; then until {cond}; do sleep 0.02; done; echo failing; exit 3; fi; \
         echo $$ > {dir}/pid.tmp.$BRAID_RANK; mv {dir}/pid.tmp.$BRAID_RANK {dir}/pid.$BRAID_RANK; exec sleep 60",
        cond = others.join(" && "),
        dir = dir.display()
    )
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("braid-run-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn read_pids(dir: &std::path::Path, ranks: impl Iterator<Item = usize>) -> Vec<i32> {
    ranks
        .map(|r| {
            std::fs::read_to_string(dir.join(format!("pid.{r}")))
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_failing_rank_fails_the_job_and_ends_the_others() {
    let dir = temp_dir("fail");
    let o = run_bounded(
        braid()
            .args([
                "run",
                "-n",
                "3",
                "--timeout",
                "60",
                "--grace",
                "5",
                "--",
                "sh",
                "-c",
            ])
            .arg(failing_job_script(&dir, 3, 1)),
        Duration::from_secs(90),
    );
    assert_eq!(o.status.code(), Some(3), "{}\n{}", o.stdout, o.stderr);
    assert!(o.stdout.contains("[1] failing"), "{}", o.stdout);
    assert!(
        o.stderr
            .contains("rank 1 exited with status 3; ending ranks 0, 2"),
        "{}",
        o.stderr
    );
    // The others got SIGTERM (sleep dies of it at once), not the 60 s timeout.
    assert!(o.took < Duration::from_secs(20), "{:?}", o.took);
    for pid in read_pids(&dir, [0, 2].into_iter()) {
        assert!(gone(pid), "rank process {pid} survived");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_ends_the_job_cleanly() {
    let dir = temp_dir("sig");
    let script = format!(
        "echo $$ > {0}/pid.tmp.$BRAID_RANK; mv {0}/pid.tmp.$BRAID_RANK {0}/pid.$BRAID_RANK; exec sleep 60",
        dir.display()
    );
    let start = Instant::now();
    let mut child = braid()
        .args([
            "run",
            "-n",
            "2",
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded wait until both ranks run.
    while !(dir.join("pid.0").exists() && dir.join("pid.1").exists()) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "ranks never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: the braid run process is our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("braid run did not end after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(err.contains("got SIGTERM; ending the job"), "{err}");
    for pid in read_pids(&dir, 0..2) {
        assert!(gone(pid), "rank process {pid} survived");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_timeout_bounds_the_job() {
    let o = run_bounded(
        braid().args([
            "run",
            "-n",
            "2",
            "--timeout",
            "1",
            "--grace",
            "1",
            "--",
            "sleep",
            "60",
        ]),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(124), "{}", o.stderr);
    assert!(o.stderr.contains("timed out"), "{}", o.stderr);
    assert!(o.took < Duration::from_secs(10), "{:?}", o.took);
}

#[test]
fn a_missing_program_is_a_clear_error() {
    let o = run_bounded(
        braid().args(["run", "-n", "2", "--", "/nonexistent/program"]),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        o.stderr.contains("starting rank 0 (/nonexistent/program)"),
        "{}",
        o.stderr
    );
}

#[test]
fn a_rank_without_its_rendezvous_fails_in_bounded_time() {
    let Some(ring) = ring() else { return };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = run_bounded(
        Command::new(&ring)
            .env("BRAID_RANK", "1")
            .env("BRAID_SIZE", "2")
            .env("BRAID_ROOT", format!("127.0.0.1:{port}"))
            .env("BRAID_JOIN_TIMEOUT", "2"),
        Duration::from_secs(30),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        o.stderr.contains("cannot reach the rendezvous"),
        "{}",
        o.stderr
    );
    assert!(o.took < Duration::from_secs(8), "{:?}", o.took);
}

fn skip_reason() -> Option<String> {
    match testbed::probe() {
        Ok(()) => None,
        Err(e) => {
            eprintln!("SKIPPED: network namespaces unavailable here: {e:#}");
            Some(e.to_string())
        }
    }
}

fn make_testbed(tag: &str, rails: usize) -> Testbed {
    let spec = TestbedSpec::new(
        format!("br{tag}{}", std::process::id()),
        rails,
        Rate::from_bits(1_000_000_000),
    );
    Testbed::up(&spec).expect("testbed up")
}

/// The `rails to rank P: A=B,...` list of rank `r`'s ring line.
fn rails_of(stdout: &str, prefix: &str) -> Vec<String> {
    let line = stdout
        .lines()
        .find(|l| l.contains(prefix))
        .unwrap_or_else(|| panic!("no line with {prefix:?}:\n{stdout}"));
    line.rsplit(": ")
        .next()
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect()
}

#[test]
fn braid_run_across_testbed_hosts_uses_every_rail() {
    if skip_reason().is_some() {
        return;
    }
    let Some(ring) = ring() else { return };
    let tb = make_testbed("r", 3);
    let name = tb.spec().name.clone();
    // Four ranks on two hosts: pairs across hosts get 3 rails, pairs on one host loopback.
    let o = run_bounded(
        braid()
            .args([
                "run",
                "-n",
                "4",
                "--testbed",
                &name,
                "--timeout",
                "60",
                "--",
            ])
            .arg(&ring),
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    // Rank 0 (host 0) to rank 1 (host 1): the three rails of the link, host 0's side local.
    let r01 = rails_of(&o.stdout, "[0] ring: rank 0/4");
    let want: Vec<String> = tb
        .rail_addrs(0, 1)
        .iter()
        .map(|(a, b)| format!("{a}={b}:"))
        .collect();
    assert_eq!(r01.len(), 3, "{r01:?}");
    for (got, want) in r01.iter().zip(&want) {
        assert!(got.starts_with(want), "{got} vs {want}");
    }
    assert_eq!(rails_of(&o.stdout, "[3] ring: rank 3/4").len(), 3);
    assert!(o.stdout.contains("token 10 ok"), "{}", o.stdout);
}

/// True if `mpirun` can be started (skips, saying so, when not).
fn have_mpirun() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        eprintln!("SKIPPED: mpirun is not installed (apt-get install openmpi-bin)");
    }
    ok
}

/// `cmd` with no `BRAID_*` variable, whatever the test's own environment holds.
fn without_braid_vars(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("BRAID_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// `mpirun -n 4 --host h0:2,h1:2 ring` across two testbed hosts, as a user types it on a
/// cluster: no `BRAID_ROOT` (only the job's secret); the rendezvous comes from Open MPI's
/// environment.
#[test]
fn mpirun_across_testbed_hosts() {
    if skip_reason().is_some() {
        return;
    }
    let Some(ring) = ring() else { return };
    if !have_mpirun() {
        return;
    }
    let tb = make_testbed("m", 2);
    let agent = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns-rsh");
    let o = run_bounded(
        without_braid_vars(&mut Command::new("nsenter"))
            .arg(format!("--net=/run/netns/{}", tb.host_ns(0)))
            .args([
                "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
                // Open MPI 4's orted maps its shared-memory copy of the hwloc topology at
                // an address it picks itself, which on these VMs sometimes lies where the
                // stack grows: orted segfaults in hwloc_shmem_topology_write (2 of 6 runs
                // here). braid binds nothing, so the component that does it is left out.
                "--mca",
                "rtc",
                "^hwloc",
                "--mca",
                "plm_rsh_agent",
            ])
            .arg(&agent)
            .arg("--host")
            .arg(format!("{}:2,{}:2", tb.host_ns(0), tb.host_ns(1)))
            .args(["-n", "4"])
            // The job's secret, to every rank (a job across hosts needs one); no BRAID_ROOT.
            .args(["-x", "BRAID_SECRET=mpirun-test-secret-0123456789abcdef"])
            .arg(&ring),
        Duration::from_secs(120),
    );
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    // By-slot mapping: ranks 0 and 1 on host 0, 2 and 3 on host 1. Each rank used its own
    // host's addresses, and pairs across the hosts got both rails.
    // (Each rank prints its rails to the next: 1 on host 0 to 2, 3 on host 1 to 0.)
    let r1 = rails_of(&o.stdout, "ring: rank 1/4");
    let r3 = rails_of(&o.stdout, "ring: rank 3/4");
    assert_eq!((r1.len(), r3.len()), (2, 2), "{}", o.stdout);
    let (a, b) = tb.rail_addrs(0, 1)[1];
    assert!(r1[1].starts_with(&format!("{a}={b}:")), "{r1:?}");
    assert!(r3[1].starts_with(&format!("{b}={a}:")), "{r3:?}");
    assert!(o.stdout.contains("token 10 ok"), "{}", o.stdout);
    drop(tb);
}

/// Four ranks on two testbed hosts started by hand with the variables `srun -N 2 -n 4`
/// sets (Slurm's task ids, job and step ids, the compact node list), and host names that
/// resolve through a private `/etc/hosts` as a cluster's DNS would: no `BRAID_ROOT` (only
/// the job's secret).
#[test]
fn slurm_environment_across_testbed_hosts() {
    if skip_reason().is_some() {
        return;
    }
    let Some(ring) = ring() else { return };
    let tb = make_testbed("s", 2);
    let dir = temp_dir("slurm");
    let (h0, h1) = (tb.host_ns(0), tb.host_ns(1));
    let (a, b) = tb.rail_addrs(0, 1)[0];
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1 localhost\n{a} {h0}\n{b} {h1}\n")).unwrap();
    // The node list as Slurm compresses it: `NAME-h[0-1]`.
    let nodelist = format!("{}[0-1]", h0.strip_suffix('0').unwrap());
    let job = (std::process::id() % 100_000).to_string();
    let ranks: Vec<_> = (0..4usize)
        .map(|rank| {
            let node = rank / 2;
            let mut cmd = Command::new("nsenter");
            without_braid_vars(&mut cmd)
                .arg(format!("--net=/run/netns/{}", tb.host_ns(node)))
                // A private mount namespace, so the bind mount of /etc/hosts is the rank's.
                .args(["unshare", "--mount", "sh", "-c"])
                .arg(format!(
                    "mount --bind {} /etc/hosts && exec \"$0\"",
                    hosts.display()
                ))
                .arg(&ring)
                .env("SLURM_PROCID", rank.to_string())
                .env("SLURM_NTASKS", "4")
                .env("SLURM_NPROCS", "4")
                .env("SLURM_NNODES", "2")
                .env("SLURM_NODEID", node.to_string())
                .env("SLURM_LOCALID", (rank % 2).to_string())
                .env("SLURM_JOB_ID", &job)
                .env("SLURM_JOBID", &job)
                .env("SLURM_STEP_ID", "0")
                .env("SLURM_STEPID", "0")
                .env("SLURM_JOB_NODELIST", &nodelist)
                .env("SLURM_NODELIST", &nodelist)
                .env("SLURM_STEP_NODELIST", &nodelist)
                .env("SLURM_STEP_NUM_NODES", "2")
                .env("SLURM_STEP_NUM_TASKS", "4")
                .env("SLURM_TASKS_PER_NODE", "2(x2)")
                .env("SLURMD_NODENAME", tb.host_ns(node))
                .env("BRAID_SECRET", format!("slurm-test-secret-{job}"));
            std::thread::spawn(move || run_bounded(&mut cmd, Duration::from_secs(90)))
        })
        .collect();
    let outs: Vec<Output> = ranks.into_iter().map(|t| t.join().unwrap()).collect();
    for (r, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {r}: {}\n{}", o.stdout, o.stderr);
    }
    let r1 = rails_of(&outs[1].stdout, "ring: rank 1/4");
    let r3 = rails_of(&outs[3].stdout, "ring: rank 3/4");
    assert_eq!((r1.len(), r3.len()), (2, 2), "{}", outs[1].stdout);
    assert!(r3[0].starts_with(&format!("{b}={a}:")), "{r3:?}");
    assert!(outs[0].stdout.contains("token 10 ok"), "{}", outs[0].stdout);
    let _ = std::fs::remove_dir_all(&dir);
    drop(tb);
}
