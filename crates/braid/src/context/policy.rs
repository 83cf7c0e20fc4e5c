//! Authentication on by default: a process that listens where other hosts can reach it must
//! have a cluster secret, unless its user says, knowingly, that it runs without one.

use std::net::SocketAddr;
use std::sync::Once;

use braid_proto::error::Error;

/// Environment variable that lets a process listen on a non-loopback address without a
/// cluster secret (`1`, `true` or `yes`); a warning is printed once.
pub const INSECURE_ENV: &str = "BRAID_INSECURE";

/// How to make and hand out a secret, for error messages.
pub const MAKE_SECRET_HINT: &str = "make a secret once and give it to every process: \
`head -c 32 /dev/urandom | base64 > ~/.braid-secret && chmod 600 ~/.braid-secret; \
export BRAID_SECRET_FILE=~/.braid-secret` (see docs/SECURITY.md)";

/// Whether [`INSECURE_ENV`] is set to a true value.
pub fn insecure_from_env() -> bool {
    std::env::var(INSECURE_ENV).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// Whether every address is a loopback one (reachable only from this host). A wildcard
/// (`0.0.0.0`, `::`) is not.
pub fn all_loopback(addrs: &[SocketAddr]) -> bool {
    addrs.iter().all(|a| a.ip().is_loopback())
}

/// The rule for every braid listener (`what` names it in the messages: "the braid
/// listener", "the rendezvous", "the file server"): on loopback addresses anything goes; on
/// others a secret is required, unless `insecure`, which warns once per process.
pub fn check_listen(
    what: &str,
    addrs: &[SocketAddr],
    has_secret: bool,
    insecure: bool,
) -> Result<(), Error> {
    if has_secret || all_loopback(addrs) {
        return Ok(());
    }
    let shown: Vec<String> = addrs
        .iter()
        .filter(|a| !a.ip().is_loopback())
        .map(ToString::to_string)
        .collect();
    let shown = shown.join(", ");
    if insecure {
        static WARNED: Once = Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                "{what} listens on {shown} WITHOUT AUTHENTICATION ({INSECURE_ENV}): anyone who \
                 reaches it can connect; {MAKE_SECRET_HINT}"
            );
            eprintln!(
                "braid: warning: {what} listens on {shown} without authentication \
                 ({INSECURE_ENV}); anyone who reaches it can connect"
            );
        });
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "{what} refuses to listen on {shown} without a cluster secret: anyone who reaches \
         that address could connect. To authenticate peers, {MAKE_SECRET_HINT}. To run \
         without authentication on a network you trust, set {INSECURE_ENV}=1 (or pass \
         --insecure)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_needs_nothing_other_addresses_need_a_secret_or_consent() {
        assert!(check_listen("x", &[a("127.0.0.1:0"), a("[::1]:0")], false, false).is_ok());
        let e = check_listen("x", &[a("127.0.0.1:0"), a("0.0.0.0:0")], false, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("0.0.0.0:0") && !e.contains("127.0.0.1"), "{e}");
        assert!(
            e.contains("BRAID_SECRET_FILE") && e.contains("BRAID_INSECURE=1"),
            "{e}"
        );
        assert!(check_listen("x", &[a("198.18.0.1:0")], true, false).is_ok());
        assert!(check_listen("x", &[a("198.18.0.1:0")], false, true).is_ok());
    }
}
