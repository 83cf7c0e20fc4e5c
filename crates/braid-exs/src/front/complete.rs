//! Where finished operations come back from the backends ([`SINK`]): the socket's
//! ordering slot is released (the next queued operation of that socket and direction starts,
//! plain sends queued behind it batched), and the event is posted.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Global, Sock, SockMode, global};
use crate::abi::*;
use crate::op::{Backend, CompletionSink, Errno, Op, OpKind};
use crate::queue::Completion;

/// Most sends one batch carries, and most bytes: enough to amortise the per-operation
/// hand-off, small enough to keep the completion of the first op prompt.
const BATCH_OPS: usize = 16;
const BATCH_BYTES: usize = 1 << 20;
/// `sendmsg` refuses more than `UIO_MAXIOV` buffers.
const BATCH_IOVS: usize = 1024;
/// The longest a short batch waits for the reposts of the thread its predecessor woke
/// (`hold_short_batch`); that thread's next dequeue, or a full batch, ends it sooner.
const HOLD_MAX: Duration = Duration::from_micros(50);

/// The front as the backends see it.
pub(crate) struct FrontSink;

/// The one sink, handed to each backend when it starts.
pub(crate) static SINK: FrontSink = FrontSink;

impl CompletionSink for FrontSink {
    fn complete(&self, op: Box<Op>, res: Result<usize, Errno>) {
        finish(op, res, true)
    }

    fn complete_held(&self, op: Box<Op>, res: Result<usize, Errno>) {
        finish(op, res, false)
    }

    fn flush_held(&self) {
        if let Ok(g) = global() {
            g.release_held();
        }
    }
}

/// Do the sends queued in `fifo` fill a batch (see `gather_sends`)?
pub(super) fn batch_is_full(fifo: &VecDeque<Box<Op>>) -> bool {
    fifo.len() >= BATCH_OPS || fifo.iter().map(|o| o.total).sum::<usize>() >= BATCH_BYTES
}

/// Do the sends queued in `fifo` make at most half a batch? Only then is holding them
/// worth it: holding a nearly full batch leaves the socket idle for a small gain.
fn at_most_half_a_batch(fifo: &VecDeque<Box<Op>>) -> bool {
    fifo.len() <= BATCH_OPS / 2 && fifo.iter().map(|o| o.total).sum::<usize>() <= BATCH_BYTES / 2
}

/// The socket's send slot is free: take the next send, with the sends it can carry, and
/// keep the slot busy if there is one.
pub(super) fn next_send(backend: &dyn Backend, sock: &mut Sock) -> Option<Box<Op>> {
    sock.send_held = false;
    let mut next = sock.send_fifo.pop_front();
    sock.send_busy = next.is_some();
    if let Some(n) = next.as_mut() {
        gather_sends(backend, n, &mut sock.send_fifo);
    }
    next
}

/// A send finished and the sends queued behind it make only a short batch. If its event
/// wakes a thread that waits on its queue, that thread is likely to send again at once
/// (an application reaping half of its outstanding sends and reposting them): hold the
/// short batch back, so that the reposts ride with it (one `sendmsg` of 1 MiB costs
/// loopback TCP about three quarters of the CPU per byte of 512 KiB ones; crate docs,
/// "Throughput"). The hold ends when the batch is full, when that thread waits again, or
/// after `HOLD_MAX`.
fn hold_short_batch(g: &Global, mode: SockMode, sock: &Sock, done: &Op) -> bool {
    let backend = g.backend(mode);
    mode == SockMode::Plain
        && sock.send_fifo.front().is_some_and(|f| backend.batchable(f))
        && at_most_half_a_batch(&sock.send_fifo)
        && done.front.queue.would_wake()
        && backend.arm_flush(HOLD_MAX)
}

/// Let `lead` carry the sends queued behind it that the backend can batch (same flags,
/// within the batch limits), so they go to the kernel in one submission.
fn gather_sends(backend: &dyn Backend, lead: &mut Op, fifo: &mut VecDeque<Box<Op>>) {
    if !backend.batchable(lead) {
        return;
    }
    let (mut bytes, mut iovs) = (lead.total, lead.iov.len());
    while let Some(f) = fifo.front() {
        if lead.batch.len() + 1 >= BATCH_OPS
            || f.msg_flags != lead.msg_flags
            || bytes + f.total > BATCH_BYTES
            || iovs + f.iov.len() > BATCH_IOVS
            || !backend.batchable(f)
        {
            break;
        }
        bytes += f.total;
        iovs += f.iov.len();
        let f = fifo.pop_front().expect("front exists");
        lead.ride(f);
    }
}

fn finish(op: Box<Op>, res: Result<usize, Errno>, release: bool) {
    let Ok(g) = global() else { return };
    {
        let mut core = g.core.lock();
        for &r in &op.front.regs {
            if let Some(e) = core.regs.get_mut(r as i32) {
                e.inflight -= 1;
            }
        }
        let mut next = None;
        let mut remove = false;
        let mut held = false;
        let mut mode = SockMode::Plain;
        if let Some((m, sock)) = core.socks.get_mut(&op.fd) {
            mode = *m;
            sock.outstanding -= 1;
            match op.kind {
                _ if !release => {}
                OpKind::Send if hold_short_batch(g, mode, sock, &op) => {
                    sock.send_held = true;
                    held = true;
                }
                OpKind::Send => next = next_send(g.backend(mode), sock),
                OpKind::Recv => {
                    next = sock.recv_fifo.pop_front();
                    sock.recv_busy = next.is_some();
                }
                _ => {}
            }
            remove = sock.outstanding == 0;
        }
        if remove {
            core.socks.remove(&op.fd);
        }
        if held {
            core.held.push(op.fd);
            g.any_held.store(true, Ordering::Release);
        }
        if let Some(n) = next {
            g.backend(mode).start(n);
        }
    }
    let ev = event_of(&op, res);
    // The op's buffers list and scratch go before the event is seen.
    let Op { front, .. } = *op;
    front.queue.post(Completion {
        ev,
        owner: front.owner,
    });
    if let Some(s) = front.sync {
        s.set(ev.ev_result, ev.ev_errno);
    }
}

/// The ES-API event of a finished op.
fn event_of(op: &Op, res: Result<usize, Errno>) -> exs_event_t {
    let mut ev = exs_event_t::zeroed();
    ev.ev_type = op.front.ev_type;
    ev.ev_fd = op.fd;
    ev.ev_ahandle = op.front.ahandle as exs_ahandle_t;
    match res {
        Ok(n) => ev.ev_result = n as isize,
        Err(e) => {
            ev.ev_result = -1;
            ev.ev_errno = e;
        }
    }
    match op.kind {
        OpKind::Send | OpKind::Recv => {
            ev.ev_u.xfer = exs_evt_xfer_t {
                xf_buf: op.front.first_buf as *mut libc::c_void,
                xf_len: op.total,
                xf_flags: op.front.user_flags,
                xf_iovcnt: op.front.iovcnt,
            }
        }
        OpKind::Accept => {
            ev.ev_u.accept = exs_evt_accept_t {
                ac_fd: if res.is_ok() { ev.ev_result as i32 } else { -1 },
                ac_addrlen: op.addrlen,
                ac_addr: op.addr,
            }
        }
        OpKind::Poll => {
            ev.ev_u.poll = exs_evt_poll_t {
                po_events: op.poll_events,
                po_revents: if res.is_ok() { ev.ev_result as i16 } else { 0 },
            }
        }
        OpKind::Connect => {}
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::test_op;

    struct Batching;

    impl Backend for Batching {
        fn start(&self, _op: Box<Op>) {}
        fn batchable(&self, op: &Op) -> bool {
            op.kind == OpKind::Send && op.total > 0
        }
        fn register(&self, _addr: *mut u8, _len: usize) -> Result<Option<u32>, Errno> {
            Ok(None)
        }
        fn deregister(&self, _cookie: u32) {}
    }

    fn sends(sizes: &[usize]) -> VecDeque<Box<Op>> {
        sizes.iter().map(|&n| test_op(OpKind::Send, n)).collect()
    }

    #[test]
    fn sends_batch_within_limits() {
        let mut lead = test_op(OpKind::Send, 100);
        let mut fifo = sends(&[10, 20, 0, 30]);
        gather_sends(&Batching, &mut lead, &mut fifo);
        // The empty send is not batchable: the batch stops before it, in order.
        assert_eq!(lead.batch.len(), 2);
        assert_eq!(lead.iov.len(), 3);
        assert_eq!(fifo.len(), 2);
        let mut lead = test_op(OpKind::Send, 1);
        let mut fifo = sends(&[1; 40]);
        gather_sends(&Batching, &mut lead, &mut fifo);
        assert_eq!(lead.batch.len(), BATCH_OPS - 1);
        let mut lead = test_op(OpKind::Send, BATCH_BYTES - 10);
        let mut fifo = sends(&[10, 1]);
        gather_sends(&Batching, &mut lead, &mut fifo);
        assert_eq!(lead.batch.len(), 1, "at most BATCH_BYTES");
        let mut lead = test_op(OpKind::Send, 5);
        let mut fifo = sends(&[5]);
        fifo[0].msg_flags |= libc::MSG_MORE;
        gather_sends(&Batching, &mut lead, &mut fifo);
        assert!(lead.batch.is_empty(), "different flags");
    }

    #[test]
    fn a_batch_is_full_at_its_op_or_byte_limit() {
        assert!(!batch_is_full(&sends(&[])));
        assert!(!batch_is_full(&sends(&[65536; BATCH_OPS - 1])));
        assert!(batch_is_full(&sends(&[1; BATCH_OPS])));
        assert!(batch_is_full(&sends(&[BATCH_BYTES / 2, BATCH_BYTES / 2])));
        assert!(!batch_is_full(&sends(&[
            BATCH_BYTES / 2,
            BATCH_BYTES / 2 - 1
        ])));
    }

    #[test]
    fn events() {
        let mut op = test_op(OpKind::Recv, 64);
        op.front.ev_type = EXS_EVT_RECV;
        op.front.ahandle = 77;
        let ev = event_of(&op, Ok(12));
        assert_eq!(
            (ev.ev_type, ev.ev_result, ev.ev_errno),
            (EXS_EVT_RECV, 12, 0)
        );
        assert_eq!(ev.ev_ahandle as usize, 77);
        let x = ev.xfer().expect("a receive's event carries the xfer body");
        assert_eq!((x.xf_len, x.xf_iovcnt), (64, 1));
        let ev = event_of(&op, Err(libc::ECONNRESET));
        assert_eq!((ev.ev_result, ev.ev_errno), (-1, libc::ECONNRESET));
        let mut op = test_op(OpKind::Poll, 0);
        op.front.ev_type = EXS_EVT_POLL;
        op.poll_events = libc::POLLIN;
        let ev = event_of(&op, Ok(libc::POLLIN as usize));
        let p = ev.poll().expect("a poll's event carries the poll body");
        assert_eq!((p.po_events, p.po_revents), (libc::POLLIN, libc::POLLIN));
        let mut op = test_op(OpKind::Accept, 0);
        op.front.ev_type = EXS_EVT_ACCEPT;
        let ev = event_of(&op, Err(libc::EMFILE));
        assert_eq!(ev.accept().expect("an accept's body").ac_fd, -1);
    }
}
