//! What the rendezvous's connection readers and greeters tell its serving thread, and the
//! socket options every rendezvous connection gets.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::core::ConnId;
use crate::wire::{self, ClientMsg, ServerMsg};

/// An event for the serving thread.
pub(super) enum Event {
    Join {
        conn: ConnId,
        job: String,
        rank: u32,
        size: u32,
        info: wire::RankInfo,
        seen: std::net::IpAddr,
        welcome: ServerMsg,
        /// The process proved the cluster secret.
        authenticated: bool,
    },
    Msg(ConnId, ClientMsg),
    Closed(ConnId, String),
    /// Rank 0 is done: stop once every rank has left, or at the deadline.
    Finish(Instant),
}

/// TCP keepalive so a vanished host (no FIN, no RST) is noticed in about 10 s.
pub(crate) fn set_keepalive(s: &TcpStream) -> std::io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(4))
        .with_interval(Duration::from_secs(1))
        .with_retries(5);
    socket2::SockRef::from(s).set_tcp_keepalive(&ka)?;
    s.set_nodelay(true)
}
