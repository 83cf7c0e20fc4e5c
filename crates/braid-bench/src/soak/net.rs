//! Where the soak runs: a testbed made for the run or loopback, and connected endpoint pairs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use braid::{Context, Endpoint, EndpointOptions, Listener, RailAddr, SessionConfig};

use braid_testbed::parse::Rate;
use braid_testbed::testbed::{self, Testbed, TestbedSpec};

use super::{FailHow, SETUP_TIMEOUT};

// ------------------------------------------------------------------ the network

pub(super) type Job<T> = JoinHandle<Result<Result<T>>>;

pub(super) fn join<T>(h: Job<T>) -> Result<T> {
    h.join()
        .map_err(|p| {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            anyhow!("a soak thread panicked: {msg}")
        })?
        .and_then(|r| r)
}

/// Where the two hosts are: a testbed made for this run, or loopback.
pub struct Net {
    pub(super) tb: Option<Testbed>,
    rails: usize,
}

impl Net {
    /// Makes a testbed `soak-<pid>-<n>` of `rails` rails of `rate`, or falls back to loopback
    /// (saying so) where namespaces are unavailable.
    pub fn new(rails: usize, rate: Rate, loopback: bool) -> Result<Net> {
        if rails == 0 || rails > 16 {
            bail!("--rail-count must be 1..16");
        }
        if loopback {
            eprintln!(
                "braid soak: --loopback: rails 127.0.0.1..127.0.0.{rails}, unshaped; a link flap is a socket break (Endpoint::inject_rail_failure)"
            );
            return Ok(Net { tb: None, rails });
        }
        match testbed::probe() {
            Ok(()) => {
                static N: AtomicU32 = AtomicU32::new(0);
                let name = format!(
                    "soak-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                );
                let tb = Testbed::up(&TestbedSpec::new(name, rails, rate))?;
                eprintln!(
                    "braid soak: testbed {} up: 2 hosts, {rails} rails of {rate} (removed at exit)",
                    tb.spec().name
                );
                Ok(Net {
                    tb: Some(tb),
                    rails,
                })
            }
            Err(e) => {
                eprintln!(
                    "braid soak: network namespaces unavailable ({e:#}); running on loopback rails 127.0.0.1..127.0.0.{rails} instead: unshaped, and a link flap becomes a socket break (Endpoint::inject_rail_failure)"
                );
                Ok(Net { tb: None, rails })
            }
        }
    }

    /// "netns" or "loopback".
    pub fn kind(&self) -> &'static str {
        if self.tb.is_some() {
            "netns"
        } else {
            "loopback"
        }
    }

    fn lo(i: usize) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, (i + 1) as u8))
    }

    /// Host 1's rail addresses (port 0).
    pub(super) fn server_addrs(&self) -> Vec<SocketAddr> {
        match &self.tb {
            Some(tb) => tb
                .rail_addrs(1, 0)
                .iter()
                .map(|(a, _)| SocketAddr::new((*a).into(), 0))
                .collect(),
            None => (0..self.rails)
                .map(|i| SocketAddr::new(Self::lo(i), 0))
                .collect(),
        }
    }

    /// Host 0's rail addresses.
    pub(super) fn client_ips(&self) -> Vec<IpAddr> {
        match &self.tb {
            Some(tb) => tb
                .rail_addrs(0, 1)
                .iter()
                .map(|(a, _)| (*a).into())
                .collect(),
            None => (0..self.rails).map(Self::lo).collect(),
        }
    }

    /// Runs `f` on a new thread inside host `host`'s namespace.
    pub(super) fn spawn<T, F>(&self, host: usize, f: F) -> Result<Job<T>>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T> + Send + 'static,
    {
        match &self.tb {
            Some(tb) => tb.spawn_in(host, f),
            None => Ok(std::thread::spawn(move || Ok(f()))),
        }
    }

    /// Takes rail `rail` out (`broken`) or puts it back, the way `how` says.
    pub(super) fn set_fault(
        &self,
        rail: usize,
        how: FailHow,
        broken: bool,
        eps: &[Arc<Endpoint>],
    ) -> Result<()> {
        match (how, &self.tb) {
            (FailHow::LinkDown, _) => self.set_link(rail, !broken, eps),
            (FailHow::Drop, Some(tb)) => tb.set_rail_blackhole(1, rail, broken),
            (FailHow::Drop, None) => bail!("--fail-how drop needs the namespace testbed"),
        }
    }

    /// Takes rail `rail`'s link of host 0 down or up; on loopback, breaks the rail's sockets
    /// of `eps` instead (and does nothing on "up": the rail re-joins by itself).
    pub(super) fn set_link(&self, rail: usize, up: bool, eps: &[Arc<Endpoint>]) -> Result<()> {
        match &self.tb {
            Some(tb) => tb.set_rail_link(0, rail, up),
            None => {
                if !up {
                    for e in eps {
                        e.inject_rail_failure(rail)?;
                    }
                }
                Ok(())
            }
        }
    }

    pub(super) fn command(&self, host: usize, exe: &std::path::Path) -> Command {
        match &self.tb {
            Some(tb) => tb.command(host, exe),
            None => {
                let mut c = Command::new(exe);
                c.env("BRAID_SECRET", testbed::harness_secret())
                    .env_remove("BRAID_SECRET_FILE");
                c
            }
        }
    }
}

/// A context of the harness, with the secret its testbed children get
/// ([`braid_testbed::testbed::harness_secret`]): testbed addresses are not loopback ones.
pub(super) fn harness_context() -> Result<Context> {
    Ok(Context::with_config(braid::ContextConfig {
        secret: Some(braid_testbed::testbed::harness_secret().as_bytes().to_vec()),
        ..braid::ContextConfig::from_env()?
    })?)
}

/// Both ends of `n` endpoints: server (host 1) and client (host 0).
pub(super) struct Pair {
    pub(super) sctx: Context,
    pub(super) cctx: Context,
    pub(super) listener: Listener,
    pub(super) seps: Vec<Arc<Endpoint>>,
    pub(super) ceps: Vec<Arc<Endpoint>>,
}

pub(super) fn session_config(peer_timeout: Duration) -> SessionConfig {
    SessionConfig {
        peer_timeout,
        ..SessionConfig::default()
    }
}

/// The contexts of host 1 (server) and host 0 (client), each made in its host's namespace.
pub(super) fn contexts(net: &Net) -> Result<(Context, Context)> {
    let s = join(net.spawn(1, harness_context)?)?;
    let c = join(net.spawn(0, harness_context)?)?;
    Ok((s, c))
}

/// Connects `n` endpoints of the contexts `sctx` (host 1) and `cctx` (host 0);
/// `sopts`/`copts` name the queues of each side.
pub(super) fn connect_pair(
    net: &Net,
    n: usize,
    (sctx, cctx): (Context, Context),
    sopts: EndpointOptions,
    copts: EndpointOptions,
) -> Result<Pair> {
    let addrs = net.server_addrs();
    let (tx, rx) = mpsc::channel::<Vec<SocketAddr>>();
    let server = net.spawn(1, move || -> Result<(Context, Listener, Vec<Endpoint>)> {
        let ctx = sctx;
        let listener = ctx.listen(&addrs).context("listening in host 1")?;
        let _ = tx.send(listener.local_addrs());
        let mut eps = Vec::new();
        for _ in 0..n {
            eps.push(
                listener
                    .accept(&sopts, SETUP_TIMEOUT)
                    .context("accepting an endpoint")?,
            );
        }
        Ok((ctx, listener, eps))
    })?;
    let ips = net.client_ips();
    let client = net.spawn(0, move || -> Result<(Context, Vec<Endpoint>)> {
        let bound = rx
            .recv_timeout(SETUP_TIMEOUT)
            .map_err(|_| anyhow!("the server side did not start listening"))?;
        let rails: Vec<RailAddr> = bound
            .iter()
            .zip(&ips)
            .map(|(a, ip)| RailAddr::new(Some(*ip), *a))
            .collect();
        let ctx = cctx;
        let mut eps = Vec::new();
        for _ in 0..n {
            eps.push(
                ctx.connect(&rails, &copts)
                    .context("connecting an endpoint")?,
            );
        }
        Ok((ctx, eps))
    })?;
    let c = join(client);
    let s = join(server);
    let (cctx, ceps) = c?;
    let (sctx, listener, seps) = s?;
    // Pair the server's endpoints with the client's by their addresses.
    let mut seps: Vec<Option<Endpoint>> = seps.into_iter().map(Some).collect();
    let mut ordered = Vec::new();
    for ce in &ceps {
        let me = ce.rail_addrs()[0].0;
        let i = seps
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.rail_addrs()[0].1 == me))
            .ok_or_else(|| anyhow!("no server endpoint matches client rail {me}"))?;
        ordered.push(Arc::new(seps[i].take().expect("present")));
    }
    Ok(Pair {
        sctx,
        cctx,
        listener,
        seps: ordered,
        ceps: ceps.into_iter().map(Arc::new).collect(),
    })
}
