//! `O_APPEND` on the server: bytes (or a reservation) placed at the end of the file as the
//! server finds it, under the lock that serialises every growth of the file, so appends
//! of several clients never overwrite each other and each learns where its bytes went.

use std::sync::Arc;

use parking_lot::Mutex;

use super::{ClientState, Export, grow};
use crate::proto::{Errno, Reply};

impl Export {
    /// Appends `data`, or with `data` empty grows the file by `reserve` zero bytes for the
    /// client to fill with one-sided writes; answers the offset they start at.
    pub(crate) fn append(
        &self,
        cs: &Mutex<ClientState>,
        fh: u64,
        data: &[u8],
        reserve: u64,
    ) -> Result<Reply, Errno> {
        let f = cs.lock().file(fh)?;
        if !f.writable {
            return Err(Errno::EBADF);
        }
        let f = Arc::clone(&f);
        // The growth lock: `MapRegion`, `Write` and other appends take it too, so the end
        // read here stays the end until these bytes are placed.
        let _growth = f.inode.regions.lock();
        let at = f.inode.attr()?.size;
        if data.is_empty() {
            let end = at.checked_add(reserve).ok_or(Errno::EFBIG)?;
            if end > i64::MAX as u64 {
                return Err(Errno::EFBIG);
            }
            grow(&f.fd, end)?;
        } else {
            let mut done = 0;
            while done < data.len() {
                let n = rustix::io::pwrite(&f.fd, &data[done..], at + done as u64)?;
                if n == 0 {
                    return Err(Errno::EIO);
                }
                done += n;
            }
        }
        Ok(Reply::Appended(at, f.inode.attr()?))
    }
}
