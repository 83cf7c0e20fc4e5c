//! What an open file coordinates with other clients through the server: appends placed
//! at the server's end of file, and byte-range locks held by the server.

use std::sync::mpsc::sync_channel;

use braid::Access;

use super::api::unexpected;
use super::{Error, File};
use crate::proto::{LockKind, LockRange, LockRequest, MAX_INLINE_WRITE, Reply, Request};

/// Appends up to this size travel inside the request; larger ones reserve their range and
/// are written one-sided.
const INLINE_APPEND_MAX: usize = MAX_INLINE_WRITE;

impl File {
    /// Appends `data` at the end of the file as the server finds it (`O_APPEND`): appends
    /// of every client land one after another, none overwrites another. Returns the offset
    /// the bytes landed at. Larger appends than fit in one request reserve their range
    /// first (readers may see zeros there until the bytes land).
    pub fn append(&self, data: &[u8]) -> Result<u64, Error> {
        if data.is_empty() {
            return Ok(self.client.getattr(self.node())?.size);
        }
        // After this client's earlier writes, which may grow the file themselves.
        self.wait_idle()?;
        let inline = data.len() <= INLINE_APPEND_MAX;
        let req = Request::Append {
            fh: self.fh,
            data: if inline { data.to_vec() } else { Vec::new() },
            reserve: if inline { 0 } else { data.len() as u64 },
        };
        let at = match self.client.call(&req)? {
            Reply::Appended(at, a) => {
                self.state.grown(a.size);
                at
            }
            r => return Err(unexpected("Append", r)),
        };
        if !inline {
            let buf = self
                .client
                .context()
                .alloc_region(data.len(), Access::LOCAL_WRITE)?;
            buf.write_at(0, data)?;
            self.write_at(at, &buf, 0, data.len())?;
        }
        Ok(at)
    }

    /// The first lock of another owner that conflicts with `range` (`F_GETLK`); `None`
    /// when it could be taken. `owner` names the lock owner on this client.
    pub fn get_lock(&self, owner: u64, range: LockRange) -> Result<Option<LockRange>, Error> {
        match self
            .client
            .call(&Request::GetLock(self.lock_req(owner, range)))?
        {
            Reply::Lock(l) if l.kind == LockKind::Unlock => Ok(None),
            Reply::Lock(l) => Ok(Some(l)),
            r => Err(unexpected("GetLock", r)),
        }
    }

    /// Takes or releases a lock for `owner` (`F_SETLK`); a conflict fails with `EAGAIN`.
    pub fn set_lock(&self, owner: u64, range: LockRange) -> Result<(), Error> {
        match self
            .client
            .call(&Request::SetLock(self.lock_req(owner, range)))?
        {
            Reply::Empty => Ok(()),
            r => Err(unexpected("SetLock", r)),
        }
    }

    /// Takes a lock for `owner`, waiting as long as conflicting locks are held
    /// (`F_SETLKW`); `EDEADLK` when waiting would deadlock. The server answers when the
    /// lock is granted; only a lost connection ends the wait otherwise.
    pub fn set_lock_wait(&self, owner: u64, range: LockRange) -> Result<(), Error> {
        let (tx, rx) = sync_channel(1);
        self.client.call_async(
            &Request::SetLockWait(self.lock_req(owner, range)),
            move |r| {
                let _ = tx.send(r);
            },
        );
        match rx.recv() {
            Ok(Ok(Reply::Empty)) => Ok(()),
            Ok(Ok(r)) => Err(unexpected("SetLockWait", r)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Lost("the client stopped".into())),
        }
    }

    fn lock_req(&self, owner: u64, range: LockRange) -> LockRequest {
        LockRequest {
            fh: self.fh,
            owner,
            range,
        }
    }
}
