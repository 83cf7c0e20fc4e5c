//! Generation-checked `int` handles (queues and memory registrations).

/// A table of generation-checked `int` handles: `(generation << 16) | index`, always
/// `>= 0x10000`, so a stale handle (its slot reused) or a small integer is never taken for
/// a live one.
pub(crate) struct Table<T> {
    slots: Vec<(u16, Option<T>)>,
    free: Vec<u32>,
}

impl<T> Table<T> {
    const MAX: usize = 0x1_0000;

    pub(crate) fn new() -> Self {
        Table {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Store `v`; its handle, or `None` when all 65536 slots are taken.
    pub(crate) fn insert(&mut self, v: T) -> Option<i32> {
        let idx = match self.free.pop() {
            Some(i) => i as usize,
            None if self.slots.len() < Self::MAX => {
                self.slots.push((0, None));
                self.slots.len() - 1
            }
            None => return None,
        };
        let slot = &mut self.slots[idx];
        slot.0 = if slot.0 >= 0x7fff { 1 } else { slot.0 + 1 };
        slot.1 = Some(v);
        Some(((slot.0 as i32) << 16) | idx as i32)
    }

    fn index(h: i32) -> Option<(usize, u16)> {
        if h < 0x1_0000 {
            return None;
        }
        Some(((h & 0xffff) as usize, (h >> 16) as u16))
    }

    pub(crate) fn get(&self, h: i32) -> Option<&T> {
        let (i, g) = Self::index(h)?;
        match self.slots.get(i) {
            Some((generation, Some(v))) if *generation == g => Some(v),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, h: i32) -> Option<&mut T> {
        let (i, g) = Self::index(h)?;
        match self.slots.get_mut(i) {
            Some((generation, Some(v))) if *generation == g => Some(v),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, h: i32) -> Option<T> {
        let (i, g) = Self::index(h)?;
        match self.slots.get_mut(i) {
            Some((generation, v @ Some(_))) if *generation == g => {
                self.free.push(i as u32);
                v.take()
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_checked() {
        let mut t = Table::new();
        let a = t.insert("a").unwrap();
        let b = t.insert("b").unwrap();
        assert!(a >= 0x1_0000 && b >= 0x1_0000 && a != b);
        assert_eq!(t.get(a), Some(&"a"));
        for bad in [-1, 0, 1, a & 0xffff, a + (1 << 16), i32::MAX] {
            assert!(t.get(bad).is_none(), "{bad:#x}");
        }
        *t.get_mut(b).unwrap() = "B";
        assert_eq!(t.remove(b), Some("B"));
        assert_eq!(t.remove(b), None);
        // The slot comes back with a new generation: the old handle stays dead.
        let c = t.insert("c").unwrap();
        assert_eq!(c & 0xffff, b & 0xffff);
        assert_ne!(c, b);
        assert!(t.get(b).is_none());
        assert_eq!(t.get(c), Some(&"c"));
    }

    #[test]
    fn full_table_and_generation_wrap() {
        let mut t = Table::new();
        let hs: Vec<i32> = (0..Table::<u8>::MAX)
            .map(|_| t.insert(0u8).unwrap())
            .collect();
        assert!(t.insert(0).is_none());
        t.remove(hs[7]).unwrap();
        let mut h = t.insert(1).unwrap();
        // Cycle one slot through every generation: handles stay positive and distinct from
        // the previous one.
        for _ in 0..0x8000 {
            t.remove(h).unwrap();
            let n = t.insert(1).unwrap();
            assert!(n >= 0x1_0000);
            assert_ne!(n, h);
            h = n;
        }
    }
}
