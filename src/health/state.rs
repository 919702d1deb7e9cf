//! The passive-health state machine of one upstream.
//!
//! `healthy → degraded → quarantined → half-open → healthy`, and `dead`. Going down takes few
//! signals, coming back takes more (hysteresis), so one error is noise and a flapping upstream
//! settles in `degraded` instead of bouncing. Every quarantine lasts `base × 2^(n−1)` (capped, with
//! jitter); `n` resets after a long enough healthy stretch, and repeated cycles at the cap make the
//! upstream `dead`.
//!
//! The machine is pure: it is fed samples and the time, and answers with the transition it made.
//! Guards that need the whole pool (the quarantine cap, the minimum in service) are the
//! caller's: it says beforehand whether the upstream may leave service, and a refused quarantine
//! keeps the upstream degraded ("held") and down-weighted instead.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::HealthConfig;

/// Named states, as shown in `/status` and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Healthy,
    /// Still in service, at a lower share of traffic.
    Degraded,
    /// Out of service for new allocations until its cool-down ends. Live sessions keep it.
    Quarantined,
    /// Back on probation with a small, growing share of traffic.
    HalfOpen,
    /// Failed too many cycles at the longest cool-down; restored only by an operator or a probe.
    Dead,
    /// Taken out of service by an operator: no new work, live leases and sessions finish.
    Drained,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Healthy => "healthy",
            State::Degraded => "degraded",
            State::Quarantined => "quarantined",
            State::HalfOpen => "half-open",
            State::Dead => "dead",
            State::Drained => "drained",
        }
    }
}

/// One exchange as health sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    Success,
    /// A fault of the proxy: connect error, timeout, reset, upstream 5xx/407.
    Fault,
    /// A ban: captcha or blocked.
    Ban,
}

/// A state change and why it happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
    pub reason: String,
}

/// The last samples, up to the window's size, with running counts: every observation asks for
/// the ratios, and counting them afresh each time made each exchange cost O(window).
#[derive(Clone, Debug, Default)]
struct Window {
    samples: VecDeque<Sample>,
    successes: usize,
    bans: usize,
}

impl Window {
    fn push(&mut self, sample: Sample, size: usize) {
        while self.samples.len() >= size.max(1) {
            let Some(old) = self.samples.pop_front() else {
                break;
            };
            if let Some(n) = self.counter(old) {
                *n -= 1;
            }
        }
        self.samples.push_back(sample);
        if let Some(n) = self.counter(sample) {
            *n += 1;
        }
    }

    /// The running count `sample` is kept in; faults are what the others leave.
    fn counter(&mut self, sample: Sample) -> Option<&mut usize> {
        match sample {
            Sample::Success => Some(&mut self.successes),
            Sample::Ban => Some(&mut self.bans),
            Sample::Fault => None,
        }
    }

    fn len(&self) -> usize {
        self.samples.len()
    }

    fn count(&self, s: Sample) -> usize {
        match s {
            Sample::Success => self.successes,
            Sample::Ban => self.bans,
            Sample::Fault => self.samples.len() - self.successes - self.bans,
        }
    }

    fn clear(&mut self) {
        *self = Window::default();
    }
}

#[derive(Clone, Debug)]
pub struct UpstreamHealth {
    state: State,
    since: Instant,
    reason: String,
    window: Window,
    consecutive_faults: u32,
    consecutive_successes: u32,
    /// Quarantines in the current run (resets after `cooldown_reset_after` healthy).
    cycle: u32,
    /// Consecutive quarantines whose cool-down hit the cap.
    cycles_at_cap: u32,
    quarantine_until: Option<Instant>,
    pub quarantines_total: u64,
    /// Kept degraded by a pool guard although its signals asked for quarantine.
    held: bool,
    /// Quarantined with its cool-down over, waiting for passing probes (pools with probes only).
    awaiting_probe: bool,
    /// Passing probes since the cool-down ended (or since the last failed probe of a dead one).
    probe_passes: u32,
    /// Taken out by an operator's removal: probes never bring it back, only a restore.
    removed: bool,
}

impl UpstreamHealth {
    pub fn new(now: Instant) -> Self {
        UpstreamHealth {
            state: State::Healthy,
            since: now,
            reason: "initial".to_string(),
            window: Window::default(),
            consecutive_faults: 0,
            consecutive_successes: 0,
            cycle: 0,
            cycles_at_cap: 0,
            quarantine_until: None,
            quarantines_total: 0,
            held: false,
            awaiting_probe: false,
            probe_passes: 0,
            removed: false,
        }
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn since(&self) -> Instant {
        self.since
    }

    pub fn reason(&self) -> &str {
        &self.reason
    }

    pub fn held(&self) -> bool {
        self.held
    }

    pub fn quarantine_until(&self) -> Option<Instant> {
        self.quarantine_until
    }

    /// Quarantined, its cool-down over, and waiting for probes to pass before half-open.
    pub fn awaiting_probe(&self) -> bool {
        self.awaiting_probe
    }

    /// Removed by an operator: only a restore brings it back, never a probe.
    pub fn removed(&self) -> bool {
        self.removed
    }

    /// Passing probes counted towards the return to half-open.
    pub fn probe_passes(&self) -> u32 {
        self.probe_passes
    }

    /// Successes over the window, once it holds `min_samples`.
    pub fn success_ratio(&self) -> Option<f64> {
        let n = self.window.len();
        (n > 0).then(|| self.count(Sample::Success) as f64 / n as f64)
    }

    pub fn ban_ratio(&self) -> Option<f64> {
        let n = self.window.len();
        (n > 0).then(|| self.count(Sample::Ban) as f64 / n as f64)
    }

    fn count(&self, s: Sample) -> usize {
        self.window.count(s)
    }

    /// Whether the upstream is failing by its recent window (for incident detection).
    pub fn is_failing(&self, cfg: &HealthConfig) -> bool {
        self.consecutive_faults >= cfg.quarantine_after_failures
            || (self.window.len() >= cfg.min_samples
                && self
                    .success_ratio()
                    .is_some_and(|r| r < cfg.quarantine_below_success))
    }

    /// Replaces the reason of the current state (the engine adds what the machine cannot know).
    pub(super) fn set_reason(&mut self, reason: &str) {
        self.reason = reason.to_string();
    }

    fn set(&mut self, to: State, reason: String, now: Instant) -> Transition {
        let from = self.state;
        self.state = to;
        self.since = now;
        self.reason = reason.clone();
        Transition { from, to, reason }
    }

    /// Feeds one sample; `jitter` in `[-1, 1]` spreads a cool-down that may start now. `guard`
    /// answers "may this upstream leave service now?" for the pool; it is asked only when the
    /// upstream would leave, since answering looks at every member.
    pub fn observe(
        &mut self,
        sample: Sample,
        cfg: &HealthConfig,
        now: Instant,
        jitter: f64,
        guard: impl FnOnce() -> Result<(), String>,
    ) -> Option<Transition> {
        // A long enough healthy stretch forgives earlier quarantines.
        if self.state == State::Healthy
            && now.duration_since(self.since) >= cfg.cooldown_reset_after
        {
            self.cycle = 0;
            self.cycles_at_cap = 0;
        }
        self.window.push(sample, cfg.window);
        match sample {
            Sample::Success => {
                self.consecutive_faults = 0;
                self.consecutive_successes += 1;
            }
            Sample::Fault | Sample::Ban => {
                self.consecutive_successes = 0;
                if sample == Sample::Fault {
                    self.consecutive_faults += 1;
                }
            }
        }
        match self.state {
            State::Quarantined | State::Dead | State::Drained => None,
            State::HalfOpen => match sample {
                Sample::Success if self.consecutive_successes >= cfg.half_open_successes => {
                    self.window.clear();
                    Some(self.set(
                        State::Healthy,
                        format!("{} successes in half-open", self.consecutive_successes),
                        now,
                    ))
                }
                Sample::Success => None,
                _ => Some(self.leave_service(
                    cfg,
                    now,
                    jitter,
                    "failed in half-open".to_string(),
                    guard(),
                )),
            },
            State::Healthy | State::Degraded => {
                if let Some(reason) = self.quarantine_reason(cfg) {
                    let verdict = guard();
                    if self.held && verdict.is_err() {
                        return None;
                    }
                    return Some(self.leave_service(cfg, now, jitter, reason, verdict));
                }
                if self.state == State::Healthy {
                    let reason = self.degrade_reason(cfg)?;
                    Some(self.set(State::Degraded, reason, now))
                } else if self.consecutive_successes >= cfg.recover_after_successes
                    && self.degrade_reason(cfg).is_none()
                {
                    self.held = false;
                    Some(self.set(
                        State::Healthy,
                        format!("{} consecutive successes", self.consecutive_successes),
                        now,
                    ))
                } else {
                    None
                }
            }
        }
    }

    fn quarantine_reason(&self, cfg: &HealthConfig) -> Option<String> {
        let n = self.window.len();
        if self.consecutive_faults >= cfg.quarantine_after_failures {
            return Some(format!("{} consecutive failures", self.consecutive_faults));
        }
        if n >= cfg.min_samples {
            if let Some(r) = self
                .success_ratio()
                .filter(|r| *r < cfg.quarantine_below_success)
            {
                return Some(format!("success ratio {r:.2} over the last {n}"));
            }
        }
        if n >= cfg.ban_min_samples {
            if let Some(r) = self.ban_ratio().filter(|r| *r >= cfg.ban_quarantine_ratio) {
                return Some(format!("captcha/block ratio {r:.2} over the last {n}"));
            }
        }
        None
    }

    fn degrade_reason(&self, cfg: &HealthConfig) -> Option<String> {
        let n = self.window.len();
        if self.consecutive_faults >= cfg.degrade_after_failures {
            return Some(format!("{} consecutive failures", self.consecutive_faults));
        }
        if n >= cfg.min_samples {
            if let Some(r) = self
                .success_ratio()
                .filter(|r| *r < cfg.degrade_below_success)
            {
                return Some(format!("success ratio {r:.2} over the last {n}"));
            }
        }
        None
    }

    /// The cool-down of the `cycle`-th consecutive quarantine, before jitter.
    pub fn cooldown(cfg: &HealthConfig, cycle: u32) -> Duration {
        let exp = cycle.saturating_sub(1).min(30);
        cfg.cooldown_base
            .saturating_mul(1u32 << exp)
            .min(cfg.cooldown_max)
    }

    /// Quarantines, unless the pool guard refuses: then the upstream stays in service, degraded
    /// and down-weighted ("held"), and is quarantined on its next failure once the guard allows.
    fn leave_service(
        &mut self,
        cfg: &HealthConfig,
        now: Instant,
        jitter: f64,
        reason: String,
        guard: Result<(), String>,
    ) -> Transition {
        match guard {
            Ok(()) => self.quarantine(cfg, now, jitter, reason),
            Err(why) => {
                self.held = true;
                self.set(
                    State::Degraded,
                    format!("{reason}; kept in service: {why}"),
                    now,
                )
            }
        }
    }

    fn quarantine(
        &mut self,
        cfg: &HealthConfig,
        now: Instant,
        jitter: f64,
        reason: String,
    ) -> Transition {
        self.cycle += 1;
        let base = Self::cooldown(cfg, self.cycle);
        if base >= cfg.cooldown_max {
            self.cycles_at_cap += 1;
        }
        self.consecutive_faults = 0;
        self.consecutive_successes = 0;
        self.held = false;
        self.awaiting_probe = false;
        self.probe_passes = 0;
        if self.cycles_at_cap > cfg.dead_after_cycles {
            self.quarantine_until = None;
            return self.set(
                State::Dead,
                format!(
                    "{reason}; {} cycles at the longest cool-down",
                    self.cycles_at_cap - 1
                ),
                now,
            );
        }
        // Jitter spreads returns so a pool that failed together does not come back together; it
        // never pushes a cool-down past the cap.
        let factor = 1.0 + cfg.cooldown_jitter * jitter.clamp(-1.0, 1.0);
        let cooldown = base.mul_f64(factor.max(0.0)).min(cfg.cooldown_max);
        self.quarantines_total += 1;
        self.quarantine_until = Some(now + cooldown);
        self.set(
            State::Quarantined,
            format!(
                "{reason}; cool-down {}",
                humantime::format_duration(round_ms(cooldown))
            ),
            now,
        )
    }

    /// Ends a quarantine whose cool-down is over: straight to half-open, or, when the pool
    /// probes (`probed`), to waiting for passing probes (still quarantined, so no client request
    /// is the first to find out whether it recovered).
    pub fn tick(&mut self, now: Instant, probed: bool) -> Option<Transition> {
        match (self.state, self.quarantine_until) {
            (State::Quarantined, Some(until)) if now >= until => {
                self.quarantine_until = None;
                self.window.clear();
                self.consecutive_successes = 0;
                if probed {
                    self.awaiting_probe = true;
                    self.probe_passes = 0;
                    self.reason = "cool-down over; waiting for passing probes".to_string();
                    return None;
                }
                Some(self.set(State::HalfOpen, "cool-down over".to_string(), now))
            }
            _ => None,
        }
    }

    /// A passing probe of a quarantined (cool-down over) or dead upstream; `needed` passes in a
    /// row return it to half-open. Other states take probes as ordinary samples (the engine's).
    pub fn probe_passed(&mut self, needed: u32, now: Instant) -> Option<Transition> {
        let waiting = (self.state == State::Quarantined && self.awaiting_probe)
            || self.state == State::Dead && !self.removed;
        if !waiting {
            return None;
        }
        self.probe_passes += 1;
        if self.probe_passes < needed {
            return None;
        }
        let from_dead = self.state == State::Dead;
        self.awaiting_probe = false;
        self.window.clear();
        self.consecutive_faults = 0;
        self.consecutive_successes = 0;
        let reason = format!(
            "{} passing probes{}",
            self.probe_passes,
            if from_dead { " after dead" } else { "" }
        );
        self.probe_passes = 0;
        Some(self.set(State::HalfOpen, reason, now))
    }

    /// A failed probe of a quarantined (cool-down over) upstream: a new quarantine, one cycle
    /// longer. A dead upstream stays dead and starts counting passes again.
    pub fn probe_failed(
        &mut self,
        cfg: &HealthConfig,
        now: Instant,
        jitter: f64,
        why: &str,
    ) -> Option<Transition> {
        match self.state {
            State::Quarantined if self.awaiting_probe => {
                Some(self.quarantine(cfg, now, jitter, format!("probe failed: {why}")))
            }
            State::Dead => {
                self.probe_passes = 0;
                None
            }
            _ => None,
        }
    }

    /// An operator's (or a passing probe's) restore: back to healthy with a clean slate.
    pub fn restore(&mut self, reason: &str, now: Instant) -> Option<Transition> {
        if self.state == State::Healthy {
            return None;
        }
        self.window.clear();
        self.consecutive_faults = 0;
        self.consecutive_successes = 0;
        self.quarantine_until = None;
        self.cycles_at_cap = 0;
        self.held = false;
        self.awaiting_probe = false;
        self.probe_passes = 0;
        self.removed = false;
        Some(self.set(State::Healthy, reason.to_string(), now))
    }

    /// An operator's quarantine for `duration`.
    /// An operator's drain: no new work until restored.
    pub fn drain(&mut self, now: Instant) -> Transition {
        self.quarantine_until = None;
        self.awaiting_probe = false;
        self.set(State::Drained, "drained by an operator".to_string(), now)
    }

    /// An operator's removal: out of service and its sessions end, until restored or reloaded.
    pub fn remove(&mut self, now: Instant) -> Transition {
        self.quarantine_until = None;
        self.awaiting_probe = false;
        self.removed = true;
        self.set(State::Dead, "removed by an operator".to_string(), now)
    }

    pub fn force_quarantine(&mut self, duration: Duration, now: Instant) -> Transition {
        self.quarantines_total += 1;
        self.awaiting_probe = false;
        self.probe_passes = 0;
        self.quarantine_until = Some(now + duration);
        self.set(
            State::Quarantined,
            "quarantined by an operator".to_string(),
            now,
        )
    }

    /// Follows a decision another instance made about this upstream (shared store): `to` is
    /// the state its member setting implies. A mirrored quarantine gets the longest cool-down
    /// the deciding instance could have drawn, so the decider always ends it first (and this
    /// instance ends it only if the decider died).
    pub fn mirror(&mut self, to: State, cfg: &HealthConfig, now: Instant) -> Option<Transition> {
        let out = |s: State| matches!(s, State::Quarantined | State::Dead | State::Drained);
        if to == self.state || (!out(to) && !out(self.state)) {
            return None;
        }
        self.window.clear();
        self.consecutive_faults = 0;
        self.consecutive_successes = 0;
        self.awaiting_probe = false;
        self.probe_passes = 0;
        self.held = false;
        self.quarantine_until = None;
        match to {
            State::Quarantined => {
                let next = Self::cooldown(cfg, self.cycle + 1);
                let longest = next
                    .mul_f64(1.0 + cfg.cooldown_jitter)
                    .min(cfg.cooldown_max);
                self.quarantine_until = Some(now + longest);
                Some(self.set(to, "quarantined by another instance".to_string(), now))
            }
            State::Dead => Some(self.set(to, "dead on another instance".to_string(), now)),
            _ => Some(self.set(
                State::HalfOpen,
                "returned to service by another instance".to_string(),
                now,
            )),
        }
    }

    /// How many successes in half-open so far (drives the growing share).
    pub fn half_open_progress(&self) -> u32 {
        if self.state == State::HalfOpen {
            self.consecutive_successes
        } else {
            0
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_its_counts_right_as_it_slides_shrinks_and_clears() {
        let mut w = Window::default();
        let mut naive: VecDeque<Sample> = VecDeque::new();
        let kinds = [Sample::Success, Sample::Fault, Sample::Ban];
        // A fixed pseudo-random sequence; the size shrinks from 7 to 3 halfway through.
        for i in 0..400usize {
            let size = if i < 200 { 7 } else { 3 };
            let sample = kinds[(i * 7 + i / 3) % 3];
            w.push(sample, size);
            naive.push_back(sample);
            while naive.len() > size {
                naive.pop_front();
            }
            assert_eq!(w.len(), naive.len());
            for k in kinds {
                assert_eq!(
                    w.count(k),
                    naive.iter().filter(|x| **x == k).count(),
                    "{i} {k:?}"
                );
            }
        }
        w.clear();
        assert_eq!(
            (w.len(), w.count(Sample::Success), w.count(Sample::Fault)),
            (0, 0, 0)
        );
    }

    fn cfg() -> HealthConfig {
        HealthConfig {
            cooldown_jitter: 0.0,
            ..HealthConfig::default()
        }
    }

    fn feed(
        h: &mut UpstreamHealth,
        c: &HealthConfig,
        s: Sample,
        n: usize,
        now: Instant,
    ) -> Vec<Transition> {
        (0..n)
            .filter_map(|_| h.observe(s, c, now, 0.0, || Ok(())))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn one_error_is_noise() {
        let c = cfg();
        let mut h = UpstreamHealth::new(Instant::now());
        let mut changes = Vec::new();
        for i in 0..50 {
            let s = if i == 25 {
                Sample::Fault
            } else {
                Sample::Success
            };
            changes.extend(h.observe(s, &c, Instant::now(), 0.0, || Ok(())));
        }
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(h.state(), State::Healthy);
    }

    #[tokio::test(start_paused = true)]
    async fn consecutive_failures_degrade_then_quarantine() {
        let c = cfg();
        let mut h = UpstreamHealth::new(Instant::now());
        let t = feed(&mut h, &c, Sample::Fault, 3, Instant::now());
        assert_eq!(
            t.iter().map(|t| t.to).collect::<Vec<_>>(),
            vec![State::Degraded, State::Quarantined]
        );
        assert!(
            t[1].reason.contains("3 consecutive failures"),
            "{}",
            t[1].reason
        );
    }

    #[tokio::test(start_paused = true)]
    async fn cooldown_doubles_caps_resets_and_ends_in_dead() {
        let c = cfg();
        let mut h = UpstreamHealth::new(Instant::now());
        let mut lengths = Vec::new();
        for _ in 0..12 {
            feed(&mut h, &c, Sample::Fault, 3, Instant::now());
            if h.state() == State::Dead {
                break;
            }
            assert_eq!(h.state(), State::Quarantined);
            let until = h.quarantine_until().unwrap();
            lengths.push(until - Instant::now());
            tokio::time::advance(until - Instant::now()).await;
            assert_eq!(h.tick(Instant::now(), false).unwrap().to, State::HalfOpen);
        }
        let base = c.cooldown_base;
        for (n, len) in lengths.iter().enumerate() {
            let expect = (base * 2u32.pow(n as u32)).min(c.cooldown_max);
            assert_eq!(*len, expect, "cycle {}", n + 1);
        }
        assert_eq!(h.state(), State::Dead);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_recovers_after_successes_and_healthy_stretch_resets_the_cycle() {
        let c = cfg();
        let mut h = UpstreamHealth::new(Instant::now());
        feed(&mut h, &c, Sample::Fault, 3, Instant::now());
        tokio::time::advance(c.cooldown_base).await;
        h.tick(Instant::now(), false);
        let t = feed(
            &mut h,
            &c,
            Sample::Success,
            c.half_open_successes as usize,
            Instant::now(),
        );
        assert_eq!(t.last().unwrap().to, State::Healthy);
        tokio::time::advance(c.cooldown_reset_after).await;
        feed(&mut h, &c, Sample::Success, 1, Instant::now());
        feed(&mut h, &c, Sample::Fault, 3, Instant::now());
        assert_eq!(
            h.quarantine_until().unwrap() - Instant::now(),
            c.cooldown_base,
            "cycle reset"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_in_band_and_under_the_cap() {
        let c = HealthConfig::default();
        for j in [-1.0, -0.3, 0.0, 0.5, 1.0] {
            let mut h = UpstreamHealth::new(Instant::now());
            for _ in 0..3 {
                h.observe(Sample::Fault, &c, Instant::now(), j, || Ok(()));
            }
            let len = h.quarantine_until().unwrap() - Instant::now();
            let lo = c.cooldown_base.mul_f64(1.0 - c.cooldown_jitter);
            let hi = c.cooldown_base.mul_f64(1.0 + c.cooldown_jitter);
            assert!(len >= lo && len <= hi, "{len:?} outside [{lo:?}, {hi:?}]");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn bans_quarantine_on_their_own_more_sensitive_threshold() {
        let c = cfg();
        let mut h = UpstreamHealth::new(Instant::now());
        let t = feed(&mut h, &c, Sample::Ban, c.ban_min_samples, Instant::now());
        assert_eq!(t.last().unwrap().to, State::Quarantined);
    }

    #[tokio::test(start_paused = true)]
    async fn flapping_settles_in_degraded() {
        let c = cfg();
        let mut h = UpstreamHealth::new(Instant::now());
        let mut changes = 0;
        for i in 0..1000 {
            let s = if i % 2 == 0 {
                Sample::Success
            } else {
                Sample::Fault
            };
            if h.observe(s, &c, Instant::now(), 0.0, || Ok(())).is_some() {
                changes += 1;
            }
        }
        assert!(changes <= 2, "{changes} state changes");
        assert_eq!(h.state(), State::Degraded);
    }
}
