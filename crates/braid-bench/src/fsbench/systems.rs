//! Mounted file services on a testbed, as the bench and the POSIX suite use them: server in
//! host 1 exporting a directory, mount in host 0's network namespace (visible to us).

use std::any::Any;
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::braidfs::{self, BraidMount, BraidServer};
use super::procs::Side;
use super::sshfs::{SshServer, SshfsMount};
use braid_testbed::testbed::Testbed;

/// Private port of the sshd (inside the server's namespace).
pub const SSHD_PORT: u16 = 2222;

/// A running file service with its mount; dropping it unmounts and ends its processes.
pub struct Service {
    /// "sshfs" or "braid-mount".
    pub system: &'static str,
    /// Rails it uses.
    pub rails: usize,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// The client's processes (FUSE daemon and helpers).
    pub client: Side,
    /// The server's processes.
    pub server: Side,
    // sshfs: (mount, server), dropped in that order; braid: the mount (its server is shared).
    _guards: Box<dyn Any>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("system", &self.system)
            .field("rails", &self.rails)
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// sshfs of `export` (sshd in host 1 on rail 0's address), mounted at `tmp/mnt-sshfs-TAG`,
/// keys in `tmp/ssh-TAG`; `extra` are further `-o` options.
pub fn start_sshfs(
    tb: &Testbed,
    tmp: &Path,
    export: &Path,
    tag: &str,
    extra: &[&str],
) -> Result<Service> {
    let dir = tmp.join(format!("ssh-{tag}"));
    std::fs::create_dir_all(&dir)?;
    let rail0 = tb.rail_addrs(0, 1)[0];
    let server = SshServer::start(&tb.host_ns(1), rail0.1, SSHD_PORT, &dir)?;
    let mnt = tmp.join(format!("mnt-sshfs-{tag}"));
    std::fs::create_dir_all(&mnt)?;
    let m = SshfsMount::mount(&tb.host_ns(0), &server, export, &mnt, extra)?;
    Ok(Service {
        system: "sshfs",
        rails: 1,
        mountpoint: mnt,
        client: m.side(),
        server: server.side(),
        _guards: Box::new((m, server)),
    })
}

/// A `braid fs serve` of `export` in host 1, listening on every rail, with this run's secret.
pub struct BraidFs {
    /// The server process.
    pub server: BraidServer,
    /// The cluster secret its clients need.
    pub secret: String,
}

/// Starts `braid fs serve` (the binary `exe`) in host 1 on every rail of `tb`; its log is
/// `tmp/braid-serve-TAG.log`.
pub fn start_braid_server(
    exe: &Path,
    tb: &Testbed,
    tmp: &Path,
    export: &Path,
    tag: &str,
) -> Result<BraidFs> {
    let secret = braidfs::random_secret()?;
    let addrs: Vec<_> = tb.rail_addrs(0, 1).into_iter().map(|p| p.1).collect();
    let server = BraidServer::start(
        exe,
        &tb.host_ns(1),
        export,
        &addrs,
        &secret,
        &tmp.join(format!("braid-serve-{tag}.log")),
    )?;
    Ok(BraidFs { server, secret })
}

/// `braid fs mount` of `fs` over its first `rails` rails, at `tmp/mnt-braid-TAG`, with
/// further mount options `extra`.
pub fn start_braid_mount(
    exe: &Path,
    tb: &Testbed,
    fs: &BraidFs,
    tmp: &Path,
    rails: usize,
    tag: &str,
    extra: &[&str],
) -> Result<Service> {
    let pairs: Vec<_> = tb.rail_addrs(0, 1).into_iter().take(rails).collect();
    let mnt = tmp.join(format!("mnt-braid-{tag}"));
    std::fs::create_dir_all(&mnt)?;
    let m = BraidMount::mount(
        exe,
        &tb.host_ns(0),
        &pairs,
        &mnt,
        &fs.secret,
        &tmp.join(format!("braid-mount-{tag}.log")),
        extra,
    )
    .map_err(|e| anyhow::anyhow!("{e:#}; the server said: {}", fs.server.log_text().trim()))?;
    Ok(Service {
        system: "braid-mount",
        rails,
        mountpoint: mnt,
        client: m.side(),
        server: fs.server.side(),
        _guards: Box::new(m),
    })
}
