//! Sticky placement: which upstream a session key belongs to.
//!
//! Rendezvous (highest-random-weight) hashing: every member gets a score from hash(key, member);
//! the key's order of preference is the members by descending score. Removing a member moves only
//! the keys whose first choice it was, adding one takes only the keys it now wins, and any
//! instance (or a store that lost its bindings) derives the same order from the same members.
//! The hash is fixed (xxh3 with a fixed seed), never per-process random, for that reason.

use xxhash_rust::xxh3::xxh3_64;

use crate::upstream::UpstreamId;

/// The members of one pool with their hashes computed once.
#[derive(Clone, Debug, Default)]
pub struct Rendezvous {
    members: Vec<(u64, UpstreamId)>,
}

/// splitmix64's finaliser: spreads the combined hash so scores are independent per member.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rendezvous {
    pub fn new(members: &[UpstreamId]) -> Self {
        Rendezvous {
            members: members
                .iter()
                .map(|id| (xxh3_64(id.as_str().as_bytes()), id.clone()))
                .collect(),
        }
    }

    /// The first `n` members in `key`'s order of preference, skipping `exclude`.
    pub fn preferred(&self, key: &str, n: usize, exclude: &[UpstreamId]) -> Vec<UpstreamId> {
        let kh = xxh3_64(key.as_bytes());
        let mut scored: Vec<(u64, &UpstreamId)> = self
            .members
            .iter()
            .filter(|(_, id)| !exclude.contains(id))
            .map(|(mh, id)| (mix(kh ^ mh), id))
            .collect();
        let n = n.min(scored.len());
        if n == 0 {
            return Vec::new();
        }
        // Only the top n need ordering.
        scored.select_nth_unstable_by(n - 1, |a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        scored.truncate(n);
        scored.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        scored.into_iter().map(|(_, id)| id.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn members(n: usize) -> Vec<UpstreamId> {
        (0..n)
            .map(|i| UpstreamId::new(format!("http://10.0.0.{i}:3128")))
            .collect()
    }

    #[test]
    fn keys_spread_evenly_and_removal_moves_only_the_removed_members_keys() {
        let all = members(8);
        let r = Rendezvous::new(&all);
        let keys: Vec<String> = (0..1000).map(|i| format!("session-{i}")).collect();
        let first: Vec<UpstreamId> = keys
            .iter()
            .map(|k| r.preferred(k, 1, &[])[0].clone())
            .collect();
        let mut counts: HashMap<&UpstreamId, usize> = HashMap::new();
        for id in &first {
            *counts.entry(id).or_default() += 1;
        }
        let mean = 1000.0 / 8.0;
        assert!(
            counts.values().all(|&c| (c as f64) <= 1.5 * mean),
            "{counts:?}"
        );

        let removed = all[3].clone();
        let r2 = Rendezvous::new(
            &all.iter()
                .filter(|id| **id != removed)
                .cloned()
                .collect::<Vec<_>>(),
        );
        for (k, before) in keys.iter().zip(&first) {
            let after = r2.preferred(k, 1, &[])[0].clone();
            if *before != removed {
                assert_eq!(&after, before, "key {k} moved although its upstream stayed");
            }
        }
    }

    #[test]
    fn order_is_stable_and_exclusion_takes_the_next() {
        let all = members(5);
        let r = Rendezvous::new(&all);
        let order = r.preferred("k", 5, &[]);
        assert_eq!(order.len(), 5);
        assert_eq!(r.preferred("k", 5, &[]), order);
        assert_eq!(r.preferred("k", 1, &order[..1]), vec![order[1].clone()]);
    }
}
