//! Vectored one-sided operations (`write_v`, `read_v`) on real sockets over loopback:
//! scatter/gather lists on both sides, mixed regions (memory and file pages), and failed
//! pieces that fail the whole operation before any byte moves.

mod common;

use braid::{Access, CompletionKind, Region, RemoteSge, Sge, Status};
use common::tmpfile::TempFile;
use common::*;

/// `n` pieces of `len` bytes, every other one skipping a gap, from `region`.
fn strided(region: &Region, n: usize, len: usize, stride: usize) -> Vec<Sge> {
    (0..n)
        .map(|i| region.slice(i * stride, len).unwrap())
        .collect()
}

#[test]
fn many_pieces_both_sides_land_where_the_remote_list_says() {
    let p = pair(4);
    let target = p.server_ctx.alloc_region(4 << 20, Access::all()).unwrap();
    let src = p.client_ctx.alloc_region(4 << 20, Access::all()).unwrap();
    let back = p.client_ctx.alloc_region(4 << 20, Access::all()).unwrap();
    let key = target.remote_key();
    let data = pattern(1, 4 << 20);
    src.write_at(0, &data).unwrap();
    // 256 local pieces of 4 KiB with 4 KiB gaps -> 256 remote pieces of 4 KiB, in reverse
    // order with 8 KiB gaps, plus one large piece of 1 MiB.
    let mut local = strided(&src, 256, 4096, 8192);
    local.push(src.slice(3 << 20, 1 << 20).unwrap());
    let mut remote: Vec<RemoteSge> = (0..256)
        .map(|i| RemoteSge::new(key, (255 - i) as u64 * 12_288, 4096))
        .collect();
    remote.push(RemoteSge::new(key, 3 << 20, 1 << 20));
    p.client.write_v(1, &local, &remote).unwrap();
    let c = expect_ok(&p.client_cq, 1);
    assert_eq!((c.kind, c.byte_len), (CompletionKind::Write, 2 << 20));
    for i in 0..256 {
        let at = (255 - i) * 12_288;
        assert!(
            target.to_vec(at, 4096).unwrap() == data[i * 8192..i * 8192 + 4096],
            "piece {i}"
        );
        // Gaps untouched.
        assert!(
            target
                .to_vec(at + 4096, 8192)
                .unwrap()
                .iter()
                .all(|&b| b == 0)
        );
    }
    assert!(target.to_vec(3 << 20, 1 << 20).unwrap() == data[3 << 20..]);

    // Read the same remote pieces back into a differently shaped local list.
    let local_back = strided(&back, 128, 8192, 16_384);
    let mut local_back = local_back;
    local_back.push(back.slice(3 << 20, 1 << 20).unwrap());
    p.client.read_v(2, &local_back, &remote).unwrap();
    let c = expect_ok(&p.client_cq, 2);
    assert_eq!((c.kind, c.byte_len), (CompletionKind::Read, 2 << 20));
    let mut want = Vec::new();
    for i in 0..256 {
        want.extend_from_slice(&data[i * 8192..i * 8192 + 4096]);
    }
    let mut got = Vec::new();
    for i in 0..128 {
        got.extend(back.to_vec(i * 16_384, 8192).unwrap());
    }
    assert!(got == want);
    assert!(back.to_vec(3 << 20, 1 << 20).unwrap() == data[3 << 20..]);
}

#[test]
fn mixed_memory_and_file_regions_in_one_operation() {
    let p = pair(2);
    let mem = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let fdata = pattern(2, 3 << 20);
    let f = TempFile::with(&fdata);
    let file = p
        .server_ctx
        .register_file(
            &f.file,
            0,
            3 << 20,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    mem.write_at(0, &pattern(3, 1 << 20)).unwrap();
    let (mk, fk) = (mem.remote_key(), file.remote_key());
    let buf = p.client_ctx.alloc_region(4 << 20, Access::all()).unwrap();
    let remote = [
        RemoteSge::new(fk, 100, 2 << 20),
        RemoteSge::new(mk, 5, 1000),
        RemoteSge::new(fk, (2 << 20) + 100, 4096),
    ];
    let total = (2 << 20) + 1000 + 4096;
    p.client
        .read_v(1, &[buf.slice(0, total).unwrap()], &remote)
        .unwrap();
    expect_ok(&p.client_cq, 1);
    let got = buf.to_vec(0, total).unwrap();
    assert!(got[..2 << 20] == fdata[100..(2 << 20) + 100]);
    assert!(got[2 << 20..(2 << 20) + 1000] == mem.to_vec(5, 1000).unwrap());
    assert!(got[(2 << 20) + 1000..] == fdata[(2 << 20) + 100..(2 << 20) + 4196]);

    // Write them back swapped around, check the file with pread.
    let new = pattern(4, total);
    buf.write_at(0, &new).unwrap();
    p.client
        .write_v(2, &[buf.slice(0, total).unwrap()], &remote)
        .unwrap();
    expect_ok(&p.client_cq, 2);
    assert!(f.pread(100, 2 << 20) == new[..2 << 20]);
    assert!(mem.to_vec(5, 1000).unwrap() == new[2 << 20..(2 << 20) + 1000]);
    assert!(f.pread((2 << 20) + 100, 4096) == new[(2 << 20) + 1000..]);
}

#[test]
fn one_bad_piece_fails_the_operation_before_any_byte_moves() {
    let p = pair(2);
    let a = p.server_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    let ro = p
        .server_ctx
        .alloc_region(1 << 20, Access::REMOTE_READ)
        .unwrap();
    a.fill(0, 1 << 20, 0xAA).unwrap();
    let (ak, rok) = (a.remote_key(), ro.remote_key());
    let bad = braid::RemoteKey {
        key: ak.key ^ 0x10000,
        len: ak.len,
    };
    let src = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    src.fill(0, 1 << 20, 0x55).unwrap();
    let cases: Vec<(&str, Vec<RemoteSge>)> = vec![
        (
            "bad key",
            vec![RemoteSge::new(ak, 0, 4096), RemoteSge::new(bad, 0, 4096)],
        ),
        (
            "out of range",
            vec![
                RemoteSge::new(ak, 0, 4096),
                RemoteSge::new(ak, (1 << 20) - 100, 4096),
            ],
        ),
        (
            "missing right",
            vec![RemoteSge::new(ak, 0, 4096), RemoteSge::new(rok, 0, 4096)],
        ),
    ];
    for (i, (what, remote)) in cases.iter().enumerate() {
        let total: u64 = remote.iter().map(|r| r.len).sum();
        let wr = 10 + i as u64;
        p.client
            .write_v(wr, &[src.slice(0, total as usize).unwrap()], remote)
            .unwrap();
        let c = next(&p.client_cq);
        assert_eq!(
            (c.wr_id, c.status),
            (wr, Status::RemoteAccessError),
            "{what}"
        );
        assert!(
            a.to_vec(0, 1 << 20).unwrap().iter().all(|&b| b == 0xAA),
            "{what}: no byte written"
        );
    }
    // Reads: a bad piece fails it too (missing right is fine for reads, so skip that one).
    let back = p.client_ctx.alloc_region(1 << 20, Access::all()).unwrap();
    for (i, (what, remote)) in cases.iter().take(2).enumerate() {
        let total: u64 = remote.iter().map(|r| r.len).sum();
        let wr = 20 + i as u64;
        p.client
            .read_v(wr, &[back.slice(0, total as usize).unwrap()], remote)
            .unwrap();
        let c = next(&p.client_cq);
        assert_eq!(
            (c.wr_id, c.status),
            (wr, Status::RemoteAccessError),
            "{what}"
        );
    }
    // The endpoint is fine afterwards.
    let remote = [RemoteSge::new(ak, 0, 10), RemoteSge::new(rok, 0, 10)];
    p.client
        .read_v(30, &[back.slice(0, 20).unwrap()], &remote)
        .unwrap();
    expect_ok(&p.client_cq, 30);
}

#[test]
fn posts_that_cannot_be_carried_out_are_refused_at_once() {
    let p = pair(1);
    let a = p.server_ctx.alloc_region(4096, Access::all()).unwrap();
    let key = a.remote_key();
    let src = p.client_ctx.alloc_region(4096, Access::all()).unwrap();
    let noright = p.client_ctx.alloc_region(4096, Access::NONE).unwrap();
    let one = [src.slice(0, 100).unwrap()];
    // Totals differ, no pieces, an empty piece, too many pieces, no LOCAL_WRITE for a read.
    assert!(
        p.client
            .write_v(1, &one, &[RemoteSge::new(key, 0, 99)])
            .is_err()
    );
    assert!(p.client.write_v(1, &one, &[]).is_err());
    let empty = [RemoteSge::new(key, 0, 100), RemoteSge::new(key, 0, 0)];
    assert!(p.client.write_v(1, &one, &empty).is_err());
    let many: Vec<RemoteSge> = (0..1025).map(|_| RemoteSge::new(key, 0, 1)).collect();
    let big = [src.slice(0, 1025).unwrap()];
    assert!(p.client.write_v(1, &big, &many).is_err());
    let nr = [noright.slice(0, 100).unwrap()];
    assert!(
        p.client
            .read_v(1, &nr, &[RemoteSge::new(key, 0, 100)])
            .is_err()
    );
    // 1024 pieces are fine.
    let most: Vec<RemoteSge> = (0..1024).map(|i| RemoteSge::new(key, i * 4, 1)).collect();
    p.client
        .write_v(2, &[src.slice(0, 1024).unwrap()], &most)
        .unwrap();
    expect_ok(&p.client_cq, 2);
    assert!(
        p.client_cq.poll().is_none(),
        "refused posts complete nothing"
    );
}
