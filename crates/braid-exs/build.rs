//! Gives the C shared library (the cdylib) its SONAME, `libexs.so.MAJOR`, so that programs
//! linked against an installed copy (scripts/install.sh) load a library of the ABI they were
//! built for, and the `.so` -> `.so.MAJOR` -> `.so.VERSION` symlinks work.

fn main() {
    // braid is Linux-only; the flag is GNU ld's (also understood by lld and mold).
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("set by cargo");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libexs.so.{major}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
