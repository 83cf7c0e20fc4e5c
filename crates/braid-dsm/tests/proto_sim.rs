//! Deterministic simulation of the DSM protocol core (see `sim/mod.rs` for the model and
//! the invariants checked after every step). Failures name the seed:
//! `BRAID_DSM_SIM_SEED=n cargo test -p braid-dsm --release --test proto_sim` replays it.

mod sim;

use sim::{Params, Sim, rng, seeds};

const MAX_STEPS: u64 = 2_000_000;

fn run_seed(seed: u64) -> Sim {
    let mut rng = rng(seed.wrapping_mul(0x9E37_79B9));
    let p = Params::random(&mut rng);
    let mut sim = Sim::new(seed, p);
    if let Err(e) = sim.run(MAX_STEPS) {
        panic!("seed {seed}: {e}");
    }
    sim
}

fn run_many(n: u64) {
    let mut totals = [0u64; 4];
    let mut steps = 0;
    let list = seeds(n);
    for &seed in &list {
        let sim = run_seed(seed);
        for (t, s) in totals.iter_mut().zip(sim.stats) {
            *t += s;
        }
        steps += sim.steps;
    }
    println!(
        "{} seeds, 0 violations: {} reads, {} writes, {} faults, {} messages, {steps} steps",
        list.len(),
        totals[0],
        totals[1],
        totals[2],
        totals[3]
    );
}

/// 1,000 seeds in CI.
#[test]
fn many_seeds() {
    run_many(1000);
}

/// The survey: `cargo test -p braid-dsm --release --test proto_sim -- --ignored --nocapture`.
#[test]
#[ignore]
fn survey_10000_seeds() {
    run_many(10_000);
}

/// Heavy contention: many threads writing one page on many ranks, FIFO and reordered.
#[test]
fn one_hot_page() {
    for seed in 0..50 {
        for reorder in [false, true] {
            let p = Params {
                ranks: 6,
                pages: 1,
                threads: 3,
                ops: 30,
                slots: 1,
                policy: braid_dsm::proto::HomePolicy::Cyclic,
                reorder,
                locks: 1,
            };
            let mut sim = Sim::new(seed, p);
            if let Err(e) = sim.run(MAX_STEPS) {
                panic!("seed {seed} reorder {reorder}: {e}");
            }
        }
    }
}

/// More ranks than fit one machine word in a copy set.
#[test]
fn seventy_ranks() {
    let p = Params {
        ranks: 70,
        pages: 3,
        threads: 1,
        ops: 10,
        slots: 2,
        policy: braid_dsm::proto::HomePolicy::Block,
        reorder: false,
        locks: 2,
    };
    let mut sim = Sim::new(7, p);
    sim.run(MAX_STEPS).unwrap();
}
