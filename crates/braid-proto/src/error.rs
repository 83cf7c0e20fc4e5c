//! Errors returned by calls, and the status carried by completions.

use std::net::SocketAddr;

use thiserror::Error;

use crate::wire::{HandshakeError, HandshakeStatus};

/// Errors returned synchronously by braid calls. Failures of operations already posted
/// are reported as [`Status`] in their completion instead.
#[derive(Debug, Error)]
pub enum Error {
    /// An operating-system error.
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// An argument is not acceptable; the text says which and why.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A local scatter/gather entry or copy reaches outside its region.
    #[error("range {offset}+{len} outside region of {region_len} bytes")]
    OutOfRange {
        /// First byte.
        offset: u64,
        /// Length.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// A local access to a file region reaches past the file's end (or a page was truncated
    /// during the copy).
    #[error(
        "range {offset}+{len} of a file region is past the end of the file ({readable} bytes of the region are before it)"
    )]
    PastEndOfFile {
        /// First byte, in the region.
        offset: u64,
        /// Length.
        len: u64,
        /// Bytes of the region before the file's end when the error was found.
        readable: u64,
    },
    /// A local region lacks a right the operation needs (e.g. `LOCAL_WRITE` for a read target).
    #[error("local region lacks the {0} right")]
    MissingRight(&'static str),
    /// A bounded queue is full; retry after completions have been polled.
    #[error("{what} full (limit {limit})")]
    QueueFull {
        /// Which queue.
        what: &'static str,
        /// Its configured limit.
        limit: usize,
    },
    /// The endpoint was closed or failed; no more operations can be posted.
    #[error("endpoint to {peer} is closed: {reason}")]
    EndpointClosed {
        /// The peer's first rail address.
        peer: String,
        /// Why.
        reason: String,
    },
    /// Deregistration timed out with remote operations still using the region.
    #[error("region still used by {in_flight} remote operation(s)")]
    RegionBusy {
        /// Remote operations holding the region.
        in_flight: usize,
    },
    /// The peer's handshake was malformed or it does not speak braid.
    #[error("handshake with {peer} failed: {source}")]
    Handshake {
        /// The peer.
        peer: SocketAddr,
        /// What was wrong.
        source: HandshakeError,
    },
    /// The peer speaks another protocol version.
    #[error("{peer} speaks braid protocol version {theirs}, this build speaks {ours}")]
    VersionMismatch {
        /// The peer.
        peer: SocketAddr,
        /// Our version.
        ours: u16,
        /// Theirs.
        theirs: u16,
    },
    /// The peer refused the rail.
    #[error("{peer} refused rail {rail}: {status:?}")]
    Refused {
        /// The peer.
        peer: SocketAddr,
        /// Rail index.
        rail: u16,
        /// The reason it gave.
        status: HandshakeStatus,
    },
    /// Authentication with the cluster secret failed.
    #[error("authentication with {peer} failed: {reason}")]
    Auth {
        /// The peer.
        peer: SocketAddr,
        /// Why.
        reason: String,
    },
    /// A bounded wait ran out.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The context's progress engine has stopped.
    #[error("the progress engine has stopped")]
    EngineStopped,
}

// The cause is in the message, so it is not also the `source()`: a chain printed with
// `{:#}` would say it twice.
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

/// Outcome of a posted operation, in the vocabulary of verbs work completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// The operation took effect.
    Success,
    /// A receive buffer was too small for the incoming message.
    LocalLengthError,
    /// The target refused the access: unknown or revoked key, missing right, or range outside
    /// the region. The target memory is unchanged.
    RemoteAccessError,
    /// A local file region's pages could not be read or written: the file was truncated
    /// under the operation (see `braid::Context::register_file`). For a write or send the
    /// peer received zeros in place of the missing bytes; for a read the local bytes are
    /// undefined.
    LocalAccessError,
    /// The target could not carry the request out (misaligned atomic, message longer than the
    /// posted receive buffer).
    RemoteInvalidRequest,
    /// The connection to the peer failed (reset, closed by the peer, protocol error, timeout).
    /// Whether the operation took effect at the target is unknown.
    TransportError,
    /// The operation was cancelled because the endpoint was closed locally.
    Flushed,
}

impl Status {
    /// True for [`Status::Success`].
    pub fn is_ok(self) -> bool {
        self == Status::Success
    }
}

/// The kind of operation a completion reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionKind {
    /// A `write` or `write_with_imm` posted here.
    Write,
    /// A `read` posted here.
    Read,
    /// A `fetch_add` posted here; the original value is in [`Completion::value`].
    FetchAdd,
    /// A `compare_swap` posted here; the original value is in [`Completion::value`].
    CompareSwap,
    /// A `send` posted here.
    Send,
    /// A posted receive filled by the peer's `send`.
    Recv,
    /// A posted receive consumed by the peer's `write_with_imm`; the data went to the
    /// written region, the immediate is in [`Completion::imm`].
    RecvWriteImm,
}

/// One finished operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The caller's id from the post.
    pub wr_id: u64,
    /// Which operation.
    pub kind: CompletionKind,
    /// Success or why not.
    pub status: Status,
    /// Bytes moved (received bytes for receives).
    pub byte_len: u64,
    /// Immediate data of a `write_with_imm` or `send_with_imm`.
    pub imm: Option<u32>,
    /// The original value for atomics.
    pub value: Option<u64>,
    /// The endpoint the operation belongs to.
    pub endpoint: u64,
}
