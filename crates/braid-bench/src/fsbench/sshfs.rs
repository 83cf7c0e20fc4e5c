//! The sshfs baseline: an sshd of our own in the server host's namespace (private port,
//! throwaway host and client keys in a temp dir, no change to the machine's ssh setup) and
//! `sshfs -o cache=no` mounted from the client host's network namespace, as a new user would
//! mount a remote directory.

use std::fs;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::mounts::{self, nsenter_net};
use super::procs::{self, Side};

/// Debian's paths of the OpenSSH server and its SFTP subsystem (`openssh-server`).
pub const SSHD: &str = "/usr/sbin/sshd";
/// SFTP server sshd runs for sshfs (Debian's default `Subsystem sftp`).
pub const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";

const START_LIMIT: Duration = Duration::from_secs(20);

/// Why the sshfs baseline cannot run here, if it cannot (missing tools).
pub fn unavailable() -> Option<String> {
    let mut missing = Vec::new();
    for (tool, pkg) in [
        (SSHD, "openssh-server"),
        (SFTP_SERVER, "openssh-server"),
        ("/usr/bin/ssh-keygen", "openssh-client"),
        ("/usr/bin/sshfs", "sshfs"),
        ("/usr/bin/fusermount3", "fuse3"),
        ("/usr/bin/nsenter", "util-linux"),
    ] {
        if !Path::new(tool).exists() {
            missing.push(format!("{tool} ({pkg})"));
        }
    }
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse".into());
    }
    (!missing.is_empty()).then(|| format!("missing {}", missing.join(", ")))
}

fn keygen(path: &Path) -> Result<()> {
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "braid-fsbench", "-f"])
        .arg(path)
        .output()
        .context("running ssh-keygen")?;
    if !out.status.success() {
        bail!(
            "ssh-keygen -f {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// An sshd of ours, listening in a testbed host's namespace; ended (by pid) on drop.
#[derive(Debug)]
pub struct SshServer {
    pid: u32,
    addr: Ipv4Addr,
    port: u16,
    dir: PathBuf,
}

impl SshServer {
    /// Starts `sshd -D -e` in namespace `ns` on `addr:port`, with keys and config in `dir`
    /// (private to this run; the caller removes it). Returns once sshd listens.
    pub fn start(ns: &str, addr: Ipv4Addr, port: u16, dir: &Path) -> Result<SshServer> {
        let host_key = dir.join("host_key");
        let client_key = dir.join("client_key");
        keygen(&host_key)?;
        keygen(&client_key)?;
        fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys"))?;
        let host_pub = fs::read_to_string(dir.join("host_key.pub"))?;
        fs::write(
            dir.join("known_hosts"),
            format!("[{addr}]:{port} {}", host_pub.trim()),
        )?;
        let config = dir.join("sshd_config");
        fs::write(
            &config,
            format!(
                "# braid fs bench: a throwaway sshd for the sshfs baseline\n\
                 Port {port}\nListenAddress {addr}\nHostKey {hk}\n\
                 AuthorizedKeysFile {dir}/authorized_keys\nPidFile {dir}/sshd.pid\n\
                 StrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 Subsystem sftp {SFTP_SERVER}\n",
                hk = host_key.display(),
                dir = dir.display(),
            ),
        )?;
        // sshd insists on its privilege-separation directory (Debian's service makes it at
        // boot); an empty root-owned directory, as that service leaves it.
        if !Path::new("/run/sshd").exists() {
            fs::create_dir_all("/run/sshd").context("creating /run/sshd")?;
        }
        let log = dir.join("sshd.log");
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, SSHD, "-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?)
            .spawn()
            .context("starting sshd")?;
        // `ip netns exec` execs the program, so the child is sshd itself.
        let server = SshServer {
            pid: child.id(),
            addr,
            port,
            dir: dir.to_owned(),
        };
        let mut exited = None;
        let r = procs::wait_until(START_LIMIT, "sshd to listen", || {
            if let Ok(Some(st)) = child.try_wait() {
                exited = Some(st);
                return true;
            }
            fs::read_to_string(&log).is_ok_and(|l| l.contains("Server listening"))
        });
        if let Some(st) = exited {
            bail!(
                "sshd exited ({st}): {}",
                fs::read_to_string(&log).unwrap_or_default().trim()
            );
        }
        r?;
        // The std handle is dropped without waiting; Drop ends and reaps the pid.
        std::mem::forget(child);
        Ok(server)
    }

    /// The server side's processes: sshd, its session processes and `sftp-server`.
    pub fn side(&self) -> Side {
        Side {
            roots: vec![self.pid],
            marker: None,
        }
    }

    /// The sshd log so far (connections, errors).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        procs::end_process(self.pid, Duration::from_secs(3));
    }
}

/// An `sshfs -f` mount (client side); unmounted, and its processes ended, on drop.
#[derive(Debug)]
pub struct SshfsMount {
    pid: u32,
    mountpoint: PathBuf,
    marker: String,
}

impl SshfsMount {
    /// Mounts `server`'s directory `remote` at `mountpoint` with `sshfs -o cache=no` (plus
    /// `extra` options), from network namespace `ns`. Only the keys and host identity are set
    /// beyond what a new user types; `-f` keeps sshfs in the foreground so it has a pid.
    pub fn mount(
        ns: &str,
        server: &SshServer,
        remote: &Path,
        mountpoint: &Path,
        extra: &[&str],
    ) -> Result<SshfsMount> {
        let dir = &server.dir;
        let key = dir.join("client_key");
        let log = dir.join(format!(
            "sshfs-{}.log",
            mountpoint
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("m")
        ));
        let mut cmd = nsenter_net(ns, "sshfs");
        cmd.args(["-f", "-F", "/dev/null", "-o", "cache=no"])
            .arg("-o")
            .arg(format!("port={}", server.port))
            .arg("-o")
            .arg(format!("IdentityFile={}", key.display()))
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.join("known_hosts").display()
            ))
            .args(["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]);
        for o in extra {
            cmd.args(["-o", o]);
        }
        cmd.arg(format!("root@{}:{}", server.addr, remote.display()))
            .arg(mountpoint)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log)?);
        let mut child = cmd.spawn().context("starting sshfs")?;
        let m = SshfsMount {
            pid: child.id(),
            mountpoint: mountpoint.to_owned(),
            marker: key.display().to_string(),
        };
        if let Err(e) = mounts::wait_mounted(&mut child, mountpoint, START_LIMIT, "sshfs") {
            bail!(
                "{e:#}; sshfs said: {}; sshd said: {}",
                fs::read_to_string(&log).unwrap_or_default().trim(),
                server.log().trim()
            );
        }
        std::mem::forget(child);
        Ok(m)
    }

    /// The client side's processes: sshfs and the `ssh` it forked (found by the key path on
    /// its command line, since sshfs double-forks it).
    pub fn side(&self) -> Side {
        Side {
            roots: vec![self.pid],
            marker: Some(self.marker.clone()),
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }
}

impl Drop for SshfsMount {
    fn drop(&mut self) {
        let others: Vec<u32> = self
            .side()
            .pids()
            .into_iter()
            .filter(|p| *p != self.pid)
            .collect();
        if let Err(e) = mounts::unmount(&self.mountpoint) {
            eprintln!("braid: {e:#}");
        }
        procs::end_process(self.pid, Duration::from_secs(3));
        // ssh ends when sshfs closes its pipe; end it by pid if it lingers.
        for p in others {
            procs::end_process(p, Duration::from_secs(2));
        }
    }
}
