//! What kinds of objects the server opens for data, creates, and which mode bits it keeps.
//!
//! The server runs with privileges its clients lack (usually root), so a device node in the
//! export (created by a client, or locally) must never be opened for data: a client's
//! `Write` would land in the device (the server's own disk). Every descriptor the server
//! reads or writes file data through is a [`RegularFd`], which can only be made from a
//! descriptor whose `fstat` says "regular file". Objects of other kinds are refused with
//! the errno a local open would give on an NFS-style `nodev` export:
//!
//! | kind | errno |
//! |---|---|
//! | directory | `EISDIR` |
//! | symbolic link | `ELOOP` (as `O_NOFOLLOW`) |
//! | block or character device | `EACCES` (as on a `nodev` mount) |
//! | FIFO, socket | `ENXIO` (as `open` of a socket, or of a FIFO without blocking) |
//!
//! Opens that may meet a non-regular object never open it for data at all: they open it
//! `O_PATH`, check the type, and only then reopen the same object (through
//! `/proc/self/fd`, never by name again) for reading or writing, with `O_NONBLOCK` so a
//! FIFO swapped in can never block a worker or wake a local reader.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use rustix::fs::{FileType, Mode, OFlags};

use crate::proto::Errno;

/// Set-user-id bit.
const S_ISUID: u32 = libc::S_ISUID;
/// Set-group-id bit.
const S_ISGID: u32 = libc::S_ISGID;

/// What an export lets its clients do beyond plain files, directories and links. The
/// defaults are those of an NFS export's `nodev,nosuid`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportPolicy {
    /// Clients may create block and character devices (`Mknod`); refused with `EPERM`
    /// otherwise. Even then the server never opens a device for data.
    pub allow_devices: bool,
    /// Clients may set the set-user-id bit, and the set-group-id bit on non-directories
    /// (at creation or by chmod); otherwise those bits are silently cleared, as `nosuid`
    /// makes them meaningless. The set-group-id bit of directories (group inheritance)
    /// is always kept.
    pub allow_setuid: bool,
}

impl ExportPolicy {
    /// Refuses a `Mknod` of kind `kind` (the `S_IFMT` bits of its mode).
    pub(crate) fn check_mknod(&self, kind: FileType) -> Result<(), Errno> {
        match kind {
            FileType::RegularFile | FileType::Fifo | FileType::Socket => Ok(()),
            FileType::BlockDevice | FileType::CharacterDevice if self.allow_devices => Ok(()),
            FileType::BlockDevice | FileType::CharacterDevice => Err(Errno::EPERM),
            _ => Err(Errno::EINVAL),
        }
    }

    /// The permission bits `mode` with what the export does not allow cleared, for an
    /// object that is a directory (`is_dir`) or not.
    pub(crate) fn squash(&self, mode: u32, is_dir: bool) -> u32 {
        let mode = mode & 0o7777;
        if self.allow_setuid {
            return mode;
        }
        if is_dir {
            mode & !S_ISUID
        } else {
            mode & !(S_ISUID | S_ISGID)
        }
    }
}

/// The errno for opening an object of type `mode & S_IFMT` for data (see the module docs).
pub(crate) fn refusal(mode: u32) -> Errno {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => Errno::EISDIR,
        libc::S_IFLNK => Errno::ELOOP,
        libc::S_IFBLK | libc::S_IFCHR => Errno::EACCES,
        _ => Errno::ENXIO,
    }
}

/// A descriptor known to be open on a regular file: the only kind the server reads or
/// writes data through.
#[derive(Debug)]
pub(crate) struct RegularFd(OwnedFd);

impl RegularFd {
    /// Checks the type of the object `fd` is open on; refused (and closed) unless regular.
    pub(crate) fn check(fd: OwnedFd) -> Result<RegularFd, Errno> {
        let st = rustix::fs::fstat(&fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(refusal(st.st_mode));
        }
        Ok(RegularFd(fd))
    }

    /// Opens the object of the `O_PATH` descriptor `path_fd` with `flags` (`O_RDONLY`,
    /// `O_WRONLY` or `O_RDWR`) after checking that it is a regular file: nothing else is
    /// ever opened. `O_NONBLOCK` and `O_NOFOLLOW` are added, and the result checked again.
    pub(crate) fn reopen(path_fd: impl AsFd, flags: OFlags) -> Result<RegularFd, Errno> {
        let st = rustix::fs::fstat(&path_fd)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(refusal(st.st_mode));
        }
        let p = format!("/proc/self/fd/{}", path_fd.as_fd().as_raw_fd());
        let fd = rustix::fs::open(
            p.as_str(),
            flags | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        // O_NONBLOCK has no meaning for regular files, and was only a guard for opening.
        RegularFd::check(fd)
    }
}

impl AsFd for RegularFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_need_the_option_and_setuid_is_squashed() {
        let p = ExportPolicy::default();
        assert_eq!(p.check_mknod(FileType::BlockDevice), Err(Errno::EPERM));
        assert_eq!(p.check_mknod(FileType::CharacterDevice), Err(Errno::EPERM));
        assert_eq!(p.check_mknod(FileType::Fifo), Ok(()));
        assert_eq!(p.check_mknod(FileType::Socket), Ok(()));
        assert_eq!(p.check_mknod(FileType::Directory), Err(Errno::EINVAL));
        assert_eq!(p.squash(0o6755, false), 0o755);
        assert_eq!(p.squash(0o6755, true), 0o2755);
        assert_eq!(p.squash(0o1777, true), 0o1777);
        let open = ExportPolicy {
            allow_devices: true,
            allow_setuid: true,
        };
        assert_eq!(open.check_mknod(FileType::BlockDevice), Ok(()));
        assert_eq!(open.squash(0o6755, false), 0o6755);
    }
}
