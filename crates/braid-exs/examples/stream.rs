//! braid-exs on a loopback stream: an asynchronous `exs` sender against a plain `read()`
//! receiver, then a plain `write()` sender against an `exs` receiver.
//!
//! `cargo run -p braid-exs --example stream`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use exs::{Buffer, EventKind, Queue, Registration};

fn fnv1a(h: u64, d: &[u8]) -> u64 {
    d.iter()
        .fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

const FNV: u64 = 0xcbf2_9ce4_8422_2325;
const TOTAL: usize = 16 << 20;
const CHUNK: usize = 256 << 10;

fn main() -> std::io::Result<()> {
    exs::init()?;
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(l.local_addr()?)?;
    let (mut b, _) = l.accept()?;
    b.set_read_timeout(Some(Duration::from_secs(30)))?;
    let data: Vec<u8> = (0..TOTAL).map(|i| (i * 31 % 251) as u8).collect();
    let want = fnv1a(FNV, &data);

    // 1. exs sender (4 registered buffers in flight) → plain receiver.
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let (mut n, mut h) = (0, FNV);
        while n < TOTAL {
            let k = b.read(&mut buf).expect("read");
            assert!(k > 0, "early end of stream");
            h = fnv1a(h, &buf[..k]);
            n += k;
        }
        (h, b)
    });
    let q = Queue::new(4)?;
    let mut free: Vec<Registration> = (0..4)
        .map(|_| Registration::zeroed(CHUNK))
        .collect::<Result<_, _>>()?;
    let (mut off, mut inflight) = (0, 0);
    while off < TOTAL || inflight > 0 {
        if off < TOTAL
            && let Some(mut r) = free.pop()
        {
            r.as_mut_slice().copy_from_slice(&data[off..off + CHUNK]);
            match q.send(&a, r, off as u64) {
                Ok(()) => {
                    off += CHUNK;
                    inflight += 1;
                    continue;
                }
                Err(rej) if rej.is_would_block() => {
                    free.push(rej.buffer.into_registration().unwrap())
                }
                Err(rej) => return Err(rej.error),
            }
        }
        for e in q.dequeue(4, Some(Duration::from_secs(10)))? {
            assert_eq!(e.kind(), EventKind::Send);
            e.result()?;
            inflight -= 1;
            free.push(e.into_buffer().unwrap().into_registration().unwrap());
        }
    }
    let (got, mut b) = reader.join().unwrap();
    assert_eq!(got, want, "checksum mismatch (exs → plain)");
    println!("exs_send → read(): {TOTAL} bytes, fnv1a {got:016x} ok");

    // 2. plain sender → exs receiver, until the peer closes.
    let d2 = data.clone();
    let writer = std::thread::spawn(move || {
        b.write_all(&d2).expect("write");
    });
    let (mut n, mut h) = (0, FNV);
    let mut buf = Buffer::from(Registration::zeroed(CHUNK)?);
    loop {
        if let Err(rej) = q.recv(&a, buf, 0) {
            return Err(rej.error);
        }
        let e = q
            .dequeue_one(Some(Duration::from_secs(10)))?
            .expect("recv event");
        let k = e.result()?;
        buf = e.into_buffer().unwrap();
        if k == 0 {
            break;
        }
        h = fnv1a(h, &buf.as_slice()[..k]);
        n += k;
        if n == TOTAL {
            break;
        }
    }
    writer.join().unwrap();
    assert_eq!((n, h), (TOTAL, want), "checksum mismatch (plain → exs)");
    println!("write() → exs_recv: {n} bytes, fnv1a {h:016x} ok");
    Ok(())
}
