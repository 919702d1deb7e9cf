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
//! Memory is bounded: at most `max_targets` targets are tracked, the least recently
//! seen forgotten first.

use std::collections::HashMap;

use serde::Serialize;
use tokio::time::Instant;

use crate::config::HealthConfig;
use crate::fast_map::FastMap;
use crate::health::state::Sample;
use crate::upstream::UpstreamId;

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
}

impl Cell {
    pub fn total(&self) -> u64 {
        self.ok + self.faults + self.bans
    }
}

#[derive(Debug)]
struct TargetStats {
    last_seen: Instant,
    cells: FastMap<UpstreamId, Cell>,
    incident_since: Option<Instant>,
    /// Upstreams this target's bans degraded or quarantined, with when: what an incident on the
    /// target gives back. At most one entry per upstream (the latest).
    blamed: Vec<(UpstreamId, Instant)>,
    /// Cells whose latest outcome was bad (recent ones: older ones are expired periodically).
    failing: usize,
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
}

impl Targets {
    /// Records `sample` of `upstream` on `target` and says whether the target's incident state
    /// changed. `about_target` is false for failures that cannot be the target's doing (the proxy
    /// itself was unreachable); they are counted but are no evidence of a target incident.
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
        members: usize,
        now: Instant,
    ) -> Option<TargetChange> {
        // One lookup for a target seen before (nearly every sample); a new one costs three.
        let stats = match self.by_target.get_mut(target) {
            Some(stats) => stats,
            None => {
                if self.by_target.len() >= cfg.max_targets {
                    self.evict_oldest();
                }
                self.by_target
                    .entry(target.to_string())
                    .or_insert_with(|| TargetStats {
                        last_seen: now,
                        cells: FastMap::default(),
                        incident_since: None,
                        blamed: Vec::new(),
                        failing: 0,
                    })
            }
        };
        stats.last_seen = now;
        let cell = match stats.cells.get_mut(upstream) {
            Some(c) => c,
            None => stats.cells.entry(upstream.clone()).or_default(),
        };
        match sample {
            Sample::Success => cell.ok += 1,
            Sample::Fault => cell.faults += 1,
            Sample::Ban => cell.bans += 1,
        }
        let bad = sample != Sample::Success && about_target;
        match (cell.last_bad, bad) {
            (false, true) => stats.failing += 1,
            (true, false) => stats.failing -= 1,
            _ => {}
        }
        cell.last_bad = bad;
        cell.last_at = Some(now);

        // Kept incrementally; `expire` stops counting cells older than the incident window.
        let failing = stats.failing;
        let share = failing as f64 / members.max(1) as f64;
        match stats.incident_since {
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
            _ => None,
        }
    }

    /// Remembers that a ban on `target` degraded or quarantined `upstream` now.
    pub fn blamed(&mut self, target: &str, upstream: &UpstreamId, now: Instant) {
        if let Some(t) = self.by_target.get_mut(target) {
            t.blamed.retain(|(id, _)| id != upstream);
            t.blamed.push((upstream.clone(), now));
        }
    }

    pub fn in_incident(&self, target: &str) -> bool {
        self.by_target
            .get(target)
            .is_some_and(|t| t.incident_since.is_some())
    }

    fn evict_oldest(&mut self) {
        if let Some(oldest) = self
            .by_target
            .iter()
            .min_by_key(|(_, t)| t.last_seen)
            .map(|(k, _)| k.clone())
        {
            self.by_target.remove(&oldest);
        }
    }

    /// Forgets targets not seen for `idle`, and stops counting failures older than the incident
    /// window (an incident with no recent evidence ends).
    pub fn expire(
        &mut self,
        cfg: &HealthConfig,
        idle: std::time::Duration,
        now: Instant,
    ) -> Vec<String> {
        self.by_target
            .retain(|_, t| now.duration_since(t.last_seen) < idle);
        let mut ended = Vec::new();
        for (name, t) in self.by_target.iter_mut() {
            for c in t.cells.values_mut() {
                if c.last_bad
                    && c.last_at
                        .is_some_and(|at| now.duration_since(at) > cfg.incident_window)
                {
                    c.last_bad = false;
                    t.failing -= 1;
                }
            }
            t.blamed
                .retain(|(_, at)| now.duration_since(*at) <= cfg.incident_window);
            if t.incident_since.is_some() && t.failing < cfg.target_incident_min_upstreams {
                t.incident_since = None;
                ended.push(name.clone());
            }
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
            if let Some(c) = t.record(
                &cfg,
                "shop.example",
                u,
                Sample::Ban,
                true,
                10,
                Instant::now(),
            ) {
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
            t.record(
                &cfg,
                "shop.example",
                u,
                Sample::Success,
                true,
                10,
                Instant::now(),
            );
        }
        assert!(!t.in_incident("shop.example"));
    }

    /// An incident gives back the upstreams the target's bans took out within
    /// `incident_window`, each once, and not those of longer ago.
    #[tokio::test(start_paused = true)]
    async fn an_incident_gives_back_what_its_bans_took_within_the_window() {
        let cfg = HealthConfig::default();
        let mut t = Targets::default();
        let ups = ids(10);
        let ban = |t: &mut Targets, u: &UpstreamId| {
            t.record(
                &cfg,
                "shop.example",
                u,
                Sample::Ban,
                true,
                10,
                Instant::now(),
            )
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
                    t.record(&cfg, "a.example", u, s, true, 10, Instant::now())
                        .is_none(),
                    "round {round}"
                );
            }
        }
        assert!(!t.in_incident("a.example"));
    }

    #[tokio::test(start_paused = true)]
    async fn tracked_targets_are_bounded() {
        let cfg = HealthConfig {
            max_targets: 50,
            ..HealthConfig::default()
        };
        let mut t = Targets::default();
        let u = UpstreamId::new("u");
        for i in 0..1000 {
            t.record(
                &cfg,
                &format!("t{i}.example"),
                &u,
                Sample::Success,
                true,
                1,
                Instant::now(),
            );
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
        }
        assert_eq!(t.len(), 50);
        assert_eq!(t.busiest(100).len(), 50);
    }
}
