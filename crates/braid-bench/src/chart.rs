//! Hand-written SVG charts of the demo's rows: (a) goodput against message size (log scale)
//! for 1..N rails, rma solid and trunking dashed; (b) grouped bars per rail count: tcp (one
//! stream and N streams), trunking, rma and the shaped rate; (c) CPU seconds per GB at the
//! receiver and the sender per rail count, where direct placement's saved copy shows on shaped
//! rails; (d), when measured, trunking and rma goodput on unshaped rails, where it shows in
//! goodput.

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

/// Renders the panels into one SVG document (the unshaped panel only when its rows exist).
pub fn render(report: &Report) -> String {
    let panels = if report.unshaped_rows.is_empty() {
        3
    } else {
        4
    };
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{}" font-family="sans-serif" font-size="12">"#,
        panels as f64 * PANEL_H
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    size_panel(&mut o, report, 0.0);
    bar_panel(&mut o, report, PANEL_H);
    cpu_panel(&mut o, report, 2.0 * PANEL_H);
    if panels == 4 {
        unshaped_panel(&mut o, report, 3.0 * PANEL_H);
    }
    o.push_str("</svg>\n");
    o
}

/// Title, axes, grid and labels of one panel at `y0`; returns the plot area (x1, x2, yt, yb).
fn axes(
    o: &mut String,
    y0: f64,
    ymax: f64,
    title: &str,
    xlabel: &str,
    ylabel: &str,
) -> (f64, f64, f64, f64) {
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
    // CPU seconds per GB are fractions: ticks of 0.1 need decimals.
    let decimals = if ymax < 5.0 { 2 } else { 0 };
    for i in 0..=5 {
        let v = ymax * i as f64 / 5.0;
        let y = yb - (yb - yt) * i as f64 / 5.0;
        let _ = writeln!(
            o,
            r##"<line x1="{x1}" y1="{y:.1}" x2="{x2}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{v:.decimals$}</text>"##,
            x1 - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        o,
        r#"<text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle">{}</text>"#,
        (yt + yb) / 2.0,
        (yt + yb) / 2.0,
        esc(ylabel)
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
        "goodput MB/s",
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
    let (x1, x2, yt, yb) = axes(o, y0, ymax, &title, "NICs (rails)", "goodput MB/s");
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

/// Colour of each mode in the CPU and unshaped panels (as in the bar panel).
fn mode_color(mode: &str) -> &'static str {
    match mode {
        "tcp" => "#616161",
        "trunking" => "#ff7f0e",
        _ => "#1f77b4",
    }
}

/// "n/a" where a bar has no figure.
fn na(o: &mut String, x: f64, y: f64) {
    let _ = writeln!(
        o,
        r#"<text x="{x:.1}" y="{y:.1}" font-size="9" text-anchor="middle">n/a</text>"#
    );
}

/// (c) CPU seconds per GB at the table's size, per rail count: receiver (server) bars solid,
/// sender (client) bars pale, for tcp, trunking and rma, each labelled with its value.
fn cpu_panel(o: &mut String, r: &Report, y0: f64) {
    let size = r.table_size;
    let n = r.max_rails();
    let modes = ["tcp", "trunking", "rma"];
    // Receiver first: that is where direct placement saves the reorder copy.
    let series: Vec<(&str, bool)> = [true, false]
        .iter()
        .flat_map(|&recv| modes.iter().map(move |&m| (m, recv)))
        .collect();
    let value = |k: usize, mode: &str, recv: bool| -> Option<f64> {
        let row = r.find(mode, k, size)?;
        if recv {
            row.server_cpu_s_per_gb
        } else {
            row.client_cpu_s_per_gb
        }
    };
    let vmax = (1..=n)
        .flat_map(|k| series.iter().filter_map(move |&(m, rc)| value(k, m, rc)))
        .fold(0.0, f64::max);
    // Headroom for the value labels above the bars.
    let ymax = nice_max(vmax * 1.15);
    let title = format!(
        "(c) CPU seconds per GB, {}-byte messages: receiver (server) and sender (client), lower is better",
        size_label(size)
    );
    let (x1, x2, yt, yb) = axes(o, y0, ymax, &title, "NICs (rails)", "CPU s per GB");
    if vmax <= 0.0 {
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">no CPU figures measured</text>"#,
            (x1 + x2) / 2.0,
            (yt + yb) / 2.0
        );
    }
    let ys = |v: f64| yb - (yb - yt) * v / ymax;
    if n > 0 {
        let group = (x2 - x1) / n as f64;
        let bw = group * 0.84 / series.len() as f64;
        for k in 1..=n {
            let gx = x1 + group * (k - 1) as f64 + group * 0.08;
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{k}</text>"#,
                gx + group * 0.42,
                yb + 16.0
            );
            for (i, &(mode, recv)) in series.iter().enumerate() {
                // A gap between the receiver's and the sender's three bars.
                let x = gx + bw * i as f64 + if recv { 0.0 } else { bw * 0.3 };
                let Some(v) = value(k, mode, recv) else {
                    na(o, x + bw * 0.4, yb - 4.0);
                    continue;
                };
                let side = if recv { "receiver" } else { "sender" };
                let opacity = if recv { 1.0 } else { 0.4 };
                let _ = writeln!(
                    o,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{}" fill-opacity="{opacity}"><title>{mode} {side}, {k} NIC(s): {v:.2} s/GB</title></rect>"#,
                    ys(v),
                    bw * 0.85,
                    yb - ys(v),
                    mode_color(mode)
                );
                let _ = writeln!(
                    o,
                    r#"<text x="{:.1}" y="{:.1}" font-size="9" text-anchor="middle">{v:.2}</text>"#,
                    x + bw * 0.42,
                    ys(v) - 3.0
                );
            }
        }
    }
    for (i, &(mode, recv)) in series.iter().enumerate() {
        let y = yt + 18.0 * i as f64;
        let side = if recv { "receiver" } else { "sender" };
        let opacity = if recv { 1.0 } else { 0.4 };
        let _ = writeln!(
            o,
            r#"<rect x="{}" y="{:.1}" width="14" height="10" fill="{}" fill-opacity="{opacity}"/><text x="{}" y="{:.1}">{mode} {side}</text>"#,
            x2 + 10.0,
            y - 6.0,
            mode_color(mode),
            x2 + 30.0,
            y + 4.0
        );
    }
}

/// (d) trunking and rma goodput on unshaped rails (the CPUs are the limit), with each mode's
/// receiver CPU per GB under its bar and the rma / trunking ratio.
fn unshaped_panel(o: &mut String, r: &Report, y0: f64) {
    let rows = &r.unshaped_rows;
    let Some(first) = rows.first() else {
        return;
    };
    let vmax = rows
        .iter()
        .filter_map(|x| x.goodput_mb_s)
        .fold(0.0, f64::max);
    let ymax = nice_max(vmax * 1.1);
    let title = format!(
        "(d) unshaped rails (no tbf, CPU-bound), {} NIC{}, {}-byte messages",
        first.rails,
        if first.rails > 1 { "s" } else { "" },
        size_label(first.size)
    );
    let (x1, x2, yt, yb) = axes(o, y0, ymax, &title, "mode", "goodput MB/s");
    let ys = |v: f64| yb - (yb - yt) * v / ymax;
    let slot = (x2 - x1) / rows.len() as f64;
    let bw = (slot * 0.5).min(160.0);
    for (i, row) in rows.iter().enumerate() {
        let cx = x1 + slot * (i as f64 + 0.5);
        let cpu = row
            .server_cpu_s_per_gb
            .map_or("receiver CPU n/a".into(), |c| {
                format!("receiver CPU {c:.2} s/GB")
            });
        let _ = writeln!(
            o,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle">{} ({})</text>"#,
            yb + 16.0,
            esc(&row.mode),
            cpu
        );
        let Some(v) = row.goodput_mb_s else {
            na(o, cx, yb - 4.0);
            continue;
        };
        let _ = writeln!(
            o,
            r#"<rect x="{:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="{}"><title>{} unshaped: {v:.1} MB/s</title></rect>"#,
            cx - bw / 2.0,
            ys(v),
            yb - ys(v),
            mode_color(&row.mode),
            esc(&row.mode)
        );
        let _ = writeln!(
            o,
            r#"<text x="{cx:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{v:.1} MB/s</text>"#,
            ys(v) - 5.0
        );
    }
    let g = |m: &str| rows.iter().find(|x| x.mode == m)?.goodput_mb_s;
    if let (Some(t), Some(d)) = (g("trunking"), g("rma"))
        && t > 0.0
    {
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{:.1}">rma / trunking:</text><text x="{}" y="{:.1}" font-size="16" font-weight="bold">{:.2}x</text>"#,
            x2 + 10.0,
            yt + 4.0,
            x2 + 10.0,
            yt + 24.0,
            d / t
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Row;

    fn mk(mode: &str, rails: usize, size: usize, g: Option<f64>) -> Row {
        Row {
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
        }
    }

    fn with_cpu(mut r: Row, client: f64, server: f64) -> Row {
        r.client_cpu_s_per_gb = Some(client);
        r.server_cpu_s_per_gb = Some(server);
        r
    }

    fn report(rows: Vec<Row>, unshaped_rows: Vec<Row>) -> Report {
        Report {
            testbed: "netns".into(),
            efficiency_basis: "x".into(),
            rail_rates_bit_s: vec![],
            table_size: 4 << 20,
            rows,
            unshaped_rows,
        }
    }

    /// One root element, every tag closed in order, attribute quotes balanced.
    fn assert_wellformed(s: &str) {
        assert!(
            s.starts_with("<svg") && s.trim_end().ends_with("</svg>"),
            "{s}"
        );
        assert_eq!(s.matches("<svg").count(), 1);
        let mut open: Vec<&str> = Vec::new();
        let mut rest = s;
        while let Some(a) = rest.find('<') {
            let b = a + rest[a..].find('>').expect("unclosed tag");
            let tag = &rest[a + 1..b];
            assert_eq!(tag.matches('"').count() % 2, 0, "quotes in <{tag}>");
            assert!(!tag.contains('<'), "nested < in <{tag}>");
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(open.pop(), Some(name), "closing </{name}>");
            } else if !tag.ends_with('/') {
                open.push(tag.split_whitespace().next().expect("tag name"));
            }
            // Text between tags must not hold a bare '&' (escaped as &amp;).
            let text_end = rest[b..].find('<').map_or(rest.len(), |t| b + t);
            let text = &rest[b + 1..text_end];
            assert!(
                !text
                    .replace("&amp;", "")
                    .replace("&lt;", "")
                    .replace("&gt;", "")
                    .contains('&')
            );
            rest = &rest[b + 1..];
        }
        assert!(open.is_empty(), "unclosed {open:?}");
    }

    #[test]
    fn renders_wellformed_svg() {
        let r = report(
            vec![
                mk("tcp", 1, 4 << 20, Some(119.0)),
                mk("trunking", 1, 65536, Some(100.0)),
                mk("trunking", 1, 4 << 20, Some(110.0)),
                mk("rma", 1, 4 << 20, None),
            ],
            vec![],
        );
        let s = render(&r);
        assert_wellformed(&s);
        assert!(s.contains("polyline"));
        assert!(s.contains("n/a"));
        // No CPU figures: the panel is drawn, says so and shows no CPU bar; no unshaped panel.
        assert!(s.contains("(c) CPU seconds per GB"));
        assert!(s.contains("no CPU figures measured"));
        assert!(!s.contains("s/GB</title>"));
        assert!(!s.contains("(d) unshaped"));
        assert!(s.contains(r#"height="1140""#), "three panels");
        assert_eq!(size_label(65536), "64K");
        assert_eq!(nice_max(478.0), 500.0);
    }

    #[test]
    fn renders_cpu_panel_and_unshaped_panel() {
        let size = 4 << 20;
        let r = report(
            vec![
                with_cpu(mk("tcp", 1, size, Some(119.0)), 0.21, 0.25),
                with_cpu(mk("trunking", 1, size, Some(117.0)), 0.30, 0.34),
                with_cpu(mk("rma", 1, size, Some(117.5)), 0.26, 0.28),
                // A row without CPU figures at 2 rails: its bars say n/a.
                mk("trunking", 2, size, Some(230.0)),
                with_cpu(mk("rma", 2, size, Some(231.0)), 0.27, 0.29),
            ],
            vec![
                with_cpu(mk("trunking", 2, size, Some(800.0)), 0.5, 0.6),
                mk("rma", 2, size, Some(1000.0)),
            ],
        );
        let s = render(&r);
        assert_wellformed(&s);
        assert!(s.contains(r#"height="1520""#), "four panels");
        assert!(!s.contains("no CPU figures measured"));
        assert!(s.contains("rma receiver, 1 NIC(s): 0.28 s/GB"), "{s}");
        assert!(s.contains("trunking receiver, 1 NIC(s): 0.34 s/GB"));
        assert!(s.contains("tcp sender, 1 NIC(s): 0.21 s/GB"));
        assert!(s.contains(">0.28</text>") && s.contains(">0.34</text>"));
        assert!(!s.contains("trunking receiver, 2 NIC(s)"));
        assert!(s.contains("n/a"));
        for legend in ["rma receiver</text>", "trunking sender</text>"] {
            assert!(s.contains(legend), "legend {legend}");
        }
        assert!(s.contains("(d) unshaped rails"));
        assert!(s.contains("1000.0 MB/s") && s.contains("800.0 MB/s"));
        assert!(s.contains("receiver CPU 0.60 s/GB") && s.contains("receiver CPU n/a"));
        assert!(s.contains(">1.25x</text>"), "rma / trunking ratio");
        assert!(s.contains("CPU s per GB"), "y axis label");
        assert!(s.contains(">0.08</text>"), "decimal ticks of the CPU axis");
    }
}
