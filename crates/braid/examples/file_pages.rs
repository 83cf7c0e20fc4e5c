//! Serve a file's pages to a peer: the "server" registers a range of a file
//! (`Context::register_file`), the "client" writes scattered pieces into it with one
//! vectored write (`write_v`), reads them back with one vectored read (`read_v`), and finds
//! that a read past the file's end is an error completion, not a crash.
//!
//! Both ends run in this process over loopback rails 127.0.0.1..127.0.0.N. Run:
//! `cargo run --release -p braid --example file_pages -- [RAILS]`.

use std::fs::OpenOptions;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::FileExt;
use std::time::Duration;

use braid::{Access, Context, EndpointOptions, RailAddr, RemoteSge, Status};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rails: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(4);
    let ip = |i: usize| IpAddr::V4(Ipv4Addr::new(127, 0, 0, i as u8 + 1));
    let path = std::env::temp_dir().join(format!("braid-file-pages-{}", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)?; // the descriptor keeps the file; nothing is left behind
    file.set_len(8 << 20)?;

    // The server: 16 MiB registered, of which the file has 8 MiB so far.
    let server = Context::new()?;
    let server_cq = server.create_cq(64);
    let listener = server.listen(
        &(0..rails)
            .map(|i| SocketAddr::new(ip(i), 0))
            .collect::<Vec<_>>(),
    )?;
    let pages = server.register_file(
        &file,
        0,
        16 << 20,
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    )?;
    let key = pages.remote_key(); // in a real program, sent to the peer

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
    let wait = || cq.wait(Duration::from_secs(30)).ok_or("no completion");

    // 64 pieces of 64 KiB, written to every other 64 KiB of the file in one operation.
    let buf = client.alloc_region(4 << 20, Access::all())?;
    let data: Vec<u8> = (0..4 << 20).map(|i| (i * 7 % 253) as u8).collect();
    buf.write_at(0, &data)?;
    let remote: Vec<RemoteSge> = (0..64)
        .map(|i| RemoteSge::new(key, i * (128 << 10), 64 << 10))
        .collect();
    ep.write_v(1, &[buf.as_sge()], &remote)?;
    assert_eq!(wait()?.status, Status::Success);
    // The bytes are in the file (the server's page cache), as pread sees them.
    let mut piece = vec![0u8; 64 << 10];
    file.read_exact_at(&mut piece, 5 * (128 << 10))?;
    assert!(piece == data[5 * (64 << 10)..6 * (64 << 10)]);

    // Read the pieces back into a fresh buffer with one vectored read.
    let back = client.alloc_region(4 << 20, Access::all())?;
    ep.read_v(2, &[back.as_sge()], &remote)?;
    assert_eq!(wait()?.status, Status::Success);
    assert!(back.to_vec(0, data.len())? == data);

    // Past the end of the file (but inside the registration): an error completion.
    ep.read(3, &[back.slice(0, 4096)?], &key, 12 << 20)?;
    assert_eq!(wait()?.status, Status::RemoteAccessError);
    // The file grows; the same key now reaches the new bytes.
    file.set_len(16 << 20)?;
    ep.read(4, &[back.slice(0, 4096)?], &key, 12 << 20)?;
    assert_eq!(wait()?.status, Status::Success);

    println!(
        "{rails} rail(s): 64 scattered pieces written to and read back from file pages; \
         past the end of the file: RemoteAccessError; after growing it: read; bytes per rail {:?}",
        ep.rail_bytes_sent()
    );
    Ok(())
}
