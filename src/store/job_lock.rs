//! A store lock that makes one gateway instance of many do a pool's periodic job: probing its
//! upstreams (`probe:<pool>`), reading its upstream lists (`sources:<pool>`).
//!
//! The holder renews the lock as it works, so another instance takes over within the lock's TTL
//! of the holder's death. When the store cannot be reached, every instance does the job for
//! itself: duplicate work is better than none.

use std::time::Duration;

use tokio::time::Instant;

use super::{LockToken, Store};

pub struct JobLock {
    name: String,
    /// The token while this instance holds the lock, and when it last took or renewed it.
    held: Option<(LockToken, Instant)>,
}

impl JobLock {
    pub fn new(name: String) -> Self {
        JobLock { name, held: None }
    }

    /// Whether this instance holds the lock (as of the last [`JobLock::lead`]).
    pub fn held(&self) -> bool {
        self.held.is_some()
    }

    /// Takes the lock, or renews it when the last renewal is `renew_every` old; true while this
    /// instance should do the job.
    pub async fn lead<S: Store + ?Sized>(
        &mut self,
        store: &S,
        ttl: Duration,
        renew_every: Duration,
    ) -> bool {
        let now = Instant::now();
        if let Some((token, renewed)) = &mut self.held {
            if now.duration_since(*renewed) < renew_every {
                return true;
            }
            match store.extend_lock(&self.name, token, ttl).await {
                Ok(true) => {
                    *renewed = now;
                    return true;
                }
                Ok(false) => {
                    tracing::info!(lock = %self.name, "job lock lost; another instance does this job now");
                    self.held = None;
                }
                Err(e) => {
                    tracing::debug!(lock = %self.name, error = %e, "job lock not renewed: store unreachable; working locally");
                    return true;
                }
            }
        }
        match store.lock(&self.name, ttl).await {
            Ok(Some(token)) => {
                tracing::info!(lock = %self.name, "job lock taken; this instance does this job");
                self.held = Some((token, now));
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::debug!(lock = %self.name, error = %e, "job lock not taken: store unreachable; working locally");
                true
            }
        }
    }

    /// Lets go of the lock, if held (the job stopped: a reload, or shutdown).
    pub async fn release<S: Store + ?Sized>(self, store: &S) {
        if let Some((token, _)) = self.held {
            let _ = store.unlock(&self.name, &token).await;
        }
    }
}
