//! A listener runs each arriving rail's handshake on its own, so a connection that says
//! nothing, or dribbles its hello a byte at a time, does not hold up other peers; and it
//! keeps a bounded number of half-open handshakes. Loopback only, every wait bounded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use braid::{Context, EndpointOptions, Listener, RailAddr};
use braid_proto::wire::HandshakeStatus;
use braid_proto::wire::handshake::{HANDSHAKE_LEN, HANDSHAKE_VERSION, Hello, HelloReply};

/// One endpoint of one rail through `listener`: connect and accept, each bounded. The time
/// from the first byte of the connect to the accepted endpoint.
fn handshake_time(ctx: &Context, listener: &Listener, to: SocketAddr) -> Duration {
    let cq = ctx.create_cq(64);
    let opts = EndpointOptions::new(&cq);
    let start = Instant::now();
    let ctx2 = ctx.clone();
    let opts2 = opts.clone();
    let connecting = std::thread::spawn(move || ctx2.connect(&[RailAddr::new(None, to)], &opts2));
    let accepted = listener
        .accept(&opts, Duration::from_secs(30))
        .expect("the peer's endpoint is accepted");
    let took = start.elapsed();
    let ep = connecting.join().unwrap().expect("the connect succeeds");
    ep.close();
    accepted.close();
    took
}

/// Sends `hello`-sized garbage one byte every `every` until stopped (or 20 s): a slow-loris.
fn slow_loris(
    to: SocketAddr,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let mut s = TcpStream::connect(to).unwrap();
    std::thread::spawn(move || {
        let end = Instant::now() + Duration::from_secs(20);
        while !stop.load(Ordering::Relaxed) && Instant::now() < end {
            if s.write_all(b"B").is_err() {
                return;
            }
            // Pacing the attacker, not synchronisation.
            std::thread::sleep(every);
        }
    })
}

#[test]
fn silent_and_slow_connections_do_not_delay_other_handshakes() {
    let ctx = Context::with_config(Default::default()).unwrap();
    let listener = ctx.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let to = listener.local_addrs()[0];
    // Baseline in the same run: the handshake with nobody else around (best of 3).
    let alone = (0..3)
        .map(|_| handshake_time(&ctx, &listener, to))
        .min()
        .unwrap();
    let silent = TcpStream::connect(to).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let loris = slow_loris(to, Duration::from_millis(50), stop.clone());
    let silent2 = TcpStream::connect(to).unwrap();
    // Let the listener take all three before the real peer comes (accepting is immediate;
    // this only orders the arrivals).
    std::thread::sleep(Duration::from_millis(50));
    let with = (0..3)
        .map(|_| handshake_time(&ctx, &listener, to))
        .max()
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    loris.join().unwrap();
    drop((silent, silent2));
    let delay = with.saturating_sub(alone);
    println!(
        "handshake alone {:.2} ms, beside a silent and a slow-loris connection {:.2} ms \
         (worst of 3): delay {:.2} ms",
        alone.as_secs_f64() * 1e3,
        with.as_secs_f64() * 1e3,
        delay.as_secs_f64() * 1e3
    );
    // Before handshakes ran concurrently the delay was the 5 s handshake timeout per silent
    // connection. The goal is 100 ms; the bound leaves room for a loaded 2-core machine.
    assert!(
        delay < Duration::from_millis(1000),
        "a silent connection delayed another peer's handshake by {delay:?}"
    );
}

#[test]
fn half_open_handshakes_are_bounded() {
    let ctx = Context::with_config(Default::default()).unwrap();
    let listener = ctx.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let to = listener.local_addrs()[0];
    let n = Listener::MAX_HALF_OPEN + 8;
    let mut silent: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(to).unwrap()).collect();
    // A real peer still gets through, promptly.
    let took = handshake_time(&ctx, &listener, to);
    println!(
        "handshake beside {n} silent connections: {:.2} ms",
        took.as_secs_f64() * 1e3
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // The oldest silent connections were closed to keep the bound: they read end of stream
    // (or a reset) long before the 5 s handshake timeout would have closed them.
    let oldest = &mut silent[0];
    oldest
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let mut b = [0u8; 1];
    match oldest.read(&mut b) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("the oldest half-open connection is still open: {other:?}"),
    }
    // The newest silent ones are still waiting for their hello (not refused).
    let newest = silent.last_mut().unwrap();
    newest.set_nonblocking(true).unwrap();
    assert_eq!(
        newest.read(&mut b).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
}

/// Sends a first-join hello for rail 0 of a two-rail session; returns the connection and
/// the reply's status.
fn half_session(to: SocketAddr, session_id: u64) -> (TcpStream, HandshakeStatus) {
    let hello = Hello {
        version: HANDSHAKE_VERSION,
        rail_index: 0,
        rail_count: 2,
        capabilities: 0,
        max_chunk: 1 << 16,
        session_id,
        nonce: [3; 16],
        same_host: None,
    };
    let mut s = TcpStream::connect(to).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&hello.encode()).unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    (s, HelloReply::decode(&b).unwrap().status)
}

#[test]
fn sessions_that_never_complete_hold_a_bounded_number_of_descriptors() {
    let ctx = Context::new().unwrap();
    let listener = ctx.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let to = listener.local_addrs()[0];
    let bound = listener.max_waiting_rails();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert!(
        bound <= lim.rlim_cur as usize / 4,
        "{bound} waiting rails for a limit of {}",
        lim.rlim_cur
    );
    // Both ends of every connection are in this process: 2 descriptors each.
    let held: Vec<TcpStream> = (0..bound as u64)
        .map(|i| {
            let (s, status) = half_session(to, 1000 + i);
            assert_eq!(status, HandshakeStatus::Accepted, "session {i}");
            s
        })
        .collect();
    // One more: the oldest incomplete session makes room (its rail is closed)...
    let (_s, status) = half_session(to, 1);
    assert_eq!(status, HandshakeStatus::Accepted);
    let mut oldest = &held[0];
    let mut b = [0u8; 64];
    assert_eq!(
        oldest.read(&mut b).unwrap(),
        0,
        "the oldest stranger's rail is closed"
    );
    // ...and a real peer gets in while the strangers still hold theirs.
    let cq = ctx.create_cq(8);
    let o = EndpointOptions::new(&cq);
    let (ctx2, o2) = (ctx.clone(), o.clone());
    let c = std::thread::spawn(move || ctx2.connect(&[RailAddr::new(None, to)], &o2));
    let ep = listener.accept(&o, Duration::from_secs(10)).unwrap();
    c.join().unwrap().unwrap();
    ep.close();
    drop(held);
}

/// Marks the child process of [`out_of_descriptors_the_accept_loop_does_not_spin`].
const EMFILE_CHILD: &str = "BRAID_TEST_EMFILE_CHILD";

/// CPU time (user + system) this process has used.
fn cpu_time() -> Duration {
    // SAFETY: getrusage writes one rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Run as a child process only: a listener with a connection waiting in its backlog and no
/// descriptor left to accept it; prints the CPU time used in the next second.
#[test]
#[ignore = "a child process of out_of_descriptors_the_accept_loop_does_not_spin"]
fn emfile_child() {
    if std::env::var_os(EMFILE_CHILD).is_none() {
        return;
    }
    let ctx = Context::new().unwrap();
    let listener = ctx.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let lim = libc::rlimit {
        rlim_cur: 256,
        rlim_max: 256,
    };
    // SAFETY: setrlimit reads one rlimit; this process is ours alone.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    let mut files = Vec::new();
    // The kernel completes the connection; accepting it needs a descriptor.
    let _client = TcpStream::connect(listener.local_addrs()[0]).unwrap();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        files.push(f);
    }
    let before = cpu_time();
    // Measuring a second of idle, not synchronisation.
    std::thread::sleep(Duration::from_secs(1));
    println!("cpu-ms {}", (cpu_time() - before).as_millis());
    drop(files);
}

#[test]
fn out_of_descriptors_the_accept_loop_does_not_spin() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "emfile_child", "--ignored", "--nocapture"])
        .env(EMFILE_CHILD, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let ms: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("cpu-ms "))
        .unwrap_or_else(|| {
            panic!(
                "no measurement:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .trim()
        .parse()
        .unwrap();
    // A spinning loop burns the whole second; one that backs off, a few milliseconds.
    assert!(ms < 200, "the accept loop used {ms} ms of CPU in 1 s");
}
