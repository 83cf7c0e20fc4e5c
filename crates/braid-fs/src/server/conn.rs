//! One client endpoint on the server: its posted receive buffers, reply buffers and state.
//!
//! A new endpoint has one small receive posted, for its `Hello`. A meta endpoint then gets
//! `max_outstanding` receive buffers of [`MAX_MSG`] bytes and as many reply buffers; a data
//! endpoint gets nothing more (it carries only one-sided operations on file regions).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use braid::{Access, Context, Endpoint, Region};
use parking_lot::Mutex;

use super::export::ClientState;
use crate::proto::{MAX_MSG, Role};

/// `wr_id` bit of receives; the low bits are the buffer index.
pub(crate) const RECV: u64 = 1 << 62;
/// `wr_id` bit of reply sends; the low bits are the buffer index.
pub(crate) const SEND: u64 = 1 << 61;
/// `wr_id` of the hello receive and of the hello reply.
pub(crate) const HELLO: u64 = 1 << 60;
/// Size of the hello buffer.
pub(crate) const HELLO_LEN: usize = 4096;

/// Receive and reply buffers of a meta endpoint. There are twice as many reply buffers as
/// receive buffers: a client may send its next request as soon as it has a reply, before
/// this side has seen that reply's send complete.
pub(crate) struct Buffers {
    pub(crate) recv: Region,
    pub(crate) send: Region,
    free_send: Mutex<Vec<usize>>,
    /// Replies waiting for a free reply buffer (bounded by the requests outstanding).
    waiting: Mutex<std::collections::VecDeque<Vec<u8>>>,
    pub(crate) slots: usize,
}

impl Buffers {
    pub(crate) fn new(ctx: &Context, slots: usize) -> Result<Buffers, braid::Error> {
        Ok(Buffers {
            recv: ctx.alloc_region(slots * MAX_MSG, Access::LOCAL_WRITE)?,
            send: ctx.alloc_region(2 * slots * MAX_MSG, Access::LOCAL_WRITE)?,
            free_send: Mutex::new((0..2 * slots).rev().collect()),
            waiting: Mutex::new(std::collections::VecDeque::new()),
            slots,
        })
    }

    /// Sends `msg` from a free reply buffer, or queues it until one is free; `Err` when the
    /// send cannot be posted (the endpoint failed) or the client has far more requests
    /// outstanding than it was allowed.
    pub(crate) fn send_reply(&self, ep: &Endpoint, msg: Vec<u8>) -> Result<(), ()> {
        let slot = {
            let mut free = self.free_send.lock();
            match free.pop() {
                Some(s) => s,
                None => {
                    let mut w = self.waiting.lock();
                    if w.len() >= 2 * self.slots {
                        return Err(());
                    }
                    w.push_back(msg);
                    return Ok(());
                }
            }
        };
        self.post(ep, slot, &msg)
    }

    fn post(&self, ep: &Endpoint, s: usize, msg: &[u8]) -> Result<(), ()> {
        let sent = self
            .send
            .write_at(s * MAX_MSG, msg)
            .and_then(|()| self.send.slice(s * MAX_MSG, msg.len()))
            .and_then(|sge| ep.send(SEND | s as u64, &[sge]));
        if sent.is_err() {
            self.free_send.lock().push(s);
            return Err(());
        }
        Ok(())
    }

    /// A reply's send completed: its buffer takes the next waiting reply, if any.
    pub(crate) fn sent(&self, ep: &Endpoint, s: usize) -> Result<(), ()> {
        if s >= 2 * self.slots {
            return Ok(());
        }
        let next = self.waiting.lock().pop_front();
        match next {
            Some(msg) => self.post(ep, s, &msg),
            None => {
                self.free_send.lock().push(s);
                Ok(())
            }
        }
    }
}

/// One accepted endpoint.
pub(crate) struct Conn {
    pub(crate) ep: Endpoint,
    pub(crate) hello_buf: Region,
    /// Set by the hello: what the endpoint is for and its client's session token.
    pub(crate) role: Mutex<Option<(Role, u64)>>,
    pub(crate) bufs: std::sync::OnceLock<Buffers>,
    pub(crate) client: Mutex<ClientState>,
    /// When it was accepted: it must say `Hello` within `ServerConfig::hello_timeout`.
    pub(crate) accepted: std::time::Instant,
    dead: AtomicBool,
}

impl Conn {
    pub(crate) fn new(ctx: &Context, ep: Endpoint) -> Result<Arc<Conn>, braid::Error> {
        let hello_buf = ctx.alloc_region(HELLO_LEN, Access::LOCAL_WRITE)?;
        Ok(Arc::new(Conn {
            ep,
            hello_buf,
            role: Mutex::new(None),
            bufs: std::sync::OnceLock::new(),
            client: Mutex::new(ClientState::default()),
            accepted: std::time::Instant::now(),
            dead: AtomicBool::new(false),
        }))
    }

    /// Posts the receive for the hello (once the connection can be found by its completions).
    pub(crate) fn post_hello(&self) -> Result<(), braid::Error> {
        self.ep.post_recv(HELLO, &[self.hello_buf.as_sge()])
    }

    /// Marks the connection dead; true for the first caller (who cleans up).
    pub(crate) fn kill(&self) -> bool {
        !self.dead.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    pub(crate) fn session(&self) -> Option<(Role, u64)> {
        *self.role.lock()
    }

    /// Posts receive buffer `i` again.
    pub(crate) fn repost(&self, i: usize) -> Result<(), braid::Error> {
        let Some(b) = self.bufs.get() else {
            return Err(braid::Error::InvalidArgument(
                "no receive buffers yet".into(),
            ));
        };
        self.ep
            .post_recv(RECV | i as u64, &[b.recv.slice(i * MAX_MSG, MAX_MSG)?])
    }
}
