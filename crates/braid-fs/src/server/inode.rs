//! The server's inode table: server-chosen ids for the objects clients have looked up, each
//! holding an `O_PATH` descriptor of the object, so a handle never names a path.

#[path = "handles.rs"]
mod handles;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use super::region::FileRegions;
use crate::proto::{Attr, Errno, NodeId, Timestamp};

/// The id of the export's root.
pub(crate) const ROOT_ID: u64 = 1;

/// How every client-supplied name or path is resolved: never above the starting directory,
/// never through a `/proc` magic link.
pub(crate) fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// One object a client has looked up.
pub(crate) struct Inode {
    pub(crate) id: u64,
    /// `O_PATH | O_NOFOLLOW` descriptor of the object itself.
    pub(crate) fd: OwnedFd,
    /// `S_IFMT` bits; an object's type never changes.
    pub(crate) kind: u32,
    /// `(st_dev, st_ino)`.
    pub(crate) key: (u64, u64),
    /// Registered pages (regular files with open handles).
    pub(crate) regions: Mutex<FileRegions>,
}

impl Inode {
    pub(crate) fn is_dir(&self) -> bool {
        self.kind == libc::S_IFDIR
    }

    pub(crate) fn is_file(&self) -> bool {
        self.kind == libc::S_IFREG
    }

    pub(crate) fn is_symlink(&self) -> bool {
        self.kind == libc::S_IFLNK
    }

    /// Fails with `ENOTDIR` unless this is a directory.
    pub(crate) fn dir(&self) -> Result<&OwnedFd, Errno> {
        if self.is_dir() {
            Ok(&self.fd)
        } else {
            Err(Errno::ENOTDIR)
        }
    }

    /// The `/proc/self/fd` path of the `O_PATH` descriptor. Only used for regular files and
    /// directories, where the magic link leads to the object itself and nothing beyond it.
    pub(crate) fn proc_path(&self) -> Result<String, Errno> {
        if self.is_symlink() {
            return Err(Errno::EINVAL);
        }
        Ok(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Opens the object itself for I/O (`flags` such as `O_RDWR`), without following a path.
    pub(crate) fn reopen(&self, flags: OFlags) -> Result<OwnedFd, Errno> {
        let p = self.proc_path()?;
        Ok(rustix::fs::open(
            p.as_str(),
            flags | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// Attributes now.
    pub(crate) fn attr(&self) -> Result<Attr, Errno> {
        Ok(attr_of(&rustix::fs::fstat(&self.fd)?))
    }
}

/// Attributes from a `stat`.
pub(crate) fn attr_of(st: &rustix::fs::Stat) -> Attr {
    let ts = |s: i64, ns: i64| Timestamp {
        secs: s,
        nanos: ns.clamp(0, 999_999_999) as u32,
    };
    let rdev = st.st_rdev;
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    Attr {
        ino: st.st_ino,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: ts(st.st_atime, st.st_atime_nsec as i64),
        mtime: ts(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: ts(st.st_ctime, st.st_ctime_nsec as i64),
        mode: st.st_mode,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        // The kernel's 32-bit "new" device encoding, as FUSE carries it.
        rdev: (minor & 0xff) | (major << 8) | ((minor & !0xff) << 12),
        blksize: st.st_blksize as u32,
    }
}

/// The inverse of the `rdev` encoding of [`attr_of`].
pub(crate) fn dev_from_wire(rdev: u32) -> u64 {
    let major = (rdev & 0xfff00) >> 8;
    let minor = (rdev & 0xff) | ((rdev >> 12) & 0xfff00);
    libc::makedev(major, minor)
}

struct Slot {
    inode: Arc<Inode>,
    /// Lookup references held by all clients together.
    refs: u64,
}

/// Ids to objects. An id is the object's inode number on the export's device (see
/// `server/handles.rs`), so it survives a restart of the server; objects elsewhere get
/// volatile ids, never reused while the server runs.
pub(crate) struct InodeTable {
    /// The export's tag: the generation of every handle (see [`handles::export_tag`]).
    generation: u64,
    /// Random per server process: tells a client that the server restarted.
    boot: u64,
    /// `st_dev` and `st_ino` of the export root.
    export_dev: u64,
    root_ino: u64,
    inner: Mutex<TableInner>,
    /// One search for a forgotten id at a time (each may read the whole export).
    searching: Mutex<()>,
}

struct TableInner {
    by_id: HashMap<u64, Slot>,
    by_key: HashMap<(u64, u64), u64>,
    next_volatile: u64,
    /// Objects found by searching since the last sweep of unreferenced entries.
    found: usize,
}

/// Unreferenced entries found by searching that may gather before they are swept.
const MAX_FOUND: usize = 4096;

impl InodeTable {
    /// A table whose root is `root` (an `O_PATH` directory descriptor); `boot` is this
    /// server process's random boot id.
    pub(crate) fn new(root: OwnedFd, boot: u64) -> Result<InodeTable, Errno> {
        let st = rustix::fs::fstat(&root)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        let key = (st.st_dev, st.st_ino);
        let generation = handles::export_tag(&st);
        let root = Arc::new(Inode {
            id: ROOT_ID,
            fd: root,
            kind: libc::S_IFDIR,
            key,
            regions: Mutex::new(FileRegions::default()),
        });
        let mut by_id = HashMap::new();
        by_id.insert(
            ROOT_ID,
            Slot {
                inode: root,
                refs: 1,
            },
        );
        Ok(InodeTable {
            generation,
            boot,
            export_dev: st.st_dev,
            root_ino: st.st_ino,
            inner: Mutex::new(TableInner {
                by_id,
                by_key: HashMap::from([(key, ROOT_ID)]),
                next_volatile: 1,
                found: 0,
            }),
            searching: Mutex::new(()),
        })
    }

    /// The generation of this export's handles (the same in every server process).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// This server process's random boot id.
    #[allow(dead_code)] // Sent to clients once the hello carries it.
    pub(crate) fn boot(&self) -> u64 {
        self.boot
    }

    /// The handle of an inode.
    pub(crate) fn node_id(&self, inode: &Inode) -> NodeId {
        NodeId {
            id: inode.id,
            generation: self.generation,
        }
    }

    /// The object a handle names; `ESTALE` for another export's handles and for objects
    /// that no longer exist in the export. A persistent id this process never handed out
    /// (one from before a restart) is found again by searching the export; it then holds
    /// one lookup reference (the client's `Forget`s drop it).
    pub(crate) fn get(&self, node: NodeId) -> Result<Arc<Inode>, Errno> {
        if node.generation != self.generation {
            return Err(Errno::ESTALE);
        }
        if let Some(s) = self.inner.lock().by_id.get(&node.id) {
            return Ok(s.inode.clone());
        }
        if node.id & handles::VOLATILE != 0 || node.id <= ROOT_ID {
            return Err(Errno::ESTALE);
        }
        let _one = self.searching.lock();
        // Another search may have found it meanwhile.
        if let Some(s) = self.inner.lock().by_id.get(&node.id) {
            return Ok(s.inode.clone());
        }
        let root = self.get(NodeId {
            id: ROOT_ID,
            generation: self.generation,
        })?;
        match handles::find_beneath(&root.fd, self.export_dev, node.id)? {
            Some(fd) => self.install_found(fd),
            None => Err(Errno::ESTALE),
        }
    }

    /// Keeps an object a search found, with no lookup reference: no client of this process
    /// looked it up. Such entries are dropped once [`MAX_FOUND`] have gathered and nothing
    /// uses them (a later request searches again).
    fn install_found(&self, fd: OwnedFd) -> Result<Arc<Inode>, Errno> {
        let (inode, _) = self.install(fd)?;
        let mut t = self.inner.lock();
        if let Some(slot) = t.by_id.get_mut(&inode.id) {
            slot.refs -= 1;
        }
        t.found += 1;
        if t.found > MAX_FOUND {
            t.found = 0;
            let before = t.by_id.len();
            t.by_id
                .retain(|_, s| s.refs > 0 || Arc::strong_count(&s.inode) > 1);
            if t.by_id.len() != before {
                let TableInner { by_id, by_key, .. } = &mut *t;
                by_key.retain(|_, id| by_id.contains_key(id));
            }
        }
        Ok(inode)
    }

    /// Adds one lookup reference to the object `fd` (an `O_PATH` descriptor) names, creating
    /// its entry if it has none. Returns the inode and its attributes.
    pub(crate) fn install(&self, fd: OwnedFd) -> Result<(Arc<Inode>, Attr), Errno> {
        let st = rustix::fs::fstat(&fd)?;
        let key = (st.st_dev, st.st_ino);
        let mut t = self.inner.lock();
        if let Some(id) = t.by_key.get(&key).copied()
            && let Some(slot) = t.by_id.get_mut(&id)
        {
            slot.refs += 1;
            return Ok((slot.inode.clone(), attr_of(&st)));
        }
        let id = match handles::persistent_id(self.export_dev, self.root_ino, key.0, key.1) {
            Some(id) => id,
            None => {
                t.next_volatile += 1;
                handles::VOLATILE | t.next_volatile
            }
        };
        let inode = Arc::new(Inode {
            id,
            fd,
            kind: st.st_mode & libc::S_IFMT,
            key,
            regions: Mutex::new(FileRegions::default()),
        });
        t.by_key.insert(key, id);
        t.by_id.insert(
            id,
            Slot {
                inode: inode.clone(),
                refs: 1,
            },
        );
        Ok((inode, attr_of(&st)))
    }

    /// Drops `n` lookup references; the entry goes when none are left (never the root).
    pub(crate) fn forget(&self, id: u64, n: u64) {
        if id == ROOT_ID {
            return;
        }
        let mut t = self.inner.lock();
        let gone = match t.by_id.get_mut(&id) {
            Some(s) => {
                s.refs = s.refs.saturating_sub(n);
                s.refs == 0
            }
            None => false,
        };
        if gone && let Some(s) = t.by_id.remove(&id) {
            let key = s.inode.key;
            if t.by_key.get(&key) == Some(&id) {
                t.by_key.remove(&key);
            }
        }
    }

    /// Number of entries (the root included).
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().by_id.len()
    }
}

/// Opens `path` beneath `dir` as an `O_PATH` descriptor (`follow`: follow a final symlink,
/// inside the export only).
pub(crate) fn open_beneath(dir: impl AsFd, path: &[u8], follow: bool) -> Result<OwnedFd, Errno> {
    let mut flags = OFlags::PATH | OFlags::CLOEXEC;
    if !follow {
        flags |= OFlags::NOFOLLOW;
    }
    Ok(openat2_beneath(dir, os(path)?, flags, Mode::empty())?)
}

/// `openat2` beneath `dir` with [`resolve_flags`]. The kernel answers `EAGAIN` when a
/// rename or mount anywhere on the system raced the resolution of a `..` in the path;
/// the resolution is then simply tried again (a bounded number of times).
pub(crate) fn openat2_beneath<P: rustix::path::Arg + Copy>(
    dir: impl AsFd,
    path: P,
    flags: OFlags,
    mode: Mode,
) -> rustix::io::Result<OwnedFd> {
    const TRIES: usize = 64;
    let dir = dir.as_fd();
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir, path, flags, mode, resolve_flags()) {
            Err(rustix::io::Errno::AGAIN) if tries < TRIES => tries += 1,
            r => return r,
        }
    }
}

/// `fstatat(fd, "", AT_EMPTY_PATH)` flags for an `O_PATH` descriptor.
pub(crate) fn empty_path() -> AtFlags {
    AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
}

/// A name or path from a request as an `OsStr` (the decoder refused NUL bytes; checked
/// again here because this is what reaches the system call).
pub(crate) fn os(b: &[u8]) -> Result<&std::ffi::OsStr, Errno> {
    use std::os::unix::ffi::OsStrExt;
    if b.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(std::ffi::OsStr::from_bytes(b))
}
