//! The rail lists of `exs_braid_attach` (or `EXS_BRAID_RAILS` / `EXS_BRAID_LISTEN`).

use std::net::{IpAddr, SocketAddr};

use braid::RailAddr;

use crate::op::Errno;

/// The list given, or else the environment variable `var`.
pub(crate) fn spec_or_env(spec: Option<&str>, var: &str) -> Option<String> {
    match spec {
        Some(s) => Some(s.to_string()),
        None => std::env::var(var).ok(),
    }
}

/// One entry of the connecting side's list.
pub(crate) enum ConnectEntry {
    /// `LOCAL=REMOTE:PORT`: a rail to an explicit address.
    Full(RailAddr),
    /// `LOCAL`: a rail from this IP to the accepting side's next advertised address.
    Local(IpAddr),
}

fn entries(spec: Option<&str>) -> Result<Vec<&str>, Errno> {
    let Some(s) = spec else {
        return Ok(Vec::new());
    };
    let v: Vec<&str> = s.split(',').map(str::trim).collect();
    if v.len() == 1 && v[0].is_empty() {
        return Ok(Vec::new());
    }
    if v.iter().any(|e| e.is_empty()) || v.len() > 64 {
        return Err(libc::EINVAL);
    }
    Ok(v)
}

/// `LOCAL=REMOTE:PORT` (a rail to an explicit address) or `LOCAL` (a rail from this IP to the
/// accepting side's next advertised address), comma-separated; empty: one rail per
/// advertised address, source chosen by the kernel.
pub(crate) fn parse_connect_spec(spec: Option<&str>) -> Result<Vec<ConnectEntry>, Errno> {
    entries(spec)?
        .into_iter()
        .map(|e| {
            if let Ok(ip) = e.parse::<IpAddr>() {
                return Ok(ConnectEntry::Local(ip));
            }
            e.parse::<RailAddr>()
                .map(ConnectEntry::Full)
                .map_err(|_| libc::EINVAL)
        })
        .collect()
}

/// `ADDR` or `ADDR:PORT` (IPv6 as `[ADDR]:PORT`), comma-separated; empty: the bootstrap
/// socket's local address.
pub(crate) fn parse_listen_spec(spec: Option<&str>) -> Result<Vec<SocketAddr>, Errno> {
    entries(spec)?
        .into_iter()
        .map(|e| {
            if let Ok(ip) = e.parse::<IpAddr>() {
                return Ok(SocketAddr::new(ip, 0));
            }
            e.parse::<SocketAddr>().map_err(|_| libc::EINVAL)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert!(parse_connect_spec(None).unwrap().is_empty());
        assert!(parse_connect_spec(Some("")).unwrap().is_empty());
        let v = parse_connect_spec(Some("127.0.0.1, 127.0.0.2=127.0.0.2:99")).unwrap();
        assert!(matches!(v[0], ConnectEntry::Local(_)));
        assert!(matches!(v[1], ConnectEntry::Full(_)));
        assert_eq!(
            parse_connect_spec(Some("nonsense")).err(),
            Some(libc::EINVAL)
        );
        assert_eq!(
            parse_connect_spec(Some("127.0.0.1,,")).err(),
            Some(libc::EINVAL)
        );
        let l = parse_listen_spec(Some("127.0.0.1,127.0.0.2:5000,[::1]:7")).unwrap();
        assert_eq!(l[1].port(), 5000);
        assert_eq!(
            parse_listen_spec(Some("127.0.0.1:x")).err(),
            Some(libc::EINVAL)
        );
    }
}
