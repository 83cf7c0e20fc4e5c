//! `--failover-transfer`: a verified stream of writes while one rail's link goes down for good.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use braid::{Access, CompletionQueue, EndpointOptions, Status};
use serde::{Deserialize, Serialize};

use braid_testbed::testbed::{self, TestbedSpec};

use super::net::{Net, connect_pair, contexts, join, session_config};
use super::util::{fill, first_diff, secs};
use super::{FailHow, RESIDENT, SoakArgs};

// ------------------------------------------------------------------ failover transfer

/// Result of `--failover-transfer`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct TransferReport {
    /// "failover-transfer".
    pub mode: String,
    /// "netns" or "loopback".
    pub network: String,
    /// Rails of the endpoint.
    pub rails: usize,
    /// The failed rail.
    pub failed_rail: usize,
    /// How it failed.
    pub fail_how: FailHow,
    /// Bytes written.
    pub bytes: u64,
    /// Size of each write.
    pub op_size: usize,
    /// Writes in flight.
    pub depth: usize,
    /// Seconds from the first post to the failure.
    pub fail_at_s: f64,
    /// Seconds from the failure to the client seeing the rail dead.
    pub detect_s: f64,
    /// Goodput before the failure (first completion to the failure), MB/s.
    pub before_mb_s: f64,
    /// Goodput after detection, over writes posted after it, MB/s.
    pub after_mb_s: f64,
    /// after / before.
    pub ratio: f64,
    /// Framing limit of the surviving rails (testbed), MB/s.
    pub surviving_limit_mb_s: f64,
    /// after / that limit.
    pub after_of_limit: f64,
    /// Whole transfer, MB/s.
    pub overall_mb_s: f64,
    /// Longest time between two completions, seconds.
    pub longest_gap_s: f64,
    /// Bytes checked in the target's memory.
    pub bytes_verified: u64,
    /// Payload bytes sent per rail.
    pub rail_bytes: Vec<u64>,
    /// Rails alive at the end (client side).
    pub rails_alive: Vec<bool>,
    /// Least acceptable ratio (checked on the testbed only).
    pub min_ratio: f64,
    /// What went wrong.
    pub errors: Vec<String>,
    /// True when every check passed.
    pub passed: bool,
}

/// Stamps the write number into every KiB of a source buffer, so every write's data is unique.
pub(super) fn stamp(buf: &mut [u8], i: u64) {
    for c in buf.chunks_mut(1024) {
        let n = c.len().min(8);
        c[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    }
}

/// Seconds of writes the failover transfer must have left to measure after the failure is
/// detected, at the least.
pub(super) const FAILOVER_MEASURE_S: f64 = 0.5;

/// Fewest bytes a failover transfer on `spec` needs so that, even at the framing limit of
/// every rail (tbf lets nothing go faster), writes are still posted after the failure of
/// `rail` at `fail_after` has been detected, `peer_timeout` later, and go on for
/// [`FAILOVER_MEASURE_S`]. A smaller transfer passes or fails by chance: when the failed rail
/// happens to have nothing in flight as its link goes down, nothing waits for the detection,
/// and the writes may all be done before it.
pub(super) fn least_failover_bytes(
    spec: &TestbedSpec,
    rail: usize,
    fail_after: Duration,
    peer_timeout: Duration,
) -> f64 {
    let limit = |skip: Option<usize>| -> f64 {
        (0..spec.rails())
            .filter(|&i| Some(i) != skip)
            .map(|i| testbed::framing_limit_mb_s(spec.rates[i], spec.mtu) * 1e6)
            .sum()
    };
    limit(None) * fail_after.as_secs_f64()
        + limit(Some(rail)) * (peer_timeout.as_secs_f64() + FAILOVER_MEASURE_S)
}

/// A stream of verified writes over one endpoint while one rail's link goes down for good.
pub fn failover_transfer(a: &SoakArgs) -> Result<TransferReport> {
    let peer_timeout = secs(a.peer_timeout, "--peer-timeout")?;
    let fail_after = secs(a.fail_after, "--fail-after")?;
    let op = a.op_size;
    if op == 0 || op > 64 << 20 || a.transfer_size < op || a.transfer_size > 16 << 30 {
        bail!("need 0 < --op-size <= 64M and --op-size <= --transfer-size <= 16G");
    }
    if a.flap_rail >= a.rails || a.rails < 2 {
        bail!("--fail-rail must name one of at least 2 rails");
    }
    let depth = a.depth.clamp(1, 64);
    let nops = a.transfer_size / op;
    let total = nops * op;
    let net = Net::new(
        a.rails,
        a.rate.shaped("use --loopback for unshaped rails")?,
        a.loopback,
    )?;
    if a.fail_how == FailHow::Drop && net.tb.is_none() {
        bail!("--fail-how drop needs the namespace testbed");
    }
    if let Some(tb) = &net.tb {
        let least = least_failover_bytes(tb.spec(), a.flap_rail, fail_after, peer_timeout);
        if (total as f64) < least {
            bail!(
                "--transfer-size {total} is too small: even at the rails' framing limit the writes must outlast the failure at {:.2} s, its detection (up to --peer-timeout {:.2} s of silence) and {FAILOVER_MEASURE_S} s measured after it, which takes at least {:.0} bytes",
                fail_after.as_secs_f64(),
                peer_timeout.as_secs_f64(),
                least.ceil()
            );
        }
    }
    let (ssq, csq) = (CompletionQueue::new(16), CompletionQueue::new(depth + 16));
    let mut sopts = EndpointOptions::new(&ssq);
    sopts.session = session_config(peer_timeout);
    let mut copts = EndpointOptions::new(&csq);
    copts.session = session_config(peer_timeout);
    let (sctx, cctx) = contexts(&net)?;
    // Resident from the start, as verbs registration pins memory: the goodput figures measure
    // the rails, not the first-touch page faults of the target, which the receiving engine
    // thread would otherwise take inside the measured intervals (on a VM whose host backs
    // guest memory lazily, 2-3x dearer for pages the guest never touched, so "before" and
    // "after" would each pay a different, unpredictable share). Made before the endpoints:
    // populating 1 GiB takes seconds on a loaded machine, and nothing is to run meanwhile.
    let target = sctx.alloc_region_with(total, Access::all(), RESIDENT)?;
    let key = target.remote_key();
    // Source buffers: NSRC patterns; a buffer is rewritten (stamped) only while unused.
    const NSRC: usize = 16;
    let depth = depth.min(NSRC / 2);
    let src = cctx.alloc_region_with(NSRC * op, Access::all(), RESIDENT)?;
    let mut pat = vec![0u8; op];
    for s in 0..NSRC {
        fill(0xFA11_0000 + s as u64, &mut pat);
        src.write_at(s * op, &pat)?;
    }
    let pair = connect_pair(&net, 1, (sctx, cctx), sopts, copts)?;
    let ep = pair.ceps[0].clone();
    let t_fail_cell = Arc::new(Mutex::new(None::<Instant>));
    let job = {
        let (ep, src, cq) = (ep.clone(), src.clone(), csq.clone());
        net.spawn(0, move || -> Result<(Instant, Vec<(Instant, Instant)>)> {
            let t0 = Instant::now();
            let mut times = Vec::with_capacity(nops);
            let mut posted_at = VecDeque::new();
            let mut next = 0usize;
            while times.len() < nops {
                while next < nops && posted_at.len() < depth {
                    let s = next % NSRC;
                    // Stamp the write number into the first 8 bytes of each KiB, in place
                    // (the buffer is not in flight: depth <= NSRC / 2).
                    let stamp_bytes = (next as u64).to_le_bytes();
                    for k in (0..op).step_by(1024) {
                        let n = (op - k).min(8);
                        src.write_at(s * op + k, &stamp_bytes[..n])?;
                    }
                    ep.write(
                        next as u64,
                        &[src.slice(s * op, op)?],
                        &key,
                        (next * op) as u64,
                    )
                    .with_context(|| format!("posting write {next}"))?;
                    posted_at.push_back(Instant::now());
                    next += 1;
                }
                let c = cq.wait(Duration::from_secs(30)).ok_or_else(|| {
                    anyhow!(
                        "no completion within 30 s after {} of {nops} writes (client rails alive {:?}): the transfer hangs",
                        times.len(),
                        ep.rails_alive()
                    )
                })?;
                let want = times.len() as u64;
                if c.wr_id != want || c.status != Status::Success {
                    bail!("write {want}: unexpected completion {c:?}");
                }
                times.push((posted_at.pop_front().expect("posted"), Instant::now()));
            }
            Ok((t0, times))
        })?
    };
    // Fault injection and detection (this thread).
    let t0 = Instant::now();
    let mut t_fail = None;
    let mut t_detect = None;
    while !job.is_finished() {
        let now = Instant::now();
        if t_fail.is_none() && now >= t0 + fail_after {
            net.set_fault(a.flap_rail, a.fail_how, true, &pair.ceps)?;
            t_fail = Some(Instant::now());
            *t_fail_cell.lock().expect("cell") = t_fail;
        }
        if t_fail.is_some() && t_detect.is_none() && !ep.rails_alive()[a.flap_rail] {
            t_detect = Some(Instant::now());
        }
        if now > t0 + Duration::from_secs(600) {
            bail!("the transfer did not finish within 600 s");
        }
        // A sampling period for the rail state, not synchronisation.
        std::thread::sleep(Duration::from_millis(2));
    }
    let (tw0, times) = join(job)?;
    let mut r = TransferReport {
        mode: "failover-transfer".into(),
        network: net.kind().into(),
        rails: a.rails,
        failed_rail: a.flap_rail,
        fail_how: a.fail_how,
        bytes: total as u64,
        op_size: op,
        depth,
        min_ratio: a.min_ratio,
        rail_bytes: ep.rail_bytes_sent(),
        rails_alive: ep.rails_alive(),
        ..Default::default()
    };
    let mut errors = Vec::new();
    // Every byte: write i's piece is pattern (i % NSRC) stamped with i.
    for i in 0..nops {
        fill(0xFA11_0000 + (i % NSRC) as u64, &mut pat);
        stamp(&mut pat, i as u64);
        let got = target.to_vec(i * op, op)?;
        if got != pat {
            errors.push(format!(
                "write {i} (target offset {}) is wrong at byte {}",
                i * op,
                first_diff(&got, &pat)
            ));
            break;
        }
        r.bytes_verified += op as u64;
    }
    let mb = |n: usize, d: Duration| n as f64 * op as f64 / d.as_secs_f64().max(1e-9) / 1e6;
    let last = times.last().expect("at least one write").1;
    r.overall_mb_s = mb(nops, last.duration_since(tw0));
    r.longest_gap_s = times
        .windows(2)
        .map(|w| w[1].1.duration_since(w[0].1).as_secs_f64())
        .fold(0.0, f64::max);
    match (t_fail, t_detect) {
        (Some(f), Some(d)) => {
            r.fail_at_s = f.duration_since(tw0).as_secs_f64();
            r.detect_s = d.duration_since(f).as_secs_f64();
            let before: Vec<Instant> = times.iter().map(|x| x.1).filter(|c| *c <= f).collect();
            if before.len() >= 2 {
                r.before_mb_s = mb(
                    before.len() - 1,
                    before[before.len() - 1].duration_since(before[0]),
                );
            } else {
                errors.push("fewer than 2 writes completed before the failure".into());
            }
            // After: writes posted after detection, from the completion of the first of them.
            match times.iter().position(|x| x.0 >= d) {
                Some(k) if nops - 1 > k + 1 => {
                    r.after_mb_s = mb(nops - 1 - k, last.duration_since(times[k].1));
                }
                _ => errors.push(
                    "too few writes after the failure was detected to measure (use a larger --transfer-size)"
                        .into(),
                ),
            }
            if r.before_mb_s > 0.0 {
                r.ratio = r.after_mb_s / r.before_mb_s;
            }
            if let Some(tb) = &net.tb {
                let spec = tb.spec();
                r.surviving_limit_mb_s = (0..a.rails)
                    .filter(|&i| i != a.flap_rail)
                    .map(|i| testbed::framing_limit_mb_s(spec.rates[i], spec.mtu))
                    .sum();
                r.after_of_limit = r.after_mb_s / r.surviving_limit_mb_s;
            }
            if net.tb.is_some() && r.ratio < a.min_ratio {
                errors.push(format!(
                    "goodput after the failure is {:.1}% of before, below {:.0}%",
                    r.ratio * 100.0,
                    a.min_ratio * 100.0
                ));
            }
        }
        (None, _) => errors.push(
            "the transfer ended before the failure was injected (use a larger --transfer-size)"
                .into(),
        ),
        (Some(f), None) => errors.push(format!(
            "the failed rail was never seen dead: the writes ended {:.2} s after its link went down (peer timeout {:.2} s)",
            last.saturating_duration_since(f).as_secs_f64(),
            peer_timeout.as_secs_f64()
        )),
    }
    if !r.rails_alive.iter().any(|x| *x) || ep.is_closed() {
        errors.push("the endpoint failed".into());
    }
    println!(
        "failover transfer on {} ({} rails, rail {} fails: {:?}): {} bytes in {} writes of {} (depth {})",
        r.network, r.rails, r.failed_rail, r.fail_how, r.bytes, nops, op, depth
    );
    println!(
        "  failure at {:.2} s, detected after {:.3} s; longest gap between completions {:.3} s",
        r.fail_at_s, r.detect_s, r.longest_gap_s
    );
    println!(
        "  goodput before {:.1} MB/s, after detection {:.1} MB/s ({:.1}%), whole transfer {:.1} MB/s",
        r.before_mb_s,
        r.after_mb_s,
        r.ratio * 100.0,
        r.overall_mb_s
    );
    if r.surviving_limit_mb_s > 0.0 {
        println!(
            "  after detection = {:.1}% of the surviving rails' framing limit ({:.1} MB/s)",
            r.after_of_limit * 100.0,
            r.surviving_limit_mb_s
        );
    }
    println!(
        "  verified {} bytes; rail bytes {:?}; rails alive {:?}",
        r.bytes_verified, r.rail_bytes, r.rails_alive
    );
    if net.tb.is_some() {
        // The rail comes back before teardown, so its re-join is exercised too.
        net.set_fault(a.flap_rail, a.fail_how, false, &pair.ceps)?;
    }
    for e in pair.ceps.iter().chain(&pair.seps) {
        e.close();
    }
    drop(pair.listener);
    drop(net);
    r.passed = errors.is_empty();
    for e in &errors {
        println!("  ERROR: {e}");
    }
    println!("  {}", if r.passed { "PASSED" } else { "FAILED" });
    r.errors = errors;
    Ok(r)
}
