//! Two braid endpoints connected over loopback rails (127.0.0.1, 127.0.0.2, ...: one local
//! address per rail, as one NIC per rail), for tests and examples that need a live pair.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use braid::{
    Completion, CompletionQueue, Context, ContextConfig, Endpoint, EndpointOptions, RailAddr,
    Status,
};

/// How long a test waits for a completion or a connection before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// A connected pair: each side has its own context (engine thread) and completion queue.
pub struct Pair {
    /// The accepting side's context.
    pub server_ctx: Context,
    /// The connecting side's context.
    pub client_ctx: Context,
    /// The accepting side's completion queue (sends and receives).
    pub server_cq: CompletionQueue,
    /// The connecting side's completion queue (sends and receives).
    pub client_cq: CompletionQueue,
    /// The accepting side's endpoint.
    pub server: Endpoint,
    /// The connecting side's endpoint.
    pub client: Endpoint,
}

/// The local address of rail `i`: 127.0.0.(i+1).
pub fn rail_ip(i: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, (i + 1) as u8))
}

/// A pair over `rails` loopback rails with default options.
pub fn pair(rails: usize) -> Pair {
    pair_with(rails, |_| {})
}

/// A pair over `rails` loopback rails; `tune` adjusts both sides' options. Panics (it is for
/// tests) when the pair cannot be set up within [`WAIT`].
pub fn pair_with(rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    let cfg = ContextConfig::from_env().expect("context settings from the environment");
    pair_in(&cfg, rails, tune)
}

/// [`pair_with`], both contexts made with `cfg`.
pub fn pair_in(cfg: &ContextConfig, rails: usize, tune: impl Fn(&mut EndpointOptions)) -> Pair {
    log_to_test_output();
    let server_ctx = Context::with_config(cfg.clone()).expect("server context");
    let client_ctx = Context::with_config(cfg.clone()).expect("client context");
    let server_cq = server_ctx.create_cq(4096);
    let client_cq = client_ctx.create_cq(4096);
    let addrs: Vec<SocketAddr> = (0..rails).map(|i| SocketAddr::new(rail_ip(i), 0)).collect();
    let listener = server_ctx
        .listen(&addrs)
        .expect("listen on the loopback rails");
    let bound = listener.local_addrs();
    let mut sopts = EndpointOptions::new(&server_cq);
    tune(&mut sopts);
    let accept = std::thread::spawn(move || listener.accept(&sopts, WAIT).expect("accept"));
    let rail_addrs: Vec<RailAddr> = bound
        .iter()
        .enumerate()
        .map(|(i, r)| RailAddr::new(Some(rail_ip(i)), *r))
        .collect();
    let mut copts = EndpointOptions::new(&client_cq);
    tune(&mut copts);
    let client = client_ctx
        .connect(&rail_addrs, &copts)
        .expect("connect over the loopback rails");
    let server = accept.join().expect("the accepting thread");
    Pair {
        server_ctx,
        client_ctx,
        server_cq,
        client_cq,
        server,
        client,
    }
}

/// The next completion of `cq`, waiting at most [`WAIT`].
pub fn next(cq: &CompletionQueue) -> Completion {
    cq.wait(WAIT)
        .expect("no completion within the bounded wait")
}

/// The next completion of `cq`, which must be `wr_id`'s and successful.
pub fn expect_ok(cq: &CompletionQueue, wr_id: u64) -> Completion {
    let c = next(cq);
    assert_eq!(c.wr_id, wr_id, "completion order: {c:?}");
    assert_eq!(c.status, Status::Success, "{c:?}");
    c
}

/// Sends braid's log (warnings and above, or what `RUST_LOG` says) to the test harness's
/// captured output, once per process: a failing test then shows why a rail failed (the
/// engine threads a test starts inherit its capture), a passing one shows nothing.
pub fn log_to_test_output() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .with_ansi(false)
            .try_init();
    });
}
