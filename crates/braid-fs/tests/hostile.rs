//! The server against peers that connect and say nothing, or hoard handles (issue 39,
//! findings 6 and 8): bounded by the descriptor limit, and a real client is still served.

use std::time::{Duration, Instant};

use braid::{Access, CompletionQueue, Context, Endpoint, EndpointOptions, RailAddr, RailTransport};
use braid_fs::client::{Client, ClientConfig, DirIter, Error};
use braid_fs::proto::{self, Errno, HelloReply, Op, Reply, Request, Role};
use braid_fs::server::{Server, ServerConfig, Squash};

struct Setup {
    _dir: tempfile::TempDir,
    server: Server,
    rails: Vec<RailAddr>,
    /// The peers' own context (not the server's).
    ctx: Context,
}

fn setup(tweak: impl FnOnce(&mut ServerConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = ServerConfig::new(dir.path(), vec!["127.0.0.1:0".parse().unwrap()]);
    // The tests run as root and own the export: trust root, as NFS's no_root_squash.
    cfg.squash = Squash::None;
    tweak(&mut cfg);
    let server = Server::start(&Context::new().unwrap(), cfg).unwrap();
    let rails = server
        .local_addrs()
        .iter()
        .map(|a| format!("{}={a}", a.ip()).parse().unwrap())
        .collect();
    Setup {
        _dir: dir,
        server,
        rails,
        ctx: Context::new().unwrap(),
    }
}

impl Setup {
    /// An endpoint that never says `Hello`.
    fn silent(&self) -> Endpoint {
        self.raw().0
    }

    /// An endpoint of a peer speaking the protocol itself, and its completion queue.
    fn raw(&self) -> (Endpoint, CompletionQueue) {
        let cq = self.ctx.create_cq(16);
        let mut opts = EndpointOptions::new(&cq);
        opts.transport = RailTransport::Tcp;
        (self.ctx.connect(&self.rails, &opts).unwrap(), cq)
    }

    /// Says `Hello` on a new raw endpoint; the server's answer, and the endpoint.
    fn hello(&self, role: Role, session: u64) -> (Result<HelloReply, Errno>, Endpoint) {
        let (ep, cq) = self.raw();
        let buf = self.ctx.alloc_region(8192, Access::LOCAL_WRITE).unwrap();
        ep.post_recv(2, &[buf.slice(4096, 4096).unwrap()]).unwrap();
        let hello = Request::Hello {
            version: proto::VERSION,
            role,
            session,
        };
        let msg = proto::encode_request(7, &proto::Caller::default(), &hello).unwrap();
        buf.write_at(0, &msg).unwrap();
        ep.send(1, &[buf.slice(0, msg.len()).unwrap()]).unwrap();
        loop {
            let c = cq.wait(Duration::from_secs(10)).expect("a hello reply");
            assert!(c.status.is_ok(), "{c:?}");
            if c.wr_id == 2 {
                let bytes = buf.to_vec(4096, c.byte_len as usize).unwrap();
                return match proto::decode_reply(&bytes).unwrap() {
                    (7, Op::Hello, Ok(Reply::Hello(h))) => (Ok(h), ep),
                    (7, Op::Hello, Err(e)) => (Err(e), ep),
                    other => panic!("{other:?}"),
                };
            }
        }
    }

    fn client(&self) -> Client {
        let mut cfg = ClientConfig::new(self.rails.clone());
        cfg.session.peer_timeout = Duration::from_secs(2);
        Client::connect(&self.ctx, &cfg).unwrap()
    }
}

/// Polls `cond` until it holds, for at most 20 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client that writes and reads back a file, intact.
fn served(c: &Client, name: &str) {
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 13) as u8).collect();
    let (_, f) = c
        .create(c.root().node, name.as_bytes(), 0o644, libc::O_RDWR)
        .unwrap();
    f.write_all_at(0, &data).unwrap();
    assert_eq!(f.read_vec(0, data.len()).unwrap(), data);
}

#[test]
fn endpoints_that_say_no_hello_are_closed_after_the_timeout() {
    let s = setup(|c| c.hello_timeout = Duration::from_millis(300));
    let silent: Vec<Endpoint> = (0..3).map(|_| s.silent()).collect();
    let client = s.client();
    wait_for("the silent endpoints to be closed", || {
        silent.iter().all(|e| e.is_closed())
    });
    // The client's two endpoints stay.
    assert_eq!(s.server.endpoints(), 2);
    served(&client, "after");
}

#[test]
fn a_flood_of_silent_endpoints_leaves_room_for_a_client() {
    // 256 descriptors: 64 reserved, 12 endpoints of 4 descriptors (docs/FS.md).
    let s = setup(|c| {
        c.fd_limit = Some(256);
        c.hello_timeout = Duration::from_secs(600);
    });
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(s.silent());
        assert!(s.server.endpoints() <= 12, "{}", s.server.endpoints());
    }
    wait_for("the oldest silent endpoints to be closed", || {
        silent.iter().filter(|e| e.is_closed()).count() >= 40 - 12
    });
    let client = s.client();
    served(&client, "during");
    assert!(s.server.endpoints() <= 12);
    // A second client too: the silent ones make room, clients do not.
    let other = s.client();
    served(&other, "other");
    assert!(s.server.endpoints() <= 12);
}

#[test]
fn a_client_hoarding_handles_gets_emfile_and_others_are_served() {
    // 256 descriptors: a pool of 144, 18 handles per client.
    let s = setup(|c| c.fd_limit = Some(256));
    let hoarder = s.client();
    let root = hoarder.root().node;
    let mut held = Vec::new();
    let err = loop {
        match DirIter::open(&hoarder, root) {
            Ok(d) => held.push(d),
            Err(e) => break e,
        }
        assert!(held.len() <= 18, "no cap");
    };
    assert!(
        matches!(err, Error::Remote(Errno::EMFILE)),
        "{err} after {}",
        held.len()
    );
    assert_eq!(held.len(), 18);
    // The hoarder's connection is fine, and so is everyone else.
    hoarder.getattr(root).unwrap();
    let other = s.client();
    served(&other, "other");
    let _d = DirIter::open(&other, other.root().node).unwrap();
    // Handles given back can be taken again.
    held.pop();
    wait_for("a released handle to be given back", || {
        DirIter::open(&hoarder, root).map(|d| held.push(d)).is_ok()
    });
}

#[test]
fn a_write_far_past_the_end_grows_the_file_in_bounded_steps() {
    let s = setup(|_| {});
    let c = s.client();
    let (_, f) = c
        .create(c.root().node, b"sparse", 0o644, libc::O_RDWR)
        .unwrap();
    // Past the registration and more than one growth step (1 GiB) away.
    let at = (3 << 30) + 5;
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 31) as u8).collect();
    f.write_all_at(at, &data).unwrap();
    assert_eq!(f.attr().unwrap().size, at + data.len() as u64);
    assert_eq!(f.read_vec(at, data.len()).unwrap(), data);
    assert_eq!(f.read_vec(1 << 30, 8).unwrap(), vec![0; 8]);
}

#[test]
fn session_tokens_are_random_and_a_data_endpoint_attaches_once() {
    let s = setup(|_| {});
    let (a, _ea) = s.hello(Role::Meta, 0);
    let (b, _eb) = s.hello(Role::Meta, 0);
    let (a, b) = (a.unwrap(), b.unwrap());
    // Not a counter, not derived from what every client is told (the handles' generation).
    let generation = a.root.node.generation;
    for t in [a.session, b.session] {
        assert!((t ^ generation) > 1 << 32, "{t:#x} ^ {generation:#x}");
    }
    assert!((a.session ^ b.session).count_ones() > 4);
    // A guessed token is refused; the right one attaches one data endpoint, once.
    let (guess, _) = s.hello(Role::Data, b.session ^ 1);
    assert_eq!(guess.err(), Some(Errno::EACCES));
    let (first, _d1) = s.hello(Role::Data, a.session);
    assert!(first.is_ok());
    let (second, _d2) = s.hello(Role::Data, a.session);
    assert_eq!(second.err(), Some(Errno::EACCES));
    // A real client's data endpoint cannot be doubled either, and it is still served.
    let c = s.client();
    served(&c, "real");
}
