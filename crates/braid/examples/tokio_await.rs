//! Awaiting completions from async code. `CompletionQueue::next()` is a plain future, so any
//! runtime works; this one uses tokio. Run: `cargo run -p braid --example tokio_await`.

use std::net::SocketAddr;
use std::time::Duration;

use braid::{Access, CompletionKind, Context, EndpointOptions, RailAddr};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Context::new()?;
    let scq = server.create_cq(64);
    let listener = server.listen(&["127.0.0.1:0".parse::<SocketAddr>()?])?;
    let addr = listener.local_addrs()[0];
    let inbox = server.alloc_region(1 << 16, Access::all())?;
    // Accepting blocks, so it runs on a blocking thread.
    let sopts = EndpointOptions::new(&scq);
    let accept =
        tokio::task::spawn_blocking(move || listener.accept(&sopts, Duration::from_secs(10)));

    let client = Context::new()?;
    let cq = client.create_cq(64);
    let copts = EndpointOptions::new(&cq);
    let ep = tokio::task::spawn_blocking(move || {
        client
            .connect(
                &[RailAddr {
                    local: None,
                    remote: addr,
                }],
                &copts,
            )
            .map(|ep| (client, ep))
    })
    .await??;
    let (client, ep) = ep;
    let server_ep = accept.await??;

    // The server awaits messages while the client sends them.
    for i in 0..4u64 {
        server_ep.post_recv(i, &[inbox.slice(i as usize * 1024, 1024)?])?;
    }
    let receiver = tokio::spawn(async move {
        let mut got = Vec::new();
        for _ in 0..4 {
            let c = scq.next().await;
            assert_eq!(c.kind, CompletionKind::Recv);
            got.push((c.wr_id, c.byte_len, c.imm));
        }
        (got, inbox, server_ep)
    });
    let msg = client.alloc_region(1024, Access::all())?;
    for i in 0..4u64 {
        msg.write_at(0, format!("hello #{i}").as_bytes())?;
        ep.send_with_imm(100 + i, &[msg.slice(0, 8)?], i as u32)?;
        let c = cq.next().await; // completes when the peer has the message
        assert!(c.status.is_ok(), "{c:?}");
    }
    let (got, inbox, _server_ep) = receiver.await?;
    for (wr_id, len, imm) in got {
        let text = String::from_utf8(inbox.to_vec(wr_id as usize * 1024, len as usize)?)?;
        println!("receive {wr_id}: {text:?} (imm {imm:?})");
    }
    Ok(())
}
