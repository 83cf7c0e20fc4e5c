//! The braid-fs RPC protocol, sans I/O: message types and their encoding.
//!
//! Every message is a 24-byte header followed by a body (all integers little-endian):
//!
//! | offset | size | field | meaning |
//! |---|---|---|---|
//! | 0 | 2 | magic | `0x4642` ("BF") |
//! | 2 | 1 | version | [`VERSION`] |
//! | 3 | 1 | kind | 0 request, 1 reply |
//! | 4 | 2 | op | [`Op`] |
//! | 6 | 2 | flags | 0 |
//! | 8 | 8 | id | request id, chosen by the client and echoed in the reply |
//! | 16 | 4 | status | replies: 0 or an [`Errno`] code (then the body is empty) |
//! | 20 | 4 | body length | bytes after the header |
//!
//! A request's body starts with the caller envelope ([`Caller`]: uid, gid, supplementary
//! groups), then the operation's fields. The server carries each request out as that caller
//! (subject to the export's squashing); see `server::creds`.
//!
//! A message is at most [`MAX_MSG`] bytes. Names are 1..=255 bytes without `/` or NUL and
//! never `.` or `..`; paths and symlink targets are 1..=4096 bytes without NUL. Decoding
//! checks every length and value and never panics (see the tests and the `fs_proto` fuzz
//! target); the layouts of the bodies are in `docs/FS.md`.

mod caller;
mod codec;
mod errno;
mod lock;
mod message;
mod reply;
mod types;

pub use caller::{CALLER_MAX_LEN, Caller, MAX_GROUPS};
pub use errno::Errno;
pub use lock::{LockKind, LockRange, LockRequest};
pub use message::{
    COMMIT_DATASYNC, COMMIT_SYNC, COMMIT_TOUCH, Header, Op, Request, Role, decode_header,
    decode_request, encode_request,
};
pub use reply::{HelloReply, Mapped, Opened, Reply, decode_reply, encode_reply};
pub use types::{
    Attr, Creds, DirEntry, Entry, NodeId, RegionInfo, SetAttr, StatFs, TimeSet, Timestamp,
};

/// The protocol version this build speaks (4: requests carry the caller envelope).
pub const VERSION: u8 = 4;
/// First two bytes of every message.
pub const MAGIC: u16 = 0x4642;
/// Bytes of the header.
pub const HEADER_LEN: usize = 24;
/// Largest message, header included.
pub const MAX_MSG: usize = 64 * 1024;
/// Longest name.
pub const MAX_NAME: usize = 255;
/// Longest path or symlink target.
pub const MAX_PATH: usize = 4096;
/// Largest `Write` whose bytes travel inside the request (header, the largest caller
/// envelope, handle, offset and length prefix take the rest of [`MAX_MSG`]).
pub const MAX_INLINE_WRITE: usize = MAX_MSG - HEADER_LEN - CALLER_MAX_LEN - 20;

/// A message that cannot be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message ends early.
    #[error("message truncated")]
    Truncated,
    /// Not a braid-fs message.
    #[error("bad magic {0:#06x}")]
    BadMagic(u16),
    /// Another protocol version.
    #[error("protocol version {0}, this build speaks {VERSION}")]
    Version(u8),
    /// Unknown operation code.
    #[error("unknown operation {0}")]
    UnknownOp(u16),
    /// The header's length disagrees with the message.
    #[error("body length {header} in the header, {actual} in the message")]
    LengthMismatch {
        /// What the header says.
        header: u32,
        /// What arrived.
        actual: usize,
    },
    /// A field holds a value outside its range.
    #[error("bad {0}: {1}")]
    BadValue(&'static str, u64),
    /// A string longer than its limit.
    #[error("{0} of {1} bytes is too long")]
    TooLong(&'static str, usize),
    /// A name or path that is empty, has `/` or NUL where not allowed, or is `.` or `..`.
    #[error("bad name or path")]
    BadName,
    /// Bytes after the last field.
    #[error("{0} bytes after the message")]
    TrailingBytes(usize),
}

/// A message that cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Larger than [`MAX_MSG`].
    #[error("message of {0} bytes exceeds {MAX_MSG}")]
    TooLarge(usize),
    /// A reply body that does not answer this operation.
    #[error("reply kind does not answer {0:?}")]
    Mismatch(Op),
}

#[cfg(test)]
mod tests;
