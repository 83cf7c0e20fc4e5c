//! The request handling of the file server without a network, for the `fs_handle` fuzz
//! target (feature `fuzzing`; not a stable interface).

use std::path::Path;
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::export::{ClientState, Export};
use crate::proto::{Errno, Reply, Request};

/// One export and one client of it, as a connection would hold them.
pub struct FuzzExport {
    export: Export,
    client: Mutex<ClientState>,
}

impl FuzzExport {
    /// Exports `root` with the default policy (read-write, `nodev,nosuid`).
    pub fn new(root: &Path) -> Result<FuzzExport, String> {
        static CTX: OnceLock<braid::Context> = OnceLock::new();
        let ctx = match CTX.get() {
            Some(c) => c.clone(),
            None => {
                let c = braid::Context::new().map_err(|e| e.to_string())?;
                CTX.get_or_init(|| c).clone()
            }
        };
        Ok(FuzzExport {
            export: Export::new(ctx, root, false)?,
            client: Mutex::new(ClientState::default()),
        })
    }

    /// The generation of this export's handles (what a real client learns from its hello).
    pub fn generation(&self) -> Result<u64, Errno> {
        Ok(self.export.root()?.node.generation)
    }

    /// Carries out one request of the client.
    pub fn handle(&self, req: Request) -> Result<Reply, Errno> {
        self.export.handle(&self.client, req)
    }
}

impl Drop for FuzzExport {
    fn drop(&mut self) {
        self.export.disconnect(&self.client);
    }
}
