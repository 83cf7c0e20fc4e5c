//! Where the steering program runs.

/// `XDP_FLAGS_SKB_MODE` and `XDP_FLAGS_DRV_MODE` (linux/if_link.h).
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// Where the XDP program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver, before the kernel allocates a socket buffer (veth and most 10-100 GbE
    /// drivers have it). The fast mode.
    Native,
    /// After the kernel built a socket buffer (any interface; slower).
    Generic,
}

impl XdpMode {
    pub(crate) fn flags(self) -> u32 {
        match self {
            XdpMode::Native => XDP_FLAGS_DRV_MODE,
            XdpMode::Generic => XDP_FLAGS_SKB_MODE,
        }
    }
}
