//! How the `braid` command reports: errors say each cause once, log lines carry no colour
//! codes into a pipe, and a mount ended from outside says so in one line and exits 0.
//!
//! Every child is bounded: it is killed (by pid, it is ours) after its limit.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_braid");

/// Runs `braid ARGS`, killed after 30 s; its exit code and stderr.
fn braid_err(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(EXE)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status, err)
}

fn wait_bounded(child: &mut Child, limit: Duration) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("braid did not finish within {limit:?}; killed");
        }
        // Polling the child's exit, bounded above.
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The causes of a `braid: error: A: B: C` line that appear more than once.
fn repeated_causes(line: &str) -> Vec<String> {
    let segs: Vec<&str> = line.split(": ").map(str::trim).collect();
    let mut seen = std::collections::HashSet::new();
    segs.iter()
        .filter(|s| s.len() > 6 && !seen.insert(**s))
        .map(|s| s.to_string())
        .collect()
}

#[test]
fn the_repeat_check_sees_the_old_duplication() {
    let old = "braid: error: cannot connect to 127.0.0.1:1: Connection refused (os error 111): \
               rail 0: cannot connect to 127.0.0.1:1: Connection refused (os error 111)";
    assert_eq!(repeated_causes(old).len(), 2);
}

#[test]
fn errors_say_each_cause_once() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refused.local_addr().unwrap().port();
    drop(refused);
    let rails = format!("127.0.0.1=127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let missing = missing.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "bench", "write", "--rails", &rails, "-s", "4K", "--iters", "1",
        ],
        vec!["fs", "mount", "--rails", &rails, missing],
        vec![
            "fs",
            "serve",
            "--export",
            missing,
            "--listen",
            "127.0.0.1:0",
        ],
        vec!["testbed", "status", "--name", "no-such-testbed-cli"],
    ];
    for args in cases {
        let (code, err) = braid_err(&args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("braid: error: "))
            .unwrap_or_else(|| panic!("{args:?}: no error line in {err}"));
        assert_eq!(err.matches("braid: error: ").count(), 1, "{err}");
        assert!(repeated_causes(line).is_empty(), "{args:?}: {line}");
        assert!(line.matches("(os error").count() <= 1, "{args:?}: {line}");
    }
}

#[test]
fn usage_errors_exit_2() {
    let (code, err) = braid_err(&["bench", "write", "-n", "5"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = braid_err(&["run", "--rails", "10.0.0.1", "--", "true"]);
    assert_eq!(code, Some(2), "{err}");
}

/// `braid fs serve` on port 0 of loopback; returns the child and its port.
fn serve(export: &std::path::Path) -> (Child, u16) {
    let mut child = Command::new(EXE)
        .args(["fs", "serve", "--listen", "127.0.0.1:0", "--export"])
        .arg(export)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .rsplit_once("127.0.0.1:")
        .and_then(|(_, p)| p.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    (child, port)
}

#[test]
fn an_unmount_from_outside_is_one_line_without_colour() {
    if !std::path::Path::new("/dev/fuse").exists() || !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: needs root and /dev/fuse");
        return;
    }
    let export = tempfile::tempdir().unwrap();
    let mnt = tempfile::tempdir().unwrap();
    let (mut server, port) = serve(export.path());
    // RUST_LOG=debug: braid-fs's debug lines show, in a pipe, without escape codes.
    let mut mount = Command::new(EXE)
        .args([
            "fs",
            "mount",
            "--rails",
            &format!("127.0.0.1=127.0.0.1:{port}"),
        ])
        .arg(mnt.path())
        .env("RUST_LOG", "braid_fs=debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(mount.stderr.take().unwrap());
    // Up to the mount's own line (debug lines may come first; EOF ends the loop).
    let mut before = String::new();
    while !before.contains("braid fs: mounted") {
        assert!(err.read_line(&mut before).unwrap() > 0, "{before}");
    }
    let status = Command::new("umount").arg(mnt.path()).status().unwrap();
    assert!(status.success());
    let code = wait_bounded(&mut mount, Duration::from_secs(30));
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    let rest = before
        .lines()
        .filter(|l| !l.contains("braid fs: mounted"))
        .fold(rest, |r, l| format!("{l}\n{r}"));
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(code, Some(0), "{rest}");
    assert!(!rest.contains('\x1b'), "colour codes in a pipe: {rest:?}");
    assert!(!rest.contains("WARN"), "{rest}");
    let said: Vec<&str> = rest
        .lines()
        .filter(|l| l.starts_with("braid fs:"))
        .collect();
    assert_eq!(said.len(), 1, "{rest}");
    assert!(said[0].ends_with("was unmounted; exiting"), "{rest}");
    assert!(
        rest.contains("DEBUG"),
        "no debug line to check for colour: {rest}"
    );
}

/// The demo, in a pipe, says what it measured as it goes (a line per cell).
#[test]
fn the_demo_reports_progress_in_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("d.svg");
    let mut child = Command::new(EXE)
        .args([
            "demo",
            "--loopback",
            "--rail-count",
            "1",
            "-D",
            "0.2",
            "--sizes",
            "64K",
            "--chart",
        ])
        .arg(&chart)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let code = wait_bounded(&mut child, Duration::from_secs(90));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(code, Some(0), "{err}");
    for (i, cell) in ["tcp 1", "trunking 1", "trunking 1", "rma 1", "rma 1"]
        .iter()
        .enumerate()
    {
        let prefix = format!("braid demo: {}/5 {cell} rail(s) ", i + 1);
        assert!(
            err.lines().any(|l| l.starts_with(&prefix)),
            "{prefix}: {err}"
        );
    }
    assert!(!err.contains('\x1b'), "{err:?}");
}
