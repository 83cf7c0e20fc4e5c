//! The frame-steering XDP program and its socket map, made with the `bpf` system call.
//!
//! The program is fifteen instructions, assembled here rather than compiled: frames whose
//! Ethernet type is the port's go to the AF_XDP socket registered for the receive queue
//! they arrived on; every other frame (ARP, IP, the rail's TCP handshake) goes on to the
//! kernel's stack untouched. No libbpf and no BPF compiler are needed at build or run time.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::XdpError;
use crate::mode::XdpMode;

// bpf(2) commands and types (linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
/// `XDP_PASS`: hand the frame to the kernel's stack.
const XDP_PASS: i32 = 2;
/// The `bpf` attribute block: a zeroed, 8-byte aligned union of which each command reads
/// its own fields (the kernel requires the bytes it does not read to be zero).
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32_at(mut self, off: usize, v: u32) -> Attr {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64_at(mut self, off: usize, v: u64) -> Attr {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    /// Runs `cmd`; the result is a new descriptor for the commands that make one.
    fn call(mut self, cmd: libc::c_long) -> io::Result<libc::c_long> {
        // SAFETY: the block is 128 bytes, zero where the command reads nothing, and every
        // address in it (instructions, license, log, key, value) outlives the call.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, self.0.as_mut_ptr(), self.0.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }
    fn call_fd(self, cmd: libc::c_long) -> io::Result<OwnedFd> {
        let fd = self.call(cmd)? as RawFd;
        // SAFETY: the kernel just returned this descriptor to us and nobody else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// An `XSKMAP`: receive queue index -> AF_XDP socket.
#[derive(Debug)]
pub(crate) struct SocketMap {
    fd: OwnedFd,
}

impl SocketMap {
    /// A map for queues `0..queues`.
    pub(crate) fn new(queues: u32) -> Result<SocketMap, XdpError> {
        let fd = Attr::new()
            .u32_at(0, BPF_MAP_TYPE_XSKMAP)
            .u32_at(4, 4) // key: the queue index
            .u32_at(8, 4) // value: a socket descriptor
            .u32_at(12, queues)
            .call_fd(BPF_MAP_CREATE)
            .map_err(|e| XdpError::Bpf("creating the socket map", e))?;
        Ok(SocketMap { fd })
    }

    /// Steers queue `queue`'s frames to `socket`.
    pub(crate) fn set(&self, queue: u32, socket: RawFd) -> Result<(), XdpError> {
        let key = queue;
        let value = socket as u32;
        Attr::new()
            .u32_at(0, self.fd.as_raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .u64_at(16, &value as *const u32 as u64)
            .call(BPF_MAP_UPDATE_ELEM)
            .map_err(|e| XdpError::Bpf("registering the socket in the map", e))?;
        Ok(())
    }

    /// Takes queue `queue`'s socket out of the map. The map holds a reference to the socket
    /// that would otherwise go only when the kernel frees the map, some time after the
    /// program is detached, and the queue stays bound (`EBUSY`) until then.
    pub(crate) fn clear(&self, queue: u32) {
        let key = queue;
        let _ = Attr::new()
            .u32_at(0, self.fd.as_raw_fd() as u32)
            .u64_at(8, &key as *const u32 as u64)
            .call(BPF_MAP_DELETE_ELEM);
    }
}

/// One BPF instruction, encoded as the kernel reads it (`struct bpf_insn`).
const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    (code as u64)
        | ((dst as u64 | (src as u64) << 4) << 8)
        | ((off as u16 as u64) << 16)
        | ((imm as u32 as u64) << 32)
}

/// The program: redirect frames of `ethertype` to `map[rx_queue_index]`, pass the rest.
fn steering_program(ethertype: u16, map: RawFd) -> [u64; 15] {
    // Opcodes (linux/bpf_common.h): class | size | mode, or class | op | source.
    const LDX_W: u8 = 0x61; // r_dst = *(u32 *)(r_src + off)
    const LDX_H: u8 = 0x69; // r_dst = *(u16 *)(r_src + off)
    const MOV_X: u8 = 0xbf; // r_dst = r_src
    const ADD_K: u8 = 0x07; // r_dst += imm
    const JGT_X: u8 = 0x2d; // if r_dst > r_src goto +off
    const JNE_K: u8 = 0x55; // if r_dst != imm goto +off
    const LD_DW: u8 = 0x18; // r_dst = imm64 (two slots)
    const MOV_K: u8 = 0xb7; // r_dst = imm
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    // A 16-bit load of the type field reads the wire's big-endian bytes in host order.
    let wire_type = u16::from_ne_bytes(ethertype.to_be_bytes()) as i32;
    [
        insn(LDX_W, 2, 1, 0, 0),                   // 0: r2 = ctx->data
        insn(LDX_W, 3, 1, 4, 0),                   // 1: r3 = ctx->data_end
        insn(MOV_X, 4, 2, 0, 0),                   // 2: r4 = r2
        insn(ADD_K, 4, 0, 0, 14),                  // 3: r4 += 14 (an Ethernet header)
        insn(JGT_X, 4, 3, 8, 0),                   // 4: too short: pass (to 13)
        insn(LDX_H, 4, 2, 12, 0),                  // 5: r4 = the type field
        insn(JNE_K, 4, 0, 6, wire_type),           // 6: not ours: pass (to 13)
        insn(LDX_W, 2, 1, 16, 0),                  // 7: r2 = ctx->rx_queue_index
        insn(LD_DW, 1, BPF_PSEUDO_MAP_FD, 0, map), // 8-9: r1 = the socket map
        0,
        insn(MOV_K, 3, 0, 0, XDP_PASS), // 10: no socket for this queue: pass
        insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP), // 11
        insn(EXIT, 0, 0, 0, 0),         // 12
        insn(MOV_K, 0, 0, 0, XDP_PASS), // 13
        insn(EXIT, 0, 0, 0, 0),         // 14
    ]
}

/// The loaded steering program, attached to one interface while this lives.
#[derive(Debug)]
pub(crate) struct Attached {
    /// The BPF link: closing it detaches the program (also if the process dies).
    _link: OwnedFd,
    _prog: OwnedFd,
}

impl Attached {
    /// Loads the program for `ethertype` and `map` and attaches it to `ifindex`.
    pub(crate) fn new(
        ifindex: u32,
        ethertype: u16,
        map: &SocketMap,
        mode: XdpMode,
    ) -> Result<Attached, XdpError> {
        let insns = steering_program(ethertype, map.fd.as_raw_fd());
        let license = c"GPL";
        let mut log = vec![0u8; 4096];
        let prog = Attr::new()
            .u32_at(0, BPF_PROG_TYPE_XDP)
            .u32_at(4, insns.len() as u32)
            .u64_at(8, insns.as_ptr() as u64)
            .u64_at(16, license.as_ptr() as u64)
            .u32_at(24, 1) // log level: the verifier says why it refused
            .u32_at(28, log.len() as u32)
            .u64_at(32, log.as_mut_ptr() as u64)
            .call_fd(BPF_PROG_LOAD)
            .map_err(|e| {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                XdpError::Verifier(e, String::from_utf8_lossy(&log[..end]).into_owned())
            })?;
        let link = Attr::new()
            .u32_at(0, prog.as_raw_fd() as u32)
            .u32_at(4, ifindex)
            .u32_at(8, BPF_XDP)
            .u32_at(12, mode.flags())
            .call_fd(BPF_LINK_CREATE)
            .map_err(|e| XdpError::Attach(ifindex, mode, e))?;
        Ok(Attached {
            _link: link,
            _prog: prog,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_struct_bpf_insn() {
        // r4 = *(u16 *)(r2 + 12): code 0x69, dst 4 in the low nibble, src 2 in the high one.
        assert_eq!(
            insn(0x69, 4, 2, 12, 0).to_le_bytes(),
            [0x69, 0x24, 12, 0, 0, 0, 0, 0]
        );
        // A negative offset and immediate keep their two's complement bits.
        assert_eq!(
            insn(0x05, 0, 0, -1, -2).to_le_bytes(),
            [5, 0, 0xff, 0xff, 0xfe, 0xff, 0xff, 0xff]
        );
    }

    #[test]
    fn both_jumps_land_on_the_pass_exit() {
        let p = steering_program(0x88b5, 7);
        for (at, want) in [(4usize, 13usize), (6, 13)] {
            let off = (p[at] >> 16) as u16 as i16;
            assert_eq!(at as isize + 1 + off as isize, want as isize);
        }
        assert_eq!(p[13] & 0xff, 0xb7);
        assert_eq!(p[14] & 0xff, 0x95);
    }
}
