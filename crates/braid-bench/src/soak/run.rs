//! The default soak mode: workers, dispatcher, rail flapping, final verification and summary.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SendError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use braid::{Access, Completion, CompletionQueue, Endpoint, EndpointOptions, Region, RemoteKey};
use serde::{Deserialize, Serialize};

use super::net::{Net, connect_pair, contexts, join, session_config};
use super::target::{RecvState, serve_receives};
use super::util::{Rng, first_diff, max_rss_kib, rss_kib, secs};
use super::worker::{KINDS, Worker, WorkerReport};

/// How often a soak prints a progress line on stderr.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
use super::{RECV_LEN, RECVS_PER_EP, SG_GAP, SoakArgs};

// ------------------------------------------------------------------ soak: the run

/// The soak's summary (printed and written with `--json`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SoakSummary {
    /// "soak".
    pub mode: String,
    /// "netns" or "loopback".
    pub network: String,
    /// Rails per endpoint.
    pub rails: usize,
    /// Worker threads.
    pub threads: usize,
    /// Endpoints.
    pub endpoints: usize,
    /// Seed of the mix.
    pub seed: u64,
    /// Seconds of random operations.
    pub duration_s: f64,
    /// Seconds of the whole run (set-up to teardown).
    pub wall_s: f64,
    /// Operations posted, by kind.
    pub ops: BTreeMap<String, u64>,
    /// All random operations.
    pub ops_total: u64,
    /// Reads of the final read-back.
    pub readback_ops: u64,
    /// Completions received (each matched to exactly one posted wr_id).
    pub completions: u64,
    /// Bytes written (write, write_with_imm, write_sg).
    pub bytes_written: u64,
    /// Bytes returned by reads during the run and checked against the model.
    pub bytes_read_verified: u64,
    /// Bytes of the final read-back over braid, checked against the model.
    pub bytes_readback_verified: u64,
    /// Bytes of the server's memory compared with the model directly at the end.
    pub bytes_memory_verified: u64,
    /// Bytes of received messages checked.
    pub bytes_received_verified: u64,
    /// Sum of the verified byte counts.
    pub bytes_verified: u64,
    /// Receives matched (sends and writes-with-immediate), each exactly once and in order.
    pub receives_matched: u64,
    /// Fetch-adds whose results chain exactly (no gap, no repeat) to the final counter.
    pub fetch_adds_checked: u64,
    /// Link downs (or socket breaks on loopback) injected.
    pub failures_injected: u64,
    /// Rail failures seen on the client's endpoints (alive -> dead).
    pub rail_failures_client: u64,
    /// Rail failures seen on the server's endpoints.
    pub rail_failures_server: u64,
    /// Rails re-joined on the client's endpoints (dead -> alive).
    pub rails_rejoined_client: u64,
    /// Rails re-joined on the server's endpoints.
    pub rails_rejoined_server: u64,
    /// Seconds from each link-up (loopback: break) until every rail of every endpoint was
    /// alive again on both sides.
    pub rejoin_s: Vec<f64>,
    /// Per client endpoint: payload bytes sent per rail.
    pub rail_bytes_client: Vec<Vec<u64>>,
    /// Per client endpoint: bytes sent on the flapped rail after its last re-join.
    pub flapped_rail_bytes_after_rejoin: Vec<u64>,
    /// Peak RSS (VmHWM) of the process, MiB.
    pub max_rss_mb: f64,
    /// RSS (VmRSS) when the operations start, half-way through them and when they end, MiB:
    /// flat when nothing leaks.
    pub rss_start_mid_end_mb: Vec<f64>,
    /// The bound it was checked against, MiB.
    pub rss_bound_mb: u64,
    /// What went wrong.
    pub errors: Vec<String>,
    /// True when every check passed.
    pub passed: bool,
}

pub(super) fn print_summary(s: &SoakSummary) {
    println!(
        "soak on {} ({} rails, {} endpoints, {} threads, seed {}): {:.1} s of operations, {:.1} s in all",
        s.network, s.rails, s.endpoints, s.threads, s.seed, s.duration_s, s.wall_s
    );
    let ops: Vec<String> = s.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "  operations: {} ({}); read-back reads {}",
        s.ops_total,
        ops.join(", "),
        s.readback_ops
    );
    println!(
        "  completions {} (one per wr_id, in order); receives matched {}; fetch-adds chained {}",
        s.completions, s.receives_matched, s.fetch_adds_checked
    );
    println!(
        "  bytes written {}; verified {} (reads {}, read-back {}, memory {}, received {})",
        s.bytes_written,
        s.bytes_verified,
        s.bytes_read_verified,
        s.bytes_readback_verified,
        s.bytes_memory_verified,
        s.bytes_received_verified
    );
    println!(
        "  failures injected {}; rail failures seen client {} / server {}; rails re-joined client {} / server {}; re-join after {:?} s",
        s.failures_injected,
        s.rail_failures_client,
        s.rail_failures_server,
        s.rails_rejoined_client,
        s.rails_rejoined_server,
        s.rejoin_s
            .iter()
            .map(|x| (x * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    );
    println!(
        "  rail bytes (client endpoints) {:?}; flapped rail after re-join {:?}",
        s.rail_bytes_client, s.flapped_rail_bytes_after_rejoin
    );
    println!(
        "  max RSS {:.1} MiB (bound {} MiB); RSS at start, middle, end of the operations {:?} MiB",
        s.max_rss_mb,
        s.rss_bound_mb,
        s.rss_start_mid_end_mb
            .iter()
            .map(|x| (x * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    if s.passed {
        println!("  PASSED");
    } else {
        for e in &s.errors {
            println!("  ERROR: {e}");
        }
        println!("  FAILED");
    }
}

/// Counts alive/dead transitions of every rail of some endpoints.
pub(super) struct RailWatch {
    prev: Vec<Vec<bool>>,
    failures: u64,
    rejoins: u64,
}

impl RailWatch {
    pub(super) fn new(eps: &[Arc<Endpoint>]) -> RailWatch {
        RailWatch {
            prev: eps.iter().map(|e| e.rails_alive()).collect(),
            failures: 0,
            rejoins: 0,
        }
    }
    fn sample(&mut self, eps: &[Arc<Endpoint>]) -> bool {
        let mut all = true;
        for (i, e) in eps.iter().enumerate() {
            let now = e.rails_alive();
            for (r, &a) in now.iter().enumerate() {
                match (self.prev[i][r], a) {
                    (true, false) => self.failures += 1,
                    (false, true) => self.rejoins += 1,
                    _ => {}
                }
                all &= a;
            }
            self.prev[i] = now;
        }
        all
    }
}

/// Runs the soak.
pub fn soak(a: &SoakArgs) -> Result<SoakSummary> {
    let t_start = Instant::now();
    let duration = secs(a.duration, "--duration")?;
    let peer_timeout = secs(a.peer_timeout, "--peer-timeout")?;
    if a.threads == 0 || a.threads > 64 {
        bail!("--threads must be 1..64");
    }
    if a.endpoints == 0 || a.endpoints > 64 {
        bail!("--endpoints must be 1..64");
    }
    if a.depth == 0 || a.depth > 256 {
        bail!("--depth must be 1..256");
    }
    if a.max_size < 8 || a.max_size > 16 << 20 || a.area < a.max_size || a.area > 256 << 20 {
        bail!("need 8 <= --max-size <= 16M and --max-size <= --area <= 256M");
    }
    if a.flap_rail >= a.rails {
        bail!("--flap-rail {} but only {} rails", a.flap_rail, a.rails);
    }
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let flap_for = secs(a.flap_for, "--flap-for")?;
    let flap_at = match a.flap_at {
        Some(x) => secs(x, "--flap-at")?,
        None => duration / 4,
    };
    let flap_every = a.flap_every.map(|x| secs(x, "--flap-every")).transpose()?;
    // The schedule of (down, up) times from the start of the operations.
    let mut flaps = Vec::new();
    if !a.no_flap {
        let mut at = flap_at;
        while at < duration && flaps.len() < 1000 {
            flaps.push((at, at + flap_for));
            match flap_every {
                Some(p) if p > flap_for => at += p,
                Some(_) => bail!("--flap-every must exceed --flap-for"),
                None => break,
            }
        }
    }

    let (t, n) = (a.threads, a.endpoints);
    let region_len = (Worker::atomics(a.area, t) + 4096 + 8 * t).next_multiple_of(4096);
    let slot_len = a.max_size + 4 * SG_GAP;
    let planned = n * (region_len + RECVS_PER_EP * RECV_LEN + t * a.area)
        + t * (2 * a.depth * slot_len + a.depth * a.max_size + a.max_size);
    let rss_bound_mb = a.max_rss_mb.unwrap_or(((2 * planned) >> 20) as u64 + 256);

    let net = Net::new(
        a.rails,
        a.rate.shaped("use --loopback for unshaped rails")?,
        a.loopback,
    )?;
    let cfg = session_config(peer_timeout);
    // Server queues: receives only. Client: one send queue shared by every endpoint.
    let sctx_cq_cap = n * RECVS_PER_EP + 16;
    let (ssq, srq) = (CompletionQueue::new(16), CompletionQueue::new(sctx_cq_cap));
    let (csq, crq) = (
        CompletionQueue::new(t * a.depth + 16),
        CompletionQueue::new(16),
    );
    let mut sopts = EndpointOptions::new(&ssq).with_recv_cq(&srq);
    sopts.session = cfg.clone();
    let mut copts = EndpointOptions::new(&csq).with_recv_cq(&crq);
    copts.session = cfg;
    copts.connect_timeout = Duration::from_secs(5);
    let pair = connect_pair(&net, n, contexts(&net)?, sopts, copts)?;

    let targets: Vec<Region> = (0..n)
        .map(|_| pair.sctx.alloc_region(region_len, Access::all()))
        .collect::<Result<_, _>>()?;
    let keys: Vec<RemoteKey> = targets.iter().map(Region::remote_key).collect();
    let recv_bufs: Vec<Region> = (0..n)
        .map(|_| {
            pair.sctx
                .alloc_region(RECVS_PER_EP * RECV_LEN, Access::LOCAL_WRITE)
        })
        .collect::<Result<_, _>>()?;

    let mut summary = SoakSummary {
        mode: "soak".into(),
        network: net.kind().into(),
        rails: a.rails,
        threads: t,
        endpoints: n,
        seed,
        rss_bound_mb,
        ..Default::default()
    };
    let mut errors = Vec::new();

    // Receive side (host 1).
    let rstate = Arc::new(Mutex::new(RecvState {
        next: vec![vec![0; t]; n],
        ..Default::default()
    }));
    let rstop = Arc::new(AtomicBool::new(false));
    let recv_job = {
        let (eps, bufs, rcq, st, stop) = (
            pair.seps.clone(),
            recv_bufs.clone(),
            srq.clone(),
            rstate.clone(),
            rstop.clone(),
        );
        net.spawn(1, move || serve_receives(eps, bufs, rcq, st, stop))?
    };

    // Client side (host 0): the dispatcher and the workers.
    let (boxes, inboxes): (Vec<Sender<Completion>>, Vec<Receiver<Completion>>) =
        (0..t).map(|_| channel()).unzip();
    let dstop = Arc::new(AtomicBool::new(false));
    let strays = Arc::new(Mutex::new(Vec::<Completion>::new()));
    let dispatch_job = {
        let (cq, stop, strays) = (csq.clone(), dstop.clone(), strays.clone());
        net.spawn(0, move || -> Result<()> {
            let mut got = Vec::new();
            while !stop.load(Ordering::Acquire) {
                if let Some(c) = cq.wait(Duration::from_millis(20)) {
                    got.push(c);
                    cq.poll_many(&mut got, 256);
                }
                for c in got.drain(..) {
                    // A worker that is gone (it failed) leaves its completions as strays.
                    let sent = match boxes.get((c.wr_id >> 48) as usize) {
                        Some(b) => b.send(c),
                        None => Err(SendError(c)),
                    };
                    if let Err(SendError(c)) = sent {
                        strays.lock().expect("strays").push(c);
                    }
                }
            }
            Ok(())
        })?
    };
    let abort = Arc::new(AtomicBool::new(false));
    let stall = Duration::from_secs(15).max(peer_timeout * 10);
    let t_ops = Instant::now();
    let end = t_ops + duration;
    let mut workers = Vec::new();
    for (w, mailbox) in inboxes.into_iter().enumerate() {
        let worker = Worker {
            t: w,
            eps: pair.ceps.clone(),
            ep_index: pair
                .ceps
                .iter()
                .enumerate()
                .map(|(i, e)| (e.id(), i))
                .collect(),
            keys: keys.clone(),
            area: a.area,
            threads: t,
            max_size: a.max_size,
            depth: a.depth,
            slot_len,
            src: pair.cctx.alloc_region(a.depth * slot_len, Access::all())?,
            dst: pair.cctx.alloc_region(a.depth * slot_len, Access::all())?,
            free: (0..a.depth).collect(),
            fifo: (0..n).map(|_| VecDeque::new()).collect(),
            next_wr: 0,
            rng: Rng::new(seed ^ ((w as u64 + 1) << 40)),
            mailbox,
            stall,
            rep: WorkerReport {
                models: vec![vec![0; a.area]; n],
                cas: vec![0; n],
                fetch_adds: vec![Vec::new(); n],
                recv_ops: vec![0; n],
                ..Default::default()
            },
            scratch: Vec::new(),
        };
        let abort = abort.clone();
        workers.push(net.spawn(0, move || worker.run(end, &abort))?);
    }

    // Fault injection and rail watching (this thread), until the workers are done.
    let mut cwatch = RailWatch::new(&pair.ceps);
    let mut swatch = RailWatch::new(&pair.seps);
    let mut down = false;
    let mut next_flap = 0;
    let mut awaiting_rejoin: Option<Instant> = None;
    let mut rejoin_bytes: Vec<u64> = vec![0; n];
    let hard_end = end + stall * 3 + Duration::from_secs(60);
    let flap_rail = a.flap_rail;
    let set_link = |up: bool| -> Result<()> { net.set_link(flap_rail, up, &pair.ceps) };
    let rss_mb = || rss_kib() as f64 / 1024.0;
    summary.rss_start_mid_end_mb.push(rss_mb());
    let mut next_progress = t_ops + PROGRESS_EVERY;
    while workers.iter().any(|w| !w.is_finished()) {
        let now = Instant::now();
        if now >= next_progress {
            next_progress += PROGRESS_EVERY;
            let sent: u64 = pair
                .ceps
                .iter()
                .map(|e| e.rail_bytes_sent().iter().sum::<u64>())
                .sum();
            eprintln!(
                "braid soak: {:.0} of {:.0} s, {:.0} MB sent, {} failure(s) injected{}",
                now.duration_since(t_ops).as_secs_f64(),
                duration.as_secs_f64(),
                sent as f64 / 1e6,
                summary.failures_injected,
                if down {
                    format!(", rail {flap_rail} down")
                } else {
                    String::new()
                }
            );
        }
        if summary.rss_start_mid_end_mb.len() == 1 && now >= t_ops + duration / 2 {
            summary.rss_start_mid_end_mb.push(rss_mb());
        }
        if now > hard_end {
            abort.store(true, Ordering::Release);
            errors.push("the workers did not finish in time".to_string());
            break;
        }
        let el = now.duration_since(t_ops);
        if let Some(&(d, u)) = flaps.get(next_flap) {
            if !down && el >= d && !abort.load(Ordering::Acquire) {
                set_link(false)?;
                summary.failures_injected += 1;
                down = true;
                if net.tb.is_none() {
                    // Loopback: the break is the whole failure.
                    down = false;
                    next_flap += 1;
                    awaiting_rejoin = Some(now);
                }
            } else if down && el >= u {
                set_link(true)?;
                down = false;
                next_flap += 1;
                awaiting_rejoin = Some(now);
            }
        }
        let c_all = cwatch.sample(&pair.ceps);
        let s_all = swatch.sample(&pair.seps);
        if let Some(since) = awaiting_rejoin
            && c_all
            && s_all
        {
            summary.rejoin_s.push(since.elapsed().as_secs_f64());
            awaiting_rejoin = None;
            rejoin_bytes = pair
                .ceps
                .iter()
                .map(|e| e.rail_bytes_sent()[flap_rail])
                .collect();
        }
        // A sampling period, not synchronisation: the rails are polled for transitions.
        std::thread::sleep(Duration::from_millis(10));
    }
    let t_ops_done = Instant::now();
    if summary.rss_start_mid_end_mb.len() == 1 {
        summary.rss_start_mid_end_mb.push(rss_mb());
    }
    summary.rss_start_mid_end_mb.push(rss_mb());
    if down {
        set_link(true)?;
        awaiting_rejoin = Some(Instant::now());
    }
    let mut reports = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        match join(w) {
            Ok(r) => reports.push(r),
            Err(e) => errors.push(format!("thread {i}: {e:#}")),
        }
    }
    summary.duration_s = t_ops_done.duration_since(t_ops).as_secs_f64();

    // Every rail back, on both sides (bounded).
    if let Some(since) = awaiting_rejoin {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let c_all = cwatch.sample(&pair.ceps);
            let s_all = swatch.sample(&pair.seps);
            if c_all && s_all {
                summary.rejoin_s.push(since.elapsed().as_secs_f64());
                break;
            }
            if Instant::now() > deadline {
                errors.push(format!(
                    "rail {flap_rail} did not re-join within 20 s of the link coming back: client {:?}, server {:?}",
                    pair.ceps.iter().map(|e| e.rails_alive()).collect::<Vec<_>>(),
                    pair.seps.iter().map(|e| e.rails_alive()).collect::<Vec<_>>()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    // Every receive matched (bounded wait for the last receive completions).
    let want: Vec<Vec<u64>> = (0..n)
        .map(|e| reports.iter().map(|r| r.recv_ops[e]).collect())
        .collect();
    if reports.len() == t {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = rstate.lock().expect("recv state");
            if st.error.is_some() || st.next == want {
                break;
            }
            drop(st);
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // A quiet period for duplicates: nothing more may arrive at either side.
    if let Some(c) = srq.wait(Duration::from_millis(200)) {
        errors.push(format!("an extra receive completion arrived: {c:?}"));
    }
    rstop.store(true, Ordering::Release);
    if let Err(e) = join(recv_job) {
        errors.push(format!("receive side: {e:#}"));
    }
    dstop.store(true, Ordering::Release);
    if let Err(e) = join(dispatch_job) {
        errors.push(format!("dispatcher: {e:#}"));
    }
    if let Some(c) = csq.poll() {
        errors.push(format!("an extra completion arrived: {c:?}"));
    }
    for c in strays.lock().expect("strays").iter() {
        errors.push(format!("a completion of no thread: {c:?}"));
    }
    for (i, r) in reports.iter().enumerate() {
        if let Some(c) = r.inbox.as_ref().and_then(|rx| rx.try_recv().ok()) {
            errors.push(format!("an extra completion for thread {i}: {c:?}"));
        }
    }
    {
        let st = rstate.lock().expect("recv state");
        summary.bytes_received_verified = st.bytes_verified;
        summary.receives_matched = st.next.iter().flatten().sum();
        if reports.len() == t && st.next != want {
            errors.push(format!(
                "receives matched per endpoint and thread {:?}, but the client completed {:?}",
                st.next, want
            ));
        }
    }

    // The client's figures, the server's memory against the models, the atomics.
    if reports.len() == t {
        for (w, r) in reports.iter().enumerate() {
            for (e, target) in targets.iter().enumerate() {
                let got = target.to_vec(w * a.area, a.area)?;
                if got != r.models[e] {
                    let d = first_diff(&got, &r.models[e]);
                    errors.push(format!(
                        "server memory of thread {w}'s area on endpoint {e} differs from the model at byte {d}"
                    ));
                } else {
                    summary.bytes_memory_verified += a.area as u64;
                }
                let cas = target
                    .atomic_u64(Worker::atomics(a.area, t) + 8 * (1 + w))?
                    .load(Ordering::SeqCst);
                if cas != r.cas[e] {
                    errors.push(format!(
                        "compare-swap word of thread {w} on endpoint {e} is {cas:#x}, the model says {:#x}",
                        r.cas[e]
                    ));
                }
            }
        }
        for (e, target) in targets.iter().enumerate() {
            let mut fa: Vec<(u64, u64)> = reports
                .iter()
                .flat_map(|r| r.fetch_adds[e].iter().copied())
                .collect();
            fa.sort_unstable();
            let mut cur = 0u64;
            for &(old, add) in &fa {
                if old != cur {
                    errors.push(format!(
                        "fetch-add results on endpoint {e} do not chain: an old value {old} where {cur} was due (an add lost or applied twice)"
                    ));
                    break;
                }
                cur += add;
            }
            let fin = target
                .atomic_u64(Worker::atomics(a.area, t))?
                .load(Ordering::SeqCst);
            if fin != cur {
                errors.push(format!(
                    "fetch-add counter on endpoint {e} is {fin}, the completed adds sum to {cur}"
                ));
            }
            summary.fetch_adds_checked += fa.len() as u64;
        }
    }
    for r in &reports {
        for (i, k) in KINDS.iter().enumerate() {
            *summary.ops.entry(k.1.to_string()).or_default() += r.ops[i];
        }
        summary.ops_total += r.ops.iter().sum::<u64>();
        summary.readback_ops += r.readback_ops;
        summary.completions += r.completions;
        summary.bytes_written += r.bytes_written;
        summary.bytes_read_verified += r.bytes_read_verified;
        summary.bytes_readback_verified += r.bytes_readback_verified;
    }
    summary.bytes_verified = summary.bytes_read_verified
        + summary.bytes_readback_verified
        + summary.bytes_memory_verified
        + summary.bytes_received_verified;
    summary.rail_failures_client = cwatch.failures;
    summary.rail_failures_server = swatch.failures;
    summary.rails_rejoined_client = cwatch.rejoins;
    summary.rails_rejoined_server = swatch.rejoins;
    summary.rail_bytes_client = pair.ceps.iter().map(|e| e.rail_bytes_sent()).collect();
    if summary.failures_injected > 0 {
        summary.flapped_rail_bytes_after_rejoin = pair
            .ceps
            .iter()
            .zip(&rejoin_bytes)
            .map(|(e, b)| e.rail_bytes_sent()[flap_rail].saturating_sub(*b))
            .collect();
        if summary.rail_failures_client == 0 {
            errors.push("a failure was injected but no client rail was seen failing".into());
        }
    }
    for e in pair.ceps.iter().chain(&pair.seps) {
        if e.is_closed() {
            errors.push(format!(
                "endpoint {} failed or closed during the soak",
                e.id()
            ));
        }
    }
    if summary.ops_total == 0 {
        errors.push("no operation was posted".into());
    }

    // Teardown: client first, then the server; then memory.
    for e in &pair.ceps {
        e.close();
    }
    for e in &pair.seps {
        e.close();
    }
    drop(pair.listener);
    summary.max_rss_mb = max_rss_kib() as f64 / 1024.0;
    if summary.max_rss_mb > rss_bound_mb as f64 {
        errors.push(format!(
            "peak RSS {:.1} MiB exceeds the bound of {rss_bound_mb} MiB",
            summary.max_rss_mb
        ));
    }
    drop(net);
    summary.wall_s = t_start.elapsed().as_secs_f64();
    summary.passed = errors.is_empty();
    summary.errors = errors;
    print_summary(&summary);
    Ok(summary)
}
