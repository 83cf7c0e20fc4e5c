//! Who made a kernel request: the mount sends each request that the server checks
//! permissions for on behalf of the process that made the system call.
//!
//! FUSE tells the uid, gid and thread id of the caller, not its supplementary groups: they
//! are read from `/proc/<tid>/status` (`Groups:`), as other FUSE file systems that enforce
//! group permissions do. A caller that is gone by then (or a `/proc` without the entry) is
//! sent without supplementary groups, which can only refuse more, never allow more.

use fuser::Request as FuseReq;

use crate::client::{ActingAs, act_as};
use crate::proto::{Caller, MAX_GROUPS};

/// The supplementary groups in a `/proc/<pid>/status` text.
fn groups_in_status(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map(|g| {
            g.split_ascii_whitespace()
                .filter_map(|n| n.parse().ok())
                .take(MAX_GROUPS)
                .collect()
        })
        .unwrap_or_default()
}

/// The caller of `req`.
pub(crate) fn caller_of(req: &FuseReq) -> Caller {
    // FUSE's pid is the calling thread's id; groups are per thread.
    let groups = std::fs::read_to_string(format!("/proc/{}/status", req.pid()))
        .map(|s| groups_in_status(&s))
        .unwrap_or_default();
    Caller::new(req.uid(), req.gid(), groups)
}

/// Sends this thread's requests on behalf of `req`'s caller while the guard lives.
pub(crate) fn act_for(req: &FuseReq) -> ActingAs {
    act_as(caller_of(req))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_read_from_the_status_text() {
        let s = "Name:\tx\nUid:\t1\t1\t1\t1\nGroups:\t4 24 27 1000 \nNgid:\t0\n";
        assert_eq!(groups_in_status(s), vec![4, 24, 27, 1000]);
        assert_eq!(groups_in_status("Groups:\n"), Vec::<u32>::new());
        assert_eq!(groups_in_status("Name:\tx\n"), Vec::<u32>::new());
        let many: String = (0..1000).map(|g| format!(" {g}")).collect();
        assert_eq!(
            groups_in_status(&format!("Groups:{many}\n")).len(),
            MAX_GROUPS
        );
    }
}
