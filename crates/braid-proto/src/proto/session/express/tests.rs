use crate::error::{CompletionKind, Status};
use crate::mem::region::{Region, RemoteKey, Sge};
use crate::wire::WireStatus;

use super::super::testkit::Pair;
use super::super::{Request, SessionConfig};
use super::{EXPRESS_MAX, EXPRESS_WINDOW, ExpressAction, ExpressRequest, ExpressTo};

/// A write of `len` bytes of `src` to `key` at `addr`.
struct W(Vec<Sge>, u64, u64, Option<u32>);

fn write(src: &Region, len: usize, key: &RemoteKey, addr: u64, imm: Option<u32>) -> W {
    W(vec![src.slice(0, len).expect("slice")], key.key, addr, imm)
}

impl W {
    fn to(&self) -> ExpressTo {
        ExpressTo::Region {
            rkey: self.1,
            addr: self.2,
        }
    }

    fn framed(self) -> Request {
        Request::Write {
            local: self.0,
            rkey: self.1,
            addr: self.2,
            imm: self.3,
        }
    }
}

/// Whether side `side` would take `w` the express way now. A write that would is posted
/// framed instead (the link "has no room") and run to completion, so the pair stays idle.
fn may_go_express(p: &mut Pair, side: usize, w: &W) -> bool {
    let mut asked = false;
    let r = p.s[side]
        .post_express(1, &w.0, w.to(), w.3, true, |_, _| {
            asked = true;
            false
        })
        .expect("a valid write");
    if asked {
        assert_eq!(r, Some(false));
        p.run();
        p.done[side].clear();
    } else {
        assert_eq!(r, None);
    }
    asked
}

/// Side 0 posts `local` to `to` the express way; returns what the target is handed.
fn post(
    p: &mut Pair,
    wr_id: u64,
    local: &[Sge],
    to: ExpressTo,
    imm: Option<u32>,
    signaled: bool,
) -> (ExpressRequest, Vec<u8>) {
    let mut out = None;
    let r = p.s[0]
        .post_express(wr_id, local, to, imm, signaled, |r, pieces| {
            let mut bytes = Vec::new();
            for &(ptr, l) in pieces {
                let at = bytes.len();
                bytes.resize(at + l, 0);
                // SAFETY: the pieces of a live region's slice, into our own buffer.
                unsafe { std::ptr::copy_nonoverlapping(ptr, bytes[at..].as_mut_ptr(), l) };
            }
            out = Some((*r, bytes));
            true
        })
        .expect("a valid request");
    assert_eq!(r, Some(true), "the request may go express");
    out.expect("sent")
}

/// Side 0 writes `req` the express way; returns what the target is handed.
fn send(p: &mut Pair, wr_id: u64, req: W, signaled: bool) -> (ExpressRequest, Vec<u8>) {
    post(p, wr_id, &req.0, req.to(), req.3, signaled)
}

fn completions(p: &mut Pair, side: usize) -> Vec<crate::error::Completion> {
    std::iter::from_fn(|| p.s[side].poll_completion()).collect()
}

#[test]
fn an_express_write_with_immediate_places_its_bytes_consumes_a_receive_and_completes() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 0xab);
    let dst = p.region(1, 64, 0);
    let inbox = p.region(1, 16, 0);
    p.s[1].post_recv(70, [inbox.as_sge()]).unwrap();
    let (r, bytes) = send(
        &mut p,
        5,
        write(&src, 8, &dst.remote_key(), 16, Some(9)),
        true,
    );
    assert_eq!((r.seq, r.len, r.imm), (0, 8, Some(9)));
    assert_eq!(
        r.to,
        ExpressTo::Region {
            rkey: dst.remote_key().key,
            addr: 16
        }
    );
    assert_eq!(p.s[0].express_outstanding(), 1);
    assert!(completions(&mut p, 0).is_empty(), "not before its answer");
    let act = p.s[1].on_express(0, &r, &bytes).unwrap();
    assert_eq!(act, ExpressAction::Done(WireStatus::Ok));
    assert_eq!(dst.to_vec(16, 8).unwrap(), vec![0xab; 8]);
    assert_eq!(
        dst.to_vec(0, 16).unwrap(),
        vec![0; 16],
        "nothing outside the range"
    );
    let got = completions(&mut p, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].wr_id, got[0].kind, got[0].imm, got[0].byte_len),
        (70, CompletionKind::RecvWriteImm, Some(9), 8)
    );
    p.s[0].express_acked(WireStatus::Ok).unwrap();
    let got = completions(&mut p, 0);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].status), (5, Status::Success));
    assert_eq!(p.s[0].outstanding(), 0);
    // The sides' sequence spaces stay in step: a framed write follows.
    p.post(0, 6, write(&src, 64, &dst.remote_key(), 0, None).framed());
    p.run();
    p.assert_no_errors("framed write after an express one");
    assert_eq!(dst.to_vec(0, 64).unwrap(), vec![0xab; 64]);
    assert_eq!(p.done[0].len(), 1);
}

#[test]
fn only_small_plain_writes_on_one_idle_rail_go_express() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 4096, 1);
    let dst = p.region(1, 4096, 0);
    let key = dst.remote_key();
    let big = write(&src, EXPRESS_MAX + 1, &key, 0, None);
    assert!(!may_go_express(&mut p, 0, &big));
    assert!(may_go_express(&mut p, 0, &write(&src, 8, &key, 0, None)));
    // A framed operation outstanding: the next write must follow its frames.
    p.post(0, 2, write(&src, 8, &key, 0, None).framed());
    assert!(!may_go_express(&mut p, 0, &write(&src, 8, &key, 0, None)));
    p.run();
    assert!(may_go_express(&mut p, 0, &write(&src, 8, &key, 0, None)));
    // Never on an endpoint of several rails.
    let mut q = Pair::new(SessionConfig::default(), 2);
    let src = q.region(0, 64, 1);
    let key = q.region(1, 64, 0).remote_key();
    assert!(!may_go_express(&mut q, 0, &write(&src, 8, &key, 0, None)));
}

#[test]
fn at_most_a_window_of_express_writes_is_outstanding() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 1);
    let key = p.region(1, 64, 0).remote_key();
    for i in 0..EXPRESS_WINDOW as u64 {
        send(&mut p, i, write(&src, 8, &key, 0, None), true);
    }
    assert!(!may_go_express(&mut p, 0, &write(&src, 8, &key, 0, None)));
}

#[test]
fn a_later_framed_operation_completes_after_the_express_write_before_it() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 4096, 7);
    let dst = p.region(1, 4096, 0);
    let key = dst.remote_key();
    let (r, bytes) = send(&mut p, 1, write(&src, 8, &key, 0, None), true);
    p.post(0, 2, write(&src, 4096, &key, 0, None).framed());
    // The link carries the express write first.
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Done(WireStatus::Ok)
    );
    // The framed write executes and its `Done` comes back before the express answer is
    // read: its completion waits behind the express write's.
    p.run();
    p.assert_no_errors("framed write behind an express one");
    assert!(p.done[0].is_empty(), "{:?}", p.done[0]);
    assert_eq!(p.s[0].outstanding(), 2);
    p.s[0].express_acked(WireStatus::Ok).unwrap();
    let ids: Vec<u64> = completions(&mut p, 0).iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [1, 2]);
    // Offered out of turn, a frame waits for the express write before it.
    let (r, bytes) = send(&mut p, 3, write(&src, 8, &key, 0, None), true);
    p.post(0, 4, write(&src, 8, &key, 8, None).framed());
    p.run();
    assert_eq!(
        p.s[0].outstanding(),
        2,
        "the framed write stalled at the target"
    );
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Done(WireStatus::Ok)
    );
    p.run();
    p.assert_no_errors("stalled frame retried");
    p.s[0].express_acked(WireStatus::Ok).unwrap();
    p.run();
    let ids: Vec<u64> = p.done[0].iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [3, 4], "{:?}", p.done[0]);
    assert_eq!(p.s[0].outstanding(), 0);
}

#[test]
fn a_refused_express_write_reports_at_the_initiator_and_keeps_the_receive() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 3);
    let dst = p.region(1, 64, 0);
    let inbox = p.region(1, 16, 0);
    p.s[1].post_recv(70, [inbox.as_sge()]).unwrap();
    let bad = RemoteKey {
        key: dst.remote_key().key ^ 0x5555,
        len: 64,
    };
    let (r, bytes) = send(&mut p, 1, write(&src, 8, &bad, 0, Some(1)), true);
    let act = p.s[1].on_express(0, &r, &bytes).unwrap();
    assert_eq!(act, ExpressAction::Done(WireStatus::RemoteAccess));
    assert!(completions(&mut p, 1).is_empty(), "no receive consumed");
    // Past the region's end.
    let (r, bytes) = {
        p.s[0].express_acked(WireStatus::RemoteAccess).unwrap();
        send(
            &mut p,
            2,
            write(&src, 8, &dst.remote_key(), 60, Some(2)),
            true,
        )
    };
    let act = p.s[1].on_express(0, &r, &bytes).unwrap();
    assert_eq!(act, ExpressAction::Done(WireStatus::RemoteAccess));
    p.s[0].express_acked(WireStatus::RemoteAccess).unwrap();
    let st: Vec<Status> = completions(&mut p, 0).iter().map(|c| c.status).collect();
    assert_eq!(st, [Status::RemoteAccessError, Status::RemoteAccessError]);
    assert_eq!(dst.to_vec(0, 64).unwrap(), vec![0; 64], "nothing written");
    // The receive is still there for a good one.
    let (r, bytes) = send(
        &mut p,
        3,
        write(&src, 8, &dst.remote_key(), 0, Some(3)),
        true,
    );
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Done(WireStatus::Ok)
    );
    let got = completions(&mut p, 1);
    assert_eq!((got[0].wr_id, got[0].imm), (70, Some(3)));
}

#[test]
fn an_express_write_with_immediate_waits_for_a_receive() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 3);
    let dst = p.region(1, 64, 0);
    let inbox = p.region(1, 16, 0);
    let (r, bytes) = send(
        &mut p,
        1,
        write(&src, 8, &dst.remote_key(), 0, Some(4)),
        true,
    );
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Stall
    );
    assert_eq!(
        dst.to_vec(0, 8).unwrap(),
        vec![0; 8],
        "nothing placed while stalled"
    );
    assert_eq!(p.s[1].take_rx_retry(), 0);
    p.s[1].post_recv(70, [inbox.as_sge()]).unwrap();
    assert_eq!(
        p.s[1].take_rx_retry(),
        1,
        "the rail is retried once a receive is posted"
    );
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Done(WireStatus::Ok)
    );
    assert_eq!(dst.to_vec(0, 8).unwrap(), vec![3; 8]);
}

#[test]
fn an_express_write_out_of_turn_or_longer_than_said_is_a_protocol_error() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 3);
    let dst = p.region(1, 64, 0);
    let (mut r, bytes) = send(&mut p, 1, write(&src, 8, &dst.remote_key(), 0, None), true);
    r.seq = 5;
    assert!(p.s[1].on_express(0, &r, &bytes).is_err());
    r.seq = 0;
    assert!(p.s[1].on_express(0, &r, &bytes[..4]).is_err());
    let long = vec![0u8; EXPRESS_MAX + 1];
    r.len = long.len() as u32;
    assert!(p.s[1].on_express(0, &r, &long).is_err());
    // An answer to nothing.
    let mut q = Pair::new(SessionConfig::default(), 1);
    assert!(q.s[0].express_acked(WireStatus::Ok).is_err());
}

#[test]
fn losing_the_rail_fails_outstanding_express_writes_once() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 3);
    let key = p.region(1, 64, 0).remote_key();
    send(&mut p, 1, write(&src, 8, &key, 0, None), true);
    send(&mut p, 2, write(&src, 8, &key, 8, None), false);
    p.lose_rail(0);
    let got = completions(&mut p, 0);
    let st: Vec<(u64, Status)> = got.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        st,
        [(1, Status::TransportError), (2, Status::TransportError)]
    );
    // An answer read after the loss changes nothing.
    p.s[0].express_acked(WireStatus::Ok).unwrap();
    assert!(completions(&mut p, 0).is_empty());
}

#[test]
fn an_unsignaled_express_write_completes_silently() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 3);
    let dst = p.region(1, 64, 0);
    let (r, bytes) = send(&mut p, 1, write(&src, 8, &dst.remote_key(), 0, None), false);
    p.s[1].on_express(0, &r, &bytes).unwrap();
    p.s[0].express_acked(WireStatus::Ok).unwrap();
    assert!(completions(&mut p, 0).is_empty());
    assert_eq!(p.s[0].take_unsignaled_done(), 1);
}

/// Side 0 sends `len` bytes of `src` (with `imm`) the express way, into side 1's next
/// receive; returns what the target is handed.
fn send_to_receive(
    p: &mut Pair,
    wr_id: u64,
    src: &Region,
    len: usize,
    imm: Option<u32>,
) -> (ExpressRequest, Vec<u8>) {
    let local = [src.slice(0, len).unwrap()];
    post(p, wr_id, &local, ExpressTo::Receive, imm, true)
}

#[test]
fn an_express_send_fills_the_next_receive_across_its_pieces() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 0);
    src.write_at(0, &(0u8..40).collect::<Vec<_>>()).unwrap();
    let inbox = p.region(1, 64, 0xee);
    let (r, bytes) = send_to_receive(&mut p, 3, &src, 40, Some(77));
    assert_eq!(r.to, ExpressTo::Receive);
    // No receive yet: it waits, and nothing is written.
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Stall
    );
    // Two pieces: 16 bytes at 0, then 32 at 32.
    p.s[1]
        .post_recv(
            9,
            [inbox.slice(0, 16).unwrap(), inbox.slice(32, 32).unwrap()],
        )
        .unwrap();
    assert_eq!(
        p.s[1].on_express(0, &r, &bytes).unwrap(),
        ExpressAction::Done(WireStatus::Ok)
    );
    let got = completions(&mut p, 1);
    assert_eq!(
        (
            got[0].wr_id,
            got[0].kind,
            got[0].status,
            got[0].byte_len,
            got[0].imm
        ),
        (9, CompletionKind::Recv, Status::Success, 40, Some(77))
    );
    let mut want = (0u8..16).collect::<Vec<_>>();
    want.extend(std::iter::repeat_n(0xee, 16));
    want.extend(16u8..40);
    want.extend(std::iter::repeat_n(0xee, 8));
    assert_eq!(inbox.to_vec(0, 64).unwrap(), want);
    p.s[0].express_acked(WireStatus::Ok).unwrap();
    let got = completions(&mut p, 0);
    assert_eq!(
        (got[0].wr_id, got[0].kind, got[0].status),
        (3, CompletionKind::Send, Status::Success)
    );
}

#[test]
fn an_express_send_longer_than_the_receive_fails_on_both_sides() {
    let mut p = Pair::new(SessionConfig::default(), 1);
    let src = p.region(0, 64, 5);
    let inbox = p.region(1, 64, 0);
    p.s[1].post_recv(9, [inbox.slice(0, 8).unwrap()]).unwrap();
    let (r, bytes) = send_to_receive(&mut p, 3, &src, 9, None);
    let act = p.s[1].on_express(0, &r, &bytes).unwrap();
    assert_eq!(act, ExpressAction::Done(WireStatus::RemoteInvalidRequest));
    let got = completions(&mut p, 1);
    assert_eq!((got[0].wr_id, got[0].status), (9, Status::LocalLengthError));
    assert_eq!(inbox.to_vec(0, 8).unwrap(), vec![0; 8], "nothing written");
    p.s[0]
        .express_acked(WireStatus::RemoteInvalidRequest)
        .unwrap();
    let got = completions(&mut p, 0);
    assert_eq!((got[0].wr_id, got[0].kind), (3, CompletionKind::Send));
    assert!(!got[0].status.is_ok());
}
