//! The file service's harnesses on a real testbed: a short `braid fs bench` against sshfs
//! (its sshd, keys, mount and cleanup), and the external POSIX suite (pjdfstest) on the braid
//! mount beside a bindfs passthrough.
//!
//! They need root, network namespaces, FUSE, and the tools (`sshfs`, `sshd`, `bindfs`,
//! `pjdfstest`); without them they skip and say why, except when
//! `BRAID_REQUIRE_POSIX_SUITE=1` (CI) makes a missing tool a failure.

use std::path::{Path, PathBuf};
use std::process::Command;

use braid_bench::fsbench::{posix, sshfs};
use braid_testbed::testbed;

fn required() -> bool {
    std::env::var("BRAID_REQUIRE_POSIX_SUITE").is_ok_and(|v| v == "1")
}

/// Why this machine cannot run the harnesses, if it cannot.
fn skip_reason(need_pjdfstest: bool) -> Option<String> {
    let mut why = Vec::new();
    if let Err(e) = testbed::probe() {
        why.push(format!("{e:#}"));
    }
    if let Some(w) = sshfs::unavailable() {
        why.push(w);
    }
    if need_pjdfstest {
        if !Path::new("/usr/bin/bindfs").exists() {
            why.push("no bindfs (apt-get install bindfs)".into());
        }
        if posix::find_pjdfstest().is_none() {
            why.push(format!(
                "no pjdfstest (cargo install pjdfstest --version {} --locked)",
                posix::PJDFSTEST_VERSION
            ));
        }
    }
    if why.is_empty() {
        return None;
    }
    let msg = why.join("; ");
    if required() {
        panic!("BRAID_REQUIRE_POSIX_SUITE=1 but: {msg}");
    }
    eprintln!("SKIPPED: {msg}");
    Some(msg)
}

/// Mounts below `/var/tmp/PREFIX-PID-*` and namespaces `NSPREFIX<PID>*` a run of the CLI
/// (process `pid`) left behind.
fn leftovers(pid: u32, prefix: &str, ns_prefix: &str) -> Vec<String> {
    let tag = format!("/{prefix}-{pid}-");
    let ns = format!("{ns_prefix}{pid}");
    let mut v: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|m| m.contains(&tag))
        .collect();
    v.extend(
        testbed::list_netns()
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with(&ns)),
    );
    v
}

#[test]
fn fs_bench_against_sshfs_runs_and_cleans_up() {
    if skip_reason(false).is_some() {
        return;
    }
    let dir = PathBuf::from(format!(
        "/var/tmp/braid-fsbench-test-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_braid"))
        .args([
            "fs",
            "bench",
            // Large enough for the sshfs server's CPU to show in /proc's 10 ms ticks: at
            // 8 MiB (70 ms over the shaped rail) it came out as 0 now and then.
            "--size",
            "32M",
            "--nets",
            "shaped",
            "--rail-count",
            "1",
            "--rail-counts",
            "1",
            "--systems",
            "local,sshfs",
            "--rand-ops",
            "200",
            "--meta-files",
            "100",
            "--op-seconds",
            "5",
            "--json",
            "-",
            "--dir",
        ])
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let json_start = stdout.find("{\n").expect("JSON document");
    let v: serde_json::Value = serde_json::from_str(&stdout[json_start..]).unwrap();
    let rows = v["results"].as_array().unwrap();
    assert_eq!(rows.len(), 8, "2 systems x 4 workloads: {stdout}");
    for r in rows {
        assert!(r.get("error").is_none(), "{r}");
        assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
        assert!(!r["check"].as_str().unwrap().is_empty(), "{r}");
    }
    let ssh_read = rows
        .iter()
        .find(|r| r["system"] == "sshfs" && r["test"] == "seq-read")
        .unwrap();
    assert_eq!(ssh_read["bytes"], 32 << 20);
    assert_eq!(ssh_read["vs_sshfs"], 1.0);
    assert!(
        ssh_read["server_cpu_s"].as_f64().unwrap() > 0.0,
        "{ssh_read}"
    );
    // Before the read the client held none of the file.
    assert_eq!(ssh_read["resident_before"], 0.0, "{ssh_read}");
    assert!(v["goals"].as_array().unwrap().len() >= 5);
    // Everything it made is gone: mounts, namespaces, its temp dir, and its processes.
    let left = leftovers(pid, "braid-fsbench", "fsb");
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir(&dir).unwrap();
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains(&dir.display().to_string()),
        "processes of the run are left"
    );
}

#[test]
fn posix_suite_on_the_braid_mount() {
    if skip_reason(true).is_some() {
        return;
    }
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/FS.md");
    let child = Command::new(env!("CARGO_BIN_EXE_braid"))
        .args(["fs", "posix-suite", "--system", "braid", "--known"])
        .arg(&docs)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "failures on the braid mount that the bindfs passthrough does not show and {} does not list:\n{stdout}\n{stderr}",
        docs.display()
    );
    assert!(stdout.contains("verdict: ok"), "{stdout}");
    let left = leftovers(pid, "braid-posix", "fsp");
    assert!(left.is_empty(), "{left:?}");
}
