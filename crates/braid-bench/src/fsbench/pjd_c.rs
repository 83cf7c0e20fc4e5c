//! pjd's original POSIX suite in C (pjd/pjdfstest at 85a8aea: 238 test files, 8,798
//! subtests that switch between several uids and gids), built from its vendored tarball and
//! run with `prove -r tests` as root inside the mount under test and inside the passthrough.
//! The mount under test passes when it fails no more subtests than the passthrough; the
//! subtests it fails that the passthrough passes are listed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::procs;

/// Where the tarball is, from the repository's root.
pub const DEFAULT_TARBALL: &str = "../shared/vendor/pjdfstest-85a8aea.tar.gz";

/// Longest a build step may take.
const BUILD_LIMIT: Duration = Duration::from_secs(600);

/// Failed subtests of one `prove` run, by test file (relative to `tests/`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProveRun {
    /// Test files run (`Files=`).
    pub files: usize,
    /// Subtests run (`Tests=`).
    pub subtests: usize,
    /// Failed subtest numbers by file.
    pub failed: BTreeMap<String, Vec<u32>>,
    /// Files that ended abnormally (non-zero wait status or a parse error).
    pub broken: Vec<String>,
    /// Whether prove printed its result line.
    pub complete: bool,
}

impl ProveRun {
    /// Failed subtests in all.
    pub fn failed_count(&self) -> usize {
        self.failed.values().map(Vec::len).sum()
    }
}

/// "1-4, 6, 9-10" as numbers.
fn numbers(list: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) {
                    // Bounded: a subtest list never spans more than a file's plan.
                    out.extend(a..=b.min(a.saturating_add(100_000)));
                }
            }
            None => out.extend(part.parse::<u32>().ok()),
        }
    }
    out
}

/// The test file's name below `tests/`.
fn short_name(path: &str) -> String {
    match path.rfind("/tests/") {
        Some(i) => path[i + 7..].to_string(),
        None => path.to_string(),
    }
}

/// Parses prove's "Test Summary Report" and totals.
pub fn parse_prove(text: &str) -> ProveRun {
    let mut run = ProveRun::default();
    let mut current: Option<String> = None;
    let mut in_failed_list = false;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Files=") {
            let num = |s: &str| s.trim().parse().unwrap_or(0);
            run.files = num(rest.split(',').next().unwrap_or(""));
            if let Some(t) = rest.split("Tests=").nth(1) {
                run.subtests = num(t.split(',').next().unwrap_or(""));
            }
            continue;
        }
        if line.starts_with("Result: ") {
            run.complete = true;
            continue;
        }
        if line.starts_with('/') && line.contains("(Wstat: ") {
            let name = short_name(line.split_whitespace().next().unwrap_or(""));
            let wstat = line
                .split("Wstat: ")
                .nth(1)
                .and_then(|w| w.split_whitespace().next())
                .unwrap_or("0");
            if wstat != "0" {
                run.broken.push(name.clone());
            }
            current = Some(name);
            in_failed_list = false;
            continue;
        }
        let t = line.trim();
        // "Failed test:" when one failed.
        let list = t
            .strip_prefix("Failed tests:")
            .or_else(|| t.strip_prefix("Failed test:"));
        if let Some(list) = list {
            if let Some(name) = &current {
                run.failed
                    .entry(name.clone())
                    .or_default()
                    .extend(numbers(list));
                in_failed_list = true;
            }
            continue;
        }
        if t.starts_with("Parse errors:")
            && let Some(name) = &current
            && !run.broken.contains(name)
        {
            run.broken.push(name.clone());
        }
        let continuation =
            !t.is_empty() && t.chars().all(|c| c.is_ascii_digit() || ", -".contains(c));
        if in_failed_list && continuation {
            if let Some(name) = &current {
                run.failed
                    .entry(name.clone())
                    .or_default()
                    .extend(numbers(t));
            }
        } else {
            in_failed_list = false;
        }
    }
    run
}

fn step(cmd: &mut Command, what: &str) -> Result<()> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    let r = procs::wait_child(child, BUILD_LIMIT, what)?;
    if !r.success {
        bail!("{what} failed: {}{}", r.stdout, r.stderr);
    }
    Ok(())
}

/// Unpacks `tarball` into `dir/pjdfstest-c` and builds the `pjdfstest` program there
/// (autoconf, automake, a C compiler); returns that directory (it holds `tests/`).
pub fn build(tarball: &Path, dir: &Path) -> Result<PathBuf> {
    if !tarball.is_file() {
        bail!(
            "{} not found (the vendored pjd suite; pass --pjd-tarball)",
            tarball.display()
        );
    }
    let root = dir.join("pjdfstest-c");
    std::fs::create_dir_all(&root)?;
    step(
        Command::new("tar")
            .arg("xzf")
            .arg(tarball)
            .arg("-C")
            .arg(&root),
        "unpacking the pjd suite",
    )?;
    step(
        Command::new("autoreconf").arg("-ifs").current_dir(&root),
        "autoreconf (apt-get install autoconf automake)",
    )?;
    step(
        Command::new("./configure").current_dir(&root),
        "configuring the pjd suite",
    )?;
    step(
        Command::new("make").arg("pjdfstest").current_dir(&root),
        "building pjdfstest",
    )?;
    Ok(root)
}

/// Runs `prove -r ROOT/tests` in a fresh directory `pjd-c` of `mount`, bounded by `limit`.
pub fn run(root: &Path, mount: &Path, limit: Duration) -> Result<ProveRun> {
    let cwd = mount.join("pjd-c");
    std::fs::create_dir_all(&cwd)?;
    // The suite's other users work in it too.
    std::os::unix::fs::chown(&cwd, Some(0), Some(0))?;
    std::fs::set_permissions(&cwd, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let child = Command::new("prove")
        .arg("-r")
        .arg(root.join("tests"))
        .current_dir(&cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting prove (apt-get install perl)")?;
    let r = procs::wait_child(child, limit, "prove")?;
    let run = parse_prove(&r.stdout);
    if run.files == 0 {
        bail!(
            "prove in {} ran no test: {}{}",
            cwd.display(),
            r.stdout.chars().take(2000).collect::<String>(),
            r.stderr.chars().take(2000).collect::<String>()
        );
    }
    Ok(run)
}

/// The C suite on the mount under test against the passthrough.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CVerdict {
    /// The mount under test's run.
    pub sut: ProveRun,
    /// The passthrough's run.
    pub passthrough: ProveRun,
    /// Subtests failing on the mount under test and passing on the passthrough, by file.
    pub only_here: BTreeMap<String, Vec<u32>>,
}

impl CVerdict {
    /// Compares two runs.
    pub fn new(sut: ProveRun, passthrough: ProveRun) -> CVerdict {
        let mut only_here = BTreeMap::new();
        for (file, nums) in &sut.failed {
            let there = passthrough.failed.get(file);
            let only: Vec<u32> = nums
                .iter()
                .copied()
                .filter(|n| !there.is_some_and(|t| t.contains(n)))
                .collect();
            if !only.is_empty() {
                only_here.insert(file.clone(), only);
            }
        }
        CVerdict {
            sut,
            passthrough,
            only_here,
        }
    }

    /// Passes when the mount under test ran everything and fails no more subtests than the
    /// passthrough.
    pub fn ok(&self) -> bool {
        self.sut.complete
            && self.sut.subtests >= self.passthrough.subtests
            && self.sut.failed_count() <= self.passthrough.failed_count()
    }

    /// A readable report.
    pub fn report(&self, what: &str) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let list = |r: &ProveRun| {
            r.failed
                .iter()
                .map(|(f, n)| format!("{f}({})", n.len()))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(
            s,
            "pjd C suite: {} subtests in {} files; {what} failed {} in {} files, the bindfs passthrough {} in {} files",
            self.sut.subtests,
            self.sut.files,
            self.sut.failed_count(),
            self.sut.failed.len(),
            self.passthrough.failed_count(),
            self.passthrough.failed.len()
        );
        let _ = writeln!(s, "  {what}: {}", list(&self.sut));
        let _ = writeln!(s, "  passthrough: {}", list(&self.passthrough));
        for (f, n) in &self.only_here {
            let _ = writeln!(s, "  only on {what}: {f} {n:?}");
        }
        if !self.sut.broken.is_empty() {
            let _ = writeln!(s, "  ended abnormally: {}", self.sut.broken.join(" "));
        }
        let _ = writeln!(
            s,
            "C suite verdict: {}",
            if self.ok() {
                "ok (no more failures than the passthrough)"
            } else {
                "FAILED (more failures than the passthrough, or the run ended early)"
            }
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "/x/tests/chmod/00.t .......... ok\n\
/x/tests/link/00.t ........... Failed 3/202 subtests\n\
\n\
Test Summary Report\n\
-------------------\n\
/x/tests/chown/00.t          (Wstat: 0 Tests: 1280 Failed: 0)\n\
  TODO passed:   1054, 1058\n\
/x/tests/link/00.t           (Wstat: 0 Tests: 202 Failed: 45)\n\
  Failed tests:  5, 8-9, 13\n\
                41, 44-45\n\
/x/tests/rename/09.t         (Wstat: 256 Tests: 10 Failed: 1)\n\
  Failed test:  10\n\
  Non-zero exit status: 1\n\
Files=238, Tests=8798, 359 wallclock secs\n\
Result: FAIL\n";

    #[test]
    fn parses_the_summary_report() {
        let r = parse_prove(OUT);
        assert_eq!((r.files, r.subtests, r.complete), (238, 8798, true));
        assert_eq!(r.failed["link/00.t"], vec![5, 8, 9, 13, 41, 44, 45]);
        assert_eq!(r.failed["rename/09.t"], vec![10]);
        assert!(
            !r.failed.contains_key("chown/00.t"),
            "TODO passed is no failure"
        );
        assert_eq!(r.broken, vec!["rename/09.t"]);
        assert_eq!(r.failed_count(), 8);
        assert_eq!(numbers("1-3, 7"), vec![1, 2, 3, 7]);
    }

    #[test]
    fn the_verdict_counts_and_lists_what_only_the_mount_fails() {
        let run = |pairs: &[(&str, &[u32])]| ProveRun {
            files: 2,
            subtests: 10,
            complete: true,
            failed: pairs
                .iter()
                .map(|(f, n)| (f.to_string(), n.to_vec()))
                .collect(),
            ..Default::default()
        };
        let v = CVerdict::new(run(&[("a.t", &[1, 2])]), run(&[("a.t", &[2, 3, 4])]));
        assert!(v.ok());
        assert_eq!(v.only_here["a.t"], vec![1]);
        let v = CVerdict::new(
            run(&[("a.t", &[1, 2]), ("b.t", &[1])]),
            run(&[("a.t", &[2])]),
        );
        assert!(!v.ok());
        assert!(v.report("braid").contains("only on braid: b.t [1]"));
        let mut early = run(&[]);
        early.complete = false;
        assert!(!CVerdict::new(early, run(&[])).ok());
    }
}
