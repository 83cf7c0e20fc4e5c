//! What braid's own code costs per small message, without the wire or a second core: two
//! contexts in this process joined by a one-rail endpoint, and one thread that plays both
//! sides of an 8 B `write_with_imm` ping-pong (post on one side, poll the other side's
//! queue, which reads the rail itself, and back). A frame is in the rail before the other
//! side polls, so the time per message is posting, framing, reading, executing and
//! completing, and nothing else: on a same-host ring (the default) it is all user space;
//! with `tcp` it adds a `sendmsg` and a `recv` on loopback, and the same exchange over plain
//! sockets is timed beside it.
//!
//! Run: `cargo run --release -p braid --example msg_cost -- [MESSAGES] [tcp]`. For the same
//! path counted in instructions per function: `valgrind --tool=callgrind
//! target/release/examples/msg_cost 5000` (docs/RESULTS.md, "Where a small message's
//! time goes").

use std::time::{Duration, Instant};

use braid::{
    Access, CompletionKind, CompletionQueue, Context, EndpointOptions, RailAddr, RailTransport,
    Status,
};

const WAIT: Duration = Duration::from_secs(10);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(100_000);
    let tcp = args.next().as_deref() == Some("tcp");

    let (sctx, cctx) = (Context::new()?, Context::new()?);
    let (scq, ccq) = (sctx.create_cq(256), cctx.create_cq(256));
    let listener = sctx.listen(&["127.0.0.1:0".parse()?])?;
    let addr = listener.local_addrs()[0];
    let (mut so, mut co) = (EndpointOptions::new(&scq), EndpointOptions::new(&ccq));
    if tcp {
        (so.transport, co.transport) = (RailTransport::Tcp, RailTransport::Tcp);
    }
    let accept = std::thread::spawn(move || listener.accept(&so, WAIT));
    let client = cctx.connect(&[RailAddr::new(None, addr)], &co)?;
    let server = accept
        .join()
        .map_err(|_| "the accepting thread panicked")??;

    let (sreg, creg) = (
        sctx.alloc_region(4096, Access::all())?,
        cctx.alloc_region(4096, Access::all())?,
    );
    let (skey, ckey) = (sreg.remote_key(), creg.remote_key());
    let (sping, cping) = (sreg.slice(0, 8)?, creg.slice(0, 8)?);
    let (srecv, crecv) = (sreg.slice(64, 8)?, creg.slice(64, 8)?);

    // The next receive completion of `cq`; send completions met on the way are checked.
    let next_recv = |cq: &CompletionQueue| -> Result<u64, String> {
        let start = Instant::now();
        let mut empty_polls = 0;
        loop {
            match cq.poll() {
                Some(c) if c.status != Status::Success => return Err(format!("{c:?}")),
                Some(c) if c.kind == CompletionKind::RecvWriteImm => return Ok(empty_polls),
                Some(_) => {}
                None if start.elapsed() > WAIT => return Err("no completion".into()),
                None => empty_polls += 1,
            }
        }
    };

    // Returns the time taken and the polls that found nothing.
    let run = |count: u64| -> Result<(Duration, u64), Box<dyn std::error::Error>> {
        let (t0, mut empty_polls) = (Instant::now(), 0);
        for i in 0..count {
            server.post_recv(i, std::slice::from_ref(&srecv))?;
            client.post_recv(i, std::slice::from_ref(&crecv))?;
            client.write_with_imm(i, std::slice::from_ref(&cping), &skey, 8, 1)?;
            empty_polls += next_recv(&scq)?;
            server.write_with_imm(i, std::slice::from_ref(&sping), &ckey, 8, 2)?;
            empty_polls += next_recv(&ccq)?;
        }
        Ok((t0.elapsed(), empty_polls))
    };
    run(n / 10 + 1)?; // warm-up: caches, the allocator, rate estimates
    let (dt, empty_polls) = run(n)?;
    // Both sides' send completions, which came with the replies.
    while scq.poll().is_some() || ccq.poll().is_some() {}
    let per_msg = dt.as_secs_f64() * 1e9 / (2 * n) as f64;
    println!(
        "{} rail, {} messages: {per_msg:.0} ns per message (one way, both ends on one thread), \
         {empty_polls} empty polls",
        if tcp { "tcp" } else { "same-host" },
        2 * n,
    );
    // A poll that finds nothing: what a busy-polling thread pays per turn of its loop, and
    // so (half of it, on average) what it adds to a message's latency before it sees it.
    // (The last sends' completions may still come: a busy poller reads the answers that no
    // reply carried only every so many polls.)
    let polls = 1_000_000;
    let t0 = Instant::now();
    for _ in 0..polls {
        if let Some(c) = scq.poll()
            && (c.kind != CompletionKind::Write || c.status != Status::Success)
        {
            return Err(format!("a completion nobody asked for: {c:?}").into());
        }
    }
    println!(
        "empty poll: {:.1} ns",
        t0.elapsed().as_secs_f64() * 1e9 / polls as f64
    );
    if tcp {
        // The same exchange with plain sockets: 8 B written on one, read on the other.
        let raw = raw_tcp_per_message(n)?;
        println!(
            "plain TCP loopback, the same pattern: {raw:.0} ns per message; braid adds {:.0} ns",
            per_msg - raw
        );
    }
    Ok(())
}

/// Nanoseconds per 8 B message of a one-thread ping-pong over a loopback TCP connection
/// (`TCP_NODELAY`, as braid's rails).
fn raw_tcp_per_message(n: u64) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    let mut a = std::net::TcpStream::connect(l.local_addr()?)?;
    let mut b = l.accept()?.0;
    a.set_nodelay(true)?;
    b.set_nodelay(true)?;
    let mut buf = [0u8; 8];
    let mut exchange = |count: u64| -> std::io::Result<Duration> {
        let t0 = Instant::now();
        for _ in 0..count {
            a.write_all(&buf)?;
            b.read_exact(&mut buf)?;
            b.write_all(&buf)?;
            a.read_exact(&mut buf)?;
        }
        Ok(t0.elapsed())
    };
    exchange(n / 10 + 1)?;
    Ok(exchange(n)?.as_secs_f64() * 1e9 / (2 * n) as f64)
}
