//! Every pool's probing status: shared between the prober (which writes it) and `/status`
//! (which reads it), held by the gateway.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::time::Instant;

use crate::upstream::UpstreamId;

/// What `/status` shows of a pool's probing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeStatus {
    /// This instance holds the pool's probe lock (with a shared store only one instance does).
    pub leader: bool,
    pub in_flight: usize,
    pub probes_total: u64,
    pub passed: u64,
    pub failed: u64,
    /// Failed probes not held against their upstream: a probe incident was going on.
    pub failed_unjudged: u64,
    pub reference_probes: u64,
    /// Every control target failed through every upstream tried; nothing is judged meanwhile.
    pub incident: Option<ProbeIncident>,
    pub last_probe_s_ago: Option<u64>,
    /// Answers of `exit_ip_url` (all zero without it).
    pub exit_ip: ExitIpCounts,
}

/// What the exit-IP checks after passing probes came to.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ExitIpCounts {
    /// An address was read and recorded as the member's exit IP.
    pub recorded: u64,
    /// The service answered something that is not one address (HTML, a host name, a list, an
    /// answer over 1 KiB): ignored, the member's last known exit IP kept.
    pub rejected: u64,
    /// No answer (connect, timeout, status other than 200).
    pub failed: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct ProbeIncident {
    pub since_s: u64,
    /// The last failure seen (credential-free).
    pub reason: String,
    #[serde(skip)]
    pub(crate) since: Instant,
}

/// Probing state of one pool, shared between the scheduling loop and the probe tasks.
#[derive(Default)]
pub(crate) struct PoolProbes {
    pub(crate) status: ProbeStatus,
    pub(crate) last_control_ok: Option<Instant>,
    pub(crate) last_probe: Option<Instant>,
    /// Upstreams whose probe finished since the loop last looked.
    pub(crate) finished: Vec<UpstreamId>,
}

/// Every pool's probing status, for `/status`.
#[derive(Default)]
pub struct Registry {
    pools: Mutex<HashMap<String, Arc<Mutex<PoolProbes>>>>,
}

impl Registry {
    pub(crate) fn pool(&self, name: &str) -> Arc<Mutex<PoolProbes>> {
        lock(&self.pools)
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// The pool's probe status, `None` when the pool does not probe.
    pub fn status(&self, pool: &str) -> Option<ProbeStatus> {
        let p = lock(&self.pools).get(pool)?.clone();
        let p = lock(&p);
        let now = Instant::now();
        let mut st = p.status.clone();
        if let Some(i) = &mut st.incident {
            i.since_s = now.duration_since(i.since).as_secs();
        }
        st.last_probe_s_ago = p.last_probe.map(|t| now.duration_since(t).as_secs());
        Some(st)
    }

    pub(crate) fn forget(&self, pool: &str) {
        lock(&self.pools).remove(pool);
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
