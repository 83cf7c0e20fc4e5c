//! Errors of opening and driving a port.

use std::io;

use crate::mode::XdpMode;

/// What went wrong with an AF_XDP port.
#[derive(Debug, thiserror::Error)]
pub enum XdpError {
    /// The interface name does not exist in the calling thread's network namespace.
    #[error("no network interface {0:?} here")]
    NoInterface(String),
    /// A `bpf` system call failed (`EPERM`: needs `CAP_BPF` and `CAP_NET_ADMIN`, or root).
    #[error("{0}: {1}")]
    Bpf(&'static str, #[source] io::Error),
    /// The kernel's verifier refused the steering program; its log follows.
    #[error("the kernel refused the XDP program ({0}): {1}")]
    Verifier(#[source] io::Error, String),
    /// The program could not be attached (`EBUSY`: another XDP program is on the
    /// interface; `EOPNOTSUPP`: the driver has no native mode, try [`XdpMode::Generic`]).
    #[error("attaching the XDP program to interface #{0} in {1:?} mode: {2}")]
    Attach(u32, XdpMode, #[source] io::Error),
    /// Making, sizing, mapping or binding the AF_XDP socket failed.
    #[error("AF_XDP socket: {0}: {1}")]
    Socket(&'static str, #[source] io::Error),
    /// The port's configuration is impossible.
    #[error("bad port configuration: {0}")]
    Config(String),
    /// A frame longer than the interface carries (MTU plus header, at most a slot less the
    /// receive headroom), or
    /// shorter than an Ethernet header.
    #[error("a frame of {len} bytes does not fit (14..={max} bytes)")]
    FrameSize {
        /// The frame's length.
        len: usize,
        /// The longest frame the port sends.
        max: usize,
    },
}
