//! Latency tests: a braid ping-pong (busy-polled or blocking in `cq.wait`) and the plain-TCP
//! ping-pong beside it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{Access, Completion, CompletionKind, CompletionQueue, Context, Error as BraidError};

use crate::bench::YIELD_EVERY;
use crate::bench::output::{LatStats, Row};
use crate::bench::{
    CTRL_LEN, DATA_IMM_MASK, Op, Peer, Progress, Report, check_status, cpu_seconds, rail_delta,
    region_matches, tcp, write_pattern,
};

use super::{Plan, finish_test, merge_verify, per_gb, remote_key, setup_for, setup_test};

/// Ping completions left in the send queue before the loop drains them.
const PING_DRAIN: usize = 32;

/// A ping-pong latency test (busy-polled, or blocking in `cq.wait` when `wait_mode`).
pub(super) fn run_lat(
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
    let mode = if wait_mode { "wait" } else { "poll" };
    let mut prog = Progress::new(
        format!("{} {size} B ({mode})", op.name()),
        plan.duration,
        plan.iters,
    );
    let mut outstanding = 0usize;
    let mut bad: Option<String> = None;
    let rails0 = peer.rail_bytes();
    let cpu0 = cpu_seconds();
    let mut rounds = Rounds::new(plan);
    while rounds.go_on() {
        let i = rounds.i;
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
        // The pong's receive is posted once the ping has left, as UCX's `tag_lat` posts its
        // receive after its send (and the server reposts after its pong): the pong takes a
        // round trip to come, and a pong that came first would wait for it, not fail.
        peer.post_recv(rbuf.slice(0, rbuf_len)?)?;
        let c = next_completion(&peer.rcq, wait_mode, t, plan.stall, op, "pong")?;
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
        // Pings' own completions are drained now and then, not after every pong: an empty
        // poll of the send queue drives the endpoint's progress once more, a cost a latency
        // loop that needs no slot back yet does not pay (the server does the same).
        if outstanding >= PING_DRAIN {
            while let Some(c) = peer.scq.poll() {
                check_status(&c, "ping")?;
                outstanding -= 1;
            }
        }
        rounds.record(rtt);
        prog.tick(rounds.samples.len() as u64);
    }
    let seconds = rounds.seconds();
    let i = rounds.i;
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
    let l = LatStats::from_rtts(&mut rounds.samples);
    let mut row = lat_row(
        peer,
        op,
        size,
        l,
        seconds,
        client_cpu,
        &report,
        client_rails,
        plan,
    );
    // One message each way per sample.
    row.client_cpu_s_per_gb = per_gb(client_cpu, 2 * row.bytes);
    row.server_cpu_s_per_gb = per_gb(report.cpu_s, 2 * row.bytes);
    row.rtt_us_median = Some(l.median * 2.0);
    row.lat_definition = Some(
        "one-way latency = round-trip time / 2 (perftest convention); rtt_* = full round trip; \
         bw_mb_s/msg_rate count one direction; CPU/GB counts both directions"
            .into(),
    );
    if plan.verify {
        row.verified = Some(bad.is_none());
        row.verify_detail = Some(bad.unwrap_or_else(|| format!("{i} pongs checked by the client")));
    }
    merge_verify(&mut row, report.verified, report.verify_detail);
    Ok(row)
}

/// A TCP ping-pong of `size` bytes on rail 0's path, blocking in `recv` on both sides if
/// `wait_mode`, else spinning on non-blocking sockets. Beside a test of `op`: one way
/// (RTT/2) for a ping-pong test, the whole round trip for read-lat and atomic-lat.
pub(super) fn tcp_lat(
    peer: &mut Peer,
    op: Op,
    size: usize,
    plan: &Plan,
    wait_mode: bool,
) -> Result<LatStats> {
    let reply = setup_test(peer, setup_for(Op::TcpPingPong, size, plan, wait_mode))?;
    let port = reply
        .tcp_port
        .context("no TCP baseline port in the reply")?;
    let mut s = tcp::connect(&plan.rails[0], port)?;
    let warmup = warmup_rounds(plan);
    let deadline = plan.duration.map(|d| Instant::now() + d);
    let mut rtts = tcp::ping_pong(&mut s, size, !wait_mode, warmup, plan.iters, deadline)?;
    drop(s);
    finish_test(peer, rtts.len() as u64 + warmup)?;
    Ok(if op.is_op_lat() {
        LatStats::from_op_times(&mut rtts)
    } else {
        LatStats::from_rtts(&mut rtts)
    })
}

/// The rounds of a latency test, one operation each: [`warmup_rounds`] first, then `--iters`
/// measured ones or as many as `-D` allows.
pub(super) struct Rounds {
    warmup: u64,
    iters: u64,
    deadline: Option<Instant>,
    measured_from: Instant,
    /// The round about to run (warm-up included).
    pub(super) i: u64,
    /// Nanoseconds of each measured round.
    pub(super) samples: Vec<u64>,
}

impl Rounds {
    pub(super) fn new(plan: &Plan) -> Rounds {
        let now = Instant::now();
        Rounds {
            warmup: warmup_rounds(plan),
            iters: plan.iters,
            deadline: plan.duration.map(|d| now + d),
            measured_from: now,
            i: 0,
            samples: Vec::with_capacity(plan.iters.min(1 << 22) as usize),
        }
    }

    /// Whether round `i` runs; the measured clock starts at the first measured round.
    pub(super) fn go_on(&mut self) -> bool {
        if self.i == self.warmup {
            self.measured_from = Instant::now();
        }
        self.i < self.warmup
            || (self.samples.len() as u64) < self.iters
                && self.deadline.is_none_or(|d| Instant::now() < d)
    }

    /// Round `i` took `ns` (not kept during the warm-up); on to the next.
    pub(super) fn record(&mut self, ns: u64) {
        if self.i >= self.warmup {
            self.samples.push(ns);
        }
        self.i += 1;
    }

    /// Seconds since the first measured round.
    pub(super) fn seconds(&self) -> f64 {
        self.measured_from.elapsed().as_secs_f64()
    }
}

/// Rounds before the measured ones: a tenth of `--iters`, at most 100 (100 with `-D`).
pub(super) fn warmup_rounds(plan: &Plan) -> u64 {
    if plan.iters == u64::MAX {
        100
    } else {
        (plan.iters / 10).min(100)
    }
}

/// The next completion of `cq` for the operation started at `since`: busy-polled, or
/// blocking in `cq.wait`; an error after `stall` without one (`what` names it).
pub(super) fn next_completion(
    cq: &CompletionQueue,
    wait_mode: bool,
    since: Instant,
    stall: Duration,
    op: Op,
    what: &str,
) -> Result<Completion> {
    let mut spins = 0u32;
    loop {
        let c = if wait_mode {
            cq.wait(Duration::from_millis(50))
        } else {
            cq.poll()
        };
        if let Some(c) = c {
            return Ok(c);
        }
        spins = spins.wrapping_add(1);
        if !wait_mode && spins.is_multiple_of(YIELD_EVERY) {
            // Polling reads the rails itself, but another thread may need the core now and
            // then (the progress engine, on a machine with fewer free cores than busy
            // threads); a yield on every poll would cost a system call per poll.
            std::thread::yield_now();
        }
        if (wait_mode || spins.is_multiple_of(4096)) && since.elapsed() > stall {
            bail!("{}: no {what} for {stall:?} (server gone?)", op.name());
        }
    }
}

/// A latency test's row: one operation in flight, `l` over its samples, CPU per GB of the
/// payload once, the client's rail bytes as the data's, the round trip as the median
/// (callers adjust what differs).
#[allow(clippy::too_many_arguments)]
pub(super) fn lat_row(
    peer: &Peer,
    op: Op,
    size: usize,
    l: LatStats,
    seconds: f64,
    client_cpu: f64,
    report: &Report,
    client_rails: Vec<u64>,
    plan: &Plan,
) -> Row {
    let n = l.samples as u64;
    let bytes = n * size as u64;
    Row {
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
        slots: 1,
        chunk_size: plan.chunk,
        client_cpu_s: client_cpu,
        server_cpu_s: report.cpu_s,
        client_cpu_s_per_gb: per_gb(client_cpu, bytes),
        server_cpu_s_per_gb: per_gb(report.cpu_s, bytes),
        rail_bytes: client_rails.clone(),
        client_rail_bytes: client_rails,
        server_rail_bytes: report.rail_bytes.clone(),
        lat_us_min: Some(l.min),
        lat_us_median: Some(l.median),
        lat_us_p99: Some(l.p99),
        rtt_us_median: Some(l.median),
        lat_poll: Some(l),
        ..Default::default()
    }
}
