//! The data path of one open file, shared by all of this client's handles of it.
//!
//! Reads are RMA reads from the file's registered pages on the server into the caller's
//! registered memory. Writes are RMA writes into those pages; a write that reaches past the
//! file's size (or its registration) first grows the file with `MapRegion` and waits, queued,
//! for the reply, and everything submitted after it queues behind it, so reads and writes
//! reach the server in the order they were submitted (one endpoint executes its operations
//! in order). Errors of writes are kept and reported by the next flush (close) or fsync,
//! as a local file system reports write-back errors.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::{RemoteKey, Sge};
use parking_lot::Mutex;

use super::data::DataCb;
use super::{Error, Inner};
use crate::proto::{Errno, Mapped, RegionInfo, Reply, Request};

/// How far the landed writes must have moved before the server is told (`Landed`): its
/// early writeback works in steps of this size.
const LANDED_STEP: u64 = 8 << 20;

/// Receives the bytes read (fewer than asked at the end of the file) or the error.
pub(crate) type ReadCb = Box<dyn FnOnce(Result<usize, Error>) + Send>;
/// Runs once the file has no writes in flight or queued.
pub(crate) type IdleCb = Box<dyn FnOnce() + Send>;

type Later = Vec<Box<dyn FnOnce() + Send>>;

struct ReadOp {
    fh: u64,
    offset: u64,
    local: Sge,
    cb: ReadCb,
    /// The size and region were asked for again once already.
    refreshed: bool,
}

struct WriteOp {
    fh: u64,
    offset: u64,
    local: Sge,
    cb: DataCb,
    /// Sent again once already (after the file shrank under it).
    retried: bool,
}

impl WriteOp {
    fn end(&self) -> u64 {
        self.offset.saturating_add(self.local.len as u64)
    }
}

enum Queued {
    Read(ReadOp),
    Write(WriteOp),
}

#[derive(Default)]
struct FileInner {
    /// The newest registrations of the file's pages this client knows, read-write and
    /// read-only: the server registers the two kinds apart (with one generation count),
    /// and a writer needs a writable key even when a reader's key is newer.
    rw: Option<RegionInfo>,
    ro: Option<RegionInfo>,
    /// The file's size as this client knows it.
    size: u64,
    /// The size asked for by a `MapRegion` in flight.
    growing: Option<u64>,
    queue: VecDeque<Queued>,
    writes_in_flight: usize,
    /// File offsets where the one-sided writes in flight start (with their counts).
    write_starts: BTreeMap<u64, u32>,
    /// The highest end of a one-sided write that has landed.
    landed_high: u64,
    /// The offset last told to the server with `Landed`.
    landed_told: u64,
    /// Writes carried inside a request (not one-sided), acknowledged to the application
    /// before the server's reply: nothing else of this file starts until they are done.
    request_writes: usize,
    reads_in_flight: usize,
    /// First write error since the last flush.
    error: Option<Errno>,
    /// Written since the last commit.
    dirty: bool,
    idle: Vec<IdleCb>,
    /// When the oldest of `idle` began to wait.
    idle_since: Option<Instant>,
}

impl FileInner {
    /// The callbacks waiting for the file's writes to end, to run now.
    fn take_idle(&mut self) -> Vec<IdleCb> {
        self.idle_since = None;
        std::mem::take(&mut self.idle)
    }

    fn busy_writing(&self) -> bool {
        self.writes_in_flight > 0
            || self.request_writes > 0
            || self.queue.iter().any(|q| matches!(q, Queued::Write(_)))
    }

    fn key_for(&self, end: u64, write: bool) -> Option<RemoteKey> {
        let fits = |r: &&RegionInfo| r.len >= end;
        let rw = self.rw.as_ref().filter(fits);
        let key = if write {
            rw
        } else {
            // The newer of the two, as when one registration was known.
            match (rw, self.ro.as_ref().filter(fits)) {
                (Some(a), Some(b)) => Some(if a.generation >= b.generation { a } else { b }),
                (a, b) => a.or(b),
            }
        };
        key.map(|r| r.remote_key())
    }

    /// A one-sided write starting at `offset` has ended (`landed_end`: where it ended, if
    /// its bytes landed). Returns the offset to tell the server with `Landed`, if every
    /// write below it has now landed and it has moved a step since the last one told.
    fn write_ended(&mut self, offset: u64, landed_end: Option<u64>) -> Option<u64> {
        self.writes_in_flight -= 1;
        if let Some(n) = self.write_starts.get_mut(&offset) {
            *n -= 1;
            if *n == 0 {
                self.write_starts.remove(&offset);
            }
        }
        self.landed_high = self.landed_high.max(landed_end?);
        let upto = match self.write_starts.keys().next() {
            Some(&first) => first.min(self.landed_high),
            None => self.landed_high,
        };
        if upto < self.landed_told.saturating_add(LANDED_STEP) {
            return None;
        }
        self.landed_told = upto;
        Some(upto)
    }

    fn learn(&mut self, size: u64, region: Option<RegionInfo>) {
        self.size = self.size.max(size);
        if let Some(r) = region {
            let slot = if r.writable {
                &mut self.rw
            } else {
                &mut self.ro
            };
            if slot.is_none_or(|old| r.generation >= old.generation || r.len > old.len) {
                *slot = Some(r);
            }
        }
    }
}

/// What this client knows and has in flight for one open file.
pub(crate) struct FileState {
    inner: Mutex<FileInner>,
}

fn run(later: Later) {
    for f in later {
        f();
    }
}

impl FileState {
    pub(crate) fn new() -> Arc<FileState> {
        Arc::new(FileState {
            inner: Mutex::new(FileInner::default()),
        })
    }

    /// Takes fresh attributes and region from an open (close-to-open: they replace what
    /// was known, unless writes of this client are still in flight).
    pub(crate) fn opened(&self, size: u64, region: Option<RegionInfo>) {
        let mut g = self.inner.lock();
        if !g.busy_writing() && g.growing.is_none() {
            g.size = size;
        } else {
            g.size = g.size.max(size);
        }
        g.learn(size, region);
    }

    /// The size set by this client (a truncation or extension it made).
    pub(crate) fn set_size(&self, size: u64) {
        let mut g = self.inner.lock();
        g.size = size;
        // Written again after a truncation: what landed before it says nothing.
        g.landed_high = g.landed_high.min(size);
        g.landed_told = g.landed_told.min(size);
    }

    /// The server reported the file at least this large (after a write this client made).
    pub(crate) fn grown(&self, size: u64) {
        let mut g = self.inner.lock();
        g.size = g.size.max(size);
    }

    /// The size as this client knows it.
    pub(crate) fn size(&self) -> u64 {
        self.inner.lock().size
    }

    /// True when written since the last commit, or writes are in flight.
    pub(crate) fn dirty(&self) -> bool {
        let g = self.inner.lock();
        g.dirty || g.busy_writing()
    }

    /// The first write error since the last flush, left in place for the flush to report.
    pub(crate) fn write_error(&self) -> Option<Errno> {
        self.inner.lock().error
    }

    /// Takes the dirty flag and the first write error since the last call.
    pub(crate) fn take_flush_state(&self) -> (bool, Option<Errno>) {
        let mut g = self.inner.lock();
        (std::mem::take(&mut g.dirty), g.error.take())
    }

    /// Starts a write carried inside a request if nothing else of the file is in flight or
    /// queued (false: nothing started). Until [`FileState::end_request_write`], reads and
    /// one-sided writes queue behind it and [`FileState::when_idle`] waits for it.
    pub(crate) fn begin_request_write(&self) -> bool {
        let mut g = self.inner.lock();
        if g.busy_writing() || g.growing.is_some() || g.reads_in_flight > 0 {
            return false;
        }
        g.request_writes += 1;
        true
    }

    /// The request write begun with [`FileState::begin_request_write`] ended: with the
    /// file's size after it, or the error the next flush, fsync or close reports.
    pub(crate) fn end_request_write(self: &Arc<Self>, c: &Arc<Inner>, r: Result<u64, Errno>) {
        let mut later = Later::new();
        {
            let mut g = self.inner.lock();
            g.request_writes = g.request_writes.saturating_sub(1);
            match r {
                Ok(size) => g.size = g.size.max(size),
                Err(e) => {
                    g.error.get_or_insert(e);
                }
            }
            self.drain(&mut g, c, &mut later);
        }
        run(later);
    }

    /// Runs `f` once no write of this file is in flight or queued (at once if none is).
    pub(crate) fn when_idle(&self, f: IdleCb) {
        let mut g = self.inner.lock();
        if g.busy_writing() {
            g.idle.push(f);
            g.idle_since.get_or_insert_with(Instant::now);
        } else {
            drop(g);
            f();
        }
    }

    /// A flush, fsync or close has waited longer than `timeout` for this file's writes to
    /// end: it goes on now with `ETIMEDOUT` as the file's write error, which it reports,
    /// rather than wait without bound (as a request does after `op_timeout`). A write
    /// whose completion never comes would otherwise hold every later flush for ever.
    /// True if anything was waiting that long.
    pub(crate) fn expire_idle(&self, timeout: Duration) -> bool {
        let cbs = {
            let mut g = self.inner.lock();
            if g.idle_since.is_none_or(|t| t.elapsed() < timeout) {
                return false;
            }
            g.error.get_or_insert(Errno::ETIMEDOUT);
            g.take_idle()
        };
        for f in cbs {
            f();
        }
        true
    }

    /// Reads into `local` from file offset `offset`; `cb` gets the bytes read.
    pub(crate) fn read(
        self: &Arc<Self>,
        c: &Arc<Inner>,
        fh: u64,
        offset: u64,
        local: Sge,
        cb: ReadCb,
    ) {
        let op = ReadOp {
            fh,
            offset,
            local,
            cb,
            refreshed: false,
        };
        let mut later = Later::new();
        {
            let mut g = self.inner.lock();
            if g.queue.is_empty() && g.request_writes == 0 {
                self.start_read(&mut g, c, op, &mut later);
            } else {
                g.queue.push_back(Queued::Read(op));
            }
        }
        run(later);
    }

    /// Writes `local` at file offset `offset`; `cb` runs when the bytes are in the
    /// server's page cache.
    pub(crate) fn write(
        self: &Arc<Self>,
        c: &Arc<Inner>,
        fh: u64,
        offset: u64,
        local: Sge,
        cb: DataCb,
    ) {
        let op = WriteOp {
            fh,
            offset,
            local,
            cb,
            retried: false,
        };
        let mut later = Later::new();
        {
            let mut g = self.inner.lock();
            g.dirty = true;
            let end = op.end();
            if g.queue.is_empty()
                && g.request_writes == 0
                && end <= g.size
                && g.key_for(end, true).is_some()
            {
                self.start_write(&mut g, c, op, &mut later);
            } else {
                g.queue.push_back(Queued::Write(op));
                self.grow(&mut g, c, fh, end, &mut later);
            }
        }
        run(later);
    }

    fn start_read(
        self: &Arc<Self>,
        g: &mut FileInner,
        c: &Arc<Inner>,
        op: ReadOp,
        later: &mut Later,
    ) {
        let len = op.local.len as u64;
        let end = op.offset.saturating_add(len);
        if (end > g.size || g.key_for(end.min(g.size), false).is_none()) && !op.refreshed {
            // The file may have grown elsewhere, or been registered anew: ask once.
            return self.refresh_then_read(c, op, later);
        }
        let n = len.min(g.size.saturating_sub(op.offset));
        if n == 0 {
            let cb = op.cb;
            later.push(Box::new(move || cb(Ok(0))));
            return;
        }
        let Some(key) = g.key_for(op.offset + n, false) else {
            let cb = op.cb;
            later.push(Box::new(move || cb(Err(Error::Remote(Errno::EIO)))));
            return;
        };
        let local = Sge {
            len: n as usize,
            ..op.local.clone()
        };
        g.reads_in_flight += 1;
        let me = self.clone();
        let c2 = c.clone();
        let ReadOp {
            fh,
            offset,
            local: whole,
            cb: user_cb,
            refreshed,
        } = op;
        let cb: DataCb = Box::new(move |r| {
            let mut later = Later::new();
            {
                let mut g = me.inner.lock();
                g.reads_in_flight -= 1;
                match r {
                    Ok(()) => later.push(Box::new(move || user_cb(Ok(n as usize)))),
                    Err(Error::Access) if !refreshed => {
                        // Shrunk or registered anew since: ask for the size, then retry once.
                        let op = ReadOp {
                            fh,
                            offset,
                            local: whole,
                            cb: user_cb,
                            refreshed: false,
                        };
                        me.refresh_then_read(&c2, op, &mut later);
                    }
                    Err(e) => later.push(Box::new(move || user_cb(Err(e)))),
                }
            }
            run(later);
        });
        if let Err((e, cb)) = c.data.read(local, &key, offset, cb) {
            // The callback comes back unrun; running it (after the lock) takes its count
            // back, as a completion would.
            later.push(Box::new(move || cb(Err(e))));
        }
    }

    /// Asks the server for the file's size and region, then reads (without asking again).
    fn refresh_then_read(self: &Arc<Self>, c: &Arc<Inner>, op: ReadOp, later: &mut Later) {
        let me = self.clone();
        let c2 = c.clone();
        let fh = op.fh;
        let cb: super::rpc::RpcCallback = Box::new(move |r| {
            let mut later = Later::new();
            {
                let mut g = me.inner.lock();
                if let Ok(Reply::Mapped(m)) = &r {
                    g.size = m.attr.size.max(if g.busy_writing() { g.size } else { 0 });
                    g.learn(m.attr.size, m.region);
                }
                let op = ReadOp {
                    refreshed: true,
                    ..op
                };
                me.start_read(&mut g, &c2, op, &mut later);
            }
            run(later);
        });
        if let Err((e, cb)) = c.rpc.call(&Request::MapRegion { fh, min_size: 0 }, cb) {
            later.push(Box::new(move || cb(Err(e))));
        }
    }

    fn start_write(
        self: &Arc<Self>,
        g: &mut FileInner,
        c: &Arc<Inner>,
        op: WriteOp,
        later: &mut Later,
    ) {
        let end = op.end();
        let Some(key) = g.key_for(end, true) else {
            g.error.get_or_insert(Errno::EIO);
            let cb = op.cb;
            later.push(Box::new(move || cb(Err(Error::Remote(Errno::EIO)))));
            return;
        };
        g.writes_in_flight += 1;
        *g.write_starts.entry(op.offset).or_default() += 1;
        let me = self.clone();
        let c2 = c.clone();
        let WriteOp {
            fh,
            offset,
            local,
            cb: user_cb,
            retried,
        } = op;
        let again = local.clone();
        let cb: DataCb = Box::new(move |r| {
            let mut later = Later::new();
            let done = {
                let mut g = me.inner.lock();
                let landed_end = r.is_ok().then(|| offset.saturating_add(again.len as u64));
                if let Some(upto) = g.write_ended(offset, landed_end) {
                    // A hint for the server's early writeback; its answer changes nothing.
                    let c3 = c2.clone();
                    later.push(Box::new(move || {
                        let _ = c3.rpc.call(&Request::Landed { fh, upto }, Box::new(|_| {}));
                    }));
                }
                match r {
                    Err(Error::Access) if !retried => {
                        // The file shrank under the write (another client or a local
                        // process truncated it): grow it again, then write once more.
                        g.size = g.size.min(offset);
                        let op = WriteOp {
                            fh,
                            offset,
                            local: again,
                            cb: user_cb,
                            retried: true,
                        };
                        let end = op.end();
                        g.queue.push_front(Queued::Write(op));
                        me.grow(&mut g, &c2, fh, end, &mut later);
                        None
                    }
                    r => {
                        if let Err(e) = &r {
                            g.error.get_or_insert(e.errno());
                        }
                        let idle = if g.busy_writing() {
                            Vec::new()
                        } else {
                            g.take_idle()
                        };
                        Some((user_cb, r, idle))
                    }
                }
            };
            run(later);
            if let Some((user_cb, r, idle)) = done {
                user_cb(r);
                for f in idle {
                    f();
                }
            }
        });
        if let Err((e, cb)) = c.data.write(local, &key, offset, cb) {
            // The callback comes back unrun; running it (after the lock) takes its count
            // back and records the error, as a failed completion would. (Taking the count
            // here as well left the file busy for ever: a flush, fsync or close then never
            // ended.)
            later.push(Box::new(move || cb(Err(e))));
        }
    }

    /// Grows the file to at least `end` unless a `MapRegion` is already in flight (its
    /// reply drains the queue and grows further if needed).
    /// Grows the file to cover every queued write (at least `end`) unless a `MapRegion` is
    /// already in flight: its reply drains the queue and grows again for what queued
    /// meanwhile, so a stream of appends costs one round trip per batch, not per write.
    fn grow(
        self: &Arc<Self>,
        g: &mut FileInner,
        c: &Arc<Inner>,
        fh: u64,
        end: u64,
        later: &mut Later,
    ) {
        if g.growing.is_some() {
            return;
        }
        let end = g
            .queue
            .iter()
            .filter_map(|q| match q {
                Queued::Write(w) => Some(w.end()),
                Queued::Read(_) => None,
            })
            .fold(end, u64::max);
        g.growing = Some(end);
        let me = self.clone();
        let c2 = c.clone();
        let sent = c.rpc.call(
            &Request::MapRegion { fh, min_size: end },
            Box::new(move |r| me.on_mapped(&c2, r)),
        );
        if let Err((e, _unrun)) = sent {
            g.growing = None;
            self.fail_queue(g, e, later);
        }
    }

    fn on_mapped(self: &Arc<Self>, c: &Arc<Inner>, r: Result<Reply, Error>) {
        let mut later = Later::new();
        {
            let mut g = self.inner.lock();
            g.growing = None;
            match r {
                Ok(Reply::Mapped(Mapped { attr, region })) => {
                    g.learn(attr.size, region);
                    self.drain(&mut g, c, &mut later);
                }
                Ok(other) => self.fail_queue(
                    &mut g,
                    Error::Protocol(format!("MapRegion answered {other:?}")),
                    &mut later,
                ),
                Err(e) => self.fail_queue(&mut g, e, &mut later),
            }
        }
        run(later);
    }

    /// Starts queued operations, in order, while they can start.
    fn drain(self: &Arc<Self>, g: &mut FileInner, c: &Arc<Inner>, later: &mut Later) {
        if g.request_writes > 0 {
            return; // its end drains
        }
        while let Some(front) = g.queue.front() {
            if let Queued::Write(w) = front {
                let end = w.end();
                if end > g.size || g.key_for(end, true).is_none() {
                    let fh = w.fh;
                    self.grow(g, c, fh, end, later);
                    return;
                }
            }
            match g.queue.pop_front() {
                Some(Queued::Read(r)) => self.start_read(g, c, r, later),
                Some(Queued::Write(w)) => self.start_write(g, c, w, later),
                None => {}
            }
        }
        if !g.busy_writing() {
            later.extend(g.take_idle());
        }
    }

    fn fail_queue(&self, g: &mut FileInner, e: Error, later: &mut Later) {
        for q in g.queue.drain(..) {
            let e = e.clone();
            match q {
                Queued::Read(r) => later.push(Box::new(move || (r.cb)(Err(e)))),
                Queued::Write(w) => {
                    g.error.get_or_insert(e.errno());
                    later.push(Box::new(move || (w.cb)(Err(e))));
                }
            }
        }
        later.extend(g.take_idle());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush waiting for writes that never end goes on after the timeout, with
    /// `ETIMEDOUT` as the write error it reports; one waiting less long stays.
    #[test]
    fn a_flush_waits_for_writes_at_most_the_timeout() {
        let f = FileState::new();
        assert!(f.begin_request_write(), "idle at first");
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = ran.clone();
        f.when_idle(Box::new(move || {
            r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        assert!(!f.expire_idle(Duration::from_secs(60)), "not yet");
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(f.expire_idle(Duration::ZERO));
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(f.take_flush_state(), (false, Some(Errno::ETIMEDOUT)));
        assert!(!f.expire_idle(Duration::ZERO), "nothing waits any more");
    }

    /// The server hears of landed writes once every write below has landed, a step at a
    /// time, and never of bytes that did not land.
    #[test]
    fn landed_writes_are_told_in_steps_below_every_write_in_flight() {
        const MIB: u64 = 1 << 20;
        let mut g = FileInner::default();
        let start = |g: &mut FileInner, at: u64| {
            g.writes_in_flight += 1;
            *g.write_starts.entry(at).or_default() += 1;
        };
        for i in 0..12 {
            start(&mut g, i * MIB);
        }
        // Out of order: 1..9 MiB land while the first write is still in flight.
        for i in 1..9 {
            assert_eq!(g.write_ended(i * MIB, Some((i + 1) * MIB)), None, "{i}");
        }
        assert_eq!(
            g.write_ended(0, Some(MIB)),
            Some(9 * MIB),
            "all below 9 MiB landed"
        );
        // A failed write lands nothing; the next step needs 17 MiB.
        assert_eq!(g.write_ended(9 * MIB, None), None);
        assert_eq!(g.write_ended(10 * MIB, Some(11 * MIB)), None);
        for i in 12..20 {
            start(&mut g, i * MIB);
        }
        assert_eq!(g.write_ended(11 * MIB, Some(12 * MIB)), None);
        for i in 12..16 {
            assert_eq!(g.write_ended(i * MIB, Some((i + 1) * MIB)), None, "{i}");
        }
        assert_eq!(g.write_ended(16 * MIB, Some(17 * MIB)), Some(17 * MIB));
        assert_eq!(g.write_ended(17 * MIB, Some(18 * MIB)), None);
        assert_eq!(g.writes_in_flight, 2);
        assert_eq!(
            g.write_starts.keys().copied().collect::<Vec<_>>(),
            [18 * MIB, 19 * MIB]
        );
    }

    fn reg(key: u64, generation: u64, writable: bool) -> RegionInfo {
        RegionInfo {
            key,
            len: 1 << 20,
            generation,
            writable,
        }
    }

    /// A reader's open made a read-only registration after the read-write one a writer of
    /// this client still uses (the server keeps both): writes keep the writable key, reads
    /// take the newer. With one slot the writer lost its key for good and grew the file
    /// in a loop of `MapRegion`s that kept returning the older writable key.
    #[test]
    fn a_newer_read_only_registration_leaves_writes_their_writable_key() {
        let mut f = FileInner::default();
        f.learn(65536, Some(reg(1, 1, true)));
        f.learn(65536, Some(reg(2, 2, false)));
        assert_eq!(f.key_for(4096, true).map(|k| k.key), Some(1));
        assert_eq!(f.key_for(4096, false).map(|k| k.key), Some(2));
        // Learning the older writable one again (a MapRegion's reply) changes nothing.
        f.learn(65536, Some(reg(1, 1, true)));
        assert_eq!(f.key_for(4096, true).map(|k| k.key), Some(1));
        // A newer writable registration replaces it, and serves reads too.
        f.learn(65536, Some(reg(3, 3, true)));
        assert_eq!(f.key_for(4096, true).map(|k| k.key), Some(3));
        assert_eq!(f.key_for(4096, false).map(|k| k.key), Some(3));
        // Nothing covers a range past every registration.
        assert!(f.key_for((1 << 20) + 1, false).is_none());
    }

    #[test]
    fn without_a_writable_registration_writes_have_no_key() {
        let mut f = FileInner::default();
        f.learn(10, Some(reg(7, 1, false)));
        assert!(f.key_for(10, true).is_none());
        assert_eq!(f.key_for(10, false).map(|k| k.key), Some(7));
    }
}
