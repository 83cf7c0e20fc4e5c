//! # braid-dsm
//!
//! A sequentially consistent, page-based distributed shared memory on braid.

#![warn(missing_docs)]

pub mod proto;
