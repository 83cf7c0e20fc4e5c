//! Express writes on the driver's side (see `braid_proto::Session::post_express` and
//! docs/PROTOCOL.md, "Express writes"): the poster writes a small write straight into a
//! rail whose link carries them, and the reader executes it between frames and answers it
//! beside the stream; the answers are reaped into the session by whoever reads the rail.

use std::sync::atomic::Ordering;

use braid_proto::{EXPRESS_WINDOW, ExpressAction, ExpressTo, PostError, Sge};

use super::EndpointShared;
use super::rx::{ExpressStep, RxStep};
use super::transport::ExpressTake;

impl EndpointShared {
    /// Posts a write or send of `local` (to `to`, with immediate `imm`) the express way
    /// when the endpoint's one rail carries express requests, nothing is being written on
    /// it, and the session lets it. True when it is posted (into the link, or as frames
    /// when the link had no room); false: post it as usual.
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
            return Ok(false);
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

impl super::rx::RxRail<'_> {
    /// At a frame boundary: executes the express request that comes next on the link, if one
    /// does.
    pub(super) fn run_express(&mut self) -> ExpressStep {
        let (ep, rail) = (self.ep, self.rail);
        let mut failure = None;
        let r = self.c.link.take_express(&mut |req, payload| {
            let mut s = ep.session.lock();
            match s.on_express(rail, req, payload) {
                Ok(ExpressAction::Done(st)) => {
                    ep.deliver(&mut s);
                    Some(st)
                }
                Ok(ExpressAction::Stall) => None,
                Err(e) => {
                    failure = Some(e);
                    None
                }
            }
        });
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
            return ExpressStep::End(RxStep::Wait);
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
            || !self.c.link.express_answered()
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
        drop(s);
        if let Some(e) = bad {
            return Some(self.die(&format!("protocol error: {e}")));
        }
        r.err().map(|e| self.die(&format!("receive failed: {e}")))
    }
}
