//! The `/status` document. Field names are a public contract (docs/operations.md, "/status"): snake_case, units
//! in the names, never an upstream credential.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::health::engine::{MatrixRow, TargetIncident, UpstreamHealthView};
use crate::ratelimit::RateLimitView;
use crate::state::Gateway;
use crate::store::{MemberStatus, Store};

#[derive(Serialize)]
pub struct Status {
    pub instance_id: String,
    pub version: &'static str,
    pub uptime_s: u64,
    pub store: StoreStatus,
    pub pools: Vec<PoolView>,
    /// Requests, tunnels, connections and config generation (see `crate::accounting`).
    #[serde(flatten)]
    pub traffic: crate::admin::traffic::TrafficView,
    /// TLS interception counters (docs/operations.md, "Admin endpoint").
    pub intercept: crate::intercept::InterceptStatus,
    /// Proxy logins: password checks, failures, lockouts (see `crate::auth`).
    pub auth: crate::auth::AuthStats,
    /// Bytes up and down per authenticated user, this instance's since start (see `crate::meter`).
    pub users: Vec<UserView>,
    /// Access-log lines written and dropped (see `crate::access_log`).
    pub access_log: crate::access_log::AccessLogStats,
}

#[derive(Serialize)]
pub struct UserView {
    pub name: String,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Serialize)]
pub struct StoreStatus {
    pub kind: &'static str,
    /// `ok`, or `degraded` when the store cannot be reached.
    pub health: &'static str,
    /// Why the store is degraded (the last error, never a credential); absent when `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Serialize)]
pub struct PoolView {
    pub name: String,
    /// Label keys `/metrics` splits `poolgate_upstreams` by (`metric_labels`).
    #[serde(skip)]
    pub metric_labels: Vec<String>,
    pub default: bool,
    pub strategy: &'static str,
    pub max_concurrency: Option<u32>,
    pub upstreams_total: usize,
    /// Bytes out through the pool's upstreams (request bodies, tunnel bytes) since start, on this
    /// instance.
    pub bytes_up: u64,
    /// Bytes back from them.
    pub bytes_down: u64,
    /// Bytes by value of each `metric_labels` key, summed over the members with that value:
    /// `{"country": {"us": {"bytes_up": …, "bytes_down": …}}}`.
    pub bytes_by_label: BTreeMap<String, BTreeMap<String, LabelBytes>>,
    pub sessions_live: u64,
    pub leases_live: u64,
    pub counts_by_state: std::collections::BTreeMap<&'static str, usize>,
    /// Members by label key, value and state: `{"country": {"us": {"healthy": 40}}}`.
    pub labels: BTreeMap<String, BTreeMap<String, BTreeMap<&'static str, usize>>>,
    pub quarantine_cap: QuarantineCap,
    pub incidents: Incidents,
    pub upstreams: Vec<UpstreamView>,
    /// Exit IPs that two members or more share (see each upstream's `shares_exit_ip_with`).
    pub shared_exit_ips: usize,
    /// Success and captcha rates per (target × upstream), for the busiest targets.
    pub matrix: Vec<MatrixRow>,
    /// Active probing (`null` when the pool has no `[pools.*.probe]` section).
    pub probes: Option<crate::probe::prober::ProbeStatus>,
    /// This instance's rate limits: configured rates, buckets held, rejections and waits.
    pub rate_limit: RateLimitView,
    /// Upstream lists and admission (`null` when the pool has no `upstreams_file`/`upstreams_url`).
    pub sources: Option<crate::sources::SourceStatus>,
}

#[derive(Serialize, Default)]
pub struct LabelBytes {
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Serialize)]
pub struct QuarantineCap {
    pub limit: usize,
    pub used: usize,
}

#[derive(Serialize)]
pub struct Incidents {
    /// Most upstreams fail at once: nothing is quarantined while this holds.
    pub global: bool,
    /// Targets failing on most upstreams: their failures do not count against upstreams.
    pub targets: Vec<TargetIncident>,
}

#[derive(Serialize)]
pub struct UpstreamView {
    pub id: String,
    pub scheme: &'static str,
    /// Bytes up and down through this upstream; `null` in pools of more than
    /// `[metrics] per_upstream_max` members (their figures are the pool's only).
    pub bytes_up: Option<u64>,
    pub bytes_down: Option<u64>,
    /// The member's labels, `{"country": "de", "type": "datacenter"}`.
    pub labels: BTreeMap<String, String>,
    #[serde(flatten)]
    pub health: Option<UpstreamHealthView>,
    #[serde(flatten)]
    pub stats: MemberStatus,
}

pub async fn collect(gw: &Gateway) -> Status {
    let pools = gw.pools.load_full();
    let mut views = Vec::new();
    let mut store_ok = true;
    for pool in pools.iter() {
        let st = match gw.store.status(pool.name()).await {
            Ok(st) => st,
            Err(e) => {
                tracing::warn!(pool = pool.name(), error = %e, "store status failed");
                store_ok = false;
                Default::default()
            }
        };
        let mut hv = pool.health.view();
        let per_upstream = pool.members().len() <= gw.live.load().metrics.per_upstream_max;
        let upstreams: Vec<UpstreamView> = st
            .members
            .into_iter()
            .map(|m| {
                let up = pool.upstream(&crate::upstream::UpstreamId::new(m.id.as_str()));
                let scheme = up.map_or("unknown", |u| u.scheme.as_str());
                let labels = up.map_or_else(BTreeMap::new, |u| {
                    u.labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                });
                let bytes = per_upstream.then(|| gw.meter.upstream(pool.name(), &m.id));
                UpstreamView {
                    id: m.id.clone(),
                    scheme,
                    labels,
                    bytes_up: bytes.map(|b| b.up),
                    bytes_down: bytes.map(|b| b.down),
                    health: hv
                        .upstreams
                        .remove(&crate::upstream::UpstreamId::new(m.id.as_str())),
                    stats: m,
                }
            })
            .collect();
        let mut by_label: BTreeMap<String, BTreeMap<String, BTreeMap<&'static str, usize>>> =
            BTreeMap::new();
        for u in &upstreams {
            let state = u.health.as_ref().map_or("unknown", |h| h.state);
            for (k, v) in &u.labels {
                *by_label
                    .entry(k.clone())
                    .or_default()
                    .entry(v.clone())
                    .or_default()
                    .entry(state)
                    .or_default() += 1;
            }
        }
        // Every member's bytes are counted whatever per_upstream_max says: a label value's are
        // their sum, for the keys the operator named (bounded, as metric_labels is).
        let mut bytes_by_label: BTreeMap<String, BTreeMap<String, LabelBytes>> = BTreeMap::new();
        for key in &pool.config.metric_labels {
            let values = bytes_by_label.entry(key.clone()).or_default();
            for id in pool.members() {
                let Some(value) = pool.upstream(id).and_then(|u| u.labels.get(key)) else {
                    continue;
                };
                let b = gw.meter.upstream(pool.name(), id.as_str());
                let sum = values.entry(value.to_string()).or_default();
                sum.bytes_up += b.up;
                sum.bytes_down += b.down;
            }
        }
        views.push(PoolView {
            name: pool.name().to_string(),
            bytes_by_label,
            metric_labels: pool.config.metric_labels.clone(),
            default: pool.name() == gw.live.load().default_pool,
            strategy: pool.config.strategy.as_str(),
            max_concurrency: pool.config.max_concurrency.map(|n| n.get()),
            upstreams_total: pool.members().len(),
            bytes_up: gw.meter.pool(pool.name()).up,
            bytes_down: gw.meter.pool(pool.name()).down,
            sessions_live: st.sessions_live,
            leases_live: upstreams.iter().map(|u| u.stats.leases_live).sum(),
            counts_by_state: hv.counts_by_state,
            labels: by_label,
            quarantine_cap: QuarantineCap {
                limit: hv.quarantine_cap,
                used: hv.quarantined,
            },
            incidents: Incidents {
                global: hv.global_incident,
                targets: hv.target_incidents,
            },
            upstreams,
            shared_exit_ips: hv.shared_exit_ips,
            matrix: hv.matrix,
            probes: pool
                .config
                .probe
                .as_ref()
                .map(|_| gw.probes.status(pool.name()).unwrap_or_default()),
            rate_limit: RateLimitView::new(
                &pool.config.rate_limit,
                gw.ratelimits.keys(pool.name()),
                |scope| gw.metrics.rate_limit_counts(pool.name(), scope),
            ),
            sources: (!pool.config.sources.is_empty())
                .then(|| gw.sources.status(pool.name()).unwrap_or_default()),
        });
    }
    Status {
        instance_id: gw.instance_id.clone(),
        version: env!("CARGO_PKG_VERSION"),
        uptime_s: gw.started.elapsed().as_secs(),
        store: StoreStatus {
            kind: gw.store.kind(),
            health: if store_ok {
                gw.store.health()
            } else {
                "degraded"
            },
            reason: gw.store.health_reason(),
        },
        pools: views,
        traffic: crate::admin::traffic::TrafficView::collect(gw).await,
        intercept: gw.intercept.status(),
        auth: gw.auth.stats(),
        users: gw
            .meter
            .users()
            .into_iter()
            .map(|(name, b)| UserView {
                name,
                bytes_up: b.up,
                bytes_down: b.down,
            })
            .collect(),
        access_log: gw
            .access_log
            .as_ref()
            .map(|l| l.stats())
            .unwrap_or_default(),
    }
}
