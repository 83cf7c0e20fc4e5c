//! The table of a context's registered regions, keyed by remote key.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::mem::access::Access;
use crate::mem::inner::{RegionInner, RegionPin};
use crate::wire::WireStatus;

/// Hashes remote keys for the registry's table. The keys are random where it matters (48
/// bits from the operating system's generator above a 16-bit generation), and only this
/// side inserts them, so a peer naming keys cannot pile entries into one bucket; SipHash's
/// protection against that would cost more than the rest of a small request's lookup.
#[derive(Default, Clone, Copy)]
struct KeyHash(u64);

impl std::hash::Hasher for KeyHash {
    fn finish(&self) -> u64 {
        // Every bit of the key reaches the low bits (the bucket) and the high bits (the
        // table's tag byte).
        let x = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^ (x >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }

    fn write_u64(&mut self, k: u64) {
        self.0 ^= k;
    }
}

type KeyMap<V> = HashMap<u64, V, std::hash::BuildHasherDefault<KeyHash>>;

/// Maps remote keys to regions; the target side of every remote access looks here.
#[derive(Default)]
pub struct Registry {
    map: RwLock<KeyMap<Arc<RegionInner>>>,
    generation: AtomicU16,
    limit: Option<u64>,
    used: AtomicU64,
}

impl Registry {
    /// A registry refusing registrations beyond `limit` bytes in total.
    pub fn with_limit(limit: Option<u64>) -> Registry {
        Registry {
            limit,
            ..Registry::default()
        }
    }

    /// Bytes registered now.
    pub fn registered_bytes(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// Takes `len` bytes of the limit, or says it is reached.
    pub(crate) fn charge(&self, len: u64) -> Result<(), crate::Error> {
        let limit = self.limit.unwrap_or(u64::MAX);
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(len).filter(|n| *n <= limit)
            })
            .map(|_| ())
            .map_err(|_| crate::Error::QueueFull {
                what: "registered bytes",
                limit: limit as usize,
            })
    }

    pub(crate) fn uncharge(&self, len: u64) {
        self.used.fetch_sub(len, Ordering::AcqRel);
    }

    /// Creates the region with a fresh unguessable key and inserts it.
    pub(crate) fn insert_with(
        &self,
        make: impl FnOnce(u64) -> Arc<RegionInner>,
    ) -> Arc<RegionInner> {
        let mut map = self.map.write();
        let key = loop {
            let gen_ = self
                .generation
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1);
            let key = (random_u64() << 16) | gen_ as u64;
            if !map.contains_key(&key) {
                break key;
            }
        };
        let inner = make(key);
        map.insert(key, inner.clone());
        inner
    }

    pub(crate) fn remove(&self, key: u64) {
        self.map.write().remove(&key);
    }

    pub(crate) fn contains(&self, key: u64) -> bool {
        self.map.read().contains_key(&key)
    }

    pub(crate) fn lookup(&self, key: u64) -> Option<RegionPin> {
        self.map.read().get(&key).map(|r| RegionPin::new(r.clone()))
    }

    /// The target-side protection check: key known, rights granted, `[addr, addr+len)`
    /// inside the region and, for a file region, before the file's end as it is now.
    /// Returns a pin that keeps the memory in place for the operation.
    pub(crate) fn check(
        &self,
        key: u64,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<RegionPin, WireStatus> {
        self.check_in(key, addr, len, need, &mut FileEnds::default())
    }

    /// [`Registry::check`] remembering file sizes in `ends`, so that the pieces of one
    /// vectored request ask for each file's size once.
    pub(crate) fn check_in(
        &self,
        key: u64,
        addr: u64,
        len: u64,
        need: Access,
        ends: &mut FileEnds,
    ) -> Result<RegionPin, WireStatus> {
        let pin = self.lookup(key).ok_or(WireStatus::RemoteAccess)?;
        Self::check_pin(&pin, key, addr, len, need, ends)?;
        Ok(pin)
    }

    /// The checks of [`Registry::check`], then `f` on the region, under the table's read
    /// lock and without a pin: deregistration, which takes the write lock, waits until `f`
    /// returns. For a short access (an express write's copy) a pin costs more than it.
    pub(crate) fn with_checked<R>(
        &self,
        key: u64,
        addr: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(&RegionInner) -> R,
    ) -> Result<R, WireStatus> {
        let map = self.map.read();
        let inner = map.get(&key).ok_or(WireStatus::RemoteAccess)?;
        Self::check_pin(inner, key, addr, len, need, &mut FileEnds::default())?;
        Ok(f(inner))
    }

    /// The checks of [`Registry::check_in`] on a region already looked up (and pinned, or
    /// held under the table's lock).
    pub(crate) fn check_pin(
        region: &RegionInner,
        key: u64,
        addr: u64,
        len: u64,
        need: Access,
        ends: &mut FileEnds,
    ) -> Result<(), WireStatus> {
        if !region.access().contains(need) {
            return Err(WireStatus::RemoteAccess);
        }
        let end = addr.checked_add(len).ok_or(WireStatus::RemoteAccess)?;
        if end > region.len() as u64 {
            return Err(WireStatus::RemoteAccess);
        }
        if let Some(f) = region.file()
            && len > 0
        {
            let readable = match ends.0.iter().find(|e| e.0 == key) {
                Some(e) => e.1,
                None => {
                    // A file whose size cannot be asked for is reachable nowhere.
                    let r = f.readable_len().unwrap_or(0);
                    ends.0.push((key, r));
                    r
                }
            };
            if end > readable {
                return Err(WireStatus::RemoteAccess);
            }
        }
        Ok(())
    }

    /// Number of registered regions.
    pub fn len(&self) -> usize {
        self.map.read().len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// File sizes looked up during one check, by region key (bytes of the region before the
/// file's end).
#[derive(Default)]
pub(crate) struct FileEnds(Vec<(u64, u64)>);

/// A random 64-bit value from the operating system's generator (keys, session ids and
/// nonces must never be predictable).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // The OS generator only fails on broken systems; keys must never be predictable.
    getrandom::fill(&mut b).expect("the operating system's random generator failed");
    u64::from_le_bytes(b)
}
