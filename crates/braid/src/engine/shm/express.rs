//! Express requests on a same-host rail (docs/PROTOCOL.md, "Express writes"): a small write
//! travels as one record of the ring, the reader executes it as soon as it meets it, and the
//! answer goes back beside the stream, in the control page (a count of requests executed and
//! a status for each), instead of as a frame.

use std::io;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering, fence};

use braid_proto::wire::WireStatus;
use braid_proto::{EXPRESS_MAX, ExpressRequest, ExpressTo};

use super::super::transport::{ExpressExec, ExpressTake};
use super::ring::{Ctrl, EXPRESS_SLOTS};
use super::{Cur, EXPRESS, ShmLink, broken};

/// An express record's header: tag, flags, two zero bytes, the payload's length (u32), then
/// sequence number, key and address (u64 each; zero for a send), the immediate (u32), four
/// zero bytes, and the answers it carries: the count of the reader's own express requests
/// the writer has executed, and the first of them after the last that failed (u64 each).
pub(super) const EXPRESS_HDR: usize = 56;
/// Flag: the request carries an immediate.
const FLAG_IMM: u8 = 1;
/// Flag: a send (into the next posted receive; key and address are zero).
const FLAG_SEND: u8 = 2;

/// Express records end on a cache line's boundary, so that the next one starts on a line
/// of its own: an 8 B write's record is then one line for the reader to fetch, not two.
const LINE: u64 = 64;

/// Where the express record of `len` payload bytes at ring position `at` ends (the next
/// record's start): the bytes up to the line's end are padding.
fn express_end(at: u64, len: usize) -> u64 {
    (at + (EXPRESS_HDR + len) as u64).next_multiple_of(LINE)
}

/// Polls a busy poller lets pass without answers carried before it looks at the control
/// page's count, while the peer's records bring answers (a ping-pong: every answer comes
/// with the reply well within this). Each look takes the line the peer writes its answers
/// to, and the peer's next answer then waits for that line to come back. Once a look found
/// answers no record had brought (a stream one way, a write waited for alone), a poller
/// looks on every poll again, until a record brings answers.
const LOOK_AFTER: u32 = 64;
/// Requests unanswered from which a busy poller looks lazily whatever brings the answers:
/// a stream of writes (its completions are taken in batches, and every look would make the
/// target's answers wait for their line), not a write waited for alone.
const LAZY_DEPTH: u64 = 16;

/// Answers carried in express records, both ways: a ping-pong then never touches the
/// control page's answer line, whose every crossing cost each message a cache miss.
#[derive(Default)]
pub(super) struct Carried {
    /// The peer's express requests executed here, and the first of them after the last
    /// that failed: what this side's records carry.
    executed: AtomicU64,
    ok_from: AtomicU64,
    /// The latest of those counts the peer's records carried.
    answered: AtomicU64,
    answered_ok_from: AtomicU64,
    /// Busy polls since answers last came carried or were looked for in the control page.
    quiet_polls: AtomicU32,
    /// The peer's records bring answers: busy pollers look at the control page only after
    /// [`LOOK_AFTER`] polls (set by a record that carried new answers, cleared when a
    /// look after that many polls found answers no record had brought).
    lazy_look: AtomicBool,
    /// The control page's count as last looked at (answers found there stay found until
    /// reaped, however the next poll would look).
    seen_done: AtomicU64,
}

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
        let c = self.tx.ctrl();
        let mut cur = self.txc.lock();
        let head = cur.head;
        let need = express_end(head, len) - head;
        if self.tx.free(head, cur.tail_seen)? < need {
            cur.tail_seen = c.tail.load(Ordering::Acquire);
            if self.tx.free(head, cur.tail_seen)? < need {
                return Ok(false);
            }
        }
        // The tag stays zero until the record is whole (see below).
        let mut h = [0u8; EXPRESS_HDR];
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
        let executed = self.carried.executed.load(Ordering::Acquire);
        h[40..48].copy_from_slice(&executed.to_le_bytes());
        let ok_from = self.carried.ok_from.load(Ordering::Relaxed);
        h[48..56].copy_from_slice(&ok_from.to_le_bytes());
        // SAFETY: the record fits the free space at `head` (checked above).
        unsafe { self.tx.copy(head, h.as_mut_ptr(), EXPRESS_HDR, true, false) };
        let mut pos = head + EXPRESS_HDR as u64;
        for &(p, l) in pieces {
            // SAFETY: the caller's pieces are valid plain memory; they fit (checked above).
            unsafe { self.tx.copy(pos, p as *mut u8, l, true, false) };
            pos += l as u64;
        }
        debug_assert!(pos <= express_end(head, len));
        let pos = express_end(head, len);
        cur.head = pos;
        cur.stream_head += stream_len(len);
        // Counted before the peer can see it, so that its answer never runs ahead. Only a
        // writer, under the cursor's lock, changes the count: no read-modify-write needed.
        let sent = self.express_sent.load(Ordering::Relaxed);
        self.express_sent.store(sent + 1, Ordering::Release);
        self.tx.end_records(pos);
        // A polling reader takes the record on its tag, without waiting for the counts'
        // line as well: one cache line crosses to it instead of two.
        self.tx.publish_tag(head, EXPRESS);
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
        // The tag alone says whether a record is there: an express record's tag is published
        // after its bytes, and a zero tag follows the last record of every publication.
        match self.rx.tag(c.tail) {
            EXPRESS => {}
            // The reader's next receive reports the end.
            0 if !self.ended.load(Ordering::Acquire) => return Ok(ExpressTake::Empty),
            _ => return Ok(ExpressTake::Other),
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
        {
            return Err(broken(format!("bad express record {h:02x?}")));
        }
        self.take_carried(u64_at(40), u64_at(48))?;
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
        if st != WireStatus::Ok {
            self.carried
                .ok_from
                .store(c.express_done, Ordering::Relaxed);
        }
        self.carried
            .executed
            .store(c.express_done, Ordering::Release);
        // The counts may not show this record yet: they may lag to its start, no further
        // (a peer whose counts fall behind that fails the rail at their next check).
        c.fast_from = c.tail;
        c.stream_fast_from = c.stream_tail;
        c.tail = express_end(c.tail, len);
        c.stream_tail += stream_len(len);
        self.note_cursor(&c);
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
        Ok(if self.rx.tag(c.tail) == 0 {
            ExpressTake::RanEmpty
        } else {
            ExpressTake::Ran
        })
    }

    /// Express requests sent here and not answered as far as
    /// [`ShmLink::read_express_answers`] has read.
    pub(super) fn unanswered_express(&self) -> u64 {
        self.express_sent
            .load(Ordering::Relaxed)
            .wrapping_sub(self.express_reaped.load(Ordering::Relaxed))
    }

    /// Takes the answers a record of the peer's carried: `answered` of this side's express
    /// requests executed, all that follow `ok_from` of them successfully.
    fn take_carried(&self, answered: u64, ok_from: u64) -> io::Result<()> {
        let prev = self.carried.answered.load(Ordering::Relaxed);
        let sent = self.express_sent.load(Ordering::Acquire);
        if answered < prev || answered > sent || ok_from > answered {
            return Err(broken(format!(
                "a record carries {answered} answers (from {ok_from} successful) after \
                 {prev}, with {sent} requests sent"
            )));
        }
        if answered > prev {
            self.carried
                .answered_ok_from
                .store(ok_from, Ordering::Relaxed);
            self.carried.answered.store(answered, Ordering::Release);
            self.carried.quiet_polls.store(0, Ordering::Relaxed);
            self.carried.lazy_look.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Answers carried by the peer's records past `reaped`, when they are all successes
    /// (their count; else `None`).
    fn carried_past(&self, reaped: u64) -> Option<u64> {
        let answered = self.carried.answered.load(Ordering::Acquire);
        (answered > reaped && self.carried.answered_ok_from.load(Ordering::Relaxed) <= reaped)
            .then_some(answered)
    }

    /// Answers arrived and not reaped yet. While answers come carried or [`LAZY_DEPTH`]
    /// requests are unanswered, and unless `eager` (a thread about to sleep), the control
    /// page is looked at only after [`LOOK_AFTER`] such calls without answers carried, or
    /// when a failure among those carried needs its status.
    pub(super) fn express_answers_waiting(&self, eager: bool) -> bool {
        let reaped = self.express_reaped.load(Ordering::Relaxed);
        let unanswered = self
            .express_sent
            .load(Ordering::Relaxed)
            .wrapping_sub(reaped);
        if unanswered == 0 {
            return false;
        }
        if self.carried_past(reaped).is_some()
            || self.carried.seen_done.load(Ordering::Relaxed) > reaped
        {
            return true;
        }
        let mut lazy = false;
        if !eager
            && (self.carried.lazy_look.load(Ordering::Relaxed) || unanswered >= LAZY_DEPTH)
            && self.carried.answered.load(Ordering::Relaxed) <= reaped
        {
            let quiet = self.carried.quiet_polls.load(Ordering::Relaxed) + 1;
            self.carried.quiet_polls.store(
                if quiet < LOOK_AFTER { quiet } else { 0 },
                Ordering::Relaxed,
            );
            if quiet < LOOK_AFTER {
                return false;
            }
            lazy = true;
        }
        let done = self.tx.ctrl().express_done.load(Ordering::Acquire);
        self.carried.seen_done.store(done, Ordering::Relaxed);
        if lazy && done != reaped {
            // Answers waited here for all those polls and no record brought them: the
            // peer is not replying, so look on every poll until one does.
            self.carried.lazy_look.store(false, Ordering::Relaxed);
        }
        done != reaped
    }

    /// Hands the statuses of newly answered express requests to `f`, oldest first: those
    /// the peer's records carried, else those of the control page. Callers take turns (the
    /// driver calls it under its session's lock).
    pub(super) fn read_express_answers(&self, f: &mut dyn FnMut(WireStatus)) -> io::Result<()> {
        let reaped = self.express_reaped.load(Ordering::Relaxed);
        if let Some(answered) = self.carried_past(reaped) {
            // At most the window: checked against what was sent when the record came.
            for _ in reaped..answered {
                f(WireStatus::Ok);
            }
            self.express_reaped.store(answered, Ordering::Relaxed);
            return Ok(());
        }
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
        if self.express_answers_waiting(true) {
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
