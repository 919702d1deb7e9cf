//! The embedded store: pool state in this process, one mutex per pool.
//!
//! Each operation takes its pool's lock once, does its whole read-decide-write step and lets go;
//! nothing awaits while holding it. Time comes from `tokio::time::Instant`, so tests drive lease
//! and session expiry with a paused clock. The decisions themselves are `pool_state.rs`'s.

mod pool_state;
mod sessions;
mod stored_key;
mod subset;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

use super::shard::Signals;
use super::{
    Acquired, HEALTH_OK, LeaseId, LockToken, MemberChange, MemberState, PoolSpec, PoolStatus,
    Store, StoreError, Want,
};
use crate::fast_map::FastMap;
use crate::outcome::Outcome;
use crate::upstream::UpstreamId;
use pool_state::PoolState;

pub struct MemoryStore {
    pools: RwLock<FastMap<String, Arc<PoolEntry>>>,
    /// Job locks: name → (holder's token, expiry).
    locks: Mutex<HashMap<String, (LockToken, Instant)>>,
    /// Kept so that subscribers wait quietly: one instance has no peers to hear from.
    changes: broadcast::Sender<MemberChange>,
    /// Lists shared by `put_listed`, per pool.
    listed: Mutex<HashMap<String, String>>,
    /// Never sent to, like `changes`.
    listed_changes: broadcast::Sender<String>,
    /// The pools' release signals, one for all shards of a pool.
    signals: Signals,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            pools: RwLock::default(),
            locks: Mutex::default(),
            changes: broadcast::channel(1).0,
            listed: Mutex::default(),
            listed_changes: broadcast::channel(1).0,
            signals: Signals::default(),
        }
    }
}

struct PoolEntry {
    state: Mutex<PoolState>,
    released: Arc<Notify>,
    /// When the scheduled lease-expiry wake-up fires, if one is pending.
    wake_at: Mutex<Option<Instant>>,
}

impl PoolEntry {
    /// Wakes waiting requests when the earliest lease expires: capacity held by a lease nobody
    /// releases comes back without a release to announce it.
    fn schedule_wake(self: &Arc<Self>, at: Instant) {
        {
            let mut pending = self.wake_at.lock().unwrap_or_else(|e| e.into_inner());
            if pending.is_some_and(|t| t <= at && t > Instant::now()) {
                return;
            }
            *pending = Some(at);
        }
        let entry = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            // A pool that was dropped meanwhile has nobody left to wake.
            let Some(entry) = entry.upgrade() else { return };
            {
                let mut pending = entry.wake_at.lock().unwrap_or_else(|e| e.into_inner());
                if *pending == Some(at) {
                    *pending = None;
                }
            }
            entry.released.notify_waiters();
        });
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// [`Store::release`] without a future: the embedded store never waits, and a release is on
    /// every request's path.
    pub fn release_now(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        let capped = {
            let mut state = lock(&entry);
            state.release(upstream, lease, outcome, latency);
            state.capped()
        };
        // Only a pool with a cap has requests waiting for a release (`Acquired::AtCapacity`);
        // waking nobody still takes the signal's lock, on every request's path.
        if capped {
            entry.released.notify_waiters();
        }
        Ok(())
    }

    /// The setting `upstream` has here, if it is a member of `pool`. The Redis store keeps this
    /// store as its local view of the shared settings, and tells Redis what it believed when it
    /// decides a change.
    pub fn member_state(&self, pool: &str, upstream: &UpstreamId) -> Option<MemberState> {
        let entry = self.entry(pool).ok()?;
        lock(&entry).member_state(upstream)
    }

    /// Counts leases held elsewhere against the caps of `pool`'s members: the Redis store, whose
    /// local view this store is, tells it the leases Redis granted it that are still running, so
    /// that while it serves degraded its own total per upstream stays within the cap. `held` lists
    /// the members that hold any (the others hold none); it is called under the pool's lock, so a
    /// count read there is not overwritten by an older one. They count in `leases_live` too.
    pub fn hold_all(&self, pool: &str, held: impl FnOnce() -> Vec<(UpstreamId, u64)>) {
        if let Ok(entry) = self.entry(pool) {
            let mut state = lock(&entry);
            state.hold_all(&held());
        }
    }

    /// Hands this store's live leases of `pool` (lease, member, deadline) to `take` under the
    /// pool's lock, so that none of them ends before `take` has them.
    pub fn with_own_leases(
        &self,
        pool: &str,
        take: impl FnOnce(Vec<(LeaseId, UpstreamId, Instant)>),
    ) {
        if let Ok(entry) = self.entry(pool) {
            take(lock(&entry).own_leases());
        }
    }

    /// [`MemoryStore::hold_all`] for one member: `held` gives its count, read under the lock.
    pub fn hold(&self, pool: &str, upstream: &UpstreamId, held: impl FnOnce() -> u64) {
        if let Ok(entry) = self.entry(pool) {
            let mut state = lock(&entry);
            state.hold(upstream, held());
        }
    }

    fn entry(&self, pool: &str) -> Result<Arc<PoolEntry>, StoreError> {
        let pools = self.pools.read().unwrap_or_else(|e| e.into_inner());
        pools
            .get(pool)
            .cloned()
            .ok_or_else(|| StoreError::UnknownPool(pool.to_string()))
    }
}

/// A poisoned lock only means another request panicked mid-step; the state is still usable.
fn lock(entry: &PoolEntry) -> MutexGuard<'_, PoolState> {
    entry.state.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store for MemoryStore {
    async fn configure(&self, spec: PoolSpec) -> Result<(), StoreError> {
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = pools.get(&spec.name) {
            lock(entry).reconfigure(spec);
            entry.released.notify_waiters();
            return Ok(());
        }
        let name = spec.name.clone();
        let released = self.signals.of(&name);
        let state = PoolState::new(spec, Instant::now());
        pools.insert(
            name,
            Arc::new(PoolEntry {
                state: Mutex::new(state),
                released,
                wake_at: Mutex::new(None),
            }),
        );
        Ok(())
    }

    async fn acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        let entry = self.entry(pool)?;
        let now = Instant::now();
        let (acquired, earliest) = {
            let mut state = lock(&entry);
            let acquired = state.acquire(want, now);
            let earliest = (acquired == Acquired::AtCapacity)
                .then(|| state.earliest_deadline())
                .flatten();
            (acquired, earliest)
        };
        if let Some(at) = earliest {
            entry.schedule_wake(at);
        }
        Ok(acquired)
    }

    async fn release(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        self.release_now(pool, upstream, lease, outcome, latency)
    }

    async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        lock(&entry).count(upstream, outcome, latency);
        Ok(())
    }

    async fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> Result<Option<UpstreamId>, StoreError> {
        let entry = self.entry(pool)?;
        let now = Instant::now();
        Ok(lock(&entry).session_upstream(key, now))
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        let mut state = lock(&entry);
        state.extend(upstream, lease, Instant::now());
        Ok(())
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
        _believed: Option<MemberState>,
    ) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        lock(&entry).set_member(upstream, state);
        // Capacity may have appeared for waiting requests.
        entry.released.notify_waiters();
        Ok(())
    }

    async fn end_session(&self, pool: &str, key: &str) -> Result<bool, StoreError> {
        let entry = self.entry(pool)?;
        let now = Instant::now();
        Ok(lock(&entry).end_session(key, now))
    }

    async fn unbind(&self, pool: &str, key: &str, upstream: &UpstreamId) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        lock(&entry).unbind(key, upstream, Instant::now());
        Ok(())
    }

    fn release_signal(&self, pool: &str) -> Arc<Notify> {
        match self.entry(pool) {
            Ok(e) => e.released.clone(),
            Err(_) => Arc::new(Notify::new()),
        }
    }

    async fn status(&self, pool: &str) -> Result<PoolStatus, StoreError> {
        let entry = self.entry(pool)?;
        let now = Instant::now();
        Ok(lock(&entry).status(now))
    }

    fn kind(&self) -> &'static str {
        "memory"
    }

    fn health(&self) -> &'static str {
        HEALTH_OK
    }

    async fn lock(&self, name: &str, ttl: Duration) -> Result<Option<LockToken>, StoreError> {
        let now = Instant::now();
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|_, (_, expires)| *expires > now);
        if locks.contains_key(name) {
            return Ok(None);
        }
        let token = LockToken::random();
        locks.insert(name.to_string(), (token.clone(), now + ttl));
        Ok(Some(token))
    }

    async fn extend_lock(
        &self,
        name: &str,
        token: &LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        match locks.get_mut(name) {
            Some((held, expires)) if held == token && *expires > now => {
                *expires = now + ttl;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn unlock(&self, name: &str, token: &LockToken) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        match locks.get(name) {
            Some((held, expires)) if held == token && *expires > now => {
                locks.remove(name);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn subscribe_member_changes(&self) -> broadcast::Receiver<MemberChange> {
        self.changes.subscribe()
    }

    async fn put_listed(&self, pool: &str, list: &str) -> Result<(), StoreError> {
        self.entry(pool)?;
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pool.to_string(), list.to_string());
        Ok(())
    }

    async fn listed(&self, pool: &str) -> Result<Option<String>, StoreError> {
        self.entry(pool)?;
        Ok(self
            .listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(pool)
            .cloned())
    }

    fn subscribe_listed_changes(&self) -> broadcast::Receiver<String> {
        self.listed_changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Strategy;
    use crate::store::Grant;

    fn ids(n: usize) -> Vec<UpstreamId> {
        (0..n).map(|i| UpstreamId::new(format!("u{i}"))).collect()
    }

    async fn store(
        strategy: Strategy,
        n: usize,
        cap: Option<u32>,
    ) -> (MemoryStore, Vec<UpstreamId>) {
        let s = MemoryStore::new();
        let members = ids(n);
        s.configure(PoolSpec {
            name: "p".into(),
            members: members.clone(),
            strategy,
            max_concurrency: cap,
            lease_ttl: Duration::from_secs(10),
            shards: 1,
        })
        .await
        .unwrap();
        (s, members)
    }

    fn granted(a: Acquired) -> Grant {
        match a {
            Acquired::Granted(g) => g,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn least_used_spreads_allocations_evenly() {
        let (s, _) = store(Strategy::LeastUsed, 8, None).await;
        for _ in 0..8_000 {
            let g = granted(
                s.acquire(
                    "p",
                    Want::Any {
                        exclude: &[],
                        within: None,
                    },
                )
                .await
                .unwrap(),
            );
            s.release("p", &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
                .await
                .unwrap();
        }
        let st = s.status("p").await.unwrap();
        let allocs: Vec<u64> = st.members.iter().map(|m| m.allocations).collect();
        assert!(
            allocs.iter().max().unwrap() - allocs.iter().min().unwrap() <= 1,
            "{allocs:?}"
        );
    }

    #[tokio::test]
    async fn cap_is_enforced_and_release_frees_capacity() {
        let (s, _) = store(Strategy::LeastUsed, 2, Some(1)).await;
        let a = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        let b = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_ne!(a.upstream, b.upstream);
        assert_eq!(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None
                }
            )
            .await
            .unwrap(),
            Acquired::AtCapacity
        );
        s.release("p", &a.upstream, a.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
        let c = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!(c.upstream, a.upstream);
    }

    const ANY: Want<'static> = Want::Any {
        exclude: &[],
        within: None,
    };

    fn live(st: &PoolStatus) -> Vec<u64> {
        st.members.iter().map(|m| m.leases_live).collect()
    }

    /// Leases held through Redis take capacity like the store's own, show in `leases_live`, and
    /// give it back when their count drops; each `hold_all` replaces the counts whole.
    #[tokio::test]
    async fn held_leases_count_against_the_cap() {
        let (s, m) = store(Strategy::LeastUsed, 2, Some(2)).await;
        s.hold_all("p", || vec![(m[0].clone(), 2), (m[1].clone(), 1)]);
        let g = granted(s.acquire("p", ANY).await.unwrap());
        assert_eq!(g.upstream, m[1], "the only room left");
        assert_eq!(s.acquire("p", ANY).await.unwrap(), Acquired::AtCapacity);
        let session = Want::Session {
            key: "k",
            ttl: Duration::from_secs(60),
            preferred: &m,
            rebind: false,
            within: None,
        };
        assert_eq!(s.acquire("p", session).await.unwrap(), Acquired::AtCapacity);
        assert_eq!(live(&s.status("p").await.unwrap()), [2, 2]);
        s.hold("p", &m[0], || 1);
        let g2 = granted(s.acquire("p", ANY).await.unwrap());
        assert_eq!(g2.upstream, m[0]);
        assert_eq!(s.acquire("p", ANY).await.unwrap(), Acquired::AtCapacity);
        // Whole replacement: members not listed hold none.
        s.hold_all("p", Vec::new);
        assert_eq!(live(&s.status("p").await.unwrap()), [1, 1]);
        granted(s.acquire("p", ANY).await.unwrap());
        granted(s.acquire("p", ANY).await.unwrap());
        assert_eq!(s.acquire("p", ANY).await.unwrap(), Acquired::AtCapacity);
        // Unknown pools and members are ignored; a reload keeps the counts of kept members.
        s.hold_all("nope", Vec::new);
        s.hold("p", &UpstreamId::new("stranger"), || 5);
        s.hold("p", &m[1], || 7);
        s.configure(PoolSpec {
            name: "p".into(),
            members: m.clone(),
            strategy: Strategy::LeastUsed,
            max_concurrency: Some(2),
            lease_ttl: Duration::from_secs(10),
            shards: 1,
        })
        .await
        .unwrap();
        assert_eq!(live(&s.status("p").await.unwrap()), [2, 9]);
    }

    /// Least-connections weighs held leases in its order, and the order follows their changes.
    #[tokio::test]
    async fn least_connections_weighs_held_leases() {
        let (s, m) = store(Strategy::LeastConnections, 3, None).await;
        s.hold_all("p", || vec![(m[0].clone(), 1), (m[1].clone(), 1)]);
        assert_eq!(granted(s.acquire("p", ANY).await.unwrap()).upstream, m[2]);
        s.hold_all("p", || vec![(m[0].clone(), 1)]);
        assert_eq!(granted(s.acquire("p", ANY).await.unwrap()).upstream, m[1]);
        s.hold("p", &m[0], || 0);
        assert_eq!(granted(s.acquire("p", ANY).await.unwrap()).upstream, m[0]);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_of_a_dead_gateway_expire_by_themselves() {
        let (s, _) = store(Strategy::LeastUsed, 1, Some(1)).await;
        let _lost = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None
                }
            )
            .await
            .unwrap(),
            Acquired::AtCapacity
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
    }

    #[tokio::test]
    async fn exclusion_leaves_no_candidates() {
        let (s, m) = store(Strategy::RoundRobin, 2, None).await;
        assert_eq!(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &m,
                    within: None
                }
            )
            .await
            .unwrap(),
            Acquired::NoCandidates
        );
        let g = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &m[..1],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!(g.upstream, m[1]);
    }

    #[tokio::test]
    async fn declaring_the_same_members_again_keeps_the_cursor_and_takes_a_new_cap() {
        let (s, m) = store(Strategy::RoundRobin, 3, None).await;
        let any = || Want::Any {
            exclude: &[],
            within: None,
        };
        let first = granted(s.acquire("p", any()).await.unwrap());
        assert_eq!(first.upstream, m[0]);
        s.release(
            "p",
            &first.upstream,
            first.lease,
            Outcome::Ok,
            Duration::ZERO,
        )
        .await
        .unwrap();
        let spec = |cap| PoolSpec {
            name: "p".into(),
            members: m.clone(),
            strategy: Strategy::RoundRobin,
            max_concurrency: cap,
            lease_ttl: Duration::from_secs(10),
            shards: 1,
        };
        s.configure(spec(Some(1))).await.unwrap();
        let second = granted(s.acquire("p", any()).await.unwrap());
        assert_eq!(second.upstream, m[1], "the cursor went on");
        let third = granted(s.acquire("p", any()).await.unwrap());
        assert_eq!(third.upstream, m[2]);
        let fourth = granted(s.acquire("p", any()).await.unwrap());
        assert_eq!(fourth.upstream, m[0]);
        // The new cap holds: each member has its one lease.
        assert_eq!(s.acquire("p", any()).await.unwrap(), Acquired::AtCapacity);
    }

    #[tokio::test]
    async fn round_robin_and_least_connections_rotate() {
        let (s, m) = store(Strategy::RoundRobin, 3, None).await;
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(
                granted(
                    s.acquire(
                        "p",
                        Want::Any {
                            exclude: &[],
                            within: None,
                        },
                    )
                    .await
                    .unwrap(),
                )
                .upstream,
            );
        }
        assert_eq!(
            seen,
            [
                m[0].clone(),
                m[1].clone(),
                m[2].clone(),
                m[0].clone(),
                m[1].clone(),
                m[2].clone()
            ]
        );

        let (s, _) = store(Strategy::LeastConnections, 3, None).await;
        let a = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        let b = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_ne!(a.upstream, b.upstream);
        s.release("p", &a.upstream, a.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
        let c = granted(
            s.acquire(
                "p",
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_ne!(c.upstream, b.upstream, "b still holds a connection");
    }

    #[tokio::test(start_paused = true)]
    async fn session_binds_once_slides_and_expires() {
        let (s, m) = store(Strategy::LeastUsed, 4, None).await;
        let ttl = Duration::from_secs(60);
        let preferred = vec![m[2].clone(), m[0].clone()];
        let session = Want::Session {
            key: "k",
            ttl,
            preferred: &preferred,
            rebind: false,
            within: None,
        };
        let g = granted(s.acquire("p", session).await.unwrap());
        assert_eq!((g.upstream.clone(), g.bound_now), (m[2].clone(), true));
        // A different preference later does not move a live binding.
        let other = vec![m[1].clone()];
        for _ in 0..3 {
            tokio::time::advance(Duration::from_secs(50)).await;
            let g = granted(
                s.acquire(
                    "p",
                    Want::Session {
                        key: "k",
                        ttl,
                        preferred: &other,
                        rebind: false,
                        within: None,
                    },
                )
                .await
                .unwrap(),
            );
            assert_eq!((g.upstream, g.bound_now), (m[2].clone(), false));
        }
        tokio::time::advance(Duration::from_secs(61)).await;
        let g = granted(
            s.acquire(
                "p",
                Want::Session {
                    key: "k",
                    ttl,
                    preferred: &other,
                    rebind: false,
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!(g.upstream, m[1]);
    }

    #[tokio::test(start_paused = true)]
    async fn session_lookup_does_not_slide_and_record_counts_without_a_lease() {
        let (s, m) = store(Strategy::LeastUsed, 2, Some(1)).await;
        let ttl = Duration::from_secs(60);
        let pref = vec![m[1].clone()];
        let want = Want::Session {
            key: "k",
            ttl,
            preferred: &pref,
            rebind: false,
            within: None,
        };
        granted(s.acquire("p", want).await.unwrap());
        assert_eq!(
            s.session_upstream("p", "k").await.unwrap(),
            Some(m[1].clone())
        );
        assert_eq!(s.session_upstream("p", "nope").await.unwrap(), None);
        tokio::time::advance(Duration::from_secs(59)).await;
        s.session_upstream("p", "k").await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(
            s.session_upstream("p", "k").await.unwrap(),
            None,
            "lookups do not slide"
        );

        s.record("p", &m[0], Outcome::Captcha, Duration::from_millis(10))
            .await
            .unwrap();
        let st = s.status("p").await.unwrap();
        let m0 = st.members.iter().find(|x| x.id == m[0].as_str()).unwrap();
        assert_eq!((m0.outcomes["captcha"], m0.leases_live), (1, 0));
    }

    #[tokio::test]
    async fn removed_upstream_fails_its_sessions_unless_rebind() {
        let (s, m) = store(Strategy::LeastUsed, 3, None).await;
        let ttl = Duration::from_secs(60);
        let pref = vec![m[0].clone(), m[1].clone()];
        granted(
            s.acquire(
                "p",
                Want::Session {
                    key: "k",
                    ttl,
                    preferred: &pref,
                    rebind: false,
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        s.configure(PoolSpec {
            name: "p".into(),
            members: m[1..].to_vec(),
            strategy: Strategy::LeastUsed,
            max_concurrency: None,
            lease_ttl: Duration::from_secs(10),
            shards: 1,
        })
        .await
        .unwrap();
        assert_eq!(
            s.acquire(
                "p",
                Want::Session {
                    key: "k",
                    ttl,
                    preferred: &pref,
                    rebind: false,
                    within: None,
                }
            )
            .await
            .unwrap(),
            Acquired::SessionUnavailable(m[0].clone())
        );
        let g = granted(
            s.acquire(
                "p",
                Want::Session {
                    key: "k",
                    ttl,
                    preferred: &pref,
                    rebind: true,
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!((g.upstream, g.bound_now), (m[1].clone(), true));
    }

    /// A session acquire that must be granted, its lease released at once.
    async fn sticky(s: &MemoryStore, key: &str, ttl: Duration, preferred: &[UpstreamId]) {
        let want = Want::Session {
            key,
            ttl,
            preferred,
            rebind: false,
            within: None,
        };
        let g = granted(s.acquire("p", want).await.unwrap());
        s.release("p", &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_live_follows_unbind_and_lasts_to_the_end_of_the_expiry_second() {
        let (s, m) = store(Strategy::LeastUsed, 2, None).await;
        let live = async || s.status("p").await.unwrap().sessions_live;
        sticky(&s, "short", Duration::from_millis(1_500), &m[..1]).await;
        sticky(&s, "long", Duration::from_secs(60), &m[1..]).await;
        assert_eq!(live().await, 2);
        // An unbind naming another upstream leaves the binding; naming its own takes it out.
        s.unbind("p", "long", &m[0]).await.unwrap();
        assert_eq!(live().await, 2);
        s.unbind("p", "long", &m[1]).await.unwrap();
        assert_eq!(live().await, 1);
        // Expired at 1.5 s, counted until the end of second 2.
        tokio::time::advance(Duration::from_millis(1_500)).await;
        assert_eq!(s.session_upstream("p", "short").await.unwrap(), None);
        assert_eq!(live().await, 1);
        tokio::time::advance(Duration::from_millis(499)).await;
        assert_eq!(live().await, 1);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(live().await, 0);
    }
}
