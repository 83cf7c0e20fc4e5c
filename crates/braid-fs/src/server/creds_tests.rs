//! Requests carried out as their callers: the kernel's permission, ownership, sticky and
//! set-group-id rules apply to a non-root caller as to a local process. These run as root
//! (the thread switches); without root they say so and check nothing else.

use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::creds::{CallerMap, Squash};
use super::export::{ClientState, Export};
use crate::proto::{Caller, Creds, Entry, Errno, NodeId, Reply, Request, SetAttr};

const ALICE: u32 = 61001;
const BOB: u32 = 61002;
const STAFF: u32 = 63000;

struct Fx {
    _dir: tempfile::TempDir,
    root: PathBuf,
    export: Export,
    cs: Mutex<ClientState>,
    map: CallerMap,
}

/// A root-owned export (0755) with `map`'s squashing, or `None` (and a note) without root.
fn fixture(squash: Squash) -> Option<Fx> {
    let map = CallerMap::new(squash, 65534, 65534);
    if !map.switches() {
        eprintln!("skipped: acting as callers needs root (CAP_SETUID, CAP_SETGID)");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("export");
    std::fs::create_dir(&root).unwrap();
    set_mode(&root, 0o755);
    let ctx = braid::Context::new().unwrap();
    let export = Export::new(ctx, &root, false).unwrap();
    Some(Fx {
        _dir: dir,
        root,
        export,
        cs: Mutex::new(ClientState::default()),
        map,
    })
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn user(uid: u32, groups: &[u32]) -> Caller {
    Caller::new(uid, uid, groups.to_vec())
}

fn creds(c: &Caller) -> Creds {
    Creds {
        uid: c.uid,
        gid: c.gid,
        umask: 0,
    }
}

impl Fx {
    fn call(&self, who: &Caller, req: Request) -> Result<Reply, Errno> {
        let _acting = self.map.enter(who, &req)?;
        self.export.handle(&self.cs, req)
    }

    /// A file or directory at `rel` (made by root), with `mode` and owner `uid:gid`.
    fn make(&self, rel: &str, dir: bool, mode: u32, uid: u32, gid: u32) -> PathBuf {
        let p = self.root.join(rel);
        if dir {
            std::fs::create_dir(&p).unwrap();
        } else {
            std::fs::write(&p, b"data").unwrap();
        }
        chown(&p, Some(uid), Some(gid)).unwrap();
        set_mode(&p, mode);
        p
    }

    fn node(&self, rel: &str) -> NodeId {
        if rel.is_empty() {
            return self.export.root().unwrap().node;
        }
        let root = self.export.root().unwrap().node;
        // As the server (root), whatever the squashing.
        match self.export.handle(
            &self.cs,
            Request::Walk {
                parent: root,
                path: rel.as_bytes().to_vec(),
                follow: false,
            },
        ) {
            Ok(Reply::Entry(Entry { node, .. })) => node,
            other => panic!("walk {rel}: {other:?}"),
        }
    }

    fn open(&self, who: &Caller, rel: &str, flags: i32) -> Result<Reply, Errno> {
        let node = self.node(rel);
        self.call(
            who,
            Request::Open {
                node,
                flags: flags as u32,
            },
        )
    }

    fn setattr(&self, who: &Caller, rel: &str, set: SetAttr) -> Result<Reply, Errno> {
        let node = self.node(rel);
        self.call(who, Request::SetAttr { node, fh: 0, set })
    }

    fn create(&self, who: &Caller, dir: &str, name: &str, mode: u32) -> Result<Reply, Errno> {
        let parent = self.node(dir);
        self.call(
            who,
            Request::Create {
                parent,
                name: name.as_bytes().to_vec(),
                mode,
                flags: libc::O_RDWR as u32,
                creds: creds(who),
            },
        )
    }

    fn mkdir(&self, who: &Caller, dir: &str, name: &str, mode: u32) -> Result<Reply, Errno> {
        let parent = self.node(dir);
        self.call(
            who,
            Request::Mkdir {
                parent,
                name: name.as_bytes().to_vec(),
                mode,
                creds: creds(who),
            },
        )
    }

    fn unlink(&self, who: &Caller, dir: &str, name: &str) -> Result<Reply, Errno> {
        let parent = self.node(dir);
        self.call(
            who,
            Request::Unlink {
                parent,
                name: name.as_bytes().to_vec(),
            },
        )
    }

    fn rename(&self, who: &Caller, dir: &str, from: &str, to: &str) -> Result<Reply, Errno> {
        let parent = self.node(dir);
        self.call(
            who,
            Request::Rename {
                parent,
                name: from.as_bytes().to_vec(),
                new_parent: parent,
                new_name: to.as_bytes().to_vec(),
                flags: 0,
            },
        )
    }
}

fn mode(set: u32) -> SetAttr {
    SetAttr {
        mode: Some(set),
        ..Default::default()
    }
}

fn owner(uid: Option<u32>, gid: Option<u32>) -> SetAttr {
    SetAttr {
        uid,
        gid,
        ..Default::default()
    }
}

#[test]
fn a_private_file_of_another_user_cannot_be_opened() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    f.make("private", false, 0o600, ALICE, ALICE);
    let (alice, bob) = (user(ALICE, &[]), user(BOB, &[]));
    assert!(matches!(
        f.open(&alice, "private", libc::O_RDWR),
        Ok(Reply::Opened(_))
    ));
    assert_eq!(f.open(&bob, "private", libc::O_RDONLY), Err(Errno::EACCES));
    assert_eq!(f.open(&bob, "private", libc::O_WRONLY), Err(Errno::EACCES));
    // Truncating by name needs write permission too.
    let trunc = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert_eq!(f.setattr(&bob, "private", trunc), Err(Errno::EACCES));
    // A directory bob cannot search hides its names from him.
    f.make("closed", true, 0o700, ALICE, ALICE);
    f.make("closed/inner", false, 0o644, ALICE, ALICE);
    let closed = f.node("closed");
    let look = |who: &Caller| {
        f.call(
            who,
            Request::Lookup {
                parent: closed,
                name: b"inner".to_vec(),
            },
        )
        .map(|_| ())
    };
    assert_eq!(look(&bob), Err(Errno::EACCES));
    assert_eq!(look(&alice), Ok(()));
}

#[test]
fn group_membership_grants_group_permissions() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    f.make("shared", false, 0o640, ALICE, STAFF);
    assert!(
        f.open(&user(BOB, &[STAFF]), "shared", libc::O_RDONLY)
            .is_ok()
    );
    assert_eq!(
        f.open(&user(BOB, &[STAFF]), "shared", libc::O_WRONLY),
        Err(Errno::EACCES)
    );
    assert_eq!(
        f.open(&user(BOB, &[]), "shared", libc::O_RDONLY),
        Err(Errno::EACCES)
    );
    // The primary group counts too.
    assert!(
        f.open(&Caller::new(BOB, STAFF, vec![]), "shared", libc::O_RDONLY)
            .is_ok()
    );
}

#[test]
fn only_the_owner_changes_mode_and_nobody_but_root_gives_a_file_away() {
    let Some(f) = fixture(Squash::None) else {
        return;
    };
    let p = f.make("file", false, 0o666, ALICE, ALICE);
    let (alice, bob) = (user(ALICE, &[STAFF]), user(BOB, &[]));
    // Write permission is not ownership.
    assert_eq!(f.setattr(&bob, "file", mode(0o777)), Err(Errno::EPERM));
    assert_eq!(
        f.setattr(&bob, "file", owner(Some(BOB), None)),
        Err(Errno::EPERM)
    );
    assert!(f.setattr(&alice, "file", mode(0o640)).is_ok());
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o640);
    // The owner may not give the file away (CAP_CHOWN is gone with a non-root fsuid) ...
    assert_eq!(
        f.setattr(&alice, "file", owner(Some(BOB), None)),
        Err(Errno::EPERM)
    );
    assert_eq!(
        f.setattr(&alice, "file", owner(Some(0), None)),
        Err(Errno::EPERM)
    );
    // ... but may hand it to a group of hers, and no other.
    assert!(f.setattr(&alice, "file", owner(None, Some(STAFF))).is_ok());
    assert_eq!(std::fs::metadata(&p).unwrap().gid(), STAFF);
    assert_eq!(
        f.setattr(&alice, "file", owner(None, Some(BOB))),
        Err(Errno::EPERM)
    );
    // Times: only the owner sets explicit ones.
    let at = crate::proto::TimeSet::At(crate::proto::Timestamp { secs: 1, nanos: 0 });
    let times = SetAttr {
        mtime: at,
        ..Default::default()
    };
    assert_eq!(f.setattr(&bob, "file", times), Err(Errno::EPERM));
    // Trusted root (no_root_squash) keeps its capabilities.
    assert!(
        f.setattr(&user(0, &[]), "file", owner(Some(BOB), Some(BOB)))
            .is_ok()
    );
    assert_eq!(std::fs::metadata(&p).unwrap().uid(), BOB);
}

#[test]
fn a_sticky_directory_protects_other_users_names() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    f.make("tmp", true, 0o1777, 0, 0);
    f.make("tmp/alices", false, 0o666, ALICE, ALICE);
    let (alice, bob) = (user(ALICE, &[]), user(BOB, &[]));
    assert_eq!(f.unlink(&bob, "tmp", "alices"), Err(Errno::EPERM));
    assert_eq!(f.rename(&bob, "tmp", "alices", "mine"), Err(Errno::EPERM));
    assert!(f.create(&bob, "tmp", "bobs", 0o666).is_ok());
    assert_eq!(
        f.rename(&bob, "tmp", "bobs", "alices"),
        Err(Errno::EPERM),
        "replacing another's name"
    );
    assert!(f.rename(&alice, "tmp", "alices", "renamed").is_ok());
    assert!(f.unlink(&alice, "tmp", "renamed").is_ok());
    // Without the sticky bit, write permission on the directory is enough.
    f.make("open", true, 0o777, 0, 0);
    f.make("open/alices", false, 0o600, ALICE, ALICE);
    assert!(f.unlink(&bob, "open", "alices").is_ok());
}

#[test]
fn new_objects_belong_to_the_caller_and_inherit_a_setgid_directory_group() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    f.make("plain", true, 0o777, 0, 0);
    f.make("team", true, 0o2777, ALICE, STAFF);
    let alice = user(ALICE, &[STAFF]);
    let Ok(Reply::Created(e, _, _)) = f.create(&alice, "plain", "a", 0o644) else {
        panic!("create failed")
    };
    assert_eq!((e.attr.uid, e.attr.gid), (ALICE, ALICE));
    let Ok(Reply::Created(e, _, _)) = f.create(&alice, "team", "f", 0o644) else {
        panic!("create failed")
    };
    assert_eq!((e.attr.uid, e.attr.gid), (ALICE, STAFF));
    let Ok(Reply::Entry(d)) = f.mkdir(&alice, "team", "sub", 0o755) else {
        panic!("mkdir failed")
    };
    assert_eq!((d.attr.uid, d.attr.gid), (ALICE, STAFF));
    assert_ne!(d.attr.mode & 0o2000, 0, "a subdirectory keeps set-group-id");
    // A non-member's set-group-id file loses the bit on creation, as on ext4.
    let bob = user(BOB, &[]);
    let Ok(Reply::Created(e, _, _)) = f.create(&bob, "team", "g", 0o2755) else {
        panic!("create failed")
    };
    assert_eq!((e.attr.uid, e.attr.gid), (BOB, STAFF));
    assert_eq!(e.attr.mode & 0o2000, 0);
    // The ids in the request body do not override the caller's.
    let parent = f.node("plain");
    let spoof = Request::Mkdir {
        parent,
        name: b"spoof".to_vec(),
        mode: 0o755,
        creds: Creds {
            uid: 0,
            gid: 0,
            umask: 0,
        },
    };
    let Ok(Reply::Entry(d)) = f.call(&bob, spoof) else {
        panic!("mkdir failed")
    };
    assert_eq!((d.attr.uid, d.attr.gid), (BOB, BOB));
    // Where the caller may not write, nothing is made.
    assert_eq!(f.create(&bob, "", "top", 0o644), Err(Errno::EACCES));
}

#[test]
fn root_squash_makes_client_root_the_anonymous_user() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    let root = user(0, &[0, 5]);
    f.make("pub", true, 0o777, 0, 0);
    f.make("secret", false, 0o600, 0, 0);
    let Ok(Reply::Created(e, _, _)) = f.create(&root, "pub", "r", 0o644) else {
        panic!("create failed")
    };
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 65534));
    assert_eq!(f.open(&root, "secret", libc::O_RDONLY), Err(Errno::EACCES));
    assert_eq!(
        f.setattr(&root, "secret", owner(Some(ALICE), None)),
        Err(Errno::EPERM)
    );
    assert_eq!(f.map.map(&root), Caller::new(65534, 65534, vec![65534, 5]));
    assert_eq!(f.map.map(&user(ALICE, &[1])), user(ALICE, &[1]));
    let all = CallerMap::new(Squash::All, 7, 8);
    assert_eq!(all.map(&user(ALICE, &[1, 2])), Caller::new(7, 8, vec![]));
    assert_eq!(
        CallerMap::new(Squash::None, 7, 8).map(&root),
        user(0, &[0, 5])
    );
}

/// The fsuid and CapEff of this thread, from /proc.
fn fsuid_and_caps() -> (u32, u64) {
    let s = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    let field = |name: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .trim()
            .to_string()
    };
    let fsuid = field("Uid:")
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    let caps = u64::from_str_radix(&field("CapEff:"), 16).unwrap();
    (fsuid, caps)
}

#[test]
fn acting_changes_this_thread_only_and_is_undone_after_the_request() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    let before = fsuid_and_caps();
    let groups_before = rustix::process::getgroups().unwrap();
    let req = Request::Lookup {
        parent: f.export.root().unwrap().node,
        name: b"x".to_vec(),
    };
    // Started before the switch (a new thread inherits its creator's credentials): it
    // looks at its own when asked.
    let (ask, asked) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || {
        asked.recv().unwrap();
        (fsuid_and_caps(), rustix::process::getgroups().unwrap())
    });
    {
        let _acting = f.map.enter(&user(ALICE, &[STAFF]), &req).unwrap();
        let (fsuid, caps) = fsuid_and_caps();
        assert_eq!(fsuid, ALICE);
        // CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH, CAP_FOWNER, CAP_FSETID.
        assert_eq!(caps & 0x1f, 0, "file system capabilities dropped");
        assert_eq!(rustix::process::getgroups().unwrap().len(), 1);
        ask.send(()).unwrap();
        let other = other.join().unwrap();
        assert_eq!(
            other.0, before,
            "another thread keeps the server's identity"
        );
        assert_eq!(other.1, groups_before, "and its groups");
    }
    assert_eq!(fsuid_and_caps(), before);
    assert_eq!(rustix::process::getgroups().unwrap(), groups_before);
    // The server's own identity needs no switch.
    let own = Caller {
        groups: groups_before.iter().map(|g| g.as_raw()).collect(),
        ..Caller::of_process()
    };
    let none = CallerMap::new(Squash::None, 65534, 65534);
    let _acting = none.enter(&own, &req).unwrap();
    assert_eq!(super::creds::acting_uid(), None);
    drop(_acting);
    // Requests on open handles run as the server.
    let write = Request::Write {
        fh: 1,
        offset: 0,
        data: vec![],
    };
    let _acting = f.map.enter(&user(ALICE, &[]), &write).unwrap();
    assert_eq!(fsuid_and_caps(), before);
}

#[test]
fn a_writer_may_clear_the_set_id_bits_as_a_write_does_and_nothing_more() {
    use super::creds::only_clears_setid;
    assert!(only_clears_setid(0o106777, 0o777));
    assert!(only_clears_setid(0o4755, 0o755));
    assert!(!only_clears_setid(0o4755, 0o4755), "no change");
    assert!(
        !only_clears_setid(0o4755, 0o744),
        "more than the set-id bits"
    );
    assert!(!only_clears_setid(0o755, 0o4755), "setting one");
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    let p = f.make("setid", false, 0o6777, 0, 0);
    let bob = user(BOB, &[]);
    assert_eq!(f.setattr(&bob, "setid", mode(0o776)), Err(Errno::EPERM));
    let r = f.setattr(&bob, "setid", mode(0o777));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o777);
    // Not a writer: the bits stay.
    f.make("readonly", false, 0o4755, 0, 0);
    assert_eq!(f.setattr(&bob, "readonly", mode(0o755)), Err(Errno::EPERM));
}

#[test]
fn write_only_files_and_unsearchable_directories_open_as_locally() {
    let Some(f) = fixture(Squash::Root) else {
        return;
    };
    let alice = user(ALICE, &[]);
    f.make("wonly", false, 0o200, ALICE, ALICE);
    let Ok(Reply::Opened(o)) = f.open(&alice, "wonly", libc::O_WRONLY) else {
        panic!("a write-only open of a -w------- file")
    };
    let w = Request::Write {
        fh: o.fh,
        offset: 0,
        data: b"in".to_vec(),
    };
    assert!(f.call(&alice, w).is_ok());
    assert_eq!(f.open(&alice, "wonly", libc::O_RDONLY), Err(Errno::EACCES));
    assert_eq!(f.open(&alice, "wonly", libc::O_RDWR), Err(Errno::EACCES));
    // A directory is read with read permission, without search permission.
    f.make("readable", true, 0o600, ALICE, ALICE);
    f.make("searchable", true, 0o100, ALICE, ALICE);
    let opendir = |rel: &str| {
        let node = f.node(rel);
        f.call(&alice, Request::OpenDir { node }).map(|_| ())
    };
    assert_eq!(opendir("readable"), Ok(()));
    assert_eq!(opendir("searchable"), Err(Errno::EACCES));
}
