//! What the mount knows without asking the server: attributes from recent replies, and names
//! this client removed.
//!
//! The kernel drops a directory's cached attributes after every create and unlink in it,
//! and a file's after a write; with `default_permissions` the next permission check or
//! `stat` then asks again. The replies to `Create`, `Unlink`, `Rmdir`, `Write`, `Commit`
//! (close, `fsync`), `Open`, `Lookup`, `SetAttr` and `GetAttr` carry the object's (and for
//! `Create`, `Unlink` and `Rmdir`, the parent's) attributes as the server had them after
//! the operation, so the mount keeps them and answers the kernel's next `GETATTR` itself,
//! for what is left of the attribute timeout counted from the reply: no attribute is used
//! longer after the server gave it than the kernel's own cache would use it.
//!
//! A name this client unlinked is known absent for the entry timeout (as a negative
//! dentry would be), so the `LOOKUP` the kernel sends before the next `open(O_CREAT)` of it
//! is answered without the server. Another client's changes show after the timeouts, as
//! they do through the kernel's caches; opening a file still asks the server
//! (close-to-open).
//!
//! Every change this client makes invalidates what it may affect before the request is
//! sent, and bumps an epoch: a reply is kept only if no invalidation happened since its
//! request was sent, so an older reply never overwrites what a newer change made stale.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::proto::Attr;

/// Most names remembered as absent (all are forgotten when the table is full).
const MAX_ABSENT: usize = 4096;

#[derive(Default)]
struct Tables {
    /// Invalidations so far.
    epoch: u64,
    attrs: HashMap<u64, (Attr, Instant)>,
    absent: HashMap<(u64, Vec<u8>), Instant>,
}

/// Attributes and absent names learnt from replies.
pub(crate) struct Known {
    attr_ttl: Duration,
    entry_ttl: Duration,
    t: Mutex<Tables>,
}

impl Known {
    pub(crate) fn new(attr_ttl: Duration, entry_ttl: Duration) -> Known {
        Known {
            attr_ttl,
            entry_ttl,
            t: Mutex::new(Tables::default()),
        }
    }

    /// The epoch to pass to [`Known::learn`] for a request sent now.
    pub(crate) fn epoch(&self) -> u64 {
        self.t.lock().epoch
    }

    /// Keeps `attr` of `node` from the reply to a request sent at `epoch`, unless something
    /// was invalidated since: then nothing is known of `node` (the reply shows that it
    /// changed, and may be older than a change of this client's).
    pub(crate) fn learn(&self, epoch: u64, node: u64, attr: &Attr) {
        let mut t = self.t.lock();
        if t.epoch == epoch && !self.attr_ttl.is_zero() {
            t.attrs.insert(node, (*attr, Instant::now()));
        } else {
            t.attrs.remove(&node);
        }
    }

    /// The attributes of `node` if known, and for how much longer.
    pub(crate) fn attr(&self, node: u64) -> Option<(Attr, Duration)> {
        let mut t = self.t.lock();
        let (a, at) = *t.attrs.get(&node)?;
        match self.attr_ttl.checked_sub(at.elapsed()) {
            Some(left) if !left.is_zero() => Some((a, left)),
            _ => {
                t.attrs.remove(&node);
                None
            }
        }
    }

    /// Forgets the attributes of `nodes` (about to change).
    pub(crate) fn forget(&self, nodes: &[u64]) {
        let mut t = self.t.lock();
        t.epoch += 1;
        for n in nodes {
            t.attrs.remove(n);
        }
    }

    /// Drops what is known of `node` (the kernel forgot it), without invalidating replies
    /// in flight: none concerns a node the kernel no longer holds.
    pub(crate) fn drop_node(&self, node: u64) {
        self.t.lock().attrs.remove(&node);
    }

    /// Forgets every attribute: a change whose other victims are unknown here (an unlink
    /// or rename changes the link count and times of an object known only by name).
    pub(crate) fn forget_all(&self) {
        let mut t = self.t.lock();
        t.epoch += 1;
        t.attrs.clear();
    }

    /// `name` in `parent` was removed by this client.
    pub(crate) fn removed(&self, parent: u64, name: &[u8]) {
        if self.entry_ttl.is_zero() {
            return;
        }
        let mut t = self.t.lock();
        if t.absent.len() >= MAX_ABSENT {
            t.absent.clear();
        }
        t.absent.insert((parent, name.to_vec()), Instant::now());
    }

    /// `name` in `parent` may exist from now on.
    pub(crate) fn named(&self, parent: u64, name: &[u8]) {
        let mut t = self.t.lock();
        if !t.absent.is_empty() {
            t.absent.remove(&(parent, name.to_vec()));
        }
    }

    /// Whether `name` in `parent` is known not to exist.
    pub(crate) fn is_absent(&self, parent: u64, name: &[u8]) -> bool {
        let mut t = self.t.lock();
        let key = (parent, name.to_vec());
        match t.absent.get(&key) {
            Some(at) if at.elapsed() < self.entry_ttl => true,
            Some(_) => {
                t.absent.remove(&key);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(size: u64) -> Attr {
        Attr {
            size,
            ..Attr::default()
        }
    }

    #[test]
    fn a_reply_older_than_an_invalidation_is_not_kept() {
        let k = Known::new(Duration::from_secs(60), Duration::from_secs(60));
        let e = k.epoch();
        k.learn(e, 1, &attr(1));
        assert_eq!(k.attr(1).map(|(a, _)| a.size), Some(1));
        let e = k.epoch();
        k.forget(&[2]);
        k.learn(e, 1, &attr(5));
        assert!(k.attr(1).is_none());
        k.learn(k.epoch(), 1, &attr(1));
        assert_eq!(k.attr(1).map(|(a, _)| a.size), Some(1));
        k.forget_all();
        assert!(k.attr(1).is_none());
    }

    #[test]
    fn attributes_and_absent_names_expire_with_their_timeouts() {
        let k = Known::new(Duration::ZERO, Duration::ZERO);
        k.learn(k.epoch(), 1, &attr(1));
        assert!(k.attr(1).is_none());
        k.removed(1, b"a");
        assert!(!k.is_absent(1, b"a"));
        let k = Known::new(Duration::from_secs(60), Duration::from_secs(60));
        k.learn(k.epoch(), 1, &attr(1));
        let (_, left) = k.attr(1).unwrap();
        assert!(left <= Duration::from_secs(60) && left > Duration::from_secs(50));
        k.removed(1, b"a");
        assert!(k.is_absent(1, b"a"));
        assert!(!k.is_absent(1, b"b"));
        k.named(1, b"a");
        assert!(!k.is_absent(1, b"a"));
    }
}
