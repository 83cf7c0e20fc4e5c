//! Error numbers on the wire.
//!
//! A reply carries a status: 0 for success, else one of the codes below. The codes are
//! Linux's errno values for the errors a file server returns; a code this build does not know
//! decodes as `EIO`, and a local error without a wire code is sent as `EIO`, so a peer never
//! sees a number that means something else on its side.

use std::fmt;

/// An error number as carried in a reply (a Linux errno value from the known set).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(u32);

macro_rules! known {
    ($($name:ident = $libc:ident),* $(,)?) => {
        impl Errno {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                pub const $name: Errno = Errno(libc::$libc as u32);
            )*
            /// Every code this build sends and understands.
            pub const KNOWN: &'static [Errno] = &[$(Errno::$name),*];

            fn name(self) -> Option<&'static str> {
                match self {
                    $(Errno::$name => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

known! {
    EPERM = EPERM, ENOENT = ENOENT, EIO = EIO, ENXIO = ENXIO, E2BIG = E2BIG, EBADF = EBADF,
    EAGAIN = EAGAIN, ENOMEM = ENOMEM, EACCES = EACCES, EFAULT = EFAULT, EBUSY = EBUSY,
    EEXIST = EEXIST, EXDEV = EXDEV, ENODEV = ENODEV, ENOTDIR = ENOTDIR, EISDIR = EISDIR,
    EINVAL = EINVAL, ENFILE = ENFILE, EMFILE = EMFILE, ETXTBSY = ETXTBSY, EFBIG = EFBIG,
    ENOSPC = ENOSPC, ESPIPE = ESPIPE, EROFS = EROFS, EMLINK = EMLINK, ERANGE = ERANGE,
    EDEADLK = EDEADLK, ENAMETOOLONG = ENAMETOOLONG, ENOLCK = ENOLCK, ENOSYS = ENOSYS,
    ENOTEMPTY = ENOTEMPTY, ELOOP = ELOOP, ENODATA = ENODATA, EOVERFLOW = EOVERFLOW,
    EPROTO = EPROTO, EOPNOTSUPP = EOPNOTSUPP, ENOTCONN = ENOTCONN, ETIMEDOUT = ETIMEDOUT,
    ESTALE = ESTALE, EDQUOT = EDQUOT, ECANCELED = ECANCELED,
}

impl Errno {
    /// The code as sent on the wire.
    pub fn code(self) -> u32 {
        self.0
    }

    /// Decodes a wire code; unknown codes become `EIO`. Returns `None` for 0 (success).
    pub fn from_code(code: u32) -> Option<Errno> {
        if code == 0 {
            return None;
        }
        let e = Errno(code);
        Some(if e.name().is_some() { e } else { Errno::EIO })
    }

    /// A local errno value (as from `std::io::Error::raw_os_error`); unknown values and 0
    /// become `EIO`.
    pub fn from_raw(raw: i32) -> Errno {
        u32::try_from(raw)
            .ok()
            .and_then(Errno::from_code)
            .unwrap_or(Errno::EIO)
    }

    /// The value as a local errno (`i32`), for replies to the kernel.
    pub fn raw(self) -> i32 {
        self.0 as i32
    }
}

impl From<std::io::Error> for Errno {
    fn from(e: std::io::Error) -> Errno {
        Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<rustix::io::Errno> for Errno {
    fn from(e: rustix::io::Errno) -> Errno {
        Errno::from_raw(e.raw_os_error())
    }
}

impl fmt::Debug for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "Errno({})", self.0),
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?}: {}",
            self,
            std::io::Error::from_raw_os_error(self.raw())
        )
    }
}

impl std::error::Error for Errno {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_is_eio() {
        for e in Errno::KNOWN {
            assert_eq!(Errno::from_code(e.code()), Some(*e));
            assert_eq!(Errno::from_raw(e.raw()), *e);
        }
        assert_eq!(Errno::from_code(0), None);
        assert_eq!(Errno::from_code(9999), Some(Errno::EIO));
        assert_eq!(Errno::from_raw(-3), Errno::EIO);
        assert_eq!(Errno::from_raw(0), Errno::EIO);
        assert_eq!(Errno::ESTALE.raw(), libc::ESTALE);
        let io = std::io::Error::from_raw_os_error(libc::ENOTEMPTY);
        assert_eq!(Errno::from(io), Errno::ENOTEMPTY);
        assert!(format!("{}", Errno::EROFS).starts_with("EROFS"));
    }
}
