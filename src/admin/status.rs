//! The `/status` document. Field names are a public contract (docs/operations.md, "/status"): snake_case, units
//! in the names, never an upstream credential.
//!
//! A pool's member list is paged ([`Listing`], from `/status?upstreams=…&limit=…&offset=…`): a
//! pool of 100,000 exits would otherwise make a document of tens of megabytes on every poll of
//! the dashboard. The pool's totals (states, labels, leases) always count every member.

use std::collections::BTreeMap;
use std::fmt;

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
    /// Store pools the pool's state is spread over (`shards`).
    pub shards: u32,
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
    /// Which members `upstreams` lists: its order, where it starts, and how many it holds.
    pub upstreams_page: Page,
    pub upstreams: Vec<UpstreamView>,
    /// Whether `/metrics` gives this pool per-upstream series (`[metrics] per_upstream_max`).
    #[serde(skip)]
    pub per_upstream: bool,
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

/// The part of a pool's member list a `/status` document shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub order: Order,
    pub offset: usize,
    /// Members listed per pool at most.
    pub limit: usize,
    /// Only this pool, when set.
    pub pool: Option<String>,
}

/// The order members are listed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// As configured (inline members, then admitted ones).
    Configured,
    /// Busiest first: most live leases, then most allocations.
    Top,
    /// None: the pools' totals only.
    None,
}

/// Members listed per pool when `/status` does not say.
pub const DEFAULT_LIMIT: usize = 1000;
/// The most members one `/status` document lists per pool.
pub const MAX_LIMIT: usize = 100_000;

/// A `/status` query that cannot be served: names the parameter.
#[derive(Debug, PartialEq, Eq)]
pub struct BadQuery(String);

impl fmt::Display for BadQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Default for Listing {
    fn default() -> Self {
        Listing {
            order: Order::Configured,
            offset: 0,
            limit: DEFAULT_LIMIT,
            pool: None,
        }
    }
}

impl Listing {
    /// Every member of every pool, for `/metrics`, which needs them all for its totals.
    pub fn everything() -> Self {
        Listing {
            limit: usize::MAX,
            ..Listing::default()
        }
    }

    /// Reads `upstreams=all|top|none`, `limit=N` (1–100000), `offset=N` and `pool=NAME` from a
    /// query string; anything else is refused, naming it.
    pub fn parse(query: Option<&str>) -> Result<Listing, BadQuery> {
        let mut l = Listing::default();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let number = |max: usize| -> Result<usize, BadQuery> {
                v.parse::<usize>()
                    .ok()
                    .filter(|n| *n <= max)
                    .ok_or_else(|| BadQuery(format!("{k}: expected a number up to {max}")))
            };
            match k {
                "upstreams" => {
                    l.order = match v {
                        "all" => Order::Configured,
                        "top" => Order::Top,
                        "none" => Order::None,
                        _ => return Err(BadQuery("upstreams: expected all, top or none".into())),
                    }
                }
                "limit" => {
                    l.limit = number(MAX_LIMIT)?;
                    if l.limit == 0 {
                        return Err(BadQuery(format!(
                            "limit: expected a number from 1 to {MAX_LIMIT}"
                        )));
                    }
                }
                "offset" => l.offset = number(usize::MAX)?,
                "pool" if !v.is_empty() => l.pool = Some(v.to_string()),
                _ => {
                    return Err(BadQuery(format!(
                        "unknown parameter {k:?}: /status takes upstreams, limit, offset and pool"
                    )));
                }
            }
        }
        Ok(l)
    }

    /// Keeps the listed part of `upstreams` (all of a pool's members, in configured order).
    fn page(&self, mut upstreams: Vec<UpstreamView>) -> (Page, Vec<UpstreamView>) {
        if self.order == Order::Top {
            // Stable: ties stay in configured order.
            upstreams.sort_by(|a, b| {
                (b.stats.leases_live, b.stats.allocations)
                    .cmp(&(a.stats.leases_live, a.stats.allocations))
            });
        }
        let listed: Vec<UpstreamView> = if self.order == Order::None {
            Vec::new()
        } else {
            upstreams
                .into_iter()
                .skip(self.offset)
                .take(self.limit)
                .collect()
        };
        let page = Page {
            order: self.order,
            offset: self.offset,
            limit: self.limit.min(MAX_LIMIT),
            listed: listed.len(),
        };
        (page, listed)
    }
}

/// Which members a pool's `upstreams` lists.
#[derive(Serialize)]
pub struct Page {
    /// `configured`, `top` (busiest first) or `none`.
    pub order: Order,
    pub offset: usize,
    pub limit: usize,
    /// Members listed: `upstreams_total` minus `offset`, at most `limit`.
    pub listed: usize,
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

/// The `/status` document, listing of each pool's members what `listing` asks.
pub async fn collect(gw: &Gateway, listing: &Listing) -> Status {
    let pools = gw.pools.load_full();
    let mut views = Vec::new();
    let mut store_ok = true;
    for pool in pools.iter() {
        if listing.pool.as_deref().is_some_and(|p| p != pool.name()) {
            continue;
        }
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
        let leases_live = upstreams.iter().map(|u| u.stats.leases_live).sum();
        let (upstreams_page, upstreams) = listing.page(upstreams);
        views.push(PoolView {
            name: pool.name().to_string(),
            bytes_by_label,
            metric_labels: pool.config.metric_labels.clone(),
            default: pool.name() == gw.live.load().default_pool,
            strategy: pool.config.strategy.as_str(),
            max_concurrency: pool.config.max_concurrency.map(|n| n.get()),
            shards: pool.config.shards,
            upstreams_total: pool.members().len(),
            bytes_up: gw.meter.pool(pool.name()).up,
            bytes_down: gw.meter.pool(pool.name()).down,
            sessions_live: st.sessions_live,
            leases_live,
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
            upstreams_page,
            upstreams,
            per_upstream,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, leases_live: u64, allocations: u64) -> UpstreamView {
        UpstreamView {
            id: id.into(),
            scheme: "http",
            bytes_up: None,
            bytes_down: None,
            labels: BTreeMap::new(),
            health: None,
            stats: MemberStatus {
                id: id.into(),
                leases_live,
                allocations,
                ..MemberStatus::default()
            },
        }
    }

    fn listed(l: &Listing, members: Vec<UpstreamView>) -> Vec<String> {
        l.page(members).1.into_iter().map(|u| u.id).collect()
    }

    #[test]
    fn top_lists_the_busiest_first_ties_in_configured_order() {
        let members = || {
            vec![
                member("a", 0, 5),
                member("b", 2, 1),
                member("c", 0, 9),
                member("d", 2, 3),
                member("e", 0, 5),
            ]
        };
        let top = Listing {
            order: Order::Top,
            ..Listing::default()
        };
        assert_eq!(listed(&top, members()), ["d", "b", "c", "a", "e"]);
        let two = Listing {
            limit: 2,
            offset: 1,
            ..top
        };
        assert_eq!(listed(&two, members()), ["b", "c"]);
        let (page, _) = two.page(members());
        assert_eq!((page.offset, page.limit, page.listed), (1, 2, 2));
    }

    #[test]
    fn queries_read_or_name_the_bad_parameter() {
        assert_eq!(Listing::parse(None).unwrap(), Listing::default());
        let l = Listing::parse(Some("upstreams=top&limit=50&offset=100&pool=eu")).unwrap();
        assert_eq!(
            l,
            Listing {
                order: Order::Top,
                offset: 100,
                limit: 50,
                pool: Some("eu".into()),
            }
        );
        assert_eq!(
            Listing::parse(Some("upstreams=none")).unwrap().order,
            Order::None
        );
        for (q, name) in [
            ("limit=0", "limit"),
            ("limit=", "limit"),
            ("offset=x", "offset"),
            ("upstreams=", "upstreams"),
            ("verbose=1", "verbose"),
        ] {
            let e = Listing::parse(Some(q)).unwrap_err().to_string();
            assert!(e.contains(name), "{q}: {e}");
        }
    }
}
