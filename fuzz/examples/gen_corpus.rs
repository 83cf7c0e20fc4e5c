//! Writes the seed corpus under `fuzz/corpus/<target>/`:
//! `cargo run --manifest-path fuzz/Cargo.toml --example gen_corpus` (from the repository root).
//! Valid frames of every opcode, valid handshake messages, short frame sequences that drive a
//! session through each of its paths (see `fuzz_targets/session_rx.rs` for the input
//! format), and a few truncated inputs.

use std::fs;
use std::path::Path;

use braid_proto::wire::frame::{FLAG_IMM, FLAG_TRAILER};
use braid_proto::wire::handshake::{AuthProof, caps};
use braid_proto::wire::{FrameHeader, HandshakeStatus, Hello, HelloReply, Opcode};

fn hdr(op: Opcode, seq: u64, rkey: u64, addr: u64, arg0: u64, arg1: u64, len: u32) -> FrameHeader {
    let mut h = FrameHeader::new(op);
    (h.seq, h.rkey, h.addr, h.arg0, h.arg1, h.payload_len) = (seq, rkey, addr, arg0, arg1, len);
    h
}

/// CRC32C (Castagnoli), bitwise: enough for a few seeds.
fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// One session_rx input: a configuration byte, then (ctl, header, payload) records.
struct Seq(Vec<u8>);

impl Seq {
    fn new(cfg: u8) -> Seq {
        Seq(vec![cfg])
    }
    fn frame(self, ctl: u8, h: FrameHeader) -> Seq {
        let payload: Vec<u8> = (0..h.payload_len)
            .map(|i| (i as u8).wrapping_mul(7) ^ 0x5a)
            .collect();
        self.frame_with(ctl, h, &payload)
    }
    fn frame_with(mut self, ctl: u8, h: FrameHeader, payload: &[u8]) -> Seq {
        self.0.push(ctl);
        self.0.extend_from_slice(&h.encode());
        self.0.extend_from_slice(payload);
        self
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::write(dir.join(name), bytes).unwrap();
}

/// An express header carrying immediate 7.
fn imm_express(mut h: FrameHeader) -> FrameHeader {
    h.flags = FLAG_IMM;
    h.aux = 7;
    h
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let dirs = ["frame_header", "handshake", "session_rx", "fs_proto", "fs_handle"].map(|d| {
        let p = root.join(d);
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        p
    });

    // ------------------------------------------------------------------ frame_header
    let d = &dirs[0];
    let mut imm = hdr(
        Opcode::Write,
        7,
        0xdead_beef_0001,
        1 << 20,
        1 << 16,
        8192,
        4096,
    );
    imm.flags = FLAG_IMM;
    imm.aux = 42;
    imm.crc = 0x1234_5678;
    imm.rail_ack = 99;
    let mut atomic_resp = hdr(Opcode::AtomicResponse, 3, 0, 0, 77, 0, 0);
    atomic_resp.aux = 1;
    let frames = [
        ("write", hdr(Opcode::Write, 0, 1, 0, 100, 0, 100)),
        ("write_imm", imm),
        ("send", hdr(Opcode::Send, 1, 0, 0, 64, 32, 32)),
        (
            "read_request",
            hdr(Opcode::ReadRequest, 2, 1, 16, 4096, 0, 0),
        ),
        ("fetch_add", hdr(Opcode::FetchAdd, 3, 1, 8, 1, 0, 0)),
        ("compare_swap", hdr(Opcode::CompareSwap, 4, 1, 16, 0, 5, 0)),
        (
            "read_response",
            hdr(Opcode::ReadResponse, 2, 0, 0, 4096, 4000, 96),
        ),
        ("atomic_response", atomic_resp),
        ("done", hdr(Opcode::Done, 0, 0, 0, 0, 0, 0)),
        ("rail_ack", {
            let mut h = FrameHeader::new(Opcode::RailAck);
            h.rail_ack = 1 << 20;
            h
        }),
        ("close", FrameHeader::new(Opcode::Close)),
        (
            "express_write_imm",
            imm_express(hdr(Opcode::Express, 5, 1, 64, 2, 0, 8)),
        ),
        ("express_send", hdr(Opcode::Express, 6, 0, 0, 0, 1, 512)),
        ("express_answer", {
            let mut h = hdr(Opcode::ExpressAnswer, 0, 0, 0, 3, 0, 0);
            h.aux = 1;
            h
        }),
        (
            "max_payload",
            hdr(Opcode::Write, 9, 1, 0, 16 << 20, 0, 16 << 20),
        ),
        ("write_v", hdr(Opcode::WriteV, 10, 0, 0, 4096, 3, 72)),
        (
            "read_v",
            hdr(Opcode::ReadV, 11, 0, 0, 1 << 20, 256, 256 * 24),
        ),
        (
            "write_v_data",
            hdr(Opcode::WriteVData, 10, 0, 0, 4096, 1024, 1024),
        ),
        ("read_response_trailer", {
            let mut h = hdr(Opcode::ReadResponse, 2, 0, 0, 4096, 0, 4096);
            h.flags = FLAG_TRAILER;
            h.aux = 1;
            h
        }),
    ];
    for (name, h) in frames {
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h), "{name}");
        write(d, name, &h.encode());
    }
    write(d, "truncated_10", &imm.encode()[..10]);
    write(d, "truncated_63", &imm.encode()[..63]);
    write(d, "empty", b"");

    // ------------------------------------------------------------------ handshake
    let d = &dirs[1];
    let hello = Hello {
        version: braid_proto::wire::handshake::HANDSHAKE_VERSION,
        rail_index: 1,
        rail_count: 4,
        capabilities: caps::PAYLOAD_CRC32C | caps::AUTH,
        max_chunk: 128 << 10,
        session_id: 0x1234_5678_9abc_def0,
        nonce: *b"0123456789abcdef",
        same_host: None,
    };
    write(d, "hello", &hello.encode());
    write(
        d,
        "hello_same_host",
        &Hello {
            capabilities: caps::SAME_HOST,
            same_host: Some(braid_proto::wire::SameHostOffer {
                host: 0x0123_4567_89ab_cdef,
                token: 42,
            }),
            ..hello
        }
        .encode(),
    );
    write(
        d,
        "hello_plain",
        &Hello {
            capabilities: 0,
            nonce: [0; 16],
            ..hello
        }
        .encode(),
    );
    for (name, status) in [
        ("reply_accepted", HandshakeStatus::Accepted),
        ("reply_version", HandshakeStatus::VersionUnsupported),
        ("reply_bad_rail", HandshakeStatus::BadRail),
        ("reply_refused", HandshakeStatus::Refused),
        ("reply_auth_required", HandshakeStatus::AuthRequired),
        ("reply_auth_failed", HandshakeStatus::AuthFailed),
    ] {
        let r = HelloReply {
            version: braid_proto::wire::handshake::HANDSHAKE_VERSION,
            rail_index: 1,
            rail_count: 4,
            status,
            capabilities: 0,
            max_chunk: 128 << 10,
            session_id: 0x1234_5678_9abc_def0,
            auth: [0xa5; 32],
        };
        assert_eq!(HelloReply::decode(&r.encode()), Ok(r));
        write(d, name, &r.encode());
    }
    write(d, "auth_proof", &AuthProof { mac: [0x3c; 32] }.encode());
    write(d, "hello_truncated", &hello.encode()[..39]);
    write(d, "http", b"GET / HTTP/1.1\r\nHost: braid\r\n\r\n");

    // ------------------------------------------------------------------ session_rx
    // rkey 0: rw region (all rights, 1000 bytes); 1: read-only (200); 2: local-write only
    // (512); 3: revoked. Our own posted operations are seq 0..=6: write 150 B, read 100 B,
    // fetch-add, compare-swap, send 20 B with imm, zero-length read, write 70 B with imm.
    // Posted receives: 64 B, 16+0+48 B, 32 B.
    let d = &dirs[2];
    let imm_of = |mut h: FrameHeader, v: u32| {
        h.flags = FLAG_IMM;
        h.aux = v;
        h
    };
    let seeds: Vec<(&str, Seq)> = vec![
        (
            "write_one_chunk",
            Seq::new(0).frame(0x40, hdr(Opcode::Write, 0, 0, 100, 16, 0, 16)),
        ),
        (
            "write_two_rails",
            Seq::new(1)
                .frame(0, hdr(Opcode::Write, 0, 0, 0, 96, 64, 32))
                .frame(1, hdr(Opcode::Write, 0, 0, 0, 96, 0, 64))
                .frame(0x41, hdr(Opcode::Write, 1, 0, 500, 8, 0, 8)),
        ),
        (
            "write_imm",
            Seq::new(0).frame(0x40, imm_of(hdr(Opcode::Write, 0, 0, 40, 24, 0, 24), 5)),
        ),
        (
            "send_imm_scattered",
            Seq::new(0)
                .frame(0, imm_of(hdr(Opcode::Send, 0, 0, 0, 20, 0, 20), 1))
                .frame(0, hdr(Opcode::Send, 1, 0, 0, 64, 0, 40))
                .frame(0x40, hdr(Opcode::Send, 1, 0, 0, 64, 40, 24)),
        ),
        (
            "send_too_long",
            Seq::new(0).frame(0x40, hdr(Opcode::Send, 0, 0, 0, 100, 0, 100)),
        ),
        (
            "send_waits_for_recv",
            Seq::new(0)
                .frame(0, hdr(Opcode::Send, 0, 0, 0, 4, 0, 4))
                .frame(0, hdr(Opcode::Send, 1, 0, 0, 4, 0, 4))
                .frame(0, hdr(Opcode::Send, 2, 0, 0, 4, 0, 4))
                .frame(0x80, hdr(Opcode::Send, 3, 0, 0, 4, 0, 4))
                .frame(0xc0, FrameHeader::new(Opcode::RailAck)),
        ),
        (
            "read_request",
            Seq::new(0)
                .frame(0x40, hdr(Opcode::ReadRequest, 0, 1, 10, 150, 0, 0))
                .frame(0x40, hdr(Opcode::ReadRequest, 1, 0, 0, 0, 0, 0)),
        ),
        (
            "write_after_read_waits",
            Seq::new(1)
                .frame(0, hdr(Opcode::ReadRequest, 0, 0, 0, 200, 0, 0))
                .frame(1, hdr(Opcode::Write, 1, 0, 100, 8, 0, 8))
                .frame(0x40, FrameHeader::new(Opcode::RailAck))
                .frame(0x40, FrameHeader::new(Opcode::RailAck)),
        ),
        (
            "atomics",
            Seq::new(0)
                .frame(0, hdr(Opcode::FetchAdd, 0, 0, 8, 3, 0, 0))
                .frame(0, hdr(Opcode::CompareSwap, 1, 0, 8, 3, 9, 0))
                .frame(0, hdr(Opcode::FetchAdd, 2, 0, 12, 1, 0, 0))
                .frame(0x40, hdr(Opcode::FetchAdd, 3, 1, 8, 1, 0, 0)),
        ),
        (
            "access_errors",
            Seq::new(0)
                .frame(0, hdr(Opcode::Write, 0, 1, 0, 16, 0, 16))
                .frame(0, hdr(Opcode::Write, 1, 3, 0, 16, 0, 16))
                .frame(0, hdr(Opcode::Write, 2, 0, 990, 16, 0, 16))
                .frame(0, hdr(Opcode::ReadRequest, 3, 2, 0, 16, 0, 0))
                .frame(0x40, imm_of(hdr(Opcode::Write, 4, 1, 0, 8, 0, 8), 2)),
        ),
        (
            "out_of_order_rails",
            Seq::new(2)
                .frame(2, hdr(Opcode::Write, 2, 0, 0, 8, 0, 8))
                .frame(1, hdr(Opcode::Write, 1, 0, 8, 8, 0, 8))
                .frame(0x40, hdr(Opcode::Write, 0, 0, 16, 8, 0, 8)),
        ),
        (
            "responses",
            Seq::new(1)
                .frame(0x40, FrameHeader::new(Opcode::RailAck))
                .frame(0, hdr(Opcode::Done, 0, 0, 0, 0, 0, 0))
                .frame(0, hdr(Opcode::ReadResponse, 1, 0, 0, 100, 0, 50))
                .frame(1, hdr(Opcode::ReadResponse, 1, 0, 0, 100, 50, 50))
                .frame(0, {
                    let mut h = hdr(Opcode::AtomicResponse, 2, 0, 0, 41, 0, 0);
                    h.aux = 0;
                    h
                })
                .frame(1, {
                    let mut h = hdr(Opcode::AtomicResponse, 3, 0, 0, 0, 0, 0);
                    h.aux = 1;
                    h
                })
                .frame(0, hdr(Opcode::Done, 4, 0, 0, 0, 0, 0))
                .frame(0, hdr(Opcode::Done, 5, 0, 0, 0, 0, 0))
                .frame(0x40, {
                    let mut h = hdr(Opcode::Done, 6, 0, 0, 0, 0, 0);
                    h.aux = 2;
                    h
                }),
        ),
        (
            "acked_rail",
            Seq::new(0)
                .frame(0x40, FrameHeader::new(Opcode::RailAck))
                .frame(0x40, {
                    let mut h = FrameHeader::new(Opcode::RailAck);
                    h.rail_ack = 64;
                    h
                }),
        ),
        (
            "close",
            Seq::new(0).frame(0, FrameHeader::new(Opcode::Close)),
        ),
        (
            "duplicate_request",
            Seq::new(0)
                .frame(0, hdr(Opcode::FetchAdd, 0, 0, 8, 1, 0, 0))
                .frame(0, hdr(Opcode::FetchAdd, 0, 0, 8, 1, 0, 0)),
        ),
        (
            "inconsistent_chunk",
            Seq::new(0)
                .frame(0, hdr(Opcode::Write, 0, 0, 0, 64, 0, 32))
                .frame(0, hdr(Opcode::Write, 0, 0, 8, 64, 32, 32)),
        ),
        ("crc_ok", {
            let p: Vec<u8> = (0..32u8).collect();
            let mut h = hdr(Opcode::Write, 0, 0, 0, 32, 0, 32);
            h.crc = crc32c(&p);
            Seq::new(0x10).frame_with(0x40, h, &p)
        }),
        ("crc_bad", {
            let mut h = hdr(Opcode::Write, 0, 0, 0, 32, 0, 32);
            h.crc = 1;
            Seq::new(0x10).frame(0x40, h)
        }),
    ];
    // Vectored requests and file pages (version 2): key 4 is the file region (600 bytes of
    // file under 1000 registered), keys inside a list are rewritten like header keys.
    let sgl = |entries: &[(u64, u64, u64)]| -> Vec<u8> {
        entries
            .iter()
            .flat_map(|&(k, a, l)| [k, a, l])
            .flat_map(u64::to_le_bytes)
            .collect()
    };
    let desc = |op: Opcode, seq: u64, entries: &[(u64, u64, u64)]| {
        let total = entries.iter().map(|e| e.2).sum();
        hdr(
            op,
            seq,
            0,
            0,
            total,
            entries.len() as u64,
            (entries.len() * 24) as u32,
        )
    };
    let trailer = |mut h: FrameHeader| {
        h.flags |= FLAG_TRAILER;
        h
    };
    let v2 = [
        ("writev", {
            let e = [(0, 10, 30), (4, 100, 50), (0, 500, 20)];
            Seq::new(1)
                .frame_with(0, desc(Opcode::WriteV, 0, &e), &sgl(&e))
                .frame(1, hdr(Opcode::WriteVData, 0, 0, 0, 100, 60, 40))
                .frame(0x40, hdr(Opcode::WriteVData, 0, 0, 0, 100, 0, 60))
        }),
        ("writev_bad_piece", {
            let e = [(0, 10, 30), (1, 0, 10)];
            Seq::new(0)
                .frame_with(0, desc(Opcode::WriteV, 0, &e), &sgl(&e))
                .frame(0x40, hdr(Opcode::WriteVData, 0, 0, 0, 40, 0, 40))
        }),
        ("readv", {
            let e = [(1, 0, 50), (4, 500, 90), (0, 0, 8)];
            Seq::new(0).frame_with(0x40, desc(Opcode::ReadV, 0, &e), &sgl(&e))
        }),
        ("readv_past_eof", {
            let e = [(4, 590, 20)];
            Seq::new(0).frame_with(0x40, desc(Opcode::ReadV, 0, &e), &sgl(&e))
        }),
        (
            "file_read_trailer",
            Seq::new(2)
                .frame(0x40, hdr(Opcode::ReadRequest, 0, 4, 0, 300, 0, 0))
                .frame(0x40, FrameHeader::new(Opcode::RailAck)),
        ),
        (
            "file_read_fault",
            Seq::new(0).frame(0x60, hdr(Opcode::ReadRequest, 0, 4, 100, 200, 0, 0)),
        ),
        (
            "file_write_fault",
            Seq::new(0)
                .frame(0x20, hdr(Opcode::Write, 0, 4, 0, 64, 0, 32))
                .frame(0x40, hdr(Opcode::Write, 0, 4, 0, 64, 32, 32)),
        ),
        ("file_write_crc", {
            let p: Vec<u8> = (0..32u8).collect();
            let mut h = hdr(Opcode::Write, 0, 4, 0, 32, 0, 32);
            h.crc = crc32c(&p);
            Seq::new(0x10).frame_with(0x40, h, &p)
        }),
        (
            "responses_v",
            Seq::new(1)
                .frame(0x40, FrameHeader::new(Opcode::RailAck))
                .frame(0, hdr(Opcode::Done, 7, 0, 0, 0, 0, 0))
                .frame(0, trailer(hdr(Opcode::ReadResponse, 8, 0, 0, 30, 0, 10)))
                .frame(1, trailer(hdr(Opcode::Done, 8, 0, 0, 0, 0, 0)))
                .frame(0x40, {
                    let mut h = trailer(hdr(Opcode::ReadResponse, 8, 0, 0, 30, 10, 20));
                    h.aux = 1;
                    h
                }),
        ),
    ];
    // Express frames (one rail). With 0x20 the session's own requests 0 and 1 are express
    // ones (a write with immediate, a send), which the peer's frames answer.
    let express = vec![
        (
            "express_write_imm",
            Seq::new(0).frame(0x40, imm_express(hdr(Opcode::Express, 0, 0, 100, 0, 0, 8))),
        ),
        (
            "express_sends",
            Seq::new(0)
                .frame(0, hdr(Opcode::Express, 0, 0, 0, 0, 1, 16))
                .frame(0x40, hdr(Opcode::Express, 1, 0, 0, 0, 1, 100)),
        ),
        (
            "express_answered",
            Seq::new(0x20)
                .frame(0, imm_express(hdr(Opcode::Express, 0, 0, 8, 1, 0, 4)))
                .frame(0x40, {
                    let mut h = hdr(Opcode::ExpressAnswer, 0, 0, 0, 1, 0, 0);
                    h.aux = 2;
                    h
                }),
        ),
        (
            "express_then_framed",
            Seq::new(0x20)
                .frame(0, hdr(Opcode::Express, 0, 0, 200, 2, 0, 8))
                .frame(0x40, hdr(Opcode::Write, 1, 0, 0, 32, 0, 32)),
        ),
    ];
    for (name, s) in seeds.into_iter().chain(v2).chain(express) {
        write(d, name, &s.0);
    }
    let long = Seq::new(0)
        .frame(0, hdr(Opcode::Write, 0, 0, 0, 64, 0, 64))
        .0;
    write(d, "truncated_payload", &long[..long.len() - 10]);
    write(d, "truncated_header", &long[..30]);

    // ------------------------------------------------------------------ fs_proto
    {
        use braid_fs::proto::{
            Attr, Caller, Creds, Entry, Errno, NodeId, Op, Reply, Request, SetAttr, TimeSet,
            encode_reply, encode_request,
        };
        let d = &dirs[3];
        let node = NodeId { id: 7, generation: 0x1234 };
        let creds = Creds { uid: 1000, gid: 100, umask: 0o022 };
        let reqs = [
            ("lookup", Request::Lookup { parent: node, name: b"name".to_vec() }),
            ("walk", Request::Walk { parent: node, path: b"a/../b".to_vec(), follow: true }),
            ("forget", Request::Forget { items: vec![(node, 3)] }),
            ("setattr", Request::SetAttr { node, fh: 2, set: SetAttr { mode: Some(0o600), size: Some(9), mtime: TimeSet::Now, ..Default::default() } }),
            ("create", Request::Create { parent: node, name: b"f".to_vec(), mode: 0o644, flags: 2, creds }),
            ("rename", Request::Rename { parent: node, name: b"a".to_vec(), new_parent: node, new_name: b"b".to_vec(), flags: 1 }),
            ("write", Request::Write { fh: 1, offset: 4096, data: b"data".to_vec() }),
            ("readdir", Request::ReadDir { dh: 1, offset: 0, max_bytes: 4096 }),
        ];
        for (name, r) in reqs {
            fs::write(d.join(format!("req_{name}")), encode_request(1, &Caller::new(1000, 100, vec![4, 27]), &r).unwrap()).unwrap();
        }
        let entry = Entry { node, attr: Attr { size: 5, mode: 0o100644, nlink: 1, ..Default::default() } };
        let reps = [
            ("entry", Op::Lookup, Ok(Reply::Entry(entry))),
            ("error", Op::Open, Err(Errno::ENOENT)),
            ("dir", Op::ReadDir, Ok(Reply::Dir(vec![braid_fs::proto::DirEntry { ino: 3, next_offset: 9, file_type: 0o40000, name: b"d".to_vec() }], true))),
        ];
        for (name, op, r) in reps {
            fs::write(d.join(format!("rep_{name}")), encode_reply(2, op, &r).unwrap()).unwrap();
        }
    }

    // ------------------------------------------------------------------ fs_handle
    {
        use braid_fs::proto::{Caller, Creds, NodeId, Request, SetAttr, encode_request};
        let d = &dirs[4];
        // Generation 0: the harness gives it the export's. Ids are handed out in order: the
        // root is 1, the next object looked up or created 2, and so on; handles count from 1.
        let n = |id| NodeId { id, generation: 0 };
        let creds = Creds { uid: 1000, gid: 100, umask: 0o022 };
        let name = |s: &str| s.as_bytes().to_vec();
        let seqs: Vec<(&str, Vec<Request>)> = vec![
            ("create_write_map", vec![
                Request::Create { parent: n(1), name: name("new"), mode: 0o644, flags: 2, creds },
                Request::Write { fh: 1, offset: 4096, data: b"data".to_vec() },
                Request::MapRegion { fh: 1, min_size: 1 << 20 },
                Request::Landed { fh: 1, upto: 1 << 20 },
                Request::Commit { fh: 1, flags: 0 },
                Request::SetAttr { node: n(2), fh: 1, set: SetAttr { size: Some(3), ..Default::default() } },
                Request::Release { fh: 1 },
            ]),
            ("special_files", vec![
                Request::Lookup { parent: n(1), name: name("fifo") },
                Request::Open { node: n(2), flags: 2 },
                Request::Create { parent: n(1), name: name("fifo"), mode: 0o644, flags: 2, creds },
                Request::Mknod { parent: n(1), name: name("blk"), mode: 0o60644, rdev: 7 << 8, creds },
                Request::Mknod { parent: n(1), name: name("sock"), mode: 0o140644, rdev: 0, creds },
                Request::Create { parent: n(1), name: name("suid"), mode: 0o6755, flags: 2, creds },
            ]),
            ("dirs_links", vec![
                Request::Mkdir { parent: n(1), name: name("d"), mode: 0o2755, creds },
                Request::OpenDir { node: n(2) },
                Request::ReadDir { dh: 1, offset: 0, max_bytes: 4096 },
                Request::Symlink { parent: n(2), name: name("up"), target: name("../../outside"), creds },
                Request::Walk { parent: n(1), path: name("d/up/secret"), follow: true },
                Request::Walk { parent: n(1), path: name("out"), follow: true },
                Request::Lookup { parent: n(1), name: name("file") },
                Request::Link { node: n(4), new_parent: n(2), new_name: name("hard") },
                Request::Rename { parent: n(2), name: name("hard"), new_parent: n(1), new_name: name("moved"), flags: 0 },
                Request::Unlink { parent: n(1), name: name("moved") },
                Request::ReleaseDir { dh: 1 },
                Request::Rmdir { parent: n(1), name: name("d") },
                Request::Forget { items: vec![(n(2), 1), (n(4), 9)] },
                Request::StatFs,
            ]),
        ];
        for (file, reqs) in seqs {
            let mut out = Vec::new();
            for (i, r) in reqs.iter().enumerate() {
                let m = encode_request(i as u64, &Caller::default(), r).unwrap();
                out.extend_from_slice(&(m.len() as u16).to_le_bytes());
                out.extend_from_slice(&m);
            }
            fs::write(d.join(file), out).unwrap();
        }
    }
}
