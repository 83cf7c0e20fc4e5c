//! The export layer without a network: path confinement, handles, read-only exports.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::export::{ClientState, Export};
use crate::proto::{Creds, Entry, Errno, NodeId, Reply, Request, SetAttr};

struct Fixture {
    _dir: tempfile::TempDir,
    export_root: std::path::PathBuf,
    outside: std::path::PathBuf,
    export: Export,
    cs: Mutex<ClientState>,
}

/// An export `<tmp>/export` beside `<tmp>/outside/secret` ("outside").
fn fixture(read_only: bool) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let export_root = dir.path().join("export");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(export_root.join("sub")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"outside").unwrap();
    std::fs::write(export_root.join("sub/file"), b"inside").unwrap();
    let ctx = braid::Context::new().unwrap();
    let export = Export::new(ctx, &export_root, read_only).unwrap();
    Fixture {
        _dir: dir,
        export_root,
        outside,
        export,
        cs: Mutex::new(ClientState::default()),
    }
}

impl Fixture {
    fn root(&self) -> NodeId {
        self.export.root().unwrap().node
    }

    fn call(&self, req: Request) -> Result<Reply, Errno> {
        self.export.handle(&self.cs, req)
    }

    fn walk(&self, path: &str, follow: bool) -> Result<Entry, Errno> {
        match self.call(Request::Walk {
            parent: self.root(),
            path: path.as_bytes().to_vec(),
            follow,
        })? {
            Reply::Entry(e) => Ok(e),
            other => panic!("unexpected {other:?}"),
        }
    }

    fn lookup(&self, parent: NodeId, name: &str) -> Result<Entry, Errno> {
        match self.call(Request::Lookup {
            parent,
            name: name.as_bytes().to_vec(),
        })? {
            Reply::Entry(e) => Ok(e),
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn ino(p: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap())
}

#[test]
fn dotdot_and_absolute_paths_stay_inside() {
    let f = fixture(false);
    assert_eq!(f.walk("sub/file", false).unwrap().attr.size, 6);
    for p in [
        "..",
        "../outside/secret",
        "sub/../../outside",
        "/etc/passwd",
        "sub/../..",
    ] {
        assert_eq!(f.walk(p, true).unwrap_err(), Errno::EXDEV, "{p}");
    }
    // `..` inside the export is fine.
    assert!(f.walk("sub/../sub/file", true).is_ok());
}

#[test]
fn symlinks_out_of_the_export_are_not_followed() {
    let f = fixture(false);
    symlink(&f.outside, f.export_root.join("abs")).unwrap();
    symlink("../outside", f.export_root.join("rel")).unwrap();
    symlink("../../outside/secret", f.export_root.join("sub/deep")).unwrap();
    symlink("sub/file", f.export_root.join("inside")).unwrap();
    for p in ["abs", "abs/secret", "rel/secret", "sub/deep"] {
        assert_eq!(f.walk(p, true).unwrap_err(), Errno::EXDEV, "{p}");
    }
    assert_eq!(f.walk("inside", true).unwrap().attr.size, 6);
    // A lookup of the link itself gives the link, which cannot be opened as a file (as
    // open with O_NOFOLLOW).
    let l = f.lookup(f.root(), "abs").unwrap();
    assert_eq!(l.attr.mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(
        f.call(Request::Open {
            node: l.node,
            flags: 0
        })
        .unwrap_err(),
        Errno::ELOOP
    );
    assert_eq!(
        f.call(Request::Lookup {
            parent: l.node,
            name: b"secret".to_vec()
        })
        .unwrap_err(),
        Errno::ENOTDIR
    );
    assert_eq!(
        f.call(Request::ReadLink { node: l.node }).unwrap(),
        Reply::Link(f.outside.as_os_str().as_encoded_bytes().to_vec())
    );
    // Changing the link's attributes never reaches the target.
    let before = std::fs::metadata(f.outside.join("secret")).unwrap();
    let set = SetAttr {
        mode: Some(0o777),
        ..Default::default()
    };
    assert_eq!(
        f.call(Request::SetAttr {
            node: l.node,
            fh: 0,
            set
        })
        .unwrap_err(),
        Errno::EOPNOTSUPP
    );
    let after = std::fs::metadata(f.outside.join("secret")).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&before.permissions()),
        std::os::unix::fs::PermissionsExt::mode(&after.permissions())
    );
}

/// A directory on the path is swapped for a symlink out of the export while lookups run:
/// no lookup ever returns the outside file.
#[test]
fn symlink_swapped_in_during_lookups_never_escapes() {
    let f = Arc::new(fixture(false));
    let d = f.export_root.join("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("secret"), b"inside").unwrap();
    let inside_dir = f.export_root.join("d.real");
    let link = f.export_root.join("d.link");
    symlink(&f.outside, &link).unwrap();
    let outside_ino = ino(&f.outside.join("secret"));
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (d, stop) = (d.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u32;
            // Bounded: at most 20000 swaps, or until the lookups are done.
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                std::fs::rename(&d, &inside_dir).unwrap();
                std::fs::rename(&link, &d).unwrap();
                std::fs::rename(&d, &link).unwrap();
                std::fs::rename(&inside_dir, &d).unwrap();
                n += 1;
            }
        })
    };
    let (mut ok, mut refused) = (0, 0);
    // At least 3000 lookups during the swaps, and more (bounded) until one has found the
    // real directory: on a loaded machine the swapper can keep the path in its other states
    // for all of the first 3000; once its 20,000 swaps are done the path is real again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut i = 0u32;
    while i < 3000 || (ok == 0 && std::time::Instant::now() < deadline) {
        i += 1;
        let follow = i.is_multiple_of(2);
        match f.walk("d/secret", follow) {
            Ok(e) => {
                assert_ne!(e.attr.ino, outside_ino, "escaped the export");
                ok += 1;
            }
            Err(e) => {
                assert!(
                    matches!(e, Errno::EXDEV | Errno::ENOENT | Errno::ENOTDIR),
                    "{e:?}"
                );
                refused += 1;
            }
        }
        // The two-step path a FUSE client takes.
        if let Ok(dir) = f.lookup(f.root(), "d")
            && let Ok(e) = f.lookup(dir.node, "secret")
        {
            assert_ne!(e.attr.ino, outside_ino, "escaped the export");
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert!(ok > 0, "no lookup succeeded ({refused} refused)");
}

#[test]
fn stale_handles_and_forget() {
    let f = fixture(false);
    let e = f.walk("sub/file", false).unwrap();
    let before = f.export.inode_count();
    assert!(f.call(Request::GetAttr { node: e.node }).is_ok());
    let wrong_gen = NodeId {
        generation: e.node.generation ^ 1,
        ..e.node
    };
    assert_eq!(
        f.call(Request::GetAttr { node: wrong_gen }).unwrap_err(),
        Errno::ESTALE
    );
    let unknown = NodeId { id: 9999, ..e.node };
    assert_eq!(
        f.call(Request::GetAttr { node: unknown }).unwrap_err(),
        Errno::ESTALE
    );
    // Two lookups of the same file share one id.
    let e2 = f.walk("sub/file", false).unwrap();
    assert_eq!(e.node, e2.node);
    assert_eq!(f.export.inode_count(), before);
    f.call(Request::Forget {
        items: vec![(e.node, 1)],
    })
    .unwrap();
    assert!(f.call(Request::GetAttr { node: e.node }).is_ok());
    // Forgetting more than was looked up is capped, not an underflow.
    f.call(Request::Forget {
        items: vec![(e.node, 5)],
    })
    .unwrap();
    assert_eq!(
        f.call(Request::GetAttr { node: e.node }).unwrap_err(),
        Errno::ESTALE
    );
    assert_eq!(f.export.inode_count(), before - 1);
    // The root is never forgotten.
    f.call(Request::Forget {
        items: vec![(f.root(), 100)],
    })
    .unwrap();
    assert!(f.call(Request::GetAttr { node: f.root() }).is_ok());
    // A client's references go when it disconnects.
    let _ = f.walk("sub", false).unwrap();
    f.export.disconnect(&f.cs);
    assert_eq!(f.export.inode_count(), 1);
}

#[test]
fn read_only_export_refuses_changes() {
    let f = fixture(true);
    let root = f.root();
    let file = f.walk("sub/file", false).unwrap();
    let creds = Creds::default();
    let name = b"new".to_vec();
    let refused = [
        Request::Create {
            parent: root,
            name: name.clone(),
            mode: 0o644,
            flags: 2,
            creds,
        },
        Request::Mkdir {
            parent: root,
            name: name.clone(),
            mode: 0o755,
            creds,
        },
        Request::Mknod {
            parent: root,
            name: name.clone(),
            mode: libc::S_IFIFO | 0o644,
            rdev: 0,
            creds,
        },
        Request::Symlink {
            parent: root,
            name: name.clone(),
            target: b"x".to_vec(),
            creds,
        },
        Request::Unlink {
            parent: root,
            name: b"sub".to_vec(),
        },
        Request::Rmdir {
            parent: root,
            name: b"sub".to_vec(),
        },
        Request::Rename {
            parent: root,
            name: b"sub".to_vec(),
            new_parent: root,
            new_name: name.clone(),
            flags: 0,
        },
        Request::Link {
            node: file.node,
            new_parent: root,
            new_name: name,
        },
        Request::SetAttr {
            node: file.node,
            fh: 0,
            set: SetAttr {
                size: Some(0),
                ..Default::default()
            },
        },
        Request::Open {
            node: file.node,
            flags: libc::O_RDWR as u32,
        },
        Request::Open {
            node: file.node,
            flags: (libc::O_RDONLY | libc::O_TRUNC) as u32,
        },
    ];
    for r in refused {
        assert_eq!(f.call(r.clone()).unwrap_err(), Errno::EROFS, "{r:?}");
    }
    let Reply::Opened(o) = f
        .call(Request::Open {
            node: file.node,
            flags: 0,
        })
        .unwrap()
    else {
        panic!()
    };
    // Nothing to write back on a read-only export: the hint is taken and ignored.
    assert_eq!(
        f.call(Request::Landed {
            fh: o.fh,
            upto: 1 << 20
        }),
        Ok(Reply::Empty)
    );
    let region = o.region.expect("a non-empty file has a region");
    assert!(!region.writable);
    assert!(region.len >= 6);
    assert_eq!(
        f.call(Request::MapRegion {
            fh: o.fh,
            min_size: 100
        })
        .unwrap_err(),
        Errno::EROFS
    );
    assert_eq!(
        f.call(Request::Write {
            fh: o.fh,
            offset: 0,
            data: b"x".to_vec()
        })
        .unwrap_err(),
        Errno::EROFS
    );
    assert_eq!(
        std::fs::read(f.export_root.join("sub/file")).unwrap(),
        b"inside"
    );
}

#[test]
fn create_write_grow_readdir_rename() {
    let f = fixture(false);
    let root = f.root();
    let creds = Creds {
        uid: 0,
        gid: 0,
        umask: 0o022,
    };
    let Reply::Created(e, o, _) = f
        .call(Request::Create {
            parent: root,
            name: b"a".to_vec(),
            mode: 0o666,
            flags: libc::O_RDWR as u32,
            creds,
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(e.attr.mode & 0o777, 0o644);
    assert_eq!(o.region, None, "an empty file has no region");
    let Reply::Written(n, a) = f
        .call(Request::Write {
            fh: o.fh,
            offset: 3,
            data: b"xyz".to_vec(),
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((n, a.size), (3, 6));
    let Reply::Mapped(m) = f
        .call(Request::MapRegion {
            fh: o.fh,
            min_size: 1 << 20,
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(m.attr.size, 1 << 20);
    let r = m.region.unwrap();
    assert!(r.writable);
    // A writable registration leaves room to grow into (address space only).
    assert_eq!(r.len, 4 << 30);
    let Reply::Mapped(within) = f
        .call(Request::MapRegion {
            fh: o.fh,
            min_size: 16 << 20,
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(within.attr.size, 16 << 20);
    assert_eq!(within.region, Some(r));
    // Growing past the registration registers a larger one; the old key stays valid. A
    // request grows the file by at most 1 GiB: the client asks until it is large enough.
    let mut m2 = within;
    for _ in 0..5 {
        let Reply::Mapped(m) = f
            .call(Request::MapRegion {
                fh: o.fh,
                min_size: (4 << 30) + 1,
            })
            .unwrap()
        else {
            panic!()
        };
        assert!(m.attr.size <= m2.attr.size + (1 << 30));
        m2 = m;
    }
    assert_eq!(m2.attr.size, (4 << 30) + 1);
    let r2 = m2.region.unwrap();
    assert_eq!(r2.len, 128 << 30);
    assert_ne!(r2.key, r.key);
    assert!(r2.generation > r.generation);
    // Landed writes are a hint: taken for the open file, past its end too; a handle the
    // server does not know is refused.
    for upto in [0, 1 << 20, 3 << 20, u64::MAX] {
        assert_eq!(f.call(Request::Landed { fh: o.fh, upto }), Ok(Reply::Empty));
    }
    assert_eq!(
        f.call(Request::Landed {
            fh: o.fh + 1000,
            upto: 1 << 20
        }),
        Err(Errno::EBADF)
    );
    // Shrinking keeps the registration (accesses past the end fail on their own).
    let set = SetAttr {
        size: Some(10),
        ..Default::default()
    };
    let Reply::Attr(a) = f
        .call(Request::SetAttr {
            node: e.node,
            fh: o.fh,
            set,
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(a.size, 10);
    let Reply::Mapped(m3) = f
        .call(Request::MapRegion {
            fh: o.fh,
            min_size: 0,
        })
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(m3.region, Some(r2));
    f.call(Request::Release { fh: o.fh }).unwrap();
    assert_eq!(
        f.call(Request::Release { fh: o.fh }).unwrap_err(),
        Errno::EBADF
    );
    f.call(Request::Rename {
        parent: root,
        name: b"a".to_vec(),
        new_parent: root,
        new_name: b"b".to_vec(),
        flags: 0,
    })
    .unwrap();
    f.call(Request::Mkdir {
        parent: root,
        name: b"dir".to_vec(),
        mode: 0o755,
        creds,
    })
    .unwrap();
    // RENAME_NOREPLACE onto an existing name.
    assert_eq!(
        f.call(Request::Rename {
            parent: root,
            name: b"b".to_vec(),
            new_parent: root,
            new_name: b"dir".to_vec(),
            flags: 1
        })
        .unwrap_err(),
        Errno::EEXIST
    );
    let Reply::Handle(dh) = f.call(Request::OpenDir { node: root }).unwrap() else {
        panic!()
    };
    let mut names = Vec::new();
    let mut offset = 0;
    loop {
        let Reply::Dir(entries, eof) = f
            .call(Request::ReadDir {
                dh,
                offset,
                max_bytes: 4096,
            })
            .unwrap()
        else {
            panic!()
        };
        for e in &entries {
            names.push(String::from_utf8(e.name.clone()).unwrap());
            offset = e.next_offset;
        }
        if eof {
            break;
        }
    }
    names.sort();
    assert_eq!(names, [".", "..", "b", "dir", "sub"]);
    f.call(Request::ReleaseDir { dh }).unwrap();
    assert_eq!(
        f.call(Request::Rmdir {
            parent: root,
            name: b"sub".to_vec()
        })
        .unwrap_err(),
        Errno::ENOTEMPTY
    );
}

#[test]
fn readdir_pages_through_a_large_directory() {
    let f = fixture(false);
    for i in 0..600 {
        std::fs::write(
            f.export_root
                .join(format!("file-with-a-longish-name-{i:04}")),
            b"",
        )
        .unwrap();
    }
    let Reply::Handle(dh) = f.call(Request::OpenDir { node: f.root() }).unwrap() else {
        panic!()
    };
    let (mut seen, mut offset, mut calls) = (std::collections::HashSet::new(), 0, 0);
    loop {
        calls += 1;
        let Reply::Dir(entries, eof) = f
            .call(Request::ReadDir {
                dh,
                offset,
                max_bytes: 4096,
            })
            .unwrap()
        else {
            panic!()
        };
        for e in entries {
            assert!(seen.insert(e.name), "an entry came twice");
            offset = e.next_offset;
        }
        if eof {
            break;
        }
        assert!(calls < 100);
    }
    assert_eq!(seen.len(), 600 + 3);
    assert!(calls > 2, "4 KiB batches need several calls");
}
