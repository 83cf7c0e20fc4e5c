//! Result rows of `braid fs bench` (`{"results": [...], "goals": [...]}`), ratios against
//! sshfs from the same run, the goals of issue 11 and the text table.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// One measurement: one workload on one system over one network, in one round.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Row {
    /// "4x1gbit" style (shaped rails of the testbed) or "unshaped".
    pub net: String,
    /// "local" (the server's directory itself), "sshfs", "braid-mount" or "braid-lib".
    pub system: String,
    /// Rails the system uses (sshfs: one TCP connection, rail 0).
    pub rails: usize,
    /// "seq-read", "seq-write", "rand-read" or "metadata".
    pub test: String,
    /// Round (systems alternate within a round, so load changes hit all of them).
    pub round: u32,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Operations (1 MiB blocks, 4 KiB reads or files).
    pub ops: u64,
    /// Wall seconds.
    pub seconds: f64,
    /// Throughput, MB/s (10^6 B/s); null for the metadata loop.
    pub mb_s: Option<f64>,
    /// Operations per second (files/s for the metadata loop).
    pub ops_s: f64,
    /// Median latency of one operation (random reads, metadata), µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lat_us_median: Option<f64>,
    /// 99th percentile, µs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lat_us_p99: Option<f64>,
    /// CPU seconds of the application (dd, or the measuring thread / library client).
    pub app_cpu_s: f64,
    /// CPU seconds of the client's file system processes (FUSE daemon and helpers).
    pub client_cpu_s: f64,
    /// CPU seconds of the server's processes.
    pub server_cpu_s: f64,
    /// Page faults (minor + major) of the server's processes over the run: a write into
    /// file pages mapped `MAP_SHARED` faults once per new page.
    pub server_faults: u64,
    /// Busy CPU seconds of the whole machine over the run, less the background rate measured
    /// before (other load on a shared machine), never below zero.
    pub machine_cpu_s: f64,
    /// (app + client) CPU s per 10^9 bytes.
    pub client_cpu_s_per_gb: Option<f64>,
    /// Server CPU s per 10^9 bytes.
    pub server_cpu_s_per_gb: Option<f64>,
    /// Whole machine's CPU s per 10^9 bytes.
    pub machine_cpu_s_per_gb: Option<f64>,
    /// TCP framing limit of the rails used (shaped networks), MB/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub framing_limit_mb_s: Option<f64>,
    /// mb_s / framing_limit_mb_s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of_framing_limit: Option<f64>,
    /// Throughput (or files/s) divided by sshfs's in the same round, network and test.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vs_sshfs: Option<f64>,
    /// Fraction of the file in the client's page cache just before a read started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resident_before: Option<f64>,
    /// Median µs of each step of one operation (metadata loop), where the time goes.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phases_us: Vec<(String, f64)>,
    /// What was checked.
    pub check: String,
    /// Why the measurement failed (the other fields are then empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Row {
    /// Throughput for ratios: MB/s, or files/s for the metadata loop.
    pub fn rate(&self) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        self.mb_s.or(Some(self.ops_s))
    }

    /// Total CPU per GB of the file service: application + client + server.
    pub fn total_cpu_s_per_gb(&self) -> Option<f64> {
        (self.bytes > 0 && self.error.is_none()).then(|| {
            (self.app_cpu_s + self.client_cpu_s + self.server_cpu_s) / (self.bytes as f64 / 1e9)
        })
    }
}

/// Fills `vs_sshfs` of every row from the sshfs row of the same net, test and round.
pub fn fill_ratios(rows: &mut [Row]) {
    let base: Vec<(String, String, u32, f64)> = rows
        .iter()
        .filter(|r| r.system == "sshfs")
        .filter_map(|r| Some((r.net.clone(), r.test.clone(), r.round, r.rate()?)))
        .collect();
    for r in rows.iter_mut() {
        r.vs_sshfs = base
            .iter()
            .find(|(n, t, k, _)| *n == r.net && *t == r.test && *k == r.round)
            .and_then(|(_, _, _, b)| Some(r.rate()? / b));
    }
}

/// One goal of issue 11, judged on the medians over rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Goal {
    /// What is asked.
    pub goal: String,
    /// The figure measured (median over rounds), if the rows exist.
    pub measured: Option<f64>,
    /// The threshold.
    pub target: f64,
    /// Unit of both.
    pub unit: String,
    /// Whether it is met (null: not measured in this run).
    pub met: Option<bool>,
    /// The figures it came from.
    pub detail: String,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Median of `f` over the rows of one (net, system, rails, test).
pub fn med(
    rows: &[Row],
    net: &str,
    system: &str,
    rails: usize,
    test: &str,
    f: impl Fn(&Row) -> Option<f64>,
) -> Option<f64> {
    median(
        rows.iter()
            .filter(|r| r.net == net && r.system == system && r.test == test)
            .filter(|r| system == "sshfs" || system == "local" || r.rails == rails)
            .filter_map(&f)
            .collect(),
    )
}

fn goal(goal: &str, measured: Option<f64>, target: f64, unit: &str, detail: String) -> Goal {
    Goal {
        goal: goal.into(),
        measured,
        target,
        unit: unit.into(),
        met: measured.map(|m| m >= target),
        detail,
    }
}

fn f(v: Option<f64>) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}"))
}

/// The goals of issue 11 from this run's rows. `shaped`: the shaped net's name; `rails`: its
/// rail count; `framing`: the framing limit of all its rails together (MB/s).
pub fn goals(rows: &[Row], shaped: &str, rails: usize, framing: f64) -> Vec<Goal> {
    let rate = |sys: &str, r: usize, net: &str, test: &str| med(rows, net, sys, r, test, Row::rate);
    let ssh_read = rate("sshfs", 1, shaped, "seq-read");
    let lib_read = rate("braid-lib", rails, shaped, "seq-read");
    let mnt_read = rate("braid-mount", rails, shaped, "seq-read");
    let mnt_write = rate("braid-mount", rails, shaped, "seq-write");
    let local_write = rate("local", 1, shaped, "seq-write");
    let pct = |v: Option<f64>| v.map(|x| 100.0 * x / framing);
    let mut g = vec![
        goal(
            &format!("client library sequential read, {rails} rails: >= 99% of the framing limit"),
            pct(lib_read),
            99.0,
            "% of framing limit",
            format!("{} MB/s of {framing:.1}", f(lib_read)),
        ),
        goal(
            &format!("mount sequential read, {rails} rails: >= 95% of the framing limit"),
            pct(mnt_read),
            95.0,
            "% of framing limit",
            format!(
                "{} MB/s of {framing:.1}; sshfs {} MB/s, ratio {}",
                f(mnt_read),
                f(ssh_read),
                f(mnt_read.zip(ssh_read).map(|(a, b)| a / b))
            ),
        ),
        goal(
            &format!(
                "mount sequential write with fsync, {rails} rails: >= 90% of the framing limit"
            ),
            pct(mnt_write),
            90.0,
            "% of framing limit",
            format!(
                "{} MB/s of {framing:.1}; the server's own disk (dd conv=fsync) {} MB/s",
                f(mnt_write),
                f(local_write)
            ),
        ),
    ];
    let un = "unshaped";
    let un_mnt = rate("braid-mount", rails, un, "seq-read");
    let un_ssh = rate("sshfs", 1, un, "seq-read");
    let cpu = |sys: &str| med(rows, un, sys, rails, "seq-read", Row::total_cpu_s_per_gb);
    let (cpu_mnt, cpu_ssh) = (cpu("braid-mount"), cpu("sshfs"));
    g.push(goal(
        "unshaped mount sequential read: >= 1 GB/s",
        un_mnt,
        1000.0,
        "MB/s",
        format!("sshfs {} MB/s", f(un_ssh)),
    ));
    g.push(goal(
        "unshaped mount sequential read: >= 5x sshfs",
        un_mnt.zip(un_ssh).map(|(a, b)| a / b),
        5.0,
        "x sshfs",
        format!("{} / {} MB/s", f(un_mnt), f(un_ssh)),
    ));
    g.push(goal(
        "unshaped mount read CPU per GB (app + client + server): <= 1/5 of sshfs's",
        cpu_mnt.zip(cpu_ssh).map(|(a, b)| b / a),
        5.0,
        "sshfs CPU/GB / braid CPU/GB",
        format!(
            "braid {} CPU s/GB, sshfs {} CPU s/GB (machine-wide: braid {}, sshfs {})",
            cpu_mnt.map_or("-".into(), |x| format!("{x:.2}")),
            cpu_ssh.map_or("-".into(), |x| format!("{x:.2}")),
            med(rows, un, "braid-mount", rails, "seq-read", |r| r
                .machine_cpu_s_per_gb)
            .map_or("-".into(), |x| format!("{x:.2}")),
            med(rows, un, "sshfs", 1, "seq-read", |r| r.machine_cpu_s_per_gb)
                .map_or("-".into(), |x| format!("{x:.2}")),
        ),
    ));
    let md = rate("braid-mount", rails, shaped, "metadata");
    let ms = rate("sshfs", 1, shaped, "metadata");
    g.push(goal(
        "metadata loop (create+write 1 B+close+stat+unlink), mount: >= 2x sshfs files/s",
        md.zip(ms).map(|(a, b)| a / b),
        2.0,
        "x sshfs",
        format!(
            "braid {} files/s, sshfs {} files/s, local disk {}",
            f(md),
            f(ms),
            f(rate("local", 1, shaped, "metadata"))
        ),
    ));
    g
}

/// The text table of all rows, then the goals.
pub fn table(rows: &[Row], goals: &[Goal]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:<12} {:>5} {:<10} {:>3} {:>10} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>7} {:>7}",
        "net",
        "system",
        "rails",
        "test",
        "rnd",
        "MB/s",
        "ops/s",
        "lat50 us",
        "lat99 us",
        "cli s/GB",
        "srv s/GB",
        "mch s/GB",
        "%frame",
        "x sshfs"
    );
    let o = |v: Option<f64>, p: usize| v.map_or("-".into(), |x| format!("{x:.p$}"));
    for r in rows {
        if let Some(e) = &r.error {
            let _ = writeln!(
                s,
                "{:<9} {:<12} {:>5} {:<10} {:>3} FAILED: {e}",
                r.net, r.system, r.rails, r.test, r.round
            );
            continue;
        }
        let _ = writeln!(
            s,
            "{:<9} {:<12} {:>5} {:<10} {:>3} {:>10} {:>10.0} {:>9} {:>9} {:>8} {:>8} {:>8} {:>7} {:>7}",
            r.net,
            r.system,
            r.rails,
            r.test,
            r.round,
            o(r.mb_s, 1),
            r.ops_s,
            o(r.lat_us_median, 0),
            o(r.lat_us_p99, 0),
            o(r.client_cpu_s_per_gb, 2),
            o(r.server_cpu_s_per_gb, 2),
            o(r.machine_cpu_s_per_gb, 2),
            o(r.of_framing_limit.map(|x| x * 100.0), 1),
            o(r.vs_sshfs, 2)
        );
    }
    let steps: Vec<&Row> = rows.iter().filter(|r| !r.phases_us.is_empty()).collect();
    if !steps.is_empty() {
        let _ = writeln!(
            s,
            "\nwhere the time goes, µs per step (metadata loop: medians; library write: totals):"
        );
        for r in steps {
            let p: Vec<String> = r
                .phases_us
                .iter()
                .map(|(n, v)| format!("{n} {v:.0}"))
                .collect();
            let _ = writeln!(
                s,
                "  {:<9} {:<12} {} rail(s) {:<9} round {}: {}",
                r.net,
                r.system,
                r.rails,
                r.test,
                r.round,
                p.join(", ")
            );
        }
    }
    if !goals.is_empty() {
        let _ = writeln!(s, "\ngoals (medians over rounds):");
        for g in goals {
            let verdict = match g.met {
                Some(true) => "MET",
                Some(false) => "NOT MET",
                None => "not measured",
            };
            let _ = writeln!(
                s,
                "  [{verdict}] {}: {} (target {} {}); {}",
                g.goal,
                g.measured.map_or("-".into(), |m| format!("{m:.2}")),
                g.target,
                g.unit,
                g.detail
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(net: &str, system: &str, rails: usize, test: &str, round: u32, mb_s: f64) -> Row {
        Row {
            net: net.into(),
            system: system.into(),
            rails,
            test: test.into(),
            round,
            bytes: 1 << 30,
            mb_s: Some(mb_s),
            ops_s: 1.0,
            app_cpu_s: 1.0,
            client_cpu_s: 1.0,
            server_cpu_s: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn ratios_and_goals_from_medians() {
        let mut rows = vec![
            row("4x1gbit", "sshfs", 1, "seq-read", 0, 117.0),
            row("4x1gbit", "braid-mount", 4, "seq-read", 0, 460.0),
            row("4x1gbit", "braid-mount", 1, "seq-read", 0, 119.0),
            row("4x1gbit", "sshfs", 1, "seq-read", 1, 100.0),
            row("4x1gbit", "braid-mount", 4, "seq-read", 1, 450.0),
            row("4x1gbit", "braid-mount", 4, "seq-read", 2, 470.0),
        ];
        rows[2].error = Some("x".into());
        fill_ratios(&mut rows);
        assert!((rows[1].vs_sshfs.unwrap() - 460.0 / 117.0).abs() < 1e-9);
        assert!((rows[4].vs_sshfs.unwrap() - 4.5).abs() < 1e-9);
        assert_eq!(rows[2].vs_sshfs, None);
        assert_eq!(rows[5].vs_sshfs, None);
        let g = goals(&rows, "4x1gbit", 4, 478.2);
        let mount = &g[1];
        assert!((mount.measured.unwrap() - 100.0 * 460.0 / 478.2).abs() < 1e-9);
        assert_eq!(mount.met, Some(true));
        assert_eq!(g[0].met, None, "no library rows: not measured");
        let t = table(&rows, &g);
        assert!(t.contains("FAILED: x") && t.contains("[MET]") && t.contains("not measured"));
    }
}
