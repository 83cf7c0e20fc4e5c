//! Sequential write or read of one file through the client library (no FUSE), with the
//! throughput: `fs_copy RAILS PATH write|read SIZE_MIB [PIECES_IN_FLIGHT]`.
//!
//! RAILS is `LOCAL=REMOTE:PORT,...`; PATH is relative to the export's root. Writes end with
//! an `fsync` on the server; reads go into one registered buffer of the whole size.

use std::time::Instant;

use braid::{Access, Context};
use braid_fs::client::{Client, ClientConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: fs_copy RAILS PATH write|read SIZE_MIB [WINDOW]");
        std::process::exit(2);
    }
    let rails = args[1]
        .split(',')
        .map(|r| r.parse())
        .collect::<Result<Vec<_>, _>>()?;
    let len: usize = args[4].parse::<usize>()? << 20;
    let ctx = Context::new()?;
    let mut cfg = ClientConfig::new(rails);
    if let Some(w) = args.get(5) {
        cfg.window = w.parse()?;
    }
    let client = Client::connect(&ctx, &cfg)?;
    let buf = ctx.alloc_region(len, Access::LOCAL_WRITE)?;
    let t = Instant::now();
    let bytes = match args[3].as_str() {
        "write" => {
            let (_, f) = match client.walk(&args[2], false) {
                Ok(e) => {
                    let f = client.open(e.node, libc::O_RDWR)?;
                    (e, f)
                }
                Err(_) => {
                    client.create(client.root().node, args[2].as_bytes(), 0o644, libc::O_RDWR)?
                }
            };
            f.write_at(0, &buf, 0, len)?;
            eprintln!("write_at: {:.3} s", t.elapsed().as_secs_f64());
            f.sync_all()?;
            len
        }
        "read" => client
            .open_path(&args[2], libc::O_RDONLY)?
            .read_at(0, &buf, 0, len)?,
        other => return Err(format!("unknown mode {other}").into()),
    };
    let s = t.elapsed().as_secs_f64();
    println!(
        "{{\"mode\":\"{}\",\"bytes\":{bytes},\"seconds\":{s:.3},\"mb_s\":{:.1}}}",
        args[3],
        bytes as f64 / s / 1e6
    );
    Ok(())
}
