//! Authentication on by default: `braid fs serve` without a cluster secret refuses an
//! address that is not a loopback one, saying how to make a secret, unless told
//! `--insecure`. Every child is bounded and killed by its pid.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_braid");

fn serve(dir: &std::path::Path, extra: &[&str]) -> Command {
    let mut c = Command::new(EXE);
    c.args(["fs", "serve", "--export"])
        .arg(dir)
        .args(["--listen", "0.0.0.0:0"])
        .args(extra)
        .env_remove("BRAID_SECRET")
        .env_remove("BRAID_SECRET_FILE")
        .env_remove("BRAID_INSECURE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("braid-secure-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn fs_serve_without_a_secret_refuses_a_non_loopback_address() {
    let dir = temp_dir("refuse");
    let mut child = serve(&dir, &[]).spawn().unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("braid fs serve kept running without a secret on 0.0.0.0");
        }
        // Polling the child's exit, bounded above.
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(!status.success(), "{err}");
    assert!(
        err.contains("without a cluster secret")
            && err.contains("BRAID_SECRET_FILE")
            && err.contains("--insecure"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fs_serve_insecure_starts_with_a_warning() {
    let dir = temp_dir("insecure");
    let mut child = serve(&dir, &["--insecure"]).spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        // Until "serving" shows (the server is up) or the pipe closes.
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
            if String::from_utf8_lossy(&all).contains("serving") {
                break;
            }
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let t = Instant::now();
    while !reader.is_finished() && t.elapsed() < Duration::from_secs(20) {
        // Polling the reader, bounded above.
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let err = reader.join().unwrap();
    assert!(err.contains("without authentication"), "{err}");
    assert!(err.contains("serving"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
