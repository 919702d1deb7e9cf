//! One pool's state in the embedded store: members, allocation order, leases, sessions, caps.
//!
//! Plain data behind its pool's mutex (see `mod.rs`): every method is one whole
//! read-decide-write step, given the time by its caller, and never waits.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Strategy;
use crate::fast_map::FastMap;
use crate::outcome::Outcome;
use crate::store::{
    Acquired, Grant, LeaseId, MemberState, PoolSpec, PoolStatus, Subset, Want, member_status,
};

use super::sessions::Sessions;
use super::subset::{MAX_SUBSETS, SubsetIndex};
use crate::upstream::UpstreamId;

/// Members in service by allocation count, then id.
type ByAllocs = BTreeSet<(u64, UpstreamId)>;
/// Members in service by [`Member::load_key`].
type ByLoad = BTreeSet<(u64, u64, u32)>;

/// One pool's state, behind its pool's mutex.
pub(super) struct PoolState {
    spec: PoolSpec,
    members: FastMap<UpstreamId, Member>,
    /// Members in service ordered by allocation count: the least-used pick is the first
    /// eligible entry.
    by_allocs: ByAllocs,
    /// Members in service by [`Member::load_key`], kept only for `least-connections`: its pick
    /// is the first entry not at its cap, found without scanning the pool.
    by_load: ByLoad,
    /// Every live lease by deadline, so that expiry is exact (a member's live leases are the
    /// ones it holds) and the earliest deadline is found without scanning the pool.
    deadlines: BTreeMap<(Instant, u64), UpstreamId>,
    rr_next: usize,
    /// Declarations so far: each marks the members it lists, so the others are found leaving
    /// without a set of the new list.
    declarations: u32,
    sessions: Sessions,
    /// The label filters requests asked for, by subset id.
    subsets: HashMap<Arc<str>, SubsetIndex>,
    /// In a least-connections pool, the subsets each member is in: whose load indexes move
    /// with it.
    load_subsets: FastMap<UpstreamId, Vec<Arc<str>>>,
    next_lease: u64,
}

struct Member {
    /// Cumulative allocation cost (not in-flight work).
    allocs: u64,
    state: MemberState,
    /// Round-robin turns passed over, for members of cost > 1.
    rr_credit: u32,
    /// Live leases and their deadlines (each also in [`PoolState::deadlines`]).
    leases: FastMap<u64, Instant>,
    /// Leases the Redis store holds on it through Redis, for which this store is the local view
    /// (see [`PoolState::hold`]): they take capacity and count in the load like live leases.
    held: u64,
    /// Still a member; a removed one lingers only until its last lease ends.
    in_pool: bool,
    /// Position in the configured member list: the last tie-break of `least-connections`.
    pos: u32,
    /// The last declaration that listed it ([`PoolState::declarations`]).
    declared: u32,
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
            held: 0,
            in_pool: false,
            pos: 0,
            declared: 0,
            outcomes: [0; Outcome::ALL.len()],
            latency_total: Duration::ZERO,
            latency_count: 0,
        }
    }
}

impl Member {
    /// New work may go to it.
    fn listed(&self) -> bool {
        self.in_pool && self.state.eligible
    }

    /// Leases running on it: its own and those held through Redis.
    fn busy(&self) -> u64 {
        self.leases.len() as u64 + self.held
    }

    /// Below `cap` (no cap: always).
    fn has_room(&self, cap: Option<u32>) -> bool {
        cap.is_none_or(|c| self.busy() < u64::from(c))
    }

    /// `least-connections` order: fewest running leases × cost, then fewest allocations, then
    /// configured order.
    fn load_key(&self) -> (u64, u64, u32) {
        (
            self.busy() * u64::from(self.state.cost.max(1)),
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
            let moved = |index: &mut ByLoad| {
                if before.0 {
                    index.remove(&before.2);
                }
                if after.0 {
                    index.insert(after.2);
                }
            };
            moved(&mut self.by_load);
            for sid in self.load_subsets.get(id).into_iter().flatten() {
                if let Some(s) = self.subsets.get_mut(sid) {
                    moved(&mut s.by_load);
                }
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
    pub(super) fn count(&mut self, upstream: &UpstreamId, outcome: Outcome, latency: Duration) {
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
        self.members
            .get(id)
            .is_none_or(|m| !m.has_room(self.spec.max_concurrency))
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
        let under_cap = |m: &Member| m.has_room(cap);
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
                let (pick, saw) = self.least_loaded(&self.by_load, exclude);
                saw_candidate = saw;
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

    /// The first member of a load index (in service by construction) that is not excluded and
    /// has room, and whether any member was a candidate: O(log n), plus one step per member
    /// passed over.
    fn least_loaded(&self, by_load: &ByLoad, exclude: &[UpstreamId]) -> (Option<UpstreamId>, bool) {
        let cap = self.spec.max_concurrency;
        let mut saw_candidate = false;
        for &(_, _, pos) in by_load {
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
            if m.has_room(cap) {
                return (Some(id.clone()), true);
            }
        }
        (None, saw_candidate)
    }

    fn acquire_session(
        &mut self,
        key: &str,
        ttl: Duration,
        preferred: &[UpstreamId],
        rebind: bool,
        within: Option<&str>,
        now: Instant,
    ) -> Acquired {
        self.sessions.sweep(now);
        let key = self.sessions.key(key);
        let bound = self.sessions.live(key, now).cloned();
        if let Some(up) = bound {
            // A member whose labels no longer match left the filter: as if it left the pool.
            let matches = within
                .and_then(|id| self.subsets.get(id))
                .is_none_or(|s| s.contains(&up));
            if matches && self.keeps_sessions(&up) {
                if self.at_cap(&up) {
                    return Acquired::AtCapacity;
                }
                self.sessions.refresh(key, now + ttl);
                return self.grant(&up, now, false);
            }
            if !rebind {
                return Acquired::SessionUnavailable(up);
            }
            self.sessions.remove(key, now);
        }
        // A new binding goes to the first member in service that has room: one at its cap is no
        // candidate (the session would wait for it while others are free).
        let mut capped = false;
        for id in preferred.iter().filter(|id| self.eligible(id)) {
            if self.at_cap(id) {
                capped = true;
                continue;
            }
            self.sessions.bind(key, id, now + ttl);
            return self.grant(id, now, true);
        }
        if capped {
            Acquired::AtCapacity
        } else {
            Acquired::NoCandidates
        }
    }

    pub(super) fn set_member(&mut self, id: &UpstreamId, state: MemberState) {
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

    pub(super) fn reconfigure(&mut self, spec: PoolSpec) {
        if spec.members == self.spec.members && spec.strategy == self.spec.strategy {
            // The same members in the same order (a reload that left the pool alone, or the
            // Redis store declaring it again): the indexes stand, and the round-robin cursor
            // goes on, as Redis keeps it. Rebuilding them held the pool's lock for 30-50 ms at
            // 100,000 members.
            self.spec = spec;
            return;
        }
        // A joining member starts at the current minimum so it is not flooded by least-used.
        let floor = self.by_allocs.first().map_or(0, |(a, _)| *a);
        if spec.strategy == self.spec.strategy && !self.members.is_empty() {
            self.edit(&spec, floor);
        } else {
            self.rebuild(&spec, floor);
        }
        self.rr_next = 0;
        // Subsets are named after their members: after a membership change requests name new ones.
        self.subsets.clear();
        self.load_subsets.clear();
        self.spec = spec;
    }

    /// A new pool, or another strategy: the members marked from the list, then the indexes made
    /// afresh in bulk.
    fn rebuild(&mut self, spec: &PoolSpec, floor: u64) {
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
        self.spec.strategy = spec.strategy;
        (self.by_allocs, self.by_load) = self.indexes_from_members();
    }

    /// `by_allocs` and `by_load` made afresh from the members.
    fn indexes_from_members(&self) -> (ByAllocs, ByLoad) {
        let by_allocs = self
            .members
            .iter()
            .filter(|(_, m)| m.listed())
            .map(|(id, m)| (m.allocs, id.clone()))
            .collect();
        let by_load = if self.tracks_load() {
            self.members
                .values()
                .filter(|m| m.listed())
                .map(Member::load_key)
                .collect()
        } else {
            BTreeSet::new()
        };
        (by_allocs, by_load)
    }

    /// The same strategy, the list edited: members that stay where they were change nothing.
    /// The others leave the indexes first and come back once all have moved (a load-order key
    /// holds the position, and a member moving to a place another has not left yet would share
    /// its key for a while). A one-line edit of a list of 100,000 costs a walk of it, 10-15 ms,
    /// where rebuilding the indexes took 30-50 ms under the pool's lock.
    fn edit(&mut self, spec: &PoolSpec, floor: u64) {
        self.declarations = self.declarations.wrapping_add(1);
        let this = self.declarations;
        let tracks_load = self.tracks_load();
        let mut placed: Vec<UpstreamId> = Vec::new();
        for (pos, id) in spec.members.iter().enumerate() {
            let pos = pos as u32;
            match self.members.get_mut(id) {
                // Listed twice: the first place counts.
                Some(m) if m.declared == this => {}
                Some(m) if m.in_pool && m.pos == pos => m.declared = this,
                Some(m) => {
                    if m.listed() {
                        self.by_allocs.remove(&(m.allocs, id.clone()));
                        if tracks_load {
                            self.by_load.remove(&m.load_key());
                        }
                    }
                    m.in_pool = true;
                    m.pos = pos;
                    m.declared = this;
                    placed.push(id.clone());
                }
                None => {
                    let m = Member {
                        allocs: floor,
                        in_pool: true,
                        pos,
                        declared: this,
                        ..Member::default()
                    };
                    self.members.insert(id.clone(), m);
                    placed.push(id.clone());
                }
            }
        }
        let leaving: Vec<UpstreamId> = self
            .members
            .iter()
            .filter(|(_, m)| m.in_pool && m.declared != this)
            .map(|(id, _)| id.clone())
            .collect();
        for id in leaving {
            // A member that left lingers only until its last lease ends.
            if self.update(&id, |m| {
                m.in_pool = false;
                m.leases.is_empty()
            }) == Some(true)
            {
                self.members.remove(&id);
            }
        }
        for id in placed {
            if let Some(m) = self.members.get(&id).filter(|m| m.listed()) {
                self.by_allocs.insert((m.allocs, id.clone()));
                if tracks_load {
                    self.by_load.insert(m.load_key());
                }
            }
        }
    }

    /// An empty pool, then declared with `spec`.
    pub(super) fn new(spec: PoolSpec, now: Instant) -> PoolState {
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
            declarations: 0,
            sessions: Sessions::new(now),
            subsets: HashMap::new(),
            load_subsets: FastMap::default(),
            next_lease: 1,
        };
        state.reconfigure(spec);
        state
    }

    /// Ends the expired leases, then decides one acquire.
    pub(super) fn acquire(&mut self, want: Want<'_>, now: Instant) -> Acquired {
        self.expire(now);
        match want {
            Want::Any {
                exclude,
                within: None,
            } => self.acquire_any(exclude, now),
            Want::Any {
                exclude,
                within: Some(subset),
            } => self.acquire_within(exclude, &subset, now),
            Want::Session {
                key,
                ttl,
                preferred,
                rebind,
                within,
            } => {
                if let Some(subset) = &within {
                    self.subset(subset, now);
                }
                let id = within.map(|s| s.id);
                self.acquire_session(key, ttl, preferred, rebind, id, now)
            }
        }
    }

    /// Makes the index of `subset` from its members on first use, and marks it used.
    fn subset(&mut self, subset: &Subset<'_>, now: Instant) {
        if let Some(index) = self.subsets.get_mut(subset.id) {
            index.last_used = now;
            return;
        }
        if self.subsets.len() >= MAX_SUBSETS {
            let oldest = self
                .subsets
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                self.drop_subset(&id);
            }
        }
        let sid: Arc<str> = subset.id.into();
        let mut index = SubsetIndex::new(subset, now);
        if self.tracks_load() {
            for id in &index.members {
                let Some(m) = self.members.get(id) else {
                    continue;
                };
                if m.listed() {
                    index.by_load.insert(m.load_key());
                }
                self.load_subsets
                    .entry(id.clone())
                    .or_default()
                    .push(sid.clone());
            }
        }
        self.subsets.insert(sid, index);
    }

    /// Forgets a subset, and its members' note that their load moves its index.
    fn drop_subset(&mut self, sid: &Arc<str>) {
        let Some(index) = self.subsets.remove(sid) else {
            return;
        };
        for id in &index.members {
            if let Some(sids) = self.load_subsets.get_mut(id) {
                sids.retain(|s| s != sid);
                if sids.is_empty() {
                    self.load_subsets.remove(id);
                }
            }
        }
    }

    /// An acquire by the pool's strategy among the members of `subset` only, with the pool's
    /// caps. Least-used counts the allocations made through the subset.
    fn acquire_within(
        &mut self,
        exclude: &[UpstreamId],
        subset: &Subset<'_>,
        now: Instant,
    ) -> Acquired {
        self.subset(subset, now);
        let Some(index) = self.subsets.get(subset.id) else {
            return Acquired::NoCandidates;
        };
        let candidate = |id: &UpstreamId| !exclude.contains(id) && self.eligible(id);
        let mut saw_candidate = false;
        let pick = match self.spec.strategy {
            Strategy::LeastUsed | Strategy::Weighted => index
                .by_allocs
                .iter()
                .map(|(_, id)| id)
                .filter(|id| candidate(id))
                .find(|id| {
                    saw_candidate = true;
                    !self.at_cap(id)
                })
                .cloned(),
            Strategy::LeastConnections => {
                let (pick, saw) = self.least_loaded(&index.by_load, exclude);
                saw_candidate = saw;
                pick
            }
            Strategy::RoundRobin => {
                let n = index.members.len();
                let start = index.rr_next;
                let mut pick = None;
                for step in 0..n {
                    let idx = (start + step) % n;
                    let id = &index.members[idx];
                    if !candidate(id) {
                        continue;
                    }
                    saw_candidate = true;
                    if self.at_cap(id) {
                        continue;
                    }
                    pick = Some((idx, id.clone()));
                    break;
                }
                pick.map(|(idx, id)| {
                    if let Some(index) = self.subsets.get_mut(subset.id) {
                        index.rr_next = (idx + 1) % n;
                    }
                    id
                })
            }
        };
        match pick {
            Some(id) => {
                let cost = self
                    .members
                    .get(&id)
                    .map_or(1, |m| u64::from(m.state.cost.max(1)));
                if let Some(index) = self.subsets.get_mut(subset.id) {
                    index.count(&id, cost);
                }
                self.grant(&id, now, false)
            }
            None if saw_candidate => Acquired::AtCapacity,
            None => Acquired::NoCandidates,
        }
    }

    /// This store's own live leases: (lease, member, deadline).
    pub(super) fn own_leases(&self) -> Vec<(LeaseId, UpstreamId, Instant)> {
        self.members
            .iter()
            .flat_map(|(id, m)| {
                m.leases
                    .iter()
                    .map(move |(l, d)| (LeaseId(*l), id.clone(), *d))
            })
            .collect()
    }

    /// Sets the leases held through Redis on every member: `held` lists the members that have
    /// any (a member listed twice holds the sum); the others hold none.
    pub(super) fn hold_all(&mut self, held: &[(UpstreamId, u64)]) {
        let mut wanted: FastMap<&UpstreamId, u64> = FastMap::default();
        for (id, n) in held {
            *wanted.entry(id).or_default() += n;
        }
        let changed: Vec<(UpstreamId, u64)> = self
            .members
            .iter()
            .filter_map(|(id, m)| {
                let n = wanted.get(id).copied().unwrap_or(0);
                (m.held != n).then(|| (id.clone(), n))
            })
            .collect();
        for (id, n) in changed {
            self.hold(&id, n);
        }
    }

    /// Sets the leases held through Redis on `id` (a member of this store only: ignored).
    pub(super) fn hold(&mut self, id: &UpstreamId, n: u64) {
        self.update(id, |m| m.held = n);
    }

    /// When the earliest live lease expires: capacity comes back then even if nobody releases.
    pub(super) fn earliest_deadline(&self) -> Option<Instant> {
        self.deadlines.first_key_value().map(|((at, _), _)| *at)
    }

    /// Whether members have a cap, so that requests may be waiting for a release.
    pub(super) fn capped(&self) -> bool {
        self.spec.max_concurrency.is_some()
    }

    /// Counts the exchange and ends its lease; a removed member goes with its last lease.
    pub(super) fn release(
        &mut self,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) {
        self.count(upstream, outcome, latency);
        if self.end_lease(upstream, lease.0) {
            self.members.remove(upstream);
        }
    }

    /// Moves a live lease's deadline to a full `lease_ttl` from `now`.
    pub(super) fn extend(&mut self, upstream: &UpstreamId, lease: LeaseId, now: Instant) {
        let deadline = now + self.spec.lease_ttl;
        let old = self
            .members
            .get_mut(upstream)
            .and_then(|m| m.leases.get_mut(&lease.0))
            .map(|d| std::mem::replace(d, deadline));
        if let Some(old) = old {
            if let Some(id) = self.deadlines.remove(&(old, lease.0)) {
                self.deadlines.insert((deadline, lease.0), id);
            }
        }
    }

    /// The setting of `upstream`, if it is a member.
    pub(super) fn member_state(&self, upstream: &UpstreamId) -> Option<MemberState> {
        self.members
            .get(upstream)
            .filter(|m| m.in_pool)
            .map(|m| m.state)
    }

    /// The upstream a live session is bound to, without sliding its expiry.
    pub(super) fn session_upstream(&self, key: &str, now: Instant) -> Option<UpstreamId> {
        self.sessions.live(self.sessions.key(key), now).cloned()
    }

    /// Drops the session's binding; true when it was still live.
    pub(super) fn end_session(&mut self, key: &str, now: Instant) -> bool {
        self.sessions.remove(self.sessions.key(key), now)
    }

    /// Drops the session's binding only if it still names `upstream`.
    pub(super) fn unbind(&mut self, key: &str, upstream: &UpstreamId, now: Instant) {
        let key = self.sessions.key(key);
        if self.sessions.bound(key) == Some(upstream) {
            self.sessions.remove(key, now);
        }
    }

    /// `/status` figures, in the configured member order, after ending the expired leases.
    pub(super) fn status(&mut self, now: Instant) -> PoolStatus {
        self.expire(now);
        let sessions_live = self.sessions.count_live(now) as u64;
        let members = self
            .spec
            .members
            .iter()
            .filter_map(|id| {
                let m = self.members.get(id)?;
                Some(member_status(
                    id,
                    m.busy(),
                    m.allocs,
                    &m.outcomes,
                    m.latency_total,
                    m.latency_count,
                ))
            })
            .collect();
        PoolStatus {
            sessions_live,
            members,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// The indexes as a rebuild from the members makes them, and the members as the list says.
    fn assert_consistent(st: &PoolState, step: usize) {
        let (by_allocs, by_load) = st.indexes_from_members();
        assert!(st.by_allocs == by_allocs, "step {step}: by_allocs");
        assert!(st.by_load == by_load, "step {step}: by_load");
        for (pos, id) in st.spec.members.iter().enumerate() {
            let m = &st.members[id];
            assert!(
                m.in_pool && m.pos == pos as u32,
                "step {step}: {id} at {pos}"
            );
        }
        let in_pool = st.members.values().filter(|m| m.in_pool).count();
        assert_eq!(
            in_pool,
            st.spec.members.len(),
            "step {step}: members in the pool"
        );
        for (id, m) in &st.members {
            assert!(
                m.in_pool || !m.leases.is_empty(),
                "step {step}: {id} lingers idle"
            );
        }
        for (sid, index) in &st.subsets {
            let by_load: ByLoad = if st.tracks_load() {
                index
                    .members
                    .iter()
                    .filter_map(|id| st.members.get(id))
                    .filter(|m| m.listed())
                    .map(Member::load_key)
                    .collect()
            } else {
                BTreeSet::new()
            };
            assert!(index.by_load == by_load, "step {step}: {sid}'s by_load");
            for id in index
                .members
                .iter()
                .filter(|id| st.members.contains_key(*id))
            {
                let noted = st.load_subsets.get(id).is_some_and(|s| s.contains(sid));
                assert_eq!(noted, st.tracks_load(), "step {step}: {id} in {sid}");
            }
        }
        for (id, sids) in &st.load_subsets {
            assert!(!sids.is_empty(), "step {step}: {id} in no subset");
            for sid in sids {
                let index = st.subsets.get(sid);
                assert!(
                    index.is_some_and(|s| s.contains(id)),
                    "step {step}: {id} in {sid}"
                );
            }
        }
    }

    #[test]
    fn a_subset_dropped_for_a_newer_one_leaves_its_members_unnoted() {
        let now = Instant::now();
        let members: Vec<UpstreamId> = (0..4)
            .map(|i| UpstreamId::new(format!("http://10.5.0.{i}:3128")))
            .collect();
        let spec = PoolSpec {
            name: "p".into(),
            members: members.clone(),
            strategy: Strategy::LeastConnections,
            max_concurrency: None,
            lease_ttl: Duration::from_secs(30),
            shards: 1,
        };
        let mut st = PoolState::new(spec, now);
        for n in 0..MAX_SUBSETS + 8 {
            let id = format!("s{n}");
            let within = Some(Subset {
                id: &id,
                members: &members[n % 4..n % 4 + 1],
            });
            let got = st.acquire(
                Want::Any {
                    exclude: &[],
                    within,
                },
                now,
            );
            assert!(matches!(got, Acquired::Granted(_)), "{n}: {got:?}");
        }
        assert_eq!(st.subsets.len(), MAX_SUBSETS);
        let noted: usize = st.load_subsets.values().map(Vec::len).sum();
        assert_eq!(noted, MAX_SUBSETS);
        assert_consistent(&st, 0);
    }

    /// Sets a member of `universe` at random in or out of service (in with `eligible`'s odds),
    /// at a random cost.
    fn set_random_member(
        st: &mut PoolState,
        rng: &mut StdRng,
        universe: &[UpstreamId],
        eligible: f64,
    ) {
        let id = &universe[rng.random_range(0..universe.len())];
        let state = MemberState {
            eligible: rng.random_bool(eligible),
            keeps_sessions: true,
            cost: rng.random_range(1..4),
        };
        st.set_member(id, state);
    }

    /// Least-connections' pick within `members` by weighing each: what the subset's load index
    /// must give.
    fn weighed_pick(st: &PoolState, members: &[UpstreamId]) -> Option<UpstreamId> {
        members
            .iter()
            .filter_map(|id| st.members.get(id).map(|m| (m, id)))
            .filter(|(m, _)| m.listed() && m.has_room(st.spec.max_concurrency))
            .min_by_key(|(m, _)| m.load_key())
            .map(|(_, id)| id.clone())
    }

    #[test]
    fn least_connections_within_a_subset_picks_what_weighing_every_member_picks() {
        let now = Instant::now();
        let universe: Vec<UpstreamId> = (0..60)
            .map(|i| UpstreamId::new(format!("http://10.4.0.{i}:3128")))
            .collect();
        let mut rng = StdRng::seed_from_u64(0x10ad);
        let spec = PoolSpec {
            name: "p".into(),
            members: universe.clone(),
            strategy: Strategy::LeastConnections,
            max_concurrency: Some(3),
            lease_ttl: Duration::from_secs(30),
            shards: 1,
        };
        let mut st = PoolState::new(spec.clone(), now);
        // Overlapping filters, as `country=us` and `country=us,type=mobile` would be.
        let filters: Vec<(String, Vec<UpstreamId>)> = (0..6)
            .map(|f| {
                let members = universe
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i % (f + 2) == 0 || (f == 5 && i % 7 == 1))
                    .map(|(_, id)| id.clone())
                    .collect();
                (format!("f{f}"), members)
            })
            .collect();
        let mut held: Vec<(UpstreamId, LeaseId)> = Vec::new();
        let mut clock = now;
        let mut picks = 0;
        for step in 0..3_000 {
            match rng.random_range(0..12) {
                0..5 => {
                    let (sid, members) = &filters[rng.random_range(0..filters.len())];
                    let expected = weighed_pick(&st, members);
                    let within = Some(Subset { id: sid, members });
                    match st.acquire(
                        Want::Any {
                            exclude: &[],
                            within,
                        },
                        clock,
                    ) {
                        Acquired::Granted(g) => {
                            assert_eq!(Some(&g.upstream), expected.as_ref(), "step {step}");
                            held.push((g.upstream, g.lease));
                            picks += 1;
                        }
                        other => assert!(expected.is_none(), "step {step}: {other:?}"),
                    }
                }
                5..8 if !held.is_empty() => {
                    let (up, lease) = held.swap_remove(rng.random_range(0..held.len()));
                    st.release(&up, lease, Outcome::Ok, Duration::ZERO);
                }
                8 => {
                    let any = Want::Any {
                        exclude: &[],
                        within: None,
                    };
                    if let Acquired::Granted(g) = st.acquire(any, clock) {
                        held.push((g.upstream, g.lease));
                    }
                }
                9 => set_random_member(&mut st, &mut rng, &universe, 0.8),
                10 => {
                    let id = &universe[rng.random_range(0..universe.len())];
                    st.hold(id, rng.random_range(0..3));
                }
                // Leases nobody releases run out.
                _ => clock += Duration::from_secs(rng.random_range(0..20)),
            }
            st.expire(clock);
            assert_consistent(&st, step);
        }
        assert!(picks > 500, "{picks} picks within filters");
    }

    #[test]
    fn declarations_that_edit_the_list_keep_the_indexes_as_a_rebuild_makes_them() {
        let now = Instant::now();
        let universe: Vec<UpstreamId> = (0..120)
            .map(|i| UpstreamId::new(format!("http://10.3.0.{i}:3128")))
            .collect();
        let mut rng = StdRng::seed_from_u64(0x5eed);
        let mut spec = PoolSpec {
            name: "p".into(),
            members: universe[..80].to_vec(),
            strategy: Strategy::LeastConnections,
            max_concurrency: None,
            lease_ttl: Duration::from_secs(600),
            shards: 1,
        };
        let mut st = PoolState::new(spec.clone(), now);
        let mut held: Vec<(UpstreamId, LeaseId)> = Vec::new();
        for step in 0..2_000 {
            match rng.random_range(0..10) {
                0..4 => {
                    let any = Want::Any {
                        exclude: &[],
                        within: None,
                    };
                    if let Acquired::Granted(g) = st.acquire(any, now) {
                        held.push((g.upstream, g.lease));
                    }
                }
                4..6 if !held.is_empty() => {
                    let (up, lease) = held.swap_remove(rng.random_range(0..held.len()));
                    st.release(&up, lease, Outcome::Ok, Duration::ZERO);
                }
                6 => set_random_member(&mut st, &mut rng, &universe, 0.7),
                _ => {
                    let mut members = spec.members.clone();
                    for _ in 0..rng.random_range(0..4) {
                        if !members.is_empty() {
                            members.remove(rng.random_range(0..members.len()));
                        }
                    }
                    for _ in 0..rng.random_range(0..4) {
                        let id = universe[rng.random_range(0..universe.len())].clone();
                        if !members.contains(&id) {
                            members.insert(rng.random_range(0..=members.len()), id);
                        }
                    }
                    if members.len() > 1 && rng.random_bool(0.3) {
                        let (i, j) = (
                            rng.random_range(0..members.len()),
                            rng.random_range(0..members.len()),
                        );
                        members.swap(i, j);
                    }
                    let strategy = match rng.random_range(0..8) {
                        0 => Strategy::LeastUsed,
                        1 => Strategy::RoundRobin,
                        2 => spec.strategy,
                        _ => Strategy::LeastConnections,
                    };
                    spec = PoolSpec {
                        members,
                        strategy,
                        ..spec.clone()
                    };
                    st.reconfigure(spec.clone());
                }
            }
            assert_consistent(&st, step);
        }
    }
}
