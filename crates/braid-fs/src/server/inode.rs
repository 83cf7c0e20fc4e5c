//! The server's inode table: server-chosen ids for the objects clients have looked up, each
//! holding an `O_PATH` descriptor of the object, so a handle never names a path.

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

/// Ids to objects. Ids are never reused while the server runs.
pub(crate) struct InodeTable {
    generation: u64,
    inner: Mutex<TableInner>,
}

struct TableInner {
    by_id: HashMap<u64, Slot>,
    by_key: HashMap<(u64, u64), u64>,
    next_id: u64,
}

impl InodeTable {
    /// A table whose root is `root` (an `O_PATH` directory descriptor).
    pub(crate) fn new(root: OwnedFd, generation: u64) -> Result<InodeTable, Errno> {
        let st = rustix::fs::fstat(&root)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        let key = (st.st_dev, st.st_ino);
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
            inner: Mutex::new(TableInner {
                by_id,
                by_key: HashMap::from([(key, ROOT_ID)]),
                next_id: ROOT_ID + 1,
            }),
        })
    }

    /// The generation of this server's handles.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// The handle of an inode.
    pub(crate) fn node_id(&self, inode: &Inode) -> NodeId {
        NodeId {
            id: inode.id,
            generation: self.generation,
        }
    }

    /// The object a handle names; `ESTALE` for unknown ids or another generation.
    pub(crate) fn get(&self, node: NodeId) -> Result<Arc<Inode>, Errno> {
        if node.generation != self.generation {
            return Err(Errno::ESTALE);
        }
        self.inner
            .lock()
            .by_id
            .get(&node.id)
            .map(|s| s.inode.clone())
            .ok_or(Errno::ESTALE)
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
        let id = t.next_id;
        t.next_id += 1;
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
    Ok(rustix::fs::openat2(
        dir,
        os(path)?,
        flags,
        Mode::empty(),
        resolve_flags(),
    )?)
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
