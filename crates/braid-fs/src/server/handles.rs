//! Handles that outlive the server process.
//!
//! A node id is the object's own inode number (`st_ino`) on the export's file system, and
//! the generation is a tag of the export (its device and root inode), not of the server
//! process. A server started again on the same export therefore gives every object the id
//! it had before, and the ids the kernel of a mount keeps as inode numbers stay valid.
//!
//! A fresh server does not know the objects behind ids handed out before it started. It
//! finds such an object by walking the export (beneath its root, on its device only) for
//! the inode number: a lookup table rebuilt on demand, persisted nowhere. This needs no
//! capability (unlike `open_by_handle_at`, which needs `CAP_DAC_READ_SEARCH` and lets a
//! handle name anything on the file system) and works on every file system. Its costs:
//! a search reads the export's directories (bounded by [`MAX_SCAN`] entries), and an
//! object with no name left in the export (unlinked while open) is not found (`ESTALE`),
//! as an NFS server without silly-rename gives.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{FileType, Mode, OFlags};

use super::openat2_beneath;
use crate::proto::Errno;

/// Most directory entries one search reads before it gives up (`ESTALE`).
pub(crate) const MAX_SCAN: usize = 4_000_000;

/// Deepest directory a search descends into (each level holds one descriptor).
const MAX_DEPTH: usize = 256;

/// Bit set in the ids of objects that cannot have a persistent id (on another device than
/// the export's, or whose inode number collides with the root's id): they are numbered by
/// the server process and go stale when it restarts.
pub(crate) const VOLATILE: u64 = 1 << 63;

/// The generation every handle of the export rooted at `root` (stat `st`) carries: the
/// same for every server process exporting it, different for another export.
pub(crate) fn export_tag(st: &rustix::fs::Stat) -> u64 {
    // SplitMix64 finaliser over (dev, ino): well spread, stable, never 0 in practice.
    let mut z = st.st_dev ^ st.st_ino.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The persistent id of an object with inode number `ino` on device `dev`, if it can have
/// one (`root_ino`: the export root's, whose id is always 1).
pub(crate) fn persistent_id(export_dev: u64, root_ino: u64, dev: u64, ino: u64) -> Option<u64> {
    let ok = dev == export_dev && ino != root_ino && ino > 1 && ino & VOLATILE == 0;
    ok.then_some(ino)
}

/// Searches the tree beneath `root` (an `O_PATH` directory) for the object on device `dev`
/// with inode number `ino`; returns its `O_PATH | O_NOFOLLOW` descriptor. `Ok(None)` when
/// there is none; `ESTALE` when the search was cut short by its bounds.
pub(crate) fn find_beneath(root: &OwnedFd, dev: u64, ino: u64) -> Result<Option<OwnedFd>, Errno> {
    let mut stack: Vec<(OwnedFd, rustix::fs::Dir)> = Vec::new();
    let dir = list(root)?;
    stack.push((
        rustix::fs::openat(root, ".", path_flags(), Mode::empty())?,
        dir,
    ));
    let mut read = 0usize;
    let mut cut = false;
    while let Some((fd, dir)) = stack.last_mut() {
        let Some(entry) = dir.next() else {
            stack.pop();
            continue;
        };
        // An entry that vanished or cannot be read is skipped, as a concurrent unlink is.
        let Ok(entry) = entry else { continue };
        read += 1;
        if read > MAX_SCAN {
            cut = true;
            break;
        }
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let maybe_dir = matches!(entry.file_type(), FileType::Directory | FileType::Unknown);
        if entry.ino() != ino && !maybe_dir {
            continue;
        }
        let Ok(child) = openat2_beneath(fd.as_fd(), entry.file_name(), path_flags(), Mode::empty())
        else {
            continue;
        };
        let Ok(st) = rustix::fs::fstat(&child) else {
            continue;
        };
        if st.st_dev != dev {
            // Another file system mounted inside the export: its objects have volatile ids.
            continue;
        }
        if st.st_ino == ino {
            return Ok(Some(child));
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            if stack.len() >= MAX_DEPTH {
                cut = true;
                continue;
            }
            if let Ok(d) = list(&child) {
                stack.push((child, d));
            }
        }
    }
    if cut { Err(Errno::ESTALE) } else { Ok(None) }
}

/// A listing of the directory `dir` (an `O_PATH` descriptor, which cannot be read itself).
fn list(dir: &OwnedFd) -> Result<rustix::fs::Dir, Errno> {
    let fd = rustix::fs::openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(rustix::fs::Dir::new(fd)?)
}

fn path_flags() -> OFlags {
    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_path(p: &std::path::Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::PATH | OFlags::CLOEXEC, Mode::empty()).unwrap()
    }

    #[test]
    fn finds_a_deep_file_and_nothing_outside() {
        let d = tempfile::tempdir().unwrap();
        let export = d.path().join("export");
        std::fs::create_dir_all(export.join("a/b/c")).unwrap();
        std::fs::write(export.join("a/b/c/f"), b"x").unwrap();
        std::fs::write(d.path().join("outside"), b"y").unwrap();
        let root = open_path(&export);
        let st = rustix::fs::stat(export.join("a/b/c/f")).unwrap();
        let found = find_beneath(&root, st.st_dev, st.st_ino).unwrap().unwrap();
        assert_eq!(rustix::fs::fstat(&found).unwrap().st_ino, st.st_ino);
        let out = rustix::fs::stat(d.path().join("outside")).unwrap();
        assert!(
            find_beneath(&root, out.st_dev, out.st_ino)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn ids_are_persistent_only_on_the_export_device() {
        assert_eq!(persistent_id(5, 2, 5, 77), Some(77));
        assert_eq!(persistent_id(5, 2, 6, 77), None);
        assert_eq!(persistent_id(5, 77, 5, 77), None);
        assert_eq!(persistent_id(5, 2, 5, 1), None);
        assert_eq!(persistent_id(5, 2, 5, VOLATILE | 3), None);
    }

    #[test]
    fn a_fresh_server_resolves_the_ids_of_the_previous_one() {
        use crate::proto::{Errno, Reply, Request};
        use crate::server::export::{ClientState, Export};
        use parking_lot::Mutex;

        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("x/y")).unwrap();
        std::fs::write(d.path().join("x/y/kept"), b"kept").unwrap();
        std::fs::write(d.path().join("x/gone"), b"gone").unwrap();
        let ctx = braid::Context::new().unwrap();
        let walk = |e: &Export, cs: &Mutex<ClientState>, p: &str| {
            let req = Request::Walk {
                parent: e.root().unwrap().node,
                path: p.as_bytes().to_vec(),
                follow: false,
            };
            match e.handle(cs, req).unwrap() {
                Reply::Entry(en) => en,
                other => panic!("unexpected {other:?}"),
            }
        };
        let first = Export::new(ctx.clone(), d.path(), false).unwrap();
        let cs = Mutex::new(ClientState::default());
        let kept = walk(&first, &cs, "x/y/kept");
        let gone = walk(&first, &cs, "x/gone");
        let root = first.root().unwrap().node;
        drop(first);
        std::fs::remove_file(d.path().join("x/gone")).unwrap();

        let second = Export::new(ctx, d.path(), false).unwrap();
        let cs2 = Mutex::new(ClientState::default());
        assert_eq!(
            second.root().unwrap().node,
            root,
            "the root's handle changed"
        );
        match second.handle(&cs2, Request::GetAttr { node: kept.node }) {
            Ok(Reply::Attr(a)) => assert_eq!(a.ino, kept.attr.ino),
            other => panic!("the old handle does not resolve: {other:?}"),
        }
        assert_eq!(
            second
                .handle(&cs2, Request::GetAttr { node: gone.node })
                .unwrap_err(),
            Errno::ESTALE
        );
        // A later lookup gives the same handle the previous server gave.
        assert_eq!(walk(&second, &cs2, "x/y/kept").node, kept.node);
    }
}
