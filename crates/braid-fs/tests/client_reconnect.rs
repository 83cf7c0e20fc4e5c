//! A client across server restarts: a new server on the same export and addresses takes
//! the old node ids, and a [`Reconnecting`] client connects to it again by itself.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use braid::{Context, RailAddr};
use braid_fs::client::{ClientConfig, Reconnecting};
use braid_fs::server::{Server, ServerConfig, Squash};

fn start(ctx: &Context, root: &Path, listen: Vec<SocketAddr>) -> Server {
    // The old server's listening sockets are closed at shutdown; a bounded retry covers a
    // port that is not yet free again.
    let mut config = ServerConfig::new(root, listen);
    // The tests run as root and own the export: trust root, as NFS's no_root_squash.
    config.squash = Squash::None;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Server::start(ctx, config.clone()) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("restart: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("the server does not start again: {e}"),
        }
    }
}

fn rails(server: &Server) -> Vec<RailAddr> {
    server
        .local_addrs()
        .iter()
        .map(|a| format!("{}={a}", a.ip()).parse().unwrap())
        .collect()
}

fn config(rails: Vec<RailAddr>) -> ClientConfig {
    let mut cfg = ClientConfig::new(rails);
    cfg.session.peer_timeout = Duration::from_secs(2);
    cfg.connect_timeout = Duration::from_secs(2);
    cfg
}

/// Waits (bounded) until the client has seen its connection fail.
fn wait_dead(c: &Reconnecting) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.current().is_connected() {
        assert!(
            Instant::now() < deadline,
            "the client never saw the server go"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed) as u8)
        .collect()
}

#[test]
fn old_node_ids_work_after_a_restart_and_calls_wait_for_the_server() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/f"), b"before").unwrap();
    let ctx = Context::new().unwrap();
    let listen = vec![
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.2:0".parse().unwrap(),
    ];
    let server = start(&ctx, dir.path(), listen);
    let addrs = server.local_addrs();
    let c = Arc::new(Reconnecting::connect(&ctx, &config(rails(&server))).unwrap());
    let f = c.walk("d/f", false).unwrap();
    let d = c.walk("d", false).unwrap();
    server.shutdown();
    wait_dead(&c);

    // A call made while no server runs waits for the new one.
    let waiting = {
        let c = c.clone();
        std::thread::spawn(move || c.getattr(f.node))
    };
    let server = start(&ctx, dir.path(), addrs);
    let attr = waiting.join().unwrap().expect("the waiting call failed");
    assert_eq!(attr.ino, f.attr.ino);
    assert_eq!(attr.size, 6);
    assert_eq!(c.reconnects(), 1);
    // Names looked up before the restart still work, as directories and as files.
    let again = c.lookup(d.node, b"f").unwrap();
    assert_eq!(
        again.node, f.node,
        "the restarted server gave another handle"
    );
    let file = c.open(f.node, libc::O_RDONLY).unwrap();
    assert_eq!(file.read_vec(0, 64).unwrap(), b"before");
    drop(file);
    server.shutdown();
}

#[test]
fn a_soft_client_gives_up_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new().unwrap();
    let server = start(&ctx, dir.path(), vec!["127.0.0.1:0".parse().unwrap()]);
    let mut cfg = config(rails(&server));
    cfg.reconnect_timeout = Some(Duration::from_millis(500));
    let c = Reconnecting::connect(&ctx, &cfg).unwrap();
    let root = c.root().node;
    server.shutdown();
    wait_dead(&c);
    let t = Instant::now();
    assert!(c.connected().is_err());
    assert!(c.getattr(root).is_err());
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "gave up only after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_stream_of_writes_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new().unwrap();
    let server = start(&ctx, dir.path(), vec!["127.0.0.1:0".parse().unwrap()]);
    let addrs = server.local_addrs();
    let c = Arc::new(Reconnecting::connect(&ctx, &config(rails(&server))).unwrap());
    let (e, file) = c
        .create(c.root().node, b"stream", 0o644, libc::O_RDWR)
        .unwrap();
    drop(file);
    const CHUNK: usize = 256 << 10;
    const CHUNKS: usize = 64;
    let source = Arc::new(pattern(CHUNK * CHUNKS, 11));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Each chunk: open by the node id, write, flush (commit), close; a chunk whose any step
    // failed is written again whole (writes at an offset are idempotent).
    let writer = {
        let (c, source, done, stop) = (c.clone(), source.clone(), done.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut failures = 0;
            for i in 0..CHUNKS {
                loop {
                    assert!(!stop.load(Ordering::Relaxed), "stopped");
                    let r = c.open(e.node, libc::O_WRONLY).and_then(|f| {
                        f.write_all_at((i * CHUNK) as u64, &source[i * CHUNK..][..CHUNK])?;
                        f.sync_all()
                    });
                    match r {
                        Ok(()) => break,
                        Err(err) => {
                            failures += 1;
                            assert!(failures < 200, "chunk {i} keeps failing: {err}");
                        }
                    }
                }
                done.store(i + 1, Ordering::Release);
            }
            failures
        })
    };
    let mut server = Some(server);
    for at in [CHUNKS / 4, CHUNKS / 2] {
        let deadline = Instant::now() + Duration::from_secs(120);
        while done.load(Ordering::Acquire) < at {
            if Instant::now() > deadline {
                stop.store(true, Ordering::Relaxed);
                panic!(
                    "the writer is stuck at chunk {}",
                    done.load(Ordering::Relaxed)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        server.take().unwrap().shutdown();
        server = Some(start(&ctx, dir.path(), addrs.clone()));
    }
    let failures = writer.join().unwrap();
    assert!(
        c.reconnects() >= 1,
        "never reconnected ({failures} failures)"
    );
    assert_eq!(
        std::fs::read(dir.path().join("stream")).unwrap(),
        *source,
        "the file differs from its source"
    );
    server.take().unwrap().shutdown();
}
