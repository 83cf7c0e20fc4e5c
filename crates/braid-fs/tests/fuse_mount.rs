//! POSIX behaviour through a real FUSE mount of a loopback server. Skips (saying why) where
//! /dev/fuse or root is missing; CI runs as root.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use common::{Loopback, pattern};

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn posix_operations() {
    require_fuse!();
    let lb = Loopback::new(2);
    let m = lb.mount("mnt", |_| {});
    let root = m.mountpoint().to_path_buf();
    let exp = lb.export();

    // create, write, read
    fs::write(root.join("a"), b"hello").unwrap();
    assert_eq!(fs::read(root.join("a")).unwrap(), b"hello");
    assert_eq!(
        fs::read(exp.join("a")).unwrap(),
        b"hello",
        "on the server after close"
    );
    // rename, unlink
    fs::rename(root.join("a"), root.join("b")).unwrap();
    assert!(!root.join("a").exists());
    assert_eq!(fs::read(root.join("b")).unwrap(), b"hello");
    // mkdir, rmdir, readdir
    fs::create_dir(root.join("d")).unwrap();
    fs::write(root.join("d/x"), b"x").unwrap();
    assert_eq!(
        errno(&fs::remove_dir(root.join("d")).unwrap_err()),
        libc::ENOTEMPTY
    );
    let mut names: Vec<String> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "d"]);
    fs::remove_file(root.join("d/x")).unwrap();
    fs::remove_dir(root.join("d")).unwrap();
    // symlink, readlink
    symlink("b", root.join("s")).unwrap();
    assert_eq!(fs::read_link(root.join("s")).unwrap().to_str(), Some("b"));
    assert_eq!(fs::read(root.join("s")).unwrap(), b"hello");
    assert!(
        fs::symlink_metadata(root.join("s"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // hard link
    fs::hard_link(root.join("b"), root.join("h")).unwrap();
    let (mb, mh) = (
        fs::metadata(root.join("b")).unwrap(),
        fs::metadata(root.join("h")).unwrap(),
    );
    assert_eq!(mb.ino(), mh.ino());
    assert_eq!(mh.nlink(), 2);
    fs::remove_file(root.join("h")).unwrap();
    assert_eq!(fs::metadata(root.join("b")).unwrap().nlink(), 1);
    // permissions
    fs::set_permissions(root.join("b"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(root.join("b")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(fs::metadata(exp.join("b")).unwrap().mode() & 0o777, 0o600);
    // truncate: shrink and grow
    let f = OpenOptions::new().write(true).open(root.join("b")).unwrap();
    f.set_len(2).unwrap();
    assert_eq!(fs::read(root.join("b")).unwrap(), b"he");
    f.set_len(10).unwrap();
    assert_eq!(fs::read(root.join("b")).unwrap(), b"he\0\0\0\0\0\0\0\0");
    drop(f);
    // append
    let mut f = OpenOptions::new()
        .append(true)
        .open(root.join("b"))
        .unwrap();
    f.write_all(b"++").unwrap();
    drop(f);
    assert_eq!(fs::read(root.join("b")).unwrap(), b"he\0\0\0\0\0\0\0\0++");
    // O_TRUNC
    fs::write(root.join("b"), b"new").unwrap();
    assert_eq!(fs::read(root.join("b")).unwrap(), b"new");
    // errors
    assert_eq!(
        errno(&fs::read(root.join("missing")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno(&File::create(root.join("missing/x")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno(&fs::create_dir(root.join("b")).unwrap_err()),
        libc::EEXIST
    );
    // utimes
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options()
        .write(true)
        .open(root.join("b"))
        .unwrap()
        .set_modified(t)
        .unwrap();
    assert_eq!(fs::metadata(root.join("b")).unwrap().mtime(), 1_000_000_000);
    // statfs
    let mut sfs: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new(root.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: valid path and buffer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sfs) }, 0);
    assert!(sfs.f_blocks > 0);
    drop(m);
}

/// A program being run from the mount can be neither opened for writing nor truncated by
/// `open(O_TRUNC)` (ETXTBSY), and the refused truncation leaves it whole on the server: the
/// kernel checks before the file system sees the open (no `FUSE_ATOMIC_O_TRUNC`).
#[test]
fn a_running_program_is_neither_written_nor_truncated() {
    require_fuse!();
    let Some(sleep) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("sleep"))
            .find(|f| f.is_file())
    }) else {
        eprintln!("skipped: no sleep program on PATH");
        return;
    };
    let lb = Loopback::new(2);
    let m = lb.mount("mnt", |_| {});
    let prog = m.mountpoint().join("prog");
    let len = fs::copy(&sleep, &prog).unwrap();
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(std::process::Command::new(&prog).arg("30").spawn().unwrap());
    let open = |write: bool, trunc: bool| {
        OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(if trunc { libc::O_TRUNC } else { 0 })
            .open(&prog)
    };
    for (write, trunc) in [(true, false), (false, true), (true, true)] {
        let e = open(write, trunc).expect_err("a running program must not open for writing");
        assert_eq!(
            errno(&e),
            libc::ETXTBSY,
            "write {write}, O_TRUNC {trunc}: {e}"
        );
    }
    assert_eq!(fs::metadata(lb.export().join("prog")).unwrap().len(), len);
    assert_eq!(fs::metadata(&prog).unwrap().len(), len);
    assert!(child.0.try_wait().unwrap().is_none(), "the program crashed");
    drop(child);
    // Once it has ended, O_TRUNC truncates as usual.
    drop(open(false, true).unwrap());
    assert_eq!(fs::metadata(lb.export().join("prog")).unwrap().len(), 0);
    drop(m);
}

#[test]
fn sparse_file_past_4_gib_and_random_writes() {
    require_fuse!();
    let lb = Loopback::new(1);
    let m = lb.mount("mnt", |_| {});
    let p = m.mountpoint().join("sparse");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let far = (4u64 << 30) + 4096 * 3 + 17;
    f.write_all_at(b"beyond 4 GiB", far).unwrap();
    let big = pattern(3 << 20, 9);
    f.write_all_at(&big, far + 100_000).unwrap();
    f.sync_all().unwrap();
    let md = fs::metadata(&p).unwrap();
    assert_eq!(md.len(), far + 100_000 + big.len() as u64);
    assert!(
        md.blocks() * 512 < 64 << 20,
        "holes stay holes: {} blocks",
        md.blocks()
    );
    let mut buf = vec![0u8; 12];
    f.read_exact_at(&mut buf, far).unwrap();
    assert_eq!(&buf, b"beyond 4 GiB");
    let mut back = vec![0u8; big.len()];
    f.read_exact_at(&mut back, far + 100_000).unwrap();
    assert_eq!(back, big);
    let mut hole = vec![1u8; 4096];
    f.read_exact_at(&mut hole, 1 << 30).unwrap();
    assert!(hole.iter().all(|b| *b == 0));
    // The server's file agrees.
    let sf = File::open(lb.export().join("sparse")).unwrap();
    let mut s = vec![0u8; 12];
    sf.read_exact_at(&mut s, far).unwrap();
    assert_eq!(&s, b"beyond 4 GiB");
    // Overwrites in the middle of a page-cached file.
    f.write_all_at(b"XYZ", far + 100_001).unwrap();
    drop(f);
    let mut g = File::open(&p).unwrap();
    g.seek(SeekFrom::Start(far + 100_000)).unwrap();
    let mut four = [0u8; 4];
    g.read_exact(&mut four).unwrap();
    assert_eq!(&four[1..], b"XYZ");
    assert_eq!(four[0], big[0]);
}

#[test]
fn large_sequential_write_and_read() {
    require_fuse!();
    let lb = Loopback::new(2);
    let m = lb.mount("mnt", |_| {});
    let p = m.mountpoint().join("big");
    let data = pattern(48 << 20, 5);
    let mut f = File::create(&p).unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(fs::read(lb.export().join("big")).unwrap(), data);
    assert_eq!(fs::read(&p).unwrap(), data);
}

/// Two mounts (two clients) of one export: what one writes and closes, the other sees at its
/// next open, even though it cached the file's attributes and pages before.
#[test]
fn close_to_open_between_two_clients() {
    require_fuse!();
    let lb = Loopback::new(1);
    let long = |c: &mut braid_fs::mount::MountConfig| {
        c.attr_timeout = Duration::from_secs(30);
        c.entry_timeout = Duration::from_secs(30);
    };
    let a = lb.mount("a", long);
    let b = lb.mount("b", long);
    let (pa, pb) = (a.mountpoint().join("f"), b.mountpoint().join("f"));
    fs::write(&pa, b"version one").unwrap();
    assert_eq!(fs::read(&pb).unwrap(), b"version one");
    assert_eq!(fs::metadata(&pb).unwrap().len(), 11);
    // A rewrites and grows the file; B's cached size and pages must not hide it.
    let mut f = OpenOptions::new().write(true).open(&pa).unwrap();
    f.write_all(b"VERSION TWO, longer").unwrap();
    drop(f);
    assert_eq!(fs::read(&pb).unwrap(), b"VERSION TWO, longer");
    // And back: B truncates and writes, A sees it at open.
    fs::write(&pb, b"three").unwrap();
    assert_eq!(fs::read(&pa).unwrap(), b"three");
    // Renames by one client: the other finds the new name.
    fs::rename(&pa, a.mountpoint().join("g")).unwrap();
    assert_eq!(fs::read(b.mountpoint().join("g")).unwrap(), b"three");
}

/// The attributes the mount keeps from replies (the parent's from create and unlink, the
/// file's from the write and the close's commit) are what the server has, and a name this
/// mount removed and another client made again shows after the entry timeout. With and
/// without the reply spin.
#[test]
fn attributes_from_replies_stay_exact() {
    require_fuse!();
    for spin in [Duration::ZERO, Duration::from_micros(300)] {
        let lb = Loopback::new(1);
        let m = lb.mount("m", |c| {
            c.attr_timeout = Duration::from_secs(30);
            c.entry_timeout = Duration::from_millis(300);
            c.poll_spin = spin;
        });
        let (root, exp) = (m.mountpoint().to_path_buf(), lb.export());
        for i in 0..20 {
            let p = root.join(format!("m{i}"));
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&p)
                .unwrap();
            f.write_all(b"x").unwrap();
            drop(f);
            let (mine, server) = (
                fs::metadata(&p).unwrap(),
                fs::metadata(exp.join(format!("m{i}"))).unwrap(),
            );
            assert_eq!(mine.len(), 1);
            assert_eq!(
                (mine.mtime(), mine.mtime_nsec()),
                (server.mtime(), server.mtime_nsec()),
                "stat after close shows the server's modification time"
            );
            let (dir, dir_srv) = (fs::metadata(&root).unwrap(), fs::metadata(&exp).unwrap());
            assert_eq!(
                (dir.mtime(), dir.mtime_nsec(), dir.nlink()),
                (dir_srv.mtime(), dir_srv.mtime_nsec(), dir_srv.nlink()),
                "the directory's attributes after a create"
            );
            // Appending through another open: the size follows.
            let mut f = OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(b"yz").unwrap();
            drop(f);
            assert_eq!(fs::metadata(&p).unwrap().len(), 3);
            // A second name and its removal: the link count follows.
            let h = root.join(format!("h{i}"));
            fs::hard_link(&p, &h).unwrap();
            assert_eq!(fs::metadata(&p).unwrap().nlink(), 2);
            fs::remove_file(&h).unwrap();
            assert_eq!(fs::metadata(&p).unwrap().nlink(), 1);
            fs::remove_file(&p).unwrap();
            let (dir, dir_srv) = (fs::metadata(&root).unwrap(), fs::metadata(&exp).unwrap());
            assert_eq!(
                (dir.mtime(), dir.mtime_nsec()),
                (dir_srv.mtime(), dir_srv.mtime_nsec()),
                "the directory's attributes after an unlink"
            );
            assert_eq!(
                errno(&fs::metadata(&p).unwrap_err()),
                libc::ENOENT,
                "a removed name"
            );
        }
        // Removed here, made again by someone else: visible within the entry timeout.
        let p = root.join("m0");
        assert!(!p.exists());
        fs::write(exp.join("m0"), b"elsewhere").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !p.exists() {
            assert!(
                Instant::now() < deadline,
                "a name made by another client never showed"
            );
            std::thread::yield_now();
        }
        assert_eq!(fs::read(&p).unwrap(), b"elsewhere");
        // Made again through this mount: visible at once.
        fs::remove_file(&p).unwrap();
        fs::write(&p, b"again").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"again");
    }
}

/// Permission bits are enforced for other users (default_permissions).
#[test]
fn permissions_for_other_users() {
    require_fuse!();
    let lb = Loopback::new(1);
    let m = lb.mount("mnt", |c| c.allow_other = true);
    let root = m.mountpoint();
    fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(root.join("public"), b"p").unwrap();
    fs::set_permissions(root.join("public"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(root.join("private"), b"s").unwrap();
    fs::set_permissions(root.join("private"), fs::Permissions::from_mode(0o600)).unwrap();
    let as_nobody = |args: &[&str]| {
        std::process::Command::new("cat")
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    };
    let ok = as_nobody(&[root.join("public").to_str().unwrap()]);
    assert!(ok.status.success(), "{ok:?}");
    assert_eq!(ok.stdout, b"p");
    let denied = as_nobody(&[root.join("private").to_str().unwrap()]);
    assert!(!denied.status.success());
    assert!(
        String::from_utf8_lossy(&denied.stderr).contains("Permission denied"),
        "{denied:?}"
    );
    // A file created by another user belongs to that user on the server.
    let dir = root.join("shared");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let made = std::process::Command::new("touch")
        .arg(dir.join("mine"))
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let md = fs::metadata(lb.export().join("shared/mine")).unwrap();
    assert_eq!((md.uid(), md.gid()), (65534, 65534));
}

/// Write-only opens bypass the kernel's page cache (`FOPEN_DIRECT_IO`): a reader on the same
/// mount with the file's pages cached sees what a write-only descriptor wrote over them and
/// past the end, and an append by a user without `CAP_FSETID` clears the set-user-ID and
/// set-group-ID bits (root's does not), as the kernel's cached path does. The same with
/// `direct_writes` off.
#[test]
fn write_only_opens_stay_coherent_and_clear_setuid() {
    require_fuse!();
    for direct in [true, false] {
        let lb = Loopback::with_config(1, |c| c.policy.allow_setuid = true);
        let m = lb.mount("mnt", |c| {
            c.direct_writes = direct;
            c.allow_other = true;
            c.attr_timeout = Duration::from_secs(30);
        });
        let root = m.mountpoint();
        let p = root.join("f");
        let old = pattern(64 << 10, 1);
        fs::write(&p, &old).unwrap();
        let reader = File::open(&p).unwrap();
        let mut got = vec![0u8; old.len()];
        reader.read_exact_at(&mut got, 0).unwrap();
        assert_eq!(got, old, "direct {direct}");
        // Over cached pages, and past the end.
        let w = OpenOptions::new().write(true).open(&p).unwrap();
        w.write_all_at(b"NEW BYTES", 4096).unwrap();
        w.write_all_at(b"TAIL", old.len() as u64 + 10).unwrap();
        let mut mid = [0u8; 9];
        reader.read_exact_at(&mut mid, 4096).unwrap();
        assert_eq!(&mid, b"NEW BYTES", "direct {direct}");
        assert_eq!(reader.metadata().unwrap().len(), old.len() as u64 + 14);
        let mut tail = [0u8; 14];
        reader.read_exact_at(&mut tail, old.len() as u64).unwrap();
        assert_eq!(&tail, b"\0\0\0\0\0\0\0\0\0\0TAIL", "direct {direct}");
        w.sync_all().unwrap();
        drop(w);
        let on_server = fs::read(lb.export().join("f")).unwrap();
        assert_eq!(&on_server[4096..4105], b"NEW BYTES");
        assert_eq!(&on_server[old.len() + 10..], b"TAIL");

        fs::set_permissions(root, fs::Permissions::from_mode(0o755)).unwrap();
        let s = root.join("setid");
        fs::write(&s, b"x").unwrap();
        fs::set_permissions(&s, fs::Permissions::from_mode(0o6777)).unwrap();
        // root may write and keep the bits.
        OpenOptions::new()
            .append(true)
            .open(&s)
            .unwrap()
            .write_all(b"r")
            .unwrap();
        assert_eq!(fs::metadata(&s).unwrap().mode() & 0o7777, 0o6777);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf y >> '{}'", s.display()))
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        assert!(out.status.success(), "direct {direct}: {out:?}");
        let server_mode = fs::metadata(lb.export().join("setid")).unwrap().mode();
        assert_eq!(server_mode & 0o7777, 0o777, "direct {direct}");
        assert_eq!(
            fs::metadata(&s).unwrap().mode() & 0o7777,
            0o777,
            "direct {direct}"
        );
        assert_eq!(fs::read(&s).unwrap(), b"xry");
    }
}

/// The server goes away while a file is written: the writer gets EIO or ENOTCONN within a
/// bound, later operations fail, and the mount can be unmounted.
#[test]
fn server_gone_gives_errors_and_unmounts() {
    require_fuse!();
    let mut lb = Loopback::new(2);
    let m = lb.mount("mnt", |_| {});
    let p = m.mountpoint().join("f");
    let writer = std::thread::spawn(move || {
        let chunk = pattern(1 << 20, 1);
        let start = Instant::now();
        let mut f = File::create(&p).unwrap();
        loop {
            // Bounded: the test fails if no error comes within 30 s.
            if start.elapsed() > Duration::from_secs(30) {
                return Err("no error within 30 s".to_string());
            }
            if let Err(e) = f.write_all(&chunk).and_then(|()| f.flush()) {
                return Ok((e, start.elapsed()));
            }
            if let Err(e) = f.sync_data() {
                return Ok((e, start.elapsed()));
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    lb.server.take().unwrap().shutdown();
    let (e, _) = writer.join().unwrap().unwrap();
    assert!(matches!(errno(&e), libc::EIO | libc::ENOTCONN), "{e:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "error after {:?}",
        t0.elapsed()
    );
    let later = fs::metadata(m.mountpoint().join("other")).unwrap_err();
    assert!(
        matches!(errno(&later), libc::EIO | libc::ENOTCONN),
        "{later:?}"
    );
    let t1 = Instant::now();
    m.unmount().unwrap();
    assert!(t1.elapsed() < Duration::from_secs(15));
}

/// Unmounting while a file is still open there: the mount is detached at once (the name is
/// free, as `umount -l`), the FUSE connection is aborted after the bounded wait, and the
/// open file's later operations fail instead of hanging.
#[test]
fn unmount_with_a_file_open_detaches_the_mount() {
    require_fuse!();
    let lb = Loopback::new(1);
    let m = lb.mount("mnt", |_| {});
    let at = m.mountpoint().to_path_buf();
    fs::write(at.join("f"), b"still open").unwrap();
    let open = File::open(at.join("f")).unwrap();
    let mounted = || {
        fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == at.to_str())
    };
    assert!(mounted());
    let t0 = Instant::now();
    m.unmount().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
    assert!(!mounted(), "still mounted with a file open");
    let mut buf = [0u8; 4];
    let e = open.read_at(&mut buf, 4096).unwrap_err();
    assert!(matches!(errno(&e), libc::ENOTCONN | libc::EIO), "{e:?}");
}
