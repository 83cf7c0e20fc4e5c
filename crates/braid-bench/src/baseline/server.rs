//! The baseline server: binds, accepts the rails of one session, and serves the tcp or
//! trunking receive side, reporting back to the client.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use rustix::event::{PollFd, PollFlags, Timespec};

use super::reassembler::Reassembler;
use super::wire::{FragHeader, Hello, Mode};
use super::{IO_TIMEOUT, STAGING_PER_RAIL, ServerOpts, ServerReport, cpu_seconds, pattern_byte};

/// Binds the listeners; the caller prints them (bound ports, for port 0).
pub fn bind(listen: &[SocketAddrV4]) -> Result<Vec<TcpListener>> {
    listen
        .iter()
        .map(|a| {
            let l = TcpListener::bind(a).with_context(|| format!("listening on {a}"))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .collect()
}

/// Serves `opts.runs` client runs of `mode` on already-bound listeners.
pub fn serve(
    mode: Mode,
    listeners: &[TcpListener],
    opts: &ServerOpts,
) -> Result<Vec<ServerReport>> {
    let mut out = Vec::new();
    for run in 0..opts.runs {
        let (hello, streams) = accept_session(listeners, opts.accept_timeout)?;
        if hello.mode != mode {
            let msg = format!(
                "this is a {} server; the client wants {}",
                mode.as_str(),
                hello.mode.as_str()
            );
            send_report(
                &streams[0],
                &ServerReport {
                    error: Some(msg.clone()),
                    ..Default::default()
                },
            );
            bail!(msg);
        }
        tracing::info!(
            run,
            rails = hello.rails,
            size = hello.size,
            "client connected"
        );
        let ctrl = streams[0].try_clone()?;
        let res = match mode {
            Mode::Tcp => serve_tcp(&hello, streams),
            Mode::Trunking => serve_trunking(&hello, streams),
        };
        match res {
            Ok(r) => {
                send_report(&ctrl, &r);
                out.push(r);
            }
            Err(e) => {
                send_report(
                    &ctrl,
                    &ServerReport {
                        error: Some(format!("{e:#}")),
                        ..Default::default()
                    },
                );
                return Err(e);
            }
        }
    }
    Ok(out)
}

pub(super) fn send_report(s: &TcpStream, r: &ServerReport) {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let mut s = s;
    if let Err(e) = s.write_all(&line).and_then(|_| s.shutdown(Shutdown::Write)) {
        tracing::warn!("could not send the report: {e}");
    }
}

pub(super) fn accept_session(
    listeners: &[TcpListener],
    timeout: Duration,
) -> Result<(Hello, Vec<TcpStream>)> {
    let deadline = Instant::now() + timeout;
    let mut first: Option<Hello> = None;
    let mut slots: Vec<Option<TcpStream>> = Vec::new();
    loop {
        if let Some(h) = first
            && slots.iter().all(Option::is_some)
        {
            return Ok((h, slots.into_iter().map(|s| s.expect("filled")).collect()));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "no complete client session within {timeout:?} ({} of {} rails connected)",
                slots.iter().flatten().count(),
                slots.len()
            );
        }
        let mut fds: Vec<PollFd<'_>> = listeners
            .iter()
            .map(|l| PollFd::new(l, PollFlags::IN))
            .collect();
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        let ms = ms.max(1);
        let timeout = Timespec {
            tv_sec: i64::from(ms / 1000),
            tv_nsec: i64::from(ms % 1000) * 1_000_000,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e)).context("poll"),
        }
        for (l, fd) in listeners.iter().zip(&fds) {
            if fd.revents().is_empty() {
                continue;
            }
            let (s, peer) = match l.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e).context("accept"),
            };
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
            s.set_nodelay(true)?;
            let mut b = [0u8; Hello::LEN];
            let h = match (&s)
                .read_exact(&mut b)
                .map_err(anyhow::Error::from)
                .and_then(|_| Hello::decode(&b))
            {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(%peer, "rejected connection: {e:#}");
                    continue;
                }
            };
            match first {
                None => {
                    first = Some(h);
                    slots = (0..h.rails).map(|_| None).collect();
                }
                Some(f)
                    if f.session != h.session
                        || f.rails != h.rails
                        || f.mode != h.mode
                        || f.size != h.size
                        || f.frag != h.frag =>
                {
                    tracing::warn!(%peer, "rejected a connection of another session");
                    continue;
                }
                Some(_) => {}
            }
            if slots[h.rail as usize].is_some() {
                tracing::warn!(%peer, rail = h.rail, "rail connected twice; dropping the second");
                continue;
            }
            tracing::debug!(%peer, rail = h.rail, "rail connected");
            slots[h.rail as usize] = Some(s);
        }
    }
}

pub(super) fn serve_tcp(h: &Hello, streams: Vec<TcpStream>) -> Result<ServerReport> {
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let buf_len = (h.size as usize).min(16 << 20);
    let handles: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            thread::spawn(move || -> Result<u64> {
                let mut buf = vec![0u8; buf_len];
                let mut n = 0u64;
                loop {
                    match s.read(&mut buf) {
                        Ok(0) => return Ok(n),
                        Ok(k) => n += k as u64,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(e).context("reading the stream (peer gone?)"),
                    }
                }
            })
        })
        .collect();
    let mut per_rail = Vec::new();
    for j in handles {
        per_rail.push(
            j.join()
                .map_err(|_| anyhow::anyhow!("reader thread panicked"))??,
        );
    }
    let bytes: u64 = per_rail.iter().sum();
    Ok(ServerReport {
        bytes,
        messages: bytes / h.size,
        seconds: t0.elapsed().as_secs_f64(),
        cpu_s: cpu_seconds() - cpu0,
        per_rail_bytes: per_rail,
        ..Default::default()
    })
}

pub(super) struct Staged {
    rail: usize,
    buf: Vec<u8>,
}

impl AsRef<[u8]> for Staged {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

pub(super) fn serve_trunking(h: &Hello, streams: Vec<TcpStream>) -> Result<ServerReport> {
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let size = h.size as usize;
    let frag = h.frag as usize;
    let (tx, rx) = mpsc::sync_channel::<(FragHeader, Staged)>(streams.len() * STAGING_PER_RAIL);
    let mut pools = Vec::new();
    let mut readers = Vec::new();
    for (rail, mut s) in streams.into_iter().enumerate() {
        let (ptx, prx) = mpsc::sync_channel::<Vec<u8>>(STAGING_PER_RAIL);
        for _ in 0..STAGING_PER_RAIL {
            ptx.send(vec![0u8; frag]).expect("pool has room");
        }
        pools.push(ptx);
        let tx = tx.clone();
        readers.push(thread::spawn(move || -> Result<u64> {
            let mut n = 0u64;
            loop {
                let mut hb = [0u8; FragHeader::LEN];
                if !read_exact_or_eof(&mut s, &mut hb)
                    .with_context(|| format!("rail {rail}: reading a fragment header"))?
                {
                    return Ok(n);
                }
                let fh = FragHeader::decode(&hb).with_context(|| format!("rail {rail}"))?;
                if fh.len as usize > frag || fh.len == 0 {
                    bail!(
                        "rail {rail}: fragment of {} bytes, fragment size is {frag}",
                        fh.len
                    );
                }
                // The pool is the reorder window: no free staging buffer means the assembler
                // waits for another rail; a dead assembler ends the wait with an error.
                let mut buf = prx.recv_timeout(IO_TIMEOUT).map_err(|_| {
                    anyhow::anyhow!("rail {rail}: no staging buffer freed within {IO_TIMEOUT:?}")
                })?;
                s.read_exact(&mut buf[..fh.len as usize])
                    .with_context(|| format!("rail {rail}: reading a fragment"))?;
                n += (FragHeader::LEN + fh.len as usize) as u64;
                if tx.send((fh, Staged { rail, buf })).is_err() {
                    bail!("rail {rail}: assembler gone");
                }
            }
        }));
    }
    drop(tx);
    let mut dest = vec![0u8; size];
    let mut re = Reassembler::<Staged>::new(size);
    let mut checked = 0u64;
    let result = (|| -> Result<()> {
        loop {
            let (fh, st) = match rx.recv_timeout(IO_TIMEOUT) {
                Ok(x) => x,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
                Err(mpsc::RecvTimeoutError::Timeout) => bail!("no fragment within {IO_TIMEOUT:?}"),
            };
            re.push(
                fh,
                st,
                &mut dest,
                &mut |s: Staged| {
                    // The reader may have exited at EOF; then its buffer is simply dropped.
                    let _ = pools[s.rail].try_send(s.buf);
                },
                &mut |_m, d: &[u8]| {
                    // A cheap spot check of every message; the last one is checked fully below.
                    let probe = [0, d.len() / 2, d.len() - 1];
                    if probe.iter().all(|&o| d[o] == pattern_byte(o)) {
                        checked += 1;
                    }
                },
            )?;
        }
    })();
    let mut per_rail = Vec::new();
    let mut reader_err = None;
    for j in readers {
        match j
            .join()
            .map_err(|_| anyhow::anyhow!("reader thread panicked"))?
        {
            Ok(n) => per_rail.push(n),
            Err(e) => {
                per_rail.push(0);
                reader_err.get_or_insert(e);
            }
        }
    }
    if let Some(e) = reader_err {
        return Err(e);
    }
    result?;
    if !re.is_idle() {
        bail!(
            "the client stopped inside message {} ({} fragments waiting)",
            re.completed(),
            re.pending()
        );
    }
    let messages = re.completed();
    if checked != messages {
        bail!(
            "{} of {messages} messages failed the spot check",
            messages - checked
        );
    }
    let verified = messages > 0 && dest.iter().enumerate().all(|(o, &b)| b == pattern_byte(o));
    if messages > 0 && !verified {
        bail!("the last reassembled message differs from the sent pattern");
    }
    Ok(ServerReport {
        bytes: messages * size as u64,
        messages,
        seconds: t0.elapsed().as_secs_f64(),
        cpu_s: cpu_seconds() - cpu0,
        per_rail_bytes: per_rail,
        max_reorder_fragments: re.max_pending(),
        verified,
        error: None,
    })
}

/// Reads exactly `buf.len()` bytes; `Ok(false)` on a clean EOF before the first byte.
pub(super) fn read_exact_or_eof(s: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "stream ended inside a header",
                ));
            }
            Ok(k) => got += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
