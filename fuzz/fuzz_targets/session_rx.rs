//! The receive side of a [`Session`] fed with whatever a malicious or broken peer could send.
//!
//! Input: one configuration byte (`cfg % 4 + 1` rails; bit 0x10: payload CRC32C; bit 0x20,
//! with one rail: the session first posts two express requests, a write with immediate and a
//! send, as `Express` frames, so that answers can name them), then records, each
//!
//! ```text
//!   ctl: u8            rail = (ctl & 0x1f) % rails
//!                      0x20: a truncated file page: this frame's placement, if it is file
//!                            pages, faults (`payload_fault`, nothing placed), and so does the
//!                            next frame sent from file pages (padded, `transmit_faulted`)
//!                      0x40: afterwards, report earlier frames written, run the timer
//!                            (`on_tick`) and poll_transmit every rail
//!                      0x80: first, post one more receive
//!   header: [u8; 64]   a frame header, decoded with FrameHeader::decode (a refused header ends
//!                      the input: the real driver closes the rail)
//!   payload            header.payload_len bytes (the input may end early)
//! ```
//!
//! The rkey field is rewritten when it is below 8: key `k` names region `k % 5` of
//! [rw (all rights), ro (remote read only), rx (local write only), revoked, file (remote
//! read and write; 1000 bytes registered of a 600-byte file)]; other values are used as they
//! are (random keys the fuzzer cannot guess). The same goes for the keys in the scatter/gather
//! list of a `WriteV`/`ReadV` payload.
//!
//! The harness drives the session as the engine does: a frame offered on a rail whose
//! previous frame stalled waits behind it until `take_rx_retry` names the rail; an
//! `Express` frame goes whole to `on_express_frame` (cut short: the rail is lost); `Place`
//! payload bytes are written through the given pointers, `Discard` ones are skipped, then
//! `payload_done`; an `Err` (or an input ending inside a payload) loses the rail.
//!
//! Checked: no panic (including the core's debug assertions), every placement lies inside
//! memory the session may write (the rw, rx and file regions; never the read-only one), adds
//! up to the frame's payload length and is flagged `fragile` when it holds file pages; every transmitted frame decodes, its payload lies inside
//! registered memory and adds up to its `payload_len`; completions name posted work requests,
//! each at most once; after a final `close`, every posted work request has completed
//! (`BRAID_FUZZ_STRICT=0` turns this last check off).
#![no_main]

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use braid_proto::mem::Registry;
use braid_proto::{ExpressAction, ExpressTo, Request, RxAction, Session, SessionConfig, Transmit};
use braid_proto::wire::{FrameHeader, Opcode};
use braid_proto::wire::frame::HEADER_LEN;
use braid_proto::wire::sgl::SGE_LEN;
use braid_proto::{Access, Region, RemoteKey, RemoteSge, Sge};
use libfuzzer_sys::fuzz_target;

struct Mem {
    rw: Region,
    ro: Region,
    rx: Region,
    file: Region,
    keys: [u64; 5],
}

/// The file behind the file region: made once per process (unlinked at once), 600 bytes.
fn backing_file() -> &'static std::fs::File {
    static F: OnceLock<std::fs::File> = OnceLock::new();
    F.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("braid-fuzz-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("fuzz backing file");
        let _ = std::fs::remove_file(&path);
        f.set_len(600).expect("fuzz backing file size");
        f
    })
}

fn span(r: &Region) -> (usize, usize) {
    // SAFETY: only the address is used, for bounds checks.
    let p = unsafe { r.as_mut_ptr() } as usize;
    (p, p + r.len())
}

/// The pages a region's mapping occupies.
fn pages(r: &Region) -> (usize, usize) {
    let (s, e) = span(r);
    (s, e.next_multiple_of(4096))
}

fn disjoint(ranges: &[(usize, usize)], p: usize, len: usize) -> bool {
    ranges
        .iter()
        .all(|&(s, e)| p.saturating_add(len) <= s || p >= e)
}

fn inside(ranges: &[(usize, usize)], p: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    ranges
        .iter()
        .any(|&(s, e)| p >= s && p.checked_add(len).is_some_and(|end| end <= e))
}

struct Harness {
    s: Session,
    mem: Mem,
    /// Work requests posted and not completed yet.
    open: HashSet<u64>,
    next_recv_id: u64,
    /// Read-response frames handed out but not yet reported written.
    unreported: Vec<u64>,
    /// Per rail: a stalled frame first, then frames the driver has not read yet.
    backlog: Vec<VecDeque<(FrameHeader, Vec<u8>, bool)>>,
    stalled: Vec<bool>,
    /// Rails the driver has closed.
    dead: Vec<bool>,
    /// A truncation is under way: the next file-page frame sent or placed faults.
    fault_tx: bool,
    fault_rx: bool,
    now: Instant,
}

/// `BRAID_FUZZ_TRACE=1`: print what the session answers (to follow a crashing input).
fn trace() -> bool {
    static T: OnceLock<bool> = OnceLock::new();
    *T.get_or_init(|| std::env::var_os("BRAID_FUZZ_TRACE").is_some_and(|v| v == "1"))
}

/// On unless `BRAID_FUZZ_STRICT=0`: after the final `close`, every work request completed.
fn strict() -> bool {
    static S: OnceLock<bool> = OnceLock::new();
    *S.get_or_init(|| std::env::var_os("BRAID_FUZZ_STRICT").is_none_or(|v| v != "0"))
}

impl Harness {
    fn new(rails: usize, payload_crc: bool, express: bool) -> Harness {
        let reg = Arc::new(Registry::default());
        let rw = Region::allocate_in(&reg, 1000, Access::all()).unwrap();
        let ro = Region::allocate_in(&reg, 200, Access::REMOTE_READ).unwrap();
        let rx = Region::allocate_in(&reg, 512, Access::LOCAL_WRITE).unwrap();
        let gone = Region::allocate_in(&reg, 64, Access::all()).unwrap();
        let gone_key = gone.remote_key().key;
        gone.deregister(Duration::from_secs(1)).unwrap();
        let file = Region::register_file_in(
            &reg,
            backing_file(),
            0,
            1000,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
        let keys = [
            rw.remote_key().key,
            ro.remote_key().key,
            rx.remote_key().key,
            gone_key,
            file.remote_key().key,
        ];
        let cfg = SessionConfig {
            chunk_size: 64,
            max_outstanding: 16,
            max_recv: 4,
            initial_window: 512,
            min_window: 256,
            max_window: 4096,
            target_delay: Duration::from_millis(4),
            ack_threshold: 256,
            payload_crc,
            keepalive_interval: Duration::from_millis(2),
            peer_timeout: Duration::from_millis(50),
            ..SessionConfig::default()
        };
        let s = Session::new(cfg, reg, rails, 7);
        let mut h = Harness {
            s,
            mem: Mem {
                rw,
                ro,
                rx,
                file,
                keys,
            },
            open: HashSet::new(),
            next_recv_id: 100,
            unreported: Vec::new(),
            backlog: (0..rails).map(|_| VecDeque::new()).collect(),
            stalled: vec![false; rails],
            dead: vec![false; rails],
            fault_tx: false,
            fault_rx: false,
            now: Instant::now(),
        };
        if express {
            h.post_express();
        }
        h.post_initial();
        h
    }

    /// Two express requests (seq 0 and 1), taken the express way on an endpoint of one
    /// rail without a CRC; their frames are dropped (the peer's answers are the input).
    fn post_express(&mut self) {
        let rw = self.mem.rw.clone();
        let to = ExpressTo::Region {
            rkey: self.mem.keys[0],
            addr: 32,
        };
        let posts = [
            (20, to, Some(4)),
            (21, ExpressTo::Receive, None),
        ];
        for (wr, to, imm) in posts {
            let local = [rw.slice(40, 24).unwrap()];
            match self.s.post_express_frame(wr, &local, to, imm, true) {
                Ok(Some(t)) => {
                    self.check_transmit(&t);
                    self.open.insert(wr);
                }
                Ok(None) => {}
                Err(e) => panic!("express post refused: {e}"),
            }
        }
    }

    /// Operations of our own, so that the peer's responses can name something (seq 0..=6),
    /// and a few receives (one scattered, one with an empty piece).
    fn post_initial(&mut self) {
        let m = &self.mem;
        let (rw, rx) = (m.rw.clone(), m.rx.clone());
        let [krw, kro, _, _, kfile] = m.keys;
        let rk = |key| RemoteKey { key, len: 1000 };
        let reqs = vec![
            Request::Write {
                local: vec![rw.slice(0, 150).unwrap()],
                rkey: krw,
                addr: 0,
                imm: None,
            },
            Request::Read {
                local: vec![rx.slice(300, 40).unwrap(), rw.slice(900, 60).unwrap()],
                rkey: kro,
                addr: 0,
            },
            Request::FetchAdd {
                rkey: krw,
                addr: 8,
                add: 1,
            },
            Request::CompareSwap {
                rkey: krw,
                addr: 16,
                compare: 0,
                swap: 5,
            },
            Request::Send {
                local: vec![rw.slice(10, 20).unwrap(), rx.slice(0, 0).unwrap()],
                imm: Some(9),
            },
            Request::Read {
                local: vec![],
                rkey: krw,
                addr: 0,
            },
            Request::Write {
                local: vec![rw.slice(500, 70).unwrap()],
                rkey: krw,
                addr: 64,
                imm: Some(3),
            },
            // Vectored, seq 7 and 8.
            Request::WriteV {
                local: vec![rw.slice(0, 40).unwrap()],
                remote: vec![
                    RemoteSge::new(rk(krw), 100, 20),
                    RemoteSge::new(rk(kfile), 0, 20),
                ],
            },
            Request::ReadV {
                local: vec![rx.slice(350, 30).unwrap()],
                remote: vec![
                    RemoteSge::new(rk(kro), 0, 10),
                    RemoteSge::new(rk(kfile), 10, 20),
                ],
            },
        ];
        for (i, r) in reqs.into_iter().enumerate() {
            let wr = i as u64 + 1;
            self.s.post(wr, r).expect("initial post");
            self.open.insert(wr);
        }
        self.post_recv(vec![rx.slice(0, 64).unwrap()]);
        self.post_recv(vec![
            rx.slice(64, 16).unwrap(),
            rx.slice(100, 0).unwrap(),
            rx.slice(200, 48).unwrap(),
        ]);
        self.post_recv(vec![rx.slice(480, 32).unwrap()]);
    }

    fn post_recv(&mut self, local: Vec<Sge>) {
        let id = self.next_recv_id;
        self.next_recv_id += 1;
        if self.s.post_recv(id, local).is_ok() {
            self.open.insert(id);
        }
    }

    fn post_another_recv(&mut self) {
        let n = self.next_recv_id as usize;
        let off = (n * 37) % 400;
        let len = (n * 13) % 100;
        self.post_recv(vec![self.mem.rx.slice(off, len).unwrap()]);
    }

    fn drain_completions(&mut self) {
        while let Some(c) = self.s.poll_completion() {
            if trace() {
                eprintln!("  completion {c:?}");
            }
            assert!(
                self.open.remove(&c.wr_id),
                "completion for a work request that is not outstanding: {c:?}"
            );
        }
    }

    fn check_transmit(&self, t: &Transmit) {
        let h = match FrameHeader::decode(&t.header) {
            Ok(h) => h,
            Err(e) => panic!("session transmitted a header its own decoder refuses: {e}"),
        };
        let total: usize = t.payload.iter().map(|p| p.1).sum();
        assert_eq!(
            total, h.payload_len as usize,
            "transmit payload length mismatch"
        );
        let m = &self.mem;
        let ranges = [span(&m.rw), span(&m.ro), span(&m.rx), span(&m.file)];
        let pages = [pages(&m.rw), pages(&m.ro), pages(&m.rx), pages(&m.file)];
        let mut sum = 0u64;
        for &(p, l) in &t.payload {
            // Inside a region, or in memory of the session's own (left to the sanitizer).
            assert!(
                inside(&ranges, p as usize, l) || disjoint(&pages, p as usize, l),
                "transmit payload outside regions: {:?}",
                t.payload
            );
            // SAFETY: checked to lie inside a live region; read as the driver would (the
            // file is never truncated here, so its pages are there).
            let bytes = unsafe { std::slice::from_raw_parts(p, l) };
            sum = bytes.iter().fold(sum, |a, &b| a.wrapping_add(b as u64));
        }
        std::hint::black_box(sum);
    }

    fn from_file(&self, p: *const u8, len: usize) -> bool {
        len > 0 && inside(&[span(&self.mem.file)], p as usize, len)
    }

    /// Reports frames handed out earlier as written, runs the timer, then takes frames from
    /// every rail. `Err(rail)` when the timer declares a rail dead.
    fn transmit_round(&mut self) -> Result<(), usize> {
        for token in std::mem::take(&mut self.unreported) {
            self.s.transmitted(token);
        }
        let dead = self.s.on_tick(self.now);
        for rail in 0..self.s.rail_count() {
            for _ in 0..64 {
                let Some(t) = self.s.poll_transmit(rail, self.now) else {
                    break;
                };
                self.check_transmit(&t);
                if trace() {
                    eprintln!("  sent on {rail}: {:?}", FrameHeader::decode(&t.header));
                }
                if self.fault_tx && t.payload.iter().any(|&(p, l)| self.from_file(p, l)) {
                    // The file's pages went away under this frame: the driver pads it.
                    self.fault_tx = false;
                    self.s.transmit_faulted(&t.header);
                }
                if let Some(token) = t.read_response {
                    self.unreported.push(token);
                }
            }
        }
        self.drain_completions();
        match dead {
            0 => Ok(()),
            d => Err(d.trailing_zeros() as usize),
        }
    }

    /// Offers one frame to the session and carries out its answer.
    fn offer(&mut self, rail: usize, h: &FrameHeader, payload: &[u8], complete: bool) -> Offer {
        self.now += Duration::from_micros(500);
        if h.opcode == Opcode::Express {
            if !complete {
                return Offer::Lost;
            }
            let r = self.s.on_express_frame(rail, h, payload);
            if trace() {
                eprintln!("rail {rail}: {h:?}\n  -> express {r:?}");
            }
            self.drain_completions();
            return match r {
                Ok(ExpressAction::Done(_)) => Offer::Ok,
                Ok(ExpressAction::Stall) => Offer::Stalled,
                Err(_) => Offer::Lost,
            };
        }
        let action = match self.s.on_frame(rail, h, self.now) {
            Ok(a) => a,
            Err(e) => {
                if trace() {
                    eprintln!("rail {rail}: {h:?}\n  -> error: {e}");
                }
                return Offer::Lost;
            }
        };
        if trace() {
            let what = match &action {
                RxAction::Done => "done".to_string(),
                RxAction::Stall => "stall".to_string(),
                RxAction::Discard => "discard".to_string(),
                RxAction::Place(p) => format!("place {:?}", p.iov),
            };
            eprintln!("rail {rail}: {h:?}\n  -> {what}");
        }
        let len = h.payload_len as usize;
        match action {
            RxAction::Stall => return Offer::Stalled,
            RxAction::Done => {
                assert_eq!(len, 0, "Done for a frame with payload: {h:?}");
                self.drain_completions();
                return Offer::Ok;
            }
            RxAction::Place(place) => {
                let m = &self.mem;
                // Registered memory the session may write into: never the read-only region.
                // Memory outside every region's pages (staging buffers) is left to the
                // address sanitizer.
                let ranges = [span(&m.rw), span(&m.rx), span(&m.file)];
                let pages = [pages(&m.rw), pages(&m.ro), pages(&m.rx), pages(&m.file)];
                let total: usize = place.iov.iter().map(|p| p.1).sum();
                assert_eq!(total, len, "placement of {total} bytes for {h:?}");
                let on_file = place.iov.iter().any(|&(p, l)| self.from_file(p, l));
                // Set whenever file pages are in it (it may be set for an operation's chunk
                // that only touches memory).
                assert!(!on_file || place.fragile, "fragile flag for {h:?}");
                let mut src = payload;
                if self.fault_rx && place.fragile {
                    // Nothing can be placed: the driver drops the payload.
                    self.fault_rx = false;
                    self.s.payload_fault(rail);
                    src = &[];
                }
                for &(p, l) in &place.iov {
                    assert!(
                        inside(&ranges, p as usize, l) || disjoint(&pages, p as usize, l),
                        "placement outside writable memory for {h:?}: {:?}",
                        place.iov
                    );
                    let n = l.min(src.len());
                    // SAFETY: checked to lie inside a live region the session may write.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, n) };
                    src = &src[n..];
                }
            }
            RxAction::Discard => {}
        }
        if !complete {
            // The peer closed the connection in the middle of the payload.
            return Offer::Lost;
        }
        let r = self.s.payload_done(rail);
        if trace() {
            eprintln!("  payload_done: {r:?}");
        }
        self.drain_completions();
        match r {
            Ok(()) => Offer::Ok,
            Err(_) => Offer::Lost,
        }
    }

    /// Runs frames of `rail` from its backlog until it is empty or stalls; `false` when the
    /// rail is lost.
    fn run_rail(&mut self, rail: usize) -> bool {
        if self.dead[rail] {
            self.backlog[rail].clear();
            return true;
        }
        while let Some((h, payload, complete)) = self.backlog[rail].pop_front() {
            match self.offer(rail, &h, &payload, complete) {
                Offer::Ok => self.stalled[rail] = false,
                Offer::Stalled => {
                    self.stalled[rail] = true;
                    self.backlog[rail].push_front((h, payload, complete));
                    return true;
                }
                Offer::Lost => return false,
            }
        }
        true
    }

    /// Resumes the rails the session names, as the engine does; `Err(rail)` when one is lost.
    fn run_retries(&mut self) -> Result<(), usize> {
        for _ in 0..64 {
            let retry = self.s.take_rx_retry();
            if retry == 0 {
                break;
            }
            for rail in 0..self.s.rail_count() {
                if retry & (1 << rail) != 0 && !self.run_rail(rail) {
                    return Err(rail);
                }
            }
        }
        Ok(())
    }

    /// The driver closes `rail` (protocol error, peer closed it, timeout). Whether the
    /// endpoint survives is the session's business.
    fn lose(&mut self, rail: usize) {
        if trace() {
            eprintln!("rail {rail} lost");
        }
        self.dead[rail] = true;
        self.stalled[rail] = false;
        self.backlog[rail].clear();
        self.s.on_rail_lost(rail);
        self.drain_completions();
    }

    /// Runs `step`, losing rails until it succeeds; `false` once the endpoint has failed
    /// (or every rail is gone).
    fn settle(&mut self, mut step: impl FnMut(&mut Harness) -> Result<(), usize>) -> bool {
        for _ in 0..=64 {
            if self.s.is_failed() || self.dead.iter().all(|&d| d) {
                return false;
            }
            match step(self) {
                Ok(()) => return true,
                Err(rail) => self.lose(rail),
            }
        }
        false
    }

    fn finish(&mut self) {
        self.s.close();
        let _ = self.transmit_round();
        self.drain_completions();
        if strict() {
            assert!(
                self.open.is_empty(),
                "work requests never completed after close: {:?}",
                self.open
            );
        }
    }
}

enum Offer {
    Ok,
    Stalled,
    Lost,
}

fn run(data: &[u8]) {
    let Some((&cfg, mut rest)) = data.split_first() else {
        return;
    };
    let rails = 1 + (cfg as usize % 4);
    let mut hx = Harness::new(rails, cfg & 0x10 != 0, cfg & 0x20 != 0);
    while !rest.is_empty() {
        let ctl = rest[0];
        rest = &rest[1..];
        let rail = (ctl & 0x1f) as usize % rails;
        if ctl & 0x80 != 0 {
            hx.post_another_recv();
            if !hx.settle(|hx| hx.run_retries()) {
                break;
            }
        }
        if rest.len() < HEADER_LEN {
            // The peer closed the rail in the middle of a header.
            break;
        }
        let header = FrameHeader::decode(&rest[..HEADER_LEN]);
        rest = &rest[HEADER_LEN..];
        if hx.dead[rail] {
            // A closed rail delivers nothing more; skip what the record says follows.
            let len = header.map_or(0, |h| h.payload_len as usize);
            rest = &rest[len.min(rest.len())..];
            continue;
        }
        let Ok(mut h) = header else {
            // A malformed header closes the rail (and the peer could not be followed further
            // on it anyway).
            hx.lose(rail);
            if hx.s.is_failed() || hx.dead.iter().all(|&d| d) {
                break;
            }
            continue;
        };
        if h.rkey < 8 {
            h.rkey = hx.mem.keys[h.rkey as usize % 5];
        }
        if ctl & 0x20 != 0 {
            (hx.fault_rx, hx.fault_tx) = (true, true);
        }
        let len = h.payload_len as usize;
        let take = len.min(rest.len());
        let mut payload = rest[..take].to_vec();
        if h.opcode.is_descriptor() {
            for e in payload.chunks_exact_mut(SGE_LEN) {
                let k = u64::from_le_bytes(e[..8].try_into().unwrap());
                if k < 8 {
                    e[..8].copy_from_slice(&hx.mem.keys[k as usize % 5].to_le_bytes());
                }
            }
        }
        rest = &rest[take..];
        hx.backlog[rail].push_back((h, payload, take == len));
        let ok = hx.settle(|hx| {
            if !hx.stalled[rail] && !hx.run_rail(rail) {
                return Err(rail);
            }
            Ok(())
        }) && hx.settle(|hx| hx.run_retries())
            && (ctl & 0x40 == 0
                || hx.settle(|hx| hx.transmit_round().and_then(|()| hx.run_retries())));
        if !ok {
            break;
        }
    }
    // End of input: let the session send what it has, report it written, resume rails.
    for _ in 0..4 {
        if !hx.settle(|hx| hx.transmit_round().and_then(|()| hx.run_retries())) {
            break;
        }
    }
    hx.finish();
}

fuzz_target!(|data: &[u8]| run(data));
