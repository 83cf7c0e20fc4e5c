//! The home side of a lock: matches waiters (who hold a ticket from the lock word's atomic
//! `fetch_add`) with hand-offs (the releaser's word says the ticket is served), whichever
//! of the two messages arrives first. The ticket word itself lives in registered memory at
//! the home and is driven with braid atomics by the runtime.

use std::collections::HashMap;

use super::Rank;

#[derive(Debug, Default)]
struct LockState {
    /// Ticket -> rank waiting with it.
    waiting: HashMap<u32, Rank>,
    /// Tickets already served whose waiter has not announced itself yet.
    served: Vec<u32>,
}

#[derive(Debug, Default)]
pub(super) struct LockHome {
    locks: HashMap<u32, LockState>,
}

impl LockHome {
    /// `rank` waits with `ticket`; returns the rank to grant to if the ticket is served.
    pub(super) fn wait(
        &mut self,
        lock: u32,
        ticket: u32,
        rank: Rank,
    ) -> Result<Option<Rank>, &'static str> {
        let st = self.locks.entry(lock).or_default();
        if let Some(i) = st.served.iter().position(|&t| t == ticket) {
            st.served.swap_remove(i);
            self.tidy(lock);
            return Ok(Some(rank));
        }
        if st.waiting.insert(ticket, rank).is_some() {
            return Err("two waiters with one ticket");
        }
        Ok(None)
    }

    /// `ticket` is served; returns its waiter if it has announced itself.
    pub(super) fn handoff(&mut self, lock: u32, ticket: u32) -> Result<Option<Rank>, &'static str> {
        let st = self.locks.entry(lock).or_default();
        if let Some(r) = st.waiting.remove(&ticket) {
            self.tidy(lock);
            return Ok(Some(r));
        }
        if st.served.contains(&ticket) {
            return Err("a ticket served twice");
        }
        st.served.push(ticket);
        Ok(None)
    }

    fn tidy(&mut self, lock: u32) {
        if self
            .locks
            .get(&lock)
            .is_some_and(|s| s.waiting.is_empty() && s.served.is_empty())
        {
            self.locks.remove(&lock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_and_handoff_meet_in_either_order() {
        let mut h = LockHome::default();
        assert_eq!(h.wait(1, 5, 3), Ok(None));
        assert_eq!(h.handoff(1, 5), Ok(Some(3)));
        assert_eq!(h.handoff(1, 6), Ok(None));
        assert_eq!(h.wait(1, 6, 2), Ok(Some(2)));
        assert!(h.locks.is_empty());
        assert_eq!(h.wait(1, 7, 2), Ok(None));
        assert!(h.wait(1, 7, 4).is_err());
        assert_eq!(h.handoff(2, 1), Ok(None));
        assert!(h.handoff(2, 1).is_err());
    }
}
