//! Stream throughput on loopback: `exs_send` (plain-socket mode) against plain `send()`,
//! measured by the same program in alternating rounds, with CPU seconds per GB.
//!
//! ```text
//! cargo run --release -p braid-exs --example exs_bench -- --size 1048576 --seconds 3 --rounds 3 [--json]
//!     [--depth 8] [--zc-min BYTES] [--unregistered] [--dequeue-half]
//! ```
//! `--send-batch N`: the `send()` side writes N buffers of `--size` per call (`writev`), to
//! show what the size of one kernel call costs; the default 1 is plain `send()`.
//! `--dequeue-half`: the sender waits for at least half of its outstanding sends at a time
//! (`exs_qdequeue` with count `-(pending / 2)`, as an application written for the ES-API
//! batches its reaping) instead of for any one; e.g. `--size 65536 --depth 16
//! --dequeue-half`.
//! The receiver is a plain `recv()` loop in both modes. CPU is the whole process
//! (sender, receiver and the exs progress thread), from `getrusage`.
//!
//! `--braid N` measures braid mode instead: exs on both ends of a socket attached with
//! `exs::braid_attach`, over 1 rail and over N loopback rails (127.0.0.1..127.0.0.N, N <= 8),
//! against plain `send()`/`recv()` in the same run (alternating rounds). The receiver posts
//! `--depth` registered receives of `--size` bytes; CPU includes the braid progress engine
//! and the exs-braid completion thread (both ends are in this process).

use std::io::{IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use exs::{Buffer, Queue, Registration};

struct Args {
    size: usize,
    seconds: f64,
    rounds: usize,
    depth: usize,
    json: bool,
    zc_min: Option<usize>,
    unregistered: bool,
    braid: Option<usize>,
    dequeue_half: bool,
    send_batch: usize,
}

fn parse() -> Args {
    let mut a = Args {
        size: 1 << 20,
        seconds: 2.0,
        rounds: 3,
        depth: 8,
        json: false,
        zc_min: None,
        unregistered: false,
        braid: None,
        dequeue_half: false,
        send_batch: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--size" | "-s" => a.size = val().parse().expect("--size"),
            "--seconds" | "-D" => a.seconds = val().parse().expect("--seconds"),
            "--rounds" => a.rounds = val().parse().expect("--rounds"),
            "--depth" => a.depth = val().parse().expect("--depth"),
            "--zc-min" => a.zc_min = Some(val().parse().expect("--zc-min")),
            "--json" => a.json = true,
            "--unregistered" => a.unregistered = true,
            "--dequeue-half" => a.dequeue_half = true,
            "--send-batch" => a.send_batch = val().parse().expect("--send-batch"),
            "--braid" => a.braid = Some(val().parse().expect("--braid")),
            "-h" | "--help" => {
                println!(
                    "exs_bench [--size B] [--seconds S] [--rounds N] [--depth D] [--zc-min B] [--unregistered] [--dequeue-half] [--send-batch N] [--braid RAILS] [--json]"
                );
                std::process::exit(0);
            }
            o => panic!("unknown argument {o}"),
        }
    }
    assert!(
        (1..=1024).contains(&a.send_batch),
        "--send-batch takes 1..=1024"
    );
    assert!(a.size > 0 && a.depth > 0 && a.rounds > 0 && a.seconds > 0.0 && a.seconds <= 600.0);
    a
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Round {
    bytes: u64,
    secs: f64,
    cpu: f64,
}

fn round(a: &Args, exs_mode: bool) -> Round {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (mut rx, _) = l.accept().unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let receiver = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            match rx.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => n += k as u64,
                Err(e) => panic!("receiver: {e}"),
            }
        }
        (n, Instant::now())
    });
    let dur = Duration::from_secs_f64(a.seconds);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    if exs_mode {
        let q = Queue::new(a.depth).unwrap();
        let mut free: Vec<Buffer> = (0..a.depth)
            .map(|i| {
                let v = vec![i as u8; a.size];
                if a.unregistered {
                    Buffer::plain(v)
                } else {
                    Registration::new(v).unwrap().into()
                }
            })
            .collect();
        let mut inflight = 0usize;
        while t0.elapsed() < dur {
            while let Some(b) = free.pop() {
                match q.send(&tx, b, 0) {
                    Ok(()) => inflight += 1,
                    Err(r) if r.is_would_block() => {
                        free.push(r.buffer);
                        break;
                    }
                    Err(r) => panic!("exs_send: {}", r.error),
                }
            }
            let timeout = Some(Duration::from_secs(10));
            let events = if a.dequeue_half {
                q.dequeue_exact((inflight / 2).max(1), timeout)
            } else {
                q.dequeue(a.depth, timeout)
            };
            for e in events.unwrap() {
                e.result().expect("send event");
                inflight -= 1;
                free.push(e.into_buffer().unwrap());
            }
        }
        while inflight > 0 {
            let evs = q.dequeue(a.depth, Some(Duration::from_secs(10))).unwrap();
            assert!(!evs.is_empty(), "send events did not arrive");
            inflight -= evs.len();
        }
    } else {
        let bufs: Vec<Vec<u8>> = (0..a.send_batch).map(|_| vec![1u8; a.size]).collect();
        let mut tx = &tx;
        while t0.elapsed() < dur {
            if let [buf] = &bufs[..] {
                tx.write_all(buf).unwrap();
                continue;
            }
            let mut slices: Vec<IoSlice> = bufs.iter().map(|b| IoSlice::new(b)).collect();
            let mut rest = &mut slices[..];
            while !rest.is_empty() {
                let n = tx.write_vectored(rest).unwrap();
                assert!(n > 0, "send: the stream refused bytes");
                IoSlice::advance_slices(&mut rest, n);
            }
        }
    }
    // SAFETY: plain shutdown of our socket.
    unsafe { libc::shutdown(tx.as_raw_fd(), libc::SHUT_WR) };
    let (bytes, t1) = receiver.join().unwrap();
    Round {
        bytes,
        secs: (t1 - t0).as_secs_f64(),
        cpu: cpu_seconds() - cpu0,
    }
}

/// One braid-mode round: exs sender and exs receiver on a socket attached over `rails`
/// loopback rails.
fn round_braid(a: &Args, rails: usize) -> Round {
    let ips: Vec<String> = (1..=rails).map(|i| format!("127.0.0.{i}")).collect();
    let spec = ips.join(",");
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (rx, _) = l.accept().unwrap();
    let spec2 = spec.clone();
    let rx = std::thread::spawn(move || {
        exs::braid_attach(&rx, exs::BraidRole::Accept, Some(&spec2)).unwrap();
        rx
    });
    exs::braid_attach(&tx, exs::BraidRole::Connect, Some(&spec)).unwrap();
    let rx = rx.join().unwrap();
    let (size, depth) = (a.size, a.depth);
    let receiver = std::thread::spawn(move || {
        let q = Queue::new(depth).unwrap();
        for i in 0..depth {
            q.recv(&rx, Registration::zeroed(size).unwrap(), i as u64)
                .unwrap();
        }
        let (mut n, mut inflight) = (0u64, depth);
        let mut eof = false;
        while inflight > 0 {
            for e in q.dequeue(depth, Some(Duration::from_secs(30))).unwrap() {
                inflight -= 1;
                let k = e.result().expect("braid receive");
                n += k as u64;
                if k == 0 {
                    eof = true;
                } else if !eof {
                    q.recv(&rx, e.into_buffer().unwrap(), 0).unwrap();
                    inflight += 1;
                }
            }
        }
        (n, Instant::now())
    });
    let dur = Duration::from_secs_f64(a.seconds);
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let q = Queue::new(a.depth).unwrap();
    let mut free: Vec<Buffer> = (0..a.depth)
        .map(|i| Registration::new(vec![i as u8; a.size]).unwrap().into())
        .collect();
    let mut inflight = 0usize;
    while t0.elapsed() < dur || inflight > 0 {
        while t0.elapsed() < dur {
            let Some(b) = free.pop() else { break };
            match q.send(&tx, b, 0) {
                Ok(()) => inflight += 1,
                Err(r) if r.is_would_block() => {
                    free.push(r.buffer);
                    break;
                }
                Err(r) => panic!("exs_send: {}", r.error),
            }
        }
        for e in q.dequeue(a.depth, Some(Duration::from_secs(10))).unwrap() {
            e.result().expect("send event");
            inflight -= 1;
            free.push(e.into_buffer().unwrap());
        }
    }
    tx.shutdown(std::net::Shutdown::Write).unwrap();
    let (bytes, t1) = receiver.join().unwrap();
    Round {
        bytes,
        secs: (t1 - t0).as_secs_f64(),
        cpu: cpu_seconds() - cpu0,
    }
}

fn sum(r: &[Round]) -> (f64, f64) {
    let b: u64 = r.iter().map(|x| x.bytes).sum();
    let t: f64 = r.iter().map(|x| x.secs).sum();
    let c: f64 = r.iter().map(|x| x.cpu).sum();
    (b as f64 / t / 1e6, c / (b as f64 / 1e9))
}

fn main_braid(a: &Args, n: usize) {
    assert!((1..=8).contains(&n), "--braid takes 1..=8 rails");
    let mut modes = vec![1usize];
    if n > 1 {
        modes.push(n);
    }
    let mut plain = Vec::new();
    let mut braid: Vec<Vec<Round>> = modes.iter().map(|_| Vec::new()).collect();
    for _ in 0..a.rounds {
        plain.push(round(a, false));
        for (i, &m) in modes.iter().enumerate() {
            braid[i].push(round_braid(a, m));
        }
    }
    let (s_mbs, s_cpu) = sum(&plain);
    let res: Vec<(usize, f64, f64)> = modes
        .iter()
        .zip(&braid)
        .map(|(&m, r)| {
            let (mbs, cpu) = sum(r);
            (m, mbs, cpu)
        })
        .collect();
    if a.json {
        let rows: Vec<String> = res
            .iter()
            .map(|(m, mbs, cpu)| {
                format!(
                    "{{\"rails\":{m},\"MBps\":{mbs:.1},\"ratio\":{:.4},\"cpu_s_per_GB\":{cpu:.3}}}",
                    mbs / s_mbs
                )
            })
            .collect();
        println!(
            "{{\"size\":{},\"seconds\":{},\"rounds\":{},\"depth\":{},\"send_MBps\":{:.1},\"send_cpu_s_per_GB\":{:.3},\"braid\":[{}]}}",
            a.size,
            a.seconds,
            a.rounds,
            a.depth,
            s_mbs,
            s_cpu,
            rows.join(",")
        );
    } else {
        println!(
            "size {} B, {} x {} s rounds, depth {}, braid mode on loopback",
            a.size, a.rounds, a.seconds, a.depth
        );
        println!(
            "{:>16} {:>12} {:>14} {:>8}",
            "mode", "MB/s", "CPU s/GB", "ratio"
        );
        println!(
            "{:>16} {:>12.1} {:>14.3} {:>8.3}",
            "send()", s_mbs, s_cpu, 1.0
        );
        for (m, mbs, cpu) in res {
            println!(
                "{:>16} {:>12.1} {:>14.3} {:>8.3}",
                format!("exs braid {m} rail"),
                mbs,
                cpu,
                mbs / s_mbs
            );
        }
    }
}

fn main() {
    let a = parse();
    if let Some(n) = a.braid {
        main_braid(&a, n);
        return;
    }
    exs::init().expect("io_uring");
    if let Some(z) = a.zc_min {
        exs::set_zerocopy_min(z).unwrap();
    }
    let zc = exs::zerocopy_min().unwrap();
    let (mut s, mut e) = (Vec::new(), Vec::new());
    for _ in 0..a.rounds {
        s.push(round(&a, false));
        e.push(round(&a, true));
    }
    let (s_mbs, s_cpu) = sum(&s);
    let (e_mbs, e_cpu) = sum(&e);
    let ratio = e_mbs / s_mbs;
    if a.json {
        println!(
            "{{\"size\":{},\"seconds\":{},\"rounds\":{},\"depth\":{},\"registered\":{},\"zc_min\":{},\
             \"send_batch\":{},\"send_MBps\":{:.1},\"exs_MBps\":{:.1},\"ratio\":{:.4},\"send_cpu_s_per_GB\":{:.3},\"exs_cpu_s_per_GB\":{:.3}}}",
            a.size,
            a.seconds,
            a.rounds,
            a.depth,
            !a.unregistered,
            zc,
            a.send_batch,
            s_mbs,
            e_mbs,
            ratio,
            s_cpu,
            e_cpu
        );
    } else {
        println!(
            "size {} B, {} x {} s rounds, depth {}, registered {}, zc_min {}, send() {} buffer(s) a call",
            a.size, a.rounds, a.seconds, a.depth, !a.unregistered, zc, a.send_batch
        );
        println!("{:>8} {:>12} {:>14}", "mode", "MB/s", "CPU s/GB");
        println!("{:>8} {:>12.1} {:>14.3}", "send()", s_mbs, s_cpu);
        println!("{:>8} {:>12.1} {:>14.3}", "exs", e_mbs, e_cpu);
        println!("exs/send throughput ratio: {:.3}", ratio);
    }
}
