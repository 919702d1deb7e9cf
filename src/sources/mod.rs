//! Upstream lists that change while the gateway runs: `upstreams_file` (re-read when it
//! changes) and `upstreams_url` (fetched every `upstreams_url_interval`).
//!
//! A listed upstream is a *candidate*. It joins the pool when it passes admission: its scheme is
//! one of `[pools.*.admission] schemes`, and — when the pool probes — a probe through it reaches
//! a control target with the expected answer within the latency ceiling. Without a probe
//! section (allowed for files only) a listed upstream joins on sight. A candidate that fails is
//! tried again after the probe's `dead_interval`, or as soon as its line changes.
//!
//! An upstream no longer listed leaves the pool the way a reload removes one: no new leases,
//! live ones finish, its sessions follow the session rules (502 `session-upstream-unavailable`,
//! or a rebind with `rebind_on_failure`). A malformed line is skipped with one warning naming
//! the line; a list that cannot be read or fetched keeps the members it gave before.
//!
//! With a shared store, a pool's `upstreams_url` is fetched and its candidates probed by one
//! instance at a time, the holder of the job lock `sources:<pool>`.

pub mod fetch;
pub mod list;
pub mod watch;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::config::SourcesConfig;
use crate::upstream::{Upstream, UpstreamId};

/// How often a list file's modification time and size are looked at.
pub const FILE_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What `/status` shows of a pool's upstream lists.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SourceStatus {
    /// This instance reads the lists and admits candidates (with a shared store only the holder
    /// of the pool's sources lock does; the others take the members it shares).
    pub leader: bool,
    /// The list file, as configured.
    pub file: Option<String>,
    /// The list URL without user info or query.
    pub url: Option<String>,
    /// Well-formed entries in the lists (inline upstreams not counted).
    pub listed: usize,
    /// Listed upstreams that passed admission and are members.
    pub admitted: usize,
    /// Candidates whose admission probe is under way.
    pub probing: usize,
    /// Candidates waiting for a free admission slot.
    pub pending: usize,
    /// Candidates refused (wrong scheme, failed probe, too slow).
    pub rejected: usize,
    /// Lines skipped as malformed at the last read of each list.
    pub skipped_lines: usize,
    pub fetches_ok: u64,
    pub fetches_failed: u64,
    /// Why the last fetch or read failed (cleared by a good one).
    pub last_error: Option<String>,
    /// The most recent rejections: upstream id and reason (credential-free).
    pub rejections: Vec<Rejection>,
}

impl SourceStatus {
    /// Which lists the pool reads, and whether this instance reads them.
    fn describe(&mut self, cfg: &SourcesConfig, leader: bool) {
        self.leader = leader;
        self.file = cfg.file.as_ref().map(|p| p.display().to_string());
        self.url = cfg.url.as_ref().map(fetch::redact);
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Rejection {
    pub upstream: String,
    pub reason: String,
}

/// Every pool's admitted list members and source status; read when pools are (re)built.
#[derive(Default)]
pub struct Registry {
    pools: Mutex<HashMap<String, PoolEntry>>,
}

#[derive(Default)]
struct PoolEntry {
    admitted: Vec<Upstream>,
    status: SourceStatus,
}

impl Registry {
    /// The members the pool's lists contribute, in list order.
    pub fn admitted(&self, pool: &str) -> Vec<Upstream> {
        lock(&self.pools)
            .get(pool)
            .map(|p| p.admitted.clone())
            .unwrap_or_default()
    }

    /// The pool's source status; `None` when it has no lists.
    pub fn status(&self, pool: &str) -> Option<SourceStatus> {
        lock(&self.pools).get(pool).map(|p| p.status.clone())
    }

    /// Replaces the pool's admitted members; true when they changed.
    fn set_admitted(&self, pool: &str, admitted: Vec<Upstream>) -> bool {
        let mut pools = lock(&self.pools);
        let entry = pools.entry(pool.to_string()).or_default();
        if entry.admitted == admitted {
            return false;
        }
        entry.admitted = admitted;
        true
    }

    fn update_status(&self, pool: &str, f: impl FnOnce(&mut SourceStatus)) {
        f(&mut lock(&self.pools)
            .entry(pool.to_string())
            .or_default()
            .status);
    }

    fn forget(&self, pool: &str) -> bool {
        lock(&self.pools)
            .remove(pool)
            .is_some_and(|p| !p.admitted.is_empty())
    }
}

impl Registry {
    /// Before the first request: the list files of pools that do not probe are read now, so
    /// their members serve from the start. (Pools that probe admit their candidates as the
    /// probes pass; the sources task warns about malformed lines when it reads the file.)
    pub fn preload(&self, config: &crate::config::Config) {
        for p in config.pools.values() {
            let (Some(path), None) = (&p.sources.file, &p.probe) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(path) else {
                continue;
            };
            let inline: HashSet<&UpstreamId> = p.upstreams.iter().map(|u| &u.id).collect();
            let admitted = list::parse(&text, "")
                .upstreams
                .into_iter()
                .filter(|u| {
                    !inline.contains(&u.id) && p.sources.admission.schemes.contains(&u.scheme)
                })
                .collect();
            self.set_admitted(&p.name, admitted);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
