//! Registered memory and the registry that the target side checks every access against.

pub(crate) mod access;
pub(crate) mod file;
pub(crate) mod inner;
pub mod region;
pub mod registry;

pub use region::{Access, Region, RegionOptions, RemoteKey, RemoteSge, Sge};
pub use registry::Registry;
