//! The rail handshake: the first bytes on every new rail, in both directions.
//!
//! The connecting side sends a [`Hello`]; the accepting side answers with a [`HelloReply`]
//! and closes the connection unless the status is [`HandshakeStatus::Accepted`] or
//! [`HandshakeStatus::AuthRequired`]. With a cluster secret, the accepting side first
//! answers `AuthRequired` with a fresh nonce, the connecting side proves knowledge of the
//! secret with an [`AuthProof`], and the final `Accepted` reply carries the accepting
//! side's own proof (see [`auth_mac`]).
//!
//! Without a secret, the `Accepted` reply of a first join carries the session's random join
//! token, and a re-join ([`caps::REJOIN`]) goes through the same challenge-response keyed
//! with that token: a sniffed session id alone re-joins (and so replaces) no rail.

use super::layout::{get_array, get_u16, get_u32, get_u64, put};
use thiserror::Error;

/// Magic that opens a [`Hello`].
pub const HELLO_MAGIC: [u8; 8] = *b"BRAIDRMA";
/// Magic that opens a [`HelloReply`].
pub const REPLY_MAGIC: [u8; 8] = *b"BRAIDACK";
/// Version of the handshake and frame format spoken by this build.
pub const HANDSHAKE_VERSION: u16 = 6;
/// Magic that opens an [`AuthProof`].
pub const AUTH_MAGIC: [u8; 8] = *b"BRAIDAUT";
/// Size in bytes of every handshake message.
pub const HANDSHAKE_LEN: usize = 64;
/// Size of a nonce.
pub const NONCE_LEN: usize = 16;
/// Size of an HMAC-SHA256 proof.
pub const MAC_LEN: usize = 32;
/// Most rails one endpoint may have.
pub const MAX_RAILS: u16 = 64;

/// Capability bits exchanged in the handshake; the endpoint uses the intersection.
pub mod caps {
    /// Every frame payload carries a CRC32C in the header's `crc` field.
    pub const PAYLOAD_CRC32C: u32 = 1 << 0;
    /// The connecting side has a key (the cluster secret, or on a re-join without one the
    /// session's join token) and expects the accepting side to prove it.
    pub const AUTH: u32 = 1 << 1;
    /// The rail re-joins the existing session `session_id` in place of a failed rail.
    pub const REJOIN: u32 = 1 << 2;
    /// Hello: the connecting side offers to move the rail onto a shared-memory ring and
    /// says where it runs ([`super::SameHostOffer`]). Reply: the accepting side runs there
    /// too, and takes the offer.
    pub const SAME_HOST: u32 = 1 << 3;
    /// Hello: the connecting side offers to move the rail onto raw Ethernet frames (it has
    /// an AF_XDP port on the rail's device). Reply: the accepting side has one too, and
    /// takes the offer; both then exchange their hardware address and rail tag over the
    /// connection (docs/PROTOCOL.md, "Raw-Ethernet rails").
    pub const RAW: u32 = 1 << 4;
}

/// The connecting side's offer of a same-host rail, in a [`Hello`] whose capabilities
/// include [`caps::SAME_HOST`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SameHostOffer {
    /// Identity of the kernel and network namespace the connecting side runs in (a hash of
    /// the boot id and the namespace's inode): only an acceptor with the same identity
    /// takes the offer.
    pub host: u64,
    /// Names the Unix socket on which the connecting side hands over the ring.
    pub token: u64,
}

/// Sent by the connecting side of a rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version the sender speaks.
    pub version: u16,
    /// Index of this rail within the endpoint (0-based).
    pub rail_index: u16,
    /// Number of rails the endpoint will have.
    pub rail_count: u16,
    /// Capability bits ([`caps`]).
    pub capabilities: u32,
    /// Largest frame payload the sender will send.
    pub max_chunk: u32,
    /// Random id that joins the rails of one endpoint.
    pub session_id: u64,
    /// Fresh random nonce of the connecting side (used when authenticating, and as the
    /// proof that takes a same-host ring).
    pub nonce: [u8; NONCE_LEN],
    /// The offer of a same-host rail (sent with [`caps::SAME_HOST`]).
    pub same_host: Option<SameHostOffer>,
}

/// The accepting side's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    /// Protocol version the replying side speaks.
    pub version: u16,
    /// Echo of the rail index.
    pub rail_index: u16,
    /// Echo of the rail count.
    pub rail_count: u16,
    /// Whether the rail is accepted, and if not, why.
    pub status: HandshakeStatus,
    /// Capability bits of the replying side.
    pub capabilities: u32,
    /// Largest frame payload the replying side will send.
    pub max_chunk: u32,
    /// Echo of the session id.
    pub session_id: u64,
    /// `AuthRequired`: the accepting side's fresh nonce (first 16 bytes). `Accepted` after
    /// authentication: the accepting side's proof. `Accepted` on a first join without a
    /// secret: the session's join token (the key a re-join of the session must prove).
    /// Otherwise zero.
    pub auth: [u8; MAC_LEN],
}

/// The connecting side's answer to `AuthRequired`: magic then, at offset 32, its proof.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthProof {
    /// HMAC-SHA256 proof (see [`auth_mac`]).
    pub mac: [u8; MAC_LEN],
}

/// Which side a proof speaks for; part of the MAC input so that one side's proof cannot be
/// reflected back as the other's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthRole {
    /// The connecting side.
    Connector,
    /// The accepting side.
    Acceptor,
}

/// The proof one side gives: HMAC-SHA256 over the role, both nonces, the session id and the
/// rail index, keyed with the cluster secret. Each connection has a fresh acceptor nonce, so a
/// recorded proof cannot be replayed.
pub fn auth_mac(
    secret: &[u8],
    role: AuthRole,
    connector_nonce: &[u8; NONCE_LEN],
    acceptor_nonce: &[u8; NONCE_LEN],
    session_id: u64,
    rail_index: u16,
) -> [u8; MAC_LEN] {
    use hmac::Mac;
    auth_hmac(
        secret,
        role,
        connector_nonce,
        acceptor_nonce,
        session_id,
        rail_index,
    )
    .finalize()
    .into_bytes()
    .into()
}

/// Whether `proof` is the [`auth_mac`] of these inputs, compared in constant time (the
/// `hmac` crate's `verify_slice`), so a forger learns nothing from how long a refusal takes.
pub fn verify_auth_mac(
    secret: &[u8],
    role: AuthRole,
    connector_nonce: &[u8; NONCE_LEN],
    acceptor_nonce: &[u8; NONCE_LEN],
    session_id: u64,
    rail_index: u16,
    proof: &[u8],
) -> bool {
    use hmac::Mac;
    auth_hmac(
        secret,
        role,
        connector_nonce,
        acceptor_nonce,
        session_id,
        rail_index,
    )
    .verify_slice(proof)
    .is_ok()
}

fn auth_hmac(
    secret: &[u8],
    role: AuthRole,
    connector_nonce: &[u8; NONCE_LEN],
    acceptor_nonce: &[u8; NONCE_LEN],
    session_id: u64,
    rail_index: u16,
) -> hmac::Hmac<sha2::Sha256> {
    use hmac::{KeyInit, Mac};
    let mut m = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret)
        .expect("HMAC takes keys of any length");
    m.update(match role {
        AuthRole::Connector => b"braid-v1 connector",
        AuthRole::Acceptor => b"braid-v1 acceptor ",
    });
    m.update(connector_nonce);
    m.update(acceptor_nonce);
    m.update(&session_id.to_le_bytes());
    m.update(&rail_index.to_le_bytes());
    m
}

/// Outcome of a rail handshake as reported by the accepting side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum HandshakeStatus {
    /// The rail joins the session.
    Accepted = 0,
    /// The accepting side does not speak the requested version.
    VersionUnsupported = 1,
    /// Rail index or count out of range, or the index is already taken in this session.
    BadRail = 2,
    /// The listener is not accepting (closing, or too many pending sessions).
    Refused = 3,
    /// The accepting side has a cluster secret: prove it (the reply carries a nonce).
    AuthRequired = 4,
    /// The proof was wrong or missing.
    AuthFailed = 5,
}

impl HandshakeStatus {
    fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0 => HandshakeStatus::Accepted,
            1 => HandshakeStatus::VersionUnsupported,
            2 => HandshakeStatus::BadRail,
            3 => HandshakeStatus::Refused,
            4 => HandshakeStatus::AuthRequired,
            5 => HandshakeStatus::AuthFailed,
            _ => return None,
        })
    }
}

/// Why handshake bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandshakeError {
    /// Fewer than [`HANDSHAKE_LEN`] bytes.
    #[error("truncated handshake: {0} of {HANDSHAKE_LEN} bytes")]
    Truncated(usize),
    /// The magic is wrong: the peer does not speak braid.
    #[error("peer does not speak the braid protocol (magic {0:02x?})")]
    BadMagic([u8; 8]),
    /// Unknown status code in a reply.
    #[error("unknown handshake status {0}")]
    BadStatus(u16),
    /// Reserved bytes were not zero.
    #[error("reserved handshake bytes are not zero")]
    Reserved,
}

/// The messages' layout: byte ranges of their fields, little-endian integers. A hello and
/// its reply share the first 32 bytes ([`Common`]).
mod field {
    use std::ops::Range;
    pub(super) const MAGIC: Range<usize> = 0..8;
    pub(super) const VERSION: Range<usize> = 8..10;
    pub(super) const RAIL_INDEX: Range<usize> = 10..12;
    pub(super) const RAIL_COUNT: Range<usize> = 12..14;
    /// Flags in a hello (none defined: sent as 0, ignored), the status in a reply.
    pub(super) const FLAGS_OR_STATUS: Range<usize> = 14..16;
    pub(super) const CAPABILITIES: Range<usize> = 16..20;
    pub(super) const MAX_CHUNK: Range<usize> = 20..24;
    pub(super) const SESSION_ID: Range<usize> = 24..32;
    /// Hello: the nonce, then the same-host offer (zeros without one).
    pub(super) const NONCE: Range<usize> = 32..48;
    pub(super) const SAME_HOST_ID: Range<usize> = 48..56;
    pub(super) const SAME_HOST_TOKEN: Range<usize> = 56..64;
    /// Reply: the accepting side's proof (or zeros).
    pub(super) const AUTH: Range<usize> = 32..64;
    /// Proof: reserved zeros after the magic, then the MAC.
    pub(super) const PROOF_RESERVED: Range<usize> = 8..32;
    pub(super) const MAC: Range<usize> = 32..64;
}

/// The first 32 bytes of a hello and of a reply.
struct Common {
    version: u16,
    rail_index: u16,
    rail_count: u16,
    flags_or_status: u16,
    capabilities: u32,
    max_chunk: u32,
    session_id: u64,
}

impl Common {
    fn put(&self, b: &mut [u8; HANDSHAKE_LEN], magic: [u8; 8]) {
        put(b, field::MAGIC, &magic);
        put(b, field::VERSION, &self.version.to_le_bytes());
        put(b, field::RAIL_INDEX, &self.rail_index.to_le_bytes());
        put(b, field::RAIL_COUNT, &self.rail_count.to_le_bytes());
        put(
            b,
            field::FLAGS_OR_STATUS,
            &self.flags_or_status.to_le_bytes(),
        );
        put(b, field::CAPABILITIES, &self.capabilities.to_le_bytes());
        put(b, field::MAX_CHUNK, &self.max_chunk.to_le_bytes());
        put(b, field::SESSION_ID, &self.session_id.to_le_bytes());
    }

    fn get(b: &[u8], magic: [u8; 8]) -> Result<Common, HandshakeError> {
        check_magic(b, magic)?;
        Ok(Common {
            version: get_u16(b, field::VERSION),
            rail_index: get_u16(b, field::RAIL_INDEX),
            rail_count: get_u16(b, field::RAIL_COUNT),
            flags_or_status: get_u16(b, field::FLAGS_OR_STATUS),
            capabilities: get_u32(b, field::CAPABILITIES),
            max_chunk: get_u32(b, field::MAX_CHUNK),
            session_id: get_u64(b, field::SESSION_ID),
        })
    }
}

/// A whole message that opens with `magic`.
fn check_magic(b: &[u8], magic: [u8; 8]) -> Result<(), HandshakeError> {
    if b.len() < HANDSHAKE_LEN {
        return Err(HandshakeError::Truncated(b.len()));
    }
    let m: [u8; 8] = get_array(b, field::MAGIC);
    if m != magic {
        return Err(HandshakeError::BadMagic(m));
    }
    Ok(())
}

impl Hello {
    /// Encodes the hello.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        Common {
            version: self.version,
            rail_index: self.rail_index,
            rail_count: self.rail_count,
            flags_or_status: 0,
            capabilities: self.capabilities,
            max_chunk: self.max_chunk,
            session_id: self.session_id,
        }
        .put(&mut b, HELLO_MAGIC);
        put(&mut b, field::NONCE, &self.nonce);
        if let Some(o) = self.same_host {
            put(&mut b, field::SAME_HOST_ID, &o.host.to_le_bytes());
            put(&mut b, field::SAME_HOST_TOKEN, &o.token.to_le_bytes());
        }
        b
    }

    /// Decodes a hello. The version is not checked here: the caller answers a foreign
    /// version with [`HandshakeStatus::VersionUnsupported`].
    pub fn decode(b: &[u8]) -> Result<Hello, HandshakeError> {
        let c = Common::get(b, HELLO_MAGIC)?;
        let same_host = if c.capabilities & caps::SAME_HOST != 0 {
            Some(SameHostOffer {
                host: get_u64(b, field::SAME_HOST_ID),
                token: get_u64(b, field::SAME_HOST_TOKEN),
            })
        } else if b[field::SAME_HOST_ID.start..field::SAME_HOST_TOKEN.end]
            .iter()
            .any(|&x| x != 0)
        {
            return Err(HandshakeError::Reserved);
        } else {
            None
        };
        Ok(Hello {
            same_host,
            nonce: get_array(b, field::NONCE),
            version: c.version,
            rail_index: c.rail_index,
            rail_count: c.rail_count,
            capabilities: c.capabilities,
            max_chunk: c.max_chunk,
            session_id: c.session_id,
        })
    }
}

impl HelloReply {
    /// Encodes the reply.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        Common {
            version: self.version,
            rail_index: self.rail_index,
            rail_count: self.rail_count,
            flags_or_status: self.status as u16,
            capabilities: self.capabilities,
            max_chunk: self.max_chunk,
            session_id: self.session_id,
        }
        .put(&mut b, REPLY_MAGIC);
        put(&mut b, field::AUTH, &self.auth);
        b
    }

    /// Decodes a reply.
    pub fn decode(b: &[u8]) -> Result<HelloReply, HandshakeError> {
        let c = Common::get(b, REPLY_MAGIC)?;
        let status = HandshakeStatus::from_u16(c.flags_or_status)
            .ok_or(HandshakeError::BadStatus(c.flags_or_status))?;
        Ok(HelloReply {
            auth: get_array(b, field::AUTH),
            version: c.version,
            rail_index: c.rail_index,
            rail_count: c.rail_count,
            status,
            capabilities: c.capabilities,
            max_chunk: c.max_chunk,
            session_id: c.session_id,
        })
    }
}

impl AuthProof {
    /// Encodes the proof.
    pub fn encode(&self) -> [u8; HANDSHAKE_LEN] {
        let mut b = [0u8; HANDSHAKE_LEN];
        put(&mut b, field::MAGIC, &AUTH_MAGIC);
        put(&mut b, field::MAC, &self.mac);
        b
    }

    /// Decodes a proof.
    pub fn decode(b: &[u8]) -> Result<AuthProof, HandshakeError> {
        check_magic(b, AUTH_MAGIC)?;
        if b[field::PROOF_RESERVED].iter().any(|&x| x != 0) {
            return Err(HandshakeError::Reserved);
        }
        Ok(AuthProof {
            mac: get_array(b, field::MAC),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fields_tile_each_message() {
        use super::super::layout::tiles;
        use field::*;
        let common = [
            MAGIC,
            VERSION,
            RAIL_INDEX,
            RAIL_COUNT,
            FLAGS_OR_STATUS,
            CAPABILITIES,
            MAX_CHUNK,
            SESSION_ID,
        ];
        let hello: Vec<_> = common
            .iter()
            .cloned()
            .chain([NONCE, SAME_HOST_ID, SAME_HOST_TOKEN])
            .collect();
        let reply: Vec<_> = common.iter().cloned().chain([AUTH]).collect();
        assert!(tiles(&hello, HANDSHAKE_LEN));
        assert!(tiles(&reply, HANDSHAKE_LEN));
        assert!(tiles(&[MAGIC, PROOF_RESERVED, MAC], HANDSHAKE_LEN));
    }
    use proptest::prelude::*;

    #[test]
    fn round_trips() {
        let h = Hello {
            version: 1,
            rail_index: 2,
            rail_count: 4,
            capabilities: 0,
            max_chunk: 1 << 18,
            session_id: 0x1234_5678_9abc,
            nonce: [7; 16],
            same_host: None,
        };
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        let offer = Hello {
            capabilities: caps::SAME_HOST,
            same_host: Some(SameHostOffer {
                host: u64::MAX - 3,
                token: 0x0102_0304_0506_0708,
            }),
            ..h
        };
        assert_eq!(Hello::decode(&offer.encode()), Ok(offer));
        // Offer bytes without the capability are not zeros where zeros belong.
        let mut b = offer.encode();
        b[16..20].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Hello::decode(&b), Err(HandshakeError::Reserved));
        let r = HelloReply {
            version: 1,
            rail_index: 2,
            rail_count: 4,
            status: HandshakeStatus::BadRail,
            capabilities: 0,
            max_chunk: 1 << 18,
            session_id: 7,
            auth: [9; 32],
        };
        assert_eq!(HelloReply::decode(&r.encode()), Ok(r));
        let p = AuthProof { mac: [3; 32] };
        assert_eq!(AuthProof::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn refuses_foreign_bytes() {
        assert!(matches!(
            Hello::decode(
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n..........................................."
            ),
            Err(HandshakeError::BadMagic(_))
        ));
        assert_eq!(Hello::decode(&[0u8; 5]), Err(HandshakeError::Truncated(5)));
        let h = Hello {
            version: 1,
            rail_index: 0,
            rail_count: 1,
            capabilities: 0,
            max_chunk: 0,
            session_id: 1,
            nonce: [0; 16],
            same_host: None,
        };
        // A hello is not a reply and vice versa.
        assert!(matches!(
            HelloReply::decode(&h.encode()),
            Err(HandshakeError::BadMagic(_))
        ));
    }

    #[test]
    fn proofs_depend_on_everything() {
        let base = auth_mac(b"secret", AuthRole::Connector, &[1; 16], &[2; 16], 9, 0);
        assert_eq!(
            base,
            auth_mac(b"secret", AuthRole::Connector, &[1; 16], &[2; 16], 9, 0)
        );
        let verify = |secret: &[u8], role, cn: [u8; 16], an: [u8; 16], sid, rail| {
            verify_auth_mac(secret, role, &cn, &an, sid, rail, &base)
        };
        assert!(verify(
            b"secret",
            AuthRole::Connector,
            [1; 16],
            [2; 16],
            9,
            0
        ));
        for (other, verified) in [
            (
                auth_mac(b"secreT", AuthRole::Connector, &[1; 16], &[2; 16], 9, 0),
                verify(b"secreT", AuthRole::Connector, [1; 16], [2; 16], 9, 0),
            ),
            (
                auth_mac(b"secret", AuthRole::Acceptor, &[1; 16], &[2; 16], 9, 0),
                verify(b"secret", AuthRole::Acceptor, [1; 16], [2; 16], 9, 0),
            ),
            (
                auth_mac(b"secret", AuthRole::Connector, &[0; 16], &[2; 16], 9, 0),
                verify(b"secret", AuthRole::Connector, [0; 16], [2; 16], 9, 0),
            ),
            (
                auth_mac(b"secret", AuthRole::Connector, &[1; 16], &[3; 16], 9, 0),
                verify(b"secret", AuthRole::Connector, [1; 16], [3; 16], 9, 0),
            ),
            (
                auth_mac(b"secret", AuthRole::Connector, &[1; 16], &[2; 16], 8, 0),
                verify(b"secret", AuthRole::Connector, [1; 16], [2; 16], 8, 0),
            ),
            (
                auth_mac(b"secret", AuthRole::Connector, &[1; 16], &[2; 16], 9, 1),
                verify(b"secret", AuthRole::Connector, [1; 16], [2; 16], 9, 1),
            ),
        ] {
            assert_ne!(other, base);
            assert!(!verified);
        }
        // Any single flipped bit, and a truncated or empty proof, fail.
        for i in 0..MAC_LEN * 8 {
            let mut p = base;
            p[i / 8] ^= 1 << (i % 8);
            assert!(!verify_auth_mac(
                b"secret",
                AuthRole::Connector,
                &[1; 16],
                &[2; 16],
                9,
                0,
                &p
            ));
        }
        for p in [&base[..MAC_LEN - 1], &[][..]] {
            assert!(!verify_auth_mac(
                b"secret",
                AuthRole::Connector,
                &[1; 16],
                &[2; 16],
                9,
                0,
                p
            ));
        }
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..72)) {
            let _ = Hello::decode(&bytes);
            let _ = HelloReply::decode(&bytes);
            let _ = AuthProof::decode(&bytes);
        }
    }
}
