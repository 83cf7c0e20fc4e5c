//! The client library against a server on loopback rails (no FUSE).

use std::time::{Duration, Instant};

use braid::{Access, Context, RailAddr};
use braid_fs::client::{Client, ClientConfig, Error};
use braid_fs::proto::{Errno, SetAttr};
use braid_fs::server::{Server, ServerConfig, Squash};

struct Setup {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    server: Option<Server>,
    ctx: Context,
    rails: Vec<RailAddr>,
}

/// A server exporting a fresh directory on two loopback rails.
fn setup(read_only: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ctx = Context::new().unwrap();
    let mut cfg = ServerConfig::new(
        &root,
        vec![
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.2:0".parse().unwrap(),
        ],
    );
    cfg.read_only = read_only;
    // The tests run as root and own the export: trust root, as NFS's no_root_squash.
    cfg.squash = Squash::None;
    let server = Server::start(&ctx, cfg).unwrap();
    let rails = server
        .local_addrs()
        .iter()
        .map(|a| format!("{}={a}", a.ip()).parse().unwrap())
        .collect();
    Setup {
        _dir: dir,
        root,
        server: Some(server),
        ctx,
        rails,
    }
}

impl Setup {
    fn client(&self) -> Client {
        let mut cfg = ClientConfig::new(self.rails.clone());
        cfg.session.peer_timeout = Duration::from_secs(2);
        Client::connect(&self.ctx, &cfg).unwrap()
    }
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761) ^ seed) as u8)
        .collect()
}

#[test]
fn large_transfers_round_trip_zero_copy() {
    let s = setup(false);
    let c = s.client();
    let root = c.root().node;
    let (e, f) = c.create(root, b"big", 0o644, libc::O_RDWR).unwrap();
    assert_eq!(e.attr.size, 0);
    let len = 9 << 20 | 12345; // not a multiple of the piece size
    let data = pattern(len, 7);
    let buf = s.ctx.alloc_region(len, Access::LOCAL_WRITE).unwrap();
    buf.write_at(0, &data).unwrap();
    f.write_at(0, &buf, 0, len).unwrap();
    f.flush().unwrap();
    assert_eq!(
        std::fs::read(s.root.join("big")).unwrap(),
        data,
        "the server's file holds the bytes"
    );
    let out = s.ctx.alloc_region(len + 4096, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        f.read_at(0, &out, 0, len + 4096).unwrap(),
        len,
        "a read past the end is short"
    );
    assert_eq!(out.to_vec(0, len).unwrap(), data);
    // Unaligned reads in the middle.
    assert_eq!(f.read_at(1_000_001, &out, 3, 2_000_000).unwrap(), 2_000_000);
    assert_eq!(
        out.to_vec(3, 2_000_000).unwrap(),
        &data[1_000_001..3_000_001]
    );
    assert_eq!(f.read_at(len as u64 + 10, &out, 0, 100).unwrap(), 0);
    // Another client sees the data after the flush (close-to-open).
    let c2 = s.client();
    let g = c2.open_path("big", libc::O_RDONLY).unwrap();
    assert_eq!(g.size(), len as u64);
    assert_eq!(g.read_vec(len as u64 - 10, 100).unwrap(), &data[len - 10..]);
    // Writes from a read-only handle are refused.
    assert_eq!(
        g.write_at(0, &buf, 0, 10).unwrap_err(),
        Error::Remote(Errno::EBADF)
    );
}

/// A file written far enough for the server's early writeback (which unmaps the written
/// range from the server before starting its writeback), then rewritten inside that range:
/// every byte is on the server and reads back.
#[test]
fn writes_behind_the_early_writeback_and_rewrites_there_keep_every_byte() {
    const MIB: usize = 1 << 20;
    const PIECES: usize = 160;
    let s = setup(false);
    let c = s.client();
    let (_, f) = c
        .create(c.root().node, b"long", 0o644, libc::O_RDWR)
        .unwrap();
    let buf = s.ctx.alloc_region(MIB, Access::LOCAL_WRITE).unwrap();
    let mut want = Vec::with_capacity(PIECES * MIB);
    for i in 0..PIECES {
        let piece = pattern(MIB, i as u64);
        buf.write_at(0, &piece).unwrap();
        f.write_at((i * MIB) as u64, &buf, 0, MIB).unwrap();
        want.extend_from_slice(&piece);
    }
    // Pieces 3 and 40 lie in ranges whose writeback has started: written again.
    for i in [3usize, 40] {
        let piece = pattern(MIB, 1000 + i as u64);
        buf.write_at(0, &piece).unwrap();
        f.write_at((i * MIB) as u64, &buf, 0, MIB).unwrap();
        want[i * MIB..(i + 1) * MIB].copy_from_slice(&piece);
    }
    f.flush().unwrap();
    let on_server = std::fs::read(s.root.join("long")).unwrap();
    assert_eq!(on_server.len(), want.len());
    assert!(
        on_server == want,
        "the server's file differs from what was written"
    );
    let out = s.ctx.alloc_region(MIB, Access::LOCAL_WRITE).unwrap();
    for i in [0usize, 3, 40, 100, PIECES - 1] {
        assert_eq!(f.read_at((i * MIB) as u64, &out, 0, MIB).unwrap(), MIB);
        assert!(
            out.to_vec(0, MIB).unwrap() == want[i * MIB..(i + 1) * MIB],
            "piece {i}"
        );
    }
}

#[test]
fn sparse_file_past_4_gib() {
    let s = setup(false);
    let c = s.client();
    let (_, f) = c
        .create(c.root().node, b"sparse", 0o644, libc::O_RDWR)
        .unwrap();
    let off = (5u64 << 30) + 123;
    f.write_all_at(off, b"far away").unwrap();
    // A one-sided write past 4 GiB too.
    let big = pattern(300_000, 3);
    f.write_all_at(off + 1000, &big).unwrap();
    f.sync_all().unwrap();
    let a = f.attr().unwrap();
    assert_eq!(a.size, off + 1000 + big.len() as u64);
    assert!(
        a.blocks * 512 < 16 << 20,
        "the hole is not allocated ({} blocks)",
        a.blocks
    );
    assert_eq!(f.read_vec(off, 8).unwrap(), b"far away");
    assert_eq!(f.read_vec(off + 1000, big.len()).unwrap(), big);
    assert_eq!(
        f.read_vec(1 << 30, 16).unwrap(),
        vec![0u8; 16],
        "holes read as zeros"
    );
}

#[test]
fn metadata_operations() {
    let s = setup(false);
    let c = s.client();
    let root = c.root().node;
    let d = c.mkdir(root, b"dir", 0o755).unwrap();
    assert!(d.attr.is_dir());
    let (fe, f) = c.create(d.node, b"a", 0o640, libc::O_WRONLY).unwrap();
    f.write_all_at(0, b"hello").unwrap();
    f.flush().unwrap();
    // The file's handle holds the lookup reference of `fe` while it is open.
    let l = c.link(fe.node, root, b"hard").unwrap();
    assert_eq!(l.attr.nlink, 2);
    assert_eq!(l.node, fe.node, "a hard link is the same object");
    c.symlink(root, b"sym", b"dir/a").unwrap();
    let sl = c.lookup(root, b"sym").unwrap();
    assert_eq!(c.readlink(sl.node).unwrap(), b"dir/a");
    assert_eq!(c.walk("sym", true).unwrap().node, fe.node);
    c.rename(d.node, b"a", root, b"b", 0).unwrap();
    assert_eq!(
        c.lookup(d.node, b"a").unwrap_err(),
        Error::Remote(Errno::ENOENT)
    );
    let a = c
        .setattr(
            fe.node,
            &SetAttr {
                mode: Some(0o600),
                size: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((a.mode & 0o777, a.size), (0o600, 2));
    let mut names: Vec<_> = c
        .readdir(root)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".", "..", "b", "dir", "hard", "sym"]);
    assert_eq!(
        c.rmdir(root, b"b").unwrap_err(),
        Error::Remote(Errno::ENOTDIR)
    );
    drop(f);
    c.unlink(root, b"b").unwrap();
    c.unlink(root, b"hard").unwrap();
    c.rmdir(root, b"dir").unwrap();
    assert!(c.statfs().unwrap().blocks > 0);
    assert_eq!(
        c.walk("../x", false).unwrap_err(),
        Error::Remote(Errno::EXDEV)
    );
}

#[test]
fn read_only_export() {
    let s = setup(true);
    std::fs::write(s.root.join("f"), b"data").unwrap();
    let c = s.client();
    assert!(c.read_only());
    assert_eq!(
        c.mkdir(c.root().node, b"d", 0o755).unwrap_err(),
        Error::Remote(Errno::EROFS)
    );
    assert_eq!(
        c.open_path("f", libc::O_RDWR).unwrap_err(),
        Error::Remote(Errno::EROFS)
    );
    let f = c.open_path("f", libc::O_RDONLY).unwrap();
    assert_eq!(f.read_vec(0, 100).unwrap(), b"data");
}

#[test]
fn several_clients_write_disjoint_ranges() {
    let s = setup(false);
    let c0 = s.client();
    let (_, f) = c0
        .create(c0.root().node, b"shared", 0o644, libc::O_RDWR)
        .unwrap();
    f.set_len(4 << 20).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let c = s.client();
            std::thread::spawn(move || {
                let f = c.open_path("shared", libc::O_RDWR).unwrap();
                f.write_all_at(i << 20, &pattern(1 << 20, i)).unwrap();
                f.flush().unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let all = std::fs::read(s.root.join("shared")).unwrap();
    for i in 0..4u64 {
        assert_eq!(
            &all[(i as usize) << 20..((i as usize) + 1) << 20],
            pattern(1 << 20, i)
        );
    }
}

/// The server goes away with operations in flight: every one of them, and every later one,
/// fails within the peer timeout; nothing hangs.
#[test]
fn server_gone_fails_everything_within_the_peer_timeout() {
    let mut s = setup(false);
    let c = s.client();
    let (_, f) = c.create(c.root().node, b"f", 0o644, libc::O_RDWR).unwrap();
    let buf = s.ctx.alloc_region(8 << 20, Access::LOCAL_WRITE).unwrap();
    f.write_at(0, &buf, 0, 8 << 20).unwrap();
    let writer = std::thread::spawn(move || {
        let start = Instant::now();
        let mut last = Ok(());
        while start.elapsed() < Duration::from_secs(20) {
            last = f.write_at(0, &buf, 0, 8 << 20).and_then(|()| f.flush());
            if last.is_err() {
                break;
            }
        }
        (last, start.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    s.server.take().unwrap().shutdown();
    let (r, _) = writer.join().unwrap();
    let e = r.unwrap_err();
    assert!(matches!(e.errno(), Errno::EIO | Errno::ENOTCONN), "{e:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "took {:?}",
        t0.elapsed()
    );
    let later = c.getattr(c.root().node).unwrap_err();
    assert_eq!(later.errno(), Errno::ENOTCONN, "{later:?}");
}

/// Writes and reads whose one-sided operation cannot even be posted (the connection is
/// closed) fail at once and leave the file idle: a later flush reports the failure instead
/// of waiting for writes that are not in flight. (The failed post was once counted back
/// twice: the file then looked busy for ever, and a mount's `fsync` or `close` never ended.)
#[test]
fn operations_refused_at_posting_leave_the_file_idle() {
    let s = setup(false);
    let mut cfg = ClientConfig::new(s.rails.clone());
    cfg.op_timeout = Duration::from_secs(20);
    let c = Client::connect(&s.ctx, &cfg).unwrap();
    let (_, f) = c.create(c.root().node, b"f", 0o644, libc::O_RDWR).unwrap();
    let buf = s.ctx.alloc_region(1 << 20, Access::LOCAL_WRITE).unwrap();
    // The file's size and registration are known: the next writes go straight to posting.
    f.write_at(0, &buf, 0, 1 << 20).unwrap();
    f.flush().unwrap();
    c.close();
    for _ in 0..3 {
        let e = f.write_at(0, &buf, 0, 1 << 20).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOTCONN, "{e:?}");
        let e = f.read_at(0, &buf, 0, 4096).unwrap_err();
        assert_eq!(e.errno(), Errno::ENOTCONN, "{e:?}");
    }
    // A file left busy would hold the flush until the client gives up waiting for its
    // writes (op_timeout, 20 s here); an idle one fails at once, on the closed connection.
    let t = Instant::now();
    let e = f.flush().unwrap_err();
    assert!(
        !matches!(e, Error::Timeout(_)),
        "the file stayed busy: {e:?}"
    );
    assert_eq!(e.errno(), Errno::ENOTCONN, "{e:?}");
    assert!(
        t.elapsed() < cfg.op_timeout,
        "the flush waited {:?} for writes that were not in flight",
        t.elapsed()
    );
}

/// A local process truncates the file on the server under a client: reads past the new end
/// are short, a write past it grows the file again; the server takes no SIGBUS.
#[test]
fn truncated_on_the_server_under_a_client() {
    let s = setup(false);
    let c = s.client();
    let (_, f) = c.create(c.root().node, b"t", 0o644, libc::O_RDWR).unwrap();
    let data = pattern(8 << 20, 1);
    f.write_all_at(0, &data).unwrap();
    f.flush().unwrap();
    assert_eq!(f.size(), 8 << 20);
    std::fs::OpenOptions::new()
        .write(true)
        .open(s.root.join("t"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let buf = s.ctx.alloc_region(1 << 20, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        f.read_at(6 << 20, &buf, 0, 1 << 20).unwrap(),
        0,
        "past the new end: nothing"
    );
    assert_eq!(f.read_at(0, &buf, 0, 8192).unwrap(), 4096);
    f.write_at(7 << 20, &buf, 0, 1 << 20).unwrap();
    f.flush().unwrap();
    assert_eq!(std::fs::metadata(s.root.join("t")).unwrap().len(), 8 << 20);
    // The server still serves.
    assert!(c.getattr(c.root().node).is_ok());
}

/// Many requests at once from one client: more than the server's receive buffers, so the
/// client's backlog is used, and replies race the next requests; none is lost and the
/// connection stays up.
#[test]
fn many_concurrent_requests() {
    let s = setup(false);
    let c = s.client();
    let root = c.root().node;
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..500 {
                    c.getattr(root).unwrap();
                }
            })
        })
        .collect();
    // And asynchronous ones beyond the slots, all answered.
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..200 {
        let tx = tx.clone();
        c.call_async(
            &braid_fs::proto::Request::GetAttr { node: root },
            move |r| {
                tx.send(r.is_ok()).unwrap();
            },
        );
    }
    for t in threads {
        t.join().unwrap();
    }
    for _ in 0..200 {
        assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
    }
    assert!(c.is_connected());
}
