//! The two baselines braid is compared against, each a server and a client that can run in
//! different namespaces (or both on loopback).
//!
//! * **tcp**: one plain TCP stream per rail: a blocking `write` loop of a `size`-byte buffer
//!   against a `read` loop. With one rail this is "one plain TCP stream"; with several rails it
//!   is "N independent streams" (each bound to its own local address), the ceiling.
//! * **trunking**: network trunking as PM/Ethernet did it. The sender cuts every message into
//!   fragments of `frag` bytes (default 64 KiB: large enough that the 24-byte fragment header
//!   and the per-fragment syscalls cost little, small enough that a 1 MiB message spans all
//!   rails), and sends fragment `g` (counted across messages) on rail `g % N`, each behind a
//!   [`FragHeader`] (message number, offset, length). The receiver reads fragments from every
//!   rail into per-rail staging buffers (the reorder buffer, [`STAGING_PER_RAIL`] fragments
//!   per rail), and one assembler thread copies them, in order, into the destination message
//!   buffer ([`Reassembler`]). That extra copy and reorder buffer is what braid's direct
//!   placement saves.
//!
//! # Protocol
//!
//! Every connection opens with a 40-byte [`Hello`] (magic, version, mode, session id, rail
//! index, rail count, size, fragment size). The server waits (bounded by `accept_timeout`)
//! until it holds `rails` connections of one session, then starts its clock and CPU count.
//! The client sends until its duration is over (stopping on a message boundary), shuts down
//! its write side, and waits for the server's [`ServerReport`], a JSON line sent back on
//! rail 0 once the server has read everything. Goodput = bytes the server received in whole
//! messages / (time from the client's first byte to the report's arrival).
//!
//! All sockets carry read and write timeouts ([`IO_TIMEOUT`]), so a vanished peer is an
//! error, not a hang.

use std::collections::BTreeMap;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::parse::RailSpec;

/// Read/write timeout on every data connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Staging buffers (fragments) per rail on the trunking receiver: the reorder window.
pub const STAGING_PER_RAIL: usize = 16;
/// Default trunking fragment size.
pub const DEFAULT_FRAG: usize = 64 * 1024;

const MAGIC: u32 = 0x4252_4442; // "BRDB"
const VERSION: u16 = 1;
const FRAG_MAGIC: u32 = 0x4652_4147; // "FRAG"

/// Which baseline a connection belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Plain TCP stream(s).
    Tcp,
    /// Round-robin fragments with a reorder buffer.
    Trunking,
}

impl Mode {
    fn code(self) -> u16 {
        match self {
            Mode::Tcp => 1,
            Mode::Trunking => 2,
        }
    }
    fn from_code(c: u16) -> Option<Mode> {
        match c {
            1 => Some(Mode::Tcp),
            2 => Some(Mode::Trunking),
            _ => None,
        }
    }
    /// Name as used in JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::Trunking => "trunking",
        }
    }
}

/// First bytes on every baseline connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Baseline.
    pub mode: Mode,
    /// Random id shared by the rails of one run.
    pub session: u64,
    /// Index of this connection's rail.
    pub rail: u32,
    /// Number of rails in the run.
    pub rails: u32,
    /// Message size in bytes.
    pub size: u64,
    /// Fragment size (trunking; 0 for tcp).
    pub frag: u32,
}

impl Hello {
    /// Encoded length.
    pub const LEN: usize = 40;

    /// Encodes to the wire format (big-endian).
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..4].copy_from_slice(&MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&VERSION.to_be_bytes());
        b[6..8].copy_from_slice(&self.mode.code().to_be_bytes());
        b[8..16].copy_from_slice(&self.session.to_be_bytes());
        b[16..20].copy_from_slice(&self.rail.to_be_bytes());
        b[20..24].copy_from_slice(&self.rails.to_be_bytes());
        b[24..32].copy_from_slice(&self.size.to_be_bytes());
        b[32..36].copy_from_slice(&self.frag.to_be_bytes());
        b
    }

    /// Decodes and checks a hello; never panics on bad input.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<Hello> {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            bail!("not a braid baseline client (bad magic)");
        }
        let ver = u16::from_be_bytes([b[4], b[5]]);
        if ver != VERSION {
            bail!("baseline protocol version {ver}, expected {VERSION}");
        }
        let mode =
            Mode::from_code(u16::from_be_bytes([b[6], b[7]])).context("unknown baseline mode")?;
        let h = Hello {
            mode,
            session: u64_at(8),
            rail: u32_at(16),
            rails: u32_at(20),
            size: u64_at(24),
            frag: u32_at(32),
        };
        if h.rails == 0 || h.rails > 64 || h.rail >= h.rails {
            bail!("bad rail {} of {}", h.rail, h.rails);
        }
        if h.size == 0 || h.size > 1 << 32 {
            bail!("bad message size {}", h.size);
        }
        if mode == Mode::Trunking && (h.frag == 0 || h.frag > 16 << 20) {
            bail!("bad fragment size {}", h.frag);
        }
        Ok(h)
    }
}

/// Header in front of every trunking fragment (24 bytes, big-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FragHeader {
    /// Message number, counted from 0 in each run.
    pub msg: u64,
    /// Offset of the fragment inside its message.
    pub offset: u64,
    /// Payload length.
    pub len: u32,
}

impl FragHeader {
    /// Encoded length.
    pub const LEN: usize = 24;

    /// Encodes to the wire format.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0..8].copy_from_slice(&self.msg.to_be_bytes());
        b[8..16].copy_from_slice(&self.offset.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
        b[20..24].copy_from_slice(&FRAG_MAGIC.to_be_bytes());
        b
    }

    /// Decodes a header; never panics.
    pub fn decode(b: &[u8; Self::LEN]) -> Result<FragHeader> {
        if u32::from_be_bytes(b[20..24].try_into().expect("4")) != FRAG_MAGIC {
            bail!("bad fragment header (stream out of sync)");
        }
        Ok(FragHeader {
            msg: u64::from_be_bytes(b[0..8].try_into().expect("8")),
            offset: u64::from_be_bytes(b[8..16].try_into().expect("8")),
            len: u32::from_be_bytes(b[16..20].try_into().expect("4")),
        })
    }
}

/// Reassembles messages from fragments that arrive in any order across rails. Fragments wait
/// in a reorder map until every byte before them has been copied; then they are copied into
/// the destination buffer in order and their staging buffer is released.
#[derive(Debug)]
pub struct Reassembler<B> {
    size: usize,
    msg: u64,
    off: usize,
    pending: BTreeMap<(u64, u64), (u32, B)>,
    completed: u64,
    max_pending: usize,
}

impl<B: AsRef<[u8]>> Reassembler<B> {
    /// A reassembler for messages of `size` bytes.
    pub fn new(size: usize) -> Self {
        Reassembler {
            size,
            msg: 0,
            off: 0,
            pending: BTreeMap::new(),
            completed: 0,
            max_pending: 0,
        }
    }

    /// Takes one fragment whose payload is `data[..h.len]`. Copies every fragment that is now
    /// in order into `dest` (which must be `size` bytes and is reused for every message),
    /// calls `release` with each staging buffer no longer needed and `complete` with each
    /// finished message. Bad input (overlap, out of range, duplicate) is an error.
    pub fn push(
        &mut self,
        h: FragHeader,
        data: B,
        dest: &mut [u8],
        release: &mut impl FnMut(B),
        complete: &mut impl FnMut(u64, &[u8]),
    ) -> Result<()> {
        let len = h.len as usize;
        if dest.len() != self.size {
            bail!(
                "destination is {} bytes, messages are {}",
                dest.len(),
                self.size
            );
        }
        if len == 0 || data.as_ref().len() < len {
            bail!(
                "fragment {h:?}: bad length (staging holds {})",
                data.as_ref().len()
            );
        }
        if h.offset
            .checked_add(h.len as u64)
            .is_none_or(|end| end > self.size as u64)
        {
            bail!("fragment {h:?} runs past the {}-byte message", self.size);
        }
        if h.msg < self.msg || (h.msg == self.msg && (h.offset as usize) < self.off) {
            bail!("fragment {h:?} is stale (already placed)");
        }
        if self
            .pending
            .insert((h.msg, h.offset), (h.len, data))
            .is_some()
        {
            bail!("duplicate fragment {h:?}");
        }
        self.max_pending = self.max_pending.max(self.pending.len());
        while let Some((l, buf)) = self.pending.remove(&(self.msg, self.off as u64)) {
            let l = l as usize;
            dest[self.off..self.off + l].copy_from_slice(&buf.as_ref()[..l]);
            release(buf);
            self.off += l;
            if self.off == self.size {
                complete(self.msg, dest);
                self.completed += 1;
                self.msg += 1;
                self.off = 0;
            }
        }
        Ok(())
    }

    /// Messages completed so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Fragments waiting in the reorder map.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Largest number of fragments that ever waited at once.
    pub fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// Whether a message is partly placed or fragments wait.
    pub fn is_idle(&self) -> bool {
        self.off == 0 && self.pending.is_empty()
    }
}

/// Content of byte `o` of every message (depends on the offset, so misplaced data shows).
pub fn pattern_byte(o: usize) -> u8 {
    ((o as u64).wrapping_mul(0x9E37_79B1) >> 24) as u8
}

fn fill_pattern(buf: &mut [u8]) {
    for (o, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(o);
    }
}

/// CPU seconds (user + system) used by this process so far.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass; RUSAGE_SELF is always valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return f64::NAN;
    }
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// What the server reports back to the client at the end of a run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ServerReport {
    /// Bytes received in whole messages.
    pub bytes: u64,
    /// Whole messages received (trunking: reassembled).
    pub messages: u64,
    /// Server wall time from the last accept to the last byte.
    pub seconds: f64,
    /// Server CPU seconds over the same span.
    pub cpu_s: f64,
    /// Bytes per rail (including fragment headers for trunking).
    pub per_rail_bytes: Vec<u64>,
    /// Largest number of fragments waiting in the reorder buffer (trunking).
    pub max_reorder_fragments: usize,
    /// The last message's content was checked against the sender's pattern.
    pub verified: bool,
    /// Set when the server failed.
    pub error: Option<String>,
}

/// The result of one baseline client run (printed as one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BaselineResult {
    /// "tcp" or "trunking".
    pub mode: Mode,
    /// Number of rails (= streams for tcp).
    pub rails: usize,
    /// Message size in bytes.
    pub size: usize,
    /// Fragment size (trunking only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frag: Option<usize>,
    /// Whole messages delivered.
    pub iterations: u64,
    /// Bytes delivered in whole messages.
    pub bytes: u64,
    /// Seconds from the first byte sent to the server's report.
    pub seconds: f64,
    /// Goodput in MB/s (10^6 bytes).
    pub bw_mb_s: f64,
    /// Messages per second.
    pub msg_rate: f64,
    /// Client CPU seconds.
    pub client_cpu_s: f64,
    /// Server CPU seconds.
    pub server_cpu_s: f64,
    /// Client CPU seconds per 10^9 bytes moved.
    pub client_cpu_s_per_gb: f64,
    /// Server CPU seconds per 10^9 bytes moved.
    pub server_cpu_s_per_gb: f64,
    /// Bytes received on each rail.
    pub per_rail_bytes: Vec<u64>,
    /// Server's reorder high-water mark (fragments, trunking only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_reorder_fragments: Option<usize>,
}

/// Server options.
#[derive(Debug, Clone)]
pub struct ServerOpts {
    /// Addresses to listen on, one per rail.
    pub listen: Vec<SocketAddrV4>,
    /// How long to wait for a client's connections.
    pub accept_timeout: Duration,
    /// Number of client runs to serve before exiting.
    pub runs: usize,
}

/// Client options.
#[derive(Debug, Clone)]
pub struct ClientOpts {
    /// Rails to use.
    pub rails: Vec<RailSpec>,
    /// Message size.
    pub size: usize,
    /// Send for this long (stopping on a message boundary).
    pub duration: Duration,
    /// Also stop after this many messages.
    pub max_messages: Option<u64>,
    /// Trunking fragment size.
    pub frag: usize,
}

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

fn send_report(s: &TcpStream, r: &ServerReport) {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let mut s = s;
    if let Err(e) = s.write_all(&line).and_then(|_| s.shutdown(Shutdown::Write)) {
        tracing::warn!("could not send the report: {e}");
    }
}

fn accept_session(listeners: &[TcpListener], timeout: Duration) -> Result<(Hello, Vec<TcpStream>)> {
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
        let mut fds: Vec<libc::pollfd> = listeners
            .iter()
            .map(|l| libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: fds is a valid array of pollfd for the duration of the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms.max(1)) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("poll");
        }
        for (l, fd) in listeners.iter().zip(&fds) {
            if fd.revents == 0 {
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

fn serve_tcp(h: &Hello, streams: Vec<TcpStream>) -> Result<ServerReport> {
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

struct Staged {
    rail: usize,
    buf: Vec<u8>,
}

impl AsRef<[u8]> for Staged {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

fn serve_trunking(h: &Hello, streams: Vec<TcpStream>) -> Result<ServerReport> {
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
fn read_exact_or_eof(s: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
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

fn session_id() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

fn progress(duration: Duration, what: &str) -> Option<indicatif::ProgressBar> {
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

fn read_report(s: &mut TcpStream) -> Result<ServerReport> {
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

fn finish(
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

fn write_all_vectored(s: &mut TcpStream, mut a: &[u8], mut b: &[u8]) -> io::Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_roundtrip_and_rejects() {
        let h = Hello {
            mode: Mode::Trunking,
            session: 42,
            rail: 1,
            rails: 4,
            size: 1 << 20,
            frag: 65536,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[0] = 0;
        assert!(Hello::decode(&b).is_err());
        let bad = Hello { rail: 4, ..h };
        assert!(Hello::decode(&bad.encode()).is_err());
        let f = FragHeader {
            msg: 7,
            offset: 65536,
            len: 100,
        };
        assert_eq!(FragHeader::decode(&f.encode()).unwrap(), f);
        let mut fb = f.encode();
        fb[23] ^= 1;
        assert!(FragHeader::decode(&fb).is_err());
    }

    /// Feeds the fragments of three messages in a fixed scrambled order and checks every
    /// reassembled message byte for byte, and that every staging buffer comes back.
    #[test]
    fn reassembly_out_of_order() {
        let size = 10_000;
        let frag = 1024;
        let msg_bytes =
            |m: u64| -> Vec<u8> { (0..size).map(|o| (o as u64 * 31 + m * 7) as u8).collect() };
        let mut frags = Vec::new();
        for m in 0..3u64 {
            let data = msg_bytes(m);
            let mut off = 0;
            while off < size {
                let len = frag.min(size - off);
                frags.push((
                    FragHeader {
                        msg: m,
                        offset: off as u64,
                        len: len as u32,
                    },
                    data[off..off + len].to_vec(),
                ));
                off += len;
            }
        }
        let total = frags.len();
        // Deterministic scramble: a fixed permutation (multiplier coprime to 30).
        assert_eq!(total, 30);
        let order: Vec<usize> = (0..total).map(|i| (i * 7 + 3) % total).collect();
        let mut re = Reassembler::new(size);
        let mut dest = vec![0u8; size];
        let mut released = 0;
        let mut done = Vec::new();
        for &i in &order {
            let (h, d) = frags[i].clone();
            re.push(
                h,
                d,
                &mut dest,
                &mut |_b: Vec<u8>| released += 1,
                &mut |m, d: &[u8]| done.push((m, d.to_vec())),
            )
            .unwrap();
        }
        assert_eq!(released, total);
        assert_eq!(done.len(), 3);
        for (m, d) in done {
            assert_eq!(d, msg_bytes(m), "message {m}");
        }
        assert!(re.is_idle());
        assert!(re.max_pending() > 1);
        assert_eq!(re.completed(), 3);
    }

    #[test]
    fn reassembly_rejects_bad_fragments() {
        let mut re = Reassembler::new(100);
        let mut dest = vec![0u8; 100];
        let mut nop = |_b: Vec<u8>| {};
        let mut nomsg = |_m: u64, _d: &[u8]| {};
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 90,
                    len: 20
                },
                vec![0; 20],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 0,
                    len: 10
                },
                vec![0; 5],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        re.push(
            FragHeader {
                msg: 0,
                offset: 50,
                len: 50,
            },
            vec![1; 50],
            &mut dest,
            &mut nop,
            &mut nomsg,
        )
        .unwrap();
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 50,
                    len: 50
                },
                vec![1; 50],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        re.push(
            FragHeader {
                msg: 0,
                offset: 0,
                len: 50,
            },
            vec![2; 50],
            &mut dest,
            &mut nop,
            &mut nomsg,
        )
        .unwrap();
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 0,
                    len: 50
                },
                vec![2; 50],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        assert_eq!(re.completed(), 1);
    }

    /// Both baselines end to end over loopback, server and client in threads.
    #[test]
    fn loopback_runs() {
        for mode in [Mode::Tcp, Mode::Trunking] {
            let addrs: Vec<SocketAddrV4> = vec![
                "127.0.0.1:0".parse().unwrap(),
                "127.0.0.1:0".parse().unwrap(),
            ];
            let ls = bind(&addrs).unwrap();
            let bound: Vec<SocketAddrV4> = ls
                .iter()
                .map(|l| match l.local_addr().unwrap() {
                    SocketAddr::V4(a) => a,
                    _ => unreachable!(),
                })
                .collect();
            let so = ServerOpts {
                listen: bound.clone(),
                accept_timeout: Duration::from_secs(10),
                runs: 1,
            };
            let srv = thread::spawn(move || serve(mode, &ls, &so));
            let rails = bound
                .iter()
                .map(|&remote| RailSpec {
                    local: "127.0.0.1".parse().unwrap(),
                    remote,
                })
                .collect();
            let co = ClientOpts {
                rails,
                size: 300_000,
                duration: Duration::from_secs(30),
                max_messages: Some(20),
                frag: 4096,
            };
            let r = match mode {
                Mode::Tcp => run_tcp_client(&co).unwrap(),
                Mode::Trunking => run_trunking_client(&co).unwrap(),
            };
            let sr = srv.join().unwrap().unwrap();
            assert_eq!(
                r.bytes,
                20 * 300_000 * if mode == Mode::Tcp { 2 } else { 1 }
            );
            assert_eq!(sr[0].bytes, r.bytes);
            if mode == Mode::Trunking {
                assert!(sr[0].verified);
                assert!(sr[0].per_rail_bytes.iter().all(|&b| b > 0));
            }
        }
    }
}
