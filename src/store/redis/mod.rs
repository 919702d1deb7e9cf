//! The shared store: one pool state in Redis for every gateway instance.
//!
//! Every decision is one Lua script of `lua/` run atomically on the server (see `scripts.rs`), so
//! instances never double-book an upstream or disagree about a session. A request costs at most
//! two commands: `acquire.lua` before connecting and `release.lua` after the exchange (off the
//! response path); in a pool without a cap only the first, as its leases are unlisted (see
//! `held.rs`). Under load, the acquires (and the releases) that queue up while the previous
//! call is under way share the next call (see `batch.rs`). Instances hear of each other through
//! one pub/sub channel per pool (see `events.rs`): releases that free capacity wake waiting
//! requests everywhere, and member settings decided elsewhere reach
//! [`Store::subscribe_member_changes`]. An idle instance sends nothing but a PING on its events
//! connection every 30 s.
//!
//! # When Redis is unreachable
//! Every call is bounded by `[store] timeout`. The first failure switches the instance to
//! *degraded*: it serves from an embedded [`MemoryStore`] configured with the same pools (caps and
//! session bindings then hold per instance, not globally), keeps the writes Redis missed (lease
//! releases, member settings, unbinds) in a bounded backlog, and reconnects in the background with
//! backoff. Once Redis answers, the backlog is replayed (after re-declaring the pools, and
//! re-applying every member setting of this instance if Redis lost its data), and the instance is
//! `ok` again. Sessions re-derive the same upstream by consistent hashing either way.
//!
//! # Clocks
//! Lease deadlines are written with this machine's wall clock (scripts take the time as an
//! argument), so instances sharing a pool need synchronised clocks (NTP); a skew of `d` moves
//! another instance's lease expiry by `d`.

mod batch;
mod conn;
mod events;
mod held;
mod keys;
mod locks;
mod members;
mod scripts;
mod sessions;
mod stats;
mod status;
mod stock;

pub use crate::store_url::{DEFAULT_KEY_PREFIX, DEFAULT_TIMEOUT_MS, Target, parse_target, redact};

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use redis::RedisError;
use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

use super::memory::MemoryStore;
use super::{
    Acquired, Grant, HEALTH_DEGRADED, HEALTH_OK, LeaseId, LockToken, MemberChange, MemberState,
    PoolSpec, PoolStatus, Store, StoreError, Want,
};
use crate::config::Strategy;
use crate::health::Outcome;
use crate::upstream::UpstreamId;
use batch::Batcher;
use conn::{Backlog, Deferred, Remote, client_name};
use keys::PoolKeys;
use scripts::{AcquireReply, Call};

/// Bound on declaring a pool, which writes every member once (large pools take longer).
const CONFIGURE_TIMEOUT: Duration = Duration::from_secs(5);
/// Plain acquires per call, and calls under way at once: a second call may start while one is
/// under way, so a lone request never waits for someone else's round trip.
const ACQUIRE_BATCH: usize = 64;
const ACQUIRE_CALLS: usize = 2;
/// Releases per call; one call at a time (releases are off the response path).
const RELEASE_BATCH: usize = 128;
/// Marks leases granted by the fallback store while degraded, so their release goes there too.
const FALLBACK_LEASE: u64 = 1 << 63;
/// Marks an unlisted lease (see `held.rs`): Redis holds no record of it.
const UNLISTED_LEASE: u64 = 1 << 62;
/// Member changes buffered per subscriber before the slowest one misses some.
const MEMBER_CHANGES_CAPACITY: usize = 1024;
/// How to reach Redis and how to name things there.
#[derive(Clone, Debug)]
pub struct RedisSettings {
    /// `redis://…`, `rediss://…`, `redis+unix://…` or `redis+cluster://h1:p1,h2:p2`.
    pub url: String,
    /// Bound on each call; past it the instance serves degraded.
    pub timeout: Duration,
    /// First segment of every key (several deployments can share one Redis).
    pub key_prefix: String,
    /// Names this instance's connections (`CLIENT SETNAME poolgate:<id>`) and marks the member
    /// changes it publishes, so it ignores its own.
    pub instance_id: String,
}

/// The Redis-backed [`Store`]. Dropping it stops its background tasks.
pub struct RedisStore {
    inner: Arc<Inner>,
    _stop: DropGuard,
}

/// Why a call did not get an answer it could use.
#[derive(Debug, Clone)]
enum Fault {
    /// Unreachable, timed out, restarting, cluster down: serve degraded and reconnect.
    Down(String),
    /// Redis answered with an error a retry will not fix (a script or protocol error).
    Broken(String),
}

impl Fault {
    fn from_redis(e: RedisError) -> Fault {
        use redis::{ErrorKind, ServerErrorKind};
        let broken = matches!(
            e.kind(),
            ErrorKind::Parse
                | ErrorKind::UnexpectedReturnType
                | ErrorKind::Server(
                    ServerErrorKind::ResponseError
                        | ServerErrorKind::ExecAbort
                        | ServerErrorKind::CrossSlot
                        | ServerErrorKind::NoPerm
                )
        );
        if broken {
            Fault::Broken(e.to_string())
        } else {
            Fault::Down(e.to_string())
        }
    }
}

fn broken(why: impl std::fmt::Display) -> StoreError {
    tracing::error!(error = %why, "redis store: unexpected answer");
    StoreError::Unavailable(format!("redis: {why}"))
}

/// What this instance keeps about one pool.
struct PoolLocal {
    spec: ArcSwap<PoolSpec>,
    keys: PoolKeys,
    /// Woken by releases (from any instance), member changes and lease expiry.
    notify: Arc<Notify>,
    /// Every member setting this instance applied, re-applied when Redis lost its data.
    applied: Mutex<HashMap<UpstreamId, MemberState>>,
    /// One restore at a time after Redis lost the pool's state, and when the last one ended.
    restoring: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// When the scheduled lease-expiry wake-up fires (ms since the epoch).
    wake_at: Mutex<Option<u64>>,
    /// Counts every event that may have freed capacity (release, expiry, member change,
    /// reconnection): an "at capacity" answer stays true until it moves.
    epoch: AtomicU64,
    /// The last plain acquire found every candidate at its cap.
    full: AtomicBool,
    /// While the pool is full, plain acquires ask Redis one at a time: the epoch at which the last
    /// one was sent and whether it found the pool full. See [`RedisStore::acquire`].
    probe: tokio::sync::Mutex<Option<(u64, bool)>>,
    /// Plain acquires and releases waiting for the call that will carry them.
    acquires: Arc<Batcher<AcquireItem, AcquireReply>>,
    releases: Arc<Batcher<Release, ()>>,
    /// Exchange statistics waiting for a call (see `stats.rs`).
    stats: Mutex<stats::Pending>,
    /// This instance's unlisted leases (see `held.rs`).
    held: Mutex<held::Held>,
    /// Grants taken ahead of need (see `stock.rs`).
    stock: Mutex<stock::Stock>,
}

/// One lease to end, and what its exchange recorded.
#[derive(Debug, Clone)]
struct Release {
    /// `None` records nothing (see [`Release::quiet`]).
    upstream: Option<UpstreamId>,
    lease: LeaseId,
    /// `None` records nothing, like a `None` upstream.
    outcome: Option<Outcome>,
    latency: Duration,
}

impl Release {
    /// Ends `lease` and records nothing: for a lease whose acquire timed out (it may have been
    /// granted all the same) and for a release already sent once, whose outcome may be counted.
    fn quiet(lease: LeaseId) -> Release {
        Release {
            upstream: None,
            lease,
            outcome: None,
            latency: Duration::ZERO,
        }
    }
}

impl PoolLocal {
    /// Capacity may have appeared: move the epoch, then wake every waiting request.
    fn wake(&self) {
        locked(&self.stock).clear();
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// A pool's local state, nothing sent yet.
    fn new(prefix: &str, spec: &PoolSpec, calls: &TaskTracker) -> PoolLocal {
        PoolLocal {
            keys: PoolKeys::new(prefix, &spec.name),
            spec: ArcSwap::from_pointee(spec.clone()),
            notify: Arc::new(Notify::new()),
            applied: Mutex::default(),
            restoring: tokio::sync::Mutex::new(None),
            wake_at: Mutex::new(None),
            epoch: AtomicU64::new(0),
            full: AtomicBool::new(false),
            probe: tokio::sync::Mutex::new(None),
            acquires: Arc::new(Batcher::new(ACQUIRE_BATCH, ACQUIRE_CALLS, calls.clone())),
            releases: Arc::new(Batcher::new(RELEASE_BATCH, 1, calls.clone())),
            stats: Mutex::default(),
            held: Mutex::default(),
            stock: Mutex::default(),
        }
    }
}

struct Inner {
    remote: Remote,
    /// RESP3 clients for the events connection (one per seed node for a cluster; the first that
    /// answers is used).
    event_clients: Vec<redis::Client>,
    timeout: Duration,
    prefix: String,
    instance: String,
    client_name: String,
    /// The URL without its password, for logs.
    redacted: String,
    pools: RwLock<HashMap<String, Arc<PoolLocal>>>,
    /// Serves while Redis is unreachable; kept configured and told every member setting.
    fallback: MemoryStore,
    degraded: AtomicBool,
    degraded_since: Mutex<Option<std::time::Instant>>,
    recovering: AtomicBool,
    backlog: Mutex<Backlog>,
    changes: broadcast::Sender<MemberChange>,
    /// Pools whose list members another instance changed (see `listed_put.lua`).
    listed: broadcast::Sender<String>,
    /// The events channels to subscribe to (one per pool).
    channels: watch::Sender<BTreeSet<String>>,
    /// The channels the events connection is subscribed to right now.
    subscribed: watch::Sender<BTreeSet<String>>,
    stop: CancellationToken,
    /// The tasks sending batched calls (see `batch.rs`); posted releases are only done once
    /// theirs has ended.
    calls: TaskTracker,
}

type ReleaseCall = std::pin::Pin<Box<dyn Future<Output = Result<Vec<()>, Fault>> + Send>>;

/// What sends a pool's queued releases, one `release.lua` run per batch. It deals with the call's
/// outcome for every release it carries, since most were posted and nobody waits for them:
/// freed capacity wakes the requests waiting for it; an unreachable Redis keeps each release for
/// replay (quietly: it may have run) and degrades the store; a refused call is logged.
fn release_sender(
    inner: &Arc<Inner>,
    pool: &str,
    p: &Arc<PoolLocal>,
) -> impl FnMut(Vec<Release>) -> ReleaseCall + Send + 'static {
    let (inner, pool, p) = (inner.clone(), pool.to_string(), p.clone());
    move |batch: Vec<Release>| {
        let (inner, pool, p) = (inner.clone(), pool.clone(), p.clone());
        Box::pin(async move {
            let stats = {
                let mut pending = locked(&p.stats);
                for r in &batch {
                    if let (Some(up), Some(outcome)) = (&r.upstream, r.outcome) {
                        pending.add(up, outcome, r.latency);
                    }
                }
                if pending.due(std::time::Instant::now()) {
                    pending.take()
                } else {
                    stats::Taken::default()
                }
            };
            match inner.release_remote(&p, &batch, &stats).await {
                Ok(freed) => {
                    if freed {
                        p.wake();
                    }
                }
                Err(Fault::Down(why)) => {
                    locked(&p.stats).restore(stats);
                    inner.replay_quietly(&pool, batch.iter().map(|r| r.lease), &why);
                }
                Err(Fault::Broken(why)) => {
                    tracing::warn!(
                        pool = %pool, releases = batch.len(), error = %why,
                        "redis refused a lease release"
                    );
                }
            }
            Ok(vec![(); batch.len()])
        })
    }
}

/// Sends what statistics wait and the reports of unlisted leases, every [`stats::FLUSH_EVERY`],
/// until the store stops: so no figure waits longer than that (a release call also carries those
/// that have waited that long, should this task run late).
async fn flush_periodically(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(stats::FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = tick.tick() => inner.flush(),
        }
    }
}

/// A poisoned lock only means a panic elsewhere mid-update; the data is still usable.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}

/// Whether the pool's acquires take unlisted leases (see `held.rs`): nothing reads a lease
/// record of a pool without a cap unless it allocates by least-connections.
fn takes_unlisted_leases(spec: &PoolSpec) -> bool {
    spec.max_concurrency.is_none() && spec.strategy != Strategy::LeastConnections
}

/// What waits for an acquire call: a request's lease, or a refill of the stock.
#[derive(Debug, Clone, Copy)]
enum AcquireItem {
    Lease(LeaseId),
    Refill,
}

type AcquireCall = std::pin::Pin<Box<dyn Future<Output = Result<Vec<AcquireReply>, Fault>> + Send>>;

/// What sends a batch of plain acquires of pool `p`.
fn acquire_sender(
    inner: &Arc<Inner>,
    p: &Arc<PoolLocal>,
) -> impl FnMut(Vec<AcquireItem>) -> AcquireCall + Send + 'static {
    let (inner, p) = (inner.clone(), p.clone());
    move |items| {
        let (inner, p) = (inner.clone(), p.clone());
        Box::pin(async move {
            let r = inner.acquire_many(&p, &items).await;
            if let Err(Fault::Down(why)) = &r {
                // Now, before this task sends the acquires that queued meanwhile: they go to the
                // local view at once instead of waiting out a second timeout.
                inner.degrade(why);
            }
            r
        })
    }
}

/// The `many` mode's reply lines as each item's answer (a refill's is a placeholder nobody
/// reads), and the upstreams of the grants taken for the stock, which follow them.
fn split_replies(
    items: &[AcquireItem],
    expected: usize,
    replies: Vec<String>,
) -> Result<(Vec<AcquireReply>, Vec<UpstreamId>), Fault> {
    if replies.len() != expected {
        return Err(Fault::Broken(format!(
            "acquire: {} replies for {expected} leases",
            replies.len()
        )));
    }
    let parse = |r: &str| AcquireReply::parse_line(r).map_err(Fault::Broken);
    let mut replies = replies.iter();
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        out.push(match i {
            // The count was checked above: a missing line cannot happen, and would not parse.
            AcquireItem::Lease(_) => parse(replies.next().map_or("", String::as_str))?,
            AcquireItem::Refill => AcquireReply::NoCandidates,
        });
    }
    let mut grants = Vec::new();
    for r in replies {
        if let AcquireReply::Granted { upstream, .. } = parse(r)? {
            grants.push(UpstreamId::new(upstream));
        }
    }
    Ok((out, grants))
}

/// A random id for a lease Redis grants, marked unlisted when it is (see `held.rs`).
fn new_lease(unlisted: bool) -> LeaseId {
    let id = rand::random::<u64>() & !(FALLBACK_LEASE | UNLISTED_LEASE);
    LeaseId(if unlisted { id | UNLISTED_LEASE } else { id })
}

/// Adds a lease id as `acquire.lua` takes it: `-` asks for an unlisted lease.
fn lease_arg(inv: &mut Call, lease: LeaseId) {
    if lease.0 & UNLISTED_LEASE != 0 {
        inv.arg("-");
    } else {
        inv.arg(lease.0);
    }
}

fn strategy_arg(s: Strategy) -> &'static str {
    match s {
        Strategy::LeastUsed => "least-used",
        Strategy::Weighted => "weighted",
        Strategy::LeastConnections => "least-connections",
        Strategy::RoundRobin => "round-robin",
    }
}

impl RedisStore {
    /// Prepares the connections (nothing is sent yet) and starts the events subscriber. Pools are
    /// declared with [`Store::configure`]; if Redis cannot be reached then, the store starts
    /// degraded and catches up when it can.
    pub fn new(settings: RedisSettings) -> Result<Self, StoreError> {
        let redacted = redact(&settings.url);
        let (remote, event_clients) = conn::connect(&settings, &redacted)?;
        let stop = CancellationToken::new();
        let inner = Arc::new(Inner {
            remote,
            event_clients,
            timeout: settings.timeout,
            prefix: settings.key_prefix,
            client_name: client_name(&settings.instance_id),
            instance: settings.instance_id,
            redacted,
            pools: RwLock::default(),
            fallback: MemoryStore::new(),
            degraded: AtomicBool::new(false),
            degraded_since: Mutex::new(None),
            recovering: AtomicBool::new(false),
            backlog: Mutex::default(),
            changes: broadcast::channel(MEMBER_CHANGES_CAPACITY).0,
            listed: broadcast::channel(MEMBER_CHANGES_CAPACITY).0,
            channels: watch::channel(BTreeSet::new()).0,
            subscribed: watch::channel(BTreeSet::new()).0,
            stop: stop.clone(),
            calls: TaskTracker::new(),
        });
        tokio::spawn(events::run(inner.clone()));
        tokio::spawn(flush_periodically(inner.clone()));
        Ok(RedisStore {
            inner,
            _stop: stop.drop_guard(),
        })
    }

    /// The URL without its password.
    pub fn redacted_url(&self) -> &str {
        &self.inner.redacted
    }

    /// Waits (at most `limit`) until the releases posted so far have gone out, then the
    /// statistics they left and the last report of unlisted leases: a gateway that stops must not
    /// leave its leases to expire, nor lose the last second of figures. True when nothing was
    /// left.
    pub async fn settle(&self, limit: Duration) -> bool {
        let calls = &self.inner.calls;
        calls.close();
        let settled = tokio::time::timeout(limit, async {
            calls.wait().await;
            self.inner.flush();
            calls.wait().await;
        })
        .await
        .is_ok();
        calls.reopen();
        settled
    }

    /// [`Store::release`] without waiting: the release goes with the pool's next release call,
    /// which handles what it meets itself (see [`release_sender`]). A release is on every
    /// request's path, and a task per release only to wait for the call cost more than the
    /// release's share of the call.
    pub fn release_now(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        if let Some((p, r)) = self.to_send(pool, upstream, lease, outcome, latency)? {
            p.releases.post(r, || release_sender(&self.inner, pool, &p));
        }
        Ok(())
    }

    /// The release that must go to Redis, or `None` when it is done already: a lease of the local
    /// view ends there, an unlisted lease here (its outcome joins the pending statistics), and
    /// while degraded the release waits in the backlog for replay.
    fn to_send(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<Option<(Arc<PoolLocal>, Release)>, StoreError> {
        let inner = &self.inner;
        let p = inner.pool(pool)?;
        if lease.0 & FALLBACK_LEASE != 0 {
            let local = LeaseId(lease.0 & !FALLBACK_LEASE);
            let r = inner
                .fallback
                .release_now(pool, upstream, local, outcome, latency);
            p.wake();
            return r.map(|()| None);
        }
        if lease.0 & UNLISTED_LEASE != 0 {
            locked(&p.held).end(upstream);
            locked(&p.stats).add(upstream, outcome, latency);
            return Ok(None);
        }
        let r = Release {
            upstream: Some(upstream.clone()),
            lease,
            outcome: Some(outcome),
            latency,
        };
        let deferred = || Deferred::Release {
            pool: pool.to_string(),
            release: r.clone(),
        };
        if inner.defer_if_degraded(deferred) {
            return Ok(None);
        }
        Ok(Some((p, r)))
    }
}

impl Inner {
    fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::SeqCst)
    }

    fn pool(&self, name: &str) -> Result<Arc<PoolLocal>, StoreError> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
            .ok_or_else(|| StoreError::UnknownPool(name.to_string()))
    }

    fn pool_names(&self) -> Vec<String> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    fn all_pools(&self) -> Vec<Arc<PoolLocal>> {
        self.pools
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Whether the pool's events reach this instance right now (else nothing may be assumed
    /// from the absence of events).
    fn hears_events(&self, p: &PoolLocal) -> bool {
        self.subscribed.borrow().contains(&p.keys.events)
    }

    fn notify_all(&self) {
        for p in self.all_pools() {
            p.wake();
        }
    }

    /// Sends the pending statistics of every pool, each in a call of its own, and the report of
    /// its unlisted leases (see `held.rs`) in another. The calls are tracked like releases, so
    /// `settle` waits for them; one that finds Redis unreachable puts its figures back for the
    /// next flush. Nothing is sent while degraded.
    fn flush(self: &Arc<Self>) {
        if self.is_degraded() {
            return;
        }
        for p in self.all_pools() {
            if let Some(report) = locked(&p.held).report() {
                let inner = self.clone();
                let p = p.clone();
                self.calls.spawn(async move {
                    match inner.report_remote(&p, &report).await {
                        Ok(()) => locked(&p.held).reported(report),
                        Err(fault) => {
                            locked(&p.held).unsure();
                            if let Fault::Broken(why) = fault {
                                tracing::warn!(error = %why, "redis refused the report of unlisted leases");
                            }
                        }
                    }
                });
            }
            let taken = locked(&p.stats).take();
            if taken.is_empty() {
                continue;
            }
            let inner = self.clone();
            self.calls.spawn(async move {
                match inner.release_remote(&p, &[], &taken).await {
                    Ok(_) => {}
                    Err(Fault::Down(_)) => locked(&p.stats).restore(taken),
                    Err(Fault::Broken(why)) => {
                        tracing::warn!(error = %why, "redis refused the exchange statistics");
                    }
                }
            });
        }
    }

    /// Ends `releases` and adds `stats` in one `release.lua` run; true when that freed capacity.
    /// What the releases themselves recorded is not sent: their callers add it to the pool's
    /// pending statistics.
    async fn release_remote(
        &self,
        p: &PoolLocal,
        releases: &[Release],
        stats: &stats::Taken,
    ) -> Result<bool, Fault> {
        let k = &p.keys;
        let cap = p.spec.load().max_concurrency.unwrap_or(0);
        let mut inv = Call::new(&scripts::RELEASE, 4);
        inv.key(&k.leases)
            .key(&k.lease_up)
            .key(&k.live)
            .key(&k.stats)
            .arg(cap)
            .arg(&k.events)
            .arg(releases.len());
        for r in releases {
            inv.arg(r.lease.0);
        }
        for (field, amount) in stats.pairs() {
            inv.arg(field).arg(amount);
        }
        let freed: i64 = self.eval(&inv, self.timeout).await?;
        Ok(freed == 1)
    }

    /// Replaces this instance's report of unlisted leases with `report` (see `report.lua`).
    async fn report_remote(&self, p: &PoolLocal, report: &held::Report) -> Result<(), Fault> {
        let k = &p.keys;
        let spec = p.spec.load();
        let now = now_ms();
        // At least three flushes long, so a late tick never lets a live instance's report lapse.
        let ttl = millis(spec.lease_ttl).max(3 * millis(stats::FLUSH_EVERY));
        let wake = report.dropped && !takes_unlisted_leases(&spec);
        let mut inv = Call::new(&scripts::REPORT, 2);
        inv.key(&k.instances)
            .key(&k.held)
            .arg(now)
            .arg(&self.instance)
            .arg(now + ttl)
            .arg(&report.lines)
            .arg(if wake { k.events.as_str() } else { "" });
        let _purged: i64 = self.eval(&inv, self.timeout).await?;
        Ok(())
    }

    async fn record_remote(
        &self,
        p: &PoolLocal,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), Fault> {
        let mut inv = Call::new(&scripts::RECORD, 1);
        inv.key(&p.keys.stats)
            .arg(upstream.as_str())
            .arg(outcome.key())
            .arg(latency.as_micros() as u64);
        let _: i64 = self.eval(&inv, self.timeout).await?;
        Ok(())
    }

    /// Wakes the pool's waiting requests when the earliest lease expires: capacity held by a
    /// gateway that died comes back without anyone releasing it.
    fn schedule_wake(&self, p: &Arc<PoolLocal>, deadline_ms: u64) {
        let now = now_ms();
        {
            let mut at = locked(&p.wake_at);
            if at.is_some_and(|t| t <= deadline_ms && t > now) {
                return;
            }
            *at = Some(deadline_ms);
        }
        let delay = Duration::from_millis(deadline_ms.saturating_sub(now) + 1);
        let p = p.clone();
        let stop = self.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.cancelled() => return,
            }
            {
                let mut at = locked(&p.wake_at);
                if *at == Some(deadline_ms) {
                    *at = None;
                }
            }
            p.wake();
        });
    }

    /// `acquire.lua` with the keys and leading arguments all its modes share; `lease` is ARGV[2]
    /// (`None` for the many mode, which ignores it) and `session` the session mode's last key.
    fn acquire_call(&self, p: &PoolLocal, lease: Option<LeaseId>, session: Option<&str>) -> Call {
        let spec = p.spec.load();
        let k = &p.keys;
        let mut inv = Call::new(&scripts::ACQUIRE, 10 + usize::from(session.is_some()));
        inv.key(&k.meta)
            .key(&k.state)
            .key(&k.members)
            .key(&k.order)
            .key(&k.leases)
            .key(&k.lease_up)
            .key(&k.live)
            .key(&k.sessions)
            .key(&k.instances)
            .key(&k.held);
        if let Some(key) = session {
            inv.key(&k.session(key));
        }
        let now = now_ms();
        inv.arg(now);
        match lease {
            Some(lease) => lease_arg(&mut inv, lease),
            None => {
                inv.arg("-");
            }
        }
        inv.arg(now + millis(spec.lease_ttl).max(1))
            .arg(spec.max_concurrency.unwrap_or(0))
            .arg(strategy_arg(spec.strategy))
            .arg(&k.events);
        inv
    }

    /// One acquire in its own call: a session's, or one that excludes upstreams.
    async fn acquire_one(
        &self,
        p: &PoolLocal,
        lease: LeaseId,
        want: Want<'_>,
    ) -> Result<AcquireReply, Fault> {
        let session = match want {
            Want::Session { key, .. } => Some(key),
            Want::Any { .. } => None,
        };
        let mut inv = self.acquire_call(p, Some(lease), session);
        match want {
            Want::Any { exclude } => {
                inv.arg("any");
                for id in exclude {
                    inv.arg(id.as_str());
                }
            }
            Want::Session {
                key,
                ttl,
                preferred,
                rebind,
            } => {
                inv.arg("session")
                    .arg(millis(ttl))
                    .arg(u8::from(rebind))
                    .arg(key);
                for id in preferred {
                    inv.arg(id.as_str());
                }
            }
        }
        let reply: Vec<String> = self.eval(&inv, self.timeout).await?;
        AcquireReply::parse(reply).map_err(Fault::Broken)
    }

    /// Plain acquires, one per waiting lease id, in one call (`many` mode); in a pool whose
    /// leases are unlisted the call also takes grants for the stock when it is due (see
    /// `stock.rs`). A refill item's reply is a placeholder: nobody waits for it.
    async fn acquire_many(
        &self,
        p: &PoolLocal,
        items: &[AcquireItem],
    ) -> Result<Vec<AcquireReply>, Fault> {
        if self.is_degraded() {
            // These waited behind a call that found Redis gone (see `acquire_sender`). Each is
            // replayed as a quiet release, which ends nothing: it was never sent.
            if items.iter().any(|i| matches!(i, AcquireItem::Refill)) {
                locked(&p.stock).refill_failed();
            }
            return Err(Fault::Down("the store is degraded".into()));
        }
        let waiting = items
            .iter()
            .filter(|i| matches!(i, AcquireItem::Lease(_)))
            .count();
        let refill = waiting < items.len();
        let (extra, generation) = if takes_unlisted_leases(&p.spec.load()) {
            let mut stock = locked(&p.stock);
            stock.note_waiting(waiting);
            let extra = if refill || stock.start_refill() {
                stock.refill_size()
            } else {
                0
            };
            (extra, stock.generation())
        } else {
            (0, 0)
        };
        let stocking = refill || extra > 0;
        let mut inv = self.acquire_call(p, None, None);
        inv.arg("many");
        for i in items {
            if let AcquireItem::Lease(l) = i {
                lease_arg(&mut inv, *l);
            }
        }
        for _ in 0..extra {
            inv.arg("-");
        }
        let replies: Result<Vec<String>, Fault> = self.eval(&inv, self.timeout).await;
        let split = replies.and_then(|r| split_replies(items, waiting + extra, r));
        match split {
            Ok((out, mut grants)) => {
                if stocking {
                    // A member this instance just took out of service may have been picked by a
                    // call Redis ran before the change.
                    let applied = locked(&p.applied);
                    grants.retain(|g| applied.get(g).is_none_or(|s| s.eligible));
                    drop(applied);
                    locked(&p.stock).fill(grants, tokio::time::Instant::now(), generation);
                }
                Ok(out)
            }
            Err(f) => {
                if stocking {
                    locked(&p.stock).refill_failed();
                }
                Err(f)
            }
        }
    }

    /// A grant from the stock, when the pool keeps one and it holds a fresh grant; posts a
    /// refill when half of it is used.
    fn from_stock(self: &Arc<Self>, p: &Arc<PoolLocal>) -> Option<Grant> {
        let (got, refill) = {
            let mut stock = locked(&p.stock);
            let got = stock.take(tokio::time::Instant::now());
            (got, stock.start_refill())
        };
        if refill {
            p.acquires
                .post(AcquireItem::Refill, || acquire_sender(self, p));
        }
        let upstream = got?;
        locked(&p.held).take(&upstream);
        Some(Grant {
            upstream,
            lease: new_lease(true),
            bound_now: false,
        })
    }

    /// One acquire in Redis (or in the local view while degraded).
    async fn acquire_remote(
        self: &Arc<Self>,
        pool: &str,
        p: &Arc<PoolLocal>,
        want: Want<'_>,
    ) -> Result<Acquired, StoreError> {
        let inner = self;
        if inner.is_degraded() {
            return inner.fallback_acquire(pool, want).await;
        }
        let unlisted = takes_unlisted_leases(&p.spec.load());
        if unlisted && matches!(want, Want::Any { exclude: [] }) {
            if let Some(grant) = inner.from_stock(p) {
                return Ok(Acquired::Granted(grant));
            }
        }
        let mut restored = false;

        loop {
            let lease = new_lease(unlisted);
            let answer = match want {
                Want::Any { exclude: [] } => {
                    p.acquires
                        .send(AcquireItem::Lease(lease), || acquire_sender(inner, p))
                        .await
                }
                _ => inner.acquire_one(p, lease, want).await,
            };
            let reply = match answer {
                Ok(reply) => reply,
                Err(Fault::Down(why)) => {
                    // The acquire may still run once Redis gets to it: cancel its lease then.
                    inner.replay_quietly(pool, [lease], &why);
                    return inner.fallback_acquire(pool, want).await;
                }
                Err(Fault::Broken(why)) => return Err(broken(why)),
            };
            return Ok(match reply {
                AcquireReply::Granted {
                    upstream,
                    bound_now,
                } => {
                    let upstream = UpstreamId::new(upstream);
                    if lease.0 & UNLISTED_LEASE != 0 {
                        locked(&p.held).take(&upstream);
                    }
                    Acquired::Granted(Grant {
                        upstream,
                        lease,
                        bound_now,
                    })
                }
                AcquireReply::AtCapacity {
                    earliest_deadline_ms,
                } => {
                    if let Some(at) = earliest_deadline_ms {
                        inner.schedule_wake(p, at);
                    }
                    Acquired::AtCapacity
                }
                AcquireReply::Unavailable(upstream) => {
                    Acquired::SessionUnavailable(UpstreamId::new(upstream))
                }
                AcquireReply::NoCandidates => Acquired::NoCandidates,
                AcquireReply::Unconfigured if !restored => {
                    restored = true;
                    match inner.restore_pool(p).await {
                        Ok(()) => continue,
                        Err(Fault::Down(why)) => {
                            inner.degrade(&why);
                            return inner.fallback_acquire(pool, want).await;
                        }
                        Err(Fault::Broken(why)) => return Err(broken(why)),
                    }
                }
                AcquireReply::Unconfigured => {
                    return Err(broken("the pool's state is missing after declaring it"));
                }
            });
        }
    }

    async fn fallback_acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        Ok(match self.fallback.acquire(pool, want).await? {
            Acquired::Granted(g) => Acquired::Granted(Grant {
                lease: LeaseId(g.lease.0 | FALLBACK_LEASE),
                ..g
            }),
            other => other,
        })
    }
}

impl Store for RedisStore {
    async fn configure(&self, spec: PoolSpec) -> Result<(), StoreError> {
        self.inner.configure(spec).await
    }

    /// Plain requests waiting for capacity are woken all at once by every release (as with the
    /// memory store), and each would cost a round trip. So while the pool is known to be full,
    /// plain acquires (no session, nothing excluded) go to Redis one at a time, and one that
    /// arrived no later than the last answer "full" was asked takes that answer without asking
    /// again: nothing that frees capacity happened since (every such thing moves the epoch).
    /// A burst of waiters then costs about two round trips per release, not one per waiter.
    async fn acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        let inner = &self.inner;
        let p = inner.pool(pool)?;
        let plain = matches!(want, Want::Any { exclude } if exclude.is_empty());
        if !plain || !p.full.load(Ordering::SeqCst) || !inner.hears_events(&p) {
            let r = inner.acquire_remote(pool, &p, want).await;
            if plain {
                p.full
                    .store(matches!(r, Ok(Acquired::AtCapacity)), Ordering::SeqCst);
            }
            return r;
        }
        let arrival = p.epoch.load(Ordering::SeqCst);
        let mut last = p.probe.lock().await;
        if let Some((sent, true)) = *last {
            if sent >= arrival && inner.hears_events(&p) {
                return Ok(Acquired::AtCapacity);
            }
        }
        let sent = p.epoch.load(Ordering::SeqCst);
        let r = inner.acquire_remote(pool, &p, want).await;
        let full = matches!(r, Ok(Acquired::AtCapacity));
        *last = Some((sent, full));
        p.full.store(full, Ordering::SeqCst);
        r
    }

    async fn release(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let Some((p, r)) = self.to_send(pool, upstream, lease, outcome, latency)? else {
            return Ok(());
        };
        if let Err(Fault::Down(why)) = p.releases.send(r, || release_sender(inner, pool, &p)).await
        {
            // The call carrying it was abandoned; it may have run all the same.
            inner.replay_quietly(pool, [lease], &why);
        }
        Ok(())
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let p = inner.pool(pool)?;
        if lease.0 & FALLBACK_LEASE != 0 {
            return inner
                .fallback
                .extend(pool, upstream, LeaseId(lease.0 & !FALLBACK_LEASE))
                .await;
        }
        // An unlisted lease lives as long as this instance's reports do.
        if inner.is_degraded() || lease.0 & UNLISTED_LEASE != 0 {
            return Ok(());
        }
        // One command, atomic on its own: only a lease still listed gets the new deadline.
        let deadline = now_ms() + millis(p.spec.load().lease_ttl);
        let cmd = redis::cmd("ZADD")
            .arg(&p.keys.leases)
            .arg("XX")
            .arg(deadline)
            .arg(lease.0)
            .clone();
        match inner.query::<i64>(&cmd).await {
            Ok(_) => Ok(()),
            Err(Fault::Down(why)) => {
                inner.degrade(&why);
                Ok(())
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
    ) -> Result<(), StoreError> {
        self.inner.set_member(pool, upstream, state).await
    }

    async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let inner = &self.inner;
        let p = inner.pool(pool)?;
        if inner.is_degraded() {
            return inner
                .fallback
                .record(pool, upstream, outcome, latency)
                .await;
        }
        match inner.record_remote(&p, upstream, outcome, latency).await {
            Ok(()) => Ok(()),
            // Statistics are best effort: a lost count is not worth failing anyone for.
            Err(Fault::Down(why) | Fault::Broken(why)) => {
                tracing::debug!(pool, error = %why, "could not record an outcome in redis");
                inner
                    .fallback
                    .record(pool, upstream, outcome, latency)
                    .await
            }
        }
    }

    async fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> Result<Option<UpstreamId>, StoreError> {
        self.inner.session_upstream(pool, key).await
    }

    async fn end_session(&self, pool: &str, key: &str) -> Result<bool, StoreError> {
        self.inner.end_session(pool, key).await
    }

    async fn unbind(&self, pool: &str, key: &str, upstream: &UpstreamId) -> Result<(), StoreError> {
        self.inner.unbind(pool, key, upstream).await
    }

    fn release_signal(&self, pool: &str) -> Arc<Notify> {
        match self.inner.pool(pool) {
            Ok(p) => p.notify.clone(),
            Err(_) => Arc::new(Notify::new()),
        }
    }

    async fn status(&self, pool: &str) -> Result<PoolStatus, StoreError> {
        self.inner.status(pool).await
    }

    fn kind(&self) -> &'static str {
        "redis"
    }

    fn health(&self) -> &'static str {
        if self.inner.is_degraded() {
            HEALTH_DEGRADED
        } else {
            HEALTH_OK
        }
    }

    async fn lock(&self, name: &str, ttl: Duration) -> Result<Option<LockToken>, StoreError> {
        self.inner.lock(name, ttl).await
    }

    async fn extend_lock(
        &self,
        name: &str,
        token: &LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.extend_lock(name, token, ttl).await
    }

    async fn unlock(&self, name: &str, token: &LockToken) -> Result<bool, StoreError> {
        self.inner.unlock(name, token).await
    }

    async fn put_listed(&self, pool: &str, list: &str) -> Result<(), StoreError> {
        self.inner.put_listed(pool, list).await
    }

    async fn listed(&self, pool: &str) -> Result<Option<String>, StoreError> {
        self.inner.listed(pool).await
    }

    fn subscribe_listed_changes(&self) -> broadcast::Receiver<String> {
        self.inner.listed.subscribe()
    }

    fn subscribe_member_changes(&self) -> broadcast::Receiver<MemberChange> {
        self.inner.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each waiting lease gets its own line in order, a refill item gets a placeholder and no
    /// line, and the lines after the waiting ones are the stock's grants.
    #[test]
    fn replies_go_to_their_leases_and_the_rest_to_the_stock() {
        let items = [
            AcquireItem::Lease(LeaseId(1)),
            AcquireItem::Refill,
            AcquireItem::Lease(LeaseId(2)),
        ];
        let lines = [
            "granted 0 http://a",
            "granted 0 http://b",
            "granted 0 http://c",
            "none",
        ];
        let (out, grants) =
            split_replies(&items, 4, lines.iter().map(|l| l.to_string()).collect()).unwrap();
        let granted = |u: &str| AcquireReply::Granted {
            upstream: u.into(),
            bound_now: false,
        };
        assert_eq!(
            out,
            [
                granted("http://a"),
                AcquireReply::NoCandidates,
                granted("http://b")
            ]
        );
        assert_eq!(
            grants,
            [UpstreamId::new("http://c")],
            "a line without a grant is skipped"
        );
        let short = split_replies(&items, 4, vec!["granted 0 http://a".into()]);
        assert!(matches!(short, Err(Fault::Broken(_))));
    }
}
