//! Fault-service figures of braid-dsm beside a braid RMA read on the same rails, in one run.
//!
//! Run as 2 ranks (4 for the write fault with several sharers), e.g. across two testbed
//! hosts (`docs/DSM.md` has the commands). Rank 0 measures, rank 1 is the pages' home and
//! owner, ranks 2.. are extra readers. Phases, each separated by barriers:
//!
//! 1. `rma_read`: 4 KiB braid RMA reads from rank 1, depth 1, busy-polled (a plain braid
//!    World over the same rails, formed and left before the DSM starts);
//! 2. `read_fault`: rank 0 reads one word of each of `--pages` pages rank 1 wrote (a
//!    missing fault: request to rank 1, the page back by `write_with_imm`, install);
//! 3. `write_fault_one_sharer`: rank 0 writes those pages, which it holds read-only and
//!    rank 1 too (upgrade: rank 1 drops its copy, no data moves);
//! 4. `write_fault_no_copy`: rank 0 writes pages it does not hold (ownership and data);
//! 5. `write_fault_sharers`: rank 0 writes pages every rank holds read-only (rank 1 drops
//!    and `size - 2` readers are invalidated, each acknowledging to rank 0);
//! 6. `fault_rate`: rank 0 reads `--rate-pages` pages in sequence: faults per second.
//!
//! Each latency is the time of one load or store that faults, measured around it.
//! `--json FILE` (or `-`) writes the figures; a table goes to stdout. The baseline's World
//! uses the rendezvous port after `BRAID_ROOT`'s (and its own job id), which must be free.

use std::time::{Duration, Instant};

use braid::{Access, Context, RegionOptions, RemoteKey};
use braid_boot::{LaunchEnv, World, WorldOptions};
use braid_dsm::{Dsm, HomePolicy};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Stats {
    samples: usize,
    median: f64,
    mean: f64,
    p99: f64,
    min: f64,
}

fn stats(ns: &mut [u64]) -> Stats {
    ns.sort_unstable();
    let n = ns.len().max(1);
    let us = |x: u64| x as f64 / 1000.0;
    Stats {
        samples: ns.len(),
        median: us(ns[n / 2]),
        mean: ns.iter().map(|&x| us(x)).sum::<f64>() / n as f64,
        p99: us(ns[((n as f64 * 0.99).ceil() as usize).clamp(1, n) - 1]),
        min: us(ns[0]),
    }
}

fn json(name: &str, s: &Stats, base: &Stats, extra: &str) -> String {
    format!(
        "\"{name}\": {{\"samples\": {}, \"min_us\": {:.2}, \"median_us\": {:.2}, \"mean_us\": {:.2}, \"p99_us\": {:.2}, \"ratio_median_to_rma\": {:.3}, \"ratio_mean_to_rma\": {:.3}{extra}}}",
        s.samples,
        s.min,
        s.median,
        s.mean,
        s.p99,
        s.median / base.median,
        s.mean / base.mean
    )
}

fn line(name: &str, s: &Stats, base: &Stats) -> String {
    format!(
        "{name:<24} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>7.2}x {:>7.2}x",
        s.samples,
        s.min,
        s.median,
        s.mean,
        s.p99,
        s.median / base.median,
        s.mean / base.mean
    )
}

struct Args {
    pages: usize,
    rate_pages: usize,
    rma: usize,
    json: Option<String>,
}

fn args() -> Res<Args> {
    let mut a = Args {
        pages: 2000,
        rate_pages: 16384,
        rma: 20000,
        json: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--pages" => a.pages = v()?.parse()?,
            "--rate-pages" => a.rate_pages = v()?.parse()?,
            "--rma" => a.rma = v()?.parse()?,
            "--json" => a.json = Some(v()?),
            _ => return Err(format!("unknown argument {k}").into()),
        }
    }
    Ok(a)
}

/// The launcher's environment for the baseline's own World: the rendezvous port plus one
/// and another job id, so it never meets the DSM's World on the same rendezvous.
fn rma_env(env: &LaunchEnv) -> Res<LaunchEnv> {
    let mut e = env.clone();
    let (host, port) = env
        .root
        .rsplit_once(':')
        .ok_or("BRAID_ROOT must be host:port")?;
    let port: u16 = port.parse()?;
    e.root = format!(
        "{host}:{}",
        port.checked_add(1).ok_or("BRAID_ROOT port too high")?
    );
    e.job = format!("{}-rma-baseline", env.job);
    Ok(e)
}

/// Phase 1: braid RMA reads of 4 KiB at depth 1 over a World of its own.
fn rma_phase(env: &LaunchEnv, n: usize, page: usize) -> Res<(Vec<u64>, usize)> {
    let env = &rma_env(env)?;
    let ctx = Context::new()?;
    let cq = ctx.create_cq(64);
    let mut opts = WorldOptions::new(&cq);
    opts.linger = Duration::ZERO;
    let world = World::join(&ctx, env, &opts)?;
    let populated = RegionOptions {
        populate: true,
        ..RegionOptions::default()
    };
    let region = ctx.alloc_region_with(page, Access::all(), populated)?;
    region.fill(0, page, 0x5a)?;
    let keys = world.allgather(&region.remote_key().to_bytes())?;
    let mut ns = Vec::with_capacity(n);
    let rails = world.rails_to(1 - world.rank().min(1)).len();
    if world.rank() == 0 {
        let key = RemoteKey::from_bytes(&keys[1]).ok_or("bad key")?;
        let ep = world.endpoint(1).ok_or("no endpoint to rank 1")?;
        let sge = region.slice(0, page)?;
        for i in 0..n + n / 10 {
            let t = Instant::now();
            ep.read(i as u64, std::slice::from_ref(&sge), &key, 0)?;
            let c = loop {
                if let Some(c) = cq.poll() {
                    break c;
                }
                std::hint::spin_loop();
            };
            if !c.status.is_ok() {
                return Err(format!("RMA read failed: {:?}", c.status).into());
            }
            if i >= n / 10 {
                ns.push(t.elapsed().as_nanos() as u64);
            }
        }
    }
    world.finalize()?;
    Ok((ns, rails))
}

fn timed(ns: &mut Vec<u64>, f: impl FnOnce()) {
    let t = Instant::now();
    f();
    ns.push(t.elapsed().as_nanos() as u64);
}

fn main() {
    if let Err(e) = run() {
        eprintln!("dsm_bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Res<()> {
    let a = args()?;
    let env = LaunchEnv::from_env()?;
    if env.size < 2 {
        return Err("run at least 2 ranks (4 for the write fault with several sharers)".into());
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let (mut rma, rails) = rma_phase(&env, a.rma, page)?;

    let dsm = Dsm::init()?;
    let (rank, size) = (dsm.rank(), dsm.size());
    let n = a.pages;
    let k = 3 * n + a.rate_pages;
    // Block homes: rank 1's block is pages k..2k of the allocation.
    let mem = dsm.alloc_with(size * k * page, HomePolicy::Block)?;
    let at = |i: usize| (k + i) * page;
    if rank == 1 {
        for i in 0..k {
            mem.write::<u64>(at(i), i as u64 + 1);
        }
    }
    dsm.barrier()?;
    let (mut rd, mut w1, mut w0, mut ws) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // 2. read faults
    if rank == 0 {
        for i in 0..n {
            timed(&mut rd, || assert_eq!(mem.read::<u64>(at(i)), i as u64 + 1));
        }
    }
    dsm.barrier()?;
    // 3. write faults on pages held read-only here and at the owner
    if rank == 0 {
        for i in 0..n {
            timed(&mut w1, || mem.write::<u64>(at(i) + 8, 1));
        }
    }
    dsm.barrier()?;
    // 4. write faults without a copy
    if rank == 0 {
        for i in n..2 * n {
            timed(&mut w0, || mem.write::<u64>(at(i) + 8, 1));
        }
    }
    dsm.barrier()?;
    // 5. write faults with size - 2 readers besides the owner
    if rank != 1 {
        for i in 2 * n..3 * n {
            assert_eq!(mem.read::<u64>(at(i)), i as u64 + 1);
        }
    }
    dsm.barrier()?;
    if rank == 0 && size > 2 {
        for i in 2 * n..3 * n {
            timed(&mut ws, || mem.write::<u64>(at(i) + 8, 1));
        }
    }
    dsm.barrier()?;
    // 6. fault rate
    let mut rate = (0, 0.0);
    if rank == 0 {
        let t = Instant::now();
        let mut sum = 0u64;
        for i in 3 * n..k {
            sum += mem.read::<u64>(at(i));
        }
        rate = (k - 3 * n, t.elapsed().as_secs_f64());
        let want: u64 = (3 * n..k).map(|i| i as u64 + 1).sum();
        assert_eq!(sum, want);
    }
    dsm.barrier()?;
    let stats_here = dsm.stats();
    let rail_bytes = dsm.rail_bytes_sent();
    dsm.finalize()?;
    eprintln!("rank {rank}: {stats_here:?}");
    if rank != 0 {
        return Ok(());
    }
    let base = stats(&mut rma);
    let (rd, w1, w0) = (stats(&mut rd), stats(&mut w1), stats(&mut w0));
    let hdr = format!(
        "{:<24} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "4 KiB, µs", "samples", "min", "median", "mean", "p99", "med/rma", "mean/rma"
    );
    println!("braid-dsm fault service, {size} ranks, {rails} rail(s) between ranks 0 and 1");
    println!("{hdr}");
    println!("{}", line("rma_read (depth 1)", &base, &base));
    println!("{}", line("read_fault", &rd, &base));
    println!("{}", line("write_fault_one_sharer", &w1, &base));
    println!("{}", line("write_fault_no_copy", &w0, &base));
    let mut parts = vec![
        format!("\"bench\": \"dsm\", \"ranks\": {size}, \"rails\": {rails}, \"page\": {page}"),
        json("rma_read", &base, &base, ""),
        json("read_fault", &rd, &base, ""),
        json("write_fault_one_sharer", &w1, &base, ""),
        json("write_fault_no_copy", &w0, &base, ""),
    ];
    if size > 2 {
        let ws = stats(&mut ws);
        println!(
            "{}",
            line(&format!("write_fault_{}_sharers", size - 1), &ws, &base)
        );
        parts.push(json(
            "write_fault_sharers",
            &ws,
            &base,
            &format!(", \"sharers\": {}", size - 1),
        ));
    }
    let fps = rate.0 as f64 / rate.1;
    println!(
        "fault_rate: {} pages in {:.3} s = {:.0} faults/s ({:.1} MB/s)",
        rate.0,
        rate.1,
        fps,
        fps * page as f64 / 1e6
    );
    parts.push(format!(
        "\"fault_rate\": {{\"pages\": {}, \"seconds\": {:.4}, \"faults_per_s\": {:.0}}}",
        rate.0, rate.1, fps
    ));
    parts.push(format!(
        "\"rank0_stats\": {{\"faults\": {}, \"installs\": {}, \"messages\": {}}}, \"rail_bytes_sent\": {:?}",
        stats_here.faults, stats_here.installs, stats_here.messages, rail_bytes
    ));
    let doc = format!("{{{}}}", parts.join(", "));
    match a.json.as_deref() {
        Some("-") => println!("{doc}"),
        Some(p) => std::fs::write(p, doc + "\n")?,
        None => {}
    }
    Ok(())
}
