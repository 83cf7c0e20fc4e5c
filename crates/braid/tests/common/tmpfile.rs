//! Temporary files for file-region tests, removed on drop (also when a test fails).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

pub struct TempFile {
    pub path: PathBuf,
    pub file: File,
}

impl TempFile {
    /// A new file holding `data`, opened read-write.
    pub fn with(data: &[u8]) -> TempFile {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "braid-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.write_all_at(data, 0).unwrap();
        TempFile { path, file }
    }

    /// The same file opened read-only.
    pub fn read_only(&self) -> File {
        File::open(&self.path).unwrap()
    }

    pub fn pread(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.file.read_exact_at(&mut v, off).unwrap();
        v
    }

    pub fn pwrite(&self, off: u64, data: &[u8]) {
        self.file.write_all_at(data, off).unwrap();
    }

    pub fn set_len(&self, len: u64) {
        self.file.set_len(len).unwrap();
    }

    pub fn len(&self) -> u64 {
        self.file.metadata().unwrap().len()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
