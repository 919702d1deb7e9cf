//! This instance's live listed leases per upstream: the leases Redis granted it and records one by
//! one (a pool with a cap, or least-connections), counted here until this instance releases them.
//!
//! Redis counts them against the caps; the local view does not know them. So when the store
//! switches to the local view (see `conn.rs`), the local view is told these counts and counts
//! them against the caps and in the least-connections order until the leases end: each instance's
//! own total on an upstream (its Redis leases still running and its local-view leases) stays
//! within `max_concurrency` while degraded, and `n` instances within `n × max_concurrency`.
//!
//! Every acquire and release of a listed lease passes here, so the counters are atomics found in a
//! map that is only replaced (on a reload), never written: no lock, no insert, one atomic add.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::fast_map::FastMap;
use crate::upstream::UpstreamId;

/// The counters of one pool.
#[derive(Default)]
pub(super) struct Live {
    /// One counter per member while the pool's leases are listed (none while they are unlisted:
    /// `held.rs` counts those). A reload builds a new map that shares the counters of the members
    /// it keeps, and of removed members while their leases run.
    counters: ArcSwap<FastMap<UpstreamId, Arc<AtomicU64>>>,
}

impl Live {
    /// Counters for `members` (or for none when the pool's leases are unlisted), keeping the
    /// count of every member that has one. Calls are serialised by the caller (the pools lock).
    pub fn reconfigure(&self, members: &[UpstreamId], listed: bool) {
        let old = self.counters.load();
        let mut new: FastMap<UpstreamId, Arc<AtomicU64>> = FastMap::default();
        if listed {
            new.reserve(members.len());
            for id in members {
                let counter = old.get(id).cloned().unwrap_or_default();
                new.insert(id.clone(), counter);
            }
        }
        // A lease of a member gone from the list (or granted before the pool's leases became
        // unlisted) still ends here.
        for (id, counter) in old.iter() {
            if counter.load(Ordering::SeqCst) > 0 && !new.contains_key(id) {
                new.insert(id.clone(), counter.clone());
            }
        }
        self.counters.store(Arc::new(new));
    }

    /// Counts a listed lease of `upstream` granted by Redis. An upstream without a counter (not in
    /// this instance's list of the pool: another instance reloaded first) is not counted.
    pub fn take(&self, upstream: &UpstreamId) {
        if let Some(c) = self.counters.load().get(upstream) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Ends one listed lease of `upstream` (never below zero: a lease that was not counted).
    pub fn end(&self, upstream: &UpstreamId) {
        if let Some(c) = self.counters.load().get(upstream) {
            let _ = c.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        }
    }

    /// Live listed leases of `upstream`.
    pub fn of(&self, upstream: &UpstreamId) -> u64 {
        self.counters
            .load()
            .get(upstream)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Every upstream with live listed leases, and how many.
    pub fn counts(&self) -> Vec<(UpstreamId, u64)> {
        self.counters
            .load()
            .iter()
            .filter_map(|(id, c)| {
                let n = c.load(Ordering::SeqCst);
                (n > 0).then(|| (id.clone(), n))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<UpstreamId> {
        names.iter().map(|n| UpstreamId::new(*n)).collect()
    }

    #[test]
    fn counts_per_member_and_never_below_zero() {
        let live = Live::default();
        let m = ids(&["a", "b"]);
        live.reconfigure(&m, true);
        live.take(&m[0]);
        live.take(&m[0]);
        live.take(&m[1]);
        live.take(&UpstreamId::new("stranger"));
        assert_eq!((live.of(&m[0]), live.of(&m[1])), (2, 1));
        live.end(&m[1]);
        live.end(&m[1]);
        assert_eq!(live.of(&m[1]), 0, "an end without a lease is ignored");
        assert_eq!(live.counts(), [(m[0].clone(), 2)]);
    }

    #[test]
    fn a_reload_keeps_the_counts_of_kept_members_and_of_removed_ones_still_leased() {
        let live = Live::default();
        let m = ids(&["a", "b", "c"]);
        live.reconfigure(&m, true);
        live.take(&m[0]);
        live.take(&m[1]);
        live.reconfigure(&m[..1], true);
        assert_eq!(live.of(&m[0]), 1, "kept");
        assert_eq!(live.of(&m[1]), 1, "removed, its lease still running");
        live.end(&m[1]);
        live.reconfigure(&m[..1], true);
        live.take(&m[1]);
        assert_eq!(live.of(&m[1]), 0, "removed and without leases: dropped");
        // Unlisted leases are not counted here; listed ones still running end here.
        live.reconfigure(&m, false);
        live.take(&m[2]);
        assert_eq!(live.of(&m[2]), 0);
        assert_eq!(live.of(&m[0]), 1);
        live.end(&m[0]);
        assert!(live.counts().is_empty());
    }
}
