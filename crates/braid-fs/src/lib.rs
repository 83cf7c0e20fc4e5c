//! # braid-fs
//!
//! A remote file service on braid (see the repository's `docs/FS.md`).

#![warn(missing_docs)]

pub mod client;
pub mod mount;
pub mod proto;
pub mod server;
