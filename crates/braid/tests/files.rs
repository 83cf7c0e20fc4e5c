//! File pages as registered regions, on real sockets over loopback: reads and writes
//! through the page cache (checked with pread/pwrite), the file's end, and truncation
//! under transfers (clean error completions, no signal, the endpoint stays usable).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use braid::{Access, CompletionKind, Error, RemoteKey, Status};
use common::tmpfile::TempFile;
use common::*;

const MIB: usize = 1 << 20;

#[test]
fn read_only_file_region_serves_reads_and_refuses_writes() {
    let p = pair(4);
    let data = pattern(1, 8 * MIB + 123);
    let f = TempFile::with(&data);
    let ro = f.read_only();
    let region = p
        .server_ctx
        .register_file(&ro, 0, data.len(), Access::REMOTE_READ)
        .unwrap();
    drop(ro); // the region keeps its own descriptor
    assert!(region.is_file());
    let key = region.remote_key();
    let back = p
        .client_ctx
        .alloc_region(data.len(), Access::all())
        .unwrap();
    p.client.read(1, &[back.as_sge()], &key, 0).unwrap();
    let c = expect_ok(&p.client_cq, 1);
    assert_eq!(c.byte_len, data.len() as u64);
    assert!(back.to_vec(0, data.len()).unwrap() == data);
    // (Striping over every rail is checked on the shaped testbed, where it does not depend
    // on how fast loopback drains the first rails: crates/braid-cli/tests/testbed_files.rs.)

    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    p.client.write(2, &[src.as_sge()], &key, 0).unwrap();
    let c = next(&p.client_cq);
    assert_eq!((c.wr_id, c.status), (2, Status::RemoteAccessError));
    assert!(
        f.pread(0, 4096) == data[..4096],
        "a refused write changes nothing"
    );
    assert!(region.write_at(0, b"x").is_err() || !region.access().contains(Access::LOCAL_WRITE));
}

#[test]
fn read_write_file_region_goes_through_the_page_cache() {
    let p = pair(4);
    let f = TempFile::with(&pattern(2, 6 * MIB));
    // An unaligned start: the mapping begins at the page below it.
    let base = 12_345u64;
    let len = 5 * MIB;
    let region = p
        .server_ctx
        .register_file(
            &f.file,
            base,
            len,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    assert_eq!(region.file_offset(), Some(base));
    let key = region.remote_key();
    let src = p.client_ctx.alloc_region(len, Access::all()).unwrap();
    let back = p.client_ctx.alloc_region(len, Access::all()).unwrap();

    // Peer writes land in the file (seen by pread).
    let new = pattern(3, 3 * MIB + 17);
    src.write_at(0, &new).unwrap();
    p.client
        .write(1, &[src.slice(0, new.len()).unwrap()], &key, 777)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    assert!(f.pread(base + 777, new.len()) == new);

    // Local writes to the file (pwrite) are what peers read.
    let local = pattern(4, 2 * MIB);
    f.pwrite(base + 4096, &local);
    p.client
        .read(2, &[back.slice(0, local.len()).unwrap()], &key, 4096)
        .unwrap();
    expect_ok(&p.client_cq, 2);
    assert!(back.to_vec(0, local.len()).unwrap() == local);

    // The local API reads and writes the same pages.
    region.write_at(10, b"hello").unwrap();
    assert_eq!(f.pread(base + 10, 5), b"hello");
    assert_eq!(region.to_vec(10, 5).unwrap(), b"hello");
    assert!(region.atomic_u64(0).is_err(), "no atomics on file pages");
}

#[test]
fn registration_refuses_what_file_pages_cannot_do() {
    let ctx = braid::Context::new().unwrap();
    let f = TempFile::with(&[1u8; 8192]);
    let e = ctx
        .register_file(
            &f.file,
            0,
            8192,
            Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        )
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    let ro = f.read_only();
    let e = ctx
        .register_file(&ro, 0, 8192, Access::REMOTE_WRITE)
        .unwrap_err();
    assert!(e.to_string().contains("read-write"), "{e}");
    let devnull = std::fs::File::open("/dev/null").unwrap();
    assert!(
        ctx.register_file(&devnull, 0, 4096, Access::REMOTE_READ)
            .is_err()
    );
    assert!(
        ctx.register_file(&f.file, 0, 0, Access::REMOTE_READ)
            .is_err()
    );
    assert_eq!(ctx.region_count(), 0);
}

#[test]
fn past_end_of_file_is_a_remote_access_error_and_growth_needs_no_new_key() {
    let p = pair(2);
    let data = pattern(5, 100_000);
    let f = TempFile::with(&data);
    // The registration reaches 1 MiB; the file has 100,000 bytes.
    let region = p
        .server_ctx
        .register_file(&f.file, 0, MIB, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    let key = region.remote_key();
    let buf = p.client_ctx.alloc_region(MIB, Access::all()).unwrap();

    p.client
        .read(1, &[buf.slice(0, 100_000).unwrap()], &key, 0)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    assert!(buf.to_vec(0, 100_000).unwrap() == data);
    // Across the end, and wholly past it (a page that would SIGBUS if loaded).
    p.client
        .read(2, &[buf.slice(0, 8192).unwrap()], &key, 96_000)
        .unwrap();
    p.client
        .read(3, &[buf.slice(0, 4096).unwrap()], &key, 512 << 10)
        .unwrap();
    p.client
        .write(4, &[buf.slice(0, 4096).unwrap()], &key, 200_000)
        .unwrap();
    for wr in 2..=4 {
        let c = next(&p.client_cq);
        assert_eq!(
            (c.wr_id, c.status),
            (wr, Status::RemoteAccessError),
            "{c:?}"
        );
    }
    assert_eq!(f.len(), 100_000, "a refused write does not grow the file");
    // Locally too, an error rather than a signal.
    let mut b = [0u8; 16];
    assert!(matches!(
        region.read_at(600_000, &mut b),
        Err(Error::PastEndOfFile { .. })
    ));
    assert!(region.write_at(99_999, b"ab").is_err());
    assert_eq!(region.file_readable_len().unwrap().unwrap(), 100_000);

    // The file grows (as the file service does with a setattr first): same key.
    f.set_len(300_000);
    buf.fill(0, 4096, 0x5a).unwrap();
    p.client
        .write(5, &[buf.slice(0, 4096).unwrap()], &key, 200_000)
        .unwrap();
    expect_ok(&p.client_cq, 5);
    assert_eq!(f.pread(200_000, 4096), vec![0x5a; 4096]);
    // The endpoint is fine after all of that.
    p.client
        .read(6, &[buf.slice(0, 1000).unwrap()], &key, 0)
        .unwrap();
    expect_ok(&p.client_cq, 6);
}

/// What the file may hold while it is truncated and regrown under transfers that write
/// only its own pattern back: per byte, the pattern or zero (a page truncated away and grown
/// back reads as a hole; a write whose source pages were lost sent zeros in their place).
fn pattern_or_zero(got: &[u8], want: &[u8]) -> bool {
    got.iter().zip(want).all(|(g, w)| g == w || *g == 0)
}

#[test]
fn truncation_under_transfers_gives_clean_errors_and_the_endpoint_stays_usable() {
    const LEN: usize = 16 * MIB;
    const OPS: u64 = 150;
    let p = pair(4);
    let data = pattern(6, LEN);
    let f = Arc::new(TempFile::with(&data));
    let region = p
        .server_ctx
        .register_file(&f.file, 0, LEN, Access::REMOTE_READ | Access::REMOTE_WRITE)
        .unwrap();
    let key = region.remote_key();
    // The client's own source of writes is a file region too (mapped read-only), truncated
    // likewise; it holds the first 4 MiB of the pattern and is written at offset 0.
    let lf = Arc::new(TempFile::with(&data[..4 * MIB]));
    let local_src = p
        .client_ctx
        .register_file(&lf.file, 0, 4 * MIB, Access::NONE)
        .unwrap();
    let buf = p.client_ctx.alloc_region(4 * MIB, Access::all()).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let truncator = {
        let (f, lf, stop) = (f.clone(), lf.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let cut = (n * 7_919 % 15) * MIB as u64;
                f.set_len(cut);
                lf.set_len(cut / 4);
                std::thread::sleep(Duration::from_micros(300));
                f.set_len(LEN as u64);
                lf.set_len(4 * MIB as u64);
                std::thread::sleep(Duration::from_micros(700));
                n += 1;
            }
            n
        })
    };

    let mut counts = std::collections::BTreeMap::new();
    for i in 0..OPS {
        let len = [4 * MIB, MIB, 64 << 10, 300 << 10][i as usize % 4];
        let off = (i as usize * 3 * MIB + i as usize * 4096) % (LEN - 4 * MIB);
        let want = &data[off..off + len];
        match i % 3 {
            0 => p
                .client
                .read(i, &[buf.slice(0, len).unwrap()], &key, off as u64)
                .unwrap(),
            1 => {
                buf.write_at(0, want).unwrap();
                p.client
                    .write(i, &[buf.slice(0, len).unwrap()], &key, off as u64)
                    .unwrap()
            }
            _ => p
                .client
                .write(i, &[local_src.slice(0, len).unwrap()], &key, 0)
                .unwrap(),
        }
        let c = next(&p.client_cq);
        assert_eq!(c.wr_id, i);
        *counts
            .entry(format!("{:?}/{:?}", c.kind, c.status))
            .or_insert(0) += 1;
        match c.status {
            Status::Success => {
                if c.kind == CompletionKind::Read {
                    let got = buf.to_vec(0, len).unwrap();
                    assert!(
                        pattern_or_zero(&got, want),
                        "read {i} returned bytes the file never held"
                    );
                }
            }
            Status::RemoteAccessError => {}
            Status::LocalAccessError => assert_eq!(i % 3, 2, "{c:?}"),
            s => panic!("operation {i}: unexpected {s:?}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    let cycles = truncator.join().unwrap();
    eprintln!("{cycles} truncate/extend cycles; completions {counts:?}");
    assert!(
        counts.keys().any(|k| k.ends_with("/Success")),
        "some operations went through: {counts:?}"
    );

    // Still usable: the file is whole again; a write and a read-back check out.
    f.set_len(LEN as u64);
    let fresh = pattern(8, 2 * MIB);
    buf.write_at(0, &fresh).unwrap();
    let at = 5 * MIB as u64;
    p.client
        .write(1000, &[buf.slice(0, fresh.len()).unwrap()], &key, at)
        .unwrap();
    expect_ok(&p.client_cq, 1000);
    assert!(f.pread(at, fresh.len()) == fresh);
    buf.fill(0, fresh.len(), 0).unwrap();
    p.client
        .read(1001, &[buf.slice(0, fresh.len()).unwrap()], &key, at)
        .unwrap();
    expect_ok(&p.client_cq, 1001);
    assert!(buf.to_vec(0, fresh.len()).unwrap() == fresh);
    assert!(!p.client.is_closed() && !p.server.is_closed());
    assert!(
        p.client.rails_alive().iter().all(|&a| a),
        "no rail was lost"
    );
    assert!(
        p.server.rails_alive().iter().all(|&a| a),
        "no rail was lost"
    );
    // The local API on the truncated file region: an error, never a signal.
    lf.set_len(0);
    let mut b = [0u8; 64];
    assert!(local_src.read_at(MIB, &mut b).is_err());
    let _ = RemoteKey::from_bytes(&key.to_bytes());
}
