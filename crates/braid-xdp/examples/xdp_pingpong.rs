//! A busy-polling ping-pong of raw Ethernet frames between two AF_XDP ports: the floor a
//! raw-Ethernet rail stands on, to set beside a TCP ping-pong on the same link.
//!
//!     xdp_pingpong server IFACE [ROUND_TRIPS] [generic]
//!     xdp_pingpong client IFACE [ROUND_TRIPS] [generic]
//!
//! Start the server first, on the other end of the link. The client prints the median and
//! the 99th percentile of the one-way time (half a round trip) of 60-byte frames carrying
//! an 8-byte sequence number. Every wait is bounded (2 s per frame); frames go to the
//! broadcast address, so no address needs configuring. Needs root.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use braid_xdp::{ETHER_HEADER, ETHERTYPE, Port, PortConfig, XdpMode, ether_header};

const FRAME: usize = 60;
const WARMUP: u64 = 1000;
const WAIT: Duration = Duration::from_secs(2);

/// Busy-polls until a frame comes; returns its sequence number.
fn await_frame(port: &mut Port) -> Result<u64, String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut seq = None;
        port.recv(1, |f| {
            if f.len() >= ETHER_HEADER + 8 {
                let b: [u8; 8] = f[ETHER_HEADER..ETHER_HEADER + 8].try_into().unwrap();
                seq = Some(u64::from_le_bytes(b));
            }
        });
        if let Some(s) = seq {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err(format!("no frame within {WAIT:?}"));
        }
    }
}

fn send_frame(port: &mut Port, seq: u64) -> Result<(), String> {
    let h = ether_header([0xff; 6], port.mac(), ETHERTYPE);
    let deadline = Instant::now() + WAIT;
    while !port
        .send_with(FRAME, |b| {
            b.fill(0);
            b[..ETHER_HEADER].copy_from_slice(&h);
            b[ETHER_HEADER..ETHER_HEADER + 8].copy_from_slice(&seq.to_le_bytes());
        })
        .map_err(|e| e.to_string())?
    {
        port.flush().map_err(|e| e.to_string())?;
        if Instant::now() > deadline {
            return Err("no send slot came free".into());
        }
    }
    port.flush().map_err(|e| e.to_string())
}

fn run(args: &[String]) -> Result<(), String> {
    let usage = "usage: xdp_pingpong server|client IFACE [ROUND_TRIPS] [generic]";
    let role = args.first().ok_or(usage)?;
    let iface = args.get(1).ok_or(usage)?;
    let n: u64 = args
        .get(2)
        .map_or(Ok(100_000), |s| s.parse())
        .map_err(|_| usage)?;
    let mode = if args.get(3).map(String::as_str) == Some("generic") {
        XdpMode::Generic
    } else {
        XdpMode::Native
    };
    let cfg = PortConfig {
        mode,
        ..PortConfig::default()
    };
    let mut port = Port::open(iface, &cfg).map_err(|e| e.to_string())?;
    match role.as_str() {
        "server" => {
            for _ in 0..WARMUP + n {
                let seq = await_frame(&mut port)?;
                send_frame(&mut port, seq)?;
            }
        }
        "client" => {
            let mut one_way = Vec::with_capacity(n as usize);
            for seq in 0..WARMUP + n {
                let t = Instant::now();
                send_frame(&mut port, seq)?;
                // A stale echo of an earlier frame would be a lost one's late twin; none
                // should come on a link that drops nothing, so any mismatch is an error.
                let got = await_frame(&mut port)?;
                if got != seq {
                    return Err(format!("sent frame {seq}, the echo carried {got}"));
                }
                if seq >= WARMUP {
                    one_way.push(t.elapsed().as_nanos() as f64 / 2.0);
                }
            }
            one_way.sort_by(f64::total_cmp);
            let at = |q: f64| one_way[((one_way.len() - 1) as f64 * q) as usize] / 1000.0;
            let stats = port.stats().map_err(|e| e.to_string())?;
            println!(
                "af_xdp {mode:?} {FRAME} B frames, {n} round trips: one-way median {:.2} us, p99 {:.2} us (drops: rx {} ring-full {} fill-empty {})",
                at(0.5),
                at(0.99),
                stats.rx_dropped,
                stats.rx_ring_full,
                stats.rx_fill_ring_empty_descs
            );
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xdp_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}
