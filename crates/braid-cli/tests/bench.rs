//! `braid bench` end to end: the built binary as server and client on loopback
//! (127.0.0.1 .. 127.0.0.4), every child bounded in time and killed by pid on overrun.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_braid");
const LIMIT: Duration = Duration::from_secs(60);

/// Ports unique to this test process (tests run in parallel threads), all below the
/// kernel's ephemeral range (32768 and up by default): a port of that range may be the local
/// port of any connection on the machine when the server binds, and the server then fails
/// with `EADDRINUSE` (`SO_REUSEADDR` does not help against a connected socket without it).
fn port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 750) as u16 * 16;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 16
}

/// Waits for `child`, killing it (by pid, it is ours) after `limit`.
fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            return st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

struct Run {
    client_out: String,
    client_err: String,
    server_out: String,
    json: Option<serde_json::Value>,
}

/// Runs a server on `rails` loopback addresses and the client `args` against it.
fn bench(rails: usize, args: &[&str]) -> Run {
    let p = port();
    let listen: Vec<String> = (1..=rails).map(|i| format!("127.0.0.{i}:{p}")).collect();
    let rail_args: Vec<String> = (1..=rails)
        .map(|i| format!("127.0.0.{i}=127.0.0.{i}:{p}"))
        .collect();
    let mut server = Command::new(EXE)
        .args(["bench", "server", "--accept-timeout", "30", "--listen"])
        .arg(listen.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let mut serr = server.stderr.take().expect("stderr");
    let serr_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = serr.read_to_string(&mut s);
        s
    });
    let json_path: PathBuf =
        std::env::temp_dir().join(format!("braid-bench-test-{}-{p}.json", std::process::id()));
    let _ = std::fs::remove_file(&json_path);
    // The client retries refused connections while the server starts.
    let mut client = Command::new(EXE)
        .arg("bench")
        .args(args)
        .arg("--rails")
        .arg(rail_args.join(","))
        .arg("--json")
        .arg(&json_path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client");
    let mut cout = client.stdout.take().expect("stdout");
    let mut cerr = client.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = cout.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = cerr.read_to_string(&mut s);
        s
    });
    let cst = wait_bounded(&mut client, LIMIT, "client");
    let sst = wait_bounded(&mut server, Duration::from_secs(15), "server");
    let mut server_out = String::new();
    if let Some(mut o) = server.stdout.take() {
        let _ = o.read_to_string(&mut server_out);
    }
    // Its errors too (a port it could not bind, say).
    server_out.push_str(&serr_t.join().unwrap());
    let client_out = out_t.join().unwrap();
    let client_err = err_t.join().unwrap();
    assert!(
        cst.success(),
        "client {args:?} failed ({cst}):\n{client_out}\n{client_err}\nserver:\n{server_out}"
    );
    assert!(sst.success(), "server failed ({sst}):\n{server_out}");
    let json = std::fs::read_to_string(&json_path)
        .ok()
        .map(|t| serde_json::from_str(&t).expect("client JSON parses"));
    let _ = std::fs::remove_file(&json_path);
    Run {
        client_out,
        client_err,
        server_out,
        json,
    }
}

fn results(run: &Run) -> Vec<serde_json::Value> {
    run.json
        .as_ref()
        .expect("JSON written")
        .get("results")
        .and_then(|r| r.as_array())
        .expect("results array")
        .clone()
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k)
        .and_then(|x| x.as_f64())
        .unwrap_or_else(|| panic!("field {k} missing or not a number in {v}"))
}

/// The fields the demo parses, and sane values.
fn check_bw_row(r: &serde_json::Value, size: u64) {
    assert_eq!(r["size"].as_u64(), Some(size), "{r}");
    assert!(r["iterations"].as_u64().unwrap() > 0, "{r}");
    assert!(f(r, "bw_mb_s") > 0.0, "{r}");
    assert!(f(r, "msg_rate") > 0.0, "{r}");
    assert!(f(r, "client_cpu_s_per_gb") >= 0.0, "{r}");
    assert!(f(r, "server_cpu_s_per_gb") >= 0.0, "{r}");
}

#[test]
fn write_verify_one_rail() {
    let run = bench(1, &["write", "-s", "64K", "--iters", "200", "--verify"]);
    let rs = results(&run);
    assert_eq!(rs.len(), 1);
    check_bw_row(&rs[0], 65536);
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
    assert_eq!(rs[0]["iterations"].as_u64(), Some(200));
    assert!(run.client_out.contains("BW average"), "{}", run.client_out);
    assert!(run.server_out.contains("verified"), "{}", run.server_out);
}

#[test]
fn write_verify_four_rails_odd_size() {
    let run = bench(
        4,
        &[
            "write", "-s", "1000003", "--iters", "40", "-q", "4", "--verify",
        ],
    );
    let rs = results(&run);
    check_bw_row(&rs[0], 1_000_003);
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
    assert_eq!(rs[0]["rails"].as_u64(), Some(4));
    assert_eq!(
        rs[0]["slots"].as_u64(),
        Some(4),
        "one slot per operation in flight"
    );
    let per_rail = rs[0]["rail_bytes"].as_array().unwrap();
    assert_eq!(per_rail.len(), 4);
    let total: u64 = per_rail.iter().map(|b| b.as_u64().unwrap()).sum();
    assert!(total >= 40 * 1_000_003, "rail bytes {per_rail:?}");
}

/// `--slots 1`: every write from and to one buffer (as ib_write_bw), still verified (the
/// client then waits for each write before it rewrites the slot).
#[test]
fn write_one_slot_verified() {
    let run = bench(
        2,
        &[
            "write", "-s", "256K", "--iters", "100", "--slots", "1", "--verify",
        ],
    );
    let rs = results(&run);
    check_bw_row(&rs[0], 262_144);
    assert_eq!(rs[0]["slots"].as_u64(), Some(1), "{}", rs[0]);
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
}

#[test]
fn read_verify() {
    let run = bench(2, &["read", "-s", "256K", "--iters", "100", "--verify"]);
    let rs = results(&run);
    check_bw_row(&rs[0], 262_144);
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
}

#[test]
fn send_verify() {
    let run = bench(2, &["send", "-s", "10000", "--iters", "300", "--verify"]);
    let rs = results(&run);
    check_bw_row(&rs[0], 10_000);
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
}

#[test]
fn fetch_add_counts_exactly() {
    let run = bench(1, &["fetch-add", "--iters", "500", "-q", "8"]);
    let rs = results(&run);
    assert_eq!(rs[0]["iterations"].as_u64(), Some(500));
    assert!(f(&rs[0], "msg_rate") > 0.0);
    // The counter check (server) and in-order values (client) always run for fetch-add.
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
}

#[test]
fn write_lat_with_baseline() {
    let run = bench(
        1,
        &[
            "write-lat",
            "-s",
            "8",
            "--iters",
            "200",
            "--verify",
            "--baseline",
        ],
    );
    let rs = results(&run);
    let r = &rs[0];
    assert_eq!(r["size"].as_u64(), Some(8));
    assert_eq!(r["verified"].as_bool(), Some(true), "{r}");
    let (min, med, p99) = (
        f(r, "lat_us_min"),
        f(r, "lat_us_median"),
        f(r, "lat_us_p99"),
    );
    assert!(0.0 < min && min <= med && med <= p99, "{r}");
    assert_eq!(r["lat_poll"]["samples"].as_u64(), Some(200), "{r}");
    assert!(r["lat_wait"]["median"].as_f64().unwrap() > 0.0, "{r}");
    // Each braid mode beside a TCP ping-pong of the same mode.
    assert_eq!(r["tcp_lat_poll"]["samples"].as_u64(), Some(200), "{r}");
    assert_eq!(r["tcp_lat"]["samples"].as_u64(), Some(200), "{r}");
    let ratio = f(r, "ratio");
    let expect = med / r["tcp_lat_poll"]["median"].as_f64().unwrap();
    assert!((ratio - expect).abs() < 1e-9 * expect, "{r}");
    let expect_wait =
        r["lat_wait"]["median"].as_f64().unwrap() / r["tcp_lat"]["median"].as_f64().unwrap();
    assert!(
        (f(r, "ratio_wait") - expect_wait).abs() < 1e-9 * expect_wait,
        "{r}"
    );
    assert!(run.client_out.contains("t_typical"), "{}", run.client_out);
    assert!(run.client_out.contains("tcp-p") && run.client_out.contains("tcp-w"));
}

/// ib_read_lat's and ib_atomic_lat's figures: whole operations, not halved, beside a TCP
/// ping-pong's full round trip.
#[test]
fn read_lat_verify_with_baseline() {
    let run = bench(
        2,
        &[
            "read-lat",
            "-s",
            "300",
            "--iters",
            "150",
            "--verify",
            "--baseline",
        ],
    );
    let r = &results(&run)[0];
    assert_eq!(r["op"].as_str(), Some("read-lat"), "{r}");
    assert_eq!(r["verified"].as_bool(), Some(true), "{r}");
    assert_eq!(r["lat_poll"]["samples"].as_u64(), Some(150), "{r}");
    assert!(r["lat_wait"]["median"].as_f64().unwrap() > 0.0, "{r}");
    let med = f(r, "lat_us_median");
    assert_eq!(f(r, "rtt_us_median"), med, "{r}");
    let tcp = r["tcp_lat_poll"]["median"].as_f64().unwrap();
    assert!((f(r, "ratio") - med / tcp).abs() < 1e-9 * med / tcp, "{r}");
    assert!(
        r["lat_definition"].as_str().unwrap().contains("not halved"),
        "{r}"
    );
    assert!(
        run.client_out.contains("RDMA_Read Latency"),
        "{}",
        run.client_out
    );
}

#[test]
fn atomic_lat_returns_every_value_in_order() {
    let run = bench(1, &["atomic-lat", "--iters", "200", "--poll-only"]);
    let r = &results(&run)[0];
    assert_eq!(r["op"].as_str(), Some("atomic-lat"), "{r}");
    assert_eq!(r["size"].as_u64(), Some(8), "{r}");
    // The client checks each returned value, the server the final counter.
    assert_eq!(r["verified"].as_bool(), Some(true), "{r}");
    assert!(
        r["verify_detail"].as_str().unwrap().contains("counter"),
        "{r}"
    );
    assert!(f(r, "lat_us_median") > 0.0, "{r}");
}

#[test]
fn send_lat_verify() {
    let run = bench(
        2,
        &[
            "send-lat",
            "-s",
            "5000",
            "--iters",
            "100",
            "--verify",
            "--poll-only",
        ],
    );
    let rs = results(&run);
    assert_eq!(rs[0]["verified"].as_bool(), Some(true), "{}", rs[0]);
    assert!(rs[0].get("lat_wait").is_none());
    assert!(f(&rs[0], "lat_us_median") > 0.0);
}

#[test]
fn all_sizes_send_then_write_baseline() {
    // -a runs 23 sizes over one endpoint: exercises the per-test setup, leftover receives
    // and pads between tests.
    let run = bench(2, &["send", "-a", "--iters", "4", "-q", "2", "--verify"]);
    let rs = results(&run);
    let sizes: Vec<u64> = rs.iter().map(|r| r["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, (1..=23).map(|k| 1u64 << k).collect::<Vec<_>>());
    for r in &rs {
        check_bw_row(r, r["size"].as_u64().unwrap());
        assert_eq!(r["verified"].as_bool(), Some(true), "{r}");
    }
    let run = bench(1, &["write", "-s", "1M", "--iters", "20", "--baseline"]);
    let r = &results(&run)[0];
    assert!(f(r, "tcp_bw_mb_s") > 0.0, "{r}");
    assert!(f(r, "ratio") > 0.0, "{r}");
}

#[test]
fn demo_argv_and_json_contract() {
    // Exactly what demo.rs runs: `-s SIZE -D SECS --json FILE`.
    let run = bench(2, &["write", "-s", "4194304", "-D", "0.5"]);
    let rs = results(&run);
    check_bw_row(&rs[0], 4_194_304);
    let m = braid_bench::demo::parse_measurement(
        &serde_json::to_string(run.json.as_ref().unwrap()).unwrap(),
        4_194_304,
    )
    .expect("the demo parses the bench JSON");
    assert!(m.bw_mb_s > 0.0);
    assert!(m.client_cpu_s_per_gb.is_some() && m.server_cpu_s_per_gb.is_some());
    assert!(!run.client_err.contains("error"), "{}", run.client_err);
}

#[test]
fn server_without_client_times_out() {
    let p = port();
    let mut server = Command::new(EXE)
        .args(["bench", "server", "--accept-timeout", "1", "--listen"])
        .arg(format!("127.0.0.1:{p}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn server");
    let st = wait_bounded(&mut server, Duration::from_secs(20), "server");
    assert!(!st.success());
    let mut err = String::new();
    server
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("no client"), "{err}");
}

#[test]
fn client_errors_when_server_vanishes() {
    let p = port();
    let mut server = Command::new(EXE)
        .args(["bench", "server", "--accept-timeout", "30", "--listen"])
        .arg(format!("127.0.0.1:{p}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn server");
    let mut client = Command::new(EXE)
        .args([
            "bench",
            "write",
            "-s",
            "64K",
            "-D",
            "30",
            "--peer-timeout",
            "5",
            "--rails",
        ])
        .arg(format!("127.0.0.1=127.0.0.1:{p}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client");
    std::thread::sleep(Duration::from_millis(1500));
    // Our own server child, by pid.
    let _ = server.kill();
    let _ = server.wait();
    let st = wait_bounded(&mut client, Duration::from_secs(30), "client");
    assert!(
        !st.success(),
        "the client must fail when the server is gone"
    );
    let mut err = String::new();
    client
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("error"), "{err}");
}
