//! The DSM protocol as a sans-IO state machine: events in, actions out.
//!
//! A [`Node`] is one rank's whole protocol state: the access it holds to each page, its
//! requests in flight, and, for the pages it is the home of, the directory entry (owner and
//! copy set) with the queue of requests waiting for the page. It is fed page faults
//! ([`Node::on_fault`]) and messages ([`Node::on_message`]) and drained of [`Action`]s
//! ([`Node::poll_action`]): messages to send, pages to install, write-protect or drop,
//! threads to wake. It owns no memory, sockets, threads or clock, so the simulator in
//! `tests/proto_sim.rs` drives it exactly as the runtime does.
//!
//! The protocol is IVY's fixed distributed manager with single writer / multiple readers,
//! described with its consistency argument in the repository's `docs/DSM.md`:
//!
//! * read fault: requester -> home `ReadReq`; home -> owner `FwdRead` (local when the home
//!   owns the page); owner write-protects its copy and sends `Grant{read, data}` to the
//!   requester; requester installs and sends `Confirm` to the home.
//! * write fault: requester -> home `WriteReq`; home -> every other holder `Invalidate`
//!   (acknowledged to the requester) and -> owner `FwdWrite` (the owner drops its copy and
//!   sends `Grant{write, acks = n}` with data unless the requester holds a current copy);
//!   the requester installs after the grant and `n` acknowledgements, then `Confirm`s.
//! * The home serves one request per page at a time; later ones queue until the `Confirm`.
//!   So at most one transaction per page is in flight, and each decision is taken on an
//!   exact directory entry.

mod home;
mod local;
mod lock;
pub mod msg;
mod rankset;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};

pub use msg::{DecodeError, MSG_LEN, Msg, Payload};
pub use rankset::RankSet;

/// A process of the group, `0..size`.
pub type Rank = u32;
/// A page of the global range, counted from its start.
pub type PageId = u64;

/// What a rank may do with its copy of a page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// No copy: any access faults.
    None,
    /// A read-only copy: writes fault.
    Read,
    /// The only copy, writable.
    Write,
}

/// How the pages of an allocation are given homes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HomePolicy {
    /// Contiguous blocks: the first `1/size` of the pages at rank 0, and so on.
    Block,
    /// Round robin: page `i` of the allocation at rank `i % size`.
    Cyclic,
}

/// Where installed contents come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The data that arrived in this staging slot.
    Slot(u32),
    /// A page of zeros (never written).
    Zero,
}

/// What the driver must do, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `msg` to rank `to` (never this rank).
    Send {
        /// Destination.
        to: Rank,
        /// The message.
        msg: Msg,
    },
    /// Send `msg` (a [`Msg::Grant`] with [`Payload::Data`]) together with a snapshot of the
    /// local page, taken now, into staging slot `slot` of rank `to`. With `drop`, discard
    /// the local copy after the snapshot and *before* sending: once the grant can arrive,
    /// no stale copy may be readable here.
    SendPage {
        /// Destination.
        to: Rank,
        /// The destination's staging slot.
        slot: u32,
        /// The grant.
        msg: Msg,
        /// Discard the local copy between snapshot and send.
        drop: bool,
    },
    /// Map the page (absent until now) with the given contents, writable or read-only,
    /// and wake the threads waiting on it. The staging slot is free again afterwards.
    Install {
        /// The page.
        page: PageId,
        /// Writable rather than read-only.
        write: bool,
        /// Its contents.
        source: Source,
    },
    /// Make the (present, read-only) page writable and wake the threads waiting on it.
    Upgrade {
        /// The page.
        page: PageId,
    },
    /// Make the (present, writable) page read-only: later writes fault.
    Protect {
        /// The page.
        page: PageId,
    },
    /// Discard the local copy: later accesses fault.
    Drop {
        /// The page.
        page: PageId,
    },
    /// Wake threads waiting on the page (a fault that was already resolved).
    Wake {
        /// The page.
        page: PageId,
    },
    /// The local thread waiting with `ticket` now holds lock `lock`.
    LockGranted {
        /// The lock.
        lock: u32,
        /// The ticket.
        ticket: u32,
    },
}

/// A peer, or this rank's driver, broke the protocol. The node must not be used further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A page outside every allocation.
    #[error("page {page} is outside every allocation")]
    UnknownPage {
        /// The page.
        page: PageId,
    },
    /// A message this rank should not have received now.
    #[error("unexpected {msg:?} from rank {from}: {why}")]
    Unexpected {
        /// Sender.
        from: Rank,
        /// The message.
        msg: Msg,
        /// What was wrong.
        why: &'static str,
    },
    /// A rank number outside the group.
    #[error("rank {0} is outside the group")]
    BadRank(Rank),
    /// An allocation request that overlaps, is empty, or is not known.
    #[error("allocation error: {0}")]
    Allocation(String),
}

/// Settings of a [`Node`].
#[derive(Clone, Copy, Debug)]
pub struct NodeConfig {
    /// This rank.
    pub rank: Rank,
    /// Ranks in the group.
    pub size: u32,
    /// Staging slots for incoming pages: at most this many requests in flight at once;
    /// further faults wait for a slot.
    pub slots: u32,
}

#[derive(Clone, Copy, Debug)]
struct Allocation {
    pages: u64,
    policy: HomePolicy,
}

/// Pages a home's first touch of an untouched page of its own installs (zeros, writable):
/// that page and up to this many minus one after it that are untouched too (the
/// fault-around of first touches; 128 KiB with 4 KiB pages). A rank initialising the
/// block homed at it then takes one fault per this many pages instead of one per page.
pub const ZERO_AROUND: u64 = 32;

/// This rank's copy of a page. Pages without an entry are `Invalid`, except at their home,
/// where they start as the owner's writable copy that has never been written (`virgin`:
/// not present in memory, contents zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LocalPage {
    access: Access,
    virgin: bool,
}

/// A request of this rank in flight.
#[derive(Clone, Copy, Debug)]
struct Pending {
    write: bool,
    slot: u32,
    /// The grant, once it arrived: (write, acks to wait for, payload).
    grant: Option<(bool, u32, Payload)>,
    acks: u32,
}

/// Directory entry at the home. Pages without an entry are owned by the home, which holds
/// the only copy.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DirEntry {
    owner: Rank,
    copyset: RankSet,
}

/// A request as the home queues it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Request {
    from: Rank,
    write: bool,
    slot: u32,
}

/// The request the home is serving for a page, and those waiting behind it.
#[derive(Debug, Default)]
struct Busy {
    current: Option<Request>,
    queue: VecDeque<Request>,
}

/// One rank's protocol state. See the module documentation.
#[derive(Debug)]
pub struct Node {
    rank: Rank,
    size: u32,
    allocs: BTreeMap<PageId, Allocation>,
    local: HashMap<PageId, LocalPage>,
    pending: HashMap<PageId, Pending>,
    /// Faults waiting for a staging slot: (page, write).
    deferred: VecDeque<(PageId, bool)>,
    free_slots: Vec<u32>,
    dir: HashMap<PageId, DirEntry>,
    busy: HashMap<PageId, Busy>,
    locks: lock::LockHome,
    /// Messages to this rank itself, handled before the current call returns.
    inbox: VecDeque<Msg>,
    actions: VecDeque<Action>,
}

/// A snapshot of one page's state at one rank, for checks and diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageView {
    /// The rank's access.
    pub access: Access,
    /// Whether the rank's copy is the never-written page not yet in memory.
    pub virgin: bool,
    /// The request of this rank in flight, if any: `Some(true)` for a write.
    pub pending_write: Option<bool>,
    /// At the page's home: (owner, copy set, whether a request is being served, queued).
    pub directory: Option<(Rank, RankSet, bool, usize)>,
}

impl Node {
    /// A node with no allocations.
    pub fn new(cfg: NodeConfig) -> Node {
        assert!(
            cfg.size >= 1 && cfg.rank < cfg.size,
            "rank within the group"
        );
        assert!(cfg.slots >= 1, "at least one staging slot");
        Node {
            rank: cfg.rank,
            size: cfg.size,
            allocs: BTreeMap::new(),
            local: HashMap::new(),
            pending: HashMap::new(),
            deferred: VecDeque::new(),
            free_slots: (0..cfg.slots).rev().collect(),
            dir: HashMap::new(),
            busy: HashMap::new(),
            locks: lock::LockHome::default(),
            inbox: VecDeque::new(),
            actions: VecDeque::new(),
        }
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Adds the allocation of pages `first..first + pages`, with homes by `policy`. Every
    /// rank adds the same allocations in the same order.
    pub fn add_allocation(
        &mut self,
        first: PageId,
        pages: u64,
        policy: HomePolicy,
    ) -> Result<(), ProtoError> {
        let end = first
            .checked_add(pages)
            .filter(|_| pages > 0)
            .ok_or_else(|| ProtoError::Allocation(format!("bad page range {first}+{pages}")))?;
        let overlaps_before = self.alloc_of(first).is_some();
        let overlaps_after = self.allocs.range(first..end).next().is_some();
        if overlaps_before || overlaps_after {
            return Err(ProtoError::Allocation(format!(
                "pages {first}..{end} overlap an allocation"
            )));
        }
        self.allocs.insert(first, Allocation { pages, policy });
        Ok(())
    }

    /// True when no request, queued fault or transaction concerns the allocation that
    /// starts at `first`, so it can be removed.
    pub fn is_quiescent(&self, first: PageId) -> bool {
        let Some(a) = self.allocs.get(&first) else {
            return true;
        };
        let inside = |p: &PageId| (first..first + a.pages).contains(p);
        !self.pending.keys().any(inside)
            && !self.deferred.iter().any(|(p, _)| inside(p))
            && !self.busy.keys().any(inside)
    }

    /// Forgets the allocation that starts at `first` and every page state in it. The driver
    /// discards the memory itself. Fails unless [`Node::is_quiescent`].
    pub fn remove_allocation(&mut self, first: PageId) -> Result<(), ProtoError> {
        let Some(a) = self.allocs.get(&first).copied() else {
            return Err(ProtoError::Allocation(format!(
                "no allocation starts at page {first}"
            )));
        };
        if !self.is_quiescent(first) {
            return Err(ProtoError::Allocation(format!(
                "allocation at page {first} still has requests in flight"
            )));
        }
        let range = first..first + a.pages;
        self.local.retain(|p, _| !range.contains(p));
        self.dir.retain(|p, _| !range.contains(p));
        self.allocs.remove(&first);
        Ok(())
    }

    fn alloc_of(&self, page: PageId) -> Option<(PageId, Allocation)> {
        let (&first, &a) = self.allocs.range(..=page).next_back()?;
        (page - first < a.pages).then_some((first, a))
    }

    /// The home of `page`, or `None` outside every allocation.
    pub fn home_of(&self, page: PageId) -> Option<Rank> {
        let (first, a) = self.alloc_of(page)?;
        let i = page - first;
        Some(match a.policy {
            HomePolicy::Block => ((i as u128 * self.size as u128) / a.pages as u128) as Rank,
            HomePolicy::Cyclic => (i % self.size as u64) as Rank,
        })
    }

    fn home(&self, page: PageId) -> Result<Rank, ProtoError> {
        self.home_of(page).ok_or(ProtoError::UnknownPage { page })
    }

    /// This rank's access to `page` (`Write` for a never-touched page at its home).
    pub fn access(&self, page: PageId) -> Access {
        self.page(page).access
    }

    /// The state of `page` at this rank, for checks.
    pub fn view(&self, page: PageId) -> PageView {
        let lp = self.page(page);
        let directory = (self.home_of(page) == Some(self.rank)).then(|| {
            let d = self.dir_entry(page);
            let b = self.busy.get(&page);
            (
                d.owner,
                d.copyset,
                b.is_some_and(|b| b.current.is_some()),
                b.map_or(0, |b| b.queue.len()),
            )
        });
        PageView {
            access: lp.access,
            virgin: lp.virgin,
            pending_write: self.pending.get(&page).map(|p| p.write),
            directory,
        }
    }

    /// The staging slot of this rank's request for `page` in flight, if any.
    pub fn pending_slot(&self, page: PageId) -> Option<u32> {
        self.pending.get(&page).map(|p| p.slot)
    }

    /// Requests in flight plus faults waiting for a staging slot.
    pub fn outstanding(&self) -> usize {
        self.pending.len() + self.deferred.len()
    }

    fn page(&self, page: PageId) -> LocalPage {
        if let Some(lp) = self.local.get(&page) {
            return *lp;
        }
        if self.home_of(page) == Some(self.rank) {
            LocalPage {
                access: Access::Write,
                virgin: true,
            }
        } else {
            LocalPage {
                access: Access::None,
                virgin: false,
            }
        }
    }

    fn set_page(&mut self, page: PageId, access: Access, virgin: bool) {
        self.local.insert(page, LocalPage { access, virgin });
    }

    /// The next action for the driver, in order.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn send(&mut self, to: Rank, msg: Msg) {
        if to == self.rank {
            self.inbox.push_back(msg);
        } else {
            self.actions.push_back(Action::Send { to, msg });
        }
    }

    /// A thread of this rank faulted on `page` (a write when `write`). Faults on pages the
    /// rank may already access only wake the thread (the fault was resolved meanwhile).
    pub fn on_fault(&mut self, page: PageId, write: bool) -> Result<(), ProtoError> {
        self.home(page)?;
        self.fault(page, write);
        self.drain_inbox()
    }

    /// A message `msg` from rank `from` (never this rank itself: those are handled inside).
    pub fn on_message(&mut self, from: Rank, msg: Msg) -> Result<(), ProtoError> {
        if from >= self.size || from == self.rank {
            return Err(ProtoError::BadRank(from));
        }
        self.dispatch(from, msg)?;
        self.drain_inbox()
    }

    fn drain_inbox(&mut self) -> Result<(), ProtoError> {
        while let Some(m) = self.inbox.pop_front() {
            self.dispatch(self.rank, m)?;
        }
        Ok(())
    }

    fn dispatch(&mut self, from: Rank, msg: Msg) -> Result<(), ProtoError> {
        let unexpected = |why| ProtoError::Unexpected { from, msg, why };
        let check_rank = |r: Rank| {
            if r < self.size {
                Ok(())
            } else {
                Err(ProtoError::BadRank(r))
            }
        };
        match msg {
            Msg::ReadReq { page, slot } | Msg::WriteReq { page, slot } => {
                if self.home(page)? != self.rank {
                    return Err(unexpected("this rank is not the page's home"));
                }
                let write = matches!(msg, Msg::WriteReq { .. });
                self.home_request(Request { from, write, slot }, page, msg)
            }
            Msg::Confirm { page } => {
                if self.home(page)? != self.rank {
                    return Err(unexpected("this rank is not the page's home"));
                }
                self.home_confirm(from, page, msg)
            }
            Msg::FwdRead { page, to, slot } => {
                self.home(page)?;
                check_rank(to)?;
                self.serve_read(from, page, to, slot, msg)
            }
            Msg::FwdWrite {
                page,
                to,
                slot,
                acks,
                data,
            } => {
                self.home(page)?;
                check_rank(to)?;
                self.serve_write(from, page, to, slot, acks, data, msg)
            }
            Msg::Invalidate { page, ack_to } => {
                self.home(page)?;
                check_rank(ack_to)?;
                self.invalidate(from, page, ack_to, msg)
            }
            Msg::InvAck { page } => {
                self.home(page)?;
                self.inv_ack(from, page, msg)
            }
            Msg::Grant {
                page,
                write,
                acks,
                payload,
            } => {
                self.home(page)?;
                self.grant(from, page, (write, acks, payload), msg)
            }
            Msg::LockWait { lock, ticket } | Msg::LockHandoff { lock, ticket } => {
                if lock % self.size != self.rank {
                    return Err(unexpected("this rank is not the lock's home"));
                }
                let grant_to = if matches!(msg, Msg::LockWait { .. }) {
                    self.locks.wait(lock, ticket, from)
                } else {
                    self.locks.handoff(lock, ticket)
                }
                .map_err(unexpected)?;
                if let Some(r) = grant_to {
                    self.send(r, Msg::LockGrant { lock, ticket });
                }
                Ok(())
            }
            Msg::LockGrant { lock, ticket } => {
                if from != lock % self.size {
                    return Err(unexpected("not from the lock's home"));
                }
                self.actions.push_back(Action::LockGranted { lock, ticket });
                Ok(())
            }
            Msg::Barrier { .. } | Msg::Gather { .. } => Err(unexpected(
                "collectives belong to the runtime, not the page protocol",
            )),
        }
    }
}
