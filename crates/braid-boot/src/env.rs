//! What the launcher tells a process: its rank, the group size, the rendezvous, the job.
//!
//! The contract is documented in the repository's `docs/LAUNCH.md`; the constants below
//! name every variable read.

use std::time::Duration;

use crate::addrs::RailSpec;
use crate::error::BootError;
use crate::launcher::{check_rank0_host, launcher_root};

/// Rank and size variables, in the order they are looked for: the first pair present wins.
/// (Open MPI, PMI (MPICH/Hydra, Intel MPI), Slurm, braid's own.)
pub const RANK_SIZE_VARS: [(&str, &str, &str); 4] = [
    ("open-mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("pmi", "PMI_RANK", "PMI_SIZE"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS"),
    ("braid", "BRAID_RANK", "BRAID_SIZE"),
];

/// The rendezvous, `host:port` (or several, comma-separated, tried in order): rank 0
/// listens on the port, every rank connects to the first address that answers. Under
/// `mpirun` and `srun` it defaults to one the launcher implies ([`crate::launcher`]).
pub const ROOT_ENV: &str = "BRAID_ROOT";
/// The job's identity; two jobs on one rendezvous are told apart by it.
pub const JOB_ENV: &str = "BRAID_JOB";
/// Job identities of launchers, used when `BRAID_JOB` is not set (first present wins).
pub const LAUNCHER_JOB_VARS: [&str; 3] =
    ["OMPI_MCA_ess_base_jobid", "SLURM_JOB_ID", "PMIX_NAMESPACE"];
/// Overrides the local rail addresses: `IP[/PREFIX],IP[/PREFIX],...`.
pub const RAILS_ENV: &str = "BRAID_RAILS";
/// Bound on forming the group, in seconds (overrides [`crate::WorldOptions::join_timeout`]).
pub const JOIN_TIMEOUT_ENV: &str = "BRAID_JOIN_TIMEOUT";

/// A process's place in its job, as the launcher's environment describes it.
#[derive(Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// Number of processes in the job.
    pub size: usize,
    /// The rendezvous (`BRAID_ROOT`, else the launcher's, see [`crate::launcher`]):
    /// `host:port`, or several comma-separated; empty for a job of one process.
    pub root: String,
    /// The job's identity (`BRAID_JOB`, else the launcher's job id, else `default`).
    pub job: String,
    /// Which launcher the rank and size came from: `open-mpi`, `pmi`, `slurm`, `braid`, or
    /// `singleton` when none set them.
    pub launcher: &'static str,
    /// Local rail addresses from `BRAID_RAILS`; `None` to use the interfaces' addresses.
    pub rails: Option<Vec<RailSpec>>,
    /// The cluster secret (`BRAID_SECRET` or `BRAID_SECRET_FILE`), authenticating the
    /// rendezvous as it does braid's rails.
    pub secret: Option<Vec<u8>>,
    /// `BRAID_JOIN_TIMEOUT`, when set.
    pub join_timeout: Option<Duration>,
    /// `BRAID_INSECURE=1`: the rendezvous may listen beyond loopback without a secret.
    pub insecure: bool,
}

impl std::fmt::Debug for LaunchEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchEnv")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("root", &self.root)
            .field("job", &self.job)
            .field("launcher", &self.launcher)
            .field("rails", &self.rails)
            .field("secret", &self.secret.as_ref().map(|_| "<set>"))
            .field("join_timeout", &self.join_timeout)
            .field("insecure", &self.insecure)
            .finish()
    }
}

impl LaunchEnv {
    /// Reads the process environment. With no launcher variables at all the process is rank
    /// 0 of a job of 1 (like an MPI singleton).
    /// Under `mpirun` without `BRAID_ROOT`, rank 0 also checks that it runs on `mpirun`'s
    /// host, where the others look for it.
    pub fn from_env() -> Result<LaunchEnv, BootError> {
        let get = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        let env = LaunchEnv::from_vars(get)?;
        let root_unset = get(ROOT_ENV).is_none_or(|r| r.trim().is_empty());
        if env.rank == 0
            && env.size > 1
            && root_unset
            && let Some(r) = launcher_root(env.launcher, &get)?
        {
            let local: Vec<std::net::IpAddr> = if_addrs::get_if_addrs()
                .map_err(|e| BootError::BadEnv(format!("listing this host's addresses: {e}")))?
                .iter()
                .map(|i| i.ip())
                .collect();
            check_rank0_host(&r, &local, &crate::addrs::hostname())?;
        }
        Ok(env)
    }

    /// [`LaunchEnv::from_env`] over any variable lookup (for embedding and tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, BootError> {
        let bad = |s: String| BootError::BadEnv(s);
        let mut found = None;
        for (launcher, rank_var, size_var) in RANK_SIZE_VARS {
            match (get(rank_var), get(size_var)) {
                (None, None) => continue,
                (Some(r), Some(s)) => {
                    let rank = parse_count(rank_var, &r)?;
                    let size = parse_count(size_var, &s)?;
                    found = Some((launcher, rank, size, rank_var, size_var));
                    break;
                }
                (Some(_), None) => {
                    return Err(bad(format!("{rank_var} is set but {size_var} is not")));
                }
                (None, Some(_)) => {
                    return Err(bad(format!("{size_var} is set but {rank_var} is not")));
                }
            }
        }
        let (launcher, rank, size) = match found {
            Some((l, rank, size, rank_var, size_var)) => {
                if size == 0 {
                    return Err(bad(format!("{size_var} is 0")));
                }
                if rank >= size {
                    return Err(bad(format!(
                        "{rank_var}={rank} is not below {size_var}={size}"
                    )));
                }
                (l, rank, size)
            }
            None => ("singleton", 0, 1),
        };
        let mut root = get(ROOT_ENV).unwrap_or_default().trim().to_owned();
        if root.is_empty() && size > 1 {
            match launcher_root(launcher, &get)? {
                Some(r) => {
                    tracing::debug!(root = %r.root, "rendezvous from {}", r.source);
                    root = r.root;
                }
                None => {
                    return Err(bad(format!(
                        "{ROOT_ENV} is not set and the launcher ({launcher}) names no \
                         rendezvous: a job of {size} ranks needs one (braid run, mpirun and \
                         srun provide it; else set {ROOT_ENV}=HOST:PORT of rank 0's host)"
                    )));
                }
            }
        }
        if !root.is_empty() {
            root_candidates(&root)?;
        }
        let job = match get(JOB_ENV).filter(|j| !j.is_empty()) {
            Some(j) => j,
            None => LAUNCHER_JOB_VARS
                .iter()
                .find_map(|v| get(v).filter(|j| !j.is_empty()))
                .map(|j| match (get("SLURM_JOB_ID"), get("SLURM_STEP_ID")) {
                    // One Slurm job runs several steps; each is its own group.
                    (Some(id), Some(step)) if id == j => format!("{j}.{step}"),
                    _ => j,
                })
                .unwrap_or_else(|| "default".into()),
        };
        if job.len() > 255 {
            return Err(bad(format!(
                "the job id is {} bytes long (at most 255)",
                job.len()
            )));
        }
        let rails = match get(RAILS_ENV).filter(|r| !r.trim().is_empty()) {
            Some(r) => Some(
                r.split(',')
                    .map(|s| s.trim().parse::<RailSpec>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad(format!("{RAILS_ENV}={r}: {e}")))?,
            ),
            None => None,
        };
        let secret = read_secret(&get)?;
        let join_timeout = match get(JOIN_TIMEOUT_ENV) {
            Some(t) => {
                let s: f64 = t
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("{JOIN_TIMEOUT_ENV}={t}: not a number of seconds")))?;
                if !(s > 0.0 && s <= 86_400.0) {
                    return Err(bad(format!(
                        "{JOIN_TIMEOUT_ENV}={t}: use 0 < seconds <= 86400"
                    )));
                }
                Some(Duration::from_secs_f64(s))
            }
            None => None,
        };
        Ok(LaunchEnv {
            rank,
            size,
            root,
            job,
            launcher,
            rails,
            secret,
            join_timeout,
            insecure: get(braid::INSECURE_ENV).is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            }),
        })
    }

    /// A job of one process (no rendezvous).
    pub fn singleton() -> LaunchEnv {
        LaunchEnv {
            rank: 0,
            size: 1,
            root: String::new(),
            job: "default".into(),
            launcher: "singleton",
            rails: None,
            secret: None,
            join_timeout: None,
            insecure: false,
        }
    }
}

fn parse_count(var: &str, v: &str) -> Result<usize, BootError> {
    let n: usize = v
        .trim()
        .parse()
        .map_err(|_| BootError::BadEnv(format!("{var}={v:?} is not a number")))?;
    if n > 1 << 20 {
        return Err(BootError::BadEnv(format!("{var}={n} is implausibly large")));
    }
    Ok(n)
}

/// The `host:port` candidates of a `BRAID_ROOT` value, checked for form.
pub(crate) fn root_candidates(root: &str) -> Result<Vec<(String, u16)>, BootError> {
    root.split(',')
        .map(|c| {
            let c = c.trim();
            let (host, port) = c
                .rsplit_once(':')
                .ok_or_else(|| BootError::BadEnv(format!("{ROOT_ENV}: {c:?} is not host:port")))?;
            let port: u16 = port
                .parse()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| BootError::BadEnv(format!("{ROOT_ENV}: bad port in {c:?}")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(BootError::BadEnv(format!("{ROOT_ENV}: no host in {c:?}")));
            }
            Ok((host.to_owned(), port))
        })
        .collect()
}

/// The cluster secret, by the rules of `braid::ContextConfig::from_env`.
fn read_secret(get: &impl Fn(&str) -> Option<String>) -> Result<Option<Vec<u8>>, BootError> {
    let secret = if let Some(s) = get(braid::SECRET_ENV) {
        Some(s.into_bytes())
    } else if let Some(path) = get(braid::SECRET_FILE_ENV) {
        let mut b = std::fs::read(&path).map_err(|e| {
            BootError::BadEnv(format!("reading the cluster secret from {path}: {e}"))
        })?;
        while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
            b.pop();
        }
        Some(b)
    } else {
        None
    };
    if secret.as_ref().is_some_and(|s| s.is_empty()) {
        return Err(BootError::BadEnv("the cluster secret is empty".into()));
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv, BootError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn launcher_precedence() {
        let e = env(&[
            ("BRAID_RANK", "3"),
            ("BRAID_SIZE", "4"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "5"),
            ("BRAID_ROOT", "10.0.0.1:29500"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (0, 5, "open-mpi"));
        let e = env(&[
            ("BRAID_RANK", "3"),
            ("BRAID_SIZE", "4"),
            ("PMI_RANK", "2"),
            ("PMI_SIZE", "3"),
            ("BRAID_ROOT", "h:1"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (2, 3, "pmi"));
        let e = env(&[
            ("BRAID_RANK", "3"),
            ("BRAID_SIZE", "4"),
            ("BRAID_ROOT", "h:1"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.size, e.launcher), (3, 4, "braid"));
    }

    #[test]
    fn job_identity() {
        let base = [
            ("BRAID_RANK", "0"),
            ("BRAID_SIZE", "2"),
            ("BRAID_ROOT", "h:1"),
        ];
        assert_eq!(env(&base).unwrap().job, "default");
        let mut v = base.to_vec();
        v.push(("OMPI_MCA_ess_base_jobid", "1573715969"));
        assert_eq!(env(&v).unwrap().job, "1573715969");
        v.push(("BRAID_JOB", "mine"));
        assert_eq!(env(&v).unwrap().job, "mine");
        let mut s = base.to_vec();
        s.extend([("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "2")]);
        assert_eq!(env(&s).unwrap().job, "77.2");
    }

    #[test]
    fn singleton_and_bad_environments() {
        let e = env(&[]).unwrap();
        assert_eq!(
            (e.rank, e.size, e.launcher, e.root.as_str()),
            (0, 1, "singleton", "")
        );
        let msg = |r: Result<LaunchEnv, BootError>| r.unwrap_err().to_string();
        assert!(msg(env(&[("BRAID_RANK", "0")])).contains("BRAID_SIZE is not"));
        assert!(msg(env(&[("BRAID_RANK", "2"), ("BRAID_SIZE", "2")])).contains("not below"));
        assert!(msg(env(&[("BRAID_RANK", "x"), ("BRAID_SIZE", "2")])).contains("not a number"));
        assert!(msg(env(&[("BRAID_RANK", "0"), ("BRAID_SIZE", "0")])).contains("is 0"));
        assert!(
            msg(env(&[("BRAID_RANK", "0"), ("BRAID_SIZE", "2")])).contains("BRAID_ROOT is not set")
        );
        let two = [("BRAID_RANK", "0"), ("BRAID_SIZE", "2")];
        for bad_root in ["nohost", "h:0", "h:99999", ":5", "a:1,b"] {
            let mut v = two.to_vec();
            v.push(("BRAID_ROOT", bad_root));
            assert!(matches!(env(&v), Err(BootError::BadEnv(_))), "{bad_root}");
        }
        let mut v = two.to_vec();
        v.extend([("BRAID_ROOT", "h:1"), ("BRAID_RAILS", "10.0.0.1,bogus")]);
        assert!(msg(env(&v)).contains("BRAID_RAILS"));
        let mut v = two.to_vec();
        v.extend([("BRAID_ROOT", "h:1"), ("BRAID_SECRET", "")]);
        assert!(msg(env(&v)).contains("empty"));
        let mut v = two.to_vec();
        v.extend([("BRAID_ROOT", "h:1"), ("BRAID_JOIN_TIMEOUT", "-1")]);
        assert!(msg(env(&v)).contains("BRAID_JOIN_TIMEOUT"));
    }

    #[test]
    fn the_launcher_implies_the_root_and_braid_root_overrides_it() {
        let ompi = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "1261830145"),
            (
                "OMPI_MCA_orte_hnp_uri",
                "1261830144.0;tcp://198.18.0.1,198.18.1.1:55173",
            ),
        ];
        let e = env(&ompi).unwrap();
        let (host, port) = root_candidates(&e.root).unwrap()[0].clone();
        assert_eq!(
            (host.as_str(), e.job.as_str()),
            ("198.18.0.1", "1261830145")
        );
        assert!((29500..29500 + 2048).contains(&port), "{port}");
        let mut v = ompi.to_vec();
        v.push(("BRAID_ROOT", "a:1"));
        assert_eq!(env(&v).unwrap().root, "a:1");
        let srun = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_STEP_NODELIST", "node[07-08]"),
        ];
        let e = env(&srun).unwrap();
        assert_eq!((e.root.as_str(), e.job.as_str()), ("node07:30116", "77.0"));
        let mut v = srun.to_vec();
        v.push(("BRAID_ROOT", "b:2"));
        assert_eq!(env(&v).unwrap().root, "b:2");
        // PMI implies none: the message says what to do.
        let e = env(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")]).unwrap_err();
        assert!(
            e.to_string().contains("launcher (pmi) names no rendezvous"),
            "{e}"
        );
    }

    #[test]
    fn roots_rails_and_secret() {
        let e = env(&[
            ("BRAID_RANK", "1"),
            ("BRAID_SIZE", "2"),
            ("BRAID_ROOT", "198.18.0.1:29500, [::1]:7"),
            ("BRAID_RAILS", "198.18.0.2/24, 198.18.1.2"),
            ("BRAID_SECRET", "s3"),
            ("BRAID_JOIN_TIMEOUT", "2.5"),
        ])
        .unwrap();
        assert_eq!(
            root_candidates(&e.root).unwrap(),
            vec![("198.18.0.1".to_string(), 29500), ("::1".to_string(), 7)]
        );
        let rails = e.rails.unwrap();
        assert_eq!(rails.len(), 2);
        assert_eq!(rails[0].prefix, Some(24));
        assert_eq!(rails[1].prefix, None);
        assert_eq!(e.secret.as_deref(), Some(&b"s3"[..]));
        assert_eq!(e.join_timeout, Some(Duration::from_millis(2500)));
    }
}
