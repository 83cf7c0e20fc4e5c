//! Wire formats: the rail handshake and the frame header. Pure data, no I/O.

pub mod frame;
pub mod handshake;
mod layout;
pub mod sgl;

pub use frame::{
    FrameError, FrameHeader, HEADER_LEN, MAX_EXPRESS_PAYLOAD, Opcode, PROTOCOL_VERSION, WireStatus,
};
pub use handshake::{HandshakeError, HandshakeStatus, Hello, HelloReply, SameHostOffer};
