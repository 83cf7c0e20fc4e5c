//! The server's byte-range lock table, sans I/O: POSIX record-lock semantics per file,
//! held for (client, lock owner) pairs, with queued waiters woken in order.
//!
//! One owner's locks on a file never overlap: a new lock replaces the part of the owner's
//! locks it covers (upgrade, downgrade, unlock split them), and adjacent or overlapping
//! locks of the same kind taken through the same open file are merged, as the kernel does
//! for local files. Locks of different owners conflict when they overlap and one of them is
//! a write lock. A waiter is granted once nothing held conflicts with it *and* no waiter
//! queued before it that it conflicts with is still waiting (so a stream of readers cannot
//! starve a queued writer); waiters are woken in the order they came. Requests that do not
//! wait are checked against held locks only, as POSIX asks.
//!
//! Deadlock: a waiter that would wait (through a chain of owners each waiting for a lock
//! held by the next) for a lock its own owner holds is refused with `EDEADLK` instead.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::proto::Errno;

/// A lock owner: the client's session and the owner id its kernel gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Owner {
    /// The client (its session token).
    pub(crate) client: u64,
    /// The owner on that client.
    pub(crate) owner: u64,
}

/// Shared or exclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// A lock held on a range of one file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) owner: Owner,
    pub(crate) kind: Kind,
    /// First byte.
    pub(crate) start: u64,
    /// Last byte (inclusive).
    pub(crate) end: u64,
    /// The client's open file handle it was taken through: its release drops it (`flock`
    /// and OFD locks belong to an open file; POSIX locks are dropped earlier, by the flush
    /// of their owner).
    pub(crate) fh: u64,
    pub(crate) pid: u32,
}

impl Held {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start <= end && start <= self.end
    }

    fn conflicts(&self, w: &Want) -> bool {
        self.owner != w.owner
            && self.overlaps(w.start, w.end)
            && (self.kind == Kind::Write || w.kind == Some(Kind::Write))
    }
}

/// A lock or unlock request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Want {
    pub(crate) owner: Owner,
    /// `None`: unlock.
    pub(crate) kind: Option<Kind>,
    pub(crate) start: u64,
    /// Inclusive.
    pub(crate) end: u64,
    pub(crate) fh: u64,
    pub(crate) pid: u32,
}

/// What became of a lock request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Taken (or released).
    Granted,
    /// Refused without waiting: this lock is in the way.
    Conflict(Held),
    /// Waiting would deadlock.
    Deadlock,
    /// Queued: granted later, through the woken list of a later call.
    Queued,
    /// Too many locks or waiters.
    NoLocks,
}

/// Most lock ranges one client may hold on one file.
pub(crate) const MAX_HELD_PER_CLIENT: usize = 4096;
/// Most owners a deadlock search visits.
const MAX_SEARCH: usize = 1024;

struct FileLocks<W> {
    held: Vec<Held>,
    waiters: VecDeque<(Want, W)>,
}

impl<W> Default for FileLocks<W> {
    fn default() -> Self {
        FileLocks {
            held: Vec::new(),
            waiters: VecDeque::new(),
        }
    }
}

/// Waiters' outcomes decided by a call: `Ok` granted, `Err` refused (cancelled).
pub(crate) type Woken<W> = Vec<(W, Result<(), Errno>)>;

/// Locks of every file, keyed by the file's server-side id.
pub(crate) struct LockTable<W> {
    files: HashMap<u64, FileLocks<W>>,
}

impl<W> Default for LockTable<W> {
    fn default() -> Self {
        LockTable {
            files: HashMap::new(),
        }
    }
}

impl<W> LockTable<W> {
    /// The first held lock that conflicts with `w` (`F_GETLK`).
    pub(crate) fn test(&self, file: u64, w: &Want) -> Option<Held> {
        let f = self.files.get(&file)?;
        f.held.iter().find(|h| h.conflicts(w)).copied()
    }

    /// Locks or unlocks; with `waiter`, a conflicting lock is queued instead of refused.
    /// Waiters this makes grantable are appended to `woken`.
    pub(crate) fn set(
        &mut self,
        file: u64,
        w: Want,
        waiter: Option<W>,
        woken: &mut Woken<W>,
    ) -> Outcome {
        if w.kind.is_some() {
            if let Some(h) = self.test(file, &w) {
                let Some(waiter) = waiter else {
                    return Outcome::Conflict(h);
                };
                if self.would_deadlock(file, &w) {
                    return Outcome::Deadlock;
                }
                self.files
                    .entry(file)
                    .or_default()
                    .waiters
                    .push_back((w, waiter));
                return Outcome::Queued;
            }
            let f = self.files.entry(file).or_default();
            let mine = f.held.iter().filter(|h| h.owner.client == w.owner.client);
            if mine.count() >= MAX_HELD_PER_CLIENT {
                return Outcome::NoLocks;
            }
        }
        let Some(f) = self.files.get_mut(&file) else {
            return Outcome::Granted; // nothing to unlock
        };
        apply(&mut f.held, &w);
        self.wake(file, woken);
        Outcome::Granted
    }

    /// Releases every lock `owner` holds on `file` and refuses its waiters there with
    /// `ECANCELED` (a close by a POSIX lock owner).
    pub(crate) fn release_owner(&mut self, file: u64, owner: Owner, woken: &mut Woken<W>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        f.held.retain(|h| h.owner != owner);
        let (mine, rest): (VecDeque<_>, VecDeque<_>) =
            f.waiters.drain(..).partition(|(w, _)| w.owner == owner);
        f.waiters = rest;
        woken.extend(mine.into_iter().map(|(_, x)| (x, Err(Errno::ECANCELED))));
        self.wake(file, woken);
    }

    /// Releases the locks `client` took through its open file `fh` on `file`, and refuses
    /// its waiters through it (the last close of that open file).
    pub(crate) fn release_fh(&mut self, file: u64, client: u64, fh: u64, woken: &mut Woken<W>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        f.held.retain(|h| h.owner.client != client || h.fh != fh);
        let (mine, rest): (VecDeque<_>, VecDeque<_>) = f
            .waiters
            .drain(..)
            .partition(|(w, _)| w.owner.client == client && w.fh == fh);
        f.waiters = rest;
        woken.extend(mine.into_iter().map(|(_, x)| (x, Err(Errno::ECANCELED))));
        self.wake(file, woken);
    }

    /// Drops everything `client` held or waited for (it disconnected); its waiters are
    /// forgotten (nobody is left to answer), others' may be granted.
    pub(crate) fn drop_client(&mut self, client: u64, woken: &mut Woken<W>) {
        let files: Vec<u64> = self.files.keys().copied().collect();
        for file in files {
            if let Some(f) = self.files.get_mut(&file) {
                f.held.retain(|h| h.owner.client != client);
                f.waiters.retain(|(w, _)| w.owner.client != client);
            }
            self.wake(file, woken);
        }
    }

    /// Locks held on `file` (tests, logs).
    #[cfg(test)]
    pub(crate) fn held(&self, file: u64) -> Vec<Held> {
        let mut v = self
            .files
            .get(&file)
            .map(|f| f.held.clone())
            .unwrap_or_default();
        v.sort_by_key(|h| (h.owner.client, h.owner.owner, h.start));
        v
    }

    /// Grants, in queue order, every waiter of `file` that nothing held and no earlier
    /// waiter blocks; drops the file's entry once it is empty.
    fn wake(&mut self, file: u64, woken: &mut Woken<W>) {
        let Some(f) = self.files.get_mut(&file) else {
            return;
        };
        let mut still: Vec<Want> = Vec::new();
        let mut queue = VecDeque::with_capacity(f.waiters.len());
        while let Some((w, x)) = f.waiters.pop_front() {
            let blocked = f.held.iter().any(|h| h.conflicts(&w))
                || still.iter().any(|e| {
                    e.owner != w.owner
                        && e.start <= w.end
                        && w.start <= e.end
                        && (e.kind == Some(Kind::Write) || w.kind == Some(Kind::Write))
                });
            if blocked {
                still.push(w);
                queue.push_back((w, x));
            } else {
                apply(&mut f.held, &w);
                woken.push((x, Ok(())));
            }
        }
        f.waiters = queue;
        if f.held.is_empty() && f.waiters.is_empty() {
            self.files.remove(&file);
        }
    }

    /// True when `w`'s owner, by waiting, would close a cycle of owners each waiting for a
    /// lock held by the next.
    fn would_deadlock(&self, file: u64, w: &Want) -> bool {
        let me = w.owner;
        let mut stack: Vec<Owner> = self.blockers(file, w);
        let mut seen: HashSet<Owner> = HashSet::new();
        while let Some(o) = stack.pop() {
            if o == me {
                return true;
            }
            if !seen.insert(o) || seen.len() > MAX_SEARCH {
                continue;
            }
            for (f, fl) in &self.files {
                for (ww, _) in fl.waiters.iter().filter(|(ww, _)| ww.owner == o) {
                    stack.extend(self.blockers(*f, ww));
                }
            }
        }
        false
    }

    fn blockers(&self, file: u64, w: &Want) -> Vec<Owner> {
        self.files
            .get(&file)
            .map(|f| {
                f.held
                    .iter()
                    .filter(|h| h.conflicts(w))
                    .map(|h| h.owner)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Applies `w` to `held`: cuts the owner's locks out of `w`'s range, adds the new lock,
/// merges it with the owner's neighbours of the same kind and open file.
fn apply(held: &mut Vec<Held>, w: &Want) {
    let mut out = Vec::with_capacity(held.len() + 2);
    for h in held.drain(..) {
        if h.owner != w.owner || !h.overlaps(w.start, w.end) {
            out.push(h);
            continue;
        }
        if h.start < w.start {
            out.push(Held {
                end: w.start - 1,
                ..h
            });
        }
        if h.end > w.end {
            out.push(Held {
                start: w.end + 1,
                ..h
            });
        }
    }
    if let Some(kind) = w.kind {
        let mut new = Held {
            owner: w.owner,
            kind,
            start: w.start,
            end: w.end,
            fh: w.fh,
            pid: w.pid,
        };
        // Merge with touching neighbours (they cannot overlap: just cut).
        out.retain(|h| {
            let touches = h.owner == new.owner
                && h.kind == new.kind
                && h.fh == new.fh
                && (h.end.checked_add(1) == Some(new.start)
                    || new.end.checked_add(1) == Some(h.start));
            if touches {
                new.start = new.start.min(h.start);
                new.end = new.end.max(h.end);
            }
            !touches
        });
        out.push(new);
    }
    *held = out;
}

#[cfg(test)]
#[path = "locks_tests.rs"]
mod tests;
