//! A set of ranks: one machine word for groups of up to 64 ranks, a bit vector beyond.

use super::Rank;

/// A set of ranks (copy sets of the directory).
#[derive(Clone, PartialEq, Eq)]
pub enum RankSet {
    /// Ranks below 64, one bit each.
    Small(u64),
    /// Any ranks, 64 per word.
    Large(Box<[u64]>),
}

impl std::fmt::Debug for RankSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl RankSet {
    /// The empty set for a group of `size` ranks.
    pub fn empty(size: u32) -> RankSet {
        if size <= 64 {
            RankSet::Small(0)
        } else {
            RankSet::Large(vec![0; size.div_ceil(64) as usize].into_boxed_slice())
        }
    }

    /// The set holding only `r`.
    pub fn single(size: u32, r: Rank) -> RankSet {
        let mut s = RankSet::empty(size);
        s.insert(r);
        s
    }

    fn words(&self) -> &[u64] {
        match self {
            RankSet::Small(w) => std::slice::from_ref(w),
            RankSet::Large(ws) => ws,
        }
    }

    fn words_mut(&mut self) -> &mut [u64] {
        match self {
            RankSet::Small(w) => std::slice::from_mut(w),
            RankSet::Large(ws) => ws,
        }
    }

    /// Adds `r` (which must be below the group size given at creation).
    pub fn insert(&mut self, r: Rank) {
        self.words_mut()[(r / 64) as usize] |= 1 << (r % 64);
    }

    /// Removes `r`.
    pub fn remove(&mut self, r: Rank) {
        if let Some(w) = self.words_mut().get_mut((r / 64) as usize) {
            *w &= !(1 << (r % 64));
        }
    }

    /// True when `r` is in the set.
    pub fn contains(&self, r: Rank) -> bool {
        self.words()
            .get((r / 64) as usize)
            .is_some_and(|w| w & (1 << (r % 64)) != 0)
    }

    /// Number of ranks in the set.
    pub fn len(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    /// True when the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words().iter().all(|w| *w == 0)
    }

    /// The ranks in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = Rank> + '_ {
        self.words().iter().enumerate().flat_map(|(i, &w)| {
            let mut w = w;
            std::iter::from_fn(move || {
                if w == 0 {
                    return None;
                }
                let b = w.trailing_zeros();
                w &= w - 1;
                Some(i as Rank * 64 + b)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_and_large_sets_agree() {
        for size in [1u32, 2, 63, 64, 65, 200] {
            let mut s = RankSet::empty(size);
            let picks: Vec<Rank> = (0..size).filter(|r| r % 3 == 1).collect();
            for &r in &picks {
                s.insert(r);
            }
            assert_eq!(s.iter().collect::<Vec<_>>(), picks);
            assert_eq!(s.len(), picks.len());
            for r in 0..size {
                assert_eq!(s.contains(r), r % 3 == 1);
            }
            for &r in &picks {
                s.remove(r);
            }
            assert!(s.is_empty());
            assert!(!s.contains(size + 100));
        }
    }
}
