//! The litmus survey: SB, MP and IRIW across two ranks, counting every outcome
//! (`braid_dsm::litmus`). Run as 2 ranks, e.g. on two testbed hosts (`docs/DSM.md`):
//!
//! ```sh
//! litmus [--tests sb,mp,iriw] [--iterations 100000] [--batch 1000] [--period-us 600] [--json FILE|-]
//! ```
//! Exits non-zero if an outcome that sequential consistency forbids was seen.

use std::time::Duration;

use braid_dsm::Dsm;
use braid_dsm::litmus::{self, Settings, Test};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    match run() {
        Ok(true) => {}
        Ok(false) => std::process::exit(2),
        Err(e) => {
            eprintln!("litmus: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Res<bool> {
    let mut s = Settings::default();
    let mut tests = vec![Test::Sb, Test::Mp, Test::Iriw];
    let mut json = None;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--tests" => {
                tests = v()?
                    .split(',')
                    .map(|t| Test::parse(t).ok_or(format!("unknown test {t}")))
                    .collect::<Result<_, _>>()?
            }
            "--iterations" => s.iterations = v()?.parse()?,
            "--batch" => s.batch = v()?.parse()?,
            "--period-us" => s.period = Duration::from_micros(v()?.parse()?),
            "--jitter-us" => s.jitter = Duration::from_micros(v()?.parse()?),
            "--json" => json = Some(v()?),
            _ => return Err(format!("unknown argument {k}").into()),
        }
    }
    let dsm = Dsm::init()?;
    let mut out = Vec::new();
    let mut clean = true;
    for t in tests {
        let tally = litmus::run(&dsm, t, s)?;
        if dsm.rank() == 0 {
            println!(
                "{}: {} iterations in {:.1} s, forbidden ({}) seen {} times",
                t.name(),
                tally.iterations,
                tally.seconds,
                tally.outcome_name(t.forbidden_outcome()),
                tally.forbidden()
            );
            for (o, c) in tally.counts.iter().enumerate() {
                println!("    {:<28} {c}", tally.outcome_name(o));
            }
            clean &= tally.forbidden() == 0;
            out.push(tally.to_json());
        }
    }
    dsm.finalize()?;
    if let Some(p) = json {
        let doc = format!("{{\"litmus\": [{}]}}", out.join(", "));
        if p == "-" {
            println!("{doc}");
        } else {
            std::fs::write(p, doc + "\n")?;
        }
    }
    Ok(clean)
}
