//! `[pools.<name>]`: a pool's upstreams, selection and session settings; its sub-tables have
//! files of their own.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use crate::intercept::HostPattern;
use crate::upstream::{Labels, Upstream};

use super::defaults::{
    DEFAULT_LEASE_TTL_MS, DEFAULT_QUEUE_TIMEOUT_MS, DEFAULT_RETRIES, DEFAULT_SESSION_TTL_MS,
    MAX_RETRIES, MAX_SESSION_TTL_MS, MAX_SHARDS, MIN_LEASE_TTL_MS,
};
use super::file::{FilePool, FileUpstream};
use super::validate::Validator;
use super::{HealthConfig, ProbeConfig, RateLimitConfig, SourcesConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    LeastUsed,
    LeastConnections,
    RoundRobin,
    /// Least-used where each upstream's share follows its success ratio and latency.
    Weighted,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::LeastUsed => "least-used",
            Strategy::LeastConnections => "least-connections",
            Strategy::RoundRobin => "round-robin",
            Strategy::Weighted => "weighted",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub name: String,
    /// The upstreams listed inline (`upstreams = [...]`): members from the start. Members that
    /// come from [`PoolConfig::sources`] are added to these at run time ([`crate::pool::Pool`]).
    /// Shared with the pool built from them: the config is kept and cloned whole, and a copy of
    /// each upstream per holder took about 500 bytes a member (a third of a 100,000-member
    /// pool's memory).
    pub upstreams: Vec<Arc<Upstream>>,
    pub sources: SourcesConfig,
    pub strategy: Strategy,
    /// Live leases allowed per upstream across all instances; `None` is unlimited.
    pub max_concurrency: Option<NonZeroU32>,
    /// Store pools the pool's state is spread over (each its own Redis Cluster slot); 1 keeps
    /// it in one ([`crate::store::shard`]).
    pub shards: u32,
    pub queue_timeout: Duration,
    pub session_ttl: Duration,
    pub lease_ttl: Duration,
    /// Further upstreams tried when connecting fails before anything was sent.
    pub retries: u32,
    /// Whether a session whose upstream is unavailable moves to another one instead of failing.
    pub rebind_on_failure: bool,
    /// Terminate clients' TLS on CONNECT and inspect the HTTP inside (needs `[intercept]`).
    pub inspect_tls: bool,
    /// Hosts never inspected, matched against the SNI name and the CONNECT host.
    pub inspect_exclude: Vec<HostPattern>,
    /// Label keys `poolgate_upstreams` is split by in `/metrics` (at most
    /// [`MAX_METRIC_LABELS`]: each multiplies the series).
    pub metric_labels: Vec<String>,
    pub health: HealthConfig,
    /// Active probes; `None` leaves health passive (a cool-down's end alone returns an upstream
    /// to half-open).
    pub probe: Option<ProbeConfig>,
    /// `[pools.<name>.rate_limit]`; none set when the table is absent.
    pub rate_limit: RateLimitConfig,
}

/// Label keys a pool's `metric_labels` may name.
pub const MAX_METRIC_LABELS: usize = 3;

impl Validator {
    /// One inline upstream: its URL, its `name` (the id, as a URL's `#name`) and its labels.
    fn upstream(&mut self, key: &str, entry: &FileUpstream) -> Option<Upstream> {
        let table = match entry {
            FileUpstream::Url(url) => {
                return Upstream::parse(url).map_err(|e| self.problem(key, e)).ok();
            }
            FileUpstream::Table(t) => t,
        };
        let url = match &table.name {
            Some(name) if name.is_empty() || name.contains(char::is_whitespace) => {
                self.problem(
                    &format!("{key}.name"),
                    "a name is non-empty and has no spaces",
                );
                return None;
            }
            Some(name) => format!("{}#{name}", table.url.split('#').next().unwrap_or_default()),
            None => table.url.clone(),
        };
        let mut upstream = match Upstream::parse(&url) {
            Ok(u) => u,
            Err(e) => {
                self.problem(&format!("{key}.url"), e);
                return None;
            }
        };
        for (k, v) in &table.labels {
            if let Err(e) = Labels::new([(k.as_str(), v.as_str())]) {
                self.problem(&format!("{key}.labels.{k}"), e);
                return None;
            }
        }
        match Labels::new(table.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()))) {
            Ok(labels) => upstream.labels = labels,
            // Keys that differ only in case: one label given twice.
            Err(e) => {
                self.problem(&format!("{key}.labels"), e);
                return None;
            }
        }
        Some(upstream)
    }

    pub(super) fn pool(&mut self, name: &str, p: FilePool) -> Option<PoolConfig> {
        let key = |k: &str| format!("pools.{name}.{k}");
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            self.problem(
                &format!("pools.{name}"),
                "pool names are 1 to 64 characters of letters, digits, '_' and '-'",
            );
        }
        let mut upstreams = Vec::new();
        for (i, entry) in p.upstreams.iter().flatten().enumerate() {
            if let Some(u) = self.upstream(&format!("pools.{name}.upstreams[{i}]"), entry) {
                upstreams.push(Arc::new(u));
            }
        }
        upstreams.shrink_to_fit();
        let sources = self.sources(name, &p);
        if upstreams.is_empty() && sources.is_empty() {
            self.problem(
                &key("upstreams"),
                "a pool needs at least one upstream (or upstreams_file / upstreams_url)",
            );
        }
        if sources.url.is_some() && p.probe.is_none() {
            self.problem(
                &key("upstreams_url"),
                format!("candidates from a list are admitted by probing them: add [pools.{name}.probe] with control targets"),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for u in &upstreams {
            if !seen.insert(u.id.clone()) {
                self.problem(
                    &key("upstreams"),
                    format!("`{}` is listed twice (give one a distinct #id)", u.id),
                );
            }
        }
        let strategy = match p.strategy.as_deref().unwrap_or("least-used") {
            "least-used" => Strategy::LeastUsed,
            "least-connections" => Strategy::LeastConnections,
            "round-robin" => Strategy::RoundRobin,
            "weighted" => Strategy::Weighted,
            other => {
                self.problem(
                    &key("strategy"),
                    format!(
                        "`{other}` is not a strategy (least-used, least-connections, round-robin, weighted)"
                    ),
                );
                Strategy::LeastUsed
            }
        };
        let max_concurrency = match p.max_concurrency {
            None => None,
            Some(0) => {
                self.problem(
                    &key("max_concurrency"),
                    "must be at least 1 (omit it for no cap)",
                );
                None
            }
            Some(n) => NonZeroU32::new(n),
        };
        let shards = p.shards.unwrap_or(1);
        if !(1..=MAX_SHARDS).contains(&shards) {
            self.problem(
                &key("shards"),
                format!("must be 1 to {MAX_SHARDS} (1 keeps the pool in one Redis hash slot)"),
            );
        }
        let session_ttl = self.duration(
            &key("session_ttl"),
            p.session_ttl.as_deref(),
            DEFAULT_SESSION_TTL_MS,
        );
        if session_ttl > Duration::from_millis(MAX_SESSION_TTL_MS) {
            self.problem(&key("session_ttl"), "must be at most 24h");
        }
        let lease_ttl = self.duration(
            &key("lease_ttl"),
            p.lease_ttl.as_deref(),
            DEFAULT_LEASE_TTL_MS,
        );
        if lease_ttl < Duration::from_millis(MIN_LEASE_TTL_MS) {
            self.problem(&key("lease_ttl"), "must be at least 1s");
        }
        let inspect_exclude = p
            .inspect_exclude
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, pattern)| match HostPattern::parse(pattern) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.problem(&format!("pools.{name}.inspect_exclude[{i}]"), e);
                    None
                }
            })
            .collect();
        let mut metric_labels: Vec<String> = Vec::new();
        for (i, k) in p.metric_labels.iter().flatten().enumerate() {
            match crate::upstream::labels::fold(k) {
                Some(k) if k == "pool" || k == "state" => self.problem(
                    &format!("pools.{name}.metric_labels[{i}]"),
                    "`pool` and `state` are labels of the series already",
                ),
                Some(k) if !metric_labels.contains(&k) => metric_labels.push(k),
                Some(_) => self.problem(
                    &format!("pools.{name}.metric_labels[{i}]"),
                    "is listed twice",
                ),
                None => self.problem(
                    &format!("pools.{name}.metric_labels[{i}]"),
                    "expected a label key: 1 to 64 characters of a-z 0-9 _ . -",
                ),
            }
        }
        if metric_labels.len() > MAX_METRIC_LABELS {
            self.problem(
                &key("metric_labels"),
                format!("at most {MAX_METRIC_LABELS} keys: each multiplies the series"),
            );
        }
        let retries = p.retries.unwrap_or(DEFAULT_RETRIES);
        if retries > MAX_RETRIES {
            self.problem(&key("retries"), format!("must be at most {MAX_RETRIES}"));
        }
        Some(PoolConfig {
            name: name.to_string(),
            upstreams,
            sources,
            strategy,
            max_concurrency,
            shards: shards.clamp(1, MAX_SHARDS),
            queue_timeout: self.duration(
                &key("queue_timeout"),
                p.queue_timeout.as_deref(),
                DEFAULT_QUEUE_TIMEOUT_MS,
            ),
            session_ttl,
            lease_ttl,
            retries,
            rebind_on_failure: p.rebind_on_failure.unwrap_or(false),
            inspect_tls: p.inspect_tls.unwrap_or(false),
            inspect_exclude,
            metric_labels,
            health: self.health(&format!("pools.{name}.health"), p.health),
            probe: p
                .probe
                .map(|f| self.probe(&format!("pools.{name}.probe"), f)),
            rate_limit: p
                .rate_limit
                .map(|r| self.rate_limit(&format!("pools.{name}.rate_limit"), r))
                .unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::Strategy;

    #[test]
    fn weighted_is_a_strategy() {
        let c = Config::parse(
            "[pools.default]\nupstreams = [\"direct://\"]\nstrategy = \"weighted\"\n",
            "t",
            None,
        )
        .unwrap();
        assert_eq!(c.pools["default"].strategy, Strategy::Weighted);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod label_tests {
    use super::super::tests::problems;
    use crate::config::Config;

    #[test]
    fn labelled_upstreams_are_tables_and_bad_labels_name_their_key() {
        let text = "[pools.default]\nupstreams = [\"http://10.0.0.1:3128\", \
                    { url = \"http://10.0.0.2:3128\", name = \"de1\", labels = { country = \"DE\", type = \"datacenter\" } }]\n\
                    metric_labels = [\"country\"]\n";
        let config = Config::parse(text, "t", None).unwrap();
        let pool = &config.pools["default"];
        assert_eq!(pool.upstreams[1].id.as_str(), "de1");
        assert_eq!(
            pool.upstreams[1].labels.to_string(),
            "country=de type=datacenter"
        );
        assert!(pool.upstreams[0].labels.is_empty());
        assert_eq!(pool.metric_labels, ["country"]);

        let cases = [
            (
                "labels = { country = \"u s\" }",
                "pools.default.upstreams[0].labels.country",
            ),
            (
                "labels = { \"Bad Key\" = \"x\" }",
                "pools.default.upstreams[0].labels.Bad Key",
            ),
            (
                "labels = { Country = \"us\", country = \"ca\" }",
                "pools.default.upstreams[0].labels",
            ),
            ("name = \"\"", "pools.default.upstreams[0].name"),
            ("colour = \"red\"", "colour"),
        ];
        for (extra, key) in cases {
            let text = format!(
                "[pools.default]\nupstreams = [{{ url = \"http://10.0.0.2:3128\", {extra} }}]\n"
            );
            let p = problems(&text);
            assert!(p.iter().any(|m| m.contains(key)), "{extra}: {p:?}");
        }
        let p = problems("[pools.default]\nupstreams = [{ url = \"ftp://x:1\" }]\n");
        assert!(
            p.iter()
                .any(|m| m.contains("pools.default.upstreams[0].url")),
            "{p:?}"
        );
        let p = problems(
            "[pools.default]\nupstreams = [\"direct://\"]\nmetric_labels = [\"a\", \"b\", \"c\", \"d\"]\n",
        );
        assert!(
            p.iter().any(|m| m.contains("pools.default.metric_labels")),
            "{p:?}"
        );
    }
}
