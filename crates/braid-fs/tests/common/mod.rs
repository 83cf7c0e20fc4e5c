//! Helpers shared by the mount tests: skip reasons, a loopback server, a mount guard.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use braid::{Context, RailAddr};
use braid_fs::client::{Client, ClientConfig};
use braid_fs::mount::{Mount, MountConfig, mount};
use braid_fs::server::{Server, ServerConfig, Squash};

/// Why FUSE mounts cannot be tested here, if they cannot.
pub fn fuse_skip_reason() -> Option<String> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("SKIPPED: FUSE mount tests need root".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("SKIPPED: /dev/fuse unavailable: {e}"));
    }
    None
}

/// Skips the calling test (returns from it) with a printed reason when FUSE is unavailable.
#[macro_export]
macro_rules! require_fuse {
    () => {
        if let Some(why) = common::fuse_skip_reason() {
            eprintln!("{why}");
            return;
        }
    };
}

/// An export directory with a server on loopback rails.
pub struct Loopback {
    pub dir: tempfile::TempDir,
    pub server: Option<Server>,
    pub rails: Vec<RailAddr>,
}

impl Loopback {
    pub fn new(rails: usize) -> Loopback {
        Loopback::with_config(rails, |_| {})
    }

    /// As [`Loopback::new`], with the server's configuration changed by `tweak`.
    pub fn with_config(rails: usize, tweak: impl FnOnce(&mut ServerConfig)) -> Loopback {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("export")).unwrap();
        let ctx = Context::new().unwrap();
        let listen = (0..rails)
            .map(|i| format!("127.0.0.{}:0", i + 1).parse().unwrap())
            .collect();
        let mut cfg = ServerConfig::new(dir.path().join("export"), listen);
        // The tests run as root and own the export: trust root, as NFS's no_root_squash.
        cfg.squash = Squash::None;
        tweak(&mut cfg);
        let server = Server::start(&ctx, cfg).unwrap();
        let rails = server
            .local_addrs()
            .iter()
            .map(|a| format!("{}={a}", a.ip()).parse().unwrap())
            .collect();
        Loopback {
            dir,
            server: Some(server),
            rails,
        }
    }

    pub fn export(&self) -> PathBuf {
        self.dir.path().join("export")
    }

    /// A new client mounted at `<tmp>/<name>`.
    pub fn mount(&self, name: &str, tweak: impl FnOnce(&mut MountConfig)) -> Mount {
        mount_rails(&self.rails, &self.dir.path().join(name), tweak)
    }

    /// A mount whose calls fail once the server has been unreachable for `soft` (by default
    /// they wait for it to come back).
    #[allow(dead_code)] // Not every test binary uses it.
    pub fn mount_soft(
        &self,
        name: &str,
        soft: Duration,
        tweak: impl FnOnce(&mut MountConfig),
    ) -> Mount {
        let at = self.dir.path().join(name);
        connect_and_mount(&self.rails, &at, Some(soft), tweak)
    }
}

/// Connects a client over `rails` and mounts it at `at` (created if missing).
pub fn mount_rails(rails: &[RailAddr], at: &Path, tweak: impl FnOnce(&mut MountConfig)) -> Mount {
    connect_and_mount(rails, at, None, tweak)
}

fn connect_and_mount(
    rails: &[RailAddr],
    at: &Path,
    soft: Option<Duration>,
    tweak: impl FnOnce(&mut MountConfig),
) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    let ctx = Context::new().unwrap();
    let mut cfg = ClientConfig::new(rails.to_vec());
    cfg.session.peer_timeout = Duration::from_secs(2);
    cfg.reconnect_timeout = soft;
    let client = Client::connect(&ctx, &cfg).unwrap();
    let mut mc = MountConfig::new(at);
    mc.buffers = 16;
    tweak(&mut mc);
    mount(client, mc).unwrap()
}

/// Deterministic bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed.wrapping_mul(0x9E37_79B9)) as u8)
        .collect()
}
