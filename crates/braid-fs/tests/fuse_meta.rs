//! The mount's shortcuts for metadata-heavy loops keep the promised consistency: directory
//! views (names known absent without asking the server) never hide this client's own
//! changes, and another client's new names show within the entry timeout; small writes
//! acknowledged before the server's reply are on the server when `close` returns, or
//! `close` reports the failure. Skips (saying why) where /dev/fuse or root is missing.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use braid_fs::mount::Mount;
use common::Loopback;

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Looks up names that do not exist in `dir` (of mount `m`) until the mount answers one
/// from its view of `dir` (a listing starts at the first miss), bounded.
fn miss_names(m: &Mount, dir: &Path, tag: &str) {
    let before = m.lookups_answered_absent();
    let deadline = Instant::now() + Duration::from_secs(10);
    for i in 0.. {
        let p = dir.join(format!("{tag}-missing-{i}"));
        assert_eq!(errno(&fs::metadata(&p).unwrap_err()), libc::ENOENT);
        if m.lookups_answered_absent() > before {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no view of {} in 10 s",
            dir.display()
        );
    }
}

/// Waits (bounded) until `p` exists; returns how long after `since` it showed.
fn shows(p: &Path, since: Instant) -> Duration {
    let deadline = since + Duration::from_secs(10);
    while !p.exists() {
        assert!(Instant::now() < deadline, "{} never showed", p.display());
        std::thread::yield_now();
    }
    since.elapsed()
}

#[test]
fn own_changes_are_never_hidden_by_a_view() {
    require_fuse!();
    let lb = Loopback::new(1);
    let m = lb.mount("m", |c| {
        c.attr_timeout = Duration::from_secs(30);
        c.entry_timeout = Duration::from_millis(500);
        c.negative_timeout = Duration::from_millis(500);
    });
    let root = m.mountpoint().to_path_buf();
    let exp = lb.export();
    fs::create_dir(root.join("d")).unwrap();
    let d = root.join("d");
    for round in 0..3 {
        miss_names(&m, &d, &format!("r{round}"));
        // A name too long is an error, not an absent name (pjdfstest's enametoolong tests).
        let long = d.join("n".repeat(256));
        assert_eq!(errno(&fs::metadata(&long).unwrap_err()), libc::ENAMETOOLONG);
        // The metadata loop's pattern, with the kernel's cached names expiring between
        // steps only where the view has to answer.
        for i in 0..200 {
            let p = d.join(format!("f{round}-{i}"));
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .unwrap();
            f.write_all(b"x").unwrap();
            drop(f);
            assert_eq!(fs::metadata(&p).unwrap().len(), 1);
            if i % 3 == 0 {
                // Kept: must stay visible after the kernel's entry expired.
                continue;
            }
            fs::remove_file(&p).unwrap();
            assert_eq!(errno(&fs::metadata(&p).unwrap_err()), libc::ENOENT);
        }
        // Past the kernel's entry timeout: every kept name is found through lookups.
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(600) {
            std::thread::yield_now();
        }
        for i in (0..200).step_by(3) {
            let p = d.join(format!("f{round}-{i}"));
            assert_eq!(fs::metadata(&p).unwrap().len(), 1, "{}", p.display());
        }
        // Renames, links and directories made here show at once, even with the kernel's
        // name cache out of the way (another name than the one it cached).
        let a = d.join(format!("f{round}-0"));
        let b = d.join(format!("moved{round}"));
        fs::rename(&a, &b).unwrap();
        assert_eq!(errno(&fs::metadata(&a).unwrap_err()), libc::ENOENT);
        assert!(exp.join(format!("d/moved{round}")).exists());
        fs::hard_link(&b, d.join(format!("link{round}"))).unwrap();
        assert_eq!(
            fs::metadata(d.join(format!("link{round}")))
                .unwrap()
                .nlink(),
            2
        );
        fs::create_dir(d.join(format!("sub{round}"))).unwrap();
        fs::write(d.join(format!("sub{round}/inner")), b"in").unwrap();
        assert_eq!(
            fs::read(d.join(format!("sub{round}/inner"))).unwrap(),
            b"in"
        );
        // Renamed back: the old name exists again.
        fs::rename(&b, &a).unwrap();
        assert!(a.exists());
    }
    // The server agrees with everything the mount shows.
    let mut here: Vec<_> = fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut there: Vec<_> = fs::read_dir(exp.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    here.sort();
    there.sort();
    assert_eq!(here, there);
}

/// A name another client (a second mount, or a process on the server) makes in a directory
/// this mount holds a view of shows within the entry timeout; an exclusive create of it
/// through this mount fails with `EEXIST` even while the view still says it is absent.
#[test]
fn other_clients_names_show_within_the_entry_timeout() {
    require_fuse!();
    let lb = Loopback::new(1);
    let ttl = Duration::from_millis(400);
    let a = lb.mount("a", |c| {
        c.attr_timeout = Duration::from_secs(30);
        c.entry_timeout = ttl;
        c.negative_timeout = ttl;
    });
    let b = lb.mount("b", |c| c.entry_timeout = ttl);
    let (ra, rb, exp) = (a.mountpoint(), b.mountpoint(), lb.export());
    let mut hidden = 0;
    for i in 0..5 {
        miss_names(&a, ra, &format!("a{i}"));
        // Through the other mount.
        let made = Instant::now();
        fs::write(rb.join(format!("from-b-{i}")), b"b").unwrap();
        // Before it shows, an exclusive create here is refused by the server.
        let p = ra.join(format!("from-b-{i}"));
        if !p.exists() {
            hidden += 1;
            let e = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .unwrap_err();
            assert_eq!(errno(&e), libc::EEXIST);
        }
        let after = shows(&p, made);
        assert_eq!(fs::read(&p).unwrap(), b"b");
        // Bounded by the view's timeout plus scheduling on a loaded host.
        assert!(
            after < ttl + Duration::from_secs(3),
            "showed after {after:?}"
        );
        // Directly on the server's disk.
        miss_names(&a, ra, &format!("a{i}x"));
        let made = Instant::now();
        fs::write(exp.join(format!("local-{i}")), b"l").unwrap();
        let after = shows(&ra.join(format!("local-{i}")), made);
        assert!(
            after < ttl + Duration::from_secs(3),
            "showed after {after:?}"
        );
    }
    // The view did answer for the other client's fresh names (each looked up within
    // milliseconds of a view answering, so only stalls of 400 ms could let all 5 through).
    assert!(hidden > 0, "the view never hid a fresh name");
}

/// Without a negative timeout (the default) no view answers: another client's new name
/// is seen by the next lookup here, at once.
#[test]
fn by_default_other_clients_names_show_at_once() {
    require_fuse!();
    let lb = Loopback::new(1);
    let a = lb.mount("a", |_| {});
    let b = lb.mount("b", |_| {});
    for i in 0..20 {
        let p = a.mountpoint().join(format!("n{i}"));
        assert_eq!(errno(&fs::metadata(&p).unwrap_err()), libc::ENOENT);
        fs::write(b.mountpoint().join(format!("n{i}")), b"b").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"b");
    }
    assert_eq!(a.lookups_answered_absent(), 0);
}

/// A small write is acknowledged before the server has it; `close` waits for it: the server
/// has the byte after `close` returns, and when the server goes away first, `close` (not a
/// later read) reports it.
#[test]
fn small_writes_are_on_the_server_at_close_or_close_fails() {
    require_fuse!();
    let mut lb = Loopback::new(1);
    // Soft: a hard mount (the default) waits for the server to come back instead.
    let m = lb.mount_soft("m", Duration::from_secs(1), |c| {
        c.attr_timeout = Duration::from_secs(30)
    });
    let (root, exp) = (m.mountpoint().to_path_buf(), lb.export());
    for i in 0..100 {
        let p = root.join(format!("s{i}"));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&p)
            .unwrap();
        f.write_all(&[i as u8]).unwrap();
        f.write_all(b"yz").unwrap();
        drop(f);
        // Read on the server's disk right after close, not through the mount.
        assert_eq!(
            fs::read(exp.join(format!("s{i}"))).unwrap(),
            [i as u8, b'y', b'z']
        );
        assert_eq!(fs::metadata(&p).unwrap().len(), 3);
    }
    let p = root.join("last");
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&p)
        .unwrap();
    f.write_all(b"x").unwrap();
    lb.server.take().unwrap().shutdown();
    // Dropping a File ignores close's error: close the descriptor by hand.
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: fd is an open descriptor this test owns and closes once.
    let rc = unsafe { libc::close(fd) };
    let on_server = fs::read(exp.join("last")).unwrap();
    if rc == 0 {
        assert_eq!(on_server, b"x", "close succeeded: the byte must be there");
    } else {
        let e = std::io::Error::last_os_error();
        assert!(matches!(errno(&e), libc::EIO | libc::ENOTCONN), "{e:?}");
    }
    m.unmount().unwrap();
}
