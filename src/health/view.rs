//! What `/status` shows of a pool's health: per upstream, the incidents, and the upstream ×
//! target matrix. Plain data, built by [`crate::health::engine::PoolHealth::view`].

use std::collections::HashMap;

use serde::Serialize;

use crate::health::blame::Cell;
use crate::upstream::UpstreamId;

/// One upstream as `/status` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct UpstreamHealthView {
    pub state: &'static str,
    pub state_since_s: u64,
    pub state_reason: String,
    pub success_ratio: Option<f64>,
    pub captcha_ratio: Option<f64>,
    pub quarantines_total: u64,
    pub cooldown_remaining_ms: Option<u64>,
    /// Quarantined with the cool-down over, waiting for passing probes.
    pub awaiting_probe: bool,
    /// Passing probes counted so far towards half-open.
    pub probe_passes: u32,
    pub latency_ewma_ms: Option<f64>,
    pub latency_p50_ms: Option<f64>,
    pub latency_p95_ms: Option<f64>,
    pub allocation_cost: u32,
    /// The exit IP the prober last measured (`null` until known, or without `exit_ip_url`).
    pub exit_ip: Option<std::net::IpAddr>,
    /// Other members with the same exit IP: one identity to a target site, sharing its bans.
    pub shares_exit_ip_with: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TargetIncident {
    pub target: String,
    pub since_s: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct MatrixRow {
    pub target: String,
    pub incident: bool,
    /// Upstreams with a cell for this target; `cells` shows the busiest
    /// [`MATRIX_CELLS`](super::engine::MATRIX_CELLS) of them.
    pub cells_total: usize,
    pub cells: Vec<MatrixCell>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MatrixCell {
    pub upstream: String,
    #[serde(flatten)]
    pub counts: Cell,
    pub success_ratio: f64,
    pub captcha_ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct PoolHealthView {
    pub quarantine_cap: usize,
    pub quarantined: usize,
    pub counts_by_state: std::collections::BTreeMap<&'static str, usize>,
    pub global_incident: bool,
    pub target_incidents: Vec<TargetIncident>,
    pub targets_tracked: usize,
    /// Exit IPs that two members or more share.
    pub shared_exit_ips: usize,
    #[serde(skip)]
    pub upstreams: HashMap<UpstreamId, UpstreamHealthView>,
    pub matrix: Vec<MatrixRow>,
}
