//! Express requests carried as `Express` frames (a TCP rail): answers ride on the next
//! express frame the other way, or go as `ExpressAnswer` frames.

use crate::error::{CompletionKind, Status};
use crate::mem::region::Region;
use crate::wire::{FrameHeader, Opcode, WireStatus};

use super::super::testkit::Pair;
use super::super::{ProtocolError, SessionConfig};
use super::{EXPRESS_WINDOW, ExpressTo};

fn to(dst: &Region, addr: u64) -> ExpressTo {
    ExpressTo::Region {
        rkey: dst.remote_key().key,
        addr,
    }
}

/// The opcodes side `side` sent so far, but the rail's acknowledgements.
fn sent(p: &Pair, side: usize) -> Vec<Opcode> {
    p.sent[side]
        .iter()
        .map(|(_, h)| h.opcode)
        .filter(|&o| o != Opcode::RailAck)
        .collect()
}

/// A pair of one rail with a 64 B region on each side and `recvs` receives of 16 B posted
/// on each.
fn pair(recvs: u64) -> (Pair, [Region; 2], [Region; 2]) {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let mem = [p.region(0, 64, 0xa0), p.region(1, 64, 0xb0)];
    let inbox = [p.region(0, 16 * 64, 0), p.region(1, 16 * 64, 0)];
    for (s, inbox) in p.s.iter_mut().zip(&inbox) {
        for k in 0..recvs {
            let sge = inbox.slice(16 * k as usize, 16).unwrap();
            s.post_recv(100 + k, [sge]).unwrap();
        }
    }
    (p, mem, inbox)
}

#[test]
fn a_ping_pong_of_express_frames_answers_each_request_in_the_reply() {
    let (mut p, mem, _) = pair(8);
    for round in 0..4u64 {
        let src = mem[0].slice(0, 8).unwrap();
        assert!(p.post_express_frame(0, round, &[src], to(&mem[1], 8), Some(1), true));
        // The reply is posted once side 1 has seen the request, as a ping-pong does.
        assert!(p.rx_one(1, 0));
        let got: Vec<_> = std::iter::from_fn(|| p.s[1].poll_completion()).collect();
        let mut want = vec![(100 + round, CompletionKind::RecvWriteImm)];
        if round > 0 {
            // The request answered side 1's previous one.
            want.insert(0, (50 + round - 1, CompletionKind::Write));
        }
        assert_eq!(
            got.iter().map(|c| (c.wr_id, c.kind)).collect::<Vec<_>>(),
            want
        );
        let src = mem[1].slice(0, 8).unwrap();
        assert!(p.post_express_frame(1, 50 + round, &[src], to(&mem[0], 8), Some(2), true));
        assert!(p.rx_one(0, 0));
        let got: Vec<_> = std::iter::from_fn(|| p.s[0].poll_completion()).collect();
        assert_eq!(
            got.iter().map(|c| (c.wr_id, c.kind)).collect::<Vec<_>>(),
            vec![
                (round, CompletionKind::Write),
                (100 + round, CompletionKind::RecvWriteImm)
            ],
            "the reply's frame answered the request, then delivered its immediate"
        );
    }
    assert_eq!(mem[1].to_vec(8, 8).unwrap(), vec![0xa0; 8]);
    assert_eq!(mem[0].to_vec(8, 8).unwrap(), vec![0xb0; 8]);
    // Side 1's last request is answered by a frame once side 0 has nothing to say.
    p.run();
    p.assert_no_errors("ping-pong");
    assert_eq!(p.done[1].len(), 1);
    assert_eq!(
        (p.done[1][0].wr_id, p.done[1][0].status),
        (53, Status::Success)
    );
    assert_eq!(
        sent(&p, 0),
        [vec![Opcode::Express; 4], vec![Opcode::ExpressAnswer]].concat()
    );
    assert_eq!(
        sent(&p, 1),
        vec![Opcode::Express; 4],
        "every answer rode on a request"
    );
}

#[test]
fn answers_to_a_stream_of_requests_go_as_counted_frames_with_failures_in_place() {
    let (mut p, mem, _) = pair(0);
    let bad = ExpressTo::Region {
        rkey: 0xdead,
        addr: 0,
    };
    let dests = [
        to(&mem[1], 0),
        bad,
        to(&mem[1], 8),
        to(&mem[1], 60),
        to(&mem[1], 16),
    ];
    for (k, &d) in dests.iter().enumerate() {
        let src = mem[0].slice(k, 8).unwrap();
        assert!(p.post_express_frame(0, k as u64, &[src], d, None, true));
    }
    for _ in 0..dests.len() {
        assert!(p.rx_one(1, 0));
    }
    let answers: Vec<_> = p.s[1].rails[0]
        .ctrl
        .iter()
        .map(|h| (h.opcode, h.arg0, h.aux))
        .collect();
    assert_eq!(
        answers,
        vec![
            (Opcode::ExpressAnswer, 2, WireStatus::RemoteAccess as u32),
            (Opcode::ExpressAnswer, 2, WireStatus::RemoteAccess as u32),
            (Opcode::ExpressAnswer, 1, WireStatus::Ok as u32),
        ],
        "successes are counted into the answer that ends with a failure"
    );
    // With a failure among them, the answers do not ride on side 1's next request.
    let src = mem[1].slice(0, 8).unwrap();
    assert!(p.post_express_frame(1, 9, &[src], to(&mem[0], 0), None, true));
    p.run();
    p.assert_no_errors("a stream with failures");
    let st: Vec<_> = p.done[0].iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        vec![
            (0, Status::Success),
            (1, Status::RemoteAccessError),
            (2, Status::Success),
            (3, Status::RemoteAccessError),
            (4, Status::Success),
        ]
    );
    assert_eq!(mem[1].to_vec(0, 8).unwrap(), vec![0xa0; 8]);
    assert_eq!(p.done[1].len(), 1);
    assert_eq!(
        p.s[0].express_outstanding() + p.s[1].express_outstanding(),
        0
    );
}

#[test]
fn answers_on_a_stalled_request_are_taken_once_however_often_it_is_offered() {
    let (mut p, mem, inbox) = pair(0);
    p.s[1]
        .post_recv(7, [inbox[1].slice(0, 16).unwrap()])
        .unwrap();
    let src = mem[0].slice(0, 8).unwrap();
    assert!(p.post_express_frame(0, 1, &[src], to(&mem[1], 32), Some(1), true));
    assert!(p.rx_one(1, 0));
    // Side 1 answers in a write with immediate that side 0 has no receive for yet.
    let src = mem[1].slice(0, 8).unwrap();
    assert!(p.post_express_frame(1, 2, &[src], to(&mem[0], 0), Some(2), true));
    for _ in 0..3 {
        p.run();
    }
    p.assert_no_errors("a stalled request carrying answers");
    assert_eq!(p.done[0].len(), 1, "the answer it carries is taken at once");
    assert_eq!(
        (p.done[0][0].wr_id, p.done[0][0].kind),
        (1, CompletionKind::Write)
    );
    assert_eq!(
        mem[0].to_vec(0, 8).unwrap(),
        vec![0xa0; 8],
        "not placed yet"
    );
    p.s[0]
        .post_recv(8, [inbox[0].slice(0, 16).unwrap()])
        .unwrap();
    p.run();
    p.assert_no_errors("the stalled request runs");
    assert_eq!(mem[0].to_vec(0, 8).unwrap(), vec![0xb0; 8]);
    assert_eq!(p.done[0].len(), 2);
    assert_eq!(p.done[1].iter().filter(|c| c.wr_id == 2).count(), 1);
}

#[test]
fn express_frames_stay_within_the_window_and_off_crc_endpoints() {
    let (mut p, mem, _) = pair(0);
    for k in 0..EXPRESS_WINDOW as u64 {
        let src = mem[0].slice(0, 1).unwrap();
        assert!(p.post_express_frame(0, k, &[src], to(&mem[1], 0), None, false));
    }
    let src = mem[0].slice(0, 1).unwrap();
    assert!(!p.post_express_frame(0, 99, &[src], to(&mem[1], 0), None, false));
    p.run();
    p.assert_no_errors("a window of unsignaled express writes");
    assert_eq!(p.s[0].outstanding(), 0);

    let mut p = Pair::new(
        SessionConfig {
            payload_crc: true,
            ..SessionConfig::default()
        },
        1,
    );
    let a = p.region(0, 8, 1);
    let b = p.region(1, 8, 0);
    assert!(!p.post_express_frame(0, 1, &[a.as_sge()], to(&b, 0), None, true));
}

#[test]
fn more_answers_than_requests_or_an_express_frame_offered_as_a_frame_are_errors() {
    let (mut p, _, _) = pair(0);
    let mut a = FrameHeader::new(Opcode::ExpressAnswer);
    a.arg0 = 1;
    let now = p.now;
    assert!(matches!(
        p.s[0].on_frame(0, &a, now),
        Err(ProtocolError::UnknownOperation { .. })
    ));
    let (mut p, mem, _) = pair(0);
    let mut e = FrameHeader::new(Opcode::Express);
    e.arg0 = 1;
    e.payload_len = 0;
    e.rkey = mem[0].remote_key().key;
    assert!(
        p.s[0].on_express_frame(0, &e, &[]).is_err(),
        "answers for requests never sent"
    );
    e.arg0 = 0;
    assert!(
        p.s[0].on_frame(0, &e, now).is_err(),
        "never offered as a frame"
    );
    let mut p2 = Pair::new(SessionConfig::default(), 2);
    assert!(
        p2.s[0].on_express_frame(0, &e, &[]).is_err(),
        "only endpoints of one rail send them"
    );
    let mut crc = Pair::new(
        SessionConfig {
            payload_crc: true,
            ..SessionConfig::default()
        },
        1,
    );
    assert!(
        crc.s[0].on_express_frame(0, &e, &[]).is_err(),
        "nor endpoints that check payloads with a CRC"
    );
}
