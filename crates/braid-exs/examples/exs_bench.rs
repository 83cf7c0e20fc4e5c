//! Stream throughput on loopback: `exs_send` (plain-socket mode) against plain `send()`,
//! measured by the same program in alternating rounds, with CPU seconds per GB.
//!
//! ```text
//! cargo run --release -p braid-exs --example exs_bench -- --size 1048576 --seconds 3 --rounds 3 [--json]
//!     [--depth 8] [--zc-min BYTES] [--unregistered]
//! ```
//! The receiver is a plain `recv()` loop in both modes. CPU is the whole process
//! (sender, receiver and the exs progress thread), from `getrusage`.

use std::io::{Read, Write};
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
            "-h" | "--help" => {
                println!(
                    "exs_bench [--size B] [--seconds S] [--rounds N] [--depth D] [--zc-min B] [--unregistered] [--json]"
                );
                std::process::exit(0);
            }
            o => panic!("unknown argument {o}"),
        }
    }
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
            for e in q.dequeue(a.depth, Some(Duration::from_secs(10))).unwrap() {
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
        let buf = vec![1u8; a.size];
        let mut tx = &tx;
        while t0.elapsed() < dur {
            tx.write_all(&buf).unwrap();
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

fn main() {
    let a = parse();
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
    let sum = |r: &[Round]| {
        let b: u64 = r.iter().map(|x| x.bytes).sum();
        let t: f64 = r.iter().map(|x| x.secs).sum();
        let c: f64 = r.iter().map(|x| x.cpu).sum();
        (b as f64 / t / 1e6, c / (b as f64 / 1e9))
    };
    let (s_mbs, s_cpu) = sum(&s);
    let (e_mbs, e_cpu) = sum(&e);
    let ratio = e_mbs / s_mbs;
    if a.json {
        println!(
            "{{\"size\":{},\"seconds\":{},\"rounds\":{},\"depth\":{},\"registered\":{},\"zc_min\":{},\
             \"send_MBps\":{:.1},\"exs_MBps\":{:.1},\"ratio\":{:.4},\"send_cpu_s_per_GB\":{:.3},\"exs_cpu_s_per_GB\":{:.3}}}",
            a.size,
            a.seconds,
            a.rounds,
            a.depth,
            !a.unregistered,
            zc,
            s_mbs,
            e_mbs,
            ratio,
            s_cpu,
            e_cpu
        );
    } else {
        println!(
            "size {} B, {} x {} s rounds, depth {}, registered {}, zc_min {}",
            a.size, a.rounds, a.seconds, a.depth, !a.unregistered, zc
        );
        println!("{:>8} {:>12} {:>14}", "mode", "MB/s", "CPU s/GB");
        println!("{:>8} {:>12.1} {:>14.3}", "send()", s_mbs, s_cpu);
        println!("{:>8} {:>12.1} {:>14.3}", "exs", e_mbs, e_cpu);
        println!("exs/send throughput ratio: {:.3}", ratio);
    }
}
