//! Latency of one-sided operations the client alone drives (`ib_read_lat`,
//! `ib_atomic_lat`): one read or fetch-add in flight, each timed from its post to its
//! completion. The server's application takes no part; its side is served by whichever
//! braid thread reads its rails: its main thread, which waits for the client's `Done` as
//! the client waits for its completions (busy polling, or blocked in `cq.wait`).

use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use braid::{Access, CompletionKind, Context, Error as BraidError};

use crate::bench::output::{LatStats, Row};
use crate::bench::{
    Op, Peer, Progress, READ_SEED, check_status, cpu_seconds, rail_delta, region_matches,
};

use super::lat::{Rounds, lat_row, next_completion};
use super::{Plan, finish_test, merge_verify, remote_key, setup_for, setup_test};

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
    let mode = if wait_mode { "wait" } else { "poll" };
    let mut prog = Progress::new(
        format!("{} {size} B ({mode})", op.name()),
        plan.duration,
        plan.iters,
    );
    let mut bad: Option<String> = None;
    let rails0 = peer.rail_bytes();
    let cpu0 = cpu_seconds();
    let mut rounds = Rounds::new(plan);
    while rounds.go_on() {
        let i = rounds.i;
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
        let c = next_completion(&peer.scq, wait_mode, t, plan.stall, op, "completion")?;
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
        rounds.record(took);
        prog.tick(rounds.samples.len() as u64);
    }
    let seconds = rounds.seconds();
    let i = rounds.i;
    let client_cpu = cpu_seconds() - cpu0;
    prog.finish();
    let client_rails = rail_delta(&peer.rail_bytes(), &rails0);
    let report = finish_test(peer, i)?;
    let l = LatStats::from_op_times(&mut rounds.samples);
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
    // The data comes from the server.
    row.rail_bytes = report.rail_bytes.clone();
    row.lat_definition = Some(
        "latency = the whole operation, from post to completion, one in flight (perftest's \
         ib_read_lat/ib_atomic_lat convention; not halved: it is itself a round trip); \
         rtt_us_median = lat_us_median; the TCP baselines are a ping-pong's full round trip"
            .into(),
    );
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
