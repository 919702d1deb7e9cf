//! Config reload (SIGHUP, or `POST /admin/reload`): re-read the config file, validate it, and
//! swap in what changed without dropping in-flight requests, tunnels or sessions.
//!
//! What a reload changes: pools and their upstreams (the store keeps the state of kept members:
//! allocations, leases, sessions), limits and timeouts for new connections and requests, the
//! target policy, users and the client allowlist. What it cannot change, because it is bound at
//! start, is refused with the key named: listener addresses, the store, upstream TLS, the
//! upstream keep-alive pool settings and the access log (`[log]`). An invalid file is refused with every problem listed, and
//! the old config keeps running.
//!
//! In-flight work is untouched: requests and tunnels hold their own `Arc<Pool>` and lease; an
//! upstream removed from a pool stays reachable by id for leases that a reload raced
//! ([`crate::pool::PoolSet::after_reload`]).

use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use serde::Serialize;
use subtle::ConstantTimeEq;

use crate::admit::TargetPolicy;
use crate::body::{self, Body};
use crate::config::{Config, ConfigError};
use crate::pool::PoolSet;
use crate::state::Gateway;
use crate::store::{Store, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("no config file to reload from: the gateway was not started from a file")]
    NoFile,
    #[error("{0}")]
    Invalid(#[from] ConfigError),
    #[error(
        "{} cannot change on reload (restart poolgate to change {}); the running config is kept",
        .0.join(", "),
        if .0.len() == 1 { "it" } else { "them" }
    )]
    Fixed(Vec<&'static str>),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// What a successful reload did.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadSummary {
    pub generation: u64,
    pub pools: usize,
    pub upstreams: usize,
    pub upstreams_added: Vec<String>,
    pub upstreams_removed: Vec<String>,
}

/// Re-reads the config file and applies it.
pub async fn reload(gw: &Gateway) -> Result<ReloadSummary, ReloadError> {
    let result = match &gw.config_path {
        None => Err(ReloadError::NoFile),
        Some(path) => match Config::load(path) {
            Ok(config) => apply(gw, config).await,
            Err(e) => Err(ReloadError::Invalid(e)),
        },
    };
    match &result {
        Ok(s) => tracing::info!(
            generation = s.generation,
            pools = s.pools,
            upstreams = s.upstreams,
            added = s.upstreams_added.len(),
            removed = s.upstreams_removed.len(),
            "config reloaded"
        ),
        Err(e) => {
            tracing::warn!(error = %e, "config reload refused; the running config is kept");
            let mut log = gw.reloads.lock().await;
            log.reloads_failed += 1;
            log.last_error = Some(e.to_string());
        }
    }
    result
}

/// Keys bound at start that a new config may not change.
fn fixed_changes(running: &Config, new: &Config) -> Vec<&'static str> {
    let (a, b) = (&running.server, &new.server);
    let mut changed = Vec::new();
    if a.listen != b.listen {
        changed.push("server.listen");
    }
    if a.admin_listen != b.admin_listen {
        changed.push("server.admin_listen");
    }
    if a.socks_listen != b.socks_listen {
        changed.push("server.socks_listen");
    }
    if running.store != new.store {
        changed.push("store");
    }
    if running.upstream_tls.ca_file != new.upstream_tls.ca_file
        || running.upstream_tls.system_roots != new.upstream_tls.system_roots
    {
        changed.push("upstream_tls");
    }
    if a.upstream_idle_timeout != b.upstream_idle_timeout {
        changed.push("server.upstream_idle_timeout");
    }
    if a.upstream_max_idle_per_key != b.upstream_max_idle_per_key {
        changed.push("server.upstream_max_idle_per_key");
    }
    if a.workers != b.workers {
        changed.push("server.workers");
    }
    if running.log != new.log {
        changed.push("log");
    }
    changed
}

/// Applies a validated config. Serialised: one reload at a time.
pub async fn apply(gw: &Gateway, new: Config) -> Result<ReloadSummary, ReloadError> {
    let mut log = gw.reloads.lock().await;
    let fixed = fixed_changes(&gw.config, &new);
    if !fixed.is_empty() {
        return Err(ReloadError::Fixed(fixed));
    }
    let old_pools = gw.pools.load_full();
    let pools = PoolSet::after_reload(&new, &old_pools, &gw.health, &gw.sources);
    let member_ids = |set: &PoolSet| {
        set.iter()
            .flat_map(|p| {
                p.members()
                    .iter()
                    .map(|id| id.to_string())
                    .collect::<Vec<_>>()
            })
            .collect::<std::collections::BTreeSet<_>>()
    };
    let (before, after) = (member_ids(&old_pools), member_ids(&pools));
    let upstreams = pools.iter().map(|p| p.members().len()).sum();
    swap_pools(gw, &old_pools, pools, true).await?;
    let own = gw.policy.load().own.clone();
    gw.policy
        .store(Arc::new(TargetPolicy::new(new.policy.clone(), own)));
    gw.connector.set_connect_timeout(new.server.connect_timeout);
    // Idle upstream connections were opened under the old policy and credentials.
    gw.conns.clear();
    let summary = ReloadSummary {
        generation: log.generation + 1,
        pools: new.pools.len(),
        upstreams,
        upstreams_added: after.difference(&before).cloned().collect(),
        upstreams_removed: before.difference(&after).cloned().collect(),
    };
    gw.metrics
        .set_per_upstream_max(new.metrics.per_upstream_max);
    gw.live.store(Arc::new(new));
    log.generation += 1;
    log.reloads_ok += 1;
    log.last_error = None;
    Ok(summary)
}

/// Rebuilds the pools of the running config with the members their lists contribute now
/// ([`crate::sources`]); the store learns of the pools whose membership changed.
pub async fn refresh_members(gw: &Gateway) -> Result<(), StoreError> {
    let _serial = gw.reloads.lock().await;
    let old = gw.pools.load_full();
    let pools = PoolSet::after_reload(&gw.live.load(), &old, &gw.health, &gw.sources);
    swap_pools(gw, &old, pools, false).await
}

/// Puts `pools` in force. The pool set first, then the store: a grant for a member the store
/// learns of now is then always found by id (see `select::acquire`), and a removed member stays
/// findable. With `all`, every pool is declared to the store again (a reload may change any
/// setting); otherwise only those whose members changed.
async fn swap_pools(
    gw: &Gateway,
    old: &PoolSet,
    pools: PoolSet,
    all: bool,
) -> Result<(), StoreError> {
    let changed: Vec<_> = pools
        .iter()
        .filter(|p| {
            all || old
                .get(Some(p.name()))
                .map_or(true, |o| o.members() != p.members())
        })
        .map(|p| {
            // Its members' settings live in the store pools of its shards: other shards
            // start from plain service, so health's settings are applied to them again.
            let resharded = old
                .get(Some(p.name()))
                .is_ok_and(|o| o.config.shards != p.config.shards);
            (p.spec(), resharded.then(|| p.health.clone()))
        })
        .collect();
    gw.pools.store(Arc::new(pools));
    for (spec, resharded) in changed {
        let name = spec.name.clone();
        gw.store.configure(spec).await?;
        if let Some(health) = resharded {
            for (id, setting) in health.settings() {
                gw.store.set_member(&name, &id, setting, None).await?;
            }
        }
    }
    Ok(())
}

/// `POST /admin/reload`, authorised by `Authorization: Bearer <server.admin_token>`.
pub async fn admin_reload<B>(gw: &Gateway, req: &Request<B>) -> Response<Body> {
    let live = gw.live.load_full();
    let Some(token) = live.server.admin_token.as_deref() else {
        return json(
            StatusCode::FORBIDDEN,
            &serde_json::json!({"status": "refused", "error": "admin actions need server.admin_token in the config"}),
        );
    };
    if !bearer_matches(req.headers(), token) {
        let mut r = json(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({"status": "refused", "error": "send Authorization: Bearer <server.admin_token>"}),
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"poolgate-admin\""),
        );
        return r;
    }
    match reload(gw).await {
        Ok(summary) => json(
            StatusCode::OK,
            &serde_json::json!({"status": "reloaded", "reload": summary}),
        ),
        Err(e) => json(
            StatusCode::BAD_REQUEST,
            &serde_json::json!({"status": "rejected", "error": e.to_string(), "running_generation": gw.reloads.lock().await.generation}),
        ),
    }
}

/// Constant-time comparison of the bearer token.
fn bearer_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let Some(value) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some((scheme, given)) = value.trim().split_once(' ') else {
        return false;
    };
    scheme.eq_ignore_ascii_case("bearer")
        && bool::from(given.trim().as_bytes().ct_eq(token.as_bytes()))
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let bytes = serde_json::to_vec_pretty(value).unwrap_or_default();
    body::typed(status, "application/json", bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text, "t", None).unwrap()
    }

    #[test]
    fn listener_store_and_tls_changes_are_named() {
        let a = parse("[pools.default]\nupstreams = [\"direct://\"]\n");
        let b = parse(
            "[server]\nlisten = \"127.0.0.1:9999\"\nupstream_idle_timeout = \"5s\"\n[pools.default]\nupstreams = [\"direct://\"]\n",
        );
        let fixed = fixed_changes(&a, &b);
        assert_eq!(fixed, vec!["server.listen", "server.upstream_idle_timeout"]);
        let msg = ReloadError::Fixed(fixed).to_string();
        assert!(
            msg.contains("server.listen") && msg.contains("restart"),
            "{msg}"
        );
        let c =
            parse("[server]\nmax_connections = 5\n[pools.default]\nupstreams = [\"direct://\"]\n");
        assert!(fixed_changes(&a, &c).is_empty());
        let d = parse(&format!(
            "[server]\nworkers = {}\n[pools.default]\nupstreams = [\"direct://\"]\n",
            a.server.workers + 1
        ));
        assert_eq!(fixed_changes(&a, &d), vec!["server.workers"]);
        // Turning the SOCKS5 port on (or moving it) needs a restart.
        let e = parse(
            "[server]\nsocks_listen = \"127.0.0.1:1080\"\n[pools.default]\nupstreams = [\"direct://\"]\n",
        );
        assert_eq!(fixed_changes(&a, &e), vec!["server.socks_listen"]);
        let g = parse("[log]\naccess = \"stderr\"\n[pools.default]\nupstreams = [\"direct://\"]\n");
        assert_eq!(fixed_changes(&a, &g), vec!["log"]);
        // Bounds on exported series follow the live config.
        let f = parse(
            "[metrics]\nper_upstream_max = 5\n[pools.default]\nupstreams = [\"direct://\"]\n",
        );
        assert!(fixed_changes(&a, &f).is_empty());
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        let mut h = http::HeaderMap::new();
        assert!(!bearer_matches(&h, "0123456789abcdef"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer 0123456789abcdef"),
        );
        assert!(bearer_matches(&h, "0123456789abcdef"));
        assert!(!bearer_matches(&h, "0123456789abcde"));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic 0123456789abcdef"),
        );
        assert!(!bearer_matches(&h, "0123456789abcdef"));
    }
}
