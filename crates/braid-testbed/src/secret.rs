//! The cluster secret a test or benchmark harness hands the braid processes it starts in a
//! testbed: testbed addresses are not loopback ones, so braid authenticates them.

/// The cluster secret of the braid processes this process starts in a testbed (fresh random
/// for each harness process): [`Testbed::command`](crate::Testbed::command) hands it to children as `BRAID_SECRET`,
/// and in-process contexts of the harness use it too, so both ends authenticate.
pub fn harness_secret() -> &'static str {
    static SECRET: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SECRET.get_or_init(|| {
        let mut b = [0u8; 32];
        let filled = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
        if filled.is_err() {
            // No urandom: still unique per process and moment (the harness's own network).
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            b[..16].copy_from_slice(&t.to_le_bytes());
            b[16..20].copy_from_slice(&std::process::id().to_le_bytes());
        }
        b.iter().map(|x| format!("{x:02x}")).collect()
    })
}
