//! One-sided operations on the data endpoint, each with a callback for its completion.

use braid::{Endpoint, RemoteKey, Sge, Status};
use parking_lot::Mutex;

use super::Error;

/// `wr_id` bit of data operations; the low bits index the callback table.
pub(crate) const DATA: u64 = 1 << 60;
/// Most one-sided operations in flight at once per client.
pub const MAX_DATA_OPS: usize = 512;

/// Receives the outcome of one one-sided operation.
pub(crate) type DataCb = Box<dyn FnOnce(Result<(), Error>) + Send>;

#[derive(Default)]
struct Table {
    cbs: Vec<Option<DataCb>>,
    free: Vec<usize>,
    live: usize,
}

/// The data endpoint and the callbacks of its operations in flight.
pub(crate) struct DataOps {
    ep: Endpoint,
    table: Mutex<Table>,
}

impl DataOps {
    pub(crate) fn new(ep: Endpoint) -> DataOps {
        DataOps {
            ep,
            table: Mutex::new(Table::default()),
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    fn insert(&self, cb: DataCb) -> Result<usize, (Error, DataCb)> {
        let mut t = self.table.lock();
        if t.live >= MAX_DATA_OPS {
            return Err((
                Error::Busy(format!("{MAX_DATA_OPS} one-sided operations in flight")),
                cb,
            ));
        }
        t.live += 1;
        Ok(match t.free.pop() {
            Some(i) => {
                t.cbs[i] = Some(cb);
                i
            }
            None => {
                t.cbs.push(Some(cb));
                t.cbs.len() - 1
            }
        })
    }

    fn remove(&self, i: usize) -> Option<DataCb> {
        let mut t = self.table.lock();
        let cb = t.cbs.get_mut(i)?.take()?;
        t.live -= 1;
        t.free.push(i);
        Some(cb)
    }

    /// Reads `remote[offset..]` into `local`; `cb` runs when it completes. On an immediate
    /// failure the callback is handed back with the error.
    pub(crate) fn read(
        &self,
        local: Sge,
        remote: &RemoteKey,
        offset: u64,
        cb: DataCb,
    ) -> Result<(), (Error, DataCb)> {
        let i = self.insert(cb)?;
        self.ep
            .read(DATA | i as u64, &[local], remote, offset)
            .map_err(|e| {
                (
                    Error::from_post(e),
                    self.remove(i).unwrap_or_else(|| Box::new(|_| {})),
                )
            })
    }

    /// Writes `local` to `remote[offset..]`; as [`DataOps::read`].
    pub(crate) fn write(
        &self,
        local: Sge,
        remote: &RemoteKey,
        offset: u64,
        cb: DataCb,
    ) -> Result<(), (Error, DataCb)> {
        let i = self.insert(cb)?;
        self.ep
            .write(DATA | i as u64, &[local], remote, offset)
            .map_err(|e| {
                (
                    Error::from_post(e),
                    self.remove(i).unwrap_or_else(|| Box::new(|_| {})),
                )
            })
    }

    /// A data operation completed; true when the connection failed.
    pub(crate) fn on_completion(&self, wr_id: u64, status: Status) -> bool {
        let result = match status {
            Status::Success => Ok(()),
            Status::RemoteAccessError => Err(Error::Access),
            Status::TransportError | Status::Flushed => Err(Error::Lost(format!(
                "the data connection ended ({status:?})"
            ))),
            other => Err(Error::Protocol(format!("one-sided operation: {other:?}"))),
        };
        let failed = matches!(status, Status::TransportError | Status::Flushed);
        if let Some(cb) = self.remove((wr_id & !DATA) as usize) {
            cb(result);
        }
        failed
    }

    /// Operations in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.table.lock().live
    }
}
