#![allow(dead_code)]
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A connected loopback pair (client, server side), with bounded blocking I/O on both.
pub fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    for t in [&c, &s] {
        t.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        t.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    }
    (c, s)
}

pub use braid_testkit::pattern::pattern;

pub fn fnv1a(h: u64, data: &[u8]) -> u64 {
    data.iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

pub const FNV_INIT: u64 = 0xcbf2_9ce4_8422_2325;

pub fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

pub fn ts(ms: u64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ms / 1000) as _,
        tv_nsec: ((ms % 1000) * 1_000_000) as _,
    }
}
