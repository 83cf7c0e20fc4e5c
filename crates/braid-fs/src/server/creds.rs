//! Carrying a request out as its caller, as a local file system would for a local process.
//!
//! Each request names its caller (uid, gid, supplementary groups: [`Caller`]). The export's
//! squashing maps it first ([`Squash`], NFS's `root_squash`/`no_root_squash`/`all_squash`),
//! then the worker thread that carries the request out takes that identity for file system
//! access, and takes its own back when the request is done:
//!
//! - `setfsuid`/`setfsgid` and the raw `setgroups` system call. All three change only the
//!   calling thread's credentials in the kernel. glibc's `setgroups()` (like its `setuid()`)
//!   changes *every* thread of the process (POSIX says credentials are per process, so glibc
//!   signals each thread to follow): other workers would run their requests with the wrong
//!   groups. So the raw system call, never the libc wrapper.
//! - The kernel then checks permissions, ownership, sticky and set-group-id directories,
//!   group membership and quotas exactly as for a local process of that user. A root server
//!   keeps its capabilities only for root callers: when the file system uid changes from 0
//!   to another, Linux drops `CAP_CHOWN`, `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`,
//!   `CAP_FOWNER`, `CAP_FSETID`, `CAP_LINUX_IMMUTABLE`, `CAP_MKNOD` and `CAP_MAC_OVERRIDE`
//!   from the thread's effective set, and raises them again when it returns to 0
//!   (`capabilities(7)`, "Effect of user ID changes on capabilities"; the tests check it).
//! - Changing the file system ids makes the process non-dumpable (no core dumps, no
//!   `ptrace` by non-root), as for any set-user-id program.
//!
//! Requests on an open handle (writes, appends, locks, commits, regions, directory reads,
//! releases, forgets) run as the server: the caller's rights were checked when the handle was opened, as a
//! local `write` on an open descriptor is not checked again either.
//!
//! A server that cannot switch (not running as root: no `CAP_SETUID` and `CAP_SETGID`)
//! carries out every request as itself and says so once at start.

use std::cell::Cell;

use rustix::fs::{Mode, OFlags};

use super::filetype::RegularFd;
use super::inode::Inode;
use crate::proto::{Caller, Errno, Request};

/// Which callers the export maps to the anonymous user, as NFS export options do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Squash {
    /// Trust every caller, root included (NFS `no_root_squash`).
    None,
    /// Callers with uid 0 become the anonymous user, and group 0 (as primary or
    /// supplementary group) the anonymous group (NFS `root_squash`, the default).
    #[default]
    Root,
    /// Every caller becomes the anonymous user and group, without supplementary groups
    /// (NFS `all_squash`).
    All,
}

/// The anonymous user and group of NFS (`nobody`, `nogroup`).
pub const ANON_ID: u32 = 65534;

/// How callers are mapped and whether this server can act as them.
#[derive(Debug)]
pub(crate) struct CallerMap {
    squash: Squash,
    anon_uid: u32,
    anon_gid: u32,
    /// The server's own ids and groups, taken back after each request; `None` when it
    /// cannot switch.
    own: Option<Caller>,
}

thread_local! {
    /// The file system uid this thread acts as for a request now, if any.
    static ACTING_UID: Cell<Option<u32>> = const { Cell::new(None) };
}

/// The file system uid this thread carries the current request out as, when it switched.
pub(crate) fn acting_uid() -> Option<u32> {
    ACTING_UID.with(|a| a.get())
}

/// Whether `req` is carried out as its caller (see the module documentation). Attributes,
/// symlink targets and statistics of an object already found need no right (as `fstat`,
/// `readlink` and `fstatfs` on a descriptor), so the most frequent request skips the switch.
fn as_caller(req: &Request) -> bool {
    !matches!(
        req,
        Request::Hello { .. }
            | Request::GetAttr { .. }
            | Request::ReadLink { .. }
            | Request::StatFs
            | Request::Forget { .. }
            | Request::Release { .. }
            | Request::Commit { .. }
            | Request::MapRegion { .. }
            | Request::Landed { .. }
            | Request::Write { .. }
            | Request::ReadDir { .. }
            | Request::ReleaseDir { .. }
            | Request::Append { .. }
            | Request::GetLock(_)
            | Request::SetLock(_)
            | Request::SetLockWait(_)
    )
}

/// Effective capability bits of this thread (`CapEff` of `/proc/thread-self/status`).
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/thread-self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

const CAP_SETGID: u64 = 1 << 6;
const CAP_SETUID: u64 = 1 << 7;

impl CallerMap {
    /// Maps callers with `squash` onto `anon_uid`/`anon_gid`; switches if this process may.
    pub(crate) fn new(squash: Squash, anon_uid: u32, anon_gid: u32) -> CallerMap {
        let caps = effective_caps();
        let own = (caps & CAP_SETUID != 0 && caps & CAP_SETGID != 0).then(|| {
            // All of the server's groups (a caller's are cut to MAX_GROUPS).
            let groups = rustix::process::getgroups()
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default();
            Caller {
                groups,
                ..Caller::of_process()
            }
        });
        CallerMap {
            squash,
            anon_uid,
            anon_gid,
            own,
        }
    }

    /// Whether requests are carried out as their callers.
    pub(crate) fn switches(&self) -> bool {
        self.own.is_some()
    }

    /// `caller` after the export's squashing.
    pub(crate) fn map(&self, caller: &Caller) -> Caller {
        match self.squash {
            Squash::None => caller.clone(),
            Squash::All => Caller::new(self.anon_uid, self.anon_gid, Vec::new()),
            Squash::Root => {
                let gid = |g: u32| if g == 0 { self.anon_gid } else { g };
                Caller::new(
                    if caller.uid == 0 {
                        self.anon_uid
                    } else {
                        caller.uid
                    },
                    gid(caller.gid),
                    caller.groups.iter().map(|g| gid(*g)).collect(),
                )
            }
        }
    }

    /// Takes `caller`'s identity (mapped) on this thread for `req`, until the guard drops.
    /// Does nothing for requests on open handles or when the server cannot switch.
    pub(crate) fn enter(&self, caller: &Caller, req: &Request) -> Result<Acting<'_>, Errno> {
        let Some(own) = self.own.as_ref().filter(|_| as_caller(req)) else {
            return Ok(Acting { map: None });
        };
        let who = self.map(caller);
        if who == *own {
            // The server's own identity (trusted root on the server's host): nothing to do.
            return Ok(Acting { map: None });
        }
        let acting = Acting { map: Some(self) };
        if let Err(e) = switch_to(&who) {
            tracing::error!(
                "cannot act as uid {} gid {}: {e}; request refused",
                who.uid,
                who.gid
            );
            // Dropping `acting` takes back whatever part of the switch took.
            drop(acting);
            return Err(Errno::EACCES);
        }
        ACTING_UID.with(|a| a.set(Some(who.uid)));
        Ok(acting)
    }
}

/// While alive, this thread acts as a caller; dropping it takes the server's identity back.
pub(crate) struct Acting<'a> {
    map: Option<&'a CallerMap>,
}

impl Drop for Acting<'_> {
    fn drop(&mut self) {
        let Some(own) = self.map.and_then(|m| m.own.as_ref()) else {
            return;
        };
        ACTING_UID.with(|a| a.set(None));
        if let Err(e) = switch_to(own) {
            // The next request would run with a stranger's rights: stop instead.
            tracing::error!("cannot take the server's identity back: {e}; aborting");
            std::process::abort();
        }
    }
}

/// Sets this thread's supplementary groups, file system gid and uid, and checks that they
/// took. (`CAP_SETUID`/`CAP_SETGID` are not file system capabilities, so a non-zero file
/// system uid does not take away the right to switch back.)
fn switch_to(who: &Caller) -> Result<(), std::io::Error> {
    // SAFETY: `groups` is a live slice of `gid_t` (u32) of the given length; setgroups only
    // reads it. The raw system call changes only this thread (see the module docs).
    let r = unsafe {
        libc::syscall(
            libc::SYS_setgroups,
            who.groups.len() as libc::size_t,
            who.groups.as_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // setfsgid/setfsuid return the previous id and never fail visibly: ask with an
    // invalid id (-1), which changes nothing and returns the current one.
    // SAFETY: plain system calls on integers.
    let (gid, uid) = unsafe {
        libc::syscall(libc::SYS_setfsgid, who.gid as libc::c_long);
        let gid = libc::syscall(libc::SYS_setfsgid, -1 as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, who.uid as libc::c_long);
        let uid = libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long);
        (gid as u32, uid as u32)
    };
    if gid != who.gid || uid != who.uid {
        return Err(std::io::Error::other(format!(
            "file system ids are {uid}:{gid}, not {}:{}",
            who.uid, who.gid
        )));
    }
    Ok(())
}

/// Whether changing a file's mode from `current` to `new` only clears its set-user-ID or
/// set-group-ID bits: what the kernel asks for (with the writer's credentials) when a
/// process without `CAP_FSETID` writes to or truncates such a file, and what the mount asks
/// for on its direct writes.
pub(crate) fn only_clears_setid(current: u32, new: u32) -> bool {
    let setid = libc::S_ISUID | libc::S_ISGID;
    let (current, new) = (current & 0o7777, new & 0o7777);
    new != current && new & !current == 0 && (current & !new) & !setid == 0
}

/// Opens the regular file `inode` for the data path with access mode `acc`: read-only, or
/// read-write for a writable handle. The data path needs a readable descriptor (the file is
/// mapped), so a write-only open checks the caller's right to write and then opens with the
/// server's rights.
pub(crate) fn open_for_data(inode: &Inode, acc: u32) -> Result<RegularFd, Errno> {
    match acc as i32 {
        libc::O_RDONLY => RegularFd::reopen(&inode.fd, OFlags::RDONLY),
        libc::O_WRONLY => {
            drop(RegularFd::reopen(&inode.fd, OFlags::WRONLY)?);
            with_server_rights(|| RegularFd::reopen(&inode.fd, OFlags::RDWR))
        }
        _ => RegularFd::reopen(&inode.fd, OFlags::RDWR),
    }
}

/// Sets `inode`'s permission bits as the caller, or with the server's rights when the change
/// only clears the set-id bits and the caller may write the file (`writer_handle`: through a
/// writable handle): a write's loss of those bits, allowed to every writer, as locally.
pub(crate) fn chmod(inode: &Inode, mode: u32, writer_handle: bool) -> Result<(), Errno> {
    let path = inode.proc_path()?;
    let chmod = || rustix::fs::chmod(path.as_str(), Mode::from_raw_mode(mode & 0o7777));
    if only_clears_setid(inode.attr()?.mode, mode) && (writer_handle || may_write(inode)) {
        with_server_rights(chmod)?;
    } else {
        chmod()?;
    }
    Ok(())
}

/// Whether this thread's caller may write the file `inode` by its permissions.
pub(crate) fn may_write(inode: &Inode) -> bool {
    // `faccessat2` refuses `AT_EMPTY_PATH` here: through the descriptor's magic link.
    inode.proc_path().is_ok_and(|p| {
        rustix::fs::accessat(
            rustix::fs::CWD,
            p.as_str(),
            rustix::fs::Access::WRITE_OK,
            rustix::fs::AtFlags::EACCESS,
        )
        .is_ok()
    })
}

/// Runs `f` with this thread's file system capabilities back (file system uid 0) when it
/// acts as a non-root caller; for the few changes the kernel allows a caller that it would
/// refuse as a plain request (see [`only_clears_setid`]).
pub(crate) fn with_server_rights<R>(f: impl FnOnce() -> R) -> R {
    let Some(uid) = acting_uid().filter(|u| *u != 0) else {
        return f();
    };
    // SAFETY: plain system calls on integers.
    unsafe { libc::syscall(libc::SYS_setfsuid, 0 as libc::c_long) };
    let r = f();
    // SAFETY: as above.
    let back = unsafe {
        libc::syscall(libc::SYS_setfsuid, uid as libc::c_long);
        libc::syscall(libc::SYS_setfsuid, -1 as libc::c_long) as u32
    };
    if back != uid {
        tracing::error!("cannot act as uid {uid} again; aborting");
        std::process::abort();
    }
    r
}
