//! Deterministic simulation of file regions and vectored operations with injected faults:
//! the driver plays a truncation under a frame (the sender pads the payload and calls
//! `transmit_faulted`, the receiver calls `payload_fault` and drops the rest), with random
//! rates, reordering over rails and rail loss. Invariants: exactly one completion per
//! operation; an operation fails exactly when a fault hit one of its frames (with
//! `LocalAccessError` when it hit the initiator's own file pages, else `RemoteAccessError`);
//! every successful read returns what the model holds, every successful write lands where
//! its remote list says. `BRAID_SIM_SEED=n` replays one seed.

mod sim;
#[path = "../../braid/tests/common/tmpfile.rs"]
#[allow(dead_code)]
mod tmpfile;

use std::collections::VecDeque;
use std::time::Duration;

use braid_proto::wire::Opcode;
use braid_proto::{Access, CompletionKind, Region, RemoteKey, RemoteSge, Status};
use braid_proto::{Request, SessionConfig};
use sim::{Rng, Sim, random_sgl, rng, seeds};
use tmpfile::TempFile;

const A: usize = 0;
const B: usize = 1;
/// The target's file region and memory region.
const FLEN: usize = 192 << 10;
const MLEN: usize = 64 << 10;
/// The initiator's file (a source of writes).
const LLEN: usize = 64 << 10;

/// Target memory: 0 = the file region, 1 = the memory region.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mem {
    File,
    Ram,
}

struct Expect {
    wr: u64,
    kind: CompletionKind,
    /// Remote pieces in list order.
    pieces: Vec<(Mem, usize, usize)>,
    /// Write: the bytes sent. Read: the destination.
    data: Option<Vec<u8>>,
    dst: Option<(Region, Vec<braid_proto::Sge>)>,
    _src: Option<Region>,
}

/// The target's memory as the model knows it: a byte, or `None` where a failed write may
/// have left anything.
struct Model {
    file: Vec<Option<u8>>,
    ram: Vec<Option<u8>>,
}

impl Model {
    fn mem(&mut self, m: Mem) -> &mut Vec<Option<u8>> {
        match m {
            Mem::File => &mut self.file,
            Mem::Ram => &mut self.ram,
        }
    }
}

fn cfg(rng: &mut Rng) -> SessionConfig {
    let min_window = rng.log_range(16 << 10, 1 << 20);
    SessionConfig {
        chunk_size: rng.log_range(512, 128 << 10) as usize,
        min_window,
        initial_window: min_window,
        max_window: rng.log_range(min_window, 8 << 20),
        ack_threshold: rng.log_range(4 << 10, min_window / 2),
        relaxed_placement: rng.chance(0.5),
        ..SessionConfig::default()
    }
}

/// Pieces totalling `len` over both target regions (disjoint when `disjoint`).
fn pieces(rng: &mut Rng, len: usize, disjoint: bool) -> Vec<(Mem, usize, usize)> {
    let k = rng.urange(1, len.min(12));
    let mut left = len;
    let mut out = Vec::new();
    // Disjoint: each piece gets its own slot of the region.
    let slot = |m: Mem| if m == Mem::File { FLEN / 12 } else { MLEN / 12 };
    let mut used = [Vec::new(), Vec::new()];
    for i in 0..k {
        let l = if i == k - 1 {
            left
        } else {
            rng.urange(1, left - (k - 1 - i))
        };
        left -= l;
        let mut m = if rng.chance(0.7) { Mem::File } else { Mem::Ram };
        if disjoint && l > slot(m) {
            m = Mem::File;
        }
        let size = if m == Mem::File { FLEN } else { MLEN };
        let at = if disjoint && l <= slot(m) {
            let free: Vec<usize> = (0..12).filter(|s| !used[m as usize].contains(s)).collect();
            let s = *rng.pick(&free);
            used[m as usize].push(s);
            s * slot(m) + rng.urange(0, slot(m) - l)
        } else {
            rng.urange(0, size - l)
        };
        out.push((m, at, l));
    }
    if disjoint {
        // A piece too large for a slot may overlap another: keep such lists to one piece.
        let overlap = out.iter().enumerate().any(|(i, a)| {
            out.iter()
                .skip(i + 1)
                .any(|b| a.0 == b.0 && a.1 < b.1 + b.2 && b.1 < a.1 + a.2)
        });
        if overlap {
            return vec![(Mem::File, rng.urange(0, FLEN - len), len)];
        }
    }
    out
}

fn case(seed: u64) -> (usize, usize) {
    let mut rng = rng(seed ^ 0x5707_0000);
    let ctx = |what: &str| format!("seed {seed} ({what}); replay with BRAID_SIM_SEED={seed}");
    let rails = rng.urange(1, 4);
    let rates: Vec<Option<f64>> = (0..rails)
        .map(|_| rng.chance(0.4).then(|| rng.range(20, 2000) as f64))
        .collect();
    let latency = Duration::from_micros(rng.range(0, 100));
    // Payload CRCs are negotiated: both sides or neither.
    let crc = rng.chance(0.3);
    let (mut ca, mut cb) = (cfg(&mut rng), cfg(&mut rng));
    (ca.payload_crc, cb.payload_crc) = (crc, crc);
    let mut sim = Sim::with(seed, rates, latency, ca, cb);
    sim.opts.fault_rate = *rng.pick(&[0.0, 0.02, 0.1, 0.3]);
    sim.opts.max_read = rng.log_range(64, 1 << 20) as usize;

    let fdata = rng.bytes(FLEN);
    let file = TempFile::with(&fdata);
    let fregion =
        sim.sides[B].alloc_file(&file.file, FLEN, Access::REMOTE_READ | Access::REMOTE_WRITE);
    let ram = sim.sides[B].alloc(MLEN, Access::all());
    let rdata = rng.bytes(MLEN);
    ram.write_at(0, &rdata).unwrap();
    let ldata = rng.bytes(LLEN);
    let lfile = TempFile::with(&ldata);
    let local_file = sim.sides[A].alloc_file(&lfile.file, LLEN, Access::NONE);
    let keys = [fregion.remote_key(), ram.remote_key()];
    let key = |m: Mem| -> RemoteKey { keys[m as usize] };
    let mut model = Model {
        file: fdata.iter().map(|&b| Some(b)).collect(),
        ram: rdata.iter().map(|&b| Some(b)).collect(),
    };

    let mut pending: VecDeque<Expect> = VecDeque::new();
    let mut ops_left = rng.urange(10, 50);
    let mut next_wr = 0u64;
    let mut seen = 0;
    let mut losses_left = if rails > 1 && rng.chance(0.4) {
        rng.urange(1, rails - 1)
    } else {
        0
    };
    let (mut failed, mut ok) = (0, 0);
    let mut steps = 0u64;
    let mut idle = 0u32;
    loop {
        steps += 1;
        assert!(
            steps < 2_000_000,
            "{}\n{}",
            ctx("no progress"),
            sim.describe()
        );
        if ops_left > 0 && pending.len() < 16 && rng.chance(0.1) {
            let wr = next_wr;
            let len = rng.log_range(1, 48 << 10) as usize;
            let choice = rng.below(100);
            // Writes avoid the ranges of reads still outstanding (see proto_sim.rs).
            let busy: Vec<(Mem, usize, usize)> = pending
                .iter()
                .filter(|e| e.kind == CompletionKind::Read)
                .flat_map(|e| e.pieces.iter().copied())
                .collect();
            let write_pieces = pieces(&mut rng, len, true);
            let clash = write_pieces.iter().any(|&(m, a, l)| {
                busy.iter()
                    .any(|&(bm, ba, bl)| bm == m && a < ba + bl && ba < a + l)
            });
            let (req, e) = if choice < 50 && !clash {
                // A write (vectored or not), from memory or from the initiator's own file.
                let from_file = choice < 20 && len <= LLEN;
                let (src, data, sgl) = if from_file {
                    let off = rng.urange(0, LLEN - len);
                    let sgl = random_sgl(&mut rng, &local_file, off, len, 3);
                    (None, ldata[off..off + len].to_vec(), sgl)
                } else {
                    let data = rng.bytes(len);
                    let src = sim.sides[A].alloc(len + 1, Access::NONE);
                    src.write_at(0, &data).unwrap();
                    let sgl = random_sgl(&mut rng, &src, 0, len, 3);
                    (Some(src), data, sgl)
                };
                let remote: Vec<RemoteSge> = write_pieces
                    .iter()
                    .map(|&(m, a, l)| RemoteSge::new(key(m), a as u64, l as u64))
                    .collect();
                let req = if remote.len() == 1 && rng.chance(0.5) {
                    Request::Write {
                        local: sgl,
                        rkey: remote[0].key.key,
                        addr: remote[0].offset,
                        imm: None,
                    }
                } else {
                    Request::WriteV { local: sgl, remote }
                };
                let e = Expect {
                    wr,
                    kind: CompletionKind::Write,
                    pieces: write_pieces,
                    data: Some(data),
                    dst: None,
                    _src: src,
                };
                (req, e)
            } else {
                let read_pieces = pieces(&mut rng, len, false);
                let dst = sim.sides[A].alloc(len + 64, Access::LOCAL_WRITE);
                let off = rng.urange(0, 63);
                let sgl = random_sgl(&mut rng, &dst, off, len, 3);
                let remote: Vec<RemoteSge> = read_pieces
                    .iter()
                    .map(|&(m, a, l)| RemoteSge::new(key(m), a as u64, l as u64))
                    .collect();
                let req = if remote.len() == 1 && rng.chance(0.5) {
                    Request::Read {
                        local: sgl.clone(),
                        rkey: remote[0].key.key,
                        addr: remote[0].offset,
                    }
                } else {
                    Request::ReadV {
                        local: sgl.clone(),
                        remote,
                    }
                };
                let e = Expect {
                    wr,
                    kind: CompletionKind::Read,
                    pieces: read_pieces,
                    data: None,
                    dst: Some((dst, sgl)),
                    _src: None,
                };
                (req, e)
            };
            let seq = sim.sides[A]
                .session
                .post(wr, req)
                .unwrap_or_else(|e| panic!("{}: {e:?}", ctx("post")));
            assert_eq!(seq, wr, "the initiator numbers its operations 0, 1, 2, ...");
            pending.push_back(e);
            next_wr += 1;
            ops_left -= 1;
        }
        if losses_left > 0 && rng.chance(1.0 / 3000.0) {
            let alive: Vec<usize> = (0..rails)
                .filter(|&r| (0..2).all(|s| sim.sides[s].session.rail_alive(r)))
                .collect();
            if alive.len() > 1 {
                let rail = *rng.pick(&alive);
                let side = rng.urange(0, 1);
                sim.lose_rail(side, rail);
                losses_left -= 1;
            }
        }
        let progressed = sim.step();
        while seen < sim.sides[A].completions.len() {
            let c = sim.sides[A].completions[seen].clone();
            seen += 1;
            let e = pending
                .pop_front()
                .unwrap_or_else(|| panic!("{}: unexpected completion {c:?}", ctx("op")));
            // What the injected faults say this operation must end with.
            let hit = |side: usize, tx: bool| {
                sim.sides[side].faults.iter().any(|(t, h)| {
                    *t == tx
                        && h.seq == e.wr
                        && matches!(
                            h.opcode,
                            Opcode::Write | Opcode::WriteVData | Opcode::ReadResponse
                        )
                })
            };
            let want = if hit(A, true) {
                Status::LocalAccessError
            } else if hit(B, true) || hit(B, false) {
                Status::RemoteAccessError
            } else {
                Status::Success
            };
            let total: usize = e.pieces.iter().map(|p| p.2).sum();
            assert_eq!(
                (c.wr_id, c.kind, c.status, c.byte_len),
                (
                    e.wr,
                    e.kind,
                    want,
                    if want.is_ok() { total as u64 } else { 0 }
                ),
                "{}",
                ctx("completion")
            );
            if want.is_ok() {
                ok += 1;
            } else {
                failed += 1;
            }
            match (e.kind, c.status.is_ok()) {
                (CompletionKind::Write, true) => {
                    let data = e.data.as_ref().unwrap();
                    let mut at = 0;
                    for &(m, a, l) in &e.pieces {
                        for i in 0..l {
                            model.mem(m)[a + i] = Some(data[at + i]);
                        }
                        at += l;
                    }
                }
                (CompletionKind::Write, false) => {
                    // Bytes before the fault may have been placed (zeros in place of the
                    // initiator's lost pages, or the data).
                    for &(m, a, l) in &e.pieces {
                        model.mem(m)[a..a + l].fill(None);
                    }
                }
                (CompletionKind::Read, true) => {
                    let (_, sgl) = e.dst.as_ref().unwrap();
                    let mut got = Vec::new();
                    for s in sgl {
                        got.extend(s.region.to_vec(s.offset, s.len).unwrap());
                    }
                    let mut at = 0;
                    for &(m, a, l) in &e.pieces {
                        for i in 0..l {
                            if let Some(b) = model.mem(m)[a + i] {
                                assert_eq!(
                                    got[at + i],
                                    b,
                                    "{}: read {} byte {} ({m:?} {})",
                                    ctx("read data"),
                                    e.wr,
                                    at + i,
                                    a + i
                                );
                            }
                        }
                        at += l;
                    }
                }
                _ => {}
            }
        }
        if ops_left == 0 && pending.is_empty() {
            break;
        }
        if progressed {
            idle = 0;
        } else {
            idle += 1;
            assert!(
                ops_left > 0 && idle < 20_000,
                "{}\n{}",
                ctx("deadlock"),
                sim.describe()
            );
        }
    }
    sim.run_idle(1_000_000);
    sim.assert_no_errors();
    assert_eq!(seen, sim.sides[A].completions.len(), "{}", ctx("extra"));
    assert!(sim.sides[B].completions.is_empty(), "{}", ctx("target"));
    // The file holds what the model knows (read with pread, not through the mapping).
    let now = file.pread(0, FLEN);
    for (i, b) in model.file.iter().enumerate() {
        if let Some(b) = b {
            assert_eq!(now[i], *b, "{}: file byte {i}", ctx("file"));
        }
    }
    (ok, failed)
}

/// 300 seeds take a few seconds in release mode.
#[test]
fn file_faults_fail_exactly_the_operations_they_hit() {
    let (mut ok, mut failed) = (0, 0);
    let all = seeds(300);
    for &seed in &all {
        let (o, f) = case(seed);
        ok += o;
        failed += f;
    }
    eprintln!("{ok} operations succeeded, {failed} failed by injected faults");
    assert!(
        all.len() < 50 || (ok > 0 && failed > 0),
        "both outcomes occur"
    );
}
