//! `Endpoint::post_list`: lists of operations under one lock and one flush, and unsignaled
//! operations that report only a failure.

mod common;

use std::time::{Duration, Instant};

use braid::{Access, CompletionKind, CompletionQueue, Error, Op, Status, WorkRequest};
use common::{WAIT, expect_ok, next, pair, pattern};

/// 4096 writes of 64 B in lists of 32, every eighth signaled, through a completion queue of
/// 64 entries: each signaled completion arrives in order, the silent ones give their slots
/// back (else posting would run out of them), and every byte lands.
#[test]
fn unsignaled_writes_in_lists_complete_in_order_and_free_their_slots() {
    const N: u64 = 4096;
    const LIST: u64 = 32;
    // Both sides' operations report into the small queue (the server posts none).
    let cq = CompletionQueue::new(64);
    let c2 = cq.clone();
    let p = common::pair_with(2, move |o| o.send_cq = c2.clone());
    let target = p
        .server_ctx
        .alloc_region(N as usize * 64, Access::all())
        .unwrap();
    let src = p
        .client_ctx
        .alloc_region(N as usize * 64, Access::all())
        .unwrap();
    let data = pattern(11, N as usize * 64);
    src.write_at(0, &data).unwrap();
    let ep = &p.client;
    let rk = target.remote_key();
    let sges: Vec<_> = (0..N)
        .map(|i| [src.slice(i as usize * 64, 64).unwrap()])
        .collect();
    let (mut posted, mut next_signaled) = (0u64, 7u64);
    let start = Instant::now();
    while next_signaled < N {
        // Operations known complete: every one before the next signaled one.
        if posted < N && posted + LIST - (next_signaled - 7) <= 64 {
            let list: Vec<_> = (posted..posted + LIST)
                .map(|i| WorkRequest {
                    wr_id: i,
                    op: Op::Write {
                        local: &sges[i as usize],
                        remote: &rk,
                        remote_offset: i * 64,
                        imm: None,
                    },
                    signaled: i % 8 == 7,
                })
                .collect();
            ep.post_list(&list).expect("slots are free again");
            posted += LIST;
            continue;
        }
        assert!(start.elapsed() < WAIT * 2, "completions stopped");
        let c = cq
            .wait(Duration::from_millis(100))
            .expect("a signaled completion");
        assert_eq!(
            (c.wr_id, c.status),
            (next_signaled, Status::Success),
            "{c:?}"
        );
        next_signaled += 8;
    }
    assert!(cq.poll().is_none(), "only signaled operations report");
    assert_eq!(target.to_vec(0, N as usize * 64).unwrap(), data);
}

/// An unsignaled operation that fails reports its failure; the unsignaled successes around
/// it stay silent.
#[test]
fn an_unsignaled_failure_is_reported() {
    let p = pair(1);
    let target = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    src.write_at(0, &pattern(3, 64)).unwrap();
    let rk = target.remote_key();
    let sge = [src.slice(0, 64).unwrap()];
    let write = |wr_id, off, signaled| WorkRequest {
        wr_id,
        op: Op::Write {
            local: &sge,
            remote: &rk,
            remote_offset: off,
            imm: None,
        },
        signaled,
    };
    p.client
        .post_list(&[
            write(1, 0, false),
            write(2, 8192, false),
            write(3, 128, false),
            write(4, 256, true),
        ])
        .unwrap();
    let c = next(&p.client_cq);
    assert_eq!((c.wr_id, c.status), (2, Status::RemoteAccessError), "{c:?}");
    // The endpoint goes on (a failed one-sided operation does not fail the endpoint):
    // the unsignaled write after it is silent, the signaled one reports.
    expect_ok(&p.client_cq, 4);
    assert!(p.client_cq.wait(Duration::from_millis(200)).is_none());
    assert_eq!(target.to_vec(128, 64).unwrap(), pattern(3, 64));
    assert_eq!(target.to_vec(0, 64).unwrap(), pattern(3, 64));
}

/// A list stops at an operation it cannot post: those before it are posted and complete,
/// those after it are not.
#[test]
fn a_list_stops_at_the_first_operation_that_cannot_be_posted() {
    let p = pair(2);
    let target = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let rk = target.remote_key();
    let err = p
        .client
        .post_list(&[
            WorkRequest {
                wr_id: 1,
                op: Op::FetchAdd {
                    remote: &rk,
                    remote_offset: 0,
                    add: 5,
                },
                signaled: true,
            },
            WorkRequest {
                wr_id: 2,
                op: Op::FetchAdd {
                    remote: &rk,
                    remote_offset: 3,
                    add: 1,
                },
                signaled: true,
            },
            WorkRequest {
                wr_id: 3,
                op: Op::FetchAdd {
                    remote: &rk,
                    remote_offset: 8,
                    add: 1,
                },
                signaled: true,
            },
        ])
        .unwrap_err();
    assert_eq!(err.index, 1);
    assert!(matches!(err.error, Error::InvalidArgument(_)), "{err}");
    let c = expect_ok(&p.client_cq, 1);
    assert_eq!(c.value, Some(0));
    assert!(
        p.client_cq.wait(Duration::from_millis(200)).is_none(),
        "nothing after the refused operation was posted"
    );
    assert_eq!(target.to_vec(0, 16).unwrap(), {
        let mut v = 5u64.to_le_bytes().to_vec();
        v.extend([0u8; 8]);
        v
    });
}

/// Every kind of operation in one list, all signaled: completions in list order with their
/// values, and the peer's receive.
#[test]
fn every_kind_of_operation_in_one_list() {
    let p = pair(4);
    let target = p.server_ctx.alloc_region(1 << 16, Access::all()).unwrap();
    let rbuf = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(1 << 16, Access::all()).unwrap();
    let back = p.client_ctx.alloc_region(1 << 16, Access::all()).unwrap();
    p.server
        .post_recv(50, &[rbuf.slice(0, 4096).unwrap()])
        .unwrap();
    let data = pattern(9, 1 << 15);
    src.write_at(0, &data).unwrap();
    let rk = target.remote_key();
    let w = [src.slice(0, 1 << 15).unwrap()];
    let r = [back.slice(0, 1 << 15).unwrap()];
    let m = [src.slice(0, 100).unwrap()];
    let list = [
        WorkRequest {
            wr_id: 1,
            op: Op::Write {
                local: &w,
                remote: &rk,
                remote_offset: 0,
                imm: None,
            },
            signaled: true,
        },
        WorkRequest {
            wr_id: 2,
            op: Op::Read {
                local: &r,
                remote: &rk,
                remote_offset: 0,
            },
            signaled: true,
        },
        WorkRequest {
            wr_id: 3,
            op: Op::FetchAdd {
                remote: &rk,
                remote_offset: 1 << 15,
                add: 7,
            },
            signaled: true,
        },
        WorkRequest {
            wr_id: 4,
            op: Op::CompareSwap {
                remote: &rk,
                remote_offset: 1 << 15,
                compare: 7,
                swap: 100,
            },
            signaled: true,
        },
        WorkRequest {
            wr_id: 5,
            op: Op::Send {
                local: &m,
                imm: Some(77),
            },
            signaled: true,
        },
    ];
    p.client.post_list(&list).unwrap();
    for id in 1..=5u64 {
        let c = expect_ok(&p.client_cq, id);
        match id {
            3 => assert_eq!(c.value, Some(0)),
            4 => assert_eq!(c.value, Some(7)),
            _ => {}
        }
    }
    assert_eq!(back.to_vec(0, 1 << 15).unwrap(), data);
    let c = expect_ok(&p.server_cq, 50);
    assert_eq!(
        (c.kind, c.imm, c.byte_len),
        (CompletionKind::Recv, Some(77), 100)
    );
    assert_eq!(
        target.to_vec(1 << 15, 8).unwrap(),
        100u64.to_le_bytes().to_vec()
    );
}
