//! Re-dialling the failed rails of an endpoint this side connected, from the network
//! namespace `connect` ran in, until each rejoins its session.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use super::handshake::connect_rail;
use crate::endpoint::{EndpointOptions, RailAddr};
use crate::engine::{Command, EndpointShared};
use crate::netns::NetNs;

/// Re-dials failed rails of an endpoint this side connected, so they rejoin its session.
pub(super) struct Redial {
    pub(super) rails: Vec<RailAddr>,
    pub(super) session_id: u64,
    pub(super) opts: EndpointOptions,
    pub(super) secret: Option<Arc<[u8]>>,
    /// The session's join token (given by the first handshake when there is no secret):
    /// the key a re-join proves without a secret.
    pub(super) join_token: [u8; braid_proto::wire::handshake::MAC_LEN],
    pub(super) engine: Arc<crate::engine::EngineShared>,
    /// Rails being re-dialled (a bit per rail).
    pub(super) busy: Mutex<u64>,
    /// Where `connect` dialled the rails; re-dials are made from there too, whichever
    /// thread noticed the failure (`None`: procfs could not tell; the thread's own is used).
    pub(super) netns: Option<NetNs>,
}

impl Redial {
    pub(super) fn start(self: &Arc<Self>, ep: Weak<EndpointShared>, rail: usize) {
        {
            let mut busy = self.busy.lock();
            if *busy & (1 << rail) != 0 {
                return;
            }
            *busy |= 1 << rail;
        }
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("braid-redial-{rail}"))
            .spawn(move || me.run(ep, rail));
        if spawned.is_err() {
            *self.busy.lock() &= !(1 << rail);
        }
    }

    /// Tries once per interval until the rail is back or the endpoint is gone.
    fn run(&self, ep: Weak<EndpointShared>, rail: usize) {
        if let Some(Err(e)) = self.netns.as_ref().map(NetNs::enter) {
            // Dialling from another namespace could reach another host: the rail stays down.
            tracing::warn!(
                rail,
                "cannot re-dial: entering the endpoint's network namespace failed: {e}"
            );
            *self.busy.lock() &= !(1 << rail);
            return;
        }
        let interval = self
            .opts
            .session
            .keepalive_interval
            .max(Duration::from_millis(200));
        loop {
            // A pause between attempts, not synchronisation: the peer's link may take any time.
            std::thread::sleep(interval);
            let Some(shared) = ep.upgrade() else { break };
            if shared.closed.load(Ordering::Acquire) || shared.session.lock().is_failed() {
                break;
            }
            let attempt = connect_rail(
                &self.rails[rail],
                rail as u16,
                self.rails.len() as u16,
                self.session_id,
                &self.opts,
                self.secret.as_deref(),
                true,
                Some(&self.join_token),
            );
            match attempt {
                Ok((r, _, _)) => {
                    self.engine.send(Command::Restore {
                        id: shared.id,
                        rail,
                        link: r.link,
                    });
                    break;
                }
                Err(e) => tracing::debug!(endpoint = shared.id, rail, "re-dial failed: {e}"),
            }
        }
        *self.busy.lock() &= !(1 << rail);
    }
}
