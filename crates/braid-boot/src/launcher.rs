//! The rendezvous a launcher implies when `BRAID_ROOT` is not set, so `mpirun -n 4 --host
//! a,b ./prog` and `srun -N 2 ./prog` need nothing more.
//!
//! * Open MPI (`mpirun`): the host `mpirun` runs on, at the addresses its daemon advertises
//!   in `OMPI_MCA_orte_hnp_uri` (`JOB.0;tcp://IP,IP:PORT;tcp6://[IP]:PORT`). `mpirun` maps
//!   rank 0 to its own host when that host is in the allocation (a batch job's `mpirun`
//!   runs on the first allocated node); rank 0 checks that it does ([`check_rank0_host`]).
//! * Slurm (`srun`): the first host of `SLURM_STEP_NODELIST` (else `SLURM_JOB_NODELIST`,
//!   `SLURM_NODELIST`), where every task distribution puts task 0.
//!
//! The port comes from the launcher's job id, in [`ROOT_PORT_BASE`]`..`[`ROOT_PORT_BASE`]` +
//! `[`ROOT_PORT_SPAN`] (below the kernel's ephemeral range, so no connecting socket takes
//! it): Slurm's `job*8 + step` modulo the span, so concurrent jobs on one node (close job ids)
//! get distinct ports; Open MPI's job id hashed.

use std::net::IpAddr;

use crate::error::BootError;
use crate::hostlist;

/// First port a launcher-derived rendezvous uses.
pub const ROOT_PORT_BASE: u16 = 29500;
/// Number of ports a launcher-derived rendezvous is taken from (29500-31547).
pub const ROOT_PORT_SPAN: u16 = 2048;

/// Open MPI's description of `mpirun`'s daemon (the "HNP"): its addresses and port.
pub const OMPI_HNP_URI_ENV: &str = "OMPI_MCA_orte_hnp_uri";
/// Open MPI's job id, the same in every rank of one `mpirun`.
pub const OMPI_JOBID_ENV: &str = "OMPI_MCA_ess_base_jobid";
/// Slurm's node lists, the step's first (a step may use part of the job's nodes).
pub const SLURM_NODELIST_VARS: [&str; 3] = [
    "SLURM_STEP_NODELIST",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
];

/// A rendezvous taken from the launcher's environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherRoot {
    /// The `BRAID_ROOT` it stands for: `host:port`, or several comma-separated.
    pub root: String,
    /// Where it came from, for messages (`mpirun's host (OMPI_MCA_orte_hnp_uri)`).
    pub source: String,
    /// Under Open MPI, `mpirun`'s addresses: rank 0 must have one of them.
    pub hnp_ips: Vec<IpAddr>,
}

/// The rendezvous `launcher` (as [`crate::LaunchEnv::launcher`] names it) implies, or
/// `None` when it implies none (PMI, braid's own variables, a singleton).
pub fn launcher_root(
    launcher: &str,
    get: &impl Fn(&str) -> Option<String>,
) -> Result<Option<LauncherRoot>, BootError> {
    let bad = BootError::BadEnv;
    match launcher {
        "open-mpi" => {
            let Some(uri) = get(OMPI_HNP_URI_ENV) else {
                return Ok(None);
            };
            let (ips, _daemon_port) =
                parse_hnp_uri(&uri).map_err(|m| bad(format!("{OMPI_HNP_URI_ENV}={uri}: {m}")))?;
            let job = get(OMPI_JOBID_ENV).unwrap_or_default();
            let port = hashed_port(&job);
            let root = ips
                .iter()
                .map(|ip| match ip {
                    IpAddr::V4(a) => format!("{a}:{port}"),
                    IpAddr::V6(a) => format!("[{a}]:{port}"),
                })
                .collect::<Vec<_>>()
                .join(",");
            Ok(Some(LauncherRoot {
                root,
                source: format!("mpirun's host ({OMPI_HNP_URI_ENV})"),
                hnp_ips: ips,
            }))
        }
        "slurm" => {
            let Some((var, list)) = SLURM_NODELIST_VARS
                .iter()
                .find_map(|v| get(v).filter(|l| !l.trim().is_empty()).map(|l| (*v, l)))
            else {
                return Ok(None);
            };
            let host = hostlist::first(&list).map_err(|e| bad(format!("{var}: {e}")))?;
            let number = |v: &str| get(v).and_then(|s| s.trim().parse::<u64>().ok());
            let port = match number("SLURM_JOB_ID").or_else(|| number("SLURM_JOBID")) {
                Some(job) => slurm_port(job, number("SLURM_STEP_ID").unwrap_or(0)),
                None => hashed_port(""),
            };
            Ok(Some(LauncherRoot {
                root: format!("{host}:{port}"),
                source: format!("the first host of {var}"),
                hnp_ips: Vec::new(),
            }))
        }
        _ => Ok(None),
    }
}

/// The addresses and port of an Open MPI contact URI. IPv4 addresses come first (in their
/// order), then IPv6.
pub fn parse_hnp_uri(uri: &str) -> Result<(Vec<IpAddr>, u16), String> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    let mut port = None;
    for part in uri.split(';').skip(1) {
        let part = part.trim();
        let (list, p) = if let Some(rest) = part.strip_prefix("tcp://") {
            rest.rsplit_once(':')
                .ok_or("a tcp:// address without a port")?
        } else if let Some(rest) = part.strip_prefix("tcp6://") {
            let (l, p) = rest
                .rsplit_once("]:")
                .ok_or("a tcp6:// address without [address]:port")?;
            (l, p)
        } else {
            continue; // another transport (usock, ...): not reachable from other hosts
        };
        let p: u16 = p.parse().map_err(|_| format!("bad port {p:?}"))?;
        for ip in list.split(',') {
            let ip = ip.trim().trim_start_matches('[').trim_end_matches(']');
            match ip.parse::<IpAddr>() {
                Ok(a @ IpAddr::V4(_)) => v4.push(a),
                Ok(a @ IpAddr::V6(_)) => v6.push(a),
                Err(_) => return Err(format!("{ip:?} is not an IP address")),
            }
        }
        port.get_or_insert(p);
    }
    let port = port.ok_or("no tcp:// or tcp6:// address")?;
    v4.extend(v6);
    Ok((v4, port))
}

/// Rank 0 serves the rendezvous: under Open MPI without `BRAID_ROOT` it must run on
/// `mpirun`'s host, i.e. hold one of `hnp_ips` among its `local` addresses.
pub fn check_rank0_host(
    root: &LauncherRoot,
    local: &[IpAddr],
    hostname: &str,
) -> Result<(), BootError> {
    if root.hnp_ips.is_empty() || root.hnp_ips.iter().any(|ip| local.contains(ip)) {
        return Ok(());
    }
    Err(BootError::BadEnv(format!(
        "BRAID_ROOT is not set, so the rendezvous is {} at {}, but rank 0 runs on another \
         host ({hostname}): start mpirun on the first host of --host, or pass \
         -x BRAID_ROOT=HOST:PORT naming rank 0's host",
        root.source, root.root
    )))
}

/// Slurm's port: `job*8 + step`, so steps 0-7 of one job and jobs started close together
/// differ.
fn slurm_port(job: u64, step: u64) -> u16 {
    let n = job.wrapping_mul(8).wrapping_add(step % 8);
    ROOT_PORT_BASE + (n % u64::from(ROOT_PORT_SPAN)) as u16
}

/// A port from a job id string (FNV-1a), for launchers whose ids are not sequential.
fn hashed_port(job: &str) -> u16 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in job.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    ROOT_PORT_BASE + (h % u64::from(ROOT_PORT_SPAN)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    /// As `mpirun -n 2 env` printed them under Open MPI 4.1.4 (Debian 12): on one host, and
    /// across two testbed hosts (each with two rails).
    #[test]
    fn open_mpi_recorded() {
        let one_host = vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "1209401345"),
            (
                "OMPI_MCA_orte_hnp_uri",
                "1209401344.0;tcp://192.0.2.2:48143;tcp6://[fd00::2]:39183",
            ),
            ("PMIX_SERVER_URI4", "1209401344.0;tcp4://127.0.0.1:53469"),
        ]);
        let r = launcher_root("open-mpi", &one_host).unwrap().unwrap();
        let port = hashed_port("1209401345");
        assert_eq!(r.root, format!("192.0.2.2:{port},[fd00::2]:{port}"));
        assert!((ROOT_PORT_BASE..ROOT_PORT_BASE + ROOT_PORT_SPAN).contains(&port));
        let testbed = vars(&[
            ("OMPI_MCA_ess_base_jobid", "1261830145"),
            (
                "OMPI_MCA_orte_hnp_uri",
                "1261830144.0;tcp://198.18.0.1,198.18.1.1:55173",
            ),
        ]);
        let r = launcher_root("open-mpi", &testbed).unwrap().unwrap();
        let port = hashed_port("1261830145");
        assert_eq!(r.root, format!("198.18.0.1:{port},198.18.1.1:{port}"));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(r.hnp_ips, [ip("198.18.0.1"), ip("198.18.1.1")]);
        // Rank 0 on mpirun's host passes; elsewhere it is told what to do.
        check_rank0_host(&r, &[ip("127.0.0.1"), ip("198.18.1.1")], "h0").unwrap();
        let e = check_rank0_host(&r, &[ip("198.18.0.2")], "h1").unwrap_err();
        assert!(
            e.to_string().contains("rank 0 runs on another host (h1)"),
            "{e}"
        );
        assert!(e.to_string().contains("-x BRAID_ROOT"), "{e}");
        // Two mpiruns get (almost always) different ports.
        assert_ne!(hashed_port("1261830145"), hashed_port("1209401345"));
        // Without the URI (an older Open MPI, a singleton) nothing is implied.
        assert_eq!(launcher_root("open-mpi", &vars(&[])).unwrap(), None);
    }

    #[test]
    fn hnp_uri_forms() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            parse_hnp_uri("1.0;tcp6://[fd00::2],[fd00::3]:7;tcp://10.0.0.1:8").unwrap(),
            (vec![ip("10.0.0.1"), ip("fd00::2"), ip("fd00::3")], 7)
        );
        assert_eq!(
            parse_hnp_uri("1.0;usock;tcp://10.0.0.1:8").unwrap(),
            (vec![ip("10.0.0.1")], 8)
        );
        for bad in [
            "",
            "1.0",
            "1.0;usock",
            "1.0;tcp://10.0.0.1",
            "1.0;tcp://host:5",
            "1.0;tcp://10.0.0.1:99999",
            "1.0;tcp6://fd00::2:5",
        ] {
            assert!(parse_hnp_uri(bad).is_err(), "{bad:?}");
        }
        let e = launcher_root(
            "open-mpi",
            &vars(&[("OMPI_MCA_orte_hnp_uri", "1.0;tcp://x:1")]),
        );
        assert!(matches!(e, Err(BootError::BadEnv(m)) if m.contains("OMPI_MCA_orte_hnp_uri")));
    }

    /// As `srun -N 2 -n 4` sets them (Slurm 23): the step's node list wins over the job's.
    #[test]
    fn slurm_recorded() {
        let srun = vars(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "1"),
            ("SLURM_JOB_NODELIST", "cn[01-04,07]"),
            ("SLURM_STEP_NODELIST", "cn[03-04]"),
            ("SLURM_NODELIST", "cn[01-04,07]"),
        ]);
        let r = launcher_root("slurm", &srun).unwrap().unwrap();
        assert_eq!(
            r.root,
            format!("cn03:{}", ROOT_PORT_BASE + (4242 * 8 + 1) % 2048)
        );
        assert!(r.source.contains("SLURM_STEP_NODELIST"), "{}", r.source);
        // Steps of one job and consecutive jobs get distinct ports.
        let ports: std::collections::HashSet<u16> = (4240..4250)
            .flat_map(|j| (0..4).map(move |s| slurm_port(j, s)))
            .collect();
        assert_eq!(ports.len(), 40);
        let job_only = vars(&[("SLURM_JOB_NODELIST", "gpu7,gpu9"), ("SLURM_JOB_ID", "9")]);
        let r = launcher_root("slurm", &job_only).unwrap().unwrap();
        assert_eq!(r.root, format!("gpu7:{}", ROOT_PORT_BASE + 72));
        let bad = vars(&[("SLURM_STEP_NODELIST", "cn[03-")]);
        assert!(launcher_root("slurm", &bad).is_err());
        assert_eq!(launcher_root("slurm", &vars(&[])).unwrap(), None);
        assert_eq!(launcher_root("pmi", &srun).unwrap(), None);
    }
}
