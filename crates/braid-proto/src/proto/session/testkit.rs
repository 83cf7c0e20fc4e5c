//! A two-session harness for the unit tests of this folder: whole frames move in order
//! through in-memory rails, one frame per rail and direction per round, with no threads and
//! a clock that moves only when a test says so. Rails can be held (not read) or lost.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Completion;
use crate::mem::region::{Access, Region, Sge};
use crate::mem::registry::Registry;
use crate::wire::frame::HEADER_LEN;
use crate::wire::{FrameHeader, Opcode};

use super::{
    ExpressAction, ExpressTo, ProtocolError, Request, RxAction, Session, SessionConfig, Transmit,
};

/// Changes a frame before it enters its pipe: (sending side, rail, frame bytes).
pub(super) type Tamper = Box<dyn FnMut(usize, usize, &mut Vec<u8>)>;

/// Two sessions joined by `rails` in-memory rails.
pub(super) struct Pair {
    pub(super) s: [Session; 2],
    pub(super) reg: [Arc<Registry>; 2],
    /// Per rail, per sending side: whole frames on their way.
    pipes: Vec<[VecDeque<Vec<u8>>; 2]>,
    /// Per rail, per receiving side: the receiver stalled on the frame at the pipe's head.
    stalled: Vec<[bool; 2]>,
    /// Per rail: the receivers do not read it (frames queue up).
    pub(super) held: Vec<bool>,
    dead: Vec<bool>,
    pub(super) now: Instant,
    /// Completions each side produced so far.
    pub(super) done: [Vec<Completion>; 2],
    /// Protocol errors each side raised: (rail, error).
    pub(super) errors: [Vec<(usize, ProtocolError)>; 2],
    /// Frames sent so far, per side and rail: their headers.
    pub(super) sent: [Vec<(usize, FrameHeader)>; 2],
    /// Applied to every frame before it enters a pipe: (side, rail, bytes).
    pub(super) tamper: Option<Tamper>,
}

impl Pair {
    pub(super) fn new(cfg: SessionConfig, rails: usize) -> Pair {
        let reg = [Arc::new(Registry::default()), Arc::new(Registry::default())];
        Pair {
            s: [
                Session::new(cfg.clone(), reg[0].clone(), rails, 0),
                Session::new(cfg, reg[1].clone(), rails, 1),
            ],
            reg,
            pipes: (0..rails)
                .map(|_| [VecDeque::new(), VecDeque::new()])
                .collect(),
            stalled: vec![[false; 2]; rails],
            held: vec![false; rails],
            dead: vec![false; rails],
            now: Instant::now(),
            done: [Vec::new(), Vec::new()],
            errors: [Vec::new(), Vec::new()],
            sent: [Vec::new(), Vec::new()],
            tamper: None,
        }
    }

    /// A region of side `side` filled with `byte`.
    pub(super) fn region(&self, side: usize, len: usize, byte: u8) -> Region {
        let r = Region::allocate_in(&self.reg[side], len, Access::all()).expect("allocate");
        r.fill(0, len, byte).expect("fill");
        r
    }

    /// Posts `req` on side `side`.
    pub(super) fn post(&mut self, side: usize, wr_id: u64, req: Request) {
        self.s[side].post(wr_id, req).expect("post");
    }

    /// Side `side` posts `local` to `to` as an express frame on rail 0, behind the frames
    /// its session holds (as braid's driver sends it); false when the session does not
    /// take it the express way.
    pub(super) fn post_express_frame(
        &mut self,
        side: usize,
        wr_id: u64,
        local: &[Sge],
        to: ExpressTo,
        imm: Option<u32>,
        signaled: bool,
    ) -> bool {
        let Some(t) = self.s[side]
            .post_express_frame(wr_id, local, to, imm, signaled)
            .expect("a valid request")
        else {
            return false;
        };
        while self.tx_one(side, 0) {}
        self.put(side, 0, t);
        true
    }

    /// Side `side` hands out at most one frame on `rail`; true if it did.
    pub(super) fn tx_one(&mut self, side: usize, rail: usize) -> bool {
        if self.dead[rail] {
            return false;
        }
        let Some(t) = self.s[side].poll_transmit(rail, self.now) else {
            return false;
        };
        self.put(side, rail, t);
        true
    }

    /// Frame `t` of side `side` enters `rail`'s pipe.
    fn put(&mut self, side: usize, rail: usize, t: Transmit) {
        let mut bytes = Vec::with_capacity(t.len());
        bytes.extend_from_slice(&t.header);
        for &(p, l) in &t.payload {
            // SAFETY: the Transmit keeps the memory behind its pointers alive; the tests
            // write no region while it is being sent.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(p, l) });
        }
        let token = t.read_response;
        drop(t);
        if let Some(token) = token {
            self.s[side].transmitted(token);
        }
        let h = FrameHeader::decode(&bytes[..HEADER_LEN]).expect("own header");
        self.sent[side].push((rail, h));
        if let Some(f) = self.tamper.as_mut() {
            f(side, rail, &mut bytes);
        }
        self.pipes[rail][side].push_back(bytes);
    }

    /// Side `side` reads at most one frame on `rail`; true if it did.
    pub(super) fn rx_one(&mut self, side: usize, rail: usize) -> bool {
        let from = 1 - side;
        if self.dead[rail] || self.held[rail] || self.stalled[rail][side] {
            return false;
        }
        let Some(frame) = self.pipes[rail][from].front() else {
            self.s[side].on_rx_idle(rail);
            return false;
        };
        let h = FrameHeader::decode(&frame[..HEADER_LEN]).expect("header");
        if h.opcode == Opcode::Express {
            match self.s[side].on_express_frame(rail, &h, &frame[HEADER_LEN..]) {
                Err(e) => {
                    self.errors[side].push((rail, e));
                    self.dead[rail] = true;
                }
                Ok(ExpressAction::Stall) => self.stalled[rail][side] = true,
                Ok(ExpressAction::Done(_)) => {
                    self.pipes[rail][from].pop_front();
                }
            }
            return true;
        }
        match self.s[side].on_frame(rail, &h, self.now) {
            Err(e) => {
                self.errors[side].push((rail, e));
                self.dead[rail] = true;
                return true;
            }
            Ok(RxAction::Stall) => {
                self.stalled[rail][side] = true;
                return true;
            }
            Ok(RxAction::Done) => {}
            Ok(RxAction::Place(p)) => {
                let mut at = HEADER_LEN;
                for (ptr, len) in p.iov {
                    // SAFETY: the session keeps the placement alive until payload_done.
                    unsafe { std::ptr::copy_nonoverlapping(frame[at..].as_ptr(), ptr, len) };
                    at += len;
                }
                assert_eq!(at, frame.len(), "placement covers the payload");
                if let Err(e) = self.s[side].payload_done(rail) {
                    self.errors[side].push((rail, e));
                    self.dead[rail] = true;
                }
            }
            Ok(RxAction::Discard) => {
                if let Err(e) = self.s[side].payload_done(rail) {
                    self.errors[side].push((rail, e));
                    self.dead[rail] = true;
                }
            }
        }
        self.pipes[rail][from].pop_front();
        self.s[side].on_rx_progress(rail, self.now);
        true
    }

    /// One round: every side sends one frame per rail, then reads one per rail.
    pub(super) fn step(&mut self) -> bool {
        let mut any = false;
        let rails = self.pipes.len();
        for side in 0..2 {
            for rail in 0..rails {
                any |= self.tx_one(side, rail);
            }
        }
        for side in 0..2 {
            let retry = self.s[side].take_rx_retry();
            for rail in 0..rails {
                if retry & (1 << rail) != 0 {
                    self.stalled[rail][side] = false;
                }
                any |= self.rx_one(side, rail);
            }
            while let Some(c) = self.s[side].poll_completion() {
                self.done[side].push(c);
                any = true;
            }
        }
        any
    }

    /// Runs rounds until nothing moves (bounded: panics past a million rounds).
    pub(super) fn run(&mut self) {
        for _ in 0..1_000_000 {
            if !self.step() {
                return;
            }
        }
        panic!("the pair never went quiet");
    }

    /// Moves the clock on by `d` and ticks both sessions; the rails each finds dead.
    pub(super) fn advance(&mut self, d: Duration) -> [u64; 2] {
        self.now += d;
        [self.s[0].on_tick(self.now), self.s[1].on_tick(self.now)]
    }

    /// Both sides lose `rail`: its frames in flight vanish.
    pub(super) fn lose_rail(&mut self, rail: usize) {
        self.dead[rail] = true;
        self.pipes[rail] = [VecDeque::new(), VecDeque::new()];
        for s in &mut self.s {
            s.on_rail_lost(rail);
            s.take_dead_rails();
        }
    }

    /// Both sides re-establish `rail` (a new connection, empty both ways).
    pub(super) fn restore_rail(&mut self, rail: usize) {
        self.dead[rail] = false;
        self.stalled[rail] = [false; 2];
        for s in &mut self.s {
            assert!(s.on_rail_restored(rail));
        }
    }

    /// Fails the test if either side raised a protocol error; `what` says which case.
    pub(super) fn assert_no_errors(&self, what: &str) {
        assert!(
            self.errors[0].is_empty() && self.errors[1].is_empty(),
            "{what}: {:?}",
            self.errors
        );
    }

    /// Frames waiting on `rail` from `side`.
    pub(super) fn queued(&self, rail: usize, side: usize) -> usize {
        self.pipes[rail][side].len()
    }
}
