//! Testbed integration tests: real namespaces, veth rails and tbf. They skip, saying why,
//! where network namespaces cannot be made (not root, no `ip`, netns not permitted).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use braid_testbed::parse::Rate;
use braid_testbed::testbed::{self, Testbed, TestbedSpec};

const TIMEOUT: Duration = Duration::from_secs(5);
const PORT: u16 = 18600;

fn skip_reason() -> Option<String> {
    match testbed::probe() {
        Ok(()) => None,
        Err(e) => {
            let msg = format!("SKIPPED: network namespaces unavailable here: {e:#}");
            eprintln!("{msg}");
            Some(msg)
        }
    }
}

fn our_namespaces(name: &str) -> Vec<String> {
    testbed::list_netns()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{name}-h")))
        .collect()
}

fn pattern(i: usize) -> u8 {
    (i as u64).wrapping_mul(2_654_435_761).to_le_bytes()[1]
}

/// Client side of one transfer: bind to `local`, connect, send `len` pattern bytes, and
/// read the server's count back.
fn connect_bound(local: Ipv4Addr, remote: SocketAddr) -> std::io::Result<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(local.into(), 0).into())?;
    s.connect_timeout(&remote.into(), TIMEOUT)?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    Ok(s)
}

/// A verified transfer of `len` bytes over one rail: server thread in host 1, client thread
/// in host 0, each bound to the rail's addresses.
fn transfer(tb: &Testbed, rail: usize, len: usize) -> Result<(), String> {
    let (a, b) = tb.rail_addrs(0, 1)[rail];
    let addr = SocketAddr::new(b.into(), PORT + rail as u16);
    let server = tb
        .spawn_in(1, move || -> std::io::Result<u64> {
            let l = TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            let deadline = Instant::now() + TIMEOUT;
            let (mut s, peer) = loop {
                match l.accept() {
                    Ok(x) => break x,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::WouldBlock
                            && Instant::now() < deadline =>
                    {
                        // Bounded: the client connects right after we listen, or the test fails.
                        std::thread::yield_now();
                    }
                    Err(e) => return Err(e),
                }
            };
            assert_eq!(
                peer.ip(),
                std::net::IpAddr::V4(a),
                "the client must come from the rail's address"
            );
            s.set_nonblocking(false)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            let mut got = Vec::new();
            s.read_to_end(&mut got)?;
            let ok = got.len() == len && got.iter().enumerate().all(|(i, &x)| x == pattern(i));
            let n = if ok { got.len() as u64 } else { u64::MAX };
            s.write_all(&n.to_be_bytes())?;
            Ok(n)
        })
        .map_err(|e| e.to_string())?;
    let client = tb
        .spawn_in(0, move || -> std::io::Result<u64> {
            let deadline = Instant::now() + TIMEOUT;
            // The server thread may not be listening yet: retry refusals, bounded in time.
            let mut s = loop {
                match connect_bound(a, addr) {
                    Ok(s) => break s,
                    Err(e)
                        if e.kind() == std::io::ErrorKind::ConnectionRefused
                            && Instant::now() < deadline =>
                    {
                        std::thread::yield_now()
                    }
                    Err(e) => return Err(e),
                }
            };
            let data: Vec<u8> = (0..len).map(pattern).collect();
            s.write_all(&data)?;
            s.shutdown(Shutdown::Write)?;
            let mut n = [0u8; 8];
            s.read_exact(&mut n)?;
            Ok(u64::from_be_bytes(n))
        })
        .map_err(|e| e.to_string())?;
    let c = client
        .join()
        .map_err(|_| "client panicked".to_string())?
        .map_err(|e| e.to_string())?;
    let s = server
        .join()
        .map_err(|_| "server panicked".to_string())?
        .map_err(|e| e.to_string())?;
    match (c, s) {
        (Ok(c), Ok(s)) if c == len as u64 && s == len as u64 => Ok(()),
        (c, s) => Err(format!("rail {rail}: client {c:?}, server {s:?}")),
    }
}

#[test]
fn testbed_rails_transfer_link_down_and_teardown() {
    if skip_reason().is_some() {
        return;
    }
    let name = format!("braid-test-{}", std::process::id());
    let spec = TestbedSpec::new(&name, 2, Rate::from_bits(1_000_000_000));
    let tb = Testbed::up(&spec).expect("testbed up");
    assert!(tb.owned());
    assert_eq!(our_namespaces(&name).len(), 2);
    assert_eq!(tb.rail_rate_bytes(1), 125_000_000);
    assert_eq!(
        tb.rail_addrs(0, 1)[1],
        (Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2))
    );
    let status = tb.status().unwrap();
    assert!(
        status.contains("198.18.1.2") && status.contains("1gbit"),
        "{status}"
    );

    // `up` of the same shape reuses it (and the reusing guard leaves it standing); another
    // shape is refused.
    let again = Testbed::up(&spec).expect("reuse");
    assert!(!again.owned());
    drop(again);
    assert_eq!(our_namespaces(&name).len(), 2);
    let mut other = spec.clone();
    other.mtu = 9000;
    assert!(Testbed::up(&other).is_err());

    for rail in 0..2 {
        transfer(&tb, rail, 1 << 20).unwrap();
    }

    // The CLI's plain TCP baseline across the namespaces, bounded by message count.
    let exe = env!("CARGO_BIN_EXE_braid");
    let mut server = tb
        .command(1, exe)
        .args([
            "baseline",
            "tcp",
            "server",
            "--listen",
            "198.18.0.2:18700",
            "--accept-timeout",
            "10",
        ])
        .spawn()
        .unwrap();
    let out = tb
        .command(0, exe)
        .args([
            "baseline",
            "tcp",
            "client",
            "--rails",
            "198.18.0.1=198.18.0.2:18700",
            "-s",
            "1M",
            "--iters",
            "4",
            "-D",
            "10",
            "--json",
            "-",
        ])
        .output()
        .unwrap();
    let st = server.wait().unwrap();
    assert!(
        out.status.success() && st.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["bytes"], 4 << 20);
    assert_eq!(v["mode"], "tcp");

    // Rail 1 down on host 0: its route is gone, so it cannot carry traffic; rail 0 still can.
    tb.set_rail_link(0, 1, false).unwrap();
    let (a1, b1) = tb.rail_addrs(0, 1)[1];
    let err = tb
        .spawn_in(0, move || {
            connect_bound(a1, SocketAddr::new(b1.into(), PORT + 1)).map(|_| ())
        })
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
    assert!(
        err.is_err(),
        "rail 1 must be unusable while its link is down"
    );
    let down = Command::new("ip")
        .args(["-n", &tb.host_ns(1), "-br", "link", "show", "p0r1"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&down.stdout).contains("LOWERLAYERDOWN")
            || String::from_utf8_lossy(&down.stdout).contains("DOWN")
    );
    transfer(&tb, 0, 1 << 16).unwrap();

    // And back up: the rail carries traffic again (carrier returns within the bounded retry).
    tb.set_rail_link(0, 1, true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match transfer(&tb, 1, 1 << 16) {
            Ok(()) => break,
            Err(e) if Instant::now() < deadline => eprintln!("rail 1 not back yet: {e}"),
            Err(e) => panic!("rail 1 did not come back: {e}"),
        }
    }

    drop(tb);
    assert!(
        our_namespaces(&name).is_empty(),
        "namespaces left: {:?}",
        our_namespaces(&name)
    );
}

#[test]
fn testbed_is_removed_when_a_test_panics() {
    if skip_reason().is_some() {
        return;
    }
    let name = format!("braid-test-{}-p", std::process::id());
    let spec = TestbedSpec::new(&name, 1, Rate::from_bits(100_000_000));
    let r = std::panic::catch_unwind(|| {
        let _tb = Testbed::up(&spec).expect("testbed up");
        assert_eq!(our_namespaces(&name).len(), 2);
        panic!("deliberate failure while the testbed is up");
    });
    assert!(r.is_err());
    assert!(
        our_namespaces(&name).is_empty(),
        "namespaces left: {:?}",
        our_namespaces(&name)
    );
}

#[test]
fn unshaped_testbed_has_no_qdisc_and_carries_traffic() {
    if skip_reason().is_some() {
        return;
    }
    let name = format!("braid-test-{}-u", std::process::id());
    let tb = Testbed::up(&TestbedSpec::unshaped(&name, 2)).expect("testbed up");
    for host in 0..2 {
        for rail in 0..2 {
            let out = Command::new("tc")
                .args(["-n", &tb.host_ns(host), "qdisc", "show", "dev"])
                .arg(format!("p{}r{rail}", 1 - host))
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success() && !text.contains("tbf"), "{text}");
        }
    }
    assert!(tb.status().unwrap().contains("unshaped"));
    // An unshaped record differs from a shaped one of the same name.
    assert!(Testbed::up(&TestbedSpec::new(&name, 2, Rate::from_bits(1_000_000_000))).is_err());
    transfer(&tb, 1, 1 << 20).unwrap();
    drop(tb);
    assert!(our_namespaces(&name).is_empty());
}
