//! Bodies of the byte-range lock requests and replies (`GetLock`, `SetLock`, `SetLockWait`).

use super::DecodeError;
use super::codec::{Reader, Writer};

/// What a lock request asks for, or what a `GetLock` reply reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockKind {
    /// Shared (`F_RDLCK`).
    Read,
    /// Exclusive (`F_WRLCK`).
    Write,
    /// Release (`F_UNLCK`); in a `GetLock` reply: nothing conflicts.
    Unlock,
}

/// A byte range and its kind, as `struct flock` after the kernel resolved `l_whence`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRange {
    /// Read, write or unlock.
    pub kind: LockKind,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive (`i64::MAX` or more: to the end of the file, however large).
    pub end: u64,
    /// The locking process on its client's host (reported by `GetLock` to processes of the
    /// same client only; 0 otherwise).
    pub pid: u32,
}

/// A lock request: through which open file, for which owner, what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// The open file handle the lock is taken through.
    pub fh: u64,
    /// The lock owner, as the client's kernel names it (a process's file table for POSIX
    /// locks, an open file description for `flock` and OFD locks).
    pub owner: u64,
    /// What to lock.
    pub range: LockRange,
}

impl LockRequest {
    pub(super) fn put(&self, w: &mut Writer) {
        w.u64(self.fh);
        w.u64(self.owner);
        put_range(w, &self.range);
    }

    pub(super) fn get(r: &mut Reader<'_>) -> Result<LockRequest, DecodeError> {
        Ok(LockRequest {
            fh: r.u64()?,
            owner: r.u64()?,
            range: get_range(r)?,
        })
    }
}

pub(super) fn put_range(w: &mut Writer, l: &LockRange) {
    w.u8(match l.kind {
        LockKind::Read => 0,
        LockKind::Write => 1,
        LockKind::Unlock => 2,
    });
    w.u64(l.start);
    w.u64(l.end);
    w.u32(l.pid);
}

pub(super) fn get_range(r: &mut Reader<'_>) -> Result<LockRange, DecodeError> {
    let kind = match r.u8()? {
        0 => LockKind::Read,
        1 => LockKind::Write,
        2 => LockKind::Unlock,
        v => return Err(DecodeError::BadValue("lock kind", v as u64)),
    };
    let (start, end) = (r.u64()?, r.u64()?);
    if end < start {
        return Err(DecodeError::BadValue("lock range end", end));
    }
    Ok(LockRange {
        kind,
        start,
        end,
        pid: r.u32()?,
    })
}
