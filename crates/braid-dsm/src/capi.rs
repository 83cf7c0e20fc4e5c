//! The C API (`include/braid/dsm.h`): the same calls as [`crate::Dsm`], on one process-wide
//! instance. Every function is safe to call in any state: before `braid_dsm_init` they fail
//! with `ENXIO`. Errors set `errno`, and [`braid_dsm_last_error`] gives the message.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::api::{Dsm, DsmStats, runtime_of};
use crate::error::DsmError;
use crate::proto::HomePolicy;
use crate::runtime::Runtime;

/// `braid_dsm_alloc_policy`: pages homed in contiguous blocks.
pub const BRAID_DSM_HOME_BLOCK: c_int = 0;
/// `braid_dsm_alloc_policy`: pages homed round robin.
pub const BRAID_DSM_HOME_CYCLIC: c_int = 1;
/// `braid_dsm_alloc_policy`: the default policy (`BRAID_DSM_HOME`, else block).
pub const BRAID_DSM_HOME_DEFAULT: c_int = -1;

static DSM: RwLock<Option<Dsm>> = RwLock::new(None);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local and always valid to write.
    unsafe { *libc::__errno_location() = e };
}

fn fail(e: DsmError) -> c_int {
    let msg = CString::new(e.to_string().replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = msg);
    set_errno(e.errno());
    -1
}

/// The runtime, cloned out of the lock so that blocking calls never hold it.
fn rt() -> Result<Arc<Runtime>, DsmError> {
    DSM.read()
        .as_ref()
        .map(runtime_of)
        .ok_or(DsmError::NotInitialized)
}

fn status(r: Result<(), DsmError>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Joins the group from the launcher's environment. 0, or -1 with `errno` (the message is
/// also printed to stderr, prefixed `braid-dsm:`, since a failed start-up usually needs a
/// person to act, e.g. on `vm.unprivileged_userfaultfd`).
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_init() -> c_int {
    let mut g = DSM.write();
    if g.is_some() {
        return fail(DsmError::AlreadyInitialized);
    }
    match Dsm::init() {
        Ok(d) => {
            *g = Some(d);
            0
        }
        Err(e) => {
            eprintln!("braid-dsm: {e}");
            fail(e)
        }
    }
}

/// This process's rank, or -1 (`ENXIO`) before init.
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_rank() -> c_int {
    match rt() {
        Ok(r) => r.rank as c_int,
        Err(e) => fail(e),
    }
}

/// Number of ranks, or -1 (`ENXIO`) before init.
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_size() -> c_int {
    match rt() {
        Ok(r) => r.size as c_int,
        Err(e) => fail(e),
    }
}

/// The page size (the unit of coherence), or 0 before init.
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_page_size() -> usize {
    rt().map(|r| r.page).unwrap_or(0)
}

/// Collective allocation with the default home policy; NULL with `errno` on error
/// (`EINVAL`: sizes differ between ranks or 0; `ENOMEM`: no room in the shared range).
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_alloc(bytes: usize) -> *mut c_void {
    braid_dsm_alloc_policy(bytes, BRAID_DSM_HOME_DEFAULT)
}

/// [`braid_dsm_alloc`] with a home policy: `BRAID_DSM_HOME_BLOCK`, `_CYCLIC` or `_DEFAULT`.
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_alloc_policy(bytes: usize, policy: c_int) -> *mut c_void {
    let r = rt().and_then(|rt| {
        let policy = match policy {
            BRAID_DSM_HOME_BLOCK => HomePolicy::Block,
            BRAID_DSM_HOME_CYCLIC => HomePolicy::Cyclic,
            BRAID_DSM_HOME_DEFAULT => rt.cfg.home,
            p => return Err(DsmError::InvalidArgument(format!("home policy {p}"))),
        };
        rt.alloc(bytes, policy)
    });
    match r {
        Ok(p) => p.cast(),
        Err(e) => {
            fail(e);
            std::ptr::null_mut()
        }
    }
}

/// Collective free; on error `errno` is set (`EINVAL`: not an allocation, or ranks freed
/// different ones).
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_free(p: *mut c_void) {
    if let Err(e) = rt().and_then(|rt| rt.free(p.cast())) {
        fail(e);
    }
}

/// Returns when every rank has called it; -1 with `errno` (`ECONNRESET`: a rank died).
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_barrier() -> c_int {
    status(rt().and_then(|rt| rt.barrier()))
}

/// Acquires global lock `id`; -1 with `errno` (`EINVAL`: id out of range).
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_lock(id: c_uint) -> c_int {
    status(rt().and_then(|rt| rt.lock(id)))
}

/// Releases global lock `id`; -1 with `errno` (`EINVAL`: not held by this rank).
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_unlock(id: c_uint) -> c_int {
    status(rt().and_then(|rt| rt.unlock(id)))
}

/// Collective end; 0, or -1 with `errno`. The process may init again afterwards.
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_finalize() -> c_int {
    let d = DSM.write().take();
    match d {
        Some(d) => status(d.finalize()),
        None => fail(DsmError::NotInitialized),
    }
}

/// This rank's counters as one line of JSON, written into `buf` (`len` bytes, always
/// NUL-terminated when `len > 0`, truncated if too small) like `snprintf`: returns the length
/// of the whole text without the NUL, so a return `>= len` means it was cut; -1 with `errno`
/// (`ENXIO` before init, `EINVAL` for a NULL `buf` with `len > 0`).
///
/// Fields: `rank`, `size`, the [`crate::DsmStats`] counters and means (`faults`,
/// `installs`, `pages_sent`, `drops`, `messages`, `requests`, `fault_to_request_us`,
/// `request_to_grant_us`, `install_us`, `serve_us`) and `rail_bytes_sent` (payload bytes
/// braid sent on each rail, over all peers, since init).
///
/// # Safety
/// `buf` must be valid for writes of `len` bytes (or NULL with `len == 0`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn braid_dsm_stats_json(buf: *mut c_char, len: usize) -> c_int {
    let rt = match rt() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if buf.is_null() && len > 0 {
        return fail(DsmError::InvalidArgument("NULL buffer".into()));
    }
    let text = stats_json(rt.rank, rt.size, rt.stats().into(), &rt.rail_bytes_sent());
    if len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: the caller gives `len` writable bytes at `buf`; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, n);
            *buf.add(n) = 0;
        }
    }
    c_int::try_from(text.len()).unwrap_or(c_int::MAX)
}

/// The text of [`braid_dsm_stats_json`].
pub(crate) fn stats_json(rank: usize, size: usize, s: DsmStats, rails: &[u64]) -> String {
    let rails: Vec<String> = rails.iter().map(u64::to_string).collect();
    format!(
        "{{\"rank\":{rank},\"size\":{size},\"faults\":{},\"installs\":{},\"pages_sent\":{},\
         \"drops\":{},\"messages\":{},\"requests\":{},\"fault_to_request_us\":{:.2},\
         \"request_to_grant_us\":{:.2},\"install_us\":{:.2},\"serve_us\":{:.2},\
         \"rail_bytes_sent\":[{}]}}",
        s.faults,
        s.installs,
        s.pages_sent,
        s.drops,
        s.messages,
        s.requests,
        s.fault_to_request_us,
        s.request_to_grant_us,
        s.install_us,
        s.serve_us,
        rails.join(",")
    )
}

/// The message of this thread's last failed call ("" if none). Valid until the thread's
/// next failing call.
#[unsafe(no_mangle)]
pub extern "C" fn braid_dsm_last_error() -> *const c_char {
    LAST_ERROR.with(|l| l.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_json_is_one_json_object() {
        let s = DsmStats {
            faults: 3,
            request_to_grant_us: 1.5,
            ..DsmStats::default()
        };
        let t = stats_json(1, 2, s, &[10, 20]);
        assert!(t.starts_with("{\"rank\":1,\"size\":2,\"faults\":3,"), "{t}");
        assert!(t.contains("\"request_to_grant_us\":1.50,"), "{t}");
        assert!(t.ends_with("\"rail_bytes_sent\":[10,20]}"), "{t}");
        assert!(!t.contains('\n'));
    }

    #[test]
    fn stats_json_before_init_is_enxio() {
        let mut buf = [0 as c_char; 64];
        // SAFETY: a buffer of 64 bytes.
        let r = unsafe { braid_dsm_stats_json(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(r, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENXIO)
        );
    }
}
