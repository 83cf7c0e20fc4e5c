//! braid mode: an ES-API stream socket riding a braid endpoint over several rails.
//!
//! * **Attach.** Both ends hold a connected TCP socket (the *bootstrap*) and call
//!   [`BraidBackend::attach`] on it, one as [`BraidRole::Connect`], the other as
//!   [`BraidRole::Accept`]. The accepting side listens on its rail addresses (port 0 by
//!   default) and sends them over the bootstrap socket; the connecting side opens one rail
//!   to each (binding its own rail IPs if given), reports the rails it made, the accepting
//!   side checks that the endpoint it accepted is the same one, and both mark the socket.
//!   The bootstrap socket then stays idle; the library watches it for end of stream.
//! * **Data path (rsockets-style direct placement).** A receive registers its buffer
//!   (exactly that range, remote-write only, revoked when the receive completes) and sends
//!   an *advertisement* (key, length, receive sequence number) to the peer with a braid
//!   `send`. The sender keeps a FIFO of advertised buffers and writes its bytes with
//!   `write_with_imm` straight into them; the 32-bit immediate says how many bytes, which
//!   receive (its sequence number modulo 256) and whether that receive is now complete.
//!   Both sides keep [`CTRL_RECVS`] small receives posted for advertisements, immediates
//!   and end-of-stream messages.
//! * **Completions.** One thread (`exs-braid`) drains the shared braid completion queue,
//!   drives each socket's state machine, and hands finished operations to
//!   [`core::complete`], which posts the ES-API events.
//!
//! Locks: the front's `Core` lock, then [`BraidBackend::tables`], then a socket's own
//! mutex; `core::complete` is only called with none of them held.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskCx, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use braid::{
    Access, Completion, CompletionKind, CompletionQueue, Context, Endpoint, EndpointOptions,
    Error as BraidError, RailAddr, Region, RemoteKey, Sge, Status,
};
use parking_lot::Mutex;

use crate::core::{self, Backend, Errno, Op, OpKind};

/// Which side of the bootstrap connection a program is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BraidRole {
    /// The side that called `connect()`: it opens the rails (`EXS_BRAID_CONNECT`).
    Connect,
    /// The side that called `accept()`: it listens for the rails (`EXS_BRAID_ACCEPT`).
    Accept,
}

/// Control receives each side keeps posted.
pub(crate) const CTRL_RECVS: usize = 256;
/// Control sends in flight per socket (a ring of slots).
const CTRL_SENDS: usize = 256;
const SLOT: usize = 64;
const MSG_LEN: usize = 48;
/// Largest single `write_with_imm` (the immediate has 23 bits of length).
pub(crate) const WRITE_MAX: usize = 4 << 20;
/// How often the bootstrap sockets are checked for end of stream or reuse.
const WATCH: Duration = Duration::from_millis(20);
/// Bound on the whole attach exchange.
pub(crate) const ATTACH_TIMEOUT: Duration = Duration::from_secs(15);

const TAG_SHIFT: u32 = 62;
const TAG_CTRL_RECV: u64 = 0;
const TAG_CTRL_SEND: u64 = 1;
const TAG_WRITE: u64 = 2;

const MSG_ADVERT: u8 = 1;
const MSG_FINREQ: u8 = 2;
const MSG_FIN: u8 = 3;
const ADV_LAST: u8 = 1;
const ADV_WAITALL: u8 = 2;

const IMM_FINAL: u32 = 1 << 31;

fn imm_encode(final_: bool, seq: u32, len: usize) -> u32 {
    debug_assert!(len < (1 << 23));
    (if final_ { IMM_FINAL } else { 0 }) | ((seq & 0xff) << 23) | len as u32
}

fn imm_decode(imm: u32) -> (bool, u32, usize) {
    (
        imm & IMM_FINAL != 0,
        (imm >> 23) & 0xff,
        (imm & 0x7f_ffff) as usize,
    )
}

type Done = Vec<(Box<Op>, Result<usize, Errno>)>;

// ---------------------------------------------------------------------------------------
// Per-socket state

struct RecvEnt {
    op: Box<Op>,
    regions: Vec<Region>,
    seq: u32,
    got: usize,
}

struct SendEnt {
    op: Box<Op>,
    /// One region per iovec (`None` for empty ones), over the caller's memory.
    regions: Vec<Option<Region>>,
    seq: u64,
    posted: usize,
    acked: usize,
}

struct Advert {
    seq: u32,
    key: RemoteKey,
    len: usize,
    filled: usize,
    last: bool,
    waitall: bool,
}

struct BSock {
    fd: RawFd,
    ino: (u64, u64),
    ep: Endpoint,
    ctrl: Region,
    ctrl_next: u64,
    ctrl_done: u64,
    ctrl_backlog: VecDeque<[u8; MSG_LEN]>,
    recvs: VecDeque<RecvEnt>,
    recv_seq: u32,
    sends: VecDeque<SendEnt>,
    send_seq: u64,
    adverts: VecDeque<Advert>,
    /// Writes in flight: (send seq, bytes), in post order.
    writes: VecDeque<(u64, usize)>,
    write_id: u64,
    bytes_sent: u64,
    bytes_recvd: u64,
    /// We asked the peer to finish its direction (our bootstrap saw end of stream).
    finreq_sent: bool,
    /// Our direction is to be finished once our sends drain.
    fin_wanted: bool,
    fin_sent: bool,
    fin_recvd: bool,
    local_closed: bool,
    closed: bool,
    failed: Option<Errno>,
    /// Operations refused after the fact (sends after end of stream), completed in order.
    deferred: Done,
}

// SAFETY: the raw pointers inside `Op`s (caller memory) are owned by the library until the
// operation completes; the state only moves between threads under its mutex.
unsafe impl Send for BSock {}

fn ctrl_recv_sge(ctrl: &Region, slot: usize) -> Sge {
    Sge {
        region: ctrl.clone(),
        offset: slot * SLOT,
        len: SLOT,
    }
}

impl BSock {
    fn outstanding(&self) -> usize {
        self.recvs.len() + self.sends.len() + self.deferred.len()
    }

    fn fail(&mut self, e: Errno) {
        if self.failed.is_none() {
            tracing::debug!(fd = self.fd, errno = e, "exs braid socket failed");
            self.failed = Some(e);
            if !self.closed {
                self.closed = true;
                self.ep.close();
            }
        }
    }

    fn post_ctrl(&mut self, msg: [u8; MSG_LEN]) {
        self.ctrl_backlog.push_back(msg);
        self.flush_ctrl();
    }

    fn flush_ctrl(&mut self) {
        while self.failed.is_none() && (self.ctrl_next - self.ctrl_done) < CTRL_SENDS as u64 {
            let Some(msg) = self.ctrl_backlog.pop_front() else {
                return;
            };
            let slot = CTRL_RECVS + (self.ctrl_next % CTRL_SENDS as u64) as usize;
            if self.ctrl.write_at(slot * SLOT, &msg).is_err() {
                self.fail(libc::EIO);
                return;
            }
            let sge = Sge {
                region: self.ctrl.clone(),
                offset: slot * SLOT,
                len: MSG_LEN,
            };
            match self
                .ep
                .send((TAG_CTRL_SEND << TAG_SHIFT) | self.ctrl_next, &[sge])
            {
                Ok(()) => self.ctrl_next += 1,
                Err(BraidError::QueueFull { .. }) => {
                    self.ctrl_backlog.push_front(msg);
                    return;
                }
                Err(e) => {
                    tracing::debug!("exs braid: control send: {e}");
                    self.fail(libc::ECONNRESET);
                    return;
                }
            }
        }
    }

    /// Start a receive: register its buffers and advertise them.
    fn start_recv(&mut self, op: Box<Op>, ctx: &Context) {
        let seq = self.recv_seq;
        self.recv_seq = self.recv_seq.wrapping_add(1);
        let mut ent = RecvEnt {
            op,
            regions: Vec::new(),
            seq,
            got: 0,
        };
        if self.failed.is_some() || self.fin_recvd {
            self.recvs.push_back(ent);
            return;
        }
        let n = ent.op.iov.len();
        let waitall = ent.op.waitall;
        let mut msgs = Vec::new();
        for (i, v) in ent.op.iov.iter().enumerate() {
            if v.iov_len == 0 {
                continue;
            }
            // SAFETY: the caller handed this memory to the library until the receive's event;
            // the region is dropped (key revoked, in-flight placements waited for) before it.
            let r = unsafe {
                ctx.register(
                    v.iov_base.cast(),
                    v.iov_len,
                    Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                )
            };
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("exs braid: cannot register a receive buffer: {e}");
                    self.fail(libc::ENOMEM);
                    self.recvs.push_back(ent);
                    return;
                }
            };
            let mut m = [0u8; MSG_LEN];
            m[0] = MSG_ADVERT;
            m[1] = if i + 1 == n { ADV_LAST } else { 0 } | if waitall { ADV_WAITALL } else { 0 };
            m[4..8].copy_from_slice(&seq.to_le_bytes());
            m[8..24].copy_from_slice(&r.remote_key().to_bytes());
            m[24..32].copy_from_slice(&(v.iov_len as u64).to_le_bytes());
            msgs.push(m);
            ent.regions.push(r);
        }
        if let Some(last) = msgs.last_mut() {
            last[1] |= ADV_LAST;
        }
        self.recvs.push_back(ent);
        for m in msgs {
            self.post_ctrl(m);
        }
    }

    fn start_send(&mut self, op: Box<Op>, ctx: &Context) {
        if self.fin_sent {
            self.deferred.push((op, Err(libc::EPIPE)));
            return;
        }
        let seq = self.send_seq;
        self.send_seq += 1;
        let mut regions = Vec::with_capacity(op.iov.len());
        for v in &op.iov {
            if v.iov_len == 0 {
                regions.push(None);
                continue;
            }
            // SAFETY: as for receives; the peer gets no right on a send buffer.
            match unsafe { ctx.register(v.iov_base.cast(), v.iov_len, Access::NONE) } {
                Ok(r) => regions.push(Some(r)),
                Err(e) => {
                    tracing::warn!("exs braid: cannot register a send buffer: {e}");
                    self.fail(libc::ENOMEM);
                    regions.push(None);
                }
            }
        }
        self.sends.push_back(SendEnt {
            op,
            regions,
            seq,
            posted: 0,
            acked: 0,
        });
    }

    /// The scatter list for bytes `[from, from + n)` of a send.
    fn sgl(s: &SendEnt, mut from: usize, mut n: usize) -> Vec<Sge> {
        let mut out = Vec::new();
        for (v, r) in s.op.iov.iter().zip(&s.regions) {
            if n == 0 {
                break;
            }
            if from >= v.iov_len {
                from -= v.iov_len;
                continue;
            }
            let take = (v.iov_len - from).min(n);
            if let Some(r) = r {
                out.push(Sge {
                    region: r.clone(),
                    offset: from,
                    len: take,
                });
            }
            n -= take;
            from = 0;
        }
        out
    }

    /// Write queued send bytes into advertised receive buffers.
    fn pump(&mut self) {
        while self.failed.is_none() {
            let Some(si) = self.sends.iter().position(|s| s.posted < s.op.total) else {
                return;
            };
            let Some(ad) = self.adverts.front() else {
                return;
            };
            let avail = self.sends[si].op.total - self.sends[si].posted;
            let n = avail.min(ad.len - ad.filled).min(WRITE_MAX);
            let more = avail > n || self.sends.iter().skip(si + 1).any(|s| s.op.total > 0);
            let seg_full = ad.filled + n == ad.len;
            let final_ = (seg_full && ad.last) || (!more && !ad.waitall);
            let imm = imm_encode(final_, ad.seq, n);
            let sgl = Self::sgl(&self.sends[si], self.sends[si].posted, n);
            let (key, off, adseq) = (ad.key, ad.filled as u64, ad.seq);
            let wr = (TAG_WRITE << TAG_SHIFT) | self.write_id;
            match self.ep.write_with_imm(wr, &sgl, &key, off, imm) {
                Ok(()) => {}
                Err(BraidError::QueueFull { .. }) => return,
                Err(e) => {
                    tracing::debug!("exs braid: write: {e}");
                    self.fail(libc::EPIPE);
                    return;
                }
            }
            self.write_id += 1;
            self.writes.push_back((self.sends[si].seq, n));
            self.sends[si].posted += n;
            self.bytes_sent += n as u64;
            let ad = self.adverts.front_mut().expect("checked above");
            ad.filled += n;
            if final_ {
                while self.adverts.front().is_some_and(|a| a.seq == adseq) {
                    self.adverts.pop_front();
                }
            } else if seg_full {
                self.adverts.pop_front();
            }
        }
    }

    fn on_ctrl_msg(&mut self, m: &[u8; SLOT]) {
        match m[0] {
            MSG_ADVERT => {
                let seq = u32::from_le_bytes(m[4..8].try_into().expect("4 bytes"));
                let key = RemoteKey::from_bytes(&m[8..24]).expect("16 bytes");
                let len = u64::from_le_bytes(m[24..32].try_into().expect("8 bytes"));
                if len == 0 || len > key.len {
                    self.fail(libc::EPROTO);
                    return;
                }
                self.adverts.push_back(Advert {
                    seq,
                    key,
                    len: len as usize,
                    filled: 0,
                    last: m[1] & ADV_LAST != 0,
                    waitall: m[1] & ADV_WAITALL != 0,
                });
            }
            MSG_FINREQ => self.fin_wanted = true,
            MSG_FIN => {
                let total = u64::from_le_bytes(m[32..40].try_into().expect("8 bytes"));
                if total != self.bytes_recvd {
                    tracing::warn!(
                        fd = self.fd,
                        sent = total,
                        received = self.bytes_recvd,
                        "exs braid: peer's byte count disagrees at end of stream"
                    );
                    self.fail(libc::EPROTO);
                    return;
                }
                self.fin_recvd = true;
            }
            _ => self.fail(libc::EPROTO),
        }
    }

    fn on_data(&mut self, imm: u32, out: &mut Done) {
        let (final_, seq, len) = imm_decode(imm);
        let Some(r) = self.recvs.front_mut() else {
            self.fail(libc::EPROTO);
            return;
        };
        if r.seq & 0xff != seq || r.got + len > r.op.total {
            self.fail(libc::EPROTO);
            return;
        }
        r.got += len;
        self.bytes_recvd += len as u64;
        if final_ {
            let mut r = self.recvs.pop_front().expect("front exists");
            // Revoke the keys (waiting for placements still holding the memory) before the
            // buffer goes back to the application.
            r.regions.clear();
            let got = r.got;
            out.push((r.op, Ok(got)));
        }
    }

    fn on_completion(&mut self, c: &Completion, out: &mut Done) {
        let tag = c.wr_id >> TAG_SHIFT;
        if c.status != Status::Success {
            // Our own close flushes what was still posted: not an error of the stream.
            if !(self.closed && c.status == Status::Flushed) {
                self.fail(match tag {
                    TAG_WRITE | TAG_CTRL_SEND => libc::EPIPE,
                    _ => libc::ECONNRESET,
                });
            }
            return;
        }
        match tag {
            TAG_CTRL_RECV => {
                let slot = (c.wr_id & 0xffff) as usize;
                match c.kind {
                    CompletionKind::RecvWriteImm => self.on_data(c.imm.unwrap_or(0), out),
                    _ => {
                        let mut m = [0u8; SLOT];
                        if self.ctrl.read_at(slot * SLOT, &mut m).is_err() || c.byte_len == 0 {
                            self.fail(libc::EPROTO);
                            return;
                        }
                        self.on_ctrl_msg(&m);
                    }
                }
                if self.failed.is_none()
                    && self
                        .ep
                        .post_recv(c.wr_id, &[ctrl_recv_sge(&self.ctrl, slot)])
                        .is_err()
                {
                    self.fail(libc::ECONNRESET);
                }
            }
            TAG_CTRL_SEND => self.ctrl_done += 1,
            TAG_WRITE => {
                let Some((sseq, n)) = self.writes.pop_front() else {
                    return;
                };
                if let Some(s) = self.sends.iter_mut().find(|s| s.seq == sseq) {
                    s.acked += n;
                }
            }
            _ => {}
        }
    }

    /// Move the state machine on; finished operations go to `out` in order.
    fn progress(&mut self, out: &mut Done) {
        if self.failed.is_none() {
            self.pump();
        }
        while self
            .sends
            .front()
            .is_some_and(|s| s.acked == s.op.total && s.posted == s.op.total)
            && self.failed.is_none()
        {
            let s = self.sends.pop_front().expect("front exists");
            let n = s.op.total;
            drop(s.regions);
            out.push((s.op, Ok(n)));
        }
        if self.fin_recvd {
            // Every byte the peer sent has been placed: the rest end the stream.
            while let Some(mut r) = self.recvs.pop_front() {
                r.regions.clear();
                let got = r.got;
                out.push((r.op, Ok(got)));
            }
        }
        if let Some(e) = self.failed {
            let (re, se) = match e {
                libc::EPIPE | libc::ECONNRESET => (libc::ECONNRESET, libc::EPIPE),
                e => (e, e),
            };
            while let Some(mut r) = self.recvs.pop_front() {
                r.regions.clear();
                out.push((r.op, Err(re)));
            }
            while let Some(s) = self.sends.pop_front() {
                drop(s.regions);
                out.push((s.op, Err(se)));
            }
            self.adverts.clear();
            self.writes.clear();
        }
        if self.fin_wanted && !self.fin_sent && self.sends.is_empty() && self.failed.is_none() {
            let mut m = [0u8; MSG_LEN];
            m[0] = MSG_FIN;
            m[32..40].copy_from_slice(&self.bytes_sent.to_le_bytes());
            self.fin_sent = true;
            self.post_ctrl(m);
        }
        self.flush_ctrl();
        out.append(&mut self.deferred);
    }

    /// Whether the state can go: nothing outstanding and both directions finished (or the
    /// endpoint failed and the descriptor is gone).
    fn finished(&mut self) -> bool {
        if self.outstanding() > 0 {
            return false;
        }
        let both = self.fin_sent && self.fin_recvd && self.ctrl_done == self.ctrl_next;
        let dead = self.failed.is_some() && self.local_closed;
        let abandoned = self.local_closed && self.fin_sent && self.ctrl_done == self.ctrl_next;
        if both || dead || abandoned {
            if !self.closed {
                self.closed = true;
                self.ep.close();
            }
            return true;
        }
        false
    }
}

// ---------------------------------------------------------------------------------------
// The backend

#[derive(Default)]
struct Tables {
    by_fd: HashMap<RawFd, Arc<Mutex<BSock>>>,
    by_ep: HashMap<u64, Arc<Mutex<BSock>>>,
}

/// The braid-mode backend: one braid [`Context`] and completion queue per process, one
/// endpoint per attached socket, one completion thread.
pub(crate) struct BraidBackend {
    ctx: Context,
    cq: CompletionQueue,
    tables: Mutex<Tables>,
    attention: Mutex<Vec<Arc<Mutex<BSock>>>>,
    orphans: Mutex<Done>,
    thread: Thread,
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

fn braid_errno(e: &BraidError) -> Errno {
    match e {
        BraidError::Io(io) => io.raw_os_error().unwrap_or(libc::EIO),
        BraidError::InvalidArgument(_) => libc::EINVAL,
        BraidError::Timeout(_) => libc::ETIMEDOUT,
        BraidError::Handshake { .. } | BraidError::VersionMismatch { .. } => libc::EPROTO,
        BraidError::Refused { .. } => libc::ECONNREFUSED,
        BraidError::QueueFull { .. } => libc::EAGAIN,
        _ => libc::EIO,
    }
}

impl BraidBackend {
    pub(crate) fn start() -> Result<Arc<Self>, Errno> {
        let ctx = Context::new().map_err(|e| braid_errno(&e))?;
        let cq = ctx.create_cq(1 << 22);
        let (tx, rx) = std::sync::mpsc::channel::<Arc<BraidBackend>>();
        let th = std::thread::Builder::new()
            .name("exs-braid".into())
            .spawn(move || {
                if let Ok(me) = rx.recv() {
                    me.run();
                }
            })
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))?;
        let me = Arc::new(BraidBackend {
            ctx,
            cq,
            tables: Mutex::new(Tables::default()),
            attention: Mutex::new(Vec::new()),
            orphans: Mutex::new(Vec::new()),
            thread: th.thread().clone(),
        });
        tx.send(me.clone()).map_err(|_| libc::EAGAIN)?;
        // SAFETY: registering a plain extern "C" function.
        unsafe { libc::atexit(at_exit) };
        Ok(me)
    }

    /// At process exit every attached socket's stream is ended as the kernel ends a TCP
    /// stream: the end-of-stream message goes out once the sends already posted are written
    /// (bounded by `timeout`), so the peer's receives complete with 0 rather than failing.
    fn flush_at_exit(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let Some(t) = self.tables.try_lock_for(Duration::from_millis(100)) else {
            return;
        };
        let socks: Vec<_> = t.by_ep.values().cloned().collect();
        drop(t);
        for s in &socks {
            if let Some(mut st) = s.try_lock_for(Duration::from_millis(100)) {
                st.fin_wanted = true;
            }
            self.kick(s.clone());
        }
        while Instant::now() < deadline {
            let done = socks.iter().all(|s| {
                s.try_lock_for(Duration::from_millis(10)).is_none_or(|st| {
                    st.failed.is_some() || (st.fin_sent && st.ctrl_done == st.ctrl_next)
                })
            });
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether `fd` is attached (and still the same socket as when it was attached).
    pub(crate) fn is_attached(&self, fd: RawFd) -> bool {
        let mut t = self.tables.lock();
        let Some(s) = t.by_fd.get(&fd).cloned() else {
            return false;
        };
        let same = {
            let mut st = s.lock();
            if socket_id(fd) == Some(st.ino) {
                true
            } else {
                st.local_closed = true;
                false
            }
        };
        if !same {
            t.by_fd.remove(&fd);
            drop(t);
            self.kick(s);
        }
        same
    }

    fn kick(&self, s: Arc<Mutex<BSock>>) {
        self.attention.lock().push(s);
        self.thread.unpark();
    }

    fn run(self: Arc<Self>) {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = TaskCx::from_waker(&waker);
        let mut batch = Vec::with_capacity(256);
        let mut last_watch = Instant::now();
        loop {
            batch.clear();
            self.cq.poll_many(&mut batch, 256);
            let got = !batch.is_empty();
            for c in batch.drain(..) {
                self.on_completion(c);
            }
            let att = std::mem::take(&mut *self.attention.lock());
            for s in att {
                self.service(&s, None);
            }
            let orphans = std::mem::take(&mut *self.orphans.lock());
            for (op, r) in orphans {
                core::complete(op, r);
            }
            if last_watch.elapsed() >= WATCH {
                last_watch = Instant::now();
                self.watch();
            }
            if got {
                continue;
            }
            let mut next = self.cq.next();
            match Pin::new(&mut next).poll(&mut cx) {
                Poll::Ready(c) => self.on_completion(c),
                Poll::Pending => std::thread::park_timeout(WATCH),
            }
        }
    }

    fn on_completion(&self, c: Completion) {
        let s = self.tables.lock().by_ep.get(&c.endpoint).cloned();
        if let Some(s) = s {
            self.service(&s, Some(&c));
        }
    }

    /// Feed a completion (if any) to a socket, move it on, complete what finished, and
    /// forget the socket once it is done.
    fn service(&self, s: &Arc<Mutex<BSock>>, c: Option<&Completion>) {
        let mut out = Vec::new();
        let (finished, fd, ep) = {
            let mut st = s.lock();
            if let Some(c) = c {
                st.on_completion(c, &mut out);
            }
            st.progress(&mut out);
            (st.finished(), st.fd, st.ep.id())
        };
        for (op, r) in out {
            core::complete(op, r);
        }
        if finished {
            let mut t = self.tables.lock();
            t.by_ep.remove(&ep);
            if t.by_fd.get(&fd).is_some_and(|x| Arc::ptr_eq(x, s)) {
                t.by_fd.remove(&fd);
            }
            tracing::debug!(fd, "exs braid socket detached");
        }
    }

    /// Check the bootstrap sockets: end of stream from the peer, or closed here.
    fn watch(&self) {
        let socks: Vec<_> = self.tables.lock().by_ep.values().cloned().collect();
        for s in socks {
            let changed = {
                let mut st = s.lock();
                let before = (st.local_closed, st.finreq_sent);
                if !st.local_closed {
                    if socket_id(st.fd) != Some(st.ino) {
                        st.local_closed = true;
                    } else {
                        let mut p = libc::pollfd {
                            fd: st.fd,
                            events: libc::POLLRDHUP,
                            revents: 0,
                        };
                        // SAFETY: one valid pollfd, no wait.
                        let r = unsafe { libc::poll(&mut p, 1, 0) };
                        if r > 0 && p.revents & libc::POLLNVAL != 0 {
                            st.local_closed = true;
                        } else if r > 0
                            && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
                            && !st.finreq_sent
                            && st.failed.is_none()
                        {
                            st.finreq_sent = true;
                            let mut m = [0u8; MSG_LEN];
                            m[0] = MSG_FINREQ;
                            st.post_ctrl(m);
                        }
                    }
                }
                if st.local_closed {
                    // Nobody can post on this socket any more: finish our direction once the
                    // sends the application left behind are written.
                    st.fin_wanted = true;
                }
                before != (st.local_closed, st.finreq_sent)
            };
            if changed {
                let fd = s.lock().fd;
                {
                    let mut t = self.tables.lock();
                    if s.lock().local_closed && t.by_fd.get(&fd).is_some_and(|x| Arc::ptr_eq(x, &s))
                    {
                        t.by_fd.remove(&fd);
                    }
                }
                self.service(&s, None);
            }
        }
    }

    /// Attach `fd` (a connected stream socket) to a new braid endpoint; blocks for the
    /// exchange with the peer, at most `timeout`.
    pub(crate) fn attach(
        &self,
        fd: RawFd,
        role: BraidRole,
        spec: Option<&str>,
        timeout: Duration,
    ) -> Result<(), Errno> {
        let deadline = Instant::now() + timeout;
        let ino = socket_id(fd).ok_or(libc::EBADF)?;
        let known = self.tables.lock().by_fd.contains_key(&fd);
        if known && self.is_attached(fd) {
            return Err(libc::EISCONN);
        }
        let mut opts = EndpointOptions::new(&self.cq);
        opts.session.max_outstanding = 8192;
        opts.session.max_recv = CTRL_RECVS + 16;
        opts.connect_timeout = timeout.min(Duration::from_secs(10));
        let ep = match role {
            BraidRole::Connect => self.attach_connect(fd, spec, &opts, deadline)?,
            BraidRole::Accept => self.attach_accept(fd, spec, &opts, deadline)?,
        };
        let ctrl = self
            .ctx
            .alloc_region((CTRL_RECVS + CTRL_SENDS) * SLOT, Access::LOCAL_WRITE)
            .map_err(|e| braid_errno(&e))?;
        let id = ep.id();
        let sock = Arc::new(Mutex::new(BSock {
            fd,
            ino,
            ep,
            ctrl,
            ctrl_next: 0,
            ctrl_done: 0,
            ctrl_backlog: VecDeque::new(),
            recvs: VecDeque::new(),
            recv_seq: 0,
            sends: VecDeque::new(),
            send_seq: 0,
            adverts: VecDeque::new(),
            writes: VecDeque::new(),
            write_id: 0,
            bytes_sent: 0,
            bytes_recvd: 0,
            finreq_sent: false,
            fin_wanted: false,
            fin_sent: false,
            fin_recvd: false,
            local_closed: false,
            closed: false,
            failed: None,
            deferred: Vec::new(),
        }));
        {
            let mut t = self.tables.lock();
            t.by_ep.insert(id, sock.clone());
            t.by_fd.insert(fd, sock.clone());
        }
        let st = sock.lock();
        for slot in 0..CTRL_RECVS {
            if let Err(e) = st.ep.post_recv(
                (TAG_CTRL_RECV << TAG_SHIFT) | slot as u64,
                &[ctrl_recv_sge(&st.ctrl, slot)],
            ) {
                drop(st);
                let mut t = self.tables.lock();
                t.by_ep.remove(&id);
                t.by_fd.remove(&fd);
                return Err(braid_errno(&e));
            }
        }
        drop(st);
        if role == BraidRole::Accept {
            // Receives are posted: let the connecting side go.
            bs_write_all(fd, &Msg::header(MSG_DONE, 0, 0), deadline)?;
        } else {
            let m = read_msg(fd, deadline)?;
            if m.kind != MSG_DONE || m.status != 0 {
                let mut t = self.tables.lock();
                t.by_ep.remove(&id);
                t.by_fd.remove(&fd);
                return Err(libc::EPROTO);
            }
        }
        tracing::debug!(
            fd,
            rails = sock.lock().ep.rail_count(),
            "exs socket in braid mode"
        );
        Ok(())
    }

    fn attach_connect(
        &self,
        fd: RawFd,
        spec: Option<&str>,
        opts: &EndpointOptions,
        deadline: Instant,
    ) -> Result<Endpoint, Errno> {
        let spec = spec_or_env(spec, "EXS_BRAID_RAILS");
        let entries = parse_connect_spec(spec.as_deref())?;
        bs_write_all(fd, &Msg::header(MSG_HELLO_CONNECT, 0, 0), deadline)?;
        let hello = read_msg(fd, deadline)?;
        if hello.kind != MSG_HELLO_ACCEPT {
            return Err(libc::EPROTO);
        }
        if hello.status != 0 || hello.addrs.is_empty() {
            return Err(libc::ECONNREFUSED);
        }
        let listen = hello.addrs;
        let rails: Vec<RailAddr> = if entries.is_empty() {
            listen.iter().map(|&a| RailAddr::new(None, a)).collect()
        } else {
            entries
                .iter()
                .enumerate()
                .map(|(i, e)| match e {
                    ConnectEntry::Full(r) => *r,
                    ConnectEntry::Local(ip) => RailAddr::new(Some(*ip), listen[i % listen.len()]),
                })
                .collect()
        };
        let mut o = opts.clone();
        o.connect_timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
            .min(opts.connect_timeout);
        match self.ctx.connect(&rails, &o) {
            Ok(ep) => {
                let pairs: Vec<SocketAddr> =
                    ep.rail_addrs().iter().flat_map(|&(l, r)| [l, r]).collect();
                bs_write_all(fd, &Msg::encode(MSG_RAILS, 0, &pairs), deadline)?;
                Ok(ep)
            }
            Err(e) => {
                tracing::warn!("exs braid attach: cannot open the rails: {e}");
                let errno = braid_errno(&e);
                let _ = bs_write_all(fd, &Msg::header(MSG_RAILS, 1, 0), deadline);
                Err(errno)
            }
        }
    }

    fn attach_accept(
        &self,
        fd: RawFd,
        spec: Option<&str>,
        opts: &EndpointOptions,
        deadline: Instant,
    ) -> Result<Endpoint, Errno> {
        let spec = spec_or_env(spec, "EXS_BRAID_LISTEN");
        let mut addrs = parse_listen_spec(spec.as_deref())?;
        if addrs.is_empty() {
            addrs.push(SocketAddr::new(local_ip(fd)?, 0));
        }
        let listener = match self.ctx.listen(&addrs) {
            Ok(l) => l,
            Err(e) => {
                let _ = bs_write_all(fd, &Msg::header(MSG_HELLO_ACCEPT, 1, 0), deadline);
                return Err(braid_errno(&e));
            }
        };
        let bound = listener.local_addrs();
        bs_write_all(fd, &Msg::encode(MSG_HELLO_ACCEPT, 0, &bound), deadline)?;
        let hello = read_msg(fd, deadline)?;
        if hello.kind != MSG_HELLO_CONNECT {
            return Err(libc::EPROTO);
        }
        // Accept in short slices so that a connecting side that failed (and said so on the
        // bootstrap socket) ends the wait early.
        let mut rails_msg: Option<Msg> = None;
        let ep = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(libc::ETIMEDOUT);
            }
            match listener.accept(opts, left.min(Duration::from_millis(100))) {
                Ok(ep) => break ep,
                Err(BraidError::Timeout(_)) => {}
                Err(e) => return Err(braid_errno(&e)),
            }
            if rails_msg.is_none() && readable(fd) {
                let m = read_msg(fd, deadline)?;
                if m.kind != MSG_RAILS || m.status != 0 {
                    return Err(libc::ECONNREFUSED);
                }
                rails_msg = Some(m);
            }
        };
        listener.close();
        let m = match rails_msg {
            Some(m) => m,
            None => read_msg(fd, deadline)?,
        };
        if m.kind != MSG_RAILS || m.status != 0 {
            return Err(libc::ECONNREFUSED);
        }
        // The endpoint we accepted must be the one the peer made over this bootstrap socket.
        let ours: Vec<SocketAddr> = ep.rail_addrs().iter().flat_map(|&(l, r)| [r, l]).collect();
        if ours.len() != m.addrs.len() || ours.iter().zip(&m.addrs).any(|(a, b)| !same_addr(a, b)) {
            tracing::warn!(
                "exs braid attach: accepted rails {ours:?} are not the peer's {:?}",
                m.addrs
            );
            let _ = bs_write_all(fd, &Msg::header(MSG_DONE, 1, 0), deadline);
            return Err(libc::EPROTO);
        }
        Ok(ep)
    }
}

extern "C" fn at_exit() {
    if let Some(b) = core::braid_backend() {
        b.flush_at_exit(Duration::from_secs(2));
    }
}

fn same_addr(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.port() == b.port() && canon(a.ip()) == canon(b.ip())
}

fn canon(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Backend for BraidBackend {
    fn start(&self, op: Box<Op>) {
        let s = self.tables.lock().by_fd.get(&op.fd).cloned();
        let Some(s) = s else {
            // Detached between the front's check and here.
            let e = if op.kind == OpKind::Send {
                libc::EPIPE
            } else {
                libc::ECONNRESET
            };
            self.orphans.lock().push((op, Err(e)));
            self.thread.unpark();
            return;
        };
        let kick = {
            let mut st = s.lock();
            match op.kind {
                OpKind::Recv => {
                    st.start_recv(op, &self.ctx);
                    st.failed.is_some() || st.fin_recvd
                }
                OpKind::Send => {
                    st.start_send(op, &self.ctx);
                    if st.failed.is_none() {
                        st.pump();
                    }
                    // Zero-length sends and refusals finish on the completion thread.
                    st.failed.is_some()
                        || !st.deferred.is_empty()
                        || st.sends.back().is_some_and(|x| x.op.total == 0)
                }
                _ => {
                    st.deferred.push((op, Err(libc::EOPNOTSUPP)));
                    true
                }
            }
        };
        if kick {
            self.kick(s);
        }
    }

    fn register(&self, _addr: *mut u8, _len: usize) -> Result<Option<u32>, Errno> {
        // Every operation registers exactly its own buffer with braid (see the crate docs).
        Ok(None)
    }

    fn deregister(&self, _cookie: u32) {}
}

// ---------------------------------------------------------------------------------------
// The bootstrap exchange

const MAGIC: &[u8; 8] = b"EXSBRAID";
const BOOT_VERSION: u16 = 1;
const MSG_HELLO_CONNECT: u8 = 1;
const MSG_HELLO_ACCEPT: u8 = 2;
const MSG_RAILS: u8 = 3;
const MSG_DONE: u8 = 4;
const HDR: usize = 16;
const ADDR: usize = 18;
const MAX_ADDRS: usize = 128;

/// A bootstrap message: magic, version, kind, status, address count, then addresses
/// (16-byte IPv6 or v4-mapped address, big-endian port).
struct Msg {
    kind: u8,
    status: u8,
    addrs: Vec<SocketAddr>,
}

impl Msg {
    fn header(kind: u8, status: u8, n: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(HDR + n * ADDR);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&BOOT_VERSION.to_le_bytes());
        b.push(kind);
        b.push(status);
        b.extend_from_slice(&(n as u16).to_le_bytes());
        b.extend_from_slice(&[0, 0]);
        b
    }

    fn encode(kind: u8, status: u8, addrs: &[SocketAddr]) -> Vec<u8> {
        let mut b = Self::header(kind, status, addrs.len());
        for a in addrs {
            let ip = match a.ip() {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            b.extend_from_slice(&ip.octets());
            b.extend_from_slice(&a.port().to_be_bytes());
        }
        b
    }
}

fn read_msg(fd: RawFd, deadline: Instant) -> Result<Msg, Errno> {
    let mut h = [0u8; HDR];
    bs_read_exact(fd, &mut h, deadline)?;
    if &h[..8] != MAGIC {
        return Err(libc::EPROTO);
    }
    if u16::from_le_bytes([h[8], h[9]]) != BOOT_VERSION {
        return Err(libc::EPROTONOSUPPORT);
    }
    let n = u16::from_le_bytes([h[12], h[13]]) as usize;
    if n > MAX_ADDRS {
        return Err(libc::EPROTO);
    }
    let mut body = vec![0u8; n * ADDR];
    bs_read_exact(fd, &mut body, deadline)?;
    let addrs = body
        .chunks_exact(ADDR)
        .map(|c| {
            let ip = Ipv6Addr::from(<[u8; 16]>::try_from(&c[..16]).expect("16 bytes"));
            let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
            SocketAddr::new(ip, u16::from_be_bytes([c[16], c[17]]))
        })
        .collect();
    Ok(Msg {
        kind: h[10],
        status: h[11],
        addrs,
    })
}

fn wait_fd(fd: RawFd, events: i16, deadline: Instant) -> Result<(), Errno> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(libc::ETIMEDOUT);
        }
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, 1000) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        if r < 0 {
            let e = errno();
            if e == libc::EINTR {
                continue;
            }
            return Err(e);
        }
        if r > 0 {
            if p.revents & libc::POLLNVAL != 0 {
                return Err(libc::EBADF);
            }
            return Ok(());
        }
    }
}

fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

fn bs_write_all(fd: RawFd, mut b: &[u8], deadline: Instant) -> Result<(), Errno> {
    while !b.is_empty() {
        // SAFETY: b is a valid buffer of b.len() bytes.
        let r = unsafe {
            libc::send(
                fd,
                b.as_ptr().cast(),
                b.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        };
        if r >= 0 {
            b = &b[r as usize..];
            continue;
        }
        match errno() {
            libc::EAGAIN => wait_fd(fd, libc::POLLOUT, deadline)?,
            libc::EINTR => {}
            e => return Err(e),
        }
    }
    Ok(())
}

fn bs_read_exact(fd: RawFd, mut b: &mut [u8], deadline: Instant) -> Result<(), Errno> {
    while !b.is_empty() {
        // SAFETY: b is a valid writable buffer of b.len() bytes.
        let r = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        if r > 0 {
            b = &mut b[r as usize..];
            continue;
        }
        if r == 0 {
            // The peer closed during the exchange (or is not calling exs_braid_attach).
            return Err(libc::ECONNRESET);
        }
        match errno() {
            libc::EAGAIN => wait_fd(fd, libc::POLLIN, deadline)?,
            libc::EINTR => {}
            e => return Err(e),
        }
    }
    Ok(())
}

fn errno() -> Errno {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// (device, inode) of the socket behind `fd`: tells a descriptor number reused for another
/// socket from the attached one.
fn socket_id(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: zero is a valid stat; fstat fills it or fails.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } < 0 {
        return None;
    }
    Some((st.st_dev, st.st_ino))
}

fn local_ip(fd: RawFd) -> Result<IpAddr, Errno> {
    // SAFETY: zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the right size.
    if unsafe {
        libc::getsockname(
            fd,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    } < 0
    {
        return Err(errno());
    }
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let sin =
                unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Ok(IpAddr::from(
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let sin6 =
                unsafe { &*(&ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Ok(canon(IpAddr::from(sin6.sin6_addr.s6_addr)))
        }
        _ => Err(libc::EOPNOTSUPP),
    }
}

/// Checks done before any exchange: a connected stream socket.
pub(crate) fn check_bootstrap(fd: RawFd) -> Result<(), Errno> {
    if fd < 0 {
        return Err(libc::EBADF);
    }
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the right size.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut ty as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(errno());
    }
    if ty != libc::SOCK_STREAM {
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid out-pointers of the right size.
    if unsafe {
        libc::getpeername(
            fd,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    } < 0
    {
        return Err(errno());
    }
    if !matches!(ss.ss_family as i32, libc::AF_INET | libc::AF_INET6) {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(())
}

fn spec_or_env(spec: Option<&str>, var: &str) -> Option<String> {
    match spec {
        Some(s) => Some(s.to_string()),
        None => std::env::var(var).ok(),
    }
}

enum ConnectEntry {
    Full(RailAddr),
    Local(IpAddr),
}

fn entries(spec: Option<&str>) -> Result<Vec<&str>, Errno> {
    let Some(s) = spec else {
        return Ok(Vec::new());
    };
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    if v.len() == 1 && v[0].is_empty() {
        return Ok(Vec::new());
    }
    if v.iter().any(|e| e.is_empty()) || v.len() > 64 {
        return Err(libc::EINVAL);
    }
    Ok(v)
}

/// `LOCAL=REMOTE:PORT` (a rail to an explicit address) or `LOCAL` (a rail from this IP to the
/// accepting side's next advertised address), comma-separated; empty: one rail per
/// advertised address, source chosen by the kernel.
fn parse_connect_spec(spec: Option<&str>) -> Result<Vec<ConnectEntry>, Errno> {
    entries(spec)?
        .into_iter()
        .map(|e| {
            if let Ok(ip) = e.parse::<IpAddr>() {
                return Ok(ConnectEntry::Local(ip));
            }
            e.parse::<RailAddr>()
                .map(ConnectEntry::Full)
                .map_err(|_| libc::EINVAL)
        })
        .collect()
}

/// `ADDR` or `ADDR:PORT` (IPv6 as `[ADDR]:PORT`), comma-separated; empty: the bootstrap
/// socket's local address.
fn parse_listen_spec(spec: Option<&str>) -> Result<Vec<SocketAddr>, Errno> {
    entries(spec)?
        .into_iter()
        .map(|e| {
            if let Ok(ip) = e.parse::<IpAddr>() {
                return Ok(SocketAddr::new(ip, 0));
            }
            e.parse::<SocketAddr>().map_err(|_| libc::EINVAL)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imm_round_trip() {
        for (f, s, l) in [(true, 0, 1), (false, 255, WRITE_MAX), (true, 300, 7)] {
            let (f2, s2, l2) = imm_decode(imm_encode(f, s, l));
            assert_eq!((f2, s2, l2), (f, s & 0xff, l));
        }
    }

    #[test]
    fn specs() {
        assert!(parse_connect_spec(None).unwrap().is_empty());
        assert!(parse_connect_spec(Some("")).unwrap().is_empty());
        let v = parse_connect_spec(Some("127.0.0.1, 127.0.0.2=127.0.0.2:99")).unwrap();
        assert!(matches!(v[0], ConnectEntry::Local(_)));
        assert!(matches!(v[1], ConnectEntry::Full(_)));
        assert_eq!(
            parse_connect_spec(Some("nonsense")).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            parse_connect_spec(Some("127.0.0.1,,")).err(),
            Some(libc::EINVAL)
        );
        let l = parse_listen_spec(Some("127.0.0.1,127.0.0.2:5000,[::1]:7")).unwrap();
        assert_eq!(l[1].port(), 5000);
        assert_eq!(
            parse_listen_spec(Some("127.0.0.1:x")).err(),
            Some(libc::EINVAL)
        );
    }

    #[test]
    fn msg_round_trip_header() {
        let a: Vec<SocketAddr> = vec!["127.0.0.3:77".parse().unwrap(), "[::1]:5".parse().unwrap()];
        let b = Msg::encode(MSG_RAILS, 0, &a);
        assert_eq!(b.len(), HDR + 2 * ADDR);
        assert_eq!(&b[..8], MAGIC);
    }
}
