//! A rank's connection to the rendezvous: the join handshake, then a reader thread that
//! records the table, collective results and failures for the calls waiting on them.

use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::auth::{self, Role};
use crate::error::{BootError, Refusal};
use crate::root::event::set_keepalive;
use crate::wire::{self, ClientMsg, Failure, RankInfo, ServerMsg, TableEntry};

/// Collective kinds on the wire.
pub(crate) const BARRIER: u8 = 0;
pub(crate) const ALLGATHER: u8 = 1;

#[derive(Default)]
struct State {
    table: Option<Vec<TableEntry>>,
    done: Option<(u64, Vec<Vec<u8>>)>,
    failure: Option<Failure>,
    /// The connection ended (how), unless we said goodbye.
    lost: Option<String>,
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

/// What a rank needs to join.
pub(crate) struct JoinRequest<'a> {
    pub root: &'a str,
    pub candidates: Vec<(String, u16)>,
    pub job: &'a str,
    pub rank: usize,
    pub size: usize,
    pub secret: Option<&'a [u8]>,
    pub info: RankInfo,
}

/// The open link to the rendezvous.
pub(crate) struct RootLink {
    root: String,
    stream: Mutex<TcpStream>,
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
    /// Next collective's number; the lock also keeps collectives one at a time.
    seq: Mutex<u64>,
}

fn failure_error(f: &Failure) -> BootError {
    match f.clone() {
        Failure::RankDied { rank, detail } => BootError::RankDied {
            rank: rank as usize,
            detail,
        },
        Failure::RankAborted { rank, reason } => BootError::RankFailed {
            rank: rank as usize,
            reason,
        },
        Failure::RankLeft { rank } => BootError::RankLeft {
            rank: rank as usize,
        },
        Failure::JoinTimeout { missing, waited_ms } => BootError::JoinTimeout {
            missing: missing.into_iter().map(|r| r as usize).collect(),
            waited: Duration::from_millis(waited_ms),
        },
        Failure::DuplicateRank {
            rank,
            first,
            second,
        } => BootError::DuplicateRank {
            rank: rank as usize,
            first,
            second,
        },
        Failure::SizeMismatch {
            rank,
            size,
            root_size,
        } => BootError::SizeMismatch {
            rank: rank as usize,
            size: size as usize,
            root_size: root_size as usize,
        },
        Failure::CollectiveMismatch(s) => BootError::CollectiveMismatch(s),
    }
}

/// Connects to the first candidate that answers, retrying until `deadline`.
fn dial(
    root: &str,
    candidates: &[(String, u16)],
    deadline: Instant,
) -> Result<TcpStream, BootError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    let mut last = String::from("no attempt");
    loop {
        for (host, port) in candidates {
            let addrs: Vec<SocketAddr> = match (host.as_str(), *port).to_socket_addrs() {
                Ok(a) => a.collect(),
                Err(e) => {
                    last = format!("resolving {host}: {e}");
                    continue;
                }
            };
            for a in addrs {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                match TcpStream::connect_timeout(&a, left.min(Duration::from_secs(3))) {
                    Ok(s) => return Ok(s),
                    Err(e) => last = format!("{a}: {e}"),
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BootError::RootUnreachable {
                root: root.to_owned(),
                waited: start.elapsed(),
                last,
            });
        }
        // Rank 0 may not be listening yet: retry with a growing pause (not a synchronisation).
        std::thread::sleep(pause.min(left));
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

impl RootLink {
    /// Dials the rendezvous, authenticates both ways and joins. Returns once admitted (the
    /// table comes later: [`RootLink::wait_table`]).
    pub(crate) fn join(req: JoinRequest<'_>, deadline: Instant) -> Result<RootLink, BootError> {
        let root = req.root.to_owned();
        let mut stream = dial(&root, &req.candidates, deadline)?;
        let _ = set_keepalive(&stream);
        let step = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_secs(1), Duration::from_secs(10));
        stream.set_read_timeout(Some(step))?;
        stream.set_write_timeout(Some(step))?;
        let proto = |e: String| BootError::Protocol(format!("rendezvous {root}: {e}"));
        let read = |s: &mut TcpStream| -> Result<ServerMsg, BootError> {
            let f = wire::read_frame(s, wire::server_frame_limit(req.size)).map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    proto("closed the connection during the handshake".into())
                } else {
                    proto(format!("during the handshake: {e}"))
                }
            })?;
            ServerMsg::decode(&f, req.size).map_err(|e| proto(e.to_string()))
        };
        let (root_nonce, auth_required) = match read(&mut stream)? {
            ServerMsg::Hello {
                version,
                nonce,
                auth_required,
            } => {
                if version != wire::VERSION {
                    return Err(BootError::Refused {
                        root,
                        rank: req.rank,
                        kind: Refusal::Version,
                        detail: format!(
                            "rendezvous speaks version {version}, this rank {}",
                            wire::VERSION
                        ),
                    });
                }
                (nonce, auth_required)
            }
            other => return Err(proto(format!("expected a hello, got {other:?}"))),
        };
        if auth_required && req.secret.is_none() {
            // Say so to the rendezvous too (it logs the refusal), then fail here.
            let _ = wire::write_frame(
                &mut stream,
                &join_msg(&req, [0; wire::NONCE_LEN], None).encode(),
            );
            return Err(BootError::Refused {
                root,
                rank: req.rank,
                kind: Refusal::Auth,
                detail: "the rendezvous requires the cluster secret; this rank has none (set BRAID_SECRET or BRAID_SECRET_FILE)".into(),
            });
        }
        let nonce = auth::nonce();
        let (rank, size) = (req.rank as u32, req.size as u32);
        let mac = req
            .secret
            .map(|s| auth::prove(s, Role::Rank, &root_nonce, &nonce, req.job, rank, size));
        wire::write_frame(&mut stream, &join_msg(&req, nonce, mac).encode())
            .map_err(|e| proto(format!("sending the join: {e}")))?;
        match read(&mut stream)? {
            ServerMsg::Welcome { mac } => {
                if let Some(s) = req.secret {
                    let ok = mac.is_some_and(|m| {
                        auth::verify(s, Role::Root, &root_nonce, &nonce, req.job, rank, size, &m)
                    });
                    if !ok {
                        return Err(BootError::Auth {
                            root,
                            reason: "it did not prove the cluster secret".into(),
                        });
                    }
                }
            }
            ServerMsg::Refuse { kind, detail } => {
                return Err(BootError::Refused {
                    root,
                    rank: req.rank,
                    kind,
                    detail,
                });
            }
            ServerMsg::Failed(f) => return Err(failure_error(&f)),
            other => return Err(proto(format!("expected a welcome, got {other:?}"))),
        }
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(Some(Duration::from_secs(10)))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let reader = {
            let mut s = stream.try_clone()?;
            let shared = shared.clone();
            let size = req.size;
            std::thread::Builder::new()
                .name("braid-boot-link".into())
                .spawn(move || read_loop(&mut s, &shared, size))?
        };
        Ok(RootLink {
            root,
            stream: Mutex::new(stream),
            shared,
            reader: Some(reader),
            seq: Mutex::new(0),
        })
    }

    fn send(&self, m: &ClientMsg) -> Result<(), BootError> {
        let mut s = self.stream.lock().expect("link lock");
        wire::write_frame(&mut *s, &m.encode())
            .map_err(|e| BootError::RootLost(format!("sending to {}: {e}", self.root)))
    }

    /// The job's failure or the link's loss, if either happened.
    pub(crate) fn failure(&self) -> Option<BootError> {
        let st = self.shared.state.lock().expect("link lock");
        Self::failure_of(&st)
    }

    fn failure_of(st: &State) -> Option<BootError> {
        if let Some(f) = &st.failure {
            return Some(failure_error(f));
        }
        st.lost.as_ref().map(|l| BootError::RootLost(l.clone()))
    }

    /// Waits up to `wait` for the job's failure or the link's loss; `None` if neither came.
    ///
    /// A rank that fails to reach a peer asks this first: when the peer gave up because the
    /// job failed, the rendezvous's verdict names the cause, the broken connection does not.
    pub(crate) fn wait_failure(&self, wait: Duration) -> Option<BootError> {
        let deadline = Instant::now() + wait;
        let mut st = self.shared.state.lock().expect("link lock");
        loop {
            if let Some(e) = Self::failure_of(&st) {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self.shared.cv.wait_timeout(st, left).expect("link lock").0;
        }
    }

    /// Waits for the address table until `deadline`.
    pub(crate) fn wait_table(&self, deadline: Instant) -> Result<Vec<TableEntry>, BootError> {
        let start = Instant::now();
        let mut st = self.shared.state.lock().expect("link lock");
        loop {
            if let Some(t) = st.table.take() {
                return Ok(t);
            }
            if let Some(e) = Self::failure_of(&st) {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BootError::Timeout {
                    what: "waiting for the other ranks to join".into(),
                    waited: start.elapsed(),
                });
            }
            st = self.shared.cv.wait_timeout(st, left).expect("link lock").0;
        }
    }

    /// Runs one collective: sends `data`, waits up to `timeout` for every rank's part.
    pub(crate) fn collective(
        &self,
        kind: u8,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, BootError> {
        if data.len() > wire::MAX_CONTRIBUTION {
            return Err(BootError::TooLarge {
                what: "an allgather contribution",
                len: data.len(),
                limit: wire::MAX_CONTRIBUTION,
            });
        }
        let mut seq = self.seq.lock().expect("seq lock");
        if let Some(e) = self.failure() {
            return Err(e);
        }
        self.send(&ClientMsg::Collective {
            seq: *seq,
            kind,
            data: data.to_vec(),
        })?;
        let start = Instant::now();
        let deadline = start + timeout;
        let mut st = self.shared.state.lock().expect("link lock");
        loop {
            if st.done.as_ref().is_some_and(|(s, _)| *s == *seq) {
                let (_, parts) = st.done.take().expect("present");
                *seq += 1;
                return Ok(parts);
            }
            if let Some(e) = Self::failure_of(&st) {
                return Err(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let what = if kind == BARRIER {
                    "barrier"
                } else {
                    "allgather"
                };
                return Err(BootError::Timeout {
                    what: format!("in {what} #{} (a rank is slow or stuck)", *seq),
                    waited: start.elapsed(),
                });
            }
            st = self.shared.cv.wait_timeout(st, left).expect("link lock").0;
        }
    }

    /// Tells the rendezvous that this rank failed, and waits (at most `wait`) until the
    /// rendezvous has told every rank: its broadcast comes back here too (to rank 0 last).
    pub(crate) fn abort(&self, reason: &str, wait: Duration) {
        let mut r = reason.to_owned();
        if r.len() > 4000 {
            let mut cut = 4000;
            while !r.is_char_boundary(cut) {
                cut -= 1;
            }
            r.truncate(cut);
        }
        if self.send(&ClientMsg::Abort { reason: r }).is_err() {
            return;
        }
        let deadline = Instant::now() + wait;
        let mut st = self.shared.state.lock().expect("link lock");
        while Self::failure_of(&st).is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self.shared.cv.wait_timeout(st, left).expect("link lock").0;
        }
    }

    /// Leaves cleanly and closes the link.
    pub(crate) fn bye(mut self) {
        self.close(true);
    }

    fn close(&mut self, say_bye: bool) {
        if let Some(reader) = self.reader.take() {
            if say_bye {
                let _ = self.send(&ClientMsg::Bye);
            }
            {
                let mut st = self.shared.state.lock().expect("link lock");
                if st.lost.is_none() {
                    st.lost = Some("this rank left the job".into());
                }
            }
            let _ = self
                .stream
                .lock()
                .expect("link lock")
                .shutdown(Shutdown::Both);
            let _ = reader.join();
        }
    }
}

impl Drop for RootLink {
    fn drop(&mut self) {
        self.close(false);
    }
}

fn join_msg(
    req: &JoinRequest<'_>,
    nonce: [u8; wire::NONCE_LEN],
    mac: Option<[u8; wire::MAC_LEN]>,
) -> ClientMsg {
    ClientMsg::Join {
        version: wire::VERSION,
        nonce,
        mac,
        job: req.job.to_owned(),
        rank: req.rank as u32,
        size: req.size as u32,
        info: req.info.clone(),
    }
}

fn read_loop(s: &mut TcpStream, shared: &Shared, size: usize) {
    let end = loop {
        let frame = match wire::read_frame(s, wire::server_frame_limit(size)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break "the rendezvous closed the connection (rank 0 exited or failed)".to_string();
            }
            Err(e) => break format!("the connection to the rendezvous failed: {e}"),
        };
        let msg = match ServerMsg::decode(&frame, size) {
            Ok(m) => m,
            Err(e) => break format!("protocol error: {e}"),
        };
        let mut st = shared.state.lock().expect("link lock");
        match msg {
            ServerMsg::Table(t) => st.table = Some(t),
            ServerMsg::Done { seq, parts } => st.done = Some((seq, parts)),
            ServerMsg::Failed(f) => {
                if st.failure.is_none() {
                    st.failure = Some(f);
                }
            }
            other => {
                drop(st);
                break format!("protocol error: unexpected {other:?}");
            }
        }
        drop(st);
        shared.cv.notify_all();
    };
    let mut st = shared.state.lock().expect("link lock");
    if st.lost.is_none() {
        st.lost = Some(end);
    }
    drop(st);
    shared.cv.notify_all();
}
