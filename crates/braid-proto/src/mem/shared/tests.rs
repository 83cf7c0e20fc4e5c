use super::*;

/// A region file mapped through `map`, unmapped (and forgotten) on drop.
struct Mapped(*mut u8, usize);

impl Mapped {
    fn new(len: usize) -> Mapped {
        Mapped(map(len, false).expect("memfds work here"), len)
    }
    fn fill(&self, from: usize, to: usize, b: u8) {
        assert!(from <= to && to <= self.1);
        // SAFETY: inside the mapping, used by one test thread at a time.
        unsafe { std::ptr::write_bytes(self.0.add(from), b, to - from) }
    }
    fn get(&self, i: usize) -> u8 {
        assert!(i < self.1);
        // SAFETY: inside the mapping.
        unsafe { self.0.add(i).read_volatile() }
    }
    /// True when every byte of `[from, to)` is `b`.
    fn all(&self, from: usize, to: usize, b: u8) -> bool {
        (from..to).all(|i| self.get(i) == b)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        forget(self.0);
        // SAFETY: unmapping what `map` mapped.
        unsafe { libc::munmap(self.0.cast(), self.1) };
    }
}

#[test]
fn spans_are_found_inside_their_file_only() {
    let len = 64 << 10;
    let m = Mapped::new(len);
    let p = m.0;
    let s = lookup(p, len).expect("the whole file");
    assert_eq!((s.offset, s.file_len), (0, len as u64));
    // SAFETY: offsets inside the mapping.
    let s = lookup(unsafe { p.add(4096) }, 100).expect("inside");
    assert_eq!(s.offset, 4096);
    assert!(
        lookup(unsafe { p.add(4096) }, len).is_none(),
        "past the end"
    );
    // (Another test's region may be mapped right after this one.)
    assert!(
        lookup(unsafe { p.add(len) }, 1).is_none_or(|o| o.token != s.token),
        "after the file"
    );
    let other = lookup(p, 1).expect("again");
    assert_eq!(other.token, s.token);
    assert!(is_live(s.token));
    drop(m);
    assert!(lookup(p, 1).is_none_or(|o| o.token != s.token));
    assert!(!is_live(s.token));
}

#[test]
fn a_region_file_cannot_be_mapped_writable_again() {
    let m = Mapped::new(64 << 10);
    let s = lookup(m.0, 1).expect("shareable");
    // SAFETY: a new mapping of our own file, checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            s.fd.as_raw_fd(),
            0,
        )
    };
    assert_eq!(p, libc::MAP_FAILED, "a peer given the file could write it");
    m.fill(0, 1, 7);
    assert_eq!(m.get(0), 7, "the region's own mapping still writes");
}

/// Reads `len` bytes of `span`'s file from `at`.
fn file_bytes(span: &SharedSpan, at: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::from(span.fd.try_clone().expect("dup"));
    let mut v = vec![0; len];
    f.read_exact_at(&mut v, span.offset + at).expect("read");
    v
}

#[test]
fn a_frozen_span_keeps_its_bytes_in_the_file_while_the_region_writes_its_own() {
    let len = 256 << 10;
    let m = Mapped::new(len);
    m.fill(0, len, 1);
    let span = exchange_span(m.0, len).expect("frozen");
    assert_eq!((span.offset, span.file_len), (0, len as u64));
    // Frozen in place and untouched: the region's file still holds its bytes.
    let plain = lookup(m.0, 1).expect("untouched frozen pages are in the file");
    assert_eq!((plain.token, plain.offset), (span.token, 0));
    // Untouched: the same frozen bytes again, no new file.
    let again = exchange_span(m.0, len).expect("still frozen");
    assert_eq!(again.token, span.token);
    // A sub-span of an untouched frozen span comes from the same file.
    // SAFETY: inside the mapping.
    let sub = exchange_span(unsafe { m.0.add(8192) }, 8192).expect("inside");
    assert_eq!((sub.token, sub.offset), (span.token, 8192));
    m.fill(5000, 5001, 2);
    assert_eq!(file_bytes(&span, 5000, 1), [1], "the write stayed private");
    // SAFETY: inside the mapping.
    assert!(
        lookup(unsafe { m.0.add(4100) }, 8).is_none(),
        "a written page is not"
    );
    assert!(
        lookup(unsafe { m.0.add(8192) }, 8).is_some(),
        "the others still are"
    );
    // Written: the bytes move to a new file, written in place from now on, and the span
    // goes by plain reference.
    assert!(exchange_span(m.0, len).is_none());
    let moved = lookup(m.0, len).expect("moved to a file of its own");
    assert_ne!(moved.token, span.token);
    assert_eq!(file_bytes(&moved, 4999, 3), [1, 2, 1]);
    m.fill(5000, 5001, 3);
    assert_eq!(file_bytes(&moved, 5000, 1), [3]);
    assert!(exchange_span(m.0, len).is_none());
    assert!(is_live(moved.token));
    assert!(is_live(span.token), "the region's own file");
    drop(m);
    assert!(!is_live(moved.token));
}

#[test]
fn adopted_pages_are_a_copy_on_both_sides() {
    let len = 128 << 10;
    let (src, dst) = (Mapped::new(len), Mapped::new(len));
    src.fill(0, len, 0xaa);
    dst.fill(0, len, 0x55);
    let span = exchange_span(src.0, len).expect("frozen");
    assert!(adopt(dst.0, len, &span));
    assert!(dst.all(0, len, 0xaa));
    // The sender rewrites its buffer: the receiver keeps the old bytes.
    src.fill(0, len, 0x11);
    assert!(dst.all(0, len, 0xaa));
    // The receiver writes: the sender is unaffected.
    dst.fill(0, 4096, 0x22);
    assert!(src.all(0, len, 0x11));
    assert!(dst.all(4096, len, 0xaa));
    // The sender's region goes away: the receiver's pages stay.
    drop(src);
    assert_eq!(dst.get(0), 0x22);
    assert!(dst.all(4096, len, 0xaa));
    // Written since it was adopted: handed on by plain reference, from a file of its own.
    assert!(exchange_span(dst.0, len).is_none());
    let on = lookup(dst.0, len).expect("moved");
    assert_eq!(file_bytes(&on, 0, 1), [0x22]);
}

#[test]
fn spans_not_page_aligned_or_not_in_a_region_are_not_exchanged() {
    let len = 64 << 10;
    let m = Mapped::new(len);
    // SAFETY: inside the mapping.
    assert!(exchange_span(unsafe { m.0.add(1) }, 4096).is_none());
    assert!(exchange_span(m.0, 4095).is_none());
    assert!(exchange_span(m.0, 2 * len).is_none());
    let mut heap = vec![0u8; 3 * PAGE];
    let aligned = heap
        .as_mut_ptr()
        .wrapping_add(heap.as_ptr().align_offset(PAGE));
    assert!(exchange_span(aligned, PAGE).is_none(), "not braid's memory");
    let span = exchange_span(m.0, PAGE).expect("frozen");
    assert!(
        !adopt(aligned, PAGE, &span),
        "never remaps memory braid does not own"
    );
    // SAFETY: inside the mapping.
    assert!(!adopt(unsafe { m.0.add(8) }, PAGE, &span));
    let past = SharedSpan {
        offset: len as u64,
        ..span.clone()
    };
    assert!(!adopt(m.0, PAGE, &past), "past the file's end");
}

/// One step of the model test below.
#[derive(Debug, Clone)]
enum Step {
    /// Fills page `page` of region `r` with `value`.
    Write { r: usize, page: usize, value: u8 },
    /// Sends `pages` pages from region `from` at `at` into the other region at `to`: by page
    /// exchange where it applies (as a same-host rail does), else by a copy from the file
    /// `lookup` names, else by a plain copy (as inline bytes).
    Send {
        from: usize,
        at: usize,
        to: usize,
        pages: usize,
    },
}

const MODEL_PAGES: usize = 24;

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (0..2usize, 0..MODEL_PAGES, any::<u8>()).prop_map(|(r, page, value)| Step::Write {
            r,
            page,
            value
        }),
        (0..2usize, 0..MODEL_PAGES, 0..MODEL_PAGES, 1..MODEL_PAGES).prop_map(
            |(from, at, to, pages)| {
                let pages = pages.min(MODEL_PAGES - at).min(MODEL_PAGES - to);
                Step::Send {
                    from,
                    at,
                    to,
                    pages,
                }
            }
        ),
    ]
}

/// The region's bytes as the model holds them: one value per page.
fn page_values(m: &Mapped) -> Vec<u8> {
    (0..MODEL_PAGES)
        .map(|p| {
            let v = m.get(p * PAGE);
            assert!(
                m.all(p * PAGE, (p + 1) * PAGE, v),
                "page {p} is not uniform"
            );
            v
        })
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Random writes and transfers between two regions: every region always holds what a
    /// plain copy would have left, and every file `lookup` or `exchange_span` names holds
    /// exactly the memory's bytes at that moment (what a peer reads through it).
    #[test]
    fn exchanged_and_referenced_spans_always_hold_the_memory_bytes(
        steps in proptest::collection::vec(step(), 1..40)
    ) {
        let regions = [Mapped::new(MODEL_PAGES * PAGE), Mapped::new(MODEL_PAGES * PAGE)];
        let mut model = [vec![0u8; MODEL_PAGES], vec![0u8; MODEL_PAGES]];
        for s in steps {
            match s {
                Step::Write { r, page, value } => {
                    regions[r].fill(page * PAGE, (page + 1) * PAGE, value);
                    model[r][page] = value;
                }
                Step::Send { from, at, to, pages } => {
                    let (src, dst) = (&regions[from], &regions[1 - from]);
                    let len = pages * PAGE;
                    // SAFETY: inside the regions.
                    let (sp, dp) = unsafe { (src.0.add(at * PAGE), dst.0.add(to * PAGE)) };
                    let want: Vec<u8> = model[from][at..at + pages].to_vec();
                    let span = exchange_span(sp, len);
                    if let Some(span) = &span {
                        for (k, &v) in want.iter().enumerate() {
                            assert_eq!(file_bytes(span, (k * PAGE) as u64, 1), [v], "frozen file");
                        }
                    }
                    let by_file = span.clone().or_else(|| lookup(sp, len));
                    match (&span, by_file) {
                        (Some(span), _) if adopt(dp, len, span) => {}
                        (_, Some(file)) => {
                            for (k, &v) in want.iter().enumerate() {
                                assert_eq!(file_bytes(&file, (k * PAGE) as u64, PAGE), vec![v; PAGE], "referenced file");
                                dst.fill((to + k) * PAGE, (to + k + 1) * PAGE, v);
                            }
                        }
                        (_, None) => {
                            for (k, &v) in want.iter().enumerate() {
                                dst.fill((to + k) * PAGE, (to + k + 1) * PAGE, v);
                            }
                        }
                    }
                    model[1 - from][to..to + pages].copy_from_slice(&want);
                }
            }
            for r in 0..2 {
                proptest::prop_assert_eq!(page_values(&regions[r]), model[r].clone());
            }
        }
        // Whatever is plain-shared now reads back from its file as it is in memory.
        for (region, values) in regions.iter().zip(&model) {
            for (p, &v) in values.iter().enumerate() {
                // SAFETY: inside the region.
                if let Some(f) = lookup(unsafe { region.0.add(p * PAGE) }, PAGE) {
                    proptest::prop_assert_eq!(file_bytes(&f, 0, PAGE), vec![v; PAGE]);
                }
            }
        }
    }
}

#[test]
fn spans_frozen_apart_are_exchanged_together_while_untouched() {
    let len = 64 << 10;
    let m = Mapped::new(len);
    m.fill(0, len, 9);
    let half = len / 2;
    let a = exchange_span(m.0, half).expect("first half");
    // SAFETY: inside the mapping.
    let b = exchange_span(unsafe { m.0.add(half) }, half).expect("second half");
    assert_eq!(
        (a.token, b.token, b.offset),
        (a.token, a.token, half as u64)
    );
    // Cut differently (a lone operation's shares vary): still the region's file, no copy.
    // SAFETY: inside the mapping.
    let mid = exchange_span(unsafe { m.0.add(PAGE) }, half).expect("across both");
    assert_eq!((mid.token, mid.offset), (a.token, PAGE as u64));
    let all = exchange_span(m.0, len).expect("all");
    assert_eq!((all.token, all.offset), (a.token, 0));
    // Written, then cut differently: its bytes move (a file of its own, by plain reference).
    m.fill(PAGE, PAGE + 1, 1);
    // SAFETY: inside the mapping.
    assert!(exchange_span(unsafe { m.0.add(PAGE) }, half).is_none());
    // SAFETY: inside the mapping.
    let moved = lookup(unsafe { m.0.add(PAGE) }, half).expect("moved");
    assert_ne!(moved.token, a.token);
    assert_eq!(file_bytes(&moved, 0, 2), [1, 9]);
}
