//! Blaming the right thing: per (upstream × target) outcomes, target incidents and global
//! incidents.
//!
//! A site that starts challenging every visitor is not evidence against any proxy: when most of
//! the upstreams that served a target recently are failing on it, that is a *target incident* and
//! its failures stop counting against upstreams. When most upstreams fail at once on everything,
//! the trouble is local (our network, our DNS): a *global incident*, during which nothing is
//! quarantined.
//!
//! An incident is recognised only once most of the pool has met the trouble, so the first
//! upstreams to meet a site that challenges everybody may already have been degraded or
//! quarantined for it by then. Each target remembers which upstreams its bans took out of full
//! service and when; the incident, once recognised, gives back those of the last
//! `incident_window` (see [`TargetChange::IncidentStarted`]).
//!
//! The opposite case is an upstream that fails where the rest of the pool does not. A proxy that
//! answers 5xx pages of its own without saying so looks like an origin error; but when its recent
//! answers on a target are mostly 5xx while the rest of the pool gets that target's pages, the
//! 5xx are its own: they are *singled out* and count as its faults (see [`SINGLED_OUT_SHARE`]).
//!
//! Memory is bounded: at most `max_targets` targets are tracked, the least recently
//! seen forgotten first (found in constant time, see [`super::recency`]).
//!
//! What ages out of the incident window is aged by a schedule, not by walking every target each
//! second: a target with anything to age is queued for when its oldest such thing leaves the
//! window, and each tick visits only the targets that came due (walking all 100,000 of a raised
//! `max_targets` took 44–74 ms a second under the engine's lock), at most
//! [`MAX_TARGETS_PER_TICK`] of them.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde::Serialize;
use tokio::time::Instant;

use crate::config::HealthConfig;
use crate::fast_map::FastMap;
use crate::health::recency::Recency;
use crate::health::state::Sample;
use crate::upstream::UpstreamId;

/// Targets a tick ages or forgets at most, each. A burst (100,000 targets seen in the same second
/// and then never again all come due one window later) is spread over ticks of about 5 ms under
/// the engine's lock (aging a target walks its cells: about 2 µs with a thousand upstreams), where
/// one tick took 63 ms. What is left over stays due, soonest first, for the next tick: in such a
/// burst an incident ends up to `burst / MAX_TARGETS_PER_TICK` ticks late.
pub const MAX_TARGETS_PER_TICK: usize = 2048;

/// Answers (successes and origin errors) remembered per (upstream, target) cell for singling
/// out, one bit each: enough for the thresholds below, few enough to follow a change quickly.
const ANSWER_WINDOW: u8 = u16::BITS as u8;

/// An upstream's origin errors on a target are *singled out* as its own faults when at least
/// this share of its recent answers there are origin errors (with at least
/// [`SINGLED_OUT_MIN_ANSWERS`] of them), while the rest of the pool's recent answers on the same
/// target (at least [`REST_MIN_ANSWERS`]) are origin errors at most [`REST_MAX_SHARE`] of the
/// time. Half is far above what a working site gives through a working proxy, so a site's
/// occasional 5xx never gets there, while a proxy failing every request does within five.
pub const SINGLED_OUT_SHARE: f64 = 0.5;
/// Five answers: one or two 5xx of a flaky moment are never half of them.
pub const SINGLED_OUT_MIN_ANSWERS: u32 = 5;
/// The rest of the pool shows that the target works: at most one answer in ten an origin error.
/// A site that is itself failing (down, overloaded, 5xx for everybody) shows it through every
/// upstream and so singles out nobody; the wide gap between the two shares keeps a flaky site's
/// chance streaks from singling out a working proxy.
pub const REST_MAX_SHARE: f64 = 0.1;
/// Five answers of the rest of the pool on the target before it is trusted to show the target
/// works. The rest leaves out upstreams singled out themselves, so two bad proxies do not vouch
/// for each other's errors being the site's.
pub const REST_MIN_ANSWERS: u32 = 5;

/// Outcome counts of one (upstream, target) cell.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Cell {
    pub ok: u64,
    pub faults: u64,
    pub bans: u64,
    #[serde(skip)]
    last_bad: bool,
    #[serde(skip)]
    last_at: Option<Instant>,
    /// The last answers, newest in bit 0: a set bit is an origin error.
    #[serde(skip)]
    answers: u16,
    /// How many bits of `answers` hold answers (up to [`ANSWER_WINDOW`]).
    #[serde(skip)]
    answered: u8,
}

impl Cell {
    pub fn total(&self) -> u64 {
        self.ok + self.faults + self.bans
    }

    fn errors(&self) -> u32 {
        self.answers.count_ones()
    }

    /// Whether this cell's recent answers are mostly origin errors: a suspect, left out of the
    /// rest of the pool's evidence.
    fn suspect(&self) -> bool {
        let n = u32::from(self.answered);
        n >= SINGLED_OUT_MIN_ANSWERS && f64::from(self.errors()) >= SINGLED_OUT_SHARE * f64::from(n)
    }

    /// What this cell adds to the rest of the pool's answers: (answers, origin errors).
    fn evidence(&self) -> (u32, u32) {
        if self.suspect() {
            (0, 0)
        } else {
            (u32::from(self.answered), self.errors())
        }
    }

    fn push_answer(&mut self, origin_error: bool) {
        // The oldest answer falls off the top.
        self.answers = (self.answers << 1) | u16::from(origin_error);
        self.answered = (self.answered + 1).min(ANSWER_WINDOW);
    }
}

/// The rest of the pool's recent answers on a target: the sum of [`Cell::evidence`].
#[derive(Clone, Copy, Debug, Default)]
struct Evidence {
    answers: u32,
    errors: u32,
}

impl Evidence {
    fn add(&mut self, (answers, errors): (u32, u32)) {
        self.answers += answers;
        self.errors += errors;
    }

    fn remove(&mut self, (answers, errors): (u32, u32)) {
        self.answers = self.answers.saturating_sub(answers);
        self.errors = self.errors.saturating_sub(errors);
    }

    /// Whether these answers show the target working.
    fn target_works(&self) -> bool {
        self.answers >= REST_MIN_ANSWERS
            && f64::from(self.errors) <= REST_MAX_SHARE * f64::from(self.answers)
    }
}

/// What the target answered through the upstream, as far as singling out is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// No answer: a failure, or an outcome reached before the target said anything.
    Unanswered,
    /// The target served the request (an ok).
    Served,
    /// The target (or so it seems) answered with an error: an origin error.
    OriginError,
}

/// An origin error that [`Targets::record`] singled out as the upstream's own fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SingledOut {
    /// The upstream's recent answers on the target, and how many were origin errors.
    pub answers: u32,
    pub errors: u32,
    /// The rest of the pool's recent answers on the target, and how many were origin errors.
    pub rest_answers: u32,
    pub rest_errors: u32,
}

/// What [`Targets::record`] made of a sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// The sample as health should judge it: a singled-out origin error is a fault.
    pub sample: Sample,
    pub singled_out: Option<SingledOut>,
    pub change: Option<TargetChange>,
}

#[derive(Debug)]
struct TargetStats {
    last_seen: Instant,
    /// Its place in [`Targets::recency`].
    slot: u32,
    cells: FastMap<UpstreamId, Cell>,
    incident_since: Option<Instant>,
    /// Upstreams this target's bans degraded or quarantined, with when: what an incident on the
    /// target gives back. At most one entry per upstream (the latest).
    blamed: Vec<(UpstreamId, Instant)>,
    /// Cells whose latest outcome was bad (recent ones: older ones are expired periodically).
    failing: usize,
    /// The recent answers of cells that are not suspects (see [`Cell::evidence`]).
    evidence: Evidence,
    /// When it is queued in [`Targets::aging`] to be visited; `None` while it has nothing that
    /// ages.
    due: Option<Instant>,
}

impl TargetStats {
    /// Ages what left the incident window by `now`: failures stop counting, answers are
    /// forgotten, blames lapse. Returns when the next thing leaves it (if anything is left to
    /// age) and whether the target's incident ended.
    fn age(&mut self, cfg: &HealthConfig, now: Instant) -> (Option<Instant>, bool) {
        let window = cfg.incident_window;
        let mut next: Option<Instant> = None;
        for c in self.cells.values_mut() {
            let Some(at) = c.last_at else { continue };
            let stale = now.duration_since(at) > window;
            if c.last_bad && stale {
                c.last_bad = false;
                self.failing -= 1;
            }
            if stale && c.answered > 0 {
                self.evidence.remove(c.evidence());
                c.answers = 0;
                c.answered = 0;
            }
            if c.last_bad || c.answered > 0 {
                next = Some(next.map_or(at + window, |n| n.min(at + window)));
            }
        }
        self.blamed
            .retain(|(_, at)| now.duration_since(*at) <= window);
        for (_, at) in &self.blamed {
            next = Some(next.map_or(*at + window, |n| n.min(*at + window)));
        }
        let ended =
            self.incident_since.is_some() && self.failing < cfg.target_incident_min_upstreams;
        if ended {
            self.incident_since = None;
        }
        (next, ended)
    }
}

/// Queues `t` to be visited at `at`, unless it is already queued for then or earlier (its
/// earlier entry stays in the heap and is skipped when it comes up: see [`Targets::expire`]).
fn schedule(aging: &mut BinaryHeap<Reverse<(Instant, u32)>>, t: &mut TargetStats, at: Instant) {
    if t.due.is_none_or(|due| at < due) {
        t.due = Some(at);
        aging.push(Reverse((at, t.slot)));
    }
}

/// What a target looks like right now.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetChange {
    /// `revoke`: the upstreams this target's bans took out of full service within the
    /// incident window, each with when; the incident shows it was the target's doing, so they
    /// are given back (those whose state has not changed since).
    IncidentStarted {
        failing: usize,
        of: usize,
        revoke: Vec<(UpstreamId, Instant)>,
    },
    IncidentEnded,
}

/// One target's row of the upstream × target matrix.
pub struct TargetRow {
    pub target: String,
    pub incident: bool,
    pub cells: Vec<(UpstreamId, Cell)>,
}

#[derive(Debug, Default)]
pub struct Targets {
    by_target: HashMap<String, TargetStats>,
    /// The targets by when they were last seen: who is forgotten when a new one comes.
    recency: Recency,
    /// Targets (by recency slot) queued to be aged, soonest first. An entry whose target was
    /// forgotten, or queued again for another time, is skipped when it comes up.
    aging: BinaryHeap<Reverse<(Instant, u32)>>,
    /// The longest incident window anything was queued for: a reload that shortens it makes
    /// every queued target due at the next tick.
    aging_window: std::time::Duration,
}

impl Targets {
    /// Records `sample` of `upstream` on `target`: how health should judge it (an origin error
    /// may be singled out as the upstream's fault) and whether the target's incident state
    /// changed. `about_target` is false for failures that cannot be the target's doing (the proxy
    /// itself was unreachable); they are counted but are no evidence of a target incident.
    /// `answer` is what the target answered, if it did: only answers are compared across the
    /// pool.
    /// `members` is the pool's size: a target incident needs most of the *pool* failing on it, so
    /// a few bad upstreams that happen to be the first to serve a target never make one.
    #[expect(
        clippy::too_many_arguments,
        reason = "each is one fact about the sample"
    )]
    pub fn record(
        &mut self,
        cfg: &HealthConfig,
        target: &str,
        upstream: &UpstreamId,
        sample: Sample,
        about_target: bool,
        answer: Answer,
        members: usize,
        now: Instant,
    ) -> Recorded {
        // One lookup for a target seen before (nearly every sample); a new one costs three.
        let stats = match self.by_target.get_mut(target) {
            Some(stats) => {
                self.recency.touch(stats.slot);
                stats
            }
            None => {
                while self.by_target.len() >= cfg.max_targets && self.evict_oldest() {}
                let slot = self.recency.push(target);
                self.by_target
                    .entry(target.to_string())
                    .or_insert_with(|| TargetStats {
                        last_seen: now,
                        slot,
                        cells: FastMap::default(),
                        incident_since: None,
                        blamed: Vec::new(),
                        failing: 0,
                        evidence: Evidence::default(),
                        due: None,
                    })
            }
        };
        stats.last_seen = now;
        let cell = match stats.cells.get_mut(upstream) {
            Some(c) => c,
            None => stats.cells.entry(upstream.clone()).or_default(),
        };
        let mut singled_out = None;
        if sample == Sample::Success && answer != Answer::Unanswered {
            let origin_error = answer == Answer::OriginError;
            stats.evidence.remove(cell.evidence());
            cell.push_answer(origin_error);
            stats.evidence.add(cell.evidence());
            // A suspect is never part of the evidence, so the rest of the pool is all of it.
            if origin_error && cell.suspect() && stats.evidence.target_works() {
                singled_out = Some(SingledOut {
                    answers: u32::from(cell.answered),
                    errors: cell.errors(),
                    rest_answers: stats.evidence.answers,
                    rest_errors: stats.evidence.errors,
                });
            }
        }
        let sample = if singled_out.is_some() {
            Sample::Fault
        } else {
            sample
        };
        match sample {
            Sample::Success => cell.ok += 1,
            Sample::Fault => cell.faults += 1,
            Sample::Ban => cell.bans += 1,
        }
        // A singled-out error is by its evidence not the target's doing.
        let bad = sample != Sample::Success && about_target && singled_out.is_none();
        match (cell.last_bad, bad) {
            (false, true) => stats.failing += 1,
            (true, false) => stats.failing -= 1,
            _ => {}
        }
        cell.last_bad = bad;
        cell.last_at = Some(now);
        if bad || cell.answered > 0 {
            schedule(&mut self.aging, stats, now + cfg.incident_window);
            self.aging_window = self.aging_window.max(cfg.incident_window);
        }

        // Kept incrementally; `expire` stops counting cells older than the incident window.
        let failing = stats.failing;
        let share = failing as f64 / members.max(1) as f64;
        let change = match stats.incident_since {
            None if failing >= cfg.target_incident_min_upstreams
                && share >= cfg.target_incident_ratio =>
            {
                stats.incident_since = Some(now);
                let revoke = std::mem::take(&mut stats.blamed)
                    .into_iter()
                    .filter(|(_, at)| now.duration_since(*at) <= cfg.incident_window)
                    .collect();
                Some(TargetChange::IncidentStarted {
                    failing,
                    of: members,
                    revoke,
                })
            }
            // Hysteresis: the incident ends well below the ratio that started it.
            Some(_) if share < cfg.target_incident_ratio / 2.0 => {
                stats.incident_since = None;
                Some(TargetChange::IncidentEnded)
            }
            // Too few failing left for an incident: it ends at the next tick, as it would have
            // by ageing.
            Some(_) if failing < cfg.target_incident_min_upstreams => {
                schedule(&mut self.aging, stats, now);
                None
            }
            _ => None,
        };
        Recorded {
            sample,
            singled_out,
            change,
        }
    }

    /// Remembers that a ban on `target` degraded or quarantined `upstream` now.
    pub fn blamed(&mut self, target: &str, upstream: &UpstreamId, now: Instant) {
        if let Some(t) = self.by_target.get_mut(target) {
            t.blamed.retain(|(id, _)| id != upstream);
            t.blamed.push((upstream.clone(), now));
            // The window is the configuration's, not known here: visited at the next tick, which
            // queues it for when the blame lapses.
            schedule(&mut self.aging, t, now);
        }
    }

    /// Counts a ban on `target` that `upstream` shares with the member it was earned through (the
    /// two leave from one exit IP). Only the cell's ban count moves: the ban is one event, so it
    /// adds no evidence of a target incident and nothing to singling out.
    pub fn shared_ban(&mut self, target: &str, upstream: &UpstreamId, now: Instant) {
        if let Some(t) = self.by_target.get_mut(target) {
            let cell = t.cells.entry(upstream.clone()).or_default();
            cell.bans += 1;
            cell.last_at = Some(now);
        }
    }

    pub fn in_incident(&self, target: &str) -> bool {
        self.by_target
            .get(target)
            .is_some_and(|t| t.incident_since.is_some())
    }

    /// Forgets the least recently seen target; false when there is none.
    fn evict_oldest(&mut self) -> bool {
        let Some((slot, _)) = self.recency.oldest() else {
            return false;
        };
        let name = self.recency.remove(slot);
        self.by_target.remove(&*name);
        true
    }

    /// Forgets targets not seen for `idle`, and stops counting failures older than the incident
    /// window (an incident with no recent evidence ends); cells not seen within the window
    /// forget their answers too. Visits only the targets forgotten and those queued for now or
    /// earlier; returns the targets whose incident ended.
    pub fn expire(
        &mut self,
        cfg: &HealthConfig,
        idle: std::time::Duration,
        now: Instant,
    ) -> Vec<String> {
        let mut forgotten = 0;
        while let Some((slot, name)) = self.recency.oldest() {
            if forgotten == MAX_TARGETS_PER_TICK {
                break;
            }
            forgotten += 1;
            let idle_for = self
                .by_target
                .get(name)
                .map_or(idle, |t| now.duration_since(t.last_seen));
            if idle_for < idle {
                break;
            }
            let name = self.recency.remove(slot);
            self.by_target.remove(&*name);
        }
        let mut ended = Vec::new();
        if cfg.incident_window < self.aging_window {
            // Queued for a longer window (a reload shortened it): everything queued is due now,
            // aged from this tick on as the budget allows. A longer window needs nothing: what is
            // queued early is queued again when it comes up.
            let queue: Vec<_> = self
                .by_target
                .values_mut()
                .filter(|t| t.due.is_some())
                .map(|t| {
                    t.due = Some(now);
                    Reverse((now, t.slot))
                })
                .collect();
            self.aging = queue.into();
        }
        self.aging_window = cfg.incident_window;
        let mut again = Vec::new();
        let mut visited = 0;
        while let Some(&Reverse((due, slot))) = self.aging.peek() {
            if due > now || visited == MAX_TARGETS_PER_TICK {
                break;
            }
            self.aging.pop();
            let Some(name) = self.recency.name(slot) else {
                continue;
            };
            let Some(t) = self.by_target.get_mut(name) else {
                continue;
            };
            if t.due != Some(due) {
                continue;
            }
            t.due = None;
            visited += 1;
            let (next, incident_ended) = t.age(cfg, now);
            if incident_ended {
                ended.push(name.to_string());
            }
            if let Some(next) = next {
                // Queued after this loop: something that leaves the window exactly now is
                // aged at the next tick, not visited again in this one.
                again.push((next, slot));
            }
        }
        for (next, slot) in again {
            // Visited just now: still tracked (nothing is forgotten in between).
            if let Some(t) = self
                .recency
                .name(slot)
                .and_then(|name| self.by_target.get_mut(name))
            {
                schedule(&mut self.aging, t, next);
            }
        }
        // Entries of forgotten or re-queued targets: the queue never holds more than about
        // twice the targets.
        if self.aging.len() > 2 * self.by_target.len() + 64 {
            self.aging = self
                .by_target
                .values()
                .filter_map(|t| t.due.map(|due| Reverse((due, t.slot))))
                .collect();
        }
        ended
    }

    pub fn len(&self) -> usize {
        self.by_target.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_target.is_empty()
    }

    /// Targets in incident, with when it started.
    pub fn incidents(&self) -> Vec<(String, Instant)> {
        let mut v: Vec<(String, Instant)> = self
            .by_target
            .iter()
            .filter_map(|(k, t)| t.incident_since.map(|s| (k.clone(), s)))
            .collect();
        v.sort();
        v
    }

    /// The `limit` busiest targets with their cells, for the upstream × target matrix.
    pub fn busiest(&self, limit: usize) -> Vec<TargetRow> {
        let mut v: Vec<(&String, &TargetStats, u64)> = self
            .by_target
            .iter()
            .map(|(k, t)| (k, t, t.cells.values().map(Cell::total).sum()))
            .collect();
        v.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
        v.into_iter()
            .take(limit)
            .map(|(k, t, _)| {
                let mut cells: Vec<(UpstreamId, Cell)> =
                    t.cells.iter().map(|(u, c)| (u.clone(), *c)).collect();
                cells.sort_by(|a, b| a.0.cmp(&b.0));
                TargetRow {
                    target: k.clone(),
                    incident: t.incident_since.is_some(),
                    cells,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sample` of `upstream` on `target` now, about the target, with no answer compared.
    fn seen(
        t: &mut Targets,
        cfg: &HealthConfig,
        target: &str,
        upstream: &UpstreamId,
        sample: Sample,
        members: usize,
    ) -> Recorded {
        t.record(
            cfg,
            target,
            upstream,
            sample,
            true,
            Answer::Unanswered,
            members,
            Instant::now(),
        )
    }

    fn ids(n: usize) -> Vec<UpstreamId> {
        (0..n).map(|i| UpstreamId::new(format!("u{i}"))).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_target_failing_everywhere_is_an_incident_and_recovers() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        let mut started = None;
        for (i, u) in ups.iter().enumerate() {
            if let Some(c) = t
                .record(
                    &cfg,
                    "shop.example",
                    u,
                    Sample::Ban,
                    true,
                    Answer::Unanswered,
                    10,
                    Instant::now(),
                )
                .change
            {
                started = Some((i, c));
            }
        }
        assert_eq!(
            started,
            Some((
                7,
                TargetChange::IncidentStarted {
                    failing: 8,
                    of: 10,
                    revoke: Vec::new()
                }
            ))
        );
        assert!(t.in_incident("shop.example"));
        for u in &ups {
            seen(&mut t, &cfg, "shop.example", u, Sample::Success, 10);
        }
        assert!(!t.in_incident("shop.example"));
    }

    /// Bans on every upstream of a 10-member pool: an incident on `target`.
    fn ban_everywhere(t: &mut Targets, cfg: &HealthConfig, target: &str, ups: &[UpstreamId]) {
        for u in ups {
            seen(t, cfg, target, u, Sample::Ban, ups.len());
        }
    }

    /// An incident with no new evidence ends at the first tick after its failures left the
    /// window, not before; its target is visited then, and the thousand quiet targets beside it
    /// are not queued at all.
    #[tokio::test(start_paused = true)]
    async fn an_incident_ends_when_its_failures_age_out_of_the_window() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        for i in 0..1000 {
            // Seen, never failing and never answering: nothing to age.
            seen(
                &mut t,
                &cfg,
                &format!("quiet{i}.example"),
                &ups[0],
                Sample::Success,
                10,
            );
        }
        ban_everywhere(&mut t, &cfg, "shop.example", &ups);
        assert!(t.in_incident("shop.example"));
        assert_eq!(t.aging.len(), 1, "only the failing target is queued");
        tokio::time::advance(cfg.incident_window).await;
        assert!(t.expire(&cfg, TARGET_IDLE, Instant::now()).is_empty());
        assert!(t.in_incident("shop.example"));
        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        assert_eq!(
            t.expire(&cfg, TARGET_IDLE, Instant::now()),
            vec!["shop.example".to_string()]
        );
        assert!(!t.in_incident("shop.example"));
        assert!(t.aging.is_empty(), "nothing left to age");
    }

    /// Fresh failures keep an incident going however often the tick runs; it ends one window
    /// after the last of them.
    #[tokio::test(start_paused = true)]
    async fn fresh_failures_keep_an_incident_and_it_ends_a_window_after_the_last() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        let second = std::time::Duration::from_secs(1);
        // Each upstream fails again every 10 s, for three windows.
        let rounds = cfg.incident_window.as_secs() * 3;
        for s in 0..rounds {
            if s % 10 == 0 {
                ban_everywhere(&mut t, &cfg, "shop.example", &ups);
            }
            assert!(
                t.expire(&cfg, TARGET_IDLE, Instant::now()).is_empty(),
                "{s}"
            );
            assert!(t.in_incident("shop.example"), "{s}");
            tokio::time::advance(second).await;
        }
        let last = rounds - rounds % 10 - if rounds % 10 == 0 { 10 } else { 0 };
        let mut ended_at = None;
        for s in rounds..rounds + cfg.incident_window.as_secs() + 5 {
            if !t.expire(&cfg, TARGET_IDLE, Instant::now()).is_empty() {
                ended_at = Some(s);
                break;
            }
            tokio::time::advance(second).await;
        }
        assert_eq!(ended_at, Some(last + cfg.incident_window.as_secs() + 1));
    }

    /// A shorter window by a reload applies at once: the next tick ages by it.
    #[tokio::test(start_paused = true)]
    async fn a_shorter_window_applies_at_the_next_tick() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        ban_everywhere(&mut t, &cfg, "shop.example", &ups);
        t.expire(&cfg, TARGET_IDLE, Instant::now());
        tokio::time::advance(std::time::Duration::from_secs(11)).await;
        let short = HealthConfig {
            incident_window: std::time::Duration::from_secs(10),
            ..cfg
        };
        assert_eq!(
            t.expire(&short, TARGET_IDLE, Instant::now()),
            vec!["shop.example".to_string()]
        );
    }

    /// Ten thousand targets failing in the same instant all come due one window later: each tick
    /// ages at most [`MAX_TARGETS_PER_TICK`] of them, soonest first, and an incident among them
    /// still ends, a tick or two late. Idle targets are forgotten by the same budget.
    #[tokio::test(start_paused = true)]
    async fn a_burst_of_due_targets_is_aged_over_several_ticks() {
        let cfg = HealthConfig {
            max_targets: 20_000,
            ..HealthConfig::default()
        };
        let mut t = Targets::default();
        let ups = ids(10);
        let n = 10_000;
        for i in 0..n {
            seen(
                &mut t,
                &cfg,
                &format!("t{i}.example"),
                &ups[i % 10],
                Sample::Ban,
                10,
            );
        }
        ban_everywhere(&mut t, &cfg, "shop.example", &ups);
        assert!(t.in_incident("shop.example"));
        assert_eq!(t.aging.len(), n + 1);
        tokio::time::advance(cfg.incident_window + std::time::Duration::from_secs(1)).await;
        let mut ended_at = None;
        let ticks = (n + 1).div_ceil(MAX_TARGETS_PER_TICK);
        for tick in 0..ticks {
            let before = t.aging.len();
            if t.expire(&cfg, TARGET_IDLE, Instant::now()) == ["shop.example"] {
                ended_at = Some(tick);
            }
            assert_eq!(
                before - t.aging.len(),
                MAX_TARGETS_PER_TICK.min(before),
                "{tick}"
            );
            tokio::time::advance(std::time::Duration::from_secs(1)).await;
        }
        assert!(t.aging.is_empty(), "all aged within {ticks} ticks");
        assert!(ended_at.is_some(), "the incident ended");
        assert!(!t.in_incident("shop.example"));
        // Idle for good: forgotten by the same budget, oldest first.
        tokio::time::advance(TARGET_IDLE).await;
        t.expire(&cfg, TARGET_IDLE, Instant::now());
        assert_eq!(t.len(), n + 1 - MAX_TARGETS_PER_TICK);
        for _ in 1..ticks {
            t.expire(&cfg, TARGET_IDLE, Instant::now());
        }
        assert_eq!(t.len(), 0);
    }

    /// Targets coming and going by the thousand (forgotten at `max_targets`) leave the ageing
    /// queue at most about twice the targets tracked.
    #[tokio::test(start_paused = true)]
    async fn the_ageing_queue_stays_bounded_while_targets_come_and_go() {
        let cfg = HealthConfig {
            max_targets: 50,
            ..HealthConfig::default()
        };
        let mut t = Targets::default();
        let u = UpstreamId::new("u");
        for i in 0..10_000 {
            seen(&mut t, &cfg, &format!("t{i}.example"), &u, Sample::Ban, 1);
            if i % 100 == 0 {
                t.expire(&cfg, TARGET_IDLE, Instant::now());
                assert!(t.aging.len() <= 2 * t.len() + 64, "{}", t.aging.len());
            }
            tokio::time::advance(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(t.len(), 50);
    }

    /// An incident gives back the upstreams the target's bans took out within
    /// `incident_window`, each once, and not those of longer ago.
    #[tokio::test(start_paused = true)]
    async fn an_incident_gives_back_what_its_bans_took_within_the_window() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        let ban = |t: &mut Targets, u: &UpstreamId| {
            seen(t, &cfg, "shop.example", u, Sample::Ban, 10).change
        };
        ban(&mut t, &ups[0]);
        t.blamed("shop.example", &ups[0], Instant::now());
        tokio::time::advance(cfg.incident_window * 2).await;
        for u in &ups[1..3] {
            ban(&mut t, u);
            t.blamed("shop.example", u, Instant::now());
            t.blamed("shop.example", u, Instant::now());
        }
        let mut started = None;
        for u in &ups {
            if let Some(c) = ban(&mut t, u) {
                started = Some(c);
            }
        }
        match started {
            Some(TargetChange::IncidentStarted { revoke, .. }) => {
                let mut ids: Vec<UpstreamId> = revoke.into_iter().map(|(id, _)| id).collect();
                ids.sort();
                assert_eq!(ids, ups[1..3].to_vec());
            }
            other => panic!("no incident: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_bad_upstream_is_not_a_target_incident() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        for round in 0..5 {
            for (i, u) in ups.iter().enumerate() {
                let s = if i == 0 { Sample::Ban } else { Sample::Success };
                assert!(
                    t.record(
                        &cfg,
                        "a.example",
                        u,
                        s,
                        true,
                        Answer::Unanswered,
                        10,
                        Instant::now()
                    )
                    .change
                    .is_none(),
                    "round {round}"
                );
            }
        }
        assert!(!t.in_incident("a.example"));
    }

    /// One answer of `u` on `target`: an ok or an origin error (both success samples).
    fn answer(t: &mut Targets, target: &str, u: &UpstreamId, origin_error: bool) -> Recorded {
        let cfg = HealthConfig::default();
        t.record(
            &cfg,
            target,
            u,
            Sample::Success,
            true,
            if origin_error {
                Answer::OriginError
            } else {
                Answer::Served
            },
            10,
            Instant::now(),
        )
    }

    /// Rounds over `ups`, each answering with an origin error when `errs(i)`; the rounds in which
    /// each upstream was first singled out.
    fn rounds(
        t: &mut Targets,
        ups: &[UpstreamId],
        n: usize,
        errs: impl Fn(usize) -> bool,
    ) -> Vec<Option<usize>> {
        let mut first = vec![None; ups.len()];
        for round in 0..n {
            for (i, u) in ups.iter().enumerate() {
                let r = answer(t, "a.example", u, errs(i));
                assert_eq!(r.change, None, "round {round}: no incident");
                if r.singled_out.is_some() {
                    assert_eq!(r.sample, Sample::Fault);
                    first[i].get_or_insert(round);
                } else {
                    assert_eq!(r.sample, Sample::Success);
                }
            }
        }
        first
    }

    #[tokio::test(start_paused = true)]
    async fn origin_errors_only_one_upstream_meets_are_singled_out_as_its_faults() {
        let mut t = Targets::default();
        let ups = ids(5);
        let first = rounds(&mut t, &ups, 10, |i| i == 0);
        // Its fifth answer makes five, the rest has had plenty by then.
        assert_eq!(first, vec![Some(4), None, None, None, None]);
        let row = &t.busiest(1)[0];
        let cell = row.cells.iter().find(|(u, _)| *u == ups[0]).unwrap().1;
        assert_eq!(
            (cell.ok, cell.faults),
            (4, 6),
            "the matrix shows them as faults"
        );
        assert!(!t.in_incident("a.example"));
    }

    #[tokio::test(start_paused = true)]
    async fn two_failing_upstreams_do_not_vouch_for_each_other() {
        let mut t = Targets::default();
        let ups = ids(5);
        let first = rounds(&mut t, &ups, 10, |i| i < 2);
        // The first to reach five answers still had the other in its evidence (four errors,
        // not yet five): it is singled out one round later.
        assert_eq!(first, vec![Some(5), Some(4), None, None, None]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_target_failing_for_everybody_singles_out_nobody() {
        let mut t = Targets::default();
        let ups = ids(5);
        assert_eq!(rounds(&mut t, &ups, 20, |_| true), vec![None; 5]);
        // Nor does a site that fails one time in three, through any upstream.
        let mut t = Targets::default();
        let n = std::cell::Cell::new(0usize);
        let flaky = |_| {
            n.set(n.get() + 1);
            n.get() % 3 == 0
        };
        assert_eq!(rounds(&mut t, &ups, 20, flaky), vec![None; 5]);
    }

    #[tokio::test(start_paused = true)]
    async fn origin_errors_without_an_answer_single_out_nobody() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(5);
        for _ in 0..10 {
            for (i, u) in ups.iter().enumerate() {
                let answer = if i == 0 {
                    Answer::Unanswered
                } else {
                    Answer::Served
                };
                let r = t.record(
                    &cfg,
                    "a.example",
                    u,
                    Sample::Success,
                    true,
                    answer,
                    10,
                    Instant::now(),
                );
                assert_eq!((r.sample, r.singled_out), (Sample::Success, None));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_older_than_the_incident_window_are_forgotten() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(5);
        rounds(&mut t, &ups, 10, |i| i == 0);
        tokio::time::advance(cfg.incident_window * 2).await;
        t.expire(&cfg, TARGET_IDLE, Instant::now());
        // Evidence starts over: the first errors after the pause are not singled out.
        let first = rounds(&mut t, &ups, 10, |i| i == 0);
        assert_eq!(first, vec![Some(4), None, None, None, None]);
    }

    /// Longer than any test runs: targets are not forgotten for idleness here.
    const TARGET_IDLE: std::time::Duration = std::time::Duration::from_secs(3600);

    #[tokio::test(start_paused = true)]
    async fn tracked_targets_are_bounded() {
        let cfg = HealthConfig {
            max_targets: 50,
            ..HealthConfig::default()
        };
        let mut t = Targets::default();
        let u = UpstreamId::new("u");
        for i in 0..1000 {
            seen(
                &mut t,
                &cfg,
                &format!("t{i}.example"),
                &u,
                Sample::Success,
                1,
            );
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(t.len(), 50);
        assert_eq!(t.busiest(100).len(), 50);
    }

    #[tokio::test(start_paused = true)]
    async fn the_least_recently_seen_target_is_forgotten_first() {
        let cfg = HealthConfig {
            max_targets: 3,
            ..HealthConfig::default()
        };
        let mut t = Targets::default();
        let u = UpstreamId::new("u");
        let see = |t: &mut Targets, name: &str| {
            seen(t, &cfg, name, &u, Sample::Ban, 1);
        };
        for name in ["a", "b", "c", "a", "d"] {
            see(&mut t, name);
        }
        // b was the least recently seen when d came.
        let mut kept: Vec<String> = t.busiest(10).into_iter().map(|r| r.target).collect();
        kept.sort();
        assert_eq!(kept, ["a", "c", "d"]);
        see(&mut t, "c");
        see(&mut t, "e");
        let mut kept: Vec<String> = t.busiest(10).into_iter().map(|r| r.target).collect();
        kept.sort();
        assert_eq!(kept, ["c", "d", "e"]);
        // Forgetting for idleness keeps the order of the rest.
        tokio::time::advance(TARGET_IDLE).await;
        see(&mut t, "f");
        t.expire(&cfg, TARGET_IDLE, Instant::now());
        assert_eq!(t.len(), 1);
        see(&mut t, "g");
        see(&mut t, "h");
        see(&mut t, "i");
        let mut kept: Vec<String> = t.busiest(10).into_iter().map(|r| r.target).collect();
        kept.sort();
        assert_eq!(kept, ["g", "h", "i"]);
    }
}
