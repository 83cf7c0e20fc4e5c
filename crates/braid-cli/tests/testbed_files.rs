//! A file read striped over every rail of the emulated cluster: `braid bench server --file`
//! in host 1 serves RMA reads from the pages of a file (a registered file region) and
//! `braid bench read --verify` in host 0 reads it over four tbf-shaped 1 Gbit/s rails.
//! Checks that every byte read matches what the server wrote into the file and that every
//! rail carried part of it. Skips, saying why, where network namespaces cannot be made.
//!
//! Bounded: each child is killed (by pid, it is ours) after [`LIMIT`]; the testbed guard removes
//! the namespaces on every exit path, panics included.

use std::path::PathBuf;
use std::process::{Child, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use braid_testbed::parse::Rate;
use braid_testbed::testbed::{self, Testbed, TestbedSpec};

const EXE: &str = env!("CARGO_BIN_EXE_braid");
const LIMIT: Duration = Duration::from_secs(60);
const RAILS: usize = 4;
const SIZE: u64 = 4 << 20;
const ITERS: u64 = 48;
const PORT: u16 = 18710;
/// The file: 16 slots of SIZE, so the reads go through it three times.
const FILE_LEN: u64 = 16 * SIZE;

/// A child process that is killed and reaped when dropped (on a failed assertion too).
struct Reaped(Option<Child>);

impl Reaped {
    fn wait(&mut self, limit: Duration, what: &str) -> ExitStatus {
        let child = self.0.as_mut().expect("child");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = child.try_wait().expect("try_wait") {
                self.0 = None;
                return st;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.0 = None;
                panic!("{what} did not finish within {limit:?}; killed");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn our_namespaces(name: &str) -> Vec<String> {
    testbed::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{name}-h")))
        .collect()
}

/// Removes the file on every exit path.
struct TempPath(PathBuf);

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn file_read_striped_over_four_rails_between_namespaces() {
    if let Err(e) = testbed::probe() {
        eprintln!("SKIPPED: network namespaces unavailable here: {e:#}");
        return;
    }
    let name = format!("braid-tbf-{}", std::process::id());
    let file = TempPath(std::env::temp_dir().join(format!("{name}.dat")));
    std::fs::File::create(&file.0)
        .and_then(|f| f.set_len(FILE_LEN))
        .expect("the served file");
    let spec = TestbedSpec::new(&name, RAILS, Rate::from_bits(1_000_000_000));
    let tb = Testbed::up(&spec).expect("testbed up");
    assert!(tb.owned(), "a fresh testbed");
    let addrs = tb.rail_addrs(0, 1);
    let listen: Vec<String> = addrs.iter().map(|(_, b)| format!("{b}:{PORT}")).collect();
    let rails: Vec<String> = addrs
        .iter()
        .map(|(a, b)| format!("{a}={b}:{PORT}"))
        .collect();
    let json = TempPath(std::env::temp_dir().join(format!("{name}.json")));

    let mut server = Reaped(Some(
        tb.command(1, EXE)
            .args(["bench", "server", "--accept-timeout", "30", "--listen"])
            .arg(listen.join(","))
            .arg("--file")
            .arg(&file.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the server"),
    ));
    // The client retries refused connections for 5 s while the server starts.
    let out = {
        let mut client = Reaped(Some(
            tb.command(0, EXE)
                .args(["bench", "read", "--verify", "-s"])
                .arg(SIZE.to_string())
                .arg("--iters")
                .arg(ITERS.to_string())
                .arg("--rails")
                .arg(rails.join(","))
                .arg("--json")
                .arg(&json.0)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the client"),
        ));
        client.wait(LIMIT, "bench read")
    };
    let sst = server.wait(Duration::from_secs(20), "bench server");
    assert!(out.success(), "bench read failed: {out}");
    assert!(sst.success(), "bench server failed: {sst}");

    let text = std::fs::read_to_string(&json.0).expect("client JSON");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let r = &v["results"][0];
    assert_eq!(r["verified"], serde_json::Value::Bool(true), "{text}");
    assert_eq!(r["iterations"].as_u64(), Some(ITERS), "{text}");
    assert!(r["server_file"].is_string(), "served from the file: {text}");
    let per_rail: Vec<u64> = r["rail_bytes"]
        .as_array()
        .expect("rail_bytes")
        .iter()
        .map(|b| b.as_u64().expect("byte count"))
        .collect();
    assert_eq!(per_rail.len(), RAILS, "{text}");
    assert!(
        per_rail.iter().all(|&b| b > 0),
        "every rail must carry part of the file: {per_rail:?}"
    );
    assert!(
        per_rail.iter().sum::<u64>() >= ITERS * SIZE,
        "rails carried less than the payload: {per_rail:?}"
    );
    eprintln!(
        "4-rail verified file read: {} MB/s, rails {per_rail:?}",
        r["bw_mb_s"]
    );

    let removed = tb.down().expect("testbed down");
    assert_eq!(removed.len(), 2, "{removed:?}");
    assert!(our_namespaces(&name).is_empty(), "namespaces left behind");
}
