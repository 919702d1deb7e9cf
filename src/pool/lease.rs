//! The lease a request or tunnel holds on its upstream, from connect to close.
//!
//! Releasing is never forgotten: a lease dropped without [`Lease::finish`] (the client went away
//! mid-response) is released as `cancelled`. Release runs on the task tracker, off the response
//! path, and shutdown waits for it. The outcome goes to the store and to the pool's health engine,
//! whose decisions are applied to the store in the same task.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::admin::metrics::Metrics;
use crate::health::{self, Outcome};
use crate::pool::Pool;
use crate::state::Gateway;
use crate::store::{AnyStore, Grant, Store};
use crate::upstream::Upstream;

pub struct Lease {
    inner: Option<Held>,
}

struct Held {
    store: Arc<AnyStore>,
    tasks: TaskTracker,
    metrics: Arc<Metrics>,
    pool: Arc<Pool>,
    grant: Grant,
    upstream: Arc<Upstream>,
    target_host: Arc<str>,
    acquired_at: Instant,
    /// Time to the response head (or to the tunnel's establishment); set once.
    latency: Option<Duration>,
}

impl Lease {
    pub(crate) fn new(
        gw: &Gateway,
        pool: Arc<Pool>,
        grant: Grant,
        upstream: Arc<Upstream>,
        target_host: Arc<str>,
    ) -> Self {
        Lease {
            inner: Some(Held {
                store: gw.store.clone(),
                tasks: gw.tasks.clone(),
                metrics: gw.metrics.clone(),
                pool,
                grant,
                upstream,
                target_host,
                acquired_at: Instant::now(),
                latency: None,
            }),
        }
    }

    fn held(&self) -> Option<&Held> {
        self.inner.as_ref()
    }

    pub fn upstream(&self) -> Option<&Arc<Upstream>> {
        self.held().map(|h| &h.upstream)
    }

    pub fn grant(&self) -> Option<&Grant> {
        self.held().map(|h| &h.grant)
    }

    /// How long the lease lives without renewal.
    pub fn ttl(&self) -> Duration {
        self.held()
            .map_or(Duration::from_secs(60), |h| h.pool.config.lease_ttl)
    }

    /// Records the exchange's latency now (first response byte or tunnel established).
    pub fn mark_latency(&mut self) {
        if let Some(h) = self.inner.as_mut() {
            h.latency.get_or_insert_with(|| h.acquired_at.elapsed());
        }
    }

    /// Keeps the lease alive past its TTL (long tunnels).
    pub async fn extend(&self) {
        if let Some(h) = self.held() {
            if let Err(e) = h
                .store
                .extend(h.pool.name(), &h.grant.upstream, h.grant.lease)
                .await
            {
                tracing::warn!(upstream = %h.grant.upstream, error = %e, "lease extension failed");
            }
        }
    }

    /// Ends the lease with the exchange's outcome.
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    fn release(&mut self, outcome: Outcome) {
        let Some(h) = self.inner.take() else { return };
        // Without a runtime (process teardown) there is nobody left to tell.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let latency = h.latency.unwrap_or_else(|| h.acquired_at.elapsed());
        h.metrics.record(
            h.pool.name(),
            h.grant.upstream.as_str(),
            outcome.key(),
            latency.as_secs_f64(),
        );
        h.tasks.spawn(async move {
            if let Err(e) = h
                .store
                .release(
                    h.pool.name(),
                    &h.grant.upstream,
                    h.grant.lease,
                    outcome,
                    latency,
                )
                .await
            {
                tracing::warn!(upstream = %h.grant.upstream, error = %e, "lease release failed");
            }
            let changes =
                h.pool
                    .health
                    .observe(&h.grant.upstream, &h.target_host, outcome, latency);
            health::apply(&*h.store, h.pool.name(), changes).await;
        });
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release(Outcome::Cancelled);
    }
}
