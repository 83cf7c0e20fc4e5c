//! `braid fs serve` and `braid fs mount` as the bench and the POSIX suite run them: the
//! server in the server host's namespace (`ip netns exec`), the mount from the client host's
//! network namespace only (`nsenter --net`, so the mount is visible to us), both in the
//! foreground with a per-run cluster secret, ended by pid.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::mounts::{self, nsenter_net};
use super::procs::{self, Side};

/// Port of the benchmark's file server on every rail address (inside the testbed).
pub const FS_PORT: u16 = 18620;

const START_LIMIT: Duration = Duration::from_secs(30);

/// A fresh random cluster secret (hex) for one run's server and clients.
pub fn random_secret() -> Result<String> {
    let mut b = [0u8; 32];
    match rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()) {
        Ok(n) if n == b.len() => {}
        Ok(n) => bail!("getrandom: {n} of {} bytes", b.len()),
        Err(e) => bail!("getrandom: {}", std::io::Error::from(e)),
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

fn listening(ns: &str, port: u16, count: usize) -> bool {
    Command::new("ip")
        .args(["netns", "exec", ns, "ss", "-Hltn"])
        .arg(format!("sport = :{port}"))
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count() >= count)
        .unwrap_or(false)
}

/// `braid fs serve --export DIR --listen A:P,...` in namespace `ns`.
#[derive(Debug)]
pub struct BraidServer {
    pid: u32,
    log: PathBuf,
}

impl BraidServer {
    /// Starts the server on `addrs` (port [`FS_PORT`]) and waits until every address listens.
    pub fn start(
        exe: &Path,
        ns: &str,
        export: &Path,
        addrs: &[Ipv4Addr],
        secret: &str,
        log: &Path,
    ) -> Result<BraidServer> {
        let listen: Vec<String> = addrs.iter().map(|a| format!("{a}:{FS_PORT}")).collect();
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(exe)
            .args(["fs", "serve", "--export"])
            .arg(export)
            .arg("--listen")
            .arg(listen.join(","))
            // The bench and the suites run as root, which owns the export and must act as
            // root there (the suites check root's powers): NFS's no_root_squash.
            .arg("--no-root-squash")
            // The suites test the semantics of a local file system, devices and set-user-id
            // bits included (the export's defaults are nodev,nosuid).
            .args(["--allow-devices", "--allow-setuid"])
            .env("BRAID_SECRET", secret)
            .env_remove("BRAID_SECRET_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log)?)
            .spawn()
            .context("starting braid fs serve")?;
        let server = BraidServer {
            pid: child.id(),
            log: log.to_owned(),
        };
        let mut exited = None;
        let r = procs::wait_until(START_LIMIT, "braid fs serve to listen", || {
            if let Ok(Some(st)) = child.try_wait() {
                exited = Some(st);
                return true;
            }
            listening(ns, FS_PORT, addrs.len())
        });
        if let Some(st) = exited {
            bail!("braid fs serve exited ({st}): {}", server.log_text().trim());
        }
        r?;
        std::mem::forget(child);
        Ok(server)
    }

    /// The server's processes.
    pub fn side(&self) -> Side {
        Side {
            roots: vec![self.pid],
            marker: None,
        }
    }

    /// What the server printed so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for BraidServer {
    fn drop(&mut self) {
        procs::end_process(self.pid, Duration::from_secs(5));
    }
}

/// `braid fs mount --rails L=R:P,... MOUNTPOINT` from namespace `ns`.
#[derive(Debug)]
pub struct BraidMount {
    pid: u32,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl BraidMount {
    /// Mounts over `rails` (local, remote) address pairs, with further `braid fs mount`
    /// options `extra`, and waits until the mount is there.
    pub fn mount(
        exe: &Path,
        ns: &str,
        rails: &[(Ipv4Addr, Ipv4Addr)],
        mountpoint: &Path,
        secret: &str,
        log: &Path,
        extra: &[&str],
    ) -> Result<BraidMount> {
        let spec: Vec<String> = rails
            .iter()
            .map(|(l, r)| format!("{l}={r}:{FS_PORT}"))
            .collect();
        let mut child = nsenter_net(ns, exe)
            .args(["fs", "mount", "--rails"])
            .arg(spec.join(","))
            .args(extra)
            .arg(mountpoint)
            .env("BRAID_SECRET", secret)
            .env_remove("BRAID_SECRET_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(log)?)
            .spawn()
            .context("starting braid fs mount")?;
        let m = BraidMount {
            pid: child.id(),
            mountpoint: mountpoint.to_owned(),
            log: log.to_owned(),
        };
        if let Err(e) = mounts::wait_mounted(&mut child, mountpoint, START_LIMIT, "braid fs mount")
        {
            bail!("{e:#}; it said: {}", m.log_text().trim());
        }
        std::mem::forget(child);
        Ok(m)
    }

    /// The client's processes (the FUSE daemon).
    pub fn side(&self) -> Side {
        Side {
            roots: vec![self.pid],
            marker: None,
        }
    }

    /// What the mount printed so far.
    pub fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for BraidMount {
    fn drop(&mut self) {
        // SIGTERM unmounts cleanly; the lazy unmount is the fallback for a stuck daemon.
        procs::end_process(self.pid, Duration::from_secs(5));
        if let Err(e) = mounts::unmount(&self.mountpoint) {
            eprintln!("braid: {e:#}");
        }
    }
}
