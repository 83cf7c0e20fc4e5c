//! Helpers of the FUSE request handlers (`fs.rs`): conversions, directory listing, and
//! removals.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use fuser::{INodeNo, ReplyDirectory, ReplyEmpty, TimeOrNow};

use super::fs::BraidFs;
use super::shared::{errno, kind};
use crate::proto::{DirEntry, Reply, Request, TimeSet, Timestamp};

pub(crate) fn timeset(t: Option<TimeOrNow>) -> TimeSet {
    match t {
        None => TimeSet::Omit,
        Some(TimeOrNow::Now) => TimeSet::Now,
        Some(TimeOrNow::SpecificTime(t)) => TimeSet::At(Timestamp::from_system_time(t)),
    }
}

/// Adds entries to a kernel readdir reply until it is full.
pub(crate) fn fill(entries: &[DirEntry], reply: &mut ReplyDirectory) {
    for e in entries {
        if reply.add(
            INodeNo(e.ino),
            e.next_offset,
            kind(e.file_type),
            OsStr::from_bytes(&e.name),
        ) {
            break;
        }
    }
}

impl BraidFs {
    /// Unlink or rmdir: sends `request(parent, name)` and keeps the known attributes right.
    pub(crate) fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        reply: ReplyEmpty,
        request: impl FnOnce(crate::proto::NodeId, Vec<u8>) -> Request,
    ) {
        let s = self.shared.clone();
        let name = Self::name(name);
        // The removed object's link count and times change too, and it is known here
        // only by name.
        s.known.forget_all();
        let epoch = s.known.epoch();
        let r = request(s.node(parent), name.clone());
        self.shared.call(&r, move |r| match r {
            Ok(reply_body) => {
                if let Reply::Attr(a) = &reply_body {
                    s.known.learn(epoch, parent.0, a);
                }
                s.removed(parent.0, &name);
                reply.ok()
            }
            Err(e) => reply.error(errno(&e)),
        });
    }
}
