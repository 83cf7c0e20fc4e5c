//! Hand-written SVG charts of the demo's rows: (a) goodput against message size (log scale)
//! for 1..N rails, rma solid and trunking dashed; (b) grouped bars per rail count: tcp (one
//! stream and N streams), trunking, rma and the shaped rate.

use std::fmt::Write;

use crate::report::Report;

const W: f64 = 900.0;
const PANEL_H: f64 = 380.0;
const ML: f64 = 70.0;
const MR: f64 = 170.0;
const MT: f64 = 40.0;
const MB: f64 = 50.0;
const RAIL_COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice_max(v: f64) -> f64 {
    if v <= 0.0 {
        return 1.0;
    }
    // Steps whose fifth (the grid spacing) is a round number, so that a 478 MB/s maximum
    // gets a 0..500 axis rather than 0..1000.
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0] {
        if m * p >= v {
            return m * p;
        }
    }
    10.0 * p
}

fn size_label(s: usize) -> String {
    if s >= 1 << 20 && s.is_multiple_of(1 << 20) {
        format!("{}M", s >> 20)
    } else if s >= 1 << 10 && s.is_multiple_of(1 << 10) {
        format!("{}K", s >> 10)
    } else {
        s.to_string()
    }
}

/// Renders both panels into one SVG document.
pub fn render(report: &Report) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" font-family="sans-serif" font-size="12">"#,
        2.0 * PANEL_H
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    size_panel(&mut o, report, 0.0);
    bar_panel(&mut o, report, PANEL_H);
    o.push_str("</svg>\n");
    o
}

fn axes(o: &mut String, y0: f64, ymax: f64, title: &str, xlabel: &str) -> (f64, f64, f64, f64) {
    let (x1, x2) = (ML, W - MR);
    let (yt, yb) = (y0 + MT, y0 + PANEL_H - MB);
    let _ = writeln!(
        o,
        r#"<text x="{}" y="{}" font-size="14" font-weight="bold">{}</text>"#,
        ML,
        y0 + 22.0,
        esc(title)
    );
    let _ = writeln!(
        o,
        r#"<line x1="{x1}" y1="{yb}" x2="{x2}" y2="{yb}" stroke="black"/><line x1="{x1}" y1="{yt}" x2="{x1}" y2="{yb}" stroke="black"/>"#
    );
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let y = yb - (yb - yt) * i as f64 / 5.0;
        let _ = writeln!(
            o,
            r##"<line x1="{x1}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"##,
            x1 - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle">goodput MB/s</text>"#,
        (yt + yb) / 2.0,
        (yt + yb) / 2.0
    );
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (x1 + x2) / 2.0,
        yb + 38.0,
        esc(xlabel)
    );
    (x1, x2, yt, yb)
}

fn size_panel(o: &mut String, r: &Report, y0: f64) {
    let mut sizes: Vec<usize> = r
        .rows
        .iter()
        .filter(|x| x.mode != "tcp" && x.goodput_mb_s.is_some())
        .map(|x| x.size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let ymax = nice_max(
        r.rows
            .iter()
            .filter_map(|x| x.goodput_mb_s)
            .fold(0.0, f64::max)
            * 1.05,
    );
    let (x1, x2, yt, yb) = axes(
        o,
        y0,
        ymax,
        "(a) goodput against message size",
        "message size (bytes, log scale)",
    );
    if sizes.is_empty() {
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">no size sweep measured</text>"#,
            (x1 + x2) / 2.0,
            (yt + yb) / 2.0
        );
        return;
    }
    let (lmin, lmax) = (
        (sizes[0] as f64).log2(),
        (*sizes.last().expect("nonempty") as f64).log2(),
    );
    let xs = |s: usize| -> f64 {
        if lmax > lmin {
            x1 + 20.0 + (x2 - x1 - 40.0) * ((s as f64).log2() - lmin) / (lmax - lmin)
        } else {
            (x1 + x2) / 2.0
        }
    };
    let ys = |v: f64| yb - (yb - yt) * v / ymax;
    for &s in &sizes {
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            xs(s),
            yb + 16.0,
            size_label(s)
        );
    }
    let mut legend_y = yt;
    for (mode, dash) in [("rma", ""), ("trunking", r#" stroke-dasharray="6 4""#)] {
        for n in 1..=r.max_rails() {
            let mut pts: Vec<(usize, f64)> = r
                .rows
                .iter()
                .filter(|x| x.mode == mode && x.rails == n)
                .filter_map(|x| Some((x.size, x.goodput_mb_s?)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by_key(|p| p.0);
            let c = RAIL_COLORS[(n - 1) % RAIL_COLORS.len()];
            let path: Vec<String> = pts
                .iter()
                .map(|&(s, v)| format!("{:.1},{:.1}", xs(s), ys(v)))
                .collect();
            let _ = writeln!(
                o,
                r#"<polyline points="{}" fill="none" stroke="{c}" stroke-width="2"{dash}/>"#,
                path.join(" ")
            );
            for &(s, v) in &pts {
                let _ = writeln!(
                    o,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                    xs(s),
                    ys(v)
                );
            }
            let _ = writeln!(
                o,
                r#"<line x1="{}" y1="{legend_y:.1}" x2="{}" y2="{legend_y:.1}" stroke="{c}" stroke-width="2"{dash}/><text x="{}" y="{:.1}">{mode} {n} NIC{}</text>"#,
                x2 + 10.0,
                x2 + 40.0,
                x2 + 46.0,
                legend_y + 4.0,
                if n > 1 { "s" } else { "" }
            );
            legend_y += 18.0;
        }
    }
}

fn bar_panel(o: &mut String, r: &Report, y0: f64) {
    let size = r.table_size;
    let n = r.max_rails();
    let series: [(&str, &str); 5] = [
        ("tcp 1 stream", "#9e9e9e"),
        ("tcp N streams", "#616161"),
        ("trunking", "#ff7f0e"),
        ("rma", "#1f77b4"),
        ("shaped rate", "#2ca02c"),
    ];
    let value = |k: usize, s: &str| -> Option<f64> {
        match s {
            "tcp 1 stream" => r.find("tcp", 1, size)?.goodput_mb_s,
            "tcp N streams" => r.find("tcp", k, size)?.goodput_mb_s,
            "trunking" => r.find("trunking", k, size)?.goodput_mb_s,
            "rma" => r.find("rma", k, size)?.goodput_mb_s,
            _ => {
                r.rows
                    .iter()
                    .find(|x| x.rails == k && x.size == size)?
                    .shaped_mb_s
            }
        }
    };
    let mut vmax: f64 = 0.0;
    for k in 1..=n {
        for (s, _) in series {
            vmax = vmax.max(value(k, s).unwrap_or(0.0));
        }
    }
    let ymax = nice_max(vmax * 1.05);
    let title = format!(
        "(b) trunking comparison, {}-byte messages ({} B)",
        size_label(size),
        size
    );
    let (x1, x2, yt, yb) = axes(o, y0, ymax, &title, "NICs (rails)");
    if n == 0 {
        return;
    }
    let group = (x2 - x1) / n as f64;
    let bw = group * 0.8 / series.len() as f64;
    let ys = |v: f64| yb - (yb - yt) * v / ymax;
    let framing = |k: usize| -> Option<f64> {
        r.rows
            .iter()
            .find(|x| x.rails == k && x.size == size)?
            .framing_mb_s
    };
    for k in 1..=n {
        let gx = x1 + group * (k - 1) as f64 + group * 0.1;
        if let Some(f) = framing(k) {
            // TCP's framing limit across the whole group: what any TCP-based transport can reach.
            let _ = writeln!(
                o,
                r#"<line x1="{gx:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="black" stroke-width="1.5" stroke-dasharray="4 3"><title>TCP framing limit: {f:.1} MB/s</title></line>"#,
                gx + group * 0.8,
                y = ys(f)
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{k}</text>"#,
            gx + group * 0.4,
            yb + 16.0
        );
        for (i, (s, c)) in series.iter().enumerate() {
            let x = gx + bw * i as f64;
            match value(k, s) {
                Some(v) => {
                    let _ = writeln!(
                        o,
                        r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{c}"><title>{s}: {v:.1} MB/s</title></rect>"#,
                        ys(v),
                        bw * 0.9,
                        yb - ys(v)
                    );
                }
                None => {
                    let _ = writeln!(
                        o,
                        r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">n/a</text>"#,
                        x + bw * 0.45,
                        yb - 4.0
                    );
                }
            }
        }
    }
    for (i, (s, c)) in series.iter().enumerate() {
        let y = yt + 18.0 * i as f64;
        let _ = writeln!(
            o,
            r#"<rect x="{}" y="{:.1}" width="14" height="10" fill="{c}"/><text x="{}" y="{:.1}">{s}</text>"#,
            x2 + 10.0,
            y - 6.0,
            x2 + 30.0,
            y + 4.0
        );
    }
    if (1..=n).any(|k| framing(k).is_some()) {
        let y = yt + 18.0 * series.len() as f64;
        let _ = writeln!(
            o,
            r#"<line x1="{}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="black" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{}" y="{:.1}">TCP framing limit</text>"#,
            x2 + 10.0,
            y - 1.0,
            x2 + 24.0,
            y - 1.0,
            x2 + 30.0,
            y + 4.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Row;

    #[test]
    fn renders_wellformed_svg() {
        let mk = |mode: &str, rails: usize, size: usize, g: Option<f64>| Row {
            rails,
            mode: mode.into(),
            mtu: 1500,
            size,
            goodput_mb_s: g,
            shaped_mb_s: Some(125.0 * rails as f64),
            framing_mb_s: None,
            efficiency: None,
            msg_rate: None,
            client_cpu_s_per_gb: None,
            server_cpu_s_per_gb: None,
            error: None,
        };
        let r = Report {
            testbed: "netns".into(),
            efficiency_basis: "x".into(),
            rail_rates_bit_s: vec![],
            table_size: 4 << 20,
            rows: vec![
                mk("tcp", 1, 4 << 20, Some(119.0)),
                mk("trunking", 1, 65536, Some(100.0)),
                mk("trunking", 1, 4 << 20, Some(110.0)),
                mk("rma", 1, 4 << 20, None),
            ],
        };
        let s = render(&r);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("polyline"));
        assert!(s.contains("n/a"));
        assert_eq!(s.matches("<svg").count(), 1);
        assert_eq!(size_label(65536), "64K");
        assert_eq!(nice_max(478.0), 500.0);
    }
}
