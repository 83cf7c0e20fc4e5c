//! Express writes on the driver's side (see `braid_proto::Session::post_express` and
//! docs/PROTOCOL.md, "Express writes" and "Express frames"): the poster writes a small write
//! straight into the endpoint's one rail. On a same-host ring the reader executes it between
//! frames and answers it beside the stream, and the answers are reaped into the session by
//! whoever reads the rail; on TCP it is one `Express` frame, which `rx.rs` runs from its
//! buffer, answered by frames the session queues.

use std::sync::atomic::Ordering;

use braid_proto::session::Pieces;
use braid_proto::wire::HEADER_LEN;
use braid_proto::{EXPRESS_WINDOW, ExpressAction, ExpressTo, PostError, Sge};

use super::EndpointShared;
use super::rx::{ExpressStep, RxStep};
use super::transport::ExpressTake;
use super::tx::Flush;

impl EndpointShared {
    /// Posts a write or send of `local` (to `to`, with immediate `imm`) the express way
    /// when the endpoint has one rail, nothing is being written on it, and the session lets
    /// it: a record of a ring, or an `Express` frame on TCP. True when it is posted (into
    /// the link, or as frames when a ring had no room); false: post it as usual.
    pub(crate) fn post_express(
        &self,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<bool, PostError> {
        let [rail] = &self.rails[..] else {
            return Ok(false);
        };
        if !rail.express.load(Ordering::Acquire) {
            return self.post_express_frame(wr_id, local, to, imm, signaled);
        }
        // The transmit lock before the session's, as a flush takes them.
        let mut tx = rail.tx.lock();
        let mut s = self.session.lock();
        // Frames wait in the session only where a read made them (see `tx_check`; a post
        // sends its own, and a framed operation outstanding keeps this write framed too).
        if self.tx_check.load(Ordering::Acquire) && s.wants_transmit(0) {
            // Frames the session holds (a `Done` the peer waits for, say) go first: behind
            // this write they would arrive after the answer the peer waits for them with.
            drop(s);
            if self.flush_locked(0, &mut tx).is_err() {
                return Ok(false);
            }
            s = self.session.lock();
        }
        // Frames in the batch are ahead of this write and not in the link yet: it must
        // follow them.
        if !tx.batch.is_empty() {
            return Ok(false);
        }
        // A link that fails here fails the rail for the reader too; the write then goes
        // the framed way and is failed with the others.
        let link = &tx.link;
        let Some(express) = s.post_express(wr_id, local, to, imm, signaled, |r, p| {
            matches!(link.send_express(r, p), Ok(true))
        })?
        else {
            return Ok(false);
        };
        drop(s);
        drop(tx);
        if !express {
            self.flush_all();
        }
        Ok(true)
    }
}

/// Most pieces (header and payload) of an express frame sent straight to the link; more
/// go through the batch.
const EXPRESS_PIECES: usize = 64;

impl EndpointShared {
    /// [`EndpointShared::post_express`] on a link that carries only frames (TCP): the
    /// request goes as one `Express` frame, behind the frames the session holds (a `Done`
    /// the peer waits for before it posts the receive this request needs, say), in one send.
    fn post_express_frame(
        &self,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        signaled: bool,
    ) -> Result<bool, PostError> {
        let io = &self.rails[0];
        let mut tx = io.tx.lock();
        // A batch being written (the link was full) goes on first, through the flush.
        if !tx.batch.is_empty() {
            return Ok(false);
        }
        let mut s = self.session.lock();
        let Some(frame) = s.post_express_frame(wr_id, local, to, imm, signaled)? else {
            return Ok(false);
        };
        let held = self.tx_check.load(Ordering::Acquire) && s.wants_transmit(0);
        if held {
            self.top_up(0, &mut tx, &mut s);
        }
        drop(s);
        // Whatever a polling thread held back goes with it.
        self.ctrl_held_since.store(0, Ordering::Release);
        self.answer_due.store(false, Ordering::Release);
        if !held && frame.payload.len() < EXPRESS_PIECES {
            // Alone: straight to the link, without the batch (the usual case).
            let mut pieces = Pieces::new();
            pieces.push((frame.header.as_ptr(), HEADER_LEN));
            pieces.extend_from_slice(&frame.payload);
            let stable = [false; EXPRESS_PIECES];
            match tx.link.send(&pieces, 0, false, &stable[..pieces.len()]) {
                Ok(n) if n == frame.len() => return Ok(true),
                Ok(n) => tx.off = n,
                Err(_) => {}
            }
        }
        // The rest goes the batch's way (a full link, an error, frames held before it).
        tx.batch.push_back(frame);
        let r = self.flush_locked(0, &mut tx);
        io.tx_blocked
            .store(matches!(r, Ok(Flush::Blocked)), Ordering::Release);
        drop(tx);
        if let Err(e) = r {
            // The request is outstanding: the failed rail fails it with the session.
            self.fail_rail(0, &format!("send failed: {e}"));
        }
        Ok(true)
    }
}

impl super::rx::RxRail<'_> {
    /// At a frame boundary: executes the express request that comes next on the link, if one
    /// does.
    pub(super) fn run_express(&mut self) -> ExpressStep {
        let (ep, rail) = (self.ep, self.rail);
        let mut failure = None;
        let mut retry = self.retry;
        let r = self.c.link.take_express(&mut |req, payload| {
            let mut s = ep.session.lock();
            let st = match s.on_express(rail, req, payload) {
                Ok(ExpressAction::Done(st)) => {
                    ep.deliver(&mut s);
                    Some(st)
                }
                Ok(ExpressAction::Stall) => None,
                Err(e) => {
                    failure = Some(e);
                    None
                }
            };
            retry = Some(s.rx_retry_pending());
            st
        });
        self.retry = retry;
        if let Some(e) = failure {
            return ExpressStep::End(self.die(&format!("protocol error: {e}")));
        }
        self.found |= r.as_ref().map_or(true, |t| {
            !matches!(t, ExpressTake::Other | ExpressTake::Empty)
        });
        match r {
            Ok(ExpressTake::Other) => ExpressStep::Read,
            Ok(ExpressTake::Empty) => ExpressStep::Empty,
            Ok(ExpressTake::Ran) => {
                self.ran_express = true;
                ExpressStep::Ran
            }
            Ok(ExpressTake::RanEmpty) => {
                self.ran_express = true;
                ExpressStep::Empty
            }
            Ok(ExpressTake::Stalled) => self.stalled_express(),
            Err(e) => ExpressStep::End(self.die(&format!("receive failed: {e}"))),
        }
    }

    /// The request at the link's head waits for a receive (a `post_recv` retries the rail).
    /// A thread about to sleep still wants the answers to this side's requests: it arms the
    /// link for them, reaping what came meanwhile (bounded: answers only grow to the
    /// window, and each pass reaps them).
    fn stalled_express(&mut self) -> ExpressStep {
        if !self.arm {
            // A polling thread put the answers off for the request; they cannot wait for it.
            return ExpressStep::End(self.reap_express().unwrap_or(RxStep::Wait));
        }
        for _ in 0..4 {
            if self.c.link.express_unanswered() == 0 {
                break;
            }
            match self.c.link.arm_for_answers() {
                Ok(false) => break,
                Ok(true) => {
                    if let Some(step) = self.reap_express() {
                        return ExpressStep::End(step);
                    }
                }
                Err(e) => return ExpressStep::End(self.die(&format!("receive failed: {e}"))),
            }
        }
        ExpressStep::End(RxStep::Wait)
    }

    /// Hands the answers to this side's express requests that arrived to the session. A
    /// busy-polling thread that has just executed the peer's request leaves them for its
    /// next poll while fewer than half the window wait: its caller's answer to that request
    /// goes first.
    pub(super) fn reap_express(&mut self) -> Option<RxStep> {
        let unanswered = self.c.link.express_unanswered();
        if unanswered == 0
            || (self.ran_express && !self.arm && unanswered < EXPRESS_WINDOW as u64 / 2)
            || !self.c.link.express_answered(self.arm)
        {
            return None;
        }
        self.found = true;
        let mut s = self.ep.session.lock();
        let mut bad = None;
        let r = self.c.link.reap_express(&mut |st| {
            if let Err(e) = s.express_acked(st) {
                bad.get_or_insert(e);
            }
        });
        self.ep.deliver(&mut s);
        self.retry = Some(s.rx_retry_pending());
        drop(s);
        if let Some(e) = bad {
            return Some(self.die(&format!("protocol error: {e}")));
        }
        r.err().map(|e| self.die(&format!("receive failed: {e}")))
    }
}
