//! Health: what an exchange's outcome says about its upstream, and what the pool does about it.
//!
//! [`classify`] turns a response into an [`Outcome`]; [`blame`] decides whether the upstream is
//! to blame; [`state`] is each upstream's state machine; [`exit`] groups members by the exit IP the
//! prober measured; [`engine`] ties them together per pool (a ban is shared by members with one
//! exit IP) and answers with allocator changes for the store.

pub mod blame;
pub mod classify;
pub mod engine;
pub mod exit;
mod latency;
mod recency;
pub mod state;
pub mod view;

use std::sync::{Arc, RwLock};

pub use crate::outcome::Outcome;
pub use engine::{Change, PoolHealth};

use crate::config::PoolConfig;
use crate::fast_map::FastMap;
use crate::store::Store;
use crate::upstream::UpstreamId;

/// Every pool's health, kept across config reloads (a pool's engine is reconfigured, not rebuilt).
#[derive(Default)]
pub struct Registry {
    pools: RwLock<FastMap<String, Arc<PoolHealth>>>,
}

impl Registry {
    /// The pool's health engine with `members` as its membership (created on first use).
    pub fn pool(&self, cfg: &PoolConfig, members: &[UpstreamId]) -> Arc<PoolHealth> {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = pools.get(&cfg.name) {
            h.reconfigure(cfg.health.clone(), cfg.strategy, members);
            h.set_probing(cfg.probe.is_some());
            if cfg.probe.as_ref().is_none_or(|p| p.exit_ip.is_none()) {
                h.forget_exit_ips();
            }
            return h.clone();
        }
        let h = Arc::new(PoolHealth::new(
            &cfg.name,
            cfg.health.clone(),
            cfg.strategy,
            members,
        ));
        h.set_probing(cfg.probe.is_some());
        pools.insert(cfg.name.clone(), h.clone());
        h
    }
}

/// Hands health's decisions to the store.
pub async fn apply<S: Store>(store: &S, pool: &str, changes: Vec<Change>) {
    for c in changes {
        if let Err(e) = store
            .set_member(pool, &c.upstream, c.member, Some(c.believed))
            .await
        {
            tracing::warn!(pool, upstream = %c.upstream, error = %e, "could not apply a health decision to the store");
        }
    }
}
