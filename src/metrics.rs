//! Every series the gateway exports: the registry and the live series recorded on the request
//! path (outcomes and latency, at lease release; rate-limit rejections and waits). Held by the
//! gateway and written by the lease; `/metrics` (in `admin::metrics`) refreshes the snapshot
//! series from `/status` and encodes them all.
//!
//! Two kinds of series share one registry: live ones recorded on the request path (outcomes and
//! latency, at lease release), and snapshot ones refreshed from the same data as `/status` at each
//! scrape (states, leases, sessions, incidents, the bounded top-targets matrix). Label cardinality is
//! bounded: pools and configured upstreams, outcomes, states, and at most
//! `health::engine::MATRIX_TARGETS` targets per pool.
//!
//! Every count of `/status` has a series here (the test `metrics_cover_status` walks `/status` and
//! holds every numeric field to its series). Counts kept outside this registry (request
//! accounting, interception, the store, health, probes, lists) are read from the same snapshot
//! at each scrape by `StatusSeries`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::fast_map::FastMap;
use crate::outcome::Outcome;
use crate::ratelimit::Scope;

pub(crate) fn rate_labels(pool: &str, scope: Scope) -> RateLimitLabels {
    RateLimitLabels {
        pool: pool.to_string(),
        scope: scope.as_str(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub pool: String,
    pub upstream: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PoolLabel {
    pub(crate) pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct UpstreamLabels {
    pub(crate) pool: String,
    pub(crate) upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct StateLabels {
    pub(crate) pool: String,
    pub(crate) state: String,
    /// The values of the pool's `metric_labels` keys (none unless configured).
    #[prometheus(flatten)]
    pub(crate) by: Vec<(String, String)>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TargetLabels {
    pub(crate) pool: String,
    pub(crate) target: String,
    pub(crate) upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RateLimitLabels {
    pub(crate) pool: String,
    pub(crate) scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RefusalLabels {
    pub(crate) pool: String,
    pub(crate) code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StoreLabels {
    pub(crate) kind: String,
}

pub(crate) type Ratio = Gauge<f64, std::sync::atomic::AtomicU64>;

pub(crate) fn latency_histogram() -> Histogram {
    // 1 ms to ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Every series the gateway exports.
pub struct Metrics {
    pub(crate) registry: Mutex<Registry>,
    pub(crate) requests: Family<OutcomeLabels, Counter>,
    pub(crate) latency: Family<PoolLabel, Histogram, fn() -> Histogram>,
    pub(crate) upstreams_by_state: Family<StateLabels, Gauge>,
    pub(crate) quarantine_limit: Family<PoolLabel, Gauge>,
    pub(crate) quarantine_used: Family<PoolLabel, Gauge>,
    pub(crate) leases_live: Family<UpstreamLabels, Gauge>,
    pub(crate) sessions_live: Family<PoolLabel, Gauge>,
    pub(crate) success_ratio: Family<UpstreamLabels, Ratio>,
    pub(crate) captcha_ratio: Family<UpstreamLabels, Ratio>,
    pub(crate) target_incidents: Family<PoolLabel, Gauge>,
    pub(crate) global_incident: Family<PoolLabel, Gauge>,
    pub(crate) target_success_ratio: Family<TargetLabels, Ratio>,
    pub(crate) target_captcha_ratio: Family<TargetLabels, Ratio>,
    pub(crate) store_up: Family<StoreLabels, Gauge>,
    pub(crate) uptime: Gauge,
    pub(crate) probe_results: Family<ProbeLabels, Gauge>,
    pub(crate) probe_incident: Family<PoolLabel, Gauge>,
    pub(crate) source_upstreams: Family<SourceLabels, Gauge>,
    pub(crate) source_fetches: Family<SourceLabels, Gauge>,
    pub(crate) rate_limited: Family<RateLimitLabels, Counter>,
    pub(crate) rate_limit_waits: Family<RateLimitLabels, Counter>,
    /// Requests a pool could not serve, by `X-Pool-Error` code.
    pub(crate) refusals: Family<RefusalLabels, Counter>,
    /// The series read from the `/status` snapshot.
    pub(crate) status_series: std::sync::Arc<StatusSeries>,
    /// The last hour in 10-second buckets, for `/status/history` and the dashboard.
    pub history: crate::history::History,
    /// `[metrics] per_upstream_max` in force: members of larger pools are counted together.
    per_upstream_max: AtomicUsize,
    /// pool -> upstream -> its `requests` and `latency` series (see [`Metrics::record`]).
    pub(crate) exchanges: RwLock<FastMap<String, FastMap<String, MemberSeries>>>,
}

/// One pool member's exchange series, found in their families once. A series is made on its
/// first use, as the family would make it, so `/metrics` lists the same series as before.
#[derive(Default)]
pub(crate) struct MemberSeries {
    pub(crate) outcomes: [OnceLock<Counter>; Outcome::ALL.len()],
    pub(crate) latency: OnceLock<Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SourceLabels {
    pub(crate) pool: String,
    pub(crate) state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProbeLabels {
    pub(crate) pool: String,
    pub(crate) result: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            requests: Family::default(),
            per_upstream_max: AtomicUsize::new(usize::MAX),
            latency: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            upstreams_by_state: Family::default(),
            quarantine_limit: Family::default(),
            quarantine_used: Family::default(),
            leases_live: Family::default(),
            sessions_live: Family::default(),
            success_ratio: Family::default(),
            captcha_ratio: Family::default(),
            target_incidents: Family::default(),
            global_incident: Family::default(),
            target_success_ratio: Family::default(),
            target_captcha_ratio: Family::default(),
            store_up: Family::default(),
            uptime: Gauge::default(),
            probe_results: Family::default(),
            probe_incident: Family::default(),
            source_upstreams: Family::default(),
            source_fetches: Family::default(),
            rate_limited: Family::default(),
            rate_limit_waits: Family::default(),
            refusals: Family::default(),
            status_series: Default::default(),
            history: Default::default(),
            exchanges: RwLock::default(),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|e| e.into_inner());
            r.register(
                "poolgate_requests",
                "Exchanges (requests and tunnels) by pool, upstream and outcome",
                m.requests.clone(),
            );
            r.register(
                "poolgate_request_duration_seconds",
                "Time to the response head (or tunnel established), by pool",
                m.latency.clone(),
            );
            r.register(
                "poolgate_upstreams",
                "Upstreams by state",
                m.upstreams_by_state.clone(),
            );
            r.register(
                "poolgate_quarantine_limit",
                "Upstreams that may be out of service at once",
                m.quarantine_limit.clone(),
            );
            r.register(
                "poolgate_quarantine_used",
                "Upstreams out of service (quarantined or dead)",
                m.quarantine_used.clone(),
            );
            r.register(
                "poolgate_leases_live",
                "Live leases by upstream",
                m.leases_live.clone(),
            );
            r.register(
                "poolgate_sessions_live",
                "Live sticky sessions by pool",
                m.sessions_live.clone(),
            );
            r.register(
                "poolgate_upstream_success_ratio",
                "Successes over the upstream's recent window",
                m.success_ratio.clone(),
            );
            r.register(
                "poolgate_upstream_captcha_ratio",
                "Captcha/blocked share over the upstream's recent window",
                m.captcha_ratio.clone(),
            );
            r.register(
                "poolgate_target_incidents",
                "Targets currently failing on most of the pool",
                m.target_incidents.clone(),
            );
            r.register(
                "poolgate_global_incident",
                "1 while most upstreams fail at once",
                m.global_incident.clone(),
            );
            r.register(
                "poolgate_target_success_ratio",
                "Success ratio per busiest target and upstream",
                m.target_success_ratio.clone(),
            );
            r.register(
                "poolgate_target_captcha_ratio",
                "Captcha/blocked share per busiest target and upstream",
                m.target_captcha_ratio.clone(),
            );
            r.register(
                "poolgate_store_up",
                "1 when the store is reachable, 0 when degraded",
                m.store_up.clone(),
            );
            r.register(
                "poolgate_probe_results",
                "Probes since start by result (passed, failed, unjudged: failed during a probe incident)",
                m.probe_results.clone(),
            );
            r.register(
                "poolgate_probe_incident",
                "1 while every control target fails through every upstream tried",
                m.probe_incident.clone(),
            );
            r.register(
                "poolgate_source_upstreams",
                "Upstreams of a pool's lists by state (listed, admitted, probing, pending, rejected), as this instance knows them",
                m.source_upstreams.clone(),
            );
            r.register(
                "poolgate_source_fetches",
                "Fetches of a pool's upstreams_url since start by result (ok, failed)",
                m.source_fetches.clone(),
            );
            r.register(
                "poolgate_rate_limited",
                "Requests answered 429 rate-limited, by pool and the limit that stopped them",
                m.rate_limited.clone(),
            );
            r.register(
                "poolgate_rate_limit_waits",
                "Requests that waited for a rate limit, by pool and limit",
                m.rate_limit_waits.clone(),
            );
            r.register(
                "poolgate_pool_refusals",
                "Requests a pool could not serve before any upstream was connected, by pool and X-Pool-Error code (pool-exhausted, no-upstream-available, rate-limited, store errors)",
                m.refusals.clone(),
            );
            r.register(
                "poolgate_uptime_seconds",
                "Seconds since start",
                m.uptime.clone(),
            );
            r.register_collector(Box::new(m.status_series.clone()));
        }
        m
    }

    /// Sets `[metrics] per_upstream_max` (at start and at each reload).
    pub fn set_per_upstream_max(&self, n: usize) {
        self.per_upstream_max.store(n, Ordering::Relaxed);
    }

    /// Records one finished exchange (called at every lease release). The member's series are
    /// kept at hand: recording is then two atomic updates under a read lock, instead of three
    /// label strings, two hashes and two family locks per exchange. (The two families are never
    /// cleared, so the kept series stay theirs.)
    ///
    /// A member of a pool of more than `per_upstream_max` members (`pool_size`) is counted under
    /// `upstream=""`, with the pool's other members: a pool of 100,000 exits would otherwise make
    /// as many series per outcome, and keep those of members long gone.
    pub fn record(
        &self,
        pool: &str,
        upstream: &str,
        pool_size: usize,
        outcome: Outcome,
        latency_s: f64,
    ) {
        self.history.record(pool, outcome, latency_s);
        let upstream = if pool_size > self.per_upstream_max.load(Ordering::Relaxed) {
            ""
        } else {
            upstream
        };
        let record = |s: &MemberSeries| {
            s.outcomes[outcome.index()]
                .get_or_init(|| {
                    self.requests
                        .get_or_create(&OutcomeLabels {
                            pool: pool.to_string(),
                            upstream: upstream.to_string(),
                            outcome: outcome.key(),
                        })
                        .clone()
                })
                .inc();
            s.latency
                .get_or_init(|| {
                    self.latency
                        .get_or_create(&PoolLabel {
                            pool: pool.to_string(),
                        })
                        .clone()
                })
                .observe(latency_s);
        };
        {
            let known = self.exchanges.read().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = known.get(pool).and_then(|m| m.get(upstream)) {
                return record(s);
            }
        }
        let mut known = self.exchanges.write().unwrap_or_else(|e| e.into_inner());
        let s = known
            .entry(pool.to_string())
            .or_default()
            .entry(upstream.to_string())
            .or_default();
        record(s);
    }

    /// Counts a request answered 429 `rate-limited` by `scope`'s limit.
    pub fn rate_limit_rejected(&self, pool: &str, scope: Scope) {
        self.rate_limited
            .get_or_create(&rate_labels(pool, scope))
            .inc();
    }

    /// Counts a request `pool` refused (or failed) before any upstream was connected; `code` is
    /// its `X-Pool-Error`.
    pub fn pool_refused(&self, pool: &str, code: &'static str) {
        self.refusals
            .get_or_create(&RefusalLabels {
                pool: pool.to_string(),
                code,
            })
            .inc();
    }

    /// Counts a request that had to wait for `scope`'s limit (once per request).
    pub fn rate_limit_waited(&self, pool: &str, scope: Scope) {
        self.rate_limit_waits
            .get_or_create(&rate_labels(pool, scope))
            .inc();
    }

    /// (rejected, waited) so far for `pool` and `scope`, for `/status`.
    pub fn rate_limit_counts(&self, pool: &str, scope: Scope) -> (u64, u64) {
        let labels = rate_labels(pool, scope);
        let read = |f: &Family<RateLimitLabels, Counter>| f.get(&labels).map_or(0, |c| c.get());
        (read(&self.rate_limited), read(&self.rate_limit_waits))
    }
}

/// Label pairs of one snapshot series.
pub(crate) type Labels = Vec<(&'static str, String)>;

/// One family of series read from the `/status` snapshot.
#[derive(Debug)]
pub(crate) struct StatusFamily {
    pub(crate) name: &'static str,
    pub(crate) help: &'static str,
    /// A count since start (exposed as a counter, `<name>_total`), else a current value.
    pub(crate) counter: bool,
    pub(crate) samples: Vec<(Labels, u64)>,
}

/// Series whose figures are kept outside this registry, set from the `/status` snapshot at each
/// scrape (so `/metrics` and `/status` show the same figures). Counters among them are exposed as
/// counters, though their values are read rather than incremented here.
#[derive(Debug, Default)]
pub(crate) struct StatusSeries(pub(crate) Mutex<Vec<StatusFamily>>);

impl StatusSeries {
    pub(crate) fn set(&self, families: Vec<StatusFamily>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = families;
    }
}

impl Collector for StatusSeries {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let families = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for f in families.iter() {
            let kind = if f.counter {
                MetricType::Counter
            } else {
                MetricType::Gauge
            };
            let mut family = encoder.encode_descriptor(f.name, f.help, None, kind)?;
            for (labels, value) in &f.samples {
                let series = family.encode_family(labels)?;
                if f.counter {
                    ConstCounter::new(*value).encode(series)?;
                } else {
                    ConstGauge::new(i64::try_from(*value).unwrap_or(i64::MAX)).encode(series)?;
                }
            }
        }
        Ok(())
    }
}
