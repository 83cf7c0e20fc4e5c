//! Express writes (docs/PROTOCOL.md, "Express writes"): a write or send of up to 512 B on a
//! one-rail endpoint goes as one record (a same-host ring: answered beside the stream) or
//! one `Express` frame (TCP: answered in the next express frame the other way, or by an
//! `ExpressAnswer`), with the semantics of a framed operation: the target's protection
//! checks, order with the framed operations around it, a receive per immediate, and a
//! completion for every operation. Every test runs over both links.

mod common;

use std::time::{Duration, Instant};

use braid::{Access, CompletionKind, RailTransport, Status};
use common::{Pair, WAIT, expect_ok, next, pair_over, pattern};

/// A one-rail pair over a same-host ring (`"shm"`) or a TCP connection (`"tcp"`).
fn pair(link: &str) -> Pair {
    let transport = match link {
        "shm" => RailTransport::Auto,
        _ => RailTransport::Tcp,
    };
    pair_over(transport, link, 1, |_| {})
}

/// Runs each named test over both links: `shm::name` and `tcp::name`.
macro_rules! over_both_links {
    ($($name:ident),* $(,)?) => {
        mod shm {
            $(#[test]
            fn $name() {
                super::$name(super::pair("shm"))
            })*
        }
        mod tcp {
            $(#[test]
            fn $name() {
                super::$name(super::pair("tcp"))
            })*
        }
    };
}

over_both_links!(
    small_writes_go_around_the_frames_and_arrive_whole_and_in_order,
    express_and_framed_writes_keep_their_order,
    a_refused_express_write_fails_alone_and_the_endpoint_goes_on,
    an_express_write_with_immediate_waits_for_a_receive,
    blocked_waiters_are_woken_by_express_writes_and_their_answers,
    a_peer_that_goes_away_fails_the_express_writes_it_never_answered,
    small_sends_go_express_into_the_receives_in_order,
    answers_are_reaped_while_the_rail_waits_for_a_receive,
    a_request_answered_before_the_peer_closes_completes_as_answered,
);

/// Polls `cq` (driving the endpoint's progress) `polls` times; the completions seen.
fn poll_for(cq: &braid::CompletionQueue, polls: usize) -> Vec<braid::Completion> {
    (0..polls).filter_map(|_| cq.poll()).collect()
}

fn small_writes_go_around_the_frames_and_arrive_whole_and_in_order(p: Pair) {
    let dst = p.server_ctx.alloc_region(128 << 10, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(128 << 10, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    let key = dst.remote_key();
    const N: u64 = 300;
    let mut off = 0usize;
    for i in 0..N {
        let len = 1 + (i as usize * 37) % 512;
        let bytes = pattern(i, len);
        src.write_at(off, &bytes).unwrap();
        p.server
            .post_recv(1000 + i, &[inbox.slice(0, 64).unwrap()])
            .unwrap();
        p.client
            .write_with_imm(
                i,
                &[src.slice(off, len).unwrap()],
                &key,
                off as u64,
                i as u32,
            )
            .unwrap();
        let c = next(&p.server_cq);
        assert_eq!(
            (c.wr_id, c.kind, c.status, c.imm, c.byte_len),
            (
                1000 + i,
                CompletionKind::RecvWriteImm,
                Status::Success,
                Some(i as u32),
                len as u64
            )
        );
        assert_eq!(dst.to_vec(off, len).unwrap(), bytes, "write {i}");
        // The poster polls, as an application does: its answers are reaped and the next
        // write may go express again (64 unanswered at most, then frames).
        expect_ok(&p.client_cq, i);
        off += len;
    }
    // No frame carried them: the rail's data bytes count framed payloads only.
    assert_eq!(p.client.rail_bytes_sent(), vec![0]);
    // A larger write goes framed.
    src.write_at(0, &pattern(7, 4096)).unwrap();
    p.client
        .write(N, &[src.slice(0, 4096).unwrap()], &key, 0)
        .unwrap();
    expect_ok(&p.client_cq, N);
    assert_eq!(p.client.rail_bytes_sent(), vec![4096]);
    assert_eq!(dst.to_vec(0, 4096).unwrap(), pattern(7, 4096));
}

fn express_and_framed_writes_keep_their_order(p: Pair) {
    let dst = p.server_ctx.alloc_region(256 << 10, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(256 << 10, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    let key = dst.remote_key();
    let big = pattern(1, 200 << 10);
    src.write_at(4096, &big).unwrap();
    for round in 0..20u64 {
        src.write_at(0, &round.to_le_bytes()).unwrap();
        src.write_at(8, &(round + 100).to_le_bytes()).unwrap();
        let base = 10 * round;
        // Small (express), then large (framed) over the same bytes, then small again (framed
        // while the large one is outstanding, or express once it completed), then a flag.
        p.client
            .write(base, &[src.slice(0, 8).unwrap()], &key, 0)
            .unwrap();
        p.client
            .write(base + 1, &[src.slice(4096, 200 << 10).unwrap()], &key, 0)
            .unwrap();
        p.client
            .write(base + 2, &[src.slice(8, 8).unwrap()], &key, 8)
            .unwrap();
        p.server
            .post_recv(base + 3, &[inbox.slice(0, 64).unwrap()])
            .unwrap();
        p.client
            .write_with_imm(
                base + 3,
                &[src.slice(0, 8).unwrap()],
                &key,
                16,
                round as u32,
            )
            .unwrap();
        // The flag arrives after every byte before it.
        let c = next(&p.server_cq);
        assert_eq!((c.wr_id, c.imm), (base + 3, Some(round as u32)));
        let mut want = big[..8].to_vec();
        want.extend_from_slice(&(round + 100).to_le_bytes());
        want.extend_from_slice(&round.to_le_bytes());
        want.extend_from_slice(&big[24..200 << 10]);
        assert!(dst.to_vec(0, 200 << 10).unwrap() == want, "round {round}");
        // Completions come in posting order, whichever way each write went.
        for k in 0..4 {
            expect_ok(&p.client_cq, base + k);
        }
    }
}

fn a_refused_express_write_fails_alone_and_the_endpoint_goes_on(p: Pair) {
    let dst = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let readonly = p
        .server_ctx
        .alloc_region(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
        .unwrap();
    let src = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    src.write_at(0, &[9u8; 64]).unwrap();
    p.server
        .post_recv(77, &[inbox.slice(0, 64).unwrap()])
        .unwrap();
    let key = dst.remote_key();
    let one = || [src.slice(0, 8).unwrap()];
    // Past the region's end, without the right, under a deregistered key.
    p.client.write_with_imm(1, &one(), &key, 4090, 1).unwrap();
    p.client
        .write_with_imm(2, &one(), &readonly.remote_key(), 0, 2)
        .unwrap();
    let gone = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let gone_key = gone.remote_key();
    drop(gone);
    p.client.write_with_imm(3, &one(), &gone_key, 0, 3).unwrap();
    for wr in 1..=3 {
        let c = next(&p.client_cq);
        assert_eq!((c.wr_id, c.status), (wr, Status::RemoteAccessError));
    }
    assert_eq!(dst.to_vec(4088, 8).unwrap(), vec![0; 8]);
    assert_eq!(readonly.to_vec(0, 8).unwrap(), vec![0; 8]);
    // None of them took the receive: the next good write does.
    p.client.write_with_imm(4, &one(), &key, 0, 4).unwrap();
    expect_ok(&p.client_cq, 4);
    let c = next(&p.server_cq);
    assert_eq!((c.wr_id, c.imm), (77, Some(4)));
    assert_eq!(dst.to_vec(0, 8).unwrap(), vec![9; 8]);
}

fn an_express_write_with_immediate_waits_for_a_receive(p: Pair) {
    let dst = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    src.write_at(0, &[5u8; 8]).unwrap();
    p.client
        .write_with_imm(1, &[src.slice(0, 8).unwrap()], &dst.remote_key(), 0, 42)
        .unwrap();
    // Both sides make progress; the write may not complete, nor place its bytes, before
    // the target has a receive for its immediate.
    for _ in 0..200 {
        assert!(poll_for(&p.server_cq, 10).is_empty());
        assert!(poll_for(&p.client_cq, 10).is_empty());
    }
    assert_eq!(dst.to_vec(0, 8).unwrap(), vec![0; 8]);
    p.server
        .post_recv(9, &[inbox.slice(0, 64).unwrap()])
        .unwrap();
    let c = next(&p.server_cq);
    assert_eq!(
        (c.wr_id, c.imm, c.kind),
        (9, Some(42), CompletionKind::RecvWriteImm)
    );
    expect_ok(&p.client_cq, 1);
    assert_eq!(dst.to_vec(0, 8).unwrap(), vec![5; 8]);
}

fn blocked_waiters_are_woken_by_express_writes_and_their_answers(p: Pair) {
    for cq in [&p.server_cq, &p.client_cq] {
        // Sleep at once: only the link (a ring's doorbell, a readable socket) wakes them.
        cq.set_spin(Duration::ZERO);
    }
    let dst = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let back = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    let key = dst.remote_key();
    let back_key = back.remote_key();
    const PINGS: u32 = 100;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            // The server echoes each immediate back with a write of its own.
            let (mut pings, mut acks) = (0u32, 0u32);
            while pings < PINGS || acks < PINGS {
                let c = p.server_cq.wait(WAIT).expect("a ping or an answer");
                assert_eq!(c.status, Status::Success, "{c:?}");
                if c.kind == CompletionKind::Write {
                    acks += 1;
                    continue;
                }
                assert_eq!(c.kind, CompletionKind::RecvWriteImm, "{c:?}");
                pings += 1;
                p.server
                    .post_recv(c.wr_id, &[inbox.slice(0, 64).unwrap()])
                    .unwrap();
                let imm = c.imm.unwrap();
                p.server
                    .write_with_imm(imm.into(), &[dst.slice(0, 8).unwrap()], &back_key, 0, imm)
                    .unwrap();
            }
        });
        let reply = p.client_ctx.alloc_region(64, Access::all()).unwrap();
        for k in 0..4 {
            p.server
                .post_recv(k, &[inbox.slice(0, 64).unwrap()])
                .unwrap();
        }
        let deadline = Instant::now() + WAIT;
        let (mut pongs, mut acks) = (0u32, 0u32);
        let ping = |i: u32| {
            p.client
                .post_recv(i.into(), &[reply.slice(0, 64).unwrap()])
                .unwrap();
            p.client
                .write_with_imm(i.into(), &[src.slice(0, 8).unwrap()], &key, 0, i)
                .unwrap();
        };
        ping(0);
        while pongs < PINGS || acks < PINGS {
            assert!(
                Instant::now() < deadline,
                "stuck after {pongs} pongs, {acks} answers"
            );
            let c = p.client_cq.wait(WAIT).expect("a completion");
            assert_eq!(c.status, Status::Success, "{c:?}");
            match c.kind {
                CompletionKind::Write => acks += 1,
                CompletionKind::RecvWriteImm => {
                    assert_eq!(c.imm, Some(pongs));
                    pongs += 1;
                    if pongs < PINGS {
                        ping(pongs);
                    }
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    });
    // A plain write completes nothing at the target: only its answer wakes the poster.
    for i in 0..20u64 {
        p.client
            .write(500 + i, &[src.slice(0, 8).unwrap()], &key, 64)
            .unwrap();
        let c = p.client_cq.wait(WAIT).expect("the answer wakes the poster");
        assert_eq!((c.wr_id, c.status), (500 + i, Status::Success));
    }
}

fn a_peer_that_goes_away_fails_the_express_writes_it_never_answered(p: Pair) {
    let dst = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    // No receive at the target: the write waits there, unanswered.
    p.client
        .write_with_imm(1, &[src.slice(0, 8).unwrap()], &dst.remote_key(), 0, 1)
        .unwrap();
    p.client
        .write(2, &[src.slice(0, 8).unwrap()], &dst.remote_key(), 8)
        .unwrap();
    assert!(poll_for(&p.client_cq, 1000).is_empty());
    let Pair {
        server,
        server_ctx,
        client,
        client_cq,
        ..
    } = p;
    drop(server);
    drop(server_ctx);
    for wr in 1..=2 {
        let c = client_cq.wait(WAIT).expect("a completion for every write");
        assert_eq!(c.wr_id, wr);
        assert_ne!(c.status, Status::Success, "{c:?}");
    }
    assert!(client.is_closed());
}

/// The next receive completion of `cq`, passing over successful send completions.
fn next_recv(cq: &braid::CompletionQueue) {
    loop {
        let c = next(cq);
        assert_eq!(c.status, Status::Success, "{c:?}");
        if c.kind == CompletionKind::RecvWriteImm {
            return;
        }
    }
}

fn a_request_answered_before_the_peer_closes_completes_as_answered(p: Pair) {
    let sdst = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    let cdst = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    let (sbuf, cbuf) = (
        p.server_ctx.alloc_region(64, Access::all()).unwrap(),
        p.client_ctx.alloc_region(64, Access::all()).unwrap(),
    );
    // A ping-pong first: each side's answers come carried by the other's replies, so a busy
    // poller on a ring looks at the control page's answers only now and then.
    for i in 0..8u64 {
        p.server.post_recv(i, &[sbuf.slice(0, 8).unwrap()]).unwrap();
        p.client.post_recv(i, &[cbuf.slice(0, 8).unwrap()]).unwrap();
        let ping = cbuf.slice(8, 8).unwrap();
        p.client
            .write_with_imm(i, &[ping], &sdst.remote_key(), 0, i as u32)
            .unwrap();
        next_recv(&p.server_cq);
        let pong = sbuf.slice(8, 8).unwrap();
        p.server
            .write_with_imm(i, &[pong], &cdst.remote_key(), 0, i as u32)
            .unwrap();
        next_recv(&p.client_cq);
    }
    // The server's last write gets no reply: its answer is only in the control page (or an
    // `ExpressAnswer` frame) when the client closes right after executing it.
    sbuf.write_at(16, b"last one").unwrap();
    p.server
        .write(100, &[sbuf.slice(16, 8).unwrap()], &cdst.remote_key(), 32)
        .unwrap();
    let deadline = Instant::now() + WAIT;
    while cdst.to_vec(32, 8).unwrap() != b"last one" {
        assert!(Instant::now() < deadline, "the write never landed");
        let _ = p.client_cq.poll();
    }
    p.client.close();
    // Whatever else completes (the ping-pong's writes), the last write completes as done.
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(
            Instant::now() < deadline,
            "no completion for the last write"
        );
        if let Some(c) = p.server_cq.poll()
            && c.wr_id == 100
        {
            assert_eq!(c.status, Status::Success, "{c:?}");
            break;
        }
    }
}

fn small_sends_go_express_into_the_receives_in_order(p: Pair) {
    let src = p.client_ctx.alloc_region(64 << 10, Access::all()).unwrap();
    let inbox = p.server_ctx.alloc_region(64 << 10, Access::all()).unwrap();
    for i in 0..100u64 {
        let len = 1 + (i as usize * 13) % 512;
        let bytes = pattern(i, len);
        src.write_at(0, &bytes).unwrap();
        p.server
            .post_recv(i, &[inbox.slice(0, 512).unwrap()])
            .unwrap();
        if i % 2 == 0 {
            p.client.send(i, &[src.slice(0, len).unwrap()]).unwrap();
        } else {
            p.client
                .send_with_imm(i, &[src.slice(0, len).unwrap()], i as u32)
                .unwrap();
        }
        let c = next(&p.server_cq);
        let imm = (i % 2 == 1).then_some(i as u32);
        assert_eq!(
            (c.wr_id, c.kind, c.status, c.byte_len, c.imm),
            (i, CompletionKind::Recv, Status::Success, len as u64, imm)
        );
        assert_eq!(inbox.to_vec(0, len).unwrap(), bytes, "send {i}");
        expect_ok(&p.client_cq, i);
    }
    assert_eq!(p.client.rail_bytes_sent(), vec![0], "no frame carried them");
    // Too long for the receive: both sides see it fail, the next one goes on.
    p.server
        .post_recv(200, &[inbox.slice(0, 8).unwrap()])
        .unwrap();
    p.client.send(200, &[src.slice(0, 9).unwrap()]).unwrap();
    let c = next(&p.server_cq);
    assert_eq!((c.wr_id, c.status), (200, Status::LocalLengthError));
    let c = next(&p.client_cq);
    assert_eq!(c.wr_id, 200);
    assert!(!c.status.is_ok(), "{c:?}");
    // A large send goes framed, after the small one before it.
    let big = pattern(9, 32 << 10);
    src.write_at(0, &big).unwrap();
    p.server
        .post_recv(300, &[inbox.slice(0, 8).unwrap()])
        .unwrap();
    p.server
        .post_recv(301, &[inbox.slice(8, 32 << 10).unwrap()])
        .unwrap();
    p.client.send(300, &[src.slice(0, 8).unwrap()]).unwrap();
    p.client
        .send(301, &[src.slice(0, 32 << 10).unwrap()])
        .unwrap();
    for wr in [300, 301] {
        let c = next(&p.server_cq);
        assert_eq!((c.wr_id, c.status), (wr, Status::Success));
        expect_ok(&p.client_cq, wr);
    }
    assert_eq!(inbox.to_vec(8, 32 << 10).unwrap(), big);
}

/// A send's answer is reaped while the rail waits on the peer's next send: an echo server
/// reposts a receive only once the echo that used its buffer completed, and that echo's
/// answer comes beside the stream, not behind the stalled send.
fn answers_are_reaped_while_the_rail_waits_for_a_receive(p: Pair) {
    let ping = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    let pong_in = p.client_ctx.alloc_region(64, Access::all()).unwrap();
    let buf = p.server_ctx.alloc_region(64, Access::all()).unwrap();
    p.server.post_recv(1, &[buf.slice(0, 64).unwrap()]).unwrap();
    for round in 0..20u64 {
        p.client
            .post_recv(round, &[pong_in.slice(0, 64).unwrap()])
            .unwrap();
        if round == 0 {
            p.client.send(round, &[ping.slice(0, 8).unwrap()]).unwrap();
        }
        let c = next(&p.server_cq);
        assert_eq!((c.kind, c.status), (CompletionKind::Recv, Status::Success));
        // Echo from the receive's own buffer.
        p.server
            .send(100 + round, &[buf.slice(0, 8).unwrap()])
            .unwrap();
        // The client takes the echo and sends the next ping at once: it reaches the
        // server's ring before the server has a receive for it.
        loop {
            let c = next(&p.client_cq);
            assert_eq!(c.status, Status::Success, "{c:?}");
            if c.kind == CompletionKind::Recv {
                break;
            }
        }
        p.client
            .send(round + 1, &[ping.slice(0, 8).unwrap()])
            .unwrap();
        // The server waits for its echo to complete before it reposts the buffer.
        loop {
            let c = next(&p.server_cq);
            assert_eq!(c.status, Status::Success, "{c:?}");
            if c.wr_id == 100 + round {
                break;
            }
        }
        p.server.post_recv(1, &[buf.slice(0, 64).unwrap()]).unwrap();
    }
}

/// A peer that speaks the wire by hand: an `Express` frame with a bad key is answered with
/// an `ExpressAnswer` carrying the failure, a valid one with immediate fills a receive, and
/// a malformed one (a payload over 512 bytes) fails the endpoint, which flushes its receive.
#[test]
fn a_hand_written_peer_gets_express_answers_and_a_malformed_frame_fails_the_endpoint() {
    use braid_proto::wire::handshake::{HANDSHAKE_LEN, HANDSHAKE_VERSION, Hello, HelloReply};
    use braid_proto::wire::{FrameHeader, HEADER_LEN, HandshakeStatus, Opcode, WireStatus};
    use std::io::{Read, Write};

    let ctx = braid::Context::new().unwrap();
    let l = ctx.listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let addr = l.local_addrs()[0];
    let cq = ctx.create_cq(16);
    let mut o = braid::EndpointOptions::new(&cq);
    o.transport = RailTransport::Tcp;
    let acc = std::thread::spawn(move || l.accept(&o, Duration::from_secs(5)));
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let hello = Hello {
        version: HANDSHAKE_VERSION,
        rail_index: 0,
        rail_count: 1,
        capabilities: 0,
        max_chunk: 0,
        session_id: 77,
        nonce: [3; 16],
        same_host: None,
    };
    s.write_all(&hello.encode()).unwrap();
    let mut b = [0u8; HANDSHAKE_LEN];
    s.read_exact(&mut b).unwrap();
    assert_eq!(
        HelloReply::decode(&b).unwrap().status,
        HandshakeStatus::Accepted
    );
    let ep = acc.join().unwrap().unwrap();
    let dst = ctx.alloc_region(64, Access::all()).unwrap();
    let inbox = ctx.alloc_region(64, Access::all()).unwrap();
    ep.post_recv(5, &[inbox.slice(0, 64).unwrap()]).unwrap();
    ep.post_recv(6, &[inbox.slice(0, 64).unwrap()]).unwrap();

    let express = |seq: u64, rkey: u64, len: u32| {
        let mut h = FrameHeader::new(Opcode::Express);
        (h.seq, h.rkey, h.addr, h.payload_len) = (seq, rkey, 8, len);
        h.flags = braid_proto::wire::frame::FLAG_IMM;
        h.aux = 40 + seq as u32;
        let mut f = h.encode().to_vec();
        f.extend((0..len).map(|i| i as u8 ^ 0x5a));
        f
    };
    // A bad key: answered with its failure, no receive taken.
    s.write_all(&express(0, 0xdead_0000_0000, 8)).unwrap();
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let a = FrameHeader::decode(&h).unwrap();
    assert_eq!(
        (a.opcode, a.arg0, a.aux),
        (Opcode::ExpressAnswer, 1, WireStatus::RemoteAccess as u32)
    );
    // A good one: placed, and its immediate fills the first receive.
    s.write_all(&express(1, dst.remote_key().key, 8)).unwrap();
    let c = cq.wait(WAIT).expect("the receive completes");
    assert_eq!(
        (c.wr_id, c.kind, c.imm, c.byte_len),
        (5, CompletionKind::RecvWriteImm, Some(41), 8)
    );
    assert_eq!(
        dst.to_vec(8, 8).unwrap(),
        (0..8).map(|i| i as u8 ^ 0x5a).collect::<Vec<_>>()
    );
    s.read_exact(&mut h).unwrap();
    let a = FrameHeader::decode(&h).unwrap();
    assert_eq!(
        (a.opcode, a.arg0, a.aux),
        (Opcode::ExpressAnswer, 1, WireStatus::Ok as u32)
    );
    // Over 512 bytes: refused by the decoder; the endpoint fails and flushes receive 6.
    s.write_all(&express(2, dst.remote_key().key, 600)).unwrap();
    let c = cq.wait(WAIT).expect("the receive is flushed");
    assert_eq!(c.wr_id, 6);
    assert_eq!(c.status, Status::Flushed, "{c:?}");
    // Failing flushes first, then closes: a bounded wait for the second.
    let deadline = Instant::now() + WAIT;
    while !ep.is_closed() {
        assert!(Instant::now() < deadline, "the endpoint stays open");
        std::thread::yield_now();
    }
}

/// Small writes posted while the peer reads 16 MiB from this side: some go as express frames
/// straight to the socket, some find the transmit batch busy with read responses and go
/// framed, some go framed because 64 express ones are outstanding. Every write lands
/// whole, and the read is exact.
#[test]
fn tcp_small_writes_beside_a_large_read_response_arrive_whole() {
    let p = pair("tcp");
    const BIG: usize = 16 << 20;
    let served = p.client_ctx.alloc_region(BIG, Access::all()).unwrap();
    served.write_at(0, &pattern(99, BIG)).unwrap();
    let into = p.server_ctx.alloc_region(BIG, Access::all()).unwrap();
    let dst = p.server_ctx.alloc_region(256 << 10, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(256 << 10, Access::all()).unwrap();
    let key = dst.remote_key();
    p.server
        .read(1, &[into.slice(0, BIG).unwrap()], &served.remote_key(), 0)
        .unwrap();
    const N: u64 = 400;
    let mut off = 0usize;
    let mut placed = Vec::new();
    let mut outstanding = 0u64;
    for i in 0..N {
        let len = 1 + (i as usize * 53) % 512;
        let bytes = pattern(i, len);
        src.write_at(off, &bytes).unwrap();
        p.client
            .write(i, &[src.slice(off, len).unwrap()], &key, off as u64)
            .unwrap();
        placed.push((off, bytes));
        off += len;
        outstanding += 1;
        // Up to 80 in flight: past 64 they go framed until the express ones are answered.
        if outstanding == 80 {
            for _ in 0..40 {
                let c = next(&p.client_cq);
                assert_eq!(c.status, Status::Success, "{c:?}");
            }
            outstanding -= 40;
        }
    }
    for _ in 0..outstanding {
        let c = next(&p.client_cq);
        assert_eq!(c.status, Status::Success, "{c:?}");
    }
    for (i, (off, bytes)) in placed.iter().enumerate() {
        assert_eq!(&dst.to_vec(*off, bytes.len()).unwrap(), bytes, "write {i}");
    }
    expect_ok(&p.server_cq, 1);
    assert!(into.to_vec(0, BIG).unwrap() == pattern(99, BIG), "the read");
}
