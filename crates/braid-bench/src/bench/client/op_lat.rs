//! Latency of one-sided operations the client alone drives (`ib_read_lat`,
//! `ib_atomic_lat`): one read or fetch-add in flight, each timed from its post to its
//! completion. The server's application takes no part; its side is served by whichever
//! braid thread reads its rails: its main thread, which waits for the client's `Done` as
//! the client waits for its completions (busy polling, or blocked in `cq.wait`).

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{Access, CompletionKind, Context, Error as BraidError};

use crate::bench::YIELD_EVERY;
use crate::bench::output::{LatStats, Row};
use crate::bench::{
    Op, Peer, Progress, READ_SEED, check_status, cpu_seconds, rail_delta, region_matches,
};

use super::{Plan, finish_test, merge_verify, per_gb, remote_key, setup_for, setup_test};

/// One `op` (read-lat: a `size`-byte read of the server's first slot; atomic-lat: a
/// fetch-add of 1 on its counter) at a time, busy-polled or blocking in `cq.wait`.
pub(super) fn run_op_lat(
    ctx: &Context,
    peer: &mut Peer,
    op: Op,
    size: usize,
    wait_mode: bool,
    plan: &Plan,
) -> Result<Row> {
    let read = op == Op::ReadLat;
    let dst = ctx.alloc_region(size, Access::LOCAL_WRITE)?;
    let reply = setup_test(peer, setup_for(op, size, plan, wait_mode))?;
    let rkey = remote_key(&reply)?;
    let into = dst.slice(0, size)?;
    let (mut scratch, mut got) = (Vec::new(), Vec::new());
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
    let mut times: Vec<u64> = Vec::with_capacity(plan.iters.min(1 << 22) as usize);
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
            && (times.len() as u64 >= plan.iters || deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
        if read && plan.verify {
            // Each read must bring the bytes again.
            dst.fill(0, size, 0)?;
        }
        let t = Instant::now();
        let posted = if read {
            peer.ep.read(i, std::slice::from_ref(&into), &rkey, 0)
        } else {
            peer.ep.fetch_add(i, &rkey, 0, 1)
        };
        match posted {
            Ok(()) => {}
            Err(BraidError::QueueFull { .. }) => {
                bail!(
                    "{}: the queue is full with nothing else in flight",
                    op.name()
                )
            }
            Err(e) => return Err(e).with_context(|| format!("posting {} #{i}", op.name())),
        }
        let mut spins = 0u32;
        let c = loop {
            let c = if wait_mode {
                peer.scq.wait(Duration::from_millis(50))
            } else {
                peer.scq.poll()
            };
            if let Some(c) = c {
                break c;
            }
            spins = spins.wrapping_add(1);
            if !wait_mode && spins.is_multiple_of(YIELD_EVERY) {
                // As in the ping-pong: let a thread that needs the core now and then run.
                std::thread::yield_now();
            }
            if (wait_mode || spins.is_multiple_of(4096)) && t.elapsed() > plan.stall {
                bail!(
                    "{}: no completion for {:?} (server gone?)",
                    op.name(),
                    plan.stall
                );
            }
        };
        let took = t.elapsed().as_nanos() as u64;
        check_status(&c, op.name())?;
        let kind = if read {
            CompletionKind::Read
        } else {
            CompletionKind::FetchAdd
        };
        if c.wr_id != i || c.kind != kind {
            bail!("{}: unexpected completion for #{i}: {c:?}", op.name());
        }
        if bad.is_none() {
            if read {
                if plan.verify
                    && let Err(o) =
                        region_matches(&dst, 0, size, READ_SEED, &mut got, &mut scratch)?
                {
                    bad = Some(format!("read #{i}: first wrong byte at offset {o}"));
                }
            } else if c.value != Some(i) {
                // The counter starts at 0 and only this loop adds to it, one at a time.
                bad = Some(format!(
                    "fetch-add #{i} returned {:?}, expected {i}",
                    c.value
                ));
            }
        }
        if i >= warmup {
            times.push(took);
        }
        i += 1;
        prog.tick(times.len() as u64);
    }
    let seconds = t_measured.elapsed().as_secs_f64();
    let client_cpu = cpu_seconds() - cpu0;
    prog.finish();
    let client_rails = rail_delta(&peer.rail_bytes(), &rails0);
    let report = finish_test(peer, i)?;
    let l = LatStats::from_op_times(&mut times);
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
        client_cpu_s_per_gb: per_gb(client_cpu, bytes),
        server_cpu_s_per_gb: per_gb(report.cpu_s, bytes),
        rail_bytes: report.rail_bytes.clone(),
        client_rail_bytes: client_rails,
        server_rail_bytes: report.rail_bytes.clone(),
        lat_definition: Some(
            "latency = the whole operation, from post to completion, one in flight (perftest's \
             ib_read_lat/ib_atomic_lat convention; not halved: it is itself a round trip); \
             rtt_us_median = lat_us_median; the TCP baselines are a ping-pong's full round trip"
                .into(),
        ),
        lat_us_min: Some(l.min),
        lat_us_median: Some(l.median),
        lat_us_p99: Some(l.p99),
        rtt_us_median: Some(l.median),
        lat_poll: Some(l),
        ..Default::default()
    };
    if read && plan.verify {
        row.verified = Some(bad.is_none());
        row.verify_detail = Some(bad.unwrap_or_else(|| format!("{i} reads checked by the client")));
    } else if !read {
        // Fetch-add's returned values are always checked, as in the bandwidth test.
        row.verified = Some(bad.is_none());
        row.verify_detail = Some(match (bad, &report.verify_detail) {
            (Some(b), _) => b,
            (None, Some(s)) => format!("{i} fetch-add values in order; server: {s}"),
            (None, None) => format!("{i} fetch-add values in order"),
        });
    }
    merge_verify(&mut row, report.verified, report.verify_detail);
    Ok(row)
}
