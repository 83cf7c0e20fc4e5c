//! Measures the file server under idle and handle-hoarding peers (issue 39). Three roles, each
//! its own process so descriptor counts are not mixed:
//!
//! ```text
//! fs_hostile serve DIR SECS            # a server on 127.0.0.1:0; prints its port, then
//!                                      # once a second: fds, endpoints, CPU
//! fs_hostile idle ADDR N SECS          # N braid endpoints that never say Hello
//! fs_hostile hoard ADDR SECS           # one client opening directories until refused
//! fs_hostile client ADDR               # one real client: connect, write, read back, timed
//! ```
//!
//! Against `braid fs serve` with a 1,024-descriptor limit (docs/FS.md, Security, Limits):
//!
//! ```text
//! (ulimit -n 1024; exec braid fs serve --export $EX --listen 127.0.0.1:0) >$LOG 2>&1 &
//! fs_hostile idle 127.0.0.1:$PORT 1000 10 &   # then, while it holds them:
//! fs_hostile client 127.0.0.1:$PORT; fs_hostile hoard 127.0.0.1:$PORT 2
//! ls /proc/$SERVER_PID/fd | wc -l; awk '{print $14+$15}' /proc/$SERVER_PID/stat   # fds, CPU ticks
//! ```
use std::time::{Duration, Instant};

use braid::{Context, EndpointOptions, RailTransport};
use braid_fs::client::{Client, ClientConfig};
use braid_fs::server::{Server, ServerConfig};

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// User + system CPU seconds of this process.
fn cpu() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat(5), counted from after the command name (field 3 is index 0).
    (ticks(11) + ticks(12)) / 100.0
}

fn rails(addr: &str) -> Vec<braid::RailAddr> {
    let ip = addr.split(':').next().unwrap_or("127.0.0.1");
    vec![format!("{ip}={addr}").parse().expect("an address IP:PORT")]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let num = |i: usize| arg(i).parse::<u64>().unwrap_or(10);
    let ctx = Context::new()?;
    match arg(0).as_str() {
        "serve" => {
            let server = Server::start(
                &ctx,
                ServerConfig::new(arg(1), vec!["127.0.0.1:0".parse()?]),
            )?;
            println!("port {}", server.local_addrs()[0].port());
            let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
            println!("nofile soft {:?} hard {:?}", limit.current, limit.maximum);
            let (t0, c0) = (Instant::now(), cpu());
            let mut last = (t0, c0);
            while t0.elapsed() < Duration::from_secs(num(2)) {
                std::thread::sleep(Duration::from_secs(1));
                let (now, c) = (Instant::now(), cpu());
                let pct = 100.0 * (c - last.1) / (now - last.0).as_secs_f64();
                println!(
                    "t {:>3} s fds {:>5} endpoints {:>5} cpu {pct:>5.1}%",
                    t0.elapsed().as_secs(),
                    fds(),
                    server.endpoints()
                );
                last = (now, c);
            }
            server.shutdown();
        }
        "idle" => {
            let cq = ctx.create_cq(64);
            let mut opts = EndpointOptions::new(&cq);
            opts.transport = RailTransport::Tcp;
            opts.connect_timeout = Duration::from_secs(2);
            let r = rails(&arg(1));
            let (mut eps, mut failed) = (Vec::new(), 0);
            let t0 = Instant::now();
            for _ in 0..num(2) {
                match ctx.connect(&r, &opts) {
                    Ok(ep) => eps.push(ep),
                    Err(_) => failed += 1,
                }
            }
            println!(
                "idle: {} endpoints connected, {failed} failed, in {:.1} s",
                eps.len(),
                t0.elapsed().as_secs_f64()
            );
            std::thread::sleep(Duration::from_secs(num(3)));
            let open = eps.iter().filter(|e| !e.is_closed()).count();
            println!("idle: {open} still open after {} s", num(3));
        }
        "hoard" => {
            let client = Client::connect(&ctx, &ClientConfig::new(rails(&arg(1))))?;
            let root = client.root().node;
            let mut held = Vec::new();
            let err = loop {
                match braid_fs::client::DirIter::open(&client, root) {
                    Ok(h) => held.push(h),
                    Err(e) => break e,
                }
                if held.len() > 10_000_000 {
                    break braid_fs::client::Error::Invalid("no limit".into());
                }
            };
            println!("hoard: {} directory handles, then: {err}", held.len());
            std::thread::sleep(Duration::from_secs(num(2)));
        }
        "client" => {
            let t0 = Instant::now();
            let client = Client::connect(&ctx, &ClientConfig::new(rails(&arg(1))))?;
            let connected = t0.elapsed();
            let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7) as u8).collect();
            let name = format!("probe-{}", std::process::id());
            let (_, f) = client.create(
                client.root().node,
                name.as_bytes(),
                0o644,
                libc::O_RDWR | libc::O_EXCL,
            )?;
            f.write_all_at(0, &data)?;
            f.sync_all()?;
            let back = f.read_vec(0, data.len())?;
            assert_eq!(back, data, "data intact");
            println!(
                "client: connected in {:.1} ms, 1 MiB written and read back intact in {:.1} ms",
                connected.as_secs_f64() * 1e3,
                t0.elapsed().as_secs_f64() * 1e3
            );
        }
        _ => eprintln!("usage: see the comment at the top of fs_hostile.rs"),
    }
    Ok(())
}
