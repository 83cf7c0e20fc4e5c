//! C ABI types and constants, mirrored one-to-one in `include/sys/exs.h`.
//!
//! Every item here has the same name, value and layout as in the header; the test
//! `tests/header_abi.rs` compiles a C program against the header and checks them.

#![allow(non_camel_case_types)]

use libc::{c_int, c_short, c_void, size_t, sockaddr_storage, socklen_t, ssize_t};

/// An error number (`errno` value), as every call of the API reports errors.
pub(crate) type Errno = c_int;

/// ES-API version 1.
pub const EXS_VERSION1: c_int = 1;
/// The ES-API version this library implements.
pub const EXS_VERSION: c_int = EXS_VERSION1;

/// Queue handle (an `int`; `EXS_QHANDLE_INVALID` on error).
pub type exs_qhandle_t = c_int;
/// Memory handle (an `int`; `EXS_MHANDLE_INVALID` on error).
pub type exs_mhandle_t = c_int;
/// Application handle: pointer-sized, returned unchanged in the event.
pub type exs_ahandle_t = *mut c_void;

/// Returned by `exs_qcreate` on error.
pub const EXS_QHANDLE_INVALID: exs_qhandle_t = -1;
/// Returned by `exs_mregister` on error.
pub const EXS_MHANDLE_INVALID: exs_mhandle_t = -1;
/// UNH EXS extension: the buffer was not registered.
pub const EXS_MHANDLE_UNREGISTERED: exs_mhandle_t = -2;

/// Registration flag: the region may be shared by several sockets and queues.
pub const EXS_MRF_SHARED: c_int = 0x1;

/// UNH EXS extension, in the `flags` of `exs_send*`/`exs_recv*`: complete before returning.
pub const EXS_MSG_SYNC: c_int = 0x1000_0000;

/// Most iovecs in one `exs_sendv`/`exs_recvv`.
pub const EXS_IOV_MAX: c_int = 64;
/// Most operations outstanding on one socket (beyond: `EAGAIN`).
pub const EXS_SOCK_OUTSTANDING_MAX: c_int = 256;
/// Largest queue depth accepted by `exs_qcreate`.
pub const EXS_QDEPTH_MAX: c_int = 65536;
/// Most events one `exs_qdequeue` can return (`|count|` is clamped to the queue depth).
pub const EXS_EVTVEC_MAX: c_int = EXS_QDEPTH_MAX;

/// Poll event bits for `exs_poll` (same values as `POLLIN`/`POLLOUT`).
pub const EXS_POLLIN: c_short = libc::POLLIN;
/// Writable.
pub const EXS_POLLOUT: c_short = libc::POLLOUT;

/// Event types.
pub const EXS_EVT_POLL: c_int = 1;
/// A connection completed.
pub const EXS_EVT_CONNECT: c_int = 2;
/// A connection was accepted.
pub const EXS_EVT_ACCEPT: c_int = 3;
/// An `exs_send` completed.
pub const EXS_EVT_SEND: c_int = 4;
/// An `exs_recv` completed.
pub const EXS_EVT_RECV: c_int = 5;
/// An `exs_sendv` completed.
pub const EXS_EVT_SENDMSG: c_int = 6;
/// An `exs_recvv` completed.
pub const EXS_EVT_RECVMSG: c_int = 7;
/// Reserved (sendfile).
pub const EXS_EVT_SENDFILE: c_int = 8;
/// Reserved (send timeout).
pub const EXS_EVT_SENDTIMEOUT: c_int = 9;
/// Reserved (receive timeout).
pub const EXS_EVT_RECVTIMEOUT: c_int = 10;
/// Reserved (shutdown).
pub const EXS_EVT_SHUTDOWN: c_int = 11;
/// Reserved (close).
pub const EXS_EVT_CLOSE: c_int = 12;

/// Body of SEND/RECV/SENDMSG/RECVMSG events.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_xfer_t {
    /// The buffer passed (first iovec's base for the vector forms).
    pub xf_buf: *mut c_void,
    /// Bytes requested (sum over the iovecs for the vector forms).
    pub xf_len: size_t,
    /// Flags as passed by the caller.
    pub xf_flags: c_int,
    /// Iovec count (1 for the plain forms).
    pub xf_iovcnt: c_int,
}

/// Body of ACCEPT events.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct exs_evt_accept_t {
    /// The new socket (also in `ev_result`), or -1.
    pub ac_fd: c_int,
    /// Length of the peer address.
    pub ac_addrlen: socklen_t,
    /// Peer address.
    pub ac_addr: sockaddr_storage,
}

/// Body of POLL events.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_evt_poll_t {
    /// Events asked for.
    pub po_events: c_short,
    /// Events that occurred.
    pub po_revents: c_short,
}

/// Per-kind event body.
#[repr(C)]
#[derive(Clone, Copy)]
pub union exs_event_body_t {
    /// SEND/RECV/SENDMSG/RECVMSG.
    pub xfer: exs_evt_xfer_t,
    /// ACCEPT.
    pub accept: exs_evt_accept_t,
    /// POLL.
    pub poll: exs_evt_poll_t,
}

/// A completion event.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct exs_event_t {
    /// `EXS_EVT_*`.
    pub ev_type: c_int,
    /// The socket.
    pub ev_fd: c_int,
    /// The application handle given with the operation.
    pub ev_ahandle: exs_ahandle_t,
    /// Bytes moved (SEND/RECV), new fd (ACCEPT), revents (POLL), 0 (CONNECT); -1 on error.
    pub ev_result: ssize_t,
    /// 0 on success, else the error number.
    pub ev_errno: c_int,
    /// Reserved, 0.
    pub ev_flags: c_int,
    /// Per-kind body.
    pub ev_u: exs_event_body_t,
}

// SAFETY: the raw pointers inside are opaque values handed back to the application.
unsafe impl Send for exs_event_t {}

impl exs_event_t {
    /// An event with zeroed body.
    pub fn zeroed() -> Self {
        // SAFETY: all-zero bytes are a valid value for every field (integers, pointers, unions).
        unsafe { std::mem::zeroed() }
    }

    /// The transfer body of a SEND, RECV, SENDMSG, RECVMSG or SENDFILE event.
    pub fn xfer(&self) -> Option<exs_evt_xfer_t> {
        matches!(
            self.ev_type,
            EXS_EVT_SEND | EXS_EVT_RECV | EXS_EVT_SENDMSG | EXS_EVT_RECVMSG | EXS_EVT_SENDFILE
        )
        // SAFETY: events of these kinds carry the xfer body; every body field is plain
        // data, and events start zeroed, so no byte read is uninitialised.
        .then(|| unsafe { self.ev_u.xfer })
    }

    /// The body of an ACCEPT event.
    pub fn accept(&self) -> Option<exs_evt_accept_t> {
        if self.ev_type != EXS_EVT_ACCEPT {
            return None;
        }
        // SAFETY: as for `xfer`: ACCEPT events carry the accept body.
        Some(unsafe { self.ev_u.accept })
    }

    /// The body of a POLL event.
    pub fn poll(&self) -> Option<exs_evt_poll_t> {
        if self.ev_type != EXS_EVT_POLL {
            return None;
        }
        // SAFETY: as for `xfer`: POLL events carry the poll body.
        Some(unsafe { self.ev_u.poll })
    }
}

/// An I/O vector with its own memory handle.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct exs_iovec_t {
    /// Start of the buffer.
    pub iov_base: *mut c_void,
    /// Length in bytes.
    pub iov_len: size_t,
    /// Memory handle, or `EXS_MHANDLE_UNREGISTERED`.
    pub iov_mhandle: exs_mhandle_t,
}

/// `exs_cancel` flag: cancel by file descriptor.
pub const EXS_CAF_FILDES: c_int = 0x1;
/// `exs_cancel` flag: cancel by application handle.
pub const EXS_CAF_AHANDLE: c_int = 0x2;

/// braid extension, `exs_braid_attach` flag: this side called `connect()` on the bootstrap
/// socket and opens the rails.
pub const EXS_BRAID_CONNECT: c_int = 0x1;
/// braid extension, `exs_braid_attach` flag: this side `accept()`ed the bootstrap socket and
/// listens for the rails.
pub const EXS_BRAID_ACCEPT: c_int = 0x2;
