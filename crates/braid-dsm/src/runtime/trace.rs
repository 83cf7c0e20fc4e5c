//! Time stamps of the service thread's steps on the shared monotonic clock (feature
//! `fault-trace`), to find where a fault's time goes across ranks: each rank writes its
//! records to `$BRAID_DSM_TRACE.RANK` when it stops, one `ns event page arg` line each.
//! Without the feature every call compiles to nothing.

use crate::proto::{Msg, PageId};

/// What a record marks.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "fault-trace"), allow(dead_code))]
pub(crate) enum Ev {
    /// A fault read from the userfaultfd (arg: 1 for a write).
    Fault = 1,
    /// A message handled (arg: sender * 16 + message kind).
    Msg = 2,
    /// A message posted (arg: destination * 16 + kind), after the post returned.
    Sent = 3,
    /// A page dropped (after `MADV_DONTNEED`).
    Dropped = 4,
    /// A page installed or unprotected (after the call, which woke the waiters).
    Installed = 5,
    /// The thread goes to sleep / woke up.
    Sleep = 6,
    Wake = 7,
    /// A message is about to be posted (arg as for `Sent`).
    Send = 8,
}

/// The page and kind of a message (kinds in declaration order, 15 for the rest).
#[cfg_attr(not(feature = "fault-trace"), allow(dead_code))]
pub(crate) fn msg_kind(m: &Msg) -> (PageId, u64) {
    match *m {
        Msg::ReadReq { page, .. } => (page, 0),
        Msg::WriteReq { page, .. } => (page, 1),
        Msg::FwdRead { page, .. } => (page, 2),
        Msg::FwdWrite { page, .. } => (page, 3),
        Msg::Invalidate { page, .. } => (page, 4),
        Msg::InvAck { page } => (page, 5),
        Msg::Grant { page, .. } => (page, 6),
        Msg::Confirm { page } => (page, 7),
        _ => (u64::MAX, 15),
    }
}

#[cfg(feature = "fault-trace")]
mod imp {
    use super::Ev;
    use crate::proto::PageId;

    /// Records of one service thread (bounded: later ones are dropped).
    pub(crate) struct Trace(Vec<[u64; 4]>);

    const MAX: usize = 4 << 20;

    impl Trace {
        pub(crate) fn new() -> Trace {
            Trace(Vec::new())
        }

        pub(crate) fn rec(&mut self, ev: Ev, page: PageId, arg: u64) {
            if self.0.len() < MAX {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: a valid timespec out-pointer.
                unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
                let ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                self.0.push([ns, ev as u64, page, arg]);
            }
        }

        pub(crate) fn dump(&self, rank: u32) {
            use std::io::Write;
            let Ok(base) = std::env::var("BRAID_DSM_TRACE") else {
                return;
            };
            let path = format!("{base}.{rank}");
            let Ok(f) = std::fs::File::create(&path) else {
                eprintln!("braid-dsm: cannot write the trace {path}");
                return;
            };
            let mut w = std::io::BufWriter::new(f);
            for r in &self.0 {
                let _ = writeln!(w, "{} {} {} {}", r[0], r[1], r[2] as i64, r[3]);
            }
        }
    }
}

#[cfg(not(feature = "fault-trace"))]
mod imp {
    use super::Ev;
    use crate::proto::PageId;

    /// Nothing: the feature is off.
    pub(crate) struct Trace;

    impl Trace {
        #[inline(always)]
        pub(crate) fn new() -> Trace {
            Trace
        }
        #[inline(always)]
        pub(crate) fn rec(&mut self, _ev: Ev, _page: PageId, _arg: u64) {}
        #[inline(always)]
        pub(crate) fn dump(&self, _rank: u32) {}
    }
}

pub(crate) use imp::Trace;
