//! The benchmark client: connects, runs one test per size, prints and writes the results.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{Context, Error as BraidError, RailAddr, RemoteKey};

use braid_testbed::parse::RailSpec;

use super::output::{self, Row};
use super::{
    ClientArgs, Ctrl, Done, MAX_DEPTH, Op, PROTO_VERSION, Peer, Report, Setup, SetupReply, secs,
};

mod bw;
mod lat;
mod op_lat;

use bw::{TcpBw, merge_bw, run_bw, tcp_bw};
use lat::{run_lat, tcp_lat};
use op_lat::run_op_lat;

/// Everything a test needs from the command line.
struct Plan {
    rails: Vec<RailSpec>,
    /// `-q`; `None`: `default_depth` of each size.
    depth: Option<usize>,
    verify: bool,
    /// `--rewrite`: the source slot is written before each operation.
    rewrite: bool,
    /// `--touch`: the server touches every page it receives.
    touch: bool,
    iters: u64,
    duration: Option<Duration>,
    max_seconds: f64,
    spin_us: Option<u64>,
    stall: Duration,
    chunk: Option<usize>,
    /// `-v`: pieces per vectored operation.
    pieces: Option<usize>,
    /// `--post-list`: operations per list, the last one signaled.
    post_list: Option<usize>,
    /// `--slots`: buffer slots of the sources (and of the server's region for writes and
    /// reads); `None`: one per operation in flight.
    slots: Option<usize>,
}

impl Plan {
    /// Operations in flight for `size`-byte operations: `-q`, or bench's default.
    fn depth_for(&self, size: usize) -> usize {
        self.depth.unwrap_or_else(|| super::default_depth(size))
    }

    /// Buffer slots of `size` bytes: `--slots`, or one per operation in flight.
    fn slots_for(&self, size: usize) -> usize {
        super::slots_for(size, self.slots.unwrap_or_else(|| self.depth_for(size)))
    }

    /// The plan of one of `rounds` rounds.
    fn sub(&self, rounds: u32) -> Plan {
        Plan {
            rails: self.rails.clone(),
            depth: self.depth,
            verify: self.verify,
            rewrite: self.rewrite,
            touch: self.touch,
            iters: if self.iters == u64::MAX {
                u64::MAX
            } else {
                (self.iters / rounds as u64).max(1)
            },
            duration: self.duration.map(|d| d / rounds),
            max_seconds: self.max_seconds,
            spin_us: self.spin_us,
            stall: self.stall,
            chunk: self.chunk,
            pieces: self.pieces,
            post_list: self.post_list,
            slots: self.slots,
        }
    }
}

/// perftest's `-a`: 2 B .. 8 MiB.
fn all_sizes() -> Vec<usize> {
    (1..=23).map(|k| 1usize << k).collect()
}

pub fn run(op: Op, a: &ClientArgs) -> Result<()> {
    if a.rails.is_empty() {
        bail!("--rails needs at least one rail");
    }
    if a.depth.is_some_and(|d| d == 0 || d > MAX_DEPTH) {
        bail!("-q must be 1 .. {MAX_DEPTH}");
    }
    let duration = a.duration.map(|d| secs(d, "-D")).transpose()?;
    let stall = secs(a.op_timeout, "--peer-timeout")?;
    let iters = match (a.iters, duration) {
        (Some(0), _) => bail!("--iters must be at least 1"),
        (Some(n), _) => n,
        (None, Some(_)) => u64::MAX,
        (None, None) if op.is_lat() => 1000,
        (None, None) => 5000,
    };
    let sizes = if matches!(op, Op::FetchAdd | Op::AtomicLat) {
        if a.all || a.size.is_some_and(|s| s != 8) {
            eprintln!("{} moves 8-byte words; -s/-a ignored", op.name());
        }
        vec![8]
    } else if a.all {
        all_sizes()
    } else {
        vec![a.size.unwrap_or(if op.is_lat() { 2 } else { 65536 })]
    };
    let plan = Plan {
        rails: a.rails.clone(),
        depth: if op.is_lat() { Some(1) } else { a.depth },
        verify: a.verify,
        rewrite: a.rewrite,
        touch: a.touch,
        iters,
        duration,
        // What the server allows for one loop: -D, else a generous bound (the client's own
        // stall timeout catches a dead server much sooner).
        max_seconds: duration.map_or(3600.0, |d| d.as_secs_f64() + 5.0),
        spin_us: a.spin_us,
        stall,
        chunk: a.chunk,
        pieces: a.pieces,
        post_list: a.post_list,
        slots: a.slots,
    };
    if let Some(n) = a.slots {
        if op.is_lat() || op == Op::FetchAdd {
            bail!("--slots applies to the write, read and send bandwidth tests");
        }
        if n == 0 || n > MAX_DEPTH {
            bail!("--slots must be 1 .. {MAX_DEPTH}");
        }
    }
    if let Some(n) = a.post_list {
        if op.is_lat() || op == Op::FetchAdd {
            bail!("--post-list applies to the write, read and send bandwidth tests");
        }
        if a.verify || a.pieces.is_some() {
            bail!("--post-list does not combine with --verify or -v");
        }
        if n == 0 || n > MAX_DEPTH {
            bail!("--post-list must be 1 .. {MAX_DEPTH}");
        }
    }
    if let Some(n) = a.pieces {
        if !matches!(op, Op::Write | Op::Read) {
            bail!("-v/--pieces applies to write and read tests");
        }
        if n == 0 || n > braid::MAX_REMOTE_SGE {
            bail!("-v must be 1 .. {} pieces", braid::MAX_REMOTE_SGE);
        }
        if let Some(s) = sizes.iter().find(|&&s| s < n) {
            bail!("-v {n}: a {s}-byte message cannot be cut into {n} pieces");
        }
    }

    let ctx = Context::new()?;
    let (scq, rcq, opts) = Peer::options(&ctx, a.chunk, &a.window)?;
    let rails: Vec<RailAddr> = a
        .rails
        .iter()
        .map(|r| RailAddr {
            local: Some(SocketAddr::new(r.local.into(), 0)),
            remote: r.remote_sa(),
        })
        .collect();
    let ep = connect(&ctx, &rails, &opts)?;
    let mut peer = Peer::new(&ctx, ep, scq, rcq, stall)?;
    peer.set_spin(a.spin_us);

    let to_stdout = a.json.as_ref().is_some_and(|p| p.as_os_str() == "-");
    let say = |s: &str| {
        if to_stdout {
            eprintln!("{s}");
        } else {
            println!("{s}");
        }
    };
    let mut transports = peer.ep.rail_transports();
    transports.dedup();
    let transport = transports.join(",");
    // What this side sends over same-host rails goes by page exchange when it can.
    let page_exchange = opts.page_exchange && transports.contains(&"shm");
    let mut carried = if page_exchange {
        format!("{transport}, page exchange")
    } else {
        transport.clone()
    };
    // This side's progress threads (`BRAID_ENGINE_THREADS`), when more than one.
    let engine_threads = ctx.engine_threads();
    if engine_threads > 1 {
        carried += &format!(", {engine_threads} engine threads");
    }
    say(&output::header(
        op,
        rails.len(),
        &carried,
        plan.depth,
        a.verify,
        a.baseline,
        (op == Op::Write).then_some(!a.window.strict_placement),
    ));
    let mut rows = Vec::new();
    for &size in &sizes {
        let mut row = if op.is_lat() {
            let run = if op.is_op_lat() { run_op_lat } else { run_lat };
            let mut row = run(&ctx, &mut peer, op, size, false, &plan)?;
            if !a.poll_only {
                let w = run(&ctx, &mut peer, op, size, true, &plan)?;
                row.lat_wait = w.lat_poll;
                row.spin_us = a.spin_us;
                merge_verify(&mut row, w.verified, w.verify_detail);
            }
            row
        } else if a.baseline {
            // Interleave braid and TCP in rounds.
            let rounds = a.rounds.clamp(1, 100);
            let p = plan.sub(rounds);
            let mut row: Option<Row> = None;
            let mut t = TcpBw::default();
            for _ in 0..rounds {
                let r = run_bw(&ctx, &mut peer, op, size, &p)?;
                row = Some(match row {
                    None => r,
                    Some(acc) => merge_bw(acc, r),
                });
                t.add(&tcp_bw(&mut peer, size, &p)?);
            }
            let mut row = row.expect("at least one round");
            let bw = t.bytes as f64 / t.seconds / 1e6;
            row.tcp_bw_mb_s = Some(bw);
            row.tcp_client_cpu_s_per_gb = per_gb(t.client_cpu_s, t.bytes);
            row.tcp_server_cpu_s_per_gb = per_gb(t.server_cpu_s, t.bytes);
            if bw > 0.0 {
                row.ratio = Some(row.bw_mb_s / bw);
                row.ratio_definition = Some(format!(
                    "braid bw_mb_s / one TCP stream on rail 0's path, interleaved in {rounds} round(s)"
                ));
            }
            row
        } else {
            run_bw(&ctx, &mut peer, op, size, &plan)?
        };
        if a.baseline && op.is_lat() {
            // Each braid mode beside the TCP ping-pong of the same mode.
            let l = tcp_lat(&mut peer, op, size, &plan, false)?;
            if l.samples > 0 && l.median > 0.0 {
                row.ratio = row.lat_us_median.map(|b| b / l.median);
                row.ratio_definition = Some(if op.is_op_lat() {
                    "braid median time per operation, busy poll / TCP ping-pong's median round trip, busy poll (non-blocking recv in a spin loop on both sides)".into()
                } else {
                    "braid one-way median latency, busy poll / TCP ping-pong's, busy poll (non-blocking recv in a spin loop on both sides)".into()
                });
            }
            row.tcp_lat_poll = Some(l);
            if !a.poll_only {
                let l = tcp_lat(&mut peer, op, size, &plan, true)?;
                if l.samples > 0 && l.median > 0.0 {
                    row.ratio_wait = row.lat_wait.as_ref().map(|b| b.median / l.median);
                }
                row.tcp_lat = Some(l);
            }
        }
        say(&output::line(op, &row, a.baseline));
        rows.push(row);
    }
    peer.send_ctrl(&Ctrl::Bye)?;
    peer.ep.close();
    say(&"-".repeat(100));
    if let Some(p) = &a.json {
        #[derive(serde::Serialize)]
        struct Doc<'a> {
            op: &'a str,
            rails: usize,
            /// What carried the rails: `tcp`, `shm` (same-host rings), or both.
            transport: &'a str,
            /// The client sent whole pages by page exchange (`BRAID_PAGE_EXCHANGE`).
            page_exchange: bool,
            /// The client's progress threads (`BRAID_ENGINE_THREADS`).
            engine_threads: usize,
            rail_addrs: Vec<String>,
            results: &'a [Row],
        }
        let doc = Doc {
            op: op.name(),
            rails: rails.len(),
            transport: &transport,
            page_exchange,
            engine_threads,
            rail_addrs: a
                .rails
                .iter()
                .map(|r| format!("{}={}", r.local, r.remote))
                .collect(),
            results: &rows,
        };
        let text = serde_json::to_string_pretty(&doc)?;
        if to_stdout {
            println!("{text}");
        } else {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
        }
    }
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.verified == Some(false))
        .map(|r| {
            format!(
                "{} B: {}",
                r.size,
                r.verify_detail.as_deref().unwrap_or("verification failed")
            )
        })
        .collect();
    if !failed.is_empty() {
        bail!("verification failed: {}", failed.join("; "));
    }
    Ok(())
}

/// Connects, retrying refusals for up to 5 s (the server may still be starting).
fn connect(
    ctx: &Context,
    rails: &[RailAddr],
    opts: &braid::EndpointOptions,
) -> Result<braid::Endpoint> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut attempt = 0u64;
    loop {
        match ctx.connect(rails, opts) {
            Ok(ep) => return Ok(ep),
            Err(BraidError::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                attempt += 1;
                std::thread::sleep(Duration::from_millis((20 * attempt).min(200)));
            }
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "connecting to the bench server over {}",
                        rails
                            .iter()
                            .map(|r| r.to_string())
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                });
            }
        }
    }
}

fn merge_verify(row: &mut Row, v: Option<bool>, detail: Option<String>) {
    if let Some(v) = v {
        let ok = row.verified.unwrap_or(true) && v;
        if !v || row.verify_detail.is_none() {
            row.verify_detail = detail;
        }
        row.verified = Some(ok);
    }
}

fn setup_test(peer: &mut Peer, setup: Setup) -> Result<SetupReply> {
    peer.ensure_recv()?;
    let op = setup.op;
    peer.send_ctrl(&Ctrl::Setup(setup))?;
    match peer.wait_ctrl(peer.stall * 3)? {
        Ctrl::SetupReply(r) => {
            if let Some(e) = r.error {
                bail!("the server refused the {} test: {e}", op.name());
            }
            Ok(r)
        }
        other => bail!("expected the server's setup reply, got {other:?}"),
    }
}

fn finish_test(peer: &mut Peer, iterations: u64) -> Result<Report> {
    peer.ensure_recv()?;
    peer.send_ctrl(&Ctrl::Done(Done { iterations }))?;
    let r = match peer.wait_ctrl(peer.stall * 3)? {
        Ctrl::Report(r) => r,
        other => bail!("expected the server's report, got {other:?}"),
    };
    peer.send_pads(r.leftover_recvs)?;
    if let Some(e) = &r.error {
        bail!("server: {e}");
    }
    Ok(r)
}

fn setup_for(op: Op, size: usize, plan: &Plan, wait_mode: bool) -> Setup {
    Setup {
        version: PROTO_VERSION,
        op,
        size,
        depth: plan.depth_for(size),
        verify: plan.verify,
        touch: plan.touch,
        wait_mode,
        max_seconds: plan.max_seconds,
        spin_us: plan.spin_us,
        client_key: None,
        slots: plan.slots,
    }
}

fn per_gb(cpu: f64, bytes: u64) -> Option<f64> {
    (bytes > 0 && cpu.is_finite()).then(|| cpu / (bytes as f64 / 1e9))
}

fn remote_key(r: &SetupReply) -> Result<RemoteKey> {
    RemoteKey::from_bytes(&r.key).context("the server's setup reply lacks a remote key")
}
