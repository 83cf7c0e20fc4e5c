//! A shared counter and a lock word in a peer's memory, updated with remote atomics from
//! several threads at once. Run: `cargo run -p braid --example atomics`.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use braid::{Access, Context, EndpointOptions, RailAddr, Status};

const THREADS: u64 = 4;
const ADDS: u64 = 1000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Context::new()?;
    let words = server.alloc_region(4096, Access::REMOTE_ATOMIC | Access::REMOTE_READ)?;
    let listener = server.listen(&["127.0.0.1:0".parse::<SocketAddr>()?])?;
    let addr = listener.local_addrs()[0];
    let scq = server.create_cq(16);
    let sopts = EndpointOptions::new(&scq);
    // One endpoint per client thread; the server application does nothing else: its
    // progress engine executes the atomics.
    let acceptor = std::thread::spawn(move || {
        (0..THREADS)
            .map(|_| listener.accept(&sopts, Duration::from_secs(10)))
            .collect::<Result<Vec<_>, _>>()
    });

    let client = Context::new()?;
    let key = words.remote_key();
    std::thread::scope(|s| -> Result<(), braid::Error> {
        let mut handles = Vec::new();
        for t in 0..THREADS {
            let client = &client;
            handles.push(s.spawn(move || -> Result<u64, braid::Error> {
                // Each thread has its own endpoint and completion queue.
                let cq = client.create_cq(ADDS as usize);
                let ep = client.connect(
                    &[RailAddr {
                        local: None,
                        remote: addr,
                    }],
                    &EndpointOptions::new(&cq),
                )?;
                for i in 0..ADDS {
                    ep.fetch_add(t * ADDS + i, &key, 0, 1)?;
                }
                let mut max_seen = 0;
                for _ in 0..ADDS {
                    let c = cq.wait(Duration::from_secs(30)).expect("completion");
                    assert_eq!(c.status, Status::Success);
                    max_seen = max_seen.max(c.value.expect("fetch_add returns the old value"));
                }
                // Take the lock word at offset 8 with compare-and-swap, then release it.
                loop {
                    ep.compare_swap(1, &key, 8, 0, t + 1)?;
                    let c = cq.wait(Duration::from_secs(30)).expect("completion");
                    if c.value == Some(0) {
                        break;
                    }
                    std::thread::yield_now();
                }
                ep.compare_swap(2, &key, 8, t + 1, 0)?;
                let c = cq.wait(Duration::from_secs(30)).expect("completion");
                assert_eq!(c.value, Some(t + 1), "we held the lock");
                Ok(max_seen)
            }));
        }
        let _server_eps = acceptor.join().expect("accept thread")?;
        for h in handles {
            h.join().expect("thread")?;
        }
        Ok(())
    })?;
    let total = words.atomic_u64(0)?.load(Ordering::SeqCst);
    println!("{THREADS} threads x {ADDS} remote fetch_add = {total}");
    assert_eq!(total, THREADS * ADDS);
    assert_eq!(
        words.atomic_u64(8)?.load(Ordering::SeqCst),
        0,
        "lock released"
    );
    Ok(())
}
