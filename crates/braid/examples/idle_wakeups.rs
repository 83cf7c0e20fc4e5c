//! How often an idle progress engine wakes: two contexts on loopback joined by one endpoint
//! of two rails, left idle; prints the voluntary context switches of each `braid-progress`
//! thread over the period (Linux procfs). The engine sleeps until its sessions' next
//! keepalive or peer-timeout deadline (`Session::poll_timeout`).
//!
//! Run: `cargo run --release -p braid --example idle_wakeups -- 10` (seconds; default 5).

use std::net::SocketAddr;
use std::time::Duration;

use braid::{Context, EndpointOptions, RailAddr};

/// (thread id, voluntary context switches) of every engine thread of this process.
fn engine_switches() -> std::io::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task")? {
        let dir = task?.path();
        if std::fs::read_to_string(dir.join("comm"))?.trim() != "braid-progress" {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status"))?;
        let n = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let tid = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        out.push((tid, n));
    }
    out.sort();
    Ok(out)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let secs: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 5,
    };
    let server = Context::new()?;
    let rails: Vec<SocketAddr> = vec!["127.0.0.1:0".parse()?, "127.0.0.2:0".parse()?];
    let listener = server.listen(&rails)?;
    let addrs = listener.local_addrs().to_vec();
    let scq = server.create_cq(16);
    let sopts = EndpointOptions::new(&scq);
    let acceptor = std::thread::spawn(move || listener.accept(&sopts, Duration::from_secs(10)));
    let client = Context::new()?;
    let cq = client.create_cq(16);
    let remote: Vec<RailAddr> = addrs
        .iter()
        .map(|a| RailAddr {
            local: None,
            remote: *a,
        })
        .collect();
    let _ep = client.connect(&remote, &EndpointOptions::new(&cq))?;
    let _sep = acceptor.join().map_err(|_| "the acceptor panicked")??;
    // The connection's own traffic settles first; what follows is idle.
    std::thread::sleep(Duration::from_secs(1));
    let before = engine_switches()?;
    std::thread::sleep(Duration::from_secs(secs));
    let after = engine_switches()?;
    for ((tid, a), (_, b)) in before.iter().zip(&after) {
        println!(
            "engine thread {tid}: {} wake-ups in {secs} s idle = {:.1}/s",
            b - a,
            (b - a) as f64 / secs.max(1) as f64
        );
    }
    Ok(())
}
