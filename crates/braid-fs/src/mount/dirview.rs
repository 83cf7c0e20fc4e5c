//! Complete views of small directories: a `LOOKUP` of a name a view lacks is answered
//! `ENOENT` without the server.
//!
//! The kernel looks every new name up before creating it, and FUSE keeps no negative
//! entry for a name it never saw, so a loop creating new names pays a server round trip
//! for each `LOOKUP`. A view is the directory's full listing, read from the server (at
//! most [`MAX_NAMES`] names), plus every change this client made to the directory since:
//! a name this client may have created is present from the moment the request is sent, a
//! name it removed is absent once the server confirmed the removal. A view is trusted for
//! the negative timeout (`MountConfig::negative_timeout`; zero, the default, turns views
//! off) counted from when its listing was asked for, so a name another client (or a
//! process on the server) creates shows here at the latest one negative timeout after it
//! was made, even to an `open` (docs/FS.md). Listings run in
//! the background: the first after the server answered a `LOOKUP` in the directory with
//! `ENOENT`, then again whenever a view answering lookups is past half its life, so a busy
//! directory keeps a fresh view and a lookup never waits for a listing.
//!
//! Only absence is answered from a view; a name a view holds is still looked up on the
//! server, so a stale view can only delay the sight of another client's new name (by at
//! most the timeout), never show a name that is gone or hide one of this client's.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Largest directory (names) kept as a view: larger ones are not worth relisting every
/// timeout.
pub(crate) const MAX_NAMES: usize = 1024;
/// How long after a directory proved too large (or its listing failed) no listing of it
/// is tried again.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// Most directories with a view (all are dropped when the table is full).
const MAX_VIEWS: usize = 256;

/// Changes this client made to a directory while a listing of it was under way: the
/// listing may or may not show them, so they are applied on top of it.
#[derive(Default)]
struct Log {
    id: u64,
    added: HashSet<Vec<u8>>,
    removed: HashSet<Vec<u8>>,
}

#[derive(Default)]
struct View {
    /// The complete set of names, if known, and until when it may be trusted.
    names: Option<(HashSet<Vec<u8>>, Instant)>,
    /// The listing under way, if any.
    listing: Option<Log>,
    /// No listing before this.
    not_before: Option<Instant>,
}

/// What a view says about a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Known not to exist: answer `ENOENT`.
    Absent,
    /// Ask the server.
    Unknown,
}

/// The views of one mount.
pub(crate) struct DirViews {
    ttl: Duration,
    next_id: Mutex<u64>,
    t: Mutex<HashMap<u64, View>>,
}

impl DirViews {
    /// Views trusted for `ttl` (the negative timeout; zero: no views).
    pub(crate) fn new(ttl: Duration) -> DirViews {
        DirViews {
            ttl,
            next_id: Mutex::new(1),
            t: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `name` in `dir` is known absent at `now`.
    pub(crate) fn lookup(&self, dir: u64, name: &[u8], now: Instant) -> Answer {
        let t = self.t.lock();
        match t.get(&dir).and_then(|v| v.names.as_ref()) {
            Some((names, until)) if now < *until && !names.contains(name) => Answer::Absent,
            _ => Answer::Unknown,
        }
    }

    /// Whether a listing of `dir` should start at `now`: the directory has no view or one
    /// past half its life, none is under way and none failed recently. If so, returns the
    /// listing's id for [`DirViews::listed`] and records the start (the changes this client
    /// makes from now on are applied on top of the listing).
    pub(crate) fn start_listing(&self, dir: u64, now: Instant) -> Option<u64> {
        if self.ttl.is_zero() {
            return None;
        }
        let mut t = self.t.lock();
        if !t.contains_key(&dir) && t.len() >= MAX_VIEWS {
            t.clear();
        }
        let v = t.entry(dir).or_default();
        if v.listing.is_some() || v.not_before.is_some_and(|nb| now < nb) {
            return None;
        }
        if let Some((_, until)) = &v.names
            && now + self.ttl / 2 < *until
        {
            return None;
        }
        let id = {
            let mut n = self.next_id.lock();
            *n += 1;
            *n
        };
        v.listing = Some(Log {
            id,
            ..Log::default()
        });
        Some(id)
    }

    /// The listing `id` of `dir`, asked for at `started`, gave `names` (`None`: it failed
    /// or the directory has more than [`MAX_NAMES`]).
    pub(crate) fn listed(
        &self,
        dir: u64,
        id: u64,
        started: Instant,
        names: Option<HashSet<Vec<u8>>>,
        now: Instant,
    ) {
        let mut t = self.t.lock();
        let Some(v) = t.get_mut(&dir) else { return };
        if v.listing.as_ref().is_none_or(|l| l.id != id) {
            return; // dropped meanwhile (a rename, the kernel forgot the directory)
        }
        let log = v.listing.take().unwrap_or_default();
        match names {
            Some(mut names) => {
                for n in &log.removed {
                    names.remove(n);
                }
                names.extend(log.added);
                v.names = Some((names, started + self.ttl));
                v.not_before = None;
            }
            None => {
                v.names = None;
                v.not_before = Some(now + RETRY_AFTER);
            }
        }
    }

    /// This client is about to ask the server to make `name` in `dir` (create, mkdir,
    /// link, rename's target, ...): from now on it may exist.
    pub(crate) fn named(&self, dir: u64, name: &[u8]) {
        let mut t = self.t.lock();
        let Some(v) = t.get_mut(&dir) else { return };
        if let Some((names, _)) = &mut v.names {
            names.insert(name.to_vec());
        }
        if let Some(l) = &mut v.listing {
            l.removed.remove(name);
            l.added.insert(name.to_vec());
        }
    }

    /// The server removed `name` from `dir` at this client's request.
    pub(crate) fn removed(&self, dir: u64, name: &[u8]) {
        let mut t = self.t.lock();
        let Some(v) = t.get_mut(&dir) else { return };
        if let Some((names, _)) = &mut v.names {
            names.remove(name);
        }
        if let Some(l) = &mut v.listing {
            l.added.remove(name);
            l.removed.insert(name.to_vec());
        }
    }

    /// Forgets the view of `dir` and any listing under way (its result will be ignored).
    pub(crate) fn drop_dir(&self, dir: u64) {
        self.t.lock().remove(&dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> HashSet<Vec<u8>> {
        names.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    const TTL: Duration = Duration::from_secs(1);

    #[test]
    fn a_listing_answers_absent_names_for_the_timeout_from_its_start() {
        let v = DirViews::new(TTL);
        let t0 = Instant::now();
        assert_eq!(v.lookup(1, b"a", t0), Answer::Unknown);
        let id = v.start_listing(1, t0).unwrap();
        assert_eq!(v.start_listing(1, t0), None, "one listing at a time");
        let t1 = t0 + Duration::from_millis(300);
        v.listed(1, id, t0, Some(set(&[".", "..", "a"])), t1);
        assert_eq!(v.lookup(1, b"a", t1), Answer::Unknown, "present: ask");
        assert_eq!(v.lookup(1, b"b", t1), Answer::Absent);
        assert_eq!(v.lookup(2, b"b", t1), Answer::Unknown, "another directory");
        // Trusted until one timeout after the listing was asked for, not after its reply.
        assert_eq!(v.lookup(1, b"b", t0 + TTL), Answer::Unknown);
        // Relisted only once past half its life.
        assert_eq!(v.start_listing(1, t0 + TTL / 4), None);
        assert!(v.start_listing(1, t0 + TTL * 3 / 4).is_some());
    }

    #[test]
    fn changes_made_during_a_listing_apply_on_top_of_it() {
        let v = DirViews::new(TTL);
        let t0 = Instant::now();
        let id = v.start_listing(1, t0).unwrap();
        // The listing may have been read before the create and after the unlink.
        v.named(1, b"new");
        v.removed(1, b"old");
        v.listed(1, id, t0, Some(set(&["old"])), t0);
        assert_eq!(v.lookup(1, b"new", t0), Answer::Unknown, "created here");
        assert_eq!(v.lookup(1, b"old", t0), Answer::Absent, "removed here");
        // With a view: the same, immediately.
        v.named(1, b"x");
        assert_eq!(v.lookup(1, b"x", t0), Answer::Unknown);
        v.removed(1, b"x");
        assert_eq!(v.lookup(1, b"x", t0), Answer::Absent);
        // Removed, then made again during a listing that still showed it gone.
        let id = v.start_listing(1, t0 + TTL).unwrap();
        v.removed(1, b"y");
        v.named(1, b"y");
        v.listed(1, id, t0 + TTL, Some(set(&[])), t0 + TTL);
        assert_eq!(v.lookup(1, b"y", t0 + TTL), Answer::Unknown);
    }

    #[test]
    fn failed_or_dropped_listings_give_no_view() {
        let v = DirViews::new(TTL);
        let t0 = Instant::now();
        let id = v.start_listing(1, t0).unwrap();
        v.listed(1, id, t0, None, t0);
        assert_eq!(v.lookup(1, b"a", t0), Answer::Unknown);
        assert_eq!(v.start_listing(1, t0 + TTL), None, "not retried at once");
        assert!(v.start_listing(1, t0 + RETRY_AFTER).is_some());
        // Dropped while listing: the result is ignored.
        let id = v.start_listing(2, t0).unwrap();
        v.drop_dir(2);
        v.listed(2, id, t0, Some(set(&[])), t0);
        assert_eq!(v.lookup(2, b"a", t0), Answer::Unknown);
        // No timeout, no views.
        assert_eq!(DirViews::new(Duration::ZERO).start_listing(1, t0), None);
    }
}
