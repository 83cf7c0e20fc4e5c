//! The caller envelope: who asks. Every request carries it right after the header, so the
//! server can carry the request out as that user (uid, gid, supplementary groups), the way
//! an NFS `AUTH_SYS` credential travels with every call.
//!
//! Layout (little-endian): uid `u32`, gid `u32`, group count `u16` (at most
//! [`MAX_GROUPS`]), then that many `u32` group ids.

use super::DecodeError;
use super::codec::{Reader, Writer};

/// Most supplementary groups a caller envelope carries. A caller with more sends the first
/// `MAX_GROUPS` (the kernel lists them sorted); NFS `AUTH_SYS` stops at 16.
pub const MAX_GROUPS: usize = 64;
/// Largest encoded envelope.
pub const CALLER_MAX_LEN: usize = 10 + 4 * MAX_GROUPS;

/// The user a request is made for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    /// File system user id.
    pub uid: u32,
    /// File system group id.
    pub gid: u32,
    /// Supplementary groups (at most [`MAX_GROUPS`]).
    pub groups: Vec<u32>,
}

impl Caller {
    /// This process's effective user, group and supplementary groups.
    pub fn of_process() -> Caller {
        // SAFETY: these calls have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let groups = rustix::process::getgroups()
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_default();
        Caller::new(uid, gid, groups)
    }

    /// A caller with `groups` cut to [`MAX_GROUPS`].
    pub fn new(uid: u32, gid: u32, mut groups: Vec<u32>) -> Caller {
        groups.truncate(MAX_GROUPS);
        Caller { uid, gid, groups }
    }

    pub(crate) fn put(&self, w: &mut Writer) {
        let n = self.groups.len().min(MAX_GROUPS);
        w.u32(self.uid);
        w.u32(self.gid);
        w.u16(n as u16);
        for g in &self.groups[..n] {
            w.u32(*g);
        }
    }

    pub(crate) fn get(r: &mut Reader<'_>) -> Result<Caller, DecodeError> {
        let uid = r.u32()?;
        let gid = r.u32()?;
        let n = r.u16()? as usize;
        if n > MAX_GROUPS {
            return Err(DecodeError::BadValue("group count", n as u64));
        }
        let mut groups = Vec::with_capacity(n);
        for _ in 0..n {
            groups.push(r.u32()?);
        }
        Ok(Caller { uid, gid, groups })
    }
}
