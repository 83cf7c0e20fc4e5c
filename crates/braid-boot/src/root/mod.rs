//! The rendezvous, hosted by rank 0: a sans-IO core and its socket driver.

pub(crate) mod core;
pub(crate) mod event;
mod greet;
pub(crate) mod server;
