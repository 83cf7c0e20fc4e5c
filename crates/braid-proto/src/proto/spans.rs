//! Target-side memory of an operation as a list of pieces of registered regions: one piece
//! for `Write`/`ReadRequest`, up to [`crate::wire::sgl::MAX_REMOTE_SGE`] for the vectored
//! `WriteV`/`ReadV`. The operation's bytes are the pieces' bytes in order; a chunk at offset
//! `off` of the operation maps to memory through [`Spans::pieces`].

use std::sync::Arc;

use smallvec::{SmallVec, smallvec};

use crate::mem::access::Access;
use crate::mem::file::{copy_maybe_fragile, read_fragile};
use crate::mem::inner::RegionPin;
use crate::mem::region::Pieces;
use crate::mem::registry::{FileEnds, Registry};
use crate::wire::WireStatus;
use crate::wire::sgl::WireSge;

/// One piece: `len` bytes at `addr` of pinned region `pins[pin]`.
pub(crate) struct Span {
    pin: usize,
    addr: u64,
    len: u64,
}

/// The pieces of one operation at the target, checked and pinned.
pub(crate) struct Spans {
    /// Each region the pieces name, pinned once.
    pins: SmallVec<[RegionPin; 1]>,
    list: SmallVec<[Span; 1]>,
    total: u64,
    /// Some piece is file pages, which only system calls may touch.
    fragile: bool,
}

impl Spans {
    /// One piece (the caller checked it).
    pub(crate) fn single(pin: RegionPin, addr: u64, len: u64) -> Arc<Spans> {
        let fragile = pin.is_file();
        Arc::new(Spans {
            pins: smallvec![pin],
            list: smallvec![Span { pin: 0, addr, len }],
            total: len,
            fragile,
        })
    }

    /// One piece, in the allocation of `spare` when it is a finished operation's spans
    /// that nothing else holds (see [`Spans::release`]): a small write then allocates
    /// nothing at its target.
    pub(crate) fn single_in(
        spare: Option<Arc<Spans>>,
        pin: RegionPin,
        addr: u64,
        len: u64,
    ) -> Arc<Spans> {
        if let Some(mut reused) = spare
            && let Some(s) = Arc::get_mut(&mut reused)
        {
            s.fragile = pin.is_file();
            s.pins.clear();
            s.pins.push(pin);
            s.list.clear();
            s.list.push(Span { pin: 0, addr, len });
            s.total = len;
            return reused;
        }
        Spans::single(pin, addr, len)
    }

    /// The spans of a finished operation, emptied (its regions unpinned) for
    /// [`Spans::single_in`] to reuse; `None` when another holder still has them.
    pub(crate) fn release(mut spans: Arc<Spans>) -> Option<Arc<Spans>> {
        let s = Arc::get_mut(&mut spans)?;
        s.pins.clear();
        s.list.clear();
        s.total = 0;
        Some(spans)
    }

    /// Checks every entry (key, rights, range, file end) before any byte moves; the first
    /// failure fails the whole operation.
    pub(crate) fn check(
        registry: &Registry,
        entries: &[WireSge],
        need: Access,
    ) -> Result<Arc<Spans>, WireStatus> {
        let mut ends = FileEnds::default();
        let mut list = SmallVec::with_capacity(entries.len());
        let mut pins: Vec<(u64, RegionPin)> = Vec::new();
        let (mut total, mut fragile) = (0, false);
        for e in entries {
            // Pieces of one region (the usual case) share one lookup and one pin.
            let pin = match pins.iter().position(|p| p.0 == e.rkey) {
                Some(i) => {
                    Registry::check_pin(&pins[i].1, e.rkey, e.addr, e.len, need, &mut ends)?;
                    i
                }
                None => {
                    let pin = registry.check_in(e.rkey, e.addr, e.len, need, &mut ends)?;
                    fragile |= pin.is_file();
                    pins.push((e.rkey, pin));
                    pins.len() - 1
                }
            };
            total += e.len;
            if e.len > 0 {
                list.push(Span {
                    pin,
                    addr: e.addr,
                    len: e.len,
                });
            }
        }
        Ok(Arc::new(Spans {
            pins: pins.into_iter().map(|p| p.1).collect(),
            list,
            total,
            fragile,
        }))
    }

    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    pub(crate) fn fragile(&self) -> bool {
        self.fragile
    }

    /// Memory of the operation's bytes `[off, off + len)`, in order.
    pub(crate) fn pieces(&self, mut off: u64, mut len: u64) -> Pieces<(*mut u8, usize)> {
        let mut out = Pieces::new();
        for s in &self.list {
            if len == 0 {
                break;
            }
            if off >= s.len {
                off -= s.len;
                continue;
            }
            let take = (s.len - off).min(len);
            out.push((
                self.pins[s.pin].ptr_at((s.addr + off) as usize),
                take as usize,
            ));
            len -= take;
            off = 0;
        }
        out
    }

    /// The address ranges `[start, end)` of every piece (to find overlapping operations).
    pub(crate) fn ranges(&self) -> Vec<(usize, usize)> {
        self.list
            .iter()
            .map(|s| {
                let start = self.pins[s.pin].ptr_at(s.addr as usize) as usize;
                (start, start + s.len as usize)
            })
            .collect()
    }

    /// True when the operation's bytes `[off, off + len)` overlap `[start, end)`.
    pub(crate) fn overlaps(&self, off: u64, len: u64, start: usize, end: usize) -> bool {
        self.pieces(off, len)
            .iter()
            .any(|&(p, l)| (p as usize) < end && start < p as usize + l)
    }

    /// Copies the operation's bytes `[off, off + len)` into `dst`; false when a file page
    /// could not be read (truncated), in which case the rest of `dst` is unspecified.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes and not overlap the pieces.
    pub(crate) unsafe fn copy_out(&self, off: u64, len: u64, dst: *mut u8) -> bool {
        let mut at = 0;
        for (p, l) in self.pieces(off, len) {
            // SAFETY: the piece is pinned registered memory; dst has room for `len` bytes.
            let d = unsafe { dst.add(at) };
            let ok = if self.fragile {
                // SAFETY: d is valid for l bytes (caller's contract).
                read_fragile(p, unsafe { std::slice::from_raw_parts_mut(d, l) })
                    .is_ok_and(|n| n == l)
            } else {
                // SAFETY: as above; the pieces are plain memory.
                unsafe { copy_maybe_fragile(p, d, l, false) }
            };
            if !ok {
                return false;
            }
            at += l;
        }
        true
    }
}

/// A read served from file pages: its status goes to the initiator in a trailing `Done`
/// (flag `TRAILER`) once every response frame has been written, because a frame whose
/// header promised bytes that truncation then took away is padded with zeros.
pub(crate) struct Trailer {
    pub(crate) seq: u64,
    /// Response frames handed to the driver and not yet reported written.
    pub(crate) frames: u32,
    /// Every chunk has been handed out.
    pub(crate) assigned: bool,
    pub(crate) status: WireStatus,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Spans;
    use crate::mem::access::Access;
    use crate::mem::region::{Region, RegionOptions};
    use crate::mem::registry::Registry;

    /// A finished write's spans are reused for the next one, and unpin their region when
    /// released: the region can be deregistered while they wait for reuse.
    #[test]
    fn released_spans_are_reused_and_pin_nothing() {
        let reg = Arc::new(Registry::default());
        let opts = RegionOptions::default();
        let a = Region::allocate(&reg, 4096, Access::all(), opts).unwrap();
        let b = Region::allocate(&reg, 4096, Access::all(), opts).unwrap();
        let pin = |r: &Region| reg.lookup(r.remote_key().key).unwrap();
        let first = Spans::single_in(None, pin(&a), 100, 8);
        let at = Arc::as_ptr(&first);
        let shared = first.clone();
        assert!(Spans::release(first).is_none(), "still held elsewhere");
        let spare = Spans::release(shared).expect("the last holder");
        assert_eq!(spare.total(), 0);
        a.deregister(Duration::from_secs(1))
            .map_err(|(_, e)| e)
            .expect("a released spans pins nothing");
        let second = Spans::single_in(Some(spare), pin(&b), 8, 16);
        assert_eq!(Arc::as_ptr(&second), at, "the same allocation");
        assert_eq!(second.total(), 16);
        let (p, l) = second.pieces(0, 16)[0];
        assert_eq!(
            (p as usize, l),
            (b.slice(8, 16).unwrap().ptr() as usize, 16)
        );
    }
}
