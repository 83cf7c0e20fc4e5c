//! The home side: the directory entry of each page homed here and the queue of requests
//! waiting for it. One request per page is served at a time; it ends with the requester's
//! `Confirm`, and only then is the directory updated and the next request started.

use super::{Busy, DirEntry, Msg, Node, PageId, Payload, ProtoError, Rank, RankSet, Request};

impl Node {
    pub(super) fn dir_entry(&self, page: PageId) -> DirEntry {
        self.dir.get(&page).cloned().unwrap_or_else(|| DirEntry {
            owner: self.rank,
            copyset: RankSet::single(self.size, self.rank),
        })
    }

    pub(super) fn home_request(
        &mut self,
        req: Request,
        page: PageId,
        msg: Msg,
    ) -> Result<(), ProtoError> {
        let b = self.busy.entry(page).or_default();
        if b.current.is_some() {
            // The rank being served may already ask again (its `Confirm` can still be on
            // the way when messages of a pair are not delivered in order), but a rank
            // never has two requests for a page waiting.
            if b.queue.iter().any(|q| q.from == req.from) {
                return Err(ProtoError::Unexpected {
                    from: req.from,
                    msg,
                    why: "a second queued request for the page from the same rank",
                });
            }
            b.queue.push_back(req);
            return Ok(());
        }
        self.start(page, req, msg)
    }

    fn start(&mut self, page: PageId, req: Request, msg: Msg) -> Result<(), ProtoError> {
        let d = self.dir_entry(page);
        let Request { from, write, slot } = req;
        if !write {
            if d.copyset.contains(from) {
                return Err(ProtoError::Unexpected {
                    from,
                    msg,
                    why: "read request from a rank that holds a copy",
                });
            }
            self.busy.entry(page).or_default().current = Some(req);
            self.send(
                d.owner,
                Msg::FwdRead {
                    page,
                    to: from,
                    slot,
                },
            );
            return Ok(());
        }
        self.busy.entry(page).or_default().current = Some(req);
        let mut acks = 0;
        for r in d.copyset.iter().filter(|&r| r != from && r != d.owner) {
            self.send(r, Msg::Invalidate { page, ack_to: from });
            acks += 1;
        }
        if d.owner == from {
            self.send(
                from,
                Msg::Grant {
                    page,
                    write: true,
                    acks,
                    payload: Payload::None,
                },
            );
        } else {
            self.send(
                d.owner,
                Msg::FwdWrite {
                    page,
                    to: from,
                    slot,
                    acks,
                    data: !d.copyset.contains(from),
                },
            );
        }
        Ok(())
    }

    pub(super) fn home_confirm(
        &mut self,
        from: Rank,
        page: PageId,
        msg: Msg,
    ) -> Result<(), ProtoError> {
        let current = self.busy.get(&page).and_then(|b| b.current);
        let Some(req) = current.filter(|r| r.from == from) else {
            return Err(ProtoError::Unexpected {
                from,
                msg,
                why: "no request of this rank is being served",
            });
        };
        let mut d = self.dir_entry(page);
        if req.write {
            d = DirEntry {
                owner: from,
                copyset: RankSet::single(self.size, from),
            };
        } else {
            d.copyset.insert(from);
        }
        self.dir.insert(page, d);
        let b: &mut Busy = self.busy.get_mut(&page).expect("checked above");
        b.current = None;
        match b.queue.pop_front() {
            Some(next) => self.start(page, next, msg),
            None => {
                self.busy.remove(&page);
                Ok(())
            }
        }
    }
}
