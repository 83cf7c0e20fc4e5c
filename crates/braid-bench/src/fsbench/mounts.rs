//! FUSE mounts made in a testbed host's network namespace but visible to the whole machine.
//!
//! `ip netns exec` gives its command a private mount namespace as well, so a FUSE mount made
//! under it is invisible outside; `nsenter --net=/run/netns/NS` joins only the network
//! namespace, and the mount lands in ours.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::procs;

/// A command that runs `program` in network namespace `ns` only (mounts stay visible).
pub fn nsenter_net(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{ns}")).arg(program);
    c
}

/// The file system type of the mount at `path`, if `path` is a mount point
/// (`/proc/self/mountinfo`).
pub fn mount_type(path: &Path) -> Option<String> {
    let want = path.to_str()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let dash = f.iter().position(|x| *x == "-")?;
        (f.get(4)? == &want).then(|| f.get(dash + 1).map(|s| s.to_string()))?
    })
}

/// Waits until a FUSE file system is mounted at `path`, while `child` (the process that
/// mounts it, in the foreground) is still running; an exit of the child first is an error
/// carrying what it printed.
pub fn wait_mounted(child: &mut Child, path: &Path, limit: Duration, what: &str) -> Result<()> {
    let mut exited = None;
    let r = procs::wait_until(limit, &format!("{what} at {}", path.display()), || {
        if let Ok(Some(st)) = child.try_wait() {
            exited = Some(st);
            return true;
        }
        mount_type(path).is_some_and(|t| t.starts_with("fuse"))
    });
    if let Some(st) = exited {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        bail!("{what} exited ({st}) before mounting: {}", err.trim());
    }
    r
}

/// Unmounts a FUSE mount: `fusermount3 -u`, falling back to a lazy `umount -l` so that a dead
/// file system daemon cannot leave the mount point hanging.
pub fn unmount(path: &Path) -> Result<()> {
    if mount_type(path).is_none() {
        return Ok(());
    }
    let ok = Command::new("fusermount3")
        .arg("-u")
        .arg(path)
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok && mount_type(path).is_none() {
        return Ok(());
    }
    let st = Command::new("umount")
        .arg("-l")
        .arg(path)
        .status()
        .context("running umount -l")?;
    if !st.success() && mount_type(path).is_some() {
        bail!("cannot unmount {}", path.display());
    }
    Ok(())
}

/// A temporary directory on the real file system (not tmpfs), removed on drop after
/// unmounting anything still mounted under it.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Makes `PARENT/PREFIX-<pid>-<n>` (pass a disk-backed parent such as `/var/tmp` where
    /// the contents must reach a disk: `/tmp` may be tmpfs).
    pub fn new_in(parent: &Path, prefix: &str) -> Result<TempDir> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = parent.join(format!("{prefix}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Anything mounted below would make remove_dir_all walk into (or fail on) a mount.
        if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
            let prefix = format!("{}/", self.path.display());
            for l in info.lines() {
                if let Some(mp) = l.split(' ').nth(4)
                    && mp.starts_with(&prefix)
                {
                    let _ = unmount(Path::new(mp));
                }
            }
        }
        if let Err(e) = std::fs::remove_dir_all(&self.path) {
            eprintln!("braid: cannot remove {}: {e}", self.path.display());
        }
    }
}

/// File system type of the directory `path` lives on (`statfs`'s magic, named for the few
/// that matter here).
pub fn fs_kind(path: &Path) -> Result<&'static str> {
    let st = match rustix::fs::statfs(path) {
        Ok(st) => st,
        Err(e) => bail!("statfs {}: {}", path.display(), std::io::Error::from(e)),
    };
    Ok(match st.f_type {
        libc::TMPFS_MAGIC => "tmpfs",
        libc::EXT4_SUPER_MAGIC => "ext4",
        libc::XFS_SUPER_MAGIC => "xfs",
        libc::BTRFS_SUPER_MAGIC => "btrfs",
        libc::OVERLAYFS_SUPER_MAGIC => "overlay",
        libc::FUSE_SUPER_MAGIC => "fuse",
        _ => "other",
    })
}
