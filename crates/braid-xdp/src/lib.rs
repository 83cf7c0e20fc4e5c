//! AF_XDP ports for braid's raw-Ethernet rails.
//!
//! braid's rails are TCP connections today. On an unshaped rail, where the CPU is the
//! limit, most of an 8-byte message's time is the kernel's TCP path (docs/RESULTS.md,
//! "Where a small message's time goes"). An AF_XDP socket takes the frames of one Ethernet
//! type straight from the driver into user memory, skipping the IP and TCP layers, and
//! sends by handing frames to the driver. This crate is that I/O layer, nothing more:
//!
//! - [`Port::open`] loads a fifteen-instruction XDP program with the `bpf` system call (no
//!   libbpf, no BPF compiler), attaches it to an interface, and binds an AF_XDP socket to
//!   one receive queue, with its frame area (UMEM) and four rings;
//! - frames of the port's Ethernet type ([`ETHERTYPE`] by default) go to the socket, all
//!   other traffic (ARP, IP, the rails' TCP) reaches the kernel as before;
//! - [`Port::send`] / [`Port::flush`] queue and send whole frames, [`Port::recv`] hands
//!   received ones to a closure, [`Port::wait_readable`] sleeps for one.
//!
//! Reliability, ordering, addressing of peers and the mapping onto braid's rails are the
//! transport's business, not this crate's: braid's raw rails (`BRAID_TRANSPORT=raw`) use
//! one port per device for all of them. `examples/xdp_pingpong.rs` measures the floor a
//! raw-Ethernet rail stands on (`scripts/xdp-lat.sh` runs it beside TCP on a testbed rail).
//!
//! Limits: copy mode only (`XDP_COPY`: every driver, one copy each way); one port per
//! interface (the kernel keeps one XDP program per interface); one receive queue per port.
//! Needs root (`CAP_NET_ADMIN` and `CAP_BPF`) and Linux 5.9 or later (BPF links for XDP).

mod bpf;
mod error;
mod mode;
mod port;
mod ring;

pub use error::XdpError;
pub use mode::XdpMode;
pub use port::{ETHER_HEADER, ETHERTYPE, Port, PortConfig, PortStats, ether_header};
