//! Following the master Redis Sentinel names. A sentinel promotes a replica first and demotes the
//! old master later (seconds later after `SENTINEL FAILOVER`, when the old master is still up), and
//! meanwhile the old master keeps accepting writes that the new one never sees. So each instance
//! asks the sentinels once a second which master they name, and when it changes, drops its
//! connection: the next call connects to the new master (see `Inner::conn`).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use super::conn::Remote;
use super::{Inner, locked};

/// How often the sentinels are asked for the master's address (one command to one sentinel;
/// nothing is sent to Redis itself).
pub const MASTER_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Runs until the store is dropped; returns at once for a store without sentinels.
pub(super) async fn follow_master(inner: Arc<Inner>) {
    let Remote::Sentinel {
        sentinel,
        master_name,
        manager,
        master,
        ..
    } = &inner.remote
    else {
        return;
    };
    let mut conn: Option<MultiplexedConnection> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(MASTER_CHECK_INTERVAL) => {}
            _ = inner.stop.cancelled() => return,
        }
        let limit = inner.timeout.max(Duration::from_secs(1));
        let ask = async {
            if conn.is_none() {
                let client = Box::pin(sentinel.lock().await.async_get_sentinel_client()).await?;
                conn = Some(client.get_multiplexed_async_connection().await?);
            }
            let Some(c) = conn.as_mut() else {
                return Ok(None);
            };
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(master_name)
                .query_async::<Option<(String, u16)>>(c)
                .await
        };
        let named = match tokio::time::timeout(limit, ask).await {
            Ok(Ok(named)) => named,
            Ok(Err(e)) => {
                tracing::debug!(store = %inner.redacted, error = %e, "cannot ask the sentinels for the master");
                conn = None;
                continue;
            }
            Err(_) => {
                conn = None;
                continue;
            }
        };
        let Some((host, port)) = named else { continue };
        let named = format!("{host}:{port}");
        let current = locked(master).clone();
        if !current.is_empty() && current != named && manager.load().is_some() {
            tracing::warn!(
                store = %inner.redacted, old = %current, new = %named,
                "the sentinels name a new redis master; reconnecting"
            );
            manager.store(None);
            // Connects to the new master and names the connection (`CLIENT LIST`); a failure
            // here is met again, and handled, by the next call.
            if let Err(e) = inner.name_connection().await {
                tracing::debug!(store = %inner.redacted, error = ?e, "new redis master not answering yet");
            }
        }
    }
}
