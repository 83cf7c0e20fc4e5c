//! Choosing the rendezvous port for a launcher that starts the ranks itself.

use std::io;
use std::net::{IpAddr, TcpListener};

/// A TCP port free on `ip` now, for `BRAID_ROOT` (in the calling thread's network
/// namespace).
///
/// It comes from below the kernel's ephemeral range. A port of that range, free when probed,
/// can be handed to any socket of the job that binds to port 0 or connects before rank 0
/// listens (a rank's rail listener, say), and rank 0 then fails with `EADDRINUSE`; below the
/// range only an explicit bind can take it (the convention of torchrun's 29500). The start
/// is random, so jobs started at once do not all probe the same port.
pub fn rendezvous_port(ip: IpAddr) -> io::Result<u16> {
    let (lo, _) = ephemeral_range().unwrap_or((32768, 60999));
    let (first, span) = (lo / 2, lo - lo / 2);
    let mut seed = [0u8; 2];
    let start = match getrandom::fill(&mut seed) {
        Ok(()) => u16::from_ne_bytes(seed) % span,
        Err(_) => std::process::id() as u16 % span,
    };
    for i in 0..span {
        let port = first + (start + i) % span;
        if TcpListener::bind((ip, port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// The kernel's ephemeral port range (`net.ipv4.ip_local_port_range`) in the calling
/// thread's network namespace.
fn ephemeral_range() -> Option<(u16, u16)> {
    let s = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = s.split_whitespace().map(|x| x.parse::<u16>().ok());
    let (lo, hi) = (it.next()??, it.next()??);
    (lo > 1024 && lo <= hi).then_some((lo, hi))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn the_port_is_below_the_ephemeral_range_and_free() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (lo, _) = ephemeral_range().expect("this kernel shows its ephemeral range");
        for _ in 0..20 {
            let p = rendezvous_port(ip).unwrap();
            assert!(p >= lo / 2 && p < lo, "{p} not in [{}, {lo})", lo / 2);
            TcpListener::bind((ip, p)).expect("the port is free");
        }
    }
}
