//! The plain-TCP baseline of `--baseline`, on rail 0's path: a blocking stream (sink on the
//! server) or a ping-pong (echo on the server), side by side with the braid test. The
//! ping-pong comes in the two modes braid's latency test has: busy polling (non-blocking
//! `recv`/`send` in a spin loop on both sides, the fair partner of braid's busy-polled
//! figure) and blocking (`recv` sleeps in the kernel, the partner of `cq.wait`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use braid_testbed::parse::RailSpec;

use super::{Op, fill_pattern};

const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts one connection (bounded by `timeout`) and serves it: `TcpStream` reads until EOF,
/// `TcpPingPong` echoes `size`-byte messages until EOF (spinning on a non-blocking socket
/// when `busy`). Returns (messages, bytes received).
pub fn serve(
    l: &TcpListener,
    op: Op,
    size: usize,
    busy: bool,
    timeout: Duration,
) -> Result<(u64, u64)> {
    let deadline = Instant::now() + timeout;
    let mut s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    bail!("no TCP baseline connection within {timeout:?}");
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(e).context("accepting the TCP baseline connection"),
        }
    };
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut bytes = 0u64;
    let mut messages = 0u64;
    match op {
        Op::TcpStream => {
            let mut buf = vec![0u8; size.clamp(64 << 10, 4 << 20)];
            loop {
                match s.read(&mut buf) {
                    Ok(0) => break,
                    Ok(k) => bytes += k as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e).context("TCP baseline stream"),
                }
            }
            messages = bytes / size as u64;
        }
        _ => {
            let mut io = PingIo::new(&mut s, busy)?;
            let mut buf = vec![0u8; size];
            loop {
                match io.read_exact(&mut buf) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
                    Err(e) => return Err(e).context("TCP baseline ping"),
                }
                bytes += size as u64;
                messages += 1;
                io.write_all(&buf).context("TCP baseline pong")?;
            }
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    Ok((messages, bytes))
}

/// Connects from rail 0's local address to the server's baseline port.
pub fn connect(rail: &RailSpec, port: u16) -> Result<TcpStream> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let remote = SocketAddr::new((*rail.remote.ip()).into(), port);
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    sock.bind(&SockAddr::from(SocketAddr::new(rail.local.into(), 0)))
        .with_context(|| format!("binding to {}", rail.local))?;
    sock.connect_timeout(&SockAddr::from(remote), Duration::from_secs(5))
        .with_context(|| format!("connecting the TCP baseline to {remote}"))?;
    let s: TcpStream = sock.into();
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

/// Streams `size`-byte messages until `max` or `deadline`, then waits until the server has
/// read everything (it closes after EOF). Returns (messages, seconds).
pub fn stream(
    s: &mut TcpStream,
    size: usize,
    max: u64,
    deadline: Option<Instant>,
) -> Result<(u64, f64)> {
    let mut buf = vec![0u8; size];
    fill_pattern(0, &mut buf);
    let t0 = Instant::now();
    let mut n = 0u64;
    while n < max && deadline.is_none_or(|d| Instant::now() < d) {
        s.write_all(&buf)
            .context("TCP baseline: writing (server gone?)")?;
        n += 1;
    }
    s.shutdown(Shutdown::Write)?;
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("TCP baseline: waiting for the server to drain"),
        }
    }
    Ok((n, t0.elapsed().as_secs_f64()))
}

/// Ping-pongs `size`-byte messages (spinning on a non-blocking socket when `busy`): `warmup`
/// uncounted rounds, then until `max` rounds or `deadline`. Returns the round-trip times in ns.
pub fn ping_pong(
    s: &mut TcpStream,
    size: usize,
    busy: bool,
    warmup: u64,
    max: u64,
    deadline: Option<Instant>,
) -> Result<Vec<u64>> {
    let mut io = PingIo::new(s, busy)?;
    let mut buf = vec![0u8; size];
    fill_pattern(1, &mut buf);
    let mut back = vec![0u8; size];
    let mut rtts = Vec::with_capacity(max.min(1 << 22) as usize);
    let mut i = 0u64;
    loop {
        if i >= warmup
            && (rtts.len() as u64 >= max || deadline.is_some_and(|d| Instant::now() >= d))
        {
            break;
        }
        let t = Instant::now();
        io.write_all(&buf)
            .context("TCP baseline: ping (server gone?)")?;
        io.read_exact(&mut back)
            .context("TCP baseline: pong (server gone?)")?;
        let ns = t.elapsed().as_nanos() as u64;
        if i >= warmup {
            rtts.push(ns);
        }
        i += 1;
    }
    io.s.shutdown(Shutdown::Write)?;
    Ok(rtts)
}

/// Whole-message reads and writes of the ping-pong, blocking or spinning. A spinning side
/// gives up after [`IO_TIMEOUT`] without progress, as a blocking one does by its socket
/// timeouts.
struct PingIo<'a> {
    s: &'a mut TcpStream,
    busy: bool,
}

impl<'a> PingIo<'a> {
    fn new(s: &'a mut TcpStream, busy: bool) -> io::Result<PingIo<'a>> {
        s.set_nonblocking(busy)?;
        Ok(PingIo { s, busy })
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        if !self.busy {
            return self.s.read_exact(buf);
        }
        let mut got = 0;
        let mut idle_since = Instant::now();
        while got < buf.len() {
            match self.s.read(&mut buf[got..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(k) => {
                    got += k;
                    idle_since = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => spin_or_time_out(idle_since)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if !self.busy {
            return self.s.write_all(buf);
        }
        let mut sent = 0;
        let mut idle_since = Instant::now();
        while sent < buf.len() {
            match self.s.write(&buf[sent..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(k) => {
                    sent += k;
                    idle_since = Instant::now();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => spin_or_time_out(idle_since)?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn spin_or_time_out(idle_since: Instant) -> io::Result<()> {
    if idle_since.elapsed() > IO_TIMEOUT {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no progress for {IO_TIMEOUT:?}"),
        ));
    }
    // As braid's busy poll in this benchmark does: both sides of a comparison spin alike,
    // and on a shared machine the peer gets the core when it needs it.
    std::thread::yield_now();
    Ok(())
}
