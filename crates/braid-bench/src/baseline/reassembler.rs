//! The trunking receiver's reorder buffer: [`Reassembler`] puts fragments that arrive in any
//! order across rails back into whole messages.

use std::collections::BTreeMap;

use anyhow::{Result, bail};

use super::wire::FragHeader;

/// Reassembles messages from fragments that arrive in any order across rails. Fragments wait
/// in a reorder map until every byte before them has been copied; then they are copied into
/// the destination buffer in order and their staging buffer is released.
#[derive(Debug)]
pub struct Reassembler<B> {
    size: usize,
    msg: u64,
    off: usize,
    pending: BTreeMap<(u64, u64), (u32, B)>,
    completed: u64,
    max_pending: usize,
}

impl<B: AsRef<[u8]>> Reassembler<B> {
    /// A reassembler for messages of `size` bytes.
    pub fn new(size: usize) -> Self {
        Reassembler {
            size,
            msg: 0,
            off: 0,
            pending: BTreeMap::new(),
            completed: 0,
            max_pending: 0,
        }
    }

    /// Takes one fragment whose payload is `data[..h.len]`. Copies every fragment that is now
    /// in order into `dest` (which must be `size` bytes and is reused for every message),
    /// calls `release` with each staging buffer no longer needed and `complete` with each
    /// finished message. Bad input (overlap, out of range, duplicate) is an error.
    pub fn push(
        &mut self,
        h: FragHeader,
        data: B,
        dest: &mut [u8],
        release: &mut impl FnMut(B),
        complete: &mut impl FnMut(u64, &[u8]),
    ) -> Result<()> {
        let len = h.len as usize;
        if dest.len() != self.size {
            bail!(
                "destination is {} bytes, messages are {}",
                dest.len(),
                self.size
            );
        }
        if len == 0 || data.as_ref().len() < len {
            bail!(
                "fragment {h:?}: bad length (staging holds {})",
                data.as_ref().len()
            );
        }
        if h.offset
            .checked_add(h.len as u64)
            .is_none_or(|end| end > self.size as u64)
        {
            bail!("fragment {h:?} runs past the {}-byte message", self.size);
        }
        if h.msg < self.msg || (h.msg == self.msg && (h.offset as usize) < self.off) {
            bail!("fragment {h:?} is stale (already placed)");
        }
        if self
            .pending
            .insert((h.msg, h.offset), (h.len, data))
            .is_some()
        {
            bail!("duplicate fragment {h:?}");
        }
        self.max_pending = self.max_pending.max(self.pending.len());
        while let Some((l, buf)) = self.pending.remove(&(self.msg, self.off as u64)) {
            let l = l as usize;
            dest[self.off..self.off + l].copy_from_slice(&buf.as_ref()[..l]);
            release(buf);
            self.off += l;
            if self.off == self.size {
                complete(self.msg, dest);
                self.completed += 1;
                self.msg += 1;
                self.off = 0;
            }
        }
        Ok(())
    }

    /// Messages completed so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Fragments waiting in the reorder map.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Largest number of fragments that ever waited at once.
    pub fn max_pending(&self) -> usize {
        self.max_pending
    }

    /// Whether a message is partly placed or fragments wait.
    pub fn is_idle(&self) -> bool {
        self.off == 0 && self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds the fragments of three messages in a fixed scrambled order and checks every
    /// reassembled message byte for byte, and that every staging buffer comes back.
    #[test]
    fn reassembly_out_of_order() {
        let size = 10_000;
        let frag = 1024;
        let msg_bytes =
            |m: u64| -> Vec<u8> { (0..size).map(|o| (o as u64 * 31 + m * 7) as u8).collect() };
        let mut frags = Vec::new();
        for m in 0..3u64 {
            let data = msg_bytes(m);
            let mut off = 0;
            while off < size {
                let len = frag.min(size - off);
                frags.push((
                    FragHeader {
                        msg: m,
                        offset: off as u64,
                        len: len as u32,
                    },
                    data[off..off + len].to_vec(),
                ));
                off += len;
            }
        }
        let total = frags.len();
        // Deterministic scramble: a fixed permutation (multiplier coprime to 30).
        assert_eq!(total, 30);
        let order: Vec<usize> = (0..total).map(|i| (i * 7 + 3) % total).collect();
        let mut re = Reassembler::new(size);
        let mut dest = vec![0u8; size];
        let mut released = 0;
        let mut done = Vec::new();
        for &i in &order {
            let (h, d) = frags[i].clone();
            re.push(
                h,
                d,
                &mut dest,
                &mut |_b: Vec<u8>| released += 1,
                &mut |m, d: &[u8]| done.push((m, d.to_vec())),
            )
            .unwrap();
        }
        assert_eq!(released, total);
        assert_eq!(done.len(), 3);
        for (m, d) in done {
            assert_eq!(d, msg_bytes(m), "message {m}");
        }
        assert!(re.is_idle());
        assert!(re.max_pending() > 1);
        assert_eq!(re.completed(), 3);
    }

    #[test]
    fn reassembly_rejects_bad_fragments() {
        let mut re = Reassembler::new(100);
        let mut dest = vec![0u8; 100];
        let mut nop = |_b: Vec<u8>| {};
        let mut nomsg = |_m: u64, _d: &[u8]| {};
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 90,
                    len: 20
                },
                vec![0; 20],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 0,
                    len: 10
                },
                vec![0; 5],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        re.push(
            FragHeader {
                msg: 0,
                offset: 50,
                len: 50,
            },
            vec![1; 50],
            &mut dest,
            &mut nop,
            &mut nomsg,
        )
        .unwrap();
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 50,
                    len: 50
                },
                vec![1; 50],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        re.push(
            FragHeader {
                msg: 0,
                offset: 0,
                len: 50,
            },
            vec![2; 50],
            &mut dest,
            &mut nop,
            &mut nomsg,
        )
        .unwrap();
        assert!(
            re.push(
                FragHeader {
                    msg: 0,
                    offset: 0,
                    len: 50
                },
                vec![2; 50],
                &mut dest,
                &mut nop,
                &mut nomsg
            )
            .is_err()
        );
        assert_eq!(re.completed(), 1);
    }
}
