//! Dead-rail detection of the protocol core (`Session::on_tick`), driven by hand: a rail is
//! declared dead after `peer_timeout` of silence that this side observed, and only then.
//! Sans-IO and deterministic: time is passed in.

use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::SessionConfig;
use braid_proto::Session;
use braid_proto::mem::Registry;

const RAILS: usize = 3;
const ALL: u64 = (1 << RAILS) - 1;
const TICK: Duration = Duration::from_millis(100);

fn session() -> Session {
    let cfg = SessionConfig {
        peer_timeout: Duration::from_secs(1),
        keepalive_interval: Duration::from_millis(250),
        ..SessionConfig::default()
    };
    Session::new(cfg, Arc::new(Registry::default()), RAILS, 1)
}

/// Ticks every 100 ms from `from` (exclusive) up to `to` (inclusive); returns the rails
/// declared dead (and given up, as the driver does) and when.
fn tick_until(s: &mut Session, from: Instant, to: Instant) -> Option<(u64, Instant)> {
    let mut t = from;
    while t + TICK <= to {
        t += TICK;
        let dead = s.on_tick(t);
        if dead != 0 {
            for rail in (0..RAILS).filter(|r| dead & (1 << r) != 0) {
                s.on_rail_lost(rail);
            }
            return Some((dead, t));
        }
    }
    None
}

#[test]
fn a_silent_rail_is_declared_dead_after_the_timeout() {
    let mut s = session();
    let t0 = Instant::now();
    assert_eq!(s.on_tick(t0), 0);
    let (dead, at) = tick_until(&mut s, t0, t0 + Duration::from_secs(3)).expect("declared dead");
    assert_eq!(dead, ALL);
    assert_eq!(at - t0, Duration::from_secs(1));
}

#[test]
fn data_the_kernel_received_before_the_first_tick_does_not_date_the_silence() {
    // The driver reports the kernel's time of the last data received before the session's
    // first tick: for a rail that has only done its handshake, that is the handshake, here
    // 2 s earlier (the endpoint's last rail took that long to connect).
    let mut s = session();
    let t0 = Instant::now() + Duration::from_secs(10);
    for rail in 0..RAILS {
        s.on_rx_progress(rail, t0 - Duration::from_secs(2));
    }
    assert_eq!(s.on_tick(t0), 0, "declared dead at the first tick");
    let (dead, at) = tick_until(&mut s, t0, t0 + Duration::from_secs(3)).expect("declared dead");
    assert_eq!((dead, at - t0), (ALL, Duration::from_secs(1)));
}

#[test]
fn a_stall_of_this_side_is_not_the_peers_silence() {
    let mut s = session();
    let t0 = Instant::now();
    assert_eq!(s.on_tick(t0), 0);
    let t1 = t0 + Duration::from_millis(400);
    assert_eq!(tick_until(&mut s, t0, t1), None);
    // Nothing ticks for 3 s: this side was stopped, or starved of CPU.
    let t2 = t1 + Duration::from_secs(3);
    assert_eq!(
        s.on_tick(t2),
        0,
        "the stall was taken for silence of the peer"
    );
    // Silence goes on counting from where it was: 0.4 s observed before the stall, the
    // stall counted as one normal tick interval at most (250 ms here), so it is declared
    // dead 0.35-0.6 s after the stall, once the peer stays silent.
    let (dead, at) = tick_until(&mut s, t2, t2 + Duration::from_secs(3)).expect("declared dead");
    assert_eq!(dead, ALL);
    let after = at - t2;
    assert!(
        after >= Duration::from_millis(300) && after <= Duration::from_millis(600),
        "declared dead {after:?} after the stall"
    );
}

#[test]
fn data_that_arrived_during_a_stall_keeps_its_rail() {
    let mut s = session();
    let t0 = Instant::now();
    assert_eq!(s.on_tick(t0), 0);
    let t1 = t0 + Duration::from_millis(500);
    assert_eq!(tick_until(&mut s, t0, t1), None);
    // A 2 s stall; the kernel reports payload bytes that arrived on rail 1 during it.
    let t2 = t1 + Duration::from_secs(2);
    s.on_rx_progress(1, t1 + Duration::from_millis(500));
    assert_eq!(s.on_tick(t2), 0);
    // Rails 0 and 2 had been silent 0.5 s before the stall (plus at most 250 ms for it).
    let (dead, at) = tick_until(&mut s, t2, t2 + Duration::from_secs(3)).expect("declared dead");
    assert_eq!(dead, 0b101);
    assert!(at - t2 <= Duration::from_millis(300), "{:?}", at - t2);
    let (dead, at) = tick_until(&mut s, at, t2 + Duration::from_secs(3)).expect("declared dead");
    assert_eq!(dead, 0b010);
    assert!(at - t2 >= Duration::from_millis(900), "{:?}", at - t2);
}
