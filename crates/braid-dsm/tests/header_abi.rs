//! The C header and the library agree: a C file including `include/braid/dsm.h` must
//! compile with every function assigned to a pointer of the exact type the Rust side
//! exports, and its constants must equal Rust's.

use std::path::PathBuf;
use std::process::Command;

use braid_dsm::capi::*;

#[test]
fn header_matches_rust() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("dsm-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("abi.c");
    std::fs::write(
        &c,
        r#"
#include <stdio.h>
#include <braid/dsm.h>
#define P(x) printf(#x " %ld\n", (long)(x))
int main(void) {
    int (*i0)(void) = braid_dsm_init; (void)i0;
    i0 = braid_dsm_rank; i0 = braid_dsm_size; i0 = braid_dsm_barrier; i0 = braid_dsm_finalize;
    void *(*al)(size_t) = braid_dsm_alloc; (void)al;
    void *(*ap)(size_t, int) = braid_dsm_alloc_policy; (void)ap;
    void (*fr)(void *) = braid_dsm_free; (void)fr;
    int (*lk)(unsigned) = braid_dsm_lock; lk = braid_dsm_unlock; (void)lk;
    size_t (*ps)(void) = braid_dsm_page_size; (void)ps;
    const char *(*le)(void) = braid_dsm_last_error; (void)le;
    int (*sj)(char *, size_t) = braid_dsm_stats_json; (void)sj;
    P(BRAID_DSM_HOME_DEFAULT); P(BRAID_DSM_HOME_BLOCK); P(BRAID_DSM_HOME_CYCLIC);
    P(BRAID_DSM_EXIT_UNSERVABLE);
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("abi");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        // Only compiled and run for the constants: the unresolved functions are never
        // called, so link lazily against nothing.
        .args(["-Wl,--unresolved-symbols=ignore-all"])
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    let got: Vec<(String, i64)> = text
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect();
    let want = [
        ("BRAID_DSM_HOME_DEFAULT", BRAID_DSM_HOME_DEFAULT as i64),
        ("BRAID_DSM_HOME_BLOCK", BRAID_DSM_HOME_BLOCK as i64),
        ("BRAID_DSM_HOME_CYCLIC", BRAID_DSM_HOME_CYCLIC as i64),
        (
            "BRAID_DSM_EXIT_UNSERVABLE",
            braid_dsm::EXIT_STATUS_UNSERVABLE as i64,
        ),
    ];
    for (k, v) in want {
        assert!(
            got.contains(&(k.to_string(), v)),
            "{k}: C says {got:?}, Rust {v}"
        );
    }
    // The Rust side's functions have the header's types too.
    let _: extern "C" fn() -> i32 = braid_dsm_init;
    let _: extern "C" fn(usize) -> *mut std::ffi::c_void = braid_dsm_alloc;
    let _: extern "C" fn(usize, i32) -> *mut std::ffi::c_void = braid_dsm_alloc_policy;
    let _: extern "C" fn(*mut std::ffi::c_void) = braid_dsm_free;
    let _: extern "C" fn(u32) -> i32 = braid_dsm_lock;
    let _: extern "C" fn(u32) -> i32 = braid_dsm_unlock;
    let _: extern "C" fn() -> usize = braid_dsm_page_size;
    let _: extern "C" fn() -> *const std::ffi::c_char = braid_dsm_last_error;
    let _: unsafe extern "C" fn(*mut std::ffi::c_char, usize) -> i32 = braid_dsm_stats_json;
    let _ = std::fs::remove_dir_all(&dir);
}
