//! `braid fs serve` and `braid fs mount`: the remote file service (crates/braid-fs).
//!
//! Both stay in the foreground until SIGINT or SIGTERM, like `sshfs -f`; the mount also ends
//! when it is unmounted from outside (`umount`, `fusermount3 -u`).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use clap::{Args, Subcommand};

use braid_fs::client::{Client, ClientConfig};
use braid_fs::mount::{MountConfig, mount};
use braid_fs::server::{Server, ServerConfig, Squash};
use braid_testbed::parse::{self, RailSpec};

/// The file service's subcommands.
#[derive(Subcommand, Debug)]
pub enum FsCmd {
    /// Export a directory to braid-fs clients (foreground until SIGINT/SIGTERM).
    Serve(ServeArgs),
    /// Mount a braid-fs export with FUSE (foreground until SIGINT/SIGTERM or unmounted).
    Mount(MountArgs),
}

/// `braid fs serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// The directory to export; nothing outside it is reachable.
    #[arg(long)]
    export: PathBuf,
    /// Addresses to listen on, IP[:PORT] (default port 18515), one per rail.
    #[arg(long, value_name = "IP[:PORT],...", value_parser = parse::parse_addrs)]
    listen: std::vec::Vec<std::net::SocketAddrV4>,
    /// Refuse every change (EROFS) and register file pages read-only.
    #[arg(long)]
    read_only: bool,
    /// Let clients create block and character device nodes (never opened for data by the
    /// server either way). Off: such a mknod fails with EPERM, as on an NFS `nodev` export.
    #[arg(long)]
    allow_devices: bool,
    /// Keep set-user-id bits (and set-group-id bits of files) that clients set. Off: they
    /// are cleared, as an NFS `nosuid` export makes them meaningless.
    #[arg(long)]
    allow_setuid: bool,
    /// Threads carrying out requests.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Microseconds an idle worker busy-polls before sleeping.
    #[arg(long, value_name = "US", default_value_t = 20)]
    poll_spin_us: u64,
    /// Trust client root (NFS no_root_squash). By default a caller with uid 0 (group 0)
    /// acts as the anonymous user (group).
    #[arg(long, conflicts_with = "all_squash")]
    no_root_squash: bool,
    /// Every caller acts as the anonymous user and group (NFS all_squash).
    #[arg(long)]
    all_squash: bool,
    /// The anonymous user squashed callers act as.
    #[arg(long, default_value_t = braid_fs::server::ANON_ID)]
    anon_uid: u32,
    /// The anonymous group squashed callers act as.
    #[arg(long, default_value_t = braid_fs::server::ANON_ID)]
    anon_gid: u32,
    /// Serve on non-loopback addresses without a cluster secret (no authentication: anyone
    /// who reaches the port is served). As BRAID_INSECURE=1; prints a warning.
    #[arg(long)]
    insecure: bool,
}

/// `braid fs mount`.
#[derive(Args, Debug)]
pub struct MountArgs {
    /// Rails: LOCAL=REMOTE[:PORT][,...], as for `braid bench`.
    #[arg(long, value_name = "LOCAL=REMOTE[:PORT],...", value_parser = parse::parse_rails)]
    rails: std::vec::Vec<RailSpec>,
    /// Seconds the kernel caches attributes.
    #[arg(long, default_value_t = 1.0)]
    attr_timeout: f64,
    /// Seconds the kernel caches names.
    #[arg(long, default_value_t = 1.0)]
    entry_timeout: f64,
    /// Seconds a name missing from a listing of its directory is answered "no such name"
    /// without asking the server (0: never). Saves the lookup before each create of a new
    /// name; another client's new name may stay hidden that long, even from an open.
    #[arg(long, default_value_t = 0.0)]
    negative_timeout: f64,
    /// Seconds to try connecting again after the server was lost before a call fails with
    /// an error (NFS's `soft`); 0, the default: for as long as it takes (NFS's `hard`).
    #[arg(long = "peer-timeout", value_name = "SECS", default_value_t = 0.0)]
    peer_timeout: f64,
    /// fsync on the server at every close (not only at fsync).
    #[arg(long)]
    sync_on_close: bool,
    /// Let other users use the mount (allow_other).
    #[arg(long)]
    allow_other: bool,
    /// Leave every permission check to the server (no default_permissions): to test the
    /// server's enforcement alone; access(2) then always succeeds.
    #[arg(long)]
    no_default_permissions: bool,
    /// Read-ahead of the mount in KiB.
    #[arg(long, default_value_t = 8192)]
    readahead_kib: u32,
    /// Microseconds the completion thread busy-polls before sleeping.
    #[arg(long, value_name = "US", default_value_t = 20)]
    poll_spin_us: u64,
    /// Microseconds a thread that sent a kernel request to the server polls for the reply
    /// (yielding the CPU between polls) before leaving it to the completion thread (0: never).
    #[arg(long, default_value_t = 300)]
    reply_spin_us: u64,
    /// Threads reading /dev/fuse.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Write-only opens go through the kernel's page cache too (by default they bypass it
    /// with FOPEN_DIRECT_IO, saving a copy of every byte written).
    #[arg(long)]
    cached_writes: bool,
    /// Where to mount.
    mountpoint: PathBuf,
}

/// Runs a `braid fs` subcommand.
pub fn run(cmd: FsCmd) -> Result<()> {
    match cmd {
        FsCmd::Serve(a) => serve(&a),
        FsCmd::Mount(a) => mount_cmd(&a),
    }
}

/// SIGINT or SIGTERM seen.
fn signal_flag() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, flag.clone()).context("installing signal handlers")?;
    }
    Ok(flag)
}

fn timeout(s: f64, what: &str) -> Result<Duration> {
    if !(0.0..=86_400.0).contains(&s) {
        bail!("{what} must be between 0 and 86400 seconds");
    }
    Ok(Duration::from_secs_f64(s))
}

fn serve(a: &ServeArgs) -> Result<()> {
    if a.listen.is_empty() {
        bail!("--listen needs at least one address");
    }
    let stop = signal_flag()?;
    let mut ccfg = braid::ContextConfig::from_env()?;
    ccfg.insecure |= a.insecure;
    let ctx = braid::Context::with_config(ccfg)?;
    let mut cfg = ServerConfig::new(&a.export, a.listen.iter().map(|s| (*s).into()).collect());
    cfg.read_only = a.read_only;
    cfg.policy = braid_fs::server::ExportPolicy {
        allow_devices: a.allow_devices,
        allow_setuid: a.allow_setuid,
    };
    cfg.workers = a.workers.clamp(1, 64);
    cfg.poll_spin = Duration::from_micros(a.poll_spin_us.min(100_000));
    cfg.squash = match (a.no_root_squash, a.all_squash) {
        (_, true) => Squash::All,
        (true, false) => Squash::None,
        (false, false) => Squash::Root,
    };
    (cfg.anon_uid, cfg.anon_gid) = (a.anon_uid, a.anon_gid);
    let squash = cfg.squash;
    let server = Server::start(&ctx, cfg)?;
    let addrs: Vec<String> = server.local_addrs().iter().map(|s| s.to_string()).collect();
    let acting = match (server.acts_as_callers(), squash) {
        (false, _) => format!(
            "as uid {} for every caller (not root: cannot act as the callers)",
            rustix::process::geteuid().as_raw()
        ),
        (true, Squash::None) => "as each caller, root trusted".into(),
        (true, Squash::Root) => format!("as each caller, root as {}:{}", a.anon_uid, a.anon_gid),
        (true, Squash::All) => format!("as {}:{} for every caller", a.anon_uid, a.anon_gid),
    };
    eprintln!(
        "braid fs: serving {} on {}{}, {acting} (SIGINT or SIGTERM stops)",
        a.export.display(),
        addrs.join(","),
        if a.read_only { ", read-only" } else { "" }
    );
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("braid fs: stopping");
    server.shutdown();
    Ok(())
}

fn mount_cmd(a: &MountArgs) -> Result<()> {
    let stop = signal_flag()?;
    let ctx = braid::Context::new()?;
    let rails = a
        .rails
        .iter()
        .map(|r| braid::RailAddr::new(Some(r.local.into()), r.remote_sa()))
        .collect();
    let mut ccfg = ClientConfig::new(rails);
    ccfg.poll_spin = Duration::from_micros(a.poll_spin_us.min(100_000));
    let soft = timeout(a.peer_timeout, "--peer-timeout")?;
    ccfg.reconnect_timeout = (!soft.is_zero()).then_some(soft);
    let client = Client::connect(&ctx, &ccfg).context("connecting to the server")?;
    let mut cfg = MountConfig::new(&a.mountpoint);
    cfg.attr_timeout = timeout(a.attr_timeout, "--attr-timeout")?;
    cfg.entry_timeout = timeout(a.entry_timeout, "--entry-timeout")?;
    cfg.negative_timeout = timeout(a.negative_timeout, "--negative-timeout")?;
    cfg.sync_on_close = a.sync_on_close;
    cfg.allow_other = a.allow_other;
    cfg.default_permissions = !a.no_default_permissions;
    cfg.readahead_kib = a.readahead_kib.max(4);
    cfg.threads = a.threads.clamp(1, 64);
    cfg.direct_writes = !a.cached_writes;
    cfg.poll_spin = Duration::from_micros(a.reply_spin_us.min(100_000));
    cfg.fsname = format!("braid-fs:{}", a.rails[0].remote);
    let m = mount(client, cfg)?;
    eprintln!(
        "braid fs: mounted {} on {} over {} rail(s) (SIGINT or SIGTERM unmounts)",
        a.rails[0].remote,
        a.mountpoint.display(),
        a.rails.len()
    );
    while !stop.load(Ordering::Acquire) && m.is_mounted() {
        std::thread::sleep(Duration::from_millis(100));
    }
    if m.is_mounted() {
        eprintln!("braid fs: unmounting {}", a.mountpoint.display());
    } else {
        // `umount` or `fusermount3 -u` from outside: the normal end of a FUSE mount.
        eprintln!(
            "braid fs: {} was unmounted; exiting",
            a.mountpoint.display()
        );
    }
    m.unmount().context("unmounting")?;
    Ok(())
}
