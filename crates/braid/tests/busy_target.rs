//! A target whose application busy-polls its queue while the peer runs one-sided
//! operations on it: the frames that complete those operations (an atomic's response, a
//! write's `Done`) leave with its next poll. Only control frames that the application's
//! answer could carry (after a receive completed here) are held back for a moment.

mod common;

use braid::{Access, Completion, CompletionQueue, RailTransport, Status};
use common::pair_over;

/// Polls `cq` at most `polls` times, without sleeping; the first completion.
fn poll_at_most(cq: &CompletionQueue, polls: usize) -> Option<Completion> {
    (0..polls).find_map(|_| cq.poll())
}

/// Client polls allowed for a completion whose frame is already in its rail. A held
/// frame would wait for the engine's check, up to a millisecond, far longer than these.
const CLIENT_POLLS: usize = 1000;

fn atomics_and_writes_against_a_busy_polling_target(transport: RailTransport, kind: &str) {
    let p = pair_over(transport, kind, 1, |_| {});
    let target = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    let rk = target.remote_key();
    let counter = target.atomic_u64(0).unwrap();
    let mut late = Vec::new();
    for i in 0..40u64 {
        let write = i % 2 == 1;
        if write {
            src.write_at(0, &i.to_le_bytes()).unwrap();
            p.client
                .write(i, &[src.slice(0, 8).unwrap()], &rk, 64)
                .unwrap();
        } else {
            p.client.fetch_add(i, &rk, 0, 1).unwrap();
        }
        // The target polls until the operation has run (it completes nothing there), then
        // once more: that poll sends what completes it.
        let ran = || {
            if write {
                target.to_vec(64, 8).unwrap() == i.to_le_bytes()
            } else {
                counter.load(std::sync::atomic::Ordering::SeqCst) == i / 2 + 1
            }
        };
        let mut polls = 0;
        while !ran() {
            assert!(
                p.server_cq.poll().is_none(),
                "a one-sided operation completed there"
            );
            polls += 1;
            assert!(polls < 10_000_000, "operation {i} never ran at the target");
        }
        assert!(p.server_cq.poll().is_none());
        match poll_at_most(&p.client_cq, CLIENT_POLLS) {
            Some(c) => {
                assert_eq!((c.wr_id, c.status), (i, Status::Success));
                if !write {
                    assert_eq!(c.value, Some(i / 2));
                }
            }
            None => {
                // Wait it out (bounded) and note it: the first round may meet the engine
                // still reading the client's rail; later rounds may not.
                late.push(i);
                common::expect_ok(&p.client_cq, i);
            }
        }
    }
    assert!(
        late.iter().all(|&i| i == 0),
        "completions held back at a busy-polling target: operations {late:?}"
    );
}

#[test]
fn a_busy_polling_target_answers_atomics_and_writes_at_its_next_poll_over_the_ring() {
    atomics_and_writes_against_a_busy_polling_target(RailTransport::Auto, "shm");
}

#[test]
fn a_busy_polling_target_answers_atomics_and_writes_at_its_next_poll_over_tcp() {
    atomics_and_writes_against_a_busy_polling_target(RailTransport::Tcp, "tcp");
}
