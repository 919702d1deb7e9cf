//! Sticky placement: which upstream a session key belongs to.
//!
//! Multi-probe consistent hashing (Appleton and O'Reilly, 2015) on a hash ring. Every member has
//! [`POINTS_PER_MEMBER`] points on the ring, derived from its id; a key is hashed to [`PROBES`]
//! points, and a member's distance from the key is the shortest clockwise walk from any of the
//! key's probes to any of the member's points. The key's order of preference is the members by
//! ascending distance.
//!
//! - **Lookup is O(probes × log n)**: one binary search per probe, then a merge of the probes'
//!   clockwise walks that stops as soon as enough distinct members are met.
//! - **Consistent**: a member's distance from a key depends only on the key and that member, so
//!   removing a member moves only the keys whose first choice it was, and adding one takes only the
//!   keys it now wins; among the other members the order is unchanged.
//! - **Balanced with few points**: with a single probe, a member's share of keys is the length
//!   of the arcs before its points, which varies as 1/√points; with several probes the nearest
//!   point wins whatever the arc before it, and 11 probes over 8 points spread keys about as
//!   evenly as ~200 virtual nodes per member would. The ring holds 12 bytes per point: 9.6 MB for
//!   100,000 members, where 200 virtual nodes would take 240 MB.
//! - **Deterministic from the member set alone**: any instance, or a store that lost its
//!   bindings, derives the same order from the same members whatever their configured order. The
//!   hash is fixed (xxh3 with its default seed, then splitmix64), never per-process random, and
//!   every tie is broken by member id.
//!
//! Both counts are fixed: a count that depended on the pool's size would move keys when the pool
//! grows.

use xxhash_rust::xxh3::xxh3_64;

use crate::upstream::UpstreamId;

/// Positions probed per key. Each costs a binary search; fewer probes leave members whose points
/// happen to follow others closely with a visibly smaller share.
pub const PROBES: usize = 11;

/// Points on the ring per member: 12 bytes each.
pub const POINTS_PER_MEMBER: usize = 8;

/// splitmix64's increment: consecutive multiples give independent probe positions.
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// The members of one pool on the ring.
///
/// Two parallel vectors sorted by point, rather than one of (point, id): 12 bytes per point
/// and a dense array for the binary searches.
#[derive(Clone, Debug, Default)]
pub struct Ring {
    /// Members' points on the ring, ascending; ties ordered by member id.
    points: Vec<u64>,
    /// `points[i]` belongs to `members[owner[i]]`.
    owner: Vec<u32>,
    /// Distinct members sorted by id, so that an index order is the id order.
    members: Vec<UpstreamId>,
    /// Search index over `points` (it never changes an answer): `starts[b]` is the first point
    /// whose top `bucket_bits` bits are at least `b`. A probe then searches ~4 points of its
    /// bucket instead of the whole ring, which at 100,000 members is ~20 cache misses fewer.
    starts: Vec<u32>,
    bucket_bits: u32,
}

/// splitmix64's finaliser: spreads a probe's position over the whole ring.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`-th position derived from `hash`: a splitmix64 stream seeded by it.
fn nth(hash: u64, i: usize) -> u64 {
    mix(hash.wrapping_add(GAMMA.wrapping_mul(i as u64 + 1)))
}

/// One probe's walk round the ring: where it is and how far it has come.
#[derive(Clone, Copy)]
struct Walk {
    /// The probe's position on the ring.
    origin: u64,
    /// Index into `points` of the next point this walk reaches.
    at: usize,
    /// Points passed so far; a walk ends after one full turn.
    steps: usize,
}

impl Ring {
    pub fn new(members: &[UpstreamId]) -> Self {
        let mut members = members.to_vec();
        members.sort_unstable();
        members.dedup();
        let mut ring: Vec<(u64, u32)> = Vec::with_capacity(members.len() * POINTS_PER_MEMBER);
        for (i, id) in members.iter().enumerate() {
            let h = xxh3_64(id.as_str().as_bytes());
            ring.extend((0..POINTS_PER_MEMBER).map(|p| (nth(h, p), i as u32)));
        }
        // Members are sorted by id, so ordering equal points by index orders them by id.
        ring.sort_unstable();
        let (points, owner): (Vec<u64>, Vec<u32>) = ring.into_iter().unzip();
        // About 4 points per bucket; no index for small rings.
        let bucket_bits = points.len().checked_ilog2().unwrap_or(0).saturating_sub(2);
        let starts = if bucket_bits == 0 {
            Vec::new()
        } else {
            let mut starts = Vec::with_capacity((1usize << bucket_bits) + 1);
            let mut at = 0usize;
            for b in 0..(1u64 << bucket_bits) {
                while at < points.len() && (points[at] >> (64 - bucket_bits)) < b {
                    at += 1;
                }
                starts.push(at as u32);
            }
            starts.push(points.len() as u32);
            starts
        };
        Ring {
            points,
            owner,
            members,
            starts,
            bucket_bits,
        }
    }

    /// Index of the first point at or after `h`, or `points.len()` past the top of the ring.
    fn first_at_or_after(&self, h: u64) -> usize {
        if self.bucket_bits == 0 {
            return self.points.partition_point(|&p| p < h);
        }
        let b = (h >> (64 - self.bucket_bits)) as usize;
        let (lo, hi) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        // Past the bucket's points, the answer is the first point of the next buckets: `hi`.
        lo + self.points[lo..hi].partition_point(|&p| p < h)
    }

    /// Distinct members on the ring.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Bytes the ring holds on the heap, ids' text aside (it is shared with the pool's config).
    pub fn heap_bytes(&self) -> usize {
        self.points.capacity() * size_of::<u64>()
            + self.owner.capacity() * size_of::<u32>()
            + self.starts.capacity() * size_of::<u32>()
            + self.members.capacity() * size_of::<UpstreamId>()
    }

    /// The first `n` members in `key`'s order of preference, skipping `exclude`.
    pub fn preferred(&self, key: &str, n: usize, exclude: &[UpstreamId]) -> Vec<UpstreamId> {
        let len = self.points.len();
        let mut out: Vec<UpstreamId> = Vec::with_capacity(n.min(self.members.len()));
        if len == 0 || n == 0 {
            return out;
        }
        // Excluded members that are on the ring, each counted once.
        let excluded = exclude
            .iter()
            .enumerate()
            .filter(|(i, id)| !exclude[..*i].contains(id) && self.members.binary_search(id).is_ok())
            .count();
        let want = n.min(self.members.len().saturating_sub(excluded));
        let mut chosen: Vec<u32> = Vec::with_capacity(want);

        let kh = xxh3_64(key.as_bytes());
        let mut walks = [Walk {
            origin: 0,
            at: 0,
            steps: 0,
        }; PROBES];
        for (i, w) in walks.iter_mut().enumerate() {
            w.origin = nth(kh, i);
            // The first point at or after the probe, wrapping past the top of the ring.
            w.at = self.first_at_or_after(w.origin) % len;
        }
        // Merge the walks by distance: each member is met first at its shortest distance.
        while chosen.len() < want {
            let mut best: Option<(u64, usize)> = None;
            for (i, w) in walks.iter().enumerate() {
                if w.steps >= len {
                    continue;
                }
                let distance = self.points[w.at].wrapping_sub(w.origin);
                let closer = match best {
                    None => true,
                    Some((d, _)) if distance != d => distance < d,
                    // Two probes equally far from points: the member first in id order.
                    Some((_, j)) => self.owner[w.at] < self.owner[walks[j].at],
                };
                if closer {
                    best = Some((distance, i));
                }
            }
            // Every walk went round once: no member is left to meet.
            let Some((_, i)) = best else { break };
            let w = &mut walks[i];
            let owner = self.owner[w.at];
            w.at = (w.at + 1) % len;
            w.steps += 1;
            if chosen.contains(&owner) {
                continue;
            }
            let id = &self.members[owner as usize];
            if exclude.contains(id) {
                continue;
            }
            chosen.push(owner);
            out.push(id.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn members(n: usize) -> Vec<UpstreamId> {
        (0..n)
            .map(|i| UpstreamId::new(format!("http://10.0.{}.{}:3128", i / 256, i % 256)))
            .collect()
    }

    fn keys(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("session-{i}")).collect()
    }

    fn first_choices(r: &Ring, keys: &[String]) -> Vec<UpstreamId> {
        keys.iter()
            .map(|k| r.preferred(k, 1, &[])[0].clone())
            .collect()
    }

    fn without(all: &[UpstreamId], gone: &UpstreamId) -> Vec<UpstreamId> {
        all.iter().filter(|id| *id != gone).cloned().collect()
    }

    #[test]
    fn keys_spread_evenly_and_removal_moves_only_the_removed_members_keys() {
        let all = members(8);
        let r = Ring::new(&all);
        let keys = keys(1000);
        let first = first_choices(&r, &keys);
        let mut counts: HashMap<&UpstreamId, usize> = HashMap::new();
        for id in &first {
            *counts.entry(id).or_default() += 1;
        }
        let mean = 1000.0 / 8.0;
        assert_eq!(counts.len(), 8, "{counts:?}");
        assert!(
            counts.values().all(|&c| (c as f64) <= 1.5 * mean),
            "{counts:?}"
        );

        let removed = all[3].clone();
        let r2 = Ring::new(&without(&all, &removed));
        for (k, before) in keys.iter().zip(&first) {
            let after = r2.preferred(k, 1, &[])[0].clone();
            if *before != removed {
                assert_eq!(&after, before, "key {k} moved although its upstream stayed");
            }
        }
    }

    #[test]
    fn a_large_pool_is_balanced_too() {
        let all = members(1000);
        let r = Ring::new(&all);
        let mut counts: HashMap<UpstreamId, usize> = HashMap::new();
        for id in first_choices(&r, &keys(100_000)) {
            *counts.entry(id).or_default() += 1;
        }
        let max = counts.values().copied().max().unwrap_or(0);
        // 100 keys each on average: sampling noise alone reaches ~1.35× here.
        assert!(max as f64 <= 1.6 * 100.0, "max {max}");
    }

    #[test]
    fn a_hundred_removals_and_additions_each_move_only_the_changed_members_keys() {
        let all = members(64);
        let keys = keys(500);
        let base = Ring::new(&all);
        let before = first_choices(&base, &keys);
        for step in 0..100 {
            let changed = &all[(step * 7) % all.len()];
            let smaller = Ring::new(&without(&all, changed));
            let without_it = first_choices(&smaller, &keys);
            for ((k, b), a) in keys.iter().zip(&before).zip(&without_it) {
                if b == changed {
                    assert_ne!(a, changed, "key {k} still on the removed {changed:?}");
                } else {
                    assert_eq!(a, b, "removing {changed:?} moved key {k}");
                }
            }
            // Adding it back: only the keys it now wins move, and they move to it.
            for ((k, a), b) in keys.iter().zip(&without_it).zip(&before) {
                if b == changed {
                    assert_ne!(a, b);
                } else {
                    assert_eq!(a, b, "adding {changed:?} took key {k} it does not win");
                }
            }
            // And a member that never was one takes only keys it wins.
            let newcomer = UpstreamId::new(format!("http://192.168.0.{step}:8080"));
            let mut grown = all.clone();
            grown.push(newcomer.clone());
            let with_new = first_choices(&Ring::new(&grown), &keys);
            for ((k, b), a) in keys.iter().zip(&before).zip(&with_new) {
                assert!(
                    a == b || *a == newcomer,
                    "adding {newcomer:?} moved key {k}"
                );
            }
        }
    }

    #[test]
    fn order_is_stable_and_exclusion_takes_the_next() {
        let all = members(5);
        let r = Ring::new(&all);
        let order = r.preferred("k", 5, &[]);
        assert_eq!(order.len(), 5);
        let mut distinct = order.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 5);
        assert_eq!(r.preferred("k", 5, &[]), order);
        assert_eq!(r.preferred("k", 9, &[]), order, "at most every member");
        assert_eq!(r.preferred("k", 1, &order[..1]), vec![order[1].clone()]);
        assert_eq!(r.preferred("k", 5, &order[..2]), order[2..].to_vec());
        assert!(r.preferred("k", 3, &order).is_empty());
        // Removing a member keeps the others' relative order.
        let smaller = Ring::new(&without(&all, &order[1]));
        let mut expected = order.clone();
        expected.remove(1);
        assert_eq!(smaller.preferred("k", 4, &[]), expected);
    }

    #[test]
    fn the_member_set_alone_decides() {
        let all = members(50);
        let mut shuffled = all.clone();
        shuffled.reverse();
        shuffled.push(all[7].clone());
        let (a, b) = (Ring::new(&all), Ring::new(&shuffled));
        assert_eq!(b.len(), 50, "duplicates count once");
        for k in keys(200) {
            assert_eq!(a.preferred(&k, 4, &[]), b.preferred(&k, 4, &[]));
        }
        assert!(Ring::new(&[]).preferred("k", 4, &[]).is_empty());
        let one = Ring::new(&all[..1]);
        assert_eq!(one.preferred("k", 4, &[]), all[..1].to_vec());
    }

    #[test]
    fn the_search_index_finds_what_a_full_search_finds() {
        for n in [1usize, 2, 3, 100, 2000] {
            let r = Ring::new(&members(n));
            assert_eq!(r.bucket_bits == 0, n * POINTS_PER_MEMBER < 8, "n {n}");
            let probes = (0..2000u64).map(|i| nth(i, 0)).chain([
                0,
                1,
                u64::MAX,
                r.points[0],
                r.points[r.points.len() - 1],
            ]);
            for h in probes {
                assert_eq!(
                    r.first_at_or_after(h),
                    r.points.partition_point(|&p| p < h),
                    "n {n}, h {h:#x}"
                );
            }
        }
    }

    #[test]
    fn fixed_hash_gives_fixed_answers() {
        // Pinned: a change of hash, probes or tie-breaks re-derives every unbound session.
        let r = Ring::new(&members(8));
        let got: Vec<String> = r
            .preferred("session-42", 3, &[])
            .iter()
            .map(|id| id.as_str().to_string())
            .collect();
        assert_eq!(got, PINNED);
    }

    const PINNED: [&str; 3] = [
        "http://10.0.0.7:3128",
        "http://10.0.0.6:3128",
        "http://10.0.0.4:3128",
    ];
}
