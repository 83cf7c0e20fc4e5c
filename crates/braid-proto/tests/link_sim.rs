//! Deterministic simulation of two [`braid_proto::link::Link`] ends over a datagram channel
//! that loses, duplicates, reorders and delays, on a virtual clock. Each side streams a
//! seeded byte pattern to the other in random pieces and reads in random pieces; the
//! invariant is that each side reads exactly the other's pattern, in order, and that both
//! finish within a bounded number of steps. Failure messages name the seed and the
//! channel.

use std::time::{Duration, Instant};

use braid_proto::link::{LINK_HEADER, Link, LinkConfig};
use braid_testkit::Rng;
use braid_testkit::pattern;

#[derive(Clone, Copy, Debug)]
struct Channel {
    loss: f64,
    dup: f64,
    /// Chance that a datagram takes an extra random delay (so later ones overtake it).
    reorder: f64,
}

struct Side {
    link: Link,
    /// The pattern this side writes.
    out: Vec<u8>,
    written: usize,
    /// What this side read so far.
    got: Vec<u8>,
}

fn run(seed: u64, ch: Channel, bytes: usize) {
    let mut rng = Rng::new(seed);
    let recv_buffer = 2048 + rng.index(1 << 15);
    let cfg = LinkConfig {
        max_payload: 64 + rng.index(1400),
        send_buffer: 4096 + rng.index(1 << 16),
        recv_buffer,
        // Odd seeds: no timed acknowledgements (as braid's rails run it), one per quarter
        // window instead.
        ack_delay: (seed.is_multiple_of(2)).then(|| Duration::from_micros(50)),
        ack_every: if seed.is_multiple_of(2) {
            1 << 18
        } else {
            recv_buffer / 4
        },
        ..LinkConfig::default()
    };
    let what = format!("seed {seed}, {ch:?}, {cfg:?}");
    let t0 = Instant::now();
    let mut now = t0;
    let mut sides = [0u64, 1].map(|s| Side {
        link: Link::new(cfg.clone()),
        out: pattern::pattern(bytes, seed * 2 + s),
        written: 0,
        got: Vec::new(),
    });
    // In flight: (delivery time, to side, datagram).
    let mut wire: Vec<(Instant, usize, Vec<u8>)> = Vec::new();
    let mut buf = vec![0u8; LINK_HEADER + cfg.max_payload];
    let latency = Duration::from_micros(5);
    for step in 0..2_000_000u64 {
        if sides.iter().all(|s| s.got.len() == bytes) {
            for s in &sides {
                assert_eq!(s.link.error(), None, "{what}");
                if ch.loss == 0.0 && ch.dup == 0.0 && ch.reorder == 0.0 {
                    assert_eq!(s.link.resent(), 0, "{what}: a resend on a clean channel");
                }
            }
            return;
        }
        for (i, s) in sides.iter_mut().enumerate() {
            // Write a random piece, read a random piece.
            if s.written < bytes && rng.chance(0.5) {
                let n = rng.urange(1, 5000).min(bytes - s.written);
                s.written += s.link.write(&s.out[s.written..s.written + n]);
            }
            if rng.chance(0.7) {
                let mut r = vec![0u8; rng.urange(1, 8000)];
                let n = s.link.read(now, &mut r);
                s.got.extend_from_slice(&r[..n]);
            }
            loop {
                let n = match s.link.poll_datagram(now, &mut buf) {
                    Ok(Some(n)) => n,
                    Ok(None) => break,
                    Err(e) => panic!("{what}: side {i} failed at step {step}: {e}"),
                };
                let copies = if rng.chance(ch.loss) {
                    0
                } else if rng.chance(ch.dup) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let extra = if rng.chance(ch.reorder) {
                        Duration::from_micros(rng.range(1, 200))
                    } else {
                        Duration::ZERO
                    };
                    wire.push((now + latency + extra, 1 - i, buf[..n].to_vec()));
                }
            }
        }
        // Deliver what is due, in delivery order; then advance the clock to the next
        // event (a delivery or a timer), at most 10 us.
        wire.sort_by_key(|w| w.0);
        let due = wire.partition_point(|w| w.0 <= now);
        for (_, to, d) in wire.drain(..due) {
            if let Err(e) = sides[to].link.on_datagram(now, &d) {
                panic!("{what}: side {to} refused a datagram at step {step}: {e}");
            }
        }
        let mut next = now + Duration::from_micros(10);
        if let Some(w) = wire.first() {
            next = next.min(w.0);
        }
        for s in &sides {
            if let Some(t) = s.link.poll_timeout() {
                next = next.min(t.max(now));
            }
        }
        now = next.max(now + Duration::from_nanos(1));
        for (i, s) in sides.iter().enumerate() {
            let k = s.got.len();
            let peer = &sides[1 - i].out;
            assert_eq!(s.got[..], peer[..k], "{what}: side {i} read wrong bytes");
        }
    }
    panic!(
        "{what}: not done after 2,000,000 steps ({} and {} of {bytes} bytes read; {:?} simulated)",
        sides[0].got.len(),
        sides[1].got.len(),
        now - t0
    );
}

const CLEAN: Channel = Channel {
    loss: 0.0,
    dup: 0.0,
    reorder: 0.0,
};

#[test]
fn a_clean_channel_streams_both_ways_without_a_resend() {
    for seed in 0..8 {
        run(seed, CLEAN, 300_000);
    }
}

#[test]
fn loss_duplication_and_reordering_lose_and_repeat_nothing() {
    let channels = [
        Channel {
            loss: 0.01,
            ..CLEAN
        },
        Channel {
            loss: 0.1,
            dup: 0.05,
            reorder: 0.05,
        },
        Channel {
            loss: 0.2,
            dup: 0.1,
            reorder: 0.2,
        },
        Channel {
            loss: 0.0,
            dup: 0.3,
            reorder: 0.5,
        },
    ];
    for (c, ch) in channels.into_iter().enumerate() {
        for seed in 0..6 {
            run(100 + c as u64 * 10 + seed, ch, 100_000);
        }
    }
}
