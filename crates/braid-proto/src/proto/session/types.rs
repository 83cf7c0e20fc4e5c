//! The types the driver exchanges with a session: posts, frames to transmit, placements,
//! errors.

use std::sync::Arc;

use crate::mem::inner::RegionPin;
use crate::mem::region::{Pieces, RemoteSge, Sge, sgl_is_fragile};
use crate::proto::spans::Spans;
use crate::wire::Opcode;
use crate::wire::frame::HEADER_LEN;
use thiserror::Error;

use super::staging::StagingBuf;

/// A protocol violation by the peer. The driver closes the rail (and, in this version,
/// fails the endpoint) with this error logged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// A request for an operation that has already been executed.
    #[error("duplicate request {seq} (next expected {frontier})")]
    DuplicateRequest {
        /// Its sequence number.
        seq: u64,
        /// The next sequence number the target expects.
        frontier: u64,
    },
    /// A chunk that disagrees with earlier chunks of the same operation.
    #[error("chunk of request {seq} disagrees with its operation's first chunk")]
    InconsistentChunk {
        /// Its sequence number.
        seq: u64,
    },
    /// More bytes arrived for an operation than it has.
    #[error("operation {seq} received more than its {total} bytes")]
    Overrun {
        /// Its sequence number.
        seq: u64,
        /// Its length.
        total: u64,
    },
    /// A response for no outstanding operation, or for one of another kind.
    #[error("{opcode:?} response for unknown or mismatched operation {seq}")]
    UnknownOperation {
        /// Response kind.
        opcode: Opcode,
        /// The sequence number it names.
        seq: u64,
    },
    /// An unknown status code.
    #[error("unknown status code {0}")]
    BadStatus(u32),
    /// The peer acknowledged bytes never sent on the rail.
    #[error("rail acknowledgement {ack} beyond the {sent} bytes sent")]
    BadAck {
        /// What it acknowledged.
        ack: u64,
        /// What was sent.
        sent: u64,
    },
    /// A vectored request whose scatter/gather list disagrees with its header (entry count,
    /// total length, overflowing range), or a second descriptor for one operation.
    #[error("malformed scatter/gather list of vectored request {seq}")]
    BadDescriptor {
        /// Its sequence number.
        seq: u64,
    },
    /// The peer closed the endpoint.
    #[error("the peer closed the endpoint")]
    PeerClosed,
    /// The rail has been given up (by this side or the peer); stop using it.
    #[error("the rail has been given up")]
    RailGone,
    /// A payload's CRC32C did not match: the data was corrupted on the way.
    #[error(
        "payload of {opcode:?} {seq} failed its CRC32C check (sent {sent:#010x}, got {got:#010x})"
    )]
    Corrupt {
        /// Frame kind.
        opcode: Opcode,
        /// Its sequence number.
        seq: u64,
        /// CRC in the header.
        sent: u32,
        /// CRC of the bytes placed.
        got: u32,
    },
}

/// Why a post was refused; nothing was queued and no completion will come.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PostError {
    /// The outstanding-operation or receive limit is reached.
    #[error("{what} full (limit {limit})")]
    QueueFull {
        /// Which queue.
        what: &'static str,
        /// The limit.
        limit: usize,
    },
    /// The session has failed or been closed.
    #[error("endpoint closed")]
    Closed,
    /// A local buffer lacks a right.
    #[error("local region lacks the {0} right")]
    MissingRight(&'static str),
    /// Bad arguments.
    #[error("{0}")]
    Invalid(String),
}

/// What a posted operation asks for.
#[derive(Debug, Clone)]
pub enum Request {
    /// Write the local list to `rkey` at `addr`; with `imm`, also consume a receive at the target.
    Write {
        /// Local source.
        local: Vec<Sge>,
        /// Target region key.
        rkey: u64,
        /// Target offset.
        addr: u64,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Read `rkey` at `addr` into the local list (its total length is the read's length).
    Read {
        /// Local destination.
        local: Vec<Sge>,
        /// Target region key.
        rkey: u64,
        /// Target offset.
        addr: u64,
    },
    /// Fetch-and-add on the word at `rkey`/`addr`.
    FetchAdd {
        /// Target region key.
        rkey: u64,
        /// Target offset (8-byte aligned).
        addr: u64,
        /// Value added.
        add: u64,
    },
    /// Compare-and-swap on the word at `rkey`/`addr`.
    CompareSwap {
        /// Target region key.
        rkey: u64,
        /// Target offset (8-byte aligned).
        addr: u64,
        /// Expected value.
        compare: u64,
        /// New value if the word equals `compare`.
        swap: u64,
    },
    /// Send the local list into the peer's next posted receive.
    Send {
        /// Local source.
        local: Vec<Sge>,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// Write the local list to the remote pieces, in order (the totals must be equal).
    WriteV {
        /// Local source.
        local: Vec<Sge>,
        /// Remote destination pieces (1 to 1024).
        remote: Vec<RemoteSge>,
    },
    /// Read the remote pieces, in order, into the local list (the totals must be equal).
    ReadV {
        /// Local destination.
        local: Vec<Sge>,
        /// Remote source pieces (1 to 1024).
        remote: Vec<RemoteSge>,
    },
}

/// The local pieces of an operation or a posted receive. One piece (almost every
/// operation) is held inline, so that posting, and keeping the memory alive for each of the
/// operation's frames, allocates nothing; several are shared.
#[derive(Clone)]
pub(super) enum SgeList {
    One(Sge),
    Many(Arc<[Sge]>),
}

impl Default for SgeList {
    fn default() -> SgeList {
        // An empty `Arc<[T]>` from `default` allocates nothing.
        SgeList::Many(Arc::default())
    }
}

impl From<Vec<Sge>> for SgeList {
    fn from(mut v: Vec<Sge>) -> SgeList {
        match v.len() {
            0 => SgeList::default(),
            1 => SgeList::One(v.pop().expect("one piece")),
            _ => SgeList::Many(v.into()),
        }
    }
}

impl From<&[Sge]> for SgeList {
    fn from(list: &[Sge]) -> SgeList {
        match list {
            [] => SgeList::default(),
            [one] => SgeList::One(one.clone()),
            _ => SgeList::Many(list.into()),
        }
    }
}

impl std::ops::Deref for SgeList {
    type Target = [Sge];

    fn deref(&self) -> &[Sge] {
        match self {
            SgeList::One(sge) => std::slice::from_ref(sge),
            SgeList::Many(list) => list,
        }
    }
}

/// Memory the driver must keep alive while it writes a frame's payload.
#[derive(Clone)]
#[allow(dead_code)] // held only for its Drop
pub(super) enum Keep {
    Regions(SgeList),
    Pin(RegionPin),
    Spans(Arc<Spans>),
    Staging(Arc<StagingBuf>),
    Bytes(Arc<[u8]>),
}

impl Keep {
    /// The memory is file pages, which only system calls may touch.
    pub(super) fn fragile(&self) -> bool {
        match self {
            Keep::Regions(sgl) => sgl_is_fragile(sgl),
            Keep::Pin(pin) => pin.is_file(),
            Keep::Spans(s) => s.fragile(),
            Keep::Staging(_) | Keep::Bytes(_) => false,
        }
    }
}

/// A frame ready for one rail: header bytes then payload read straight from registered memory.
pub struct Transmit {
    /// The encoded header.
    pub header: [u8; HEADER_LEN],
    /// Payload pieces, in order, as (pointer, length).
    pub payload: Pieces<(*const u8, usize)>,
    /// For a read-response chunk the session tracks (sent straight from the target's region,
    /// or of a read served from file pages): a token the driver hands back to
    /// [`Session::transmitted`](super::Session::transmitted) once the frame is completely written.
    pub read_response: Option<u64>,
    pub(super) _keep: Option<Keep>,
}

// SAFETY: the pointers refer to registered memory kept alive by `_keep`.
unsafe impl Send for Transmit {}

impl Transmit {
    /// Total bytes of the frame.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.iter().map(|p| p.1).sum::<usize>()
    }

    /// Never true: a frame has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The payload is file pages, which a truncation can take away: the driver must read
    /// them only with system calls (a kernel socket does), never from user space (a
    /// `SIGBUS`), and reports a failed read (`EFAULT`) with
    /// [`Session::transmit_faulted`](super::Session::transmit_faulted).
    pub fn fragile(&self) -> bool {
        self._keep.as_ref().is_some_and(Keep::fragile)
    }
}

/// Where an incoming payload goes: memory pieces in order, kept alive by the session
/// until [`Session::payload_done`](super::Session::payload_done).
pub struct Placement {
    /// Destination pieces, as (pointer, length).
    pub iov: Pieces<(*mut u8, usize)>,
    /// The pieces are file pages, which a truncation can take away: the driver must not
    /// store into them from user space (a `SIGBUS`), only with system calls, and reports a
    /// failed one ( `EFAULT`) with [`Session::payload_fault`](super::Session::payload_fault).
    pub fragile: bool,
}

// SAFETY: the pointers refer to registered memory pinned by the session.
unsafe impl Send for Placement {}

/// What the driver must do with the frame it just offered.
pub enum RxAction {
    /// Handled; no payload follows.
    Done,
    /// Read the payload into these places, then call [`Session::payload_done`].
    ///
    /// [`Session::payload_done`]: super::Session::payload_done
    Place(Placement),
    /// Read the payload and drop it, then call [`Session::payload_done`].
    ///
    /// [`Session::payload_done`]: super::Session::payload_done
    Discard,
    /// Not executable yet: keep the header, stop reading this rail, and offer the same
    /// header again when [`Session::take_rx_retry`](super::Session::take_rx_retry) names the rail.
    Stall,
}

#[cfg(test)]
mod tests {
    use super::super::SessionConfig;
    use super::super::testkit::Pair;
    use super::SgeList;

    /// A list keeps its pieces and their order whatever its length; one piece is inline.
    #[test]
    fn an_sge_list_keeps_its_pieces_in_order() {
        let p = Pair::new(SessionConfig::default(), 1);
        let r = p.region(0, 100, 0);
        let piece = |off, len| r.slice(off, len).expect("slice");
        assert!(SgeList::from(Vec::new()).is_empty());
        let one = SgeList::from(vec![piece(10, 5)]);
        assert!(matches!(one, SgeList::One(_)));
        assert_eq!((one[0].offset, one[0].len), (10, 5));
        let many = SgeList::from(vec![piece(0, 1), piece(20, 2), piece(40, 3)]);
        assert!(matches!(many, SgeList::Many(_)));
        let got: Vec<_> = many.iter().map(|s| (s.offset, s.len)).collect();
        assert_eq!(got, [(0, 1), (20, 2), (40, 3)]);
        assert_eq!(many.clone().len(), 3);
        let from_slice = SgeList::from(&[piece(7, 1)][..]);
        assert!(matches!(from_slice, SgeList::One(_)));
        assert_eq!(SgeList::from(&many[..]).len(), 3);
    }
}
