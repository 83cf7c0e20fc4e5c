//! Page exchange between same-host endpoints (docs/PROTOCOL.md, "Page exchange"): whole
//! pages of a payload are mapped copy-on-write at the destination instead of copied, and
//! both sides keep the semantics of a copy. Both contexts run in this process, so
//! `/proc/self/maps` shows whether a destination was mapped or copied.

mod common;

use braid::{Access, RailTransport, Region};
use braid_testkit::maps::mapped_private;
use common::*;

const LEN: usize = 16 << 20;

fn pair(exchange: bool) -> Pair {
    common::pair_over(RailTransport::Auto, "shm", 1, |o| {
        o.page_exchange = exchange
    })
}

fn filled(p: &Pair, seed: u64) -> (Region, Vec<u8>) {
    let r = p.client_ctx.alloc_region(LEN, Access::all()).unwrap();
    let data = pattern(seed, LEN);
    r.write_at(0, &data).unwrap();
    (r, data)
}

#[test]
fn a_written_buffer_is_a_copy_on_both_sides() {
    let p = pair(true);
    let (src, data) = filled(&p, 1);
    let target = p
        .server_ctx
        .alloc_region(LEN + 4096, Access::all())
        .unwrap();
    let key = target.remote_key();
    p.client.write(1, &[src.as_sge()], &key, 4096).unwrap();
    expect_ok(&p.client_cq, 1);
    assert!(
        mapped_private(target.addr().wrapping_add(4096)),
        "the pages were mapped, not copied"
    );
    assert!(target.to_vec(4096, LEN).unwrap() == data);
    // The sender overwrites its buffer after completion: the receiver keeps the old bytes.
    src.fill(0, LEN, 0xee).unwrap();
    assert!(target.to_vec(4096, LEN).unwrap() == data);
    // The receiver writes: the sender is unaffected; both write the same page.
    target.write_at(4096, b"target").unwrap();
    src.write_at(3, b"src").unwrap();
    assert_eq!(
        target.to_vec(4096, 8).unwrap(),
        [b"target" as &[u8], &data[6..8]].concat()
    );
    assert_eq!(src.to_vec(0, 8).unwrap(), b"\xee\xee\xeesrc\xee\xee");
    // The rewritten buffer goes again (its bytes move to a new file first), then untouched.
    for (id, seed) in [(2u64, 2u64), (3, 2)] {
        let again = pattern(seed, LEN);
        if id == 2 {
            src.write_at(0, &again).unwrap();
        }
        p.client.write(id, &[src.as_sge()], &key, 4096).unwrap();
        expect_ok(&p.client_cq, id);
        assert!(target.to_vec(4096, LEN).unwrap() == again, "write {id}");
    }
    // The bytes before the exchanged pages were never touched.
    assert_eq!(target.to_vec(0, 4096).unwrap(), vec![0u8; 4096]);
}

#[test]
fn a_sent_message_is_received_by_exchange() {
    let p = pair(true);
    let (src, data) = filled(&p, 3);
    let dst = p.server_ctx.alloc_region(LEN, Access::all()).unwrap();
    p.server.post_recv(7, &[dst.as_sge()]).unwrap();
    p.client.send(8, &[src.as_sge()]).unwrap();
    expect_ok(&p.client_cq, 8);
    assert_eq!(expect_ok(&p.server_cq, 7).byte_len, LEN as u64);
    assert!(mapped_private(dst.addr()));
    src.fill(0, LEN, 0).unwrap();
    assert!(dst.to_vec(0, LEN).unwrap() == data);
}

#[test]
fn pages_outlive_the_sender_region_and_its_endpoint() {
    let p = pair(true);
    let (src, data) = filled(&p, 4);
    let target = p.server_ctx.alloc_region(LEN, Access::all()).unwrap();
    p.client
        .write(1, &[src.as_sge()], &target.remote_key(), 0)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    // The source region is deregistered and freed while its pages are shared.
    drop(src);
    assert!(target.to_vec(0, LEN).unwrap() == data);
    // The sending side goes away entirely.
    let Pair {
        client,
        client_ctx,
        server,
        server_ctx,
        ..
    } = p;
    drop(client);
    drop(client_ctx);
    assert!(target.to_vec(0, LEN).unwrap() == data);
    target.write_at(LEN - 4, b"last").unwrap();
    assert_eq!(
        target.to_vec(LEN - 6, 6).unwrap(),
        [&data[LEN - 6..LEN - 4], b"last"].concat()
    );
    drop((server, server_ctx));
}

#[test]
fn a_target_region_freed_after_exchange_frees_cleanly() {
    let p = pair(true);
    let (src, data) = filled(&p, 5);
    for round in 0..3u64 {
        let target = p.server_ctx.alloc_region(LEN, Access::all()).unwrap();
        p.client
            .write(round, &[src.as_sge()], &target.remote_key(), 0)
            .unwrap();
        expect_ok(&p.client_cq, round);
        assert!(target.to_vec(0, LEN).unwrap() == data);
        // Deregistered while the sender still shares its pages.
    }
    assert!(src.to_vec(0, LEN).unwrap() == data);
}

#[test]
fn without_page_exchange_the_bytes_are_copied() {
    let p = pair(false);
    let (src, data) = filled(&p, 6);
    let target = p.server_ctx.alloc_region(LEN, Access::all()).unwrap();
    p.client
        .write(1, &[src.as_sge()], &target.remote_key(), 0)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    assert!(!mapped_private(target.addr()));
    assert!(target.to_vec(0, LEN).unwrap() == data);
}

#[test]
fn unaligned_and_partial_pages_are_copied_around_the_exchanged_ones() {
    let p = pair(true);
    let (src, data) = filled(&p, 7);
    let target = p.server_ctx.alloc_region(2 * LEN, Access::all()).unwrap();
    let key = target.remote_key();
    // Off the page grid at the target: copied.
    p.client.write(1, &[src.as_sge()], &key, 100).unwrap();
    expect_ok(&p.client_cq, 1);
    assert!(target.to_vec(100, LEN).unwrap() == data);
    // Not whole pages at the source: the plain single copy.
    let part = src.slice(4096, LEN - 8192 + 5).unwrap();
    p.client.write(2, &[part], &key, LEN as u64).unwrap();
    expect_ok(&p.client_cq, 2);
    assert!(target.to_vec(LEN, LEN - 8192 + 5).unwrap()[..] == data[4096..LEN - 4096 + 5]);
}

#[test]
fn over_four_rails_every_page_of_an_aligned_write_is_mapped() {
    // Windows that are not whole pages (as measured rates give): their quarter, the chunk,
    // is not either.
    let p = common::pair_over(RailTransport::Auto, "shm", 4, |o| {
        o.page_exchange = true;
        o.session.initial_window = (12 << 20) + 4100;
    });
    let (src, data) = filled(&p, 8);
    let target = p.server_ctx.alloc_region(LEN, Access::all()).unwrap();
    let key = target.remote_key();
    for id in 0..4u64 {
        p.client.write(id, &[src.as_sge()], &key, 0).unwrap();
        expect_ok(&p.client_cq, id);
        for page in (0..LEN).step_by(64 << 10) {
            assert!(
                mapped_private(target.addr().wrapping_add(page)),
                "write {id}: byte {page} was copied, not mapped"
            );
        }
        assert!(target.to_vec(0, LEN).unwrap() == data, "write {id}");
    }
    let sent = p.client.rail_bytes_sent();
    assert!(sent.iter().filter(|&&b| b > 0).count() > 1, "{sent:?}");
}
