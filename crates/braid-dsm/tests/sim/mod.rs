//! A deterministic simulator of a braid-dsm group: N ranks, each with its protocol core
//! ([`Node`]), a model of its MMU and memory, a userfaultfd queue, a single service thread
//! that executes the core's actions one per step (while the rank's application threads
//! keep running between them, as in the runtime), and application threads running random
//! programs of reads, writes and lock-protected sections. Messages travel with random
//! delay: per-pair FIFO (what a braid endpoint guarantees) or, in some seeds, in any order.
//!
//! After every step the checker verifies:
//! * at most one writable mapping of a page, and then no other mapping at all;
//! * every mapped copy holds the value of the latest write (so every read returns the
//!   latest write in the simulation's step order: a sequentially consistent execution);
//! * a rank whose service thread is idle has core state and MMU in agreement;
//! * a page with nothing in flight has a directory (owner, copy set) equal to the holders;
//! * a lock has at most one holder, and tickets are served in order;
//!
//! and at the end that every thread finished (every fault was answered).

#![allow(dead_code)]

use std::collections::{HashMap, VecDeque};

use braid_dsm::proto::{Access, Action, HomePolicy, Msg, Node, NodeConfig, PageId, Rank, Source};

/// The test kit's generator, salted per simulation seed (the recorded surveys' streams).
pub use braid_testkit::Rng;

/// The generator of simulation `seed`.
pub fn rng(seed: u64) -> Rng {
    Rng::new(seed ^ 0xD5A0_0000_1234_5678)
}

/// Seeds to run: `BRAID_DSM_SIM_SEED=n` replays one, `BRAID_DSM_SIM_SEEDS=n` sets the count.
pub fn seeds(default: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("BRAID_DSM_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("BRAID_DSM_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

/// A page's mapping in a rank's MMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Map {
    /// Not mapped: any access faults (userfaultfd "missing").
    Missing,
    /// Mapped write-protected: writes fault (userfaultfd "write-protect").
    ReadOnly,
    /// Mapped writable.
    Writable,
}

/// One operation of an application thread.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// Read a page.
    Read(PageId),
    /// Write a fresh value to a page.
    Write(PageId),
    /// Acquire a lock.
    Lock(u32),
    /// Release the held lock.
    Unlock(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TState {
    Ready,
    /// Blocked in a page fault; `woken` once the page's waiters were woken.
    Faulted {
        page: PageId,
        woken: bool,
    },
    /// Waiting for the completion of a lock-word atomic.
    Atomic,
    /// Waiting for the home's grant of `ticket`.
    LockWait {
        lock: u32,
        ticket: u32,
    },
}

#[derive(Debug)]
struct Thread {
    ops: VecDeque<Op>,
    state: TState,
    held: Option<(u32, u32)>,
}

/// What travels between ranks.
#[derive(Clone, Copy, Debug)]
enum Net {
    Proto(Msg),
    /// A grant with data: placed into `slot` on arrival, then delivered as a message.
    Page {
        msg: Msg,
        slot: u32,
        value: u64,
    },
    /// Lock-word atomic, executed by the target's engine on arrival.
    Atomic {
        lock: u32,
        add: u64,
        thread: usize,
        release: bool,
    },
    AtomicDone {
        old: u64,
        thread: usize,
    },
}

/// Input to a rank's service thread.
#[derive(Clone, Copy, Debug)]
enum Service {
    Msg(Rank, Msg),
    LockWait(u32, u32),
    LockHandoff(u32, u32),
}

struct SimRank {
    node: Node,
    map: Vec<Map>,
    mem: Vec<u64>,
    slots: Vec<Option<u64>>,
    uffd: VecDeque<(PageId, bool)>,
    inbox: VecDeque<Service>,
    actions: VecDeque<Action>,
    threads: Vec<Thread>,
    /// Lock words homed here.
    words: HashMap<u32, u64>,
}

struct InFlight {
    from: Rank,
    to: Rank,
    net: Net,
}

/// Parameters of one simulated run.
#[derive(Clone, Debug)]
pub struct Params {
    /// Ranks.
    pub ranks: u32,
    /// Pages (one allocation).
    pub pages: u64,
    /// Threads per rank.
    pub threads: usize,
    /// Operations per thread.
    pub ops: usize,
    /// Staging slots per rank.
    pub slots: u32,
    /// Home policy.
    pub policy: HomePolicy,
    /// Deliver messages of one pair in any order (braid is FIFO; the protocol should not
    /// depend on it).
    pub reorder: bool,
    /// Locks used by critical sections (0 for none).
    pub locks: u32,
}

impl Params {
    /// Random parameters for `seed`.
    pub fn random(rng: &mut Rng) -> Params {
        Params {
            ranks: 1 + rng.index(5) as u32,
            pages: 1 + rng.index(6) as u64,
            threads: 1 + rng.index(3),
            ops: 5 + rng.index(40),
            slots: 1 + rng.index(3) as u32,
            policy: if rng.chance(0.5) {
                HomePolicy::Block
            } else {
                HomePolicy::Cyclic
            },
            reorder: rng.chance(0.3),
            locks: rng.index(3) as u32,
        }
    }
}

/// The simulated group.
pub struct Sim {
    rng: Rng,
    p: Params,
    ranks: Vec<SimRank>,
    net: Vec<InFlight>,
    latest: Vec<u64>,
    next_value: u64,
    holder: HashMap<u32, (Rank, usize, u32)>,
    /// Statistics: executed reads, writes, faults, messages.
    pub stats: [u64; 4],
    /// Steps taken.
    pub steps: u64,
}

const FIRST_PAGE: PageId = 1000;

fn program(rng: &mut Rng, p: &Params) -> VecDeque<Op> {
    let mut ops = VecDeque::new();
    let page = |rng: &mut Rng| FIRST_PAGE + rng.index(p.pages as usize) as u64;
    while ops.len() < p.ops {
        if p.locks > 0 && rng.chance(0.15) {
            let l = rng.index(p.locks as usize) as u32 * 7 + 1;
            ops.push_back(Op::Lock(l));
            for _ in 0..1 + rng.index(3) {
                let pg = page(rng);
                ops.push_back(Op::Read(pg));
                ops.push_back(Op::Write(pg));
            }
            ops.push_back(Op::Unlock(l));
        } else if rng.chance(0.5) {
            ops.push_back(Op::Read(page(rng)));
        } else {
            ops.push_back(Op::Write(page(rng)));
        }
    }
    ops
}

impl Sim {
    /// A group for `p`, seeded with `seed`.
    pub fn new(seed: u64, p: Params) -> Sim {
        let mut rng = rng(seed);
        let mut ranks = Vec::new();
        for r in 0..p.ranks {
            let mut node = Node::new(NodeConfig {
                rank: r,
                size: p.ranks,
                slots: p.slots,
            });
            node.add_allocation(FIRST_PAGE, p.pages, p.policy).unwrap();
            let threads = (0..p.threads)
                .map(|_| Thread {
                    ops: program(&mut rng, &p),
                    state: TState::Ready,
                    held: None,
                })
                .collect();
            // Lock words start near the 32-bit wrap of the tickets.
            let start = u32::MAX - rng.index(3) as u32;
            let words = (0..p.locks)
                .map(|i| i * 7 + 1)
                .filter(|l| l % p.ranks == r)
                .map(|l| (l, (start as u64) << 32 | start as u64))
                .collect();
            ranks.push(SimRank {
                node,
                map: vec![Map::Missing; p.pages as usize],
                mem: vec![0; p.pages as usize],
                slots: vec![None; p.slots as usize],
                uffd: VecDeque::new(),
                inbox: VecDeque::new(),
                actions: VecDeque::new(),
                threads,
                words,
            });
        }
        Sim {
            rng,
            latest: vec![0; p.pages as usize],
            p,
            ranks,
            net: Vec::new(),
            next_value: 1,
            holder: HashMap::new(),
            stats: [0; 4],
            steps: 0,
        }
    }

    fn idx(page: PageId) -> usize {
        (page - FIRST_PAGE) as usize
    }

    fn send(&mut self, from: Rank, to: Rank, net: Net) {
        assert_ne!(from, to, "the core never sends to itself");
        self.stats[3] += 1;
        self.net.push(InFlight { from, to, net });
    }

    /// Runs to completion; `Err` describes the first violation.
    pub fn run(&mut self, max_steps: u64) -> Result<(), String> {
        loop {
            let mut choices: Vec<(u8, usize, usize)> = Vec::new();
            if !self.net.is_empty() {
                choices.push((0, 0, 0));
            }
            for (r, sr) in self.ranks.iter().enumerate() {
                if !sr.actions.is_empty() || !sr.uffd.is_empty() || !sr.inbox.is_empty() {
                    choices.push((1, r, 0));
                }
                for (t, th) in sr.threads.iter().enumerate() {
                    let runnable = match th.state {
                        TState::Ready => !th.ops.is_empty(),
                        TState::Faulted { woken, .. } => woken,
                        _ => false,
                    };
                    if runnable {
                        choices.push((2, r, t));
                    }
                }
            }
            if choices.is_empty() {
                return self.finish();
            }
            self.steps += 1;
            if self.steps > max_steps {
                return Err(format!(
                    "no completion within {max_steps} steps\n{}",
                    self.dump()
                ));
            }
            let (kind, r, t) = choices[self.rng.index(choices.len())];
            match kind {
                0 => self.deliver()?,
                1 => self.service(r as Rank)?,
                _ => self.thread_step(r as Rank, t)?,
            }
            self.check()?;
        }
    }

    fn deliver(&mut self) -> Result<(), String> {
        let i = if self.p.reorder {
            self.rng.index(self.net.len())
        } else {
            // The oldest message of a random pair: per-pair FIFO.
            let j = self.rng.index(self.net.len());
            let (f, t) = (self.net[j].from, self.net[j].to);
            self.net
                .iter()
                .position(|m| m.from == f && m.to == t)
                .expect("j matches")
        };
        let m = self.net.remove(i);
        let sr = &mut self.ranks[m.to as usize];
        match m.net {
            Net::Proto(msg) => sr.inbox.push_back(Service::Msg(m.from, msg)),
            Net::Page { msg, slot, value } => {
                let s = sr
                    .slots
                    .get_mut(slot as usize)
                    .ok_or_else(|| format!("page data for slot {slot} beyond the slots"))?;
                if s.is_some() {
                    return Err(format!("rank {}: slot {slot} written while in use", m.to));
                }
                *s = Some(value);
                sr.inbox.push_back(Service::Msg(m.from, msg));
            }
            Net::Atomic {
                lock,
                add,
                thread,
                release,
            } => {
                let old = self.atomic(m.to, lock, add, release)?;
                self.send(m.to, m.from, Net::AtomicDone { old, thread });
            }
            Net::AtomicDone { old, thread } => self.atomic_done(m.to, thread, old)?,
        }
        Ok(())
    }

    fn atomic(&mut self, home: Rank, lock: u32, add: u64, release: bool) -> Result<u64, String> {
        let w = self.ranks[home as usize]
            .words
            .get_mut(&lock)
            .ok_or_else(|| format!("lock {lock} has no word at rank {home}"))?;
        let old = *w;
        *w = w.wrapping_add(add);
        if release {
            self.holder.remove(&lock);
        }
        Ok(old)
    }

    fn service(&mut self, r: Rank) -> Result<(), String> {
        let sr = &mut self.ranks[r as usize];
        if let Some(a) = sr.actions.pop_front() {
            return self.execute(r, a);
        }
        let take_fault = !sr.uffd.is_empty() && (sr.inbox.is_empty() || self.rng.chance(0.5));
        let res = if take_fault {
            let (page, write) = sr.uffd.pop_front().expect("non-empty");
            self.stats[2] += 1;
            sr.node.on_fault(page, write)
        } else {
            match sr.inbox.pop_front().expect("non-empty") {
                Service::Msg(from, msg) => sr.node.on_message(from, msg),
                Service::LockWait(l, t) => sr.node.lock_wait(l, t),
                Service::LockHandoff(l, t) => sr.node.lock_handoff(l, t),
            }
        };
        res.map_err(|e| format!("rank {r}: protocol error: {e}\n{}", self.dump()))?;
        let sr = &mut self.ranks[r as usize];
        while let Some(a) = sr.node.poll_action() {
            sr.actions.push_back(a);
        }
        Ok(())
    }

    fn wake(&mut self, r: Rank, page: PageId) {
        for th in &mut self.ranks[r as usize].threads {
            if let TState::Faulted { page: p, woken } = &mut th.state
                && *p == page
            {
                *woken = true;
            }
        }
    }

    fn execute(&mut self, r: Rank, a: Action) -> Result<(), String> {
        let sr = &mut self.ranks[r as usize];
        let bad = |what: &str| Err(format!("rank {r}: {what} in {a:?}"));
        match a {
            Action::Send { to, msg } => self.send(r, to, Net::Proto(msg)),
            Action::SendPage {
                to,
                slot,
                msg,
                drop,
            } => {
                let Msg::Grant { page, .. } = msg else {
                    return bad("page data without a grant");
                };
                let i = Self::idx(page);
                if sr.map[i] == Map::Missing {
                    return bad("snapshot of a page that is not present (would deadlock)");
                }
                if sr.map[i] == Map::Writable {
                    return bad("snapshot of a writable page (a write could be lost)");
                }
                let value = sr.mem[i];
                if drop {
                    sr.map[i] = Map::Missing;
                }
                self.send(r, to, Net::Page { msg, slot, value });
            }
            Action::Install {
                page,
                write,
                source,
            } => {
                let i = Self::idx(page);
                if sr.map[i] != Map::Missing {
                    return bad("install over a present page");
                }
                sr.mem[i] = match source {
                    Source::Zero => 0,
                    Source::Slot(s) => match sr.slots.get_mut(s as usize).and_then(Option::take) {
                        Some(v) => v,
                        None => return bad("install from an empty slot"),
                    },
                };
                sr.map[i] = if write { Map::Writable } else { Map::ReadOnly };
                self.wake(r, page);
            }
            Action::Upgrade { page } => {
                let i = Self::idx(page);
                if sr.map[i] != Map::ReadOnly {
                    return bad("upgrade of a page that is not read-only");
                }
                sr.map[i] = Map::Writable;
                self.wake(r, page);
            }
            Action::Protect { page } => {
                let i = Self::idx(page);
                if sr.map[i] != Map::Writable {
                    return bad("protect of a page that is not writable");
                }
                sr.map[i] = Map::ReadOnly;
            }
            Action::Drop { page } => {
                let i = Self::idx(page);
                if sr.map[i] == Map::Missing {
                    return bad("drop of an absent page");
                }
                sr.map[i] = Map::Missing;
            }
            Action::Wake { page } => self.wake(r, page),
            Action::LockGranted { lock, ticket } => {
                let t = sr
                    .threads
                    .iter()
                    .position(|th| th.state == TState::LockWait { lock, ticket })
                    .ok_or_else(|| {
                        format!("rank {r}: grant of lock {lock} ticket {ticket} nobody waits for")
                    })?;
                self.acquired(r, t, lock, ticket)?;
            }
        }
        Ok(())
    }

    fn acquired(&mut self, r: Rank, t: usize, lock: u32, ticket: u32) -> Result<(), String> {
        if let Some(h) = self.holder.get(&lock) {
            return Err(format!(
                "lock {lock}: rank {r} thread {t} acquires while {h:?} holds it"
            ));
        }
        let home = lock % self.p.ranks;
        let serving = self.ranks[home as usize].words[&lock] as u32;
        if serving != ticket {
            return Err(format!(
                "lock {lock}: ticket {ticket} acquires while {serving} is served"
            ));
        }
        self.holder.insert(lock, (r, t, ticket));
        let th = &mut self.ranks[r as usize].threads[t];
        th.held = Some((lock, ticket));
        th.state = TState::Ready;
        Ok(())
    }

    fn atomic_done(&mut self, r: Rank, t: usize, old: u64) -> Result<(), String> {
        let th = &mut self.ranks[r as usize].threads[t];
        if th.state != TState::Atomic {
            return Err(format!(
                "rank {r} thread {t}: atomic completion it does not wait for"
            ));
        }
        th.state = TState::Ready;
        match th.ops.pop_front() {
            Some(Op::Lock(lock)) => {
                let (ticket, serving) = ((old >> 32) as u32, old as u32);
                if ticket == serving {
                    self.acquired(r, t, lock, ticket)?;
                } else {
                    let th = &mut self.ranks[r as usize].threads[t];
                    th.state = TState::LockWait { lock, ticket };
                    self.ranks[r as usize]
                        .inbox
                        .push_back(Service::LockWait(lock, ticket));
                }
            }
            Some(Op::Unlock(lock)) => {
                let (_, ticket) = th.held.take().expect("unlock while holding");
                if old as u32 != ticket {
                    return Err(format!(
                        "lock {lock}: released ticket {ticket} but {} was served",
                        old as u32
                    ));
                }
                if (old >> 32) as u32 != ticket.wrapping_add(1) {
                    let next = ticket.wrapping_add(1);
                    self.ranks[r as usize]
                        .inbox
                        .push_back(Service::LockHandoff(lock, next));
                }
            }
            other => return Err(format!("atomic completion for {other:?}")),
        }
        Ok(())
    }

    fn thread_step(&mut self, r: Rank, t: usize) -> Result<(), String> {
        let op = *self.ranks[r as usize].threads[t]
            .ops
            .front()
            .expect("runnable");
        self.ranks[r as usize].threads[t].state = TState::Ready;
        let sr = &mut self.ranks[r as usize];
        match op {
            Op::Read(page) | Op::Write(page) => {
                let i = Self::idx(page);
                let write = matches!(op, Op::Write(_));
                let ok = match sr.map[i] {
                    Map::Missing => false,
                    Map::ReadOnly => !write,
                    Map::Writable => true,
                };
                if !ok {
                    sr.uffd.push_back((page, write));
                    sr.threads[t].state = TState::Faulted { page, woken: false };
                    return Ok(());
                }
                if write {
                    sr.mem[i] = self.next_value;
                    self.latest[i] = self.next_value;
                    self.next_value += 1;
                    self.stats[1] += 1;
                } else {
                    self.stats[0] += 1;
                    if sr.mem[i] != self.latest[i] {
                        return Err(format!(
                            "rank {r} thread {t} read {} from page {page}, the latest write is {}",
                            sr.mem[i], self.latest[i]
                        ));
                    }
                }
                sr.threads[t].ops.pop_front();
            }
            Op::Lock(lock) | Op::Unlock(lock) => {
                let release = matches!(op, Op::Unlock(_));
                let add = match sr.threads[t].held {
                    Some((_, u32::MAX)) if release => 1u64.wrapping_sub(1 << 32),
                    _ if release => 1,
                    _ => 1 << 32,
                };
                sr.threads[t].state = TState::Atomic;
                let home = lock % self.p.ranks;
                if home == r {
                    let old = self.atomic(r, lock, add, release)?;
                    self.atomic_done(r, t, old)?;
                } else {
                    let net = Net::Atomic {
                        lock,
                        add,
                        thread: t,
                        release,
                    };
                    self.send(r, home, net);
                }
            }
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        for i in 0..self.p.pages as usize {
            let page = FIRST_PAGE + i as u64;
            let writable = self
                .ranks
                .iter()
                .filter(|sr| sr.map[i] == Map::Writable)
                .count();
            let mapped = self
                .ranks
                .iter()
                .filter(|sr| sr.map[i] != Map::Missing)
                .count();
            if writable > 1 || (writable == 1 && mapped > 1) {
                return Err(format!(
                    "page {page}: {writable} writable of {mapped} mapped copies\n{}",
                    self.dump()
                ));
            }
            for (r, sr) in self.ranks.iter().enumerate() {
                if sr.map[i] != Map::Missing && sr.mem[i] != self.latest[i] {
                    return Err(format!(
                        "page {page}: rank {r} holds {} but the latest write is {}\n{}",
                        sr.mem[i],
                        self.latest[i],
                        self.dump()
                    ));
                }
                if sr.actions.is_empty() {
                    let v = sr.node.view(page);
                    let expect = match (v.access, v.virgin) {
                        (_, true) | (Access::None, _) => Map::Missing,
                        (Access::Read, false) => Map::ReadOnly,
                        (Access::Write, false) => Map::Writable,
                    };
                    if v.virgin && self.latest[i] != 0 {
                        return Err(format!(
                            "page {page}: rank {r} holds it as never written, but it was"
                        ));
                    }
                    if expect != sr.map[i] {
                        return Err(format!(
                            "page {page}: rank {r} core says {v:?}, MMU says {:?}\n{}",
                            sr.map[i],
                            self.dump()
                        ));
                    }
                }
            }
            if self.quiet(page) {
                self.check_directory(page)?;
            }
        }
        Ok(())
    }

    /// Nothing concerning `page` is in flight or queued anywhere.
    fn quiet(&self, page: PageId) -> bool {
        let about = |m: &Msg| match *m {
            Msg::ReadReq { page: p, .. }
            | Msg::WriteReq { page: p, .. }
            | Msg::FwdRead { page: p, .. }
            | Msg::FwdWrite { page: p, .. }
            | Msg::Invalidate { page: p, .. }
            | Msg::InvAck { page: p }
            | Msg::Grant { page: p, .. }
            | Msg::Confirm { page: p } => p == page,
            _ => false,
        };
        let in_net = self.net.iter().any(|m| match &m.net {
            Net::Proto(msg) | Net::Page { msg, .. } => about(msg),
            _ => false,
        });
        !in_net
            && self.ranks.iter().all(|sr| {
                sr.actions.is_empty()
                    && !sr.uffd.iter().any(|(p, _)| *p == page)
                    && !sr
                        .inbox
                        .iter()
                        .any(|s| matches!(s, Service::Msg(_, m) if about(m)))
                    && sr.node.view(page).pending_write.is_none()
            })
    }

    fn check_directory(&self, page: PageId) -> Result<(), String> {
        let home = self.ranks[0].node.home_of(page).expect("allocated");
        let v = self.ranks[home as usize].node.view(page);
        let (owner, copyset, busy, queued) = v.directory.expect("the home has the entry");
        let holders: Vec<Rank> = (0..self.p.ranks)
            .filter(|&r| self.ranks[r as usize].node.access(page) != Access::None)
            .collect();
        let ok = !busy
            && queued == 0
            && copyset.iter().collect::<Vec<_>>() == holders
            && holders.contains(&owner)
            && (0..self.p.ranks).all(|r| {
                let a = self.ranks[r as usize].node.access(page);
                a != Access::Write || (r == owner && holders.len() == 1)
            });
        if ok {
            Ok(())
        } else {
            Err(format!(
                "page {page} at rest: home {home} says owner {owner}, copies {copyset:?}, busy {busy}, queued {queued}; holders {holders:?}\n{}",
                self.dump()
            ))
        }
    }

    fn finish(&self) -> Result<(), String> {
        for (r, sr) in self.ranks.iter().enumerate() {
            for (t, th) in sr.threads.iter().enumerate() {
                if !th.ops.is_empty() || th.state != TState::Ready {
                    return Err(format!(
                        "deadlock: rank {r} thread {t} stuck in {:?} before {:?}\n{}",
                        th.state,
                        th.ops.front(),
                        self.dump()
                    ));
                }
            }
            if sr.node.outstanding() != 0 {
                return Err(format!("rank {r} still has requests at the end"));
            }
        }
        for i in 0..self.p.pages {
            self.check_directory(FIRST_PAGE + i)?;
        }
        if !self.holder.is_empty() {
            return Err(format!("locks still held at the end: {:?}", self.holder));
        }
        Ok(())
    }

    fn dump(&self) -> String {
        let mut s = format!("{:?}\nlatest {:?}\n", self.p, self.latest);
        for (r, sr) in self.ranks.iter().enumerate() {
            s += &format!(
                "rank {r}: map {:?} mem {:?} actions {:?} uffd {:?} inbox {:?}\n",
                sr.map, sr.mem, sr.actions, sr.uffd, sr.inbox
            );
            for i in 0..self.p.pages {
                s += &format!(
                    "  page {}: {:?}\n",
                    FIRST_PAGE + i,
                    sr.node.view(FIRST_PAGE + i)
                );
            }
            for (t, th) in sr.threads.iter().enumerate() {
                s += &format!(
                    "  thread {t}: {:?} next {:?} held {:?}\n",
                    th.state,
                    th.ops.front(),
                    th.held
                );
            }
        }
        for m in &self.net {
            s += &format!("net {} -> {}: {:?}\n", m.from, m.to, m.net);
        }
        s
    }
}
