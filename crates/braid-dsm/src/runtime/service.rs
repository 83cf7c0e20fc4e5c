//! The service thread: the only thread that drives the protocol core. It reads page faults
//! from the userfaultfd, completions from braid (driving the endpoints' sockets itself
//! while it polls, so an answer needs no hand-off from braid's engine thread), requests of
//! the application threads, and executes the core's actions. It never waits for anything
//! but new events, so it serves other ranks' requests while this rank's own wait.

use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::{Duration, Instant};

use braid::{Completion, CompletionKind, CompletionQueue};

use super::shared::{Request, Shared};
use super::trace::{Ev, Trace, msg_kind};
use super::transport::{Transport, WR_ATOMIC, WR_CTRL, WR_PAGE, WR_RECV};
use super::uffd::{self, EventBuffer, Fault, Faults};
use crate::error::DsmError;
use crate::proto::{Action, Msg, Node, PageId, Payload, Rank, Source};

/// Exit status of a process whose page faults can no longer be served.
pub(crate) const EXIT_UNSERVABLE: i32 = 70;

/// Counters of the service thread (read by `Dsm::stats`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ServiceStats {
    /// Page faults read from the userfaultfd.
    pub faults: u64,
    /// Pages installed (from a peer or zero-filled).
    pub installs: u64,
    /// Pages this rank sent to others.
    pub pages_sent: u64,
    /// Copies dropped on invalidation or hand-over.
    pub drops: u64,
    /// Protocol messages received.
    pub messages: u64,
    /// Requests for pages sent, and the nanoseconds from reading their fault to having
    /// posted the request.
    pub requests: u64,
    /// See `requests`.
    pub fault_to_request_ns: u64,
    /// Nanoseconds from posting requests to their grants' arrival (summed).
    pub request_to_grant_ns: u64,
    /// Nanoseconds in `UFFDIO_COPY` / unprotect installing granted pages (summed).
    pub install_ns: u64,
    /// Pages served (sent to a requester), and the nanoseconds from the request's arrival
    /// here to the page being posted (write-protect, copy, post; summed).
    pub serve_ns: u64,
}

/// The text of a failure, without the "group has failed" prefix it gets when reported.
fn reason(e: DsmError) -> String {
    match e {
        DsmError::Failed(s) => s,
        e => e.to_string(),
    }
}

pub(crate) struct Service {
    pub node: Node,
    pub faults: Faults,
    pub tx: Transport,
    pub cq: CompletionQueue,
    pub shared: Arc<Shared>,
    pub base: usize,
    pub len: usize,
    pub page: usize,
    pub zero: Box<[u8]>,
    pub spin: Duration,
    /// How long to poll while a request of this rank is in flight.
    pub spin_wait: Duration,
    pub stats: Arc<parking_lot::Mutex<ServiceStats>>,
    stopping: bool,
    removals: Vec<(PageId, u64)>,
    local: ServiceStats,
    /// When each of this rank's requests in flight was posted.
    posted: std::collections::HashMap<PageId, Instant>,
    /// When the message being handled arrived.
    arrived: Option<Instant>,
    /// `Confirm`s not sent yet: they go out after the next round's fault requests, so a
    /// thread woken by an install gets its next request out first. The home needs one
    /// only before it serves that page again.
    confirms: Vec<(Rank, Msg)>,
    trace: Trace,
}

impl Service {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node: Node,
        faults: Faults,
        tx: Transport,
        cq: CompletionQueue,
        shared: Arc<Shared>,
        base: usize,
        len: usize,
        page: usize,
        (spin, spin_wait): (Duration, Duration),
        stats: Arc<parking_lot::Mutex<ServiceStats>>,
    ) -> Service {
        Service {
            node,
            faults,
            tx,
            cq,
            shared,
            base,
            len,
            page,
            zero: vec![0u8; page].into_boxed_slice(),
            spin,
            spin_wait,
            stats,
            stopping: false,
            removals: Vec::new(),
            local: ServiceStats::default(),
            posted: std::collections::HashMap::new(),
            arrived: None,
            confirms: Vec::new(),
            trace: Trace::new(),
        }
    }

    fn addr(&self, page: PageId) -> *mut u8 {
        (self.base + page as usize * self.page) as *mut u8
    }

    /// Runs until stopped; the group's failure is recorded in `shared`.
    pub(crate) fn run(mut self) {
        let waker = Waker::from(self.shared.doorbell.clone());
        let mut buf = EventBuffer::new(64);
        let mut faults = Vec::new();
        let mut last_active = Instant::now();
        let mut last_check = Instant::now();
        loop {
            let active = match self.round(&mut buf, &mut faults) {
                Ok(a) => a,
                Err(e) => {
                    self.failed(reason(e));
                    true
                }
            };
            if self.stopping && self.shared.requests.lock().is_empty() {
                break;
            }
            if last_check.elapsed() > Duration::from_millis(100) {
                last_check = Instant::now();
                if let Err(e) = self.tx.world.check() {
                    self.failed(e.to_string());
                }
            }
            if active {
                *self.stats.lock() = self.local;
                last_active = Instant::now();
                continue;
            }
            let spin = if self.node.outstanding() > 0 {
                self.spin_wait
            } else {
                self.spin
            };
            if last_active.elapsed() < spin {
                // Poll cooperatively: a thread this one just woke (the faulting thread, or
                // braid's engine) gets the processor at once instead of waiting for this
                // thread's time slice to end; with nothing else runnable it returns at once.
                // SAFETY: no preconditions.
                unsafe { libc::sched_yield() };
                continue;
            }
            self.trace.rec(Ev::Sleep, 0, 0);
            self.sleep(&waker);
            self.trace.rec(Ev::Wake, 0, 0);
        }
        for (to, msg) in std::mem::take(&mut self.confirms) {
            let _ = self.tx.send(to, &msg);
        }
        let _ = self.tx.flush();
        *self.stats.lock() = self.local;
        self.trace.dump(self.node.rank());
    }

    /// One pass over every source of events; true if anything happened.
    fn round(&mut self, buf: &mut EventBuffer, faults: &mut Vec<Fault>) -> Result<bool, DsmError> {
        let mut active = false;
        let confirms = std::mem::take(&mut self.confirms);
        faults.clear();
        self.faults
            .read(buf, faults)
            .map_err(|e| DsmError::Os("reading the userfaultfd".into(), e))?;
        active |= !faults.is_empty() || !confirms.is_empty();
        // Every fault and request read here is handled even after one fails (see
        // `each_of`): a fault dropped here would never be answered.
        let faulted = each_of(faults.iter(), |f| self.fault(*f));
        for (to, msg) in confirms {
            self.tx.send(to, &msg)?;
        }
        faulted?;
        let reqs = {
            let mut q = self.shared.requests.lock();
            if q.is_empty() {
                Default::default()
            } else {
                std::mem::take(&mut *q)
            }
        };
        active |= !reqs.is_empty();
        each_of(reqs, |r| self.request(r))?;
        for _ in 0..64 {
            let Some(c) = self.cq.poll() else { break };
            active = true;
            self.completion(c)?;
        }
        if self.tx.outbox_len() > 0 {
            self.tx.flush()?;
        }
        if !self.removals.is_empty() {
            self.try_removals()?;
        }
        Ok(active)
    }

    fn sleep(&mut self, waker: &Waker) {
        // Sleep on the rails' sockets too: a message wakes this thread, which reads it
        // itself, instead of braid's engine thread, which would then ring the doorbell.
        if let Some(armed) = self.cq.arm() {
            if !self.cq.is_empty() || !self.shared.requests.lock().is_empty() {
                return;
            }
            self.poll_with(Some(armed.as_fd().as_raw_fd()));
            return;
        }
        // Hand the endpoints' reads back to braid's engine, whose completions then ring the
        // doorbell through the queue's waker.
        if let Some(c) = self.cq.wait(Duration::ZERO) {
            if let Err(e) = self.completion(c) {
                self.failed(reason(e));
            }
            return;
        }
        let mut next = self.cq.next();
        if let Poll::Ready(c) = Pin::new(&mut next).poll(&mut TaskContext::from_waker(waker)) {
            if let Err(e) = self.completion(c) {
                self.failed(reason(e));
            }
            return;
        }
        if !self.shared.requests.lock().is_empty() {
            return;
        }
        self.poll_with(None);
    }

    /// Sleeps (at most 100 ms) until a fault, a request from an application thread, or
    /// `rails` (an armed completion queue's descriptor) is readable.
    fn poll_with(&self, rails: Option<RawFd>) {
        let pollfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut fds = [
            pollfd(self.faults.fd()),
            pollfd(self.shared.doorbell.fd()),
            pollfd(rails.unwrap_or(-1)),
        ];
        let n = if rails.is_some() { 3 } else { 2 };
        // SAFETY: `n` valid pollfd entries.
        unsafe { libc::poll(fds.as_mut_ptr(), n, 100) };
        self.shared.doorbell.clear();
    }

    /// The group failed: wake every waiter; threads blocked in faults cannot be answered,
    /// so the process ends (see `docs/DSM.md`).
    fn failed(&mut self, why: String) {
        self.shared.fail(why);
        if self.node.outstanding() > 0 {
            self.unservable(self.node.outstanding());
        }
    }

    fn unservable(&self, n: usize) -> ! {
        eprintln!(
            "braid-dsm: rank {}: {}; {n} page fault(s) of this process cannot be served; \
             ending the process (exit status {EXIT_UNSERVABLE})",
            self.node.rank(),
            self.shared.failure().unwrap_or_default()
        );
        // SAFETY: ends the process without running destructors of blocked threads' state.
        unsafe { libc::_exit(EXIT_UNSERVABLE) }
    }

    fn fault(&mut self, f: Fault) -> Result<(), DsmError> {
        self.local.faults += 1;
        if self.shared.failure().is_some() {
            self.unservable(1);
        }
        if f.addr < self.base || f.addr >= self.base + self.len {
            return Err(DsmError::Failed(format!(
                "a fault at {:#x} outside the shared range",
                f.addr
            )));
        }
        let page = ((f.addr - self.base) / self.page) as PageId;
        self.trace.rec(Ev::Fault, page, f.write as u64);
        let t = Instant::now();
        let before = self.node.pending_slot(page).is_some();
        self.node
            .on_fault(page, f.write)
            .map_err(|e| DsmError::Failed(format!("protocol: {e}")))?;
        self.actions()?;
        if !before && self.node.pending_slot(page).is_some() {
            self.local.requests += 1;
            self.local.fault_to_request_ns += t.elapsed().as_nanos() as u64;
            self.posted.insert(page, Instant::now());
        }
        Ok(())
    }

    fn request(&mut self, r: Request) -> Result<(), DsmError> {
        match r {
            Request::Send { to, msg } => self.tx.send(to, &msg)?,
            Request::LockWait { lock, ticket } => {
                self.node
                    .lock_wait(lock, ticket)
                    .map_err(|e| DsmError::Failed(format!("protocol: {e}")))?;
                self.actions()?;
            }
            Request::LockHandoff { lock, ticket } => {
                self.node
                    .lock_handoff(lock, ticket)
                    .map_err(|e| DsmError::Failed(format!("protocol: {e}")))?;
                self.actions()?;
            }
            Request::AddAllocation {
                first,
                pages,
                policy,
                token,
            } => {
                let r = self
                    .node
                    .add_allocation(first, pages, policy)
                    .map(|_| 0)
                    .map_err(|e| e.to_string());
                self.shared.update(|w| {
                    w.results.insert(token, r);
                });
            }
            Request::RemoveAllocation { first, token } => {
                self.removals.push((first, token));
                self.try_removals()?;
            }
            Request::Stop => self.stopping = true,
        }
        Ok(())
    }

    fn try_removals(&mut self) -> Result<(), DsmError> {
        let mut i = 0;
        while i < self.removals.len() {
            let (first, token) = self.removals[i];
            if self.node.is_quiescent(first) {
                let r = self
                    .node
                    .remove_allocation(first)
                    .map(|_| 0)
                    .map_err(|e| e.to_string());
                self.shared.update(|w| {
                    w.results.insert(token, r);
                });
                self.removals.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn completion(&mut self, c: Completion) -> Result<(), DsmError> {
        let kind = c.wr_id >> 56;
        let peer = self.tx.world.peer_of(c.endpoint);
        if !c.status.is_ok() {
            if kind == WR_ATOMIC {
                let token = c.wr_id & ((1 << 56) - 1);
                let why = format!("atomic on rank {peer:?}: {:?}", c.status);
                self.shared.update(|w| {
                    w.results.insert(token, Err(why));
                });
            }
            return Err(DsmError::Failed(match peer {
                Some(p) => format!("rank {p} failed or is unreachable ({:?})", c.status),
                None => format!("an endpoint failed ({:?})", c.status),
            }));
        }
        match kind {
            WR_RECV => {
                let peer = ((c.wr_id >> 20) & 0xF_FFFF_FFFF) as Rank;
                let i = (c.wr_id & 0xF_FFFF) as usize;
                let msg = match c.kind {
                    CompletionKind::RecvWriteImm => self.staged_grant(peer, c.imm)?,
                    _ => {
                        let bytes = self.tx.received(peer, i)?;
                        if c.byte_len != bytes.len() as u64 {
                            return Err(DsmError::Failed(format!(
                                "rank {peer} sent a message of {} bytes",
                                c.byte_len
                            )));
                        }
                        Msg::decode(&bytes)
                            .map_err(|e| DsmError::Failed(format!("rank {peer}: {e}")))?
                    }
                };
                // Serve first, repost after: the receive's buffer has been copied out (a
                // grant's page is in its staging slot), and the braid acknowledgement of
                // the message then leaves with whatever the handling sent to `peer`.
                self.message(peer, msg)?;
                self.tx.repost(peer, i)?;
            }
            WR_CTRL | WR_PAGE => self.tx.sent(kind, (c.wr_id & 0xFFFF_FFFF) as u32),
            WR_ATOMIC => {
                let token = c.wr_id & ((1 << 56) - 1);
                let v = c.value.unwrap_or(0);
                self.shared.update(|w| {
                    w.results.insert(token, Ok(v));
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// The grant that came with page data into a staging slot.
    fn staged_grant(&self, peer: Rank, imm: Option<u32>) -> Result<Msg, DsmError> {
        let bad = |why: &str| DsmError::Failed(format!("rank {peer}: page data {why}"));
        let slot = imm.ok_or_else(|| bad("without a slot number"))?;
        let hdr = self
            .tx
            .staged_header(slot)
            .map_err(|_| bad("into a slot beyond the staging area"))?;
        let msg = Msg::decode(&hdr).map_err(|e| bad(&e.to_string()))?;
        match msg {
            Msg::Grant {
                page,
                payload: Payload::Data,
                ..
            } if self.node.pending_slot(page) == Some(slot) => Ok(msg),
            _ => Err(bad("that no request of this rank waits for in that slot")),
        }
    }

    fn message(&mut self, peer: Rank, msg: Msg) -> Result<(), DsmError> {
        self.local.messages += 1;
        self.arrived = Some(Instant::now());
        let (p, k) = msg_kind(&msg);
        self.trace.rec(Ev::Msg, p, peer as u64 * 16 + k);
        if let Msg::Grant { page, .. } = msg
            && let Some(t) = self.posted.remove(&page)
        {
            self.local.request_to_grant_ns += t.elapsed().as_nanos() as u64;
        }
        match msg {
            Msg::Barrier { epoch, round } => self.shared.update(|w| {
                *w.barrier.entry((epoch, round)).or_default() += 1;
            }),
            Msg::Gather { seq, a, b } => {
                let size = self.node.size() as usize;
                self.shared.update(|w| {
                    w.gather.entry(seq).or_insert_with(|| vec![None; size])[peer as usize] =
                        Some((a, b));
                });
            }
            _ => {
                self.node
                    .on_message(peer, msg)
                    .map_err(|e| DsmError::Failed(format!("protocol: {e}")))?;
                self.actions()?;
            }
        }
        Ok(())
    }

    fn actions(&mut self) -> Result<(), DsmError> {
        while let Some(a) = self.node.poll_action() {
            self.execute(a)?;
        }
        Ok(())
    }

    fn execute(&mut self, a: Action) -> Result<(), DsmError> {
        let page_len = self.page;
        let os = |what: &str, e| DsmError::Os(format!("{what} ({a:?})"), e);
        match a {
            Action::Send {
                to,
                msg: msg @ Msg::Confirm { .. },
            } => self.confirms.push((to, msg)),
            Action::Send { to, msg } => {
                let (p, k) = msg_kind(&msg);
                self.trace.rec(Ev::Send, p, to as u64 * 16 + k);
                self.tx.send(to, &msg)?;
                self.trace.rec(Ev::Sent, p, to as u64 * 16 + k);
            }
            Action::SendPage {
                to,
                slot,
                msg,
                drop,
            } => {
                let Msg::Grant { page, .. } = msg else {
                    return Err(DsmError::Failed(format!("bad action {a:?}")));
                };
                let p = self.addr(page);
                let snap = self.tx.snapshot(&msg, p)?;
                if drop {
                    uffd::drop_pages(p, page_len).map_err(|e| os("dropping a page", e))?;
                    self.local.drops += 1;
                }
                self.trace.rec(Ev::Send, page, to as u64 * 16 + 6);
                self.tx.send_page(to, slot, snap)?;
                self.trace.rec(Ev::Sent, page, to as u64 * 16 + 6);
                self.local.pages_sent += 1;
                if let Some(t) = self.arrived {
                    self.local.serve_ns += t.elapsed().as_nanos() as u64;
                }
            }
            Action::Install {
                page,
                write,
                source,
            } => {
                let src = match source {
                    Source::Zero => self.zero.as_ptr(),
                    Source::Slot(s) => self.tx.staged_page(s),
                };
                // SAFETY: `src` is a page of the zero buffer or of the staging region; the
                // destination is a page of the registered range that the core says is absent.
                let t = Instant::now();
                unsafe { self.faults.install(self.addr(page), src, page_len, write) }
                    .map_err(|e| os("installing a page", e))?;
                self.trace.rec(Ev::Installed, page, 0);
                self.local.installs += 1;
                self.local.install_ns += t.elapsed().as_nanos() as u64;
            }
            Action::Upgrade { page } => {
                let t = Instant::now();
                self.faults
                    .unprotect(self.addr(page), page_len)
                    .map_err(|e| os("unprotecting a page", e))?;
                self.trace.rec(Ev::Installed, page, 1);
                self.local.install_ns += t.elapsed().as_nanos() as u64;
            }
            Action::Protect { page } => self
                .faults
                .protect(self.addr(page), page_len)
                .map_err(|e| os("protecting a page", e))?,
            Action::Drop { page } => {
                uffd::drop_pages(self.addr(page), page_len)
                    .map_err(|e| os("dropping a page", e))?;
                self.trace.rec(Ev::Dropped, page, 0);
                self.local.drops += 1;
            }
            Action::Wake { page } => self
                .faults
                .wake(self.addr(page), page_len)
                .map_err(|e| os("waking", e))?,
            Action::LockGranted { lock, ticket } => self.shared.update(|w| {
                w.grants.insert((lock, ticket));
            }),
        }
        Ok(())
    }
}

/// Runs `run` on every item, in order, even after one fails, and returns the first error.
/// The service thread takes faults and requests in batches: after an error (the group then
/// fails) the rest of a batch must still be seen: a `Stop` behind a failed `Send` to a dead
/// rank was lost that way, and the runtime's drop waited for this thread for ever (the
/// `dead_rank` test, once in a CI run); a fault left out would never be answered.
fn each_of<T, E>(
    items: impl IntoIterator<Item = T>,
    mut run: impl FnMut(T) -> Result<(), E>,
) -> Result<(), E> {
    let mut first = Ok(());
    for item in items {
        let r = run(item);
        if first.is_ok() {
            first = r;
        }
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_behind_a_failed_request_is_still_seen() {
        let reqs = vec![
            Request::LockWait { lock: 1, ticket: 0 },
            Request::LockHandoff { lock: 1, ticket: 1 },
            Request::Stop,
        ];
        let mut seen = Vec::new();
        let r = each_of(reqs, |r| {
            seen.push(format!("{r:?}"));
            match r {
                Request::LockWait { .. } => Err("rank 1 is gone"),
                Request::LockHandoff { .. } => Err("second error"),
                _ => Ok(()),
            }
        });
        assert_eq!(r, Err("rank 1 is gone"), "the first error is returned");
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[2], "Stop");
        assert_eq!(each_of(Vec::<u8>::new(), |_| Err(())), Ok(()));
    }
}
