//! The bootstrap protocol's messages and their encoding (described in `docs/LAUNCH.md`).
//!
//! Every message is a frame: a 4-byte big-endian length (of what follows), a type byte and a
//! body. Decoding is checked: a short, long or malformed frame is an error, never a panic.
//!
//! Files by concept: `msg` holds the message types ([`ClientMsg`], [`ServerMsg`] and their
//! parts), `codec` the byte-level encoder and checked decoder, `encode` each message's
//! layout, and `frame` the length-prefixed framing on a stream ([`read_frame`],
//! [`write_frame`]).

mod codec;
mod encode;
mod frame;
mod msg;

pub use codec::DecodeError;
pub use frame::{CLIENT_FRAME_LIMIT, read_frame, server_frame_limit, write_frame};
pub use msg::{ClientMsg, Failure, Published, RankInfo, ServerMsg, TableEntry};

/// Protocol version; both hellos carry it.
pub const VERSION: u16 = 1;
/// First bytes of both hellos.
pub const MAGIC: [u8; 8] = *b"BRAIDBT\0";
/// Length of the handshake nonces.
pub const NONCE_LEN: usize = 16;
/// Length of an HMAC-SHA256 proof.
pub const MAC_LEN: usize = 32;
/// Largest contribution of one rank to an allgather.
pub const MAX_CONTRIBUTION: usize = 1 << 20;
/// Most addresses one rank may offer.
pub const MAX_ADDRS: usize = 256;
