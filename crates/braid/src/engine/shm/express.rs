//! Express requests on a same-host rail (docs/PROTOCOL.md, "Express writes"): a small write
//! travels as one record of the ring, the reader executes it as soon as it meets it, and the
//! answer goes back beside the stream, in the control page (a count of requests executed and
//! a status for each), instead of as a frame.

use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{Ordering, fence};

use braid_proto::wire::WireStatus;
use braid_proto::{EXPRESS_MAX, ExpressRequest, ExpressTo};

use super::super::transport::{ExpressExec, ExpressTake};
use super::ring::{Ctrl, EXPRESS_SLOTS};
use super::{Cur, EXPRESS, ShmLink, broken};

/// An express record's header: tag, flags, two zero bytes, the payload's length (u32), then
/// sequence number, key and address (u64 each; zero for a send), the immediate (u32) and four
/// zero bytes.
pub(super) const EXPRESS_HDR: usize = 40;
/// Flag: the request carries an immediate.
const FLAG_IMM: u8 = 1;
/// Flag: a send (into the next posted receive; key and address are zero).
const FLAG_SEND: u8 = 2;

/// What an express record adds to the stream counts that wake a sleeping reader.
fn stream_len(len: usize) -> u64 {
    len as u64 + 1
}

impl ShmLink {
    /// Writes express request `r` with its payload (`pieces`, `r.len` bytes of plain
    /// memory) as one record; false when the ring lacks room for it.
    pub(super) fn put_express(
        &self,
        r: &ExpressRequest,
        pieces: &[(*const u8, usize)],
    ) -> io::Result<bool> {
        self.check_open()?;
        let len = r.len as usize;
        debug_assert!(len <= EXPRESS_MAX);
        debug_assert_eq!(pieces.iter().map(|p| p.1).sum::<usize>(), len);
        let need = (EXPRESS_HDR + len) as u64;
        let c = self.tx.ctrl();
        let mut cur = self.txc.lock();
        let head = cur.head;
        if self.tx.cap() - self.tx.used(head, cur.tail_seen)? < need {
            cur.tail_seen = c.tail.load(Ordering::Acquire);
            if self.tx.cap() - self.tx.used(head, cur.tail_seen)? < need {
                return Ok(false);
            }
        }
        let mut h = [0u8; EXPRESS_HDR];
        h[0] = EXPRESS;
        let (rkey, addr, send) = match r.to {
            ExpressTo::Region { rkey, addr } => (rkey, addr, 0),
            ExpressTo::Receive => (0, 0, FLAG_SEND),
        };
        h[1] = if r.imm.is_some() { FLAG_IMM } else { 0 } | send;
        h[4..8].copy_from_slice(&r.len.to_le_bytes());
        h[8..16].copy_from_slice(&r.seq.to_le_bytes());
        h[16..24].copy_from_slice(&rkey.to_le_bytes());
        h[24..32].copy_from_slice(&addr.to_le_bytes());
        h[32..36].copy_from_slice(&r.imm.unwrap_or(0).to_le_bytes());
        // SAFETY: the record fits the free space at `head` (checked above).
        unsafe { self.tx.copy(head, h.as_mut_ptr(), EXPRESS_HDR, true, false) };
        let mut pos = head + EXPRESS_HDR as u64;
        for &(p, l) in pieces {
            // SAFETY: the caller's pieces are valid plain memory; they fit (checked above).
            unsafe { self.tx.copy(pos, p as *mut u8, l, true, false) };
            pos += l as u64;
        }
        cur.head = pos;
        cur.stream_head += stream_len(len);
        // Counted before the peer can see it, so that its answer never runs ahead.
        self.express_sent.fetch_add(1, Ordering::Release);
        c.head.store(pos, Ordering::Release);
        c.stream_head.store(cur.stream_head, Ordering::Release);
        fence(Ordering::SeqCst);
        self.wake_reader(c, cur.stream_head);
        Ok(true)
    }

    /// Executes the express record at the read cursor, if that is what is there, with
    /// `exec` (its status; `None`: not executable yet, the record stays for a later call).
    pub(super) fn exec_express(&self, exec: &mut ExpressExec<'_>) -> io::Result<ExpressTake> {
        let mut c = self.rxc.lock();
        if !matches!(c.cur, Cur::None) {
            return Ok(ExpressTake::Other);
        }
        let head = self.rx.ctrl().head.load(Ordering::Acquire);
        let used = self.rx.used(head, c.tail)?;
        if used == 0 {
            return Ok(if self.ended.load(Ordering::Acquire) {
                // The reader's next receive reports the end.
                ExpressTake::Other
            } else {
                ExpressTake::Empty
            });
        }
        if self.rx_tag(c.tail) != EXPRESS {
            return Ok(ExpressTake::Other);
        }
        if used < EXPRESS_HDR as u64 {
            return Err(broken(format!("express record cut short ({used} bytes)")));
        }
        let mut h = [0u8; EXPRESS_HDR];
        // SAFETY: published bytes of the ring into a local buffer.
        unsafe {
            self.rx
                .copy(c.tail, h.as_mut_ptr(), EXPRESS_HDR, false, false)
        };
        let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        let len = u32_at(4) as usize;
        let imm = (h[1] & FLAG_IMM != 0).then(|| u32_at(32));
        let send = h[1] & FLAG_SEND != 0;
        if h[1] & !(FLAG_IMM | FLAG_SEND) != 0
            || (send && h[16..32] != [0; 16])
            || h[2..4] != [0, 0]
            || h[36..40] != [0; 4]
            || len > EXPRESS_MAX
            || used < (EXPRESS_HDR + len) as u64
        {
            return Err(broken(format!("bad express record {h:02x?}")));
        }
        let r = ExpressRequest {
            seq: u64_at(8),
            to: if send {
                ExpressTo::Receive
            } else {
                ExpressTo::Region {
                    rkey: u64_at(16),
                    addr: u64_at(24),
                }
            },
            imm,
            len: len as u32,
        };
        let mut payload = [MaybeUninit::<u8>::uninit(); EXPRESS_MAX];
        // SAFETY: published bytes of the ring into a local buffer of at least `len`.
        unsafe {
            self.rx.copy(
                c.tail + EXPRESS_HDR as u64,
                payload.as_mut_ptr().cast(),
                len,
                false,
                false,
            )
        };
        // SAFETY: the first `len` bytes were written just now.
        let payload = unsafe { std::slice::from_raw_parts(payload.as_ptr().cast::<u8>(), len) };
        let Some(st) = exec(&r, payload) else {
            return Ok(ExpressTake::Stalled);
        };
        let ctrl = self.rx.ctrl();
        ctrl.express_status[(c.express_done % EXPRESS_SLOTS as u64) as usize]
            .store(st as u8, Ordering::Relaxed);
        c.express_done += 1;
        c.tail += (EXPRESS_HDR + len) as u64;
        c.stream_tail += stream_len(len);
        ctrl.express_done.store(c.express_done, Ordering::Release);
        ctrl.tail.store(c.tail, Ordering::Release);
        ctrl.stream_tail.store(c.stream_tail, Ordering::Release);
        fence(Ordering::SeqCst);
        // One doorbell wakes the peer whether it sleeps for room or for the answer (on the
        // other ring, where a sleeping reader arms).
        let back = self.tx.ctrl();
        if (ctrl.writer_armed.load(Ordering::Relaxed) != 0
            && ctrl.writer_armed.swap(0, Ordering::AcqRel) != 0)
            | (back.reader_armed.load(Ordering::Relaxed) != 0
                && back.reader_armed.swap(0, Ordering::AcqRel) != 0)
        {
            self.ring_bell();
        }
        Ok(if ctrl.head.load(Ordering::Acquire) == c.tail {
            ExpressTake::RanEmpty
        } else {
            ExpressTake::Ran
        })
    }

    /// The tag of the record at ring position `at` (published).
    pub(super) fn rx_tag(&self, at: u64) -> u8 {
        let mut tag = 0u8;
        // SAFETY: one published byte into a local.
        unsafe { self.rx.copy(at, &mut tag, 1, false, false) };
        tag
    }

    /// Express requests sent here and not answered as far as
    /// [`ShmLink::read_express_answers`] has read.
    pub(super) fn unanswered_express(&self) -> u64 {
        self.express_sent
            .load(Ordering::Relaxed)
            .wrapping_sub(self.express_reaped.load(Ordering::Relaxed))
    }

    /// Answers arrived and not reaped yet.
    pub(super) fn express_answers_waiting(&self) -> bool {
        self.unanswered_express() != 0
            && self.tx.ctrl().express_done.load(Ordering::Acquire)
                != self.express_reaped.load(Ordering::Relaxed)
    }

    /// Hands the statuses of newly answered express requests to `f`, oldest first. Callers
    /// take turns (the driver calls it under its session's lock).
    pub(super) fn read_express_answers(&self, f: &mut dyn FnMut(WireStatus)) -> io::Result<()> {
        let reaped = self.express_reaped.load(Ordering::Relaxed);
        let done = self.tx.ctrl().express_done.load(Ordering::Acquire);
        if done == reaped {
            return Ok(());
        }
        let sent = self.express_sent.load(Ordering::Acquire);
        let new = done.wrapping_sub(reaped);
        if new > sent.wrapping_sub(reaped) || new > EXPRESS_SLOTS as u64 {
            return Err(broken(format!(
                "{done} express answers after {reaped}, with {sent} requests sent"
            )));
        }
        let status = &self.tx.ctrl().express_status;
        for k in reaped..done {
            let v = status[(k % EXPRESS_SLOTS as u64) as usize].load(Ordering::Relaxed);
            let st = WireStatus::from_u32(v.into())
                .ok_or_else(|| broken(format!("express answer {v} to request {k}")))?;
            f(st);
        }
        self.express_reaped.store(done, Ordering::Relaxed);
        Ok(())
    }

    /// Arms the ring for answers only, for a reader about to sleep while the record at its
    /// head waits for a receive: stream bytes behind it cannot be read, but the answers to
    /// this side's requests must still wake it. True when answers are there already.
    pub(super) fn arm_for_answers(&self) -> io::Result<bool> {
        self.drain_bell()?;
        let c = self.rx.ctrl();
        c.want.store(u64::MAX, Ordering::Relaxed);
        c.reader_armed.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if self.express_answers_waiting() {
            c.reader_armed.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    /// Rings the peer if it sleeps on this ring and what it waits for is there.
    pub(super) fn wake_reader(&self, c: &Ctrl, stream_head: u64) {
        if c.reader_armed.load(Ordering::Relaxed) != 0 {
            let waiting = stream_head.wrapping_sub(c.stream_tail.load(Ordering::Acquire));
            if waiting >= c.want.load(Ordering::Relaxed).max(1)
                && c.reader_armed.swap(0, Ordering::AcqRel) != 0
            {
                self.ring_bell();
            }
        }
    }
}
