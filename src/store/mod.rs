//! Pool state: who is leased, how often each upstream was used, which session is bound where.
//!
//! [`Store`] is the one interface; [`memory::MemoryStore`] keeps the state in this process (the
//! embedded default), and [`redis::RedisStore`] shares it between instances. Every decision that
//! reads and then writes (acquire, release, bind) is one atomic step of the store, so concurrent
//! requests never double-book an upstream or disagree about a session.

pub mod job_lock;
pub mod memory;
pub mod redis;
pub mod shard;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::{Notify, broadcast};

use crate::config::Strategy;
use crate::outcome::Outcome;
use crate::upstream::UpstreamId;

/// What the store needs to know about a pool to allocate from it.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    pub name: String,
    pub members: Vec<UpstreamId>,
    pub strategy: Strategy,
    /// Live leases allowed per upstream; `None` is unlimited.
    pub max_concurrency: Option<u32>,
    /// A lease not released or extended by then is void: its gateway is presumed dead.
    pub lease_ttl: Duration,
    /// Store pools the pool is spread over ([`shard`]); 1 is one pool. Backends see 1: the
    /// shards are [`shard::Sharded`]'s business.
    pub shards: u32,
}

/// How the allocator treats a member, as health decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberState {
    /// A candidate for new allocations: non-sticky requests and new sessions.
    pub eligible: bool,
    /// Sessions already bound to it keep it (false only when it is dead): no teleporting.
    pub keeps_sessions: bool,
    /// Allocation cost: a member of cost `c` is picked about `1/c` as often as one of cost 1.
    pub cost: u32,
}

impl MemberState {
    pub const IN_SERVICE: MemberState = MemberState {
        eligible: true,
        keeps_sessions: true,
        cost: 1,
    };
}

/// The members of a pool that match a request's label filter. An acquire `within` one chooses
/// among them only, by the pool's strategy, with the pool's caps and leases.
///
/// The store keeps an index per subset (it is told the members once, then finds them by `id`),
/// so choosing within a narrow filter of a large pool does not walk the pool. Allocation
/// counts for least-used are the subset's own: inside a filter, least-used spreads the
/// requests made with that filter.
#[derive(Clone, Copy, Debug)]
pub struct Subset<'a> {
    /// Names the subset: its filter and a digest of its members, the same on every instance
    /// with the same members (a membership change makes a new subset).
    pub id: &'a str,
    /// The matching members, in the pool's order.
    pub members: &'a [UpstreamId],
}

/// What an acquire asks for.
#[derive(Clone, Copy, Debug)]
pub enum Want<'a> {
    /// Any eligible member by the pool's strategy, except those already tried.
    Any {
        exclude: &'a [UpstreamId],
        within: Option<Subset<'a>>,
    },
    /// The session's upstream; on first use the first of `preferred` (consistent-hash order) that
    /// is eligible and below its cap gets bound (`AtCapacity` only when every eligible one is at
    /// its cap, `NoCandidates` when none is eligible).
    Session {
        key: &'a str,
        ttl: Duration,
        preferred: &'a [UpstreamId],
        /// Rebind instead of failing when the bound upstream is no longer a member.
        rebind: bool,
        /// A session inside a filter: a bound upstream outside the subset is treated as one
        /// that left the pool.
        within: Option<Subset<'a>>,
    },
}

/// Identifies one lease within its upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId(pub u64);

/// A granted lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub upstream: UpstreamId,
    pub lease: LeaseId,
    /// This acquire created the session binding: nothing has used it yet, so the caller may undo it
    /// when the upstream turns out unreachable.
    pub bound_now: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    Granted(Grant),
    /// Every candidate is at its concurrency cap; wait for a release.
    AtCapacity,
    /// The session is bound to an upstream that can no longer serve it.
    SessionUnavailable(UpstreamId),
    /// No eligible member is left to try.
    NoCandidates,
}

/// A member setting decided by another gateway instance, delivered by
/// [`Store::subscribe_member_changes`] so this instance's health view can mirror it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberChange {
    pub pool: String,
    pub upstream: UpstreamId,
    pub state: MemberState,
}

/// Proof of holding a job lock: a random token only the holder knows. A holder whose lock expired
/// and was taken by someone else can neither extend nor release the new holder's lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockToken(String);

impl LockToken {
    /// A fresh random token (128 bits, hex).
    pub fn random() -> Self {
        LockToken(format!("{:032x}", rand::random::<u128>()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What `/status` says about the store: `ok`, or `degraded` while a shared store cannot be
/// reached and the instance serves from its local view.
pub const HEALTH_OK: &str = "ok";
pub const HEALTH_DEGRADED: &str = "degraded";

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("unknown pool `{0}`")]
    UnknownPool(String),
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

/// Per-upstream figures for `/status`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MemberStatus {
    #[serde(skip)]
    pub id: String,
    pub leases_live: u64,
    pub allocations: u64,
    /// Count of each outcome, keyed by [`Outcome::key`].
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
    /// Successes over every recorded outcome since start (the window ratio is health's).
    pub success_ratio_total: Option<f64>,
    pub latency_avg_ms: Option<f64>,
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PoolStatus {
    pub sessions_live: u64,
    pub members: Vec<MemberStatus>,
}

/// The pool-state interface shared by the embedded and Redis backends.
pub trait Store: Send + Sync + 'static {
    /// Declares a pool (or replaces its membership and limits); state of kept members is kept.
    fn configure(&self, spec: PoolSpec) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Picks an upstream and leases it in one atomic step.
    fn acquire(
        &self,
        pool: &str,
        want: Want<'_>,
    ) -> impl Future<Output = Result<Acquired, StoreError>> + Send;

    /// Ends a lease and records its outcome.
    fn release(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Counts an outcome in the statistics without touching any lease: the earlier exchanges of
    /// an inspected tunnel (whose lease release counts the last one) and client feedback.
    fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The upstream a live session is bound to, without refreshing the binding (a lookup is not
    /// a use).
    fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> impl Future<Output = Result<Option<UpstreamId>, StoreError>> + Send;

    /// Pushes a live lease's deadline out by the pool's lease TTL (long tunnels).
    fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Applies a health decision to a member. A member that becomes eligible again starts at
    /// max(its old allocation count, the pool's current minimum), so it is not flooded.
    /// `believed` is the setting the decider last knew the member to have (`None`: what this
    /// instance's view shows now). A shared store refuses a decision that would bring the member
    /// back towards service when another instance has moved it out since: the decider had not
    /// heard of that yet, even if this instance's view has. A store of one instance has nobody
    /// to race.
    fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
        believed: Option<MemberState>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Ends a session: its binding is deleted, whatever it points at.
    fn end_session(
        &self,
        pool: &str,
        key: &str,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Deletes a session binding if it still points at `upstream`.
    fn unbind(
        &self,
        pool: &str,
        key: &str,
        upstream: &UpstreamId,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Signalled whenever capacity may have been freed in `pool`.
    fn release_signal(&self, pool: &str) -> Arc<Notify>;

    fn status(&self, pool: &str) -> impl Future<Output = Result<PoolStatus, StoreError>> + Send;

    fn kind(&self) -> &'static str;

    /// [`HEALTH_OK`], or [`HEALTH_DEGRADED`] while a shared store is unreachable.
    fn health(&self) -> &'static str;

    /// Why the store is degraded (the last failure, without credentials); `None` when it is ok.
    fn health_reason(&self) -> Option<String> {
        None
    }

    /// Takes the job lock `name` for `ttl` unless someone holds it. Only one holder at a time
    /// (across every instance sharing the store); the lock expires by itself if its holder dies.
    fn lock(
        &self,
        name: &str,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<LockToken>, StoreError>> + Send;

    /// Pushes the lock's expiry to `ttl` from now; false when `token` no longer holds it.
    fn extend_lock(
        &self,
        name: &str,
        token: &LockToken,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Releases the lock; false when `token` no longer holds it (nothing is released then).
    fn unlock(
        &self,
        name: &str,
        token: &LockToken,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Member settings applied by *other* instances (quarantines, restores, cost changes), as
    /// they happen. A single-instance store never sends any.
    fn subscribe_member_changes(&self) -> broadcast::Receiver<MemberChange>;

    /// Shares the members a pool's upstream lists contribute (one URL a line), as decided by
    /// the instance holding the pool's sources lock ([`crate::sources`]).
    fn put_listed(
        &self,
        pool: &str,
        list: &str,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The list last shared by [`Store::put_listed`], if any.
    fn listed(&self, pool: &str)
    -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Names of pools whose shared list another instance changed (nothing on one instance).
    fn subscribe_listed_changes(&self) -> broadcast::Receiver<String>;
}

/// Builds one member's `/status` figures from its raw counters (shared by the backends).
pub(crate) fn member_status(
    id: &UpstreamId,
    leases_live: u64,
    allocations: u64,
    outcomes: &[u64; Outcome::ALL.len()],
    latency_total: Duration,
    latency_count: u64,
) -> MemberStatus {
    let by_key = Outcome::ALL
        .iter()
        .map(|o| (o.key(), outcomes[o.index()]))
        .collect();
    let total: u64 = Outcome::ALL
        .iter()
        .filter(|o| o.is_judgement())
        .map(|o| outcomes[o.index()])
        .sum();
    let ok: u64 = Outcome::ALL
        .iter()
        .filter(|o| o.is_success())
        .map(|o| outcomes[o.index()])
        .sum();
    MemberStatus {
        id: id.to_string(),
        leases_live,
        allocations,
        outcomes: by_key,
        success_ratio_total: (total > 0).then(|| ok as f64 / total as f64),
        latency_avg_ms: (latency_count > 0)
            .then(|| latency_total.as_secs_f64() * 1000.0 / latency_count as f64),
    }
}

/// The store the gateway uses: the configured backend, with sharded pools routed.
pub type GatewayStore = shard::Sharded<AnyStore>;

/// The configured backend. An enum rather than a trait object: the trait's async methods are not
/// object-safe, and a match costs nothing on the hot path.
// One per process: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum AnyStore {
    Memory(memory::MemoryStore),
    Redis(redis::RedisStore),
}

/// Forwards a call to whichever backend is configured.
macro_rules! dispatch {
    ($self:ident, $s:ident => $call:expr) => {
        match $self {
            AnyStore::Memory($s) => $call,
            AnyStore::Redis($s) => $call,
        }
    };
}

impl AnyStore {
    /// [`Store::release`] without a future: the embedded store ends the lease here and now; the
    /// Redis store queues it for the pool's next release call, which deals with its failures. A
    /// release is on every request's path, and waiting for Redis there would hold nobody up but
    /// would cost a task per request.
    pub fn release_now(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.release_now(pool, upstream, lease, outcome, latency))
    }

    /// Waits (at most `limit`) for the releases [`AnyStore::release_now`] queued to reach the
    /// store; true when they all did. Shutdown calls it last.
    pub async fn settle(&self, limit: Duration) -> bool {
        match self {
            AnyStore::Memory(_) => true,
            AnyStore::Redis(s) => s.settle(limit).await,
        }
    }
}

impl Store for AnyStore {
    async fn configure(&self, spec: PoolSpec) -> Result<(), StoreError> {
        dispatch!(self, s => s.configure(spec).await)
    }

    async fn acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        match self {
            AnyStore::Memory(s) => s.acquire(pool, want).await,
            // Boxed: the Redis acquire's state (the call, its batching, a restore) is kilobytes
            // that every request's future would otherwise carry and have moved into place,
            // whichever store serves it. Next to a round trip, the allocation costs nothing.
            AnyStore::Redis(s) => Box::pin(s.acquire(pool, want)).await,
        }
    }

    async fn release(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.release(pool, upstream, lease, outcome, latency).await,
            // Boxed, as acquire.
            AnyStore::Redis(s) => {
                Box::pin(s.release(pool, upstream, lease, outcome, latency)).await
            }
        }
    }

    async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.record(pool, upstream, outcome, latency).await)
    }

    async fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> Result<Option<UpstreamId>, StoreError> {
        dispatch!(self, s => s.session_upstream(pool, key).await)
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.extend(pool, upstream, lease).await)
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
        believed: Option<MemberState>,
    ) -> Result<(), StoreError> {
        dispatch!(self, s => s.set_member(pool, upstream, state, believed).await)
    }

    async fn end_session(&self, pool: &str, key: &str) -> Result<bool, StoreError> {
        dispatch!(self, s => s.end_session(pool, key).await)
    }

    async fn unbind(&self, pool: &str, key: &str, upstream: &UpstreamId) -> Result<(), StoreError> {
        dispatch!(self, s => s.unbind(pool, key, upstream).await)
    }

    fn release_signal(&self, pool: &str) -> Arc<Notify> {
        dispatch!(self, s => s.release_signal(pool))
    }

    async fn status(&self, pool: &str) -> Result<PoolStatus, StoreError> {
        dispatch!(self, s => s.status(pool).await)
    }

    fn kind(&self) -> &'static str {
        dispatch!(self, s => s.kind())
    }

    fn health(&self) -> &'static str {
        dispatch!(self, s => s.health())
    }

    fn health_reason(&self) -> Option<String> {
        dispatch!(self, s => s.health_reason())
    }

    async fn lock(&self, name: &str, ttl: Duration) -> Result<Option<LockToken>, StoreError> {
        dispatch!(self, s => s.lock(name, ttl).await)
    }

    async fn extend_lock(
        &self,
        name: &str,
        token: &LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        dispatch!(self, s => s.extend_lock(name, token, ttl).await)
    }

    async fn unlock(&self, name: &str, token: &LockToken) -> Result<bool, StoreError> {
        dispatch!(self, s => s.unlock(name, token).await)
    }

    fn subscribe_member_changes(&self) -> broadcast::Receiver<MemberChange> {
        dispatch!(self, s => s.subscribe_member_changes())
    }

    async fn put_listed(&self, pool: &str, list: &str) -> Result<(), StoreError> {
        dispatch!(self, s => s.put_listed(pool, list).await)
    }

    async fn listed(&self, pool: &str) -> Result<Option<String>, StoreError> {
        dispatch!(self, s => s.listed(pool).await)
    }

    fn subscribe_listed_changes(&self) -> broadcast::Receiver<String> {
        dispatch!(self, s => s.subscribe_listed_changes())
    }
}
