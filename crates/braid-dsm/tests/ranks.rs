//! The DSM on real processes: several ranks on loopback, each a re-run of this test binary
//! (see `common/mod.rs`), exercising allocation, reads, writes, invalidation, locks,
//! barriers and the error cases. Needs userfaultfd (root, or the sysctl); skips otherwise.

mod common;

use std::time::{Duration, Instant};

use braid_dsm::{Dsm, DsmError, HomePolicy};
use common::{assert_all_ok, run_job, scenario};

const ENTRY: &str = "rank_entry";

/// Entry of a child rank; a no-op in the normal test run.
#[test]
fn rank_entry() {
    let Some(name) = scenario() else { return };
    let code = match run_scenario(&name) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!(
                "rank {}: {name}: {e}",
                std::env::var("BRAID_RANK").unwrap_or_default()
            );
            1
        }
    };
    std::process::exit(code);
}

fn uffd_available() -> bool {
    // SAFETY: plain system call; the descriptor is closed at once.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) };
    if fd < 0 {
        eprintln!("skipped: userfaultfd is not available to this process");
        return false;
    }
    // SAFETY: our own descriptor.
    unsafe { libc::close(fd as i32) };
    true
}

type R = Result<(), Box<dyn std::error::Error>>;

fn check(cond: bool, what: impl Into<String>) -> R {
    if cond {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

fn run_scenario(name: &str) -> R {
    match name {
        "basic" => basic(),
        "counter" => counter(),
        "mismatch" => mismatch(),
        "dead_rank" => dead_rank(),
        "segv" => segv(),
        "unprivileged" => unprivileged(),
        "litmus" => litmus_short(),
        "capi_stats" => capi_stats(),
        _ => Err(format!("unknown scenario {name}").into()),
    }
}

/// Every rank writes its own pages and reads everyone's; then pages move between writers.
fn basic() -> R {
    let dsm = Dsm::init()?;
    let (rank, size) = (dsm.rank(), dsm.size());
    let page = dsm.page_size();
    for policy in [HomePolicy::Block, HomePolicy::Cyclic] {
        let pages = 4 * size;
        let a = dsm.alloc_with(pages * page, policy)?;
        // Untouched memory reads as zero everywhere.
        check(
            a.read::<u64>(page * (pages - 1)) == 0,
            "fresh memory is zero",
        )?;
        dsm.barrier()?;
        for p in (rank..pages).step_by(size) {
            for w in 0..page / 8 {
                a.write::<u64>(p * page + w * 8, (p * 1000 + w) as u64);
            }
        }
        dsm.barrier()?;
        for p in 0..pages {
            for w in [0, page / 16, page / 8 - 1] {
                let v = a.read::<u64>(p * page + w * 8);
                check(
                    v == (p * 1000 + w) as u64,
                    format!("page {p} word {w}: {v}"),
                )?;
            }
        }
        dsm.barrier()?;
        // Each rank in turn overwrites page 0; all others then see it (invalidation).
        for turn in 0..size {
            if turn == rank {
                a.write::<u64>(0, 7_000 + turn as u64);
            }
            dsm.barrier()?;
            let v = a.read::<u64>(0);
            check(
                v == 7_000 + turn as u64,
                format!("turn {turn}: page 0 holds {v}"),
            )?;
            dsm.barrier()?;
        }
        dsm.free(a)?;
    }
    // The address is the same on every rank: a pointer stored in shared memory works.
    let a = dsm.alloc(2 * page)?;
    if rank == 0 {
        a.write::<u64>(0, a.as_ptr() as u64 + page as u64);
        a.write::<u64>(page, 99);
    }
    dsm.barrier()?;
    let p = a.read::<u64>(0) as *const u64;
    // SAFETY: the pointer rank 0 stored points into the allocation, identical everywhere.
    check(unsafe { p.read_volatile() } == 99, "a shared pointer")?;
    dsm.barrier()?;
    let s = dsm.stats();
    println!("rank {rank}: {s:?}");
    check(s.faults > 0 && s.installs > 0, "faults were served")?;
    dsm.finalize()?;
    Ok(())
}

/// A counter incremented under a lock by every rank; the total is exact.
fn counter() -> R {
    let dsm = Dsm::init()?;
    let (rank, size) = (dsm.rank(), dsm.size());
    let a = dsm.alloc(dsm.page_size())?;
    const N: u64 = 200;
    for i in 0..N {
        dsm.lock(3)?;
        let v = a.read::<u64>(0);
        a.write::<u64>(0, v + 1);
        // A second word checks mutual exclusion: never odd outside the lock.
        let w = a.read::<u64>(8);
        check(
            w % 2 == 0,
            format!("iteration {i}: a holder was inside with us"),
        )?;
        a.write::<u64>(8, w + 1);
        a.write::<u64>(8, w + 2);
        dsm.unlock(3)?;
    }
    dsm.barrier()?;
    let v = a.read::<u64>(0);
    check(
        v == N * size as u64,
        format!("counter {v}, expected {}", N * size as u64),
    )?;
    // Locks are also usable from several threads of a rank.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                for _ in 0..20 {
                    dsm.lock(11).unwrap();
                    a.write::<u64>(16, a.read::<u64>(16) + 1);
                    dsm.unlock(11).unwrap();
                }
            });
        }
    });
    dsm.barrier()?;
    let v = a.read::<u64>(16);
    check(v == 40 * size as u64, format!("threaded counter {v}"))?;
    // Bad lock use is an error, not a hang.
    check(
        matches!(dsm.unlock(5), Err(DsmError::InvalidArgument(_))),
        "unlock of a free lock",
    )?;
    check(
        matches!(dsm.lock(u32::MAX), Err(DsmError::InvalidArgument(_))),
        "lock id range",
    )?;
    println!("rank {rank}: counter ok");
    dsm.finalize()?;
    Ok(())
}

/// Different sizes in one `alloc` fail on every rank; the group stays usable.
fn mismatch() -> R {
    let dsm = Dsm::init()?;
    let rank = dsm.rank();
    let e = dsm.alloc(4096 * (1 + rank)).unwrap_err();
    check(matches!(e, DsmError::Mismatch(_)), format!("got {e}"))?;
    check(
        e.to_string().contains("rank 1"),
        format!("names the ranks: {e}"),
    )?;
    let e = dsm.alloc(0).unwrap_err();
    check(
        matches!(e, DsmError::InvalidArgument(_)),
        format!("alloc(0): {e}"),
    )?;
    let e = dsm.alloc(usize::MAX / 2).unwrap_err();
    check(
        matches!(e, DsmError::NoSpace(_)),
        format!("huge alloc: {e}"),
    )?;
    let a = dsm.alloc(100)?;
    a.write::<u32>(0, 1);
    dsm.free(a)?;
    dsm.finalize()?;
    Ok(())
}

/// Rank 1 dies; rank 0's next operation fails with a clear error within seconds.
fn dead_rank() -> R {
    let dsm = Dsm::init()?;
    let a = dsm.alloc_with(dsm.page_size(), HomePolicy::Block)?;
    if dsm.rank() == 0 {
        a.write::<u64>(0, 5);
    }
    dsm.barrier()?;
    if dsm.rank() == 1 {
        // A fault served by rank 0 (its answer comes after this rank's barrier message
        // has left), then die like a crash.
        check(a.read::<u64>(0) == 5, "the value rank 0 wrote")?;
        // SAFETY: ends this process at once.
        unsafe { libc::_exit(3) };
    }
    let t = Instant::now();
    let e = dsm.barrier().unwrap_err();
    let took = t.elapsed();
    println!("rank 0: barrier failed after {took:?}: {e}");
    check(matches!(e, DsmError::Failed(_)), format!("got {e}"))?;
    check(took < Duration::from_secs(10), format!("took {took:?}"))?;
    check(
        e.to_string().contains("rank 1"),
        format!("names the rank: {e}"),
    )?;
    let e2 = dsm.lock(1).unwrap_err();
    check(
        matches!(e2, DsmError::Failed(_)),
        format!("later calls fail too: {e2}"),
    )?;
    let _ = a;
    Ok(())
}

/// An access outside every allocation is an ordinary SIGSEGV (the parent checks).
fn segv() -> R {
    let dsm = Dsm::init()?;
    let a = dsm.alloc(dsm.page_size())?;
    a.write::<u64>(0, 1);
    let beyond = unsafe { a.as_ptr().add(dsm.page_size()) } as *mut u64;
    // SAFETY: deliberately not: the guard page after the allocation.
    unsafe { beyond.write_volatile(1) };
    Err("survived a write outside every allocation".into())
}

/// A short litmus run (the survey is the `litmus` example): nothing SC forbids.
fn litmus_short() -> R {
    use braid_dsm::litmus::{self, Settings, Test};
    let dsm = Dsm::init()?;
    let s = Settings {
        iterations: 1500,
        batch: 500,
        ..Settings::default()
    };
    for t in [Test::Sb, Test::Mp, Test::Iriw] {
        let tally = litmus::run(&dsm, t, s)?;
        if dsm.rank() == 0 {
            println!("{}", tally.to_json());
            check(
                tally.forbidden() == 0,
                format!("forbidden outcome seen: {}", tally.to_json()),
            )?;
            check(tally.iterations == 1500, "all iterations counted")?;
        }
    }
    dsm.finalize()?;
    Ok(())
}

/// Without permission for userfaultfd, init names the sysctl.
fn unprivileged() -> R {
    // SAFETY: dropping to nobody in this child process only.
    unsafe {
        if libc::setgid(65534) != 0 || libc::setuid(65534) != 0 {
            return Err("cannot drop privileges".into());
        }
    }
    let e = Dsm::init().unwrap_err();
    println!("init: {e}");
    check(
        matches!(e, DsmError::UserfaultfdNotPermitted(_)),
        format!("got {e:?}"),
    )?;
    check(
        e.to_string().contains("vm.unprivileged_userfaultfd"),
        "names the sysctl",
    )?;
    Ok(())
}

/// The C API's `braid_dsm_stats_json`: counters after pages moved, truncation like
/// `snprintf`, one byte per rail counted.
fn capi_stats() -> R {
    use braid_dsm::capi::*;
    use std::ffi::{CStr, c_char};
    check(braid_dsm_init() == 0, "braid_dsm_init")?;
    let (rank, size) = (braid_dsm_rank(), braid_dsm_size());
    let page = braid_dsm_page_size();
    let p = braid_dsm_alloc_policy(2 * page * size as usize, BRAID_DSM_HOME_BLOCK).cast::<u64>();
    check(!p.is_null(), "alloc")?;
    let words = page / 8;
    // Each rank writes the pages homed at the other rank, then reads its own back.
    let other = ((rank + 1) % size) as usize;
    for i in 0..2 * words {
        // SAFETY: in the allocation (2 pages per rank).
        unsafe { p.add(other * 2 * words + i).write_volatile(i as u64) };
    }
    check(braid_dsm_barrier() == 0, "barrier")?;
    // SAFETY: as above.
    let v = unsafe { p.add(rank as usize * 2 * words + 5).read_volatile() };
    check(v == 5, format!("read back {v}"))?;
    // Every rank's page has come (and so was sent) before anyone reads the counters.
    check(braid_dsm_barrier() == 0, "barrier")?;
    let mut buf = vec![0 as c_char; 4096];
    // SAFETY: a buffer of buf.len() bytes.
    let n = unsafe { braid_dsm_stats_json(buf.as_mut_ptr(), buf.len()) };
    check(n > 0 && (n as usize) < buf.len(), format!("length {n}"))?;
    // SAFETY: NUL-terminated by the call.
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_str()?
        .to_string();
    check(text.len() == n as usize, "length matches the text")?;
    check(
        text.starts_with(&format!("{{\"rank\":{rank},\"size\":{size},")),
        format!("starts with rank and size: {text}"),
    )?;
    let faults: u64 = text
        .split("\"faults\":")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .and_then(|t| t.parse().ok())
        .ok_or(format!("no faults in {text}"))?;
    check(faults >= 2, format!("faults {faults} in {text}"))?;
    let rails = text
        .split("\"rail_bytes_sent\":[")
        .nth(1)
        .and_then(|t| t.strip_suffix("]}"))
        .ok_or(format!("no rail_bytes_sent in {text}"))?;
    let sent: u64 = rails
        .split(',')
        .map(|b| b.parse::<u64>().unwrap_or(0))
        .sum();
    check(
        sent >= page as u64,
        format!("at least a page sent on the rails: {text}"),
    )?;
    // Cut like snprintf: NUL at the end, the full length returned.
    let mut small = [1 as c_char; 10];
    // SAFETY: a buffer of 10 bytes.
    let m = unsafe { braid_dsm_stats_json(small.as_mut_ptr(), small.len()) };
    check(m >= 10 && small[9] == 0, format!("cut: {m}"))?;
    // SAFETY: NULL with length 0 is allowed.
    let m = unsafe { braid_dsm_stats_json(std::ptr::null_mut(), 0) };
    check(m > 0, "length query")?;
    println!("rank {rank}: {text}");
    check(braid_dsm_barrier() == 0, "barrier")?;
    braid_dsm_free(p.cast());
    check(braid_dsm_finalize() == 0, "finalize")?;
    Ok(())
}

#[test]
fn c_api_stats_json_two_ranks() {
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "capi_stats", 2, &[], Duration::from_secs(120));
    assert_all_ok("capi_stats", &rs);
}

#[test]
fn basic_three_ranks() {
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "basic", 3, &[], Duration::from_secs(120));
    assert_all_ok("basic", &rs);
}

#[test]
fn lock_counter_three_ranks() {
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "counter", 3, &[], Duration::from_secs(120));
    assert_all_ok("counter", &rs);
}

#[test]
fn alloc_size_mismatch_fails_everywhere() {
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "mismatch", 2, &[], Duration::from_secs(60));
    assert_all_ok("mismatch", &rs);
}

#[test]
fn dead_rank_fails_the_next_operation() {
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "dead_rank", 2, &[], Duration::from_secs(60));
    assert!(
        rs[0].status.success(),
        "rank 0: {}\n{}\n{}",
        rs[0].status,
        rs[0].stdout,
        rs[0].stderr
    );
    assert_eq!(rs[1].status.code(), Some(3));
}

#[test]
fn access_outside_allocations_is_sigsegv() {
    use std::os::unix::process::ExitStatusExt;
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "segv", 1, &[], Duration::from_secs(60));
    assert_eq!(rs[0].status.signal(), Some(libc::SIGSEGV), "{:?}", rs[0]);
}

#[test]
fn userfaultfd_not_permitted_names_the_sysctl() {
    let sysctl =
        std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || sysctl.trim() != "0" {
        eprintln!("skipped: needs root (to drop to nobody) and vm.unprivileged_userfaultfd = 0");
        return;
    }
    let rs = run_job(ENTRY, "unprivileged", 1, &[], Duration::from_secs(60));
    assert_all_ok("unprivileged", &rs);
    assert!(
        rs[0].stdout.contains("vm.unprivileged_userfaultfd"),
        "{:?}",
        rs[0]
    );
}

#[test]
fn litmus_sb_mp_iriw_short() {
    if !uffd_available() {
        return;
    }
    let rs = run_job(ENTRY, "litmus", 2, &[], Duration::from_secs(180));
    assert_all_ok("litmus", &rs);
    print!("{}", rs[0].stdout);
}
