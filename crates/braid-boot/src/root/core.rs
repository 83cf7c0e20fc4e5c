//! The rendezvous as a sans-IO state machine: joins, the address table, collectives and
//! failures in; messages to send and connections to close out. The driver
//! ([`super::server`]) owns the sockets and the clock.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::error::Refusal;
use crate::wire::{ClientMsg, Failure, RankInfo, ServerMsg, TableEntry};

/// A connection, numbered by the driver.
pub(crate) type ConnId = u64;

/// What the driver must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send a message on a connection.
    Send(ConnId, ServerMsg),
    /// Close a connection (after the sends before it).
    Close(ConnId),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Joining,
    Formed,
    Failed(Failure),
}

struct Member {
    conn: ConnId,
    info: RankInfo,
    seen: IpAddr,
    /// Connection ended (after a goodbye or not).
    gone: bool,
    /// Said goodbye.
    left: bool,
}

impl Member {
    fn label(&self) -> String {
        format!(
            "pid {} on {} ({})",
            self.info.pid, self.info.hostname, self.seen
        )
    }
}

struct Pending {
    kind: u8,
    parts: Vec<Option<Vec<u8>>>,
}

/// The rendezvous of one job.
pub(crate) struct RootCore {
    job: String,
    size: usize,
    join_deadline: Instant,
    join_timeout: Duration,
    phase: Phase,
    members: Vec<Option<Member>>,
    by_conn: HashMap<ConnId, usize>,
    next_seq: u64,
    pending: Option<Pending>,
    out: Vec<Action>,
}

impl RootCore {
    /// A rendezvous for `size` ranks of `job`, expecting all of them by `now + join_timeout`.
    pub(crate) fn new(job: &str, size: usize, now: Instant, join_timeout: Duration) -> RootCore {
        RootCore {
            job: job.to_owned(),
            size,
            join_deadline: now + join_timeout,
            join_timeout,
            phase: Phase::Joining,
            members: (0..size).map(|_| None).collect(),
            by_conn: HashMap::new(),
            next_seq: 0,
            pending: None,
            out: Vec::new(),
        }
    }

    /// The actions accumulated since the last call.
    pub(crate) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.out)
    }

    /// When [`RootCore::tick`] must run next, if ever.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        (self.phase == Phase::Joining).then_some(self.join_deadline)
    }

    /// True once the job has failed.
    #[cfg(test)]
    pub(crate) fn failed(&self) -> Option<&Failure> {
        match &self.phase {
            Phase::Failed(f) => Some(f),
            _ => None,
        }
    }

    /// True when no rank needs the rendezvous any more: the job formed or failed, every rank
    /// joined at some point, and each has left or is gone. A job that failed before every
    /// rank joined is never finished: a late rank still needs to learn why (the server
    /// lingers for that until its own deadline).
    pub(crate) fn finished(&self) -> bool {
        self.phase != Phase::Joining
            && self
                .members
                .iter()
                .all(|m| m.as_ref().is_some_and(|m| m.gone || m.left))
    }

    fn refuse(&mut self, conn: ConnId, kind: Refusal, detail: String) {
        tracing::warn!(conn, %kind, "rendezvous refused a process: {detail}");
        self.out
            .push(Action::Send(conn, ServerMsg::Refuse { kind, detail }));
        self.out.push(Action::Close(conn));
    }

    /// A process asks to join as `rank`; `welcome` is the message that admits it (carrying
    /// the rendezvous's proof). `authenticated`: it proved the cluster secret. Only an
    /// authenticated join that conflicts with the job (size, duplicate rank) fails the job;
    /// without a secret such a join could be anyone's, and is refused alone.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn join(
        &mut self,
        conn: ConnId,
        job: &str,
        rank: u32,
        size: u32,
        info: RankInfo,
        seen: IpAddr,
        welcome: ServerMsg,
        authenticated: bool,
    ) {
        let who = format!("pid {} on {} ({seen})", info.pid, info.hostname);
        if job != self.job {
            // The job's own id is not told: the peer may be a stranger fishing for it.
            return self.refuse(
                conn,
                Refusal::WrongJob,
                format!("this rendezvous serves another job, not {job:?} ({who})"),
            );
        }
        match &self.phase {
            Phase::Failed(f) => {
                // Late ranks learn the job's failure itself, as the others did.
                tracing::warn!(conn, rank, "a rank joined a job that had already failed");
                self.out
                    .push(Action::Send(conn, ServerMsg::Failed(f.clone())));
                self.out.push(Action::Close(conn));
                return;
            }
            Phase::Formed => {
                return self.refuse(
                    conn,
                    Refusal::JobFormed,
                    format!(
                        "job {job:?} already has all {} ranks; {who} claims rank {rank}",
                        self.size
                    ),
                );
            }
            Phase::Joining => {}
        }
        if size as usize != self.size {
            self.refuse(
                conn,
                Refusal::SizeMismatch,
                format!("{who} has size {size}, rank 0 has {}", self.size),
            );
            if !authenticated {
                return;
            }
            return self.fail(Failure::SizeMismatch {
                rank,
                size,
                root_size: self.size as u32,
            });
        }
        let r = rank as usize;
        if r >= self.size {
            return self.refuse(
                conn,
                Refusal::BadRank,
                format!("rank {rank} of a job of {}", self.size),
            );
        }
        if let Some(first) = &self.members[r] {
            let first = first.label();
            self.refuse(
                conn,
                Refusal::DuplicateRank,
                format!("rank {rank} already joined ({first})"),
            );
            if !authenticated {
                return;
            }
            return self.fail(Failure::DuplicateRank {
                rank,
                first,
                second: who,
            });
        }
        self.members[r] = Some(Member {
            conn,
            info,
            seen,
            gone: false,
            left: false,
        });
        self.by_conn.insert(conn, r);
        self.out.push(Action::Send(conn, welcome));
        if self.members.iter().all(Option::is_some) {
            self.phase = Phase::Formed;
            let table: Vec<TableEntry> = self
                .members
                .iter()
                .flatten()
                .map(|m| TableEntry {
                    info: m.info.clone(),
                    seen: m.seen,
                })
                .collect();
            tracing::debug!(job = %self.job, size = self.size, "all ranks joined");
            self.broadcast(ServerMsg::Table(table));
        }
    }

    /// A message from a joined rank's connection.
    pub(crate) fn message(&mut self, conn: ConnId, msg: ClientMsg) {
        let Some(&r) = self.by_conn.get(&conn) else {
            return;
        };
        match msg {
            ClientMsg::Collective { seq, kind, data } => self.contribute(r, seq, kind, data),
            ClientMsg::Abort { reason } => self.fail(Failure::RankAborted {
                rank: r as u32,
                reason,
            }),
            ClientMsg::Bye => {
                if let Some(m) = self.members[r].as_mut() {
                    m.left = true;
                }
                let waiting = self.pending.as_ref().is_some_and(|p| p.parts[r].is_none());
                if waiting && self.phase == Phase::Formed {
                    self.fail(Failure::RankLeft { rank: r as u32 });
                }
            }
            ClientMsg::Join { .. } => self.fail(Failure::RankDied {
                rank: r as u32,
                detail: "protocol error: joined twice on one connection".into(),
            }),
        }
    }

    fn contribute(&mut self, r: usize, seq: u64, kind: u8, data: Vec<u8>) {
        if self.phase != Phase::Formed {
            return;
        }
        if seq != self.next_seq {
            return self.fail(Failure::CollectiveMismatch(format!(
                "rank {r} entered collective #{seq}, the others are at #{}",
                self.next_seq
            )));
        }
        let size = self.size;
        let p = self.pending.get_or_insert_with(|| Pending {
            kind,
            parts: vec![None; size],
        });
        let name = |k: u8| if k == 0 { "barrier" } else { "allgather" };
        if p.kind != kind {
            let msg = format!(
                "collective #{seq}: rank {r} called {} while others called {}",
                name(kind),
                name(p.kind)
            );
            return self.fail(Failure::CollectiveMismatch(msg));
        }
        if p.parts[r].is_some() {
            return self.fail(Failure::CollectiveMismatch(format!(
                "rank {r} entered collective #{seq} twice"
            )));
        }
        p.parts[r] = Some(data);
        if let Some(left) = (0..size)
            .find(|&i| p.parts[i].is_none() && self.members[i].as_ref().is_some_and(|m| m.left))
        {
            return self.fail(Failure::RankLeft { rank: left as u32 });
        }
        if p.parts.iter().all(Option::is_some) {
            let p = self.pending.take().expect("present");
            let parts = p
                .parts
                .into_iter()
                .map(|x| x.expect("all present"))
                .collect();
            self.next_seq += 1;
            self.broadcast(ServerMsg::Done { seq, parts });
        }
    }

    /// A connection ended (`detail`: how).
    pub(crate) fn closed(&mut self, conn: ConnId, detail: &str) {
        let Some(r) = self.by_conn.remove(&conn) else {
            return;
        };
        let Some(m) = self.members[r].as_mut() else {
            return;
        };
        m.gone = true;
        if !m.left {
            let detail = format!("{}: {detail}", m.label());
            self.fail(Failure::RankDied {
                rank: r as u32,
                detail,
            });
        }
    }

    /// Time passes.
    pub(crate) fn tick(&mut self, now: Instant) {
        if self.phase == Phase::Joining && now >= self.join_deadline {
            let missing = (0..self.size)
                .filter(|&r| self.members[r].is_none())
                .map(|r| r as u32)
                .collect();
            self.fail(Failure::JoinTimeout {
                missing,
                waited_ms: self.join_timeout.as_millis() as u64,
            });
        }
    }

    fn fail(&mut self, f: Failure) {
        if matches!(self.phase, Phase::Failed(_)) {
            return;
        }
        tracing::warn!(job = %self.job, failure = ?f, "the job failed");
        self.phase = Phase::Failed(f.clone());
        self.pending = None;
        self.broadcast(ServerMsg::Failed(f));
    }

    /// Sends `msg` to every rank still connected, rank 0 last: rank 0 hosts the rendezvous,
    /// so once it has a broadcast, every other rank's copy has been written.
    fn broadcast(&mut self, msg: ServerMsg) {
        let mut live: Vec<(usize, ConnId)> = self
            .members
            .iter()
            .enumerate()
            .filter_map(|(r, m)| m.as_ref().filter(|m| !m.gone).map(|m| (r, m.conn)))
            .collect();
        live.sort_by_key(|&(r, _)| (r == 0, r));
        for (_, conn) in live {
            self.out.push(Action::Send(conn, msg.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pid: u32) -> RankInfo {
        RankInfo {
            hostname: "h".into(),
            pid,
            host_key: "k".into(),
            addrs: vec![],
            loopback_port: 1,
            rails_override: false,
        }
    }

    fn welcome() -> ServerMsg {
        ServerMsg::Welcome { mac: None }
    }

    fn seen() -> IpAddr {
        "127.0.0.1".parse().unwrap()
    }

    /// A core with all `n` ranks joined (conn id = rank).
    fn formed(n: usize) -> RootCore {
        let mut c = RootCore::new("j", n, Instant::now(), Duration::from_secs(10));
        for r in 0..n {
            c.join(
                r as u64,
                "j",
                r as u32,
                n as u32,
                info(r as u32),
                seen(),
                welcome(),
                true,
            );
        }
        let a = c.take_actions();
        let tables = a
            .iter()
            .filter(|x| matches!(x, Action::Send(_, ServerMsg::Table(t)) if t.len() == n))
            .count();
        assert_eq!(tables, n);
        c
    }

    fn failures(a: &[Action]) -> Vec<(ConnId, Failure)> {
        a.iter()
            .filter_map(|x| match x {
                Action::Send(c, ServerMsg::Failed(f)) => Some((*c, f.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn table_after_the_last_join_and_allgather_in_rank_order() {
        let mut c = formed(3);
        for r in [2u64, 0, 1] {
            c.message(
                r,
                ClientMsg::Collective {
                    seq: 0,
                    kind: 1,
                    data: vec![r as u8],
                },
            );
        }
        let a = c.take_actions();
        assert_eq!(a.len(), 3);
        for x in a {
            match x {
                Action::Send(_, ServerMsg::Done { seq: 0, parts }) => {
                    assert_eq!(parts, vec![vec![0], vec![1], vec![2]])
                }
                other => panic!("{other:?}"),
            }
        }
        for r in 0..3 {
            c.message(
                r,
                ClientMsg::Collective {
                    seq: 1,
                    kind: 0,
                    data: vec![],
                },
            );
        }
        assert_eq!(c.take_actions().len(), 3);
        for r in 0..3 {
            c.message(r, ClientMsg::Bye);
            assert!(!c.finished() || r == 2);
            c.closed(r, "eof");
        }
        assert!(c.finished());
        assert!(c.failed().is_none());
        assert!(c.take_actions().is_empty());
    }

    #[test]
    fn wrong_job_is_refused_without_harm() {
        let mut c = RootCore::new("j", 2, Instant::now(), Duration::from_secs(10));
        c.join(7, "other", 1, 2, info(9), seen(), welcome(), true);
        let a = c.take_actions();
        assert!(matches!(
            &a[0],
            Action::Send(7, ServerMsg::Refuse { kind: Refusal::WrongJob, detail }) if detail.contains("\"other\"") && !detail.contains("\"j\"")
        ));
        assert_eq!(a[1], Action::Close(7));
        assert!(c.failed().is_none());
        c.closed(7, "eof");
        assert!(c.failed().is_none());
    }

    #[test]
    fn unauthenticated_conflicting_joins_are_refused_alone() {
        let mut c = RootCore::new("secret-job", 2, Instant::now(), Duration::from_secs(10));
        c.join(0, "secret-job", 0, 2, info(1), seen(), welcome(), false);
        c.take_actions();
        // Fishing for the job id learns nothing of it.
        c.join(5, "guess", 1, 2, info(9), seen(), welcome(), false);
        let a = c.take_actions();
        assert!(matches!(
            &a[0],
            Action::Send(5, ServerMsg::Refuse { kind: Refusal::WrongJob, detail })
                if !detail.contains("secret-job")
        ));
        // A forged size or a second rank 0 is refused, and the job goes on.
        c.join(6, "secret-job", 1, 3, info(9), seen(), welcome(), false);
        c.join(7, "secret-job", 0, 2, info(9), seen(), welcome(), false);
        let a = c.take_actions();
        assert!(failures(&a).is_empty(), "{a:?}");
        assert!(a.contains(&Action::Close(6)) && a.contains(&Action::Close(7)));
        assert!(c.failed().is_none());
        c.join(1, "secret-job", 1, 2, info(2), seen(), welcome(), false);
        assert!(matches!(
            c.take_actions().last(),
            Some(Action::Send(_, ServerMsg::Table(_)))
        ));
    }

    #[test]
    fn duplicate_rank_and_size_mismatch_abort_the_job() {
        let mut c = RootCore::new("j", 3, Instant::now(), Duration::from_secs(10));
        c.join(0, "j", 0, 3, info(1), seen(), welcome(), true);
        c.join(1, "j", 1, 3, info(2), seen(), welcome(), true);
        c.take_actions();
        c.join(2, "j", 1, 3, info(3), seen(), welcome(), true);
        let a = c.take_actions();
        assert!(matches!(
            &a[0],
            Action::Send(
                2,
                ServerMsg::Refuse {
                    kind: Refusal::DuplicateRank,
                    ..
                }
            )
        ));
        let f = failures(&a);
        assert_eq!(f.len(), 2, "both joined ranks hear of it: {a:?}");
        assert!(matches!(f[0].1, Failure::DuplicateRank { rank: 1, .. }));
        // Later joiners are refused with the failure.
        c.join(3, "j", 2, 3, info(4), seen(), welcome(), true);
        assert!(matches!(
            &c.take_actions()[0],
            Action::Send(3, ServerMsg::Failed(Failure::DuplicateRank { rank: 1, .. }))
        ));

        let mut c = RootCore::new("j", 2, Instant::now(), Duration::from_secs(10));
        c.join(0, "j", 0, 2, info(1), seen(), welcome(), true);
        c.join(1, "j", 1, 3, info(2), seen(), welcome(), true);
        let a = c.take_actions();
        assert!(a.contains(&Action::Send(
            0,
            ServerMsg::Failed(Failure::SizeMismatch {
                rank: 1,
                size: 3,
                root_size: 2
            })
        )));
        assert!(a.iter().any(|x| matches!(
            x,
            Action::Send(
                1,
                ServerMsg::Refuse {
                    kind: Refusal::SizeMismatch,
                    ..
                }
            )
        )));
    }

    #[test]
    fn join_timeout_names_the_missing_ranks() {
        let t0 = Instant::now();
        let mut c = RootCore::new("j", 4, t0, Duration::from_secs(2));
        c.join(0, "j", 0, 4, info(1), seen(), welcome(), true);
        c.join(2, "j", 2, 4, info(1), seen(), welcome(), true);
        c.tick(t0 + Duration::from_secs(1));
        assert!(c.failed().is_none());
        c.tick(t0 + Duration::from_secs(2));
        assert_eq!(
            c.failed(),
            Some(&Failure::JoinTimeout {
                missing: vec![1, 3],
                waited_ms: 2000
            })
        );
        assert_eq!(failures(&c.take_actions()).len(), 2);
        assert_eq!(c.deadline(), None);
    }

    #[test]
    fn a_dead_rank_fails_everyone_but_a_goodbye_does_not() {
        let mut c = RootCore::new("j", 3, Instant::now(), Duration::from_secs(10));
        c.join(0, "j", 0, 3, info(1), seen(), welcome(), true);
        c.join(1, "j", 1, 3, info(2), seen(), welcome(), true);
        c.take_actions();
        c.closed(1, "connection reset");
        let f = failures(&c.take_actions());
        assert_eq!(f.len(), 1);
        assert!(
            matches!(&f[0], (0, Failure::RankDied { rank: 1, detail }) if detail.contains("reset"))
        );
        // Rank 2 has not joined yet: the rendezvous must stay to tell it why, even once the
        // ranks that did join are gone.
        c.closed(0, "eof");
        assert!(!c.finished());
        c.join(2, "j", 2, 3, info(3), seen(), welcome(), true);
        let late = failures(&c.take_actions());
        assert!(
            matches!(&late[..], [(2, Failure::RankDied { rank: 1, .. })]),
            "{late:?}"
        );

        let mut c = formed(2);
        c.message(1, ClientMsg::Bye);
        c.closed(1, "eof");
        assert!(c.failed().is_none());
        // ... but a collective that needs it fails at once.
        c.message(
            0,
            ClientMsg::Collective {
                seq: 0,
                kind: 0,
                data: vec![],
            },
        );
        assert_eq!(c.failed(), Some(&Failure::RankLeft { rank: 1 }));
    }

    #[test]
    fn mismatched_collectives_fail() {
        let mut c = formed(2);
        c.message(
            0,
            ClientMsg::Collective {
                seq: 0,
                kind: 0,
                data: vec![],
            },
        );
        c.message(
            1,
            ClientMsg::Collective {
                seq: 0,
                kind: 1,
                data: vec![],
            },
        );
        assert!(
            matches!(c.failed(), Some(Failure::CollectiveMismatch(s)) if s.contains("allgather"))
        );
        let mut c = formed(2);
        c.message(
            0,
            ClientMsg::Collective {
                seq: 1,
                kind: 0,
                data: vec![],
            },
        );
        assert!(matches!(c.failed(), Some(Failure::CollectiveMismatch(_))));
        let mut c = formed(2);
        c.message(
            0,
            ClientMsg::Abort {
                reason: "boom".into(),
            },
        );
        let f = failures(&c.take_actions());
        assert_eq!(f.len(), 2);
        assert!(matches!(&f[1].1, Failure::RankAborted { rank: 0, reason } if reason == "boom"));
        // Rank 0 (the host of the rendezvous) hears of it last.
        assert_eq!((f[0].0, f[1].0), (1, 0));
    }
}
