//! `braid soak`: the reliability checks of braid on the emulated cluster.
//!
//! Three modes, each on a testbed the command makes itself (a unique name, torn down on every
//! exit path by the [`Testbed`](braid_testbed::testbed::Testbed) guard) or, where network namespaces cannot be made (or with
//! `--loopback`), on unshaped loopback rails 127.0.0.1..N:
//!
//! * **soak** (default): `--threads` threads post a random mix of `write`, `read`,
//!   `write_with_imm`, `send`, `fetch_add`, `compare_swap` and scatter/gather writes and reads
//!   over `--endpoints` endpoints of `--rail-count` rails each, for `--duration` seconds, while one
//!   rail's link is taken down (`--flap-at`, for `--flap-for` seconds) and brought back up.
//!   Every byte is checked against a model of each target region (reads at completion, a
//!   read-back over braid at the end, and the server's memory directly), atomics are counted
//!   exactly (the fetch-add results chain without gap or repeat; compare-swap answers are
//!   predicted), every receive is matched to its send (per thread, in order, content checked),
//!   and every posted `wr_id` gets exactly one completion, in post order per endpoint.
//!   Memory is bounded: the process's peak RSS (`VmHWM`) must stay below `--max-rss-mb`.
//! * **`--failover-transfer`**: one endpoint writes `--transfer-size` (1 GiB) in `--op-size`
//!   (4 MiB) operations; `--fail-after` seconds in, rail `--fail-rail`'s link goes down for
//!   good. Reports goodput before the failure and after its detection, and checks every byte
//!   and that the ratio is at least `--min-ratio` (0.70; on the testbed only).
//! * **`--kill-peer`**: the target runs as a separate process (`braid soak-peer`, in host 1);
//!   during a stream of writes it is sent `--kill-signal` (`kill`: SIGKILL, the kernel closes
//!   its sockets; `stop`: SIGSTOP, nothing more arrives and only the timeout can tell). Every
//!   operation must complete exactly once, the outstanding ones with an error, within
//!   `peer_timeout` + 1 s of the signal.
//!
//! Threads that use braid run inside the namespace of their host (created with
//! [`Testbed::spawn_in`](braid_testbed::testbed::Testbed::spawn_in)). A failed rail is re-dialled from the namespace its endpoint was
//! connected in, whichever thread (of whichever namespace) noticed the failure.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use braid::RegionOptions;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use braid_testbed::parse;

/// Size of each server receive buffer; sends are at most this long.
const RECV_LEN: usize = 64 << 10;
/// Receives each server endpoint keeps posted.
const RECVS_PER_EP: usize = 64;
/// Header of a send's payload: magic, thread, endpoint, sequence, length, seed.
const SEND_HDR: usize = 32;
const SEND_MAGIC: u32 = 0x534F_414B;
/// Bounded waits for set-up steps.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Regions whose pages are resident from the start (`MAP_POPULATE`), as verbs registration
/// pins memory.
const RESIDENT: RegionOptions = RegionOptions {
    huge_pages: false,
    populate: true,
};
/// Gap between the pieces of a scatter/gather list in the local slot.
const SG_GAP: usize = 64;

/// `braid soak` options.
#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// Seconds of random operations (soak mode).
    #[arg(short = 'D', long, default_value_t = 60.0)]
    pub duration: f64,
    /// Threads posting operations; each uses every endpoint.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Endpoints between the two hosts.
    #[arg(long, default_value_t = 2)]
    pub endpoints: usize,
    /// Rails per endpoint (veth pairs of the testbed).
    #[arg(long = "rail-count", value_name = "N", default_value_t = 4)]
    pub rails: usize,
    /// Shaped rate of every rail (tc units: 1gbit, 250mbit, ...).
    #[arg(long, default_value = "1gbit", value_parser = crate::args::rail_rate)]
    pub rate: crate::args::RailRate,
    /// Seconds into the run at which the flapped rail's link goes down (default: a quarter
    /// of the duration).
    #[arg(long)]
    pub flap_at: Option<f64>,
    /// Seconds the link stays down.
    #[arg(long, default_value_t = 3.0)]
    pub flap_for: f64,
    /// Repeat the flap every this many seconds after --flap-at (while the run lasts).
    #[arg(long)]
    pub flap_every: Option<f64>,
    /// Which rail to flap (and, with --failover-transfer, to fail).
    #[arg(long, alias = "fail-rail", default_value_t = 0)]
    pub flap_rail: usize,
    /// No flap: a soak of the healthy cluster.
    #[arg(long)]
    pub no_flap: bool,
    /// Largest RMA operation (bytes; K/M suffixes).
    #[arg(long, default_value = "1M", value_parser = parse::parse_size)]
    pub max_size: usize,
    /// Bytes of each thread's area in each endpoint's target region.
    #[arg(long, default_value = "4M", value_parser = parse::parse_size)]
    pub area: usize,
    /// Operations in flight per thread.
    #[arg(short = 'q', long, default_value_t = 8)]
    pub depth: usize,
    /// SessionConfig::peer_timeout of every endpoint, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub peer_timeout: f64,
    /// Fail when the peak RSS exceeds this many MiB (default: twice the planned memory
    /// plus 256 MiB).
    #[arg(long)]
    pub max_rss_mb: Option<u64>,
    /// Seed of the operation mix (default: from the clock; printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Use unshaped loopback rails even where namespaces work.
    #[arg(long)]
    pub loopback: bool,
    /// Write the summary as JSON to FILE ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// Mode: a large verified write during which one rail's link goes down for good.
    #[arg(long, conflicts_with = "kill_peer")]
    pub failover_transfer: bool,
    /// Bytes written by --failover-transfer.
    #[arg(long, default_value = "1G", value_parser = parse::parse_size)]
    pub transfer_size: usize,
    /// Size of each write of --failover-transfer and --kill-peer.
    #[arg(long, default_value = "4M", value_parser = parse::parse_size)]
    pub op_size: usize,
    /// Seconds into the transfer at which the link goes down (--failover-transfer) or the
    /// peer is signalled (--kill-peer).
    #[arg(long, alias = "kill-after", default_value_t = 1.0)]
    pub fail_after: f64,
    /// --failover-transfer: how the rail fails. `link-down` sets the client's end of the
    /// rail down (both ends see a local event); `drop` makes the server's end drop every
    /// packet silently (a qdisc that drops everything; the link stays up). Testbed only for
    /// `drop`.
    #[arg(long, value_enum, default_value_t = FailHow::LinkDown)]
    pub fail_how: FailHow,
    /// --failover-transfer: least goodput after / before the failure (testbed only).
    #[arg(long, default_value_t = 0.70)]
    pub min_ratio: f64,

    /// Mode: the target is a separate process, signalled during a transfer.
    #[arg(long)]
    pub kill_peer: bool,
    /// Signal for --kill-peer.
    #[arg(long, value_enum, default_value_t = KillSignal::Kill)]
    pub kill_signal: KillSignal,
}

/// How `--failover-transfer` takes its rail out.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FailHow {
    /// The client's end of the rail goes down (its peer loses the carrier).
    #[default]
    LinkDown,
    /// The server's end of the rail drops everything it sends; no local event anywhere.
    Drop,
}

/// How the peer process is taken out.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KillSignal {
    /// SIGKILL: the kernel closes the process's sockets.
    Kill,
    /// SIGSTOP: the process hangs with its sockets open; only the timeout notices.
    Stop,
}

/// `braid soak-peer` (internal): the target process of `braid soak --kill-peer`.
#[derive(Args, Debug, Clone)]
pub struct PeerArgs {
    /// Addresses to listen on, IP:PORT[,IP:PORT...] (port 0: any).
    #[arg(long, value_delimiter = ',')]
    pub listen: Vec<SocketAddr>,
    /// Bytes of the target region.
    #[arg(long, default_value = "64M", value_parser = parse::parse_size)]
    pub size: usize,
    /// SessionConfig::peer_timeout, seconds.
    #[arg(long, default_value_t = 1.0)]
    pub peer_timeout: f64,
    /// Exit after this many seconds at the latest.
    #[arg(long, default_value_t = 60.0)]
    pub max_seconds: f64,
}

mod kill;
mod net;
mod run;
mod target;
mod transfer;
mod util;
mod worker;

pub use kill::{KillReport, kill_peer, peer_main};
pub use net::Net;
pub use run::{SoakSummary, soak};
pub use transfer::{TransferReport, failover_transfer};
pub use util::max_rss_kib;
use util::write_json;

/// `braid soak ...`: runs the selected mode, prints its summary, fails when a check failed.
pub fn main(a: &SoakArgs) -> Result<()> {
    if a.kill_peer {
        let r = kill_peer(a)?;
        if let Some(p) = &a.json {
            write_json(p, &r)?;
        }
        if !r.passed {
            bail!("kill-peer check failed: {}", r.errors.join("; "));
        }
        return Ok(());
    }
    if a.failover_transfer {
        let r = failover_transfer(a)?;
        if let Some(p) = &a.json {
            write_json(p, &r)?;
        }
        if !r.passed {
            bail!("failover transfer failed: {}", r.errors.join("; "));
        }
        return Ok(());
    }
    let s = soak(a)?;
    if let Some(p) = &a.json {
        write_json(p, &s)?;
    }
    if !s.passed {
        bail!("soak failed: {}", s.errors.join("; "));
    }
    Ok(())
}
