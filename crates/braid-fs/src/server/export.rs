//! The exported tree: carries out decoded requests with system calls confined beneath the
//! export's root. No network here: the connection layer hands requests in and replies out,
//! and tests drive this directly.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use braid::Context;
use parking_lot::Mutex;
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags, Timespec, Timestamps};

use super::creds::{self, acting_uid};
use super::filetype::{ExportPolicy, RegularFd};
use super::inode::{
    Inode, InodeTable, dev_from_wire, empty_path, open_beneath, openat2_beneath, os,
};
use super::jobs::JobThread;
use super::limits::{HandleBudget, Limits, MAX_GROWTH, POPULATE_AHEAD, Ticket};
use super::region::FileRegions;
use super::writeback::Writeback;
use crate::proto::{
    COMMIT_DATASYNC, COMMIT_SYNC, COMMIT_TOUCH, Creds, Entry, Errno, Mapped, NodeId, Opened, Reply,
    Request, StatFs,
};
use attr::{gid_of, read_dir, uid_of};

#[path = "append.rs"]
mod append;
mod attr;

/// A regular file opened by a client.
pub(crate) struct OpenFile {
    inode: Arc<Inode>,
    /// `O_RDWR` for writable handles, else `O_RDONLY`.
    fd: RegularFd,
    writable: bool,
    _ticket: Ticket,
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        let mut r = self.inode.regions.lock();
        r.opens = r.opens.saturating_sub(1);
        if r.opens == 0 {
            r.clear();
        }
    }
}

/// A directory opened for reading.
pub(crate) struct OpenDir {
    fd: OwnedFd,
    _ticket: Ticket,
}

/// What the server holds for one client: lookup references and open handles. Dropped (via
/// [`Export::disconnect`]) when the client goes away.
#[derive(Default)]
pub(crate) struct ClientState {
    lookups: HashMap<u64, u64>,
    files: HashMap<u64, Arc<OpenFile>>,
    dirs: HashMap<u64, Arc<Mutex<OpenDir>>>,
    next_handle: u64,
    /// Open files and directories (their tickets of the handle budget).
    held: Arc<std::sync::atomic::AtomicUsize>,
}

impl ClientState {
    fn handle(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }

    /// Open file handles.
    #[cfg(test)]
    pub(crate) fn files_open(&self) -> usize {
        self.files.len()
    }

    fn file(&self, fh: u64) -> Result<Arc<OpenFile>, Errno> {
        self.files.get(&fh).cloned().ok_or(Errno::EBADF)
    }
}

/// One exported directory tree.
pub(crate) struct Export {
    table: InodeTable,
    ctx: Context,
    read_only: bool,
    /// Devices and set-user-id bits.
    policy: ExportPolicy,
    /// Running as root: new objects are given to the calling user.
    as_root: bool,
    /// This process's umask, which the kernel applies on creation.
    process_umask: u32,
    /// Starts the writeback of what clients have written (before their commit).
    writeback: Writeback,
    /// Faults in the pages of grown ranges, after `MapRegion` has been answered.
    populate: JobThread,
    /// Descriptors clients may hold.
    budget: HandleBudget,
}

/// Grows the file open as `fd` to `size` bytes (more than it has) by writing one zero byte
/// at `size - 1`: the same file as `ftruncate(size)` gives (the new range reads as zeros;
/// nobody can have written there, it lay past the end), but `ftruncate` takes the file's
/// page-cache invalidation lock for writing, which waits for every page fault of the file
/// in progress and holds up the ones after it: the faults that populate the previous grown
/// range, and the engine's own while it places the bytes. Growing a file being written at
/// the line rate happens every few MiB, so that lock stalled the transfer each time.
fn grow(fd: impl AsFd, size: u64) -> Result<(), Errno> {
    match rustix::io::pwrite(fd, &[0u8], size - 1)? {
        1 => Ok(()),
        _ => Err(Errno::EIO),
    }
}

/// Longest a growth waits for the ranges grown before it to be faulted in.
const POPULATE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_err() {
        // A clock-derived value still tells one server run from the next.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        return t.as_nanos() as u64 ^ std::process::id() as u64;
    }
    u64::from_le_bytes(b) | 1
}

impl Export {
    /// Opens `root` for export.
    pub(crate) fn new(ctx: Context, root: &Path, read_only: bool) -> Result<Export, String> {
        let fd = rustix::fs::open(
            root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| format!("cannot open export {}: {e}", root.display()))?;
        let table = InodeTable::new(fd, random_u64())
            .map_err(|e| format!("export {}: {e}", root.display()))?;
        let root_inode = table
            .get(NodeId {
                id: super::inode::ROOT_ID,
                generation: table.generation(),
            })
            .map_err(|e| e.to_string())?;
        root_inode
            .reopen(OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| {
                format!("the server reopens objects through /proc/self/fd, which failed: {e}")
            })?;
        let old = rustix::process::umask(Mode::from_raw_mode(0o022));
        rustix::process::umask(old);
        Ok(Export {
            table,
            ctx,
            read_only,
            policy: ExportPolicy::default(),
            as_root: rustix::process::geteuid().is_root(),
            process_umask: old.as_raw_mode(),
            writeback: Writeback::start(),
            populate: JobThread::start(
                "fs-populate",
                "grown ranges are faulted in before MapRegion is answered",
            ),
            budget: HandleBudget::new(Limits::derive(
                rustix::process::getrlimit(rustix::process::Resource::Nofile).current,
                1,
                64,
            )),
        })
    }

    /// The export with `policy` instead of the default (`nodev,nosuid`).
    pub(crate) fn with_policy(mut self, policy: ExportPolicy) -> Export {
        self.policy = policy;
        self
    }

    /// The export with the descriptor limits `limits` instead of those of the process's
    /// limit now.
    pub(crate) fn with_limits(mut self, limits: Limits) -> Export {
        self.budget = HandleBudget::new(limits);
        self
    }

    /// A ticket for one more open handle of client `cs` (before its descriptor is opened).
    fn ticket(&self, cs: &Mutex<ClientState>) -> Result<Ticket, Errno> {
        let held = cs.lock().held.clone();
        self.budget.take(&held, self.table.len())
    }

    /// The root's entry (sent in the hello reply).
    pub(crate) fn root(&self) -> Result<Entry, Errno> {
        let node = NodeId {
            id: super::inode::ROOT_ID,
            generation: self.table.generation(),
        };
        let inode = self.table.get(node)?;
        Ok(Entry {
            node,
            attr: inode.attr()?,
        })
    }

    /// Whether changes are refused.
    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    /// Objects in the inode table (for tests and logs).
    pub(crate) fn inode_count(&self) -> usize {
        self.table.len()
    }

    /// The object open as `fh` (the lock table's key for it).
    pub(crate) fn open_file_id(&self, cs: &Mutex<ClientState>, fh: u64) -> Result<u64, Errno> {
        Ok(cs.lock().file(fh)?.inode.id)
    }

    /// Releases everything a client held.
    pub(crate) fn disconnect(&self, cs: &Mutex<ClientState>) {
        let cs = std::mem::take(&mut *cs.lock());
        for (id, n) in cs.lookups {
            self.table.forget(id, n);
        }
    }

    fn install(&self, cs: &Mutex<ClientState>, fd: OwnedFd) -> Result<Entry, Errno> {
        let held = cs.lock().lookups.len();
        self.budget.may_look_up(held, self.table.len())?;
        let (inode, attr) = self.table.install(fd)?;
        *cs.lock().lookups.entry(inode.id).or_default() += 1;
        Ok(Entry {
            node: self.table.node_id(&inode),
            attr,
        })
    }

    fn entry_of(
        &self,
        cs: &Mutex<ClientState>,
        dir: &OwnedFd,
        name: &[u8],
    ) -> Result<Entry, Errno> {
        self.install(cs, open_beneath(dir, name, false)?)
    }

    /// Gives a new object to the caller and sets its exact mode. A thread acting as the
    /// caller (`creds`) created it with the caller's ids already; only a root server that
    /// does not switch gives it away here.
    fn own(
        &self,
        fd: impl AsFd,
        creds: &Creds,
        mode: u32,
        chmod_path: Option<&str>,
    ) -> Result<(), Errno> {
        if self.as_root && acting_uid().is_none() && (creds.uid != 0 || creds.gid != 0) {
            let st = rustix::fs::fstat(&fd)?;
            // A set-group-id directory already gave the object its group.
            let gid = if st.st_gid != 0 { st.st_gid } else { creds.gid };
            rustix::fs::chownat(
                &fd,
                "",
                Some(uid_of(creds.uid)?),
                Some(gid_of(gid)?),
                empty_path(),
            )?;
        }
        if mode & self.process_umask != 0
            && let Some(p) = chmod_path
        {
            rustix::fs::chmod(p, Mode::from_raw_mode(mode))?;
        }
        Ok(())
    }

    /// Carries out one request for the client `cs`.
    pub(crate) fn handle(&self, cs: &Mutex<ClientState>, req: Request) -> Result<Reply, Errno> {
        if self.read_only && req.modifies() {
            return Err(Errno::EROFS);
        }
        // Checked before anything is created: an object is never left with the wrong owner.
        if let Request::Mknod { creds, .. }
        | Request::Mkdir { creds, .. }
        | Request::Symlink { creds, .. }
        | Request::Create { creds, .. } = &req
        {
            uid_of(creds.uid)?;
            gid_of(creds.gid)?;
        }
        match req {
            Request::Hello { .. } => Err(Errno::EPROTO),
            Request::Lookup { parent, name } => {
                let p = self.table.get(parent)?;
                Ok(Reply::Entry(self.entry_of(cs, p.dir()?, &name)?))
            }
            Request::Walk {
                parent,
                path,
                follow,
            } => {
                let p = self.table.get(parent)?;
                let fd = open_beneath(p.dir()?, &path, follow)?;
                Ok(Reply::Entry(self.install(cs, fd)?))
            }
            Request::Forget { items } => {
                let mut c = cs.lock();
                for (node, n) in items {
                    if node.generation != self.table.generation() {
                        continue;
                    }
                    let held = c.lookups.get(&node.id).copied().unwrap_or(0);
                    let drop_n = n.min(held);
                    if drop_n == held {
                        c.lookups.remove(&node.id);
                    } else if let Some(h) = c.lookups.get_mut(&node.id) {
                        *h -= drop_n;
                    }
                    self.table.forget(node.id, drop_n);
                }
                Ok(Reply::Empty)
            }
            Request::GetAttr { node } => Ok(Reply::Attr(self.table.get(node)?.attr()?)),
            Request::SetAttr { node, fh, set } => {
                let inode = self.table.get(node)?;
                let file = if fh != 0 {
                    Some(cs.lock().file(fh)?)
                } else {
                    None
                };
                self.setattr(&inode, file.as_deref(), &set).map(Reply::Attr)
            }
            Request::ReadLink { node } => {
                let inode = self.table.get(node)?;
                if !inode.is_symlink() {
                    return Err(Errno::EINVAL);
                }
                let t = rustix::fs::readlinkat(&inode.fd, "", Vec::new())?;
                Ok(Reply::Link(t.into_bytes()))
            }
            Request::Mknod {
                parent,
                name,
                mode,
                rdev,
                creds,
            } => {
                let p = self.table.get(parent)?;
                let dir = p.dir()?;
                let perm = self.policy.squash(mode & !creds.umask, false);
                // No type bits: a regular file, as mknod(2) makes.
                let kind = match mode & libc::S_IFMT {
                    0 => rustix::fs::FileType::RegularFile,
                    t => rustix::fs::FileType::from_raw_mode(t),
                };
                self.policy.check_mknod(kind)?;
                rustix::fs::mknodat(
                    dir,
                    os(&name)?,
                    kind,
                    Mode::from_raw_mode(perm),
                    dev_from_wire(rdev),
                )?;
                let e = self.entry_of(cs, dir, &name)?;
                let inode = self.table.get(e.node)?;
                let path = if inode.is_file() || inode.is_dir() {
                    Some(inode.proc_path()?)
                } else {
                    None
                };
                self.own(&inode.fd, &creds, perm, path.as_deref())?;
                Ok(Reply::Entry(Entry {
                    node: e.node,
                    attr: inode.attr()?,
                }))
            }
            Request::Mkdir {
                parent,
                name,
                mode,
                creds,
            } => {
                let p = self.table.get(parent)?;
                let dir = p.dir()?;
                let perm = self.policy.squash(mode & !creds.umask, true);
                rustix::fs::mkdirat(dir, os(&name)?, Mode::from_raw_mode(perm))?;
                let e = self.entry_of(cs, dir, &name)?;
                let inode = self.table.get(e.node)?;
                if inode.is_dir() {
                    self.own(&inode.fd, &creds, perm, Some(&inode.proc_path()?))?;
                }
                Ok(Reply::Entry(Entry {
                    node: e.node,
                    attr: inode.attr()?,
                }))
            }
            Request::Unlink { parent, name } => {
                let p = self.table.get(parent)?;
                rustix::fs::unlinkat(p.dir()?, os(&name)?, AtFlags::empty())?;
                Ok(Reply::Attr(p.attr()?))
            }
            Request::Rmdir { parent, name } => {
                let p = self.table.get(parent)?;
                rustix::fs::unlinkat(p.dir()?, os(&name)?, AtFlags::REMOVEDIR)?;
                Ok(Reply::Attr(p.attr()?))
            }
            Request::Symlink {
                parent,
                name,
                target,
                creds,
            } => {
                let p = self.table.get(parent)?;
                let dir = p.dir()?;
                rustix::fs::symlinkat(os(&target)?, dir, os(&name)?)?;
                let e = self.entry_of(cs, dir, &name)?;
                let inode = self.table.get(e.node)?;
                self.own(&inode.fd, &creds, 0, None)?;
                Ok(Reply::Entry(Entry {
                    node: e.node,
                    attr: inode.attr()?,
                }))
            }
            Request::Rename {
                parent,
                name,
                new_parent,
                new_name,
                flags,
            } => {
                let flags = RenameFlags::from_bits(flags)
                    .filter(|f| !f.contains(RenameFlags::WHITEOUT))
                    .ok_or(Errno::EINVAL)?;
                let p = self.table.get(parent)?;
                let np = self.table.get(new_parent)?;
                rustix::fs::renameat_with(p.dir()?, os(&name)?, np.dir()?, os(&new_name)?, flags)?;
                Ok(Reply::Empty)
            }
            Request::Link {
                node,
                new_parent,
                new_name,
            } => {
                let inode = self.table.get(node)?;
                let np = self.table.get(new_parent)?;
                let dir = np.dir()?;
                if inode.is_dir() {
                    return Err(Errno::EPERM);
                }
                // A link by descriptor needs CAP_DAC_READ_SEARCH, which a thread acting as
                // a non-root caller has not (nor a symlink's magic link: not done for them).
                let privileged = self.as_root && acting_uid().is_none_or(|u| u == 0);
                if privileged || inode.is_symlink() {
                    rustix::fs::linkat(&inode.fd, "", dir, os(&new_name)?, AtFlags::EMPTY_PATH)?;
                } else {
                    let p = inode.proc_path()?;
                    rustix::fs::linkat(
                        rustix::fs::CWD,
                        p.as_str(),
                        dir,
                        os(&new_name)?,
                        AtFlags::SYMLINK_FOLLOW,
                    )?;
                }
                Ok(Reply::Entry(self.entry_of(cs, dir, &new_name)?))
            }
            Request::Open { node, flags } => {
                let inode = self.table.get(node)?;
                self.open(cs, inode, flags).map(Reply::Opened)
            }
            Request::Create {
                parent,
                name,
                mode,
                flags,
                creds,
            } => self.create(cs, parent, &name, mode, flags, &creds),
            Request::Release { fh } => {
                cs.lock().files.remove(&fh).ok_or(Errno::EBADF)?;
                Ok(Reply::Empty)
            }
            Request::Commit { fh, flags } => {
                let f = cs.lock().file(fh)?;
                if flags & COMMIT_TOUCH != 0 && f.writable && !self.read_only {
                    let now = Timespec {
                        tv_sec: 0,
                        tv_nsec: rustix::fs::UTIME_NOW,
                    };
                    let omit = Timespec {
                        tv_sec: 0,
                        tv_nsec: rustix::fs::UTIME_OMIT,
                    };
                    rustix::fs::futimens(
                        &f.fd,
                        &Timestamps {
                            last_access: omit,
                            last_modification: now,
                        },
                    )?;
                }
                if flags & COMMIT_SYNC != 0 {
                    rustix::fs::fsync(&f.fd)?;
                } else if flags & COMMIT_DATASYNC != 0 {
                    rustix::fs::fdatasync(&f.fd)?;
                }
                Ok(Reply::Attr(f.inode.attr()?))
            }
            Request::MapRegion { fh, min_size } => {
                let f = cs.lock().file(fh)?;
                self.map_region(&f, min_size).map(Reply::Mapped)
            }
            Request::Landed { fh, upto } => {
                let f = cs.lock().file(fh)?;
                if f.writable && !self.read_only {
                    let size = f.inode.attr()?.size;
                    let mut r = f.inode.regions.lock();
                    let range = r.writeback_upto(size, upto);
                    self.start_writeback(&f, &r, range);
                }
                Ok(Reply::Empty)
            }
            Request::Write { fh, offset, data } => {
                let f = cs.lock().file(fh)?;
                if !f.writable {
                    return Err(Errno::EBADF);
                }
                // Serialised with `MapRegion`'s growth of the file, which decides from the
                // size it reads whether (and where) to write its byte.
                let _growth = f.inode.regions.lock();
                let mut done = 0;
                while done < data.len() {
                    let n = rustix::io::pwrite(&f.fd, &data[done..], offset + done as u64)?;
                    if n == 0 {
                        return Err(Errno::EIO);
                    }
                    done += n;
                }
                Ok(Reply::Written(done as u32, f.inode.attr()?))
            }
            Request::OpenDir { node } => {
                let inode = self.table.get(node)?;
                inode.dir()?;
                let ticket = self.ticket(cs)?;
                // Through the magic link: read permission, not search, as a local opendir.
                let fd = inode.reopen(OFlags::RDONLY | OFlags::DIRECTORY)?;
                let mut c = cs.lock();
                let dh = c.handle();
                let d = OpenDir {
                    fd,
                    _ticket: ticket,
                };
                c.dirs.insert(dh, Arc::new(Mutex::new(d)));
                Ok(Reply::Handle(dh))
            }
            Request::ReadDir {
                dh,
                offset,
                max_bytes,
            } => {
                let d = cs.lock().dirs.get(&dh).cloned().ok_or(Errno::EBADF)?;
                let d = d.lock();
                read_dir(&d.fd, offset, max_bytes)
            }
            Request::ReleaseDir { dh } => {
                cs.lock().dirs.remove(&dh).ok_or(Errno::EBADF)?;
                Ok(Reply::Empty)
            }
            Request::Append { fh, data, reserve } => self.append(cs, fh, &data, reserve),
            // Answered by the server's lock table (`server/lockserv.rs`).
            Request::GetLock(_) | Request::SetLock(_) | Request::SetLockWait(_) => {
                Err(Errno::EPROTO)
            }
            Request::StatFs => {
                let root = self.table.get(self.root()?.node)?;
                let s = rustix::fs::fstatvfs(&root.fd)?;
                Ok(Reply::StatFs(StatFs {
                    blocks: s.f_blocks,
                    bfree: s.f_bfree,
                    bavail: s.f_bavail,
                    files: s.f_files,
                    ffree: s.f_ffree,
                    bsize: s.f_bsize as u32,
                    namelen: s.f_namemax as u32,
                    frsize: s.f_frsize as u32,
                }))
            }
        }
    }

    fn open(
        &self,
        cs: &Mutex<ClientState>,
        inode: Arc<Inode>,
        flags: u32,
    ) -> Result<Opened, Errno> {
        if !inode.is_file() {
            return Err(super::filetype::refusal(inode.kind));
        }
        let acc = flags & libc::O_ACCMODE as u32;
        let writable = acc != libc::O_RDONLY as u32;
        let trunc = flags & libc::O_TRUNC as u32 != 0;
        if self.read_only && (writable || trunc) {
            return Err(Errno::EROFS);
        }
        let ticket = self.ticket(cs)?;
        let fd = creds::open_for_data(&inode, acc)?;
        let file = OpenFile {
            inode: inode.clone(),
            fd,
            writable,
            _ticket: ticket,
        };
        inode.regions.lock().opens += 1;
        if trunc && writable {
            rustix::fs::ftruncate(&file.fd, 0)?;
        }
        self.finish_open(cs, file)
    }

    fn finish_open(&self, cs: &Mutex<ClientState>, file: OpenFile) -> Result<Opened, Errno> {
        let (attr, region) = {
            let mut r = file.inode.regions.lock();
            let attr = file.inode.attr()?;
            let region = r.ensure(
                &self.ctx,
                &file.fd,
                attr.size,
                file.writable && !self.read_only,
            )?;
            (attr, region)
        };
        let mut c = cs.lock();
        let fh = c.handle();
        c.files.insert(fh, Arc::new(file));
        Ok(Opened { fh, attr, region })
    }

    fn create(
        &self,
        cs: &Mutex<ClientState>,
        parent: NodeId,
        name: &[u8],
        mode: u32,
        flags: u32,
        creds: &Creds,
    ) -> Result<Reply, Errno> {
        let p = self.table.get(parent)?;
        let dir = p.dir()?;
        let perm = self.policy.squash(mode & !creds.umask, false);
        let ticket = self.ticket(cs)?;
        let (fd, opath) = self.create_or_open(dir, name, perm, flags, creds)?;
        if flags & libc::O_TRUNC as u32 != 0 {
            rustix::fs::ftruncate(&fd, 0)?;
        }
        let entry = self.install(cs, opath)?;
        let inode = self.table.get(entry.node)?;
        let writable = flags & libc::O_ACCMODE as u32 != libc::O_RDONLY as u32;
        inode.regions.lock().opens += 1;
        let opened = self.finish_open(
            cs,
            OpenFile {
                inode,
                fd,
                writable,
                _ticket: ticket,
            },
        )?;
        Ok(Reply::Created(
            Entry {
                node: entry.node,
                attr: opened.attr,
            },
            opened,
            p.attr()?,
        ))
    }

    /// Creates `name` in `dir` as a new regular file (given to the caller), or without
    /// `O_EXCL` opens the regular file of that name: an object of another kind is never
    /// opened (see [`super::filetype`]). Returns the read-write descriptor and an `O_PATH`
    /// one of the same file.
    fn create_or_open(
        &self,
        dir: &OwnedFd,
        name: &[u8],
        perm: u32,
        flags: u32,
        creds: &Creds,
    ) -> Result<(RegularFd, OwnedFd), Errno> {
        let excl = flags & libc::O_EXCL as u32 != 0;
        // The name may come and go between the two attempts (another client): a few tries.
        let mut tries = 0;
        loop {
            tries += 1;
            let created = openat2_beneath(
                dir,
                os(name)?,
                OFlags::CREATE | OFlags::EXCL | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(perm),
            );
            match created {
                Ok(fd) => {
                    let path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
                    let fd = RegularFd::check(fd)?;
                    self.own(&fd, creds, perm, Some(&path))?;
                    let opath = rustix::fs::open(
                        path.as_str(),
                        OFlags::PATH | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?;
                    return Ok((fd, opath));
                }
                Err(rustix::io::Errno::EXIST) if !excl => {}
                Err(e) => return Err(e.into()),
            }
            match open_beneath(dir, name, false) {
                Ok(opath) => return Ok((RegularFd::reopen(&opath, OFlags::RDWR)?, opath)),
                Err(Errno::ENOENT) if tries < 3 => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn map_region(&self, f: &OpenFile, min_size: u64) -> Result<Mapped, Errno> {
        // Back-pressure: a growth (not a refresh) is answered once the ranges grown before
        // it are faulted in. The populate thread normally runs well ahead of the wire, so
        // this costs nothing; when the kernel throttles it (dirty pages beyond its limits,
        // a disk slower than the rails) the clients' writes wait here, instead of the
        // engine faulting pages in itself and being throttled in its socket reads, which
        // stopped the rails' acknowledgements long enough for the peer to give rails up
        // (a 5 GiB write; docs/FS-BENCH.md).
        if min_size > f.inode.attr()?.size && !self.populate.wait_idle(POPULATE_WAIT) {
            tracing::debug!("populating grown ranges takes over {POPULATE_WAIT:?}");
        }
        let mut r = f.inode.regions.lock();
        let mut attr = f.inode.attr()?;
        if min_size > attr.size {
            if !f.writable || self.read_only {
                return Err(if self.read_only {
                    Errno::EROFS
                } else {
                    Errno::EBADF
                });
            }
            // A request costs its client a few bytes; what it makes the server allocate is
            // bounded: the size by MAX_GROWTH per request (the client asks again for more),
            // and pages faulted in ahead of the client's data by POPULATE_AHEAD.
            grow(&f.fd, min_size.min(attr.size.saturating_add(MAX_GROWTH)))?;
            let old = attr.size;
            attr = f.inode.attr()?;
            let region = r.ensure(&self.ctx, &f.fd, attr.size, true)?;
            // The client grows a file just before writing the new range: its pages are
            // faulted in on a thread of their own while the reply travels and the first
            // bytes arrive (page by page faster than the wire fills them), not before the
            // reply: the client's writes queue behind the growth, and a synchronous
            // populate of each batch (1 ms per MiB here) left the rails idle meanwhile.
            let from = old.max(attr.size.saturating_sub(POPULATE_AHEAD));
            if let Some(job) = r.populate_job(from, attr.size)
                && let Err(job) = self.populate.submit(job)
            {
                job();
            }
            // ... and has had time to fill what lies well before the old end.
            let range = r.writeback_range(old);
            self.start_writeback(f, &r, range);
            return Ok(Mapped { attr, region });
        }
        let region = r.ensure(&self.ctx, &f.fd, attr.size, f.writable && !self.read_only)?;
        Ok(Mapped { attr, region })
    }

    /// Waits until the pages of grown ranges have been faulted in (tests).
    #[cfg(test)]
    pub(crate) fn settle(&self) {
        assert!(self.populate.wait_idle(std::time::Duration::from_secs(60)));
    }

    /// Hands `range` of the file (if any) to the writeback thread.
    fn start_writeback(&self, f: &OpenFile, r: &FileRegions, range: Option<(u64, u64)>) {
        if let Some((from, to)) = range {
            // Unmapped from the server first: see FileRegion::unmap_pages.
            let maps = r.writable_mappings();
            let unmap = move || maps.iter().for_each(|m| m.unmap_pages(from, to));
            self.writeback.request(&f.fd, Box::new(unmap), from, to);
        }
    }
}
