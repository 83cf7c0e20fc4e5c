//! Requests over the meta endpoint: request buffers, posted reply buffers, request ids.
//!
//! At most `slots` requests are outstanding (the number of receive buffers the server posted
//! for this client, told in its hello reply); more wait in a bounded backlog and go out as
//! slots free. A slot is free again once both its send has completed and its reply arrived.
//! Nothing here blocks: callers get their reply through a callback, run on the client's
//! completion thread.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use braid::{Endpoint, Region, Status};
use parking_lot::Mutex;

use super::Error;
use crate::proto::{self, MAX_MSG, Op, Reply, Request};

/// `wr_id` bit of posted reply buffers.
pub(crate) const RECV: u64 = 1 << 62;
/// `wr_id` bit of request sends.
pub(crate) const SEND: u64 = 1 << 61;
/// Most requests that may wait for a slot.
pub const MAX_BACKLOG: usize = 4096;

/// Receives the outcome of one request.
pub(crate) type RpcCallback = Box<dyn FnOnce(Result<Reply, Error>) + Send>;

struct Pending {
    slot: usize,
    op: Op,
    cb: RpcCallback,
    /// When the request was sent.
    sent_at: Instant,
}

#[derive(Clone, Copy, Default)]
struct SlotUse {
    sent: bool,
    replied: bool,
}

struct State {
    free: Vec<usize>,
    slots: Vec<SlotUse>,
    pending: HashMap<u64, Pending>,
    backlog: VecDeque<(u64, Op, Vec<u8>, RpcCallback)>,
    dead: Option<String>,
}

/// The request/reply machinery of one client.
pub(crate) struct Rpc {
    ep: Endpoint,
    req_buf: Region,
    rep_buf: Region,
    state: Mutex<State>,
    next_id: AtomicU64,
}

impl Rpc {
    /// Uses `slots` request buffers in `req_buf` and posts `slots` reply buffers of
    /// `rep_buf` (each region `slots * MAX_MSG` bytes).
    pub(crate) fn new(
        ep: Endpoint,
        req_buf: Region,
        rep_buf: Region,
        slots: usize,
    ) -> Result<Rpc, Error> {
        for i in 0..slots {
            ep.post_recv(RECV | i as u64, &[rep_buf.slice(i * MAX_MSG, MAX_MSG)?])?;
        }
        Ok(Rpc {
            ep,
            req_buf,
            rep_buf,
            state: Mutex::new(State {
                free: (0..slots).rev().collect(),
                slots: vec![SlotUse::default(); slots],
                pending: HashMap::new(),
                backlog: VecDeque::new(),
                dead: None,
            }),
            next_id: AtomicU64::new(1),
        })
    }

    /// Why the client stopped, once it has.
    pub(crate) fn dead(&self) -> Option<String> {
        self.state.lock().dead.clone()
    }

    /// Sends `req`; `cb` gets the reply (or why there is none), on the completion thread.
    /// When the request cannot be encoded, the client is disconnected or the backlog is full,
    /// fails at once and hands `cb` back unrun.
    pub(crate) fn call(&self, req: &Request, cb: RpcCallback) -> Result<(), (Error, RpcCallback)> {
        if let Some(e) = too_long(req) {
            return Err((Error::Remote(e), cb));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let msg = match proto::encode_request(id, &super::caller::current(), req) {
            Ok(m) => m,
            Err(e) => return Err((Error::Invalid(e.to_string()), cb)),
        };
        let op = req.op();
        let mut st = self.state.lock();
        if let Some(why) = &st.dead {
            return Err((Error::NotConnected(why.clone()), cb));
        }
        match st.free.pop() {
            Some(slot) => self.start(&mut st, slot, id, op, &msg, cb),
            None if st.backlog.len() >= MAX_BACKLOG => Err((
                Error::Busy(format!(
                    "{MAX_BACKLOG} requests already wait for the server"
                )),
                cb,
            )),
            None => {
                st.backlog.push_back((id, op, msg, cb));
                Ok(())
            }
        }
    }

    /// [`Rpc::call`], running `cb` with the error on an immediate failure (the caller must
    /// hold no lock `cb` takes).
    pub(crate) fn call_then(&self, req: &Request, cb: RpcCallback) {
        if let Err((e, cb)) = self.call(req, cb) {
            cb(Err(e));
        }
    }

    fn start(
        &self,
        st: &mut State,
        slot: usize,
        id: u64,
        op: Op,
        msg: &[u8],
        cb: RpcCallback,
    ) -> Result<(), (Error, RpcCallback)> {
        let posted = self
            .req_buf
            .write_at(slot * MAX_MSG, msg)
            .and_then(|()| self.req_buf.slice(slot * MAX_MSG, msg.len()))
            .and_then(|sge| self.ep.send(SEND | slot as u64, &[sge]));
        match posted {
            Ok(()) => {
                st.slots[slot] = SlotUse::default();
                st.pending.insert(
                    id,
                    Pending {
                        slot,
                        op,
                        cb,
                        sent_at: Instant::now(),
                    },
                );
                Ok(())
            }
            Err(e) => {
                st.free.push(slot);
                Err((Error::from_post(e), cb))
            }
        }
    }

    /// A slot's send completed and its reply came: free it and start waiting requests.
    /// Returns the callbacks of requests that could not be sent, with why.
    fn release(&self, st: &mut State, slot: usize) -> Vec<(RpcCallback, Error)> {
        let mut failed = Vec::new();
        st.free.push(slot);
        while !st.backlog.is_empty() {
            let Some(s) = st.free.pop() else { break };
            let Some((id, op, msg, cb)) = st.backlog.pop_front() else {
                st.free.push(s);
                break;
            };
            if let Err((e, cb)) = self.start(st, s, id, op, &msg, cb) {
                failed.push((cb, e));
            }
        }
        failed
    }

    /// A request send completed.
    pub(crate) fn on_send(&self, slot: usize, status: Status) {
        if !status.is_ok() {
            self.fail(format!("sending a request failed: {status:?}"));
            return;
        }
        let mut st = self.state.lock();
        let Some(u) = st.slots.get_mut(slot) else {
            return;
        };
        u.sent = true;
        let run = if u.replied {
            self.release(&mut st, slot)
        } else {
            Vec::new()
        };
        drop(st);
        for (cb, e) in run {
            cb(Err(e));
        }
    }

    /// A reply arrived in buffer `i` (or the receive failed).
    pub(crate) fn on_recv(&self, i: usize, len: usize, status: Status) {
        if !status.is_ok() {
            self.fail(format!("the server's connection ended ({status:?})"));
            return;
        }
        let bytes = self.rep_buf.to_vec(i * MAX_MSG, len.min(MAX_MSG));
        let repost = self
            .rep_buf
            .slice(i * MAX_MSG, MAX_MSG)
            .and_then(|s| self.ep.post_recv(RECV | i as u64, &[s]));
        let (Ok(bytes), Ok(())) = (bytes, repost) else {
            self.fail("reposting a reply buffer failed".into());
            return;
        };
        let (id, op, result) = match proto::decode_reply(&bytes) {
            Ok(x) => x,
            Err(e) => {
                self.fail(format!("malformed reply from the server: {e}"));
                return;
            }
        };
        let mut st = self.state.lock();
        let Some(p) = st.pending.remove(&id) else {
            drop(st);
            self.fail(format!("a reply to unknown request {id}"));
            return;
        };
        if p.op != op {
            drop(st);
            (p.cb)(Err(Error::Protocol(format!(
                "reply of kind {op:?} to a {:?}",
                p.op
            ))));
            self.fail("a reply of the wrong kind".into());
            return;
        }
        let mut run = Vec::new();
        if let Some(u) = st.slots.get_mut(p.slot) {
            u.replied = true;
            if u.sent {
                run = self.release(&mut st, p.slot);
            }
        }
        drop(st);
        (p.cb)(result.map_err(Error::Remote));
        for (cb, e) in run {
            cb(Err(e));
        }
    }

    /// The connection is gone: every outstanding and waiting request fails, and so does
    /// every later one.
    pub(crate) fn fail(&self, why: String) {
        self.end(why, false);
    }

    /// [`Rpc::fail`] for an end the application asked for (a close, a drop, an unmount):
    /// not worth a warning.
    pub(crate) fn close(&self, why: String) {
        self.end(why, true);
    }

    fn end(&self, why: String, deliberate: bool) {
        let (pending, backlog) = {
            let mut st = self.state.lock();
            if st.dead.is_none() {
                if deliberate {
                    tracing::debug!("braid-fs client: {why}");
                } else {
                    tracing::warn!("braid-fs client: {why}");
                }
                st.dead = Some(why.clone());
            }
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.backlog),
            )
        };
        self.ep.close();
        for (_, p) in pending {
            (p.cb)(Err(Error::Lost(why.clone())));
        }
        for (_, _, _, cb) in backlog {
            cb(Err(Error::NotConnected(why.clone())));
        }
    }

    /// Fails the connection when a request has waited longer than `timeout` for its
    /// reply: a server that stopped answering (alive, so the endpoint's keepalives do not
    /// end it) must not leave callers (a mount's kernel requests among them) waiting
    /// forever. As when the connection breaks, every outstanding request then fails; the
    /// reply buffers stay the server's to write until the endpoint is closed.
    pub(crate) fn expire(&self, timeout: Duration) {
        let late = {
            let st = self.state.lock();
            st.pending
                .values()
                // A lock wait lasts as long as the conflicting lock is held.
                .filter(|p| p.op != Op::SetLockWait && p.sent_at.elapsed() > timeout)
                .map(|p| p.op)
                .next()
        };
        if let Some(op) = late {
            self.fail(format!(
                "no reply to a {op:?} request within {timeout:?}: the server stopped answering"
            ));
        }
    }

    /// Requests outstanding or waiting.
    pub(crate) fn outstanding(&self) -> usize {
        let st = self.state.lock();
        st.pending.len() + st.backlog.len()
    }
}

/// A name over `NAME_MAX` or a path over `PATH_MAX` is the caller's error (ENAMETOOLONG),
/// answered here: the server takes it for a malformed request and closes the connection.
fn too_long(req: &Request) -> Option<proto::Errno> {
    let name = |n: &[u8]| n.len() > proto::MAX_NAME;
    let long = match req {
        Request::Lookup { name: n, .. }
        | Request::Unlink { name: n, .. }
        | Request::Rmdir { name: n, .. }
        | Request::Mknod { name: n, .. }
        | Request::Mkdir { name: n, .. }
        | Request::Create { name: n, .. } => name(n),
        Request::Symlink {
            name: n, target, ..
        } => name(n) || target.len() > proto::MAX_PATH,
        Request::Rename {
            name: n, new_name, ..
        } => name(n) || name(new_name),
        Request::Link { new_name, .. } => name(new_name),
        Request::Walk { path, .. } => path.len() > proto::MAX_PATH,
        _ => false,
    };
    long.then_some(proto::Errno::ENAMETOOLONG)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use braid::Access;
    use braid_testkit::loopback::{WAIT, pair};

    use super::*;

    /// A server that takes the request (its receive is posted) but never answers: the
    /// request fails once it has waited longer than the timeout, and so does every later
    /// one (the connection is given up), instead of waiting forever.
    #[test]
    fn an_unanswered_request_fails_after_the_timeout() {
        let p = pair(1);
        let sink = p
            .server_ctx
            .alloc_region(4 * MAX_MSG, Access::all())
            .unwrap();
        for i in 0..4 {
            p.server
                .post_recv(i, &[sink.slice(i as usize * MAX_MSG, MAX_MSG).unwrap()])
                .unwrap();
        }
        let req_buf = p
            .client_ctx
            .alloc_region(2 * MAX_MSG, Access::all())
            .unwrap();
        let rep_buf = p
            .client_ctx
            .alloc_region(2 * MAX_MSG, Access::all())
            .unwrap();
        let rpc = Rpc::new(p.client, req_buf, rep_buf, 2).unwrap();
        let (tx, rx) = mpsc::channel();
        let req = Request::GetAttr {
            node: proto::NodeId {
                id: 1,
                generation: 0,
            },
        };
        rpc.call_then(&req, Box::new(move |r| tx.send(r).unwrap()));
        let timeout = Duration::from_millis(200);
        let start = Instant::now();
        rpc.expire(timeout);
        assert!(rx.try_recv().is_err(), "not expired before the timeout");
        let result = loop {
            assert!(start.elapsed() < WAIT, "the request never expired");
            rpc.expire(timeout);
            if let Ok(r) = rx.try_recv() {
                break r;
            }
            // Bounded polling of a timer, not synchronisation with another thread.
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(start.elapsed() >= timeout);
        assert!(
            matches!(result, Err(Error::Lost(ref why)) if why.contains("stopped answering")),
            "{result:?}"
        );
        assert!(rpc.dead().is_some());
        let (tx2, rx2) = mpsc::channel();
        rpc.call_then(&req, Box::new(move |r| tx2.send(r).unwrap()));
        assert!(matches!(
            rx2.recv_timeout(WAIT),
            Ok(Err(Error::NotConnected(_)))
        ));
    }
}
