//! The FUSE mount (the `fuser` crate): the remote export as a local directory.
//!
//! Consistency (see `docs/FS.md`): attributes and names are cached by the kernel for
//! [`MountConfig::attr_timeout`] and [`MountConfig::entry_timeout`] (1 s by default); every
//! `open` asks the server for fresh attributes, and if the file changed since the kernel last
//! heard of it, the kernel's cached attributes and pages are dropped (close-to-open
//! consistency). Writes are acknowledged once copied into a registered buffer and go out as
//! one-sided writes; `close` (flush) waits for them and dates them on the server, `fsync`
//! also makes them durable there, and either reports a failed write.
//!
//! ```no_run
//! use braid_fs::client::{Client, ClientConfig};
//! use braid_fs::mount::{mount, MountConfig};
//! let ctx = braid::Context::new()?;
//! let client = Client::connect(&ctx, &ClientConfig::new(vec!["127.0.0.1=127.0.0.1:7100".parse()?]))?;
//! let m = mount(client, MountConfig::new("/mnt/remote"))?;
//! // ... until a signal:
//! m.unmount()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod caller;
mod dirview;
mod fs;
mod known;
mod pool;
mod shared;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, SessionACL};
use rustix::mount::UnmountFlags;

use crate::client::Client;
use fs::BraidFs;
use pool::Pool;

/// How a mount behaves.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// How long the kernel trusts cached attributes (default 1 s).
    pub attr_timeout: Duration,
    /// How long the kernel trusts cached names (default 1 s).
    pub entry_timeout: Duration,
    /// How long a name missing from a complete listing of its directory is answered "no
    /// such name" without the server (default zero: never; see `docs/FS.md`, "Names known
    /// absent from a view"). With it, a name another client makes may stay hidden here
    /// that long, even from an `open`; without it, only names this client removed are
    /// known absent (for the entry timeout).
    pub negative_timeout: Duration,
    /// `fsync` on the server at every close, not only at `fsync` (default off).
    pub sync_on_close: bool,
    /// Registered 1 MiB buffers for reads and writes in flight (default 64).
    pub buffers: usize,
    /// The mount's read-ahead in KiB (default 8192), set through
    /// `/sys/class/bdi/<dev>/read_ahead_kb` where allowed.
    pub readahead_kib: u32,
    /// Threads reading `/dev/fuse` (default 2).
    pub threads: usize,
    /// How long a thread that read a request from `/dev/fuse` and sent it to the server
    /// polls for the reply before leaving it to the client's completion thread (default
    /// 300 µs; zero: never). A reply read there reaches the kernel without waking the
    /// progress engine and the completion thread. The thread yields the CPU between polls:
    /// a pure spin slowed the metadata loop down on a loaded 2-core host, the yielding poll
    /// made it 1.4-1.5x faster (docs/FS-BENCH.md).
    pub poll_spin: Duration,
    /// Files opened write-only bypass the client's page cache (`FOPEN_DIRECT_IO`, default
    /// on): the kernel hands the writer's own pages to the mount instead of first copying
    /// them into its page cache, which a write-only descriptor can never read back or map.
    /// The kernel still drops cached pages of the ranges written, so readers on this host
    /// never see stale data; off, writes go through the page cache as for other opens.
    pub direct_writes: bool,
    /// Let other users access the mount (`allow_other`).
    pub allow_other: bool,
    /// The client's kernel checks permissions from its cached attributes before asking the
    /// server (`default_permissions`, default on). The server checks every request as its
    /// caller either way; off, it alone decides, as for a client that skips the kernel's
    /// checks (for testing that; `access(2)` then always succeeds).
    pub default_permissions: bool,
    /// The source shown in `/proc/mounts`.
    pub fsname: String,
}

impl MountConfig {
    /// Defaults for mounting at `mountpoint`.
    pub fn new(mountpoint: impl Into<PathBuf>) -> MountConfig {
        MountConfig {
            mountpoint: mountpoint.into(),
            attr_timeout: Duration::from_secs(1),
            entry_timeout: Duration::from_secs(1),
            negative_timeout: Duration::ZERO,
            sync_on_close: false,
            buffers: 64,
            readahead_kib: 8192,
            threads: 2,
            poll_spin: Duration::from_micros(300),
            direct_writes: true,
            allow_other: false,
            default_permissions: true,
            fsname: "braid-fs".into(),
        }
    }
}

/// Why a mount failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// `/dev/fuse` or the mount itself failed (not root and no `fusermount3`, ...).
    #[error("mounting {path}: {error}")]
    Mount {
        /// The mount point.
        path: PathBuf,
        /// Why (in the message, so not a `source()`).
        error: std::io::Error,
    },
    /// The buffers could not be registered.
    #[error("registering buffers: {0}")]
    Buffers(braid::Error),
}

// The cause is in the message, so it is not also the `source()`: a chain printed with
// `{:#}` would say it twice.
impl From<braid::Error> for MountError {
    fn from(e: braid::Error) -> Self {
        MountError::Buffers(e)
    }
}

/// Size of one buffer: the largest read or write the kernel sends (`max_read`/`max_write`).
pub const BUFFER_SIZE: usize = 1 << 20;

/// A live mount. [`Mount::unmount`] (or dropping it) unmounts.
pub struct Mount {
    mountpoint: PathBuf,
    unmounter: Option<fuser::SessionUnmounter>,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    /// The FUSE connection's number (`/sys/fs/fuse/connections/<n>`).
    conn: Option<u32>,
    shared: std::sync::Arc<shared::Shared>,
}

impl std::fmt::Debug for Mount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mount")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// Mounts `client`'s export at `cfg.mountpoint` and serves it on background threads.
pub fn mount(client: Client, cfg: MountConfig) -> Result<Mount, MountError> {
    let pool = Pool::new(client.context(), cfg.buffers.max(2), BUFFER_SIZE)?;
    let read_only = client.read_only();
    let fs = BraidFs::new(client, &cfg, pool);
    let shared = fs.shared.clone();
    let mut options = vec![
        MountOption::FSName(cfg.fsname.clone()),
        MountOption::Subtype("braid".into()),
        MountOption::CUSTOM(format!("max_read={BUFFER_SIZE}")),
    ];
    if cfg.default_permissions {
        options.push(MountOption::DefaultPermissions);
    }
    options.push(if read_only {
        MountOption::RO
    } else {
        MountOption::RW
    });
    let mut config = Config::default();
    config.mount_options = options;
    config.acl = if cfg.allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(cfg.threads.max(1));
    config.clone_fd = true;
    let err = |error| MountError::Mount {
        path: cfg.mountpoint.clone(),
        error,
    };
    let mut session = fuser::Session::new(fs, &cfg.mountpoint, &config).map_err(err)?;
    *shared.notifier.lock() = Some(session.notifier());
    let unmounter = session.unmount_callable();
    let thread = std::thread::Builder::new()
        .name("braid-fs-fuse".into())
        .spawn(move || session.run())
        .map_err(err)?;
    // Only now: a stat of the mount point is a request the session must answer.
    let dev = std::fs::metadata(&cfg.mountpoint).ok().map(|m| m.dev());
    if let Some(dev) = dev {
        set_readahead(libc::major(dev), libc::minor(dev), cfg.readahead_kib);
    }
    let conn = dev.map(|d| libc::minor(d));
    tracing::info!(mountpoint = %cfg.mountpoint.display(), "mounted");
    Ok(Mount {
        mountpoint: cfg.mountpoint,
        unmounter: Some(unmounter),
        thread: Some(thread),
        conn,
        shared,
    })
}

fn set_readahead(major: u32, minor: u32, kib: u32) {
    let p = format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb");
    if let Err(e) = std::fs::write(&p, kib.to_string()) {
        tracing::debug!("setting {p}: {e} (the kernel's default read-ahead stays)");
    }
}

impl Mount {
    /// Where it is mounted.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Lookups answered "no such name" from a view of the directory, without the server
    /// (see docs/FS.md, "Names known absent").
    pub fn lookups_answered_absent(&self) -> u64 {
        self.shared
            .absent_from_views
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the connection to the server is up now (it is made again by itself when it
    /// fails; see docs/FS.md, "Server restart").
    pub fn server_connected(&self) -> bool {
        self.shared.client.current().is_connected()
    }

    /// How many times the mount connected to the server again after losing it.
    pub fn reconnects(&self) -> u64 {
        self.shared.client.reconnects()
    }

    /// False once the session ended (unmounted, also from outside with `umount`).
    pub fn is_mounted(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Unmounts: unmounts (lazily, `MNT_DETACH`, when the mount is busy), then waits up to
    /// 5 s for the session to end; if files are still open on it, aborts the FUSE
    /// connection (their operations fail with `ENOTCONN`) and waits up to 5 s more.
    pub fn unmount(mut self) -> std::io::Result<()> {
        self.stop()
    }

    fn stop(&mut self) -> std::io::Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        if let Some(mut u) = self.unmounter.take()
            && let Err(e) = u.unmount()
        {
            // Busy (a file still open there, or a process's working directory): detach it
            // all the same, so the name is free at once; the session ends when the last
            // user lets go, or at the abort below.
            tracing::warn!(
                "unmounting {}: {e}; detaching it",
                self.mountpoint.display()
            );
            if let Err(e) = rustix::mount::unmount(&self.mountpoint, UnmountFlags::DETACH) {
                tracing::warn!("detaching {}: {e}", self.mountpoint.display());
            }
        }
        if !wait_finished(&thread, Duration::from_secs(5)) {
            if let Some(n) = self.conn {
                abort_connection(n);
            }
            if !wait_finished(&thread, Duration::from_secs(5)) {
                tracing::warn!(
                    "the FUSE session of {} did not end; leaving it",
                    self.mountpoint.display()
                );
                return Ok(());
            }
        }
        match thread.join() {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::other("the FUSE session thread panicked")),
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!("unmounting {}: {e}", self.mountpoint.display());
        }
    }
}

/// Polls a thread's end (a bounded wait on a thread we cannot otherwise be told about).
fn wait_finished(t: &JoinHandle<std::io::Result<()>>, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !t.is_finished() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// Aborts FUSE connection `n` through fusectl (mounted if it is not, when allowed).
fn abort_connection(n: u32) {
    let dir = Path::new("/sys/fs/fuse/connections");
    if !dir.join(n.to_string()).exists() {
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(dir)
            .output();
    }
    if let Err(e) = std::fs::write(dir.join(n.to_string()).join("abort"), "1") {
        tracing::warn!("aborting FUSE connection {n}: {e}");
    }
}
