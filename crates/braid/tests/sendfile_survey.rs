//! Why read responses of file regions are sent with `sendmsg` from the mapping and not with
//! `sendfile`: the sender CPU of both over one loopback TCP stream (64-byte header + 256 KiB
//! of a page-cached file per frame, 4 GiB per run, three rounds). A survey, not a test:
//! `cargo test --release -p braid --test sendfile_survey -- --ignored --nocapture`
//! (run under `flock /work/bench.lock` on a shared machine). See docs/RESULTS.md.

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

const CHUNK: usize = 256 << 10;
const FILE: usize = 256 << 20;
const TOTAL: usize = 4 << 30;

fn thread_cpu() -> f64 {
    // SAFETY: a zeroed rusage is valid; getrusage fills it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// Sends TOTAL bytes as frames; returns (MB/s, sender CPU s per GB).
fn run(sendfile: bool, file: &std::fs::File, map: *const u8) -> (f64, f64) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    tx.set_nodelay(true).unwrap();
    let (mut rx, _) = l.accept().unwrap();
    let want = TOTAL + TOTAL / CHUNK * 64;
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < want {
            match rx.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got += n,
            }
        }
    });
    let fd = tx.as_raw_fd();
    let header = [0u8; 64];
    let (t0, c0) = (Instant::now(), thread_cpu());
    let mut off = 0usize;
    for _ in 0..TOTAL / CHUNK {
        if sendfile {
            // SAFETY: valid descriptors and buffers throughout.
            let n = unsafe { libc::send(fd, header.as_ptr().cast(), 64, libc::MSG_MORE) };
            assert_eq!(n, 64);
            let mut o = off as libc::off_t;
            let mut left = CHUNK;
            while left > 0 {
                let n = unsafe { libc::sendfile(fd, file.as_raw_fd(), &mut o, left) };
                assert!(n > 0, "sendfile: {}", std::io::Error::last_os_error());
                left -= n as usize;
            }
        } else {
            let (mut done, len) = (0usize, 64 + CHUNK);
            while done < len {
                let (h, p) = (64usize.saturating_sub(done), done.saturating_sub(64));
                let iov = [
                    libc::iovec {
                        iov_base: header[64 - h..].as_ptr() as *mut _,
                        iov_len: h,
                    },
                    libc::iovec {
                        // SAFETY: inside the mapping.
                        iov_base: unsafe { map.add(off + p) } as *mut _,
                        iov_len: CHUNK - p,
                    },
                ];
                let skip = if h == 0 { 1 } else { 0 };
                let n = unsafe { libc::writev(fd, iov[skip..].as_ptr(), (2 - skip) as i32) };
                assert!(n > 0, "writev: {}", std::io::Error::last_os_error());
                done += n as usize;
            }
        }
        off = (off + CHUNK) % FILE;
    }
    let (secs, cpu) = (t0.elapsed().as_secs_f64(), thread_cpu() - c0);
    reader.join().unwrap();
    (TOTAL as f64 / secs / 1e6, cpu / (TOTAL as f64 / 1e9))
}

#[test]
#[ignore]
fn sendmsg_from_the_mapping_against_sendfile() {
    let path = std::env::temp_dir().join(format!("braid-sendfile-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    for i in 0..FILE / block.len() {
        file.write_all_at(&block, (i * block.len()) as u64).unwrap();
    }
    // SAFETY: a fresh read-only shared mapping of the file, checked below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            FILE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    for round in 1..=3 {
        let (a, ca) = run(false, &file, map.cast());
        let (b, cb) = run(true, &file, map.cast());
        eprintln!(
            "round {round}: sendmsg from the mapping {a:.0} MB/s, {ca:.3} CPU s/GB; \
             sendfile {b:.0} MB/s, {cb:.3} CPU s/GB (ratio {:.2})",
            cb / ca
        );
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, FILE) };
}
