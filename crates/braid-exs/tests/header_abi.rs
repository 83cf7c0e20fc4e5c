//! The C header and the Rust ABI agree: compile a C program against include/sys/exs.h,
//! print constants, sizes and offsets, and compare with Rust's.

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use exs::*;

#[test]
fn header_matches_rust() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::env::temp_dir().join(format!("exs-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = dir.join("abi.c");
    std::fs::write(
        &c,
        r#"
#include <stdio.h>
#include <stddef.h>
#include <sys/exs.h>
#define P(x) printf(#x " %ld\n", (long)(x))
int main(void) {
    P(EXS_VERSION); P(EXS_VERSION1); P(EXS_QHANDLE_INVALID); P(EXS_MHANDLE_INVALID);
    P(EXS_MHANDLE_UNREGISTERED); P(EXS_MRF_SHARED); P(EXS_MSG_SYNC); P(MSG_EXS_SYNC); P(EXS_IOV_MAX);
    P(EXS_SOCK_OUTSTANDING_MAX); P(EXS_QDEPTH_MAX); P(EXS_EVTVEC_MAX); P(EXS_POLLIN); P(EXS_POLLOUT);
    P(EXS_CAF_FILDES); P(EXS_CAF_AHANDLE); P(EXS_BRAID_CONNECT); P(EXS_BRAID_ACCEPT);
    P(EXS_EVT_POLL); P(EXS_EVT_CONNECT); P(EXS_EVT_ACCEPT); P(EXS_EVT_SEND); P(EXS_EVT_RECV);
    P(EXS_EVT_SENDMSG); P(EXS_EVT_RECVMSG); P(EXS_EVT_SENDFILE); P(EXS_EVT_SENDTIMEOUT);
    P(EXS_EVT_RECVTIMEOUT); P(EXS_EVT_SHUTDOWN); P(EXS_EVT_CLOSE);
    P(sizeof(exs_event_t)); P(offsetof(exs_event_t, ev_type)); P(offsetof(exs_event_t, ev_fd));
    P(offsetof(exs_event_t, ev_ahandle)); P(offsetof(exs_event_t, ev_result));
    P(offsetof(exs_event_t, ev_errno)); P(offsetof(exs_event_t, ev_flags)); P(offsetof(exs_event_t, ev_u));
    P(sizeof(exs_evt_xfer_t)); P(offsetof(exs_evt_xfer_t, xf_len)); P(offsetof(exs_evt_xfer_t, xf_flags));
    P(offsetof(exs_evt_xfer_t, xf_iovcnt));
    P(sizeof(exs_evt_accept_t)); P(offsetof(exs_evt_accept_t, ac_addrlen)); P(offsetof(exs_evt_accept_t, ac_addr));
    P(sizeof(exs_evt_poll_t)); P(offsetof(exs_evt_poll_t, po_revents));
    P(sizeof(exs_iovec_t)); P(offsetof(exs_iovec_t, iov_len)); P(offsetof(exs_iovec_t, iov_mhandle));
    P(sizeof(exs_ahandle_t)); P(sizeof(exs_qhandle_t)); P(sizeof(exs_mhandle_t));
    return 0;
}
"#,
    )
    .unwrap();
    let exe = dir.join("abi");
    let out = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let c: std::collections::HashMap<&str, i64> = text
        .lines()
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    let rust: &[(&str, i64)] = &[
        ("EXS_VERSION", EXS_VERSION as i64),
        ("EXS_VERSION1", EXS_VERSION1 as i64),
        ("EXS_QHANDLE_INVALID", EXS_QHANDLE_INVALID as i64),
        ("EXS_MHANDLE_INVALID", EXS_MHANDLE_INVALID as i64),
        ("EXS_MHANDLE_UNREGISTERED", EXS_MHANDLE_UNREGISTERED as i64),
        ("EXS_MRF_SHARED", EXS_MRF_SHARED as i64),
        ("EXS_MSG_SYNC", EXS_MSG_SYNC as i64),
        ("MSG_EXS_SYNC", EXS_MSG_SYNC as i64),
        ("EXS_IOV_MAX", EXS_IOV_MAX as i64),
        ("EXS_SOCK_OUTSTANDING_MAX", EXS_SOCK_OUTSTANDING_MAX as i64),
        ("EXS_QDEPTH_MAX", EXS_QDEPTH_MAX as i64),
        ("EXS_EVTVEC_MAX", EXS_EVTVEC_MAX as i64),
        ("EXS_POLLIN", EXS_POLLIN as i64),
        ("EXS_POLLOUT", EXS_POLLOUT as i64),
        ("EXS_CAF_FILDES", EXS_CAF_FILDES as i64),
        ("EXS_CAF_AHANDLE", EXS_CAF_AHANDLE as i64),
        ("EXS_BRAID_CONNECT", EXS_BRAID_CONNECT as i64),
        ("EXS_BRAID_ACCEPT", EXS_BRAID_ACCEPT as i64),
        ("EXS_EVT_POLL", EXS_EVT_POLL as i64),
        ("EXS_EVT_CONNECT", EXS_EVT_CONNECT as i64),
        ("EXS_EVT_ACCEPT", EXS_EVT_ACCEPT as i64),
        ("EXS_EVT_SEND", EXS_EVT_SEND as i64),
        ("EXS_EVT_RECV", EXS_EVT_RECV as i64),
        ("EXS_EVT_SENDMSG", EXS_EVT_SENDMSG as i64),
        ("EXS_EVT_RECVMSG", EXS_EVT_RECVMSG as i64),
        ("EXS_EVT_SENDFILE", EXS_EVT_SENDFILE as i64),
        ("EXS_EVT_SENDTIMEOUT", EXS_EVT_SENDTIMEOUT as i64),
        ("EXS_EVT_RECVTIMEOUT", EXS_EVT_RECVTIMEOUT as i64),
        ("EXS_EVT_SHUTDOWN", EXS_EVT_SHUTDOWN as i64),
        ("EXS_EVT_CLOSE", EXS_EVT_CLOSE as i64),
        ("sizeof(exs_event_t)", size_of::<exs_event_t>() as i64),
        (
            "offsetof(exs_event_t, ev_type)",
            offset_of!(exs_event_t, ev_type) as i64,
        ),
        (
            "offsetof(exs_event_t, ev_fd)",
            offset_of!(exs_event_t, ev_fd) as i64,
        ),
        (
            "offsetof(exs_event_t, ev_ahandle)",
            offset_of!(exs_event_t, ev_ahandle) as i64,
        ),
        (
            "offsetof(exs_event_t, ev_result)",
            offset_of!(exs_event_t, ev_result) as i64,
        ),
        (
            "offsetof(exs_event_t, ev_errno)",
            offset_of!(exs_event_t, ev_errno) as i64,
        ),
        (
            "offsetof(exs_event_t, ev_flags)",
            offset_of!(exs_event_t, ev_flags) as i64,
        ),
        (
            "offsetof(exs_event_t, ev_u)",
            offset_of!(exs_event_t, ev_u) as i64,
        ),
        ("sizeof(exs_evt_xfer_t)", size_of::<exs_evt_xfer_t>() as i64),
        (
            "offsetof(exs_evt_xfer_t, xf_len)",
            offset_of!(exs_evt_xfer_t, xf_len) as i64,
        ),
        (
            "offsetof(exs_evt_xfer_t, xf_flags)",
            offset_of!(exs_evt_xfer_t, xf_flags) as i64,
        ),
        (
            "offsetof(exs_evt_xfer_t, xf_iovcnt)",
            offset_of!(exs_evt_xfer_t, xf_iovcnt) as i64,
        ),
        (
            "sizeof(exs_evt_accept_t)",
            size_of::<exs_evt_accept_t>() as i64,
        ),
        (
            "offsetof(exs_evt_accept_t, ac_addrlen)",
            offset_of!(exs_evt_accept_t, ac_addrlen) as i64,
        ),
        (
            "offsetof(exs_evt_accept_t, ac_addr)",
            offset_of!(exs_evt_accept_t, ac_addr) as i64,
        ),
        ("sizeof(exs_evt_poll_t)", size_of::<exs_evt_poll_t>() as i64),
        (
            "offsetof(exs_evt_poll_t, po_revents)",
            offset_of!(exs_evt_poll_t, po_revents) as i64,
        ),
        ("sizeof(exs_iovec_t)", size_of::<exs_iovec_t>() as i64),
        (
            "offsetof(exs_iovec_t, iov_len)",
            offset_of!(exs_iovec_t, iov_len) as i64,
        ),
        (
            "offsetof(exs_iovec_t, iov_mhandle)",
            offset_of!(exs_iovec_t, iov_mhandle) as i64,
        ),
        ("sizeof(exs_ahandle_t)", size_of::<exs_ahandle_t>() as i64),
        ("sizeof(exs_qhandle_t)", size_of::<exs_qhandle_t>() as i64),
        ("sizeof(exs_mhandle_t)", size_of::<exs_mhandle_t>() as i64),
    ];
    for (k, v) in rust {
        assert_eq!(c.get(k), Some(v), "{k}: C {:?} vs Rust {v}", c.get(k));
    }
    assert_eq!(c.len(), rust.len(), "every printed item is checked");
    let _ = std::fs::remove_dir_all(&dir);
}
