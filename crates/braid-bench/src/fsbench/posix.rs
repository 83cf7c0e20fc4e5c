//! The external POSIX suite: `pjdfstest` (the Rust rewrite of pjd's file system test suite,
//! crates.io 0.2.x) run on a mount under test and, as the comparison, on a local directory
//! mirrored through a FUSE passthrough (`bindfs`, as root: `allow_other`,
//! `default_permissions`, new files owned by their creator). A failure on the mount under test
//! is *explained* when the passthrough fails the same test (an effect of FUSE itself, such as
//! the kernel's attribute cache) or when the docs list it with a reason; anything else is
//! *unexplained* and makes the run fail.
//!
//! Timing-sensitive tests on a loaded machine can fail once; a failure seen only on the mount
//! under test is rerun (by exact name, on both) up to [`RERUNS`] times. It stays unexplained
//! only if it fails on the mount under test every time and never on the passthrough; one that
//! passes on a rerun is reported as intermittent.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::mounts;
use super::procs;

/// Reruns of a failure seen only on the mount under test.
pub const RERUNS: usize = 2;

/// The pjdfstest version the CI installs (`cargo install pjdfstest --version ...`).
pub const PJDFSTEST_VERSION: &str = "0.2.2";

/// The suite's configuration: the Linux features both file systems offer, sleeps long enough
/// for ext4's coarse timestamps, and two unprivileged users every Debian system has.
pub const CONFIG: &str = r#"# braid fs posix-suite: pjdfstest configuration
[features]
posix_fallocate = {}
utimensat = {}
utime_now = {}
rename_ctime = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [
  ["nobody", "nogroup"],
  ["daemon", "daemon"],
]
"#;

/// One test's result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Outcome {
    /// Passed.
    Ok,
    /// Failed.
    Failed,
    /// Not run (missing feature, no remount, ...).
    Skipped,
}

/// One run of the suite.
#[derive(Debug, Clone, Default)]
pub struct SuiteRun {
    /// Every test the run reported, by name.
    pub results: BTreeMap<String, Outcome>,
    /// Failure messages by test name (the line after `FAILED`).
    pub messages: BTreeMap<String, String>,
    /// What pjdfstest printed.
    pub output: String,
    /// Whether it reached its summary (a run that dies half-way, e.g. when the mount goes
    /// away, reports only the tests before).
    pub complete: bool,
}

impl SuiteRun {
    /// Names of the failed tests.
    pub fn failed(&self) -> Vec<String> {
        self.with(Outcome::Failed)
    }

    /// Names with outcome `o`.
    pub fn with(&self, o: Outcome) -> Vec<String> {
        self.results
            .iter()
            .filter(|(_, v)| **v == o)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses pjdfstest's output: `NAME   ok|FAILED|skipped` lines, a failure's message on the
/// next (tab-indented) line.
pub fn parse_output(text: &str) -> SuiteRun {
    let text = strip_ansi(text);
    let mut run = SuiteRun {
        output: text.clone(),
        ..Default::default()
    };
    let mut last_failed: Option<String> = None;
    for line in text.lines() {
        if let Some(msg) = line.strip_prefix('\t') {
            if let Some(name) = last_failed.take() {
                run.messages.insert(name, msg.trim().to_string());
            }
            continue;
        }
        last_failed = None;
        let t = line.trim_end();
        let Some(name) = t.split_whitespace().next() else {
            continue;
        };
        if !name.contains("::") {
            continue;
        }
        let outcome = if t.ends_with(" ok") || t.ends_with("failed as expected") {
            Outcome::Ok
        } else if t.ends_with(" FAILED") || t.ends_with("PASSED UNEXPECTEDLY") {
            Outcome::Failed
        } else if t.ends_with(" skipped") {
            Outcome::Skipped
        } else {
            continue;
        };
        if outcome == Outcome::Failed {
            last_failed = Some(name.to_string());
        }
        run.results.insert(name.to_string(), outcome);
    }
    run
}

/// Finds pjdfstest: `$PJDFSTEST`, then `PATH`, then `~/.cargo/bin`.
pub fn find_pjdfstest() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PJDFSTEST") {
        return Some(PathBuf::from(p));
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(h).join(".cargo/bin"));
    }
    dirs.into_iter()
        .map(|d| d.join("pjdfstest"))
        .find(|p| p.is_file())
}

/// Runs pjdfstest in `dir` (tests named exactly as in `only`, or all), bounded by `limit`.
pub fn run_suite(
    pjdfstest: &Path,
    config: &Path,
    dir: &Path,
    only: &[String],
    limit: Duration,
) -> Result<SuiteRun> {
    let mut cmd = Command::new(pjdfstest);
    cmd.arg("-c").arg(config).arg("-p").arg(dir);
    if !only.is_empty() {
        // Exact patterns match the full inventory name, which the output prints trimmed.
        cmd.arg("-e")
            .args(only.iter().map(|n| format!("pjdfstest::tests::{n}")));
    }
    let child = cmd
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", pjdfstest.display()))?;
    let r = procs::wait_child(child, limit, "pjdfstest")?;
    let mut run = parse_output(&r.stdout);
    run.complete = r.stdout.contains("Summary:");
    if run.results.is_empty() {
        bail!(
            "pjdfstest in {} ran no test: {}{}",
            dir.display(),
            r.stdout.chars().take(2000).collect::<String>(),
            r.stderr.chars().take(2000).collect::<String>()
        );
    }
    if !run.complete {
        let tail: String = {
            let s = r.stdout.trim_end();
            s[s.len().saturating_sub(1500)..].to_string()
        };
        eprintln!(
            "posix-suite: pjdfstest in {} ended without its summary ({}); its last words: {tail}",
            dir.display(),
            if r.success { "exit 0" } else { "failed" }
        );
    }
    Ok(run)
}

/// A test the docs list as failing on the braid mount, with the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// Test name, or a prefix ending in `*` (`link::share_metadata::*`).
    pub name: String,
    /// Why it fails.
    pub reason: String,
}

impl Known {
    /// Whether this entry covers test `name`.
    pub fn covers(&self, name: &str) -> bool {
        match self.name.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.name == name,
        }
    }
}

/// Reads the listed failures from a Markdown document: the table rows
/// `` | `test::name` | reason | `` under a heading containing "External POSIX suite".
pub fn parse_known(markdown: &str) -> Vec<Known> {
    let mut out = Vec::new();
    let mut inside = false;
    let mut level = 0;
    for line in markdown.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes > 0 && line[hashes..].starts_with(' ') {
            if line.contains("External POSIX suite") {
                inside = true;
                level = hashes;
            } else if inside && hashes <= level {
                inside = false;
            }
            continue;
        }
        if !inside {
            continue;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        if cells.len() < 2 {
            continue;
        }
        let name = cells[0].trim();
        if let Some(n) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`'))
            && n.contains("::")
        {
            out.push(Known {
                name: n.to_string(),
                reason: cells[1].trim().to_string(),
            });
        }
    }
    out
}

/// How the mount under test compares with the passthrough.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Verdict {
    /// Tests run on both.
    pub total: usize,
    /// Failed on the mount under test (first run).
    pub failed: Vec<String>,
    /// ... of which the passthrough fails too.
    pub also_on_passthrough: Vec<String>,
    /// ... of which the docs list (and the passthrough passes).
    pub listed: Vec<(String, String)>,
    /// ... that passed on a rerun on the mount under test.
    pub intermittent: Vec<String>,
    /// ... that failed on every run on the mount under test, never on the passthrough, and
    /// are not listed: these fail the run.
    pub unexplained: Vec<(String, String)>,
    /// Listed tests that passed on the mount under test (the list may be stale).
    pub listed_but_passed: Vec<String>,
    /// Skipped on the mount under test but run on the passthrough.
    pub skipped_only_here: Vec<String>,
    /// Failures of the passthrough.
    pub passthrough_failed: Vec<String>,
    /// Tests the passthrough ran that the run on the mount under test never reached (it
    /// ended early): these fail the run too.
    pub not_run: Vec<String>,
    /// pjd's C suite on both, when run (`--suite c` or `both`).
    pub c_suite: Option<super::pjd_c::CVerdict>,
}

impl Verdict {
    /// Whether the suite passes: no unexplained failure.
    pub fn ok(&self) -> bool {
        self.unexplained.is_empty()
            && self.not_run.is_empty()
            && self.c_suite.as_ref().is_none_or(|c| c.ok())
    }

    /// A readable report.
    pub fn report(&self, what: &str) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "pjdfstest {PJDFSTEST_VERSION}: {} tests; {what} failed {}, the bindfs passthrough {}",
            self.total,
            self.failed.len(),
            self.passthrough_failed.len()
        );
        let _ = writeln!(
            s,
            "  also failing on the passthrough ({}): {}",
            self.also_on_passthrough.len(),
            self.also_on_passthrough.join(" ")
        );
        for (n, r) in &self.listed {
            let _ = writeln!(s, "  listed in the docs: {n}: {r}");
        }
        for n in &self.intermittent {
            let _ = writeln!(s, "  intermittent (passed on a rerun): {n}");
        }
        for n in &self.listed_but_passed {
            let _ = writeln!(s, "  listed but passed: {n}");
        }
        for n in &self.skipped_only_here {
            let _ = writeln!(s, "  skipped here, run on the passthrough: {n}");
        }
        for (n, m) in &self.unexplained {
            let _ = writeln!(s, "  UNEXPLAINED: {n}: {m}");
        }
        if !self.not_run.is_empty() {
            let _ = writeln!(
                s,
                "  NOT RUN ({}, the suite ended early): {}",
                self.not_run.len(),
                self.not_run.join(" ")
            );
        }
        if let Some(c) = &self.c_suite {
            s.push_str(&c.report(what));
        }
        let _ = writeln!(
            s,
            "verdict: {}",
            if self.ok() {
                "ok (every failure fails on the passthrough too or is listed)"
            } else {
                "FAILED (unexplained failures or tests not run above)"
            }
        );
        s
    }
}

/// Compares a run on the mount under test with a run on the passthrough. `rerun` runs the
/// named tests again on (the mount under test, the passthrough).
pub fn compare(
    sut: &SuiteRun,
    passthrough: &SuiteRun,
    known: &[Known],
    mut rerun: impl FnMut(&[String]) -> Result<(SuiteRun, SuiteRun)>,
) -> Result<Verdict> {
    let mut v = Verdict {
        total: sut.results.len(),
        failed: sut.failed(),
        passthrough_failed: passthrough.failed(),
        ..Default::default()
    };
    let mut open = Vec::new();
    for n in &v.failed {
        if passthrough.results.get(n) == Some(&Outcome::Failed) {
            v.also_on_passthrough.push(n.clone());
        } else if let Some(k) = known.iter().find(|k| k.covers(n)) {
            v.listed.push((n.clone(), k.reason.clone()));
        } else {
            open.push(n.clone());
        }
    }
    for k in known {
        for (n, o) in &sut.results {
            if *o == Outcome::Ok && k.covers(n) {
                v.listed_but_passed.push(n.clone());
            }
        }
    }
    for n in passthrough.results.keys() {
        if !sut.results.contains_key(n) {
            v.not_run.push(n.clone());
        }
    }
    for (n, o) in &sut.results {
        if *o == Outcome::Skipped && passthrough.results.get(n) != Some(&Outcome::Skipped) {
            v.skipped_only_here.push(n.clone());
        }
    }
    for _ in 0..RERUNS {
        if open.is_empty() {
            break;
        }
        let (s, p) = rerun(&open)?;
        open.retain(|n| {
            if p.results.get(n) == Some(&Outcome::Failed) {
                v.also_on_passthrough.push(n.clone());
                false
            } else if s.results.get(n) == Some(&Outcome::Ok) {
                v.intermittent.push(n.clone());
                false
            } else {
                true
            }
        });
    }
    v.unexplained = open
        .into_iter()
        .map(|n| {
            let m = sut.messages.get(&n).cloned().unwrap_or_default();
            (n, m)
        })
        .collect();
    Ok(v)
}

/// A `bindfs -f SRC MNT` passthrough mount; unmounted and ended on drop.
#[derive(Debug)]
pub struct BindfsMount {
    pid: u32,
    mountpoint: PathBuf,
}

impl BindfsMount {
    /// Mirrors `src` at `mountpoint` (as root: `allow_other`, `default_permissions`, new
    /// files owned by their creator, which is bindfs's default for root).
    pub fn mount(src: &Path, mountpoint: &Path) -> Result<BindfsMount> {
        let mut child = Command::new("bindfs")
            .arg("-f")
            .arg(src)
            .arg(mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting bindfs (apt-get install bindfs)")?;
        let m = BindfsMount {
            pid: child.id(),
            mountpoint: mountpoint.to_owned(),
        };
        mounts::wait_mounted(&mut child, mountpoint, Duration::from_secs(20), "bindfs")?;
        std::mem::forget(child);
        Ok(m)
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for BindfsMount {
    fn drop(&mut self) {
        if let Err(e) = mounts::unmount(&self.mountpoint) {
            eprintln!("braid: {e:#}");
        }
        procs::end_process(self.pid, Duration::from_secs(3));
    }
}

/// The file service `braid fs posix-suite` tests.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PosixSystem {
    /// braid fs mount.
    Braid,
    /// sshfs (with allow_other and default_permissions, so the suite's user switches work):
    /// a check of the harness, and a comparison.
    Sshfs,
}

/// Which suites `braid fs posix-suite` runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suites {
    /// The Rust rewrite (pjdfstest 0.2.2 from crates.io).
    Rust,
    /// pjd's original C suite, built from the vendored tarball (`--pjd-tarball`).
    C,
    /// Both.
    Both,
}

/// `braid fs posix-suite` options.
#[derive(clap::Args, Debug, Clone)]
pub struct PosixArgs {
    /// The file service under test.
    #[arg(long, value_enum, default_value = "braid")]
    pub system: PosixSystem,
    /// The pjdfstest binary (default: $PJDFSTEST, PATH, ~/.cargo/bin).
    #[arg(long)]
    pub pjdfstest: Option<PathBuf>,
    /// Markdown file listing the failures that have reasons (section "External POSIX suite").
    #[arg(long, default_value = "docs/FS.md")]
    pub known: PathBuf,
    /// Rails of the (unshaped) testbed.
    #[arg(long = "rail-count", value_name = "N", default_value_t = 2)]
    pub rails: usize,
    /// Parent of the run's temp dir (on a real disk).
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Seconds one pjdfstest run may take.
    #[arg(
        long = "timeout",
        value_name = "SECS",
        alias = "limit",
        default_value_t = 900.0
    )]
    pub limit: f64,
    /// Write the verdict as JSON to FILE ("-" for stdout).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Which suites to run.
    #[arg(long, value_enum, default_value = "rust")]
    pub suite: Suites,
    /// pjd's C suite (`--suite c|both`), built in the run's temp dir.
    #[arg(long, default_value = super::pjd_c::DEFAULT_TARBALL)]
    pub pjd_tarball: PathBuf,
}

/// Runs the suite on the passthrough and on the system under test and compares them; the
/// report is printed. The caller decides what an unexplained failure means (the CLI exits 1).
pub fn run(args: &PosixArgs) -> Result<Verdict> {
    use super::pjd_c;
    use braid_testbed::testbed::{self, Testbed, TestbedSpec};
    let rust = args.suite != Suites::C;
    let pjd = match &args.pjdfstest {
        Some(p) => p.clone(),
        None if !rust => PathBuf::new(),
        None => find_pjdfstest().with_context(|| {
            format!(
                "pjdfstest not found; install it with `cargo install pjdfstest --version {PJDFSTEST_VERSION} --locked` or pass --pjdfstest"
            )
        })?,
    };
    if !(args.limit > 0.0 && args.limit <= 3600.0) {
        bail!("--timeout must be in (0, 3600] seconds");
    }
    if args.rails == 0 || args.rails > 16 {
        bail!("--rail-count must be 1..16");
    }
    let known = match std::fs::read_to_string(&args.known) {
        Ok(md) => parse_known(&md),
        Err(e) => bail!(
            "reading the list of known failures {}: {e} (run from the repository's root, or pass --known)",
            args.known.display()
        ),
    };
    testbed::probe().context("the suite runs the mount on a testbed")?;
    procs::become_subreaper();
    let limit = Duration::from_secs_f64(args.limit);
    let tmp = mounts::TempDir::new_in(&args.dir, "braid-posix")?;
    let config = tmp.path().join("pjdfstest.toml");
    std::fs::write(&config, CONFIG)?;
    let c_root = match args.suite {
        Suites::Rust => None,
        _ => Some(pjd_c::build(&args.pjd_tarball, tmp.path())?),
    };
    let suites = |mnt: &Path| -> Result<(SuiteRun, Option<pjd_c::ProveRun>)> {
        let r = match rust {
            true => run_suite(&pjd, &config, mnt, &[], limit)?,
            false => SuiteRun::default(),
        };
        let c = c_root.as_ref().map(|root| pjd_c::run(root, mnt, limit));
        Ok((r, c.transpose()?))
    };
    let (pt_src, pt_mnt) = (tmp.path().join("pt-src"), tmp.path().join("pt-mnt"));
    std::fs::create_dir_all(&pt_src)?;
    std::fs::create_dir_all(&pt_mnt)?;
    let passthrough = BindfsMount::mount(&pt_src, &pt_mnt)?;
    eprintln!(
        "posix-suite: pjdfstest on the bindfs passthrough {}",
        pt_mnt.display()
    );
    let (pt_run, pt_c) = suites(&pt_mnt)?;

    let tb = Testbed::up(&TestbedSpec::unshaped(
        format!("fsp{}", std::process::id()),
        args.rails,
    ))?;
    let export = tmp.path().join("export");
    std::fs::create_dir_all(&export)?;
    let mut braid_server = None;
    let service = match args.system {
        PosixSystem::Sshfs => super::systems::start_sshfs(
            &tb,
            tmp.path(),
            &export,
            "posix",
            &["allow_other", "default_permissions"],
        )?,
        PosixSystem::Braid => {
            let exe = std::env::current_exe().context("finding the braid executable")?;
            let fs = super::systems::start_braid_server(&exe, &tb, tmp.path(), &export, "posix")?;
            let m =
                // The suite switches to other users, as on the passthrough (allow_other).
                super::systems::start_braid_mount(
                    &exe,
                    &tb,
                    &fs,
                    tmp.path(),
                    args.rails,
                    "posix",
                    &["--allow-other"],
                )?;
            braid_server = Some(fs);
            m
        }
    };
    let what = service.system;
    eprintln!(
        "posix-suite: pjdfstest on {what} at {}",
        service.mountpoint.display()
    );
    let (sut_run, sut_c) = suites(&service.mountpoint)?;
    let mut verdict = compare(&sut_run, &pt_run, &known, |names| {
        eprintln!("posix-suite: rerunning {}", names.join(" "));
        Ok((
            run_suite(&pjd, &config, &service.mountpoint, names, limit)?,
            run_suite(&pjd, &config, passthrough.path(), names, limit)?,
        ))
    })?;
    verdict.c_suite = sut_c.zip(pt_c).map(|(s, p)| pjd_c::CVerdict::new(s, p));
    drop(service);
    drop(braid_server);
    drop(tb);
    drop(passthrough);
    print!("{}", verdict.report(what));
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&verdict)?;
        if p.as_os_str() == "-" {
            println!("{text}");
        } else {
            std::fs::write(p, text + "\n").with_context(|| format!("writing {}", p.display()))?;
        }
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "chmod::ok_case                                                ok\n\
        link::share_metadata::fifo                                   \u{1b}[31mFAILED\u{1b}[0m\n\
        \tassertion `left == right` failed\n\
        Backtrace:\n\
        chown::erofs_named                                      skipped\n\
        \tRemounts (allow_remount) are not allowed in the configuration file\n\
        unlink::update_ctime_success::regular                        FAILED\n\
        \tTimestamps did not change as expected\n\
        \n\
        Summary: 2 failed, 1 skipped, 1 passed, 0 expected failures, 4 total\n";

    #[test]
    fn parses_pjdfstest_output() {
        let r = parse_output(OUT);
        assert_eq!(r.results.len(), 4);
        assert_eq!(r.results["chmod::ok_case"], Outcome::Ok);
        assert_eq!(r.results["chown::erofs_named"], Outcome::Skipped);
        assert_eq!(
            r.failed(),
            vec![
                "link::share_metadata::fifo".to_string(),
                "unlink::update_ctime_success::regular".to_string()
            ]
        );
        assert_eq!(
            r.messages["unlink::update_ctime_success::regular"],
            "Timestamps did not change as expected"
        );
    }

    #[test]
    fn known_failures_from_markdown() {
        let md = "# FS\n\n## External POSIX suite\n\ntext\n\n| test | reason |\n|---|---|\n\
                  | `a::b` | why a |\n| `c::d::*` | why c |\n\n### detail\n| `e::f` | nested |\n\
                  ## Other\n| `x::y` | not in the section |\n";
        let k = parse_known(md);
        assert_eq!(k.len(), 3, "{k:?}");
        assert!(k[1].covers("c::d::fifo") && !k[1].covers("c::e"));
        assert_eq!(k[0].reason, "why a");
        assert!(!k.iter().any(|k| k.name == "x::y"));
    }

    fn run(pairs: &[(&str, Outcome)]) -> SuiteRun {
        SuiteRun {
            results: pairs.iter().map(|(n, o)| (n.to_string(), *o)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn compare_explains_and_reruns() {
        use Outcome::*;
        let sut = run(&[
            ("t::common", Failed),
            ("t::listed", Failed),
            ("t::flaky", Failed),
            ("t::bad", Failed),
            ("t::pt_flaky", Failed),
            ("t::fine", Ok),
            ("t::skip", Skipped),
        ]);
        let pt = run(&[
            ("t::common", Failed),
            ("t::listed", Ok),
            ("t::flaky", Ok),
            ("t::bad", Ok),
            ("t::pt_flaky", Ok),
            ("t::fine", Ok),
            ("t::skip", Ok),
        ]);
        let known = vec![
            Known {
                name: "t::listed".into(),
                reason: "r".into(),
            },
            Known {
                name: "t::fine".into(),
                reason: "stale".into(),
            },
        ];
        let mut calls = 0;
        let v = compare(&sut, &pt, &known, |names| {
            calls += 1;
            assert!(names.contains(&"t::bad".to_string()));
            Result::Ok((
                run(&[
                    ("t::flaky", Ok),
                    ("t::bad", Failed),
                    ("t::pt_flaky", Failed),
                ]),
                run(&[("t::flaky", Ok), ("t::bad", Ok), ("t::pt_flaky", Failed)]),
            ))
        })
        .unwrap();
        assert_eq!(calls, RERUNS);
        assert_eq!(v.also_on_passthrough, vec!["t::common", "t::pt_flaky"]);
        assert_eq!(v.listed, vec![("t::listed".to_string(), "r".to_string())]);
        assert_eq!(v.intermittent, vec!["t::flaky"]);
        assert_eq!(v.unexplained.len(), 1);
        assert_eq!(v.unexplained[0].0, "t::bad");
        assert_eq!(v.listed_but_passed, vec!["t::fine"]);
        assert_eq!(v.skipped_only_here, vec!["t::skip"]);
        assert!(!v.ok());
        assert!(v.report("braid").contains("UNEXPLAINED: t::bad"));
    }

    #[test]
    fn a_run_that_ended_early_fails() {
        use Outcome::*;
        let sut = run(&[("t::a", Ok)]);
        let pt = run(&[("t::a", Ok), ("t::b", Ok)]);
        let v = compare(&sut, &pt, &[], |_| unreachable!("nothing to rerun")).unwrap();
        assert_eq!(v.not_run, vec!["t::b"]);
        assert!(!v.ok());
        assert!(v.report("braid").contains("NOT RUN (1"));
    }
}
