//! `braid bench server`: accepts an endpoint and serves the client's tests.

use std::collections::HashMap;
use std::net::{SocketAddr, SocketAddrV4, TcpListener};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{Access, CompletionKind, Context, Error as BraidError, Region, RemoteKey, Sge};

use super::{
    CTRL_IMM, CTRL_LEN, Ctrl, DATA_IMM_MASK, MAX_DEPTH, MAX_SIZE, Op, PROTO_VERSION, Peer,
    READ_SEED, Report, ServerArgs, Setup, SetupReply, check_pattern, check_status, cpu_seconds,
    rail_delta, region_matches, secs, slots_for, tcp, write_pattern,
};

/// What the server prints per test.
struct Served {
    op: Op,
    size: usize,
    report: Report,
}

pub fn run(args: &ServerArgs) -> Result<()> {
    if args.listen.is_empty() {
        bail!("--listen needs at least one address");
    }
    let timeout = secs(args.timeout, "--accept-timeout")?;
    let ctx = Context::new()?;
    let addrs: Vec<SocketAddr> = args.listen.iter().map(|a| SocketAddr::V4(*a)).collect();
    let listener = ctx.listen(&addrs).with_context(|| {
        format!(
            "listening on {}",
            braid_testbed::parse::format_addrs(&args.listen)
        )
    })?;
    let tcp = TcpListener::bind(SocketAddrV4::new(*args.listen[0].ip(), 0))
        .context("binding the TCP baseline listener")?;
    tcp.set_nonblocking(true)?;
    let tcp_port = tcp.local_addr()?.port();
    eprintln!(
        "braid bench server listening on {} (TCP baseline on port {tcp_port})",
        listener
            .local_addrs()
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    loop {
        let (scq, rcq, opts) = Peer::options(&ctx, args.chunk, &args.window)?;
        let ep = match listener.accept(&opts, timeout) {
            Ok(ep) => ep,
            Err(BraidError::Timeout(_)) if args.forever => continue,
            Err(BraidError::Timeout(_)) => {
                bail!("no client connected within {timeout:?}")
            }
            Err(e) => return Err(e).context("accepting a client"),
        };
        eprintln!(
            "client connected over {} rail(s) ({}) from {}",
            ep.rail_count(),
            ep.rail_transports().join(","),
            ep.rail_addrs()
                .iter()
                .map(|(_, r)| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        );
        let mut peer = Peer::new(&ctx, ep, scq, rcq, timeout)?;
        peer.set_spin(args.spin_us);
        let r = serve(&ctx, &mut peer, args, &tcp, timeout);
        peer.ep.close();
        match r {
            Ok(()) => eprintln!("client run done"),
            Err(e) if args.forever => eprintln!("braid bench server: client run failed: {e:#}"),
            Err(e) => return Err(e),
        }
        if !args.forever {
            return Ok(());
        }
    }
}

fn serve(
    ctx: &Context,
    peer: &mut Peer,
    args: &ServerArgs,
    tcp: &TcpListener,
    timeout: Duration,
) -> Result<()> {
    peer.post_ctrl_recv()?;
    println!(
        "{:<14} {:>10} {:>12} {:>14} {:>10} {:>12}  check",
        "op", "#bytes", "#messages", "bytes rx", "CPU s", "CPU s/GB"
    );
    loop {
        let msg = peer.wait_ctrl(timeout)?;
        match msg {
            Ctrl::Setup(s) => {
                let served = run_test(ctx, peer, &s, args, tcp, timeout)?;
                print_served(&served);
            }
            Ctrl::Bye => {
                // The client closes first (it has its results); give it a moment.
                let until = Instant::now() + Duration::from_secs(2);
                while !peer.ep.is_closed() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(2));
                }
                return Ok(());
            }
            other => bail!("unexpected control message {other:?}"),
        }
    }
}

fn print_served(s: &Served) {
    let r = &s.report;
    let moved = if r.bytes > 0 {
        r.bytes
    } else {
        r.messages * s.size as u64
    };
    let per_gb = if moved > 0 {
        format!("{:.3}", r.cpu_s / (moved as f64 / 1e9))
    } else {
        "-".into()
    };
    println!(
        "{:<14} {:>10} {:>12} {:>14} {:>10.3} {:>12}  {}",
        s.op.name(),
        s.size,
        r.messages,
        r.bytes,
        r.cpu_s,
        per_gb,
        match (&r.error, r.verified) {
            (Some(e), _) => format!("error: {e}"),
            (None, Some(true)) => "verified".into(),
            (None, Some(false)) => format!(
                "VERIFY FAILED: {}",
                r.verify_detail.as_deref().unwrap_or("")
            ),
            (None, None) => "-".into(),
        }
    );
}

fn validate(s: &Setup) -> Result<(), String> {
    if s.version != PROTO_VERSION {
        return Err(format!(
            "control protocol version {} (server speaks {PROTO_VERSION})",
            s.version
        ));
    }
    if s.size == 0 || s.size > MAX_SIZE {
        return Err(format!("size {} outside 1 .. {MAX_SIZE}", s.size));
    }
    if s.depth == 0 || s.depth > MAX_DEPTH {
        return Err(format!("depth {} outside 1 .. {MAX_DEPTH}", s.depth));
    }
    if let Some(n) = s.slots.filter(|&n| n == 0 || n > MAX_DEPTH) {
        return Err(format!("slots {n} outside 1 .. {MAX_DEPTH}"));
    }
    if !(s.max_seconds > 0.0 && s.max_seconds <= 86_400.0 * 7.0) {
        return Err(format!("max_seconds {} out of range", s.max_seconds));
    }
    Ok(())
}

/// State of one test between setup and `Done`.
struct Test {
    region: Option<Region>,
    slots: usize,
    cpu0: f64,
    t0: Instant,
    rails0: Vec<u64>,
    report: Report,
}

fn run_test(
    ctx: &Context,
    peer: &mut Peer,
    s: &Setup,
    args: &ServerArgs,
    tcp: &TcpListener,
    timeout: Duration,
) -> Result<Served> {
    let served = |report: Report| Served {
        op: s.op,
        size: s.size,
        report,
    };
    if let Err(e) = validate(s) {
        peer.post_ctrl_recv()?;
        peer.send_ctrl(&Ctrl::SetupReply(SetupReply {
            error: Some(e.clone()),
            ..Default::default()
        }))?;
        return Ok(served(Report {
            error: Some(e),
            ..Default::default()
        }));
    }
    peer.set_spin(s.spin_us.or(args.spin_us));
    // The client's loop may last max_seconds; then allow the usual timeout.
    let done_within = Duration::from_secs_f64(s.max_seconds) + timeout;
    let mut reply = SetupReply::default();
    let mut t = Test {
        region: None,
        slots: 0,
        cpu0: 0.0,
        t0: Instant::now(),
        rails0: Vec::new(),
        report: Report::default(),
    };
    let mut scratch = Vec::new();
    let mut got = Vec::new();
    // The latency tests of one-sided operations are served as their bandwidth tests.
    let op = s.op.served_as();
    match op {
        Op::Write | Op::Read | Op::FetchAdd | Op::ReadLat | Op::AtomicLat => {
            let file = match (&args.file, op) {
                (Some(path), Op::Write | Op::Read) => match file_region(ctx, path, s.size) {
                    Ok(f) => Some(f),
                    Err(e) => {
                        let e = format!("{e:#}");
                        peer.post_ctrl_recv()?;
                        peer.send_ctrl(&Ctrl::SetupReply(SetupReply {
                            error: Some(e.clone()),
                            ..Default::default()
                        }))?;
                        return Ok(served(Report {
                            error: Some(e),
                            ..Default::default()
                        }));
                    }
                },
                _ => None,
            };
            let (slots, len) = if op == Op::FetchAdd {
                (1, 4096)
            } else if let Some((_, slots)) = &file {
                (*slots, slots * s.size)
            } else {
                let slots = slots_for(s.size, s.slots.unwrap_or(s.depth));
                (slots, slots * s.size)
            };
            let from_file = file.is_some();
            let region = match file {
                Some((region, _)) => {
                    reply.file = args.file.as_ref().map(|p| p.display().to_string());
                    region
                }
                // Resident before the clock starts, as a verbs registration would make it.
                None => ctx.alloc_region_with(len, Access::all(), super::POPULATED)?,
            };
            if op == Op::Read && (!from_file || s.verify) {
                for k in 0..slots {
                    write_pattern(
                        &region,
                        k * s.size,
                        s.size,
                        READ_SEED + k as u64,
                        &mut scratch,
                    )?;
                }
            }
            reply.key = region.remote_key().to_bytes().to_vec();
            reply.slots = slots;
            t.slots = slots;
            t.region = Some(region);
            peer.post_ctrl_recv()?;
            start(peer, &mut t, reply)?;
            // The latency tests' server polls as its client does: a busy-polling target,
            // or one blocked in `wait` (which serves the requests that wake it).
            let done = if s.op.is_op_lat() && !s.wait_mode {
                match peer.poll_ctrl(done_within)? {
                    Ctrl::Done(d) => d.iterations,
                    other => bail!("expected Done, got {other:?}"),
                }
            } else {
                wait_done(peer, done_within)?
            };
            stop(peer, &mut t);
            let region = t.region.as_ref().expect("region");
            if op == Op::FetchAdd {
                let v = region
                    .atomic_u64(0)?
                    .load(std::sync::atomic::Ordering::SeqCst);
                t.report.messages = done;
                let ok = v == done;
                t.report.verified = Some(ok);
                t.report.verify_detail =
                    Some(format!("counter {v}, client completed {done} fetch-adds"));
            } else if op == Op::Write {
                t.report.messages = done;
                if s.verify {
                    let r =
                        check_write_slots(region, s.size, t.slots, done, &mut got, &mut scratch)?;
                    t.report.verified = Some(r.is_ok());
                    t.report.verify_detail = Some(match r {
                        Ok(n) => format!("{n} slot(s) hold their last write"),
                        Err(e) => e,
                    });
                }
            } else {
                t.report.messages = done;
            }
        }
        Op::Send => {
            let buf = s.size.max(CTRL_LEN);
            let r = (s.depth * 2)
                .clamp(8, 256)
                .min((super::BUF_CAP / buf).max(2));
            let region = ctx.alloc_region_with(r * buf, Access::LOCAL_WRITE, super::POPULATED)?;
            for k in 0..r {
                peer.post_recv(region.slice(k * buf, buf)?)?;
            }
            reply.recvs = r;
            start(peer, &mut t, reply)?;
            let mut bad: Option<String> = None;
            let deadline = Instant::now() + done_within;
            loop {
                let c = peer.rcq.wait(
                    Duration::from_millis(500)
                        .min(deadline.saturating_duration_since(Instant::now())),
                );
                let Some(c) = c else {
                    if Instant::now() >= deadline {
                        bail!("send test: no Done from the client within {done_within:?}");
                    }
                    if peer.ep.is_closed() {
                        bail!("send test: the endpoint closed (client gone?)");
                    }
                    continue;
                };
                if c.imm == Some(CTRL_IMM) {
                    match peer.decode(&c)? {
                        Some(Ctrl::Done(_)) => break,
                        other => bail!("send test: unexpected control message {other:?}"),
                    }
                }
                let sge = peer.take(&c)?;
                check_status(&c, "send test receive")?;
                if c.kind != CompletionKind::Recv {
                    bail!("send test: unexpected completion {c:?}");
                }
                let k = t.report.messages;
                t.report.messages += 1;
                t.report.bytes += c.byte_len;
                if s.touch {
                    let mut b = [0u8; 1];
                    for at in (0..c.byte_len as usize).step_by(4096) {
                        sge.region.read_at(sge.offset + at, &mut b)?;
                    }
                }
                if s.verify && bad.is_none() {
                    if c.byte_len as usize != s.size {
                        bad = Some(format!(
                            "message {k}: {} bytes, expected {}",
                            c.byte_len, s.size
                        ));
                    } else if let Err(off) =
                        region_matches(&sge.region, sge.offset, s.size, k, &mut got, &mut scratch)?
                    {
                        bad = Some(format!("message {k}: first wrong byte at offset {off}"));
                    }
                }
                peer.post_recv(sge)?;
            }
            stop(peer, &mut t);
            if s.verify {
                t.report.verified = Some(bad.is_none());
                t.report.verify_detail =
                    Some(bad.unwrap_or_else(|| format!("{} messages checked", t.report.messages)));
            }
        }
        Op::WriteLat | Op::SendLat => lat_server(ctx, peer, s, &mut t, reply, done_within)?,
        Op::TcpStream | Op::TcpPingPong => {
            reply.tcp_port = Some(tcp.local_addr()?.port());
            peer.post_ctrl_recv()?;
            start(peer, &mut t, reply)?;
            let r = tcp::serve(tcp, s.op, s.size, !s.wait_mode, timeout);
            match r {
                Ok((messages, bytes)) => {
                    t.report.messages = messages;
                    t.report.bytes = bytes;
                }
                Err(e) => t.report.error = Some(format!("{e:#}")),
            }
            wait_done(peer, done_within)?;
            stop(peer, &mut t);
        }
    }
    // Receives still posted: the client consumes them with pads before its next message,
    // which lands in this one.
    t.report.leftover_recvs = peer.pool.len();
    peer.post_ctrl_recv()?;
    peer.send_ctrl(&Ctrl::Report(t.report.clone()))?;
    drop(t.region);
    Ok(served(t.report))
}

/// Sends the reply and starts the clocks.
/// The pages of `path` as a region for `size`-byte operations, and how many slots of that
/// size it holds; its pages are read once first, so that the test runs from the page cache.
fn file_region(ctx: &Context, path: &std::path::Path, size: usize) -> Result<(Region, usize)> {
    use std::io::Read;
    let (file, access) = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(f) => (f, Access::REMOTE_READ | Access::REMOTE_WRITE),
        Err(_) => (
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            Access::REMOTE_READ,
        ),
    };
    let len = file.metadata()?.len() as usize;
    let slots = len / size;
    if slots == 0 {
        bail!(
            "{} has {len} bytes, less than one {size}-byte message",
            path.display()
        );
    }
    let mut warm = &file;
    let mut buf = vec![0u8; 1 << 20];
    while warm.read(&mut buf)? > 0 {}
    let region = ctx
        .register_file(&file, 0, slots * size, access)
        .with_context(|| format!("registering {}", path.display()))?;
    Ok((region, slots))
}

fn start(peer: &mut Peer, t: &mut Test, reply: SetupReply) -> Result<()> {
    t.rails0 = peer.rail_bytes();
    peer.send_ctrl(&Ctrl::SetupReply(reply))?;
    t.cpu0 = cpu_seconds();
    t.t0 = Instant::now();
    Ok(())
}

fn stop(peer: &Peer, t: &mut Test) {
    t.report.cpu_s = cpu_seconds() - t.cpu0;
    t.report.seconds = t.t0.elapsed().as_secs_f64();
    t.report.rail_bytes = rail_delta(&peer.rail_bytes(), &t.rails0);
}

fn wait_done(peer: &mut Peer, within: Duration) -> Result<u64> {
    match peer.wait_ctrl(within)? {
        Ctrl::Done(d) => Ok(d.iterations),
        other => bail!("expected Done, got {other:?}"),
    }
}

/// After `n` writes of iteration `i` into slot `i % slots`, every slot must hold the
/// pattern of the last iteration that wrote it. Returns the number of slots checked.
fn check_write_slots(
    region: &Region,
    size: usize,
    slots: usize,
    n: u64,
    got: &mut Vec<u8>,
    scratch: &mut Vec<u8>,
) -> Result<Result<usize, String>> {
    let mut checked = 0;
    for k in 0..slots as u64 {
        if k >= n {
            break;
        }
        let last = k + (n - 1 - k) / slots as u64 * slots as u64;
        if let Err(off) = region_matches(region, k as usize * size, size, last, got, scratch)? {
            return Ok(Err(format!(
                "slot {k} (last written by iteration {last}): first wrong byte at offset {off}"
            )));
        }
        checked += 1;
    }
    Ok(Ok(checked))
}

/// Server side of a ping-pong: answer every ping with a pong of the same size (write-lat:
/// write-with-imm from the region the client wrote into; send-lat: send back the received
/// buffer). Busy-polls unless the client asked for the blocking variant.
fn lat_server(
    ctx: &Context,
    peer: &mut Peer,
    s: &Setup,
    t: &mut Test,
    mut reply: SetupReply,
    within: Duration,
) -> Result<()> {
    const R: usize = 4;
    let size = s.size;
    let write = s.op == Op::WriteLat;
    let client_key = if write {
        Some(
            s.client_key
                .as_deref()
                .and_then(RemoteKey::from_bytes)
                .context("write-lat setup without the client's key")?,
        )
    } else {
        None
    };
    let region = ctx.alloc_region(size.max(8), Access::all())?;
    let buf = if write { CTRL_LEN } else { size.max(CTRL_LEN) };
    let rbufs = ctx.alloc_region(R * buf, Access::LOCAL_WRITE)?;
    for k in 0..R {
        peer.post_recv(rbufs.slice(k * buf, buf)?)?;
    }
    reply.key = region.remote_key().to_bytes().to_vec();
    reply.slots = 1;
    reply.recvs = R;
    start(peer, t, reply)?;
    let deadline = Instant::now() + within;
    let mut pending: HashMap<u64, Sge> = HashMap::new();
    let mut outstanding = 0usize;
    let mut seq = 0u64;
    let mut spins = 0u32;
    let mut bad: Option<String> = None;
    let (mut got, mut scratch) = (Vec::new(), Vec::new());
    let pong_src = region.slice(0, size)?;
    'outer: loop {
        let c = if s.wait_mode {
            peer.rcq.wait(Duration::from_millis(100))
        } else {
            peer.rcq.poll()
        };
        let Some(c) = c else {
            spins = spins.wrapping_add(1);
            if !s.wait_mode && spins.is_multiple_of(super::YIELD_EVERY) {
                // As the client's poll loop: a yield now and then, not per poll.
                std::thread::yield_now();
            }
            if (s.wait_mode || spins.is_multiple_of(1024)) && Instant::now() >= deadline {
                bail!("latency test: no Done from the client within {within:?}");
            }
            if (s.wait_mode || spins.is_multiple_of(65536)) && peer.ep.is_closed() {
                bail!("latency test: the endpoint closed (client gone?)");
            }
            // Pongs complete when the client's next ping arrives (its Done rides with it),
            // and are drained after that ping: polling the send queue on every empty poll
            // too would make each poll of a busy loop twice as long, and a ping wait longer
            // to be seen.
            if s.wait_mode || spins.is_multiple_of(super::YIELD_EVERY) {
                drain_pongs(peer, &mut outstanding, &mut pending)?;
            }
            continue;
        };
        {
            if c.imm == Some(CTRL_IMM) {
                match peer.decode(&c)? {
                    Some(Ctrl::Done(_)) => break 'outer,
                    other => bail!("latency test: unexpected control message {other:?}"),
                }
            }
            let sge = peer.take(&c)?;
            check_status(&c, "latency test receive")?;
            let ping = t.report.messages;
            t.report.messages += 1;
            match (write, c.kind, c.imm) {
                (true, CompletionKind::RecvWriteImm, Some(imm)) if imm <= DATA_IMM_MASK => {
                    if s.verify
                        && bad.is_none()
                        && let Err(off) =
                            region_matches(&region, 0, size, imm as u64, &mut got, &mut scratch)?
                    {
                        bad = Some(format!("ping {imm}: first wrong byte at offset {off}"));
                    }
                    let key = client_key.as_ref().expect("write-lat key");
                    post_retry(peer, &mut outstanding, &mut pending, |ep| {
                        ep.write_with_imm(seq, std::slice::from_ref(&pong_src), key, 0, imm)
                    })?;
                    // Reposted after the pong left, as the TCP ping-pong's server answers
                    // first (R receives are posted; the next ping needs this pong first).
                    peer.post_recv(sge)?;
                }
                (false, CompletionKind::Recv, None) => {
                    if s.verify && bad.is_none() {
                        if c.byte_len as usize != size {
                            bad = Some(format!("ping {ping}: {} bytes", c.byte_len));
                        } else if let Err(off) =
                            check_pattern(ping, &sge.region.to_vec(sge.offset, size)?, &mut scratch)
                        {
                            bad = Some(format!("ping {ping}: first wrong byte at offset {off}"));
                        }
                    }
                    let echo = sge.region.slice(sge.offset, size)?;
                    post_retry(peer, &mut outstanding, &mut pending, |ep| {
                        ep.send(seq, std::slice::from_ref(&echo))
                    })?;
                    pending.insert(seq, sge);
                }
                _ => bail!("latency test: unexpected completion {c:?}"),
            }
            seq += 1;
        }
        drain_pongs(peer, &mut outstanding, &mut pending)?;
    }
    stop(peer, t);
    // Let the last pongs complete (they reserve queue slots); their buffers stay unposted.
    let until = Instant::now() + peer.stall;
    while outstanding > 0 {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("latency test: {outstanding} pong(s) never completed");
        }
        if let Some(c) = peer.scq.wait(left) {
            check_status(&c, "pong")?;
            outstanding -= 1;
        }
    }
    if s.verify {
        t.report.verified = Some(bad.is_none());
        t.report.verify_detail =
            Some(bad.unwrap_or_else(|| format!("{} pings checked", t.report.messages)));
    }
    Ok(())
}

fn drain_pongs(
    peer: &mut Peer,
    outstanding: &mut usize,
    pending: &mut HashMap<u64, Sge>,
) -> Result<()> {
    while let Some(c) = peer.scq.poll() {
        check_status(&c, "pong")?;
        *outstanding -= 1;
        if let Some(sge) = pending.remove(&c.wr_id) {
            peer.post_recv(sge)?;
        }
    }
    Ok(())
}

/// Posts with `f`, draining send completions (and reposting their receive buffers) while
/// the queue is full.
fn post_retry(
    peer: &mut Peer,
    outstanding: &mut usize,
    pending: &mut HashMap<u64, Sge>,
    f: impl Fn(&braid::Endpoint) -> Result<(), BraidError>,
) -> Result<()> {
    // Read the clock only once the queue is full: a latency loop posts every pong here.
    let mut until = None;
    loop {
        match f(&peer.ep) {
            Ok(()) => {
                *outstanding += 1;
                return Ok(());
            }
            Err(BraidError::QueueFull { .. })
                if Instant::now() < *until.get_or_insert_with(|| Instant::now() + peer.stall) =>
            {
                if let Some(c) = peer.scq.wait(Duration::from_millis(10)) {
                    check_status(&c, "pong")?;
                    *outstanding -= 1;
                    if let Some(sge) = pending.remove(&c.wr_id) {
                        peer.post_recv(sge)?;
                    }
                }
            }
            Err(e) => return Err(e).context("posting a pong"),
        }
    }
}
