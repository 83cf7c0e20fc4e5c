//! The frame header that starts every frame on an established rail.
//!
//! All integers are little-endian. The exact layout is documented in `docs/PROTOCOL.md`;
//! [`FrameHeader::decode`] refuses every header that layout does not allow, so that the
//! rest of braid can trust a decoded header's fields.

use thiserror::Error;

use super::layout::{get_array, get_u16, get_u32, get_u64, put};

/// Protocol version carried in every frame header and in the rail handshake.
pub const PROTOCOL_VERSION: u8 = 4;

/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 64;

/// Largest payload a single frame may carry (16 MiB): larger chunks are refused as malformed.
pub const MAX_FRAME_PAYLOAD: u32 = 16 << 20;

/// Largest payload of an [`Opcode::Express`] frame.
pub const MAX_EXPRESS_PAYLOAD: u32 = 512;

/// Frame kinds. Requests (`Write` .. `CompareSwap`) travel in the initiator's sequence space
/// and are executed by the target strictly in sequence order; the rest are responses and
/// rail-level control, which are never held back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// One chunk of an RDMA write (optionally with immediate data).
    Write = 1,
    /// One chunk of a two-sided send into a posted receive buffer.
    Send = 2,
    /// Request to read `arg0` bytes from `rkey`/`addr`.
    ReadRequest = 3,
    /// Atomic fetch-and-add of `arg0` on the aligned 8-byte word at `rkey`/`addr`.
    FetchAdd = 4,
    /// Atomic compare (`arg0`) and swap (`arg1`) on the aligned 8-byte word at `rkey`/`addr`.
    CompareSwap = 5,
    /// First frame of a vectored write: the payload is the remote scatter/gather list
    /// ([`crate::wire::sgl`]) of `arg1` entries and `arg0` bytes; the data follows in
    /// [`Opcode::WriteVData`] chunks.
    WriteV = 6,
    /// A vectored read of `arg0` bytes: the payload is the remote scatter/gather list of
    /// `arg1` entries; answered by [`Opcode::ReadResponse`] chunks as a read is.
    ReadV = 7,
    /// One chunk of a vectored write's data: bytes `[arg1, arg1 + payload_len)` of the
    /// operation's `arg0` bytes, placed through its scatter/gather list.
    WriteVData = 8,
    /// A whole small write (`arg1` = 0, to `rkey`/`addr`) or send (`arg1` = 1, into the next
    /// posted receive; `rkey` and `addr` zero) of at most [`MAX_EXPRESS_PAYLOAD`] bytes, with
    /// immediate `aux` under [`FLAG_IMM`], answered without a `Done`: by the count in `arg0`
    /// of a later `Express` frame the other way (that many of its sender's express requests
    /// succeeded, oldest first), or by an [`Opcode::ExpressAnswer`]. Sent outside the rail's
    /// byte count (it is never retransmitted: only endpoints of one rail send it). See
    /// docs/PROTOCOL.md, "Express writes".
    Express = 9,
    /// One chunk of the data answering a read request.
    ReadResponse = 16,
    /// Result of an atomic: the word's original value in `arg0`, status in `aux`.
    AtomicResponse = 17,
    /// Completion of a request (write, send, or a failed read): status in `aux`.
    Done = 18,
    /// Carries only the rail acknowledgement (`rail_ack`); also used as keepalive.
    RailAck = 19,
    /// The sender closes the endpoint; no more frames follow on any rail.
    Close = 20,
    /// The sender has given up rail `arg0`; its unacknowledged frames follow as retransmissions.
    RailDown = 21,
    /// First frame on a re-established rail: the sender's byte count on this rail starts at `arg0`.
    RailRestore = 22,
    /// Answers the receiver's `arg0` oldest unanswered [`Opcode::Express`] requests: all
    /// succeeded but the last, whose [`WireStatus`] is `aux`.
    ExpressAnswer = 23,
}

impl Opcode {
    /// Parses a wire opcode.
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            1 => Opcode::Write,
            2 => Opcode::Send,
            3 => Opcode::ReadRequest,
            4 => Opcode::FetchAdd,
            5 => Opcode::CompareSwap,
            6 => Opcode::WriteV,
            7 => Opcode::ReadV,
            8 => Opcode::WriteVData,
            9 => Opcode::Express,
            16 => Opcode::ReadResponse,
            17 => Opcode::AtomicResponse,
            18 => Opcode::Done,
            19 => Opcode::RailAck,
            20 => Opcode::Close,
            21 => Opcode::RailDown,
            22 => Opcode::RailRestore,
            23 => Opcode::ExpressAnswer,
            _ => return None,
        })
    }

    /// True for frames that are executed in the initiator's sequence order at the target.
    pub fn is_request(self) -> bool {
        matches!(
            self,
            Opcode::Write
                | Opcode::Send
                | Opcode::ReadRequest
                | Opcode::FetchAdd
                | Opcode::CompareSwap
                | Opcode::WriteV
                | Opcode::ReadV
                | Opcode::WriteVData
        )
    }

    /// True for the first frame of a vectored operation, whose payload is its remote
    /// scatter/gather list.
    pub fn is_descriptor(self) -> bool {
        matches!(self, Opcode::WriteV | Opcode::ReadV)
    }

    /// True for the chunked data-carrying kinds (the payload belongs to an operation of
    /// `arg0` bytes and starts at offset `arg1` within it).
    pub fn is_chunk(self) -> bool {
        matches!(
            self,
            Opcode::Write | Opcode::Send | Opcode::ReadResponse | Opcode::WriteVData
        )
    }
}

/// Header flag: the operation carries 32-bit immediate data in `aux`.
pub const FLAG_IMM: u16 = 1 << 0;
/// Header flag: a retransmission of a frame first sent on the rail in bits 8..14 of the flags,
/// ending at offset `rail_ack` of that rail (which then carries no acknowledgement).
pub const FLAG_RETX: u16 = 1 << 1;
/// Bits of the flags naming the original rail of a retransmission.
pub const RETX_RAIL_MASK: u16 = 0x3f << 8;
/// Header flag: the sender's window on this rail is half full; acknowledge this frame soon.
pub const FLAG_ACK_REQ: u16 = 1 << 2;
/// Header flag on a `Write` chunk: the initiator allows the target to place it before the
/// requests ahead of it have executed (no earlier outstanding request of the initiator
/// touches the same memory; see `SessionConfig::relaxed_placement`). Only placement moves
/// ahead: the write still completes in order.
pub const FLAG_EARLY: u16 = 1 << 3;
/// Header flag of a read served from file pages (which truncation can take away under the
/// transfer, after its headers promised the bytes): on `ReadResponse` chunks, "the read's
/// status follows in a `Done`; complete only with it"; on that `Done`, "every response
/// byte has been sent; complete once they are placed".
pub const FLAG_TRAILER: u16 = 1 << 4;
/// Header flag with [`FLAG_RETX`]: a hedge. The sender still uses the original rail, which
/// was slow to deliver, and sent the frame again elsewhere; the receiver executes whichever
/// copy comes first and drops the other (the original included), without giving the rail up.
pub const FLAG_HEDGE: u16 = 1 << 5;
/// All flags this version defines; any other bit set is malformed.
pub const KNOWN_FLAGS: u16 =
    FLAG_IMM | FLAG_RETX | FLAG_ACK_REQ | FLAG_EARLY | FLAG_TRAILER | FLAG_HEDGE | RETX_RAIL_MASK;

/// A decoded, validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Frame kind.
    pub opcode: Opcode,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Bytes of payload that follow the header.
    pub payload_len: u32,
    /// Operation sequence number, in the initiator's sequence space.
    pub seq: u64,
    /// Remote key naming the target region (requests only).
    pub rkey: u64,
    /// Offset of the operation's first byte inside the target region (requests only).
    pub addr: u64,
    /// Chunks: the operation's total length. Atomics: the add or compare operand.
    /// Atomic response: the original value.
    pub arg0: u64,
    /// Chunks: this chunk's offset within the operation. Compare-swap: the swap value.
    pub arg1: u64,
    /// Immediate data (with `FLAG_IMM`) or a [`WireStatus`] code in responses.
    pub aux: u32,
    /// CRC32C of the payload when the endpoint negotiated it, else 0.
    pub crc: u32,
    /// Cumulative bytes the sender of this frame has consumed from this rail.
    pub rail_ack: u64,
}

/// Why a frame header was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// Fewer than [`HEADER_LEN`] bytes were given.
    #[error("truncated frame header: {0} of {HEADER_LEN} bytes")]
    Truncated(usize),
    /// The header's version byte is not [`PROTOCOL_VERSION`].
    #[error("frame of protocol version {0}, expected {PROTOCOL_VERSION}")]
    Version(u8),
    /// Unknown opcode.
    #[error("unknown opcode {0}")]
    Opcode(u8),
    /// An express request with a payload over [`MAX_EXPRESS_PAYLOAD`], a kind other than
    /// write or send, a flag other than [`FLAG_IMM`], or a send naming a region.
    #[error("malformed express request: {0}")]
    Express(&'static str),
    /// A flag this version does not define.
    #[error("unknown flags {0:#06x}")]
    Flags(u16),
    /// Payload longer than [`MAX_FRAME_PAYLOAD`].
    #[error("oversized payload of {0} bytes (limit {MAX_FRAME_PAYLOAD})")]
    Oversized(u32),
    /// A kind that carries no payload came with one.
    #[error("{0:?} frame must not carry a payload, got {1} bytes")]
    UnexpectedPayload(Opcode, u32),
    /// A chunk whose offset and length do not fit inside its operation.
    #[error("chunk at offset {off} of {len} bytes exceeds its operation of {total} bytes")]
    ChunkOutOfRange {
        /// Chunk offset within the operation.
        off: u64,
        /// Chunk length.
        len: u32,
        /// Operation total length.
        total: u64,
    },
    /// `addr + length` overflows.
    #[error("address range overflows")]
    AddressOverflow,
    /// A vectored request's entry count, payload length or unused fields are wrong.
    #[error("malformed vectored request: {0}")]
    Descriptor(&'static str),
}

/// The header's layout: byte ranges of its fields, little-endian integers.
mod field {
    use std::ops::Range;
    pub(super) const VERSION: Range<usize> = 0..1;
    pub(super) const OPCODE: Range<usize> = 1..2;
    pub(super) const FLAGS: Range<usize> = 2..4;
    pub(super) const PAYLOAD_LEN: Range<usize> = 4..8;
    pub(super) const SEQ: Range<usize> = 8..16;
    pub(super) const RKEY: Range<usize> = 16..24;
    pub(super) const ADDR: Range<usize> = 24..32;
    pub(super) const ARG0: Range<usize> = 32..40;
    pub(super) const ARG1: Range<usize> = 40..48;
    pub(super) const AUX: Range<usize> = 48..52;
    pub(super) const CRC: Range<usize> = 52..56;
    pub(super) const RAIL_ACK: Range<usize> = 56..64;
}

impl FrameHeader {
    /// A header with every field zero but the opcode.
    pub fn new(opcode: Opcode) -> FrameHeader {
        FrameHeader {
            opcode,
            flags: 0,
            payload_len: 0,
            seq: 0,
            rkey: 0,
            addr: 0,
            arg0: 0,
            arg1: 0,
            aux: 0,
            crc: 0,
            rail_ack: 0,
        }
    }

    /// Decodes and validates the first [`HEADER_LEN`] bytes of `buf`.
    pub fn decode(buf: &[u8]) -> Result<FrameHeader, FrameError> {
        if buf.len() < HEADER_LEN {
            return Err(FrameError::Truncated(buf.len()));
        }
        let b = &buf[..HEADER_LEN];
        let [version] = get_array(b, field::VERSION);
        if version != PROTOCOL_VERSION {
            return Err(FrameError::Version(version));
        }
        let [op] = get_array(b, field::OPCODE);
        let opcode = Opcode::from_u8(op).ok_or(FrameError::Opcode(op))?;
        let flags = get_u16(b, field::FLAGS);
        if flags & !KNOWN_FLAGS != 0 || (flags & FLAG_RETX == 0 && flags & RETX_RAIL_MASK != 0) {
            return Err(FrameError::Flags(flags));
        }
        let h = FrameHeader {
            opcode,
            flags,
            payload_len: get_u32(b, field::PAYLOAD_LEN),
            seq: get_u64(b, field::SEQ),
            rkey: get_u64(b, field::RKEY),
            addr: get_u64(b, field::ADDR),
            arg0: get_u64(b, field::ARG0),
            arg1: get_u64(b, field::ARG1),
            aux: get_u32(b, field::AUX),
            crc: get_u32(b, field::CRC),
            rail_ack: get_u64(b, field::RAIL_ACK),
        };
        h.validate()?;
        Ok(h)
    }

    fn validate(&self) -> Result<(), FrameError> {
        if self.payload_len > MAX_FRAME_PAYLOAD {
            return Err(FrameError::Oversized(self.payload_len));
        }
        if self.opcode.is_chunk() {
            let end = self.arg1.checked_add(self.payload_len as u64);
            if end.is_none_or(|e| e > self.arg0) {
                return Err(FrameError::ChunkOutOfRange {
                    off: self.arg1,
                    len: self.payload_len,
                    total: self.arg0,
                });
            }
        } else if self.opcode == Opcode::Express {
            if self.payload_len > MAX_EXPRESS_PAYLOAD {
                return Err(FrameError::Express("payload over 512 bytes"));
            }
            if self.flags & !FLAG_IMM != 0 {
                return Err(FrameError::Express("flags other than the immediate's"));
            }
            match self.arg1 {
                0 => {}
                1 if self.rkey == 0 && self.addr == 0 => {}
                1 => return Err(FrameError::Express("a send names a region")),
                _ => return Err(FrameError::Express("neither a write nor a send")),
            }
        } else if self.opcode.is_descriptor() {
            let max = crate::wire::sgl::MAX_REMOTE_SGE as u64;
            if self.arg1 == 0 || self.arg1 > max {
                return Err(FrameError::Descriptor("entry count outside 1..=1024"));
            }
            if self.payload_len as u64 != self.arg1 * crate::wire::sgl::SGE_LEN as u64 {
                return Err(FrameError::Descriptor("payload is not 24 bytes per entry"));
            }
        } else if self.payload_len != 0 {
            return Err(FrameError::UnexpectedPayload(self.opcode, self.payload_len));
        }
        if (self.opcode.is_descriptor() || self.opcode == Opcode::WriteVData)
            && (self.rkey != 0 || self.addr != 0)
        {
            return Err(FrameError::Descriptor("rkey and addr must be 0"));
        }
        let span = match self.opcode {
            Opcode::Write | Opcode::Send | Opcode::ReadRequest => self.arg0,
            Opcode::Express => self.payload_len.into(),
            Opcode::FetchAdd | Opcode::CompareSwap => 8,
            _ => 0,
        };
        if self.addr.checked_add(span).is_none() {
            return Err(FrameError::AddressOverflow);
        }
        Ok(())
    }

    /// Encodes the header into its fixed wire form.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        put(&mut b, field::VERSION, &[PROTOCOL_VERSION]);
        put(&mut b, field::OPCODE, &[self.opcode as u8]);
        put(&mut b, field::FLAGS, &self.flags.to_le_bytes());
        put(&mut b, field::PAYLOAD_LEN, &self.payload_len.to_le_bytes());
        put(&mut b, field::SEQ, &self.seq.to_le_bytes());
        put(&mut b, field::RKEY, &self.rkey.to_le_bytes());
        put(&mut b, field::ADDR, &self.addr.to_le_bytes());
        put(&mut b, field::ARG0, &self.arg0.to_le_bytes());
        put(&mut b, field::ARG1, &self.arg1.to_le_bytes());
        put(&mut b, field::AUX, &self.aux.to_le_bytes());
        put(&mut b, field::CRC, &self.crc.to_le_bytes());
        put(&mut b, field::RAIL_ACK, &self.rail_ack.to_le_bytes());
        b
    }

    /// For a retransmission: the rail it was first sent on and its end offset there.
    pub fn retransmission_of(&self) -> Option<(usize, u64)> {
        (self.flags & FLAG_RETX != 0)
            .then_some((((self.flags & RETX_RAIL_MASK) >> 8) as usize, self.rail_ack))
    }
}

/// Status codes carried in `aux` of `Done` and `AtomicResponse` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum WireStatus {
    /// The operation took effect.
    Ok = 0,
    /// Unknown key, missing right, range outside the region or past a file region's end,
    /// or file pages truncated under the operation.
    RemoteAccess = 1,
    /// The request cannot be carried out (misaligned atomic, send longer than the posted buffer).
    RemoteInvalidRequest = 2,
}

impl WireStatus {
    /// Parses a status code.
    pub fn from_u32(v: u32) -> Option<WireStatus> {
        Some(match v {
            0 => WireStatus::Ok,
            1 => WireStatus::RemoteAccess,
            2 => WireStatus::RemoteInvalidRequest,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_fields_tile_the_header() {
        use field::*;
        let fields = [
            VERSION,
            OPCODE,
            FLAGS,
            PAYLOAD_LEN,
            SEQ,
            RKEY,
            ADDR,
            ARG0,
            ARG1,
            AUX,
            CRC,
            RAIL_ACK,
        ];
        assert!(super::super::layout::tiles(&fields, HEADER_LEN));
    }

    fn sample() -> FrameHeader {
        FrameHeader {
            opcode: Opcode::Write,
            flags: FLAG_IMM,
            payload_len: 4096,
            seq: 7,
            rkey: 0xdead_beef_0001,
            addr: 1 << 20,
            arg0: 1 << 16,
            arg1: 8192,
            aux: 42,
            crc: 0x1234,
            rail_ack: 99,
        }
    }

    #[test]
    fn round_trip() {
        let h = sample();
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn express_frames_are_whole_small_writes_or_sends() {
        let mut h = FrameHeader::new(Opcode::Express);
        h.payload_len = MAX_EXPRESS_PAYLOAD;
        h.rkey = 5;
        h.addr = 64;
        h.flags = FLAG_IMM;
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        let refused = |h: FrameHeader| {
            assert!(
                matches!(
                    FrameHeader::decode(&h.encode()),
                    Err(FrameError::Express(_))
                ),
                "{h:?}"
            )
        };
        refused(FrameHeader {
            payload_len: MAX_EXPRESS_PAYLOAD + 1,
            ..h
        });
        refused(FrameHeader {
            flags: FLAG_ACK_REQ,
            ..h
        });
        refused(FrameHeader { arg1: 2, ..h });
        // A send names no region.
        refused(FrameHeader { arg1: 1, ..h });
        let send = FrameHeader {
            arg1: 1,
            rkey: 0,
            addr: 0,
            ..h
        };
        assert_eq!(FrameHeader::decode(&send.encode()), Ok(send));
        assert_eq!(
            FrameHeader::decode(
                &FrameHeader {
                    addr: u64::MAX - 8,
                    ..h
                }
                .encode()
            ),
            Err(FrameError::AddressOverflow)
        );
        // An answer carries no payload.
        let mut a = FrameHeader::new(Opcode::ExpressAnswer);
        a.arg0 = 3;
        assert_eq!(FrameHeader::decode(&a.encode()), Ok(a));
        a.payload_len = 1;
        assert!(matches!(
            FrameHeader::decode(&a.encode()),
            Err(FrameError::UnexpectedPayload(..))
        ));
    }

    #[test]
    fn refuses_bad_headers() {
        let good = sample().encode();
        assert_eq!(
            FrameHeader::decode(&good[..10]),
            Err(FrameError::Truncated(10))
        );
        let mut b = good;
        b[0] = 1;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::Version(1)));
        let mut b = good;
        b[1] = 99;
        assert_eq!(FrameHeader::decode(&b), Err(FrameError::Opcode(99)));
        let mut h = FrameHeader::new(Opcode::ReadV);
        h.arg1 = 2;
        h.payload_len = 48;
        assert!(FrameHeader::decode(&h.encode()).is_ok());
        h.payload_len = 47;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::Descriptor(_))
        ));
        h.payload_len = 48;
        h.rkey = 1;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::Descriptor(_))
        ));
        let mut h = FrameHeader::new(Opcode::WriteV);
        h.arg1 = 0;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::Descriptor(_))
        ));
        let mut b = good;
        b[2] = 0x80;
        assert!(matches!(FrameHeader::decode(&b), Err(FrameError::Flags(_))));
        let mut h = sample();
        h.payload_len = MAX_FRAME_PAYLOAD + 1;
        h.arg0 = u64::MAX / 2;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::Oversized(_))
        ));
        let mut h = sample();
        h.arg1 = h.arg0 - 10;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::ChunkOutOfRange { .. })
        ));
        let mut h = FrameHeader::new(Opcode::FetchAdd);
        h.payload_len = 8;
        assert!(matches!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::UnexpectedPayload(..))
        ));
        let mut h = FrameHeader::new(Opcode::FetchAdd);
        h.addr = u64::MAX - 3;
        assert_eq!(
            FrameHeader::decode(&h.encode()),
            Err(FrameError::AddressOverflow)
        );
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = FrameHeader::decode(&bytes);
        }

        #[test]
        fn decoded_headers_reencode_identically(bytes in proptest::collection::vec(any::<u8>(), 64)) {
            if let Ok(h) = FrameHeader::decode(&bytes) {
                prop_assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
            }
        }
    }
}
