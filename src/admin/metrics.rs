//! `/metrics`: Prometheus (OpenMetrics text) series.
//!
//! Two kinds of series share one registry: live ones recorded on the request path (outcomes and
//! latency, at lease release), and snapshot ones refreshed from the same data as `/status` at each
//! scrape (states, leases, sessions, incidents, the bounded top-targets matrix). Label cardinality is
//! bounded: pools and configured upstreams, outcomes, states, and at most
//! [`crate::health::engine::MATRIX_TARGETS`] targets per pool.
//!
//! Every count of `/status` has a series here (the test `metrics_cover_status` walks `/status` and
//! holds every numeric field to its series). Counts kept outside this registry (request
//! accounting, interception, the store, health, probes, lists) are read from the same snapshot
//! at each scrape by [`StatusSeries`].

use std::sync::{Mutex, OnceLock, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::admin::status::Status;
use crate::fast_map::FastMap;
use crate::health::Outcome;
use crate::ratelimit::Scope;

fn rate_labels(pool: &str, scope: Scope) -> RateLimitLabels {
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
struct PoolLabel {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    pool: String,
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    pool: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    pool: String,
    target: String,
    upstream: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RateLimitLabels {
    pool: String,
    scope: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    kind: String,
}

type Ratio = Gauge<f64, std::sync::atomic::AtomicU64>;

fn latency_histogram() -> Histogram {
    // 1 ms to ~33 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Every series the gateway exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<OutcomeLabels, Counter>,
    latency: Family<PoolLabel, Histogram, fn() -> Histogram>,
    upstreams_by_state: Family<StateLabels, Gauge>,
    quarantine_limit: Family<PoolLabel, Gauge>,
    quarantine_used: Family<PoolLabel, Gauge>,
    leases_live: Family<UpstreamLabels, Gauge>,
    sessions_live: Family<PoolLabel, Gauge>,
    success_ratio: Family<UpstreamLabels, Ratio>,
    captcha_ratio: Family<UpstreamLabels, Ratio>,
    target_incidents: Family<PoolLabel, Gauge>,
    global_incident: Family<PoolLabel, Gauge>,
    target_success_ratio: Family<TargetLabels, Ratio>,
    target_captcha_ratio: Family<TargetLabels, Ratio>,
    store_up: Family<StoreLabels, Gauge>,
    uptime: Gauge,
    probe_results: Family<ProbeLabels, Gauge>,
    probe_incident: Family<PoolLabel, Gauge>,
    source_upstreams: Family<SourceLabels, Gauge>,
    source_fetches: Family<SourceLabels, Gauge>,
    rate_limited: Family<RateLimitLabels, Counter>,
    rate_limit_waits: Family<RateLimitLabels, Counter>,
    /// The series read from the `/status` snapshot.
    status_series: std::sync::Arc<StatusSeries>,
    /// pool -> upstream -> its `requests` and `latency` series (see [`Metrics::record`]).
    exchanges: RwLock<FastMap<String, FastMap<String, MemberSeries>>>,
}

/// One pool member's exchange series, found in their families once. A series is made on its
/// first use, as the family would make it, so `/metrics` lists the same series as before.
#[derive(Default)]
struct MemberSeries {
    outcomes: [OnceLock<Counter>; Outcome::ALL.len()],
    latency: OnceLock<Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    pool: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    pool: String,
    result: &'static str,
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
            status_series: Default::default(),
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
                "poolgate_uptime_seconds",
                "Seconds since start",
                m.uptime.clone(),
            );
            r.register_collector(Box::new(m.status_series.clone()));
        }
        m
    }

    /// Records one finished exchange (called at every lease release). The member's series are
    /// kept at hand: recording is then two atomic updates under a read lock, instead of three
    /// label strings, two hashes and two family locks per exchange. (The two families are never
    /// cleared, so the kept series stay theirs.)
    pub fn record(&self, pool: &str, upstream: &str, outcome: Outcome, latency_s: f64) {
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

    /// Refreshes the snapshot series from `status` and encodes everything.
    pub fn render(&self, status: &Status) -> Result<String, std::fmt::Error> {
        for f in [
            &self.quarantine_limit,
            &self.quarantine_used,
            &self.sessions_live,
            &self.target_incidents,
            &self.global_incident,
        ] {
            f.clear();
        }
        self.upstreams_by_state.clear();
        self.leases_live.clear();
        self.success_ratio.clear();
        self.captcha_ratio.clear();
        self.target_success_ratio.clear();
        self.target_captcha_ratio.clear();
        self.store_up.clear();
        self.probe_results.clear();
        self.probe_incident.clear();
        self.source_upstreams.clear();
        self.source_fetches.clear();

        self.uptime.set(status.uptime_s as i64);
        self.store_up
            .get_or_create(&StoreLabels {
                kind: status.store.kind.to_string(),
            })
            .set(i64::from(status.store.health == "ok"));
        for p in &status.pools {
            let pool = PoolLabel {
                pool: p.name.clone(),
            };
            for (state, n) in &p.counts_by_state {
                self.upstreams_by_state
                    .get_or_create(&StateLabels {
                        pool: p.name.clone(),
                        state: state.to_string(),
                    })
                    .set(*n as i64);
            }
            self.quarantine_limit
                .get_or_create(&pool)
                .set(p.quarantine_cap.limit as i64);
            self.quarantine_used
                .get_or_create(&pool)
                .set(p.quarantine_cap.used as i64);
            self.sessions_live
                .get_or_create(&pool)
                .set(p.sessions_live as i64);
            self.target_incidents
                .get_or_create(&pool)
                .set(p.incidents.targets.len() as i64);
            self.global_incident
                .get_or_create(&pool)
                .set(i64::from(p.incidents.global));
            for u in &p.upstreams {
                let labels = UpstreamLabels {
                    pool: p.name.clone(),
                    upstream: u.id.clone(),
                };
                self.leases_live
                    .get_or_create(&labels)
                    .set(u.stats.leases_live as i64);
                if let Some(h) = &u.health {
                    if let Some(r) = h.success_ratio {
                        self.success_ratio.get_or_create(&labels).set(r);
                    }
                    if let Some(r) = h.captcha_ratio {
                        self.captcha_ratio.get_or_create(&labels).set(r);
                    }
                }
            }
            if let Some(probes) = &p.probes {
                for (result, n) in [
                    ("passed", probes.passed),
                    ("failed", probes.failed - probes.failed_unjudged),
                    ("unjudged", probes.failed_unjudged),
                ] {
                    self.probe_results
                        .get_or_create(&ProbeLabels {
                            pool: p.name.clone(),
                            result,
                        })
                        .set(n as i64);
                }
                self.probe_incident
                    .get_or_create(&pool)
                    .set(i64::from(probes.incident.is_some()));
            }
            if let Some(src) = &p.sources {
                let label = |state| SourceLabels {
                    pool: p.name.clone(),
                    state,
                };
                for (state, n) in [
                    ("listed", src.listed),
                    ("admitted", src.admitted),
                    ("probing", src.probing),
                    ("pending", src.pending),
                    ("rejected", src.rejected),
                ] {
                    self.source_upstreams
                        .get_or_create(&label(state))
                        .set(n as i64);
                }
                for (state, n) in [("ok", src.fetches_ok), ("failed", src.fetches_failed)] {
                    self.source_fetches
                        .get_or_create(&label(state))
                        .set(n as i64);
                }
            }
            for row in &p.matrix {
                for cell in &row.cells {
                    let labels = TargetLabels {
                        pool: p.name.clone(),
                        target: row.target.clone(),
                        upstream: cell.upstream.clone(),
                    };
                    self.target_success_ratio
                        .get_or_create(&labels)
                        .set(cell.success_ratio);
                    self.target_captcha_ratio
                        .get_or_create(&labels)
                        .set(cell.captcha_ratio);
                }
            }
            // Every limit's series from the start, at 0, as `/status` shows them.
            for scope in Scope::ALL {
                let labels = rate_labels(&p.name, scope);
                drop(self.rate_limited.get_or_create(&labels));
                drop(self.rate_limit_waits.get_or_create(&labels));
            }
        }
        self.status_series.set(status_families(status));
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// Label pairs of one snapshot series.
type Labels = Vec<(&'static str, String)>;

/// One family of series read from the `/status` snapshot.
#[derive(Debug)]
struct StatusFamily {
    name: &'static str,
    help: &'static str,
    /// A count since start (exposed as a counter, `<name>_total`), else a current value.
    counter: bool,
    samples: Vec<(Labels, u64)>,
}

/// Series whose figures are kept outside this registry, set from the `/status` snapshot at each
/// scrape (so `/metrics` and `/status` show the same figures). Counters among them are exposed as
/// counters, though their values are read rather than incremented here.
#[derive(Debug, Default)]
struct StatusSeries(Mutex<Vec<StatusFamily>>);

impl StatusSeries {
    fn set(&self, families: Vec<StatusFamily>) {
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

/// The snapshot series of `s`: every family always, with a series per figure `/status` shows.
fn status_families(s: &Status) -> Vec<StatusFamily> {
    let mut out = Vec::new();
    let mut family = |name, help, counter, samples| {
        out.push(StatusFamily {
            name,
            help,
            counter,
            samples,
        })
    };
    let one = |value: u64| vec![(Labels::new(), value)];
    let by = |label: &'static str, values: &[(&'static str, u64)]| -> Vec<(Labels, u64)> {
        values
            .iter()
            .map(|(k, v)| (vec![(label, k.to_string())], *v))
            .collect()
    };

    let r = &s.traffic.requests;
    family(
        "poolgate_requests_accepted",
        "Client requests accepted (head parsed) since start",
        true,
        one(r.accepted),
    );
    family(
        "poolgate_requests_ended",
        "Accepted client requests that ended, by how (completed, rejected: a 4xx of the gateway, failed: a 5xx of the gateway or a broken response)",
        true,
        by(
            "end",
            &[
                ("completed", r.completed),
                ("rejected", r.rejected),
                ("failed", r.failed),
            ],
        ),
    );
    family(
        "poolgate_requests_in_flight",
        "Accepted client requests not yet ended",
        false,
        one(r.in_flight),
    );
    family(
        "poolgate_requests_forwarded",
        "Plain requests whose head was sent to an upstream, since start",
        true,
        one(r.forwarded),
    );
    family(
        "poolgate_tunnels",
        "CONNECT tunnels since start",
        true,
        one(s.traffic.tunnels.total),
    );
    family(
        "poolgate_tunnels_open",
        "CONNECT tunnels open now",
        false,
        one(s.traffic.tunnels.open),
    );
    family(
        "poolgate_connections_open",
        "Client connections open on the proxy port",
        false,
        one(s.traffic.connections.open),
    );
    family(
        "poolgate_connections_refused",
        "Client connections refused by the connection limits since start",
        true,
        one(s.traffic.connections.refused),
    );
    let c = &s.traffic.config;
    family(
        "poolgate_config_generation",
        "Config generation: 1 at start, +1 per successful reload",
        false,
        one(c.generation),
    );
    family(
        "poolgate_config_reloads",
        "Config reloads since start by result (ok, failed)",
        true,
        by(
            "result",
            &[("ok", c.reloads_ok), ("failed", c.reloads_failed)],
        ),
    );

    let i = &s.intercept;
    family(
        "poolgate_intercept_tunnels",
        "Tunnels of inspecting pools since start by mode (inspected, excluded, passthrough)",
        true,
        by(
            "mode",
            &[
                ("inspected", i.tunnels_inspected),
                ("excluded", i.tunnels_excluded),
                ("passthrough", i.tunnels_passthrough),
            ],
        ),
    );
    family(
        "poolgate_intercept_requests",
        "Requests relayed inside inspected tunnels since start",
        true,
        one(i.requests),
    );
    family(
        "poolgate_intercept_handshake_failures",
        "Failed TLS handshakes of interception since start by side (client: with the gateway, origin: with the origin)",
        true,
        by(
            "side",
            &[
                ("client", i.client_handshake_failures),
                ("origin", i.origin_handshake_failures),
            ],
        ),
    );
    family(
        "poolgate_intercept_certs_minted",
        "Leaf certificates minted since start",
        true,
        one(i.certs_minted),
    );
    family(
        "poolgate_intercept_cert_cache_entries",
        "Leaf certificates cached now",
        false,
        one(i.cert_cache_entries as u64),
    );
    family(
        "poolgate_intercept_cert_cache_capacity",
        "Leaf certificates the cache holds at most",
        false,
        one(i.cert_cache_capacity as u64),
    );

    let mut allocations = Vec::new();
    let mut outcomes = Vec::new();
    let mut quarantines = Vec::new();
    let mut target_exchanges = Vec::new();
    let mut probes_in_flight = Vec::new();
    let mut reference_probes = Vec::new();
    let mut rate_limit_keys = Vec::new();
    let mut skipped_lines = Vec::new();
    for p in &s.pools {
        let pool = || ("pool", p.name.clone());
        for u in &p.upstreams {
            let labels = || vec![pool(), ("upstream", u.id.clone())];
            allocations.push((labels(), u.stats.allocations));
            for (outcome, n) in &u.stats.outcomes {
                let mut l = labels();
                l.push(("outcome", outcome.to_string()));
                outcomes.push((l, *n));
            }
            if let Some(h) = &u.health {
                quarantines.push((labels(), h.quarantines_total));
            }
        }
        for row in &p.matrix {
            for cell in &row.cells {
                for (result, n) in [
                    ("ok", cell.counts.ok),
                    ("faults", cell.counts.faults),
                    ("bans", cell.counts.bans),
                ] {
                    let l = vec![
                        pool(),
                        ("target", row.target.clone()),
                        ("upstream", cell.upstream.clone()),
                        ("result", result.to_string()),
                    ];
                    target_exchanges.push((l, n));
                }
            }
        }
        if let Some(probes) = &p.probes {
            probes_in_flight.push((vec![pool()], probes.in_flight as u64));
            reference_probes.push((vec![pool()], probes.reference_probes));
        }
        rate_limit_keys.push((vec![pool()], p.rate_limit.keys_tracked as u64));
        if let Some(src) = &p.sources {
            skipped_lines.push((vec![pool()], src.skipped_lines as u64));
        }
    }
    family(
        "poolgate_upstream_allocations",
        "Leases granted per upstream since start, as the store counts them",
        true,
        allocations,
    );
    family(
        "poolgate_upstream_outcomes",
        "Recorded exchange outcomes per upstream since start, as the store counts them (every request of an inspected tunnel and every feedback report included)",
        true,
        outcomes,
    );
    family(
        "poolgate_upstream_quarantines",
        "Quarantines per upstream since start",
        true,
        quarantines,
    );
    family(
        "poolgate_target_exchanges",
        "Exchanges health counted per busiest target and upstream by result (ok, faults, bans)",
        false,
        target_exchanges,
    );
    family(
        "poolgate_probes_in_flight",
        "Probes of a pool under way",
        false,
        probes_in_flight,
    );
    family(
        "poolgate_reference_probes",
        "Reference probes (through other upstreams, after a failed probe) since start",
        true,
        reference_probes,
    );
    family(
        "poolgate_rate_limit_keys",
        "Rate-limit buckets this instance holds now",
        false,
        rate_limit_keys,
    );
    family(
        "poolgate_source_skipped_lines",
        "Malformed lines skipped at the last read of a pool's lists",
        false,
        skipped_lines,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exchanges are counted per pool, member and outcome (the kept series are the families'
    /// own), latency per pool, and an outcome never seen has no series.
    #[test]
    fn exchanges_count_per_member_and_outcome() {
        let m = Metrics::new();
        for _ in 0..3 {
            m.record("p", "http://a:1", Outcome::Ok, 0.01);
        }
        m.record("p", "http://a:1", Outcome::Timeout, 0.5);
        m.record("p", "http://b:1", Outcome::Ok, 0.02);
        m.record("q", "http://a:1", Outcome::Ok, 0.02);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry.lock().unwrap()).unwrap();
        for line in [
            r#"poolgate_requests_total{pool="p",upstream="http://a:1",outcome="ok"} 3"#,
            r#"poolgate_requests_total{pool="p",upstream="http://a:1",outcome="timeout"} 1"#,
            r#"poolgate_requests_total{pool="p",upstream="http://b:1",outcome="ok"} 1"#,
            r#"poolgate_requests_total{pool="q",upstream="http://a:1",outcome="ok"} 1"#,
            r#"poolgate_request_duration_seconds_count{pool="p"} 5"#,
            r#"poolgate_request_duration_seconds_count{pool="q"} 1"#,
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(!out.contains(r#"outcome="captcha""#), "{out}");
    }
}
