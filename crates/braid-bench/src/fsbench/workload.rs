//! The measured workloads, each against a directory that may be a mount: sequential read and
//! write with `dd bs=1M` (as a user measures a file system), random 4 KiB reads and the
//! create + write(1 B) + close + stat + unlink loop, both in this process (a loop in Rust, so
//! process start-ups do not dominate).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::procs;

/// Steps of one metadata-loop iteration, as [`Measured::phases_us`] names them.
pub const META_PHASES: [&str; 5] = ["create", "write", "close", "stat", "unlink"];

/// Block of the read file's pattern (and of random reads).
pub const BLOCK: usize = 4096;

/// What one workload run measured, before the sides' CPU is added.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Payload bytes moved (0 for the metadata loop).
    pub bytes: u64,
    /// Operations: 1 MiB blocks for dd, reads for random reads, files for the metadata loop.
    pub ops: u64,
    /// Wall seconds of the measured part.
    pub seconds: f64,
    /// CPU seconds of the application (dd, or this process's measuring thread).
    pub app_cpu_s: f64,
    /// Per-operation latencies in µs (random reads and the metadata loop): median and p99.
    pub lat_us_median: Option<f64>,
    /// ... 99th percentile.
    pub lat_us_p99: Option<f64>,
    /// What was checked, and whether it held.
    pub check: String,
    /// Median µs of each step of one operation (the metadata loop's create, write, close,
    /// stat, unlink), to show where the time goes.
    pub phases_us: Vec<(String, f64)>,
}

/// Per-step latency samples of a loop; [`Phases::medians`] at the end.
#[derive(Debug, Default)]
pub struct Phases {
    names: Vec<&'static str>,
    samples: Vec<Vec<f64>>,
}

impl Phases {
    /// Steps named in order.
    pub fn new(names: &[&'static str]) -> Phases {
        Phases {
            names: names.to_vec(),
            samples: vec![Vec::new(); names.len()],
        }
    }

    /// Records one iteration: the instants between steps (`names.len() + 1` of them).
    pub fn record(&mut self, marks: &[Instant]) {
        for (i, w) in marks.windows(2).enumerate().take(self.names.len()) {
            self.samples[i].push(w[1].duration_since(w[0]).as_secs_f64() * 1e6);
        }
    }

    /// Median of each step.
    pub fn medians(mut self) -> Vec<(String, f64)> {
        self.names
            .iter()
            .zip(self.samples.iter_mut())
            .filter_map(|(n, v)| {
                v.sort_by(f64::total_cmp);
                Some((n.to_string(), percentile(v, 0.5)?))
            })
            .collect()
    }
}

fn block_pattern(index: u64, buf: &mut [u8]) {
    buf.fill((index as u8) ^ 0x5A);
    buf[..8].copy_from_slice(&index.to_le_bytes());
    buf[8..16].copy_from_slice(&(!index).to_le_bytes());
}

/// Whether `buf` is block `index` of the pattern.
pub fn block_ok(index: u64, buf: &[u8]) -> bool {
    buf.len() == BLOCK
        && buf[..8] == index.to_le_bytes()
        && buf[8..16] == (!index).to_le_bytes()
        && buf[16..].iter().all(|&b| b == (index as u8) ^ 0x5A)
}

/// Writes the file the read tests use, directly on the server's disk: `size` bytes of 4 KiB
/// blocks that each name their own index, so a read at a wrong offset shows. Synced.
pub fn make_read_file(path: &Path, size: u64) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let per = (1 << 20) / BLOCK;
    let mut buf = vec![0u8; 1 << 20];
    let blocks = size / BLOCK as u64;
    let mut b = 0u64;
    while b < blocks {
        let n = per.min((blocks - b) as usize);
        for i in 0..n {
            block_pattern(b + i as u64, &mut buf[i * BLOCK..(i + 1) * BLOCK]);
        }
        f.write_all(&buf[..n * BLOCK])?;
        b += n as u64;
    }
    f.sync_all()?;
    Ok(())
}

/// Reads a file into the page cache (the server's side warm, so every system starts the
/// same).
pub fn warm(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut buf, off)?;
        if n == 0 {
            return Ok(());
        }
        off += n as u64;
    }
}

/// Drops `path`'s cached pages in this kernel (`POSIX_FADV_DONTNEED`; through a mount this
/// is the client's copy only) and returns the fraction still resident afterwards
/// (`mincore`), so a report can show that a read started cold.
pub fn evict(path: &Path) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len() as usize;
    let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: a read-only shared mapping of the whole open file, never touched; mincore only
    // reads the page tables' view of the page cache.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        if p == libc::MAP_FAILED {
            // A file system without mmap: nothing to check.
            return Ok(f64::NAN);
        }
        let pages = len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        let r = libc::mincore(p, len, v.as_mut_ptr());
        libc::munmap(p, len);
        if r != 0 {
            return Ok(f64::NAN);
        }
        Ok(v.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64)
    }
}

fn dd(args: &[String], limit: Duration) -> Result<Measured> {
    let t0 = Instant::now();
    let child = Command::new("dd")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting dd")?;
    let r = procs::wait_child(child, limit, "dd")?;
    let seconds = t0.elapsed().as_secs_f64();
    if !r.success {
        bail!("dd {} failed: {}", args.join(" "), r.stderr.trim());
    }
    // "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 2.3 s, 465 MB/s"
    let bytes = r
        .stderr
        .lines()
        .find_map(|l| l.split(" bytes").next()?.trim().parse::<u64>().ok())
        .with_context(|| format!("dd printed no byte count: {}", r.stderr.trim()))?;
    Ok(Measured {
        bytes,
        ops: bytes.div_ceil(1 << 20),
        seconds,
        app_cpu_s: r.cpu_s,
        check: String::new(),
        ..Default::default()
    })
}

/// `dd if=FILE of=/dev/null bs=1M`: a sequential read of the whole file.
pub fn seq_read(file: &Path, expect: u64, limit: Duration) -> Result<Measured> {
    let mut m = dd(
        &[
            format!("if={}", file.display()),
            "of=/dev/null".into(),
            "bs=1M".into(),
        ],
        limit,
    )?;
    if m.bytes != expect {
        bail!("read {} bytes of {expect}", m.bytes);
    }
    m.check = format!("dd read all {expect} bytes");
    Ok(m)
}

/// `dd if=/dev/zero of=FILE bs=1M count=N conv=fsync`: a sequential write whose time includes
/// the `fsync` (data on the server's disk). `server_view` is the same file seen on the server,
/// whose size is checked afterwards.
pub fn seq_write(file: &Path, server_view: &Path, size: u64, limit: Duration) -> Result<Measured> {
    let mut m = dd(
        &[
            "if=/dev/zero".into(),
            format!("of={}", file.display()),
            "bs=1M".into(),
            format!("count={}", size.div_ceil(1 << 20)),
            "conv=fsync".into(),
        ],
        limit,
    )?;
    let on_server = fs::metadata(server_view)
        .with_context(|| format!("the written file on the server: {}", server_view.display()))?
        .len();
    if on_server != m.bytes {
        bail!("dd wrote {} bytes, the server has {on_server}", m.bytes);
    }
    m.check = format!("server file has all {on_server} bytes after conv=fsync");
    Ok(m)
}

fn thread_cpu_seconds() -> f64 {
    use nix::sys::resource::{UsageWho, getrusage};
    use nix::sys::time::TimeVal;
    let Ok(ru) = getrusage(UsageWho::RUSAGE_THREAD) else {
        return 0.0;
    };
    let tv = |t: TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 * 1e-6;
    tv(ru.user_time()) + tv(ru.system_time())
}

/// The `p` quantile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[i])
}

/// The test kit's seeded generator, so runs read the same offsets.
pub use braid_testkit::Rng;

/// Random 4 KiB reads (one at a time, `pread` at block-aligned offsets) of the pattern file,
/// each block checked, until `max_ops` reads or `limit` seconds.
pub fn rand_read(file: &Path, max_ops: u64, limit: Duration) -> Result<Measured> {
    let f = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let blocks = f.metadata()?.len() / BLOCK as u64;
    if blocks == 0 {
        bail!("{} is empty", file.display());
    }
    let mut rng = Rng::new(0xF5BE_0C4B ^ blocks);
    let mut buf = vec![0u8; BLOCK];
    let mut lat = Vec::with_capacity(max_ops.min(1 << 20) as usize);
    let cpu0 = thread_cpu_seconds();
    let t0 = Instant::now();
    while (lat.len() as u64) < max_ops && t0.elapsed() < limit {
        let b = rng.next_u64() % blocks;
        let s = Instant::now();
        let n = f.read_at(&mut buf, b * BLOCK as u64)?;
        lat.push(s.elapsed().as_secs_f64() * 1e6);
        if n != BLOCK || !block_ok(b, &buf) {
            bail!("random read of block {b}: wrong data ({n} bytes)");
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let app_cpu_s = thread_cpu_seconds() - cpu0;
    let ops = lat.len() as u64;
    lat.sort_by(f64::total_cmp);
    Ok(Measured {
        bytes: ops * BLOCK as u64,
        ops,
        seconds,
        app_cpu_s,
        lat_us_median: percentile(&lat, 0.5),
        lat_us_p99: percentile(&lat, 0.99),
        check: format!("all {ops} blocks had their own index"),
        ..Default::default()
    })
}

/// In directory `dir` (made if missing), one file after another: create (`O_EXCL`),
/// write 1 byte, close, `stat` (size must be 1), unlink; until `max_files` or `limit`.
pub fn metadata_loop(dir: &Path, max_files: u64, limit: Duration) -> Result<Measured> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut lat = Vec::with_capacity(max_files.min(1 << 20) as usize);
    let mut phases = Phases::new(&META_PHASES);
    let cpu0 = thread_cpu_seconds();
    let t0 = Instant::now();
    let mut i = 0u64;
    while i < max_files && t0.elapsed() < limit {
        let p = dir.join(format!("m{i}"));
        let s = Instant::now();
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&p)
            .with_context(|| format!("creating {}", p.display()))?;
        let created = Instant::now();
        f.write_all(b"x")?;
        let written = Instant::now();
        drop(f);
        let closed = Instant::now();
        let len = fs::metadata(&p)?.len();
        let stated = Instant::now();
        if len != 1 {
            bail!("{}: stat after close says {len} bytes, not 1", p.display());
        }
        fs::remove_file(&p)?;
        let end = Instant::now();
        phases.record(&[s, created, written, closed, stated, end]);
        lat.push(end.duration_since(s).as_secs_f64() * 1e6);
        i += 1;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let app_cpu_s = thread_cpu_seconds() - cpu0;
    // libfuse's high-level layer (sshfs) hides a file unlinked before the kernel's
    // asynchronous RELEASE reached it as `.fuse_hidden*` and removes it at that release: give
    // those a bounded moment; anything else left is an unlink that did not happen.
    let left = |dir: &Path| -> Result<Vec<String>> {
        Ok(fs::read_dir(dir)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect())
    };
    let mut rest = left(dir)?;
    let deadline = Instant::now() + Duration::from_secs(3);
    while !rest.is_empty()
        && rest.iter().all(|n| n.starts_with(".fuse_hidden"))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
        rest = left(dir)?;
    }
    if !rest.is_empty() && rest.iter().all(|n| n.starts_with(".fuse_hidden")) {
        // An unlink that raced the RELEASE inside libfuse leaves the hidden file for good
        // (1 workspace run in 2 on 2026-11-27; sshfs 3 takes no `hard_remove`). The names
        // are gone, as the loop asked: libfuse's leftovers are cleared, not counted.
        eprintln!(
            "fs bench: {} left {} hidden file(s) of unlinked files (libfuse's unlink/release race); removing them",
            dir.display(),
            rest.len()
        );
        for n in &rest {
            fs::remove_file(dir.join(n))?;
        }
        rest = left(dir)?;
    }
    if !rest.is_empty() {
        bail!(
            "{} is not empty after the loop: {}",
            dir.display(),
            rest.join(" ")
        );
    }
    lat.sort_by(f64::total_cmp);
    Ok(Measured {
        bytes: 0,
        ops: i,
        seconds,
        app_cpu_s,
        lat_us_median: percentile(&lat, 0.5),
        lat_us_p99: percentile(&lat, 0.99),
        check: format!("{i} files each stat'ed at 1 byte after close, directory empty after"),
        phases_us: phases.medians(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_on_a_local_directory() {
        let dir = std::env::temp_dir().join(format!("braid-fsbench-wl-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("read.dat");
        make_read_file(&f, 3 << 20).unwrap();
        let m = seq_read(&f, 3 << 20, Duration::from_secs(30)).unwrap();
        assert_eq!(m.bytes, 3 << 20);
        let r = rand_read(&f, 200, Duration::from_secs(10)).unwrap();
        assert_eq!(r.ops, 200);
        assert!(r.lat_us_median.is_some());
        let w = dir.join("w.dat");
        let m = seq_write(&w, &w, 2 << 20, Duration::from_secs(30)).unwrap();
        assert_eq!(m.bytes, 2 << 20);
        let md = metadata_loop(&dir.join("meta"), 50, Duration::from_secs(10)).unwrap();
        assert_eq!(md.ops, 50);
        assert!(evict(&f).unwrap() <= 1.0);
        // A block at the wrong offset is caught.
        let mut buf = vec![0u8; BLOCK];
        block_pattern(7, &mut buf);
        assert!(block_ok(7, &buf) && !block_ok(8, &buf));
        fs::remove_dir_all(&dir).unwrap();
    }
}
