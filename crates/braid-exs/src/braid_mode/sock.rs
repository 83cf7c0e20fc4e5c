//! The state machine of one braid-mode socket: receives registered and advertised, sends
//! written into the peer's advertised buffers, control messages, end of stream and failure.
//! Driven by the backend's completion thread (and by `start` on the caller's thread) under
//! the socket's mutex; finished operations are handed out in order, never completed here.

use std::collections::VecDeque;
use std::os::fd::RawFd;

use braid::{
    Access, Completion, CompletionKind, Context, Endpoint, Error as BraidError, Region, RemoteKey,
    Sge, Status,
};

use super::ctrl::{
    AdvertFlags, CTRL_RECVS, CTRL_SENDS, CtrlMsg, Imm, MSG_LEN, SLOT, TAG_CTRL_RECV, TAG_CTRL_SEND,
    TAG_SHIFT, TAG_WRITE, WRITE_MAX,
};
use crate::ffi;
use crate::op::{Errno, Op};
use crate::sys::{self, Hangup};

/// Operations finished, with their results, in the order they are to complete.
pub(crate) type Done = Vec<(Box<Op>, Result<usize, Errno>)>;

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

pub(crate) struct BSock {
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

pub(crate) fn ctrl_recv_sge(ctrl: &Region, slot: usize) -> Sge {
    Sge {
        region: ctrl.clone(),
        offset: slot * SLOT,
        len: SLOT,
    }
}

impl BSock {
    pub(crate) fn outstanding(&self) -> usize {
        self.recvs.len() + self.sends.len() + self.deferred.len()
    }

    pub(crate) fn fail(&mut self, e: Errno) {
        if self.failed.is_none() {
            tracing::debug!(fd = self.fd, errno = e, "exs braid socket failed");
            self.failed = Some(e);
            if !self.closed {
                self.closed = true;
                self.ep.close();
            }
        }
    }

    pub(crate) fn post_ctrl(&mut self, msg: CtrlMsg) {
        self.ctrl_backlog.push_back(msg.encode());
        self.flush_ctrl();
    }

    pub(crate) fn flush_ctrl(&mut self) {
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
                Err(_) if self.ep.is_closed() => {
                    // The peer closed the endpoint. Whether the stream ended cleanly is for
                    // the completion thread to say: the peer's FIN may be waiting in the
                    // queue ahead of the flushed receives that report the close, and an
                    // application thread posting a receive here must not beat it to a
                    // failure. Nothing more can be sent either way.
                    self.ctrl_backlog.clear();
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
    pub(crate) fn start_recv(&mut self, op: Box<Op>, ctx: &Context) {
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
            // The region is dropped (key revoked, in-flight placements waited for) before the
            // receive's event.
            let r = ffi::register_lent(ctx, v, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!("exs braid: cannot register a receive buffer: {e}");
                    self.fail(libc::ENOMEM);
                    self.recvs.push_back(ent);
                    return;
                }
            };
            let mut flags = AdvertFlags::empty();
            flags.set(AdvertFlags::LAST, i + 1 == n);
            flags.set(AdvertFlags::WAITALL, waitall);
            let m = CtrlMsg::Advert {
                seq,
                key: r.remote_key(),
                len: v.iov_len as u64,
                flags,
            };
            msgs.push(m);
            ent.regions.push(r);
        }
        if let Some(CtrlMsg::Advert { flags, .. }) = msgs.last_mut() {
            flags.insert(AdvertFlags::LAST);
        }
        self.recvs.push_back(ent);
        for m in msgs {
            self.post_ctrl(m);
        }
    }

    pub(crate) fn start_send(&mut self, op: Box<Op>, ctx: &Context) {
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
            // As for receives; the peer gets no right on a send buffer.
            match ffi::register_lent(ctx, v, Access::NONE) {
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
    pub(crate) fn pump(&mut self) {
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
            let imm = Imm {
                final_,
                seq: ad.seq,
                len: n,
            }
            .encode();
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
        match CtrlMsg::decode(m) {
            Ok(CtrlMsg::Advert {
                seq,
                key,
                len,
                flags,
            }) => self.adverts.push_back(Advert {
                seq,
                key,
                len: len as usize,
                filled: 0,
                last: flags.contains(AdvertFlags::LAST),
                waitall: flags.contains(AdvertFlags::WAITALL),
            }),
            Ok(CtrlMsg::FinRequest) => self.fin_wanted = true,
            Ok(CtrlMsg::Fin { total }) => {
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
            Err(e) => self.fail(e),
        }
    }

    fn on_data(&mut self, imm: u32, out: &mut Done) {
        let Imm { final_, seq, len } = Imm::decode(imm);
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

    pub(crate) fn on_completion(&mut self, c: &Completion, out: &mut Done) {
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
                    && !self.ep.is_closed()
                {
                    self.fail(libc::ECONNRESET);
                }
                // A closed endpoint takes no receive: the completions behind this one say
                // whether the stream ended (the peer's FIN) or broke (flushed receives).
                // Failing here would overtake a FIN already queued (see `flush_ctrl`).
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
    pub(crate) fn progress(&mut self, out: &mut Done) {
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
            self.fin_sent = true;
            self.post_ctrl(CtrlMsg::Fin {
                total: self.bytes_sent,
            });
        }
        self.flush_ctrl();
        out.append(&mut self.deferred);
    }

    /// Whether the state can go: nothing outstanding and both directions finished (or the
    /// endpoint failed and the descriptor is gone).
    pub(crate) fn finished(&mut self) -> bool {
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

impl BSock {
    /// The state of socket `fd` (file identity `ino`) just attached to `ep`, with `ctrl` its
    /// control slots.
    pub(crate) fn new(fd: RawFd, ino: (u64, u64), ep: Endpoint, ctrl: Region) -> BSock {
        BSock {
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
        }
    }

    /// Post the control receives (before the peer may send anything).
    pub(crate) fn post_ctrl_recvs(&self) -> Result<(), BraidError> {
        for slot in 0..CTRL_RECVS {
            self.ep.post_recv(
                (TAG_CTRL_RECV << TAG_SHIFT) | slot as u64,
                &[ctrl_recv_sge(&self.ctrl, slot)],
            )?;
        }
        Ok(())
    }

    /// Whether the descriptor still names the socket that was attached.
    pub(crate) fn same_socket(&self) -> bool {
        sys::file_id(self.fd) == Some(self.ino)
    }

    /// Look at the bootstrap socket: closed here (the descriptor is gone or names another
    /// file now), or end of stream from the peer (ask it to finish its direction). Whether
    /// anything changed.
    pub(crate) fn watch_bootstrap(&mut self) -> bool {
        let before = (self.local_closed, self.finreq_sent);
        if !self.local_closed {
            if !self.same_socket() {
                self.local_closed = true;
            } else {
                match sys::hangup(self.fd) {
                    Hangup::Closed => self.local_closed = true,
                    Hangup::Peer if !self.finreq_sent && self.failed.is_none() => {
                        self.finreq_sent = true;
                        self.post_ctrl(CtrlMsg::FinRequest);
                    }
                    _ => {}
                }
            }
        }
        if self.local_closed {
            // Nobody can post on this socket any more: finish our direction once the sends
            // the application left behind are written.
            self.fin_wanted = true;
        }
        before != (self.local_closed, self.finreq_sent)
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd
    }

    pub(crate) fn endpoint_id(&self) -> u64 {
        self.ep.id()
    }

    pub(crate) fn rail_count(&self) -> usize {
        self.ep.rail_count()
    }

    /// The descriptor was closed here (or now names another file).
    pub(crate) fn local_closed(&self) -> bool {
        self.local_closed
    }

    pub(crate) fn mark_local_closed(&mut self) {
        self.local_closed = true;
    }

    /// At process exit: our direction ends once the sends already posted are written.
    pub(crate) fn want_fin(&mut self) {
        self.fin_wanted = true;
    }

    /// The end of our direction went out (or the socket failed, or the peer closed the
    /// endpoint): nothing more to flush.
    pub(crate) fn flushed(&self) -> bool {
        self.failed.is_some()
            || (self.fin_sent && self.ctrl_done == self.ctrl_next)
            || self.ep.is_closed()
    }

    /// A rejected operation, completed in order on the completion thread.
    pub(crate) fn defer(&mut self, op: Box<Op>, e: Errno) {
        self.deferred.push((op, Err(e)));
    }

    /// Whether the completion thread must look at the socket after `start`: a failure, a
    /// refusal, a zero-length send or the stream's end finish there.
    pub(crate) fn needs_service(&self) -> bool {
        self.failed.is_some()
            || self.fin_recvd
            || !self.deferred.is_empty()
            || self.sends.back().is_some_and(|x| x.op.total == 0)
    }
}
