//! The soak's operation mix: a worker thread posts random verified operations and models
//! the target memory; its completions arrive through a channel from the dispatcher.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use braid::{Completion, CompletionKind, Endpoint, Region, RemoteKey, Sge, Status};

use super::util::{Rng, fill, first_diff};
use super::{RECV_LEN, SEND_HDR, SEND_MAGIC, SG_GAP};

// ------------------------------------------------------------------ soak: operations

/// Operation kinds of the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Write,
    Read,
    WriteImm,
    Send,
    FetchAdd,
    CompareSwap,
    WriteSg,
    ReadSg,
}

pub(super) const KINDS: [(Kind, &str, u32); 8] = [
    (Kind::Write, "write", 22),
    (Kind::Read, "read", 18),
    (Kind::WriteImm, "write_with_imm", 10),
    (Kind::Send, "send", 14),
    (Kind::FetchAdd, "fetch_add", 12),
    (Kind::CompareSwap, "compare_swap", 10),
    (Kind::WriteSg, "write_sg", 7),
    (Kind::ReadSg, "read_sg", 7),
];

impl Kind {
    fn index(self) -> usize {
        KINDS.iter().position(|k| k.0 == self).expect("listed")
    }
    fn completion(self) -> CompletionKind {
        match self {
            Kind::Write | Kind::WriteImm | Kind::WriteSg => CompletionKind::Write,
            Kind::Read | Kind::ReadSg => CompletionKind::Read,
            Kind::Send => CompletionKind::Send,
            Kind::FetchAdd => CompletionKind::FetchAdd,
            Kind::CompareSwap => CompletionKind::CompareSwap,
        }
    }
}

pub(super) enum Check {
    Nothing,
    /// A read: the bytes expected in the local pieces (slot offsets, lengths).
    Bytes {
        expect: Vec<u8>,
        pieces: Vec<(usize, usize)>,
        target: u64,
    },
    FetchAdd {
        add: u64,
    },
    Cas {
        old: u64,
    },
}

pub(super) struct Pending {
    wr: u64,
    kind: Kind,
    slot: usize,
    check: Check,
    readback: bool,
}

/// What a worker did and what it believes the target memory holds.
#[derive(Default)]
pub(super) struct WorkerReport {
    pub(super) ops: [u64; 8],
    pub(super) readback_ops: u64,
    pub(super) completions: u64,
    pub(super) bytes_written: u64,
    pub(super) bytes_read_verified: u64,
    pub(super) bytes_readback_verified: u64,
    /// Per endpoint: the model of this thread's area.
    pub(super) models: Vec<Vec<u8>>,
    /// Per endpoint: this thread's compare-swap word.
    pub(super) cas: Vec<u64>,
    /// Per endpoint: (old value, addend) of each fetch-add.
    pub(super) fetch_adds: Vec<Vec<(u64, u64)>>,
    /// Per endpoint: sends and writes-with-immediate that completed (receives consumed).
    pub(super) recv_ops: Vec<u64>,
    /// The worker's completion channel, handed back so that the final check can tell
    /// whether anything arrived for it after it finished.
    pub(super) inbox: Option<Receiver<Completion>>,
}

pub(super) struct Worker {
    pub(super) t: usize,
    pub(super) eps: Vec<Arc<Endpoint>>,
    pub(super) ep_index: HashMap<u64, usize>,
    pub(super) keys: Vec<RemoteKey>,
    pub(super) area: usize,
    pub(super) threads: usize,
    pub(super) max_size: usize,
    pub(super) depth: usize,
    pub(super) slot_len: usize,
    pub(super) src: Region,
    pub(super) dst: Region,
    pub(super) free: Vec<usize>,
    pub(super) fifo: Vec<VecDeque<Pending>>,
    pub(super) next_wr: u64,
    pub(super) rng: Rng,
    /// Completions of this worker's operations, from the dispatcher.
    pub(super) mailbox: Receiver<Completion>,
    pub(super) stall: Duration,
    pub(super) rep: WorkerReport,
    pub(super) scratch: Vec<u8>,
}

impl Worker {
    fn area_base(&self) -> u64 {
        (self.t * self.area) as u64
    }
    /// Offset of the atomics page in each target region.
    pub(super) fn atomics(area: usize, threads: usize) -> usize {
        area * threads
    }
    fn cas_off(&self) -> u64 {
        (Self::atomics(self.area, self.threads) + 8 * (1 + self.t)) as u64
    }
    fn inflight(&self) -> usize {
        self.fifo.iter().map(VecDeque::len).sum()
    }

    fn wr(&mut self) -> u64 {
        self.next_wr += 1;
        ((self.t as u64) << 48) | self.next_wr
    }

    pub(super) fn push(&mut self, e: usize, p: Pending) {
        self.fifo[e].push_back(p);
    }

    /// Random pieces (slot offset, length) of a scatter/gather list of `len` bytes.
    fn sg_pieces(&mut self, len: usize) -> Vec<(usize, usize)> {
        let n = self.rng.urange(2, 4).min(len);
        let mut cuts: Vec<usize> = (1..n).map(|_| self.rng.urange(1, len - 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::new();
        let (mut prev, mut off) = (0, 0);
        for c in cuts.into_iter().chain(std::iter::once(len)) {
            pieces.push((off, c - prev));
            off += c - prev + SG_GAP;
            prev = c;
        }
        pieces
    }

    fn sges(region: &Region, base: usize, pieces: &[(usize, usize)]) -> Result<Vec<Sge>> {
        pieces
            .iter()
            .map(|&(o, l)| Ok(region.slice(base + o, l)?))
            .collect()
    }

    /// Posts one random operation.
    fn post_random(&mut self) -> Result<()> {
        let total: u32 = KINDS.iter().map(|k| k.2).sum();
        let mut pick = (self.rng.next_u64() % total as u64) as u32;
        let kind = KINDS
            .iter()
            .find(|k| {
                if pick < k.2 {
                    true
                } else {
                    pick -= k.2;
                    false
                }
            })
            .expect("weights")
            .0;
        let e = self.rng.urange(0, self.eps.len() - 1);
        let slot = self.free.pop().expect("a free slot below depth");
        let r = self.post(kind, e, slot);
        if r.is_err() {
            self.free.push(slot);
        }
        r
    }

    fn post(&mut self, kind: Kind, e: usize, slot: usize) -> Result<()> {
        let base = slot * self.slot_len;
        let wr = self.wr();
        let key = self.keys[e];
        let ep = self.eps[e].clone();
        let posted = |r: std::result::Result<(), braid::Error>| {
            r.with_context(|| format!("posting {kind:?} on endpoint {e}"))
        };
        let check = match kind {
            Kind::Write | Kind::WriteImm | Kind::WriteSg => {
                let len = self.rng.log_range(1, self.max_size as u64) as usize;
                let off = self.rng.urange(0, self.area - len);
                let pieces = if kind == Kind::WriteSg && len >= 2 {
                    self.sg_pieces(len)
                } else {
                    vec![(0, len)]
                };
                self.scratch.resize(len, 0);
                fill(self.rng.next_u64(), &mut self.scratch);
                let mut at = 0;
                for &(o, l) in &pieces {
                    self.src.write_at(base + o, &self.scratch[at..at + l])?;
                    at += l;
                }
                self.rep.models[e][off..off + len].copy_from_slice(&self.scratch);
                let sges = Self::sges(&self.src, base, &pieces)?;
                let target = self.area_base() + off as u64;
                if kind == Kind::WriteImm {
                    let seq = self.rep.recv_ops[e];
                    let imm = ((self.t as u32) << 24) | (seq as u32 & 0xFF_FFFF);
                    posted(ep.write_with_imm(wr, &sges, &key, target, imm))?;
                    self.rep.recv_ops[e] += 1;
                } else {
                    posted(ep.write(wr, &sges, &key, target))?;
                }
                self.rep.bytes_written += len as u64;
                Check::Nothing
            }
            Kind::Read | Kind::ReadSg => {
                let len = self.rng.log_range(1, self.max_size as u64) as usize;
                let off = self.rng.urange(0, self.area - len);
                return self.post_read(e, slot, off, len, kind == Kind::ReadSg, false);
            }
            Kind::Send => {
                let len = self.rng.log_range(
                    SEND_HDR as u64,
                    RECV_LEN.min(self.max_size.max(SEND_HDR)) as u64,
                ) as usize;
                let seq = self.rep.recv_ops[e];
                let seed = self.rng.next_u64();
                self.scratch.resize(len, 0);
                fill(seed, &mut self.scratch[SEND_HDR..]);
                let h = &mut self.scratch[..SEND_HDR];
                h[0..4].copy_from_slice(&SEND_MAGIC.to_le_bytes());
                h[4..6].copy_from_slice(&(self.t as u16).to_le_bytes());
                h[6..8].copy_from_slice(&(e as u16).to_le_bytes());
                h[8..16].copy_from_slice(&seq.to_le_bytes());
                h[16..24].copy_from_slice(&(len as u64).to_le_bytes());
                h[24..32].copy_from_slice(&seed.to_le_bytes());
                self.src.write_at(base, &self.scratch)?;
                posted(ep.send(wr, &[self.src.slice(base, len)?]))?;
                self.rep.recv_ops[e] += 1;
                Check::Nothing
            }
            Kind::FetchAdd => {
                let add = self.rng.urange(1, 1000) as u64;
                let off = Self::atomics(self.area, self.threads) as u64;
                posted(ep.fetch_add(wr, &key, off, add))?;
                Check::FetchAdd { add }
            }
            Kind::CompareSwap => {
                let old = self.rep.cas[e];
                let swap = self.rng.next_u64();
                let compare = if self.rng.next_u64().is_multiple_of(2) {
                    old
                } else {
                    old ^ (1 + self.rng.next_u64() % 255)
                };
                posted(ep.compare_swap(wr, &key, self.cas_off(), compare, swap))?;
                if compare == old {
                    self.rep.cas[e] = swap;
                }
                Check::Cas { old }
            }
        };
        self.rep.ops[kind.index()] += 1;
        self.push(
            e,
            Pending {
                wr,
                kind,
                slot,
                check,
                readback: false,
            },
        );
        Ok(())
    }

    /// Posts a read of `len` bytes at `off` of this thread's area on endpoint `e`, checked at
    /// completion against the model as it is now (operations on one endpoint execute in order).
    fn post_read(
        &mut self,
        e: usize,
        slot: usize,
        off: usize,
        len: usize,
        sg: bool,
        readback: bool,
    ) -> Result<()> {
        let base = slot * self.slot_len;
        let kind = if sg { Kind::ReadSg } else { Kind::Read };
        let pieces = if sg && len >= 2 {
            self.sg_pieces(len)
        } else {
            vec![(0, len)]
        };
        let sges = Self::sges(&self.dst, base, &pieces)?;
        let expect = self.rep.models[e][off..off + len].to_vec();
        let wr = self.wr();
        let target = self.area_base() + off as u64;
        self.eps[e]
            .read(wr, &sges, &self.keys[e], target)
            .with_context(|| format!("posting a read on endpoint {e}"))?;
        if readback {
            self.rep.readback_ops += 1;
        } else {
            self.rep.ops[kind.index()] += 1;
        }
        self.push(
            e,
            Pending {
                wr,
                kind,
                slot,
                check: Check::Bytes {
                    expect,
                    pieces,
                    target,
                },
                readback,
            },
        );
        Ok(())
    }

    /// Accounts for and checks one completion.
    fn complete(&mut self, c: Completion) -> Result<()> {
        self.rep.completions += 1;
        let e = *self
            .ep_index
            .get(&c.endpoint)
            .ok_or_else(|| anyhow!("completion of an unknown endpoint: {c:?}"))?;
        let Some(p) = self.fifo[e].pop_front() else {
            bail!("completion with nothing outstanding on endpoint {e} (a duplicate?): {c:?}");
        };
        if p.wr != c.wr_id {
            bail!(
                "completion out of post order or duplicated on endpoint {e}: expected wr_id {:#x}, got {c:?}",
                p.wr
            );
        }
        if c.status != Status::Success {
            bail!("{:?} on endpoint {e} failed: {c:?}", p.kind);
        }
        if c.kind != p.kind.completion() {
            bail!(
                "{:?} completed as {:?} on endpoint {e}: {c:?}",
                p.kind,
                c.kind
            );
        }
        let base = p.slot * self.slot_len;
        match p.check {
            Check::Nothing => {}
            Check::Bytes {
                expect,
                pieces,
                target,
            } => {
                self.scratch.clear();
                for (o, l) in pieces {
                    let at = self.scratch.len();
                    self.scratch.resize(at + l, 0);
                    self.dst.read_at(base + o, &mut self.scratch[at..])?;
                }
                if self.scratch != expect {
                    let d = first_diff(&self.scratch, &expect);
                    bail!(
                        "read of {} bytes at target offset {target} on endpoint {e} returned wrong data: first difference at byte {d} (got {:#04x}, model {:#04x}){}",
                        expect.len(),
                        self.scratch[d],
                        expect[d],
                        if p.readback { " [final read-back]" } else { "" }
                    );
                }
                if c.byte_len != expect.len() as u64 {
                    bail!(
                        "read completion byte_len {} != {}",
                        c.byte_len,
                        expect.len()
                    );
                }
                if p.readback {
                    self.rep.bytes_readback_verified += expect.len() as u64;
                } else {
                    self.rep.bytes_read_verified += expect.len() as u64;
                }
            }
            Check::FetchAdd { add } => {
                let old = c
                    .value
                    .ok_or_else(|| anyhow!("fetch-add without a value: {c:?}"))?;
                self.rep.fetch_adds[e].push((old, add));
            }
            Check::Cas { old } => {
                let got = c
                    .value
                    .ok_or_else(|| anyhow!("compare-swap without a value: {c:?}"))?;
                if got != old {
                    bail!(
                        "compare-swap on endpoint {e} returned {got:#x}, the model says {old:#x}"
                    );
                }
            }
        }
        self.free.push(p.slot);
        Ok(())
    }

    fn wait_one(&mut self) -> Result<()> {
        match self.mailbox.recv_timeout(self.stall) {
            Ok(c) => self.complete(c),
            Err(_) => bail!(
                "thread {}: no completion within {:?} with {} operation(s) outstanding",
                self.t,
                self.stall,
                self.inflight()
            ),
        }
    }

    pub(super) fn run(mut self, end: Instant, abort: &AtomicBool) -> Result<WorkerReport> {
        let r = self.run_inner(end, abort);
        if r.is_err() {
            abort.store(true, Ordering::Release);
        }
        r.map(|()| {
            let mut rep = self.rep;
            rep.inbox = Some(self.mailbox);
            rep
        })
    }

    fn run_inner(&mut self, end: Instant, abort: &AtomicBool) -> Result<()> {
        while Instant::now() < end && !abort.load(Ordering::Acquire) {
            while let Ok(c) = self.mailbox.try_recv() {
                self.complete(c)?;
            }
            if self.inflight() < self.depth {
                self.post_random()?;
            } else {
                self.wait_one()?;
            }
        }
        while self.inflight() > 0 {
            self.wait_one()?;
        }
        if abort.load(Ordering::Acquire) {
            return Ok(());
        }
        // Final read-back of the whole area on every endpoint.
        for e in 0..self.eps.len() {
            let mut off = 0;
            while off < self.area {
                if self.inflight() >= self.depth {
                    self.wait_one()?;
                }
                let len = self.max_size.min(self.area - off);
                let slot = self.free.pop().expect("a free slot below depth");
                self.post_read(e, slot, off, len, false, true)?;
                off += len;
            }
        }
        while self.inflight() > 0 {
            self.wait_one()?;
        }
        Ok(())
    }
}
