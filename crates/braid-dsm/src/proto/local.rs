//! The rank-local side of the protocol: faults, requests in flight, and serving the home's
//! forwards and invalidations for the copies this rank holds.

use super::{
    Access, Action, Msg, Node, PageId, Payload, Pending, ProtoError, Rank, Source, ZERO_AROUND,
};

impl Node {
    /// Fault-around for first touches at the home: installs zeros (writable) in the pages
    /// after `page`, up to [`ZERO_AROUND`] in all, while they are in the same allocation,
    /// homed here and untouched (virgin, writable here alone, no request for them at the
    /// home). Installing them is exactly what their own first touch would do, one fault
    /// each, so a rank initialising its block takes one fault per `ZERO_AROUND` pages.
    fn zero_around(&mut self, page: PageId) {
        let Some((first, _)) = self.alloc_of(page) else {
            return;
        };
        for p in page + 1..page + ZERO_AROUND {
            let untouched = self.alloc_of(p).is_some_and(|(f, _)| f == first)
                && self.home_of(p) == Some(self.rank)
                && !self.local.contains_key(&p)
                && !self.pending.contains_key(&p)
                && self
                    .busy
                    .get(&p)
                    .is_none_or(|b| b.current.is_none() && b.queue.is_empty());
            if !untouched {
                return;
            }
            self.set_page(p, Access::Write, false);
            self.actions.push_back(Action::Install {
                page: p,
                write: true,
                source: Source::Zero,
            });
        }
    }

    pub(super) fn fault(&mut self, page: PageId, write: bool) {
        let lp = self.page(page);
        let needed = if write { Access::Write } else { Access::Read };
        if lp.access >= needed {
            if lp.virgin {
                // The home's first touch of a page nobody has written: zeros, locally.
                self.set_page(page, lp.access, false);
                self.actions.push_back(Action::Install {
                    page,
                    write: lp.access == Access::Write,
                    source: Source::Zero,
                });
                if lp.access == Access::Write {
                    self.zero_around(page);
                }
            } else {
                self.actions.push_back(Action::Wake { page });
            }
            return;
        }
        if self.pending.contains_key(&page) {
            // A request is in flight. Its install wakes every waiter; one that needs more
            // (a write after a read grant) faults again then.
            return;
        }
        let Some(slot) = self.free_slots.pop() else {
            match self.deferred.iter_mut().find(|(p, _)| *p == page) {
                Some(d) => d.1 |= write,
                None => self.deferred.push_back((page, write)),
            }
            return;
        };
        self.pending.insert(
            page,
            Pending {
                write,
                slot,
                grant: None,
                acks: 0,
            },
        );
        let home = self.home_of(page).expect("checked by the caller");
        let msg = if write {
            Msg::WriteReq { page, slot }
        } else {
            Msg::ReadReq { page, slot }
        };
        self.send(home, msg);
    }

    /// The owner serves a read: keep a read-only copy, send one to `to`.
    pub(super) fn serve_read(
        &mut self,
        from: Rank,
        page: PageId,
        to: Rank,
        slot: u32,
        msg: Msg,
    ) -> Result<(), ProtoError> {
        if Some(from) != self.home_of(page) {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "forward not from the page's home",
            });
        }
        let lp = self.page(page);
        if lp.access == Access::None || to == self.rank {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "this rank holds no copy to forward, or is the requester",
            });
        }
        if lp.access == Access::Write && !lp.virgin {
            self.actions.push_back(Action::Protect { page });
        }
        self.set_page(page, Access::Read, lp.virgin);
        if lp.virgin {
            let payload = Payload::Zero;
            let (write, acks) = (false, 0);
            self.send(
                to,
                Msg::Grant {
                    page,
                    write,
                    acks,
                    payload,
                },
            );
        } else {
            let msg = Msg::Grant {
                page,
                write: false,
                acks: 0,
                payload: Payload::Data,
            };
            self.actions.push_back(Action::SendPage {
                to,
                slot,
                msg,
                drop: false,
            });
        }
        Ok(())
    }

    /// The owner gives the page up to writer `to`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve_write(
        &mut self,
        from: Rank,
        page: PageId,
        to: Rank,
        slot: u32,
        acks: u32,
        data: bool,
        msg: Msg,
    ) -> Result<(), ProtoError> {
        if Some(from) != self.home_of(page) {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "forward not from the page's home",
            });
        }
        let lp = self.page(page);
        if lp.access == Access::None || to == self.rank || acks >= self.size {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "this rank holds no copy to give up, is the requester, or too many acks",
            });
        }
        if data && !lp.virgin {
            if lp.access == Access::Write {
                // Stop local writers before the snapshot.
                self.actions.push_back(Action::Protect { page });
            }
            let msg = Msg::Grant {
                page,
                write: true,
                acks,
                payload: Payload::Data,
            };
            // Snapshot, drop, then send: no copy may stay readable here once the new
            // writer can have it.
            self.actions.push_back(Action::SendPage {
                to,
                slot,
                msg,
                drop: true,
            });
        } else {
            if !lp.virgin {
                self.actions.push_back(Action::Drop { page });
            }
            let payload = if data { Payload::Zero } else { Payload::None };
            self.send(
                to,
                Msg::Grant {
                    page,
                    write: true,
                    acks,
                    payload,
                },
            );
        }
        self.set_page(page, Access::None, false);
        Ok(())
    }

    /// A reader drops its copy for writer `ack_to`.
    pub(super) fn invalidate(
        &mut self,
        from: Rank,
        page: PageId,
        ack_to: Rank,
        msg: Msg,
    ) -> Result<(), ProtoError> {
        let lp = self.page(page);
        if Some(from) != self.home_of(page) || lp.access != Access::Read || ack_to == self.rank {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "invalidation not from the home, of a copy that is not read-only, or to self",
            });
        }
        if !lp.virgin {
            self.actions.push_back(Action::Drop { page });
        }
        self.set_page(page, Access::None, false);
        self.send(ack_to, Msg::InvAck { page });
        Ok(())
    }

    pub(super) fn inv_ack(&mut self, from: Rank, page: PageId, msg: Msg) -> Result<(), ProtoError> {
        match self.pending.get_mut(&page) {
            Some(p) if p.write && p.acks < self.size => p.acks += 1,
            _ => {
                return Err(ProtoError::Unexpected {
                    from,
                    msg,
                    why: "no write request of this rank waits for acknowledgements",
                });
            }
        }
        self.try_complete(page, from, msg)
    }

    pub(super) fn grant(
        &mut self,
        from: Rank,
        page: PageId,
        g: (bool, u32, Payload),
        msg: Msg,
    ) -> Result<(), ProtoError> {
        let lp = self.page(page);
        let (write, acks, payload) = g;
        let ok = match self.pending.get(&page) {
            Some(p) => {
                p.grant.is_none()
                    && p.write == write
                    && (write || (acks == 0 && payload != Payload::None))
                    && acks < self.size
                    && (payload != Payload::None || lp.access == Access::Read)
            }
            None => false,
        };
        if !ok {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "no matching request of this rank is in flight",
            });
        }
        if let Some(p) = self.pending.get_mut(&page) {
            p.grant = Some(g);
        }
        self.try_complete(page, from, msg)
    }

    /// Installs a granted page once the grant and every acknowledgement are in.
    fn try_complete(&mut self, page: PageId, from: Rank, msg: Msg) -> Result<(), ProtoError> {
        let p = self.pending[&page];
        let Some((write, acks, payload)) = p.grant else {
            return Ok(());
        };
        if p.acks > acks {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "more acknowledgements than the grant announced",
            });
        }
        if p.acks < acks {
            return Ok(());
        }
        self.pending.remove(&page);
        let lp = self.page(page);
        let action = match payload {
            Payload::Data => Action::Install {
                page,
                write,
                source: Source::Slot(p.slot),
            },
            Payload::Zero => Action::Install {
                page,
                write,
                source: Source::Zero,
            },
            // An upgrade of the never-written page the home still holds: zeros.
            Payload::None if lp.virgin => Action::Install {
                page,
                write,
                source: Source::Zero,
            },
            Payload::None => Action::Upgrade { page },
        };
        self.actions.push_back(action);
        let access = if write { Access::Write } else { Access::Read };
        self.set_page(page, access, false);
        self.free_slots.push(p.slot);
        let home = self.home_of(page).expect("pending pages are allocated");
        self.send(home, Msg::Confirm { page });
        // A slot is free: the oldest fault waiting for one goes now.
        if let Some((page, write)) = self.deferred.pop_front() {
            self.fault(page, write);
        }
        Ok(())
    }

    /// This rank's thread waits with `ticket` for `lock` (see [`Msg::LockWait`]).
    pub fn lock_wait(&mut self, lock: u32, ticket: u32) -> Result<(), ProtoError> {
        self.send(lock % self.size, Msg::LockWait { lock, ticket });
        self.drain_inbox()
    }

    /// This rank released `lock` and `ticket` is served next (see [`Msg::LockHandoff`]).
    pub fn lock_handoff(&mut self, lock: u32, ticket: u32) -> Result<(), ProtoError> {
        self.send(lock % self.size, Msg::LockHandoff { lock, ticket });
        self.drain_inbox()
    }
}
