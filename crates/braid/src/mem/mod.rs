//! Registered memory and the registry that the target side checks every access against.

pub mod region;
pub mod registry;

pub use region::{Access, Region, RegionOptions, RemoteKey, Sge};
pub use registry::Registry;
