//! braid-fs's request *handling* (`Export::handle`) on a real export directory, fed a
//! stream of requests as a hostile client would send them.
//!
//! Input: records of a 2-byte little-endian length and that many bytes of one request
//! message (decoded with `decode_request`; records that do not decode are skipped). Node
//! handles whose generation is 0 get the export's generation (ids are small and sequential,
//! so the fuzzer reaches real objects); file sizes, offsets and append reservations are taken
//! modulo 16 MiB and the sync bits of `Commit` are cleared, to keep each run short and small.
//!
//! Each input gets a fresh export (`<tmp>/export`, with a file, a directory, a symlink out
//! and one in, a FIFO) beside `<tmp>/outside/secret`. Checked after every input: no panic; no
//! block or character device, no set-user-id file and nothing that is not from the seed
//! tree anywhere but inside the export; `outside/secret` unchanged.
#![no_main]

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use braid_fs::proto::{COMMIT_DATASYNC, COMMIT_SYNC, NodeId, Request, decode_request};
use braid_fs::server::fuzzing::FuzzExport;
use libfuzzer_sys::fuzz_target;

const SIZE_MASK: u64 = (16 << 20) - 1;

fn fix(n: &mut NodeId, generation: u64) {
    if n.generation == 0 {
        n.generation = generation;
    }
}

/// Points the request's handles at this export and bounds its sizes.
fn tame(req: &mut Request, g: u64) {
    match req {
        Request::Lookup { parent, .. }
        | Request::Walk { parent, .. }
        | Request::Mknod { parent, .. }
        | Request::Mkdir { parent, .. }
        | Request::Unlink { parent, .. }
        | Request::Rmdir { parent, .. }
        | Request::Symlink { parent, .. }
        | Request::Create { parent, .. } => fix(parent, g),
        Request::Rename {
            parent, new_parent, ..
        } => {
            fix(parent, g);
            fix(new_parent, g);
        }
        Request::Link {
            node, new_parent, ..
        } => {
            fix(node, g);
            fix(new_parent, g);
        }
        Request::Forget { items } => items.iter_mut().for_each(|(n, _)| fix(n, g)),
        Request::GetAttr { node }
        | Request::ReadLink { node }
        | Request::Open { node, .. }
        | Request::OpenDir { node } => fix(node, g),
        Request::SetAttr { node, set, .. } => {
            fix(node, g);
            if let Some(s) = set.size.as_mut() {
                *s &= SIZE_MASK;
            }
        }
        Request::MapRegion { min_size, .. } => *min_size &= SIZE_MASK,
        Request::Write { offset, .. } => *offset &= SIZE_MASK,
        Request::Append { reserve, .. } => *reserve &= SIZE_MASK,
        Request::Commit { flags, .. } => *flags &= !(COMMIT_SYNC | COMMIT_DATASYNC),
        _ => {}
    }
}

fn seed(root: &Path) {
    let ex = root.join("export");
    std::fs::create_dir_all(ex.join("dir")).unwrap();
    std::fs::create_dir_all(root.join("outside")).unwrap();
    std::fs::write(root.join("outside/secret"), b"outside").unwrap();
    std::fs::write(ex.join("file"), b"0123456789").unwrap();
    std::os::unix::fs::symlink("../outside/secret", ex.join("out")).unwrap();
    std::os::unix::fs::symlink("file", ex.join("in")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        &ex.join("fifo"),
        rustix::fs::Mode::from_raw_mode(0o666),
    )
    .unwrap();
}

/// The invariants of the module docs, over everything under `dir`.
fn check(dir: &Path, inside: bool) {
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        let kind = md.mode() & libc::S_IFMT;
        assert!(
            kind != libc::S_IFBLK && kind != libc::S_IFCHR,
            "a device node: {}",
            e.path().display()
        );
        assert!(
            md.mode() & libc::S_ISUID == 0,
            "a set-user-id file: {}",
            e.path().display()
        );
        let name = e.file_name();
        if !inside {
            assert!(
                name == "export" || name == "outside" || name == "secret",
                "created outside the export: {}",
                e.path().display()
            );
        }
        if md.is_dir() {
            check(&e.path(), inside || name == "export");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let base = if Path::new("/dev/shm").is_dir() {
        "/dev/shm"
    } else {
        "/tmp"
    };
    let tmp = tempfile::Builder::new()
        .prefix("fs-handle-")
        .tempdir_in(base)
        .unwrap();
    seed(tmp.path());
    {
        let ex = FuzzExport::new(&tmp.path().join("export")).unwrap();
        let g = ex.generation().unwrap();
        let mut rest = data;
        while rest.len() >= 2 {
            let len = u16::from_le_bytes([rest[0], rest[1]]) as usize;
            let body = &rest[2..];
            let (msg, next) = body.split_at(len.min(body.len()));
            rest = next;
            if let Ok((_, _, mut req)) = decode_request(msg) {
                tame(&mut req, g);
                let _ = ex.handle(req);
            }
        }
    }
    check(tmp.path(), false);
    assert_eq!(
        std::fs::read(tmp.path().join("outside/secret")).unwrap(),
        b"outside"
    );
});
