//! Pool state: who is leased, how often each upstream was used, which session is bound where.
//!
//! [`Store`] is the one interface; [`memory::MemoryStore`] keeps the state in this process (the
//! embedded default), and a Redis backend shares it between instances. Every decision that reads
//! and then writes (acquire, release, bind) is one atomic step of the store, so concurrent requests
//! never double-book an upstream or disagree about a session.

pub mod memory;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::sync::Notify;

use crate::config::Strategy;
use crate::health::Outcome;
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

/// What an acquire asks for.
#[derive(Clone, Copy, Debug)]
pub enum Want<'a> {
    /// Any eligible member by the pool's strategy, except those already tried.
    Any { exclude: &'a [UpstreamId] },
    /// The session's upstream; on first use the first of `preferred` (consistent-hash order) that
    /// is eligible gets bound.
    Session {
        key: &'a str,
        ttl: Duration,
        preferred: &'a [UpstreamId],
        /// Rebind instead of failing when the bound upstream is no longer a member.
        rebind: bool,
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
    fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

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
}

/// The configured backend. An enum rather than a trait object: the trait's async methods are not
/// object-safe, and a match costs nothing on the hot path.
pub enum AnyStore {
    Memory(memory::MemoryStore),
}

impl Store for AnyStore {
    async fn configure(&self, spec: PoolSpec) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.configure(spec).await,
        }
    }

    async fn acquire(&self, pool: &str, want: Want<'_>) -> Result<Acquired, StoreError> {
        match self {
            AnyStore::Memory(s) => s.acquire(pool, want).await,
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
        }
    }

    async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.record(pool, upstream, outcome, latency).await,
        }
    }

    async fn session_upstream(
        &self,
        pool: &str,
        key: &str,
    ) -> Result<Option<UpstreamId>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.session_upstream(pool, key).await,
        }
    }

    async fn extend(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.extend(pool, upstream, lease).await,
        }
    }

    async fn set_member(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
    ) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.set_member(pool, upstream, state).await,
        }
    }

    async fn unbind(&self, pool: &str, key: &str, upstream: &UpstreamId) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(s) => s.unbind(pool, key, upstream).await,
        }
    }

    fn release_signal(&self, pool: &str) -> Arc<Notify> {
        match self {
            AnyStore::Memory(s) => s.release_signal(pool),
        }
    }

    async fn status(&self, pool: &str) -> Result<PoolStatus, StoreError> {
        match self {
            AnyStore::Memory(s) => s.status(pool).await,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            AnyStore::Memory(s) => s.kind(),
        }
    }
}
