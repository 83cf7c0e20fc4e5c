//! The value types carried inside requests and replies, each with its wire layout.

use super::DecodeError;
use super::codec::{Reader, Writer};

/// A server-side file handle: an id the server chose plus the generation of the server
/// instance that chose it. Ids are never reused while a server runs, and a restarted server
/// has a new generation, so a handle the server no longer knows gets `ESTALE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId {
    /// The server's id for the object (1 is the export's root).
    pub id: u64,
    /// The generation the id belongs to.
    pub generation: u64,
}

impl NodeId {
    pub(crate) fn put(&self, w: &mut Writer) {
        w.u64(self.id);
        w.u64(self.generation);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<NodeId, DecodeError> {
        Ok(NodeId {
            id: r.u64()?,
            generation: r.u64()?,
        })
    }
}

/// A point in time: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Timestamp {
    /// Seconds (negative before 1970).
    pub secs: i64,
    /// Nanoseconds, below 10^9.
    pub nanos: u32,
}

impl Timestamp {
    fn put(&self, w: &mut Writer) {
        w.i64(self.secs);
        w.u32(self.nanos);
    }
    fn get(r: &mut Reader<'_>) -> Result<Timestamp, DecodeError> {
        let secs = r.i64()?;
        let nanos = r.u32()?;
        if nanos >= 1_000_000_000 {
            return Err(DecodeError::BadValue("nanoseconds", nanos as u64));
        }
        Ok(Timestamp { secs, nanos })
    }

    /// As a `SystemTime` (saturating at the representable range).
    pub fn to_system_time(self) -> std::time::SystemTime {
        use std::time::{Duration, UNIX_EPOCH};
        if self.secs >= 0 {
            UNIX_EPOCH + Duration::new(self.secs as u64, self.nanos)
        } else {
            UNIX_EPOCH
                .checked_sub(Duration::new(self.secs.unsigned_abs(), 0))
                .and_then(|t| t.checked_add(Duration::from_nanos(self.nanos as u64)))
                .unwrap_or(UNIX_EPOCH)
        }
    }

    /// From a `SystemTime`.
    pub fn from_system_time(t: std::time::SystemTime) -> Timestamp {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: d.as_secs() as i64,
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                let d = e.duration();
                let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
                if nanos > 0 {
                    secs -= 1;
                    nanos = 1_000_000_000 - nanos;
                }
                Timestamp { secs, nanos }
            }
        }
    }
}

/// Attributes of a file, as `statx` reports them on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Attr {
    /// The server's inode number (`st_ino`).
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    /// Last access.
    pub atime: Timestamp,
    /// Last data modification.
    pub mtime: Timestamp,
    /// Last status change.
    pub ctime: Timestamp,
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    /// Hard links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Device number of a device node.
    pub rdev: u32,
    /// Preferred I/O size.
    pub blksize: u32,
}

impl Attr {
    pub(crate) fn put(&self, w: &mut Writer) {
        w.u64(self.ino);
        w.u64(self.size);
        w.u64(self.blocks);
        self.atime.put(w);
        self.mtime.put(w);
        self.ctime.put(w);
        w.u32(self.mode);
        w.u32(self.nlink);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u32(self.rdev);
        w.u32(self.blksize);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<Attr, DecodeError> {
        Ok(Attr {
            ino: r.u64()?,
            size: r.u64()?,
            blocks: r.u64()?,
            atime: Timestamp::get(r)?,
            mtime: Timestamp::get(r)?,
            ctime: Timestamp::get(r)?,
            mode: r.u32()?,
            nlink: r.u32()?,
            uid: r.u32()?,
            gid: r.u32()?,
            rdev: r.u32()?,
            blksize: r.u32()?,
        })
    }

    /// The file type bits (`mode & S_IFMT`).
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    /// True for a regular file.
    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }

    /// True for a directory.
    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }
}

/// A name resolved: the handle and its attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The handle; the server counts one lookup reference for it (released by `Forget`).
    pub node: NodeId,
    /// Its attributes.
    pub attr: Attr,
}

impl Entry {
    pub(crate) fn put(&self, w: &mut Writer) {
        self.node.put(w);
        self.attr.put(w);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<Entry, DecodeError> {
        Ok(Entry {
            node: NodeId::get(r)?,
            attr: Attr::get(r)?,
        })
    }
}

/// How `SetAttr` changes a time stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TimeSet {
    /// Leave it.
    #[default]
    Omit,
    /// Set it to the server's current time.
    Now,
    /// Set it to this time.
    At(Timestamp),
}

impl TimeSet {
    fn put(&self, w: &mut Writer) {
        match self {
            TimeSet::Omit => w.u8(0),
            TimeSet::Now => w.u8(1),
            TimeSet::At(t) => {
                w.u8(2);
                t.put(w);
            }
        }
    }
    fn get(r: &mut Reader<'_>) -> Result<TimeSet, DecodeError> {
        Ok(match r.u8()? {
            0 => TimeSet::Omit,
            1 => TimeSet::Now,
            2 => TimeSet::At(Timestamp::get(r)?),
            v => return Err(DecodeError::BadValue("time kind", v as u64)),
        })
    }
}

/// The changes of a `SetAttr`; `None` fields are left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SetAttr {
    /// New permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with zeros).
    pub size: Option<u64>,
    /// New access time.
    pub atime: TimeSet,
    /// New modification time.
    pub mtime: TimeSet,
}

impl SetAttr {
    pub(crate) fn put(&self, w: &mut Writer) {
        let opt32 = |w: &mut Writer, v: Option<u32>| {
            w.bool(v.is_some());
            w.u32(v.unwrap_or(0));
        };
        opt32(w, self.mode);
        opt32(w, self.uid);
        opt32(w, self.gid);
        w.bool(self.size.is_some());
        w.u64(self.size.unwrap_or(0));
        self.atime.put(w);
        self.mtime.put(w);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<SetAttr, DecodeError> {
        fn opt32(r: &mut Reader<'_>) -> Result<Option<u32>, DecodeError> {
            let some = r.bool()?;
            let v = r.u32()?;
            Ok(some.then_some(v))
        }
        let mode = opt32(r)?;
        let uid = opt32(r)?;
        let gid = opt32(r)?;
        let some = r.bool()?;
        let size = r.u64()?;
        Ok(SetAttr {
            mode,
            uid,
            gid,
            size: some.then_some(size),
            atime: TimeSet::get(r)?,
            mtime: TimeSet::get(r)?,
        })
    }
}

/// The caller of a request that creates something: the new object's owner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Creds {
    /// User id (file system uid of the calling process).
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// The caller's umask, applied to the requested mode.
    pub umask: u32,
}

impl Creds {
    pub(crate) fn put(&self, w: &mut Writer) {
        w.u32(self.uid);
        w.u32(self.gid);
        w.u32(self.umask);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<Creds, DecodeError> {
        Ok(Creds {
            uid: r.u32()?,
            gid: r.u32()?,
            umask: r.u32()?,
        })
    }
}

/// Where a file's pages are registered on the server: what a client needs for one-sided
/// reads and writes of the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// The registration's remote key (`braid::RemoteKey::key`).
    pub key: u64,
    /// Bytes registered, from file offset 0. Offsets at or past the file's size are refused
    /// by the server (an error completion), as are offsets past this length.
    pub len: u64,
    /// Counts the file's registrations on this server; a changed generation means the
    /// client must use the new key.
    pub generation: u64,
    /// True when the registration grants remote writes.
    pub writable: bool,
}

impl RegionInfo {
    pub(crate) fn put(&self, w: &mut Writer) {
        w.u64(self.key);
        w.u64(self.len);
        w.u64(self.generation);
        w.bool(self.writable);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<RegionInfo, DecodeError> {
        Ok(RegionInfo {
            key: r.u64()?,
            len: r.u64()?,
            generation: r.u64()?,
            writable: r.bool()?,
        })
    }

    /// The key as braid's [`braid::RemoteKey`].
    pub fn remote_key(&self) -> braid::RemoteKey {
        braid::RemoteKey {
            key: self.key,
            len: self.len,
        }
    }
}

/// One directory entry of a `ReadDir` reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The server's inode number (`d_ino`).
    pub ino: u64,
    /// The offset to ask for to continue after this entry.
    pub next_offset: u64,
    /// File type bits (`S_IFDIR`, `S_IFREG`, ...), or 0 when unknown.
    pub file_type: u32,
    /// The name (no `/`, no NUL).
    pub name: Vec<u8>,
}

/// File system statistics of the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct StatFs {
    /// Total blocks of `frsize` bytes.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Longest name.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

impl StatFs {
    pub(crate) fn put(&self, w: &mut Writer) {
        for v in [self.blocks, self.bfree, self.bavail, self.files, self.ffree] {
            w.u64(v);
        }
        w.u32(self.bsize);
        w.u32(self.namelen);
        w.u32(self.frsize);
    }
    pub(crate) fn get(r: &mut Reader<'_>) -> Result<StatFs, DecodeError> {
        Ok(StatFs {
            blocks: r.u64()?,
            bfree: r.u64()?,
            bavail: r.u64()?,
            files: r.u64()?,
            ffree: r.u64()?,
            bsize: r.u32()?,
            namelen: r.u32()?,
            frsize: r.u32()?,
        })
    }
}
