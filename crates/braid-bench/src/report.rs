//! Demo results: one [`Row`] per measurement, the text table and the JSON document.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// One measurement of the demo (`{"rows": [...]}` in `braid demo --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Rails (NICs) used; for "tcp" also the number of parallel streams.
    pub rails: usize,
    /// "tcp", "trunking" or "rma".
    pub mode: String,
    /// MTU of the rails.
    pub mtu: u32,
    /// Message size in bytes.
    pub size: usize,
    /// Application goodput in MB/s (10^6 bytes); null when the measurement failed.
    pub goodput_mb_s: Option<f64>,
    /// Sum of the used rails' shaped rates in MB/s; null on unshaped loopback rails.
    pub shaped_mb_s: Option<f64>,
    /// TCP framing limit of the used rails in MB/s; null on loopback.
    pub framing_mb_s: Option<f64>,
    /// goodput / shaped rate (or, on loopback, goodput / (rails × 1-stream tcp goodput)).
    pub efficiency: Option<f64>,
    /// Messages per second.
    pub msg_rate: Option<f64>,
    /// Client CPU seconds per 10^9 bytes.
    pub client_cpu_s_per_gb: Option<f64>,
    /// Server CPU seconds per 10^9 bytes.
    pub server_cpu_s_per_gb: Option<f64>,
    /// Why the measurement failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole demo document.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// "netns" (shaped testbed), "netns-unshaped" (testbed rails without tbf) or "loopback"
    /// (unshaped).
    pub testbed: String,
    /// What `efficiency` is relative to.
    pub efficiency_basis: String,
    /// Rate of each rail in bits per second (empty on loopback).
    pub rail_rates_bit_s: Vec<u64>,
    /// Size the table is made of.
    pub table_size: usize,
    /// Every measurement.
    pub rows: Vec<Row>,
    /// trunking and rma at the largest rail count on testbed rails without tbf, after the
    /// shaped table: there the CPUs are the limit, and direct placement's saved copy shows in
    /// goodput. Empty when skipped (`--no-unshaped`) or when the main run is itself unshaped.
    #[serde(default)]
    pub unshaped_rows: Vec<Row>,
}

impl Report {
    /// Finds the row of one measurement.
    pub fn find(&self, mode: &str, rails: usize, size: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|r| r.mode == mode && r.rails == rails && r.size == size)
    }

    /// Largest rail count present.
    pub fn max_rails(&self) -> usize {
        self.rows.iter().map(|r| r.rails).max().unwrap_or(0)
    }

    /// Recomputes `efficiency` of every row from its basis.
    pub fn fill_efficiency(&mut self) {
        let tcp1 = self
            .find("tcp", 1, self.table_size)
            .and_then(|r| r.goodput_mb_s);
        for r in &mut self.rows {
            let basis = match r.shaped_mb_s {
                Some(s) => Some(s),
                None => tcp1.map(|t| t * r.rails as f64),
            };
            r.efficiency = match (r.goodput_mb_s, basis) {
                (Some(g), Some(b)) if b > 0.0 => Some(g / b),
                _ => None,
            };
        }
    }

    /// The seed's experiment as a text table: per NIC count, one tcp stream, N tcp streams,
    /// trunking and rma at `table_size`, with the shaped rate and the framing limit.
    pub fn table(&self) -> String {
        let mut o = String::new();
        let size = self.table_size;
        let _ = writeln!(
            o,
            "message size {} bytes; goodput MB/s (10^6 B/s) and efficiency = {}",
            size, self.efficiency_basis
        );
        let _ = writeln!(
            o,
            "{:>4} | {:>9} | {:>9} | {:>16} | {:>16} | {:>16} | {:>16}",
            "NICs", "shaped", "framing", "tcp 1 stream", "tcp N streams", "trunking", "rma"
        );
        let _ = writeln!(o, "{}", "-".repeat(4 + 9 * 2 + 16 * 4 + 3 * 6));
        let tcp1 = self.find("tcp", 1, size);
        for n in 1..=self.max_rails() {
            let any = self.rows.iter().find(|r| r.rails == n && r.size == size);
            let shaped = any.and_then(|r| r.shaped_mb_s);
            let framing = any.and_then(|r| r.framing_mb_s);
            let cell = |r: Option<&Row>, basis: Option<f64>| -> String {
                match r {
                    Some(Row {
                        goodput_mb_s: Some(g),
                        ..
                    }) => match basis {
                        Some(b) if b > 0.0 => format!("{g:.1} ({:.1}%)", 100.0 * g / b),
                        _ => format!("{g:.1}"),
                    },
                    Some(_) => "n/a".into(),
                    None => "-".into(),
                }
            };
            let basis = shaped.or_else(|| tcp1.and_then(|t| t.goodput_mb_s).map(|t| t * n as f64));
            let _ = writeln!(
                o,
                "{:>4} | {:>9} | {:>9} | {:>16} | {:>16} | {:>16} | {:>16}",
                n,
                shaped.map_or("unshaped".into(), |s| format!("{s:.1}")),
                framing.map_or("-".into(), |s| format!("{s:.1}")),
                cell(tcp1, basis),
                cell(
                    if n > 1 {
                        self.find("tcp", n, size)
                    } else {
                        tcp1
                    },
                    basis
                ),
                cell(self.find("trunking", n, size), basis),
                cell(self.find("rma", n, size), basis),
            );
        }
        let mut errs: Vec<(String, &str)> = Vec::new();
        for r in &self.rows {
            if let Some(e) = &r.error {
                let first = e.lines().next().unwrap_or("");
                if !errs.iter().any(|(m, x)| *m == r.mode && *x == first) {
                    errs.push((r.mode.clone(), first));
                }
            }
        }
        for (m, e) in errs {
            let _ = writeln!(o, "{m}: n/a: {e}");
        }
        self.unshaped_section(&mut o);
        // CPU cost, where known, as s per GB (client / server).
        let cpu: Vec<String> = ["tcp", "trunking", "rma"]
            .iter()
            .filter_map(|m| {
                let r = self.find(m, self.max_rails(), size)?;
                Some(format!(
                    "{m} {:.2}/{:.2}",
                    r.client_cpu_s_per_gb?, r.server_cpu_s_per_gb?
                ))
            })
            .collect();
        if !cpu.is_empty() {
            let _ = writeln!(
                o,
                "CPU s per GB at {} NICs (client/server): {}",
                self.max_rails(),
                cpu.join(", ")
            );
        }
        o
    }

    /// The extra section of the unshaped rows, if any: goodput and CPU per GB per mode.
    fn unshaped_section(&self, o: &mut String) {
        let Some(first) = self.unshaped_rows.first() else {
            return;
        };
        let _ = writeln!(
            o,
            "\nunshaped rails (no tbf: the CPUs are the limit), {} NICs, message size {} bytes:",
            first.rails, first.size
        );
        let _ = writeln!(
            o,
            "{:>8} | {:>12} | {:>18} | {:>18}",
            "mode", "goodput MB/s", "client CPU s/GB", "server CPU s/GB"
        );
        let _ = writeln!(o, "{}", "-".repeat(8 + 12 + 18 * 2 + 3 * 3));
        let num = |v: Option<f64>, p: usize| v.map_or("n/a".into(), |v| format!("{v:.p$}"));
        for r in &self.unshaped_rows {
            let _ = writeln!(
                o,
                "{:>8} | {:>12} | {:>18} | {:>18}",
                r.mode,
                num(r.goodput_mb_s, 1),
                num(r.client_cpu_s_per_gb, 2),
                num(r.server_cpu_s_per_gb, 2)
            );
            if let Some(e) = &r.error {
                let _ = writeln!(o, "{}: n/a: {}", r.mode, e.lines().next().unwrap_or(""));
            }
        }
    }

    /// `{"rows": [...], ...}` as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("rows serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(mode: &str, rails: usize, g: Option<f64>) -> Row {
        Row {
            rails,
            mode: mode.into(),
            mtu: 1500,
            size: 4 << 20,
            goodput_mb_s: g,
            shaped_mb_s: Some(125.0 * rails as f64),
            framing_mb_s: Some(119.55 * rails as f64),
            efficiency: None,
            msg_rate: None,
            client_cpu_s_per_gb: g.map(|_| 0.5),
            server_cpu_s_per_gb: g.map(|_| 0.7),
            error: if g.is_none() {
                Some("bench is not built yet".into())
            } else {
                None
            },
        }
    }

    #[test]
    fn table_and_json() {
        let mut r = Report {
            testbed: "netns".into(),
            efficiency_basis: "goodput / shaped rate".into(),
            rail_rates_bit_s: vec![1_000_000_000; 2],
            table_size: 4 << 20,
            rows: vec![
                row("tcp", 1, Some(119.5)),
                row("tcp", 2, Some(239.0)),
                row("trunking", 2, Some(200.0)),
                row("rma", 2, None),
            ],
            unshaped_rows: vec![],
        };
        r.fill_efficiency();
        assert!((r.find("tcp", 1, 4 << 20).unwrap().efficiency.unwrap() - 0.956).abs() < 1e-9);
        let t = r.table();
        assert!(t.contains("119.5 (95.6%)"), "{t}");
        assert!(t.contains("200.0 (80.0%)"), "{t}");
        assert!(t.contains("n/a"), "{t}");
        assert!(t.contains("rma: n/a: bench is not built yet"), "{t}");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let rows = v["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 4);
        for k in [
            "rails",
            "mode",
            "mtu",
            "size",
            "goodput_mb_s",
            "shaped_mb_s",
            "efficiency",
        ] {
            assert!(rows[0].get(k).is_some(), "missing {k}");
        }
        assert_eq!(rows[3]["goodput_mb_s"], serde_json::Value::Null);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back.rows, r.rows);
        assert!(!t.contains("unshaped rails"), "{t}");

        let mut u = row("rma", 2, Some(1234.5));
        u.shaped_mb_s = None;
        r.unshaped_rows = vec![row("trunking", 2, None), u];
        let t = r.table();
        assert!(t.contains("unshaped rails (no tbf"), "{t}");
        assert!(t.contains("1234.5"), "{t}");
        assert!(t.contains("0.70"), "{t}");
        assert!(t.contains("trunking: n/a: bench is not built yet"), "{t}");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["unshaped_rows"].as_array().unwrap().len(), 2);
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back.unshaped_rows, r.unshaped_rows);
    }

    #[test]
    fn loopback_efficiency_is_relative_to_one_stream() {
        let mut a = row("tcp", 1, Some(1000.0));
        let mut b = row("trunking", 2, Some(1500.0));
        a.shaped_mb_s = None;
        b.shaped_mb_s = None;
        let mut r = Report {
            testbed: "loopback".into(),
            efficiency_basis: "x".into(),
            rail_rates_bit_s: vec![],
            table_size: 4 << 20,
            rows: vec![a, b],
            unshaped_rows: vec![],
        };
        r.fill_efficiency();
        assert_eq!(r.rows[1].efficiency, Some(0.75));
        assert!(r.table().contains("unshaped"));
    }
}
