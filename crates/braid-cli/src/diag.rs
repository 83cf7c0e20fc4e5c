//! What the `braid` command prints about itself: its error line and its log lines.

use std::io::IsTerminal;

/// An error and its causes as one line, `outer: cause: root cause`, each said once.
///
/// braid's error types put their cause in their own message and do not repeat it as their
/// `source()`; a cause whose text the line already ends with (a third-party error that does
/// both) is left out rather than printed twice.
pub fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// `RUST_LOG`'s default: braid's warnings. fuser's are left out: after an unmount from
/// outside it warns that its own unmount found nothing to unmount (`braid fs mount` says
/// what happened in one line); `RUST_LOG=warn` shows them.
pub const DEFAULT_LOG_FILTER: &str = "warn,fuser=error";

/// Logs to stderr at `RUST_LOG`'s levels (default [`DEFAULT_LOG_FILTER`]), with colour only
/// when stderr is a terminal (no escape codes in a file or a pipe).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Both(std::io::Error);
    impl std::fmt::Display for Both {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "opening x: {}", self.0)
        }
    }
    impl std::error::Error for Both {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_in_the_message_is_not_repeated() {
        let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
        let e = anyhow::Error::new(Both(io())).context("mounting /m");
        assert_eq!(error_line(&e), format!("mounting /m: opening x: {}", io()));
        let e = anyhow::Error::new(io()).context("reading f");
        assert_eq!(error_line(&e), format!("reading f: {}", io()));
    }

    /// braid's own error types say their cause once: in the message, not again as source.
    #[test]
    fn braid_errors_say_their_cause_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let errors: Vec<anyhow::Error> = vec![
            braid::Error::from(io()).into(),
            braid_boot::BootError::from(io()).into(),
            braid_fs::server::ServerError::from(io()).into(),
            braid_fs::server::ServerError::from(braid::Error::from(io())).into(),
            braid_fs::mount::MountError::from(braid::Error::from(io())).into(),
        ];
        for e in errors {
            let chained = format!("{e:#}");
            assert_eq!(chained.matches("refused here").count(), 1, "{chained}");
            assert_eq!(error_line(&e).matches("refused here").count(), 1);
        }
    }
}
