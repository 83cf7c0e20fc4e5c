//! What the request handlers and the reply callbacks share: the open handles, what the
//! kernel was told, the attributes known without asking (see [`super::known`]), and the
//! conversion of replies into the kernel's.

#[path = "coord.rs"]
pub(crate) mod coord;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fuser::{
    FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyEmpty,
    ReplyEntry, Request as FuseReq,
};
use parking_lot::Mutex;

use super::dirview::{Answer, DirViews, MAX_NAMES};
use super::known::Known;
use super::pool::Pool;
use crate::client::{Error, FileState, Reconnecting};
use crate::proto::{
    Attr, COMMIT_TOUCH, Creds, DirEntry, Entry, NodeId, Reply, Request, SetAttr, TimeSet, Timestamp,
};

pub(crate) fn errno(e: &Error) -> fuser::Errno {
    fuser::Errno::from_i32(e.errno().raw())
}

pub(crate) fn kind(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        libc::S_IFSOCK => FileType::Socket,
        _ => FileType::RegularFile,
    }
}

/// The kernel's view of an object: `st_ino` is the node id (FUSE uses one number for both).
fn file_attr(node: u64, a: &Attr) -> FileAttr {
    let ctime = a.ctime.to_system_time();
    FileAttr {
        ino: INodeNo(node),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.to_system_time(),
        mtime: a.mtime.to_system_time(),
        ctime,
        crtime: ctime,
        kind: kind(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize.max(4096),
        flags: 0,
    }
}

/// An open file of the kernel's.
pub(crate) struct Handle {
    /// The server's handle.
    pub(crate) fh: u64,
    /// The file's node id.
    pub(crate) node: u64,
    pub(crate) state: Arc<FileState>,
    /// Opened with `FOPEN_DIRECT_IO` (see [`super::MountConfig::direct_writes`]): the
    /// kernel leaves clearing the set-user-ID and set-group-ID bits on a write to us.
    pub(crate) direct: bool,
    /// The file's mode as this client last heard of it (open, its own `chmod`s).
    pub(crate) mode: AtomicU32,
}

impl Handle {
    pub(crate) fn new(fh: u64, node: u64, state: Arc<FileState>, direct: bool, mode: u32) -> Self {
        Handle {
            fh,
            node,
            state,
            direct,
            mode: AtomicU32::new(mode),
        }
    }
}

/// The bits a write by a process without `CAP_FSETID` clears, as the kernel's
/// `file_remove_privs` does: set-user-ID, and set-group-ID if the group may execute.
pub(crate) fn privs_to_kill(mode: u32) -> u32 {
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_IXGRP != 0 {
        kill |= mode & libc::S_ISGID;
    }
    kill
}

/// An open directory: the server's handle and the last batch of entries.
pub(crate) struct DirHandle {
    pub(crate) dh: u64,
    /// The offset the batch was read from, and the batch.
    pub(crate) from: u64,
    pub(crate) entries: Vec<DirEntry>,
    pub(crate) eof: bool,
}

impl DirHandle {
    /// Index in the batch of the first entry after `offset`.
    pub(crate) fn position(&self, offset: u64) -> Option<usize> {
        if offset == self.from {
            return Some(0);
        }
        self.entries
            .iter()
            .position(|e| e.next_offset == offset)
            .map(|i| i + 1)
    }
}

/// State the reply callbacks share with the request handlers.
pub(crate) struct Shared {
    /// Connects again by itself when the connection fails (`client/reconnect.rs`).
    pub(crate) client: Reconnecting,
    pub(crate) generation: u64,
    pub(crate) attr_ttl: Duration,
    pub(crate) entry_ttl: Duration,
    pub(crate) sync_on_close: bool,
    /// Write-only opens bypass the kernel's page cache.
    pub(crate) direct_writes: bool,
    pub(crate) pool: Arc<Pool>,
    pub(crate) handles: Mutex<HashMap<u64, Arc<Handle>>>,
    pub(crate) dirs: Mutex<HashMap<u64, Arc<Mutex<DirHandle>>>>,
    pub(crate) next: AtomicU64,
    /// (size, mtime) the kernel was last told of each node.
    pub(crate) seen: Mutex<HashMap<u64, (u64, Timestamp)>>,
    /// Attributes and absent names known without asking.
    pub(crate) known: Known,
    /// Complete views of small directories (absent names known without asking).
    pub(crate) views: DirViews,
    /// Lookups answered `ENOENT` from a view.
    pub(crate) absent_from_views: AtomicU64,
    /// Locks taken through this mount (`mount/coord.rs`).
    pub(crate) locks: coord::MountLocks,
    /// How long a thread that sent a request polls for its reply (see [`Shared::call`]).
    pub(crate) spin: Duration,
    pub(crate) notifier: Mutex<Option<fuser::Notifier>>,
}

impl Shared {
    pub(crate) fn node(&self, ino: INodeNo) -> NodeId {
        NodeId {
            id: ino.0,
            generation: self.generation,
        }
    }

    /// Whether `name` in `dir` is known not to exist (removed by this client, or missing
    /// from a valid view of the directory); a view answering lookups is relisted in the
    /// background once past half its life.
    pub(crate) fn is_absent(self: &Arc<Self>, dir: u64, name: &[u8]) -> bool {
        // A name too long is the caller's error (ENAMETOOLONG, answered by the request
        // path), not an absent name; and nothing is known once the server is gone.
        if name.len() > crate::proto::MAX_NAME || !self.client.is_connected() {
            return false;
        }
        if self.known.is_absent(dir, name) {
            return true;
        }
        let absent = self.views.lookup(dir, name, Instant::now()) == Answer::Absent;
        if absent {
            self.absent_from_views.fetch_add(1, Ordering::Relaxed);
            self.refresh_view(dir);
        }
        absent
    }

    /// This client is about to ask the server to make `name` in `dir`.
    pub(crate) fn named(&self, dir: u64, name: &[u8]) {
        self.known.named(dir, name);
        self.views.named(dir, name);
    }

    /// The server removed `name` from `dir` at this client's request.
    pub(crate) fn removed(&self, dir: u64, name: &[u8]) {
        self.known.removed(dir, name);
        self.views.removed(dir, name);
    }

    /// Lists `dir` in the background into a view, if it needs one (see
    /// [`DirViews::start_listing`]).
    pub(crate) fn refresh_view(self: &Arc<Self>, dir: u64) {
        let started = Instant::now();
        let Some(id) = self.views.start_listing(dir, started) else {
            return;
        };
        let s = self.clone();
        let node = self.node(INodeNo(dir));
        self.client
            .call_async(&Request::OpenDir { node }, move |r| match r {
                Ok(Reply::Handle(dh)) => s.list_from(dir, id, started, dh, 0, HashSet::new()),
                _ => s.views.listed(dir, id, started, None, Instant::now()),
            });
    }

    /// Reads the listing `id` of `dir` on from `offset` (`names`: what came so far).
    fn list_from(
        self: Arc<Self>,
        dir: u64,
        id: u64,
        started: Instant,
        dh: u64,
        offset: u64,
        mut names: HashSet<Vec<u8>>,
    ) {
        let s = self.clone();
        let req = Request::ReadDir {
            dh,
            offset,
            max_bytes: 32 * 1024,
        };
        self.client.call_async(&req, move |r| {
            let complete = match r {
                Ok(Reply::Dir(entries, eof)) => {
                    let next = entries.last().map(|e| e.next_offset);
                    names.extend(entries.into_iter().map(|e| e.name));
                    match next {
                        _ if names.len() > MAX_NAMES => None,
                        _ if eof => Some(names),
                        Some(next) => return s.list_from(dir, id, started, dh, next, names),
                        None => None, // no progress: give up rather than loop
                    }
                }
                _ => None,
            };
            s.client.call_async(&Request::ReleaseDir { dh }, |_| {});
            s.views.listed(dir, id, started, complete, Instant::now());
        });
    }

    /// Sends a small write that grows a file with nothing else in flight (begun with
    /// `FileState::begin_request_write`) inside one request, to be acknowledged at once (as
    /// one-sided writes are once copied): the next flush, fsync, close, stat or access of
    /// the file waits for it, and a failure is reported by flush, fsync or close.
    pub(crate) fn write_in_background(self: &Arc<Self>, h: &Handle, offset: u64, data: &[u8]) {
        let (s, state, node, len) = (self.clone(), h.state.clone(), h.node, data.len());
        self.known.forget(&[node]);
        let epoch = self.known.epoch();
        let req = Request::Write {
            fh: h.fh,
            offset,
            data: data.to_vec(),
        };
        self.client.call_async(&req, move |r| {
            let r = match r {
                Ok(Reply::Written(n, a)) if n as usize == len => {
                    s.known.learn(epoch, node, &a);
                    Ok(a.size)
                }
                // A short write was acknowledged whole: the close reports it.
                Ok(_) => Err(crate::proto::Errno::EIO),
                Err(e) => Err(e.errno()),
            };
            state.end_request_write(&s.client.inner, r);
        });
    }

    /// Records what the kernel is told; true if it differs from what it was told before.
    pub(crate) fn note(&self, node: u64, a: &Attr) -> bool {
        let now = (a.size, a.mtime);
        self.seen
            .lock()
            .insert(node, now)
            .is_some_and(|before| before != now)
    }

    pub(crate) fn attr(&self, node: u64, a: &Attr) -> FileAttr {
        self.note(node, a);
        file_attr(node, a)
    }

    /// Sends `req`; `cb` gets the reply. The calling thread (one that reads `/dev/fuse`,
    /// holding no lock) then polls for the reply for up to [`Shared::spin`] and runs `cb`
    /// itself when it comes in time: the reply then passes no other thread of this process.
    pub(crate) fn call(
        &self,
        req: &Request,
        cb: impl FnOnce(Result<Reply, Error>) + Send + 'static,
    ) {
        let done = Arc::new(AtomicBool::new(false));
        self.send(req, cb, done.clone());
        self.help(&done);
    }

    /// Sends `req`; `done` is set after `cb` has run.
    pub(crate) fn send(
        &self,
        req: &Request,
        cb: impl FnOnce(Result<Reply, Error>) + Send + 'static,
        done: Arc<AtomicBool>,
    ) {
        self.client.call_async(req, move |r| {
            cb(r);
            done.store(true, Ordering::Release);
        });
    }

    /// Polls for completions on the calling thread until `done` is set, for up to
    /// [`Shared::spin`].
    pub(crate) fn help(&self, done: &AtomicBool) {
        // Yielding between polls: a pure spin kept the server (on a 2-core host, often the
        // same machine) from the CPU and made the loop slower under load (docs/FS-BENCH.md).
        self.client.help_until_with(done, self.spin, true);
    }

    /// Answers the kernel with the entry of a reply to a request sent at `epoch`.
    pub(crate) fn reply_entry(&self, reply: ReplyEntry, epoch: u64, r: Result<Reply, Error>) {
        match r {
            Ok(Reply::Entry(e)) => {
                self.known.learn(epoch, e.node.id, &e.attr);
                self.entry(reply, &e)
            }
            Ok(_) => reply.error(fuser::Errno::EIO),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn entry(&self, reply: ReplyEntry, e: &Entry) {
        let fa = self.attr(e.node.id, &e.attr);
        reply.entry_with_ttls(
            &self.attr_ttl,
            &self.entry_ttl,
            &fa,
            Generation(e.node.generation),
        );
    }

    pub(crate) fn reply_empty(reply: ReplyEmpty, r: Result<Reply, Error>) {
        match r {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// Answers the kernel with the attributes of `node` in a reply to a request sent at
    /// `epoch`.
    pub(crate) fn reply_attr(
        &self,
        reply: ReplyAttr,
        node: u64,
        epoch: u64,
        r: Result<Reply, Error>,
    ) {
        match r {
            Ok(Reply::Attr(a)) => {
                self.known.learn(epoch, node, &a);
                reply.attr(&self.attr_ttl, &self.attr(node, &a))
            }
            Ok(_) => reply.error(fuser::Errno::EIO),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles.lock().get(&fh.0).cloned()
    }

    pub(crate) fn add_handle(&self, h: Handle) -> FileHandle {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(id, Arc::new(h));
        FileHandle(id)
    }

    /// Drops the kernel's cached attributes of `ino` (not its pages).
    pub(crate) fn inval_attr(&self, ino: u64) {
        if let Some(n) = self.notifier.lock().as_ref()
            && let Err(e) = n.inval_inode(INodeNo(ino), -1, 0)
        {
            tracing::debug!("invalidating cached attributes of {ino}: {e}");
        }
    }

    /// Open flags for the kernel: keep its cached pages unless the file changed since it
    /// last heard of it (then also drop its cached attributes: close-to-open); bypass the
    /// page cache for a write-only open when `direct`.
    pub(crate) fn open_flags(&self, ino: u64, a: &Attr, direct: bool) -> FopenFlags {
        let mut f = if self.note(ino, a) {
            self.inval_attr(ino);
            FopenFlags::empty()
        } else {
            FopenFlags::FOPEN_KEEP_CACHE
        };
        if direct {
            f |= FopenFlags::FOPEN_DIRECT_IO;
        }
        f
    }

    /// Whether an open with `flags` bypasses the page cache: write-only ones (a descriptor
    /// that can neither read nor map the file gains nothing from it), if configured, and
    /// appending ones.
    pub(crate) fn direct(&self, flags: i32) -> bool {
        // O_APPEND always: the server places appends, so pages the kernel filled at the
        // offset it computed from its cached size could be wrong.
        self.direct_writes && flags & libc::O_ACCMODE == libc::O_WRONLY
            || flags & libc::O_APPEND != 0
    }

    /// Records a mode this client set on `node`, for its open handles.
    pub(crate) fn note_mode(&self, node: u64, mode: u32) {
        for h in self.handles.lock().values().filter(|h| h.node == node) {
            h.mode.store(mode, Ordering::Relaxed);
        }
    }

    /// A write through a direct handle by a process without `CAP_FSETID`: the kernel
    /// clears the set-user-ID and set-group-ID bits only on its cached path, so the mount
    /// does it here, from the mode it knows (as the kernel does from its cached one), and
    /// before the write is acknowledged. This one waits for the server on the calling
    /// thread: it happens at most once per such bit set, never on a plain file.
    pub(crate) fn kill_privs(&self, h: &Handle) -> Result<(), Error> {
        let mode = h.mode.load(Ordering::Relaxed);
        let kill = privs_to_kill(mode);
        if kill == 0 {
            return Ok(());
        }
        self.known.forget(&[h.node]);
        let set = SetAttr {
            mode: Some(mode & !kill & 0o7777),
            uid: None,
            gid: None,
            size: None,
            atime: TimeSet::Omit,
            mtime: TimeSet::Omit,
        };
        let node = self.node(INodeNo(h.node));
        let r = self.client.call(&Request::SetAttr {
            node,
            fh: h.fh,
            set,
        });
        // The kernel's cached mode has the bits still.
        self.inval_attr(node.id);
        match r? {
            Reply::Attr(a) => {
                self.note_mode(node.id, a.mode);
                Ok(())
            }
            other => Err(Error::Protocol(format!("SetAttr answered {other:?}"))),
        }
    }

    pub(crate) fn creds(req: &FuseReq, umask: u32) -> Creds {
        Creds {
            uid: req.uid(),
            gid: req.gid(),
            umask,
        }
    }

    /// Waits (without blocking) for the file's writes, then commits with `flags` (plus
    /// `COMMIT_TOUCH` when written since the last commit) if `always` or written.
    pub(crate) fn commit(
        self: &Arc<Self>,
        h: Arc<Handle>,
        flags: u32,
        always: bool,
        done: impl FnOnce(Result<(), Error>) + Send + 'static,
    ) {
        let me = self.clone();
        let state = h.state.clone();
        state.when_idle(Box::new(move || {
            let (dirty, err) = h.state.take_flush_state();
            if let Some(e) = err {
                return done(Err(Error::Remote(e)));
            }
            if !(dirty || always) {
                return done(Ok(()));
            }
            let flags = flags | if dirty { COMMIT_TOUCH } else { 0 };
            let epoch = me.known.epoch();
            let me2 = me.clone();
            me.client
                .call_async(&Request::Commit { fh: h.fh, flags }, move |r| {
                    // The attributes after every write of this client's: what a `stat`
                    // after the close shows.
                    if let Ok(Reply::Attr(a)) = &r {
                        me2.known.learn(epoch, h.node, a);
                    }
                    done(r.map(|_| ()))
                });
        }));
    }
}
