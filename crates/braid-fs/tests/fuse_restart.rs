//! A mount across server restarts: after the server is shut down and started again on the
//! same export and addresses, the mount connects again by itself; names looked up before
//! work, and calls made while no server ran wait for it instead of failing. Skips (saying
//! why) where /dev/fuse or root is missing.

mod common;

use std::fs;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use braid::Context;
use braid_fs::mount::Mount;
use braid_fs::server::{Server, ServerConfig, Squash};
use common::Loopback;

/// Starts a server on `listen` again, retrying (bounded) while the old ports are not free.
fn restart(export: &Path, listen: Vec<SocketAddr>) -> Server {
    let ctx = Context::new().unwrap();
    let mut config = ServerConfig::new(export, listen);
    // The tests run as root and own the export: trust root, as NFS's no_root_squash.
    config.squash = Squash::None;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match Server::start(&ctx, config.clone()) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                eprintln!("restart: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("the server does not start again: {e}"),
        }
    }
}

fn wait_disconnected(m: &Mount) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while m.server_connected() {
        assert!(
            Instant::now() < deadline,
            "the mount never saw the server go"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_mount_works_again_after_a_server_restart() {
    require_fuse!();
    let mut lb = Loopback::new(2);
    let m = lb.mount("m", |c| {
        c.attr_timeout = Duration::ZERO;
        c.entry_timeout = Duration::ZERO;
    });
    let root = m.mountpoint().to_path_buf();
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/before"), b"written before").unwrap();
    let addrs = lb.server.as_ref().unwrap().local_addrs();
    for round in 0..2 {
        lb.server.take().unwrap().shutdown();
        wait_disconnected(&m);
        // Made while no server runs: waits for the next one.
        let name = format!("d/during-{round}");
        let writer = {
            let p = root.join(&name);
            std::thread::spawn(move || fs::write(p, b"written while the server was down"))
        };
        lb.server = Some(restart(&lb.export(), addrs.clone()));
        writer
            .join()
            .unwrap()
            .expect("a call made while disconnected failed");
        assert_eq!(m.reconnects(), round + 1);
        assert_eq!(
            fs::read(lb.export().join(&name)).unwrap(),
            b"written while the server was down"
        );
        // Names looked up before the restart (the kernel keeps their node ids).
        assert_eq!(fs::read(root.join("d/before")).unwrap(), b"written before");
        let mut names: Vec<String> = fs::read_dir(root.join("d"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert!(names.contains(&"before".to_string()), "{names:?}");
        assert!(names.contains(&format!("during-{round}")), "{names:?}");
    }
}
