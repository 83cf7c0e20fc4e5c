//! The blocking API for applications: names, attributes, directories and open files.

use std::sync::Arc;
use std::sync::mpsc::sync_channel;

use braid::{Access, Region, Sge};
use parking_lot::{Condvar, Mutex};

use super::{Client, Error, FileState, wait};
use crate::proto::{
    Attr, COMMIT_SYNC, COMMIT_TOUCH, Creds, DirEntry, Entry, MAX_INLINE_WRITE, NodeId, Op, Opened,
    Reply, Request, SetAttr, StatFs,
};

pub(super) fn unexpected(op: &str, r: Reply) -> Error {
    Error::Protocol(format!("{op} answered with {r:?}"))
}

fn creds() -> Creds {
    // SAFETY: these calls have no preconditions.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Creds { uid, gid, umask: 0 }
}

impl Client {
    fn entry(&self, req: Request) -> Result<Entry, Error> {
        match self.call(&req)? {
            Reply::Entry(e) => Ok(e),
            r => Err(unexpected("a lookup", r)),
        }
    }

    fn empty(&self, req: Request) -> Result<(), Error> {
        match self.call(&req)? {
            Reply::Empty => Ok(()),
            r => Err(unexpected("a request", r)),
        }
    }

    fn attr(&self, req: Request) -> Result<Attr, Error> {
        match self.call(&req)? {
            Reply::Attr(a) => Ok(a),
            r => Err(unexpected("a request", r)),
        }
    }

    /// Looks `name` up in `parent` (the server counts a reference: [`Client::forget`] it).
    pub fn lookup(&self, parent: NodeId, name: &[u8]) -> Result<Entry, Error> {
        self.entry(Request::Lookup {
            parent,
            name: name.to_vec(),
        })
    }

    /// Resolves a path relative to the export's root (never above it); `follow` follows a
    /// final symlink (inside the export).
    pub fn walk(&self, path: &str, follow: bool) -> Result<Entry, Error> {
        let path = path.trim_start_matches('/');
        if path.is_empty() {
            return Ok(self.root());
        }
        self.entry(Request::Walk {
            parent: self.root().node,
            path: path.as_bytes().to_vec(),
            follow,
        })
    }

    /// Drops `n` references of a handle (sent without waiting).
    pub fn forget(&self, node: NodeId, n: u64) {
        if node != self.root().node && n > 0 {
            self.call_async(
                &Request::Forget {
                    items: vec![(node, n)],
                },
                |_| {},
            );
        }
    }

    /// Attributes of `node`.
    pub fn getattr(&self, node: NodeId) -> Result<Attr, Error> {
        self.attr(Request::GetAttr { node })
    }

    /// Changes attributes of `node`.
    pub fn setattr(&self, node: NodeId, set: &SetAttr) -> Result<Attr, Error> {
        self.attr(Request::SetAttr {
            node,
            fh: 0,
            set: *set,
        })
    }

    /// The target of a symlink.
    pub fn readlink(&self, node: NodeId) -> Result<Vec<u8>, Error> {
        match self.call(&Request::ReadLink { node })? {
            Reply::Link(t) => Ok(t),
            r => Err(unexpected("ReadLink", r)),
        }
    }

    /// Makes a directory owned by this process's user.
    pub fn mkdir(&self, parent: NodeId, name: &[u8], mode: u32) -> Result<Entry, Error> {
        self.entry(Request::Mkdir {
            parent,
            name: name.to_vec(),
            mode,
            creds: creds(),
        })
    }

    /// Makes a symlink.
    pub fn symlink(&self, parent: NodeId, name: &[u8], target: &[u8]) -> Result<Entry, Error> {
        self.entry(Request::Symlink {
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
            creds: creds(),
        })
    }

    /// Makes a hard link to `node`.
    pub fn link(&self, node: NodeId, new_parent: NodeId, new_name: &[u8]) -> Result<Entry, Error> {
        self.entry(Request::Link {
            node,
            new_parent,
            new_name: new_name.to_vec(),
        })
    }

    /// Removes a name.
    pub fn unlink(&self, parent: NodeId, name: &[u8]) -> Result<(), Error> {
        self.attr(Request::Unlink {
            parent,
            name: name.to_vec(),
        })
        .map(|_parent_attr| ())
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: NodeId, name: &[u8]) -> Result<(), Error> {
        self.attr(Request::Rmdir {
            parent,
            name: name.to_vec(),
        })
        .map(|_parent_attr| ())
    }

    /// Renames (`flags`: `renameat2`'s `RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
    pub fn rename(
        &self,
        parent: NodeId,
        name: &[u8],
        new_parent: NodeId,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), Error> {
        self.empty(Request::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
        })
    }

    /// File system statistics.
    pub fn statfs(&self) -> Result<StatFs, Error> {
        match self.call(&Request::StatFs)? {
            Reply::StatFs(s) => Ok(s),
            r => Err(unexpected("StatFs", r)),
        }
    }

    /// Every entry of a directory (`.` and `..` included).
    pub fn readdir(&self, node: NodeId) -> Result<Vec<DirEntry>, Error> {
        DirIter::open(self, node)?.collect()
    }

    fn file(&self, opened: Opened, node: NodeId, flags: i32, forget: u64) -> File {
        let state = self.inner.file_state(node);
        state.opened(opened.attr.size, opened.region);
        File {
            client: self.clone(),
            state,
            fh: opened.fh,
            node,
            writable: flags & libc::O_ACCMODE != libc::O_RDONLY,
            forget,
        }
    }

    /// Opens a regular file (`flags`: `O_RDONLY`, `O_WRONLY` or `O_RDWR`, and `O_TRUNC`).
    pub fn open(&self, node: NodeId, flags: i32) -> Result<File, Error> {
        match self.call(&Request::Open {
            node,
            flags: flags as u32,
        })? {
            Reply::Opened(o) => Ok(self.file(o, node, flags, 0)),
            r => Err(unexpected("Open", r)),
        }
    }

    /// Opens the file at `path` (relative to the export's root; symlinks inside the export
    /// are followed).
    pub fn open_path(&self, path: &str, flags: i32) -> Result<File, Error> {
        let e = self.walk(path, true)?;
        match self.open(e.node, flags) {
            Ok(mut f) => {
                f.forget = 1;
                Ok(f)
            }
            Err(err) => {
                self.forget(e.node, 1);
                Err(err)
            }
        }
    }

    /// Creates and opens a regular file (`O_EXCL` honoured).
    pub fn create(
        &self,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        flags: i32,
    ) -> Result<(Entry, File), Error> {
        match self.call(&Request::Create {
            parent,
            name: name.to_vec(),
            mode,
            flags: flags as u32,
            creds: creds(),
        })? {
            Reply::Created(e, o, _) => Ok((e, self.file(o, e.node, flags, 1))),
            r => Err(unexpected("Create", r)),
        }
    }
}

/// Reads a directory in batches.
pub struct DirIter {
    client: Client,
    dh: u64,
    offset: u64,
    batch: std::vec::IntoIter<DirEntry>,
    eof: bool,
}

impl std::fmt::Debug for DirIter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirIter")
            .field("offset", &self.offset)
            .finish()
    }
}

impl DirIter {
    /// Opens directory `node`.
    pub fn open(client: &Client, node: NodeId) -> Result<DirIter, Error> {
        match client.call(&Request::OpenDir { node })? {
            Reply::Handle(dh) => Ok(DirIter {
                client: client.clone(),
                dh,
                offset: 0,
                batch: Vec::new().into_iter(),
                eof: false,
            }),
            r => Err(unexpected("OpenDir", r)),
        }
    }
}

impl Iterator for DirIter {
    type Item = Result<DirEntry, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(e) = self.batch.next() {
                self.offset = e.next_offset;
                return Some(Ok(e));
            }
            if self.eof {
                return None;
            }
            match self.client.call(&Request::ReadDir {
                dh: self.dh,
                offset: self.offset,
                max_bytes: 32 * 1024,
            }) {
                Ok(Reply::Dir(entries, eof)) => {
                    self.eof = eof || entries.is_empty();
                    self.batch = entries.into_iter();
                }
                Ok(r) => {
                    self.eof = true;
                    return Some(Err(unexpected("ReadDir", r)));
                }
                Err(e) => {
                    self.eof = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Drop for DirIter {
    fn drop(&mut self) {
        self.client
            .call_async(&Request::ReleaseDir { dh: self.dh }, |_| {});
    }
}

/// An open regular file. Dropping it releases the server's handle (without waiting; call
/// [`File::flush`] first to learn of write errors).
pub struct File {
    pub(super) client: Client,
    pub(super) state: Arc<FileState>,
    pub(super) fh: u64,
    node: NodeId,
    pub(super) writable: bool,
    /// Lookup references to drop with the handle.
    forget: u64,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("node", &self.node)
            .field("fh", &self.fh)
            .finish()
    }
}

/// Pieces in flight, (file offset, bytes) of those done, and the first error.
type Pieces = (usize, Vec<(u64, usize)>, Option<Error>);

/// Counts the pieces of one large transfer.
struct Progress {
    state: Mutex<Pieces>,
    cv: Condvar,
}

impl File {
    /// The file's handle.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The file's size as this client knows it.
    pub fn size(&self) -> u64 {
        self.state.size()
    }

    /// Reads `len` bytes at `offset` into `buf[buf_offset..]` with one-sided reads from the
    /// server's page cache (no copy on either host beyond the sockets'), cut into pieces of
    /// `piece_size` with `window` in flight. Returns the bytes read: fewer than `len` only
    /// at the end of the file. `buf` must come from the client's context and allow
    /// `LOCAL_WRITE`.
    pub fn read_at(
        &self,
        offset: u64,
        buf: &Region,
        buf_offset: usize,
        len: usize,
    ) -> Result<usize, Error> {
        if !buf.access().contains(Access::LOCAL_WRITE) {
            return Err(Error::Invalid("the buffer lacks LOCAL_WRITE".into()));
        }
        self.transfer(offset, buf.slice(buf_offset, len)?, false)
    }

    /// Writes `len` bytes of `buf[buf_offset..]` at `offset` with one-sided writes into the
    /// server's page cache, growing the file first if needed. Returns when the bytes are
    /// there (visible to other clients); [`File::sync_all`] makes them durable.
    pub fn write_at(
        &self,
        offset: u64,
        buf: &Region,
        buf_offset: usize,
        len: usize,
    ) -> Result<(), Error> {
        if !self.writable {
            return Err(Error::Remote(crate::proto::Errno::EBADF));
        }
        self.transfer(offset, buf.slice(buf_offset, len)?, true)
            .map(|_| ())
    }

    fn transfer(&self, offset: u64, whole: Sge, write: bool) -> Result<usize, Error> {
        let c = &self.client.inner;
        let piece = c.cfg.piece_size.max(4096);
        let pieces = whole.len.div_ceil(piece);
        let p = Arc::new(Progress {
            state: Mutex::new((0, Vec::with_capacity(pieces), None)),
            cv: Condvar::new(),
        });
        let deadline = std::time::Instant::now() + c.cfg.op_timeout;
        for i in 0..pieces {
            {
                let mut st = p.state.lock();
                while st.0 >= c.cfg.window.max(1) {
                    if p.cv.wait_until(&mut st, deadline).timed_out() {
                        return Err(Error::Timeout(
                            "a transfer's pieces did not complete".into(),
                        ));
                    }
                }
                if let Some(e) = &st.2 {
                    let e = e.clone();
                    drop(st);
                    self.drain(&p, deadline);
                    return Err(e);
                }
                st.0 += 1;
            }
            let at = i * piece;
            let local = Sge {
                region: whole.region.clone(),
                offset: whole.offset + at,
                len: piece.min(whole.len - at),
            };
            let off = offset + at as u64;
            let p2 = p.clone();
            if write {
                self.state.write(
                    c,
                    self.fh,
                    off,
                    local.clone(),
                    Box::new(move |r| {
                        let mut st = p2.state.lock();
                        st.0 -= 1;
                        match r {
                            Ok(()) => st.1.push((off, local.len)),
                            Err(e) => {
                                st.2.get_or_insert(e);
                            }
                        }
                        p2.cv.notify_all();
                    }),
                );
            } else {
                self.state.read(
                    c,
                    self.fh,
                    off,
                    local,
                    Box::new(move |r| {
                        let mut st = p2.state.lock();
                        st.0 -= 1;
                        match r {
                            Ok(n) => st.1.push((off, n)),
                            Err(e) => {
                                st.2.get_or_insert(e);
                            }
                        }
                        p2.cv.notify_all();
                    }),
                );
            }
        }
        self.drain(&p, deadline);
        let mut st = p.state.lock();
        if let Some(e) = st.2.take() {
            return Err(e);
        }
        // The bytes read are the pieces up to the first short one.
        st.1.sort_unstable();
        let mut total = 0usize;
        for (off, n) in &st.1 {
            if *off != offset + total as u64 {
                break;
            }
            total += n;
        }
        Ok(total)
    }

    fn drain(&self, p: &Progress, deadline: std::time::Instant) {
        let mut st = p.state.lock();
        while st.0 > 0 {
            if p.cv.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
    }

    /// Reads up to `len` bytes at `offset` into a new vector (through a bounce region).
    pub fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>, Error> {
        let buf = self
            .client
            .context()
            .alloc_region(len.max(1), Access::LOCAL_WRITE)?;
        let n = self.read_at(offset, &buf, 0, len)?;
        Ok(buf.to_vec(0, n)?)
    }

    /// Writes `data` at `offset`: small writes travel inside a request, larger ones through
    /// a bounce region and one-sided writes.
    pub fn write_all_at(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        if data.len() <= MAX_INLINE_WRITE / 4 {
            self.wait_idle()?;
            return match self.client.call(&Request::Write {
                fh: self.fh,
                offset,
                data: data.to_vec(),
            })? {
                Reply::Written(_, a) => {
                    self.state.set_size(self.state.size().max(a.size));
                    Ok(())
                }
                r => Err(unexpected("Write", r)),
            };
        }
        let buf = self
            .client
            .context()
            .alloc_region(data.len(), Access::LOCAL_WRITE)?;
        buf.write_at(0, data)?;
        self.write_at(offset, &buf, 0, data.len())
    }

    pub(super) fn wait_idle(&self) -> Result<(), Error> {
        let (tx, rx) = sync_channel(1);
        self.state.when_idle(Box::new(move || {
            let _ = tx.send(Ok(()));
        }));
        wait(&rx, self.client.inner.cfg.op_timeout, Op::Commit)
    }

    fn commit(&self, flags: u32) -> Result<Attr, Error> {
        self.wait_idle()?;
        let (_, err) = self.state.take_flush_state();
        let a = match self.client.call(&Request::Commit { fh: self.fh, flags })? {
            Reply::Attr(a) => a,
            r => return Err(unexpected("Commit", r)),
        };
        match err {
            Some(e) => Err(Error::Remote(e)),
            None => Ok(a),
        }
    }

    /// Waits for this client's writes to the file and dates them: afterwards every client
    /// that opens the file sees them (close-to-open consistency). Reports the first write
    /// error since the last flush.
    pub fn flush(&self) -> Result<(), Error> {
        self.commit(if self.writable { COMMIT_TOUCH } else { 0 })
            .map(|_| ())
    }

    /// [`File::flush`], then `fsync` on the server: the data is on its disk.
    pub fn sync_all(&self) -> Result<(), Error> {
        self.commit(COMMIT_SYNC | if self.writable { COMMIT_TOUCH } else { 0 })
            .map(|_| ())
    }

    /// Attributes (after this client's writes are dated).
    pub fn attr(&self) -> Result<Attr, Error> {
        if self.writable && self.state.dirty() {
            return self.commit(COMMIT_TOUCH);
        }
        self.client.getattr(self.node)
    }

    /// Truncates or extends the file.
    pub fn set_len(&self, size: u64) -> Result<Attr, Error> {
        self.wait_idle()?;
        let a = match self.client.call(&Request::SetAttr {
            node: self.node,
            fh: self.fh,
            set: SetAttr {
                size: Some(size),
                ..Default::default()
            },
        })? {
            Reply::Attr(a) => a,
            r => return Err(unexpected("SetAttr", r)),
        };
        self.state.set_size(a.size);
        Ok(a)
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let (client, node, forget, fh) = (self.client.clone(), self.node, self.forget, self.fh);
        // Release after this handle's writes are out, so none lands after the close.
        self.state.when_idle(Box::new(move || {
            client.call_async(&Request::Release { fh }, |_| {});
            client.forget(node, forget);
        }));
    }
}
