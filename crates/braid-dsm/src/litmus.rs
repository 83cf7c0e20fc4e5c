//! Litmus tests of the DSM's consistency across two ranks: store buffering (SB), message
//! passing (MP) and independent reads of independent writes (IRIW), each run many times on
//! fresh pages, counting every outcome. Sequential consistency forbids one outcome of each;
//! [`Tally::forbidden`] counts how often it was seen (it must be 0).
//!
//! Each iteration uses two fresh shared pages `x` and `y` (zero, homed by the batch's
//! policy: alternately block and cyclic). The threads of both ranks start iteration `i` at
//! the same moment of `CLOCK_MONOTONIC` (one clock on one machine; on separate machines the
//! iterations still run, just less aligned), each after its own small random delay, so the
//! accesses race. Per thread:
//!
//! * SB: rank 0 `x = 1; r0 = y`, rank 1 `y = 1; r1 = x`; forbidden `r0 = r1 = 0`.
//! * MP: rank 0 `x = 1; y = 1`, rank 1 `r0 = y; r1 = x`; forbidden `r0 = 1, r1 = 0`.
//! * IRIW: rank 0 writes `x = 1` and (another thread) reads `r0 = y; r1 = x`; rank 1
//!   writes `y = 1` and reads `r2 = x; r3 = y`; forbidden `r0 = 1, r1 = 0, r2 = 1, r3 = 0`
//!   (the readers saw the two writes in opposite orders).

use std::time::{Duration, Instant};

use crate::api::Dsm;
use crate::error::DsmError;
use crate::proto::HomePolicy;

/// Which litmus test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Test {
    /// Store buffering.
    Sb,
    /// Message passing.
    Mp,
    /// Independent reads of independent writes.
    Iriw,
}

impl Test {
    /// Its short name (`sb`, `mp`, `iriw`).
    pub fn name(self) -> &'static str {
        match self {
            Test::Sb => "sb",
            Test::Mp => "mp",
            Test::Iriw => "iriw",
        }
    }

    /// Parses [`Test::name`].
    pub fn parse(s: &str) -> Option<Test> {
        match s {
            "sb" => Some(Test::Sb),
            "mp" => Some(Test::Mp),
            "iriw" => Some(Test::Iriw),
            _ => None,
        }
    }

    /// Number of values an outcome has (2 for SB and MP, 4 for IRIW).
    pub fn arity(self) -> usize {
        match self {
            Test::Iriw => 4,
            _ => 2,
        }
    }

    /// The outcome sequential consistency forbids, as its bits (value `k` in bit `k`).
    pub fn forbidden_outcome(self) -> usize {
        match self {
            Test::Sb => 0b00,
            Test::Mp => 0b01,     // r0 (y) = 1, r1 (x) = 0
            Test::Iriw => 0b0101, // r0 = 1, r1 = 0, r2 = 1, r3 = 0
        }
    }
}

/// Outcome counts of one test.
#[derive(Clone, Debug)]
pub struct Tally {
    /// The test.
    pub test: Test,
    /// Iterations run.
    pub iterations: u64,
    /// Count per outcome (index: value `k` in bit `k`).
    pub counts: Vec<u64>,
    /// Seconds taken.
    pub seconds: f64,
}

impl Tally {
    /// Times the forbidden outcome was seen.
    pub fn forbidden(&self) -> u64 {
        self.counts[self.test.forbidden_outcome()]
    }

    /// The outcome `o` written as its values, e.g. `r0=1 r1=0`.
    pub fn outcome_name(&self, o: usize) -> String {
        (0..self.test.arity())
            .map(|k| format!("r{k}={}", (o >> k) & 1))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        let outcomes: Vec<String> = (0..self.counts.len())
            .map(|o| format!("\"{}\": {}", self.outcome_name(o), self.counts[o]))
            .collect();
        format!(
            "{{\"test\": \"{}\", \"iterations\": {}, \"seconds\": {:.2}, \"outcomes\": {{{}}}, \"forbidden_outcome\": \"{}\", \"forbidden_seen\": {}}}",
            self.test.name(),
            self.iterations,
            self.seconds,
            outcomes.join(", "),
            self.outcome_name(self.test.forbidden_outcome()),
            self.forbidden()
        )
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn spin_until(t: u64) {
    while now_ns() < t {
        std::hint::spin_loop();
    }
}

/// A small deterministic delay per (rank, thread, iteration), in ns below `max`.
fn jitter(rank: usize, thread: usize, i: u64, max: u64) -> u64 {
    let mut z = (rank as u64) << 40 ^ (thread as u64) << 32 ^ i;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % max.max(1)
}

/// Settings of a run.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Iterations in all.
    pub iterations: u64,
    /// Iterations per batch (fresh pages are allocated per batch).
    pub batch: u64,
    /// Time between the starts of consecutive iterations.
    pub period: Duration,
    /// Largest random delay of a thread within its iteration.
    pub jitter: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            iterations: 100_000,
            batch: 1000,
            period: Duration::from_micros(600),
            jitter: Duration::from_micros(60),
        }
    }
}

/// Runs `test` on a group of exactly two ranks (collective: both call it). Rank 0 returns
/// the tally; rank 1 returns an empty one.
pub fn run(dsm: &Dsm, test: Test, s: Settings) -> Result<Tally, DsmError> {
    if dsm.size() != 2 {
        return Err(DsmError::InvalidArgument(
            "litmus tests run on exactly 2 ranks".into(),
        ));
    }
    let rank = dsm.rank();
    let page = dsm.page_size();
    let mut counts = vec![0u64; 1 << test.arity()];
    let started = Instant::now();
    let clock = dsm.alloc(page)?;
    let mut done = 0u64;
    let mut batch_no = 0u64;
    while done < s.iterations {
        let k = s.batch.min(s.iterations - done);
        let policy = if batch_no.is_multiple_of(2) {
            HomePolicy::Cyclic
        } else {
            HomePolicy::Block
        };
        let mem = dsm.alloc_with(2 * k as usize * page, policy)?;
        // Each rank's observations: up to 2 values of 4 bytes per iteration.
        let per = 2;
        let results = dsm.alloc_with(2 * k as usize * per * 4, HomePolicy::Block)?;
        if rank == 0 {
            clock.write::<u64>(0, now_ns() + 5_000_000);
        }
        dsm.barrier()?;
        let t0 = clock.read::<u64>(0);
        let x: &(dyn Fn(u64) -> usize + Sync) = &|i| (2 * i as usize) * page;
        let y: &(dyn Fn(u64) -> usize + Sync) = &|i| (2 * i as usize + 1) * page;
        let slot = |i: u64, v: usize| ((rank * k as usize + i as usize) * per + v) * 4;
        let period = s.period.as_nanos() as u64;
        let jit = s.jitter.as_nanos() as u64;
        let (mine_x, other) = if rank == 0 { (x, y) } else { (y, x) };
        std::thread::scope(|sc| {
            // IRIW's writer is a thread of its own; SB's and MP's accesses are one thread.
            if test == Test::Iriw {
                sc.spawn(|| {
                    for i in 0..k {
                        spin_until(t0 + i * period + jitter(rank, 1, i, jit));
                        mem.write::<u32>(mine_x(i), 1);
                    }
                });
            }
            for i in 0..k {
                spin_until(t0 + i * period + jitter(rank, 0, i, jit));
                match (test, rank) {
                    (Test::Sb, _) => {
                        mem.write::<u32>(mine_x(i), 1);
                        results.write::<u32>(slot(i, 0), mem.read::<u32>(other(i)));
                    }
                    (Test::Mp, 0) => {
                        mem.write::<u32>(x(i), 1);
                        mem.write::<u32>(y(i), 1);
                    }
                    (Test::Mp, _) => {
                        let f = mem.read::<u32>(y(i));
                        let d = mem.read::<u32>(x(i));
                        results.write::<u32>(slot(i, 0), f);
                        results.write::<u32>(slot(i, 1), d);
                    }
                    (Test::Iriw, _) => {
                        // Rank 0 reads y then x; rank 1 reads x then y.
                        let a = mem.read::<u32>(other(i));
                        let b = mem.read::<u32>(mine_x(i));
                        results.write::<u32>(slot(i, 0), a);
                        results.write::<u32>(slot(i, 1), b);
                    }
                }
            }
        });
        dsm.barrier()?;
        if rank == 0 {
            for i in 0..k {
                let v = |r: usize, j: usize| {
                    results.read::<u32>(((r * k as usize + i as usize) * per + j) * 4) as usize
                };
                let o = match test {
                    // SB: r0 = rank 0's read of y, r1 = rank 1's read of x.
                    Test::Sb => v(0, 0) | v(1, 0) << 1,
                    // MP: r0 = flag (y), r1 = data (x), both read by rank 1.
                    Test::Mp => v(1, 0) | v(1, 1) << 1,
                    // IRIW: rank 0 read y then x (r0, r1); rank 1 read x then y (r2, r3).
                    Test::Iriw => v(0, 0) | v(0, 1) << 1 | v(1, 0) << 2 | v(1, 1) << 3,
                };
                counts[o] += 1;
            }
        }
        dsm.barrier()?;
        dsm.free(results)?;
        dsm.free(mem)?;
        done += k;
        batch_no += 1;
    }
    dsm.free(clock)?;
    Ok(Tally {
        test,
        iterations: if rank == 0 { done } else { 0 },
        counts,
        seconds: started.elapsed().as_secs_f64(),
    })
}
