//! `[pools.<name>.health]`: passive-health thresholds.

use std::time::Duration;

use super::file::FileHealth;
use super::validate::Validator;

/// Passive-health thresholds of one pool. Defaults: one error is noise, three in a row or a
/// success ratio under one half is a fault, and bans (captcha/blocked) trip earlier at 30% of five.
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// Outcomes remembered per upstream for ratios.
    pub window: usize,
    /// Ratios count only once the window holds this many outcomes.
    pub min_samples: usize,
    pub degrade_after_failures: u32,
    pub quarantine_after_failures: u32,
    pub degrade_below_success: f64,
    pub quarantine_below_success: f64,
    /// Share of captcha/blocked outcomes that quarantines (the more sensitive threshold).
    pub ban_quarantine_ratio: f64,
    pub ban_min_samples: usize,
    /// Consecutive successes that bring a degraded upstream back to healthy.
    pub recover_after_successes: u32,
    /// Consecutive successes in half-open that make the upstream healthy again.
    pub half_open_successes: u32,
    pub cooldown_base: Duration,
    pub cooldown_max: Duration,
    /// ± share of a cool-down added at random.
    pub cooldown_jitter: f64,
    /// A healthy stretch this long resets the cool-down doubling.
    pub cooldown_reset_after: Duration,
    /// Quarantines at the longest cool-down before the upstream is declared dead.
    pub dead_after_cycles: u32,
    pub max_quarantined_percent: u32,
    pub min_in_service: usize,
    /// Share of the pool's upstreams that must be failing on a target for a target incident.
    pub target_incident_ratio: f64,
    pub target_incident_min_upstreams: usize,
    /// How recent an outcome must be to count towards an incident.
    pub incident_window: Duration,
    /// Share of active upstreams failing at once that makes a global (local network) incident.
    pub global_incident_ratio: f64,
    /// Targets tracked per pool; the least recently seen are forgotten first.
    pub max_targets: usize,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            window: 20,
            min_samples: 10,
            degrade_after_failures: 2,
            quarantine_after_failures: 3,
            degrade_below_success: 0.8,
            quarantine_below_success: 0.5,
            ban_quarantine_ratio: 0.3,
            ban_min_samples: 5,
            recover_after_successes: 5,
            half_open_successes: 5,
            cooldown_base: Duration::from_secs(30),
            cooldown_max: Duration::from_secs(30 * 60),
            cooldown_jitter: 0.2,
            cooldown_reset_after: Duration::from_secs(10 * 60),
            dead_after_cycles: 3,
            max_quarantined_percent: 30,
            min_in_service: 1,
            target_incident_ratio: 0.75,
            target_incident_min_upstreams: 3,
            incident_window: Duration::from_secs(60),
            global_incident_ratio: 0.8,
            max_targets: 1000,
        }
    }
}

impl Validator {
    pub(super) fn health(&mut self, prefix: &str, h: FileHealth) -> HealthConfig {
        let d = HealthConfig::default();
        let k = |name: &str| format!("{prefix}.{name}");
        let c = HealthConfig {
            window: self.positive(&k("window"), h.window, d.window),
            min_samples: self.positive(&k("min_samples"), h.min_samples, d.min_samples),
            degrade_after_failures: self.positive(
                &k("degrade_after_failures"),
                h.degrade_after_failures,
                d.degrade_after_failures,
            ),
            quarantine_after_failures: self.positive(
                &k("quarantine_after_failures"),
                h.quarantine_after_failures,
                d.quarantine_after_failures,
            ),
            degrade_below_success: self.ratio(
                &k("degrade_below_success"),
                h.degrade_below_success,
                d.degrade_below_success,
            ),
            quarantine_below_success: self.ratio(
                &k("quarantine_below_success"),
                h.quarantine_below_success,
                d.quarantine_below_success,
            ),
            ban_quarantine_ratio: self.ratio(
                &k("ban_quarantine_ratio"),
                h.ban_quarantine_ratio,
                d.ban_quarantine_ratio,
            ),
            ban_min_samples: self.positive(
                &k("ban_min_samples"),
                h.ban_min_samples,
                d.ban_min_samples,
            ),
            recover_after_successes: self.positive(
                &k("recover_after_successes"),
                h.recover_after_successes,
                d.recover_after_successes,
            ),
            half_open_successes: self.positive(
                &k("half_open_successes"),
                h.half_open_successes,
                d.half_open_successes,
            ),
            cooldown_base: self.duration(
                &k("cooldown_base"),
                h.cooldown_base.as_deref(),
                d.cooldown_base.as_millis() as u64,
            ),
            cooldown_max: self.duration(
                &k("cooldown_max"),
                h.cooldown_max.as_deref(),
                d.cooldown_max.as_millis() as u64,
            ),
            cooldown_jitter: self.ratio(
                &k("cooldown_jitter"),
                h.cooldown_jitter,
                d.cooldown_jitter,
            ),
            cooldown_reset_after: self.duration(
                &k("cooldown_reset_after"),
                h.cooldown_reset_after.as_deref(),
                d.cooldown_reset_after.as_millis() as u64,
            ),
            dead_after_cycles: h.dead_after_cycles.unwrap_or(d.dead_after_cycles),
            max_quarantined_percent: h
                .max_quarantined_percent
                .unwrap_or(d.max_quarantined_percent),
            min_in_service: h.min_in_service.unwrap_or(d.min_in_service),
            target_incident_ratio: self.ratio(
                &k("target_incident_ratio"),
                h.target_incident_ratio,
                d.target_incident_ratio,
            ),
            target_incident_min_upstreams: self.positive(
                &k("target_incident_min_upstreams"),
                h.target_incident_min_upstreams,
                d.target_incident_min_upstreams,
            ),
            incident_window: self.duration(
                &k("incident_window"),
                h.incident_window.as_deref(),
                d.incident_window.as_millis() as u64,
            ),
            global_incident_ratio: self.ratio(
                &k("global_incident_ratio"),
                h.global_incident_ratio,
                d.global_incident_ratio,
            ),
            max_targets: self.positive(&k("max_targets"), h.max_targets, d.max_targets),
        };
        if c.max_quarantined_percent > 100 {
            self.problem(&k("max_quarantined_percent"), "must be between 0 and 100");
        }
        if c.cooldown_max < c.cooldown_base {
            self.problem(&k("cooldown_max"), "must be at least cooldown_base");
        }
        if c.quarantine_after_failures < c.degrade_after_failures {
            self.problem(
                &k("quarantine_after_failures"),
                "must be at least degrade_after_failures",
            );
        }
        if c.quarantine_below_success > c.degrade_below_success {
            self.problem(
                &k("quarantine_below_success"),
                "must not exceed degrade_below_success",
            );
        }
        if c.min_samples > c.window || c.ban_min_samples > c.window {
            self.problem(
                &k("min_samples"),
                "min_samples and ban_min_samples must not exceed window",
            );
        }
        c
    }
}
