//! `braid info`: its JSON parses and tells the truth about this host (the loopback interface,
//! TCP usable), lists every `BRAID_*` variable the sources read, masks the secret, reports a
//! refused value as refused, and inside a testbed host lists that host's rails.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use braid_testbed::testbed::{self, Testbed, TestbedSpec};
use serde_json::Value;

/// `program` without the caller's launcher and braid variables: the tests set what they check.
fn clean(program: &str) -> Command {
    let mut c = Command::new(program);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let launcher = ["BRAID_", "EXS_BRAID_", "OMPI_", "SLURM_", "PMI"];
        if launcher.iter().any(|p| k.starts_with(p)) {
            c.env_remove(k);
        }
    }
    c
}

fn braid() -> Command {
    clean(env!("CARGO_BIN_EXE_braid"))
}

fn info_json(cmd: &mut Command) -> Value {
    let out = cmd
        .args(["info", "--json"])
        .output()
        .expect("run braid info");
    assert!(
        out.status.success(),
        "braid info failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("braid info --json is JSON")
}

fn setting<'a>(info: &'a Value, name: &str) -> &'a Value {
    info["config"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in braid info's configuration"))
}

#[test]
fn json_has_loopback_tcp_versions_and_defaults() {
    let info = info_json(&mut braid());
    let ifs = info["interfaces"].as_array().unwrap();
    let lo = ifs
        .iter()
        .find(|i| i["loopback"] == true)
        .expect("a loopback interface");
    assert!(
        lo["addresses"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "127.0.0.1/8"),
        "{lo}"
    );
    assert!(lo["mtu"].as_u64().unwrap() > 0);
    let tcp = info["transports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "tcp")
        .expect("tcp transport");
    assert_eq!(tcp["usable"], true);
    for t in ["shm", "af_xdp"] {
        assert!(
            info["transports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == t)
        );
    }
    for f in ["io_uring", "userfaultfd", "fuse"] {
        let x = info["features"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == f)
            .unwrap();
        assert!(!x["detail"].as_str().unwrap().is_empty());
    }
    assert_eq!(info["versions"]["braid"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        info["versions"]["protocol"],
        braid_proto::wire::PROTOCOL_VERSION
    );
    // The loopback address is never a rail; unset variables show their defaults.
    assert!(!info["rails"]["addresses"].to_string().contains("127.0.0.1"));
    assert_eq!(info["rails"]["source"], "interfaces");
    let t = setting(&info, "BRAID_TRANSPORT");
    assert_eq!(
        (t["value"].clone(), t["effective"].clone()),
        (Value::Null, "auto".into())
    );
    assert_eq!(
        setting(&info, "BRAID_RANK")["effective"],
        "rank 0 of 1 (from singleton)"
    );
    // The text form says the same.
    let out = braid().arg("info").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success() && text.contains("127.0.0.1/8") && text.contains("BRAID_TRANSPORT")
    );
}

#[test]
fn settings_show_values_mask_the_secret_and_report_refusals() {
    let info = info_json(
        braid()
            .env("BRAID_SECRET", "do-not-print-me")
            .env("BRAID_TRANSPORT", "tcp")
            .env("BRAID_DSM_SLOTS", "0")
            .env("BRAID_RAILS", "127.0.0.1")
            .env("BRAID_RANK", "1")
            .env("BRAID_SIZE", "2")
            .env("BRAID_ROOT", "127.0.0.1:1"),
    );
    assert!(!info.to_string().contains("do-not-print-me"));
    assert_eq!(setting(&info, "BRAID_SECRET")["value"], "(set)");
    assert_eq!(setting(&info, "BRAID_TRANSPORT")["effective"], "tcp");
    let slots = setting(&info, "BRAID_DSM_SLOTS")["effective"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        slots.starts_with("refused:") && slots.contains("1 to 65536"),
        "{slots}"
    );
    assert_eq!(
        setting(&info, "BRAID_RANK")["effective"],
        "rank 1 of 2 (from braid)"
    );
    assert_eq!(info["rails"]["source"], "BRAID_RAILS");
    assert_eq!(info["rails"]["addresses"][0]["address"], "127.0.0.1/8");
    assert_eq!(info["rails"]["addresses"][0]["interface"], "lo");
    // A rail list braid-boot refuses is reported, not fatal.
    let info = info_json(braid().env("BRAID_RAILS", "not-an-ip"));
    let refused = info["rails"]["refused"].as_str().unwrap();
    assert!(refused.contains("not-an-ip"), "{refused}");
    assert_eq!(info["rails"]["addresses"], Value::Array(vec![]));
    let e = setting(&info, "BRAID_RAILS")["effective"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(e.starts_with("refused:"), "{e}");
}

/// Every `"BRAID_..."` / `"EXS_BRAID_..."` string literal in the library and command sources.
fn names_in_sources(dir: &Path, out: &mut BTreeSet<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if name != "tests" && name != "target" {
                names_in_sources(&p, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            // Up to the first unit-test module: its variables are the tests' own.
            let text = text.split("#[cfg(test)]").next().unwrap();
            for (i, _) in text
                .match_indices("\"BRAID_")
                .chain(text.match_indices("\"EXS_BRAID_"))
            {
                let rest = &text[i + 1..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
                    .unwrap_or(rest.len());
                if rest[end..].starts_with('"') {
                    out.insert(rest[..end].to_string());
                }
            }
        }
    }
}

#[test]
fn every_variable_the_sources_read_is_listed() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut names = BTreeSet::new();
    names_in_sources(crates, &mut names);
    assert!(
        names.contains("BRAID_TRANSPORT") && names.contains("BRAID_DSM_SPACE"),
        "{names:?}"
    );
    let info = info_json(&mut braid());
    let listed: BTreeSet<String> = info["config"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !listed.contains(*n) && !braid_cli::info::TEST_ONLY.contains(&n.as_str()))
        .collect();
    assert!(missing.is_empty(), "braid info does not list {missing:?}");
}

/// As an unprivileged user, what needs privileges is reported unusable, with the reason.
#[test]
fn unprivileged_user_is_told_why_af_xdp_is_unusable() {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let Some(setpriv) = setpriv.filter(|_| root) else {
        eprintln!("SKIPPED: needs root and setpriv(1) to drop to an unprivileged user");
        return;
    };
    let mut cmd = clean(setpriv);
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ]);
    cmd.arg(env!("CARGO_BIN_EXE_braid"));
    let out = cmd.args(["info", "--json"]).output().unwrap();
    if !out.status.success() {
        // The binary may sit where user 65534 cannot reach it (a private home directory).
        eprintln!(
            "SKIPPED: braid does not run as user 65534: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["host"]["root"], false);
    assert_eq!(info["host"]["capabilities"], Value::Array(vec![]));
    let xdp = info["transports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "af_xdp")
        .unwrap();
    assert_eq!(xdp["usable"], false, "{xdp}");
    assert!(
        xdp["detail"].as_str().unwrap().contains("not permitted"),
        "{xdp}"
    );
    assert_eq!(info["transports"][0]["usable"], true);
}

#[test]
fn lists_the_four_rails_of_a_testbed_host() {
    if let Err(e) = testbed::probe() {
        eprintln!("SKIPPED: network namespaces unavailable here: {e:#}");
        return;
    }
    let name = format!("bi{}", std::process::id() % 100_000);
    let tb = Testbed::up(&TestbedSpec::unshaped(&name, 4)).expect("testbed up");
    let expected: BTreeSet<String> = tb
        .rail_addrs(0, 1)
        .iter()
        .map(|(a, _)| a.to_string())
        .collect();
    // As a user would: `ip netns exec NAME-h0 braid info --json`, bounded.
    let mut ip = clean("timeout");
    ip.args(["60", "ip", "netns", "exec", &testbed::ns_name(&name, 0)]);
    ip.arg(env!("CARGO_BIN_EXE_braid"));
    let info = info_json(&mut ip);
    let rails: BTreeSet<String> = info["rails"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let a = r["address"].as_str().unwrap();
            a.split('/').next().unwrap().to_string()
        })
        .collect();
    assert_eq!(rails, expected, "{}", info["rails"]);
    assert_eq!(rails.len(), 4);
    // Each rail's interface is listed, up, a veth, with its MTU.
    for r in info["rails"]["addresses"].as_array().unwrap() {
        let ifname = r["interface"].as_str().expect("the rail's interface");
        let i = info["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == ifname)
            .unwrap();
        assert_eq!(i["up"], true, "{i}");
        assert_eq!(i["driver"], "veth", "{i}");
        assert!(i["mtu"].as_u64().unwrap() >= 1280, "{i}");
    }
    let tcp = &info["transports"][0];
    assert_eq!(
        (tcp["name"].clone(), tcp["usable"].clone()),
        ("tcp".into(), true.into())
    );
    drop(tb);
}
