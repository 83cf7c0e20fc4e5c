//! Express records on the ring alone: taken on their tag, in order with the stream around
//! them, never mistaken for bytes an earlier lap left behind, and counts that lag behind a
//! record taken on its tag (but no further).

use super::express::EXPRESS_HDR;
use super::ring::MIN_RING_BYTES;
use super::tests::{pair, send_all};
use super::*;
use braid_proto::{EXPRESS_MAX, ExpressTo};

const SMALL: usize = MIN_RING_BYTES;

/// A write of `len` bytes, numbered `seq`.
fn request(seq: u64, len: usize) -> ExpressRequest {
    ExpressRequest {
        seq,
        to: ExpressTo::Region {
            rkey: 7,
            addr: seq * 1000,
        },
        imm: seq.is_multiple_of(3).then_some(seq as u32),
        len: len as u32,
    }
}

/// Offers the record at `b`'s read cursor; the requests executed go to `ran`.
fn take(b: &ShmLink, ran: &mut Vec<(ExpressRequest, Vec<u8>)>) -> ExpressTake {
    b.exec_express(&mut |r, p| {
        ran.push((*r, p.to_vec()));
        Some(WireStatus::Ok)
    })
    .expect("take")
}

#[test]
fn express_records_come_in_order_with_the_stream_and_stale_bytes_never_pass_for_one() {
    let (a, b) = pair(SMALL);
    // Every byte the stream leaves behind looks like an express record's tag: a reader that
    // trusted a stale byte at a record's start would execute garbage.
    let tagged = vec![EXPRESS; 3000];
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut seq, mut ran, mut stream, mut answered) = (0u64, Vec::new(), 0usize, 0u64);
    let mut buf = vec![0u8; 4096];
    // About eight laps of the ring.
    for _ in 0..400 {
        // A few records: express requests of any size, inline runs of tag bytes.
        let mut sent_stream = 0;
        let mut sent_express = Vec::new();
        for _ in 0..(next() % 4 + 1) {
            if next() % 2 == 0 {
                let len = (next() % (EXPRESS_MAX as u64 + 1)) as usize;
                let payload: Vec<u8> = (0..len).map(|i| (seq as usize + i) as u8).collect();
                let r = request(seq, len);
                assert!(a.put_express(&r, &[(payload.as_ptr(), len)]).expect("put"));
                sent_express.push((r, payload));
                seq += 1;
            } else {
                let len = (next() % 3000) as usize + 1;
                assert_eq!(send_all(&a, &tagged[..len]), len);
                sent_stream += len;
            }
        }
        // The reader, as the engine's receive loop: express records between stream bytes.
        let (before, mut got) = (ran.len(), 0);
        loop {
            match take(&b, &mut ran) {
                ExpressTake::Ran | ExpressTake::RanEmpty => continue,
                ExpressTake::Empty => break,
                ExpressTake::Other => match b.recv(&mut buf) {
                    Ok(n) => {
                        assert!(buf[..n].iter().all(|&x| x == EXPRESS));
                        got += n;
                    }
                    Err(e) => panic!("recv after Other: {e}"),
                },
                ExpressTake::Stalled => unreachable!(),
            }
        }
        assert_eq!(got, sent_stream);
        assert_eq!(ran[before..], sent_express[..]);
        stream += got;
        assert_eq!(b.bytes_waiting(), Some(0));
        assert_eq!(
            b.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // Answers, as the engine reaps them: within the window of 64.
        a.read_express_answers(&mut |st| {
            assert_eq!(st, WireStatus::Ok);
            answered += 1;
        })
        .expect("answers");
        assert_eq!(answered, seq);
    }
    assert_eq!(ran.len() as u64, seq);
    assert!(stream > 4 * SMALL, "{stream} stream bytes: too few laps");
}

#[test]
fn counts_may_lag_behind_a_record_taken_on_its_tag_but_no_further() {
    let (a, b) = pair(SMALL);
    let ctrl = a.tx.ctrl();
    let mut ran = Vec::new();
    // The producer's counts not yet published when the reader meets the tag.
    let r = request(0, 8);
    assert!(
        a.put_express(&r, &[(b"eight by".as_ptr(), 8)])
            .expect("put")
    );
    let (head, stream_head) = (
        ctrl.head.load(Ordering::Acquire),
        ctrl.stream_head.load(Ordering::Acquire),
    );
    ctrl.head.store(0, Ordering::Release);
    ctrl.stream_head.store(0, Ordering::Release);
    assert_eq!(take(&b, &mut ran), ExpressTake::RanEmpty);
    assert_eq!(ran.len(), 1);
    let mut buf = [0u8; 16];
    assert_eq!(b.bytes_waiting(), Some(0));
    assert_eq!(
        b.recv(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    assert!(!b.arm(1).expect("arm"));
    ctrl.head.store(head, Ordering::Release);
    ctrl.stream_head.store(stream_head, Ordering::Release);
    // And the stream goes on behind it.
    assert_eq!(send_all(&a, b"xy"), 2);
    assert_eq!(take(&b, &mut ran), ExpressTake::Other);
    assert_eq!(b.recv(&mut buf).expect("recv"), 2);
    assert_eq!(&buf[..2], b"xy");

    // Counts further behind than the record's start are a broken peer's.
    let start = ctrl.head.load(Ordering::Acquire);
    // The express record padded to its line, then the inline one.
    assert_eq!(
        start,
        (EXPRESS_HDR + 8).next_multiple_of(64) as u64 + (INLINE_HDR + 2) as u64
    );
    assert!(a.put_express(&request(1, 0), &[]).expect("put"));
    ctrl.head.store(start - 1, Ordering::Release);
    assert_eq!(take(&b, &mut ran), ExpressTake::RanEmpty);
    assert_eq!(
        b.recv(&mut buf).unwrap_err().kind(),
        io::ErrorKind::InvalidData
    );
}

#[test]
fn stream_bytes_counted_behind_a_zero_tag_fail_an_arming_reader() {
    let (a, b) = pair(SMALL);
    // The "peer" counts bytes it never wrote.
    a.tx.ctrl().head.store(16, Ordering::Release);
    a.tx.ctrl().stream_head.store(8, Ordering::Release);
    let mut ran = Vec::new();
    assert_eq!(take(&b, &mut ran), ExpressTake::Empty);
    assert_eq!(b.arm(1).unwrap_err().kind(), io::ErrorKind::InvalidData);
    assert!(ran.is_empty());
}

/// Takes the record at `b`'s cursor with `st` as its status.
fn take_as(b: &ShmLink, st: WireStatus) -> ExpressTake {
    b.exec_express(&mut |_, _| Some(st)).expect("take")
}

fn answers(a: &ShmLink) -> Vec<WireStatus> {
    let mut got = Vec::new();
    a.read_express_answers(&mut |st| got.push(st))
        .expect("answers");
    got
}

#[test]
fn answers_ride_on_the_reply_and_a_failure_among_them_is_read_from_the_control_page() {
    let (a, b) = pair(SMALL);
    // a's request 0 executes on b; b's reply carries the answer.
    assert!(
        a.put_express(&request(0, 8), &[(b"request0".as_ptr(), 8)])
            .expect("put")
    );
    assert_eq!(take_as(&b, WireStatus::Ok), ExpressTake::RanEmpty);
    // The control page's status is spoilt: an answer read from there would fail the link.
    b.rx.ctrl().express_status[0].store(200, Ordering::Relaxed);
    assert!(b.put_express(&request(0, 0), &[]).expect("put"));
    assert_eq!(take_as(&a, WireStatus::Ok), ExpressTake::RanEmpty);
    assert!(a.express_answers_waiting(false));
    assert_eq!(answers(&a), [WireStatus::Ok]);
    assert!(!a.express_answers_waiting(true));

    // Requests 1 and 2; 1 fails. The reply carries both, but not as successes.
    for seq in 1..3 {
        assert!(a.put_express(&request(seq, 0), &[]).expect("put"));
    }
    assert_eq!(take_as(&b, WireStatus::RemoteAccess), ExpressTake::Ran);
    assert_eq!(take_as(&b, WireStatus::Ok), ExpressTake::RanEmpty);
    assert!(b.put_express(&request(1, 0), &[]).expect("put"));
    assert_eq!(take_as(&a, WireStatus::Ok), ExpressTake::RanEmpty);
    assert!(a.express_answers_waiting(false));
    assert_eq!(answers(&a), [WireStatus::RemoteAccess, WireStatus::Ok]);

    // A record that carries more answers than requests were sent is a broken peer's.
    let mut h = [0u8; EXPRESS_HDR];
    // SAFETY: b's last record, read back from the ring it wrote.
    unsafe { b.tx.copy(64, h.as_mut_ptr(), EXPRESS_HDR, false, false) };
    assert!(b.put_express(&request(2, 0), &[]).expect("put"));
    let at = 128;
    h[8..16].copy_from_slice(&2u64.to_le_bytes());
    h[40..48].copy_from_slice(&9u64.to_le_bytes());
    h[0] = EXPRESS;
    // SAFETY: the record b just wrote at `at`, rewritten before a reads it.
    unsafe { b.tx.copy(at, h.as_mut_ptr(), EXPRESS_HDR, true, false) };
    assert_eq!(
        a.exec_express(&mut |_, _| Some(WireStatus::Ok))
            .unwrap_err()
            .kind(),
        io::ErrorKind::InvalidData
    );
}

#[test]
fn a_busy_poller_looks_for_uncarried_answers_now_and_then_a_sleeper_at_once() {
    let (a, b) = pair(SMALL);
    // A ping-pong first: the answer comes carried by the reply.
    assert!(
        a.put_express(&request(0, 8), &[(b"ping-pon".as_ptr(), 8)])
            .expect("put")
    );
    assert_eq!(take_as(&b, WireStatus::Ok), ExpressTake::RanEmpty);
    assert!(b.put_express(&request(0, 0), &[]).expect("put"));
    assert_eq!(take_as(&a, WireStatus::Ok), ExpressTake::RanEmpty);
    assert_eq!(answers(&a), [WireStatus::Ok]);
    // Then no reply comes: the answer is only in the control page, and a busy poller that
    // got its last answers carried looks there only now and then.
    assert!(
        a.put_express(&request(1, 8), &[(b"one-way!".as_ptr(), 8)])
            .expect("put")
    );
    assert_eq!(take_as(&b, WireStatus::Ok), ExpressTake::RanEmpty);
    let polls = (1..=1000)
        .find(|_| a.express_answers_waiting(false))
        .expect("a busy poller never looked");
    assert!(polls > 1 && polls <= 64, "looked after {polls} polls");
    // Found, it stays found until reaped.
    assert!(a.express_answers_waiting(false));
    assert_eq!(answers(&a), [WireStatus::Ok]);
    assert!(!a.express_answers_waiting(false));
    // Answers came from the control page: the poller looks there on every poll now (a
    // write waited for alone is not held up).
    assert!(a.put_express(&request(2, 0), &[]).expect("put"));
    assert_eq!(take_as(&b, WireStatus::Ok), ExpressTake::RanEmpty);
    assert!(a.express_answers_waiting(false));
    assert_eq!(answers(&a), [WireStatus::Ok]);
    // And a thread about to sleep looks at once, whatever the mode.
    assert!(a.put_express(&request(3, 0), &[]).expect("put"));
    assert_eq!(take_as(&b, WireStatus::Ok), ExpressTake::RanEmpty);
    assert!(a.express_answers_waiting(true));
    assert_eq!(answers(&a), [WireStatus::Ok]);
}
