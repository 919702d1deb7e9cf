//! The lease a request or tunnel holds on its upstream, from connect to close.
//!
//! Releasing is never forgotten: a lease dropped without [`Lease::finish`] (the client went away
//! mid-response) is released as `cancelled`. Release never holds up the response: the embedded
//! store ends the lease on the spot, and the Redis store queues it for the pool's next release
//! call, which shutdown waits for. The outcome goes to the store and to the pool's health engine,
//! whose decisions are applied to the store right after (on the task tracker when they wait).
//!
//! A lease may also carry several exchanges: an inspected tunnel holds one lease (it is one
//! connection through the upstream) and relays many requests. Each of them is recorded with
//! [`Lease::record`] (or through an [`Exchange`]): health hears every one at once, the store's
//! statistics count every one, and the lease's own release then adds nothing of its own.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::access_log::Entry;
use crate::health;
use crate::meter::Tap;
use crate::metrics::Metrics;
use crate::outcome::Outcome;
use crate::pool::Pool;
use crate::store::{GatewayStore, Grant, Store};
use crate::upstream::Upstream;

pub struct Lease {
    inner: Option<Held>,
}

struct Held {
    store: Arc<GatewayStore>,
    tasks: TaskTracker,
    metrics: Arc<Metrics>,
    pool: Arc<Pool>,
    grant: Grant,
    upstream: Arc<Upstream>,
    target_host: Arc<str>,
    acquired_at: Instant,
    /// Time to the response head (or to the tunnel's establishment); set once.
    latency: Option<Duration>,
    /// The last exchange recorded with [`Lease::record`]: the store counts it with the release,
    /// which then stands for it (earlier ones were counted as they came).
    last_exchange: Mutex<Option<(Outcome, Duration)>>,
    /// Counts the bytes through this upstream (see [`crate::meter`]); set once connected.
    tap: Option<Arc<Tap>>,
    /// The request's access-log entry: learns the outcome at release.
    entry: Option<Arc<Entry>>,
    /// Upstreams the request tried before this one.
    retries: u32,
}

impl Lease {
    /// A lease on `grant`, released to `store` (on `tasks` when the release waits) and counted
    /// in `metrics`.
    pub(crate) fn new(
        store: Arc<GatewayStore>,
        tasks: TaskTracker,
        metrics: Arc<Metrics>,
        pool: Arc<Pool>,
        grant: Grant,
        upstream: Arc<Upstream>,
        target_host: Arc<str>,
    ) -> Self {
        Lease {
            inner: Some(Held {
                store,
                tasks,
                metrics,
                pool,
                grant,
                upstream,
                target_host,
                acquired_at: Instant::now(),
                latency: None,
                last_exchange: Mutex::new(None),
                tap: None,
                entry: None,
                retries: 0,
            }),
        }
    }

    fn held(&self) -> Option<&Held> {
        self.inner.as_ref()
    }

    pub fn upstream(&self) -> Option<&Arc<Upstream>> {
        self.held().map(|h| &h.upstream)
    }

    /// The upstream as this request connects through it: a provider upstream with its
    /// credentials filled in for the request (the same member, by id).
    pub fn use_upstream(&mut self, upstream: Arc<Upstream>) {
        if let Some(h) = self.inner.as_mut() {
            if h.upstream.id == upstream.id {
                h.upstream = upstream;
            }
        }
    }

    pub fn grant(&self) -> Option<&Grant> {
        self.held().map(|h| &h.grant)
    }

    /// The exchange's byte counter, once connected.
    pub fn tap(&self) -> Option<&Arc<Tap>> {
        self.held().and_then(|h| h.tap.as_ref())
    }

    pub fn set_tap(&mut self, tap: Arc<Tap>) {
        if let Some(h) = self.inner.as_mut() {
            h.tap = Some(tap);
        }
    }

    /// Upstreams the request tried before this one (see `proxy::open`).
    pub fn retries(&self) -> u32 {
        self.held().map_or(0, |h| h.retries)
    }

    pub fn set_retries(&mut self, n: u32) {
        if let Some(h) = self.inner.as_mut() {
            h.retries = n;
        }
    }

    /// Carries the request's access-log entry to the release, which tells it the outcome.
    pub fn set_entry(&mut self, entry: Arc<Entry>) {
        if let Some(h) = self.inner.as_mut() {
            h.entry = Some(entry);
        }
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

    /// Ends the lease with the exchange's outcome. On a lease that carried recorded exchanges,
    /// the release counts the last of them instead and `outcome` is not used.
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome);
    }

    /// Records one of several exchanges carried by this lease (a request relayed in an inspected
    /// tunnel): health observes it now, the store counts it now or, for the last one, at release.
    pub fn record(&self, outcome: Outcome, latency: Duration) {
        let Some(h) = self.held() else { return };
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let previous = h
            .last_exchange
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace((outcome, latency));
        let store = h.store.clone();
        let pool = h.pool.clone();
        let upstream = h.grant.upstream.clone();
        let target = h.target_host.clone();
        run_or_spawn(&h.tasks, async move {
            if let Some((o, l)) = previous {
                if let Err(e) = store.record(pool.name(), &upstream, o, l).await {
                    tracing::warn!(upstream = %upstream, error = %e, "recording an outcome failed");
                }
            }
            let changes = pool.health.observe(&upstream, &target, outcome, latency);
            health::apply(&*store, pool.name(), changes).await;
        });
    }

    fn release(&mut self, outcome: Outcome) {
        let Some(mut h) = self.inner.take() else {
            return;
        };
        // Without a runtime (process teardown) there is nobody left to tell.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let last = h
            .last_exchange
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        // Health already heard a recorded exchange; the release only counts it in the store.
        let observed = last.is_some();
        let (outcome, latency) = last.unwrap_or_else(|| {
            (
                outcome,
                h.latency.unwrap_or_else(|| h.acquired_at.elapsed()),
            )
        });
        // The line is written once its last holder lets go: this, or the request's handler.
        if let Some(entry) = h.entry.take() {
            entry.update(|f| f.outcome = Some(outcome));
        }
        h.metrics.record(
            h.pool.name(),
            h.grant.upstream.as_str(),
            h.pool.members().len(),
            outcome,
            latency.as_secs_f64(),
        );
        // Health hears the outcome now; what it decides goes to the store next, after the release
        // (for Redis, after it is queued: the two touch different keys).
        // Without a response head or an established tunnel the target never answered.
        let (up, target) = (&h.grant.upstream, &h.target_host);
        let changes = if observed {
            Vec::new()
        } else if h.latency.is_some() {
            h.pool.health.observe(up, target, outcome, latency)
        } else {
            h.pool
                .health
                .observe_unanswered(up, target, outcome, latency)
        };
        let (pool, upstream, lease) = (h.pool.name(), &h.grant.upstream, h.grant.lease);
        if let Err(e) = h.store.release_now(pool, upstream, lease, outcome, latency) {
            tracing::warn!(upstream = %upstream, error = %e, "lease release failed");
        }
        if !changes.is_empty() {
            run_or_spawn(&h.tasks, async move {
                health::apply(&*h.store, h.pool.name(), changes).await;
            });
        }
    }
}

/// Runs `work` here and now if it completes without waiting, else on the task tracker. Polled
/// once with a waker that does nothing: the spawned task polls it again at once, with its own.
fn run_or_spawn(tasks: &TaskTracker, work: impl Future<Output = ()> + Send + 'static) {
    let mut work = Box::pin(work);
    let mut cx = Context::from_waker(Waker::noop());
    if work.as_mut().poll(&mut cx).is_pending() {
        tasks.spawn(work);
    }
}

/// One exchange on a lease shared by several: records its outcome exactly once, `cancelled`
/// when dropped unfinished (the client went away mid-response).
pub struct Exchange {
    lease: Arc<Lease>,
    latency: Duration,
    done: bool,
}

impl Exchange {
    /// `latency`: time to the response head.
    pub fn new(lease: Arc<Lease>, latency: Duration) -> Self {
        Exchange {
            lease,
            latency,
            done: false,
        }
    }

    pub fn finish(mut self, outcome: Outcome) {
        self.done = true;
        self.lease.record(outcome, self.latency);
    }

    /// The shared lease's byte counter.
    pub fn tap(&self) -> Option<&Arc<Tap>> {
        self.lease.tap()
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if !self.done {
            self.lease.record(Outcome::Cancelled, self.latency);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release(Outcome::Cancelled);
    }
}
