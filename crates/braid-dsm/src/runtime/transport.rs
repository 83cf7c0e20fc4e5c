//! braid resources of one rank and the posting of messages and pages.
//!
//! * Control messages: `send` of [`MSG_LEN`] bytes from a ring of registered slots into
//!   receives the peer keeps posted ([`RECV_DEPTH`] per peer).
//! * Page data: one `write_with_imm` of the grant header and the page into the requester's
//!   staging slot (named by the request), immediate = slot number. The page is copied into
//!   a registered send slot first, so braid never reads the shared range itself (a page it
//!   read could be dropped, and a missing page would block braid's engine on a fault only
//!   the service thread can resolve).
//! * Lock words: a registered table of 8-byte ticket words per rank, driven with braid's
//!   `fetch_add` by the application threads.
//!
//! Whatever cannot be posted at once (no free slot, a full queue) waits in an outbox, in
//! order, and goes out as completions free room.

use std::collections::VecDeque;
use std::sync::Arc;

use braid::{Access, Context, Error as BraidError, Region, RegionOptions, RemoteKey};
use braid_boot::World;

use crate::error::DsmError;
use crate::proto::{MSG_LEN, Msg, Rank};

/// Bytes before the page in a page slot (the grant message, padded).
pub(crate) const HDR: usize = 64;
/// Receives kept posted per peer.
pub(crate) const RECV_DEPTH: usize = 256;
const CTRL_SLOTS: usize = 4096;
const PAGE_SLOTS: usize = 64;

/// Work-request id kinds (top byte).
pub(crate) const WR_RECV: u64 = 1;
pub(crate) const WR_CTRL: u64 = 2;
pub(crate) const WR_PAGE: u64 = 3;
pub(crate) const WR_ATOMIC: u64 = 4;

pub(crate) fn wr(kind: u64, a: u64) -> u64 {
    kind << 56 | a
}

/// A rank's registered regions, as its peers reach them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Keys {
    pub staging: RemoteKey,
    pub locks: RemoteKey,
}

impl Keys {
    pub(crate) fn to_bytes(self) -> Vec<u8> {
        [self.staging.to_bytes(), self.locks.to_bytes()].concat()
    }
    pub(crate) fn from_bytes(b: &[u8]) -> Option<Keys> {
        Some(Keys {
            staging: RemoteKey::from_bytes(b.get(..16)?)?,
            locks: RemoteKey::from_bytes(b.get(16..32)?)?,
        })
    }
}

enum Out {
    Ctrl {
        to: Rank,
        bytes: [u8; MSG_LEN],
    },
    Page {
        to: Rank,
        slot: u32,
        bytes: Box<[u8]>,
    },
}

/// A page copied out of the shared range, ready to send.
pub(crate) enum Snapshot {
    InSlot(u32),
    Boxed(Box<[u8]>),
}

pub(crate) struct Transport {
    pub world: Arc<World>,
    rank: Rank,
    page: usize,
    slot_len: usize,
    recv: Region,
    ctrl: Region,
    ctrl_free: Vec<u32>,
    pages: Region,
    pages_free: Vec<u32>,
    pub staging: Region,
    pub locks: Region,
    pub peers: Vec<Keys>,
    outbox: VecDeque<Out>,
    /// Page-data bytes posted to each peer.
    pub page_bytes: Vec<u64>,
}

fn posted(r: Result<(), BraidError>, to: Rank) -> Result<bool, DsmError> {
    match r {
        Ok(()) => Ok(true),
        Err(BraidError::QueueFull { .. }) => Ok(false),
        Err(e) => Err(DsmError::Failed(format!("rank {to}: {e}"))),
    }
}

impl Transport {
    /// Allocates and registers the regions. Peers' keys are filled in later.
    pub(crate) fn new(
        ctx: &Context,
        world: Arc<World>,
        slots: u32,
        lock_words: usize,
        page: usize,
    ) -> Result<Transport, DsmError> {
        let size = world.size();
        let slot_len = HDR + page;
        let populated = RegionOptions {
            populate: true,
            ..RegionOptions::default()
        };
        let recv =
            ctx.alloc_region_with(size * RECV_DEPTH * MSG_LEN, Access::LOCAL_WRITE, populated)?;
        let ctrl = ctx.alloc_region_with(CTRL_SLOTS * MSG_LEN, Access::NONE, populated)?;
        let pages = ctx.alloc_region_with(PAGE_SLOTS * slot_len, Access::NONE, populated)?;
        let staging = ctx.alloc_region_with(
            slots as usize * slot_len,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            populated,
        )?;
        let locks = ctx.alloc_region_with(
            lock_words.max(1) * 8,
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            populated,
        )?;
        Ok(Transport {
            rank: world.rank() as Rank,
            world,
            page,
            slot_len,
            recv,
            ctrl,
            ctrl_free: (0..CTRL_SLOTS as u32).rev().collect(),
            pages,
            pages_free: (0..PAGE_SLOTS as u32).rev().collect(),
            staging,
            locks,
            peers: Vec::new(),
            outbox: VecDeque::new(),
            page_bytes: vec![0; size],
        })
    }

    pub(crate) fn keys(&self) -> Keys {
        Keys {
            staging: self.staging.remote_key(),
            locks: self.locks.remote_key(),
        }
    }

    fn ep(&self, to: Rank) -> Result<&braid::Endpoint, DsmError> {
        self.world
            .endpoint(to as usize)
            .ok_or_else(|| DsmError::Failed(format!("no endpoint to rank {to}")))
    }

    /// Posts every peer's receives.
    pub(crate) fn post_receives(&self) -> Result<(), DsmError> {
        for peer in 0..self.world.size() as Rank {
            if peer != self.rank {
                for i in 0..RECV_DEPTH {
                    self.repost(peer, i)?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn repost(&self, peer: Rank, i: usize) -> Result<(), DsmError> {
        let off = (peer as usize * RECV_DEPTH + i) * MSG_LEN;
        let sge = self.recv.slice(off, MSG_LEN)?;
        self.ep(peer)?
            .post_recv(wr(WR_RECV, (peer as u64) << 20 | i as u64), &[sge])
            .map_err(|e| DsmError::Failed(format!("rank {peer}: posting a receive: {e}")))
    }

    /// The message in receive `i` of `peer`.
    pub(crate) fn received(&self, peer: Rank, i: usize) -> Result<[u8; MSG_LEN], DsmError> {
        let mut b = [0u8; MSG_LEN];
        self.recv
            .read_at((peer as usize * RECV_DEPTH + i) * MSG_LEN, &mut b)?;
        Ok(b)
    }

    /// The grant header in staging slot `slot`.
    pub(crate) fn staged_header(&self, slot: u32) -> Result<[u8; MSG_LEN], DsmError> {
        let mut b = [0u8; MSG_LEN];
        self.staging
            .read_at(slot as usize * self.slot_len, &mut b)?;
        Ok(b)
    }

    /// The page data in staging slot `slot`.
    pub(crate) fn staged_page(&self, slot: u32) -> *const u8 {
        // SAFETY: slot numbers are checked against the region by the caller (core slots
        // are below the configured count); only the pointer is formed here.
        unsafe {
            self.staging
                .as_mut_ptr()
                .add(slot as usize * self.slot_len + HDR)
        }
    }

    /// Sends a control message.
    pub(crate) fn send(&mut self, to: Rank, msg: &Msg) -> Result<(), DsmError> {
        let bytes = msg.encode();
        if self.outbox.is_empty() && self.try_ctrl(to, &bytes)? {
            return Ok(());
        }
        self.outbox.push_back(Out::Ctrl { to, bytes });
        Ok(())
    }

    fn try_ctrl(&mut self, to: Rank, bytes: &[u8; MSG_LEN]) -> Result<bool, DsmError> {
        let Some(i) = self.ctrl_free.pop() else {
            return Ok(false);
        };
        let off = i as usize * MSG_LEN;
        self.ctrl.write_at(off, bytes)?;
        let sge = self.ctrl.slice(off, MSG_LEN)?;
        if posted(self.ep(to)?.send(wr(WR_CTRL, i as u64), &[sge]), to)? {
            Ok(true)
        } else {
            self.ctrl_free.push(i);
            Ok(false)
        }
    }

    /// Copies the page at `src` and the grant `msg` into a send slot (or a buffer when none
    /// is free). The caller may discard the page afterwards.
    pub(crate) fn snapshot(&mut self, msg: &Msg, src: *const u8) -> Result<Snapshot, DsmError> {
        let hdr = msg.encode();
        if let Some(i) = self.pages_free.pop() {
            let off = i as usize * self.slot_len;
            self.pages.write_at(off, &hdr)?;
            // SAFETY: `src` is a present page of the shared range (the core's invariant:
            // only pages this rank holds are snapshotted), `page` bytes long.
            let page = unsafe { std::slice::from_raw_parts(src, self.page) };
            self.pages.write_at(off + HDR, page)?;
            return Ok(Snapshot::InSlot(i));
        }
        let mut b = vec![0u8; self.slot_len].into_boxed_slice();
        b[..MSG_LEN].copy_from_slice(&hdr);
        // SAFETY: as above.
        b[HDR..].copy_from_slice(unsafe { std::slice::from_raw_parts(src, self.page) });
        Ok(Snapshot::Boxed(b))
    }

    /// Sends a snapshot into staging slot `slot` of `to`.
    pub(crate) fn send_page(
        &mut self,
        to: Rank,
        slot: u32,
        snap: Snapshot,
    ) -> Result<(), DsmError> {
        match snap {
            Snapshot::InSlot(i) if self.outbox.is_empty() => {
                if !self.try_page(to, slot, i)? {
                    let bytes = self.slot_bytes(i)?;
                    self.pages_free.push(i);
                    self.outbox.push_back(Out::Page { to, slot, bytes });
                }
            }
            Snapshot::InSlot(i) => {
                let bytes = self.slot_bytes(i)?;
                self.pages_free.push(i);
                self.outbox.push_back(Out::Page { to, slot, bytes });
            }
            Snapshot::Boxed(bytes) => self.outbox.push_back(Out::Page { to, slot, bytes }),
        }
        Ok(())
    }

    fn slot_bytes(&self, i: u32) -> Result<Box<[u8]>, DsmError> {
        Ok(self
            .pages
            .to_vec(i as usize * self.slot_len, self.slot_len)?
            .into_boxed_slice())
    }

    fn try_page(&mut self, to: Rank, slot: u32, i: u32) -> Result<bool, DsmError> {
        let key = self
            .peers
            .get(to as usize)
            .ok_or_else(|| DsmError::Failed(format!("no keys of rank {to}")))?
            .staging;
        let remote_off = slot as u64 * self.slot_len as u64;
        if remote_off + self.slot_len as u64 > key.len {
            return Err(DsmError::Failed(format!(
                "rank {to} asked for data into staging slot {slot}, beyond its region"
            )));
        }
        let sge = self
            .pages
            .slice(i as usize * self.slot_len, self.slot_len)?;
        let ep = self.ep(to)?;
        let r = ep.write_with_imm(wr(WR_PAGE, i as u64), &[sge], &key, remote_off, slot);
        let ok = posted(r, to)?;
        if ok {
            self.page_bytes[to as usize] += self.page as u64;
        }
        Ok(ok)
    }

    /// A send of kind `kind` and slot `i` completed: its slot is free.
    pub(crate) fn sent(&mut self, kind: u64, i: u32) {
        match kind {
            WR_CTRL => self.ctrl_free.push(i),
            _ => self.pages_free.push(i),
        }
    }

    /// Posts what waits in the outbox, in order, while there is room.
    pub(crate) fn flush(&mut self) -> Result<(), DsmError> {
        while let Some(out) = self.outbox.pop_front() {
            let ok = match &out {
                Out::Ctrl { to, bytes } => self.try_ctrl(*to, bytes)?,
                Out::Page { to, slot, bytes } => match self.pages_free.pop() {
                    Some(i) => {
                        self.pages.write_at(i as usize * self.slot_len, bytes)?;
                        let ok = self.try_page(*to, *slot, i)?;
                        if !ok {
                            self.pages_free.push(i);
                        }
                        ok
                    }
                    None => false,
                },
            };
            if !ok {
                self.outbox.push_front(out);
                break;
            }
        }
        Ok(())
    }

    pub(crate) fn outbox_len(&self) -> usize {
        self.outbox.len()
    }
}
