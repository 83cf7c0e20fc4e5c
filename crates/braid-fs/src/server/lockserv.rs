//! The lock requests on the server: the lock table ([`super::locks`]) fed from requests,
//! blocking waits answered later (when granted, from whichever thread releases the
//! conflicting lock), and the releases a close, a last close or a disconnect implies.

use std::sync::Arc;

use super::Shared;
use super::conn::Conn;
use super::locks::{Held, Kind, LockTable, Outcome, Owner, Want, Woken};
use crate::proto::{
    Errno, LockKind, LockRange, LockRequest, Op, Reply, Request, Role, encode_reply,
};

/// A waiting `SetLockWait`: whom to answer.
pub(crate) struct Waiter {
    conn: Arc<Conn>,
    id: u64,
}

/// The server's lock table.
pub(crate) type Locks = parking_lot::Mutex<LockTable<Waiter>>;

/// An unlock of `0..=u64::MAX` is the mount's close of a POSIX lock owner: it releases the
/// owner's locks on the file and cancels its waits there. (An application's unlock to the
/// end of the file ends at `i64::MAX`.)
const RELEASE_OWNER_END: u64 = u64::MAX;

impl Shared {
    /// Carries out `req` for `conn`'s client: lock requests here, the rest by the export.
    /// `None` when the reply is deferred (a lock wait).
    pub(super) fn dispatch(
        &self,
        conn: &Arc<Conn>,
        id: u64,
        req: Request,
    ) -> Option<Result<Reply, Errno>> {
        match req {
            Request::GetLock(l) => Some(self.get_lock(conn, &l)),
            Request::SetLock(l) => Some(self.set_lock(conn, id, &l, false)?),
            Request::SetLockWait(l) => self.set_lock(conn, id, &l, true),
            Request::Release { fh } => {
                // The last close of an open file: its flock and OFD locks go with it.
                if let (Ok(file), Some(client)) =
                    (self.export.open_file_id(&conn.client, fh), client_of(conn))
                {
                    let mut woken = Vec::new();
                    self.locks.lock().release_fh(file, client, fh, &mut woken);
                    self.answer_woken(woken);
                }
                Some(self.export.handle(&conn.client, req))
            }
            req => Some(self.export.handle(&conn.client, req)),
        }
    }

    /// Drops the locks and waits of a client whose meta endpoint ended.
    pub(super) fn drop_client_locks(&self, conn: &Conn) {
        if let Some((Role::Meta, session)) = conn.session() {
            let mut woken = Vec::new();
            self.locks.lock().drop_client(session, &mut woken);
            self.answer_woken(woken);
        }
    }

    fn get_lock(&self, conn: &Arc<Conn>, l: &LockRequest) -> Result<Reply, Errno> {
        let (file, want) = self.want(conn, l)?;
        if want.kind.is_none() {
            return Err(Errno::EINVAL);
        }
        Ok(Reply::Lock(match self.locks.lock().test(file, &want) {
            None => LockRange {
                kind: LockKind::Unlock,
                ..l.range
            },
            Some(h) => describe(&h, want.owner.client),
        }))
    }

    /// `None`: queued, answered when granted.
    fn set_lock(
        &self,
        conn: &Arc<Conn>,
        id: u64,
        l: &LockRequest,
        wait: bool,
    ) -> Option<Result<Reply, Errno>> {
        let (file, want) = match self.want(conn, l) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        let mut woken = Vec::new();
        let outcome = {
            let mut t = self.locks.lock();
            if want.kind.is_none() && want.start == 0 && want.end == RELEASE_OWNER_END {
                t.release_owner(file, want.owner, &mut woken);
                Outcome::Granted
            } else {
                let waiter = wait.then(|| Waiter {
                    conn: conn.clone(),
                    id,
                });
                t.set(file, want, waiter, &mut woken)
            }
        };
        self.answer_woken(woken);
        match outcome {
            Outcome::Granted => Some(Ok(Reply::Empty)),
            Outcome::Conflict(_) => Some(Err(Errno::EAGAIN)),
            Outcome::Deadlock => Some(Err(Errno::EDEADLK)),
            Outcome::NoLocks => Some(Err(Errno::ENOLCK)),
            Outcome::Queued => None,
        }
    }

    fn want(&self, conn: &Arc<Conn>, l: &LockRequest) -> Result<(u64, Want), Errno> {
        let client = client_of(conn).ok_or(Errno::EPROTO)?;
        // No check that a write lock comes through a writable handle: fcntl's is made by
        // the client's kernel, and flock takes exclusive locks through read-only files
        // (the kernel hands it over as a write lock, without telling which it is).
        let file = self.export.open_file_id(&conn.client, l.fh)?;
        let kind = match l.range.kind {
            LockKind::Read => Some(Kind::Read),
            LockKind::Write => Some(Kind::Write),
            LockKind::Unlock => None,
        };
        Ok((
            file,
            Want {
                owner: Owner {
                    client,
                    owner: l.owner,
                },
                kind,
                start: l.range.start,
                end: l.range.end,
                fh: l.fh,
                pid: l.range.pid,
            },
        ))
    }

    /// Answers the waits a change decided, outside the table's lock.
    fn answer_woken(&self, woken: Woken<Waiter>) {
        for (w, r) in woken {
            if w.conn.is_dead() {
                continue;
            }
            let reply = r.map(|()| Reply::Empty);
            let sent = encode_reply(w.id, Op::SetLockWait, &reply)
                .map_err(|_| ())
                .and_then(|m| match w.conn.bufs.get() {
                    Some(b) => b.send_reply(&w.conn.ep, m),
                    None => Err(()),
                });
            if sent.is_err() {
                tracing::warn!(
                    endpoint = w.conn.ep.id(),
                    "a granted lock could not be answered; closing"
                );
                self.drop_conn(&w.conn);
            }
        }
    }
}

/// The client (session) a meta endpoint belongs to.
fn client_of(conn: &Conn) -> Option<u64> {
    match conn.session() {
        Some((Role::Meta, s)) => Some(s),
        _ => None,
    }
}

/// A held lock as `F_GETLK` reports it: the holder's pid only to processes of its own
/// client (a pid of another host means nothing here).
fn describe(h: &Held, asking_client: u64) -> LockRange {
    LockRange {
        kind: match h.kind {
            Kind::Read => LockKind::Read,
            Kind::Write => LockKind::Write,
        },
        start: h.start,
        end: h.end,
        pid: if h.owner.client == asking_client {
            h.pid
        } else {
            0
        },
    }
}
