//! Attaching a socket: the exchange over the bootstrap socket that makes (connecting side)
//! or accepts (accepting side) the endpoint, checks both ends agree on its rails, and posts
//! the control receives before either side may send.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid::{Access, Endpoint, EndpointOptions, Error as BraidError, RailAddr};
use parking_lot::Mutex;

use super::bootstrap::{Kind, Msg};
use super::ctrl::{CTRL_RECVS, CTRL_SENDS, SLOT};
use super::sock::BSock;
use super::spec::{ConnectEntry, parse_connect_spec, parse_listen_spec, spec_or_env};
use super::{BraidBackend, BraidRole, braid_errno};
use crate::op::Errno;
use crate::sys;

impl BraidBackend {
    /// Attach `fd` (a connected stream socket) to a new braid endpoint; blocks for the
    /// exchange with the peer, at most `timeout`.
    pub(crate) fn attach(
        &self,
        fd: RawFd,
        role: BraidRole,
        spec: Option<&str>,
        timeout: Duration,
    ) -> Result<(), Errno> {
        let deadline = Instant::now() + timeout;
        let ino = sys::file_id(fd).ok_or(libc::EBADF)?;
        let known = self.tables.lock().by_fd.contains_key(&fd);
        if known && self.is_attached(fd) {
            return Err(libc::EISCONN);
        }
        let mut opts = EndpointOptions::new(&self.cq);
        opts.session.max_outstanding = 8192;
        opts.session.max_recv = CTRL_RECVS + 16;
        opts.connect_timeout = timeout.min(Duration::from_secs(10));
        let ep = match role {
            BraidRole::Connect => self.attach_connect(fd, spec, &opts, deadline)?,
            BraidRole::Accept => self.attach_accept(fd, spec, &opts, deadline)?,
        };
        let ctrl = self
            .ctx
            .alloc_region((CTRL_RECVS + CTRL_SENDS) * SLOT, Access::LOCAL_WRITE)
            .map_err(|e| braid_errno(&e))?;
        let id = ep.id();
        let sock = Arc::new(Mutex::new(BSock::new(fd, ino, ep, ctrl)));
        {
            let mut t = self.tables.lock();
            t.by_ep.insert(id, sock.clone());
            t.by_fd.insert(fd, sock.clone());
        }
        let posted = sock.lock().post_ctrl_recvs();
        if let Err(e) = posted {
            let mut t = self.tables.lock();
            t.by_ep.remove(&id);
            t.by_fd.remove(&fd);
            return Err(braid_errno(&e));
        }
        if role == BraidRole::Accept {
            // Receives are posted: let the connecting side go.
            Msg::new(Kind::Done, 0).write(fd, deadline)?;
        } else {
            let m = Msg::read(fd, deadline)?;
            if !m.is_ok(Kind::Done) {
                let mut t = self.tables.lock();
                t.by_ep.remove(&id);
                t.by_fd.remove(&fd);
                return Err(libc::EPROTO);
            }
        }
        tracing::debug!(
            fd,
            rails = sock.lock().rail_count(),
            "exs socket in braid mode"
        );
        Ok(())
    }

    fn attach_connect(
        &self,
        fd: RawFd,
        spec: Option<&str>,
        opts: &EndpointOptions,
        deadline: Instant,
    ) -> Result<Endpoint, Errno> {
        let spec = spec_or_env(spec, "EXS_BRAID_RAILS");
        let entries = parse_connect_spec(spec.as_deref())?;
        Msg::new(Kind::HelloConnect, 0).write(fd, deadline)?;
        let hello = Msg::read(fd, deadline)?;
        if hello.kind != Some(Kind::HelloAccept) {
            return Err(libc::EPROTO);
        }
        if hello.status != 0 || hello.addrs.is_empty() {
            return Err(libc::ECONNREFUSED);
        }
        let listen = hello.addrs;
        let rails: Vec<RailAddr> = if entries.is_empty() {
            listen.iter().map(|&a| RailAddr::new(None, a)).collect()
        } else {
            entries
                .iter()
                .enumerate()
                .map(|(i, e)| match e {
                    ConnectEntry::Full(r) => *r,
                    ConnectEntry::Local(ip) => RailAddr::new(Some(*ip), listen[i % listen.len()]),
                })
                .collect()
        };
        let mut o = opts.clone();
        o.connect_timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
            .min(opts.connect_timeout);
        match self.ctx.connect(&rails, &o) {
            Ok(ep) => {
                let pairs: Vec<SocketAddr> =
                    ep.rail_addrs().iter().flat_map(|&(l, r)| [l, r]).collect();
                Msg::with_addrs(Kind::Rails, 0, pairs).write(fd, deadline)?;
                Ok(ep)
            }
            Err(e) => {
                tracing::warn!("exs braid attach: cannot open the rails: {e}");
                let errno = braid_errno(&e);
                let _ = Msg::new(Kind::Rails, 1).write(fd, deadline);
                Err(errno)
            }
        }
    }

    fn attach_accept(
        &self,
        fd: RawFd,
        spec: Option<&str>,
        opts: &EndpointOptions,
        deadline: Instant,
    ) -> Result<Endpoint, Errno> {
        let spec = spec_or_env(spec, "EXS_BRAID_LISTEN");
        let mut addrs = parse_listen_spec(spec.as_deref())?;
        if addrs.is_empty() {
            addrs.push(SocketAddr::new(sys::local_ip(fd)?, 0));
        }
        let listener = match self.ctx.listen(&addrs) {
            Ok(l) => l,
            Err(e) => {
                let _ = Msg::new(Kind::HelloAccept, 1).write(fd, deadline);
                return Err(braid_errno(&e));
            }
        };
        let bound = listener.local_addrs();
        Msg::with_addrs(Kind::HelloAccept, 0, bound).write(fd, deadline)?;
        let hello = Msg::read(fd, deadline)?;
        if hello.kind != Some(Kind::HelloConnect) {
            return Err(libc::EPROTO);
        }
        // Accept in short slices so that a connecting side that failed (and said so on the
        // bootstrap socket) ends the wait early.
        let mut rails_msg: Option<Msg> = None;
        let ep = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(libc::ETIMEDOUT);
            }
            match listener.accept(opts, left.min(Duration::from_millis(100))) {
                Ok(ep) => break ep,
                Err(BraidError::Timeout(_)) => {}
                Err(e) => return Err(braid_errno(&e)),
            }
            if rails_msg.is_none() && sys::readable(fd) {
                let m = Msg::read(fd, deadline)?;
                if !m.is_ok(Kind::Rails) {
                    return Err(libc::ECONNREFUSED);
                }
                rails_msg = Some(m);
            }
        };
        listener.close();
        let m = match rails_msg {
            Some(m) => m,
            None => Msg::read(fd, deadline)?,
        };
        if !m.is_ok(Kind::Rails) {
            return Err(libc::ECONNREFUSED);
        }
        // The endpoint we accepted must be the one the peer made over this bootstrap socket.
        let ours: Vec<SocketAddr> = ep.rail_addrs().iter().flat_map(|&(l, r)| [r, l]).collect();
        if ours.len() != m.addrs.len() || ours.iter().zip(&m.addrs).any(|(a, b)| !same_addr(a, b)) {
            tracing::warn!(
                "exs braid attach: accepted rails {ours:?} are not the peer's {:?}",
                m.addrs
            );
            let _ = Msg::new(Kind::Done, 1).write(fd, deadline);
            return Err(libc::EPROTO);
        }
        Ok(ep)
    }
}

/// Checks done before any exchange: a connected stream socket over IPv4 or IPv6.
pub(crate) fn check_bootstrap(fd: RawFd) -> Result<(), Errno> {
    sys::probe_stream_socket(fd)?;
    match sys::peer_addr(fd)? {
        Some(_) => Ok(()),
        None => Err(libc::EOPNOTSUPP),
    }
}

fn same_addr(a: &SocketAddr, b: &SocketAddr) -> bool {
    a.port() == b.port() && sys::canonical_ip(a.ip()) == sys::canonical_ip(b.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn addresses_compare_across_families() {
        let a: SocketAddr = "127.0.0.1:5".parse().unwrap();
        let b: SocketAddr = "[::ffff:127.0.0.1]:5".parse().unwrap();
        assert!(same_addr(&a, &b));
        assert!(!same_addr(&a, &"127.0.0.1:6".parse().unwrap()));
        assert!(!same_addr(&a, &"127.0.0.2:5".parse().unwrap()));
    }

    #[test]
    fn bootstrap_must_be_a_connected_inet_stream() {
        assert_eq!(check_bootstrap(-1), Err(libc::EBADF));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(check_bootstrap(l.as_raw_fd()), Err(libc::ENOTCONN));
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(check_bootstrap(c.as_raw_fd()), Ok(()));
        let (u, _v) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(check_bootstrap(u.as_raw_fd()), Err(libc::EOPNOTSUPP));
        let d = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(check_bootstrap(d.as_raw_fd()), Err(libc::EOPNOTSUPP));
    }
}
