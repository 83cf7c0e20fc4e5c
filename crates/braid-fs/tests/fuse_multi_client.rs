//! Several FUSE mounts (clients) of one export: appends and locks across clients. Skips
//! (saying why) where /dev/fuse or root is missing; CI runs as root.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use braid::Context;
use braid_fs::client::{Client, ClientConfig};
use braid_fs::proto::{LockKind, LockRange};
use common::Loopback;

/// Longest a test waits for a lock another thread should be granted.
const GRANT_WAIT: Duration = Duration::from_secs(10);

fn long_caches(c: &mut braid_fs::mount::MountConfig) {
    // Long attribute caches: close-to-open alone must keep appends right.
    c.attr_timeout = Duration::from_secs(30);
    c.entry_timeout = Duration::from_secs(30);
}

fn append_line(path: &Path, line: &str) {
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(line.as_bytes()).unwrap();
}

/// Every expected line once, nothing else.
fn check_lines(content: &str, mut expected: Vec<String>) {
    let mut got: Vec<String> = content.lines().map(str::to_string).collect();
    got.sort();
    expected.sort();
    assert_eq!(got.len(), expected.len(), "line count");
    assert_eq!(got, expected);
}

/// `echo X >> f` from two mounts in turns: every line lands, in order (issue 45: 9 of 100).
#[test]
fn appends_in_turns_from_two_mounts_keep_every_line() {
    require_fuse!();
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", long_caches), lb.mount("b", long_caches));
    let (pa, pb) = (a.mountpoint().join("w"), b.mountpoint().join("w"));
    let mut want = String::new();
    for i in 0..50 {
        append_line(&pa, &format!("A{i}\n"));
        append_line(&pb, &format!("B{i}\n"));
        want.push_str(&format!("A{i}\nB{i}\n"));
    }
    assert_eq!(fs::read_to_string(lb.export().join("w")).unwrap(), want);
    assert_eq!(fs::read_to_string(&pa).unwrap(), want);
    assert_eq!(fs::metadata(&pb).unwrap().len(), want.len() as u64);
    // Through `sh`'s `>>` too, and an append larger than one request.
    let big = "x".repeat(200_000) + "\n";
    append_line(&pa, &big);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("echo tail >> {}", pb.display()))
        .status()
        .unwrap();
    assert!(out.success());
    want.push_str(&big);
    want.push_str("tail\n");
    assert_eq!(fs::read_to_string(lb.export().join("w")).unwrap(), want);
}

/// An appending descriptor that can also read bypasses the page cache (the server places
/// its bytes), yet reads and shared mappings of it see what it appended.
#[test]
fn an_appending_read_write_file_reads_and_maps() {
    require_fuse!();
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", long_caches), lb.mount("b", long_caches));
    fs::write(a.mountpoint().join("f"), b"0123").unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .append(true)
        .open(b.mountpoint().join("f"))
        .unwrap();
    append_line(&a.mountpoint().join("f"), "4567");
    f.write_all(b"89").unwrap();
    let mut back = String::new();
    std::io::Read::read_to_string(
        &mut File::open(b.mountpoint().join("f")).unwrap(),
        &mut back,
    )
    .unwrap();
    assert_eq!(back, "0123456789");
    // SAFETY: a fresh mapping of 10 bytes of an open file, read while mapped, unmapped.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            10,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        assert_eq!(
            std::slice::from_raw_parts(p as *const u8, 10),
            b"0123456789"
        );
        libc::munmap(p, 10);
    }
}

/// Four mounts appending at once, each line by its own open/append/close: all intact.
#[test]
fn concurrent_appends_from_four_mounts_keep_every_line() {
    require_fuse!();
    let lb = Loopback::new(1);
    let mounts: Vec<_> = (0..4)
        .map(|i| lb.mount(&format!("m{i}"), long_caches))
        .collect();
    let mut expected = Vec::new();
    std::thread::scope(|s| {
        for (i, m) in mounts.iter().enumerate() {
            let p = m.mountpoint().join("log");
            s.spawn(move || {
                for j in 0..60 {
                    // Lines of different lengths, so an overwrite cannot hide.
                    append_line(&p, &format!("client{i} line{j} {}\n", "#".repeat(j % 7)));
                }
            });
        }
    });
    for i in 0..4 {
        for j in 0..60 {
            expected.push(format!("client{i} line{j} {}", "#".repeat(j % 7)));
        }
    }
    check_lines(
        &fs::read_to_string(lb.export().join("log")).unwrap(),
        expected,
    );
}

fn flock(f: &File, op: i32) -> Result<(), i32> {
    // SAFETY: a valid descriptor; flock has no memory arguments.
    if unsafe { libc::flock(f.as_raw_fd(), op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// `flock -x` through A keeps `flock -x -n` through B out; a blocking one through B is
/// granted when A unlocks.
#[test]
fn flock_is_exclusive_across_mounts() {
    require_fuse!();
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", |_| {}), lb.mount("b", |_| {}));
    fs::write(a.mountpoint().join("lk"), b"x").unwrap();
    let fa = File::open(a.mountpoint().join("lk")).unwrap();
    let fb = File::open(b.mountpoint().join("lk")).unwrap();
    flock(&fa, libc::LOCK_EX).unwrap();
    assert_eq!(
        flock(&fb, libc::LOCK_EX | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    assert_eq!(
        flock(&fb, libc::LOCK_SH | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    let (tx, rx) = channel();
    let waiter = std::thread::spawn(move || {
        let r = flock(&fb, libc::LOCK_EX);
        let _ = tx.send((r, Instant::now()));
        fb
    });
    // Not granted while A holds it.
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    let unlocked = Instant::now();
    flock(&fa, libc::LOCK_UN).unwrap();
    let (r, at) = rx.recv_timeout(GRANT_WAIT).expect("the waiter was granted");
    r.unwrap();
    eprintln!("flock granted {:?} after the unlock", at - unlocked);
    let fb = waiter.join().unwrap();
    // Now A is kept out; closing B's (last) descriptor releases its flock.
    assert_eq!(
        flock(&fa, libc::LOCK_EX | libc::LOCK_NB),
        Err(libc::EWOULDBLOCK)
    );
    drop(fb);
    let deadline = Instant::now() + GRANT_WAIT;
    // The kernel sends the release after close returns: poll for it, bounded.
    while flock(&fa, libc::LOCK_EX | libc::LOCK_NB).is_err() {
        assert!(
            Instant::now() < deadline,
            "B's close did not release its flock"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn fcntl_lock(f: &File, cmd: i32, typ: i32, start: i64, len: i64) -> Result<libc::flock, i32> {
    // SAFETY: zeroed is a valid flock.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: a valid descriptor and a flock that lives across the call.
    if unsafe { libc::fcntl(f.as_raw_fd(), cmd, &mut fl) } == 0 {
        Ok(fl)
    } else {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

/// fcntl byte-range locks through A and B: conflicts only where ranges overlap, F_GETLK
/// describes the holder, F_SETLKW waits and is granted when A's close releases its locks.
#[test]
fn fcntl_locks_conflict_across_mounts() {
    require_fuse!();
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", |_| {}), lb.mount("b", |_| {}));
    fs::write(a.mountpoint().join("db"), vec![0u8; 100]).unwrap();
    let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
    let fa = rw(&a.mountpoint().join("db"));
    let fb = rw(&b.mountpoint().join("db"));
    fcntl_lock(&fa, libc::F_SETLK, libc::F_WRLCK, 10, 10).unwrap();
    fcntl_lock(&fa, libc::F_SETLK, libc::F_RDLCK, 50, 0).unwrap(); // 50..EOF
    // B: the holder as F_GETLK sees it (no pid: another host's process).
    let g = fcntl_lock(&fb, libc::F_GETLK, libc::F_WRLCK, 0, 15).unwrap();
    assert_eq!(g.l_type, libc::F_WRLCK as i16);
    assert_eq!((g.l_start, g.l_len), (10, 10));
    let g = fcntl_lock(&fb, libc::F_GETLK, libc::F_RDLCK, 0, 10).unwrap();
    assert_eq!(g.l_type, libc::F_UNLCK as i16);
    assert_eq!(
        fcntl_lock(&fb, libc::F_SETLK, libc::F_WRLCK, 19, 1),
        Err(libc::EAGAIN)
    );
    fcntl_lock(&fb, libc::F_SETLK, libc::F_WRLCK, 20, 30).unwrap();
    fcntl_lock(&fb, libc::F_SETLK, libc::F_RDLCK, 60, 5).unwrap(); // readers share
    assert_eq!(
        fcntl_lock(&fb, libc::F_SETLK, libc::F_WRLCK, 60, 5),
        Err(libc::EAGAIN)
    );
    let (tx, rx) = channel();
    let waiter = std::thread::spawn(move || {
        let r = fcntl_lock(&fb, libc::F_SETLKW, libc::F_WRLCK, 0, 0);
        let _ = tx.send((r.map(|_| ()), Instant::now()));
        fb
    });
    assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    // Closing any descriptor of A's owner releases its locks (POSIX).
    let closed = Instant::now();
    drop(fa);
    let (r, at) = rx.recv_timeout(GRANT_WAIT).expect("the waiter was granted");
    r.unwrap();
    eprintln!("F_SETLKW granted {:?} after the close", at - closed);
    let fb = waiter.join().unwrap();
    let fa = rw(&a.mountpoint().join("db"));
    assert_eq!(
        fcntl_lock(&fa, libc::F_SETLK, libc::F_RDLCK, 99, 1),
        Err(libc::EAGAIN)
    );
    // OFD locks belong to the open file: its last close releases them.
    drop(fb);
    let fb = rw(&b.mountpoint().join("db"));
    fcntl_lock(&fb, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 1).unwrap();
    assert_eq!(
        fcntl_lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 1),
        Err(libc::EAGAIN)
    );
    drop(fb);
    let deadline = Instant::now() + GRANT_WAIT;
    while fcntl_lock(&fa, libc::F_SETLK, libc::F_WRLCK, 0, 1).is_err() {
        assert!(Instant::now() < deadline, "the OFD lock outlived its file");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A client that goes away (its connection ends) loses its locks: a waiter through a mount
/// is granted.
#[test]
fn a_gone_clients_locks_are_released() {
    require_fuse!();
    let lb = Loopback::new(1);
    let b = lb.mount("b", |_| {});
    fs::write(b.mountpoint().join("f"), b"x").unwrap();
    let ctx = Context::new().unwrap();
    let c = Client::connect(&ctx, &ClientConfig::new(lb.rails.clone())).unwrap();
    let file = c.open_path("f", libc::O_RDWR).unwrap();
    let all = LockRange {
        kind: LockKind::Write,
        start: 0,
        end: i64::MAX as u64,
        pid: 1,
    };
    file.set_lock(1, all).unwrap();
    let fb = OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.mountpoint().join("f"))
        .unwrap();
    assert_eq!(
        fcntl_lock(&fb, libc::F_SETLK, libc::F_WRLCK, 0, 0),
        Err(libc::EAGAIN)
    );
    let (tx, rx) = channel();
    let waiter = std::thread::spawn(move || {
        let r = fcntl_lock(&fb, libc::F_SETLKW, libc::F_WRLCK, 0, 0);
        let _ = tx.send(r.map(|_| ()));
        fb
    });
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    c.close(); // the connection ends: as a crash of the client's host, seen at once
    rx.recv_timeout(GRANT_WAIT)
        .expect("granted after the holder went")
        .unwrap();
    drop(waiter.join().unwrap());
    drop(file);
}

/// A name another client removed (and made again) while this one still had it cached:
/// opening it reaches the new file, never the removed one's bytes.
#[test]
fn a_name_removed_elsewhere_does_not_open_the_old_file() {
    require_fuse!();
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", long_caches), lb.mount("b", long_caches));
    fs::write(a.mountpoint().join("j"), b"old journal").unwrap();
    assert_eq!(fs::read(b.mountpoint().join("j")).unwrap(), b"old journal");
    fs::remove_file(a.mountpoint().join("j")).unwrap();
    fs::write(a.mountpoint().join("j"), b"new").unwrap();
    assert_eq!(fs::read(b.mountpoint().join("j")).unwrap(), b"new");
    fs::remove_file(a.mountpoint().join("j")).unwrap();
    let e = File::open(b.mountpoint().join("j")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
}

/// Issue 45's application test: two SQLite writers (rollback journal), one through each
/// mount, 300 `begin immediate; insert; commit` each: every transaction that reported
/// success is in the table and the database is intact. Skips without python3's sqlite3.
#[test]
fn two_sqlite_writers_on_two_mounts_lose_nothing() {
    require_fuse!();
    let has_sqlite = std::process::Command::new("python3")
        .args(["-c", "import sqlite3"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_sqlite {
        eprintln!("SKIPPED: python3 with sqlite3 unavailable");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/sqlite_writer.py");
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", |_| {}), lb.mount("b", |_| {}));
    let run = |m: &braid_fs::mount::Mount, who: &str, n: u32| {
        std::process::Command::new("python3")
            .arg(script)
            .arg(m.mountpoint().join("db"))
            .arg(who)
            .arg(n.to_string())
            .output()
            .unwrap()
    };
    assert!(run(&a, "A", 0).status.success());
    let (oa, ob) = std::thread::scope(|s| {
        let ha = s.spawn(|| run(&a, "A", 300));
        let hb = s.spawn(|| run(&b, "B", 300));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    let check = |who: &str, out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout.clone()).unwrap();
        let mut lines = text.lines();
        let counts: Vec<u32> = lines
            .next()
            .unwrap()
            .split(' ')
            .map(|n| n.parse().unwrap())
            .collect();
        // A local directory gives 0 failures with these busy timeouts.
        assert_eq!(
            counts[1],
            0,
            "{who}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lines.map(|l| l.parse::<u32>().unwrap()).collect::<Vec<_>>()
    };
    let (ca, cb) = (check("A", &oa), check("B", &ob));
    let q = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
             print(c.execute('pragma integrity_check').fetchone()[0]); \
             [print(w, i) for w, i in c.execute('select who, i from t order by who, i')]";
    let out = std::process::Command::new("python3")
        .args(["-c", q])
        .arg(lb.export().join("db"))
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("ok"));
    let rows: Vec<String> = lines.map(str::to_string).collect();
    let mut want: Vec<String> = ca.iter().map(|i| format!("A {i}")).collect();
    want.extend(cb.iter().map(|i| format!("B {i}")));
    let mut got = rows;
    got.sort();
    want.sort();
    assert_eq!(got, want, "every committed transaction, nothing else");
}

/// Locks carry data between clients with files kept open (as NFS): what A wrote before its
/// unlock, B reads after its lock, although B had the old bytes cached.
#[test]
fn a_lock_brings_what_the_previous_holder_wrote() {
    require_fuse!();
    use std::os::unix::fs::FileExt;
    let lb = Loopback::new(1);
    let (a, b) = (lb.mount("a", long_caches), lb.mount("b", long_caches));
    fs::write(a.mountpoint().join("f"), b"aaaaaaaa").unwrap();
    let rw = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
    let fa = rw(&a.mountpoint().join("f"));
    let fb = rw(&b.mountpoint().join("f"));
    let mut buf = [0u8; 8];
    fb.read_exact_at(&mut buf, 0).unwrap(); // cached by B's kernel
    assert_eq!(&buf, b"aaaaaaaa");
    for round in 0..3u8 {
        let c = b'b' + round;
        fcntl_lock(&fa, libc::F_SETLKW, libc::F_WRLCK, 0, 0).unwrap();
        fa.write_all_at(&[c; 8], 0).unwrap();
        fcntl_lock(&fa, libc::F_SETLK, libc::F_UNLCK, 0, 0).unwrap();
        fcntl_lock(&fb, libc::F_SETLKW, libc::F_RDLCK, 0, 0).unwrap();
        fb.read_exact_at(&mut buf, 0).unwrap();
        fcntl_lock(&fb, libc::F_SETLK, libc::F_UNLCK, 0, 0).unwrap();
        assert_eq!(buf, [c; 8], "round {round}");
    }
}
