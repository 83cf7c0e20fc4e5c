//! AF_XDP ports on a veth rail of a two-host testbed (network namespaces this test makes
//! and removes). Needs root, like every testbed test.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use braid_testbed::testbed::spawn_in_netns;
use braid_testbed::{Testbed, TestbedSpec};
use braid_xdp::{ETHER_HEADER, ETHERTYPE, Port, PortConfig, XdpError, XdpMode, ether_header};

const WAIT: Duration = Duration::from_secs(10);

/// A two-host unshaped testbed with one rail: host 0 reaches host 1 through `p1r0`, host 1
/// reaches host 0 through `p0r0`.
fn testbed(name: &str) -> Result<Testbed> {
    Testbed::up(&TestbedSpec::unshaped(name, 1))
}

/// The frame numbered `seq`: a length that varies from the shortest to the longest frame,
/// the sequence number, and bytes derived from it.
fn frame(src: [u8; 6], seq: u32, max: usize) -> Vec<u8> {
    let len = ETHER_HEADER + 4 + (seq as usize * 97) % (max - ETHER_HEADER - 4 + 1);
    let mut f = ether_header([0xff; 6], src, ETHERTYPE).to_vec();
    f.extend_from_slice(&seq.to_le_bytes());
    f.extend((0..len - f.len()).map(|i| (i as u32 ^ seq.wrapping_mul(31)) as u8));
    f
}

/// Receives one frame, waiting at most `WAIT`.
fn recv_one(port: &mut Port) -> Result<Vec<u8>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut got = None;
        port.recv(1, |f| got = Some(f.to_vec()));
        if let Some(f) = got {
            return Ok(f);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no frame within {WAIT:?}");
        }
        port.wait_readable(left.min(Duration::from_millis(50)))?;
    }
}

fn send_one(port: &mut Port, f: &[u8]) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while !port.send(f)? {
        port.flush()?;
        ensure!(
            Instant::now() < deadline,
            "no send slot came free within {WAIT:?}"
        );
        std::thread::yield_now();
    }
    Ok(())
}

#[test]
fn frames_of_every_length_cross_a_veth_rail_and_come_back_in_order() -> Result<()> {
    echo_round_trips("xdpecho", XdpMode::Native)
}

#[test]
fn the_generic_mode_carries_the_same_frames() -> Result<()> {
    echo_round_trips("xdpgen", XdpMode::Generic)
}

/// Host 0 sends frames of every length, at most a window ahead; host 1 echoes them; each
/// echo must be the frame sent, in order, with nothing dropped.
fn echo_round_trips(name: &str, mode: XdpMode) -> Result<()> {
    let tb = testbed(name)?;
    let cfg = PortConfig {
        mode,
        ..PortConfig::default()
    };
    let cfg2 = cfg.clone();
    const N: u32 = 3000;
    const WINDOW: u32 = 64;
    let (ready_tx, ready_rx) = mpsc::channel();
    // Host 1 echoes every frame it gets, in order.
    let echo = spawn_in_netns(&tb.host_ns(1), move || -> Result<()> {
        let mut port = Port::open("p0r0", &cfg2)?;
        ready_tx.send(()).ok();
        for _ in 0..N {
            let f = recv_one(&mut port)?;
            send_one(&mut port, &f)?;
            port.flush()?;
        }
        // Frames still queued for sending go before the port closes.
        let deadline = Instant::now() + WAIT;
        while port.pending() > 0 {
            port.flush()?;
            ensure!(
                Instant::now() < deadline,
                "echoes stuck in the transmit ring"
            );
        }
        Ok(())
    })?;
    ready_rx
        .recv_timeout(WAIT)
        .context("the echo side never opened its port")?;
    let client = spawn_in_netns(&tb.host_ns(0), move || -> Result<()> {
        let mut port = Port::open("p1r0", &cfg)?;
        let (mac, max) = (port.mac(), port.max_frame());
        let (mut sent, mut got) = (0u32, 0u32);
        while got < N {
            while sent < N && sent - got < WINDOW {
                send_one(&mut port, &frame(mac, sent, max))?;
                sent += 1;
            }
            port.flush()?;
            let f = recv_one(&mut port)?;
            let want = frame(mac, got, max);
            ensure!(
                f == want,
                "echo #{got}: {} bytes, not the {} sent (or changed)",
                f.len(),
                want.len()
            );
            got += 1;
        }
        let s = port.stats()?;
        ensure!(
            s.rx_dropped == 0 && s.rx_ring_full == 0,
            "the port dropped frames: {s:?}"
        );
        Ok(())
    })?;
    let c = client.join().expect("client thread");
    let e = echo.join().expect("echo thread");
    c??;
    e??;
    Ok(())
}

#[test]
fn other_traffic_still_reaches_the_kernel_while_ports_are_open() -> Result<()> {
    let tb = testbed("xdppass")?;
    let (a, b) = tb.rail_addrs(0, 1)[0];
    let (ready_tx, ready_rx) = mpsc::channel();
    let server = spawn_in_netns(&tb.host_ns(1), move || -> Result<()> {
        let _port = Port::open("p0r0", &PortConfig::default())?;
        let l = TcpListener::bind((b, 19800))?;
        ready_tx.send(()).ok();
        let (mut s, _) = l.accept()?;
        s.set_read_timeout(Some(WAIT))?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)?;
        s.write_all(&buf)?;
        Ok(())
    })?;
    ready_rx
        .recv_timeout(WAIT)
        .context("server never listened")?;
    let client = spawn_in_netns(&tb.host_ns(0), move || -> Result<()> {
        let _port = Port::open("p1r0", &PortConfig::default())?;
        // ARP and TCP are not the ports' type: the stack answers them as before.
        let mut s = TcpStream::connect_timeout(&(b, 19800).into(), WAIT)?;
        s.set_read_timeout(Some(WAIT))?;
        s.write_all(b"hello")?;
        let mut buf = [0u8; 5];
        s.read_exact(&mut buf)?;
        ensure!(&buf == b"hello", "got {buf:?} back from {a}");
        Ok(())
    })?;
    client.join().expect("client thread")??;
    server.join().expect("server thread")??;
    Ok(())
}

#[test]
fn a_closed_port_detaches_and_bad_requests_get_clear_errors() -> Result<()> {
    let tb = testbed("xdperr")?;
    spawn_in_netns(&tb.host_ns(0), || -> Result<()> {
        match Port::open("no-such-if", &PortConfig::default()) {
            Err(XdpError::NoInterface(n)) => ensure!(n == "no-such-if"),
            other => bail!("a missing interface gave {other:?}"),
        }
        let bad = PortConfig {
            frames: 100,
            ..PortConfig::default()
        };
        ensure!(matches!(Port::open("p1r0", &bad), Err(XdpError::Config(_))));
        let mut port = Port::open("p1r0", &PortConfig::default())?;
        // One XDP program per interface: a second port is refused while the first lives.
        match Port::open("p1r0", &PortConfig::default()) {
            Err(XdpError::Attach(..)) => {}
            other => bail!("a second port on one interface gave {other:?}"),
        }
        let long = vec![0u8; port.max_frame() + 1];
        ensure!(matches!(port.send(&long), Err(XdpError::FrameSize { .. })));
        ensure!(matches!(
            port.send(&[0u8; 13]),
            Err(XdpError::FrameSize { .. })
        ));
        drop(port);
        // Closing detached the program: the interface takes a new port.
        Port::open("p1r0", &PortConfig::default())?;
        Ok(())
    })?
    .join()
    .expect("test thread")??;
    Ok(())
}
