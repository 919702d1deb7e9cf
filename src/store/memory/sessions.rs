//! One pool's session bindings in the embedded store: session key → upstream, until an expiry.
//!
//! Built for a million bindings a pool. A binding takes a 40-byte slot: the key boxed (16 bytes,
//! where a `String` takes 24), the upstream (a shared `Arc`) and the expiry as nanoseconds from
//! the pool's epoch (8 bytes, where an `Instant` takes 16); plus the key's own allocation.
//!
//! Expired bindings are dropped by a sweep, and lookups ignore an expired binding whether it was
//! swept or not. The bindings are split into [`SHARDS`] maps, swept one at a time, so a sweep
//! holds the pool's lock over a sixty-fourth of the bindings (about 0.3 ms at a million, where
//! sweeping them all took 20 ms and stalled every request of the pool): one shard each
//! `SWEEP_INTERVAL / SHARDS`, so each is still swept every [`SWEEP_INTERVAL`] while session
//! acquires keep coming.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::upstream::UpstreamId;

/// How often each shard's expired bindings are swept out, at most.
pub(super) const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Maps the bindings are split into; one is swept at a time.
pub(super) const SHARDS: usize = 64;

struct Binding {
    upstream: UpstreamId,
    /// Nanoseconds from [`Sessions::epoch`].
    expires: u64,
}

/// Session key → binding, in [`SHARDS`] maps. The maps keep the standard library's hasher: the
/// keys are the clients'.
pub(super) struct Sessions {
    shards: Box<[HashMap<Box<str>, Binding>]>,
    /// Picks a key's shard (with the key's xxh3): a client that crafts keys into one shard only
    /// makes that shard's sweeps as long as a whole sweep was; the maps' own hashing is keyed.
    seed: u64,
    /// Expiries are counted from here: no binding outlives 584 years of it.
    epoch: Instant,
    next_shard: usize,
    last_sweep: Instant,
}

impl Sessions {
    pub fn new(now: Instant) -> Self {
        Sessions {
            shards: (0..SHARDS).map(|_| HashMap::new()).collect(),
            seed: rand::random(),
            epoch: now,
            next_shard: 0,
            last_sweep: now,
        }
    }

    fn ticks(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    fn shard(&self, key: &str) -> usize {
        xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), self.seed) as usize % SHARDS
    }

    /// The upstream `key` is bound to, if its binding is live at `now`.
    pub fn live(&self, key: &str, now: Instant) -> Option<&UpstreamId> {
        let now = self.ticks(now);
        self.shards[self.shard(key)]
            .get(key)
            .filter(|b| b.expires > now)
            .map(|b| &b.upstream)
    }

    /// The upstream `key` is bound to, live or expired but not yet swept.
    pub fn bound(&self, key: &str) -> Option<&UpstreamId> {
        self.shards[self.shard(key)].get(key).map(|b| &b.upstream)
    }

    /// Moves `key`'s expiry to `expires`, if it has a binding.
    pub fn refresh(&mut self, key: &str, expires: Instant) {
        let expires = self.ticks(expires);
        let shard = self.shard(key);
        if let Some(b) = self.shards[shard].get_mut(key) {
            b.expires = expires;
        }
    }

    /// Binds `key` to `upstream` until `expires`, replacing any binding it had.
    pub fn bind(&mut self, key: &str, upstream: &UpstreamId, expires: Instant) {
        let binding = Binding {
            upstream: upstream.clone(),
            expires: self.ticks(expires),
        };
        let shard = self.shard(key);
        self.shards[shard].insert(key.into(), binding);
    }

    /// Drops `key`'s binding; true when it was live at `now`.
    pub fn remove(&mut self, key: &str, now: Instant) -> bool {
        let now = self.ticks(now);
        let shard = self.shard(key);
        self.shards[shard]
            .remove(key)
            .is_some_and(|b| b.expires > now)
    }

    /// Bindings live at `now` (a walk over all of them: `/status` only).
    pub fn count_live(&self, now: Instant) -> usize {
        let now = self.ticks(now);
        self.shards
            .iter()
            .map(|s| s.values().filter(|b| b.expires > now).count())
            .sum()
    }

    /// Bindings held, expired ones not yet swept included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(HashMap::len).sum()
    }

    /// Sweeps the next shard's expired bindings, if one is due.
    pub fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.last_sweep) < SWEEP_INTERVAL / SHARDS as u32 {
            return;
        }
        let ticks = self.ticks(now);
        self.shards[self.next_shard].retain(|_, b| b.expires > ticks);
        self.next_shard = (self.next_shard + 1) % SHARDS;
        self.last_sweep = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(i: usize) -> UpstreamId {
        UpstreamId::new(format!("u{i}"))
    }

    #[tokio::test(start_paused = true)]
    async fn bindings_expire_slide_and_end() {
        let t0 = Instant::now();
        let mut s = Sessions::new(t0);
        s.bind("k", &up(1), t0 + Duration::from_secs(60));
        assert_eq!(s.live("k", t0), Some(&up(1)));
        assert_eq!(s.live("k", t0 + Duration::from_secs(60)), None);
        s.refresh("k", t0 + Duration::from_secs(120));
        assert_eq!(s.live("k", t0 + Duration::from_secs(119)), Some(&up(1)));
        // Expired, not swept: no longer live, still there for `unbind`.
        assert_eq!(s.bound("k"), Some(&up(1)));
        assert!(!s.remove("k", t0 + Duration::from_secs(120)));
        s.bind("k", &up(2), t0 + Duration::from_secs(60));
        assert!(s.remove("k", t0));
        assert_eq!((s.bound("k"), s.len()), (None, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_walks_one_shard_and_every_shard_is_swept_within_the_interval() {
        let t0 = Instant::now();
        let mut s = Sessions::new(t0);
        let n = 10 * SHARDS;
        for i in 0..n {
            s.bind(&format!("k{i}"), &up(i % 3), t0 + Duration::from_secs(1));
        }
        s.bind("kept", &up(0), t0 + Duration::from_secs(3600));
        let step = SWEEP_INTERVAL / SHARDS as u32;
        let mut now = t0 + Duration::from_secs(2);
        assert_eq!(s.count_live(now), 1);
        s.sweep(now);
        let after_one = s.len();
        assert!(
            after_one > n / 2,
            "one sweep dropped {} of {n}",
            n + 1 - after_one
        );
        // Not due again right after a sweep.
        s.sweep(now);
        assert_eq!(s.len(), after_one);
        for _ in 1..SHARDS {
            now += step;
            s.sweep(now);
        }
        assert_eq!(s.len(), 1);
        assert!(now - t0 <= Duration::from_secs(2) + SWEEP_INTERVAL);
        assert_eq!(s.live("kept", now), Some(&up(0)));
    }
}
