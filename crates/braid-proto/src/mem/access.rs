//! Access rights of registered memory.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

/// Access rights of a region, combined with `|`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond being a local source of writes and sends.
    pub const NONE: Access = Access(0);
    /// braid may write into the region locally: needed as the destination of a read or a receive.
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    /// Peers may read the region.
    pub const REMOTE_READ: Access = Access(1 << 1);
    /// Peers may write the region.
    pub const REMOTE_WRITE: Access = Access(1 << 2);
    /// Peers may run atomics on the region's aligned 8-byte words.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);

    /// Every right.
    pub const fn all() -> Access {
        Access(0b1111)
    }

    /// True when every right in `other` is present in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when any remote right is present.
    pub const fn is_remote(self) -> bool {
        self.0 & (Self::REMOTE_READ.0 | Self::REMOTE_WRITE.0 | Self::REMOTE_ATOMIC.0) != 0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            write!(f, "NONE")
        } else {
            write!(f, "{}", set.join("|"))
        }
    }
}
