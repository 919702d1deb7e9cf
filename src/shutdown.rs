//! Signals and what they mean.
//!
//! - SIGTERM or SIGINT (first): graceful shutdown. Stop accepting, let in-flight requests and
//!   tunnels finish within `server.shutdown_grace`, then close the tunnels still open, release
//!   every lease, exit 0.
//! - SIGTERM or SIGINT (second): stop waiting and exit at once (status 1).
//! - SIGHUP: reload the config file. An invalid file is refused (logged with the reason) and the
//!   running config is kept. The access log's file is reopened too (as after SIGUSR1). SIGHUP
//!   during shutdown is ignored.
//! - SIGUSR1: reopen the access log's file only (logrotate's `postrotate`); ignored during
//!   shutdown.

use tokio::signal::unix::{Signal as UnixSignal, SignalKind, signal};

/// What a signal asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Terminate(&'static str),
    Reload,
    Reopen,
}

/// The signals the gateway listens for, registered once.
pub struct Signals {
    term: UnixSignal,
    int: UnixSignal,
    hup: UnixSignal,
    usr1: UnixSignal,
}

impl Signals {
    pub fn new() -> std::io::Result<Self> {
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            usr1: signal(SignalKind::user_defined1())?,
        })
    }

    /// The next signal.
    pub async fn next(&mut self) -> Signal {
        tokio::select! {
            _ = self.term.recv() => Signal::Terminate("SIGTERM"),
            _ = self.int.recv() => Signal::Terminate("SIGINT"),
            _ = self.hup.recv() => Signal::Reload,
            _ = self.usr1.recv() => Signal::Reopen,
        }
    }

    /// The next SIGTERM or SIGINT, ignoring SIGHUP and SIGUSR1 (used while shutting down).
    pub async fn next_terminate(&mut self) -> &'static str {
        loop {
            if let Signal::Terminate(sig) = self.next().await {
                return sig;
            }
        }
    }
}

/// Waits for SIGTERM or SIGINT and names it.
pub async fn terminate() -> std::io::Result<&'static str> {
    Ok(Signals::new()?.next_terminate().await)
}
