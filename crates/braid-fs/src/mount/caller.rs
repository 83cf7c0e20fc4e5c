//! Who made a kernel request: the mount sends each request that the server checks
//! permissions for on behalf of the process that made the system call.
//!
//! FUSE tells the uid, gid and thread id of the caller, not its supplementary groups: they
//! are read from `/proc/<tid>/status` (`Groups:`), as other FUSE file systems that enforce
//! group permissions do. A caller that is gone by then (or a `/proc` without the entry) is
//! sent without supplementary groups, which can only refuse more, never allow more.
//!
//! Reading that file costs about 40 µs (the kernel formats the whole status), as much as a
//! request's round trip, so the groups of a (thread, uid, gid) are kept for
//! [`GROUPS_TTL`]. A thread that changes only its supplementary groups may meet its old
//! ones on the server for that long: the kernel's own check on the mount
//! (`default_permissions`) uses the new ones, so this can refuse, never allow, too much.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fuser::Request as FuseReq;
use parking_lot::Mutex;

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

/// How long the groups read for a (thread, uid, gid) are used.
pub(crate) const GROUPS_TTL: Duration = Duration::from_secs(1);
/// Most (thread, uid, gid) entries kept; beyond, the cache starts again empty.
const GROUPS_CACHED: usize = 4096;

type GroupCache = HashMap<(u32, u32, u32), (Instant, Vec<u32>)>;

fn groups_cache() -> &'static Mutex<GroupCache> {
    static CACHE: OnceLock<Mutex<GroupCache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The supplementary groups of thread `tid`, running as `uid`:`gid`.
fn groups_of(tid: u32, uid: u32, gid: u32) -> Vec<u32> {
    let now = Instant::now();
    let key = (tid, uid, gid);
    if let Some((at, g)) = groups_cache().lock().get(&key)
        && now.duration_since(*at) < GROUPS_TTL
    {
        return g.clone();
    }
    // FUSE's pid is the calling thread's id; groups are per thread.
    let groups = std::fs::read_to_string(format!("/proc/{tid}/status"))
        .map(|s| groups_in_status(&s))
        .unwrap_or_default();
    let mut cache = groups_cache().lock();
    if cache.len() >= GROUPS_CACHED {
        cache.clear();
    }
    cache.insert(key, (now, groups.clone()));
    groups
}

/// The caller of `req`.
pub(crate) fn caller_of(req: &FuseReq) -> Caller {
    let groups = groups_of(req.pid(), req.uid(), req.gid());
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

    #[test]
    fn groups_are_read_from_proc_for_a_live_thread_and_kept_a_while() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let mine: Vec<u32> = rustix::process::getgroups()
            .unwrap()
            .into_iter()
            .map(|g| g.as_raw())
            .take(MAX_GROUPS)
            .collect();
        // A (uid, gid) pair no other test uses: the first call reads /proc.
        assert_eq!(groups_of(tid, 4_000_000, 4_000_001), mine);
        let at = groups_cache().lock()[&(tid, 4_000_000, 4_000_001)].0;
        assert_eq!(groups_of(tid, 4_000_000, 4_000_001), mine);
        assert_eq!(
            groups_cache().lock()[&(tid, 4_000_000, 4_000_001)].0,
            at,
            "served from the cache"
        );
        // A thread that does not exist has no groups.
        assert_eq!(groups_of(u32::MAX - 1, 1, 1), Vec::<u32>::new());
    }
}
