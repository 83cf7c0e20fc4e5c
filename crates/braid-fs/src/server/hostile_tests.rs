//! A hostile client against the export: special files, set-user-id bits, amplification (issue 39).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use parking_lot::Mutex;

use super::export::{ClientState, Export};
use super::filetype::ExportPolicy;
use crate::proto::{Creds, Entry, Errno, NodeId, Reply, Request, SetAttr};

struct Fx {
    _dir: tempfile::TempDir,
    root: PathBuf,
    export: Export,
    cs: Mutex<ClientState>,
}

fn fx(policy: ExportPolicy) -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let export = Export::new(braid::Context::new().unwrap(), &root, false)
        .unwrap()
        .with_policy(policy);
    Fx {
        _dir: dir,
        root,
        export,
        cs: Mutex::new(ClientState::default()),
    }
}

const CREDS: Creds = Creds {
    uid: 0,
    gid: 0,
    umask: 0,
};

impl Fx {
    fn top(&self) -> NodeId {
        self.export.root().unwrap().node
    }
    fn call(&self, req: Request) -> Result<Reply, Errno> {
        self.export.handle(&self.cs, req)
    }
    fn lookup(&self, name: &str) -> Entry {
        match self.call(Request::Lookup {
            parent: self.top(),
            name: name.into(),
        }) {
            Ok(Reply::Entry(e)) => e,
            other => panic!("lookup {name}: {other:?}"),
        }
    }
    fn create(&self, name: &str, mode: u32, flags: i32) -> Result<Reply, Errno> {
        self.call(Request::Create {
            parent: self.top(),
            name: name.into(),
            mode,
            flags: flags as u32,
            creds: CREDS,
        })
    }
    fn mknod(&self, name: &str, mode: u32, rdev: u32) -> Result<Reply, Errno> {
        self.call(Request::Mknod {
            parent: self.top(),
            name: name.into(),
            mode,
            rdev,
            creds: CREDS,
        })
    }
    /// Every way a client could get at the data of `name`: each must be refused with `want`.
    fn assert_never_opened(&self, name: &str, want: Errno) {
        for flags in [libc::O_RDWR, libc::O_RDWR | libc::O_TRUNC, libc::O_WRONLY] {
            assert_eq!(self.create(name, 0o644, flags).err(), Some(want), "{name}");
        }
        let node = self.lookup(name).node;
        for flags in [libc::O_RDONLY, libc::O_RDWR, libc::O_WRONLY | libc::O_TRUNC] {
            let r = self.call(Request::Open {
                node,
                flags: flags as u32,
            });
            assert_eq!(r.err(), Some(want), "open {name} {flags:#o}");
        }
        let set = SetAttr {
            size: Some(0),
            ..SetAttr::default()
        };
        let r = self.call(Request::SetAttr { node, fh: 0, set });
        assert!(r.is_err(), "truncate of {name}: {r:?}");
        // No handle was ever given out, so no data operation can reach the object.
        assert!(self.cs.lock().files_open() == 0);
        for fh in 1..4 {
            let w = Request::Write {
                fh,
                offset: 0,
                data: b"x".to_vec(),
            };
            assert_eq!(self.call(w).err(), Some(Errno::EBADF));
            let m = Request::MapRegion { fh, min_size: 1 };
            assert_eq!(self.call(m).err(), Some(Errno::EBADF));
            assert_eq!(
                self.call(Request::Commit { fh, flags: 0 }).err(),
                Some(Errno::EBADF)
            );
        }
    }
}

fn mknod_local(path: &Path, mode: u32, dev: u64) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string; mknod only reads it.
    let r = unsafe { libc::mknod(c.as_ptr(), mode, dev) };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn device_nodes_are_refused_by_mknod_unless_the_export_allows_them() {
    if !is_root() {
        return eprintln!("skipped: creating device nodes needs root");
    }
    let f = fx(ExportPolicy::default());
    // 7:0 is /dev/loop0 and 1:3 /dev/null in the wire's encoding (major << 8 | minor).
    let blk = f.mknod("disk", libc::S_IFBLK | 0o666, 7 << 8);
    assert_eq!(blk.err(), Some(Errno::EPERM));
    let chr = f.mknod("null", libc::S_IFCHR | 0o666, (1 << 8) | 3);
    assert_eq!(chr.err(), Some(Errno::EPERM));
    assert!(!f.root.join("disk").exists() && !f.root.join("null").exists());
    // FIFOs, sockets and plain files are harmless: created.
    f.mknod("fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    f.mknod("sock", libc::S_IFSOCK | 0o644, 0).unwrap();
    f.mknod("plain", 0o644, 0).unwrap();
    assert!(f.root.join("plain").metadata().unwrap().is_file());

    let open = fx(ExportPolicy {
        allow_devices: true,
        ..ExportPolicy::default()
    });
    let Reply::Entry(e) = open
        .mknod("null", libc::S_IFCHR | 0o666, (1 << 8) | 3)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(e.attr.mode & libc::S_IFMT, libc::S_IFCHR);
    // Allowed to exist, still never opened for data.
    open.assert_never_opened("null", Errno::EACCES);
}

#[test]
fn a_device_node_in_the_export_is_never_opened_for_data() {
    if !is_root() {
        return eprintln!("skipped: creating device nodes needs root");
    }
    let f = fx(ExportPolicy::default());
    // A character device that accepts any write (/dev/null's numbers), made locally.
    mknod_local(
        &f.root.join("dev"),
        libc::S_IFCHR | 0o666,
        libc::makedev(1, 3),
    );
    f.assert_never_opened("dev", Errno::EACCES);
    // A block device node (of a loop device number) likewise.
    mknod_local(
        &f.root.join("blk"),
        libc::S_IFBLK | 0o666,
        libc::makedev(7, 250),
    );
    f.assert_never_opened("blk", Errno::EACCES);
}

#[test]
fn a_fifo_in_the_export_never_blocks_nor_wakes_a_reader() {
    let f = fx(ExportPolicy::default());
    let fifo = f.root.join("fifo");
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::Mode::from_raw_mode(0o666),
    )
    .unwrap();
    // A local reader waits in open() for a writer to appear.
    let (tx, rx) = std::sync::mpsc::channel();
    let path = fifo.clone();
    let reader = std::thread::spawn(move || {
        let file = std::fs::File::open(&path);
        let _ = tx.send(());
        file
    });
    f.assert_never_opened("fifo", Errno::ENXIO);
    // Had the server opened the FIFO for writing, the reader's open would have returned.
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the server woke the FIFO's reader"
    );
    // Release the reader.
    let w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    rx.recv_timeout(Duration::from_secs(10)).unwrap();
    reader.join().unwrap().unwrap();
    drop(w);
    // A socket too.
    let _l = std::os::unix::net::UnixListener::bind(f.root.join("sock")).unwrap();
    f.assert_never_opened("sock", Errno::ENXIO);
}

#[test]
fn set_user_id_bits_from_a_client_are_squashed_unless_allowed() {
    for allow_setuid in [false, true] {
        let f = fx(ExportPolicy {
            allow_setuid,
            ..ExportPolicy::default()
        });
        let perm = |name: &str| f.root.join(name).metadata().unwrap().mode() & 0o7777;
        f.create("c", 0o6755, libc::O_RDWR).unwrap();
        f.mknod("m", 0o6755, 0).unwrap();
        f.call(Request::Mkdir {
            parent: f.top(),
            name: b"d".to_vec(),
            mode: 0o6755,
            creds: CREDS,
        })
        .unwrap();
        std::fs::write(f.root.join("s"), b"#!/bin/sh\n").unwrap();
        for n in ["s", "d"] {
            let node = f.lookup(n).node;
            let set = SetAttr {
                mode: Some(0o6755),
                ..SetAttr::default()
            };
            f.call(Request::SetAttr { node, fh: 0, set }).unwrap();
        }
        if allow_setuid {
            for n in ["c", "m", "s", "d"] {
                assert_eq!(perm(n), 0o6755, "{n}");
            }
        } else {
            for n in ["c", "m", "s"] {
                assert_eq!(perm(n), 0o755, "{n}");
            }
            // A directory keeps set-group-id (group inheritance, no privilege).
            assert_eq!(perm("d"), 0o2755);
        }
    }
}

#[test]
fn create_of_an_existing_file_opens_it_without_taking_it_over() {
    if !is_root() {
        return eprintln!("skipped: giving files away needs root");
    }
    let f = fx(ExportPolicy::default());
    let p = f.root.join("theirs");
    std::fs::write(&p, b"data").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&p, Some(4321), Some(4321)).unwrap();
    let r = f.call(Request::Create {
        parent: f.top(),
        name: b"theirs".to_vec(),
        mode: 0o777,
        flags: libc::O_RDWR as u32,
        creds: Creds {
            uid: 1234,
            gid: 1234,
            umask: 0,
        },
    });
    let Ok(Reply::Created(e, _, _)) = r else {
        panic!("{r:?}")
    };
    let md = p.metadata().unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (4321, 4321, 0o600)
    );
    assert_eq!(e.attr.size, 4);
    // With O_EXCL it is refused.
    let excl = f.create("theirs", 0o644, libc::O_RDWR | libc::O_EXCL);
    assert_eq!(excl.err(), Some(Errno::EEXIST));
}

#[test]
fn a_small_map_region_cannot_make_the_server_allocate_a_gib() {
    use std::os::unix::fs::MetadataExt;
    let f = fx(ExportPolicy::default());
    let Ok(Reply::Created(_, o, _)) = f.create("big", 0o644, libc::O_RDWR) else {
        panic!()
    };
    const GIB: u64 = 1 << 30;
    let Ok(Reply::Mapped(m)) = f.call(Request::MapRegion {
        fh: o.fh,
        min_size: GIB,
    }) else {
        panic!()
    };
    assert_eq!(m.attr.size, GIB);
    f.export.settle();
    // Only the end of the range, where a client's writes would land, is faulted in.
    let allocated = f.root.join("big").metadata().unwrap().blocks() * 512;
    assert!(
        allocated <= (64 << 20) + (1 << 20),
        "{allocated} bytes allocated for a 40-byte request"
    );
    // Growth per request is bounded too: the client asks again.
    let Ok(Reply::Mapped(m)) = f.call(Request::MapRegion {
        fh: o.fh,
        min_size: 1 << 50,
    }) else {
        panic!()
    };
    assert_eq!(m.attr.size, 2 * GIB);
    f.export.settle();
    let allocated = f.root.join("big").metadata().unwrap().blocks() * 512;
    assert!(allocated <= 2 * (64 << 20) + (1 << 20), "{allocated}");
}

#[test]
fn an_id_of_minus_one_is_refused_not_taken_as_leave_it() {
    if !is_root() {
        return eprintln!("skipped: giving files away needs root");
    }
    let f = fx(ExportPolicy::default());
    let creds = Creds {
        uid: u32::MAX,
        gid: 5,
        umask: 0,
    };
    let r = f.call(Request::Mkdir {
        parent: f.top(),
        name: b"d".to_vec(),
        mode: 0o755,
        creds,
    });
    assert_eq!(r.err(), Some(Errno::EINVAL));
    assert!(!f.root.join("d").exists(), "nothing is created");
    std::fs::write(f.root.join("x"), b"").unwrap();
    let node = f.lookup("x").node;
    for set in [
        SetAttr {
            uid: Some(u32::MAX),
            ..SetAttr::default()
        },
        SetAttr {
            gid: Some(u32::MAX),
            ..SetAttr::default()
        },
    ] {
        let r = f.call(Request::SetAttr { node, fh: 0, set });
        assert_eq!(r.err(), Some(Errno::EINVAL));
    }
}
