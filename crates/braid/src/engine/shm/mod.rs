//! Same-host rails: the session's byte stream through a pair of rings in shared memory (a
//! sealed memfd both processes map), with the Unix socket the memfd came over kept as the
//! doorbell and the liveness signal. See docs/PROTOCOL.md, "Same-host rails".
//!
//! Each direction is a single-producer, single-consumer byte ring. Its cursors are byte
//! counts that only grow (`head` by the producer, `tail` by the consumer); the data area's
//! size is a power of two. A side that is about to sleep *arms* the ring: it sets a flag in
//! shared memory and re-checks the cursors, and the other side, after moving its cursor,
//! writes one byte on its end of the Unix socket when it finds the flag set (a Dekker pair of
//! sequentially consistent fences orders the two). A busy-polling reader never arms, so a
//! ping-pong between pollers makes no system call at all. The peer's death closes its end of
//! the socket: the reader sees the end at its next arm, the engine at once (a hang-up).
//!
//! The ring carries records: inline bytes, or a reference to bytes of a region file of the
//! sender's ([`refs`]), which the receiver copies straight from its mapping of that file
//! into their destination: one copy instead of two.
//!
//! The peer's memory is not trusted: cursors and records read from the shared pages are
//! checked before use (a peer that breaks them fails the rail, never this process), and
//! every shared file is sealed against shrinking, so no access can fault.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};

use parking_lot::Mutex;

use super::io::Received;
use super::transport::{ExpressExec, ExpressTake, LinkSample, Transport};
use braid_proto::ExpressRequest;
use braid_proto::mem::shared::SharedSpan;
use braid_proto::wire::WireStatus;

mod express;
mod refs;
mod ring;

use refs::{Dest, PeerFile, PeerFiles, Sharer};
pub(crate) use ring::{DEFAULT_RING_BYTES, RingFile, Side};
use ring::{Mapping, Ring};

/// Payload pieces at least this long that lie in a shareable region file go by reference.
const REF_MIN: usize = 8 << 10;
/// Page-aligned payload pieces at least this long go by page exchange, when the link does.
const EXCHANGE_MIN: usize = 64 << 10;
/// Record tags.
const INLINE: u8 = 1;
const REF: u8 = 2;
/// A reference to frozen pages (see [`braid_proto::mem::shared::exchange_span`]), which the
/// receiver may map copy-on-write instead of copying.
const EXCHANGE: u8 = 3;
/// An express request (see [`express`]): executed where it stands, never read as stream
/// bytes.
const EXPRESS: u8 = 4;
/// An inline record's header: tag, three zero bytes, length (u32).
const INLINE_HDR: usize = 8;
/// A reference record: the inline header's fields, then token and offset (u64 each).
const REF_HDR: usize = 24;
/// Least room a send needs to make progress.
const MIN_ROOM: u64 = 64;
/// Most stream bytes that can wait in a ring (a count above it is a broken peer's).
const MAX_STREAM_WAITING: u64 = 1 << 48;

/// The record being read.
enum Cur {
    /// Between records.
    None,
    /// Inline bytes left in the ring.
    Inline(u64),
    /// Bytes left of a reference: the peer's file, where in it, how many, and whether its
    /// pages are frozen (may be mapped instead of copied).
    Ref(Arc<PeerFile>, u64, u64, bool),
}

/// The consuming side's cursors and the record it is in.
struct RxCursor {
    tail: u64,
    stream_tail: u64,
    /// Express requests executed.
    express_done: u64,
    /// Where the last express record taken on its tag alone started, in ring and stream
    /// counts: the producer publishes `head` and `stream_head` just after such a tag, so
    /// they may still show this record's start while the cursors are past it.
    fast_from: u64,
    stream_fast_from: u64,
    cur: Cur,
    files: PeerFiles,
}

/// The producing side's cursors.
struct TxCursor {
    head: u64,
    stream_head: u64,
    /// The consumer's `tail` as last read: the room it leaves is read again only when a
    /// send needs more (the line the consumer writes is not fetched on every send).
    tail_seen: u64,
}

/// A same-host rail: a ring each way in shared memory, the Unix socket to the peer as
/// doorbell (a byte written wakes the peer's poll) and liveness signal, and a second socket
/// for region files.
pub(crate) struct ShmLink {
    tx: Ring,
    rx: Ring,
    txc: Mutex<TxCursor>,
    rxc: Mutex<RxCursor>,
    sharer: Sharer,
    bell: UnixStream,
    /// Shut down here, or the peer's end of the socket closed.
    ended: AtomicBool,
    /// Page-aligned payloads go by page exchange, and the peer's exchanged pages are mapped
    /// rather than copied.
    exchange: bool,
    /// Express requests written, and answers to them handed on (see [`express`]).
    express_sent: AtomicU64,
    express_reaped: AtomicU64,
    /// Answers carried in express records, both ways.
    carried: express::Carried,
    /// See [`ShmLink::note_cursor`].
    next_record_at: AtomicU64,
    _map: Mapping,
}

// SAFETY: the raw pointers are into mappings the link owns; producing and consuming are
// each behind their cursor's lock.
unsafe impl Send for ShmLink {}
unsafe impl Sync for ShmLink {}

fn broken(why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the peer broke the shared ring: {why}"),
    )
}

impl ShmLink {
    /// A link over `file`'s rings, this side being `side`, with `bell` connected to the
    /// peer and `files` the socket for region files; `exchange`: page-aligned payloads go by
    /// page exchange.
    pub(crate) fn new(
        file: RingFile,
        side: Side,
        bell: UnixStream,
        files: UnixStream,
        exchange: bool,
    ) -> io::Result<ShmLink> {
        bell.set_nonblocking(true)?;
        files.set_nonblocking(true)?;
        let (tx, rx) = match side {
            Side::Connector => (0, 1),
            Side::Acceptor => (1, 0),
        };
        let tx = Ring::new(&file.map, file.ring_bytes, tx);
        let rx = Ring::new(&file.map, file.ring_bytes, rx);
        // Both start armed: data may arrive before this side's first read.
        for r in [&tx, &rx] {
            r.ctrl().want.store(1, Ordering::Relaxed);
            r.ctrl().reader_armed.store(1, Ordering::Release);
        }
        Ok(ShmLink {
            tx,
            rx,
            txc: Mutex::new(TxCursor {
                head: 0,
                stream_head: 0,
                tail_seen: 0,
            }),
            rxc: Mutex::new(RxCursor {
                tail: 0,
                stream_tail: 0,
                express_done: 0,
                fast_from: 0,
                stream_fast_from: 0,
                cur: Cur::None,
                files: PeerFiles::new(files.try_clone()?),
            }),
            sharer: Sharer::new(files),
            bell,
            ended: AtomicBool::new(false),
            exchange,
            express_sent: AtomicU64::new(0),
            express_reaped: AtomicU64::new(0),
            carried: express::Carried::default(),
            next_record_at: AtomicU64::new(0),
            _map: file.map,
        })
    }

    /// Wakes the peer. A full socket means the peer has doorbells unread already.
    fn ring_bell(&self) {
        // SAFETY: one byte from a valid buffer on our socket.
        unsafe {
            libc::send(
                self.bell.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
    }

    /// Reads the doorbells that woke us; an error once the peer's end is closed.
    pub(super) fn drain_bell(&self) -> io::Result<()> {
        let mut buf = [0u8; 256];
        loop {
            // SAFETY: reads into a valid local buffer.
            let n = unsafe {
                libc::recv(
                    self.bell.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            match n {
                0 => {
                    self.ended.store(true, Ordering::Release);
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "the peer closed its end of the shared-memory rail",
                    ));
                }
                n if n > 0 => continue,
                _ => {
                    let e = io::Error::last_os_error();
                    match e.kind() {
                        io::ErrorKind::WouldBlock => return Ok(()),
                        io::ErrorKind::Interrupted => continue,
                        _ => {
                            self.ended.store(true, Ordering::Release);
                            return Err(e);
                        }
                    }
                }
            }
        }
    }

    fn check_open(&self) -> io::Result<()> {
        if self.ended.load(Ordering::Acquire) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the shared-memory rail is closed",
            ));
        }
        Ok(())
    }

    /// Stream bytes waiting, checked.
    fn stream_waiting(&self, c: &mut RxCursor) -> io::Result<u64> {
        let head = self.rx.ctrl().stream_head.load(Ordering::Acquire);
        let w = head.wrapping_sub(c.stream_tail);
        if w > MAX_STREAM_WAITING {
            if lags_within(head, c.stream_fast_from, c.stream_tail) {
                return Ok(0);
            }
            return Err(broken(format!(
                "stream cursors {head} and {}",
                c.stream_tail
            )));
        }
        // Caught up: the count may no longer lag.
        c.stream_fast_from = c.stream_tail;
        Ok(w)
    }

    /// Ring bytes published past the read cursor, checked.
    fn rx_used(&self, c: &mut RxCursor) -> io::Result<u64> {
        let head = self.rx.ctrl().head.load(Ordering::Acquire);
        if head.wrapping_sub(c.tail) > self.rx.cap() && lags_within(head, c.fast_from, c.tail) {
            return Ok(0);
        }
        let used = self.rx.used(head, c.tail)?;
        c.fast_from = c.tail;
        Ok(used)
    }

    /// Reads the next record's header at the cursor; false when the ring is empty or an
    /// express request is next.
    fn next_record(&self, c: &mut RxCursor) -> io::Result<bool> {
        let used = self.rx_used(c)?;
        if used == 0 {
            return Ok(false);
        }
        let mut h = [0u8; REF_HDR];
        let n = (used as usize).min(REF_HDR);
        // SAFETY: `n` bytes into a local buffer, within the ring's published bytes.
        unsafe { self.rx.copy(c.tail, h.as_mut_ptr(), n, false, false) };
        // Stream bytes end at an express request: the caller executes it between frames.
        if h[0] == EXPRESS {
            return Ok(false);
        }
        let len = u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")) as u64;
        if n < INLINE_HDR || h[1..4] != [0, 0, 0] || len == 0 {
            return Err(broken(format!("bad record header {:02x?}", &h[..n])));
        }
        match h[0] {
            INLINE if used >= INLINE_HDR as u64 + len => {
                c.tail += INLINE_HDR as u64;
                c.cur = Cur::Inline(len);
            }
            tag @ (REF | EXCHANGE) if n == REF_HDR => {
                let token = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
                let off = u64::from_le_bytes(h[16..24].try_into().expect("8 bytes"));
                let pf = c.files.get(token)?;
                if off
                    .checked_add(len)
                    .is_none_or(|end| end > pf.map.len as u64)
                {
                    return Err(broken(format!(
                        "reference past its file ({len} bytes at {off} of {})",
                        pf.map.len
                    )));
                }
                c.tail += REF_HDR as u64;
                if tag == EXCHANGE {
                    // Whole pages will be mapped, not read: nothing to fault in.
                    c.cur = Cur::Ref(pf, off, len, true);
                    return Ok(true);
                }
                c.cur = Cur::Ref(pf, off, len, false);
            }
            _ => return Err(broken(format!("bad record header {:02x?}", &h[..n]))),
        }
        Ok(true)
    }

    /// Copies stream bytes into `dest` until it is full or the ring empty; `WouldBlock`
    /// when nothing was there, `Ok(0)` at the end of a closed link.
    fn take(&self, dest: &mut Dest<'_>) -> io::Result<usize> {
        let mut c = self.rxc.lock();
        let r = self.take_from(&mut c, dest);
        self.note_cursor(&c);
        r
    }

    /// Where the next record starts, for [`Transport::quiet`] to look without the cursor's
    /// lock: the cursor when it is between records, else `u64::MAX`.
    fn note_cursor(&self, c: &RxCursor) {
        let at = if matches!(c.cur, Cur::None) {
            c.tail
        } else {
            u64::MAX
        };
        self.next_record_at.store(at, Ordering::Relaxed);
    }

    /// The tag at the next record's start, read without the cursor's lock (`None` inside a
    /// record): a hint. A stale position (another thread reading meanwhile) holds a consumed
    /// record's tag, never a zero one, so a hint taken from it errs on the safe side.
    fn next_tag(&self) -> Option<u8> {
        let at = self.next_record_at.load(Ordering::Relaxed);
        (at != u64::MAX).then(|| self.rx.tag(at))
    }

    /// [`ShmLink::take`] with the cursor locked.
    fn take_from(&self, c: &mut RxCursor, dest: &mut Dest<'_>) -> io::Result<usize> {
        let mut got = 0usize;
        while dest.room() > 0 && !dest.faulted {
            match &mut c.cur {
                Cur::None => {
                    if !self.next_record(c)? {
                        break;
                    }
                }
                Cur::Inline(left) => {
                    let n = (*left as usize).min(dest.room());
                    let mut put = 0;
                    for (p, len) in self.rx.segments(c.tail, n) {
                        // SAFETY: published bytes of the ring's data area.
                        let got = unsafe { dest.put(p, len) };
                        put += got;
                        if got < len {
                            break;
                        }
                    }
                    *left -= put as u64;
                    c.tail += put as u64;
                    if *left == 0 {
                        c.cur = Cur::None;
                    }
                    got += put;
                }
                Cur::Ref(pf, off, left, frozen) => {
                    let n = (*left as usize).min(dest.room());
                    let mut put = 0;
                    if *frozen && self.exchange {
                        put = dest.adopt(&pf.file, *off, n);
                        if put == 0 && got > 0 {
                            // Not into whatever buffer took the bytes before (the engine
                            // reads a frame's header with the start of its payload): the
                            // next call brings the payload's own placement.
                            break;
                        }
                    }
                    if put < n {
                        // SAFETY: within the peer's file (checked with the record), which is
                        // sealed against shrinking.
                        put += unsafe { dest.put(pf.map.base.add(*off as usize + put), n - put) };
                    }
                    *off += put as u64;
                    *left -= put as u64;
                    if *left == 0 {
                        c.cur = Cur::None;
                    }
                    got += put;
                }
            }
        }
        if got == 0 {
            if dest.faulted {
                return Err(io::Error::from_raw_os_error(libc::EFAULT));
            }
            if dest.room() == 0 {
                return Ok(0);
            }
            if self.ended.load(Ordering::Acquire) {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        c.stream_tail += got as u64;
        let ctrl = self.rx.ctrl();
        ctrl.tail.store(c.tail, Ordering::Release);
        ctrl.stream_tail.store(c.stream_tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if ctrl.writer_armed.load(Ordering::Relaxed) != 0
            && ctrl.writer_armed.swap(0, Ordering::AcqRel) != 0
        {
            self.ring_bell();
        }
        Ok(got)
    }

    /// The file span holding `[src, src + len)` and the record tag naming it: frozen pages
    /// for page exchange when the link does it and the span is whole pages, else the plain
    /// region file (`None`: the bytes go inline).
    fn shareable(&self, src: *const u8, len: usize) -> Option<(SharedSpan, u8)> {
        use braid_proto::mem::shared;
        if self.exchange
            && len >= EXCHANGE_MIN
            && (src as usize).is_multiple_of(shared::PAGE)
            && len.is_multiple_of(shared::PAGE)
            && let Some(span) = shared::exchange_span(src, len)
        {
            return Some((span, EXCHANGE));
        }
        shared::lookup(src, len).map(|span| (span, REF))
    }

    /// Writes an inline record of up to `len` bytes from `src` at ring position `pos`
    /// (room for it checked by the caller); returns the payload bytes written.
    ///
    /// SAFETY: `src` valid for `len` bytes (file pages aside, when `fragile`).
    unsafe fn put_inline(&self, pos: u64, src: *const u8, len: usize, fragile: bool) -> usize {
        // SAFETY: the caller's contract; the data goes after the header's place.
        let got = unsafe {
            self.tx
                .copy(pos + INLINE_HDR as u64, src as *mut u8, len, true, fragile)
        };
        if got > 0 {
            // SAFETY: the header's eight bytes at `pos`.
            unsafe { self.set_inline_len(pos, got) };
        }
        got
    }

    /// Writes the header of an inline record of `len` bytes at `pos`.
    ///
    /// SAFETY: the eight bytes at `pos` are free space of the transmit ring (not yet
    /// published).
    unsafe fn set_inline_len(&self, pos: u64, len: usize) {
        let mut h = [0u8; INLINE_HDR];
        h[0] = INLINE;
        h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
        // SAFETY: the caller's contract.
        unsafe { self.tx.copy(pos, h.as_mut_ptr(), INLINE_HDR, true, false) };
    }
}

/// Whether `head`, behind `tail`, is no further behind than `from`: a cursor that ran ahead
/// of the published count over one express record taken on its tag (see
/// [`ShmLink::exec_express`]).
fn lags_within(head: u64, from: u64, tail: u64) -> bool {
    head.wrapping_sub(from) <= tail.wrapping_sub(from)
}

/// The pieces after `skip` bytes, as (index, pointer, offset, length) runs.
fn runs_indexed<P: Copy>(
    pieces: &[(P, usize)],
    mut skip: usize,
) -> impl Iterator<Item = (usize, P, usize, usize)> + '_ {
    pieces.iter().enumerate().filter_map(move |(i, &(p, l))| {
        if skip >= l {
            skip -= l;
            None
        } else {
            let s = skip;
            skip = 0;
            Some((i, p, s, l - s))
        }
    })
}

/// The pieces after `skip` bytes, as (pointer, offset, length) runs.
fn runs<P: Copy>(
    pieces: &[(P, usize)],
    skip: usize,
) -> impl Iterator<Item = (P, usize, usize)> + '_ {
    runs_indexed(pieces, skip).map(|(_, p, o, l)| (p, o, l))
}

impl Transport for ShmLink {
    fn readiness_fd(&self) -> RawFd {
        self.bell.as_raw_fd()
    }

    fn send(
        &self,
        pieces: &[(*const u8, usize)],
        skip: usize,
        fragile: bool,
        stable: &[bool],
    ) -> io::Result<usize> {
        self.check_open()?;
        let c = self.tx.ctrl();
        let mut cur = self.txc.lock();
        let head = cur.head;
        // What this send could use: its bytes and a record header per piece.
        let need = runs(pieces, skip)
            .map(|r| r.2 as u64 + REF_HDR as u64)
            .sum::<u64>()
            .min(self.tx.cap());
        let mut room = self.tx.free(head, cur.tail_seen)?;
        if room < need {
            cur.tail_seen = c.tail.load(Ordering::Acquire);
            room = self.tx.free(head, cur.tail_seen)?;
        }
        if room < MIN_ROOM {
            c.writer_armed.store(1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            cur.tail_seen = c.tail.load(Ordering::Acquire);
            room = self.tx.free(head, cur.tail_seen)?;
            if room < MIN_ROOM {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        let end = head + room;
        let (mut pos, mut sent) = (head, 0usize);
        // The inline record the previous piece went into, as (its header's place, its
        // length): the next inline piece extends it, so that a batch of small frames (a
        // `Done`, a request header, its payload) is one record for the reader to take.
        let mut open: Option<(u64, usize)> = None;
        for (i, p, off, len) in runs_indexed(pieces, skip) {
            // SAFETY: `off < len` of the caller's piece.
            let src = unsafe { p.add(off) };
            if !fragile
                && stable.get(i).copied().unwrap_or(false)
                && len >= REF_MIN
                && end - pos >= REF_HDR as u64
                && let Some((span, tag)) = self.shareable(src, len)
                && self
                    .sharer
                    .give(&span, pos + REF_HDR as u64, c.tail.load(Ordering::Acquire))
            {
                let whole = len;
                let len = whole.min(u32::MAX as usize);
                let mut h = [0u8; REF_HDR];
                h[0] = tag;
                h[4..8].copy_from_slice(&(len as u32).to_le_bytes());
                h[8..16].copy_from_slice(&span.token.to_le_bytes());
                h[16..24].copy_from_slice(&span.offset.to_le_bytes());
                // SAFETY: the record's bytes fit the free space.
                unsafe { self.tx.copy(pos, h.as_mut_ptr(), REF_HDR, true, false) };
                pos += REF_HDR as u64;
                sent += len;
                open = None;
                if len < whole {
                    break;
                }
                continue;
            }
            if let Some((at, so_far)) = open.filter(|_| !fragile) {
                // Only memory that cannot fault is appended: a short copy would leave the
                // record's length ahead of its bytes.
                let take = len
                    .min((end - pos) as usize)
                    .min(u32::MAX as usize - so_far);
                if take == 0 {
                    break;
                }
                // SAFETY: the piece is valid for `off + len` bytes (the caller's contract);
                // `take` bytes fit the free space at `pos`, which follows the record.
                unsafe { self.tx.copy(pos, src as *mut u8, take, true, false) };
                let so_far = so_far + take;
                // SAFETY: the length field of the record's header, written before.
                unsafe { self.set_inline_len(at, so_far) };
                open = Some((at, so_far));
                pos += take as u64;
                sent += take;
                if take < len {
                    break;
                }
                continue;
            }
            if end - pos <= INLINE_HDR as u64 {
                break;
            }
            let take = len
                .min((end - pos) as usize - INLINE_HDR)
                .min(u32::MAX as usize);
            // SAFETY: the piece is valid for `off + len` bytes (the caller's contract);
            // `take` fits the free space after the header.
            let got = unsafe { self.put_inline(pos, src, take, fragile) };
            if got > 0 {
                open = Some((pos, got));
                pos += (INLINE_HDR + got) as u64;
                sent += got;
            }
            if got < take {
                // A truncated file page: what came before it goes; the fault is reported
                // when it is all that is left.
                if sent == 0 {
                    return Err(io::Error::from_raw_os_error(libc::EFAULT));
                }
                break;
            }
            if take < len {
                break;
            }
        }
        if sent == 0 {
            return Ok(0);
        }
        cur.head = pos;
        cur.stream_head += sent as u64;
        self.tx.end_records(pos);
        c.head.store(pos, Ordering::Release);
        c.stream_head.store(cur.stream_head, Ordering::Release);
        fence(Ordering::SeqCst);
        self.wake_reader(c, cur.stream_head);
        Ok(sent)
    }

    fn recv_pieces(
        &self,
        pieces: &[(*mut u8, usize)],
        skip: usize,
        tail: Option<(*mut u8, usize)>,
        fragile: bool,
    ) -> io::Result<Received> {
        let mut runs: Vec<(*mut u8, usize)> = runs(pieces, skip)
            // SAFETY: `off < len` of the caller's piece.
            .map(|(p, off, len)| (unsafe { p.add(off) }, len))
            .collect();
        runs.extend(tail);
        let mut dest = Dest::new(&runs, fragile);
        let asked = dest.room();
        let got = self.take(&mut dest)?;
        Ok(Received { got, asked })
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let run = [(buf.as_mut_ptr(), buf.len())];
        let mut dest = Dest::new(&run, false);
        self.take(&mut dest)
    }

    fn set_wake_threshold(&self, _bytes: usize) -> io::Result<()> {
        // The threshold goes with arming (`arm`), where the sleeping side names it.
        Ok(())
    }

    fn bytes_waiting(&self) -> Option<usize> {
        let mut c = self.rxc.lock();
        self.stream_waiting(&mut c).ok().map(|w| w as usize)
    }

    fn arm(&self, want: usize) -> io::Result<bool> {
        self.drain_bell()?;
        let c = self.rx.ctrl();
        // Never more than half the ring: a producer with a full ring must still wake us.
        let want = (want as u64).clamp(1, self.rx.cap() / 2);
        c.want.store(want, Ordering::Relaxed);
        c.reader_armed.store(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let mut rc = self.rxc.lock();
        let waiting = self.stream_waiting(&mut rc)?;
        if waiting > 0 && matches!(rc.cur, Cur::None) && self.rx.tag(rc.tail) == 0 {
            // Stream bytes are published behind a tag, so this one cannot be zero.
            return Err(broken(format!("{waiting} bytes waiting behind a zero tag")));
        }
        drop(rc);
        if waiting >= want || self.express_answers_waiting(true) {
            c.reader_armed.store(0, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }

    fn signals_when_armed(&self) -> bool {
        true
    }

    fn carries_express(&self) -> bool {
        true
    }

    fn send_express(&self, r: &ExpressRequest, pieces: &[(*const u8, usize)]) -> io::Result<bool> {
        self.put_express(r, pieces)
    }

    fn take_express(&self, exec: &mut ExpressExec<'_>) -> io::Result<ExpressTake> {
        self.exec_express(exec)
    }

    fn quiet(&self) -> bool {
        self.next_tag() == Some(0)
            && !self.ended.load(Ordering::Acquire)
            && !self.express_answers_waiting(false)
    }

    fn express_next(&self) -> bool {
        self.next_tag() == Some(EXPRESS)
    }

    fn express_unanswered(&self) -> u64 {
        self.unanswered_express()
    }

    fn express_answered(&self, eager: bool) -> bool {
        self.express_answers_waiting(eager)
    }

    fn arm_for_answers(&self) -> io::Result<bool> {
        ShmLink::arm_for_answers(self)
    }

    fn reap_express(&self, f: &mut dyn FnMut(WireStatus)) -> io::Result<()> {
        self.read_express_answers(f)
    }

    fn sample(&self) -> Option<LinkSample> {
        None
    }

    fn kind(&self) -> &'static str {
        "shm"
    }

    fn shutdown(&self) {
        self.ended.store(true, Ordering::Release);
        let _ = self.bell.shutdown(std::net::Shutdown::Both);
    }
}

/// Sends the ring file and the region-file socket's far end over `sock`, with `msg`.
pub(crate) fn send_ring_file(
    sock: &UnixStream,
    file: &RingFile,
    files_end: &UnixStream,
    msg: &[u8],
) -> io::Result<()> {
    sock.set_nonblocking(false)?;
    refs::send_fds(sock, &[file.fd().as_fd(), files_end.as_fd()], msg)
}

/// Receives the ring file and the region-file socket with exactly `msg.len()` bytes.
pub(crate) fn recv_ring_file(
    sock: &UnixStream,
    msg: &mut [u8],
) -> io::Result<(OwnedFd, UnixStream)> {
    let [ring, files] = refs::recv_fds::<2>(sock, msg)?;
    Ok((ring, UnixStream::from(files)))
}

#[cfg(test)]
mod express_tests;
#[cfg(test)]
mod tests;
