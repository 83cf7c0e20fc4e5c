//! The benchmark connection as each side holds it: the endpoint, its two queues, the
//! receives it has posted, and the control messages that run a test (see the module above
//! for their protocol).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use braid::{Access, Completion, CompletionKind, CompletionQueue, Context, Endpoint, Region, Sge};

use super::{
    CQ_CAP, CTRL_IMM, CTRL_LEN, CTRL_WR, Ctrl, PAD_IMM, PAD_WR, WindowArgs, YIELD_EVERY,
    check_status,
};

/// Posted receives by wr_id, so a completion names its buffer.
#[derive(Default)]
pub struct RecvPool {
    next: u64,
    /// By id, oldest first: receives complete in the order they were posted, so the one
    /// completing is found at the front (no hashing on a latency loop's path).
    posted: VecDeque<(u64, Sge)>,
}

impl RecvPool {
    /// Receives posted and not completed.
    pub fn len(&self) -> usize {
        self.posted.len()
    }

    /// True when no receive is outstanding.
    pub fn is_empty(&self) -> bool {
        self.posted.is_empty()
    }
}

/// One side of the benchmark connection: the endpoint, its two queues and control buffers.
pub struct Peer {
    /// The endpoint.
    pub ep: Endpoint,
    /// Completions of operations posted here.
    pub scq: CompletionQueue,
    /// Completions of posted receives.
    pub rcq: CompletionQueue,
    ctrl_tx: Region,
    ctrl_rx: Region,
    ctrl_rx_next: usize,
    /// Posted receives.
    pub pool: RecvPool,
    /// Bound on waits for control messages and completions.
    pub stall: Duration,
}

const CTRL_RX_SLOTS: usize = 8;

impl Peer {
    /// Wraps an endpoint made with `scq`/`rcq`.
    pub fn new(
        ctx: &Context,
        ep: Endpoint,
        scq: CompletionQueue,
        rcq: CompletionQueue,
        stall: Duration,
    ) -> Result<Peer> {
        Ok(Peer {
            ep,
            scq,
            rcq,
            ctrl_tx: ctx.alloc_region(CTRL_LEN, Access::LOCAL_WRITE)?,
            ctrl_rx: ctx.alloc_region(CTRL_LEN * CTRL_RX_SLOTS, Access::LOCAL_WRITE)?,
            ctrl_rx_next: 0,
            pool: RecvPool::default(),
            stall,
        })
    }

    /// Creates the two queues and endpoint options for a peer.
    pub fn options(
        ctx: &Context,
        chunk: Option<usize>,
        window: &WindowArgs,
    ) -> Result<(CompletionQueue, CompletionQueue, braid::EndpointOptions)> {
        let scq = ctx.create_cq(CQ_CAP);
        let rcq = ctx.create_cq(CQ_CAP);
        let mut opts = braid::EndpointOptions::new(&scq).with_recv_cq(&rcq);
        if let Some(c) = chunk {
            if c == 0 || c > 16 << 20 {
                bail!("--chunk must be 1 byte .. 16 MiB");
            }
            opts.session.chunk_size = c;
        }
        window.apply(&mut opts.session)?;
        Ok((scq, rcq, opts))
    }

    /// Sets the spin of both queues.
    pub fn set_spin(&self, spin_us: Option<u64>) {
        if let Some(us) = spin_us {
            self.scq.set_spin(Duration::from_micros(us));
            self.rcq.set_spin(Duration::from_micros(us));
        }
    }

    /// Posts a receive into `sge`.
    pub fn post_recv(&mut self, sge: Sge) -> Result<()> {
        let id = self.pool.next;
        self.pool.next += 1;
        self.ep
            .post_recv(id, std::slice::from_ref(&sge))
            .context("posting a receive")?;
        self.pool.posted.push_back((id, sge));
        Ok(())
    }

    /// Posts a receive for a control message.
    pub fn post_ctrl_recv(&mut self) -> Result<()> {
        let slot = self.ctrl_rx_next % CTRL_RX_SLOTS;
        self.ctrl_rx_next += 1;
        let sge = self.ctrl_rx.slice(slot * CTRL_LEN, CTRL_LEN)?;
        self.post_recv(sge)
    }

    /// Posts a control receive unless one is already posted.
    pub fn ensure_recv(&mut self) -> Result<()> {
        if self.pool.is_empty() {
            self.post_ctrl_recv()?;
        }
        Ok(())
    }

    /// The buffer of a receive completion (removing it from the pool).
    pub fn take(&mut self, c: &Completion) -> Result<Sge> {
        let posted = &mut self.pool.posted;
        posted
            .iter()
            .position(|(id, _)| *id == c.wr_id)
            .and_then(|i| posted.remove(i))
            .map(|(_, sge)| sge)
            .with_context(|| format!("completion of an unknown receive: {c:?}"))
    }

    /// Waits for the completion of the control send `wr_id`; other send completions must be
    /// successful and are dropped.
    fn wait_send(&self, wr_id: u64) -> Result<()> {
        let deadline = Instant::now() + self.stall;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "no completion of a control message within {:?} (peer gone?)",
                    self.stall
                );
            }
            if let Some(c) = self.scq.wait(left) {
                check_status(&c, "control send")?;
                if c.wr_id == wr_id {
                    return Ok(());
                }
            }
        }
    }

    /// Sends a control message and waits until the peer has it.
    pub fn send_ctrl(&mut self, msg: &Ctrl) -> Result<()> {
        let bytes = serde_json::to_vec(msg)?;
        if bytes.len() > CTRL_LEN {
            bail!("control message of {} bytes is too long", bytes.len());
        }
        self.ctrl_tx.write_at(0, &bytes)?;
        let sge = self.ctrl_tx.slice(0, bytes.len())?;
        self.ep
            .send_with_imm(CTRL_WR, &[sge], CTRL_IMM)
            .context("sending a control message")?;
        self.wait_send(CTRL_WR)
    }

    /// Sends `n` pads and waits for them.
    pub fn send_pads(&mut self, n: usize) -> Result<()> {
        for _ in 0..n {
            let sge = self.ctrl_tx.slice(0, 1)?;
            self.ep
                .send_with_imm(PAD_WR, &[sge], PAD_IMM)
                .context("sending a pad")?;
            self.wait_send(PAD_WR)?;
        }
        Ok(())
    }

    /// Decodes a control message from a completed receive, or `None` for a pad.
    pub fn decode(&mut self, c: &Completion) -> Result<Option<Ctrl>> {
        let sge = self.take(c)?;
        check_status(c, "control receive")?;
        match (c.kind, c.imm) {
            (CompletionKind::Recv, Some(PAD_IMM)) => Ok(None),
            (CompletionKind::Recv, Some(CTRL_IMM)) => {
                let len = (c.byte_len as usize).min(sge.len);
                let b = sge.region.to_vec(sge.offset, len)?;
                let m: Ctrl = serde_json::from_slice(&b).with_context(|| {
                    format!(
                        "bad control message {:?}",
                        String::from_utf8_lossy(&b[..b.len().min(200)])
                    )
                })?;
                Ok(Some(m))
            }
            _ => bail!("unexpected completion where a control message was due: {c:?}"),
        }
    }

    /// Waits up to `timeout` for the next control message (skipping pads).
    pub fn wait_ctrl(&mut self, timeout: Duration) -> Result<Ctrl> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no control message from the peer within {timeout:?} (peer gone?)");
            }
            if let Some(c) = self.rcq.wait(left.min(Duration::from_millis(500))) {
                if let Some(m) = self.decode(&c)? {
                    return Ok(m);
                }
            } else if self.ep.is_closed() {
                bail!("the endpoint closed while waiting for a control message (peer gone?)");
            }
        }
    }

    /// [`Peer::wait_ctrl`], busy-polling the receive queue instead of blocking in it.
    pub fn poll_ctrl(&mut self, timeout: Duration) -> Result<Ctrl> {
        let deadline = Instant::now() + timeout;
        let mut spins = 0u32;
        loop {
            if let Some(c) = self.rcq.poll() {
                if let Some(m) = self.decode(&c)? {
                    return Ok(m);
                }
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(YIELD_EVERY) {
                std::thread::yield_now();
            }
            if spins.is_multiple_of(4096) {
                if Instant::now() >= deadline {
                    bail!("no control message from the peer within {timeout:?} (peer gone?)");
                }
                if self.ep.is_closed() {
                    bail!("the endpoint closed while waiting for a control message (peer gone?)");
                }
            }
        }
    }

    /// Per-rail bytes sent so far.
    pub fn rail_bytes(&self) -> Vec<u64> {
        self.ep.rail_bytes_sent()
    }
}
