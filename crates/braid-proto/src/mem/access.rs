//! Access rights of registered memory.

use std::fmt;

bitflags::bitflags! {
    /// Access rights of a region, combined with `|`.
    #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// braid may write into the region locally: needed as the destination of a read or
        /// a receive.
        const LOCAL_WRITE = 1 << 0;
        /// Peers may read the region.
        const REMOTE_READ = 1 << 1;
        /// Peers may write the region.
        const REMOTE_WRITE = 1 << 2;
        /// Peers may run atomics on the region's aligned 8-byte words.
        const REMOTE_ATOMIC = 1 << 3;
    }
}

impl Access {
    /// No rights beyond being a local source of writes and sends.
    pub const NONE: Access = Access::empty();

    /// True when any remote right is present.
    pub const fn is_remote(self) -> bool {
        self.intersects(
            Access::REMOTE_READ
                .union(Access::REMOTE_WRITE)
                .union(Access::REMOTE_ATOMIC),
        )
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
