//! Replies, and their encoding behind the common header.

use super::codec::{Reader, Writer};
use super::lock::{LockRange, get_range, put_range};
use super::message::{Op, decode_header, finish, get_path, put_header};
use super::types::{Attr, DirEntry, Entry, RegionInfo, StatFs};
use super::{DecodeError, EncodeError, Errno, MAX_NAME};

/// The reply to `Hello`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloReply {
    /// The version both sides use.
    pub version: u8,
    /// The export's root.
    pub root: Entry,
    /// True when the export refuses every change (`EROFS`).
    pub read_only: bool,
    /// Token that ties a data endpoint to this client.
    pub session: u64,
    /// Most requests the client may have outstanding on its meta endpoint.
    pub max_outstanding: u32,
    /// Largest message, header included, either way.
    pub max_msg: u32,
}

/// The reply to `Open`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The open file handle.
    pub fh: u64,
    /// Fresh attributes (close-to-open consistency).
    pub attr: Attr,
    /// The file's registered pages; `None` for an empty file.
    pub region: Option<RegionInfo>,
}

/// The reply to `MapRegion`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// Attributes after growing.
    pub attr: Attr,
    /// The region now; `None` for an empty file.
    pub region: Option<RegionInfo>,
}

/// Every reply body, one kind per request kind.
#[derive(Clone, Debug, PartialEq, Eq)]
// `Created` (two attribute sets) is the largest; a reply lives only from its decoding to its
// callback, so boxing it would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// To `Hello`.
    Hello(HelloReply),
    /// To `Lookup`, `Walk`, `Mknod`, `Mkdir`, `Symlink`, `Link`.
    Entry(Entry),
    /// To `GetAttr`, `SetAttr`, `Commit`; to `Unlink` and `Rmdir` the parent directory's
    /// attributes after the removal.
    Attr(Attr),
    /// To `Forget`, `Rename`, `Release`, `ReleaseDir`, `Landed`.
    Empty,
    /// To `ReadLink`.
    Link(Vec<u8>),
    /// To `Open`.
    Opened(Opened),
    /// To `Create`: the new file, its handle, and the parent directory's attributes after
    /// the creation.
    Created(Entry, Opened, Attr),
    /// To `MapRegion`.
    Mapped(Mapped),
    /// To `Write`: bytes written and the attributes after.
    Written(u32, Attr),
    /// To `OpenDir`: the directory handle.
    Handle(u64),
    /// To `ReadDir`: entries, and whether the end was reached.
    Dir(Vec<DirEntry>, bool),
    /// To `StatFs`.
    StatFs(StatFs),
    /// To `Append`: the offset the bytes (or the reservation) landed at, and the
    /// attributes after.
    Appended(u64, Attr),
    /// To `GetLock`: the first conflicting lock, or kind `Unlock` when none conflicts.
    Lock(LockRange),
}

fn put_opened(w: &mut Writer, o: &Opened) {
    w.u64(o.fh);
    o.attr.put(w);
    put_region(w, &o.region);
}

fn get_opened(r: &mut Reader<'_>) -> Result<Opened, DecodeError> {
    Ok(Opened {
        fh: r.u64()?,
        attr: Attr::get(r)?,
        region: get_region(r)?,
    })
}

fn put_region(w: &mut Writer, reg: &Option<RegionInfo>) {
    w.bool(reg.is_some());
    if let Some(reg) = reg {
        reg.put(w);
    }
}

fn get_region(r: &mut Reader<'_>) -> Result<Option<RegionInfo>, DecodeError> {
    Ok(if r.bool()? {
        Some(RegionInfo::get(r)?)
    } else {
        None
    })
}

/// Encodes the reply to request `id` of kind `op`: a body, or an error number.
///
/// Fails with [`EncodeError::Mismatch`] when `reply` is not the kind `op` answers with.
pub fn encode_reply(id: u64, op: Op, reply: &Result<Reply, Errno>) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::default();
    let reply = match reply {
        Err(e) => {
            put_header(&mut w, true, op, id, e.code());
            return finish(w);
        }
        Ok(r) => r,
    };
    if reply_op_matches(op, reply).is_err() {
        return Err(EncodeError::Mismatch(op));
    }
    put_header(&mut w, true, op, id, 0);
    match reply {
        Reply::Hello(h) => {
            w.u8(h.version);
            h.root.put(&mut w);
            w.bool(h.read_only);
            w.u64(h.session);
            w.u32(h.max_outstanding);
            w.u32(h.max_msg);
        }
        Reply::Entry(e) => e.put(&mut w),
        Reply::Attr(a) => a.put(&mut w),
        Reply::Empty => {}
        Reply::Link(t) => w.bytes(t),
        Reply::Opened(o) => put_opened(&mut w, o),
        Reply::Created(e, o, parent) => {
            e.put(&mut w);
            put_opened(&mut w, o);
            parent.put(&mut w);
        }
        Reply::Mapped(m) => {
            m.attr.put(&mut w);
            put_region(&mut w, &m.region);
        }
        Reply::Written(n, a) => {
            w.u32(*n);
            a.put(&mut w);
        }
        Reply::Handle(h) => w.u64(*h),
        Reply::Dir(entries, eof) => {
            w.u32(entries.len() as u32);
            for e in entries {
                w.u64(e.ino);
                w.u64(e.next_offset);
                w.u32(e.file_type);
                w.bytes(&e.name);
            }
            w.bool(*eof);
        }
        Reply::StatFs(s) => s.put(&mut w),
        Reply::Appended(off, a) => {
            w.u64(*off);
            a.put(&mut w);
        }
        Reply::Lock(l) => put_range(&mut w, l),
    }
    finish(w)
}

/// Checks that `reply` is the kind of reply `op` gets.
fn reply_op_matches(op: Op, reply: &Reply) -> Result<(), ()> {
    let ok = match reply {
        Reply::Hello(_) => op == Op::Hello,
        Reply::Entry(_) => matches!(
            op,
            Op::Lookup | Op::Walk | Op::Mknod | Op::Mkdir | Op::Symlink | Op::Link
        ),
        Reply::Attr(_) => matches!(
            op,
            Op::GetAttr | Op::SetAttr | Op::Commit | Op::Unlink | Op::Rmdir
        ),
        Reply::Empty => matches!(
            op,
            Op::Forget
                | Op::Rename
                | Op::Release
                | Op::ReleaseDir
                | Op::Landed
                | Op::SetLock
                | Op::SetLockWait
        ),
        Reply::Link(_) => op == Op::ReadLink,
        Reply::Opened(_) => op == Op::Open,
        Reply::Created(..) => op == Op::Create,
        Reply::Mapped(_) => op == Op::MapRegion,
        Reply::Written(..) => op == Op::Write,
        Reply::Handle(_) => op == Op::OpenDir,
        Reply::Dir(..) => op == Op::ReadDir,
        Reply::StatFs(_) => op == Op::StatFs,
        Reply::Appended(..) => op == Op::Append,
        Reply::Lock(_) => op == Op::GetLock,
    };
    if ok { Ok(()) } else { Err(()) }
}

/// Decodes a reply message: its request id, operation and outcome. Never panics.
pub fn decode_reply(buf: &[u8]) -> Result<(u64, Op, Result<Reply, Errno>), DecodeError> {
    let (h, body) = decode_header(buf)?;
    if !h.is_reply {
        return Err(DecodeError::BadValue("kind", 0));
    }
    if let Some(e) = Errno::from_code(h.status) {
        if !body.is_empty() {
            return Err(DecodeError::TrailingBytes(body.len()));
        }
        return Ok((h.id, h.op, Err(e)));
    }
    let r = &mut Reader::new(body);
    let reply = match h.op {
        Op::Hello => Reply::Hello(HelloReply {
            version: r.u8()?,
            root: Entry::get(r)?,
            read_only: r.bool()?,
            session: r.u64()?,
            max_outstanding: r.u32()?,
            max_msg: r.u32()?,
        }),
        Op::Lookup | Op::Walk | Op::Mknod | Op::Mkdir | Op::Symlink | Op::Link => {
            Reply::Entry(Entry::get(r)?)
        }
        Op::GetAttr | Op::SetAttr | Op::Commit | Op::Unlink | Op::Rmdir => {
            Reply::Attr(Attr::get(r)?)
        }
        Op::Forget
        | Op::Rename
        | Op::Release
        | Op::ReleaseDir
        | Op::Landed
        | Op::SetLock
        | Op::SetLockWait => Reply::Empty,
        Op::ReadLink => Reply::Link(get_path(r, "symlink target")?),
        Op::Open => Reply::Opened(get_opened(r)?),
        Op::Create => Reply::Created(Entry::get(r)?, get_opened(r)?, Attr::get(r)?),
        Op::MapRegion => Reply::Mapped(Mapped {
            attr: Attr::get(r)?,
            region: get_region(r)?,
        }),
        Op::Write => Reply::Written(r.u32()?, Attr::get(r)?),
        Op::OpenDir => Reply::Handle(r.u64()?),
        Op::ReadDir => {
            let n = r.u32()? as usize;
            // Each entry takes at least 25 bytes: refuse counts the body cannot hold.
            if n > body.len() / 25 {
                return Err(DecodeError::Truncated);
            }
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(DirEntry {
                    ino: r.u64()?,
                    next_offset: r.u64()?,
                    file_type: r.u32()?,
                    name: {
                        let name = r.bytes(MAX_NAME, "name")?;
                        if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
                            return Err(DecodeError::BadName);
                        }
                        name
                    },
                });
            }
            Reply::Dir(entries, r.bool()?)
        }
        Op::StatFs => Reply::StatFs(StatFs::get(r)?),
        Op::Append => Reply::Appended(r.u64()?, Attr::get(r)?),
        Op::GetLock => Reply::Lock(get_range(r)?),
    };
    r.finish()?;
    Ok((h.id, h.op, Ok(reply)))
}
