//! Scripted message sequences of the protocol core (the simulator covers the interleavings).

use super::*;

fn nodes(n: u32, slots: u32) -> Vec<Node> {
    (0..n)
        .map(|rank| {
            let mut node = Node::new(NodeConfig {
                rank,
                size: n,
                slots,
            });
            node.add_allocation(10, 4, HomePolicy::Cyclic).unwrap();
            node
        })
        .collect()
}

fn drain(n: &mut Node) -> Vec<Action> {
    std::iter::from_fn(|| n.poll_action()).collect()
}

fn send(to: Rank, msg: Msg) -> Action {
    Action::Send { to, msg }
}

#[test]
fn read_fault_served_by_the_home_owner() {
    let mut ns = nodes(2, 4);
    // Page 11 is homed at rank 1 (cyclic), which owns it; rank 1 writes it first.
    ns[1].on_fault(11, true).unwrap();
    assert_eq!(
        drain(&mut ns[1]),
        [Action::Install {
            page: 11,
            write: true,
            source: Source::Zero
        }]
    );
    ns[0].on_fault(11, false).unwrap();
    let a = drain(&mut ns[0]);
    assert_eq!(a, [send(1, Msg::ReadReq { page: 11, slot: 0 })]);
    ns[1]
        .on_message(0, Msg::ReadReq { page: 11, slot: 0 })
        .unwrap();
    let grant = Msg::Grant {
        page: 11,
        write: false,
        acks: 0,
        payload: Payload::Data,
    };
    assert_eq!(
        drain(&mut ns[1]),
        [
            Action::Protect { page: 11 },
            Action::SendPage {
                to: 0,
                slot: 0,
                msg: grant,
                drop: false
            }
        ]
    );
    ns[0].on_message(1, grant).unwrap();
    assert_eq!(
        drain(&mut ns[0]),
        [
            Action::Install {
                page: 11,
                write: false,
                source: Source::Slot(0)
            },
            send(1, Msg::Confirm { page: 11 })
        ]
    );
    ns[1].on_message(0, Msg::Confirm { page: 11 }).unwrap();
    let (owner, copyset, busy, queued) = ns[1].view(11).directory.unwrap();
    assert_eq!((owner, busy, queued), (1, false, 0));
    assert_eq!(copyset.iter().collect::<Vec<_>>(), [0, 1]);
}

#[test]
fn write_upgrade_invalidates_every_other_reader() {
    let mut ns = nodes(3, 4);
    // Page 10 is homed at rank 0. Ranks 1 and 2 read it (never written: zero grants).
    for r in [1, 2] {
        ns[r].on_fault(10, false).unwrap();
        assert_eq!(
            drain(&mut ns[r]),
            [send(0, Msg::ReadReq { page: 10, slot: 0 })]
        );
        ns[0]
            .on_message(r as Rank, Msg::ReadReq { page: 10, slot: 0 })
            .unwrap();
        let zero = Msg::Grant {
            page: 10,
            write: false,
            acks: 0,
            payload: Payload::Zero,
        };
        assert_eq!(drain(&mut ns[0]), [send(r as Rank, zero)]);
        ns[r].on_message(0, zero).unwrap();
        drain(&mut ns[r]);
        ns[0]
            .on_message(r as Rank, Msg::Confirm { page: 10 })
            .unwrap();
    }
    // Rank 1 writes: the home (owner, never written) and rank 2 must give up their copies.
    ns[1].on_fault(10, true).unwrap();
    drain(&mut ns[1]);
    ns[0]
        .on_message(1, Msg::WriteReq { page: 10, slot: 1 })
        .unwrap();
    let a = drain(&mut ns[0]);
    let grant = Msg::Grant {
        page: 10,
        write: true,
        acks: 1,
        payload: Payload::None,
    };
    assert_eq!(
        a,
        [
            send(
                2,
                Msg::Invalidate {
                    page: 10,
                    ack_to: 1
                }
            ),
            send(1, grant)
        ]
    );
    ns[1].on_message(0, grant).unwrap();
    assert!(
        drain(&mut ns[1]).is_empty(),
        "waits for the acknowledgement"
    );
    ns[2]
        .on_message(
            0,
            Msg::Invalidate {
                page: 10,
                ack_to: 1,
            },
        )
        .unwrap();
    assert_eq!(
        drain(&mut ns[2]),
        [Action::Drop { page: 10 }, send(1, Msg::InvAck { page: 10 })]
    );
    ns[1].on_message(2, Msg::InvAck { page: 10 }).unwrap();
    assert_eq!(
        drain(&mut ns[1]),
        [
            Action::Upgrade { page: 10 },
            send(0, Msg::Confirm { page: 10 })
        ]
    );
    assert_eq!(ns[1].access(10), Access::Write);
}

#[test]
fn faults_wait_for_a_staging_slot() {
    let mut ns = nodes(2, 1);
    ns[0].on_fault(11, false).unwrap();
    ns[0].on_fault(13, true).unwrap();
    assert_eq!(
        drain(&mut ns[0]),
        [send(1, Msg::ReadReq { page: 11, slot: 0 })]
    );
    assert_eq!(ns[0].outstanding(), 2);
    let zero = Msg::Grant {
        page: 11,
        write: false,
        acks: 0,
        payload: Payload::Zero,
    };
    ns[0].on_message(1, zero).unwrap();
    let a = drain(&mut ns[0]);
    assert_eq!(a[2], send(1, Msg::WriteReq { page: 13, slot: 0 }));
}

#[test]
fn bad_messages_are_errors_not_panics() {
    let mut ns = nodes(2, 1);
    let e = ns[0].on_message(1, Msg::InvAck { page: 11 });
    assert!(matches!(e, Err(ProtoError::Unexpected { .. })), "{e:?}");
    let e = ns[0].on_message(1, Msg::Confirm { page: 99 });
    assert_eq!(e, Err(ProtoError::UnknownPage { page: 99 }));
    let e = ns[0].on_message(5, Msg::Confirm { page: 10 });
    assert_eq!(e, Err(ProtoError::BadRank(5)));
    let e = ns[0].on_message(1, Msg::ReadReq { page: 11, slot: 0 });
    assert!(e.is_err(), "rank 0 is not the home of page 11");
    let e = ns[0].on_message(
        1,
        Msg::FwdRead {
            page: 10,
            to: 1,
            slot: 0,
        },
    );
    assert!(e.is_err(), "forwards come from the home only");
    let e = ns[1].on_message(
        0,
        Msg::Invalidate {
            page: 11,
            ack_to: 0,
        },
    );
    assert!(e.is_err(), "from a non-home");
    let e = ns[0].on_message(1, Msg::LockGrant { lock: 0, ticket: 0 });
    assert!(e.is_err(), "lock 0 is homed at rank 0 itself");
    let e = ns[0].on_message(1, Msg::Barrier { epoch: 0, round: 0 });
    assert!(e.is_err());
    assert!(ns[0].on_fault(3, false).is_err());
}

#[test]
fn allocations_are_checked_and_removed_only_when_quiet() {
    let mut ns = nodes(2, 1);
    assert!(ns[0].add_allocation(12, 1, HomePolicy::Block).is_err());
    assert!(ns[0].add_allocation(5, 6, HomePolicy::Block).is_err());
    assert!(ns[0].add_allocation(14, 0, HomePolicy::Block).is_err());
    ns[0].add_allocation(14, 4, HomePolicy::Block).unwrap();
    assert_eq!(
        (14..18)
            .map(|p| ns[0].home_of(p).unwrap())
            .collect::<Vec<_>>(),
        [0, 0, 1, 1]
    );
    ns[0].on_fault(16, false).unwrap();
    assert!(!ns[0].is_quiescent(14));
    assert!(ns[0].remove_allocation(14).is_err());
    assert!(ns[0].remove_allocation(10).is_ok());
    assert_eq!(ns[0].home_of(10), None);
}

fn zero_installs(actions: &[Action]) -> Vec<PageId> {
    actions
        .iter()
        .map(|a| match a {
            Action::Install {
                page,
                write: true,
                source: Source::Zero,
            } => *page,
            a => panic!("unexpected {a:?}"),
        })
        .collect()
}

#[test]
fn first_touch_at_the_home_installs_the_untouched_pages_after_it() {
    let mut n = Node::new(NodeConfig {
        rank: 0,
        size: 2,
        slots: 4,
    });
    // 200 pages in blocks: 0..100 at rank 0, 100..200 at rank 1.
    n.add_allocation(1000, 200, HomePolicy::Block).unwrap();
    n.on_fault(1000, true).unwrap();
    let want: Vec<PageId> = (1000..1000 + ZERO_AROUND).collect();
    assert_eq!(zero_installs(&drain(&mut n)), want);
    // Those pages are writable now: their faults (already queued) only wake.
    n.on_fault(1001, true).unwrap();
    assert_eq!(drain(&mut n), [Action::Wake { page: 1001 }]);
    // A page another rank holds stops the run: give page 1040 to rank 1.
    n.on_message(
        1,
        Msg::WriteReq {
            page: 1040,
            slot: 0,
        },
    )
    .unwrap();
    drain(&mut n);
    n.on_message(1, Msg::Confirm { page: 1040 }).unwrap();
    drain(&mut n);
    n.on_fault(1035, false).unwrap();
    assert_eq!(
        zero_installs(&drain(&mut n)),
        (1035..1040).collect::<Vec<_>>()
    );
    // The end of the home's block stops it (page 1100 is homed at rank 1).
    n.on_fault(1090, true).unwrap();
    assert_eq!(
        zero_installs(&drain(&mut n)),
        (1090..1100).collect::<Vec<_>>()
    );
}

#[test]
fn first_touch_stops_at_the_end_of_the_allocation_and_at_cyclic_neighbours() {
    let mut n = Node::new(NodeConfig {
        rank: 0,
        size: 1,
        slots: 4,
    });
    n.add_allocation(10, 5, HomePolicy::Block).unwrap();
    n.add_allocation(15, 5, HomePolicy::Block).unwrap();
    n.on_fault(12, true).unwrap();
    assert_eq!(zero_installs(&drain(&mut n)), [12, 13, 14]);
    // With cyclic homes the next page is another rank's: one page per fault.
    let mut ns = nodes(2, 4);
    ns[1].on_fault(11, true).unwrap();
    assert_eq!(zero_installs(&drain(&mut ns[1])), [11]);
}
