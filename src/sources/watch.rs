//! The task that follows every pool's upstream lists: reads files when they change, fetches
//! URLs on their interval (one instance per pool with a shared store, the holder of the
//! `sources:<pool>` lock), probes candidates and publishes the admitted members.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{FILE_POLL_INTERVAL, Rejection, fetch, list};
use crate::config::{PoolConfig, SourcesConfig};
use crate::probe::Runner;
use crate::state::Gateway;
use crate::store::Store;
use crate::store::job_lock::JobLock;
use crate::upstream::{Upstream, UpstreamId};

/// Bound on one fetch of `upstreams_url`.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);
/// After a failed fetch, the next try comes this soon (or at the interval, if sooner).
const FETCH_RETRY: Duration = Duration::from_secs(30);
/// How long the `sources:<pool>` lock lives without renewal; renewed on every loop turn.
const LOCK_TTL: Duration = Duration::from_secs(10);
/// Rejections shown in `/status` per pool (the most recent).
const MAX_REJECTIONS_SHOWN: usize = 20;
/// An instance that does not hold the sources lock re-reads the shared list this often, besides
/// when it is told of a change (events can be missed while a connection is down).
const FOLLOW_REFRESH: Duration = Duration::from_secs(30);

/// Where a listed upstream stands.
#[derive(Debug)]
enum Verdict {
    Probing(Upstream),
    Admitted(Upstream),
    Rejected {
        upstream: Upstream,
        /// When it may be probed again; `None` never (its line must change).
        retry_at: Option<Instant>,
    },
}

impl Verdict {
    fn upstream(&self) -> &Upstream {
        match self {
            Verdict::Probing(u) | Verdict::Admitted(u) => u,
            Verdict::Rejected { upstream, .. } => upstream,
        }
    }
}

/// The loop's state for one pool with lists.
struct Tracked {
    cfg: SourcesConfig,
    /// Modification time and size of the file when it was last read.
    file_stamp: Option<Stamp>,
    /// Modification time and size at the last poll, for a change to settle before it is read.
    file_seen: Option<Stamp>,
    /// The file was read once.
    file_read: bool,
    /// The file could not be read at the last look (said once, not at every poll).
    file_failing: bool,
    /// Lines skipped at the last read of each list, so a warning is not repeated.
    file_warned: HashSet<String>,
    url_warned: HashSet<String>,
    file_listed: Vec<Upstream>,
    url_listed: Vec<Upstream>,
    /// The URL was fetched once since this instance began reading the lists.
    url_fetched: bool,
    next_fetch: Instant,
    verdicts: HashMap<UpstreamId, Verdict>,
    rejections: Vec<Rejection>,
    lock: JobLock,
    /// This instance reads the lists (since it last followed another instance).
    leading: bool,
    /// The admitted members changed but the store has not taken them yet.
    unpublished: bool,
    /// When a follower next reads the shared list (`None`: now).
    follow_at: Option<Instant>,
}

impl Tracked {
    fn new(pool: &str, cfg: &SourcesConfig) -> Self {
        Tracked {
            cfg: cfg.clone(),
            file_stamp: None,
            file_seen: None,
            file_read: false,
            file_failing: false,
            file_warned: HashSet::new(),
            url_warned: HashSet::new(),
            file_listed: Vec::new(),
            url_listed: Vec::new(),
            url_fetched: false,
            next_fetch: Instant::now(),
            verdicts: HashMap::new(),
            rejections: Vec::new(),
            lock: JobLock::new(format!("sources:{pool}")),
            leading: false,
            unpublished: false,
            follow_at: None,
        }
    }

    fn reject(&mut self, upstream: Upstream, reason: String, retry_at: Option<Instant>) {
        self.rejections.push(Rejection {
            upstream: upstream.id.to_string(),
            reason,
        });
        if self.rejections.len() > MAX_REJECTIONS_SHOWN {
            self.rejections.remove(0);
        }
        self.verdicts.insert(
            upstream.id.clone(),
            Verdict::Rejected { upstream, retry_at },
        );
    }
}

/// The answer of one admission probe.
struct ProbeDone {
    pool: String,
    upstream: Upstream,
    result: Result<Duration, String>,
}

/// Runs until shutdown: keeps every pool's list members current.
pub async fn run(gw: Arc<Gateway>, runner: Arc<dyn Runner>) {
    let mut tracked: HashMap<String, Tracked> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<ProbeDone>();
    let mut shared_changes = gw.store.subscribe_listed_changes();
    loop {
        let mut changed = false;
        let pools = gw.pools.load_full();
        let mut seen = HashSet::new();
        for pool in pools.iter() {
            let cfg = &pool.config;
            if cfg.sources.is_empty() {
                continue;
            }
            seen.insert(cfg.name.clone());
            let t = tracked
                .entry(cfg.name.clone())
                .or_insert_with(|| Tracked::new(&cfg.name, &cfg.sources));
            if t.cfg != cfg.sources {
                // A reload pointed the pool at other lists: start over, keeping the verdicts
                // (an upstream still listed keeps its place).
                let mut fresh = Tracked::new(&cfg.name, &cfg.sources);
                fresh.verdicts = std::mem::take(&mut t.verdicts);
                std::mem::swap(&mut fresh.lock, &mut t.lock);
                *t = fresh;
            }
            changed |= turn(&gw, cfg, t, &runner, &done_tx).await;
        }
        // Pools that no longer have lists (or no longer exist) give back their members.
        let gone: Vec<String> = tracked
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for name in gone {
            if let Some(t) = tracked.remove(&name) {
                t.lock.release(&*gw.store).await;
            }
            changed |= gw.sources.forget(&name);
        }
        if changed {
            if let Err(e) = crate::reload::refresh_members(&gw).await {
                tracing::warn!(error = %e, "list members changed but the store could not be told; it is when it answers again");
            }
        }
        let now = Instant::now();
        let wake = tracked
            .values()
            .filter_map(|t| {
                // A retry already due waits for an admission slot: a finishing probe wakes the
                // loop, so it is no reason to wake now.
                let retry = t.verdicts.values().filter_map(|v| match v {
                    Verdict::Rejected { retry_at, .. } => retry_at.filter(|at| *at > now),
                    _ => None,
                });
                // Only the lock holder fetches; the others look again at the next poll.
                let fetch = (t.cfg.url.is_some() && t.lock.held()).then_some(t.next_fetch);
                let follow = (!t.lock.held()).then_some(t.follow_at).flatten();
                retry.chain(fetch).chain(follow).min()
            })
            .fold(now + FILE_POLL_INTERVAL, Instant::min);
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            Some(done) = done_rx.recv() => {
                let mut batch = vec![done];
                while let Ok(more) = done_rx.try_recv() {
                    batch.push(more);
                }
                for d in batch {
                    judged(&gw, &mut tracked, d);
                }
            }
            changed = shared_changes.recv() => match changed {
                Ok(pool) => {
                    if let Some(t) = tracked.get_mut(&pool) {
                        t.follow_at = None;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    for t in tracked.values_mut() {
                        t.follow_at = None;
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    shared_changes = gw.store.subscribe_listed_changes();
                }
            },
            _ = gw.shutdown.cancelled() => break,
        }
    }
    for t in tracked.into_values() {
        t.lock.release(&*gw.store).await;
    }
}

/// One look at a pool's lists: re-read what changed, start admission probes for new
/// candidates, drop what is no longer listed. True when the pool's admitted members changed.
async fn turn(
    gw: &Arc<Gateway>,
    cfg: &PoolConfig,
    t: &mut Tracked,
    runner: &Arc<dyn Runner>,
    done: &mpsc::UnboundedSender<ProbeDone>,
) -> bool {
    let name = cfg.name.as_str();
    // The lock is renewed every turn, so its holder keeps it and another instance takes over
    // within LOCK_TTL of its death.
    if !t.lock.lead(&*gw.store, LOCK_TTL, Duration::ZERO).await {
        return follow(gw, cfg, t).await;
    }
    let mut seeded = false;
    if !t.leading {
        t.leading = true;
        seeded = seed(gw, cfg, t).await;
    }
    if let Some(path) = cfg.sources.file.clone() {
        read_file(gw, name, &path, t).await;
    }
    if let Some(url) = cfg.sources.url.clone() {
        if Instant::now() >= t.next_fetch {
            fetch_url(gw, name, &url, cfg.sources.url_interval, t).await;
        }
    }

    // A list not read yet (its first fetch failed, the file is still settling) stands for the
    // members the lists gave before, so nothing leaves the pool for want of a read.
    let before = gw.sources.admitted(name);
    let unread = |configured: bool, read: bool| configured && !read;
    let file_part = match unread(cfg.sources.file.is_some(), t.file_read) {
        true => &before,
        false => &t.file_listed,
    };
    let url_part = match unread(cfg.sources.url.is_some(), t.url_fetched) {
        true => &before,
        false => &t.url_listed,
    };
    let inline: HashSet<&UpstreamId> = cfg.upstreams.iter().map(|u| &u.id).collect();
    let mut listed: Vec<Upstream> = Vec::new();
    let mut ids = HashSet::new();
    for u in file_part.iter().chain(url_part) {
        if !inline.contains(&u.id) && ids.insert(u.id.clone()) {
            listed.push(u.clone());
        }
    }

    // Verdicts of upstreams no longer listed, or listed differently (new credentials), go.
    let listed_by_id: HashMap<&UpstreamId, &Upstream> = listed.iter().map(|u| (&u.id, u)).collect();
    t.verdicts.retain(|id, v| {
        let keep = listed_by_id.get(id).is_some_and(|u| *u == v.upstream());
        if !keep && matches!(v, Verdict::Admitted(_)) {
            tracing::info!(pool = name, upstream = %id, "upstream leaves the pool: no longer listed (live leases finish)");
        }
        keep
    });

    let now = Instant::now();
    // Candidates beyond the admission concurrency wait for a free slot (a finishing probe
    // wakes the loop), so a long list never holds more than that many probes or tasks.
    let mut in_flight = t
        .verdicts
        .values()
        .filter(|v| matches!(v, Verdict::Probing(_)))
        .count();
    for u in &listed {
        let retry_due = match t.verdicts.get(&u.id) {
            None => true,
            Some(Verdict::Rejected {
                retry_at: Some(at), ..
            }) => *at <= now,
            Some(_) => false,
        };
        if !retry_due {
            continue;
        }
        if !cfg.sources.admission.schemes.contains(&u.scheme) {
            let reason = format!(
                "scheme {} is not admitted (pools.{name}.admission.schemes)",
                u.scheme.as_str()
            );
            tracing::warn!(pool = name, upstream = %u.id, reason, "candidate refused");
            t.reject(u.clone(), reason, None);
            continue;
        }
        match &cfg.probe {
            None => {
                tracing::info!(pool = name, upstream = %u.id, "upstream joins the pool from its list (the pool does not probe)");
                t.verdicts
                    .insert(u.id.clone(), Verdict::Admitted(u.clone()));
            }
            Some(_) if in_flight >= cfg.sources.admission.concurrency => {}
            Some(probe) => {
                in_flight += 1;
                t.verdicts.insert(u.id.clone(), Verdict::Probing(u.clone()));
                let probe = Arc::new(probe.clone());
                let (runner, done) = (runner.clone(), done.clone());
                let (pool, upstream) = (name.to_string(), u.clone());
                let shutdown = gw.shutdown.clone();
                gw.tasks.spawn(async move {
                    let result = tokio::select! {
                        r = runner.probe(Arc::new(upstream.clone()), probe) => r,
                        _ = shutdown.cancelled() => return,
                    };
                    let _ = done.send(ProbeDone {
                        pool,
                        upstream,
                        result,
                    });
                });
            }
        }
    }
    let changed = publish(gw, name, t, &listed) || seeded;
    if changed || t.unpublished {
        let text: Vec<String> = gw
            .sources
            .admitted(name)
            .iter()
            .map(Upstream::to_list_line)
            .collect();
        t.unpublished = gw.store.put_listed(name, &text.join("\n")).await.is_err();
    }
    changed
}

/// An instance that starts reading the lists starts from the members the previous reader shared
/// (or, when the store cannot say, from the members it has): they passed admission already, and
/// they stay until this instance's own read of the lists says otherwise.
async fn seed(gw: &Gateway, cfg: &PoolConfig, t: &mut Tracked) -> bool {
    let shared = match gw.store.listed(&cfg.name).await {
        Ok(Some(text)) => list::parse(&text, "the shared list").upstreams,
        _ => gw.sources.admitted(&cfg.name),
    };
    if shared.is_empty() {
        return false;
    }
    for u in &shared {
        t.verdicts
            .entry(u.id.clone())
            .or_insert_with(|| Verdict::Admitted(u.clone()));
    }
    tracing::info!(pool = %cfg.name, members = shared.len(), "this instance reads the pool's upstream lists, starting from the members it knows");
    gw.sources.set_admitted(&cfg.name, shared)
}

/// Another instance holds the sources lock: take the members it shares.
async fn follow(gw: &Gateway, cfg: &PoolConfig, t: &mut Tracked) -> bool {
    let now = Instant::now();
    if t.follow_at.is_some_and(|at| at > now) {
        return false;
    }
    t.follow_at = Some(now + FOLLOW_REFRESH);
    // Should this instance lead later, it starts over from what is shared then.
    if std::mem::take(&mut t.leading) {
        tracing::info!(pool = %cfg.name, "another instance reads the pool's upstream lists now; taking the members it shares");
    }
    t.verdicts.clear();
    (t.file_stamp, t.file_read, t.url_fetched, t.next_fetch) = (None, false, false, now);
    let Ok(Some(text)) = gw.store.listed(&cfg.name).await else {
        return false;
    };
    let inline: HashSet<&UpstreamId> = cfg.upstreams.iter().map(|u| &u.id).collect();
    let shared: Vec<Upstream> = list::parse(&text, "the shared list")
        .upstreams
        .into_iter()
        .filter(|u| !inline.contains(&u.id))
        .collect();
    let n = shared.len();
    gw.sources.update_status(&cfg.name, |s| {
        s.describe(&cfg.sources, false);
        s.listed = n;
        s.admitted = n;
        s.probing = 0;
        s.pending = 0;
    });
    gw.sources.set_admitted(&cfg.name, shared)
}

/// Applies one admission probe's answer.
fn judged(gw: &Gateway, tracked: &mut HashMap<String, Tracked>, d: ProbeDone) {
    let Some(t) = tracked.get_mut(&d.pool) else {
        return;
    };
    // Only the probe of the upstream as it is still listed counts.
    if !matches!(t.verdicts.get(&d.upstream.id), Some(Verdict::Probing(u)) if *u == d.upstream) {
        return;
    }
    let pools = gw.pools.load();
    let Ok(pool) = pools.get(Some(&d.pool)) else {
        return;
    };
    let ceiling = pool.config.sources.admission.max_latency;
    let retry_at = pool
        .config
        .probe
        .as_ref()
        .map(|p| Instant::now() + p.dead_interval);
    let id = d.upstream.id.clone();
    match d.result {
        Ok(took) if ceiling.is_none_or(|c| took <= c) => {
            tracing::info!(pool = %d.pool, upstream = %id, latency_ms = took.as_millis() as u64, "candidate admitted: its probe passed");
            t.verdicts.insert(id, Verdict::Admitted(d.upstream));
        }
        Ok(took) => {
            let reason = format!(
                "probe answered in {} ms, over the admission ceiling of {} ms",
                took.as_millis(),
                ceiling.map_or(0, |c| c.as_millis())
            );
            tracing::info!(pool = %d.pool, upstream = %id, reason, "candidate refused");
            t.reject(d.upstream, reason, retry_at);
        }
        Err(why) => {
            let reason = format!("probe failed: {why}");
            tracing::info!(pool = %d.pool, upstream = %id, reason, "candidate refused");
            t.reject(d.upstream, reason, retry_at);
        }
    }
}

/// Writes the pool's admitted members and status to the registry; true when members changed.
fn publish(gw: &Gateway, pool: &str, t: &Tracked, listed: &[Upstream]) -> bool {
    let admitted: Vec<Upstream> = listed
        .iter()
        .filter(|u| matches!(t.verdicts.get(&u.id), Some(Verdict::Admitted(_))))
        .cloned()
        .collect();
    let count = |f: fn(&Verdict) -> bool| t.verdicts.values().filter(|v| f(v)).count();
    let probing = count(|v| matches!(v, Verdict::Probing(_)));
    let rejected = count(|v| matches!(v, Verdict::Rejected { .. }));
    let pending = listed.len().saturating_sub(t.verdicts.len());
    let n_admitted = admitted.len();
    let rejections = t.rejections.clone();
    gw.sources.update_status(pool, |s| {
        s.describe(&t.cfg, true);
        s.listed = listed.len();
        s.admitted = n_admitted;
        s.probing = probing;
        s.pending = pending;
        s.rejected = rejected;
        s.rejections = rejections;
    });
    gw.sources.set_admitted(pool, admitted)
}

/// Re-reads the list file once a change has settled: its modification time and size must be
/// the same at two polls in a row, so a file caught half-written (an editor's save, a copy) is
/// not read as a shorter list whose missing members would leave the pool.
async fn read_file(gw: &Gateway, pool: &str, path: &std::path::Path, t: &mut Tracked) {
    // Unsettled content can be read at once only when it can remove nothing: the first read
    // of a pool that has no list members yet (a pool that does not probe has them from the
    // start, read before the listener opened).
    let first = !t.file_read && gw.sources.admitted(pool).is_empty();
    let (stamp, seen) = (t.file_stamp, t.file_seen);
    let read = async {
        let m = tokio::fs::metadata(path).await?;
        let now = (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len());
        if !settled(stamp, seen, now, first) {
            return Ok(Err(now));
        }
        Ok::<_, std::io::Error>(Ok((now, tokio::fs::read_to_string(path).await?)))
    };
    match read.await {
        Ok(Err(now)) => t.file_seen = Some(now),
        Ok(Ok((now, text))) => {
            (t.file_stamp, t.file_seen, t.file_read) = (Some(now), Some(now), true);
            t.file_failing = false;
            let origin = path.display().to_string();
            t.file_listed = take_list(gw, pool, &text, &origin, &mut t.file_warned);
        }
        // Said once per spell of failures, not every poll.
        Err(e) if !t.file_failing => {
            t.file_failing = true;
            t.file_stamp = None;
            list_failed(gw, pool, format!("cannot read {}: {e}", path.display()));
        }
        Err(_) => {}
    }
}

/// A file's modification time and size.
type Stamp = (SystemTime, u64);

/// Whether a file whose stamp is `now` is to be read: it changed since it was `read`, and the
/// change has settled (the previous poll `seen` the same stamp) unless reading it `first` can
/// remove nothing.
fn settled(read: Option<Stamp>, seen: Option<Stamp>, now: Stamp, first: bool) -> bool {
    read != Some(now) && (first || seen == Some(now))
}

/// Fetches the list URL; on failure the members it gave before stay.
async fn fetch_url(gw: &Gateway, pool: &str, url: &http::Uri, interval: Duration, t: &mut Tracked) {
    let shown = fetch::redact(url);
    let fetched = fetch::fetch(url, gw.connector.tls(), FETCH_TIMEOUT).await;
    let ok = fetched.is_ok();
    gw.sources.update_status(pool, |s| {
        if ok {
            s.fetches_ok += 1;
        } else {
            s.fetches_failed += 1;
        }
    });
    match fetched {
        Ok(text) => {
            t.next_fetch = Instant::now() + interval;
            t.url_listed = take_list(gw, pool, &text, &shown, &mut t.url_warned);
            t.url_fetched = true;
        }
        Err(e) => {
            t.next_fetch = Instant::now() + interval.min(FETCH_RETRY);
            list_failed(gw, pool, format!("fetching {shown} failed: {e}"));
        }
    }
}

/// Parses a list just read or fetched, warning about each skipped line once (`warned` holds
/// the lines skipped at the previous read).
fn take_list(
    gw: &Gateway,
    pool: &str,
    text: &str,
    origin: &str,
    warned: &mut HashSet<String>,
) -> Vec<Upstream> {
    let listed = list::parse(text, origin);
    for why in &listed.skipped {
        if !warned.contains(why) {
            tracing::warn!(pool, line = why.as_str(), "upstream list line skipped");
        }
    }
    *warned = listed.skipped.iter().cloned().collect();
    let skipped = listed.skipped.len();
    gw.sources.update_status(pool, |s| {
        s.skipped_lines = skipped;
        s.last_error = None;
    });
    listed.upstreams
}

/// A list that could not be read or fetched: its members stay as they were.
fn list_failed(gw: &Gateway, pool: &str, why: String) {
    tracing::warn!(
        pool,
        error = why,
        "upstream list not read; its members stay as they were"
    );
    gw.sources.update_status(pool, |s| s.last_error = Some(why));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_change_is_read_once_it_has_settled() {
        let at = |s: u64, len: u64| (SystemTime::UNIX_EPOCH + Duration::from_secs(s), len);
        let (old, half, whole) = (at(1, 300), at(2, 120), at(2, 310));
        // The first read needs no settling.
        assert!(settled(None, None, old, true));
        // Unchanged: nothing to read.
        assert!(!settled(Some(old), Some(old), old, false));
        // Caught half-written: wait; written on: still wait; then read what has settled.
        assert!(!settled(Some(old), Some(old), half, false));
        assert!(!settled(Some(old), Some(half), whole, false));
        assert!(settled(Some(old), Some(whole), whole, false));
        // After a failed read (no stamp), a settled file is read again.
        assert!(settled(None, Some(old), old, false));
    }
}
