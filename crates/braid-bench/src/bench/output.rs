//! Result rows (JSON) and the perftest-like table.

use serde::Serialize;

use super::Op;

/// Latency statistics in µs: of a ping-pong, one way = RTT/2 as perftest
/// ([`LatStats::from_rtts`]); of a read or fetch-add, the whole operation
/// ([`LatStats::from_op_times`]).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct LatStats {
    /// Rounds measured.
    pub samples: usize,
    /// Minimum.
    pub min: f64,
    /// Median.
    pub median: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
}

impl LatStats {
    /// From round-trip times in ns.
    pub fn from_rtts(rtts: &mut [u64]) -> LatStats {
        Self::from_ns(rtts, 2000.0)
    }

    /// From whole-operation times in ns, not halved: a read or a fetch-add is itself the
    /// round trip (perftest's `ib_read_lat` and `ib_atomic_lat` report it so).
    pub fn from_op_times(times: &mut [u64]) -> LatStats {
        Self::from_ns(times, 1000.0)
    }

    fn from_ns(rtts: &mut [u64], ns_per_unit: f64) -> LatStats {
        if rtts.is_empty() {
            return LatStats::default();
        }
        rtts.sort_unstable();
        let n = rtts.len();
        let us = |ns: u64| ns as f64 / ns_per_unit;
        let pct = |p: f64| us(rtts[((n as f64 * p).ceil() as usize).clamp(1, n) - 1]);
        let avg = rtts.iter().map(|&x| us(x)).sum::<f64>() / n as f64;
        let var = rtts.iter().map(|&x| (us(x) - avg).powi(2)).sum::<f64>() / n as f64;
        LatStats {
            samples: n,
            min: us(rtts[0]),
            median: us(rtts[n / 2]),
            p99: pct(0.99),
            p999: pct(0.999),
            max: us(rtts[n - 1]),
            avg,
            stdev: var.sqrt(),
        }
    }
}

fn is_none<T>(v: &Option<T>) -> bool {
    v.is_none()
}

/// One size's result (an element of `{"results": [...]}`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Row {
    /// Operation.
    pub op: String,
    /// Message size in bytes.
    pub size: usize,
    /// Completed operations (latency: measured rounds).
    pub iterations: u64,
    /// Bytes moved (size × iterations).
    pub bytes: u64,
    /// Seconds of the measured loop.
    pub seconds: f64,
    /// Bandwidth in MB/s (10^6 B/s).
    pub bw_mb_s: f64,
    /// Operations per second.
    pub msg_rate: f64,
    /// Operations per second / 10^6.
    pub msg_rate_mpps: f64,
    /// Rails of the endpoint.
    pub rails: usize,
    /// Operations in flight.
    pub depth: usize,
    /// Message-size buffer slots of the client's sources (`--slots`; latency tests: 1).
    #[serde(default)]
    pub slots: usize,
    /// Chunk size asked for (null: braid's default).
    pub chunk_size: Option<usize>,
    /// Client CPU seconds (user + system, whole process) over the loop.
    pub client_cpu_s: f64,
    /// Server CPU seconds over the test.
    pub server_cpu_s: f64,
    /// Client CPU s per 10^9 bytes moved.
    pub client_cpu_s_per_gb: Option<f64>,
    /// Server CPU s per 10^9 bytes moved.
    pub server_cpu_s_per_gb: Option<f64>,
    /// Payload bytes per rail in the data direction (client's for write/send, server's for
    /// read).
    pub rail_bytes: Vec<u64>,
    /// Payload bytes the client sent per rail.
    pub client_rail_bytes: Vec<u64>,
    /// Payload bytes the server sent per rail.
    pub server_rail_bytes: Vec<u64>,
    /// Data check result (--verify, and always for fetch-add's counter).
    #[serde(skip_serializing_if = "is_none")]
    pub verified: Option<bool>,
    /// What the check covered or found.
    #[serde(skip_serializing_if = "is_none")]
    pub verify_detail: Option<String>,
    /// Latency: how the figures are defined.
    #[serde(skip_serializing_if = "is_none")]
    pub lat_definition: Option<String>,
    /// Latency (one way = RTT/2 for ping-pongs, the whole operation for read-lat and
    /// atomic-lat: see `lat_definition`), busy-polled, minimum, µs.
    #[serde(skip_serializing_if = "is_none")]
    pub lat_us_min: Option<f64>,
    /// ... median.
    #[serde(skip_serializing_if = "is_none")]
    pub lat_us_median: Option<f64>,
    /// ... 99th percentile.
    #[serde(skip_serializing_if = "is_none")]
    pub lat_us_p99: Option<f64>,
    /// Round-trip time, busy-polled, median, µs.
    #[serde(skip_serializing_if = "is_none")]
    pub rtt_us_median: Option<f64>,
    /// Full one-way statistics, busy-polled.
    #[serde(skip_serializing_if = "is_none")]
    pub lat_poll: Option<LatStats>,
    /// Full one-way statistics, blocking `cq.wait` on both sides.
    #[serde(skip_serializing_if = "is_none")]
    pub lat_wait: Option<LatStats>,
    /// `cq.wait` spin of the blocking variant, µs (null: braid's default).
    #[serde(skip_serializing_if = "is_none")]
    pub spin_us: Option<u64>,
    /// TCP baseline bandwidth (one stream on rail 0's path), MB/s.
    #[serde(skip_serializing_if = "is_none")]
    pub tcp_bw_mb_s: Option<f64>,
    /// TCP baseline one-way latency (RTT/2) statistics, blocking `recv` on both sides (the
    /// partner of `lat_wait`).
    #[serde(skip_serializing_if = "is_none")]
    pub tcp_lat: Option<LatStats>,
    /// TCP baseline one-way latency, busy polling on both sides (the partner of `lat_poll`).
    #[serde(skip_serializing_if = "is_none")]
    pub tcp_lat_poll: Option<LatStats>,
    /// TCP baseline client CPU s/GB.
    #[serde(skip_serializing_if = "is_none")]
    pub tcp_client_cpu_s_per_gb: Option<f64>,
    /// TCP baseline server CPU s/GB.
    #[serde(skip_serializing_if = "is_none")]
    pub tcp_server_cpu_s_per_gb: Option<f64>,
    /// braid / TCP: bandwidth ratio (bw tests, goal ≥ 0.9) or median latency ratio
    /// (latency tests, goal ≤ 1.5).
    #[serde(skip_serializing_if = "is_none")]
    pub ratio: Option<f64>,
    /// Latency tests: braid's blocking median / the blocking TCP ping-pong's median.
    #[serde(skip_serializing_if = "is_none")]
    pub ratio_wait: Option<f64>,
    /// What `ratio` divides.
    #[serde(skip_serializing_if = "is_none")]
    pub ratio_definition: Option<String>,
    /// Pieces per vectored operation (`-v`).
    #[serde(skip_serializing_if = "is_none")]
    pub pieces: Option<usize>,
    /// The file whose pages the server's region is (`bench server --file`).
    #[serde(skip_serializing_if = "is_none")]
    pub server_file: Option<String>,
    /// `--rewrite`: seconds of the measured loop the client spent writing its sources. No
    /// transfer, however cheap, brings the loop under this: `bytes / rewrite_s` is the
    /// ceiling of `bw_mb_s`.
    #[serde(skip_serializing_if = "is_none")]
    pub rewrite_s: Option<f64>,
}

/// The table's heading for `op`.
/// `relaxed`: the writes' placement (`None` where it does not apply).
/// `transport`: what carries the rails (`tcp`, `shm`, or a mix as `tcp,shm`).
pub fn header(
    op: Op,
    rails: usize,
    transport: &str,
    depth: Option<usize>,
    verify: bool,
    baseline: bool,
    relaxed: Option<bool>,
) -> String {
    let title = match op {
        Op::Write => "RDMA_Write BW Test",
        Op::Read => "RDMA_Read BW Test",
        Op::Send => "Send BW Test",
        Op::FetchAdd => "Atomic FETCH_AND_ADD BW Test",
        Op::WriteLat => "RDMA_Write Latency Test (write_with_imm ping-pong)",
        Op::SendLat => "Send Latency Test",
        Op::ReadLat => "RDMA_Read Latency Test",
        Op::AtomicLat => "Atomic FETCH_AND_ADD Latency Test",
        Op::TcpStream | Op::TcpPingPong => "TCP",
    };
    let line = "-".repeat(100);
    let mut s = format!(
        "{line}\n {title} (braid, {rails} rail(s) over {transport}{}{}{})\n",
        if op.is_lat() {
            String::new()
        } else {
            match depth {
                Some(d) => format!(", depth {d}"),
                None => ", depth 16 MiB in flight (16-1000 ops)".to_string(),
            }
        },
        if verify { ", verify" } else { "" },
        match relaxed {
            Some(true) => ", relaxed placement",
            Some(false) => ", strict placement",
            None => "",
        }
    );
    if op.is_op_lat() {
        s += " latencies are whole operations, post to completion, in usec (as perftest); poll = busy cq.poll, wait = cq.wait, on both sides\n";
        if baseline {
            s += " tcp-p / tcp-w = a TCP ping-pong's round trip on rail 0's path, busy-polled / blocking; braid/TCP divides the same modes\n";
        }
    } else if op.is_lat() {
        s += " latencies are one-way = RTT/2 in usec (as perftest); poll = busy cq.poll, wait = cq.wait\n";
        if baseline {
            s += " tcp-p / tcp-w = a TCP ping-pong on rail 0's path, busy-polled / blocking; braid/TCP divides the same modes\n";
        }
    }
    if op.is_lat() {
        s += &format!(
            " {:>8} {:>12} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "#bytes",
            "#iterations",
            "mode",
            "t_min",
            "t_max",
            "t_typical",
            "t_avg",
            "t_stdev",
            "99%",
            "99.9%"
        );
        if baseline {
            s += &format!(" {:>8}", "braid/TCP");
        }
    } else {
        s += &format!(
            " {:>8} {:>12} {:>19} {:>14} {:>11} {:>11}",
            "#bytes",
            "#iterations",
            "BW average[MB/sec]",
            "MsgRate[Mpps]",
            "CPUs/GB cli",
            "CPUs/GB srv"
        );
        if baseline {
            s += &format!(" {:>12} {:>9}", "TCP[MB/sec]", "braid/TCP");
        }
    }
    s + &format!("\n{line}")
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.prec$}"))
}

fn lat_line(size: usize, iters: u64, mode: &str, l: &LatStats, extra: &str) -> String {
    format!(
        " {:>8} {:>12} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}{extra}",
        size, iters, mode, l.min, l.max, l.median, l.avg, l.stdev, l.p99, l.p999
    )
}

/// The table line(s) of a row.
pub fn line(op: Op, r: &Row, baseline: bool) -> String {
    let mut s = if op.is_lat() {
        let mut s = String::new();
        if let Some(l) = &r.lat_poll {
            let extra = if baseline {
                format!(" {:>8}", opt(r.ratio, 2))
            } else {
                String::new()
            };
            s += &lat_line(r.size, l.samples as u64, "poll", l, &extra);
        }
        if let Some(l) = &r.lat_wait {
            let extra = if baseline {
                format!(" {:>8}", opt(r.ratio_wait, 2))
            } else {
                String::new()
            };
            s += "\n";
            s += &lat_line(r.size, l.samples as u64, "wait", l, &extra);
        }
        for (l, mode) in [(&r.tcp_lat_poll, "tcp-p"), (&r.tcp_lat, "tcp-w")] {
            if let Some(l) = l {
                s += "\n";
                s += &lat_line(r.size, l.samples as u64, mode, l, "");
            }
        }
        s
    } else {
        let mut s = format!(
            " {:>8} {:>12} {:>19.2} {:>14.6} {:>11} {:>11}",
            r.size,
            r.iterations,
            r.bw_mb_s,
            r.msg_rate_mpps,
            opt(r.client_cpu_s_per_gb, 3),
            opt(r.server_cpu_s_per_gb, 3)
        );
        if baseline {
            s += &format!(" {:>12} {:>9}", opt(r.tcp_bw_mb_s, 2), opt(r.ratio, 3));
        }
        s
    };
    if r.rails > 1 && !op.is_lat() {
        let total: u64 = r.rail_bytes.iter().sum();
        if total > 0 {
            let shares: Vec<String> = r
                .rail_bytes
                .iter()
                .map(|b| format!("{:.0}%", 100.0 * *b as f64 / total as f64))
                .collect();
            s += &format!("   rails {}", shares.join("/"));
        }
    }
    if let Some(w) = r.rewrite_s.filter(|w| *w > 0.0) {
        s += &format!(
            "   rewrite {:.0}% of the time (alone: {:.0} MB/s)",
            100.0 * w / r.seconds.max(f64::MIN_POSITIVE),
            r.bytes as f64 / w / 1e6
        );
    }
    match r.verified {
        Some(true) => s += "   verified",
        Some(false) => {
            s += &format!(
                "   VERIFY FAILED: {}",
                r.verify_detail.as_deref().unwrap_or("")
            )
        }
        None => {}
    }
    s
}
