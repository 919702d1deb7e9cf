//! Signals and what they mean.
//!
//! - SIGTERM or SIGINT (first): graceful shutdown. Stop accepting, let in-flight requests and
//!   tunnels finish within `server.shutdown_grace`, release their leases, exit 0.
//! - SIGTERM or SIGINT (second): stop waiting and exit at once (status 1).

use tokio::signal::unix::{SignalKind, signal};

/// Waits for SIGTERM or SIGINT and names it.
pub async fn terminate() -> std::io::Result<&'static str> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
