//! The baseline clients: opens the rails and sends for the run's duration, one stream per rail
//! (tcp) or fragments round-robin over the rails (trunking).

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use braid_testbed::parse::RailSpec;

use super::wire::{FragHeader, Hello, Mode};
use super::{BaselineResult, ClientOpts, IO_TIMEOUT, ServerReport, cpu_seconds, fill_pattern};

/// Opens one rail: binds to `rail.local`, connects (retrying refusals for up to 3 s, as the
/// server may still be starting), sets timeouts and sends the hello.
pub fn connect_rail(rail: &RailSpec, hello: &Hello) -> Result<TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut attempt = 0u32;
    let s = loop {
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
        sock.bind(&SockAddr::from(SocketAddr::new(rail.local.into(), 0)))
            .with_context(|| format!("binding to local address {}", rail.local))?;
        match sock.connect_timeout(&SockAddr::from(rail.remote_sa()), Duration::from_secs(5)) {
            Ok(()) => break sock,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                attempt += 1;
                // Bounded back-off: at most ~3 s in total.
                thread::sleep(Duration::from_millis((20 * attempt as u64).min(200)));
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("connecting {} -> {}", rail.local, rail.remote));
            }
        }
    };
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    s.set_nodelay(true)?;
    (&s).write_all(&hello.encode())?;
    Ok(s)
}

pub(super) fn session_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

pub(super) fn progress(duration: Duration, what: &str) -> Option<indicatif::ProgressBar> {
    if duration < Duration::from_secs(3) {
        return None;
    }
    let pb = indicatif::ProgressBar::new(duration.as_secs());
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} [{elapsed}/{len}s]")
            .expect("valid template"),
    );
    pb.set_message(what.to_owned());
    pb.enable_steady_tick(Duration::from_millis(200));
    Some(pb)
}

pub(super) fn read_report(s: &mut TcpStream) -> Result<ServerReport> {
    // The server drains the rails before it answers, so allow for a slow rail.
    s.set_read_timeout(Some(IO_TIMEOUT * 3))?;
    let mut v = Vec::new();
    s.take(1 << 20)
        .read_to_end(&mut v)
        .context("waiting for the server's report")?;
    let r: ServerReport = serde_json::from_slice(v.trim_ascii())
        .with_context(|| format!("bad server report {:?}", String::from_utf8_lossy(&v)))?;
    if let Some(e) = &r.error {
        bail!("server: {e}");
    }
    Ok(r)
}

pub(super) fn finish(
    mode: Mode,
    opts: &ClientOpts,
    t0: Instant,
    cpu0: f64,
    r: ServerReport,
) -> BaselineResult {
    let seconds = t0.elapsed().as_secs_f64();
    let client_cpu_s = cpu_seconds() - cpu0;
    let gb = r.bytes as f64 / 1e9;
    BaselineResult {
        mode,
        rails: opts.rails.len(),
        size: opts.size,
        frag: (mode == Mode::Trunking).then_some(opts.frag),
        iterations: r.messages,
        bytes: r.bytes,
        seconds,
        bw_mb_s: r.bytes as f64 / seconds / 1e6,
        msg_rate: r.messages as f64 / seconds,
        client_cpu_s,
        server_cpu_s: r.cpu_s,
        client_cpu_s_per_gb: client_cpu_s / gb,
        server_cpu_s_per_gb: r.cpu_s / gb,
        per_rail_bytes: r.per_rail_bytes,
        max_reorder_fragments: (mode == Mode::Trunking).then_some(r.max_reorder_fragments),
    }
}

/// Runs the tcp baseline client: one stream per rail, a blocking write loop of `size` bytes.
pub fn run_tcp_client(opts: &ClientOpts) -> Result<BaselineResult> {
    let session = session_id();
    let n = opts.rails.len() as u32;
    let mut streams = Vec::new();
    for (i, r) in opts.rails.iter().enumerate() {
        let h = Hello {
            mode: Mode::Tcp,
            session,
            rail: i as u32,
            rails: n,
            size: opts.size as u64,
            frag: 0,
        };
        streams.push(connect_rail(r, &h)?);
    }
    let pb = progress(opts.duration, "tcp");
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let deadline = t0 + opts.duration;
    let max = opts.max_messages.unwrap_or(u64::MAX);
    let size = opts.size;
    let handles: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            thread::spawn(move || -> Result<(u64, TcpStream)> {
                let mut buf = vec![0u8; size];
                fill_pattern(&mut buf);
                let mut msgs = 0u64;
                while msgs < max && Instant::now() < deadline {
                    s.write_all(&buf).context("writing (peer gone?)")?;
                    msgs += 1;
                }
                s.shutdown(Shutdown::Write)?;
                Ok((msgs, s))
            })
        })
        .collect();
    let mut sent = 0u64;
    let mut ctrl = None;
    for j in handles {
        let (m, s) = j
            .join()
            .map_err(|_| anyhow::anyhow!("writer thread panicked"))??;
        sent += m;
        ctrl.get_or_insert(s);
    }
    let r = read_report(ctrl.as_mut().expect("at least one rail"))?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if r.bytes != sent * size as u64 {
        bail!(
            "sent {} bytes but the server received {}",
            sent * size as u64,
            r.bytes
        );
    }
    let mut res = finish(Mode::Tcp, opts, t0, cpu0, r);
    res.iterations = sent;
    res.msg_rate = sent as f64 / res.seconds;
    Ok(res)
}

pub(super) fn write_all_vectored(s: &mut TcpStream, mut a: &[u8], mut b: &[u8]) -> io::Result<()> {
    while !a.is_empty() || !b.is_empty() {
        match s.write_vectored(&[IoSlice::new(a), IoSlice::new(b)]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(k) => {
                let ka = k.min(a.len());
                a = &a[ka..];
                b = &b[k - ka..];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs the trunking client: fragments of every message go round-robin over the rails from
/// one sending thread (as a trunking driver does), each behind a [`FragHeader`].
pub fn run_trunking_client(opts: &ClientOpts) -> Result<BaselineResult> {
    if opts.frag == 0 || opts.frag > 16 << 20 {
        bail!("fragment size must be 1 byte .. 16 MiB");
    }
    let session = session_id();
    let n = opts.rails.len();
    let mut streams = Vec::new();
    for (i, r) in opts.rails.iter().enumerate() {
        let h = Hello {
            mode: Mode::Trunking,
            session,
            rail: i as u32,
            rails: n as u32,
            size: opts.size as u64,
            frag: opts.frag as u32,
        };
        streams.push(connect_rail(r, &h)?);
    }
    let mut buf = vec![0u8; opts.size];
    fill_pattern(&mut buf);
    let pb = progress(opts.duration, "trunking");
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let deadline = t0 + opts.duration;
    let max = opts.max_messages.unwrap_or(u64::MAX);
    let mut g = 0usize;
    let mut msg = 0u64;
    while msg < max && Instant::now() < deadline {
        let mut off = 0;
        while off < opts.size {
            let len = opts.frag.min(opts.size - off);
            let h = FragHeader {
                msg,
                offset: off as u64,
                len: len as u32,
            };
            let rail = g % n;
            write_all_vectored(&mut streams[rail], &h.encode(), &buf[off..off + len])
                .with_context(|| format!("rail {rail}: writing (peer gone?)"))?;
            off += len;
            g += 1;
        }
        msg += 1;
    }
    for s in &streams {
        s.shutdown(Shutdown::Write)?;
    }
    let r = read_report(&mut streams[0])?;
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if r.messages != msg {
        bail!(
            "sent {msg} messages but the server reassembled {}",
            r.messages
        );
    }
    Ok(finish(Mode::Trunking, opts, t0, cpu0, r))
}
