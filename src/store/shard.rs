//! Pool shards: a pool declared with `shards = k` lives in the store as k pools, named
//! `<pool>~<n>` ([`shard_names`]).
//!
//! One pool's state is one hash tag, so on a Redis Cluster it is one slot on one master, and a
//! pool with a cap or least-connections costs Redis enough per request that one core bounds it
//! (docs/performance.md, "Instances and the capacity model"). Each shard is a pool of its own to
//! the backend, with its own hash tag, so k shards spread over the masters. What stays exact:
//! a member lives in one shard (chosen by a hash of its id, the same on every instance), so its
//! cap, live leases, settings and statistics are its shard's; a session lives in one shard
//! (chosen by its key among the shards holding members it may use), so it is as sticky as in
//! one pool. What becomes approximate: least-used, least-connections and round-robin hold
//! within a shard, and a plain request picks a shard in proportion to its members, falling over
//! to the next when one has none to give.
//!
//! [`Sharded`] wraps a backend and routes every call; pools declared with one shard pass
//! straight through.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::{
    Acquired, AnyStore, LeaseId, LockToken, MemberChange, MemberState, MemberStatus, PoolSpec,
    PoolStatus, Store, StoreError, Subset, Want,
};
use crate::fast_map::FastMap;
use crate::outcome::Outcome;
use crate::upstream::UpstreamId;

/// Label-filter subsets whose split is kept per pool; past this the cache starts over.
const MAX_SPLITS: usize = 1024;

/// Consecutive plain acquires an instance sends to one shard before it moves on. The Redis
/// store batches the acquires (and releases) of one store pool that queue while its last call
/// is under way, and a call's fixed cost is most of what Redis pays: spreading every request
/// over k shards cut the batches k-fold and raised Redis's CPU per request 2-3-fold on a Cluster
/// (6 shards, docs/performance.md). In runs, a busy instance's batches stay whole, and instances (each
/// starting at a random turn) and time spread the runs over the shards.
const PLAIN_RUN: u64 = 64;

/// Redis Cluster's hash slots.
const SLOTS: u32 = 16384;

/// The Redis Cluster slot of keys whose hash tag is `tag`.
fn slot(tag: &str) -> u32 {
    u32::from(crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes())) % SLOTS
}

/// The store's names for the `shards` shards of `pool`: `<pool>~<n>`, the n of shard `i` the
/// first whose slot lies in the `i`-th of `shards` equal parts of the slot space. A cluster's
/// masters usually hold equal ranges of slots, so the shards spread evenly over them; plain
/// `~0`, `~1`… fell 3, 2 and 1 to a master (6 shards, 3 masters, docs/performance.md). The
/// names depend on the pool's name and `shards` only: every instance finds the same ones. `~`
/// is not allowed in pool names, so a shard never meets a pool of the same name.
pub fn shard_names(pool: &str, shards: usize) -> Vec<String> {
    let part = |i: usize| (i as u64 * u64::from(SLOTS) / shards as u64) as u32;
    let mut n = 0u64;
    (0..shards)
        .map(|i| {
            let (lo, hi) = (part(i), part(i + 1));
            // Each candidate lands in a given part with probability 1/shards: a few dozen
            // tries at most for 64 shards. Bounded all the same: a name outside its part
            // only spreads less.
            let first = n;
            loop {
                let name = format!("{pool}~{n}");
                n += 1;
                if (lo..hi).contains(&slot(&name)) || n - first > 100_000 {
                    return name;
                }
            }
        })
        .collect()
}

/// The pool a store pool belongs to: `eu~3` is a shard of `eu`; any other name is its own pool.
/// Backends name pools this way where the gateway hears of them (member changes, list changes,
/// release signals), so shards are invisible above the store.
pub fn pool_of(name: &str) -> &str {
    match name.rsplit_once('~') {
        Some((pool, index)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            pool
        }
        _ => name,
    }
}

/// The shard (of `shards`) member `id` lives in: the same on every instance.
pub fn shard_of(id: &UpstreamId, shards: usize) -> usize {
    (xxh3_64(id.as_str().as_bytes()) % shards as u64) as usize
}

/// One release signal per pool, shared by its shards: a request waiting for capacity in a
/// sharded pool is woken by a release in any of them.
#[derive(Default)]
pub struct Signals(Mutex<HashMap<String, Arc<Notify>>>);

impl Signals {
    pub fn of(&self, store_pool: &str) -> Arc<Notify> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(pool_of(store_pool).to_string())
            .or_default()
            .clone()
    }
}

/// How one sharded pool is laid out.
struct Layout {
    /// The store's name of each shard.
    names: Vec<String>,
    /// Members in each shard.
    sizes: Vec<usize>,
    /// The pool's members in order, for `/status`.
    members: Vec<UpstreamId>,
    /// Label-filter subsets split by shard, by subset id.
    splits: Mutex<FastMap<Box<str>, Arc<Split>>>,
    /// Spreads plain acquires over the shards.
    turn: AtomicU64,
}

/// A label filter's members, split by shard.
struct Split {
    members: Vec<Vec<UpstreamId>>,
    sizes: Vec<usize>,
}

impl Layout {
    fn new(spec: &PoolSpec, shards: usize) -> (Layout, Vec<Vec<UpstreamId>>) {
        let parts = split(&spec.members, shards);
        let layout = Layout {
            names: shard_names(&spec.name, shards),
            sizes: parts.iter().map(Vec::len).collect(),
            members: spec.members.clone(),
            splits: Mutex::default(),
            turn: AtomicU64::new(rand::random::<u32>().into()),
        };
        (layout, parts)
    }

    fn shards(&self) -> usize {
        self.names.len()
    }

    /// The shards, the one a session `key` outside any label filter lives in first: where a
    /// lookup by key alone (which does not say the session's filter) most likely finds it.
    fn names_for_key(&self, key: &str) -> impl Iterator<Item = &str> {
        let home = home_shard(key, &self.sizes).unwrap_or(0);
        let k = self.shards();
        (0..k).map(move |step| self.names[(home + step) % k].as_str())
    }

    /// The subset's members in each shard (kept: the same subset comes back request after
    /// request, and its members do not change under one id).
    fn split(&self, subset: &Subset<'_>) -> Arc<Split> {
        let mut splits = self.splits.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = splits.get(subset.id) {
            return s.clone();
        }
        if splits.len() >= MAX_SPLITS {
            splits.clear();
        }
        let members = split(subset.members, self.shards());
        let s = Arc::new(Split {
            sizes: members.iter().map(Vec::len).collect(),
            members,
        });
        splits.insert(subset.id.into(), s.clone());
        s
    }

    /// The shard a plain acquire asks first: runs of [`PLAIN_RUN`] acquires, each run's shard
    /// picked in proportion to `sizes` and spread evenly over consecutive runs (the
    /// golden-ratio sequence).
    fn first_shard(&self, sizes: &[usize]) -> Option<usize> {
        let total: usize = sizes.iter().sum();
        if total == 0 {
            return None;
        }
        let run = self.turn.fetch_add(1, Ordering::Relaxed) / PLAIN_RUN;
        // frac(run × φ) in 32-bit fixed point.
        let x = (run.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u128;
        let mut point = ((x * total as u128) >> 32) as usize;
        for (i, &n) in sizes.iter().enumerate() {
            if point < n {
                return Some(i);
            }
            point -= n;
        }
        sizes.iter().rposition(|&n| n > 0)
    }
}

/// A session's shard: highest random weight over the shards holding members it may use, so a
/// shard gaining or losing its last such member moves only the sessions that go to or come
/// from it.
fn home_shard(key: &str, sizes: &[usize]) -> Option<usize> {
    sizes
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .max_by_key(|(i, _)| xxh3_64_with_seed(key.as_bytes(), *i as u64))
        .map(|(i, _)| i)
}

fn split(members: &[UpstreamId], shards: usize) -> Vec<Vec<UpstreamId>> {
    let mut parts = vec![Vec::new(); shards];
    for m in members {
        parts[shard_of(m, shards)].push(m.clone());
    }
    parts
}

/// The backend's pool a call goes to: the pool itself, or one of its shards.
enum StorePool<'a> {
    Whole(&'a str),
    Shard(Arc<Layout>, usize),
}

impl StorePool<'_> {
    fn name(&self) -> &str {
        match self {
            StorePool::Whole(pool) => pool,
            StorePool::Shard(layout, shard) => &layout.names[*shard],
        }
    }
}

/// A backend whose pools may be sharded (see the module documentation).
pub struct Sharded<S> {
    inner: S,
    layouts: RwLock<FastMap<String, Arc<Layout>>>,
    /// Whether any pool is sharded: until one is, calls skip the lookup.
    any: AtomicBool,
}

impl<S: Store> Sharded<S> {
    pub fn new(inner: S) -> Self {
        Sharded {
            inner,
            layouts: RwLock::default(),
            any: AtomicBool::new(false),
        }
    }

    /// The backend.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn layout(&self, pool: &str) -> Option<Arc<Layout>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let layouts = self.layouts.read().unwrap_or_else(|e| e.into_inner());
        layouts.get(pool).cloned()
    }

    /// The store pool that holds `upstream` of `pool` (a release and a record on every
    /// request: named without a copy of the name).
    fn pool_for<'a>(&self, pool: &'a str, upstream: &UpstreamId) -> StorePool<'a> {
        match self.layout(pool) {
            Some(l) => {
                let shard = shard_of(upstream, l.shards());
                StorePool::Shard(l, shard)
            }
            None => StorePool::Whole(pool),
        }
    }

    async fn acquire_sharded(
        &self,
        layout: &Layout,
        want: Want<'_>,
    ) -> Result<Acquired, StoreError> {
        let (Want::Any { within, .. } | Want::Session { within, .. }) = want;
        let split = within.as_ref().map(|s| layout.split(s));
        let sizes = split.as_ref().map_or(&layout.sizes, |s| &s.sizes);
        // The filter's members in shard `i`.
        let within_shard = |i: usize| {
            within.map(|s| Subset {
                id: s.id,
                members: split.as_ref().map_or(&[][..], |p| &p.members[i]),
            })
        };
        match want {
            Want::Any { exclude, .. } => {
                let Some(first) = layout.first_shard(sizes) else {
                    return Ok(Acquired::NoCandidates);
                };
                let mut at_capacity = false;
                for step in 0..layout.shards() {
                    let i = (first + step) % layout.shards();
                    if sizes[i] == 0 {
                        continue;
                    }
                    let want = Want::Any {
                        exclude,
                        within: within_shard(i),
                    };
                    match self.inner.acquire(&layout.names[i], want).await? {
                        Acquired::AtCapacity => at_capacity = true,
                        Acquired::NoCandidates => {}
                        other => return Ok(other),
                    }
                }
                Ok(if at_capacity {
                    Acquired::AtCapacity
                } else {
                    Acquired::NoCandidates
                })
            }
            Want::Session {
                key,
                ttl,
                preferred,
                rebind,
                ..
            } => {
                let Some(home) = home_shard(key, sizes) else {
                    return Ok(Acquired::NoCandidates);
                };
                let shards = layout.shards();
                let preferred: Vec<UpstreamId> = preferred
                    .iter()
                    .filter(|u| shard_of(u, shards) == home)
                    .cloned()
                    .collect();
                let want = Want::Session {
                    key,
                    ttl,
                    preferred: &preferred,
                    rebind,
                    within: within_shard(home),
                };
                self.inner.acquire(&layout.names[home], want).await
            }
        }
    }
}

impl Sharded<AnyStore> {
    /// [`AnyStore::release_now`], to the lease's shard.
    pub fn release_now(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let pool = self.pool_for(pool, upstream);
        self.inner
            .release_now(pool.name(), upstream, lease, outcome, latency)
    }

    /// [`AnyStore::settle`].
    pub async fn settle(&self, limit: Duration) -> bool {
        self.inner.settle(limit).await
    }
}

impl<S: Store> Store for Sharded<S> {
    async fn configure(&self, spec: PoolSpec) -> Result<(), StoreError> {
        let shards = spec.shards.max(1) as usize;
        if shards == 1 {
            let name = spec.name.clone();
            self.inner.configure(spec).await?;
            let mut layouts = self.layouts.write().unwrap_or_else(|e| e.into_inner());
            layouts.remove(&name);
            return Ok(());
        }
        let (layout, parts) = Layout::new(&spec, shards);
        for (name, members) in layout.names.iter().zip(parts) {
            self.inner
                .configure(PoolSpec {
                    name: name.clone(),
                    members,
                    shards: 1,
                    ..spec.clone()
                })
                .await?;
        }
        let mut layouts = self.layouts.write().unwrap_or_else(|e| e.into_inner());
        layouts.insert(spec.name.clone(), Arc::new(layout));
        self.any.store(true, Ordering::Release);
        Ok(())
    }

    async fn acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        match self.layout(pool) {
            None => self.inner.acquire(pool, want).await,
            Some(l) => Box::pin(self.acquire_sharded(&l, want)).await,
        }
    }

    async fn release(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let pool = self.pool_for(pool, upstream);
        self.inner
            .release(pool.name(), upstream, lease, outcome, latency)
            .await
    }

    async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let pool = self.pool_for(pool, upstream);
        self.inner
            .record(pool.name(), upstream, outcome, latency)
            .await
    }

    async fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> Result<Option<UpstreamId>, StoreError> {
        let Some(layout) = self.layout(pool) else {
            return self.inner.session_upstream(pool, key).await;
        };
        // Which shard is the session's depends on its filter, which the key alone does not
        // say; a lookup is not on any request's path.
        for name in layout.names_for_key(key) {
            if let Some(up) = self.inner.session_upstream(name, key).await? {
                return Ok(Some(up));
            }
        }
        Ok(None)
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let pool = self.pool_for(pool, upstream);
        self.inner.extend(pool.name(), upstream, lease).await
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
        believed: Option<MemberState>,
    ) -> Result<(), StoreError> {
        let pool = self.pool_for(pool, upstream);
        self.inner
            .set_member(pool.name(), upstream, state, believed)
            .await
    }

    async fn end_session(&self, pool: &str, key: &str) -> Result<bool, StoreError> {
        let Some(layout) = self.layout(pool) else {
            return self.inner.end_session(pool, key).await;
        };
        let mut ended = false;
        for name in layout.names_for_key(key) {
            ended |= self.inner.end_session(name, key).await?;
        }
        Ok(ended)
    }

    async fn unbind(&self, pool: &str, key: &str, upstream: &UpstreamId) -> Result<(), StoreError> {
        // A binding lives in the shard of the member it points at.
        let pool = self.pool_for(pool, upstream);
        self.inner.unbind(pool.name(), key, upstream).await
    }

    fn release_signal(&self, pool: &str) -> Arc<Notify> {
        match self.layout(pool) {
            // Shared by the shards (see [`Signals`]).
            Some(l) => self.inner.release_signal(&l.names[0]),
            None => self.inner.release_signal(pool),
        }
    }

    async fn status(&self, pool: &str) -> Result<PoolStatus, StoreError> {
        let Some(layout) = self.layout(pool) else {
            return self.inner.status(pool).await;
        };
        let mut sessions_live = 0;
        let mut by_id: HashMap<String, MemberStatus> = HashMap::new();
        for name in &layout.names {
            let s = self.inner.status(name).await?;
            sessions_live += s.sessions_live;
            by_id.extend(s.members.into_iter().map(|m| (m.id.clone(), m)));
        }
        let members = layout
            .members
            .iter()
            .filter_map(|id| by_id.remove(id.as_str()))
            .collect();
        Ok(PoolStatus {
            sessions_live,
            members,
        })
    }

    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn health(&self) -> &'static str {
        self.inner.health()
    }

    fn health_reason(&self) -> Option<String> {
        self.inner.health_reason()
    }

    async fn lock(&self, name: &str, ttl: Duration) -> Result<Option<LockToken>, StoreError> {
        self.inner.lock(name, ttl).await
    }

    async fn extend_lock(
        &self,
        name: &str,
        token: &LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.extend_lock(name, token, ttl).await
    }

    async fn unlock(&self, name: &str, token: &LockToken) -> Result<bool, StoreError> {
        self.inner.unlock(name, token).await
    }

    fn subscribe_member_changes(&self) -> broadcast::Receiver<MemberChange> {
        self.inner.subscribe_member_changes()
    }

    async fn put_listed(&self, pool: &str, list: &str) -> Result<(), StoreError> {
        // The list is the pool's, kept with its first shard.
        match self.layout(pool) {
            Some(l) => self.inner.put_listed(&l.names[0], list).await,
            None => self.inner.put_listed(pool, list).await,
        }
    }

    async fn listed(&self, pool: &str) -> Result<Option<String>, StoreError> {
        match self.layout(pool) {
            Some(l) => self.inner.listed(&l.names[0]).await,
            None => self.inner.listed(pool).await,
        }
    }

    fn subscribe_listed_changes(&self) -> broadcast::Receiver<String> {
        self.inner.subscribe_listed_changes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<UpstreamId> {
        (0..n)
            .map(|i| UpstreamId::new(format!("http://10.0.{}.{}:3128", i / 250, i % 250)))
            .collect()
    }

    #[test]
    fn a_shard_names_its_pool_and_nothing_else_does() {
        assert_eq!(pool_of("eu~3"), "eu");
        for name in shard_names("us-east_1", 64) {
            assert_eq!(pool_of(&name), "us-east_1");
        }
        for own in ["eu", "eu~", "eu~x", "~", "a~1b"] {
            assert_eq!(pool_of(own), own);
        }
    }

    #[test]
    fn shards_spread_evenly_over_the_cluster_slots() {
        // Known slots (CLUSTER KEYSLOT): the function is Redis Cluster's.
        assert_eq!(slot("default~0"), 6327);
        assert_eq!(slot("default~1"), 2198);
        for pool in ["default", "residential", "p"] {
            for k in [2, 3, 6, 12, 64] {
                let names = shard_names(pool, k);
                assert_eq!(names, shard_names(pool, k), "the same on every instance");
                let distinct: std::collections::HashSet<_> = names.iter().collect();
                assert_eq!(distinct.len(), k);
                for (i, name) in names.iter().enumerate() {
                    let part = (slot(name) as usize * k) / SLOTS as usize;
                    assert_eq!(part, i, "{name} of {k}");
                }
            }
        }
    }

    #[test]
    fn members_split_by_their_id_alone() {
        let members = ids(1000);
        let parts = split(&members, 8);
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), 1000);
        for (i, part) in parts.iter().enumerate() {
            // Roughly even (1000 / 8 = 125), and where shard_of says.
            assert!(
                (90..=160).contains(&part.len()),
                "shard {i}: {}",
                part.len()
            );
            assert!(part.iter().all(|m| shard_of(m, 8) == i));
        }
        // Another order, the same split.
        let mut reversed = members.clone();
        reversed.reverse();
        let again = split(&reversed, 8);
        for (a, b) in parts.iter().zip(&again) {
            let mut b = b.clone();
            b.reverse();
            assert_eq!(a, &b);
        }
    }

    #[test]
    fn plain_acquires_go_to_shards_in_proportion_to_their_members() {
        let spec = PoolSpec {
            name: "p".into(),
            members: ids(10),
            strategy: crate::config::Strategy::LeastUsed,
            max_concurrency: None,
            lease_ttl: Duration::from_secs(60),
            shards: 4,
        };
        let (layout, _) = Layout::new(&spec, 4);
        let sizes = [1, 0, 3, 6];
        let mut counts = [0usize; 4];
        let mut runs = 0;
        let mut last = None;
        for _ in 0..1000 * PLAIN_RUN {
            let shard = layout.first_shard(&sizes).unwrap();
            counts[shard] += 1;
            runs += usize::from(last != Some(shard));
            last = Some(shard);
        }
        // Low-discrepancy: within a few runs of the exact shares over any 1000 runs.
        let run = PLAIN_RUN as usize;
        for (i, want) in [100, 0, 300, 600].into_iter().enumerate() {
            assert!(counts[i].abs_diff(want * run) <= 4 * run, "{counts:?}");
        }
        // In runs: at most one change of shard per run (the first may start midway).
        assert!(runs <= 1001, "{runs} changes");
        assert!(runs >= 500, "{runs} changes: runs too long");
        assert_eq!(layout.first_shard(&[0, 0, 0, 0]), None);
    }

    #[test]
    fn a_session_keeps_its_shard_unless_its_shard_empties() {
        let keys: Vec<String> = (0..2000).map(|i| format!("s{i}")).collect();
        let all = [5, 5, 5, 5];
        let home: Vec<usize> = keys.iter().map(|k| home_shard(k, &all).unwrap()).collect();
        let mut per_shard = [0; 4];
        for &h in &home {
            per_shard[h] += 1;
        }
        assert!(
            per_shard.iter().all(|&n| (400..=600).contains(&n)),
            "{per_shard:?}"
        );
        // Shard 2 left without members: only its sessions move.
        let without = [5, 5, 0, 5];
        for (k, &h) in keys.iter().zip(&home) {
            let now = home_shard(k, &without).unwrap();
            if h == 2 {
                assert_ne!(now, 2);
            } else {
                assert_eq!(now, h, "{k} moved");
            }
        }
        assert_eq!(home_shard("s1", &[0, 0, 0, 0]), None);
    }
}
