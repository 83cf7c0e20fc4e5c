//! The target side of the soak: the server's receive thread matches every send.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use braid::{CompletionKind, CompletionQueue, Endpoint, Region, Status};

use super::util::{fill, first_diff};
use super::{RECV_LEN, RECVS_PER_EP, SEND_HDR, SEND_MAGIC};

// ------------------------------------------------------------------ soak: the target side

/// What the server's receive thread saw.
#[derive(Default)]
pub(super) struct RecvState {
    /// Per endpoint, per thread: receives matched so far (= next expected sequence).
    pub(super) next: Vec<Vec<u64>>,
    pub(super) bytes_verified: u64,
    pub(super) error: Option<String>,
}

pub(super) fn serve_receives(
    eps: Vec<Arc<Endpoint>>,
    bufs: Vec<Region>,
    rcq: CompletionQueue,
    state: Arc<Mutex<RecvState>>,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let ids: HashMap<u64, usize> = eps.iter().enumerate().map(|(i, e)| (e.id(), i)).collect();
    for (e, ep) in eps.iter().enumerate() {
        for s in 0..RECVS_PER_EP {
            ep.post_recv(
                ((e as u64) << 32) | s as u64,
                &[bufs[e].slice(s * RECV_LEN, RECV_LEN)?],
            )?;
        }
    }
    let mut buf = Vec::new();
    let mut want = Vec::new();
    let r = (|| -> Result<()> {
        while !stop.load(Ordering::Acquire) {
            let Some(c) = rcq.wait(Duration::from_millis(50)) else {
                continue;
            };
            let (e, s) = ((c.wr_id >> 32) as usize, (c.wr_id & 0xFFFF_FFFF) as usize);
            if ids.get(&c.endpoint) != Some(&e) || s >= RECVS_PER_EP {
                bail!("receive completion of an unknown buffer: {c:?}");
            }
            if c.status != Status::Success {
                bail!("receive on endpoint {e} failed: {c:?}");
            }
            let mut st = state.lock().expect("recv state");
            let threads = st.next[e].len();
            match c.kind {
                CompletionKind::Recv => {
                    let len = c.byte_len as usize;
                    if !(SEND_HDR..=RECV_LEN).contains(&len) {
                        bail!("receive of {len} bytes on endpoint {e}: {c:?}");
                    }
                    buf.resize(len, 0);
                    bufs[e].read_at(s * RECV_LEN, &mut buf)?;
                    let u = |a: usize, b: usize| -> u64 {
                        let mut w = [0u8; 8];
                        w[..b - a].copy_from_slice(&buf[a..b]);
                        u64::from_le_bytes(w)
                    };
                    let (magic, t, ep, seq, hlen, seed) = (
                        u(0, 4) as u32,
                        u(4, 6) as usize,
                        u(6, 8) as usize,
                        u(8, 16),
                        u(16, 24) as usize,
                        u(24, 32),
                    );
                    if magic != SEND_MAGIC || ep != e || t >= threads || hlen != len {
                        bail!(
                            "receive on endpoint {e} has a bad header (magic {magic:#x}, thread {t}, endpoint {ep}, length {hlen} of {len})"
                        );
                    }
                    if seq != st.next[e][t] {
                        bail!(
                            "receive on endpoint {e} from thread {t}: sequence {seq}, expected {} (lost, duplicated or reordered)",
                            st.next[e][t]
                        );
                    }
                    want.resize(len - SEND_HDR, 0);
                    fill(seed, &mut want);
                    if buf[SEND_HDR..] != want[..] {
                        bail!(
                            "send {seq} of thread {t} on endpoint {e} arrived corrupted at byte {}",
                            SEND_HDR + first_diff(&buf[SEND_HDR..], &want)
                        );
                    }
                    st.next[e][t] += 1;
                    st.bytes_verified += len as u64;
                }
                CompletionKind::RecvWriteImm => {
                    let imm = c
                        .imm
                        .ok_or_else(|| anyhow!("write-with-imm receive without imm: {c:?}"))?;
                    let (t, seq) = ((imm >> 24) as usize, (imm & 0xFF_FFFF) as u64);
                    if t >= threads || seq != st.next[e][t] & 0xFF_FFFF {
                        bail!(
                            "write-with-imm on endpoint {e}: immediate {imm:#x} (thread {t}, sequence {seq}), expected sequence {} (lost, duplicated or reordered)",
                            st.next.get(e).and_then(|v| v.get(t)).copied().unwrap_or(0)
                        );
                    }
                    st.next[e][t] += 1;
                }
                other => bail!("unexpected receive completion kind {other:?}: {c:?}"),
            }
            drop(st);
            eps[e].post_recv(c.wr_id, &[bufs[e].slice(s * RECV_LEN, RECV_LEN)?])?;
        }
        Ok(())
    })();
    if let Err(e) = &r {
        state.lock().expect("recv state").error = Some(format!("{e:#}"));
        stop.store(true, Ordering::Release);
    }
    r
}
