//! Registered memory and the registry that the target side checks every access against.

pub(crate) mod access;
pub mod file;
pub(crate) mod inner;
pub mod region;
pub mod registry;
pub mod shared;

pub use region::{Access, Region, RegionOptions, RemoteKey, RemoteSge, Sge};
pub use registry::Registry;

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Where braid (this crate and its driver, the `braid` crate beside it) may build a
    /// slice over raw memory: never over registered memory, which a peer may be writing (the
    /// rule of [`super::region`]). Each entry is a file under `crates/` and how many
    /// `slice::from_raw_parts` calls it holds, all over private memory.
    const ALLOWED: &[(&str, usize, &str)] = &[
        (
            "braid-proto/src/proto/spans.rs",
            1,
            "copy_out's destination, private by its contract",
        ),
        (
            "braid-proto/src/proto/session/staging.rs",
            1,
            "StagingBuf::bytes: the buffer's own heap",
        ),
        (
            "braid-proto/src/proto/session/transmit.rs",
            1,
            "a StagingBuf filled from file pages",
        ),
        (
            "braid-proto/src/proto/session/testkit.rs",
            1,
            "the unit-test harness",
        ),
        (
            "braid/src/engine/shm/express.rs",
            1,
            "an express request's payload, copied out of the ring onto the reader's stack",
        ),
    ];

    fn scan(dir: &Path, root: &Path, found: &mut Vec<(String, usize)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                scan(&path, root, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                let needle = ["slice::", "from_raw_parts"].concat();
                let n = text
                    .lines()
                    .filter(|l| !l.trim_start().starts_with("//") && l.contains(&needle))
                    .count();
                if n > 0 {
                    let rel = path
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    found.push((rel, n));
                }
            }
        }
    }

    #[test]
    fn no_slice_is_built_over_registered_memory() {
        let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut found = Vec::new();
        for krate in ["braid-proto", "braid"] {
            scan(&crates.join(krate).join("src"), &crates, &mut found);
        }
        found.sort();
        let mut allowed: Vec<(String, usize)> = ALLOWED
            .iter()
            .map(|&(f, n, _)| (f.to_string(), n))
            .collect();
        allowed.sort();
        assert_eq!(
            found, allowed,
            "a new slice over raw memory: copy registered memory out (Region::read_at, \
             mem::file::crc32c_raw) instead, or add a private-memory use to ALLOWED"
        );
    }
}
