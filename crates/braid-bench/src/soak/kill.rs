//! `--kill-peer`: a stream of writes to a peer process (`braid soak-peer`) that is killed or
//! stopped part-way.

use std::io::{BufRead, BufReader, Write as _};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use braid::{Access, CompletionQueue, Context, EndpointOptions, RailAddr, RemoteKey, Status};
use rustix::process::{Pid, Signal, kill_process};
use serde::{Deserialize, Serialize};

use super::net::{Net, join, session_config};
use super::util::{fill, hex, secs, unhex};
use super::{KillSignal, PeerArgs, SETUP_TIMEOUT, SoakArgs};

// ------------------------------------------------------------------ killed peer

/// Result of `--kill-peer`.
#[derive(Debug, Default, Serialize)]
pub struct KillReport {
    /// "kill-peer".
    pub mode: String,
    /// "netns" or "loopback".
    pub network: String,
    /// The signal sent.
    pub signal: Option<KillSignal>,
    /// The configured peer_timeout, seconds.
    pub peer_timeout_s: f64,
    /// Writes posted.
    pub posted: u64,
    /// Completions received (one per posted write).
    pub completions: u64,
    /// Writes that succeeded.
    pub succeeded: u64,
    /// Writes that completed with an error.
    pub failed: u64,
    /// Error statuses seen.
    pub statuses: Vec<String>,
    /// Seconds from the signal to the first error completion.
    pub first_error_s: f64,
    /// Seconds from the signal to the last completion.
    pub last_completion_s: f64,
    /// The bound: peer_timeout + 1 s.
    pub bound_s: f64,
    /// What went wrong.
    pub errors: Vec<String>,
    /// True when every check passed.
    pub passed: bool,
}

/// One completion: wr_id, status, when.
pub(super) type Done = (u64, Status, Instant);

/// Kills (by its pid) and reaps a child this run started.
pub(super) fn kill_child(child: &mut Child) {
    // kill(2) on the pid of our own child; SIGKILL also ends a stopped process.
    let _ = kill_process(Pid::from_child(child), Signal::KILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!(
        "braid soak: child {} did not exit after SIGKILL",
        child.id()
    );
}

pub(super) struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            kill_child(&mut self.0);
        }
    }
}

/// The peer's announcement on its stdout.
#[derive(Serialize, Deserialize)]
pub(super) struct PeerHello {
    addrs: Vec<SocketAddr>,
    key: String,
}

/// `braid soak-peer`: listens, prints its addresses and region key, serves one endpoint.
pub fn peer_main(a: &PeerArgs) -> Result<()> {
    if a.listen.is_empty() {
        bail!("--listen needs at least one address");
    }
    let max = secs(a.max_seconds, "--max-seconds")?;
    let ctx = Context::new()?;
    let listener = ctx.listen(&a.listen)?;
    let region = ctx.alloc_region(a.size, Access::all())?;
    let hello = PeerHello {
        addrs: listener.local_addrs(),
        key: hex(&region.remote_key().to_bytes()),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", serde_json::to_string(&hello)?)?;
    out.flush()?;
    drop(out);
    let cq = ctx.create_cq(64);
    let mut opts = EndpointOptions::new(&cq);
    opts.session = session_config(secs(a.peer_timeout, "--peer-timeout")?);
    let ep = listener.accept(&opts, SETUP_TIMEOUT)?;
    let t0 = Instant::now();
    // Serve until the client goes away or the time is up (a bounded poll of the state).
    while !ep.is_closed() && t0.elapsed() < max {
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A stream of writes to a peer process that is killed (or stopped) part-way.
pub fn kill_peer(a: &SoakArgs) -> Result<KillReport> {
    let peer_timeout = secs(a.peer_timeout, "--peer-timeout")?;
    let kill_after = secs(a.fail_after, "--kill-after")?;
    let op = a.op_size.clamp(4096, 16 << 20);
    let depth = a.depth.clamp(1, 64);
    let net = Net::new(
        a.rails,
        a.rate.shaped("use --loopback for unshaped rails")?,
        a.loopback,
    )?;
    let exe = std::env::current_exe().context("locating the braid executable")?;
    let addrs: Vec<String> = net.server_addrs().iter().map(|a| a.to_string()).collect();
    let region = 16 * op;
    let mut cmd = net.command(1, &exe);
    cmd.args(["soak-peer", "--listen", &addrs.join(",")])
        .arg("--size")
        .arg(region.to_string())
        .arg("--peer-timeout")
        .arg(a.peer_timeout.to_string())
        .arg("--max-seconds")
        .arg("60")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = ChildGuard(cmd.spawn().context("starting the peer process")?);
    let pid = child.0.id();
    let stdout = child.0.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let r = BufReader::new(stdout).read_line(&mut line).map(|_| line);
        let _ = tx.send(r);
    });
    let line = rx
        .recv_timeout(SETUP_TIMEOUT)
        .map_err(|_| anyhow!("the peer process did not announce itself within {SETUP_TIMEOUT:?}"))?
        .context("reading the peer's announcement")?;
    let hello: PeerHello = serde_json::from_str(line.trim())
        .with_context(|| format!("bad announcement from the peer: {line:?}"))?;
    let key = unhex(&hello.key)
        .and_then(|b| RemoteKey::from_bytes(&b))
        .ok_or_else(|| anyhow!("bad key from the peer"))?;
    // `ip netns exec` execs the program in place, so the pid is the peer's own.
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() == "ip" {
        bail!("pid {pid} is `ip`, not the peer: cannot signal the peer by pid");
    }

    let cq = CompletionQueue::new(depth + 16);
    let mut copts = EndpointOptions::new(&cq);
    copts.session = session_config(peer_timeout);
    let ips = net.client_ips();
    let rails: Vec<RailAddr> = hello
        .addrs
        .iter()
        .zip(&ips)
        .map(|(r, ip)| RailAddr::new(Some(*ip), *r))
        .collect();
    let signalled = Arc::new(AtomicBool::new(false));
    let job = {
        let signalled = signalled.clone();
        net.spawn(0, move || -> Result<(u64, Vec<Done>)> {
            let ctx = super::net::harness_context()?;
            let ep = ctx.connect(&rails, &copts)?;
            let src = ctx.alloc_region(op, Access::all())?;
            let mut pat = vec![0u8; op];
            fill(7, &mut pat);
            src.write_at(0, &pat)?;
            let mut done = Vec::new();
            let mut posted = 0u64;
            let mut outstanding = 0usize;
            let mut failed = false;
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                while !failed && outstanding < depth {
                    let off = ((posted as usize) % 16 * op) as u64;
                    match ep.write(posted, &[src.as_sge()], &key, off) {
                        Ok(()) => {
                            posted += 1;
                            outstanding += 1;
                        }
                        Err(_) if signalled.load(Ordering::Acquire) => {
                            failed = true;
                        }
                        Err(e) => return Err(e).context("posting a write before the signal"),
                    }
                }
                if outstanding == 0 {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{outstanding} write(s) still outstanding after 120 s");
                }
                if let Some(c) = cq.wait(Duration::from_millis(100)) {
                    outstanding -= 1;
                    if c.status != Status::Success {
                        if !signalled.load(Ordering::Acquire) {
                            bail!("a write failed before the peer was signalled: {c:?}");
                        }
                        failed = true;
                    }
                    done.push((c.wr_id, c.status, Instant::now()));
                }
            }
            // Nothing more may arrive.
            if let Some(c) = cq.wait(Duration::from_millis(200)) {
                bail!("an extra completion arrived: {c:?}");
            }
            drop(ep);
            Ok((posted, done))
        })?
    };
    let t0 = Instant::now();
    let mut t_sig = None;
    while !job.is_finished() {
        if t_sig.is_none() && t0.elapsed() >= kill_after {
            let sig = match a.kill_signal {
                KillSignal::Kill => Signal::KILL,
                KillSignal::Stop => Signal::STOP,
            };
            // kill(2) on the pid of the child this run started.
            if let Err(e) = kill_process(Pid::from_child(&child.0), sig) {
                bail!("kill({pid}): {}", std::io::Error::from(e));
            }
            t_sig = Some(Instant::now());
            signalled.store(true, Ordering::Release);
        }
        if t0.elapsed() > Duration::from_secs(150) {
            bail!("the writer did not finish within 150 s");
        }
        // The schedule of the signal, not synchronisation.
        std::thread::sleep(Duration::from_millis(2));
    }
    let res = join(job);
    drop(child);
    let (posted, done) = res?;
    let t_sig = t_sig.ok_or_else(|| anyhow!("the writes ended before the peer was signalled"))?;
    let mut r = KillReport {
        mode: "kill-peer".into(),
        network: net.kind().into(),
        signal: Some(a.kill_signal),
        peer_timeout_s: peer_timeout.as_secs_f64(),
        posted,
        completions: done.len() as u64,
        bound_s: peer_timeout.as_secs_f64() + 1.0,
        ..Default::default()
    };
    let mut errors = Vec::new();
    let ids: Vec<u64> = done.iter().map(|d| d.0).collect();
    if ids != (0..posted).collect::<Vec<_>>() {
        errors.push(format!(
            "completions are not exactly one per posted write in order ({} for {posted})",
            ids.len()
        ));
    }
    let mut statuses = std::collections::BTreeSet::new();
    for (_, s, at) in &done {
        if *s == Status::Success {
            r.succeeded += 1;
        } else {
            r.failed += 1;
            statuses.insert(format!("{s:?}"));
            if r.failed == 1 {
                r.first_error_s = at.saturating_duration_since(t_sig).as_secs_f64();
            }
        }
    }
    r.statuses = statuses.into_iter().collect();
    r.last_completion_s = done
        .last()
        .map(|d| d.2.saturating_duration_since(t_sig).as_secs_f64())
        .unwrap_or(0.0);
    if r.failed == 0 {
        errors.push("no write failed after the peer was signalled".into());
    }
    if r.last_completion_s > r.bound_s {
        errors.push(format!(
            "the last completion came {:.2} s after the signal, beyond peer_timeout + 1 s = {:.2} s",
            r.last_completion_s, r.bound_s
        ));
    }
    drop(net);
    r.passed = errors.is_empty();
    println!(
        "kill-peer on {} (SIG{}, peer_timeout {:.2} s): {} writes posted, {} ok, {} failed ({}); first error {:.3} s after the signal, last completion {:.3} s (bound {:.2} s)",
        r.network,
        match a.kill_signal {
            KillSignal::Kill => "KILL",
            KillSignal::Stop => "STOP",
        },
        r.peer_timeout_s,
        r.posted,
        r.succeeded,
        r.failed,
        r.statuses.join(","),
        r.first_error_s,
        r.last_completion_s,
        r.bound_s
    );
    for e in &errors {
        println!("  ERROR: {e}");
    }
    println!("  {}", if r.passed { "PASSED" } else { "FAILED" });
    r.errors = errors;
    Ok(r)
}
