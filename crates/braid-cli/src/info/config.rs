//! Every environment variable braid reads, with what the reading library makes of it here:
//! the values in effect come from the libraries' own parsers (`LaunchEnv::from_env`,
//! `ContextConfig::from_env`, `RailTransport::from_env`, `DsmConfig::from_env`), so a value
//! they would refuse shows as refused. A test (tests/info.rs) checks that every `BRAID_*`
//! name in the sources is listed here.

use super::Setting;

/// Variables of test harnesses and examples, not of braid itself (tests/info.rs skips them).
pub const TEST_ONLY: &[&str] = &[
    "BRAID_BOOT_TEST_CHILD",
    "BRAID_DSM_SIM_SEED",
    "BRAID_DSM_SIM_SEEDS",
    "BRAID_EXAMPLE_SAME_HOST_PEER",
    "BRAID_REQUIRE_POSIX_SUITE",
    "BRAID_SIM_NO_FAILOVER",
    "BRAID_SIM_OVERLAP",
    "BRAID_SIM_SEED",
    "BRAID_SIM_SEEDS",
    "BRAID_SIM_TRACE",
    "BRAID_TEST_CHILD_SENDER",
    "BRAID_TEST_CHILD_SERVER",
];

fn us(d: std::time::Duration) -> String {
    format!("{} us", d.as_micros())
}

/// Bytes, in GiB when whole.
fn gib(n: usize) -> String {
    if n.is_multiple_of(1 << 30) {
        format!("{} GiB", n >> 30)
    } else {
        format!("{n} bytes")
    }
}

fn on_off(b: bool) -> String {
    if b { "on" } else { "off" }.into()
}

/// One row: the value shown is masked for secrets.
fn row(
    name: &'static str,
    read_by: &'static str,
    default: impl Into<String>,
    effective: impl Into<String>,
    meaning: &'static str,
) -> Setting {
    let value = std::env::var_os(name).map(|v| {
        if name == braid::SECRET_ENV {
            "(set)".to_string()
        } else {
            v.to_string_lossy().into_owned()
        }
    });
    Setting {
        name,
        read_by,
        value,
        default: default.into(),
        effective: effective.into(),
        meaning,
    }
}

fn launch(defaults: &braid_boot::WorldOptions) -> Vec<Setting> {
    use braid_boot::{JOB_ENV, JOIN_TIMEOUT_ENV, RAILS_ENV, ROOT_ENV};
    const BOOT: &str = "braid-boot (World::join, libbraid_dsm)";
    let env = braid_boot::LaunchEnv::from_env();
    let default_join = defaults.join_timeout;
    let (rank, root, job, rails, join) = match &env {
        Ok(e) => (
            format!("rank {} of {} (from {})", e.rank, e.size, e.launcher),
            if e.root.is_empty() {
                "none (a job of one)".to_string()
            } else {
                e.root.clone()
            },
            e.job.clone(),
            match &e.rails {
                Some(r) => r
                    .iter()
                    .map(|s| s.ip.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
                None => "this host's interfaces".to_string(),
            },
            format!(
                "{:.1} s",
                e.join_timeout.unwrap_or(default_join).as_secs_f64()
            ),
        ),
        Err(e) => {
            let bad = format!("refused: {e}");
            (bad.clone(), bad.clone(), bad.clone(), bad.clone(), bad)
        }
    };
    vec![
        row(
            braid_boot::RANK_SIZE_VARS[3].1,
            BOOT,
            "0 (after OMPI_COMM_WORLD_*, PMI_*, SLURM_*)",
            rank.clone(),
            "this process's rank",
        ),
        row(
            braid_boot::RANK_SIZE_VARS[3].2,
            BOOT,
            "1",
            rank,
            "ranks in the job",
        ),
        row(
            ROOT_ENV,
            BOOT,
            "none",
            root,
            "rendezvous host:port[,host:port...] of rank 0",
        ),
        row(
            JOB_ENV,
            BOOT,
            "the launcher's job id, else `default`",
            job,
            "job identity (two jobs on one rendezvous are told apart)",
        ),
        row(
            RAILS_ENV,
            BOOT,
            "every non-loopback IPv4 address",
            rails,
            "local rail addresses IP[/PREFIX],...",
        ),
        row(
            JOIN_TIMEOUT_ENV,
            BOOT,
            format!("{:.1} s", default_join.as_secs_f64()),
            join,
            "bound on forming the group, seconds",
        ),
        row(
            "BRAID_LOCAL_RANK",
            "set by braid run (for the program)",
            "none",
            std::env::var("BRAID_LOCAL_RANK").unwrap_or_else(|_| "unset".into()),
            "rank among the job's ranks on this host",
        ),
        row(
            "BRAID_LOCAL_SIZE",
            "set by braid run (for the program)",
            "none",
            std::env::var("BRAID_LOCAL_SIZE").unwrap_or_else(|_| "unset".into()),
            "the job's ranks on this host",
        ),
    ]
}

fn braid_core(defaults: &braid_boot::WorldOptions) -> Vec<Setting> {
    const CTX: &str = "braid (Context::new)";
    let ctx = braid::ContextConfig::from_env();
    let (secret, threads, insecure) = match &ctx {
        Ok(c) => (
            match (&c.secret, std::env::var_os(braid::SECRET_ENV).is_some()) {
                (Some(_), true) => "rails authenticated (secret from BRAID_SECRET)".to_string(),
                (Some(_), false) => "rails authenticated (secret from the file)".to_string(),
                (None, _) => "rails not authenticated: listening on loopback only".to_string(),
            },
            c.engine_threads.to_string(),
            on_off(c.insecure),
        ),
        Err(e) => (
            format!("refused: {e}"),
            format!("refused: {e}"),
            format!("refused: {e}"),
        ),
    };
    let exchange = defaults.endpoint.page_exchange;
    let transport = format!("{:?}", braid::RailTransport::from_env()).to_lowercase();
    vec![
        row(
            braid::SECRET_ENV,
            CTX,
            "none",
            secret.clone(),
            "cluster secret: every rail handshake proves it (HMAC-SHA256)",
        ),
        row(
            braid::SECRET_FILE_ENV,
            CTX,
            "none",
            secret,
            "file holding the cluster secret (when BRAID_SECRET is unset)",
        ),
        row(
            braid::INSECURE_ENV,
            CTX,
            "off",
            insecure,
            "1: listen beyond loopback without a secret (one warning per process)",
        ),
        row(
            braid::ENGINE_THREADS_ENV,
            CTX,
            "1",
            threads,
            "progress threads of a context",
        ),
        row(
            braid::TRANSPORT_ENV,
            "braid (EndpointOptions::new)",
            "auto",
            transport,
            "auto (same-host rails on shared memory), tcp, or raw (AF_XDP)",
        ),
        row(
            braid::PAGE_EXCHANGE_ENV,
            "braid (EndpointOptions::new)",
            "on",
            on_off(exchange),
            "same-host rails map large page-aligned payloads instead of copying",
        ),
    ]
}

fn dsm() -> Vec<Setting> {
    use braid_dsm::{
        HOME_ENV, LOCKS_ENV, SLOTS_ENV, SPACE_ENV, SPIN_ENV, SPIN_WAIT_ENV, SPREAD_RAILS_ENV,
        USER_FAULTS_ONLY_ENV,
    };
    const DSM: &str = "braid-dsm (Dsm::join, libbraid_dsm)";
    let d = braid_dsm::DsmConfig::default();
    let c = braid_dsm::DsmConfig::from_env();
    let eff = |f: &dyn Fn(&braid_dsm::DsmConfig) -> String| match &c {
        Ok(c) => f(c),
        Err(e) => format!("refused: {e}"),
    };
    let policy = |p: braid_dsm::HomePolicy| format!("{p:?}").to_lowercase();
    vec![
        row(
            HOME_ENV,
            DSM,
            policy(d.home),
            eff(&|c| policy(c.home)),
            "home policy of allocations: block or cyclic",
        ),
        row(
            SPACE_ENV,
            DSM,
            gib(d.space),
            eff(&|c| gib(c.space)),
            "shared address range reserved in every rank",
        ),
        row(
            LOCKS_ENV,
            DSM,
            d.locks.to_string(),
            eff(&|c| c.locks.to_string()),
            "number of global locks",
        ),
        row(
            SLOTS_ENV,
            DSM,
            d.slots.to_string(),
            eff(&|c| c.slots.to_string()),
            "page requests in flight per rank",
        ),
        row(
            SPIN_ENV,
            DSM,
            us(d.spin),
            eff(&|c| us(c.spin)),
            "service thread polling after activity, microseconds",
        ),
        row(
            SPIN_WAIT_ENV,
            DSM,
            us(d.spin_wait),
            eff(&|c| us(c.spin_wait)),
            "polling while a request is in flight, microseconds",
        ),
        row(
            USER_FAULTS_ONLY_ENV,
            DSM,
            on_off(d.user_faults_only),
            eff(&|c| on_off(c.user_faults_only)),
            "accept a userfaultfd for user-mode faults only",
        ),
        row(
            SPREAD_RAILS_ENV,
            DSM,
            on_off(d.spread_rails),
            eff(&|c| on_off(c.spread_rails)),
            "spread concurrent page transfers over every rail",
        ),
        row(
            "BRAID_DSM_TRACE",
            "braid-dsm built with feature fault-trace",
            "none",
            std::env::var("BRAID_DSM_TRACE")
                .map(|p| format!("{p}.RANK"))
                .unwrap_or_else(|_| "no trace".into()),
            "path prefix of the fault-time trace files",
        ),
    ]
}

fn exs_and_log() -> Vec<Setting> {
    const EXS: &str = "libexs (ES-API)";
    let zc = std::env::var("BRAID_EXS_ZC_MIN")
        .ok()
        .map(|v| match v.parse::<usize>() {
            Ok(0) => "never zero-copy".to_string(),
            Ok(n) => format!("SEND_ZC from {n} bytes"),
            Err(_) => "not a number: ignored, never zero-copy".to_string(),
        })
        .unwrap_or_else(|| "never zero-copy".into());
    let spec = |n: &str| std::env::var(n).unwrap_or_else(|_| "unset".into());
    vec![
        row(
            "BRAID_EXS_ZC_MIN",
            EXS,
            "0 (never)",
            zc,
            "smallest send that uses io_uring SEND_ZC",
        ),
        row(
            "EXS_BRAID_RAILS",
            EXS,
            "none",
            spec("EXS_BRAID_RAILS"),
            "braid mode: rails to connect (exs_braid_attach with a NULL spec)",
        ),
        row(
            "EXS_BRAID_LISTEN",
            EXS,
            "none",
            spec("EXS_BRAID_LISTEN"),
            "braid mode: addresses to listen on (NULL spec)",
        ),
        row(
            "RUST_LOG",
            "the braid command (a library logs through its program's tracing subscriber)",
            "warn",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            "log filter (error, warn, info, debug, trace; per module: braid=debug)",
        ),
    ]
}

/// Every setting, in the order of the layers: launch, rails, DSM, ES-API, logging.
pub fn settings() -> Vec<Setting> {
    // The options a rank's World starts from: their defaults read the environment.
    let cq = braid::CompletionQueue::new(1);
    let defaults = braid_boot::WorldOptions::new(&cq);
    let mut v = launch(&defaults);
    v.extend(braid_core(&defaults));
    v.extend(dsm());
    v.extend(exs_and_log());
    v
}
