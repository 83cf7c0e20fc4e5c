//! Bandwidth tests: keep operations in flight for --iters or -D, and the plain-TCP stream beside
//! them.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{
    Access, Context, Error as BraidError, Op as ListOp, RemoteKey, RemoteSge, Sge, WorkRequest,
};

use crate::bench::output::Row;
use crate::bench::{
    Op, Peer, Progress, READ_SEED, check_status, cpu_seconds, rail_delta, region_matches, tcp,
    write_pattern,
};

use super::{Plan, finish_test, merge_verify, per_gb, remote_key, setup_for, setup_test};

/// Sums two rounds of a bandwidth test.
pub(super) fn merge_bw(a: Row, b: Row) -> Row {
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
pub(super) struct TcpBw {
    pub(super) bytes: u64,
    pub(super) seconds: f64,
    pub(super) client_cpu_s: f64,
    pub(super) server_cpu_s: f64,
}

impl TcpBw {
    pub(super) fn add(&mut self, o: &TcpBw) {
        self.bytes += o.bytes;
        self.seconds += o.seconds;
        self.client_cpu_s += o.client_cpu_s;
        self.server_cpu_s += o.server_cpu_s;
    }
}

/// A bandwidth test: keep `depth` operations in flight until --iters or -D.
pub(super) fn run_bw(
    ctx: &Context,
    peer: &mut Peer,
    op: Op,
    size: usize,
    plan: &Plan,
) -> Result<Row> {
    let reply = setup_test(peer, setup_for(op, size, plan, false))?;
    let rkey = if op == Op::Send {
        RemoteKey { key: 0, len: 0 }
    } else {
        remote_key(&reply)?
    };
    let rslots = reply.slots.max(1) as u64;
    let fetch = op == Op::FetchAdd;
    let lslots = if fetch { 1 } else { plan.slots_for(size) };
    // With --verify or --rewrite a local slot is reused only after its previous operation
    // completed.
    let depth = if (plan.verify || plan.rewrite) && !fetch {
        plan.depth_for(size).min(lslots)
    } else {
        plan.depth_for(size)
    } as u64;
    let local =
        ctx.alloc_region_with(lslots * size, Access::LOCAL_WRITE, crate::bench::POPULATED)?;
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
    // --rewrite: the time the client spent writing its sources, inside the measured loop.
    let mut rewrite_s = 0.0f64;
    let mut last_progress = Instant::now();
    let mut bad: Option<String> = None;
    loop {
        if !stop && (posted >= plan.iters || deadline.is_some_and(|d| Instant::now() >= d)) {
            stop = true;
        }
        if let Some(n) = plan.post_list {
            // Whole lists only, so every list ends with a signaled operation.
            let n = n as u64;
            while !stop && posted - done + n <= depth.max(n) && posted + n <= plan.iters {
                let list: Vec<WorkRequest<'_>> = (posted..posted + n)
                    .map(|i| {
                        let local = &sges[(i % lslots) as usize][..];
                        let remote_offset = (i % rslots) * size as u64;
                        let op = match op {
                            Op::Write => ListOp::Write {
                                local,
                                remote: &rkey,
                                remote_offset,
                                imm: None,
                            },
                            Op::Read => ListOp::Read {
                                local,
                                remote: &rkey,
                                remote_offset,
                            },
                            _ => ListOp::Send { local, imm: None },
                        };
                        WorkRequest {
                            wr_id: i,
                            op,
                            signaled: i == posted + n - 1,
                        }
                    })
                    .collect();
                // Within -q nothing is refused for room; a refused list would leave its
                // posted part without a signaled end, so it ends the run.
                peer.ep
                    .post_list(&list)
                    .with_context(|| format!("posting a list of {n} {} operations", op.name()))?;
                posted += n;
            }
        }
        while plan.post_list.is_none() && !stop && posted - done < depth && posted < plan.iters {
            let i = posted;
            let slot = (i % lslots) as usize;
            let roff = (i % rslots) * size as u64;
            let sge = &sges[slot][..];
            if plan.rewrite && matches!(op, Op::Write | Op::Send) {
                let t = Instant::now();
                local.fill(slot * size, size, i as u8)?;
                rewrite_s += t.elapsed().as_secs_f64();
            }
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
            if plan.post_list.is_some() && c.wr_id >= done {
                // The list's last operation: every one before it completed too.
                done = c.wr_id;
            }
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
        slots: lslots as usize,
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
        rewrite_s: plan.rewrite.then_some(rewrite_s),
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

/// One TCP stream of `size`-byte messages on rail 0's path, for as long as the braid test.
pub(super) fn tcp_bw(peer: &mut Peer, size: usize, plan: &Plan) -> Result<TcpBw> {
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
