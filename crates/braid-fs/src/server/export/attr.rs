//! Attribute changes and directory listings of the export (split from `export.rs`).

use std::os::fd::OwnedFd;

use rustix::fs::{OFlags, SeekFrom, Timespec, Timestamps};

use super::{Export, OpenFile};
use crate::proto::{Attr, DirEntry, Errno, MAX_MSG, Reply, SetAttr, TimeSet};
use crate::server::creds;
use crate::server::filetype::RegularFd;
use crate::server::inode::{Inode, empty_path};

impl Export {
    pub(super) fn setattr(
        &self,
        inode: &Inode,
        file: Option<&OpenFile>,
        set: &SetAttr,
    ) -> Result<Attr, Errno> {
        if let Some(size) = set.size {
            if inode.is_dir() {
                return Err(Errno::EISDIR);
            }
            if !inode.is_file() {
                return Err(Errno::EINVAL);
            }
            let reopened;
            let fd = match file.filter(|f| f.writable) {
                Some(f) => &f.fd,
                None => {
                    reopened = RegularFd::reopen(&inode.fd, OFlags::WRONLY)?;
                    &reopened
                }
            };
            let _regions = inode.regions.lock();
            rustix::fs::ftruncate(fd, size)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            rustix::fs::chownat(
                &inode.fd,
                "",
                set.uid.map(uid_of).transpose()?,
                set.gid.map(gid_of).transpose()?,
                empty_path(),
            )?;
        }
        if let Some(mode) = set.mode {
            if inode.is_symlink() {
                return Err(Errno::EOPNOTSUPP);
            }
            let mode = self.policy.squash(mode, inode.is_dir());
            creds::chmod(inode, mode, file.is_some_and(|f| f.writable))?;
        }
        if set.atime != TimeSet::Omit || set.mtime != TimeSet::Omit {
            let spec = |t: TimeSet| match t {
                TimeSet::Omit => Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_OMIT,
                },
                TimeSet::Now => Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_NOW,
                },
                TimeSet::At(t) => Timespec {
                    tv_sec: t.secs,
                    tv_nsec: t.nanos as _,
                },
            };
            let times = Timestamps {
                last_access: spec(set.atime),
                last_modification: spec(set.mtime),
            };
            rustix::fs::utimensat(&inode.fd, "", &times, empty_path())?;
        }
        inode.attr()
    }
}

/// A user id from a client; `EINVAL` for -1, which `chown` would take as "leave it".
pub(super) fn uid_of(raw: u32) -> Result<rustix::fs::Uid, Errno> {
    if raw == u32::MAX {
        return Err(Errno::EINVAL);
    }
    Ok(rustix::fs::Uid::from_raw(raw))
}

/// A group id from a client; `EINVAL` for -1.
pub(super) fn gid_of(raw: u32) -> Result<rustix::fs::Gid, Errno> {
    if raw == u32::MAX {
        return Err(Errno::EINVAL);
    }
    Ok(rustix::fs::Gid::from_raw(raw))
}

/// Reads entries of the directory open as `fd`, starting at the cookie `offset`.
pub(super) fn read_dir(fd: &OwnedFd, offset: u64, max_bytes: u32) -> Result<Reply, Errno> {
    rustix::fs::seek(fd, SeekFrom::Start(offset))?;
    // Keep the reply inside one message: each entry costs 24 bytes plus its name.
    let budget = (max_bytes as usize).clamp(4096, MAX_MSG - 512);
    let mut buf = Vec::<u8>::with_capacity(32 * 1024);
    let mut it = rustix::fs::RawDir::new(fd, buf.spare_capacity_mut());
    let mut out = Vec::new();
    let mut used = 0;
    let mut eof = true;
    while let Some(e) = it.next() {
        let e = e?;
        let name = e.file_name().to_bytes();
        let cost = 24 + name.len();
        if used + cost > budget {
            eof = false;
            break;
        }
        used += cost;
        out.push(DirEntry {
            ino: e.ino(),
            next_offset: e.next_entry_cookie(),
            file_type: e.file_type().as_raw_mode(),
            name: name.to_vec(),
        });
    }
    Ok(Reply::Dir(out, eof))
}
