//! The sans-IO protocol core: one [`Session`] per endpoint, fed with frame headers and
//! drained of frames and completions by a driver (braid's engine, or a test's simulator).

pub mod rate;
pub mod session;
pub(crate) mod spans;

pub use session::{
    EXPRESS_MAX, EXPRESS_WINDOW, ExpressAction, ExpressRequest, ExpressTo, HedgeStats, Placement,
    PostError, ProtocolError, Request, RxAction, Session, SessionConfig, Transmit,
};
