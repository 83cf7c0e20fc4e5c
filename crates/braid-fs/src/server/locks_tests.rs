use super::*;

const F: u64 = 7;
const EOF: u64 = u64::MAX;

fn o(client: u64, owner: u64) -> Owner {
    Owner { client, owner }
}

fn want(owner: Owner, kind: Option<Kind>, start: u64, end: u64) -> Want {
    Want {
        owner,
        kind,
        start,
        end,
        fh: 1,
        pid: 100,
    }
}

fn rd(owner: Owner, start: u64, end: u64) -> Want {
    want(owner, Some(Kind::Read), start, end)
}
fn wr(owner: Owner, start: u64, end: u64) -> Want {
    want(owner, Some(Kind::Write), start, end)
}
fn un(owner: Owner, start: u64, end: u64) -> Want {
    want(owner, None, start, end)
}

/// (kind, start, end) of `owner`'s locks, in order.
fn ranges(t: &LockTable<u32>, owner: Owner) -> Vec<(Kind, u64, u64)> {
    t.held(F)
        .into_iter()
        .filter(|h| h.owner == owner)
        .map(|h| (h.kind, h.start, h.end))
        .collect()
}

fn set(t: &mut LockTable<u32>, w: Want) -> Outcome {
    let mut woken = Vec::new();
    let r = t.set(F, w, None, &mut woken);
    assert!(woken.is_empty());
    r
}

#[test]
fn an_unlock_in_the_middle_splits_a_lock() {
    let mut t = LockTable::default();
    let a = o(1, 1);
    assert_eq!(set(&mut t, wr(a, 0, 99)), Outcome::Granted);
    assert_eq!(set(&mut t, un(a, 40, 59)), Outcome::Granted);
    assert_eq!(
        ranges(&t, a),
        vec![(Kind::Write, 0, 39), (Kind::Write, 60, 99)]
    );
    // Another owner may now take the hole, not a byte more.
    let b = o(2, 1);
    assert_eq!(set(&mut t, wr(b, 40, 59)), Outcome::Granted);
    assert!(matches!(set(&mut t, wr(b, 39, 39)), Outcome::Conflict(h) if h.owner == a));
}

#[test]
fn adjacent_and_overlapping_locks_of_one_kind_merge() {
    let mut t = LockTable::default();
    let a = o(1, 1);
    set(&mut t, rd(a, 0, 9));
    set(&mut t, rd(a, 10, 19));
    set(&mut t, rd(a, 15, 29));
    assert_eq!(ranges(&t, a), vec![(Kind::Read, 0, 29)]);
    set(&mut t, rd(a, 31, EOF));
    assert_eq!(
        ranges(&t, a),
        vec![(Kind::Read, 0, 29), (Kind::Read, 31, EOF)]
    );
    set(&mut t, rd(a, 30, 30));
    assert_eq!(ranges(&t, a), vec![(Kind::Read, 0, EOF)]);
    set(&mut t, un(a, 0, EOF));
    assert!(t.held(F).is_empty());
}

#[test]
fn upgrade_and_downgrade_replace_the_covered_part() {
    let mut t = LockTable::default();
    let a = o(1, 1);
    set(&mut t, rd(a, 0, 99));
    set(&mut t, wr(a, 20, 29));
    assert_eq!(
        ranges(&t, a),
        vec![
            (Kind::Read, 0, 19),
            (Kind::Write, 20, 29),
            (Kind::Read, 30, 99)
        ]
    );
    // A reader of another owner is refused on the write part only.
    let b = o(2, 5);
    assert!(matches!(set(&mut t, rd(b, 25, 25)), Outcome::Conflict(_)));
    assert_eq!(set(&mut t, rd(b, 50, 60)), Outcome::Granted);
    // An upgrade that overlaps the other reader is refused and changes nothing.
    assert!(matches!(set(&mut t, wr(a, 0, 99)), Outcome::Conflict(h) if h.owner == b));
    assert_eq!(ranges(&t, a).len(), 3);
    // Downgrade: the read locks merge back into one.
    set(&mut t, rd(a, 20, 29));
    assert_eq!(ranges(&t, a), vec![(Kind::Read, 0, 99)]);
}

#[test]
fn conflicts_need_overlap_and_a_writer() {
    let mut t = LockTable::default();
    let (a, b, a2) = (o(1, 1), o(2, 1), o(1, 2));
    set(&mut t, rd(a, 0, 9));
    assert_eq!(t.test(F, &rd(b, 0, 9)), None, "readers share");
    assert!(t.test(F, &wr(b, 9, 20)).is_some(), "one byte of overlap");
    assert_eq!(t.test(F, &wr(b, 10, 20)), None, "adjacent");
    assert_eq!(t.test(F, &wr(a, 0, 9)), None, "own locks never conflict");
    // Owners on the same client are different owners.
    assert!(t.test(F, &wr(a2, 5, 5)).is_some());
    // Other files are independent.
    assert_eq!(t.test(F + 1, &wr(b, 0, 9)), None);
}

#[test]
fn a_waiter_is_granted_when_the_conflict_goes() {
    let mut t = LockTable::default();
    let (a, b) = (o(1, 1), o(2, 1));
    set(&mut t, wr(a, 0, EOF));
    let mut woken = Vec::new();
    assert_eq!(t.set(F, wr(b, 0, 0), Some(1), &mut woken), Outcome::Queued);
    // A partial unlock elsewhere wakes nobody.
    t.set(F, un(a, 10, 20), None, &mut woken);
    assert!(woken.is_empty());
    t.set(F, un(a, 0, 9), None, &mut woken);
    assert_eq!(woken, vec![(1, Ok(()))]);
    assert_eq!(ranges(&t, b), vec![(Kind::Write, 0, 0)]);
}

#[test]
fn waiters_are_woken_in_order_and_a_queued_writer_is_not_starved() {
    let mut t = LockTable::default();
    let (a, w1, r1, r2) = (o(1, 1), o(2, 1), o(3, 1), o(4, 1));
    set(&mut t, rd(a, 0, 99));
    let mut woken = Vec::new();
    assert_eq!(
        t.set(F, wr(w1, 0, 99), Some(10), &mut woken),
        Outcome::Queued
    );
    // A reader that does not wait is checked against held locks only (POSIX): granted
    // while the writer waits; so is a waiting one that conflicts with nothing held.
    assert_eq!(set(&mut t, rd(r1, 0, 0)), Outcome::Granted);
    assert_eq!(
        t.set(F, wr(r2, 200, 300), Some(11), &mut woken),
        Outcome::Granted
    );
    set(&mut t, un(r2, 200, 300));
    // A waiting writer behind the first writer, conflicting with the readers.
    assert_eq!(
        t.set(F, wr(r2, 50, 50), Some(12), &mut woken),
        Outcome::Queued
    );
    set(&mut t, un(r1, 0, 0));
    assert!(woken.is_empty(), "a still holds its read lock");
    t.set(F, un(a, 0, 99), None, &mut woken);
    // The first writer first; the second conflicts with it and stays queued.
    assert_eq!(woken, vec![(10, Ok(()))]);
    woken.clear();
    t.set(F, un(w1, 0, 99), None, &mut woken);
    assert_eq!(woken, vec![(12, Ok(()))]);
}

#[test]
fn a_later_reader_waits_behind_an_earlier_waiting_writer() {
    let mut t = LockTable::default();
    let (a, w, r) = (o(1, 1), o(2, 1), o(3, 1));
    set(&mut t, wr(a, 0, 9));
    let mut woken = Vec::new();
    t.set(F, wr(w, 0, 9), Some(1), &mut woken);
    t.set(F, rd(r, 0, 9), Some(2), &mut woken);
    // a downgrades to a read lock: r could share it, but w came first and conflicts.
    t.set(F, rd(a, 0, 9), None, &mut woken);
    assert!(woken.is_empty());
    t.set(F, un(a, 0, 9), None, &mut woken);
    assert_eq!(woken, vec![(1, Ok(()))]);
    woken.clear();
    t.set(F, un(w, 0, 9), None, &mut woken);
    assert_eq!(woken, vec![(2, Ok(()))]);
}

#[test]
fn a_cycle_of_waiters_is_refused_as_a_deadlock() {
    let mut t = LockTable::default();
    let (a, b, c) = (o(1, 1), o(2, 1), o(3, 1));
    set(&mut t, wr(a, 0, 0));
    set(&mut t, wr(b, 1, 1));
    set(&mut t, wr(c, 2, 2));
    let mut woken = Vec::new();
    assert_eq!(t.set(F, wr(a, 1, 1), Some(1), &mut woken), Outcome::Queued);
    assert_eq!(t.set(F, wr(b, 2, 2), Some(2), &mut woken), Outcome::Queued);
    // c waiting for a would close a -> b -> c -> a.
    assert_eq!(
        t.set(F, wr(c, 0, 0), Some(3), &mut woken),
        Outcome::Deadlock
    );
    // Across files too.
    assert_eq!(
        t.set(F + 1, wr(c, 0, 0), Some(4), &mut Vec::new()),
        Outcome::Granted
    );
    let mut t2: LockTable<u32> = LockTable::default();
    t2.set(1, wr(a, 0, 0), None, &mut woken);
    t2.set(2, wr(b, 0, 0), None, &mut woken);
    assert_eq!(t2.set(2, wr(a, 0, 0), Some(5), &mut woken), Outcome::Queued);
    assert_eq!(
        t2.set(1, wr(b, 0, 0), Some(6), &mut woken),
        Outcome::Deadlock
    );
    assert!(woken.is_empty());
}

#[test]
fn releasing_an_owner_cancels_its_waiters_and_wakes_others() {
    let mut t = LockTable::default();
    let (a, b, c) = (o(1, 1), o(2, 1), o(3, 1));
    set(&mut t, wr(a, 0, 9));
    set(&mut t, wr(b, 20, 29));
    let mut woken = Vec::new();
    t.set(F, wr(b, 0, 9), Some(1), &mut woken);
    t.set(F, wr(c, 20, 20), Some(2), &mut woken);
    t.release_owner(F, b, &mut woken);
    assert_eq!(woken, vec![(1, Err(Errno::ECANCELED)), (2, Ok(()))]);
    assert_eq!(ranges(&t, b), vec![]);
    assert_eq!(ranges(&t, a), vec![(Kind::Write, 0, 9)]);
}

#[test]
fn a_release_of_an_open_file_drops_only_its_locks() {
    let mut t = LockTable::default();
    let a = o(1, 1);
    let mut woken = Vec::new();
    t.set(
        F,
        Want {
            fh: 5,
            ..wr(a, 0, 9)
        },
        None,
        &mut woken,
    );
    t.set(
        F,
        Want {
            fh: 6,
            ..wr(a, 10, 19)
        },
        None,
        &mut woken,
    );
    assert_eq!(ranges(&t, a).len(), 2, "no merge across open files");
    t.release_fh(F, 1, 5, &mut woken);
    assert_eq!(ranges(&t, a), vec![(Kind::Write, 10, 19)]);
    t.release_fh(F, 2, 6, &mut woken); // another client's handle 6
    assert_eq!(ranges(&t, a).len(), 1);
}

#[test]
fn a_disconnected_client_loses_everything_and_its_waiters_vanish() {
    let mut t = LockTable::default();
    let (a, a2, b) = (o(1, 1), o(1, 2), o(2, 1));
    set(&mut t, wr(a, 0, EOF));
    let mut woken = Vec::new();
    t.set(F, wr(b, 0, 0), Some(1), &mut woken);
    t.set(F, wr(a2, 5, 5), Some(2), &mut woken);
    t.drop_client(1, &mut woken);
    assert_eq!(woken, vec![(1, Ok(()))]);
    assert_eq!(ranges(&t, a), vec![]);
    assert_eq!(ranges(&t, b), vec![(Kind::Write, 0, 0)]);
}

#[test]
fn one_client_cannot_hold_unbounded_lock_ranges() {
    let mut t = LockTable::default();
    let a = o(1, 1);
    for i in 0..MAX_HELD_PER_CLIENT as u64 {
        assert_eq!(set(&mut t, wr(a, 2 * i, 2 * i)), Outcome::Granted);
    }
    let n = MAX_HELD_PER_CLIENT as u64;
    assert_eq!(set(&mut t, wr(a, 2 * n, 2 * n)), Outcome::NoLocks);
    // Another client is not affected; unlocking still works.
    assert_eq!(set(&mut t, wr(o(2, 1), 2 * n, 2 * n)), Outcome::Granted);
    assert_eq!(set(&mut t, un(a, 0, EOF)), Outcome::Granted);
    assert_eq!(ranges(&t, a), vec![]);
}
