//! The workloads through the braid-fs client library (no FUSE): zero-copy `read_at` into a
//! region of this process, `write_at` + `sync_all`, 4 KiB `read_at`s at random offsets, and
//! the create + write 1 B + flush/close + getattr + unlink loop. The client runs in this
//! process (its sockets made from a thread inside the client host's namespace), so its CPU is
//! this process's.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use braid::{Access, Context, ContextConfig, RailAddr, Region, RegionOptions};
use braid_fs::client::{Client, ClientConfig, File};

use super::braidfs::FS_PORT;
use super::procs;
use super::workload::{BLOCK, META_PHASES, Measured, Phases, Rng, block_ok, percentile};
use braid_testbed::testbed::Testbed;

/// Resident pages from the start, as a verbs registration pins them.
const POPULATED: RegionOptions = RegionOptions {
    huge_pages: false,
    populate: true,
};

/// A connected library client over the first `rails` rails of a testbed.
pub struct LibClient {
    ctx: Context,
    client: Client,
    /// Rails it uses.
    pub rails: usize,
    buf_len: usize,
}

impl LibClient {
    /// Connects from host 0 to the server in host 1 (listening on [`FS_PORT`] of every rail)
    /// with `secret`; large transfers go through a `buf_len` region.
    pub fn connect(tb: &Testbed, rails: usize, secret: &str, buf_len: usize) -> Result<LibClient> {
        let addrs: Vec<RailAddr> = tb
            .rail_addrs(0, 1)
            .into_iter()
            .take(rails)
            .map(|(l, r): (Ipv4Addr, Ipv4Addr)| {
                RailAddr::new(Some(IpAddr::V4(l)), SocketAddr::new(IpAddr::V4(r), FS_PORT))
            })
            .collect();
        let secret = secret.as_bytes().to_vec();
        // Sockets and the engine's threads belong to the namespace of the thread that makes
        // them; afterwards the client may be used from any thread.
        let (ctx, client) = tb
            .spawn_in(0, move || -> Result<(Context, Client)> {
                let ctx = Context::with_config(ContextConfig {
                    secret: Some(secret),
                    ..Default::default()
                })?;
                let client = Client::connect(&ctx, &ClientConfig::new(addrs))
                    .map_err(|e| anyhow::anyhow!("connecting the client library: {e}"))?;
                Ok((ctx, client))
            })?
            .join()
            .map_err(|_| anyhow::anyhow!("the connecting thread panicked"))???;
        Ok(LibClient {
            ctx,
            client,
            rails,
            buf_len,
        })
    }

    fn buffer(&self, len: usize) -> Result<Region> {
        Ok(self
            .ctx
            .alloc_region_with(len, Access::LOCAL_WRITE, POPULATED)?)
    }

    fn open(&self, path: &str, flags: i32) -> Result<File> {
        self.client
            .open_path(path, flags)
            .map_err(|e| anyhow::anyhow!("opening {path}: {e}"))
    }

    /// Reads the whole pattern file `path` (relative to the export) with `read_at`s of the
    /// buffer's size; every block is checked after the timed part.
    pub fn seq_read(&self, path: &str, expect: u64) -> Result<Measured> {
        let f = self.open(path, libc::O_RDONLY)?;
        let buf = self.buffer(self.buf_len)?;
        let mut header = [0u8; BLOCK];
        let cpu0 = procs::self_cpu_seconds();
        let mut timed = Duration::ZERO;
        let mut off = 0u64;
        let mut bad = None;
        while off < expect {
            let len = self.buf_len.min((expect - off) as usize);
            let t = Instant::now();
            let n = f
                .read_at(off, &buf, 0, len)
                .map_err(|e| anyhow::anyhow!("read_at {off}: {e}"))?;
            timed += t.elapsed();
            if n != len {
                bail!("read_at {off}: {n} bytes of {len}");
            }
            for b in 0..n / BLOCK {
                buf.read_at(b * BLOCK, &mut header)?;
                let index = (off as usize / BLOCK + b) as u64;
                if bad.is_none() && !block_ok(index, &header) {
                    bad = Some(index);
                }
            }
            off += n as u64;
        }
        let app_cpu_s = procs::self_cpu_seconds() - cpu0;
        if let Some(b) = bad {
            bail!("block {b} read wrong data");
        }
        Ok(Measured {
            bytes: off,
            ops: off.div_ceil(self.buf_len as u64),
            seconds: timed.as_secs_f64(),
            app_cpu_s,
            check: format!(
                "every 4 KiB block checked (read_at of {} MiB into one region)",
                self.buf_len >> 20
            ),
            ..Default::default()
        })
    }

    /// Removes `name` from the export's root through the service.
    pub fn remove(&self, name: &str) -> Result<()> {
        let root = self.client.root().node;
        self.client
            .unlink(root, name.as_bytes())
            .map_err(|e| anyhow::anyhow!("unlink {name}: {e}"))
    }

    /// Creates `name`, writes `size` bytes with `write_at` from one region, then `sync_all`
    /// (the server's `fsync`); `server_view` is the file on the server, checked afterwards.
    pub fn seq_write(&self, name: &str, server_view: &Path, size: u64) -> Result<Measured> {
        let root = self.client.root().node;
        let buf = self.buffer(self.buf_len)?;
        buf.fill(0, self.buf_len, 0x5A)?;
        let cpu0 = procs::self_cpu_seconds();
        let t0 = Instant::now();
        let (_, f) = self
            .client
            .create(
                root,
                name.as_bytes(),
                0o644,
                libc::O_RDWR | libc::O_EXCL | libc::O_TRUNC,
            )
            .map_err(|e| anyhow::anyhow!("creating {name}: {e}"))?;
        let created = Instant::now();
        let mut off = 0u64;
        while off < size {
            let len = self.buf_len.min((size - off) as usize);
            f.write_at(off, &buf, 0, len)
                .map_err(|e| anyhow::anyhow!("write_at {off}: {e}"))?;
            off += len as u64;
        }
        let written = Instant::now();
        f.sync_all().map_err(|e| anyhow::anyhow!("sync_all: {e}"))?;
        drop(f);
        let end = Instant::now();
        let seconds = end.duration_since(t0).as_secs_f64();
        let us = |a: Instant, b: Instant| b.duration_since(a).as_secs_f64() * 1e6;
        let phases_us = vec![
            ("create".to_string(), us(t0, created)),
            ("write_at all".to_string(), us(created, written)),
            ("sync_all".to_string(), us(written, end)),
        ];
        let app_cpu_s = procs::self_cpu_seconds() - cpu0;
        let on_server = std::fs::metadata(server_view)?.len();
        if on_server != size {
            bail!("wrote {size} bytes, the server has {on_server}");
        }
        Ok(Measured {
            bytes: size,
            ops: size.div_ceil(self.buf_len as u64),
            seconds,
            app_cpu_s,
            check: format!("server file has all {size} bytes after sync_all"),
            phases_us,
            ..Default::default()
        })
    }

    /// 4 KiB `read_at`s at random block-aligned offsets of the pattern file, one at a time,
    /// each block checked; until `max_ops` or `limit`.
    pub fn rand_read(&self, path: &str, max_ops: u64, limit: Duration) -> Result<Measured> {
        let f = self.open(path, libc::O_RDONLY)?;
        let blocks = f.size() / BLOCK as u64;
        if blocks == 0 {
            bail!("{path} is empty");
        }
        let buf = self.buffer(BLOCK)?;
        let mut got = [0u8; BLOCK];
        let mut rng = Rng::new(0xF5BE_0C4B ^ blocks);
        let mut lat = Vec::with_capacity(max_ops.min(1 << 20) as usize);
        let cpu0 = procs::self_cpu_seconds();
        let t0 = Instant::now();
        while (lat.len() as u64) < max_ops && t0.elapsed() < limit {
            let b = rng.next_u64() % blocks;
            let s = Instant::now();
            let n = f
                .read_at(b * BLOCK as u64, &buf, 0, BLOCK)
                .map_err(|e| anyhow::anyhow!("read_at block {b}: {e}"))?;
            lat.push(s.elapsed().as_secs_f64() * 1e6);
            buf.read_at(0, &mut got)?;
            if n != BLOCK || !block_ok(b, &got) {
                bail!("random read of block {b}: wrong data ({n} bytes)");
            }
        }
        let seconds = t0.elapsed().as_secs_f64();
        let app_cpu_s = procs::self_cpu_seconds() - cpu0;
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

    /// In the export's root, one file after another: create (`O_EXCL`), write 1 byte, flush
    /// and close (close-to-open), stat by name (lookup; size must be 1), unlink; until
    /// `max_files` or `limit`.
    pub fn metadata(&self, tag: &str, max_files: u64, limit: Duration) -> Result<Measured> {
        let root = self.client.root().node;
        let mut lat = Vec::with_capacity(max_files.min(1 << 20) as usize);
        let mut phases = Phases::new(&META_PHASES);
        let cpu0 = procs::self_cpu_seconds();
        let t0 = Instant::now();
        let mut i = 0u64;
        while i < max_files && t0.elapsed() < limit {
            let name = format!("m-{tag}-{i}");
            let s = Instant::now();
            let (_, f) = self
                .client
                .create(root, name.as_bytes(), 0o644, libc::O_WRONLY | libc::O_EXCL)
                .map_err(|e| anyhow::anyhow!("creating {name}: {e}"))?;
            let created = Instant::now();
            f.write_all_at(0, b"x")
                .map_err(|e| anyhow::anyhow!("writing {name}: {e}"))?;
            let written = Instant::now();
            // Closing (flush, then release of the handle and its lookup reference); stat
            // looks the name up again, as stat(2) of a path does.
            f.flush()
                .map_err(|e| anyhow::anyhow!("flushing {name}: {e}"))?;
            drop(f);
            let closed = Instant::now();
            let e = self
                .client
                .lookup(root, name.as_bytes())
                .map_err(|e| anyhow::anyhow!("stat {name}: {e}"))?;
            self.client.forget(e.node, 1);
            let stated = Instant::now();
            if e.attr.size != 1 {
                bail!("{name}: stat after close says {} bytes, not 1", e.attr.size);
            }
            self.client
                .unlink(root, name.as_bytes())
                .map_err(|e| anyhow::anyhow!("unlink {name}: {e}"))?;
            let end = Instant::now();
            phases.record(&[s, created, written, closed, stated, end]);
            lat.push(end.duration_since(s).as_secs_f64() * 1e6);
            i += 1;
        }
        let seconds = t0.elapsed().as_secs_f64();
        let app_cpu_s = procs::self_cpu_seconds() - cpu0;
        lat.sort_by(f64::total_cmp);
        Ok(Measured {
            bytes: 0,
            ops: i,
            seconds,
            app_cpu_s,
            lat_us_median: percentile(&lat, 0.5),
            lat_us_p99: percentile(&lat, 0.99),
            check: format!("{i} files each 1 byte by lookup after flush and close"),
            phases_us: phases.medians(),
        })
    }
}

impl Drop for LibClient {
    fn drop(&mut self) {
        self.client.close();
    }
}
