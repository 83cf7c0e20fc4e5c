//! The two baselines braid is compared against, each a server and a client that can run in
//! different namespaces (or both on loopback).
//!
//! * **tcp**: one plain TCP stream per rail: a blocking `write` loop of a `size`-byte buffer
//!   against a `read` loop. With one rail this is "one plain TCP stream"; with several rails it
//!   is "N independent streams" (each bound to its own local address), the ceiling.
//! * **trunking**: network trunking as PM/Ethernet did it. The sender cuts every message into
//!   fragments of `frag` bytes (default 64 KiB: large enough that the 24-byte fragment header
//!   and the per-fragment syscalls cost little, small enough that a 1 MiB message spans all
//!   rails), and sends fragment `g` (counted across messages) on rail `g % N`, each behind a
//!   [`FragHeader`] (message number, offset, length). The receiver reads fragments from every
//!   rail into per-rail staging buffers (the reorder buffer, [`STAGING_PER_RAIL`] fragments
//!   per rail), and one assembler thread copies them, in order, into the destination message
//!   buffer ([`Reassembler`]). That extra copy and reorder buffer is what braid's direct
//!   placement saves.
//!
//! # Protocol
//!
//! Every connection opens with a 40-byte [`Hello`] (magic, version, mode, session id, rail
//! index, rail count, size, fragment size). The server waits (bounded by `accept_timeout`)
//! until it holds `rails` connections of one session, then starts its clock and CPU count.
//! The client sends until its duration is over (stopping on a message boundary), shuts down
//! its write side, and waits for the server's [`ServerReport`], a JSON line sent back on
//! rail 0 once the server has read everything. Goodput = bytes the server received in whole
//! messages / (time from the client's first byte to the report's arrival).
//!
//! All sockets carry read and write timeouts ([`IO_TIMEOUT`]), so a vanished peer is an
//! error, not a hang.

use std::net::SocketAddrV4;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use braid_testbed::parse::RailSpec;

/// Read/write timeout on every data connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Staging buffers (fragments) per rail on the trunking receiver: the reorder window.
pub const STAGING_PER_RAIL: usize = 16;
/// Default trunking fragment size.
pub const DEFAULT_FRAG: usize = 64 * 1024;

const MAGIC: u32 = 0x4252_4442; // "BRDB"
const VERSION: u16 = 1;
const FRAG_MAGIC: u32 = 0x4652_4147; // "FRAG"

mod client;
mod reassembler;
mod server;
mod wire;

pub use client::{connect_rail, run_tcp_client, run_trunking_client};
pub use reassembler::Reassembler;
pub use server::{bind, serve};
pub use wire::{FragHeader, Hello, Mode};

/// Content of byte `o` of every message (depends on the offset, so misplaced data shows).
pub fn pattern_byte(o: usize) -> u8 {
    ((o as u64).wrapping_mul(0x9E37_79B1) >> 24) as u8
}

fn fill_pattern(buf: &mut [u8]) {
    for (o, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(o);
    }
}

/// CPU seconds (user + system) used by this process so far.
pub fn cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeVal;
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return f64::NAN;
    };
    let t = |tv: TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 * 1e-6;
    t(ru.user_time()) + t(ru.system_time())
}

/// What the server reports back to the client at the end of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerReport {
    /// Bytes received in whole messages.
    pub bytes: u64,
    /// Whole messages received (trunking: reassembled).
    pub messages: u64,
    /// Server wall time from the last accept to the last byte.
    pub seconds: f64,
    /// Server CPU seconds over the same span.
    pub cpu_s: f64,
    /// Bytes per rail (including fragment headers for trunking).
    pub per_rail_bytes: Vec<u64>,
    /// Largest number of fragments waiting in the reorder buffer (trunking).
    pub max_reorder_fragments: usize,
    /// The last message's content was checked against the sender's pattern.
    pub verified: bool,
    /// Set when the server failed.
    pub error: Option<String>,
}

/// The result of one baseline client run (printed as one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BaselineResult {
    /// "tcp" or "trunking".
    pub mode: Mode,
    /// Number of rails (= streams for tcp).
    pub rails: usize,
    /// Message size in bytes.
    pub size: usize,
    /// Fragment size (trunking only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frag: Option<usize>,
    /// Whole messages delivered.
    pub iterations: u64,
    /// Bytes delivered in whole messages.
    pub bytes: u64,
    /// Seconds from the first byte sent to the server's report.
    pub seconds: f64,
    /// Goodput in MB/s (10^6 bytes).
    pub bw_mb_s: f64,
    /// Messages per second.
    pub msg_rate: f64,
    /// Client CPU seconds.
    pub client_cpu_s: f64,
    /// Server CPU seconds.
    pub server_cpu_s: f64,
    /// Client CPU seconds per 10^9 bytes moved.
    pub client_cpu_s_per_gb: f64,
    /// Server CPU seconds per 10^9 bytes moved.
    pub server_cpu_s_per_gb: f64,
    /// Bytes received on each rail.
    pub per_rail_bytes: Vec<u64>,
    /// Server's reorder high-water mark (fragments, trunking only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_reorder_fragments: Option<usize>,
}

/// Server options.
#[derive(Debug, Clone)]
pub struct ServerOpts {
    /// Addresses to listen on, one per rail.
    pub listen: Vec<SocketAddrV4>,
    /// How long to wait for a client's connections.
    pub accept_timeout: Duration,
    /// Number of client runs to serve before exiting.
    pub runs: usize,
}

/// Client options.
#[derive(Debug, Clone)]
pub struct ClientOpts {
    /// Rails to use.
    pub rails: Vec<RailSpec>,
    /// Message size.
    pub size: usize,
    /// Send for this long (stopping on a message boundary).
    pub duration: Duration,
    /// Also stop after this many messages.
    pub max_messages: Option<u64>,
    /// Trunking fragment size.
    pub frag: usize,
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::thread;

    use super::*;

    /// Both baselines end to end over loopback, server and client in threads.
    #[test]
    fn loopback_runs() {
        for mode in [Mode::Tcp, Mode::Trunking] {
            let addrs: Vec<SocketAddrV4> = vec![
                "127.0.0.1:0".parse().unwrap(),
                "127.0.0.1:0".parse().unwrap(),
            ];
            let ls = bind(&addrs).unwrap();
            let bound: Vec<SocketAddrV4> = ls
                .iter()
                .map(|l| match l.local_addr().unwrap() {
                    SocketAddr::V4(a) => a,
                    _ => unreachable!(),
                })
                .collect();
            let so = ServerOpts {
                listen: bound.clone(),
                accept_timeout: Duration::from_secs(10),
                runs: 1,
            };
            let srv = thread::spawn(move || serve(mode, &ls, &so));
            let rails = bound
                .iter()
                .map(|&remote| RailSpec {
                    local: "127.0.0.1".parse().unwrap(),
                    remote,
                })
                .collect();
            let co = ClientOpts {
                rails,
                size: 300_000,
                duration: Duration::from_secs(30),
                max_messages: Some(20),
                frag: 4096,
            };
            let r = match mode {
                Mode::Tcp => run_tcp_client(&co).unwrap(),
                Mode::Trunking => run_trunking_client(&co).unwrap(),
            };
            let sr = srv.join().unwrap().unwrap();
            assert_eq!(
                r.bytes,
                20 * 300_000 * if mode == Mode::Tcp { 2 } else { 1 }
            );
            assert_eq!(sr[0].bytes, r.bytes);
            if mode == Mode::Trunking {
                assert!(sr[0].verified);
                assert!(sr[0].per_rail_bytes.iter().all(|&b| b > 0));
            }
        }
    }
}
