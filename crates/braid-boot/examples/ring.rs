//! A ring over a braid world: every rank joins, allgathers its region's remote key, passes a
//! token around the ring with `send`/`recv`, writes a pattern one-sided into each
//! neighbour's region, checks what its neighbours wrote, and prints one line.
//!
//! ```sh
//! cargo build --release -p braid-boot --example ring
//! braid run -n 3 -- target/release/examples/ring                    # loopback
//! braid run -n 2 --testbed T -- target/release/examples/ring        # across testbed hosts
//! ```
//! (or under `mpirun`, see `docs/LAUNCH.md`). Without a launcher it runs as a job of one.

use std::collections::HashMap;
use std::error::Error;
use std::time::Duration;

use braid::{Access, CompletionKind, CompletionQueue, Context, RemoteKey};
use braid_boot::{LaunchEnv, World, WorldOptions};

const SLOT: usize = 64;
const TOKEN_IN: usize = 1024;
const TOKEN_OUT: usize = 1032;
const WAIT: Duration = Duration::from_secs(30);

/// What `rank` writes into its neighbour's slot `slot` (0: from the left, 1: from the right).
fn pattern(rank: usize, slot: usize) -> Vec<u8> {
    (0..SLOT)
        .map(|i| (rank * 31 + slot * 7 + i) as u8)
        .collect()
}

fn main() {
    let joined = LaunchEnv::from_env()
        .map_err(Box::<dyn Error>::from)
        .and_then(|env| {
            let ctx = Context::new()?;
            let cq = ctx.create_cq(64);
            let world = World::join(&ctx, &env, &WorldOptions::new(&cq))?;
            Ok((ctx, cq, world))
        });
    let (ctx, cq, world) = match joined {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ring: error: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = ring(&ctx, &cq, &world) {
        eprintln!("ring: rank {} error: {e}", world.rank());
        // The other ranks' next collective fails with this reason.
        world.abort_job(&e.to_string());
        std::process::exit(1);
    }
    if let Err(e) = world.finalize() {
        eprintln!("ring: error: {e}");
        std::process::exit(1);
    }
}

fn ring(ctx: &Context, cq: &CompletionQueue, world: &World) -> Result<(), Box<dyn Error>> {
    let (rank, size) = (world.rank(), world.size());
    let region = ctx.alloc_region(4096, Access::all())?;

    // Allgather: every rank's remote key and name.
    let mut mine = region.remote_key().to_bytes().to_vec();
    mine.extend_from_slice(format!("rank {rank}").as_bytes());
    let parts = world.allgather(&mine)?;
    let mut keys = Vec::with_capacity(size);
    for (r, p) in parts.iter().enumerate() {
        let key = RemoteKey::from_bytes(p.get(..16).unwrap_or_default())
            .ok_or_else(|| format!("rank {r}'s key is malformed"))?;
        if &p[16..] != format!("rank {r}").as_bytes() {
            return Err(format!("allgather: part {r} is from someone else").into());
        }
        keys.push(key);
    }

    let mut token = 1u64;
    if size > 1 {
        let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
        let to_left = world.endpoint(left).ok_or("no endpoint to the left")?;
        let to_right = world.endpoint(right).ok_or("no endpoint to the right")?;
        to_left.post_recv(1, &[region.slice(TOKEN_IN, 8)?])?;

        // One-sided writes into both neighbours' regions.
        let staging = ctx.alloc_region(2 * SLOT, Access::LOCAL_WRITE)?;
        staging.write_at(0, &pattern(rank, 0))?;
        staging.write_at(SLOT, &pattern(rank, 1))?;
        to_right.write(2, &[staging.slice(0, SLOT)?], &keys[right], 0)?;
        to_left.write(3, &[staging.slice(SLOT, SLOT)?], &keys[left], SLOT as u64)?;

        // Completions arrive in any order across endpoints (the token can come back to rank 0
        // before its own send's completion): count each kind, wait until one is there.
        let mut seen: HashMap<CompletionKind, usize> = HashMap::new();
        let mut wait_for = |want: CompletionKind, count: usize| -> Result<(), Box<dyn Error>> {
            while seen.get(&want).copied().unwrap_or(0) < count {
                let c = cq
                    .wait(WAIT)
                    .ok_or_else(|| format!("no {want:?} completion within {WAIT:?}"))?;
                if !c.status.is_ok() {
                    return Err(
                        format!("{:?} (wr {}) failed: {:?}", c.kind, c.wr_id, c.status).into(),
                    );
                }
                *seen.entry(c.kind).or_default() += 1;
            }
            Ok(())
        };
        // The token: rank 0 starts it, every rank adds rank + 1 and passes it on.
        if rank != 0 {
            wait_for(CompletionKind::Recv, 1)?;
            let mut b = [0u8; 8];
            region.read_at(TOKEN_IN, &mut b)?;
            token = u64::from_le_bytes(b) + rank as u64 + 1;
        }
        region.write_at(TOKEN_OUT, &token.to_le_bytes())?;
        to_right.send(4, &[region.slice(TOKEN_OUT, 8)?])?;
        wait_for(CompletionKind::Send, 1)?;
        if rank == 0 {
            wait_for(CompletionKind::Recv, 1)?;
            let mut b = [0u8; 8];
            region.read_at(TOKEN_IN, &mut b)?;
            token = u64::from_le_bytes(b);
        }
        wait_for(CompletionKind::Write, 2)?;
        // Every rank's writes are complete (placed at the target) once all pass the barrier.
        world.barrier()?;
        if region.to_vec(0, SLOT)? != pattern(left, 0) {
            return Err(format!("the slot written by rank {left} (left) is wrong").into());
        }
        if region.to_vec(SLOT, SLOT)? != pattern(right, 1) {
            return Err(format!("the slot written by rank {right} (right) is wrong").into());
        }
        if rank == 0 {
            let want = (size * (size + 1) / 2) as u64;
            if token != want {
                return Err(format!("the token came back as {token}, expected {want}").into());
            }
        }
        println!(
            "ring: rank {rank}/{size} on {}: token {token} ok, writes from ranks {left} and {right} ok, {} rail(s) to rank {right}: {}",
            world.host_of(rank).unwrap_or("?"),
            to_right.rail_count(),
            world
                .rails_to(right)
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
    } else {
        println!("ring: rank 0/1: a job of one, nothing to pass");
    }
    Ok(())
}
