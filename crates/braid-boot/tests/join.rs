//! Forming worlds on loopback, in one process (a thread and a braid `Context` per rank), and
//! every start-up failure the bootstrap promises a clear, bounded error for.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use braid::{Access, CompletionKind, CompletionQueue, Context};
use braid_boot::wire::{self, ClientMsg, RankInfo, ServerMsg};
use braid_boot::{BootError, LaunchEnv, Refusal, World, WorldOptions};

/// A loopback port free right now for the rendezvous, not one of the ephemeral range
/// (which a rank's own sockets could take before rank 0 listens).
fn free_port() -> u16 {
    braid_boot::rendezvous_port(std::net::Ipv4Addr::LOCALHOST.into()).unwrap()
}

fn env(rank: usize, size: usize, port: u16, job: &str, timeout_s: f64) -> LaunchEnv {
    LaunchEnv {
        rank,
        size,
        root: format!("127.0.0.1:{port}"),
        job: job.into(),
        launcher: "braid",
        rails: None,
        secret: None,
        join_timeout: Some(Duration::from_secs_f64(timeout_s)),
        insecure: false,
    }
}

/// Joins on a new thread; the world is handed to `then`, whose result comes back.
fn spawn_rank<T: Send + 'static>(
    e: LaunchEnv,
    then: impl FnOnce(&Context, World) -> T + Send + 'static,
) -> JoinHandle<Result<T, BootError>> {
    spawn_rank_cq(e, move |ctx, _, w| then(ctx, w))
}

/// [`spawn_rank`] that also hands over the completion queue of the world's endpoints.
fn spawn_rank_cq<T: Send + 'static>(
    e: LaunchEnv,
    then: impl FnOnce(&Context, &CompletionQueue, World) -> T + Send + 'static,
) -> JoinHandle<Result<T, BootError>> {
    std::thread::spawn(move || {
        let ctx = Context::new().unwrap();
        let cq = ctx.create_cq(64);
        let w = World::join(&ctx, &e, &WorldOptions::new(&cq))?;
        Ok(then(&ctx, &cq, w))
    })
}

#[test]
fn three_ranks_form_a_mesh_and_run_collectives() {
    let port = free_port();
    let handles: Vec<_> = (0..3)
        .map(|r| {
            spawn_rank_cq(env(r, 3, port, "mesh", 20.0), move |ctx, cq, w| {
                assert_eq!((w.rank(), w.size()), (r, 3));
                assert!(w.endpoint(r).is_none());
                for p in (0..3).filter(|&p| p != r) {
                    let ep = w.endpoint(p).expect("endpoint");
                    assert_eq!(w.peer_of(ep.id()), Some(p));
                    assert_eq!(w.rails_to(p).len(), 1, "one loopback rail");
                }
                let parts = w.allgather(&[r as u8; 3]).unwrap();
                assert_eq!(parts, vec![vec![0; 3], vec![1; 3], vec![2; 3]]);
                // A one-sided write to the next rank, which checks it after a barrier.
                let region = ctx.alloc_region(4096, Access::all()).unwrap();
                let keys = w.allgather(&region.remote_key().to_bytes()).unwrap();
                let next = (r + 1) % 3;
                let key = braid::RemoteKey::from_bytes(&keys[next]).unwrap();
                let src = ctx.alloc_region(8, Access::LOCAL_WRITE).unwrap();
                src.write_at(0, &[r as u8 + 10; 8]).unwrap();
                let ep = w.endpoint(next).unwrap();
                ep.write(7, &[src.slice(0, 8).unwrap()], &key, 100).unwrap();
                // The barrier is out of band: it orders nothing on the endpoints, so each
                // rank waits for its write's completion (placed at the target) first.
                let c = cq.wait(Duration::from_secs(10)).expect("write completion");
                assert!(c.status.is_ok() && c.wr_id == 7, "{c:?}");
                w.barrier().unwrap();
                let prev = (r + 2) % 3;
                assert_eq!(region.to_vec(100, 8).unwrap(), vec![prev as u8 + 10; 8]);
                w.check().unwrap();
                w.finalize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap().unwrap();
    }
}

#[test]
fn a_job_of_one_needs_no_rendezvous() {
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(4);
    let w = World::join(&ctx, &LaunchEnv::singleton(), &WorldOptions::new(&cq)).unwrap();
    assert_eq!((w.rank(), w.size()), (0, 1));
    assert_eq!(w.allgather(b"x").unwrap(), vec![b"x".to_vec()]);
    w.barrier().unwrap();
    assert!(w.endpoint(0).is_none());
}

#[test]
fn unreachable_root_fails_within_the_join_timeout() {
    let port = free_port();
    let t = Instant::now();
    let e = spawn_rank(env(1, 2, port, "lonely", 1.5), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    let took = t.elapsed();
    assert!(matches!(e, BootError::RootUnreachable { .. }), "{e}");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

#[test]
fn missing_ranks_are_named_at_the_join_timeout() {
    let port = free_port();
    let t = Instant::now();
    let r0 = spawn_rank(env(0, 3, port, "short", 1.5), |_, _| ());
    let r2 = spawn_rank(env(2, 3, port, "short", 1.5), |_, _| ());
    for h in [r0, r2] {
        match h.join().unwrap().unwrap_err() {
            BootError::JoinTimeout { missing, .. } => assert_eq!(missing, vec![1]),
            e => panic!("{e}"),
        }
    }
    assert!(t.elapsed() < Duration::from_secs(6));
}

#[test]
fn a_second_job_on_the_same_port_is_refused() {
    let port = free_port();
    // Job A: two ranks, rank 1 arrives only after the intruder was refused.
    let a0 = spawn_rank(env(0, 2, port, "job-a", 20.0), |_, w| w.finalize().unwrap());
    // Job B's rank 1 dials A's rendezvous: refused as the wrong job.
    let e = spawn_rank(env(1, 2, port, "job-b", 10.0), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    match &e {
        BootError::Refused {
            kind: Refusal::WrongJob,
            detail,
            ..
        } => assert!(
            !detail.contains("job-a") && detail.contains("job-b"),
            "the job's id is not told to whoever asks: {detail}"
        ),
        e => panic!("{e}"),
    }
    // Job B's rank 0 cannot listen on the port A holds.
    let e = spawn_rank(env(0, 2, port, "job-b", 10.0), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, BootError::RootListen { .. }), "{e}");
    // Job A is unharmed.
    let a1 = spawn_rank(env(1, 2, port, "job-a", 20.0), |_, w| w.finalize().unwrap());
    a0.join().unwrap().unwrap();
    a1.join().unwrap().unwrap();
}

/// `e` with the cluster secret: only authenticated joins can fail a job.
fn with_secret(mut e: LaunchEnv) -> LaunchEnv {
    e.secret = Some(b"join test secret".to_vec());
    e
}

#[test]
fn a_duplicate_rank_fails_both_sides() {
    let port = free_port();
    let r0 = spawn_rank(with_secret(env(0, 3, port, "dup", 20.0)), |_, _| ());
    let a = spawn_rank(with_secret(env(1, 3, port, "dup", 20.0)), |_, _| ());
    let b = spawn_rank(with_secret(env(1, 3, port, "dup", 20.0)), |_, _| ());
    let (a, b) = (
        a.join().unwrap().unwrap_err(),
        b.join().unwrap().unwrap_err(),
    );
    // Whichever came second is refused; the first is told the job failed.
    let refused = |e: &BootError| {
        matches!(e, BootError::Refused { kind: Refusal::DuplicateRank, detail, .. }
            if detail.contains("already joined"))
    };
    let failed = |e: &BootError| matches!(e, BootError::DuplicateRank { rank: 1, .. });
    assert!(
        (refused(&a) && failed(&b)) || (refused(&b) && failed(&a)),
        "{a}\n{b}"
    );
    let e = r0.join().unwrap().unwrap_err();
    assert!(matches!(e, BootError::DuplicateRank { rank: 1, .. }), "{e}");
}

#[test]
fn size_disagreement_fails_the_job() {
    let port = free_port();
    let r0 = spawn_rank(with_secret(env(0, 2, port, "sz", 20.0)), |_, _| ());
    let e1 = spawn_rank(with_secret(env(1, 3, port, "sz", 20.0)), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            e1,
            BootError::Refused {
                kind: Refusal::SizeMismatch,
                ..
            }
        ),
        "{e1}"
    );
    let e0 = r0.join().unwrap().unwrap_err();
    assert!(
        matches!(
            e0,
            BootError::SizeMismatch {
                rank: 1,
                size: 3,
                root_size: 2
            }
        ),
        "{e0}"
    );
}

/// Sends a raw join and returns the rendezvous's answer.
fn raw_try_join(port: u16, job: &str, rank: u32, size: u32) -> ServerMsg {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    wire::read_frame(&mut s, 1 << 20).unwrap();
    let join = ClientMsg::Join {
        version: wire::VERSION,
        nonce: [0; wire::NONCE_LEN],
        mac: None,
        job: job.into(),
        rank,
        size,
        info: fake_info(),
    };
    s.write_all(&join.encode()).unwrap();
    ServerMsg::decode(&wire::read_frame(&mut s, 1 << 20).unwrap(), 8).unwrap()
}

#[test]
fn forged_joins_without_a_secret_do_not_fail_the_job() {
    let port = free_port();
    let r0 = spawn_rank(env(0, 2, port, "quiet-job-name", 20.0), |_, w| {
        w.finalize().unwrap()
    });
    wait_listening(port);
    // A stranger fishing for the job id learns nothing of it...
    match raw_try_join(port, "guess", 1, 2) {
        ServerMsg::Refuse {
            kind: Refusal::WrongJob,
            detail,
        } => assert!(!detail.contains("quiet-job-name"), "{detail}"),
        m => panic!("{m:?}"),
    }
    // ...and one who knows it cannot fail the job with a forged size or rank 0.
    for (rank, size) in [(1, 3), (0, 2)] {
        let m = raw_try_join(port, "quiet-job-name", rank, size);
        assert!(matches!(m, ServerMsg::Refuse { .. }), "{m:?}");
    }
    let r1 = spawn_rank(env(1, 2, port, "quiet-job-name", 20.0), |_, w| {
        w.finalize().unwrap()
    });
    r0.join().unwrap().unwrap();
    r1.join().unwrap().unwrap();
}

/// Waits (bounded) until the rendezvous on `port` accepts connections.
fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the rendezvous never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn idle_and_dribbling_connections_cost_no_threads_and_are_closed_in_time() {
    let port = free_port();
    let before = threads();
    let r0 = spawn_rank(env(0, 2, port, "flood", 30.0), |_, w| w.finalize().unwrap());
    wait_listening(port);
    // 300 connections that never join, and one that dribbles a join a byte at a time.
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    let mut drip = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let t = Instant::now();
    // Rank 0's own threads, the rendezvous's few; none per connection.
    assert!(
        threads() < before + 150,
        "{} threads for 301 connections (from {before})",
        threads()
    );
    // A real rank still joins while they are held.
    let r1 = spawn_rank(env(1, 2, port, "flood", 30.0), |_, w| w.finalize().unwrap());
    // The dribbler is closed at the 5 s deadline for its whole join, not kept by its bytes.
    drip.set_read_timeout(Some(Duration::from_millis(400)))
        .unwrap();
    let mut buf = [0u8; 256];
    let closed = loop {
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the dribbler was kept"
        );
        if drip.write_all(&[0]).is_err() {
            break t.elapsed();
        }
        if let Ok(0) = drip.read(&mut buf) {
            break t.elapsed();
        }
    };
    assert!(closed < Duration::from_secs(8), "{closed:?}");
    r0.join().unwrap().unwrap();
    r1.join().unwrap().unwrap();
    drop(idle);
}

fn fake_info() -> RankInfo {
    RankInfo {
        hostname: "fake".into(),
        pid: 1,
        host_key: "fake".into(),
        addrs: vec![],
        loopback_port: 0,
        rails_override: false,
    }
}

/// Joins as `rank` with raw protocol messages and returns the open connection.
fn raw_join(port: u16, job: &str, rank: u32, size: u32) -> TcpStream {
    raw_join_as(port, job, rank, size, fake_info())
}

/// [`raw_join`] with the rank's published information.
fn raw_join_as(port: u16, job: &str, rank: u32, size: u32, info: RankInfo) -> TcpStream {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let f = wire::read_frame(&mut s, 1 << 20).unwrap();
    assert!(matches!(
        ServerMsg::decode(&f, 8).unwrap(),
        ServerMsg::Hello { .. }
    ));
    let join = ClientMsg::Join {
        version: wire::VERSION,
        nonce: [0; wire::NONCE_LEN],
        mac: None,
        job: job.into(),
        rank,
        size,
        info,
    };
    s.write_all(&join.encode()).unwrap();
    let f = wire::read_frame(&mut s, 1 << 20).unwrap();
    assert_eq!(
        ServerMsg::decode(&f, 8).unwrap(),
        ServerMsg::Welcome { mac: None }
    );
    s
}

#[test]
fn a_rank_that_dies_during_start_up_fails_everyone() {
    let port = free_port();
    let r0 = spawn_rank(env(0, 3, port, "die", 20.0), |_, _| ());
    let r2 = spawn_rank(env(2, 3, port, "die", 20.0), |_, _| ());
    let t = Instant::now();
    drop(raw_join(port, "die", 1, 3)); // joins, then "dies"
    for h in [r0, r2] {
        let e = h.join().unwrap().unwrap_err();
        assert!(matches!(e, BootError::RankDied { rank: 1, .. }), "{e}");
    }
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// Marks the child process of [`a_rank_that_dies_later_fails_the_next_collective`].
const CHILD_ENV: &str = "BRAID_BOOT_TEST_CHILD";

/// Run as a child process only: joins as rank 1, then exits without a goodbye.
#[test]
#[ignore = "a child process of a_rank_that_dies_later_fails_the_next_collective"]
fn child_rank_that_exits_abruptly() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let e = LaunchEnv::from_env().unwrap();
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(4);
    let w = World::join(&ctx, &e, &WorldOptions::new(&cq)).unwrap();
    w.barrier().unwrap();
    std::process::exit(3);
}

#[test]
fn a_rank_that_dies_later_fails_the_next_collective() {
    let port = free_port();
    let r0 = spawn_rank(env(0, 2, port, "later", 20.0), |_, w| {
        w.barrier().unwrap();
        let t = Instant::now();
        let e = w.barrier().unwrap_err();
        assert!(matches!(e, BootError::RankDied { rank: 1, .. }), "{e}");
        assert!(w.check().is_err());
        t.elapsed()
    });
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_rank_that_exits_abruptly",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .env("BRAID_RANK", "1")
        .env("BRAID_SIZE", "2")
        .env("BRAID_ROOT", format!("127.0.0.1:{port}"))
        .env("BRAID_JOB", "later")
        .env("BRAID_JOIN_TIMEOUT", "20")
        .spawn()
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3));
    let took = r0.join().unwrap().unwrap();
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// Run as a child process only: rank 0 of a job of 3 whose join fails; prints, then exits.
#[test]
#[ignore = "a child process of late_ranks_learn_the_cause_after_rank_0_exited"]
fn child_rank_0_whose_join_fails() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let e = LaunchEnv::from_env().unwrap();
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(4);
    let Err(err) = World::join(&ctx, &e, &WorldOptions::new(&cq)) else {
        panic!("the join was to fail");
    };
    println!("rank 0 failed: {err}");
    std::process::exit(70);
}

#[test]
fn late_ranks_learn_the_cause_after_rank_0_exited() {
    let port = free_port();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_rank_0_whose_join_fails",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .env("BRAID_RANK", "0")
        .env("BRAID_SIZE", "3")
        .env("BRAID_ROOT", format!("127.0.0.1:{port}"))
        .env("BRAID_JOB", "late")
        .env("BRAID_JOIN_TIMEOUT", "20")
        .env("BRAID_SECRET", "join test secret")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Rank 1 disagrees on the size: the job fails, and rank 0's process exits.
    wait_listening(port);
    let e1 = spawn_rank(with_secret(env(1, 2, port, "late", 20.0)), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    assert!(matches!(e1, BootError::Refused { .. }), "{e1}");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    // The test harness prints its own lines first.
    let mut line = String::new();
    while !line.contains("rank 0 failed") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "rank 0 ended without reporting its failure");
    }
    // Rank 2 comes late, after rank 0 gave up: it learns the real cause at once.
    let t = Instant::now();
    let e2 = spawn_rank(with_secret(env(2, 3, port, "late", 20.0)), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    assert!(matches!(e2, BootError::SizeMismatch { .. }), "{e2}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert_eq!(child.wait().unwrap().code(), Some(70));
}

#[test]
fn garbage_on_the_rendezvous_port_does_not_disturb_the_job() {
    let port = free_port();
    let r0 = spawn_rank(env(0, 2, port, "noise", 20.0), |_, w| w.finalize().unwrap());
    // Bounded wait for the port, then garbage.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("{e}"),
        }
    };
    s.write_all(&[0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9])
        .unwrap();
    let mut buf = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_end(&mut buf); // the rendezvous closes it
    let r1 = spawn_rank(env(1, 2, port, "noise", 20.0), |_, w| w.finalize().unwrap());
    r0.join().unwrap().unwrap();
    r1.join().unwrap().unwrap();
}

#[test]
fn the_cluster_secret_authenticates_the_rendezvous() {
    let with = |mut e: LaunchEnv, s: Option<&str>| {
        e.secret = s.map(|s| s.as_bytes().to_vec());
        e
    };
    // Both have it: the job forms.
    let port = free_port();
    let a = spawn_rank(with(env(0, 2, port, "sec", 20.0), Some("k1")), |_, w| {
        w.finalize().unwrap()
    });
    let b = spawn_rank(with(env(1, 2, port, "sec", 20.0), Some("k1")), |_, w| {
        w.finalize().unwrap()
    });
    a.join().unwrap().unwrap();
    b.join().unwrap().unwrap();
    // A different secret, or none, is refused; the job is not harmed (it times out waiting).
    let port = free_port();
    let r0 = spawn_rank(with(env(0, 2, port, "sec2", 3.0), Some("k1")), |_, _| ());
    for s in [Some("k2"), None] {
        let e = spawn_rank(with(env(1, 2, port, "sec2", 3.0), s), |_, _| ())
            .join()
            .unwrap()
            .unwrap_err();
        assert!(
            matches!(
                e,
                BootError::Refused {
                    kind: Refusal::Auth,
                    ..
                }
            ),
            "{s:?}: {e}"
        );
    }
    let e = r0.join().unwrap().unwrap_err();
    assert!(matches!(e, BootError::JoinTimeout { .. }), "{e}");
    // The rank has a secret, the rendezvous none.
    let port = free_port();
    let r0 = spawn_rank(env(0, 2, port, "sec3", 3.0), |_, _| ());
    let e = spawn_rank(with(env(1, 2, port, "sec3", 3.0), Some("k1")), |_, _| ())
        .join()
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            e,
            BootError::Refused {
                kind: Refusal::Auth,
                ..
            }
        ),
        "{e}"
    );
    let _ = r0.join().unwrap();
}

#[test]
fn ranks_exchange_messages_over_the_mesh() {
    let port = free_port();
    let hs: Vec<_> = (0..2)
        .map(|r| {
            spawn_rank_cq(env(r, 2, port, "msg", 20.0), move |ctx, cq, w| {
                let peer = 1 - r;
                let ep = w.endpoint(peer).unwrap();
                let buf = ctx.alloc_region(64, Access::all()).unwrap();
                ep.post_recv(1, &[buf.slice(0, 8).unwrap()]).unwrap();
                buf.write_at(8, &[r as u8; 8]).unwrap();
                ep.send(2, &[buf.slice(8, 8).unwrap()]).unwrap();
                let (mut got_recv, mut got_send) = (false, false);
                while !(got_recv && got_send) {
                    let c = cq.wait(Duration::from_secs(10)).expect("a completion");
                    assert!(c.status.is_ok());
                    assert_eq!(w.peer_of(c.endpoint), Some(peer));
                    match c.kind {
                        CompletionKind::Recv => got_recv = true,
                        CompletionKind::Send => got_send = true,
                        k => panic!("{k:?}"),
                    }
                }
                assert_eq!(buf.to_vec(0, 8).unwrap(), vec![peer as u8; 8]);
                w.finalize().unwrap();
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap().unwrap();
    }
}

#[test]
fn an_aborting_rank_tells_everyone_why() {
    let port = free_port();
    let r0 = spawn_rank(env(0, 3, port, "why", 20.0), |_, w| {
        let e = w.barrier().unwrap_err();
        assert!(
            matches!(&e, BootError::RankFailed { rank: 2, reason } if reason == "out of memory"),
            "{e}"
        );
    });
    // Ranks 0 and 1 enter the same collective: had they called different ones, the root
    // could report that mismatch before rank 2's abort arrives.
    let r1 = spawn_rank(env(1, 3, port, "why", 20.0), |_, w| {
        let e = w.barrier().unwrap_err();
        assert!(matches!(&e, BootError::RankFailed { rank: 2, .. }), "{e}");
        // Every later collective reports the same cause.
        let e = w.allgather(b"x").unwrap_err();
        assert!(matches!(&e, BootError::RankFailed { rank: 2, .. }), "{e}");
    });
    let r2 = spawn_rank(env(2, 3, port, "why", 20.0), |_, w| {
        w.abort_job("out of memory");
        assert!(w.check().is_err());
    });
    for h in [r0, r1, r2] {
        h.join().unwrap().unwrap();
    }
}

#[test]
fn without_a_secret_the_rendezvous_stays_on_loopback() {
    let mut e = env(0, 2, free_port(), "open", 5.0);
    // Not one of this host's addresses: the refusal comes before any bind.
    e.root = format!("198.18.255.254:{}", free_port());
    let ctx = Context::new().unwrap();
    let cq = ctx.create_cq(8);
    let Err(err) = World::join(&ctx, &e, &WorldOptions::new(&cq)) else {
        panic!("the rendezvous listened beyond loopback without a secret");
    };
    let err = err.to_string();
    assert!(
        err.contains("without a cluster secret")
            && err.contains("BRAID_SECRET_FILE")
            && err.contains("BRAID_INSECURE"),
        "{err}"
    );
}

#[test]
fn a_formed_rank_takes_no_strangers_endpoint_and_keeps_going() {
    let port = free_port();
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let r0 = spawn_rank(env(0, 2, port, "stray", 20.0), move |_, w| {
        go_rx.recv_timeout(Duration::from_secs(20)).unwrap();
        w.barrier().unwrap();
        w.finalize().unwrap();
    });
    let r1 = spawn_rank(env(1, 2, port, "stray", 20.0), move |_, w| {
        // Rank 1 dialled rank 0's listener: that is where a stranger would connect.
        addr_tx
            .send(w.endpoint(0).unwrap().rail_addrs()[0].1)
            .unwrap();
        w.barrier().unwrap();
        w.finalize().unwrap();
    });
    let listener_addr = addr_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    let stranger = Context::new().unwrap();
    let cq = stranger.create_cq(4);
    let mut o = braid::EndpointOptions::new(&cq);
    o.connect_timeout = Duration::from_secs(5);
    let got = stranger.connect(
        &[braid::RailAddr {
            local: None,
            remote: listener_addr,
        }],
        &o,
    );
    assert!(
        got.is_err(),
        "a formed rank took a stranger's endpoint (it would hold it for ever)"
    );
    go_tx.send(()).unwrap();
    r0.join().unwrap().unwrap();
    r1.join().unwrap().unwrap();
}

/// The mesh report of an allgather during `World::join`: (peer dialled, local address).
fn dialled_report(peer: u32, from: std::net::SocketAddr) -> Vec<u8> {
    let mut v = peer.to_be_bytes().to_vec();
    let ip = match from.ip() {
        std::net::IpAddr::V4(x) => x.to_ipv6_mapped(),
        std::net::IpAddr::V6(x) => x,
    };
    v.extend_from_slice(&ip.octets());
    v.extend_from_slice(&from.port().to_be_bytes());
    v
}

/// Sends a collective contribution and waits for its result.
fn raw_collective(s: &mut TcpStream, seq: u64, kind: u8, data: Vec<u8>) {
    s.write_all(&ClientMsg::Collective { seq, kind, data }.encode())
        .unwrap();
    let f = wire::read_frame(s, 1 << 20).unwrap();
    let m = ServerMsg::decode(&f, 8).unwrap();
    assert!(
        matches!(m, ServerMsg::Done { seq: s2, .. } if s2 == seq),
        "{m:?}"
    );
}

#[test]
fn a_stray_endpoint_during_the_join_is_dropped_and_the_job_goes_on() {
    let port = free_port();
    let r0 = spawn_rank(env(0, 2, port, "strays", 20.0), |_, w| {
        // The endpoint to rank 1 is the one rank 1 reported, not the stranger's.
        let from = w.endpoint(1).unwrap().rail_addrs()[0].1;
        w.barrier().unwrap();
        from
    });
    // This test plays rank 1 by hand, to know rank 0's listener before the mesh forms.
    // Same host as rank 0: the table gives the pair one loopback rail, dialled by rank 1.
    let info = RankInfo {
        host_key: braid_boot::addrs::host_key(),
        loopback_port: 1,
        ..fake_info()
    };
    let mut link = raw_join_as(port, "strays", 1, 2, info);
    let f = wire::read_frame(&mut link, 1 << 20).unwrap();
    let ServerMsg::Table(table) = ServerMsg::decode(&f, 8).unwrap() else {
        panic!("no table");
    };
    let rank0: std::net::SocketAddr = ([127, 0, 0, 1], table[0].info.loopback_port).into();
    let dial = |ctx: &Context| {
        let cq = ctx.create_cq(8);
        let mut o = braid::EndpointOptions::new(&cq);
        o.connect_timeout = Duration::from_secs(5);
        ctx.connect(
            &[braid::RailAddr {
                local: None,
                remote: rank0,
            }],
            &o,
        )
        .unwrap()
    };
    // A stranger's endpoint arrives first and takes rank 1's place in the accept...
    let stranger = Context::new().unwrap();
    let _stray = dial(&stranger);
    // ...then rank 1's own, which it reports in the allgather as ranks do.
    let me = Context::new().unwrap();
    let ep = dial(&me);
    let from = ep.rail_addrs()[0].0;
    raw_collective(&mut link, 0, 1, dialled_report(0, from));
    raw_collective(&mut link, 1, 0, vec![]);
    // Rank 0's barrier after the join.
    raw_collective(&mut link, 2, 0, vec![]);
    link.write_all(&ClientMsg::Bye.encode()).unwrap();
    assert_eq!(r0.join().unwrap().unwrap(), from);
}
