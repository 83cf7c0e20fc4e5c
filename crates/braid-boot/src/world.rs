//! [`World`]: the group of processes with a braid endpoint between every pair.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use braid::{CompletionQueue, Context, Endpoint, EndpointOptions, Listener, RailAddr};

use crate::addrs::{self, HostAddr};
use crate::client::{ALLGATHER, BARRIER, JoinRequest, RootLink};
use crate::env::{LaunchEnv, root_candidates};
use crate::error::BootError;
use crate::root::server::RootServer;
use crate::wire::{Published, RankInfo, TableEntry};

/// How a [`World`] is formed: the template of every endpoint, and the time bounds.
#[derive(Debug, Clone)]
pub struct WorldOptions {
    /// Options of every endpoint to a peer (completion queues, `SessionConfig`, connect
    /// timeout). Completions carry the endpoint id; [`World::peer_of`] maps it to a rank.
    pub endpoint: EndpointOptions,
    /// Bound on forming the group, from the call to every endpoint being up (default 60 s;
    /// `BRAID_JOIN_TIMEOUT` overrides it).
    pub join_timeout: Duration,
    /// Bound on one [`World::barrier`] or [`World::allgather`] (default 300 s).
    pub collective_timeout: Duration,
    /// How long rank 0 keeps serving the rendezvous after its own [`World`] is dropped, for
    /// ranks still finishing (default 10 s).
    pub linger: Duration,
    /// Most rails per pair of ranks (default 64, braid's limit).
    pub max_rails: usize,
}

impl WorldOptions {
    /// Every completion of every endpoint goes to `cq`; default bounds.
    pub fn new(cq: &CompletionQueue) -> WorldOptions {
        WorldOptions::with_endpoint(EndpointOptions::new(cq))
    }

    /// Endpoints made from `endpoint`; default bounds.
    pub fn with_endpoint(endpoint: EndpointOptions) -> WorldOptions {
        WorldOptions {
            endpoint,
            join_timeout: Duration::from_secs(60),
            collective_timeout: Duration::from_secs(300),
            linger: Duration::from_secs(10),
            max_rails: braid::MAX_RAILS as usize,
        }
    }
}

/// A group of `size` processes, each with a braid endpoint to every other, and an
/// out-of-band channel to the rendezvous (hosted by rank 0) for [`World::barrier`],
/// [`World::allgather`] and noticing ranks that die.
///
/// Dropping it closes the endpoints and leaves the job; call [`World::finalize`] to wait for
/// the others first.
pub struct World {
    rank: usize,
    size: usize,
    job: String,
    endpoints: Vec<Option<Endpoint>>,
    rails: Vec<Vec<RailAddr>>,
    by_endpoint: HashMap<u64, usize>,
    hosts: Vec<String>,
    collective_timeout: Duration,
    linger: Duration,
    /// Accepts re-joining rails of the endpoints accepted here (failover).
    listener: Option<Listener>,
    link: Option<RootLink>,
    server: Option<RootServer>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("job", &self.job)
            .field(
                "rails",
                &self.rails.iter().map(Vec::len).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Bound on waiting for the rendezvous to pass an abort on.
const ABORT_WAIT: Duration = Duration::from_secs(1);

/// How long a rank 0 whose join failed keeps telling late ranks why.
const FAILED_LINGER: Duration = Duration::from_secs(3);

/// How long a rank whose mesh connection failed waits for the rendezvous's verdict.
const VERDICT_WAIT: Duration = Duration::from_secs(2);

/// Where rank 0 listens: the first candidate's port, on that loopback address if every
/// candidate is a loopback address, else on every address of its host (the wildcard).
fn root_bind(candidates: &[(String, u16)]) -> SocketAddr {
    let port = candidates[0].1;
    let ips: Vec<Option<IpAddr>> = candidates.iter().map(|(h, _)| h.parse().ok()).collect();
    let all_loopback = ips.iter().all(|ip| ip.is_some_and(|ip| ip.is_loopback()));
    if all_loopback {
        return SocketAddr::new(ips[0].expect("checked"), port);
    }
    if ips.iter().any(|ip| ip.is_some_and(|ip| ip.is_ipv6())) {
        SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), port)
    } else {
        SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)
    }
}

/// The rails from `me` to `peer` under the rule of [`crate::addrs`], as `me` dials them:
/// local address (port 0) and the peer's listening address.
pub(crate) fn plan_rails(
    me: usize,
    peer: usize,
    table: &[TableEntry],
    max: usize,
) -> Vec<RailAddr> {
    let (a, b) = (&table[me].info, &table[peer].info);
    let loopback = Ipv4Addr::LOCALHOST;
    if !a.rails_override
        && !b.rails_override
        && a.host_key == b.host_key
        && a.loopback_port != 0
        && b.loopback_port != 0
    {
        return vec![RailAddr {
            local: Some(SocketAddr::new(loopback.into(), 0)),
            remote: SocketAddr::new(loopback.into(), b.loopback_port),
        }];
    }
    let hosts = |i: &RankInfo| i.addrs.iter().map(|p| p.addr).collect::<Vec<HostAddr>>();
    // Matched in rank order, so both sides of a pair compute the same rails.
    let pairs: Vec<(usize, usize)> = if me < peer {
        addrs::match_subnets(&hosts(a), &hosts(b))
    } else {
        addrs::match_subnets(&hosts(b), &hosts(a))
            .into_iter()
            .map(|(i, j)| (j, i))
            .collect()
    };
    let mut rails: Vec<RailAddr> = pairs
        .into_iter()
        .map(|(x, y)| RailAddr {
            local: Some(SocketAddr::new(a.addrs[x].addr.ip.into(), 0)),
            remote: SocketAddr::new(b.addrs[y].addr.ip.into(), b.addrs[y].port),
        })
        .collect();
    rails.truncate(max.max(1));
    if rails.is_empty() {
        // No common subnet: the address the rendezvous saw the peer come from, if it listens
        // there, else its first; the kernel picks the route and local address.
        let seen = table[peer].seen;
        let target = b
            .addrs
            .iter()
            .find(|p| IpAddr::V4(p.addr.ip) == seen)
            .or(b.addrs.first());
        if let Some(p) = target {
            rails.push(RailAddr {
                local: None,
                remote: SocketAddr::new(p.addr.ip.into(), p.port),
            });
        } else if b.loopback_port != 0 && a.host_key == b.host_key {
            rails.push(RailAddr {
                local: None,
                remote: SocketAddr::new(loopback.into(), b.loopback_port),
            });
        }
    }
    rails
}

fn rails_text(rails: &[RailAddr]) -> String {
    if rails.is_empty() {
        return "(none: no address in common)".into();
    }
    rails
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Encodes which endpoints this rank dialled: (peer, local address of rail 0) per peer.
fn encode_dialled(list: &[(usize, SocketAddr)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(list.len() * 22);
    for (peer, a) in list {
        v.extend_from_slice(&(*peer as u32).to_be_bytes());
        let ip = match a.ip() {
            IpAddr::V4(x) => x.to_ipv6_mapped(),
            IpAddr::V6(x) => x,
        };
        v.extend_from_slice(&ip.octets());
        v.extend_from_slice(&a.port().to_be_bytes());
    }
    v
}

fn decode_dialled(b: &[u8]) -> Result<Vec<(usize, SocketAddr)>, BootError> {
    if !b.len().is_multiple_of(22) {
        return Err(BootError::Protocol(format!(
            "mesh report of {} bytes is not whole entries",
            b.len()
        )));
    }
    Ok(b.chunks_exact(22)
        .map(|c| {
            let peer = u32::from_be_bytes(c[..4].try_into().expect("4 bytes")) as usize;
            let ip6 = Ipv6Addr::from(<[u8; 16]>::try_from(&c[4..20]).expect("16 bytes"));
            let ip = ip6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(ip6));
            let port = u16::from_be_bytes([c[20], c[21]]);
            (peer, SocketAddr::new(ip, port))
        })
        .collect())
}

fn canonical(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        IpAddr::V6(x) => match x.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    }
}

impl World {
    /// Joins the job described by `env`: publishes this process's addresses to the
    /// rendezvous (rank 0 hosts it), receives the address table, and forms a braid endpoint
    /// to every other rank over the rails the addressing rule gives (see `docs/LAUNCH.md`).
    /// Returns when every rank has every endpoint, or fails on every rank with the reason.
    pub fn join(ctx: &Context, env: &LaunchEnv, opts: &WorldOptions) -> Result<World, BootError> {
        if env.rank >= env.size {
            return Err(BootError::BadEnv(format!(
                "rank {} is not below size {}",
                env.rank, env.size
            )));
        }
        let timeout = env.join_timeout.unwrap_or(opts.join_timeout);
        let deadline = Instant::now() + timeout;
        if env.size == 1 {
            return Ok(World {
                rank: 0,
                size: 1,
                job: env.job.clone(),
                endpoints: vec![None],
                rails: vec![vec![]],
                by_endpoint: HashMap::new(),
                hosts: vec![addrs::hostname()],
                collective_timeout: opts.collective_timeout,
                linger: opts.linger,
                listener: None,
                link: None,
                server: None,
            });
        }
        let candidates = root_candidates(&env.root)?;
        let (local, overridden) = match &env.rails {
            Some(specs) => (addrs::resolve_rail_specs(specs)?, true),
            // Without a secret (or consent to go without) the listener stays on loopback:
            // ranks of one host still meet there, ranks of other hosts are told why not.
            None if !ctx.may_listen_beyond_loopback() => (vec![], false),
            None => (addrs::interface_addrs(false)?, false),
        };
        let mut bind: Vec<SocketAddr> = local
            .iter()
            .map(|a| SocketAddr::new(a.ip.into(), 0))
            .collect();
        if !overridden {
            bind.push(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0));
        }
        let listener = ctx.listen(&bind)?;
        let bound = listener.local_addrs();
        if bound.len() != bind.len() {
            return Err(BootError::Mesh(format!(
                "the braid listener bound {} of {} addresses",
                bound.len(),
                bind.len()
            )));
        }
        let info = RankInfo {
            hostname: addrs::hostname(),
            pid: std::process::id(),
            host_key: addrs::host_key(),
            addrs: local
                .iter()
                .zip(&bound)
                .map(|(a, b)| Published {
                    addr: *a,
                    port: b.port(),
                })
                .collect(),
            loopback_port: if overridden {
                0
            } else {
                bound[bind.len() - 1].port()
            },
            rails_override: overridden,
        };
        let server = if env.rank == 0 {
            let bind = root_bind(&candidates);
            braid::policy::check_listen(
                "the rendezvous (rank 0)",
                &[bind],
                env.secret.is_some(),
                env.insecure,
            )
            .map_err(|e| BootError::BadEnv(e.to_string()))?;
            Some(RootServer::start(
                bind,
                &env.job,
                env.size,
                env.secret.clone(),
                timeout,
            )?)
        } else {
            None
        };
        if let Some(s) = &server {
            tracing::debug!(addr = %s.local_addr(), "rank 0 hosts the rendezvous");
        }
        let link = match RootLink::join(
            JoinRequest {
                root: &env.root,
                candidates,
                job: &env.job,
                rank: env.rank,
                size: env.size,
                secret: env.secret.as_deref(),
                info,
            },
            deadline,
        ) {
            Ok(l) => l,
            Err(e) => {
                if let Some(s) = server {
                    s.finish_detached(FAILED_LINGER);
                }
                return Err(e);
            }
        };
        let mut world = World {
            rank: env.rank,
            size: env.size,
            job: env.job.clone(),
            endpoints: (0..env.size).map(|_| None).collect(),
            rails: vec![],
            by_endpoint: HashMap::new(),
            hosts: vec![],
            collective_timeout: opts.collective_timeout,
            linger: opts.linger,
            listener: Some(listener),
            link: Some(link),
            server,
        };
        // The rendezvous reports a join timeout itself, with the missing ranks; wait a
        // little longer than it so that its reason arrives first.
        let link_table = world
            .link()
            .wait_table(deadline + Duration::from_secs(2))
            .and_then(|t| {
                if t.len() == env.size {
                    Ok(t)
                } else {
                    Err(BootError::Protocol(format!(
                        "the table has {} entries for {} ranks",
                        t.len(),
                        env.size
                    )))
                }
            });
        let formed = match link_table {
            Ok(table) => world.form_mesh(ctx, opts, deadline, timeout, &table),
            Err(e) => Err(e),
        };
        match formed {
            Ok(()) => Ok(world),
            Err(e) => {
                world.abort(&e);
                if let Some(s) = world.server.take() {
                    // Others may still be joining: they learn the failure from it.
                    s.finish_detached(FAILED_LINGER);
                }
                Err(e)
            }
        }
    }

    /// One endpoint from the listener, waiting at most 200 ms (so that a failure elsewhere
    /// ends the wait promptly); `None` if none came in that time.
    fn accept_one(
        &self,
        opts: &WorldOptions,
        deadline: Instant,
        timeout: Duration,
        have: usize,
        expected: usize,
    ) -> Result<Option<Endpoint>, BootError> {
        if let Some(e) = self.link().failure() {
            return Err(e);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(BootError::Timeout {
                what: format!(
                    "accepting endpoints: {have} of the {expected} higher ranks connected"
                ),
                waited: timeout,
            });
        }
        let listener = self.listener.as_ref().expect("listener");
        match listener.accept(&opts.endpoint, left.min(Duration::from_millis(200))) {
            Ok(ep) => Ok(Some(ep)),
            Err(braid::Error::Timeout(_)) => Ok(None),
            Err(e) => Err(self.cause_of(e.into())),
        }
    }

    /// Tells every rank that this one failed with `e` (unless the failure came from them).
    fn abort(&self, e: &BootError) {
        if let Some(l) = &self.link
            && l.failure().is_none()
        {
            l.abort(&e.to_string(), ABORT_WAIT);
        }
    }

    /// The job's failure if the rendezvous reports one soon after `e`, else `e`: a peer that
    /// gave up because the job failed breaks our connection before the verdict reaches us.
    fn cause_of(&self, e: BootError) -> BootError {
        self.link().wait_failure(VERDICT_WAIT).unwrap_or(e)
    }

    fn link(&self) -> &RootLink {
        self.link
            .as_ref()
            .expect("a world of several ranks has a link")
    }

    /// Dials every lower rank, accepts every higher one, then learns from an allgather which
    /// accepted endpoint is which rank, and ends with a barrier.
    fn form_mesh(
        &mut self,
        ctx: &Context,
        opts: &WorldOptions,
        deadline: Instant,
        timeout: Duration,
        table: &[TableEntry],
    ) -> Result<(), BootError> {
        self.hosts = table.iter().map(|t| t.info.hostname.clone()).collect();
        self.rails = (0..self.size)
            .map(|p| {
                if p == self.rank {
                    vec![]
                } else {
                    plan_rails(self.rank, p, table, opts.max_rails)
                }
            })
            .collect();
        let mut dialled = Vec::new();
        for peer in 0..self.rank {
            if let Some(e) = self.link().failure() {
                return Err(e);
            }
            let rails = &self.rails[peer];
            let err = |error| BootError::Connect {
                peer,
                rails: rails_text(rails),
                error,
            };
            if rails.is_empty() {
                let why = if ctx.may_listen_beyond_loopback() {
                    "no rail between the two ranks".to_string()
                } else {
                    format!(
                        "no rail between the two ranks: they run on different hosts, and \
                         without a cluster secret braid listens on loopback only; to \
                         authenticate, {}",
                        braid::policy::MAKE_SECRET_HINT
                    )
                };
                return Err(self.cause_of(err(braid::Error::InvalidArgument(why))));
            }
            let mut o = opts.endpoint.clone();
            o.connect_timeout = o
                .connect_timeout
                .min(deadline.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(100));
            let ep = match ctx.connect(rails, &o) {
                Ok(ep) => ep,
                Err(e) => return Err(self.cause_of(err(e))),
            };
            dialled.push((peer, canonical(ep.rail_addrs()[0].0)));
            self.by_endpoint.insert(ep.id(), peer);
            self.endpoints[peer] = Some(ep);
        }
        // Every higher rank dials us. Endpoints are accepted before the allgather that says
        // which is which: a stranger's endpoint may take a place then; it is found out and
        // dropped below, and accepting goes on until every higher rank is there.
        let expected = self.size - 1 - self.rank;
        let mut accepted = Vec::with_capacity(expected);
        while accepted.len() < expected {
            match self.accept_one(opts, deadline, timeout, accepted.len(), expected)? {
                Some(ep) => accepted.push(ep),
                None => continue,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let parts = self
            .link()
            .collective(ALLGATHER, &encode_dialled(&dialled), left)?;
        let mut by_addr: HashMap<SocketAddr, usize> = HashMap::new();
        for (q, part) in parts.iter().enumerate().skip(self.rank + 1) {
            for (peer, addr) in decode_dialled(part)? {
                if peer == self.rank {
                    by_addr.insert(addr, q);
                }
            }
        }
        let mut placed = 0;
        let mut pending = accepted.into_iter();
        while placed < expected {
            let ep = match pending.next() {
                Some(ep) => ep,
                None => match self.accept_one(opts, deadline, timeout, placed, expected)? {
                    Some(ep) => ep,
                    None => continue,
                },
            };
            let from = canonical(ep.rail_addrs()[0].1);
            let Some(&q) = by_addr.get(&from) else {
                // No rank dialled from there: a stranger (or a leftover of another job).
                tracing::warn!(
                    rank = self.rank,
                    "dropped an endpoint from {from}: it is no rank's (a stray connection to the braid listener)"
                );
                continue;
            };
            if self.endpoints[q].is_some() {
                return Err(BootError::Mesh(format!("rank {q} connected twice")));
            }
            if ep.rail_count() != self.rails[q].len() {
                return Err(BootError::Mesh(format!(
                    "rank {q} connected with {} rails, the table gives {}",
                    ep.rail_count(),
                    self.rails[q].len()
                )));
            }
            self.by_endpoint.insert(ep.id(), q);
            self.endpoints[q] = Some(ep);
            placed += 1;
        }
        // From now on the listener only takes back failed rails of these endpoints.
        if let Some(l) = &self.listener {
            l.refuse_new_endpoints();
        }
        let left = deadline.saturating_duration_since(Instant::now());
        self.link()
            .collective(BARRIER, &[], left.max(Duration::from_millis(100)))?;
        tracing::debug!(rank = self.rank, size = self.size, job = %self.job, "world formed");
        Ok(())
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The job id.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The endpoint to `peer`; `None` for this rank itself or a rank out of range.
    pub fn endpoint(&self, peer: usize) -> Option<&Endpoint> {
        self.endpoints.get(peer).and_then(Option::as_ref)
    }

    /// The rank at the other end of the endpoint with this id (see
    /// [`braid::Completion::endpoint`]).
    pub fn peer_of(&self, endpoint_id: u64) -> Option<usize> {
        self.by_endpoint.get(&endpoint_id).copied()
    }

    /// The rails between this rank and `peer`, as this rank sees them: local address (port
    /// 0) and the peer's listening address. Empty for this rank itself.
    pub fn rails_to(&self, peer: usize) -> &[RailAddr] {
        self.rails.get(peer).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The host name of `rank`'s machine.
    pub fn host_of(&self, rank: usize) -> Option<&str> {
        self.hosts.get(rank).map(String::as_str)
    }

    /// Every rank's `mine`, by rank (at most 1 MiB each), through the rendezvous; bounded by
    /// [`WorldOptions::collective_timeout`]. Every rank must call the same collectives in the
    /// same order.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootError> {
        match &self.link {
            None => Ok(vec![mine.to_vec()]),
            Some(l) => l.collective(ALLGATHER, mine, self.collective_timeout),
        }
    }

    /// Returns when every rank has called it; bounded by
    /// [`WorldOptions::collective_timeout`].
    pub fn barrier(&self) -> Result<(), BootError> {
        match &self.link {
            None => Ok(()),
            Some(l) => l
                .collective(BARRIER, &[], self.collective_timeout)
                .map(|_| ()),
        }
    }

    /// The job's failure, if the rendezvous reported one (a rank died or gave up) or the
    /// link to it was lost. Cheap; no communication.
    pub fn check(&self) -> Result<(), BootError> {
        match self.link.as_ref().and_then(RootLink::failure) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reports this rank's failure to every other rank: their next collective, and
    /// [`World::check`], fail with [`BootError::RankFailed`] and `reason`. Returns once the
    /// rendezvous has passed it on (at most about a second), so the process may exit next.
    pub fn abort_job(&self, reason: &str) {
        if let Some(l) = &self.link {
            l.abort(reason, ABORT_WAIT);
        }
    }

    /// A final barrier, then leaves the job.
    pub fn finalize(self) -> Result<(), BootError> {
        self.barrier()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        for ep in self.endpoints.iter_mut() {
            *ep = None;
        }
        self.listener = None;
        if let Some(l) = self.link.take() {
            l.bye();
        }
        if let Some(s) = self.server.take() {
            s.finish(self.linger);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(host: &str, addrs: &[(&str, u16)], lo: u16, seen: &str) -> TableEntry {
        TableEntry {
            info: RankInfo {
                hostname: host.into(),
                pid: 1,
                host_key: host.into(),
                addrs: addrs
                    .iter()
                    .map(|(a, port)| {
                        let (ip, p) = a.split_once('/').unwrap();
                        Published {
                            addr: HostAddr {
                                ip: ip.parse().unwrap(),
                                prefix: p.parse().unwrap(),
                            },
                            port: *port,
                        }
                    })
                    .collect(),
                loopback_port: lo,
                rails_override: false,
            },
            seen: seen.parse().unwrap(),
        }
    }

    #[test]
    fn rails_follow_the_rule() {
        let t = vec![
            entry(
                "h0",
                &[("198.18.0.1/24", 10), ("198.18.1.1/24", 11)],
                19,
                "198.18.0.1",
            ),
            entry(
                "h1",
                &[("198.18.0.2/24", 20), ("198.18.1.2/24", 21)],
                29,
                "198.18.0.2",
            ),
            entry(
                "h0",
                &[("198.18.0.1/24", 30), ("198.18.1.1/24", 31)],
                39,
                "127.0.0.1",
            ),
            entry("h9", &[("10.9.0.9/24", 90)], 99, "10.9.0.9"),
        ];
        let r = plan_rails(1, 0, &t, 64);
        assert_eq!(
            r,
            vec![
                "198.18.0.2=198.18.0.1:10".parse().unwrap(),
                "198.18.1.2=198.18.1.1:11".parse().unwrap()
            ]
        );
        // The acceptor sees the same pairs mirrored.
        assert_eq!(
            plan_rails(0, 1, &t, 64),
            vec![
                "198.18.0.1=198.18.0.2:20".parse().unwrap(),
                "198.18.1.1=198.18.1.2:21".parse().unwrap()
            ]
        );
        assert_eq!(plan_rails(1, 0, &t, 1).len(), 1);
        // Same host and namespace: loopback.
        assert_eq!(
            plan_rails(2, 0, &t, 64),
            vec!["127.0.0.1=127.0.0.1:19".parse().unwrap()]
        );
        // No common subnet: the address the rendezvous saw.
        assert_eq!(
            plan_rails(0, 3, &t, 64),
            vec!["10.9.0.9:90".parse().unwrap()]
        );
    }

    #[test]
    fn dialled_reports_round_trip() {
        let l = vec![
            (0usize, "127.0.0.1:5".parse().unwrap()),
            (7, "[fe80::1]:9".parse().unwrap()),
        ];
        assert_eq!(decode_dialled(&encode_dialled(&l)).unwrap(), l);
        assert!(decode_dialled(&[0; 21]).is_err());
    }

    #[test]
    fn root_binding() {
        let c = |s: &str| root_candidates(s).unwrap();
        assert_eq!(root_bind(&c("127.0.0.1:5")), "127.0.0.1:5".parse().unwrap());
        assert_eq!(root_bind(&c("198.18.0.1:5")), "0.0.0.0:5".parse().unwrap());
        assert_eq!(root_bind(&c("localhost:5")), "0.0.0.0:5".parse().unwrap());
        assert_eq!(
            root_bind(&c("[::1]:5,10.0.0.1:5")),
            "[::]:5".parse().unwrap()
        );
    }
}
