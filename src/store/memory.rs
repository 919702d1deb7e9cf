//! The embedded store: pool state in this process, one mutex per pool.
//!
//! Each operation takes its pool's lock once, does its whole read-decide-write step and lets go;
//! nothing awaits while holding it. Time comes from `tokio::time::Instant`, so tests drive lease
//! and session expiry with a paused clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, broadcast};
use tokio::time::Instant;

use super::{
    Acquired, Grant, HEALTH_OK, LeaseId, LockToken, MemberChange, MemberState, PoolSpec,
    PoolStatus, Store, StoreError, Want,
};
use crate::config::Strategy;
use crate::fast_map::FastMap;
use crate::health::Outcome;
use crate::upstream::UpstreamId;

/// How often expired session bindings are swept out, at most.
const SESSION_SWEEP_INTERVAL: Duration = Duration::from_secs(5);

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
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            pools: RwLock::default(),
            locks: Mutex::default(),
            changes: broadcast::channel(1).0,
            listed: Mutex::default(),
            listed_changes: broadcast::channel(1).0,
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

struct PoolState {
    spec: PoolSpec,
    members: FastMap<UpstreamId, Member>,
    /// Members in service ordered by allocation count: the least-used pick is the first
    /// eligible entry.
    by_allocs: BTreeSet<(u64, UpstreamId)>,
    /// Members in service by [`Member::load_key`], kept only for `least-connections`: its pick
    /// is the first entry not at its cap, found without scanning the pool.
    by_load: BTreeSet<(u64, u64, u32)>,
    /// Every live lease by deadline, so that expiry is exact (a member's live leases are the
    /// ones it holds) and the earliest deadline is found without scanning the pool.
    deadlines: BTreeMap<(Instant, u64), UpstreamId>,
    rr_next: usize,
    sessions: HashMap<String, Binding>,
    next_lease: u64,
    last_sweep: Instant,
}

struct Member {
    /// Cumulative allocation cost (not in-flight work).
    allocs: u64,
    state: MemberState,
    /// Round-robin turns passed over, for members of cost > 1.
    rr_credit: u32,
    /// Live leases and their deadlines (each also in [`PoolState::deadlines`]).
    leases: FastMap<u64, Instant>,
    /// Still a member; a removed one lingers only until its last lease ends.
    in_pool: bool,
    /// Position in the configured member list: the last tie-break of `least-connections`.
    pos: u32,
    outcomes: [u64; Outcome::ALL.len()],
    latency_total: Duration,
    latency_count: u64,
}

impl Default for Member {
    fn default() -> Self {
        Member {
            allocs: 0,
            state: MemberState::IN_SERVICE,
            rr_credit: 0,
            leases: FastMap::default(),
            in_pool: false,
            pos: 0,
            outcomes: [0; Outcome::ALL.len()],
            latency_total: Duration::ZERO,
            latency_count: 0,
        }
    }
}

struct Binding {
    upstream: UpstreamId,
    expires: Instant,
}

impl Member {
    /// New work may go to it.
    fn listed(&self) -> bool {
        self.in_pool && self.state.eligible
    }

    /// `least-connections` order: fewest live leases × cost, then fewest allocations, then
    /// configured order.
    fn load_key(&self) -> (u64, u64, u32) {
        (
            self.leases.len() as u64 * u64::from(self.state.cost.max(1)),
            self.allocs,
            self.pos,
        )
    }
}

impl PoolState {
    fn tracks_load(&self) -> bool {
        self.spec.strategy == Strategy::LeastConnections
    }

    /// Changes member `id` with `change`, keeping the ordered indexes in step with it.
    fn update<T>(&mut self, id: &UpstreamId, change: impl FnOnce(&mut Member) -> T) -> Option<T> {
        let tracks_load = self.tracks_load();
        let m = self.members.get_mut(id)?;
        let before = (m.listed(), m.allocs, m.load_key());
        let out = change(m);
        let after = (m.listed(), m.allocs, m.load_key());
        if before.0 != after.0 || before.1 != after.1 {
            if before.0 {
                self.by_allocs.remove(&(before.1, id.clone()));
            }
            if after.0 {
                self.by_allocs.insert((after.1, id.clone()));
            }
        }
        if tracks_load && before != after {
            if before.0 {
                self.by_load.remove(&before.2);
            }
            if after.0 {
                self.by_load.insert(after.2);
            }
        }
        Some(out)
    }

    /// Ends the leases whose deadline has passed: capacity held by a lease nobody released
    /// (its gateway task died) comes back by itself.
    fn expire(&mut self, now: Instant) {
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((_, lease), id) = entry.remove_entry();
            let gone = self.update(&id, |m| {
                m.leases.remove(&lease);
                !m.in_pool && m.leases.is_empty()
            });
            if gone == Some(true) {
                self.members.remove(&id);
            }
        }
    }

    /// Counts one exchange's outcome and latency in `upstream`'s statistics.
    fn count(&mut self, upstream: &UpstreamId, outcome: Outcome, latency: Duration) {
        if let Some(m) = self.members.get_mut(upstream) {
            m.outcomes[outcome.index()] += 1;
            m.latency_total += latency;
            m.latency_count += 1;
        }
    }

    /// Ends one lease; true when its member was removed from the pool and this was its last.
    fn end_lease(&mut self, id: &UpstreamId, lease: u64) -> bool {
        let ended = self.update(id, |m| m.leases.remove(&lease));
        if let Some(Some(deadline)) = ended {
            self.deadlines.remove(&(deadline, lease));
        }
        self.members
            .get(id)
            .is_some_and(|m| !m.in_pool && m.leases.is_empty())
    }

    fn at_cap(&self, id: &UpstreamId) -> bool {
        let cap = self.spec.max_concurrency;
        match self.members.get(id) {
            Some(m) => cap.is_some_and(|cap| m.leases.len() >= cap as usize),
            None => true,
        }
    }

    /// A member new work may go to.
    fn eligible(&self, id: &UpstreamId) -> bool {
        self.members.get(id).is_some_and(Member::listed)
    }

    /// A member its existing sessions may keep using.
    fn keeps_sessions(&self, id: &UpstreamId) -> bool {
        self.members
            .get(id)
            .is_some_and(|m| m.in_pool && m.state.keeps_sessions)
    }

    /// Leases `id`, counting the allocation.
    fn grant(&mut self, id: &UpstreamId, now: Instant, bound_now: bool) -> Acquired {
        let lease = self.next_lease;
        self.next_lease += 1;
        let deadline = now + self.spec.lease_ttl;
        let held = self.update(id, |m| {
            m.allocs += u64::from(m.state.cost.max(1));
            m.leases.insert(lease, deadline);
        });
        if held.is_some() {
            self.deadlines.insert((deadline, lease), id.clone());
        }
        Acquired::Granted(Grant {
            upstream: id.clone(),
            lease: LeaseId(lease),
            bound_now,
        })
    }

    /// Expired leases must have been ended first ([`PoolState::expire`]).
    fn acquire_any(&mut self, exclude: &[UpstreamId], now: Instant) -> Acquired {
        let mut saw_candidate = false;
        let cap = self.spec.max_concurrency;
        let under_cap = |m: &Member| cap.is_none_or(|c| m.leases.len() < c as usize);
        let pick = match self.spec.strategy {
            // The first entries of the ordered indexes: O(log n), plus one step per member
            // passed over (excluded, or at its cap).
            Strategy::LeastUsed | Strategy::Weighted => {
                let mut pick = None;
                for (_, id) in &self.by_allocs {
                    if exclude.contains(id) {
                        continue;
                    }
                    let Some(m) = self.members.get(id) else {
                        continue;
                    };
                    saw_candidate = true;
                    if under_cap(m) {
                        pick = Some(id.clone());
                        break;
                    }
                }
                pick
            }
            Strategy::LeastConnections => {
                let mut pick = None;
                for &(_, _, pos) in &self.by_load {
                    let Some(id) = self.spec.members.get(pos as usize) else {
                        continue;
                    };
                    if exclude.contains(id) {
                        continue;
                    }
                    let Some(m) = self.members.get(id) else {
                        continue;
                    };
                    saw_candidate = true;
                    if under_cap(m) {
                        pick = Some(id.clone());
                        break;
                    }
                }
                pick
            }
            Strategy::RoundRobin => {
                let n = self.spec.members.len();
                let mut pick = None;
                for step in 0..n {
                    let idx = (self.rr_next + step) % n;
                    let id = &self.spec.members[idx];
                    if exclude.contains(id) || !self.eligible(id) {
                        continue;
                    }
                    saw_candidate = true;
                    if self.at_cap(id) {
                        continue;
                    }
                    // A member of cost c takes one turn in c.
                    if let Some(m) = self.members.get_mut(id) {
                        if m.rr_credit + 1 < m.state.cost {
                            m.rr_credit += 1;
                            continue;
                        }
                        m.rr_credit = 0;
                    }
                    self.rr_next = (idx + 1) % n;
                    pick = Some(id.clone());
                    break;
                }
                pick
            }
        };
        match pick {
            Some(id) => self.grant(&id, now, false),
            None if saw_candidate => Acquired::AtCapacity,
            None => Acquired::NoCandidates,
        }
    }

    fn acquire_session(
        &mut self,
        key: &str,
        ttl: Duration,
        preferred: &[UpstreamId],
        rebind: bool,
        now: Instant,
    ) -> Acquired {
        self.sweep_sessions(now);
        let bound = self
            .sessions
            .get(key)
            .filter(|b| b.expires > now)
            .map(|b| b.upstream.clone());
        if let Some(up) = bound {
            if self.keeps_sessions(&up) {
                if self.at_cap(&up) {
                    return Acquired::AtCapacity;
                }
                if let Some(b) = self.sessions.get_mut(key) {
                    b.expires = now + ttl;
                }
                return self.grant(&up, now, false);
            }
            if !rebind {
                return Acquired::SessionUnavailable(up);
            }
            self.sessions.remove(key);
        }
        // A new binding goes to the first member in service that has room: one at its cap is no
        // candidate (the session would wait for it while others are free).
        let mut any_eligible = false;
        let Some(first) = preferred
            .iter()
            .filter(|id| self.eligible(id))
            .find(|id| {
                any_eligible = true;
                !self.at_cap(id)
            })
            .cloned()
        else {
            return if any_eligible {
                Acquired::AtCapacity
            } else {
                Acquired::NoCandidates
            };
        };
        self.sessions.insert(
            key.to_string(),
            Binding {
                upstream: first.clone(),
                expires: now + ttl,
            },
        );
        self.grant(&first, now, true)
    }

    fn set_member(&mut self, id: &UpstreamId, state: MemberState) {
        let floor = self.by_allocs.first().map_or(0, |(a, _)| *a);
        self.update(id, |m| {
            let was_listed = m.listed();
            m.state = state;
            m.rr_credit = 0;
            if !was_listed && m.listed() {
                // A returning member is not flooded: it starts at the current minimum.
                m.allocs = m.allocs.max(floor);
            }
        });
    }

    fn sweep_sessions(&mut self, now: Instant) {
        if now.duration_since(self.last_sweep) >= SESSION_SWEEP_INTERVAL {
            self.sessions.retain(|_, b| b.expires > now);
            self.last_sweep = now;
        }
    }

    fn reconfigure(&mut self, spec: PoolSpec) {
        // A joining member starts at the current minimum so it is not flooded by least-used.
        let floor = self.by_allocs.first().map_or(0, |(a, _)| *a);
        for m in self.members.values_mut() {
            m.in_pool = false;
        }
        for (pos, id) in spec.members.iter().enumerate() {
            let m = self.members.entry(id.clone()).or_insert_with(|| Member {
                allocs: floor,
                ..Member::default()
            });
            if !m.in_pool {
                m.in_pool = true;
                m.pos = pos as u32;
            }
        }
        self.members
            .retain(|_, m| m.in_pool || !m.leases.is_empty());
        self.rr_next = 0;
        self.spec = spec;
        self.by_allocs = self
            .members
            .iter()
            .filter(|(_, m)| m.listed())
            .map(|(id, m)| (m.allocs, id.clone()))
            .collect();
        self.by_load = if self.tracks_load() {
            self.members
                .values()
                .filter(|m| m.listed())
                .map(Member::load_key)
                .collect()
        } else {
            BTreeSet::new()
        };
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
            state.count(upstream, outcome, latency);
            if state.end_lease(upstream, lease.0) {
                state.members.remove(upstream);
            }
            state.spec.max_concurrency.is_some()
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
        let state = lock(&entry);
        state
            .members
            .get(upstream)
            .filter(|m| m.in_pool)
            .map(|m| m.state)
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
        let mut state = PoolState {
            spec: PoolSpec {
                members: Vec::new(),
                ..spec.clone()
            },
            members: FastMap::default(),
            by_allocs: BTreeSet::new(),
            by_load: BTreeSet::new(),
            deadlines: BTreeMap::new(),
            rr_next: 0,
            sessions: HashMap::new(),
            next_lease: 1,
            last_sweep: Instant::now(),
        };
        state.reconfigure(spec.clone());
        pools.insert(
            spec.name,
            Arc::new(PoolEntry {
                state: Mutex::new(state),
                released: Arc::new(Notify::new()),
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
            state.expire(now);
            let acquired = match want {
                Want::Any { exclude } => state.acquire_any(exclude, now),
                Want::Session {
                    key,
                    ttl,
                    preferred,
                    rebind,
                } => state.acquire_session(key, ttl, preferred, rebind, now),
            };
            let earliest = (acquired == Acquired::AtCapacity)
                .then(|| state.deadlines.first_key_value().map(|((at, _), _)| *at))
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
        let state = lock(&entry);
        Ok(state
            .sessions
            .get(key)
            .filter(|b| b.expires > now)
            .map(|b| b.upstream.clone()))
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        let mut state = lock(&entry);
        let deadline = Instant::now() + state.spec.lease_ttl;
        let old = state
            .members
            .get_mut(upstream)
            .and_then(|m| m.leases.get_mut(&lease.0))
            .map(|d| std::mem::replace(d, deadline));
        if let Some(old) = old {
            if let Some(id) = state.deadlines.remove(&(old, lease.0)) {
                state.deadlines.insert((deadline, lease.0), id);
            }
        }
        Ok(())
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
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
        let removed = lock(&entry).sessions.remove(key);
        Ok(removed.is_some_and(|b| b.expires > now))
    }

    async fn unbind(&self, pool: &str, key: &str, upstream: &UpstreamId) -> Result<(), StoreError> {
        let entry = self.entry(pool)?;
        let mut state = lock(&entry);
        if state
            .sessions
            .get(key)
            .is_some_and(|b| &b.upstream == upstream)
        {
            state.sessions.remove(key);
        }
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
        let mut state = lock(&entry);
        state.expire(now);
        let sessions_live = state.sessions.values().filter(|b| b.expires > now).count() as u64;
        let members = state
            .spec
            .members
            .iter()
            .filter_map(|id| {
                let m = state.members.get(id)?;
                let live = m.leases.len() as u64;
                Some(super::member_status(
                    id,
                    live,
                    m.allocs,
                    &m.outcomes,
                    m.latency_total,
                    m.latency_count,
                ))
            })
            .collect();
        Ok(PoolStatus {
            sessions_live,
            members,
        })
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
            let g = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
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
        let a = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
        let b = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
        assert_ne!(a.upstream, b.upstream);
        assert_eq!(
            s.acquire("p", Want::Any { exclude: &[] }).await.unwrap(),
            Acquired::AtCapacity
        );
        s.release("p", &a.upstream, a.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
        let c = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
        assert_eq!(c.upstream, a.upstream);
    }

    #[tokio::test(start_paused = true)]
    async fn leases_of_a_dead_gateway_expire_by_themselves() {
        let (s, _) = store(Strategy::LeastUsed, 1, Some(1)).await;
        let _lost = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
        assert_eq!(
            s.acquire("p", Want::Any { exclude: &[] }).await.unwrap(),
            Acquired::AtCapacity
        );
        tokio::time::advance(Duration::from_secs(11)).await;
        granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
    }

    #[tokio::test]
    async fn exclusion_leaves_no_candidates() {
        let (s, m) = store(Strategy::RoundRobin, 2, None).await;
        assert_eq!(
            s.acquire("p", Want::Any { exclude: &m }).await.unwrap(),
            Acquired::NoCandidates
        );
        let g = granted(
            s.acquire("p", Want::Any { exclude: &m[..1] })
                .await
                .unwrap(),
        );
        assert_eq!(g.upstream, m[1]);
    }

    #[tokio::test]
    async fn round_robin_and_least_connections_rotate() {
        let (s, m) = store(Strategy::RoundRobin, 3, None).await;
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap()).upstream);
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
        let a = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
        let b = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
        assert_ne!(a.upstream, b.upstream);
        s.release("p", &a.upstream, a.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
        let c = granted(s.acquire("p", Want::Any { exclude: &[] }).await.unwrap());
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
                    rebind: false
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
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!((g.upstream, g.bound_now), (m[1].clone(), true));
    }
}
