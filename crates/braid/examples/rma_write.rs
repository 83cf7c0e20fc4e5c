//! A one-sided RMA write between two processes, with the remote key sent over the endpoint.
//!
//! The server registers a region and sends its remote key; the client writes into it and
//! tells the server with a send; the server checks the bytes. One rail per address pair:
//!
//! ```sh
//! rma_write server 10.0.1.2:18600,10.0.2.2:18600                    # host B: an address per NIC
//! rma_write client 10.0.1.1=10.0.1.2:18600,10.0.2.1=10.0.2.2:18600  # host A: LOCAL=REMOTE per rail
//! ```
//!
//! The client retries a refused connection for up to 10 s, so both may start together.

use std::net::SocketAddr;
use std::str::FromStr;
use std::time::{Duration, Instant};

use braid::{
    Access, CompletionQueue, Context, Endpoint, EndpointOptions, RailAddr, RemoteKey, Status,
};

const LEN: usize = 4 << 20;
const WAIT: Duration = Duration::from_secs(30);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(role), Some(list)) = (args.first(), args.get(1)) else {
        return Err("usage: rma_write server IP:PORT,... | client LOCAL=REMOTE:PORT,...".into());
    };
    let ctx = Context::new()?;
    let cq = ctx.create_cq(16);
    let opts = EndpointOptions::new(&cq);
    match role.as_str() {
        "server" => server(&ctx, &cq, &opts, list),
        "client" => client(&ctx, &cq, &opts, list),
        _ => Err(format!("unknown role `{role}`: server or client").into()),
    }
}

fn server(
    ctx: &Context,
    cq: &CompletionQueue,
    opts: &EndpointOptions,
    list: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let addrs: Vec<SocketAddr> = parse_list(list)?;
    // Server: one listening address per rail; a region the peer may write; its key, sent.
    let listener = ctx.listen(&addrs)?;
    let ep = listener.accept(opts, Duration::from_secs(60))?;
    let target = ctx.alloc_region(LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
    let done = ctx.alloc_region(1, Access::LOCAL_WRITE)?;
    ep.post_recv(1, &[done.as_sge()])?; // for the client's "done"
    let key = ctx.alloc_region(16, Access::LOCAL_WRITE)?;
    key.write_at(0, &target.remote_key().to_bytes())?; // 16 bytes, opaque to the peer
    ep.send(2, &[key.as_sge()])?;
    complete(cq, 2)?; // the send, then the "done" receive: the write has landed
    if target.to_vec(0, LEN)? != (0..LEN).map(pattern).collect::<Vec<u8>>() {
        return Err("the written bytes differ".into());
    }
    println!("server: {LEN} bytes written by the peer, correct");
    Ok(())
}

fn client(
    ctx: &Context,
    cq: &CompletionQueue,
    opts: &EndpointOptions,
    list: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let rails: Vec<RailAddr> = parse_list(list)?;
    // Client: connect every rail, receive the key, write, then say "done".
    let ep = connect_retrying(ctx, &rails, opts)?;
    let msg = ctx.alloc_region(16, Access::LOCAL_WRITE)?;
    ep.post_recv(1, &[msg.as_sge()])?;
    complete(cq, 1)?;
    let key = RemoteKey::from_bytes(&msg.to_vec(0, 16)?).ok_or("not a remote key")?;
    let src = ctx.alloc_region(LEN, Access::LOCAL_WRITE)?;
    src.write_at(0, &(0..LEN).map(pattern).collect::<Vec<u8>>())?;
    let t = Instant::now();
    ep.write(2, &[src.as_sge()], &key, 0)?; // one-sided, striped over every rail
    complete(cq, 1)?;
    let secs = t.elapsed().as_secs_f64();
    ep.send(3, &[msg.slice(0, 1)?])?; // "done": executed after the write
    complete(cq, 1)?;
    println!(
        "client: wrote {LEN} bytes over {} rail(s) in {secs:.4} s",
        ep.rail_count()
    );
    Ok(())
}

/// `a,b,c` parsed item by item.
fn parse_list<T: FromStr>(list: &str) -> Result<Vec<T>, T::Err> {
    list.split(',').map(str::parse).collect()
}

/// Waits for `n` completions on the endpoint's queue; any failure is an error.
fn complete(cq: &CompletionQueue, n: usize) -> Result<(), Box<dyn std::error::Error>> {
    for _ in 0..n {
        let c = cq.wait(WAIT).ok_or("no completion in time")?;
        if c.status != Status::Success {
            return Err(format!("operation {} failed: {:?}", c.wr_id, c.status).into());
        }
    }
    Ok(())
}

fn connect_retrying(
    ctx: &Context,
    rails: &[RailAddr],
    opts: &EndpointOptions,
) -> Result<Endpoint, braid::Error> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ctx.connect(rails, opts) {
            Err(braid::Error::Io(e))
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

fn pattern(i: usize) -> u8 {
    (i * 31 % 251) as u8
}
