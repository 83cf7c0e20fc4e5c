//! Requests, and their encoding behind the common header (replies: [`super::reply`]).

use super::caller::Caller;
use super::codec::{Reader, Writer};
use super::lock::LockRequest;
use super::types::{Creds, NodeId, SetAttr};
use super::{DecodeError, EncodeError, HEADER_LEN, MAGIC, MAX_MSG, MAX_NAME, MAX_PATH, VERSION};

/// Which connection of a client an endpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Carries the RPCs.
    Meta,
    /// Carries only one-sided reads and writes (so they never delay an RPC).
    Data,
}

/// `flags` of [`Request::Commit`]: write the file's data to stable storage (`fsync`).
pub const COMMIT_SYNC: u32 = 1;
/// `flags` of [`Request::Commit`]: only the data (`fdatasync`).
pub const COMMIT_DATASYNC: u32 = 2;
/// `flags` of [`Request::Commit`]: set the modification time to now (one-sided writes do
/// not always update it).
pub const COMMIT_TOUCH: u32 = 4;
const COMMIT_ALL: u32 = COMMIT_SYNC | COMMIT_DATASYNC | COMMIT_TOUCH;

/// Every request a client can send. Each gets exactly one reply with the same id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// First message on every endpoint.
    Hello {
        /// Highest protocol version the client speaks.
        version: u8,
        /// What this endpoint is for.
        role: Role,
        /// For a data endpoint: the session token of the client's meta endpoint.
        session: u64,
    },
    /// Resolves one name in a directory (no `/`, not `.` or `..`); does not follow a final
    /// symlink.
    Lookup {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
    },
    /// Resolves a relative path beneath `parent`, never leaving the export.
    Walk {
        /// Where the path starts.
        parent: NodeId,
        /// A relative path.
        path: Vec<u8>,
        /// Follow a final symlink (inside the export).
        follow: bool,
    },
    /// Drops lookup references.
    Forget {
        /// (handle, number of references).
        items: Vec<(NodeId, u64)>,
    },
    /// Attributes.
    GetAttr {
        /// The object.
        node: NodeId,
    },
    /// Changes attributes.
    SetAttr {
        /// The object.
        node: NodeId,
        /// An open file handle of it, or 0.
        fh: u64,
        /// What to change.
        set: SetAttr,
    },
    /// A symlink's target.
    ReadLink {
        /// The symlink.
        node: NodeId,
    },
    /// Makes a device node, FIFO, socket or regular file.
    Mknod {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
        /// Type and permission bits.
        mode: u32,
        /// Device number.
        rdev: u32,
        /// Owner and umask.
        creds: Creds,
    },
    /// Makes a directory.
    Mkdir {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
        /// Permission bits.
        mode: u32,
        /// Owner and umask.
        creds: Creds,
    },
    /// Removes a name that is not a directory.
    Unlink {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
    },
    /// Removes an empty directory.
    Rmdir {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
    },
    /// Makes a symlink.
    Symlink {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
        /// What it points to (stored verbatim, never followed by the server outside the
        /// export).
        target: Vec<u8>,
        /// Owner.
        creds: Creds,
    },
    /// Renames (`renameat2` flags: `RENAME_NOREPLACE`, `RENAME_EXCHANGE`).
    Rename {
        /// Source directory.
        parent: NodeId,
        /// Source name.
        name: Vec<u8>,
        /// Target directory.
        new_parent: NodeId,
        /// Target name.
        new_name: Vec<u8>,
        /// `renameat2` flags.
        flags: u32,
    },
    /// Makes a hard link.
    Link {
        /// Existing object.
        node: NodeId,
        /// Directory of the new name.
        new_parent: NodeId,
        /// New name.
        new_name: Vec<u8>,
    },
    /// Opens a regular file for the data path.
    Open {
        /// The file.
        node: NodeId,
        /// `O_ACCMODE` bits, `O_TRUNC`, `O_APPEND`.
        flags: u32,
    },
    /// Creates and opens a regular file.
    Create {
        /// Directory.
        parent: NodeId,
        /// Name.
        name: Vec<u8>,
        /// Permission bits.
        mode: u32,
        /// Open flags (`O_EXCL` honoured).
        flags: u32,
        /// Owner and umask.
        creds: Creds,
    },
    /// Closes an open file handle.
    Release {
        /// The handle.
        fh: u64,
    },
    /// Makes one-sided writes durable or dated: see the `COMMIT_*` flags.
    Commit {
        /// The handle.
        fh: u64,
        /// `COMMIT_*` bits.
        flags: u32,
    },
    /// Grows the file to at least `min_size` (0: no change) and returns its current region.
    MapRegion {
        /// The handle.
        fh: u64,
        /// Size the file must have at least.
        min_size: u64,
    },
    /// Every one-sided write of this client below `upto` has landed: the server may start
    /// writing that range back to its disk (a hint; the commit is what makes data durable).
    Landed {
        /// The handle.
        fh: u64,
        /// File offset below which no write of this client is in flight.
        upto: u64,
    },
    /// Writes bytes carried in the request (small writes).
    Write {
        /// The handle.
        fh: u64,
        /// File offset.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Opens a directory for reading.
    OpenDir {
        /// The directory.
        node: NodeId,
    },
    /// Reads entries after `offset` (0: from the start).
    ReadDir {
        /// Directory handle.
        dh: u64,
        /// Continue after the entry whose `next_offset` this is.
        offset: u64,
        /// Most bytes of names to return.
        max_bytes: u32,
    },
    /// Closes a directory handle.
    ReleaseDir {
        /// The handle.
        dh: u64,
    },
    /// File system statistics.
    StatFs,
    /// Writes at the file's end as the server finds it, atomically with respect to every
    /// other append and growth of the file (`O_APPEND`).
    Append {
        /// The handle.
        fh: u64,
        /// Bytes to append; empty with `reserve > 0` to only reserve that many bytes at the
        /// end (grown with zeros), which the client then writes one-sided.
        data: Vec<u8>,
        /// Bytes to reserve when `data` is empty; 0 otherwise.
        reserve: u64,
    },
    /// The first lock that would conflict with the one described (`F_GETLK`).
    GetLock(LockRequest),
    /// Takes or releases a lock, failing with `EAGAIN` on a conflict (`F_SETLK`).
    SetLock(LockRequest),
    /// Takes a lock, waiting for conflicting ones to go (`F_SETLKW`): answered when
    /// granted, with `EDEADLK` when waiting would deadlock, `ECANCELED` when its owner
    /// released its locks of the file meanwhile.
    SetLockWait(LockRequest),
}

/// Operation codes (the header's `op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
#[allow(missing_docs)]
pub enum Op {
    Hello = 1,
    Lookup = 2,
    Walk = 3,
    Forget = 4,
    GetAttr = 5,
    SetAttr = 6,
    ReadLink = 7,
    Mknod = 8,
    Mkdir = 9,
    Unlink = 10,
    Rmdir = 11,
    Symlink = 12,
    Rename = 13,
    Link = 14,
    Open = 15,
    Create = 16,
    Release = 17,
    Commit = 18,
    MapRegion = 19,
    Write = 20,
    OpenDir = 21,
    ReadDir = 22,
    ReleaseDir = 23,
    StatFs = 24,
    Landed = 25,
    Append = 26,
    GetLock = 27,
    SetLock = 28,
    SetLockWait = 29,
}

impl Op {
    const ALL: [Op; 29] = [
        Op::Hello,
        Op::Lookup,
        Op::Walk,
        Op::Forget,
        Op::GetAttr,
        Op::SetAttr,
        Op::ReadLink,
        Op::Mknod,
        Op::Mkdir,
        Op::Unlink,
        Op::Rmdir,
        Op::Symlink,
        Op::Rename,
        Op::Link,
        Op::Open,
        Op::Create,
        Op::Release,
        Op::Commit,
        Op::MapRegion,
        Op::Write,
        Op::OpenDir,
        Op::ReadDir,
        Op::ReleaseDir,
        Op::StatFs,
        Op::Landed,
        Op::Append,
        Op::GetLock,
        Op::SetLock,
        Op::SetLockWait,
    ];

    /// The op with this code.
    pub fn from_code(c: u16) -> Option<Op> {
        Op::ALL.iter().copied().find(|o| *o as u16 == c)
    }
}

impl Request {
    /// Its operation code.
    pub fn op(&self) -> Op {
        match self {
            Request::Hello { .. } => Op::Hello,
            Request::Lookup { .. } => Op::Lookup,
            Request::Walk { .. } => Op::Walk,
            Request::Forget { .. } => Op::Forget,
            Request::GetAttr { .. } => Op::GetAttr,
            Request::SetAttr { .. } => Op::SetAttr,
            Request::ReadLink { .. } => Op::ReadLink,
            Request::Mknod { .. } => Op::Mknod,
            Request::Mkdir { .. } => Op::Mkdir,
            Request::Unlink { .. } => Op::Unlink,
            Request::Rmdir { .. } => Op::Rmdir,
            Request::Symlink { .. } => Op::Symlink,
            Request::Rename { .. } => Op::Rename,
            Request::Link { .. } => Op::Link,
            Request::Open { .. } => Op::Open,
            Request::Create { .. } => Op::Create,
            Request::Release { .. } => Op::Release,
            Request::Commit { .. } => Op::Commit,
            Request::MapRegion { .. } => Op::MapRegion,
            Request::Landed { .. } => Op::Landed,
            Request::Write { .. } => Op::Write,
            Request::OpenDir { .. } => Op::OpenDir,
            Request::ReadDir { .. } => Op::ReadDir,
            Request::ReleaseDir { .. } => Op::ReleaseDir,
            Request::StatFs => Op::StatFs,
            Request::Append { .. } => Op::Append,
            Request::GetLock(_) => Op::GetLock,
            Request::SetLock(_) => Op::SetLock,
            Request::SetLockWait(_) => Op::SetLockWait,
        }
    }

    /// True for requests that change the file system (refused by a read-only export).
    pub fn modifies(&self) -> bool {
        matches!(
            self,
            Request::SetAttr { .. }
                | Request::Mknod { .. }
                | Request::Mkdir { .. }
                | Request::Unlink { .. }
                | Request::Rmdir { .. }
                | Request::Symlink { .. }
                | Request::Rename { .. }
                | Request::Link { .. }
                | Request::Create { .. }
                | Request::Write { .. }
                | Request::Append { .. }
        )
    }
}

/// The fixed header in front of every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// True for a reply.
    pub is_reply: bool,
    /// Operation.
    pub op: Op,
    /// Request id, chosen by the client, echoed by the reply.
    pub id: u64,
    /// Reply status: 0 or a wire errno; always 0 in requests.
    pub status: u32,
    /// Bytes after the header.
    pub body_len: u32,
}

pub(super) fn put_header(w: &mut Writer, is_reply: bool, op: Op, id: u64, status: u32) {
    w.u16(MAGIC);
    w.u8(VERSION);
    w.u8(is_reply as u8);
    w.u16(op as u16);
    w.u16(0);
    w.u64(id);
    w.u32(status);
    w.u32(0); // body length, patched by `finish`
}

pub(super) fn finish(mut w: Writer) -> Result<Vec<u8>, EncodeError> {
    let len = w.buf.len();
    if len > MAX_MSG {
        return Err(EncodeError::TooLarge(len));
    }
    let body = (len - HEADER_LEN) as u32;
    w.buf[20..24].copy_from_slice(&body.to_le_bytes());
    Ok(w.buf)
}

/// Decodes and checks the header of a message; returns it and the body.
pub fn decode_header(buf: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
    if buf.len() > MAX_MSG {
        return Err(DecodeError::TooLong("message", buf.len()));
    }
    let mut r = Reader::new(buf);
    let magic = r.u16()?;
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = r.u8()?;
    if version != VERSION {
        return Err(DecodeError::Version(version));
    }
    let is_reply = match r.u8()? {
        0 => false,
        1 => true,
        v => return Err(DecodeError::BadValue("kind", v as u64)),
    };
    let code = r.u16()?;
    let op = Op::from_code(code).ok_or(DecodeError::UnknownOp(code))?;
    let flags = r.u16()?;
    if flags != 0 {
        return Err(DecodeError::BadValue("flags", flags as u64));
    }
    let id = r.u64()?;
    let status = r.u32()?;
    let body_len = r.u32()?;
    let body = &buf[HEADER_LEN..];
    if body.len() != body_len as usize {
        return Err(DecodeError::LengthMismatch {
            header: body_len,
            actual: body.len(),
        });
    }
    if !is_reply && status != 0 {
        return Err(DecodeError::BadValue("request status", status as u64));
    }
    Ok((
        Header {
            is_reply,
            op,
            id,
            status,
            body_len,
        },
        body,
    ))
}

/// A single path component: 1..=255 bytes, no `/` or NUL, not `.` or `..`.
fn check_name(name: &[u8]) -> Result<(), DecodeError> {
    if name.is_empty() || name == b"." || name == b".." {
        return Err(DecodeError::BadName);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(DecodeError::BadName);
    }
    Ok(())
}

fn get_name(r: &mut Reader<'_>) -> Result<Vec<u8>, DecodeError> {
    let n = r.bytes(MAX_NAME, "name")?;
    check_name(&n)?;
    Ok(n)
}

/// A path or symlink target: 1..=4096 bytes without NUL.
pub(super) fn get_path(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<u8>, DecodeError> {
    let p = r.bytes(MAX_PATH, what)?;
    if p.is_empty() || p.contains(&0) {
        return Err(DecodeError::BadName);
    }
    Ok(p)
}

/// Encodes a request with id `id`, made by `caller`.
pub fn encode_request(id: u64, caller: &Caller, req: &Request) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::default();
    put_header(&mut w, false, req.op(), id, 0);
    caller.put(&mut w);
    match req {
        Request::Hello {
            version,
            role,
            session,
        } => {
            w.u8(*version);
            w.u8(match role {
                Role::Meta => 0,
                Role::Data => 1,
            });
            w.u64(*session);
        }
        Request::Lookup { parent, name }
        | Request::Unlink { parent, name }
        | Request::Rmdir { parent, name } => {
            parent.put(&mut w);
            w.bytes(name);
        }
        Request::Walk {
            parent,
            path,
            follow,
        } => {
            parent.put(&mut w);
            w.bytes(path);
            w.bool(*follow);
        }
        Request::Forget { items } => {
            w.u32(items.len() as u32);
            for (n, count) in items {
                n.put(&mut w);
                w.u64(*count);
            }
        }
        Request::GetAttr { node } | Request::ReadLink { node } | Request::OpenDir { node } => {
            node.put(&mut w)
        }
        Request::SetAttr { node, fh, set } => {
            node.put(&mut w);
            w.u64(*fh);
            set.put(&mut w);
        }
        Request::Mknod {
            parent,
            name,
            mode,
            rdev,
            creds,
        } => {
            parent.put(&mut w);
            w.bytes(name);
            w.u32(*mode);
            w.u32(*rdev);
            creds.put(&mut w);
        }
        Request::Mkdir {
            parent,
            name,
            mode,
            creds,
        } => {
            parent.put(&mut w);
            w.bytes(name);
            w.u32(*mode);
            creds.put(&mut w);
        }
        Request::Symlink {
            parent,
            name,
            target,
            creds,
        } => {
            parent.put(&mut w);
            w.bytes(name);
            w.bytes(target);
            creds.put(&mut w);
        }
        Request::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } => {
            parent.put(&mut w);
            w.bytes(name);
            new_parent.put(&mut w);
            w.bytes(new_name);
            w.u32(*flags);
        }
        Request::Link {
            node,
            new_parent,
            new_name,
        } => {
            node.put(&mut w);
            new_parent.put(&mut w);
            w.bytes(new_name);
        }
        Request::Open { node, flags } => {
            node.put(&mut w);
            w.u32(*flags);
        }
        Request::Create {
            parent,
            name,
            mode,
            flags,
            creds,
        } => {
            parent.put(&mut w);
            w.bytes(name);
            w.u32(*mode);
            w.u32(*flags);
            creds.put(&mut w);
        }
        Request::Release { fh } | Request::ReleaseDir { dh: fh } => w.u64(*fh),
        Request::Commit { fh, flags } => {
            w.u64(*fh);
            w.u32(*flags);
        }
        Request::MapRegion { fh, min_size: n } | Request::Landed { fh, upto: n } => {
            w.u64(*fh);
            w.u64(*n);
        }
        Request::Write { fh, offset, data } => {
            w.u64(*fh);
            w.u64(*offset);
            w.bytes(data);
        }
        Request::ReadDir {
            dh,
            offset,
            max_bytes,
        } => {
            w.u64(*dh);
            w.u64(*offset);
            w.u32(*max_bytes);
        }
        Request::StatFs => {}
        Request::Append { fh, data, reserve } => {
            w.u64(*fh);
            w.bytes(data);
            w.u64(*reserve);
        }
        Request::GetLock(l) | Request::SetLock(l) | Request::SetLockWait(l) => l.put(&mut w),
    }
    finish(w)
}

/// Decodes a request message (header, caller envelope and body): its id, who made it and
/// the request. Never panics; every malformed input is an error.
pub fn decode_request(buf: &[u8]) -> Result<(u64, Caller, Request), DecodeError> {
    let (h, body) = decode_header(buf)?;
    if h.is_reply {
        return Err(DecodeError::BadValue("kind", 1));
    }
    let r = &mut Reader::new(body);
    let caller = Caller::get(r)?;
    let req = match h.op {
        Op::Hello => {
            let version = r.u8()?;
            let role = match r.u8()? {
                0 => Role::Meta,
                1 => Role::Data,
                v => return Err(DecodeError::BadValue("role", v as u64)),
            };
            Request::Hello {
                version,
                role,
                session: r.u64()?,
            }
        }
        Op::Lookup => Request::Lookup {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
        },
        Op::Unlink => Request::Unlink {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
        },
        Op::Rmdir => Request::Rmdir {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
        },
        Op::Walk => Request::Walk {
            parent: NodeId::get(r)?,
            path: get_path(r, "path")?,
            follow: r.bool()?,
        },
        Op::Forget => {
            let n = r.u32()? as usize;
            // Each item is 24 bytes: refuse counts the body cannot hold before allocating.
            if n > body.len() / 24 {
                return Err(DecodeError::Truncated);
            }
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push((NodeId::get(r)?, r.u64()?));
            }
            Request::Forget { items }
        }
        Op::GetAttr => Request::GetAttr {
            node: NodeId::get(r)?,
        },
        Op::ReadLink => Request::ReadLink {
            node: NodeId::get(r)?,
        },
        Op::OpenDir => Request::OpenDir {
            node: NodeId::get(r)?,
        },
        Op::SetAttr => Request::SetAttr {
            node: NodeId::get(r)?,
            fh: r.u64()?,
            set: SetAttr::get(r)?,
        },
        Op::Mknod => Request::Mknod {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
            mode: r.u32()?,
            rdev: r.u32()?,
            creds: Creds::get(r)?,
        },
        Op::Mkdir => Request::Mkdir {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
            mode: r.u32()?,
            creds: Creds::get(r)?,
        },
        Op::Symlink => Request::Symlink {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
            target: get_path(r, "symlink target")?,
            creds: Creds::get(r)?,
        },
        Op::Rename => Request::Rename {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
            new_parent: NodeId::get(r)?,
            new_name: get_name(r)?,
            flags: r.u32()?,
        },
        Op::Link => Request::Link {
            node: NodeId::get(r)?,
            new_parent: NodeId::get(r)?,
            new_name: get_name(r)?,
        },
        Op::Open => Request::Open {
            node: NodeId::get(r)?,
            flags: r.u32()?,
        },
        Op::Create => Request::Create {
            parent: NodeId::get(r)?,
            name: get_name(r)?,
            mode: r.u32()?,
            flags: r.u32()?,
            creds: Creds::get(r)?,
        },
        Op::Release => Request::Release { fh: r.u64()? },
        Op::ReleaseDir => Request::ReleaseDir { dh: r.u64()? },
        Op::Commit => {
            let fh = r.u64()?;
            let flags = r.u32()?;
            if flags & !COMMIT_ALL != 0 {
                return Err(DecodeError::BadValue("commit flags", flags as u64));
            }
            Request::Commit { fh, flags }
        }
        Op::MapRegion => Request::MapRegion {
            fh: r.u64()?,
            min_size: r.u64()?,
        },
        Op::Landed => Request::Landed {
            fh: r.u64()?,
            upto: r.u64()?,
        },
        Op::Write => Request::Write {
            fh: r.u64()?,
            offset: r.u64()?,
            data: r.bytes(MAX_MSG, "write data")?,
        },
        Op::ReadDir => Request::ReadDir {
            dh: r.u64()?,
            offset: r.u64()?,
            max_bytes: r.u32()?,
        },
        Op::StatFs => Request::StatFs,
        Op::Append => {
            let fh = r.u64()?;
            let data = r.bytes(MAX_MSG, "append data")?;
            let reserve = r.u64()?;
            if data.is_empty() == (reserve == 0) {
                return Err(DecodeError::BadValue("append reserve", reserve));
            }
            Request::Append { fh, data, reserve }
        }
        Op::GetLock => Request::GetLock(LockRequest::get(r)?),
        Op::SetLock => Request::SetLock(LockRequest::get(r)?),
        Op::SetLockWait => Request::SetLockWait(LockRequest::get(r)?),
    };
    r.finish()?;
    Ok((h.id, caller, req))
}
