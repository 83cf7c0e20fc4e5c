//! Launching a test binary as the ranks of a job on loopback, the way a launcher would:
//! `BRAID_RANK`, `BRAID_SIZE`, `BRAID_ROOT` and a unique `BRAID_JOB`. Each rank re-runs
//! this test binary with `--exact ENTRY` and `DSM_TEST_SCENARIO` set.

#![allow(dead_code)]

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The scenario a child rank runs, if this process is one.
pub fn scenario() -> Option<String> {
    std::env::var("DSM_TEST_SCENARIO").ok()
}

/// A loopback port free right now for the rendezvous, not one of the ephemeral range
/// (which a rank's own sockets could take before rank 0 listens).
pub fn free_port() -> u16 {
    braid_boot::rendezvous_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap()
}

/// Children killed when dropped (a failed test leaves no ranks behind).
pub struct Job {
    pub children: Vec<Child>,
}

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// What one rank printed and how it ended.
#[derive(Debug)]
pub struct RankResult {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `n` ranks of scenario `name` (entry `entry` of this test binary), with `env` added,
/// and waits at most `timeout` for all of them.
pub fn run_job(
    entry: &str,
    name: &str,
    n: usize,
    env: &[(&str, String)],
    timeout: Duration,
) -> Vec<RankResult> {
    let exe = std::env::current_exe().unwrap();
    let root = format!("127.0.0.1:{}", free_port());
    let job_id = format!("dsm-test-{}-{name}-{}", std::process::id(), free_port());
    let mut job = Job {
        children: Vec::new(),
    };
    for rank in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.args(["--exact", entry, "--nocapture", "--test-threads=1"])
            .env("DSM_TEST_SCENARIO", name)
            .env("BRAID_RANK", rank.to_string())
            .env("BRAID_SIZE", n.to_string())
            .env("BRAID_ROOT", &root)
            .env("BRAID_JOB", &job_id)
            .env("BRAID_JOIN_TIMEOUT", "30")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        job.children.push(cmd.spawn().unwrap());
    }
    // Read output in threads so full pipes never block a rank.
    let readers: Vec<_> = job
        .children
        .iter_mut()
        .map(|c| {
            let mut out = c.stdout.take().unwrap();
            let mut err = c.stderr.take().unwrap();
            std::thread::spawn(move || {
                use std::io::Read;
                let mut o = String::new();
                let mut e = String::new();
                let t = std::thread::spawn(move || {
                    let _ = err.read_to_string(&mut e);
                    e
                });
                let _ = out.read_to_string(&mut o);
                (o, t.join().unwrap_or_default())
            })
        })
        .collect();
    let deadline = Instant::now() + timeout;
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    while statuses.iter().any(Option::is_none) {
        for (i, c) in job.children.iter_mut().enumerate() {
            if statuses[i].is_none() {
                statuses[i] = c.try_wait().unwrap();
            }
        }
        if Instant::now() > deadline {
            for c in &mut job.children {
                let _ = c.kill();
            }
            let outs: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
            panic!(
                "scenario {name}: ranks still running after {timeout:?}: {statuses:?}\n{outs:#?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outs: Vec<_> = readers.into_iter().map(|r| r.join().unwrap()).collect();
    job.children.clear();
    statuses
        .into_iter()
        .zip(outs)
        .map(|(s, (stdout, stderr))| RankResult {
            status: s.unwrap(),
            stdout,
            stderr,
        })
        .collect()
}

/// Panics unless every rank exited 0.
pub fn assert_all_ok(name: &str, rs: &[RankResult]) {
    for (r, x) in rs.iter().enumerate() {
        assert!(
            x.status.success(),
            "scenario {name}: rank {r} ended with {}\nstdout:\n{}\nstderr:\n{}",
            x.status,
            x.stdout,
            x.stderr
        );
    }
}
