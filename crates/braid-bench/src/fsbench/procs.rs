//! CPU accounting of the processes a measurement involves, from `/proc`, and child processes
//! the benchmark starts and ends by their process id.
//!
//! A file service runs in several processes (sshfs forks `ssh`, sshd forks a session process
//! and `sftp-server`), so a *side* is a set of root processes plus their descendants plus any
//! process whose command line carries a marker (the run's private temp dir: sshfs
//! double-forks `ssh`, which is then no descendant of anything we started).

use std::collections::HashMap;
use std::fs;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::process::{Pid, Signal};

/// Clock ticks per second of `/proc` times.
fn clk_tck() -> f64 {
    let t = rustix::param::clock_ticks_per_second();
    if t > 0 { t as f64 } else { 100.0 }
}

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy)]
struct ProcStat {
    ppid: u32,
    /// utime + stime + cutime + cstime, in ticks (children it reaped count too).
    ticks: u64,
    /// Page faults, minor and major (its own and its reaped children's).
    faults: u64,
}

fn read_stat(pid: u32) -> Option<ProcStat> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); ppid is field 4, utime..cstime fields 14..17.
    let num = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    Some(ProcStat {
        ppid: num(4)? as u32,
        ticks: num(14)? + num(15)? + num(16)? + num(17)?,
        faults: num(10)? + num(11)? + num(12)? + num(13)?,
    })
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn cmdline_contains(pid: u32, marker: &str) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            let text: Vec<u8> = b
                .into_iter()
                .map(|c| if c == 0 { b' ' } else { c })
                .collect();
            String::from_utf8_lossy(&text).contains(marker)
        })
        .unwrap_or(false)
}

/// The processes of one side of a file service.
#[derive(Debug, Clone, Default)]
pub struct Side {
    /// Processes counted with all their descendants.
    pub roots: Vec<u32>,
    /// Also counted: processes whose command line contains this string.
    pub marker: Option<String>,
}

impl Side {
    /// The pids of the side now, with their CPU ticks and page faults.
    fn members(&self) -> Vec<(u32, ProcStat)> {
        let stats: HashMap<u32, ProcStat> = all_pids()
            .into_iter()
            .filter_map(|p| Some((p, read_stat(p)?)))
            .collect();
        let in_tree = |mut p: u32| {
            for _ in 0..64 {
                if self.roots.contains(&p) {
                    return true;
                }
                match stats.get(&p) {
                    Some(s) if s.ppid > 1 => p = s.ppid,
                    _ => return false,
                }
            }
            false
        };
        stats
            .iter()
            .filter(|(p, _)| {
                in_tree(**p)
                    || self
                        .marker
                        .as_deref()
                        .is_some_and(|m| cmdline_contains(**p, m))
            })
            .map(|(p, s)| (*p, *s))
            .collect()
    }

    /// CPU seconds (user + system, including reaped children) the side's processes have used
    /// so far. Differences of two calls give a measurement's cost as long as the processes
    /// live through it.
    pub fn cpu_seconds(&self) -> f64 {
        self.members().iter().map(|(_, s)| s.ticks).sum::<u64>() as f64 / clk_tck()
    }

    /// CPU seconds and page faults (minor + major) so far, from one look at `/proc`.
    pub fn cpu_and_faults(&self) -> (f64, u64) {
        let m = self.members();
        (
            m.iter().map(|(_, s)| s.ticks).sum::<u64>() as f64 / clk_tck(),
            m.iter().map(|(_, s)| s.faults).sum(),
        )
    }

    /// Pids of the side now.
    pub fn pids(&self) -> Vec<u32> {
        self.members().into_iter().map(|(p, _)| p).collect()
    }
}

/// Busy CPU seconds of the whole machine so far (all CPUs, `/proc/stat`: everything but
/// idle and iowait).
pub fn machine_busy_seconds() -> f64 {
    let s = fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = s.lines().next() else {
        return 0.0;
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 5 {
        return 0.0;
    }
    // user nice system idle iowait irq softirq steal (guest time is inside user already).
    let total: u64 = v.iter().take(8).sum();
    (total - v[3] - v[4]) as f64 / clk_tck()
}

/// CPU seconds of this process (all threads, user + system).
pub fn self_cpu_seconds() -> f64 {
    rusage_seconds(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

fn rusage_seconds(who: nix::sys::resource::UsageWho) -> f64 {
    let Ok(ru) = nix::sys::resource::getrusage(who) else {
        return 0.0;
    };
    let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
    tv(ru.user_time()) + tv(ru.system_time())
}

/// Makes this process the reaper of orphans among its descendants (`PR_SET_CHILD_SUBREAPER`),
/// so that a grandchild a tool double-forks (sshfs's `ssh`) is reparented here and can be
/// reaped ([`reap`]) rather than left a zombie.
pub fn become_subreaper() {
    let _ = rustix::process::set_child_subreaper(Some(rustix::process::getpid()));
}

/// Waits for the child `pid` without blocking; true when it has ended (and is reaped).
fn try_reap(pid: u32) -> bool {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    match rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG) {
        Ok(r) => r.is_some_and(|(q, _)| q == p),
        Err(_) => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
    }
}

/// Reaps every process of ours that has ended and was reparented to us (see
/// [`become_subreaper`]): only the pids given, never `waitpid(-1)`, which would steal the
/// exit status of children other code waits for.
pub fn reap(pids: &[u32]) {
    for &p in pids {
        try_reap(p);
    }
}

/// Ends a process we started: SIGTERM, up to `grace` for it to exit, then SIGKILL; reaps it
/// if it is our child. Returns whether it had to be killed.
pub fn end_process(pid: u32, grace: Duration) -> bool {
    if !alive(pid) {
        try_reap(pid);
        return false;
    }
    signal(pid, Signal::TERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if try_reap(pid) || !alive(pid) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(pid, Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && !try_reap(pid) && alive(pid) {
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Sends `sig` to `pid` (a process we started), ignoring errors as kill(2) was.
fn signal(pid: u32, sig: Signal) {
    if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

/// Whether `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 2..].chars().next())
            .is_some_and(|st| st != 'Z'),
        Err(_) => false,
    }
}

/// Waits for a child with a bound, returning its exit status, its CPU seconds
/// (`wait4`'s rusage: exact, unlike `RUSAGE_CHILDREN` deltas in a subreaper) and its output.
/// Past `limit` the child is killed and this is an error.
pub fn wait_child(mut child: Child, limit: Duration, what: &str) -> Result<ChildResult> {
    use std::io::Read;
    let pid = child.id();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // Read the pipes on threads so a chatty child cannot block on a full pipe.
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut v);
        }
        v
    });
    let deadline = Instant::now() + limit;
    let (status, cpu) = loop {
        let mut status = 0;
        // SAFETY: wait4 on our own child with a zeroed rusage to fill.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid as libc::pid_t, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid as libc::pid_t {
            let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
            break (status, tv(ru.ru_utime) + tv(ru.ru_stime));
        }
        if r < 0 {
            bail!("{what}: wait4: {}", std::io::Error::last_os_error());
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{what}: did not finish within {limit:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    // The std handle must not wait again: the pid is reaped.
    std::mem::forget(child);
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    Ok(ChildResult {
        success: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        status,
        cpu_s: cpu,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// What [`wait_child`] returns.
#[derive(Debug, Clone)]
pub struct ChildResult {
    /// Exited with status 0.
    pub success: bool,
    /// Raw wait status.
    pub status: i32,
    /// User + system CPU seconds of the child (and children it reaped).
    pub cpu_s: f64,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// Polls `cond` every few milliseconds until it holds or `limit` passes.
pub fn wait_until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(2);
    loop {
        if cond() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Runs `sync` and drops the kernel's clean page cache, dentries and inodes
/// (`/proc/sys/vm/drop_caches`), as a user measuring a cold read does.
pub fn drop_caches() -> Result<()> {
    rustix::fs::sync();
    fs::write("/proc/sys/vm/drop_caches", "3\n").context("writing /proc/sys/vm/drop_caches")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_counted() {
        let side = Side {
            roots: vec![std::process::id()],
            marker: None,
        };
        assert!(side.pids().contains(&std::process::id()));
        let t0 = side.cpu_seconds();
        let mut x = 0u64;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(side.cpu_seconds() >= t0);
        assert!(machine_busy_seconds() > 0.0);
    }

    #[test]
    fn child_cpu_and_output_and_time_limit() {
        use std::process::{Command, Stdio};
        let c = Command::new("sh")
            .args(["-c", "echo out; echo err >&2; exit 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let r = wait_child(c, Duration::from_secs(10), "sh").unwrap();
        assert!(!r.success);
        assert_eq!(libc::WEXITSTATUS(r.status), 3);
        assert_eq!(r.stdout.trim(), "out");
        assert_eq!(r.stderr.trim(), "err");
        let c = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = c.id();
        assert!(wait_child(c, Duration::from_millis(100), "sleep").is_err());
        assert!(!alive(pid));
    }
}
