//! The health of one pool: every upstream's state machine, the target tracker, and the pool-wide
//! guards (quarantine cap, minimum in service, global incidents).
//!
//! It is fed outcomes at lease release and ticked once a second; it answers with [`Change`]s, the
//! allocator settings the store must apply. It holds no I/O and no clock of its own beyond
//! `tokio::time::Instant::now()`, so tests drive it on a paused clock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{HealthConfig, Strategy};
use crate::fast_map::FastMap;
use crate::health::blame::{Answer, TargetChange, Targets};
use crate::health::exit::ExitIps;
use crate::health::latency::LatencyHistogram;
use crate::health::state::{Sample, State, Transition, UpstreamHealth};
pub use crate::health::view::{
    MatrixCell, MatrixRow, PoolHealthView, TargetIncident, UpstreamHealthView,
};
use crate::outcome::Outcome;
use crate::store::MemberState;
use crate::upstream::UpstreamId;

/// Raw (unblamed) outcomes remembered per upstream for global-incident detection.
const RAW_WINDOW: usize = 10;
/// Targets idle this long are forgotten.
const TARGET_IDLE_EXPIRY: Duration = Duration::from_secs(15 * 60);
/// Allocation cost of a degraded upstream (half the share), and of one kept in service only by a
/// pool guard (a quarter).
const DEGRADED_COST: u32 = 2;
const HELD_COST: u32 = 4;
/// A half-open upstream starts at 1/8 of a share and doubles with each success.
const HALF_OPEN_START_COST: u32 = 8;
const MAX_WEIGHT_COST: u32 = 8;

/// An allocator setting to apply, with the state transition behind it (when there was one).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub upstream: UpstreamId,
    pub member: MemberState,
    /// The setting the engine knew the member to have when it decided: a shared store refuses
    /// the change if another instance has moved the member out of service since.
    pub believed: MemberState,
    pub transition: Option<Transition>,
}

#[derive(Debug)]
struct Tracked {
    machine: UpstreamHealth,
    raw: VecDeque<bool>,
    last_active: Option<Instant>,
    latency_ewma_ms: Option<f64>,
    latency: LatencyHistogram,
    /// Cost factor of the `weighted` strategy.
    weight_cost: u32,
    /// The member setting last handed to the store.
    applied: MemberState,
}

impl Tracked {
    fn new(now: Instant) -> Self {
        Tracked {
            machine: UpstreamHealth::new(now),
            raw: VecDeque::new(),
            last_active: None,
            latency_ewma_ms: None,
            latency: LatencyHistogram::default(),
            weight_cost: 1,
            applied: MemberState::IN_SERVICE,
        }
    }

    fn raw_failing(&self) -> bool {
        self.raw.len() >= 3 && self.raw.iter().filter(|bad| **bad).count() * 2 >= self.raw.len()
    }

    fn member_state(&self) -> MemberState {
        let m = &self.machine;
        let (eligible, keeps_sessions, cost) = match m.state() {
            State::Healthy => (true, true, 1),
            State::Degraded if m.held() => (true, true, HELD_COST),
            State::Degraded => (true, true, DEGRADED_COST),
            State::HalfOpen => (
                true,
                true,
                (HALF_OPEN_START_COST >> m.half_open_progress()).max(1),
            ),
            State::Quarantined => (false, true, 1),
            State::Dead => (false, false, 1),
            State::Drained => (false, true, 1),
        };
        MemberState {
            eligible,
            keeps_sessions,
            cost: cost * self.weight_cost,
        }
    }
}

#[derive(Debug)]
struct Engine {
    cfg: HealthConfig,
    strategy: Strategy,
    members: Vec<UpstreamId>,
    upstreams: FastMap<UpstreamId, Tracked>,
    targets: Targets,
    global_incident_since: Option<Instant>,
    /// The pool probes: a cool-down's end waits for passing probes instead of going half-open.
    probing: bool,
    /// Members grouped by measured exit IP: a ban through one is a ban on its twins.
    exits: ExitIps,
}

/// Why an upstream is due a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbePurpose {
    /// Quarantined, its cool-down over: passing probes return it to half-open.
    Recovery,
    /// Dead: probed rarely, in case it came back.
    Dead,
    /// In service but carrying no traffic: probes keep its health current.
    Idle,
}

impl ProbePurpose {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbePurpose::Recovery => "recovery",
            ProbePurpose::Dead => "dead",
            ProbePurpose::Idle => "idle",
        }
    }
}

/// The health of one pool.
#[derive(Debug)]
pub struct PoolHealth {
    name: String,
    inner: Mutex<Engine>,
}

/// Rows of the upstream × target matrix in `/status`.
pub const MATRIX_TARGETS: usize = 20;
/// Upstreams the matrix shows per target at most: those with the most exchanges with it. A
/// busy target of a pool of 100,000 exits has a cell on each: `/status` would list them all.
pub const MATRIX_CELLS: usize = 100;

fn sample_of(outcome: Outcome) -> Option<Sample> {
    match outcome {
        Outcome::Ok | Outcome::OriginError => Some(Sample::Success),
        Outcome::ConnectError | Outcome::Timeout | Outcome::Reset | Outcome::UpstreamError => {
            Some(Sample::Fault)
        }
        Outcome::Captcha | Outcome::Blocked => Some(Sample::Ban),
        Outcome::Cancelled => None,
    }
}

/// Members per health state, every state present (zero or not).
fn counts_by_state(e: &Engine) -> BTreeMap<&'static str, usize> {
    let mut counts: BTreeMap<_, _> = [
        State::Healthy,
        State::Degraded,
        State::Quarantined,
        State::HalfOpen,
        State::Dead,
        State::Drained,
    ]
    .into_iter()
    .map(|s| (s.as_str(), 0))
    .collect();
    for t in e.upstreams.values() {
        *counts.entry(t.machine.state().as_str()).or_default() += 1;
    }
    counts
}

impl PoolHealth {
    pub fn new(name: &str, cfg: HealthConfig, strategy: Strategy, members: &[UpstreamId]) -> Self {
        let now = Instant::now();
        PoolHealth {
            name: name.to_string(),
            inner: Mutex::new(Engine {
                upstreams: members
                    .iter()
                    .map(|id| (id.clone(), Tracked::new(now)))
                    .collect(),
                members: members.to_vec(),
                cfg,
                strategy,
                targets: Targets::default(),
                global_incident_since: None,
                probing: false,
                exits: ExitIps::default(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Engine> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// New thresholds and membership (config reload); state of kept upstreams is kept.
    pub fn reconfigure(&self, cfg: HealthConfig, strategy: Strategy, members: &[UpstreamId]) {
        let now = Instant::now();
        let mut e = self.lock();
        e.cfg = cfg;
        e.strategy = strategy;
        e.members = members.to_vec();
        let keep: std::collections::HashSet<&UpstreamId> = members.iter().collect();
        e.upstreams.retain(|id, _| keep.contains(id));
        e.exits.retain(|id| keep.contains(id));
        for id in members {
            e.upstreams
                .entry(id.clone())
                .or_insert_with(|| Tracked::new(now));
        }
    }

    /// Mirrors a member setting another instance applied (shared store), so this instance's
    /// view and decisions start from it. Returns nothing for the store: it already holds it.
    pub fn mirror(&self, upstream: &UpstreamId, member: MemberState) {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let cfg = e.cfg.clone();
        let Some(t) = e.upstreams.get_mut(upstream) else {
            return;
        };
        let to = match (member.eligible, member.keeps_sessions) {
            (false, false) => State::Dead,
            (false, true) => State::Quarantined,
            (true, _) => State::Healthy,
        };
        let transition = t.machine.mirror(to, &cfg, now);
        t.applied = member;
        if let Some(tr) = &transition {
            self.log(upstream, tr);
        }
    }

    /// Whether the pool probes (its config has a probe section); set at start and on reload.
    pub fn set_probing(&self, probing: bool) {
        self.lock().probing = probing;
    }

    /// Records the exit IP a probe measured for `upstream` (a member of the pool); logs a change.
    pub fn set_exit_ip(&self, upstream: &UpstreamId, ip: IpAddr) {
        let mut e = self.lock();
        if !e.upstreams.contains_key(upstream) {
            return;
        }
        if e.exits.set(upstream, ip) {
            let shares: Vec<&UpstreamId> = e.exits.twins(upstream).collect();
            if shares.is_empty() {
                tracing::info!(pool = %self.name, upstream = %upstream, exit_ip = %ip, "exit IP measured");
            } else {
                tracing::warn!(
                    pool = %self.name, upstream = %upstream, exit_ip = %ip, shares_with = ?shares,
                    "exit IP measured: shared with other members, which now share its bans"
                );
            }
        }
    }

    /// Forgets every measured exit IP (the pool no longer measures them: a reload dropped its
    /// `exit_ip_url`), so no stale grouping goes on sharing bans.
    pub fn forget_exit_ips(&self) {
        self.lock().exits = ExitIps::default();
    }

    /// The members a probe should look at now, and why: quarantined ones whose cool-down is
    /// over, dead ones (not operator-removed), and in-service ones with no traffic for `idle`.
    /// Members carrying traffic are left to passive health.
    pub fn probe_plan(&self, idle: Duration) -> Vec<(UpstreamId, ProbePurpose)> {
        let now = Instant::now();
        let e = self.lock();
        e.members
            .iter()
            .filter_map(|id| {
                let t = e.upstreams.get(id)?;
                let m = &t.machine;
                let purpose = match m.state() {
                    State::Quarantined if m.awaiting_probe() => ProbePurpose::Recovery,
                    State::Dead if !m.removed() => ProbePurpose::Dead,
                    State::Healthy | State::Degraded | State::HalfOpen
                        if t.last_active.is_none_or(|a| now.duration_since(a) >= idle) =>
                    {
                        ProbePurpose::Idle
                    }
                    _ => return None,
                };
                Some((id.clone(), purpose))
            })
            .collect()
    }

    /// Members in service now (healthy, degraded or half-open): where a reference probe may go.
    pub fn in_service(&self) -> Vec<UpstreamId> {
        let e = self.lock();
        e.members
            .iter()
            .filter(|id| {
                e.upstreams.get(*id).is_some_and(|t| {
                    matches!(
                        t.machine.state(),
                        State::Healthy | State::Degraded | State::HalfOpen
                    )
                })
            })
            .cloned()
            .collect()
    }

    /// Applies a probe's verdict. A quarantined or dead upstream needs `needed` passes in a row
    /// to go half-open, and a failure re-quarantines it with a longer cool-down; for an upstream
    /// in service a probe counts as one sample, like an exchange (without target statistics: a
    /// control target is not a target anyone asked for).
    pub fn probe_result(
        &self,
        upstream: &UpstreamId,
        passed: Result<(), &str>,
        needed: u32,
    ) -> Vec<Change> {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let cfg = e.cfg.clone();
        let Some(state) = e.upstreams.get(upstream).map(|t| t.machine.state()) else {
            return Vec::new();
        };
        let jitter = rand::random::<f64>() * 2.0 - 1.0;
        let transition = match state {
            State::Quarantined | State::Dead => {
                let m = match e.upstreams.get_mut(upstream) {
                    Some(t) => &mut t.machine,
                    None => return Vec::new(),
                };
                match passed {
                    Ok(()) => m.probe_passed(needed, now),
                    Err(why) => m.probe_failed(&cfg, now, jitter, why),
                }
            }
            State::Healthy | State::Degraded | State::HalfOpen => {
                let sample = if passed.is_ok() {
                    Sample::Success
                } else {
                    Sample::Fault
                };
                Self::feed(e, upstream, sample, &cfg, now, jitter)
            }
            State::Drained => None,
        };
        if let Some(t) = &transition {
            self.log(upstream, t);
        }
        self.change_for(e, upstream, transition)
            .into_iter()
            .collect()
    }

    /// Records one exchange's outcome and returns what the allocator must change.
    pub fn observe(
        &self,
        upstream: &UpstreamId,
        target: &str,
        outcome: Outcome,
        latency: Duration,
    ) -> Vec<Change> {
        self.observe_exchange(upstream, target, outcome, latency, true)
    }

    /// Records the outcome of an exchange that ended before the target answered anything (the
    /// connect failed; the target did not resolve or was refused before anything was dialed).
    /// Its origin errors are judged as usual but are no answer of the target's: they take no part
    /// in comparing upstreams on it (a local resolver's failure singles out nobody).
    pub fn observe_unanswered(
        &self,
        upstream: &UpstreamId,
        target: &str,
        outcome: Outcome,
        latency: Duration,
    ) -> Vec<Change> {
        self.observe_exchange(upstream, target, outcome, latency, false)
    }

    fn observe_exchange(
        &self,
        upstream: &UpstreamId,
        target: &str,
        outcome: Outcome,
        latency: Duration,
        answered: bool,
    ) -> Vec<Change> {
        let Some(sample) = sample_of(outcome) else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let cfg = e.cfg.clone();
        // The upstream's entry is taken out for the whole exchange and put back once: two lookups
        // instead of five. The pool guard, which the state machine may ask, skips it anyway.
        let Some((id, mut t)) = e.upstreams.remove_entry(upstream) else {
            return Vec::new();
        };

        let about_target = outcome != Outcome::ConnectError;
        let answer = match outcome {
            _ if !answered => Answer::Unanswered,
            Outcome::OriginError => Answer::OriginError,
            _ => Answer::Served,
        };
        let members = e.members.len();
        let mut revoke = Vec::new();
        let recorded = e.targets.record(
            &cfg,
            target,
            upstream,
            sample,
            about_target,
            answer,
            members,
            now,
        );
        // An origin error the rest of the pool does not meet on the target is the upstream's.
        let sample = recorded.sample;
        match recorded.change {
            Some(TargetChange::IncidentStarted {
                failing,
                of,
                revoke: r,
            }) => {
                tracing::warn!(
                    pool = %self.name, target, failing, of, given_back = r.len(),
                    "target incident: the target fails on most upstreams; its failures no longer count against them"
                );
                revoke = r;
            }
            Some(TargetChange::IncidentEnded) => {
                tracing::info!(pool = %self.name, target, "target incident over")
            }
            None => {}
        }
        if t.raw.len() == RAW_WINDOW {
            t.raw.pop_front();
        }
        t.raw.push_back(sample != Sample::Success);
        t.last_active = Some(now);
        if sample == Sample::Success {
            let ms = latency.as_secs_f64() * 1000.0;
            t.latency_ewma_ms = Some(t.latency_ewma_ms.map_or(ms, |old| old * 0.8 + ms * 0.2));
            t.latency.record(ms);
        }

        // Blame: a target incident or a global incident is nobody's fault.
        let blamed = match sample {
            Sample::Success => true,
            _ => !e.targets.in_incident(target) && e.global_incident_since.is_none(),
        };
        let mut changes = Vec::new();
        if blamed {
            let jitter = rand::random::<f64>() * 2.0 - 1.0;
            let mut transition = t
                .machine
                .observe(sample, &cfg, now, jitter, || Self::guard(e, upstream));
            if let (Some(tr), Some(so)) = (&mut transition, recorded.singled_out) {
                tr.reason = format!(
                    "{}; origin errors on {target} in {} of its last {} answers, {} of {} through the rest of the pool",
                    tr.reason, so.errors, so.answers, so.rest_errors, so.rest_answers
                );
                t.machine.set_reason(&tr.reason);
            }
            if let Some(tr) = &transition {
                self.log(upstream, tr);
                if sample == Sample::Ban && matches!(tr.to, State::Degraded | State::Quarantined) {
                    e.targets.blamed(target, upstream, now);
                }
            }
            changes.extend(Self::change_of(upstream, &mut t, transition));
        }
        e.upstreams.insert(id, t);
        if blamed && sample == Sample::Ban {
            changes.extend(self.share_ban(e, upstream, target, &cfg, now));
        }
        for (other, at) in revoke {
            changes.extend(self.give_back(e, &other, at, target, now));
        }
        if e.strategy == Strategy::Weighted {
            changes.extend(self.reweigh(e, upstream));
        }
        changes
    }

    /// A ban `upstream` earned on `target` is a ban on the members that leave from the same exit
    /// IP (one visitor to the site): each gets the ban in its cell for the target and as a sample
    /// of its state machine, and is remembered among the target's blamed upstreams when that
    /// takes it out of full service (so a target incident gives it back too). Faults stay with the
    /// member that had them: they are the proxy's, not the address's.
    fn share_ban(
        &self,
        e: &mut Engine,
        upstream: &UpstreamId,
        target: &str,
        cfg: &HealthConfig,
        now: Instant,
    ) -> Vec<Change> {
        let twins: Vec<UpstreamId> = e.exits.twins(upstream).cloned().collect();
        let mut changes = Vec::new();
        for twin in twins {
            e.targets.shared_ban(target, &twin, now);
            let jitter = rand::random::<f64>() * 2.0 - 1.0;
            let mut transition = Self::feed(e, &twin, Sample::Ban, cfg, now, jitter);
            if let Some(tr) = &mut transition {
                let ip = e.exits.ip_of(upstream).map(|ip| ip.to_string());
                tr.reason = format!(
                    "{}; a ban on {target} through {upstream}, which shares its exit IP {}",
                    tr.reason,
                    ip.as_deref().unwrap_or("?")
                );
                if let Some(t) = e.upstreams.get_mut(&twin) {
                    t.machine.set_reason(&tr.reason);
                }
                self.log(&twin, tr);
                if matches!(tr.to, State::Degraded | State::Quarantined) {
                    e.targets.blamed(target, &twin, now);
                }
            }
            changes.extend(self.change_for(e, &twin, transition));
        }
        changes
    }

    /// A target incident shows that `upstream` was degraded or quarantined at `at` for the
    /// target's doing: back to healthy with a clean slate, unless its state has changed since (an
    /// operator, a probe, the dead state, another failure).
    fn give_back(
        &self,
        e: &mut Engine,
        upstream: &UpstreamId,
        at: Instant,
        target: &str,
        now: Instant,
    ) -> Option<Change> {
        let t = e.upstreams.get_mut(upstream)?;
        if !matches!(t.machine.state(), State::Degraded | State::Quarantined)
            || t.machine.removed()
            || t.machine.since() != at
        {
            return None;
        }
        let reason = format!("target incident on {target}: the target challenges every upstream");
        let transition = t.machine.restore(&reason, now)?;
        self.log(upstream, &transition);
        self.change_for(e, upstream, Some(transition))
    }

    /// Whether `upstream` may leave service now: the quarantine cap and `min_in_service`.
    /// Feeds `sample` to `upstream`'s state machine. Should the machine ask the pool guard, the
    /// guard looks at the other members: the entry is out of the map meanwhile.
    fn feed(
        e: &mut Engine,
        upstream: &UpstreamId,
        sample: Sample,
        cfg: &HealthConfig,
        now: Instant,
        jitter: f64,
    ) -> Option<Transition> {
        let (id, mut t) = e.upstreams.remove_entry(upstream)?;
        let transition = t
            .machine
            .observe(sample, cfg, now, jitter, || Self::guard(e, upstream));
        e.upstreams.insert(id, t);
        transition
    }

    fn guard(e: &Engine, upstream: &UpstreamId) -> Result<(), String> {
        let n = e.members.len();
        let out = e
            .upstreams
            .iter()
            .filter(|(id, u)| {
                *id != upstream
                    && matches!(
                        u.machine.state(),
                        State::Quarantined | State::Dead | State::Drained
                    )
            })
            .count();
        let cap = Self::cap(&e.cfg, n);
        if out + 1 > cap {
            return Err(format!(
                "quarantine cap reached ({out} of {n} out, cap {cap})"
            ));
        }
        if n.saturating_sub(out + 1) < e.cfg.min_in_service {
            return Err(format!("min_in_service is {}", e.cfg.min_in_service));
        }
        Ok(())
    }

    /// How many members may be out at once: the percentage of the pool, rounded down, but at
    /// least one when the percentage is not zero (a pool of two can still drop a dead member;
    /// `min_in_service` keeps the last one).
    fn cap(cfg: &HealthConfig, members: usize) -> usize {
        let cap = members * cfg.max_quarantined_percent as usize / 100;
        if cfg.max_quarantined_percent > 0 {
            cap.max(1)
        } else {
            0
        }
    }

    fn update_global_incident(&self, e: &mut Engine, now: Instant) {
        let window = e.cfg.incident_window;
        let active: Vec<&Tracked> = e
            .upstreams
            .values()
            .filter(|t| {
                t.last_active
                    .is_some_and(|a| now.duration_since(a) <= window)
            })
            .collect();
        let failing = active.iter().filter(|t| t.raw_failing()).count();
        let share = if active.is_empty() {
            0.0
        } else {
            failing as f64 / active.len() as f64
        };
        let min = e.cfg.target_incident_min_upstreams;
        match e.global_incident_since {
            None if active.len() >= min && share >= e.cfg.global_incident_ratio => {
                e.global_incident_since = Some(now);
                tracing::warn!(
                    pool = %self.name, failing, active = active.len(),
                    "global incident: most upstreams fail at once; nothing is quarantined while it lasts"
                );
            }
            Some(_) if share < e.cfg.global_incident_ratio / 2.0 => {
                e.global_incident_since = None;
                tracing::info!(pool = %self.name, "global incident over");
            }
            _ => {}
        }
    }

    /// Recomputes the `weighted` cost factor of `upstream` from its success ratio and latency
    /// relative to the pool's median.
    fn reweigh(&self, e: &mut Engine, upstream: &UpstreamId) -> Option<Change> {
        let mut lat: Vec<f64> = e
            .upstreams
            .values()
            .filter_map(|t| t.latency_ewma_ms)
            .collect();
        lat.sort_by(|a, b| a.total_cmp(b));
        let median = lat.get(lat.len() / 2).copied().unwrap_or(0.0).max(1.0);
        let t = e.upstreams.get_mut(upstream)?;
        let ratio = t.latency_ewma_ms.map_or(1.0, |l| (l / median).max(1.0));
        let success = t.machine.success_ratio().unwrap_or(1.0).max(0.1);
        t.weight_cost = ((ratio / success).round() as u32).clamp(1, MAX_WEIGHT_COST);
        self.change_for(e, upstream, None)
    }

    /// The store change for `upstream`, if its setting differs from the one applied.
    fn change_for(
        &self,
        e: &mut Engine,
        upstream: &UpstreamId,
        transition: Option<Transition>,
    ) -> Option<Change> {
        let t = e.upstreams.get_mut(upstream)?;
        Self::change_of(upstream, t, transition)
    }

    /// What the allocator must change after `transition` (if any) of `upstream`, tracked as `t`.
    fn change_of(
        upstream: &UpstreamId,
        t: &mut Tracked,
        transition: Option<Transition>,
    ) -> Option<Change> {
        let member = t.member_state();
        if member == t.applied && transition.is_none() {
            return None;
        }
        let believed = std::mem::replace(&mut t.applied, member);
        Some(Change {
            upstream: upstream.clone(),
            member,
            believed,
            transition,
        })
    }

    fn log(&self, upstream: &UpstreamId, t: &Transition) {
        tracing::info!(
            pool = %self.name, upstream = %upstream, from = t.from.as_str(), to = t.to.as_str(),
            reason = %t.reason, "upstream state changed"
        );
    }

    /// Ends cool-downs that are over and forgets idle targets; run about once a second.
    pub fn tick(&self) -> Vec<Change> {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        for target in e.targets.expire(&e.cfg, TARGET_IDLE_EXPIRY, now) {
            tracing::info!(pool = %self.name, target, "target incident over: no recent failures");
        }
        self.update_global_incident(e, now);
        let ids: Vec<UpstreamId> = e.upstreams.keys().cloned().collect();
        let mut changes = Vec::new();
        for id in ids {
            let probing = e.probing;
            let transition = e
                .upstreams
                .get_mut(&id)
                .and_then(|t| t.machine.tick(now, probing));
            if let Some(t) = &transition {
                self.log(&id, t);
            }
            if transition.is_some() {
                changes.extend(self.change_for(e, &id, transition));
            }
        }
        changes
    }

    /// An operator's restore of `upstream` to healthy.
    pub fn restore(&self, upstream: &UpstreamId, reason: &str) -> Option<Change> {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let t = e
            .upstreams
            .get_mut(upstream)?
            .machine
            .restore(reason, now)?;
        self.log(upstream, &t);
        self.change_for(e, upstream, Some(t))
    }

    /// An operator's drain of `upstream`: no new work; live leases and sessions finish.
    pub fn drain(&self, upstream: &UpstreamId) -> Option<Change> {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let t = e.upstreams.get_mut(upstream)?.machine.drain(now);
        self.log(upstream, &t);
        self.change_for(e, upstream, Some(t))
    }

    /// An operator's removal of `upstream`: out of service, its sessions end.
    pub fn remove(&self, upstream: &UpstreamId) -> Option<Change> {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let t = e.upstreams.get_mut(upstream)?.machine.remove(now);
        self.log(upstream, &t);
        self.change_for(e, upstream, Some(t))
    }

    /// An operator's quarantine of `upstream` for `duration` (no pool guard applies).
    pub fn quarantine(&self, upstream: &UpstreamId, duration: Duration) -> Option<Change> {
        let now = Instant::now();
        let mut e = self.lock();
        let e = &mut *e;
        let t = e
            .upstreams
            .get_mut(upstream)?
            .machine
            .force_quarantine(duration, now);
        self.log(upstream, &t);
        self.change_for(e, upstream, Some(t))
    }

    /// The members whose store setting is not plain service, with that setting: what a store
    /// pool declared afresh (a pool resharded) must be told again.
    pub fn settings(&self) -> Vec<(UpstreamId, MemberState)> {
        let e = self.lock();
        e.members
            .iter()
            .filter_map(|id| {
                let t = e.upstreams.get(id)?;
                (t.applied != MemberState::IN_SERVICE).then(|| (id.clone(), t.applied))
            })
            .collect()
    }

    pub fn state_of(&self, upstream: &UpstreamId) -> Option<State> {
        self.lock()
            .upstreams
            .get(upstream)
            .map(|t| t.machine.state())
    }

    /// Members per health state (every state present): what the dashboard's history keeps
    /// every 10 s, without the per-member [`PoolHealth::view`] (28 MB of a 100,000-member pool).
    pub fn counts_by_state(&self) -> BTreeMap<&'static str, usize> {
        counts_by_state(&self.lock())
    }

    /// The upstream's latency average, if it has one (what a feedback report without a figure
    /// is counted with).
    pub fn latency_ewma_ms(&self, upstream: &UpstreamId) -> Option<f64> {
        self.lock().upstreams.get(upstream)?.latency_ewma_ms
    }

    pub fn view(&self) -> PoolHealthView {
        let now = Instant::now();
        let e = self.lock();
        let counts_by_state = counts_by_state(&e);
        let mut upstreams = HashMap::new();
        for (id, t) in &e.upstreams {
            let m = &t.machine;
            upstreams.insert(
                id.clone(),
                UpstreamHealthView {
                    state: m.state().as_str(),
                    state_since_s: now.duration_since(m.since()).as_secs(),
                    state_reason: m.reason().to_string(),
                    success_ratio: m.success_ratio(),
                    captcha_ratio: m.ban_ratio(),
                    quarantines_total: m.quarantines_total,
                    cooldown_remaining_ms: m
                        .quarantine_until()
                        .map(|u| u.saturating_duration_since(now).as_millis() as u64),
                    awaiting_probe: m.awaiting_probe(),
                    probe_passes: m.probe_passes(),
                    latency_ewma_ms: t.latency_ewma_ms,
                    latency_p50_ms: t.latency.quantile(0.5),
                    latency_p95_ms: t.latency.quantile(0.95),
                    allocation_cost: t.applied.cost,
                    exit_ip: e.exits.ip_of(id),
                    shares_exit_ip_with: e.exits.twins(id).map(|u| u.to_string()).collect(),
                },
            );
        }
        let quarantined = e
            .upstreams
            .values()
            .filter(|t| matches!(t.machine.state(), State::Quarantined | State::Dead))
            .count();
        PoolHealthView {
            quarantine_cap: Self::cap(&e.cfg, e.members.len()),
            quarantined,
            counts_by_state,
            global_incident: e.global_incident_since.is_some(),
            target_incidents: e
                .targets
                .incidents()
                .into_iter()
                .map(|(target, since)| TargetIncident {
                    target,
                    since_s: now.duration_since(since).as_secs(),
                })
                .collect(),
            targets_tracked: e.targets.len(),
            shared_exit_ips: e.exits.shared(),
            upstreams,
            matrix: e
                .targets
                .busiest(MATRIX_TARGETS)
                .into_iter()
                .map(|mut row| MatrixRow {
                    target: row.target,
                    incident: row.incident,
                    cells_total: row.cells.len(),
                    cells: {
                        if row.cells.len() > MATRIX_CELLS {
                            // The busiest, in their order before.
                            let mut by_total: Vec<u64> =
                                row.cells.iter().map(|(_, c)| c.total()).collect();
                            by_total.sort_unstable_by(|a, b| b.cmp(a));
                            let floor = by_total[MATRIX_CELLS - 1];
                            let mut above = by_total.iter().filter(|t| **t > floor).count();
                            row.cells.retain(|(_, c)| {
                                let t = c.total();
                                if t > floor {
                                    true
                                } else if t == floor && above < MATRIX_CELLS {
                                    above += 1;
                                    true
                                } else {
                                    false
                                }
                            });
                        }
                        row.cells
                    }
                    .into_iter()
                    .map(|(u, c)| {
                        let total = c.total().max(1) as f64;
                        MatrixCell {
                            upstream: u.to_string(),
                            success_ratio: c.ok as f64 / total,
                            captcha_ratio: c.bans as f64 / total,
                            counts: c,
                        }
                    })
                    .collect(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> UpstreamId {
        UpstreamId::new(s)
    }

    fn pool(n: usize) -> PoolHealth {
        let members: Vec<UpstreamId> = (0..n).map(|i| id(&format!("u{i}"))).collect();
        let cfg = HealthConfig {
            max_quarantined_percent: 100,
            min_in_service: 1,
            cooldown_jitter: 0.0,
            ..HealthConfig::default()
        };
        PoolHealth::new("t", cfg, Strategy::LeastUsed, &members)
    }

    fn bans_of(h: &PoolHealth, target: &str, upstream: &str) -> u64 {
        h.view()
            .matrix
            .iter()
            .find(|r| r.target == target)
            .and_then(|r| r.cells.iter().find(|c| c.upstream == upstream))
            .map_or(0, |c| c.counts.bans)
    }

    /// Each change names the setting its decision started from: the one last handed to the
    /// store, or mirrored from another instance, so that a shared store can refuse a decision
    /// made before a quarantine elsewhere was heard of.
    #[tokio::test(start_paused = true)]
    async fn each_change_carries_the_setting_its_decision_started_from() {
        let h = pool(3);
        let fail = |u: &str| {
            let mut changes = Vec::new();
            for _ in 0..20 {
                changes.extend(h.observe(
                    &id(u),
                    "a.example",
                    Outcome::ConnectError,
                    Duration::ZERO,
                ));
            }
            changes
        };
        let changes = fail("u0");
        assert!(!changes.is_empty(), "u0 left service");
        assert_eq!(changes[0].believed, MemberState::IN_SERVICE);
        for pair in changes.windows(2) {
            assert_eq!(pair[1].believed, pair[0].member, "{changes:?}");
        }
        let elsewhere = MemberState {
            eligible: true,
            keeps_sessions: true,
            cost: 3,
        };
        h.mirror(&id("u1"), elsewhere);
        let changes = fail("u1");
        assert!(!changes.is_empty(), "u1 left service");
        assert_eq!(changes[0].believed, elsewhere, "{changes:?}");
    }

    /// The per-state counts and one member's latency, read without the whole view, agree with
    /// the view.
    #[tokio::test(start_paused = true)]
    async fn counts_by_state_and_latency_read_alone_match_the_view() {
        let h = pool(6);
        for _ in 0..20 {
            h.observe(
                &id("u0"),
                "a.example",
                Outcome::ConnectError,
                Duration::ZERO,
            );
        }
        h.observe(
            &id("u1"),
            "a.example",
            Outcome::Ok,
            Duration::from_millis(40),
        );
        let view = h.view();
        assert_ne!(
            view.counts_by_state["healthy"], 6,
            "u0 left the healthy state"
        );
        assert_eq!(h.counts_by_state(), view.counts_by_state);
        assert_eq!(h.counts_by_state().values().sum::<usize>(), 6);
        assert_eq!(
            h.latency_ewma_ms(&id("u1")),
            view.upstreams[&id("u1")].latency_ewma_ms
        );
        assert!(h.latency_ewma_ms(&id("u1")).is_some());
        assert_eq!(h.latency_ewma_ms(&id("nobody")), None);
    }

    /// A target seen through more upstreams than the matrix shows keeps the busiest cells, in
    /// member order, and says how many there were.
    #[tokio::test(start_paused = true)]
    async fn the_matrix_shows_the_busiest_upstreams_of_a_target() {
        let n = MATRIX_CELLS + 20;
        let h = pool(n);
        for i in 0..n {
            // u0..u19 once, every other member twice.
            let times = if i < 20 { 1 } else { 2 };
            for _ in 0..times {
                h.observe(
                    &id(&format!("u{i}")),
                    "shop.example",
                    Outcome::Ok,
                    Duration::from_millis(5),
                );
            }
        }
        let view = h.view();
        let row = view
            .matrix
            .iter()
            .find(|r| r.target == "shop.example")
            .unwrap();
        assert_eq!(row.cells_total, n);
        assert_eq!(row.cells.len(), MATRIX_CELLS);
        assert!(row.cells.iter().all(|c| c.counts.total() == 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_ban_through_one_member_is_a_ban_on_its_exit_ip_twins_only() {
        let h = pool(4);
        let shared: IpAddr = "198.51.100.9".parse().unwrap();
        h.set_exit_ip(&id("u0"), shared);
        h.set_exit_ip(&id("u1"), shared);
        h.set_exit_ip(&id("u2"), "198.51.100.10".parse().unwrap());
        h.set_exit_ip(&id("nobody"), shared);
        let view = h.view();
        assert_eq!(view.shared_exit_ips, 1);
        assert_eq!(view.upstreams[&id("u0")].shares_exit_ip_with, ["u1"]);
        assert_eq!(view.upstreams[&id("u1")].shares_exit_ip_with, ["u0"]);
        assert!(view.upstreams[&id("u2")].shares_exit_ip_with.is_empty());
        assert_eq!(view.upstreams[&id("u3")].exit_ip, None);

        let mut changed = Vec::new();
        for _ in 0..6 {
            for c in h.observe(
                &id("u0"),
                "shop.example",
                Outcome::Captcha,
                Duration::from_millis(5),
            ) {
                changed.push(c.upstream.to_string());
            }
        }
        assert_eq!(h.state_of(&id("u0")), Some(State::Quarantined));
        assert_eq!(h.state_of(&id("u1")), Some(State::Quarantined));
        assert_eq!(h.state_of(&id("u2")), Some(State::Healthy));
        assert!(changed.iter().any(|u| u == "u1"), "{changed:?}");
        assert_eq!(bans_of(&h, "shop.example", "u1"), 6);
        assert_eq!(bans_of(&h, "shop.example", "u2"), 0);
        let reason = h.view().upstreams[&id("u1")].state_reason.clone();
        assert!(reason.contains("through u0"), "{reason}");
        assert!(
            h.view().target_incidents.is_empty(),
            "a shared ban is no evidence of a target incident"
        );

        // Faults stay with the member that had them.
        for _ in 0..10 {
            h.observe(
                &id("u2"),
                "shop.example",
                Outcome::ConnectError,
                Duration::from_millis(5),
            );
        }
        h.set_exit_ip(&id("u3"), "198.51.100.10".parse().unwrap());
        assert_eq!(h.state_of(&id("u3")), Some(State::Healthy));
    }
}
