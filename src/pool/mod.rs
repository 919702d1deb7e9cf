//! Pools: named sets of upstreams, how a request picks one, and the lease it holds.

pub mod lease;
pub mod rendezvous;
pub mod select;

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::{Config, PoolConfig};
use crate::error::ProxyError;
use crate::health::{self, PoolHealth};
use crate::store::PoolSpec;
use crate::upstream::{Upstream, UpstreamId};

pub use lease::{Exchange, Lease};
pub use rendezvous::Rendezvous;

/// One pool as configured, with what the hot path needs precomputed.
#[derive(Debug)]
pub struct Pool {
    pub config: PoolConfig,
    upstreams: HashMap<UpstreamId, Arc<Upstream>>,
    /// Sticky placement over the pool's members.
    pub placement: Rendezvous,
    /// Passive health of the members; outlives reloads.
    pub health: Arc<PoolHealth>,
}

impl Pool {
    pub fn new(config: PoolConfig, health: Arc<PoolHealth>) -> Self {
        let ids: Vec<UpstreamId> = config.upstreams.iter().map(|u| u.id.clone()).collect();
        Pool {
            upstreams: config
                .upstreams
                .iter()
                .map(|u| (u.id.clone(), Arc::new(u.clone())))
                .collect(),
            placement: Rendezvous::new(&ids),
            health,
            config,
        }
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn upstream(&self, id: &UpstreamId) -> Option<&Arc<Upstream>> {
        self.upstreams.get(id)
    }

    /// What the store needs to allocate from this pool.
    pub fn spec(&self) -> PoolSpec {
        PoolSpec {
            name: self.config.name.clone(),
            members: self.config.upstreams.iter().map(|u| u.id.clone()).collect(),
            strategy: self.config.strategy,
            max_concurrency: self.config.max_concurrency.map(|n| n.get()),
            lease_ttl: self.config.lease_ttl,
        }
    }
}

/// Every pool, swapped whole on reload.
#[derive(Debug)]
pub struct PoolSet {
    pools: HashMap<String, Arc<Pool>>,
    default: String,
}

impl PoolSet {
    pub fn from_config(config: &Config, health: &health::Registry) -> Self {
        PoolSet {
            pools: config
                .pools
                .values()
                .map(|p| {
                    (
                        p.name.clone(),
                        Arc::new(Pool::new(p.clone(), health.pool(p))),
                    )
                })
                .collect(),
            default: config.default_pool.clone(),
        }
    }

    /// The pools of a reloaded config. Upstreams that left a pool stay findable by id (not
    /// selectable: the store no longer offers them), so leases and grants that raced the reload
    /// still find their upstream.
    pub fn after_reload(config: &Config, old: &PoolSet, health: &health::Registry) -> Self {
        let mut set = Self::from_config(config, health);
        for (name, pool) in set.pools.iter_mut() {
            let Some(old_pool) = old.pools.get(name) else {
                continue;
            };
            let mut merged = Pool::new(pool.config.clone(), pool.health.clone());
            for up in &old_pool.config.upstreams {
                merged
                    .upstreams
                    .entry(up.id.clone())
                    .or_insert_with(|| Arc::new(up.clone()));
            }
            *pool = Arc::new(merged);
        }
        set
    }

    /// The pool a request named, or the default one.
    pub fn get(&self, name: Option<&str>) -> Result<&Arc<Pool>, ProxyError> {
        let name = name.unwrap_or(&self.default);
        self.pools
            .get(name)
            .ok_or_else(|| ProxyError::UnknownPool(name.to_string()))
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Pool>> {
        let mut pools: Vec<&Arc<Pool>> = self.pools.values().collect();
        pools.sort_by(|a, b| a.name().cmp(b.name()));
        pools.into_iter()
    }
}
