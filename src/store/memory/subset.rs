//! One label filter's members in the embedded store: the index an acquire within the filter
//! walks instead of the whole pool (see [`crate::store::Subset`]).

use std::collections::BTreeSet;

use tokio::time::Instant;

use crate::fast_map::FastMap;
use crate::store::Subset;
use crate::upstream::UpstreamId;

/// Subsets kept per pool; past this the least recently used one is dropped (and rebuilt from
/// the members the next request hands over).
pub(super) const MAX_SUBSETS: usize = 1024;

pub(super) struct SubsetIndex {
    /// The matching members by id: round-robin's cycle (as the Redis store's subset ZSET orders
    /// them).
    pub members: Vec<UpstreamId>,
    /// Allocations through this subset, per member.
    pub allocs: FastMap<UpstreamId, u64>,
    /// Every member by (allocations through this subset, id): least-used's order. Members out
    /// of service stay in it and are passed over, so a quarantine touches no subset.
    pub by_allocs: BTreeSet<(u64, UpstreamId)>,
    /// The members in service by the pool's load key (least-connections' order; kept only in
    /// such a pool): the pool keeps it in step with every lease, so an acquire takes its first
    /// entry with room instead of weighing every member.
    pub by_load: BTreeSet<(u64, u64, u32)>,
    pub rr_next: usize,
    pub last_used: Instant,
}

impl SubsetIndex {
    pub fn new(subset: &Subset<'_>, now: Instant) -> Self {
        let mut members = subset.members.to_vec();
        members.sort();
        members.dedup();
        SubsetIndex {
            members,
            allocs: subset.members.iter().map(|m| (m.clone(), 0)).collect(),
            by_allocs: subset.members.iter().map(|m| (0, m.clone())).collect(),
            by_load: BTreeSet::new(),
            rr_next: 0,
            last_used: now,
        }
    }

    pub fn contains(&self, id: &UpstreamId) -> bool {
        self.allocs.contains_key(id)
    }

    /// Counts an allocation of `id` through this subset.
    pub fn count(&mut self, id: &UpstreamId, cost: u64) {
        if let Some(a) = self.allocs.get_mut(id) {
            self.by_allocs.remove(&(*a, id.clone()));
            *a += cost;
            self.by_allocs.insert((*a, id.clone()));
        }
    }
}
