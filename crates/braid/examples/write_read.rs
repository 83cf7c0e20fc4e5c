//! Write a buffer into a peer's registered memory over several rails, then read it back.
//!
//! Both ends run in this process (two contexts, as two hosts would have) over loopback rails
//! 127.0.0.1..127.0.0.N. Run: `cargo run --release -p braid --example write_read -- [RAILS] [MiB]`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use braid::{Access, Context, EndpointOptions, RailAddr, Status};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rails: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let mib: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(64);
    let ip = |i: usize| IpAddr::V4(Ipv4Addr::new(127, 0, 0, i as u8 + 1));

    // The "server" host: a context, a listener with one address per rail, a target region.
    let server = Context::new()?;
    let server_cq = server.create_cq(64);
    let listener = server.listen(
        &(0..rails)
            .map(|i| SocketAddr::new(ip(i), 0))
            .collect::<Vec<_>>(),
    )?;
    let target = server.alloc_region(mib << 20, Access::all())?;
    let key = target.remote_key(); // in a real program, sent to the peer (e.g. with `send`)

    // The "client" host connects rail i from 127.0.0.(i+1) to the listener's address i.
    let client = Context::new()?;
    let cq = client.create_cq(64);
    let rail_addrs: Vec<RailAddr> = listener
        .local_addrs()
        .into_iter()
        .enumerate()
        .map(|(i, a)| RailAddr::new(Some(ip(i)), a))
        .collect();
    let opts = EndpointOptions::new(&server_cq);
    let acceptor = std::thread::spawn(move || listener.accept(&opts, Duration::from_secs(10)));
    let ep = client.connect(&rail_addrs, &EndpointOptions::new(&cq))?;
    let _server_ep = acceptor.join().expect("accept thread")?;

    let src = client.alloc_region(mib << 20, Access::all())?;
    let back = client.alloc_region(mib << 20, Access::all())?;
    let data: Vec<u8> = (0..mib << 20).map(|i| (i * 31 % 251) as u8).collect();
    src.write_at(0, &data)?;

    let t = Instant::now();
    ep.write(1, &[src.as_sge()], &key, 0)?;
    let c = cq
        .wait(Duration::from_secs(60))
        .ok_or("write did not complete")?;
    assert_eq!(c.status, Status::Success, "{c:?}");
    let wt = t.elapsed();
    let t = Instant::now();
    ep.read(2, &[back.as_sge()], &key, 0)?;
    let c = cq
        .wait(Duration::from_secs(60))
        .ok_or("read did not complete")?;
    assert_eq!(c.status, Status::Success, "{c:?}");
    let rt = t.elapsed();

    assert!(target.to_vec(0, data.len())? == data, "target bytes differ");
    assert!(
        back.to_vec(0, data.len())? == data,
        "read-back bytes differ"
    );
    let mb = data.len() as f64 / 1e6;
    println!(
        "{rails} rail(s): wrote {mib} MiB in {wt:?} ({:.0} MB/s), read it back in {rt:?} ({:.0} MB/s); bytes per rail {:?}",
        mb / wt.as_secs_f64(),
        mb / rt.as_secs_f64(),
        ep.rail_bytes_sent()
    );
    Ok(())
}
