//! The prober: one background task that decides, per pool, which upstreams to probe and when,
//! runs the probes (bounded in concurrency, paced so they never bunch up), and hands verdicts to
//! the pool's health.
//!
//! - Quarantined upstreams are probed once their cool-down is over; `successes` passes in a row
//!   send them to half-open, a failure re-quarantines them with a longer cool-down.
//! - Idle upstreams in service are probed every `interval` to `interval × (1 + jitter)`; dead
//!   ones every `dead_interval`; upstreams carrying traffic never (passive health sees them).
//! - A failed probe counts against its upstream only when the control targets are known to work:
//!   some probe passed within the last interval, or a reference probe through another upstream in
//!   service passes now. When none does, every control target fails through every upstream tried:
//!   that is a probe incident, reported in `/status`, and nothing is judged while it lasts.
//! - With `exit_ip_url`, every passing probe also asks it, through the same upstream, for the
//!   member's exit IP, and hands a valid answer to the pool's health, which groups members by
//!   it (a ban through one is a ban on the members with the same exit IP). Every passing probe
//!   rather than every Nth: a rotating exit changes its address, and the check is one small
//!   request next to the probe. An answer that is not exactly one address is counted and ignored.
//! - With a shared store, only the holder of the pool's job lock probes, so each upstream is
//!   probed once per interval across all instances; verdicts reach the others through the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::ProbeConfig;
use crate::health::engine::ProbePurpose;
use crate::health::{self, PoolHealth};
use crate::pool::Pool;
use crate::probe::status::{PoolProbes, lock};
pub use crate::probe::status::{ProbeIncident, ProbeStatus, Registry};
pub use crate::probe::{LiveRunner, Runner};
use crate::state::Gateway;
use crate::store::job_lock::JobLock;
use crate::upstream::{Upstream, UpstreamId};

/// Longest sleep of the scheduling loop: membership, leadership and states are re-read at least
/// this often.
const MAX_SLEEP: Duration = Duration::from_secs(1);
/// How long the probe lock of a pool lives without renewal; the loop renews it every second or so.
const LOCK_TTL: Duration = Duration::from_secs(10);
/// Idle probes are paced at this multiple of their mean rate, so they stay spread out.
const PACE_HEADROOM: f64 = 1.5;
/// In-service upstreams a failed probe is checked against before it counts.
const REFERENCE_PROBES: usize = 2;

/// One scheduled upstream.
struct Entry {
    purpose: ProbePurpose,
    due: Instant,
    in_flight: bool,
}

/// The scheduling state of one pool, owned by the loop.
struct Schedule {
    entries: HashMap<UpstreamId, Entry>,
    /// Earliest time the next paced probe may start.
    pace_next: Instant,
    lock: JobLock,
    semaphore: Arc<Semaphore>,
    concurrency: usize,
}

impl Schedule {
    fn new(pool: &str, concurrency: usize) -> Self {
        Schedule {
            entries: HashMap::new(),
            pace_next: Instant::now(),
            lock: JobLock::new(format!("probe:{pool}")),
            semaphore: Arc::new(Semaphore::new(concurrency)),
            concurrency,
        }
    }
}

/// Runs until shutdown: probes every pool that has a `[pools.*.probe]` section.
pub async fn run(gw: Arc<Gateway>, runner: Arc<dyn Runner>) {
    let mut schedules: HashMap<String, Schedule> = HashMap::new();
    loop {
        let mut wake = Instant::now() + MAX_SLEEP;
        let pools = gw.pools.load_full();
        let mut seen = Vec::new();
        for pool in pools.iter() {
            let Some(cfg) = pool.config.probe.clone() else {
                continue;
            };
            seen.push(pool.name().to_string());
            let cfg = Arc::new(cfg);
            let sched = schedules
                .entry(pool.name().to_string())
                .or_insert_with(|| Schedule::new(pool.name(), cfg.concurrency));
            if sched.concurrency != cfg.concurrency {
                // A reload changed the bound; probes in flight finish under the old one.
                let fresh = Schedule::new(pool.name(), cfg.concurrency);
                *sched = Schedule {
                    lock: std::mem::replace(&mut sched.lock, fresh.lock),
                    ..fresh
                };
            }
            let shared = gw.probes.pool(pool.name());
            // Renewed at most once per turn of this loop.
            if !sched.lock.lead(&*gw.store, LOCK_TTL, MAX_SLEEP).await {
                sched.entries.clear();
                lock(&shared).status.leader = false;
                continue;
            }
            lock(&shared).status.leader = true;
            if let Some(at) = sweep(&gw, pool, &cfg, sched, &shared, &runner) {
                wake = wake.min(at);
            }
        }
        // Pools that stopped probing (reload) let go of their lock and status.
        let gone: Vec<String> = schedules
            .keys()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for name in gone {
            if let Some(s) = schedules.remove(&name) {
                s.lock.release(&*gw.store).await;
            }
            gw.probes.forget(&name);
        }
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = gw.shutdown.cancelled() => break,
        }
    }
    for s in schedules.into_values() {
        s.lock.release(&*gw.store).await;
    }
}

/// Brings the pool's schedule up to date and starts the probes that are due; returns when the
/// loop should look again.
fn sweep(
    gw: &Arc<Gateway>,
    pool: &Arc<Pool>,
    cfg: &Arc<ProbeConfig>,
    sched: &mut Schedule,
    shared: &Arc<Mutex<PoolProbes>>,
    runner: &Arc<dyn Runner>,
) -> Option<Instant> {
    let now = Instant::now();
    // Probes that finished since the last turn free their entries for rescheduling.
    let finished = std::mem::take(&mut lock(shared).finished);
    for id in finished {
        if let Some(e) = sched.entries.get_mut(&id) {
            e.in_flight = false;
        }
    }
    let plan = pool.health.probe_plan(cfg.interval);
    let n = plan.len().max(1);
    let mean_gap = cfg.interval.mul_f64(1.0 + cfg.jitter / 2.0);
    let spacing = mean_gap.div_f64(n as f64 * PACE_HEADROOM);

    // Keep entries whose purpose holds; new ones get a phase.
    let planned: HashMap<&UpstreamId, ProbePurpose> = plan.iter().map(|(id, p)| (id, *p)).collect();
    sched
        .entries
        .retain(|id, e| e.in_flight || planned.get(id) == Some(&e.purpose));
    for (rank, (id, purpose)) in plan.iter().enumerate() {
        if sched.entries.contains_key(id) {
            continue;
        }
        let u = rand::random::<f64>();
        let due = match purpose {
            ProbePurpose::Recovery => now,
            // Stratified over the interval: never all at once, whatever the pool's size.
            ProbePurpose::Idle => now + cfg.interval.mul_f64((rank as f64 + u) / (n as f64 + 1.0)),
            ProbePurpose::Dead => now + cfg.dead_interval.mul_f64(u),
        };
        sched.entries.insert(
            id.clone(),
            Entry {
                purpose: *purpose,
                due,
                in_flight: false,
            },
        );
    }

    let mut due: Vec<(Instant, UpstreamId)> = sched
        .entries
        .iter()
        .filter(|(_, e)| !e.in_flight)
        .map(|(id, e)| (e.due, id.clone()))
        .collect();
    due.sort();
    let mut wake: Option<Instant> = None;
    let mut soon = |at: Instant| wake = Some(wake.map_or(at, |w| w.min(at)));
    for (at, id) in due {
        if at > now {
            soon(at);
            break;
        }
        let Some(purpose) = sched.entries.get(&id).map(|e| e.purpose) else {
            continue;
        };
        // Idle and dead probes are paced; a recovery is wanted as soon as the cool-down ends.
        let paced = purpose != ProbePurpose::Recovery;
        if paced && sched.pace_next > now {
            soon(sched.pace_next);
            continue;
        }
        let Ok(permit) = sched.semaphore.clone().try_acquire_owned() else {
            // Full: a finishing probe frees a slot by the next loop turn.
            break;
        };
        let Some(upstream) = pool.upstream(&id).cloned() else {
            sched.entries.remove(&id);
            continue;
        };
        let Some(entry) = sched.entries.get_mut(&id) else {
            continue;
        };
        entry.in_flight = true;
        // The next probe of this upstream, counted from this one's start.
        entry.due = now + next_gap(cfg, purpose);
        if paced {
            sched.pace_next = sched.pace_next.max(now) + spacing;
        }
        lock(shared).status.in_flight += 1;
        let task = ProbeTask {
            gw: gw.clone(),
            pool: pool.clone(),
            cfg: cfg.clone(),
            shared: shared.clone(),
            runner: runner.clone(),
        };
        gw.tasks.spawn(async move {
            task.run(upstream, purpose).await;
            drop(permit);
        });
    }
    wake
}

/// Spacing between two probes of one upstream for `purpose`.
fn next_gap(cfg: &ProbeConfig, purpose: ProbePurpose) -> Duration {
    let u = rand::random::<f64>();
    match purpose {
        // Passes in a row are wanted soon after one another, but not back to back.
        ProbePurpose::Recovery => cfg.interval.div_f64(10.0).max(Duration::from_millis(100)),
        ProbePurpose::Idle => cfg.interval.mul_f64(1.0 + cfg.jitter * u),
        ProbePurpose::Dead => cfg.dead_interval.mul_f64(1.0 + cfg.jitter * u),
    }
}

/// One probe and what follows from it.
struct ProbeTask {
    gw: Arc<Gateway>,
    pool: Arc<Pool>,
    cfg: Arc<ProbeConfig>,
    shared: Arc<Mutex<PoolProbes>>,
    runner: Arc<dyn Runner>,
}

impl ProbeTask {
    async fn run(&self, upstream: Arc<Upstream>, purpose: ProbePurpose) {
        self.judge(&upstream, purpose).await;
        let mut p = lock(&self.shared);
        p.status.in_flight = p.status.in_flight.saturating_sub(1);
        p.finished.push(upstream.id.clone());
    }

    async fn judge(&self, upstream: &Arc<Upstream>, purpose: ProbePurpose) {
        let result = self.runner.probe(upstream.clone(), self.cfg.clone()).await;
        let now = Instant::now();
        {
            let mut p = lock(&self.shared);
            p.status.probes_total += 1;
            p.last_probe = Some(now);
            match &result {
                Ok(_) => p.status.passed += 1,
                Err(_) => p.status.failed += 1,
            }
        }
        let verdict = match &result {
            Ok(_) => {
                self.control_ok(now);
                Ok(())
            }
            Err(why) => {
                if !self.control_works(&upstream.id).await {
                    self.incident(why);
                    lock(&self.shared).status.failed_unjudged += 1;
                    return;
                }
                Err(why.as_str())
            }
        };
        tracing::debug!(pool = self.pool.name(), upstream = %upstream.id, purpose = purpose.as_str(), passed = verdict.is_ok(), "probe");
        let changes = self
            .pool
            .health
            .probe_result(&upstream.id, verdict, self.cfg.successes);
        health::apply(&*self.gw.store, self.pool.name(), changes).await;
        if verdict.is_ok() && self.cfg.exit_ip.is_some() {
            self.measure_exit_ip(upstream).await;
        }
    }

    /// Asks `exit_ip_url` through `upstream` and records the answer when it is one address.
    async fn measure_exit_ip(&self, upstream: &Arc<Upstream>) {
        let result = self
            .runner
            .exit_ip(upstream.clone(), self.cfg.clone())
            .await;
        match result {
            Ok(ip) => {
                lock(&self.shared).status.exit_ip.recorded += 1;
                self.pool.health.set_exit_ip(&upstream.id, ip);
            }
            Err(e) if e.is_malformed() => {
                lock(&self.shared).status.exit_ip.rejected += 1;
                tracing::warn!(pool = self.pool.name(), upstream = %upstream.id, reason = %e, "exit IP answer ignored");
            }
            Err(e) => {
                lock(&self.shared).status.exit_ip.failed += 1;
                tracing::debug!(pool = self.pool.name(), upstream = %upstream.id, reason = %e, "exit IP check failed");
            }
        }
    }

    fn control_ok(&self, now: Instant) {
        let mut p = lock(&self.shared);
        p.last_control_ok = Some(now);
        if p.status.incident.take().is_some() {
            tracing::info!(
                pool = self.pool.name(),
                "probe incident over: a control target answers again"
            );
        }
    }

    /// Whether the control targets are known to answer: a probe passed within the interval, or
    /// a reference probe through another upstream in service passes now.
    async fn control_works(&self, failed: &UpstreamId) -> bool {
        let (recent, incident) = {
            let p = lock(&self.shared);
            let recent = p
                .last_control_ok
                .is_some_and(|t| t.elapsed() < self.cfg.interval);
            (recent, p.status.incident.is_some())
        };
        if recent {
            return true;
        }
        // During an incident, the next passing probe ends it; more reference probes would only
        // add load on whatever is down.
        if incident {
            return false;
        }
        let health: &PoolHealth = &self.pool.health;
        let references: Vec<Arc<Upstream>> = health
            .in_service()
            .into_iter()
            .filter(|id| id != failed)
            .filter_map(|id| self.pool.upstream(&id).cloned())
            .take(REFERENCE_PROBES)
            .collect();
        for r in references {
            lock(&self.shared).status.reference_probes += 1;
            if self.runner.probe(r, self.cfg.clone()).await.is_ok() {
                self.control_ok(Instant::now());
                return true;
            }
        }
        false
    }

    fn incident(&self, why: &str) {
        let mut p = lock(&self.shared);
        if p.status.incident.is_none() {
            tracing::warn!(
                pool = self.pool.name(),
                reason = why,
                "probe incident: every control target fails through every upstream tried; probe failures are not held against upstreams"
            );
            p.status.incident = Some(ProbeIncident {
                since_s: 0,
                reason: why.to_string(),
                since: Instant::now(),
            });
        } else if let Some(i) = &mut p.status.incident {
            i.reason = why.to_string();
        }
    }
}
