//! The FUSE file system: each kernel request becomes an RPC or a one-sided operation. The
//! thread that read the request polls for the reply for a short while
//! (`MountConfig::poll_spin`) and answers the kernel itself when it comes in time; a later
//! reply is answered from the client's completion thread, so the threads that read
//! `/dev/fuse` never wait long on the network (nor, beyond that, for a free buffer).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use fuser::{
    FileHandle, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite, Request as FuseReq, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

#[path = "fs_helpers.rs"]
mod fs_helpers;

use self::fs_helpers::{fill, timeset};
use super::MountConfig;
use super::caller::{act_for, caller_of};
use super::dirview::DirViews;
use super::known::Known;
use super::pool::Pool;
use super::shared::coord::KernelLock;
use super::shared::{DirHandle, Handle, Shared, errno};

use crate::client::{Client, Reconnecting, act_as};
use crate::proto::{COMMIT_DATASYNC, COMMIT_SYNC, Reply, Request, SetAttr};

/// Small writes that grow a file travel inside a request (one round trip, no `MapRegion`).
const INLINE_GROWTH_MAX: usize = 32 * 1024;
/// How long a kernel request may wait for a free buffer.
const BUFFER_WAIT: Duration = Duration::from_secs(30);

/// The FUSE side of a mount.
pub(crate) struct BraidFs {
    pub(crate) shared: Arc<Shared>,
    pub(crate) readahead: u32,
}

impl BraidFs {
    pub(crate) fn new(client: Client, cfg: &MountConfig, pool: Pool) -> BraidFs {
        let generation = client.root().node.generation;
        BraidFs {
            shared: Arc::new(Shared {
                client: Reconnecting::new(client),
                generation,
                attr_ttl: cfg.attr_timeout,
                entry_ttl: cfg.entry_timeout,
                sync_on_close: cfg.sync_on_close,
                direct_writes: cfg.direct_writes,
                pool: Arc::new(pool),
                handles: Mutex::new(HashMap::new()),
                dirs: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
                seen: Mutex::new(HashMap::new()),
                known: Known::new(cfg.attr_timeout, cfg.entry_timeout),
                views: DirViews::new(cfg.negative_timeout),
                locks: Default::default(),
                absent_from_views: AtomicU64::new(0),
                spin: cfg.poll_spin,
                notifier: Mutex::new(None),
            }),
            readahead: cfg.readahead_kib.saturating_mul(1024),
        }
    }

    pub(crate) fn name(name: &OsStr) -> Vec<u8> {
        name.as_bytes().to_vec()
    }
}

impl Filesystem for BraidFs {
    fn init(&mut self, _req: &FuseReq, config: &mut KernelConfig) -> std::io::Result<()> {
        self.configure_kernel(config);
        Ok(())
    }

    fn lookup(&self, req: &FuseReq, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        let name = Self::name(name);
        if s.is_absent(parent.0, &name) {
            return reply.error(fuser::Errno::ENOENT);
        }
        let epoch = s.known.epoch();
        let req = Request::Lookup {
            parent: s.node(parent),
            name,
        };
        self.shared.call(&req, move |r| {
            // A directory in which new names are looked up: worth a view.
            if matches!(&r, Err(e) if e.errno() == crate::proto::Errno::ENOENT) {
                s.refresh_view(parent.0);
            }
            s.reply_entry(reply, epoch, r)
        });
    }

    fn forget(&self, _req: &FuseReq, ino: INodeNo, nlookup: u64) {
        if ino != INodeNo::ROOT {
            self.shared.known.drop_node(ino.0);
            self.shared.views.drop_dir(ino.0);
            self.shared.locks.forget(ino.0);
            let node = self.shared.node(ino);
            self.shared.client.call_async(
                &Request::Forget {
                    items: vec![(node, nlookup)],
                },
                |_| {},
            );
        }
    }

    fn getattr(&self, _req: &FuseReq, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let s = self.shared.clone();
        let node = s.node(ino);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let ask = move || {
            // Known from a recent reply (the kernel dropped its copy after a change this
            // client made and whose reply carried the attributes after it).
            if let Some((a, left)) = s.known.attr(node.id) {
                reply.attr(&left, &s.attr(node.id, &a));
                return d.store(true, Ordering::Release);
            }
            let epoch = s.known.epoch();
            let s2 = s.clone();
            s.send(
                &Request::GetAttr { node },
                move |r| s2.reply_attr(reply, node.id, epoch, r),
                d,
            );
        };
        // Writes this client has acknowledged must show in the size and times.
        match self.shared.client.inner.existing_file_state(node) {
            Some(st) => st.when_idle(Box::new(ask)),
            None => ask(),
        }
        self.shared.help(&done);
    }

    fn setattr(
        &self,
        req: &FuseReq,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // A truncation may wait for writes in flight and go out from another thread.
        let caller = caller_of(req);
        let s = self.shared.clone();
        let node = s.node(ino);
        let srv_fh = fh.and_then(|f| s.handle(f)).map_or(0, |h| h.fh);
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: timeset(atime),
            mtime: timeset(mtime),
        };
        let state = s.client.inner.existing_file_state(node);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let go = {
            let state = state.clone();
            move || {
                let _caller = act_as(caller);
                s.known.forget(&[node.id]);
                let epoch = s.known.epoch();
                let s2 = s.clone();
                s.send(
                    &Request::SetAttr {
                        node,
                        fh: srv_fh,
                        set,
                    },
                    move |r| {
                        if let (Some(st), Ok(Reply::Attr(a)), Some(_)) = (&state, &r, size) {
                            st.set_size(a.size);
                        }
                        if let (Ok(Reply::Attr(a)), Some(_)) = (&r, mode) {
                            s2.note_mode(node.id, a.mode);
                        }
                        s2.reply_attr(reply, node.id, epoch, r)
                    },
                    d,
                );
            }
        };
        // A truncation must not be overtaken by this client's writes still in flight.
        match state {
            Some(st) if size.is_some() => st.when_idle(Box::new(go)),
            _ => go(),
        }
        self.shared.help(&done);
    }

    fn readlink(&self, _req: &FuseReq, ino: INodeNo, reply: ReplyData) {
        let node = self.shared.node(ino);
        self.shared
            .call(&Request::ReadLink { node }, move |r| match r {
                Ok(Reply::Link(t)) => reply.data(&t),
                Ok(_) => reply.error(fuser::Errno::EIO),
                Err(e) => reply.error(errno(&e)),
            });
    }

    fn mknod(
        &self,
        req: &FuseReq,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        let name = Self::name(name);
        s.known.forget(&[parent.0]);
        s.named(parent.0, &name);
        let epoch = s.known.epoch();
        let r = Request::Mknod {
            parent: s.node(parent),
            name,
            mode,
            rdev,
            creds: Shared::creds(req, umask),
        };
        self.shared
            .call(&r, move |r| s.reply_entry(reply, epoch, r));
    }

    fn mkdir(
        &self,
        req: &FuseReq,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        let name = Self::name(name);
        s.known.forget(&[parent.0]);
        s.named(parent.0, &name);
        let epoch = s.known.epoch();
        let r = Request::Mkdir {
            parent: s.node(parent),
            name,
            mode,
            creds: Shared::creds(req, umask),
        };
        self.shared
            .call(&r, move |r| s.reply_entry(reply, epoch, r));
    }

    fn unlink(&self, req: &FuseReq, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = act_for(req);
        self.remove(parent, name, reply, |parent, name| Request::Unlink {
            parent,
            name,
        });
    }

    fn rmdir(&self, req: &FuseReq, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = act_for(req);
        self.remove(parent, name, reply, |parent, name| Request::Rmdir {
            parent,
            name,
        });
    }

    fn symlink(
        &self,
        req: &FuseReq,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        let name = Self::name(link_name);
        s.known.forget(&[parent.0]);
        s.named(parent.0, &name);
        let epoch = s.known.epoch();
        let r = Request::Symlink {
            parent: s.node(parent),
            name,
            target: target.as_os_str().as_bytes().to_vec(),
            creds: Shared::creds(req, 0),
        };
        self.shared
            .call(&r, move |r| s.reply_entry(reply, epoch, r));
    }

    fn rename(
        &self,
        req: &FuseReq,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        s.known.forget_all();
        s.named(newparent.0, newname.as_bytes());
        if flags.contains(RenameFlags::RENAME_EXCHANGE) {
            s.named(parent.0, name.as_bytes());
        }
        let name = Self::name(name);
        let r = Request::Rename {
            parent: s.node(parent),
            name: name.clone(),
            new_parent: s.node(newparent),
            new_name: Self::name(newname),
            flags: flags.bits(),
        };
        self.shared.call(&r, move |r| {
            if r.is_ok() && !flags.contains(RenameFlags::RENAME_EXCHANGE) {
                s.removed(parent.0, &name);
            }
            Shared::reply_empty(reply, r)
        });
    }

    fn link(
        &self,
        req: &FuseReq,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        s.known.forget_all();
        s.named(newparent.0, newname.as_bytes());
        let epoch = s.known.epoch();
        let r = Request::Link {
            node: s.node(ino),
            new_parent: s.node(newparent),
            new_name: Self::name(newname),
        };
        self.shared
            .call(&r, move |r| s.reply_entry(reply, epoch, r));
    }

    fn open(&self, req: &FuseReq, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        let node = s.node(ino);
        let f = flags.0 & (libc::O_ACCMODE | libc::O_TRUNC | libc::O_APPEND);
        let direct = s.direct(f);
        if f & libc::O_TRUNC != 0 {
            s.known.forget(&[node.id]);
        }
        let epoch = s.known.epoch();
        self.shared.call(
            &Request::Open {
                node,
                flags: f as u32,
            },
            move |r| match r {
                // Reached through a name another client has removed since the kernel cached
                // it: ESTALE makes the kernel look the name up again (LOOKUP_REVAL).
                Ok(Reply::Opened(o)) if o.attr.nlink == 0 => {
                    s.client.call_async(&Request::Release { fh: o.fh }, |_| {});
                    reply.error(fuser::Errno::ESTALE)
                }
                Ok(Reply::Opened(o)) => {
                    s.known.learn(epoch, node.id, &o.attr);
                    let state = s.client.inner.file_state(node);
                    state.opened(o.attr.size, o.region);
                    let fopen = s.open_flags(node.id, &o.attr, direct);
                    let fh = s.add_handle(Handle::new(o.fh, node.id, state, direct, o.attr.mode));
                    reply.opened(fh, fopen);
                }
                Ok(_) => reply.error(fuser::Errno::EIO),
                Err(e) => reply.error(errno(&e)),
            },
        );
    }

    fn read(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = &self.shared;
        let Some(h) = s.handle(fh) else {
            return reply.error(fuser::Errno::EBADF);
        };
        let Some(slot) = s.pool.take(BUFFER_WAIT) else {
            return reply.error(fuser::Errno::EAGAIN);
        };
        let pool = s.pool.clone();
        let sge = pool.sge(slot, size as usize);
        h.state.read(
            &s.client.inner,
            h.fh,
            offset,
            sge,
            Box::new(move |r| {
                match r {
                    Ok(n) => pool.with_bytes(slot, n, |b| reply.data(b)),
                    Err(e) => reply.error(errno(&e)),
                }
                pool.give(slot);
            }),
        );
    }

    fn write(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        wf: WriteFlags,
        flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let s = &self.shared;
        let Some(h) = s.handle(fh) else {
            return reply.error(fuser::Errno::EBADF);
        };
        if h.direct
            && wf.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            && let Err(e) = s.kill_privs(&h)
        {
            return reply.error(errno(&e));
        }
        // After a failed write (or with the server gone) later writes fail at once, as a
        // local file system's do after a write-back error, rather than queue up.
        if let Some(e) = h.state.write_error() {
            return reply.error(fuser::Errno::from_i32(e.raw()));
        }
        if !s.client.is_connected() {
            return reply.error(fuser::Errno::ENOTCONN);
        }
        if flags.0 & libc::O_APPEND != 0 {
            return s.append(&h, data, reply);
        }
        let end = offset.saturating_add(data.len() as u64);
        if data.len() <= INLINE_GROWTH_MAX && end > h.state.size() && h.state.begin_request_write()
        {
            s.write_in_background(&h, offset, data);
            return reply.written(data.len() as u32);
        }
        if data.len() <= INLINE_GROWTH_MAX && end > h.state.size() {
            // A small write that grows the file while others are in flight: one request
            // carries it, after this client's earlier writes, so it lands last.
            let (sh, data, state) = (s.clone(), data.to_vec(), h.state.clone());
            let (srv_fh, node) = (h.fh, h.node);
            let done = Arc::new(AtomicBool::new(false));
            let d = done.clone();
            h.state.when_idle(Box::new(move || {
                sh.known.forget(&[node]);
                let epoch = sh.known.epoch();
                let sh2 = sh.clone();
                sh.send(
                    &Request::Write {
                        fh: srv_fh,
                        offset,
                        data,
                    },
                    move |r| match r {
                        Ok(Reply::Written(n, a)) => {
                            sh2.known.learn(epoch, node, &a);
                            state.grown(a.size);
                            reply.written(n);
                        }
                        Ok(_) => reply.error(fuser::Errno::EIO),
                        Err(e) => reply.error(errno(&e)),
                    },
                    d,
                );
            }));
            s.help(&done);
            return;
        }
        let Some(slot) = s.pool.take(BUFFER_WAIT) else {
            return reply.error(fuser::Errno::EAGAIN);
        };
        // Size and times change: known again after the next commit.
        s.known.forget(&[h.node]);
        if s.pool.fill(slot, data).is_err() {
            s.pool.give(slot);
            return reply.error(fuser::Errno::EIO);
        }
        let pool = s.pool.clone();
        let sge = pool.sge(slot, data.len());
        // Acknowledged now; a failure is kept and reported by flush, fsync or close.
        h.state.write(
            &s.client.inner,
            h.fh,
            offset,
            sge,
            Box::new(move |_| pool.give(slot)),
        );
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.shared.handle(fh) else {
            return reply.ok();
        };
        self.shared.close(h, owner.0, reply);
    }

    fn release(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(h) = self.shared.handles.lock().remove(&fh.0) {
            let client = self.shared.client.clone();
            let state = h.state.clone();
            // After the handle's writes are out, so none lands after the close.
            state.when_idle(Box::new(move || {
                client.call_async(&Request::Release { fh: h.fh }, |_| {});
            }));
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.shared.handle(fh) else {
            return reply.error(fuser::Errno::EBADF);
        };
        let flags = if datasync {
            COMMIT_DATASYNC
        } else {
            COMMIT_SYNC
        };
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        self.shared.commit(h, flags, true, move |r| {
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
            d.store(true, Ordering::Release);
        });
        self.shared.help(&done);
    }

    fn opendir(&self, req: &FuseReq, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        self.shared
            .call(&Request::OpenDir { node: s.node(ino) }, move |r| match r {
                Ok(Reply::Handle(dh)) => {
                    let id = s.next.fetch_add(1, Ordering::Relaxed);
                    let d = DirHandle {
                        dh,
                        from: u64::MAX,
                        entries: Vec::new(),
                        eof: false,
                    };
                    s.dirs.lock().insert(id, Arc::new(Mutex::new(d)));
                    reply.opened(FileHandle(id), FopenFlags::empty());
                }
                Ok(_) => reply.error(fuser::Errno::EIO),
                Err(e) => reply.error(errno(&e)),
            });
    }

    fn readdir(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(d) = self.shared.dirs.lock().get(&fh.0).cloned() else {
            return reply.error(fuser::Errno::EBADF);
        };
        let dh = {
            let g = d.lock();
            // Served from the last batch when it reaches `offset`.
            if let Some(start) = g.position(offset)
                && (start < g.entries.len() || g.eof)
            {
                fill(&g.entries[start..], &mut reply);
                return reply.ok();
            }
            g.dh
        };
        let req = Request::ReadDir {
            dh,
            offset,
            max_bytes: 32 * 1024,
        };
        self.shared.call(&req, move |r| match r {
            Ok(Reply::Dir(entries, eof)) => {
                let mut g = d.lock();
                g.from = offset;
                g.entries = entries;
                g.eof = eof;
                fill(&g.entries, &mut reply);
                reply.ok();
            }
            Ok(_) => reply.error(fuser::Errno::EIO),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn releasedir(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        if let Some(d) = self.shared.dirs.lock().remove(&fh.0) {
            let dh = d.lock().dh;
            self.shared
                .client
                .call_async(&Request::ReleaseDir { dh }, |_| {});
        }
        reply.ok();
    }

    fn statfs(&self, _req: &FuseReq, _ino: INodeNo, reply: ReplyStatfs) {
        self.shared.call(&Request::StatFs, move |r| match r {
            Ok(Reply::StatFs(s)) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Ok(_) => reply.error(fuser::Errno::EIO),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn create(
        &self,
        req: &FuseReq,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _caller = act_for(req);
        let s = self.shared.clone();
        let name = Self::name(name);
        s.known.forget(&[parent.0]);
        s.named(parent.0, &name);
        let epoch = s.known.epoch();
        let r = Request::Create {
            parent: s.node(parent),
            name,
            mode,
            flags: (flags & (libc::O_ACCMODE | libc::O_EXCL | libc::O_TRUNC | libc::O_APPEND))
                as u32,
            creds: Shared::creds(req, umask),
        };
        self.shared.call(&r, move |r| match r {
            Ok(Reply::Created(e, o, parent_attr)) => {
                s.known.learn(epoch, e.node.id, &e.attr);
                s.known.learn(epoch, parent.0, &parent_attr);
                let state = s.client.inner.file_state(e.node);
                state.opened(o.attr.size, o.region);
                let fa = s.attr(e.node.id, &e.attr);
                let direct = s.direct(flags);
                let fh = s.add_handle(Handle::new(o.fh, e.node.id, state, direct, e.attr.mode));
                let fopen = if direct {
                    FopenFlags::FOPEN_DIRECT_IO
                } else {
                    FopenFlags::empty()
                };
                reply.created(&s.attr_ttl, &fa, Generation(e.node.generation), fh, fopen);
            }
            Ok(_) => reply.error(fuser::Errno::EIO),
            Err(e) => reply.error(errno(&e)),
        });
    }

    fn getlk(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let Some(h) = self.shared.handle(fh) else {
            return reply.error(fuser::Errno::EBADF);
        };
        let l = KernelLock {
            owner: owner.0,
            start,
            end,
            typ,
            pid,
        };
        self.shared.getlk(&h, l, reply);
    }

    fn setlk(
        &self,
        _req: &FuseReq,
        _ino: INodeNo,
        fh: FileHandle,
        owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.shared.handle(fh) else {
            return reply.error(fuser::Errno::EBADF);
        };
        let l = KernelLock {
            owner: owner.0,
            start,
            end,
            typ,
            pid,
        };
        self.shared.setlk(&h, l, sleep, reply);
    }
}
