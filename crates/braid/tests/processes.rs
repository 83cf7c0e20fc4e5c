//! Two OS processes: the test binary re-runs itself as the server (an ignored test that
//! only acts when an environment variable says so).

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use braid::{Access, Context, EndpointOptions, RailAddr, RailTransport, RemoteKey, Status};
use braid_testkit::maps::mapped_private;
use common::*;

const ROLE: &str = "BRAID_TEST_CHILD_SERVER";
const RAILS: usize = 4;

/// The server process: listens on 4 rails, sends its region's key, then serves one-sided
/// operations until the client closes (or a bounded time passes).
#[test]
#[ignore = "runs only as the child process of the two-process tests"]
fn child_server() {
    if std::env::var(ROLE).is_err() {
        return;
    }
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(64);
    let addrs: Vec<SocketAddr> = (0..RAILS).map(|i| SocketAddr::new(rail_ip(i), 0)).collect();
    let l = ctx.listen(&addrs).unwrap();
    let ports: Vec<String> = l.local_addrs().iter().map(|a| a.to_string()).collect();
    println!("LISTEN {}", ports.join(","));
    let ep = l.accept(&EndpointOptions::new(&cq), WAIT).unwrap();
    let region = ctx.alloc_region(256 << 20, Access::all()).unwrap();
    let msg = ctx.alloc_region(4096, Access::all()).unwrap();
    msg.write_at(0, &region.remote_key().to_bytes()).unwrap();
    ep.send(1, &[msg.slice(0, RemoteKey::BYTES).unwrap()])
        .unwrap();
    ep.post_recv(2, &[msg.slice(0, 16).unwrap()]).unwrap();
    // Serve until the client closes or says goodbye; the engine does the work.
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if let Some(c) = cq.wait(Duration::from_millis(200))
            && c.wr_id == 2
        {
            break;
        }
    }
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// Runs this binary's ignored test `name` as a child with `role` set, until it prints the
/// addresses it listens on.
fn spawn_child(name: &str, role: &str) -> (ChildGuard, Vec<SocketAddr>, Lines) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--ignored",
            "--exact",
            name,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(role, "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let guard = ChildGuard(child);
    let mut lines = BufReader::new(out).lines();
    let addrs = loop {
        let line = lines
            .next()
            .expect("child exited before listening")
            .unwrap();
        // libtest may print "test child_server ... " before our line.
        if let Some(at) = line.find("LISTEN ") {
            break line[at + 7..]
                .split(',')
                .map(|a| a.parse().unwrap())
                .collect::<Vec<SocketAddr>>();
        }
    };
    (guard, addrs, lines)
}

fn spawn_server() -> (ChildGuard, Vec<SocketAddr>) {
    let (guard, addrs, lines) = spawn_child("child_server", ROLE);
    // Keep draining the child's output so that its last lines do not hit a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (guard, addrs)
}

fn connect(
    ctx: &Context,
    cq: &braid::CompletionQueue,
    addrs: &[SocketAddr],
) -> (braid::Endpoint, RemoteKey) {
    connect_with(ctx, cq, addrs, EndpointOptions::new(cq))
}

fn connect_with(
    ctx: &Context,
    cq: &braid::CompletionQueue,
    addrs: &[SocketAddr],
    opts: EndpointOptions,
) -> (braid::Endpoint, RemoteKey) {
    let rails: Vec<RailAddr> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| RailAddr::new(Some(rail_ip(i)), *a))
        .collect();
    let ep = ctx.connect(&rails, &opts).unwrap();
    let msg = ctx.alloc_region(4096, Access::all()).unwrap();
    ep.post_recv(100, &[msg.slice(0, 64).unwrap()]).unwrap();
    let c = expect_ok(cq, 100);
    let key = RemoteKey::from_bytes(&msg.to_vec(0, c.byte_len as usize).unwrap()).unwrap();
    (ep, key)
}

#[test]
fn two_processes_write_and_read() {
    write_and_read_with(RailTransport::Auto, "shm");
}

#[test]
fn two_processes_write_and_read_over_tcp() {
    write_and_read_with(RailTransport::Tcp, "tcp");
}

/// Processes on one host share rings unless told to use TCP.
fn write_and_read_with(transport: RailTransport, kind: &str) {
    let (_child, addrs) = spawn_server();
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(256);
    let mut opts = EndpointOptions::new(&cq);
    opts.transport = transport;
    let (ep, key) = connect_with(&ctx, &cq, &addrs, opts);
    assert_eq!(ep.rail_transports(), vec![kind; RAILS]);
    let src = ctx.alloc_region(32 << 20, Access::all()).unwrap();
    let dst = ctx.alloc_region(32 << 20, Access::all()).unwrap();
    let data = pattern(3, 32 << 20);
    src.write_at(0, &data).unwrap();
    ep.write(1, &[src.as_sge()], &key, 4096).unwrap();
    ep.read(2, &[dst.as_sge()], &key, 4096).unwrap();
    expect_ok(&cq, 1);
    expect_ok(&cq, 2);
    assert!(dst.to_vec(0, 32 << 20).unwrap() == data);
    ep.fetch_add(3, &key, 0, 5).unwrap();
    // The server's region starts zeroed; the write above began at offset 4096.
    assert_eq!(expect_ok(&cq, 3).value, Some(0));
    let bye = ctx.alloc_region(16, Access::all()).unwrap();
    ep.send(4, &[bye.as_sge()]).unwrap();
    expect_ok(&cq, 4);
}

#[test]
fn killed_peer_gives_error_completions_in_bounded_time() {
    let (mut child, addrs) = spawn_server();
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(256);
    let (ep, key) = connect(&ctx, &cq, &addrs);
    let src = ctx.alloc_region(64 << 20, Access::all()).unwrap();
    const N: u64 = 64;
    for i in 0..N {
        ep.write(i, &[src.as_sge()], &key, 0).unwrap();
    }
    // Let some of it flow, then kill the server process mid-transfer.
    let first = next(&cq);
    assert_eq!(first.status, Status::Success);
    let killed_at = Instant::now();
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let mut errors = 0;
    for _ in 1..N {
        let c = next(&cq);
        if c.status != Status::Success {
            assert_eq!(c.status, Status::TransportError, "{c:?}");
            errors += 1;
        }
    }
    assert!(errors > 0, "the kill happened mid-transfer");
    assert!(
        killed_at.elapsed() < Duration::from_secs(10),
        "errors took {:?}",
        killed_at.elapsed()
    );
    assert!(ep.is_closed());
    assert!(ep.write(999, &[src.as_sge()], &key, 0).is_err());
}

#[test]
fn silent_peer_is_detected_within_the_configured_timeout() {
    let (child, addrs) = spawn_server();
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(256);
    let mut opts = EndpointOptions::new(&cq);
    opts.session.peer_timeout = Duration::from_millis(800);
    let (ep, key) = connect_with(&ctx, &cq, &addrs, opts);
    let src = ctx.alloc_region(1 << 20, Access::all()).unwrap();
    ep.write(1, &[src.as_sge()], &key, 0).unwrap();
    expect_ok(&cq, 1);
    // Freeze the peer: its sockets stay open, but nothing (not even keepalives) comes back.
    let pid = child.0.id() as i32;
    // SAFETY: signalling a child process this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    // kill() returns before every thread of the child has stopped: wait (bounded) until
    // the kernel reports the process stopped, so that nothing more is served.
    let deadline = Instant::now() + WAIT;
    while !std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|st| {
            st.rsplit(") ")
                .next()
                .is_some_and(|rest| rest.starts_with('T'))
        })
        .unwrap_or(false)
    {
        assert!(Instant::now() < deadline, "the child did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
    let stopped_at = Instant::now();
    for i in 0..8 {
        ep.write(10 + i, &[src.as_sge()], &key, 0).unwrap();
    }
    // kill() returns before every thread of the child has stopped: the first writes may
    // still be served. The rest must fail, and only after the peer timeout.
    let mut failed = 0;
    for _ in 0..8 {
        let c = next(&cq);
        if c.status != Status::Success {
            assert_eq!(c.status, Status::TransportError, "{c:?}");
            failed += 1;
        }
    }
    assert!(failed > 0);
    let took = stopped_at.elapsed();
    // SAFETY: as above; let the child run so that the guard can end it.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    assert!(
        took >= Duration::from_millis(700),
        "detected after {took:?}"
    );
    assert!(took < Duration::from_secs(5), "detected after {took:?}");
}

const SENDER_ROLE: &str = "BRAID_TEST_CHILD_SENDER";
const EXCHANGED: usize = 16 << 20;

/// The sending process of the page-exchange test: sends a 16 MiB pattern on one rail,
/// overwrites its buffer once the send completed, says so, and waits to be killed.
#[test]
#[ignore = "runs only as the child process of the page-exchange test"]
fn child_sender() {
    if std::env::var(SENDER_ROLE).is_err() {
        return;
    }
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(64);
    let l = ctx.listen(&[SocketAddr::new(rail_ip(0), 0)]).unwrap();
    println!("LISTEN {}", l.local_addrs()[0]);
    let ep = l.accept(&EndpointOptions::new(&cq), WAIT).unwrap();
    let src = ctx.alloc_region(EXCHANGED, Access::all()).unwrap();
    src.write_at(0, &pattern(11, EXCHANGED)).unwrap();
    ep.send(1, &[src.as_sge()]).unwrap();
    expect_ok(&cq, 1);
    src.fill(0, EXCHANGED, 0xee).unwrap();
    println!("SENT");
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline && !ep.is_closed() {
        cq.wait(Duration::from_millis(200));
    }
}

/// Pages received by exchange from another process stay this process's copy when the
/// sender rewrites its buffer and when it is killed.
#[test]
fn exchanged_pages_outlive_the_killed_sender_process() {
    let (mut child, addrs, mut lines) = spawn_child("child_sender", SENDER_ROLE);
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(64);
    let mut opts = EndpointOptions::new(&cq);
    opts.transport = RailTransport::Auto;
    let ep = ctx
        .connect(&[RailAddr::new(Some(rail_ip(0)), addrs[0])], &opts)
        .unwrap();
    assert_eq!(ep.rail_transports(), vec!["shm"]);
    let dst = ctx.alloc_region(EXCHANGED, Access::all()).unwrap();
    ep.post_recv(1, &[dst.as_sge()]).unwrap();
    assert_eq!(expect_ok(&cq, 1).byte_len, EXCHANGED as u64);
    assert!(mapped_private(dst.addr()), "mapped, not copied");
    let sent = lines.any(|l| l.is_ok_and(|l| l.contains("SENT")));
    assert!(sent, "the sender overwrote its buffer");
    let data = pattern(11, EXCHANGED);
    assert!(dst.to_vec(0, EXCHANGED).unwrap() == data);
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    assert!(dst.to_vec(0, EXCHANGED).unwrap() == data);
    dst.write_at(0, b"mine").unwrap();
    assert_eq!(
        dst.to_vec(0, 6).unwrap(),
        [b"mine" as &[u8], &data[4..6]].concat()
    );
}
