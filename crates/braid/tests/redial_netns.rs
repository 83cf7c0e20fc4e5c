//! A failed rail is re-dialled from the network namespace its endpoint was connected in, even
//! when every thread that can notice the failure lives in another one.
//!
//! Namespaces belong to threads in Linux and a new thread starts in its creator's. Here the
//! client's context (and so its progress engine thread) is made in the test's namespace, and
//! the endpoint is connected from a thread in a new, private namespace where the server is.
//! A broken rail is noticed by the engine thread or by this thread polling, both in the
//! test's namespace, where nothing listens on the server's port: a re-dial made from there is
//! refused for ever, one made from the endpoint's namespace rejoins.
//!
//! Needs root (unshare) and `ip` (to bring the new namespace's loopback up); skips, saying
//! why, elsewhere. The namespace is anonymous: it goes away with its last thread and socket.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use braid::{Access, Context, Endpoint, EndpointOptions, Listener, RailAddr};
use common::*;

/// Runs on a thread that has moved into a new network namespace with its loopback up:
/// listens there on 127.0.0.1..3 and connects `client`'s endpoint to it.
fn connect_in_new_namespace(
    client: Context,
    copts: EndpointOptions,
    sopts: EndpointOptions,
) -> Result<(Context, Listener, Endpoint, Endpoint), String> {
    // SAFETY: unshare(2) with CLONE_NEWNET only changes the calling thread's namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        ));
    }
    // A child process starts in its creating thread's namespace: this one.
    match Command::new("ip")
        .args(["link", "set", "lo", "up"])
        .output()
    {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return Err(format!(
                "ip link set lo up: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => return Err(format!("running ip: {e}")),
    }
    let server = Context::new().map_err(|e| e.to_string())?;
    let addrs: Vec<SocketAddr> = (0..3).map(|i| SocketAddr::new(rail_ip(i), 0)).collect();
    let listener = server.listen(&addrs).map_err(|e| e.to_string())?;
    let rails: Vec<RailAddr> = listener
        .local_addrs()
        .iter()
        .enumerate()
        .map(|(i, a)| RailAddr::new(Some(rail_ip(i)), *a))
        .collect();
    // The accepting thread starts in this thread's namespace too.
    let accept = std::thread::spawn(move || {
        let ep = listener.accept(&sopts, WAIT);
        (ep, listener)
    });
    let cep = client.connect(&rails, &copts).map_err(|e| e.to_string())?;
    let (sep, listener) = accept.join().expect("accept thread");
    let sep = sep.map_err(|e| e.to_string())?;
    Ok((server, listener, cep, sep))
}

#[test]
fn a_rail_is_redialled_from_the_namespace_its_endpoint_was_connected_in() {
    // Made here, in the test's namespace: so are the progress engine thread and every
    // re-dial thread it starts.
    let client = Context::new().unwrap();
    let (ccq, scq) = (client.create_cq(64), client.create_cq(64));
    let mut copts = EndpointOptions::new(&ccq);
    copts.session.keepalive_interval = Duration::from_millis(50);
    // Small windows: every rail carries part of each write.
    copts.session.max_window = 2 << 20;
    let sopts = EndpointOptions::new(&scq);
    let c2 = client.clone();
    let made = std::thread::spawn(move || connect_in_new_namespace(c2, copts, sopts))
        .join()
        .expect("connecting thread");
    // The listener stays: re-joining rails come back through it.
    let (server, _listener, cep, sep) = match made {
        Ok(x) => x,
        Err(why) => {
            eprintln!("SKIPPED: cannot make a network namespace here: {why}");
            return;
        }
    };
    let target = server.alloc_region(8 << 20, Access::all()).unwrap();
    let src = client.alloc_region(8 << 20, Access::all()).unwrap();
    let data = pattern(23, 8 << 20);
    src.write_at(0, &data).unwrap();

    cep.inject_rail_failure(1).unwrap();
    // Bounded waits on the rail state (polling a condition, not sleeping for a result).
    let deadline = Instant::now() + WAIT;
    while cep.rails_alive()[1] {
        assert!(Instant::now() < deadline, "the break was not noticed");
        std::thread::sleep(Duration::from_millis(5));
    }
    while !(cep.rails_alive().iter().all(|a| *a) && sep.rails_alive().iter().all(|a| *a)) {
        assert!(
            Instant::now() < deadline,
            "the rail was not re-dialled into its endpoint's namespace within {WAIT:?}: client {:?}, server {:?}",
            cep.rails_alive(),
            sep.rails_alive()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let before = cep.rail_bytes_sent()[1];
    for i in 0..4u64 {
        cep.write(i, &[src.as_sge()], &target.remote_key(), 0)
            .unwrap();
    }
    for i in 0..4u64 {
        expect_ok(&ccq, i);
    }
    assert!(target.to_vec(0, 8 << 20).unwrap() == data);
    assert!(
        cep.rail_bytes_sent()[1] > before,
        "the re-dialled rail carries data: {:?}",
        cep.rail_bytes_sent()
    );
}
