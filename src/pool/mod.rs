//! Pools: named sets of upstreams, how a request picks one, and the lease it holds.

pub mod filter;
pub mod lease;
pub mod ring;
pub mod select;

use std::sync::Arc;

use crate::config::{Config, PoolConfig};
use crate::error::ProxyError;
use crate::fast_map::FastMap;
use crate::health::{self, PoolHealth};
use crate::store::PoolSpec;
use crate::upstream::{Upstream, UpstreamId};

use filter::{FilterView, LabelIndex};
pub use ring::Ring;

use crate::session::LabelWant;

/// One pool as configured, with what the hot path needs precomputed.
#[derive(Debug)]
pub struct Pool {
    pub config: PoolConfig,
    /// The members: the inline upstreams, then those admitted from the pool's lists.
    members: Vec<UpstreamId>,
    /// Every upstream findable by id: the members, and (after a membership change) those that
    /// left, for the leases that still hold them.
    upstreams: FastMap<UpstreamId, Arc<Upstream>>,
    /// Sticky placement over the pool's members.
    pub placement: Ring,
    /// Passive health of the members; outlives reloads.
    pub health: Arc<PoolHealth>,
    /// The members' labels, for requests that ask for a kind of exit.
    pub labels: LabelIndex,
}

impl Pool {
    /// A pool of `config`'s inline upstreams and `listed` (admitted from its lists; an id that
    /// is also inline is the inline one).
    pub fn new(config: PoolConfig, listed: Vec<Upstream>, health: &health::Registry) -> Self {
        let mut upstreams = FastMap::default();
        let mut members = Vec::new();
        for u in config
            .upstreams
            .iter()
            .cloned()
            .chain(listed.into_iter().map(Arc::new))
        {
            if !upstreams.contains_key(&u.id) {
                members.push(u.id.clone());
                upstreams.insert(u.id.clone(), u);
            }
        }
        let health = health.pool(&config, &members);
        Pool {
            placement: Ring::new(&members),
            labels: LabelIndex::new(&members, &upstreams),
            members,
            upstreams,
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

    /// The members matching what a request asked for ([`filter::LabelIndex::view`]).
    pub fn filter(&self, wants: &[LabelWant]) -> Result<Option<Arc<FilterView>>, ProxyError> {
        if wants.is_empty() {
            return Ok(None);
        }
        self.labels
            .view(self.name(), wants, &self.members, &self.upstreams)
    }

    /// The current members, inline ones first.
    pub fn members(&self) -> &[UpstreamId] {
        &self.members
    }

    /// What the store needs to allocate from this pool.
    pub fn spec(&self) -> PoolSpec {
        PoolSpec {
            name: self.config.name.clone(),
            members: self.members.clone(),
            strategy: self.config.strategy,
            max_concurrency: self.config.max_concurrency.map(|n| n.get()),
            lease_ttl: self.config.lease_ttl,
            shards: self.config.shards,
        }
    }
}

/// Every pool, swapped whole on reload.
#[derive(Debug)]
pub struct PoolSet {
    pools: FastMap<String, Arc<Pool>>,
    default: String,
}

impl PoolSet {
    /// The pools of `config`, each with the members its lists contribute now.
    pub fn from_config(
        config: &Config,
        health: &health::Registry,
        sources: &crate::sources::Registry,
    ) -> Self {
        PoolSet {
            pools: config
                .pools
                .values()
                .map(|p| {
                    let pool = Pool::new(p.clone(), sources.admitted(&p.name), health);
                    (p.name.clone(), Arc::new(pool))
                })
                .collect(),
            default: config.default_pool.clone(),
        }
    }

    /// The pools after a reload or a membership change. Upstreams that left a pool stay
    /// findable by id (not selectable: the store no longer offers them), so leases and grants
    /// that raced the change still find their upstream.
    pub fn after_reload(
        config: &Config,
        old: &PoolSet,
        health: &health::Registry,
        sources: &crate::sources::Registry,
    ) -> Self {
        let mut set = Self::from_config(config, health, sources);
        for (name, pool) in set.pools.iter_mut() {
            let Some(old_pool) = old.pools.get(name) else {
                continue;
            };
            let Some(p) = Arc::get_mut(pool) else {
                continue;
            };
            for id in old_pool.members() {
                if let Some(up) = old_pool.upstream(id) {
                    p.upstreams.entry(id.clone()).or_insert_with(|| up.clone());
                }
            }
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
