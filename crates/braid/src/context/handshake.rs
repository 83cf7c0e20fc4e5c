//! The connecting side of a rail's handshake: dial, hello, the optional proof of the
//! cluster secret, and the reply.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use socket2::{Domain, Socket, Type};

use super::RailLink;
use super::raw_rail::RawOffer;
use super::same_host::Offer;
use crate::endpoint::{EndpointOptions, RailAddr, RailTransport};
use crate::engine::shm::DEFAULT_RING_BYTES;
use crate::engine::transport::Tcp;
use braid_proto::error::Error;
use braid_proto::mem::registry::random_u64;
use braid_proto::wire::handshake::{
    AuthProof, AuthRole, HANDSHAKE_LEN, HANDSHAKE_VERSION, MAC_LEN, NONCE_LEN, auth_mac, caps,
    verify_auth_mac,
};
use braid_proto::wire::{HandshakeError, HandshakeStatus, Hello, HelloReply};

pub(super) fn nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&random_u64().to_le_bytes());
    n[8..].copy_from_slice(&random_u64().to_le_bytes());
    n
}

/// Connects one rail and runs the connecting side of its handshake; returns the rail's link
/// (TCP, or a same-host ring when the acceptor took the offer), the capabilities the
/// accepting side granted, and (first join without a secret) the session's join token.
///
/// A re-join proves the cluster secret, or without one the join token the first handshake
/// gave, over both sides' fresh nonces: a sniffed session id alone re-joins nothing.
#[allow(clippy::too_many_arguments)]
pub(super) fn connect_rail(
    r: &RailAddr,
    index: u16,
    count: u16,
    session_id: u64,
    opts: &EndpointOptions,
    secret: Option<&[u8]>,
    rejoin: bool,
    join_token: Option<&[u8; MAC_LEN]>,
) -> Result<(RailLink, u32, [u8; MAC_LEN]), Error> {
    // The key of the proofs: the secret, else on a re-join the session's join token.
    let key: Option<&[u8]> = match (secret, rejoin) {
        (Some(s), _) => Some(s),
        (None, true) => join_token.map(|t| &t[..]),
        (None, false) => None,
    };
    let what = if secret.is_some() {
        "the cluster secret"
    } else {
        "the session's join token"
    };
    let deadline = Instant::now() + opts.connect_timeout;
    let s = Socket::new(Domain::for_address(r.remote), Type::STREAM, None)?;
    if let Some(local) = r.local {
        s.bind(&local.into()).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("rail {index}: cannot bind {local}: {e}"),
            ))
        })?;
    }
    s.connect_timeout(&r.remote.into(), opts.connect_timeout)
        .map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("rail {index}: cannot connect to {}: {e}", r.remote),
            ))
        })?;
    s.set_tcp_nodelay(true)?;
    let mut stream: TcpStream = s.into();
    stream.set_read_timeout(Some(opts.connect_timeout))?;
    stream.set_write_timeout(Some(opts.connect_timeout))?;
    let mut capabilities = 0;
    if opts.session.payload_crc {
        capabilities |= caps::PAYLOAD_CRC32C;
    }
    if key.is_some() {
        capabilities |= caps::AUTH;
    }
    if rejoin {
        capabilities |= caps::REJOIN;
    }
    let offer = match opts.transport {
        RailTransport::Auto => {
            Offer::new(session_id, index, DEFAULT_RING_BYTES, opts.page_exchange)
        }
        RailTransport::Tcp | RailTransport::Raw => None,
    };
    if offer.is_some() {
        capabilities |= caps::SAME_HOST;
    }
    let raw = match opts.transport {
        RailTransport::Raw => RawOffer::new(&stream),
        _ => None,
    };
    if raw.is_some() {
        capabilities |= caps::RAW;
    }
    let hello = Hello {
        version: HANDSHAKE_VERSION,
        rail_index: index,
        rail_count: count,
        capabilities,
        max_chunk: opts.session.chunk_size as u32,
        session_id,
        nonce: nonce(),
        same_host: offer.as_ref().map(Offer::wire),
    };
    stream.write_all(&hello.encode())?;
    let peer = r.remote;
    let mut reply = read_reply(&mut stream, peer)?;
    let mut acceptor_nonce = None;
    if reply.status == HandshakeStatus::AuthRequired {
        let Some(key) = key else {
            return Err(Error::Auth {
                peer,
                reason:
                    "the peer requires a cluster secret and none is configured (BRAID_SECRET_FILE)"
                        .into(),
            });
        };
        let n: [u8; NONCE_LEN] = reply.auth[..NONCE_LEN].try_into().expect("16 bytes");
        let mac = auth_mac(
            key,
            AuthRole::Connector,
            &hello.nonce,
            &n,
            session_id,
            index,
        );
        stream.write_all(&AuthProof { mac }.encode())?;
        acceptor_nonce = Some(n);
        reply = read_reply(&mut stream, peer)?;
    }
    if reply.status == HandshakeStatus::VersionUnsupported || reply.version != HANDSHAKE_VERSION {
        return Err(Error::VersionMismatch {
            peer,
            ours: HANDSHAKE_VERSION,
            theirs: reply.version,
        });
    }
    if reply.status == HandshakeStatus::AuthFailed {
        return Err(Error::Auth {
            peer,
            reason: format!(
                "the peer refused our proof of {what} (different secrets, or a session it no longer has)"
            ),
        });
    }
    if reply.status != HandshakeStatus::Accepted {
        return Err(Error::Refused {
            peer,
            rail: index,
            status: reply.status,
        });
    }
    if reply.session_id != session_id || reply.rail_index != index {
        return Err(Error::Handshake {
            peer,
            source: HandshakeError::Reserved,
        });
    }
    if let Some(key) = key {
        // The accepting side must prove the key too, or we would hand our data to anyone.
        let ok = acceptor_nonce.is_some_and(|n| {
            verify_auth_mac(
                key,
                AuthRole::Acceptor,
                &hello.nonce,
                &n,
                session_id,
                index,
                &reply.auth,
            )
        });
        if !ok {
            return Err(Error::Auth {
                peer,
                reason: format!("the peer did not prove knowledge of {what}"),
            });
        }
    }
    let addrs = (stream.local_addr()?, stream.peer_addr()?);
    let same_host = offer.filter(|_| reply.capabilities & caps::SAME_HOST != 0);
    let raw = raw.filter(|_| reply.capabilities & caps::RAW != 0);
    let link: Arc<dyn crate::engine::transport::Transport> = match (same_host, raw) {
        (Some(offer), _) => Arc::new(offer.complete(&hello.nonce, &stream, deadline)?),
        (None, Some(raw)) => Arc::new(raw.complete(stream, deadline)?),
        (None, None) => {
            stream.set_read_timeout(None)?;
            stream.set_write_timeout(None)?;
            Arc::new(Tcp::new(stream)?)
        }
    };
    let token = if key.is_none() {
        reply.auth
    } else {
        [0; MAC_LEN]
    };
    Ok((RailLink { link, addrs }, reply.capabilities, token))
}

fn read_reply(stream: &mut TcpStream, peer: SocketAddr) -> Result<HelloReply, Error> {
    let mut buf = [0u8; HANDSHAKE_LEN];
    let mut got = 0;
    while got < HANDSHAKE_LEN {
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                // Closed early: a peer that is not braid says so in its first bytes.
                let source = match HelloReply::decode(&{
                    let mut padded = [0u8; HANDSHAKE_LEN];
                    padded[..got].copy_from_slice(&buf[..got]);
                    padded
                }) {
                    Err(e @ HandshakeError::BadMagic(_)) if got >= 8 => e,
                    _ => HandshakeError::Truncated(got),
                };
                return Err(Error::Handshake { peer, source });
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Timeout("waiting for the rail handshake".into()));
            }
            Err(e) => return Err(e.into()),
        }
    }
    HelloReply::decode(&buf).map_err(|source| Error::Handshake { peer, source })
}
