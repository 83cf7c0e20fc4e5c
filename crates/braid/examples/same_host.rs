//! Two processes on one host: the rails move onto shared-memory rings by themselves, and a
//! large write is copied once, by the target, straight from the writer's region.
//!
//! The example starts itself again as the peer process (which listens and serves), then
//! writes and reads back `MiB` twice: once over the default transport (same-host rings) and
//! once with `RailTransport::Tcp`, and prints both. Run:
//! `cargo run --release -p braid --example same_host -- [MiB]`.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use braid::{
    Access, Context, EndpointOptions, RailAddr, RailTransport, RegionOptions, RemoteKey, Status,
};

const PEER_ENV: &str = "BRAID_EXAMPLE_SAME_HOST_PEER";
const WAIT: Duration = Duration::from_secs(30);

fn populated() -> RegionOptions {
    RegionOptions {
        populate: true,
        ..RegionOptions::default()
    }
}

/// The peer process: one region, its key and port on stdout, then two endpoints served in
/// turn until stdin closes.
fn peer(mib: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = Context::new()?;
    let cq = ctx.create_cq(64);
    let listener = ctx.listen(&["127.0.0.1:0".parse()?])?;
    // Populated, so that neither transport pays the first touch of its pages.
    let target = ctx.alloc_region_with(mib << 20, Access::all(), populated())?;
    let key = target.remote_key().to_bytes();
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    println!("{} {hex}", listener.local_addrs()[0]);
    std::io::stdout().flush()?;
    let mut endpoints = Vec::new();
    for _ in 0..2 {
        endpoints.push(listener.accept(&EndpointOptions::new(&cq), WAIT)?);
    }
    // The engine serves the writes and reads; stay until the parent is done.
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mib: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(64);
    if std::env::var_os(PEER_ENV).is_some() {
        return peer(mib);
    }
    let mut child = Command::new(std::env::current_exe()?)
        .arg(mib.to_string())
        .env(PEER_ENV, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut first = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut first)?;
    let (addr, hex) = first.trim().split_once(' ').ok_or("bad peer line")?;
    let addr: SocketAddr = addr.parse()?;
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<_, _>>()?;
    let key = RemoteKey::from_bytes(&bytes).ok_or("bad remote key")?;

    let ctx = Context::new()?;
    let cq = ctx.create_cq(64);
    let src = ctx.alloc_region(mib << 20, Access::all())?;
    let back = ctx.alloc_region_with(mib << 20, Access::all(), populated())?;
    let data: Vec<u8> = (0..mib << 20).map(|i| (i * 31 % 251) as u8).collect();
    src.write_at(0, &data)?;
    for transport in [RailTransport::Auto, RailTransport::Tcp] {
        let mut opts = EndpointOptions::new(&cq);
        opts.transport = transport;
        let ep = ctx.connect(&[RailAddr::new(None, addr)], &opts)?;
        let mut times = Vec::new();
        for (id, op) in [(1, "write"), (2, "read")] {
            back.write_at(0, &[0u8; 4096])?;
            let t = Instant::now();
            if op == "write" {
                ep.write(id, &[src.as_sge()], &key, 0)?;
            } else {
                ep.read(id, &[back.as_sge()], &key, 0)?;
            }
            let c = cq.wait(WAIT).ok_or("no completion")?;
            assert_eq!(c.status, Status::Success, "{c:?}");
            times.push(t.elapsed());
        }
        assert!(
            back.to_vec(0, mib << 20)? == data,
            "the bytes read back differ"
        );
        let rate = |d: Duration| (mib << 20) as f64 / d.as_secs_f64() / 1e6;
        println!(
            "{:?} rails over {}: wrote {mib} MiB into the other process in {:?} ({:.0} MB/s), \
             read it back in {:?} ({:.0} MB/s), verified",
            transport,
            ep.rail_transports().join(","),
            times[0],
            rate(times[0]),
            times[1],
            rate(times[1]),
        );
    }
    drop(child.stdin.take());
    child.wait()?;
    Ok(())
}
