//! The benchmark client: connects, runs one test per size, prints and writes the results.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{
    Access, CompletionKind, Context, Error as BraidError, RailAddr, RemoteKey, RemoteSge, Sge,
};

use braid_cli::parse::RailSpec;

use super::output::{self, LatStats, Row};
use super::{
    CTRL_LEN, ClientArgs, Ctrl, DATA_IMM_MASK, Done, MAX_DEPTH, Op, PROTO_VERSION, Peer, Progress,
    READ_SEED, Report, Setup, SetupReply, check_status, cpu_seconds, rail_delta, region_matches,
    secs, slots_for, tcp, write_pattern,
};

/// Everything a test needs from the command line.
struct Plan {
    rails: Vec<RailSpec>,
    /// `-q`; `None`: `default_depth` of each size.
    depth: Option<usize>,
    verify: bool,
    iters: u64,
    duration: Option<Duration>,
    max_seconds: f64,
    spin_us: Option<u64>,
    stall: Duration,
    chunk: Option<usize>,
    /// `-v`: pieces per vectored operation.
    pieces: Option<usize>,
}

impl Plan {
    /// Operations in flight for `size`-byte operations: `-q`, or bench's default.
    fn depth_for(&self, size: usize) -> usize {
        self.depth.unwrap_or_else(|| super::default_depth(size))
    }

    /// The plan of one of `rounds` rounds.
    fn sub(&self, rounds: u32) -> Plan {
        Plan {
            rails: self.rails.clone(),
            depth: self.depth,
            verify: self.verify,
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
        }
    }
}

/// Sums two rounds of a bandwidth test.
fn merge_bw(a: Row, b: Row) -> Row {
    let add = |x: &[u64], y: &[u64]| -> Vec<u64> {
        (0..x.len().max(y.len()))
            .map(|i| x.get(i).copied().unwrap_or(0) + y.get(i).copied().unwrap_or(0))
            .collect()
    };
    let iterations = a.iterations + b.iterations;
    let bytes = a.bytes + b.bytes;
    let seconds = a.seconds + b.seconds;
    let client_cpu_s = a.client_cpu_s + b.client_cpu_s;
    let server_cpu_s = a.server_cpu_s + b.server_cpu_s;
    let mut r = Row {
        iterations,
        bytes,
        seconds,
        bw_mb_s: bytes as f64 / seconds / 1e6,
        msg_rate: iterations as f64 / seconds,
        msg_rate_mpps: iterations as f64 / seconds / 1e6,
        client_cpu_s,
        server_cpu_s,
        client_cpu_s_per_gb: per_gb(client_cpu_s, bytes),
        server_cpu_s_per_gb: per_gb(server_cpu_s, bytes),
        rail_bytes: add(&a.rail_bytes, &b.rail_bytes),
        client_rail_bytes: add(&a.client_rail_bytes, &b.client_rail_bytes),
        server_rail_bytes: add(&a.server_rail_bytes, &b.server_rail_bytes),
        ..a
    };
    merge_verify(&mut r, b.verified, b.verify_detail);
    r
}

/// Sums of the TCP stream baseline over rounds.
#[derive(Default)]
struct TcpBw {
    bytes: u64,
    seconds: f64,
    client_cpu_s: f64,
    server_cpu_s: f64,
}

impl TcpBw {
    fn add(&mut self, o: &TcpBw) {
        self.bytes += o.bytes;
        self.seconds += o.seconds;
        self.client_cpu_s += o.client_cpu_s;
        self.server_cpu_s += o.server_cpu_s;
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
    let stall = secs(a.op_timeout, "--op-timeout")?;
    let iters = match (a.iters, duration) {
        (Some(0), _) => bail!("-n must be at least 1"),
        (Some(n), _) => n,
        (None, Some(_)) => u64::MAX,
        (None, None) if op.is_lat() => 1000,
        (None, None) => 5000,
    };
    let sizes = if op == Op::FetchAdd {
        if a.all || a.size.is_some_and(|s| s != 8) {
            eprintln!("fetch-add moves 8-byte words; -s/-a ignored");
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
        iters,
        duration,
        // What the server allows for one loop: -D, else a generous bound (the client's own
        // stall timeout catches a dead server much sooner).
        max_seconds: duration.map_or(3600.0, |d| d.as_secs_f64() + 5.0),
        spin_us: a.spin_us,
        stall,
        chunk: a.chunk,
        pieces: a.pieces,
    };
    if let Some(n) = a.pieces {
        if !matches!(op, Op::Write | Op::Read) {
            bail!("-v/--pieces applies to write and read tests");
        }
        if n == 0 || n > braid::wire::sgl::MAX_REMOTE_SGE {
            bail!(
                "-v must be 1 .. {} pieces",
                braid::wire::sgl::MAX_REMOTE_SGE
            );
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
    say(&output::header(
        op,
        rails.len(),
        plan.depth,
        a.verify,
        a.baseline,
        (op == Op::Write).then_some(!a.window.strict_placement),
    ));
    let mut rows = Vec::new();
    for &size in &sizes {
        let mut row = if op.is_lat() {
            let mut row = run_lat(&ctx, &mut peer, op, size, false, &plan)?;
            if !a.poll_only {
                let w = run_lat(&ctx, &mut peer, op, size, true, &plan)?;
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
            let l = tcp_lat(&mut peer, size, &plan, false)?;
            if l.samples > 0 && l.median > 0.0 {
                row.ratio = row.lat_us_median.map(|b| b / l.median);
                row.ratio_definition = Some(
                    "braid one-way median latency, busy poll / TCP ping-pong's, busy poll (non-blocking recv in a spin loop on both sides)".into(),
                );
            }
            row.tcp_lat_poll = Some(l);
            if !a.poll_only {
                let l = tcp_lat(&mut peer, size, &plan, true)?;
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
            rail_addrs: Vec<String>,
            results: &'a [Row],
        }
        let doc = Doc {
            op: op.name(),
            rails: rails.len(),
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
        wait_mode,
        max_seconds: plan.max_seconds,
        spin_us: plan.spin_us,
        client_key: None,
    }
}

fn per_gb(cpu: f64, bytes: u64) -> Option<f64> {
    (bytes > 0 && cpu.is_finite()).then(|| cpu / (bytes as f64 / 1e9))
}

fn remote_key(r: &SetupReply) -> Result<RemoteKey> {
    RemoteKey::from_bytes(&r.key).context("the server's setup reply lacks a remote key")
}

/// A bandwidth test: keep `depth` operations in flight until -n or -D.
fn run_bw(ctx: &Context, peer: &mut Peer, op: Op, size: usize, plan: &Plan) -> Result<Row> {
    let reply = setup_test(peer, setup_for(op, size, plan, false))?;
    let rkey = if op == Op::Send {
        RemoteKey { key: 0, len: 0 }
    } else {
        remote_key(&reply)?
    };
    let rslots = reply.slots.max(1) as u64;
    let fetch = op == Op::FetchAdd;
    let lslots = if fetch {
        1
    } else {
        slots_for(size, plan.depth_for(size))
    };
    // With --verify a local slot is reused only after its previous operation completed.
    let depth = if plan.verify && !fetch {
        plan.depth_for(size).min(lslots)
    } else {
        plan.depth_for(size)
    } as u64;
    let local = ctx.alloc_region_with(lslots * size, Access::LOCAL_WRITE, super::POPULATED)?;
    let mut scratch = Vec::new();
    let mut got = Vec::new();
    if !plan.verify && matches!(op, Op::Write | Op::Send) {
        for k in 0..lslots {
            write_pattern(&local, k * size, size, k as u64, &mut scratch)?;
        }
    }
    // Per slot, the local list: one entry, or with -v the slot cut in pieces.
    let npieces = plan.pieces.unwrap_or(1);
    let cut = |len: usize| -> Vec<(usize, usize)> {
        (0..npieces)
            .map(|j| {
                let (a, b) = (j * len / npieces, (j + 1) * len / npieces);
                (a, b - a)
            })
            .collect()
    };
    let sges: Vec<Vec<Sge>> = (0..lslots)
        .map(|k| {
            cut(size)
                .into_iter()
                .map(|(o, l)| local.slice(k * size + o, l))
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    let lslots = lslots as u64;

    let label = format!("{} {size} B", op.name());
    let mut prog = Progress::new(label, plan.duration, plan.iters);
    let rails0 = peer.rail_bytes();
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let deadline = plan.duration.map(|d| t0 + d);
    let (mut posted, mut done) = (0u64, 0u64);
    let mut stop = false;
    let mut comps = Vec::with_capacity(256);
    let mut last_progress = Instant::now();
    let mut bad: Option<String> = None;
    loop {
        if !stop && (posted >= plan.iters || deadline.is_some_and(|d| Instant::now() >= d)) {
            stop = true;
        }
        while !stop && posted - done < depth && posted < plan.iters {
            let i = posted;
            let slot = (i % lslots) as usize;
            let roff = (i % rslots) * size as u64;
            let sge = &sges[slot][..];
            if plan.verify {
                match op {
                    Op::Write | Op::Send => {
                        write_pattern(&local, slot * size, size, i, &mut scratch)?
                    }
                    Op::Read => local.fill(slot * size, size, 0)?,
                    _ => {}
                }
            }
            let remote = || -> Vec<RemoteSge> {
                cut(size)
                    .into_iter()
                    .map(|(o, l)| RemoteSge::new(rkey, roff + o as u64, l as u64))
                    .collect()
            };
            let r = match op {
                Op::Write if plan.pieces.is_some() => peer.ep.write_v(i, sge, &remote()),
                Op::Read if plan.pieces.is_some() => peer.ep.read_v(i, sge, &remote()),
                Op::Write => peer.ep.write(i, sge, &rkey, roff),
                Op::Read => peer.ep.read(i, sge, &rkey, roff),
                Op::Send => peer.ep.send(i, sge),
                _ => peer.ep.fetch_add(i, &rkey, 0, 1),
            };
            match r {
                Ok(()) => posted += 1,
                Err(BraidError::QueueFull { .. }) => break,
                Err(e) => return Err(e).with_context(|| format!("posting {} #{i}", op.name())),
            }
        }
        if stop && done == posted {
            break;
        }
        comps.clear();
        if peer.scq.poll_many(&mut comps, 256) == 0
            && let Some(c) = peer.scq.wait(Duration::from_millis(50))
        {
            comps.push(c);
        }
        if comps.is_empty() {
            if last_progress.elapsed() > plan.stall {
                bail!(
                    "{}: no completion for {:?} with {} operation(s) in flight (server gone?)",
                    op.name(),
                    plan.stall,
                    posted - done
                );
            }
            if peer.ep.is_closed() {
                bail!("{}: the endpoint closed (server gone?)", op.name());
            }
            continue;
        }
        last_progress = Instant::now();
        for c in &comps {
            check_status(c, op.name())?;
            if c.wr_id != done {
                bail!(
                    "{}: completion {} arrived where {done} was due (order broken)",
                    op.name(),
                    c.wr_id
                );
            }
            if plan.verify && bad.is_none() && op == Op::Read {
                let slot = (done % lslots) as usize;
                let seed = READ_SEED + done % rslots;
                if let Err(off) =
                    region_matches(&local, slot * size, size, seed, &mut got, &mut scratch)?
                {
                    bad = Some(format!("read #{done}: first wrong byte at offset {off}"));
                }
            }
            if fetch && bad.is_none() && c.value != Some(done) {
                bad = Some(format!(
                    "fetch-add #{done} returned {:?}, expected {done}",
                    c.value
                ));
            }
            done += 1;
        }
        prog.tick(done);
    }
    let seconds = t0.elapsed().as_secs_f64();
    let client_cpu = cpu_seconds() - cpu0;
    prog.finish();
    let client_rails = rail_delta(&peer.rail_bytes(), &rails0);
    let report = finish_test(peer, done)?;
    let bytes = done * size as u64;
    let mut row = Row {
        op: op.name().into(),
        size,
        iterations: done,
        bytes,
        seconds,
        bw_mb_s: bytes as f64 / seconds / 1e6,
        msg_rate: done as f64 / seconds,
        msg_rate_mpps: done as f64 / seconds / 1e6,
        rails: peer.ep.rail_count(),
        depth: depth as usize,
        chunk_size: plan.chunk,
        client_cpu_s: client_cpu,
        server_cpu_s: report.cpu_s,
        client_cpu_s_per_gb: per_gb(client_cpu, bytes),
        server_cpu_s_per_gb: per_gb(report.cpu_s, bytes),
        rail_bytes: if op == Op::Read {
            report.rail_bytes.clone()
        } else {
            client_rails.clone()
        },
        client_rail_bytes: client_rails,
        server_rail_bytes: report.rail_bytes.clone(),
        pieces: plan.pieces,
        server_file: reply.file.clone(),
        ..Default::default()
    };
    if plan.verify && op == Op::Read || fetch {
        row.verified = Some(bad.is_none());
        row.verify_detail = Some(
            bad.clone()
                .unwrap_or_else(|| format!("{done} completions checked by the client")),
        );
    }
    merge_verify(&mut row, report.verified, report.verify_detail);
    if op == Op::Send && report.messages != done {
        row.verified = Some(false);
        row.verify_detail = Some(format!(
            "the server received {} messages, the client completed {done}",
            report.messages
        ));
    }
    Ok(row)
}

/// A ping-pong latency test (busy-polled, or blocking in `cq.wait` when `wait_mode`).
fn run_lat(
    ctx: &Context,
    peer: &mut Peer,
    op: Op,
    size: usize,
    wait_mode: bool,
    plan: &Plan,
) -> Result<Row> {
    let write = op == Op::WriteLat;
    let src = ctx.alloc_region(size, Access::LOCAL_WRITE)?;
    let dst = ctx.alloc_region(size.max(8), Access::all())?;
    let rbuf_len = if write { CTRL_LEN } else { size.max(CTRL_LEN) };
    let rbuf = ctx.alloc_region(rbuf_len, Access::LOCAL_WRITE)?;
    let mut setup = setup_for(op, size, plan, wait_mode);
    setup.client_key = Some(dst.remote_key().to_bytes().to_vec());
    let reply = setup_test(peer, setup)?;
    let rkey = remote_key(&reply)?;
    let mut scratch = Vec::new();
    let mut got = Vec::new();
    if !plan.verify {
        write_pattern(&src, 0, size, 0, &mut scratch)?;
    }
    let ping = src.slice(0, size)?;
    let warmup = if plan.iters == u64::MAX {
        100
    } else {
        (plan.iters / 10).min(100)
    };
    let mode = if wait_mode { "wait" } else { "poll" };
    let mut prog = Progress::new(
        format!("{} {size} B ({mode})", op.name()),
        plan.duration,
        plan.iters,
    );
    let mut rtts: Vec<u64> = Vec::with_capacity(plan.iters.min(1 << 22) as usize);
    let mut outstanding = 0usize;
    let mut bad: Option<String> = None;
    let rails0 = peer.rail_bytes();
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut t_measured = t0;
    let deadline = plan.duration.map(|d| t0 + d);
    let mut i = 0u64;
    loop {
        if i == warmup {
            t_measured = Instant::now();
        }
        if i >= warmup
            && (rtts.len() as u64 >= plan.iters || deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
        peer.post_recv(rbuf.slice(0, rbuf_len)?)?;
        if plan.verify {
            write_pattern(&src, 0, size, i, &mut scratch)?;
        }
        let imm = (i as u32) & DATA_IMM_MASK;
        let t = Instant::now();
        loop {
            let r = if write {
                peer.ep
                    .write_with_imm(i, std::slice::from_ref(&ping), &rkey, 0, imm)
            } else {
                peer.ep.send(i, std::slice::from_ref(&ping))
            };
            match r {
                Ok(()) => {
                    outstanding += 1;
                    break;
                }
                Err(BraidError::QueueFull { .. }) if t.elapsed() < plan.stall => {
                    if let Some(c) = peer.scq.wait(Duration::from_millis(10)) {
                        check_status(&c, "ping")?;
                        outstanding -= 1;
                    }
                }
                Err(e) => return Err(e).context("posting a ping"),
            }
        }
        let mut spins = 0u32;
        let c = loop {
            let c = if wait_mode {
                peer.rcq.wait(Duration::from_millis(50))
            } else {
                peer.rcq.poll()
            };
            if let Some(c) = c {
                break c;
            }
            if !wait_mode {
                // The progress engine thread has to run for the pong to arrive; on a machine
                // with fewer free cores than busy threads a pure spin starves it.
                std::thread::yield_now();
            }
            spins = spins.wrapping_add(1);
            if (wait_mode || spins.is_multiple_of(4096)) && t.elapsed() > plan.stall {
                bail!("{}: no pong for {:?} (server gone?)", op.name(), plan.stall);
            }
        };
        let rtt = t.elapsed().as_nanos() as u64;
        peer.take(&c)?;
        check_status(&c, "pong")?;
        let ok_kind = if write {
            c.kind == CompletionKind::RecvWriteImm && c.imm == Some(imm)
        } else {
            c.kind == CompletionKind::Recv && c.imm.is_none() && c.byte_len == size as u64
        };
        if !ok_kind {
            bail!("{}: unexpected completion for ping {i}: {c:?}", op.name());
        }
        if plan.verify && bad.is_none() {
            let (r, off) = if write { (&dst, 0) } else { (&rbuf, 0) };
            if let Err(o) = region_matches(r, off, size, i, &mut got, &mut scratch)? {
                bad = Some(format!("pong {i}: first wrong byte at offset {o}"));
            }
        }
        while let Some(c) = peer.scq.poll() {
            check_status(&c, "ping")?;
            outstanding -= 1;
        }
        if i >= warmup {
            rtts.push(rtt);
        }
        i += 1;
        prog.tick(rtts.len() as u64);
    }
    let seconds = t_measured.elapsed().as_secs_f64();
    let client_cpu = cpu_seconds() - cpu0;
    prog.finish();
    let until = Instant::now() + plan.stall;
    while outstanding > 0 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("{outstanding} ping(s) never completed");
        }
        if let Some(c) = peer.scq.wait(left) {
            check_status(&c, "ping")?;
            outstanding -= 1;
        }
    }
    let client_rails = rail_delta(&peer.rail_bytes(), &rails0);
    let report = finish_test(peer, i)?;
    let l = LatStats::from_rtts(&mut rtts);
    let n = l.samples as u64;
    let bytes = n * size as u64;
    let mut row = Row {
        op: op.name().into(),
        size,
        iterations: n,
        bytes,
        seconds,
        bw_mb_s: bytes as f64 / seconds / 1e6,
        msg_rate: n as f64 / seconds,
        msg_rate_mpps: n as f64 / seconds / 1e6,
        rails: peer.ep.rail_count(),
        depth: 1,
        chunk_size: plan.chunk,
        client_cpu_s: client_cpu,
        server_cpu_s: report.cpu_s,
        client_cpu_s_per_gb: per_gb(client_cpu, 2 * bytes),
        server_cpu_s_per_gb: per_gb(report.cpu_s, 2 * bytes),
        rail_bytes: client_rails.clone(),
        client_rail_bytes: client_rails,
        server_rail_bytes: report.rail_bytes.clone(),
        lat_definition: Some(
            "one-way latency = round-trip time / 2 (perftest convention); rtt_* = full round trip; \
             bw_mb_s/msg_rate count one direction; CPU/GB counts both directions"
                .into(),
        ),
        lat_us_min: Some(l.min),
        lat_us_median: Some(l.median),
        lat_us_p99: Some(l.p99),
        rtt_us_median: Some(l.median * 2.0),
        lat_poll: Some(l),
        ..Default::default()
    };
    if plan.verify {
        row.verified = Some(bad.is_none());
        row.verify_detail = Some(bad.unwrap_or_else(|| format!("{i} pongs checked by the client")));
    }
    merge_verify(&mut row, report.verified, report.verify_detail);
    Ok(row)
}

/// One TCP stream of `size`-byte messages on rail 0's path, for as long as the braid test.
fn tcp_bw(peer: &mut Peer, size: usize, plan: &Plan) -> Result<TcpBw> {
    let reply = setup_test(peer, setup_for(Op::TcpStream, size, plan, false))?;
    let port = reply
        .tcp_port
        .context("no TCP baseline port in the reply")?;
    let mut s = tcp::connect(&plan.rails[0], port)?;
    let cpu0 = cpu_seconds();
    let deadline = plan.duration.map(|d| Instant::now() + d);
    let (n, seconds) = tcp::stream(&mut s, size, plan.iters, deadline)?;
    let cpu = cpu_seconds() - cpu0;
    drop(s);
    let report = finish_test(peer, n)?;
    let bytes = n * size as u64;
    if report.bytes != bytes {
        bail!(
            "TCP baseline: sent {bytes} bytes, the server received {}",
            report.bytes
        );
    }
    Ok(TcpBw {
        bytes,
        seconds,
        client_cpu_s: cpu,
        server_cpu_s: report.cpu_s,
    })
}

/// A TCP ping-pong of `size` bytes on rail 0's path, blocking in `recv` on both sides if
/// `wait_mode`, else spinning on non-blocking sockets.
fn tcp_lat(peer: &mut Peer, size: usize, plan: &Plan, wait_mode: bool) -> Result<LatStats> {
    let reply = setup_test(peer, setup_for(Op::TcpPingPong, size, plan, wait_mode))?;
    let port = reply
        .tcp_port
        .context("no TCP baseline port in the reply")?;
    let mut s = tcp::connect(&plan.rails[0], port)?;
    let warmup = if plan.iters == u64::MAX {
        100
    } else {
        (plan.iters / 10).min(100)
    };
    let deadline = plan.duration.map(|d| Instant::now() + d);
    let mut rtts = tcp::ping_pong(&mut s, size, !wait_mode, warmup, plan.iters, deadline)?;
    drop(s);
    finish_test(peer, rtts.len() as u64 + warmup)?;
    Ok(LatStats::from_rtts(&mut rtts))
}
