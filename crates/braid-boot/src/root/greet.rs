//! A new rendezvous connection's greeting, run by the accept thread's poll loop (no thread
//! per connection): the hello goes out at once; the join frame is gathered as its bytes
//! arrive, within a deadline for the whole of it; then the join is authenticated and only
//! then acted on.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::core::ConnId;
use super::event::{Event, set_keepalive};
use crate::auth::{self, Role};
use crate::error::Refusal;
use crate::wire::{self, ClientMsg, ServerMsg};

/// The first frame (a join) is small; an unauthenticated peer gets no more room than this.
const JOIN_FRAME_LIMIT: usize = 64 * 1024;
/// Bound on writing a refusal.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// A connection between its accept and its join.
pub(super) struct Greeting {
    pub(super) conn: ConnId,
    pub(super) stream: TcpStream,
    pub(super) from: SocketAddr,
    /// The whole greeting must be done by then.
    pub(super) deadline: Instant,
    root_nonce: [u8; wire::NONCE_LEN],
    /// The join frame so far (length prefix included).
    buf: Vec<u8>,
}

/// What a readable greeting came to.
pub(super) enum Progress {
    /// More bytes are needed.
    Pending,
    /// The join frame, whole.
    Frame(Vec<u8>),
    /// The connection ended or broke the rules.
    Failed(String),
}

impl Greeting {
    /// Sends the hello (to a fresh socket: its buffer takes it whole, or the peer is gone).
    pub(super) fn start(
        conn: ConnId,
        mut stream: TcpStream,
        from: SocketAddr,
        auth_required: bool,
        deadline: Instant,
    ) -> Result<Greeting, String> {
        let _ = set_keepalive(&stream);
        let root_nonce = auth::nonce();
        let hello = ServerMsg::Hello {
            version: wire::VERSION,
            nonce: root_nonce,
            auth_required,
        };
        stream
            .set_nonblocking(true)
            .and_then(|()| wire::write_frame(&mut stream, &hello.encode()))
            .map_err(|e| format!("cannot send the hello: {e}"))?;
        Ok(Greeting {
            conn,
            stream,
            from,
            deadline,
            root_nonce,
            buf: Vec::new(),
        })
    }

    /// Reads what has arrived.
    pub(super) fn on_readable(&mut self) -> Progress {
        let want = match self.buf.get(..4) {
            None => 4,
            Some(len) => {
                let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
                if len == 0 || len > JOIN_FRAME_LIMIT {
                    return Progress::Failed(format!(
                        "a first frame of {len} bytes (limit {JOIN_FRAME_LIMIT})"
                    ));
                }
                4 + len
            }
        };
        let have = self.buf.len();
        self.buf.resize(want, 0);
        match self.stream.read(&mut self.buf[have..]) {
            Ok(0) => Progress::Failed("closed before joining".into()),
            Ok(n) => {
                self.buf.truncate(have + n);
                if self.buf.len() == want && want > 4 {
                    Progress::Frame(self.buf.split_off(4))
                } else if self.buf.len() == 4 {
                    // The length is known now: its frame may be there already.
                    self.on_readable()
                } else {
                    Progress::Pending
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                ) =>
            {
                self.buf.truncate(have);
                Progress::Pending
            }
            Err(e) => Progress::Failed(e.to_string()),
        }
    }

    /// Decodes and authenticates the join, refusing (with a reason that tells a stranger
    /// nothing about the job) or handing it to the core; returns the connection, blocking
    /// again, for its reader.
    pub(super) fn admit(
        self,
        frame: &[u8],
        tx: &mpsc::Sender<Event>,
        secret: Option<&[u8]>,
    ) -> Result<TcpStream, String> {
        let (conn, from, root_nonce) = (self.conn, self.from, self.root_nonce);
        let mut owned = self.stream;
        // A refusal is a few hundred bytes into an idle socket: bounded, never waited on long.
        owned
            .set_nonblocking(false)
            .and_then(|()| owned.set_write_timeout(Some(REFUSAL_WRITE_TIMEOUT)))
            .map_err(|e| e.to_string())?;
        let stream = &mut owned;
        let refuse = |stream: &mut TcpStream, kind: Refusal, detail: String| {
            let _ = wire::write_frame(
                stream,
                &ServerMsg::Refuse {
                    kind,
                    detail: detail.clone(),
                }
                .encode(),
            );
            Err(format!("{kind}: {detail}"))
        };
        let (version, nonce, mac, jjob, rank, rsize, info) = match ClientMsg::decode(frame) {
            Ok(ClientMsg::Join {
                version,
                nonce,
                mac,
                job,
                rank,
                size,
                info,
            }) => (version, nonce, mac, job, rank, size, info),
            Ok(other) => return Err(format!("protocol error: {other:?} before joining")),
            Err(e) => return Err(format!("protocol error: {e}")),
        };
        if version != wire::VERSION {
            return refuse(
                stream,
                Refusal::Version,
                format!(
                    "rank speaks version {version}, the rendezvous {}",
                    wire::VERSION
                ),
            );
        }
        let proof = match (secret, mac) {
            (Some(s), Some(m)) => {
                if !auth::verify(s, Role::Rank, &root_nonce, &nonce, &jjob, rank, rsize, &m) {
                    return refuse(
                        stream,
                        Refusal::Auth,
                        format!(
                            "rank {rank} ({from}) did not prove the cluster secret: the secrets differ"
                        ),
                    );
                }
                Some(auth::prove(
                    s,
                    Role::Root,
                    &root_nonce,
                    &nonce,
                    &jjob,
                    rank,
                    rsize,
                ))
            }
            (Some(_), None) => {
                return refuse(
                    stream,
                    Refusal::Auth,
                    format!(
                        "rank {rank} ({from}) has no cluster secret; the rendezvous requires one (BRAID_SECRET or BRAID_SECRET_FILE)"
                    ),
                );
            }
            (None, Some(_)) => {
                return refuse(
                    stream,
                    Refusal::Auth,
                    format!(
                        "rank {rank} ({from}) has a cluster secret; the rendezvous (rank 0) has none"
                    ),
                );
            }
            (None, None) => None,
        };
        tx.send(Event::Join {
            conn,
            job: jjob,
            rank,
            size: rsize,
            info,
            seen: from.ip(),
            welcome: ServerMsg::Welcome { mac: proof },
            authenticated: secret.is_some(),
        })
        .map_err(|_| "rendezvous stopped".to_string())?;
        Ok(owned)
    }
}
