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
//! session bindings then hold per instance, not globally; the leases Redis granted this instance
//! that still run count against the caps there, see `live.rs`), keeps the writes Redis missed
//! (lease releases, member settings, unbinds) in a bounded backlog, and reconnects in the
//! background with backoff. Once Redis answers, the backlog is replayed (after re-declaring the pools, and
//! re-applying every member setting of this instance if Redis lost its data), and the instance is
//! `ok` again. Sessions re-derive the same upstream by consistent hashing either way.
//!
//! # Clocks
//! Lease deadlines are written with this machine's wall clock (scripts take the time as an
//! argument), so instances sharing a pool need synchronised clocks (NTP); a skew of `d` moves
//! another instance's lease expiry by `d`.
//!
//! # Layout
//! [`RedisStore`] and its [`Store`] methods are here, each one handing over to the module that does
//! the job: `conn.rs` (connections, degraded mode), `sentinel.rs` (following the master the
//! sentinels name), `acquire.rs`, `release.rs` (and statistics), `held.rs` and `live.rs` (this
//! instance's live leases per upstream, unlisted and listed), `members.rs` (pools, member
//! settings, lists), `sessions.rs`, `status.rs` and `locks.rs`.

mod acquire;
mod batch;
mod conn;
mod declare;
mod events;
mod held;
mod keys;
mod live;
mod locks;
mod members;
mod release;
mod scripts;
mod sentinel;
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
use super::shard::Signals;
use super::{
    Acquired, HEALTH_DEGRADED, HEALTH_OK, LeaseId, LockToken, MemberChange, MemberState, PoolSpec,
    PoolStatus, Store, StoreError, Want,
};
use crate::config::Strategy;
use crate::outcome::Outcome;
use crate::upstream::UpstreamId;
use acquire::Lane;
use batch::Batcher;
pub use conn::client_name;
use conn::{Backlog, Remote};
use keys::PoolKeys;
pub use keys::script_keys;
use release::{Release, flush_periodically};

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
    /// Roots and client certificate for a `rediss://` URL (the system's roots when unset).
    pub tls: crate::config::StoreTls,
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
    /// one was sent and whether it found the pool full (see `acquire.rs`).
    probe: tokio::sync::Mutex<Option<(u64, bool)>>,
    /// Plain acquires from the whole pool (waiting for their call, or served from its stock).
    plain: Arc<Lane>,
    /// Releases waiting for the call that will carry them.
    releases: Arc<Batcher<Release, ()>>,
    /// Exchange statistics waiting for a call (see `stats.rs`).
    stats: Mutex<stats::Pending>,
    /// This instance's unlisted leases (see `held.rs`).
    held: Mutex<held::Held>,
    /// This instance's listed leases per upstream, for the local view (see `live.rs`).
    live: live::Live,
    /// Label-filter subsets this instance has sent the members of (later acquires within them
    /// name them only, see `acquire.lua`), each with the lane its plain acquires wait in (a
    /// call names one subset).
    within: Mutex<HashMap<String, Arc<Lane>>>,
}

impl PoolLocal {
    /// Capacity may have appeared: move the epoch, then wake every waiting request. (Only a
    /// pool with a cap has capacity to free, and such a pool keeps no stock.)
    fn wake(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// The pool's members may have changed, or Redis may have: drop the grants taken ahead,
    /// then wake every waiting request.
    fn members_changed(&self) {
        self.clear_stocks();
        self.wake();
    }

    /// A pool's local state, nothing sent yet.
    fn new(prefix: &str, spec: &PoolSpec, notify: Arc<Notify>, calls: &TaskTracker) -> PoolLocal {
        let live = live::Live::default();
        live.reconfigure(&spec.members, !takes_unlisted_leases(spec));
        PoolLocal {
            keys: PoolKeys::new(prefix, &spec.name),
            spec: ArcSwap::from_pointee(spec.clone()),
            notify,
            applied: Mutex::default(),
            restoring: tokio::sync::Mutex::new(None),
            within: Mutex::default(),
            wake_at: Mutex::new(None),
            epoch: AtomicU64::new(0),
            full: AtomicBool::new(false),
            probe: tokio::sync::Mutex::new(None),
            plain: Arc::new(Lane::new(None, calls)),
            releases: Arc::new(Batcher::new(RELEASE_BATCH, 1, calls.clone())),
            stats: Mutex::default(),
            held: Mutex::default(),
            live,
        }
    }

    /// Drops every grant taken ahead, the whole pool's and each subset's: the pool's members
    /// changed, or Redis may have.
    fn clear_stocks(&self) {
        self.plain.clear_stock();
        for lane in locked(&self.within).values() {
            lane.clear_stock();
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
    /// The last failure while degraded, shown in `/status` (Redis error texts hold no URL).
    degraded_reason: Mutex<Option<String>>,
    recovering: AtomicBool,
    backlog: Mutex<Backlog>,
    changes: broadcast::Sender<MemberChange>,
    /// Pools whose list members another instance changed (see `listed_put.lua`).
    listed: broadcast::Sender<String>,
    /// The pools' release signals, one for all shards of a pool.
    signals: Signals,
    /// The events channels to subscribe to (one per pool).
    channels: watch::Sender<BTreeSet<String>>,
    /// The channels the events connection is subscribed to right now.
    subscribed: watch::Sender<BTreeSet<String>>,
    stop: CancellationToken,
    /// The tasks sending batched calls (see `batch.rs`); posted releases are only done once
    /// theirs has ended.
    calls: TaskTracker,
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
            degraded_reason: Mutex::new(None),
            recovering: AtomicBool::new(false),
            backlog: Mutex::default(),
            changes: broadcast::channel(MEMBER_CHANGES_CAPACITY).0,
            listed: broadcast::channel(MEMBER_CHANGES_CAPACITY).0,
            signals: Signals::default(),
            channels: watch::channel(BTreeSet::new()).0,
            subscribed: watch::channel(BTreeSet::new()).0,
            stop: stop.clone(),
            calls: TaskTracker::new(),
        });
        tokio::spawn(events::run(inner.clone()));
        tokio::spawn(flush_periodically(inner.clone()));
        tokio::spawn(sentinel::follow_master(inner.clone()));
        Ok(RedisStore {
            inner,
            _stop: stop.drop_guard(),
        })
    }

    /// The URL without its password.
    pub fn redacted_url(&self) -> &str {
        &self.inner.redacted
    }

    /// Checks at start that Redis does not refuse this instance for good (wrong password, ACL,
    /// untrusted certificate): such a refusal is a start-up error naming the key to change.
    /// An unreachable Redis is not: the instance starts degraded and catches up.
    pub async fn first_contact(&self) -> Result<(), String> {
        self.inner.first_contact().await
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
            p.members_changed();
        }
    }
}

impl Store for RedisStore {
    async fn configure(&self, spec: PoolSpec) -> Result<(), StoreError> {
        self.inner.configure(spec).await
    }

    async fn acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        self.inner.acquire(pool, want).await
    }

    async fn release(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        self.inner
            .release(pool, upstream, lease, outcome, latency)
            .await
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        self.inner.extend(pool, upstream, lease).await
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
        believed: Option<MemberState>,
    ) -> Result<(), StoreError> {
        self.inner.set_member(pool, upstream, state, believed).await
    }

    async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        self.inner.record(pool, upstream, outcome, latency).await
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

    fn health_reason(&self) -> Option<String> {
        if !self.inner.is_degraded() {
            return None;
        }
        locked(&self.inner.degraded_reason).clone()
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
