//! What a copy-on-write costs here, beside the copy it would save: the ceiling of page
//! exchange for a sender that rewrites its whole buffer between sends (issue 14,
//! docs/PROTOCOL.md "Page exchange").
//!
//! ```text
//! cargo run --release -p braid --example cow_cost -- [MiB] [rounds]   # defaults: 16 10
//! ```
//!
//! Per round, on a buffer of MiB mebibytes (best round of each printed):
//! * `memcpy`: a single copy of the buffer into another (what single copy moves per send);
//! * `memset`: the sender's rewrite of a buffer that is its own;
//! * `memset over cow`: the same rewrite over pages mapped copy-on-write (`MAP_PRIVATE`)
//!   over a memfd's pages that were read in first, which is what a sender's buffer is
//!   after a page exchange: every page's first write faults and copies 4 KiB.
//!
//! A rewritten send costs `memset + memcpy` by single copy and at least `memset over cow`
//! by page exchange (the exchange itself moves no byte), so page exchange can reach at
//! most their ratio of the single-copy rate. The program prints that ceiling.

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().map_or(16, |v| v.parse().expect("MiB"));
    let rounds: usize = args.next().map_or(10, |v| v.parse().expect("rounds"));
    assert!((1..=1024).contains(&mib) && (1..=1000).contains(&rounds));
    let len = mib << 20;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let pages = len / page;

    let src = vec![1u8; len];
    let mut dst = vec![2u8; len];
    let (mut copy, mut set, mut cow) = (f64::MAX, f64::MAX, f64::MAX);
    for r in 0..rounds {
        let t = Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        copy = copy.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        dst.fill(std::hint::black_box(r as u8));
        set = set.min(t.elapsed().as_secs_f64());
        cow = cow.min(rewrite_over_cow(len, page, r as u8));
    }
    std::hint::black_box(&dst);
    let us_page = |s: f64| s * 1e6 / pages as f64;
    println!(
        "{mib} MiB, {page} B pages, best of {rounds}: memcpy {:.3} ms ({:.3} us/page), memset {:.3} ms, memset over cow {:.3} ms ({:.3} us/page)",
        copy * 1e3,
        us_page(copy),
        set * 1e3,
        cow * 1e3,
        us_page(cow)
    );
    println!(
        "rewritten sends: page exchange paying a copy-on-write per page reaches at most {:.2}x single copy (a copy-on-write costs {:.1}x a page copy)",
        (set + copy) / cow,
        us_page(cow - set) / us_page(copy)
    );
}

/// Seconds to write `byte` over `len` bytes mapped copy-on-write over a memfd whose pages
/// exist and were mapped for reading first (each write is then a copy-on-write fault, not
/// the fault of a missing page).
fn rewrite_over_cow(len: usize, page: usize, byte: u8) -> f64 {
    use rustix::mm::{MapFlags, ProtFlags, mmap, munmap};
    let fd = rustix::fs::memfd_create("cow_cost", rustix::fs::MemfdFlags::CLOEXEC)
        .expect("memfd_create");
    rustix::fs::ftruncate(&fd, len as u64).expect("ftruncate");
    let rw = ProtFlags::READ | ProtFlags::WRITE;
    // SAFETY: fresh mappings of our own memfd, unmapped below; nothing else refers to them.
    unsafe {
        let shared = mmap(std::ptr::null_mut(), len, rw, MapFlags::SHARED, &fd, 0).expect("mmap");
        std::ptr::write_bytes(shared.cast::<u8>(), 3, len);
        let private = mmap(std::ptr::null_mut(), len, rw, MapFlags::PRIVATE, &fd, 0).expect("mmap");
        let p = private.cast::<u8>();
        let mut sum = 0u8;
        for off in (0..len).step_by(page) {
            sum = sum.wrapping_add(std::ptr::read_volatile(p.add(off)));
        }
        std::hint::black_box(sum);
        let t = Instant::now();
        std::ptr::write_bytes(p, byte, len);
        let s = t.elapsed().as_secs_f64();
        munmap(private, len).expect("munmap");
        munmap(shared, len).expect("munmap");
        s
    }
}
