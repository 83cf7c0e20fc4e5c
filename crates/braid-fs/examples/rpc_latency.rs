//! Times metadata RPCs through the client library against a server in this process (loopback).
use std::time::Instant;

use braid::Context;
use braid_fs::client::{Client, ClientConfig};
use braid_fs::server::{Server, ServerConfig, Squash};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("braid-fs-lat-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ctx = Context::new()?;
    let mut cfg = ServerConfig::new(&dir, vec!["127.0.0.1:0".parse()?]);
    // This process owns the export, root or not.
    cfg.squash = Squash::None;
    let server = Server::start(&ctx, cfg)?;
    let a = server.local_addrs()[0];
    let cctx = Context::new()?;
    let client = Client::connect(
        &cctx,
        &ClientConfig::new(vec![format!("127.0.0.1={a}").parse()?]),
    )?;
    let root = client.root().node;
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        client.getattr(root)?;
    }
    println!(
        "getattr: {:.1} us",
        t.elapsed().as_secs_f64() / n as f64 * 1e6
    );
    let t = Instant::now();
    for i in 0..500 {
        let name = format!("d{i}");
        client.mkdir(root, name.as_bytes(), 0o755)?;
        client.rmdir(root, name.as_bytes())?;
    }
    println!(
        "mkdir+rmdir: {:.1} us",
        t.elapsed().as_secs_f64() / 500.0 * 1e6
    );
    drop(client);
    server.shutdown();
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
