//! Appends and locks of several library clients of one server on loopback rails (no FUSE).

use std::sync::mpsc::channel;
use std::time::Duration;

use braid::{Context, RailAddr};
use braid_fs::client::{Client, ClientConfig, Error};
use braid_fs::proto::{Errno, LockKind, LockRange};
use braid_fs::server::{Server, ServerConfig, Squash};

fn server() -> (tempfile::TempDir, Server, Vec<RailAddr>) {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new().unwrap();
    let mut cfg = ServerConfig::new(dir.path(), vec!["127.0.0.1:0".parse().unwrap()]);
    // The tests run as root and own the export: trust root, as NFS's no_root_squash.
    cfg.squash = Squash::None;
    let server = Server::start(&ctx, cfg).unwrap();
    let rails = server
        .local_addrs()
        .iter()
        .map(|a| format!("{}={a}", a.ip()).parse().unwrap())
        .collect();
    (dir, server, rails)
}

fn client(rails: &[RailAddr]) -> Client {
    let mut cfg = ClientConfig::new(rails.to_vec());
    cfg.session.peer_timeout = Duration::from_secs(2);
    Client::connect(&Context::new().unwrap(), &cfg).unwrap()
}

fn range(kind: LockKind, start: u64, end: u64) -> LockRange {
    LockRange {
        kind,
        start,
        end,
        pid: 7,
    }
}

fn errno(r: Result<(), Error>) -> Option<Errno> {
    r.err().map(|e| e.errno())
}

/// Four clients append records at once (small ones inside requests, every tenth larger
/// than a request, reserved and written one-sided): each lands whole, at the offset the
/// server told its client, and none overlaps another.
#[test]
fn concurrent_appends_of_four_clients_never_overlap() {
    let (dir, _server, rails) = server();
    std::fs::write(dir.path().join("log"), b"").unwrap();
    let placed = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u8)
            .map(|i| {
                let rails = rails.clone();
                s.spawn(move || {
                    let c = client(&rails);
                    let f = c.open_path("log", libc::O_WRONLY | libc::O_APPEND).unwrap();
                    let mut placed = Vec::new();
                    for j in 0..40usize {
                        let len = if j % 10 == 9 { 100_000 } else { 10 + j };
                        let rec = vec![b'a' + i; len];
                        placed.push((f.append(&rec).unwrap(), rec));
                    }
                    f.flush().unwrap();
                    placed
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let content = std::fs::read(dir.path().join("log")).unwrap();
    let total: usize = placed.iter().map(|(_, r)| r.len()).sum();
    assert_eq!(content.len(), total, "no gaps, no overwrites");
    for (at, rec) in &placed {
        let at = *at as usize;
        assert_eq!(&content[at..at + rec.len()], &rec[..], "record at {at}");
    }
}

/// Byte-range locks between two clients: conflicts, F_GETLK, a waiter granted at the
/// unlock, EDEADLK for a cycle across clients.
#[test]
fn locks_between_two_clients() {
    let (dir, _server, rails) = server();
    std::fs::write(dir.path().join("f"), vec![0u8; 10]).unwrap();
    std::fs::write(dir.path().join("g"), vec![0u8; 10]).unwrap();
    let (ca, cb) = (client(&rails), client(&rails));
    let fa = ca.open_path("f", libc::O_RDWR).unwrap();
    let fb = cb.open_path("f", libc::O_RDWR).unwrap();
    let ga = ca.open_path("g", libc::O_RDWR).unwrap();
    let gb = cb.open_path("g", libc::O_RDWR).unwrap();
    fa.set_lock(1, range(LockKind::Write, 0, 9)).unwrap();
    // The same owner number on another client is another owner.
    assert_eq!(
        errno(fb.set_lock(1, range(LockKind::Read, 5, 5))),
        Some(Errno::EAGAIN)
    );
    let held = fb
        .get_lock(1, range(LockKind::Read, 0, 100))
        .unwrap()
        .unwrap();
    assert_eq!(
        (held.kind, held.start, held.end, held.pid),
        (LockKind::Write, 0, 9, 0)
    );
    assert_eq!(
        fa.get_lock(2, range(LockKind::Read, 0, 0))
            .unwrap()
            .map(|l| l.pid),
        Some(7),
        "a holder on the same client is reported with its pid"
    );
    fb.set_lock(1, range(LockKind::Write, 10, 20)).unwrap();
    gb.set_lock(1, range(LockKind::Write, 0, 0)).unwrap();
    // A waits for g (held by B) while B waits for f (held by A): whichever request reaches
    // the server second would close the cycle and is refused; the other is granted once the
    // locks are released.
    let (tx, rx) = channel();
    std::thread::scope(|s| {
        let txa = tx.clone();
        let ga = &ga;
        s.spawn(move || {
            let r = ga.set_lock_wait(1, range(LockKind::Write, 0, 0));
            txa.send(('a', r.map_err(|e| e.errno()))).unwrap();
        });
        let txb = tx.clone();
        let fb = &fb;
        s.spawn(move || {
            let r = fb.set_lock_wait(1, range(LockKind::Write, 0, 0));
            txb.send(('b', r.map_err(|e| e.errno()))).unwrap();
        });
        let (first, r) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(r, Err(Errno::EDEADLK), "{first}");
        assert!(rx.try_recv().is_err(), "the other one still waits");
        gb.set_lock(1, range(LockKind::Unlock, 0, 0)).unwrap();
        fa.set_lock(1, range(LockKind::Unlock, 0, 9)).unwrap();
        let (second, r) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_ne!(first, second);
        assert_eq!(r, Ok(()));
    });
    // flock takes exclusive locks through read-only files: the server lets it.
    let ro = cb.open_path("f", libc::O_RDONLY).unwrap();
    ro.set_lock(3, range(LockKind::Write, 50, 50)).unwrap();
}

const CHILD_RAILS: &str = "BRAID_FS_TEST_LOCK_HOLDER_RAILS";

/// Not a test by itself: the lock holder `a_killed_clients_locks_are_released` runs in a
/// process of its own (this test binary again) and kills.
#[test]
#[ignore]
fn lock_holder_child() {
    let Ok(rails) = std::env::var(CHILD_RAILS) else {
        return;
    };
    let rails: Vec<RailAddr> = vec![rails.parse().unwrap()];
    let c = client(&rails);
    let f = c.open_path("f", libc::O_RDWR).unwrap();
    f.set_lock(1, range(LockKind::Write, 0, i64::MAX as u64))
        .unwrap();
    println!("locked");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    // Killed long before this ends.
    std::thread::sleep(Duration::from_secs(60));
}

/// `kill -9` of a client process holding a lock: the server sees its connection end and
/// grants the lock to a waiting client.
#[test]
fn a_killed_clients_locks_are_released() {
    use std::io::BufRead;
    let (dir, server, _) = server();
    std::fs::write(dir.path().join("f"), b"x").unwrap();
    let addr = server.local_addrs()[0];
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["lock_holder_child", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_RAILS, format!("{}={addr}", addr.ip()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let locked = lines.any(|l| l.is_ok_and(|l| l.trim() == "locked"));
    let kill = |child: &mut std::process::Child| {
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    };
    if !locked {
        kill(&mut child);
        panic!("the child did not take its lock");
    }
    let rails: Vec<RailAddr> = vec![format!("{}={addr}", addr.ip()).parse().unwrap()];
    let c = client(&rails);
    let f = c.open_path("f", libc::O_RDWR).unwrap();
    let all = range(LockKind::Write, 0, 0);
    assert_eq!(errno(f.set_lock(1, all)), Some(Errno::EAGAIN));
    let (tx, rx) = channel();
    std::thread::scope(|s| {
        s.spawn(|| {
            tx.send(f.set_lock_wait(1, all).map_err(|e| e.errno()))
                .unwrap()
        });
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
        let killed = std::time::Instant::now();
        kill(&mut child);
        let r = rx.recv_timeout(Duration::from_secs(10));
        eprintln!("granted {:?} after the kill", killed.elapsed());
        assert_eq!(r, Ok(Ok(())));
    });
}
