//! Read guards: a read response sent from the region must return the memory as it was when
//! the read executed, so bytes a later request modifies are copied aside first.

use super::staging::StagingBuf;
use super::{Sent, Session};

/// A read response some of whose bytes are still read from the region: chunks not handed
/// out yet, frames being written, and frames logged for retransmission until acknowledged.
/// The read must return the memory as it was when the read executed, not as a later request
/// left it, so a request that modifies those bytes first has them copied aside (see
/// `Session::read_conflict`); it waits only for frames being written.
pub(super) struct ReadGuard {
    pub(super) seq: u64,
    /// Address ranges `[start, end)` the read sends from.
    pub(super) ranges: Vec<(usize, usize)>,
    /// Frames handed out from the region and not yet reported written.
    pub(super) frames: u32,
    /// Every chunk has been handed out.
    pub(super) assigned: bool,
    /// Frames sent from the region and still logged (on a rail or awaiting retransmission).
    pub(super) logged: u32,
}

/// A logged frame of read `seq` sent from the region is acknowledged, or now has a private
/// copy: its guard lets go of it (and goes once nothing else holds it).
pub(super) fn unlog_response(guards: &mut Vec<ReadGuard>, seq: u64) {
    if let Some(i) = guards.iter().position(|g| g.seq == seq) {
        let g = &mut guards[i];
        g.logged = g.logged.saturating_sub(1);
        if g.frames == 0 && g.assigned && g.logged == 0 {
            guards.swap_remove(i);
        }
    }
}

impl Session {
    /// One frame of read `seq` no longer reads the region; true when a request waiting for
    /// the read's frames may go ahead.
    pub(super) fn frame_written(&mut self, seq: u64) -> bool {
        let Some(i) = self.reads_active.iter().position(|g| g.seq == seq) else {
            return false;
        };
        let g = &mut self.reads_active[i];
        g.frames = g.frames.saturating_sub(1);
        let released = g.frames == 0 && g.assigned;
        if released && g.logged == 0 {
            self.reads_active.swap_remove(i);
        }
        released
    }

    /// Takes a private copy of every logged response frame of read `seq` that is still sent
    /// from the region and overlaps the region bytes `[start, end)`, so that a
    /// retransmission sends the bytes the read saw. Returns how many it copied.
    pub(super) fn copy_logged_responses(&mut self, seq: u64, start: usize, end: usize) -> u32 {
        let mut n = 0;
        let logs = self.rails.iter_mut().flat_map(|r| r.log.iter_mut());
        for e in logs.chain(self.retx.iter_mut()) {
            let Sent::Response {
                src,
                copy: copy @ None,
                seq: s,
                off,
                len,
                ..
            } = &mut e.frame
            else {
                continue;
            };
            if *s != seq || !src.overlaps(*off, *len, start, end) {
                continue;
            }
            // The source is unchanged since the read executed (every overlapping request
            // comes here first).
            *copy = Some((StagingBuf::copy_of(src, *off, *len), *off));
            n += 1;
        }
        n
    }

    /// A request wants to modify `[start, end)`. Read responses that would still read those
    /// bytes from the region take a private copy of what they have not handed out yet, and
    /// of the logged frames a retransmission would send, so the request can go ahead; it
    /// waits (true) only for frames already handed to the driver, which need no
    /// acknowledgement to finish.
    pub(super) fn read_conflict(&mut self, ranges: &[(usize, usize)]) -> bool {
        let mut wait = false;
        let mut i = 0;
        while i < self.reads_active.len() {
            let (seq, assigned, logged) = {
                let g = &self.reads_active[i];
                (g.seq, g.assigned, g.logged)
            };
            let hit = ranges.iter().copied().find(|&(start, end)| {
                self.reads_active[i]
                    .ranges
                    .iter()
                    .any(|&(gs, ge)| start < ge && gs < end)
            });
            let Some((start, end)) = hit else {
                i += 1;
                continue;
            };
            if !assigned
                && let Some(c) = self
                    .tx_resp
                    .iter_mut()
                    .find(|c| c.seq == seq && c.copy.is_none())
            {
                let buf = StagingBuf::copy_of(&c.src, c.next_off, c.total - c.next_off);
                c.copy = Some((buf, c.next_off));
            }
            if logged > 0 {
                let mut n = self.copy_logged_responses(seq, start, end);
                for &(s2, e2) in ranges {
                    if (s2, e2) != (start, end) {
                        n += self.copy_logged_responses(seq, s2, e2);
                    }
                }
                self.reads_active[i].logged -= n;
            }
            let g = &mut self.reads_active[i];
            g.assigned = true;
            wait |= g.frames > 0;
            if g.frames == 0 && g.logged == 0 {
                self.reads_active.swap_remove(i);
            } else {
                i += 1;
            }
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use crate::error::Status;

    use super::super::testkit::Pair;
    use super::super::{Request, SessionConfig};

    /// A read's response is sent from the region chunk by chunk; a later write to the same
    /// bytes executes before the last chunks go, and must not show through them.
    #[test]
    fn a_read_returns_the_memory_as_it_was_when_it_executed() {
        const LEN: usize = 4 << 20;
        let cfg = SessionConfig {
            chunk_size: 256 << 10,
            ..SessionConfig::default()
        };
        let mut p = Pair::new(cfg, 2);
        let remote = p.region(1, LEN, 0x11);
        let back = p.region(0, LEN, 0);
        let new = p.region(0, LEN, 0x22);
        let key = remote.remote_key().key;
        let read = Request::Read {
            local: vec![back.as_sge()],
            rkey: key,
            addr: 0,
        };
        p.post(0, 1, read);
        let write = Request::Write {
            local: vec![new.as_sge()],
            rkey: key,
            addr: 0,
            imm: None,
        };
        p.post(0, 2, write);
        p.run();
        assert_eq!(p.done[0].len(), 2);
        assert!(p.done[0].iter().all(|c| c.status == Status::Success));
        assert_eq!(back.to_vec(0, LEN).unwrap(), vec![0x11; LEN]);
        assert_eq!(remote.to_vec(0, LEN).unwrap(), vec![0x22; LEN]);
        assert!(p.s[1].reads_active.is_empty(), "every guard let go");
        assert!(p.s[1].tx_frames.is_empty());
    }

    #[test]
    fn only_overlapping_writes_wait_and_only_for_frames_being_written() {
        let mut p = Pair::new(SessionConfig::default(), 1);
        let s = &mut p.s[1];
        s.reads_active.push(super::ReadGuard {
            seq: 0,
            ranges: vec![(1000, 2000)],
            frames: 1,
            assigned: true,
            logged: 0,
        });
        assert!(!s.read_conflict(&[(0, 1000), (2000, 3000)]));
        assert_eq!(s.reads_active.len(), 1);
        assert!(s.read_conflict(&[(1999, 2001)]), "a frame is being written");
        assert_eq!(s.reads_active.len(), 1);
        s.reads_active[0].frames = 0;
        assert!(!s.read_conflict(&[(1500, 1600)]));
        assert!(s.reads_active.is_empty(), "nothing left to protect");
    }
}
