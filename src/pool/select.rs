//! Choosing an upstream for one attempt: sticky or by strategy, waiting for capacity when every
//! candidate is at its cap and for rate limits ([`crate::ratelimit`]) when every candidate is
//! at its limit.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;
use xxhash_rust::xxh3::xxh3_128;

use crate::error::ProxyError;
use crate::outcome::Outcome;
use crate::pool::Pool;
use crate::pool::filter::FilterView;
use crate::pool::lease::Lease;
use crate::ratelimit::{Blocked, Refusal, Scope};
use crate::session::SessionKey;
use crate::state::Gateway;
use crate::store::{Acquired, Grant, Store, Want};
use crate::upstream::{Upstream, UpstreamId};

/// How many members of a session's consistent-hash order are offered to the store at first (per
/// shard of the pool); the store binds the first one in service and below its cap. When none of them is, the offer grows
/// fourfold (up to the whole pool) before the request waits or fails, so a new session is never
/// refused while a member further along its order could take it.
const PREFERRED_CANDIDATES: usize = 4;
/// Granted members unknown to this instance that a request asks past before it gives up (503
/// `no-upstream-available`): a reload in progress leaves a few, never many.
const MAX_UNKNOWN: usize = 8;

/// Where a request goes: its pool and, when sticky, its session.
pub struct Route {
    pub pool: Arc<Pool>,
    /// The members the request's labels leave, when it asked for a kind of exit.
    pub filter: Option<Arc<FilterView>>,
    pub session: Option<SessionPlan>,
    /// The target host, for per-target health and rate limits.
    pub target_host: Arc<str>,
    /// The authenticated client user, for the per-user rate limit.
    pub user: Option<Arc<str>>,
}

impl Route {
    /// What a provider upstream's `{name}` placeholder holds for this request: `{session}` a
    /// stable id of the session (32 hex characters, the same on every instance, a fresh random
    /// one per request without a session); `{<label>}` the request's value for it when it asked
    /// for one, else the member's own label, else the first of the request's alternatives.
    pub fn placeholder(&self, upstream: &Upstream, name: &str) -> Option<String> {
        if name == "session" {
            let id = match &self.session {
                Some(s) => xxh3_128(format!("{}\n{}", self.pool.name(), s.binding).as_bytes()),
                None => rand::random::<u128>(),
            };
            return Some(format!("{id:032x}"));
        }
        let asked = self
            .filter
            .as_ref()
            .and_then(|f| f.filter.pairs().iter().find(|(k, _)| k == name))
            .map(|(_, values)| values.as_slice());
        match asked {
            Some([one]) => Some(one.clone()),
            _ => upstream
                .labels
                .get(name)
                .map(str::to_string)
                .or_else(|| asked.and_then(|v| v.first().cloned())),
        }
    }
}

pub struct SessionPlan {
    pub key: SessionKey,
    /// The binding's name in the store: the key, and inside a label filter the filter too
    /// (`s1|country=us`), so the same key with another filter is another session.
    pub binding: String,
    pub ttl: Duration,
    /// The gateway minted the key for this request (`X-Pool-Session: create`).
    pub minted: bool,
}

/// Leases an upstream for `route`, skipping those already `tried`. Waits up to the pool's
/// `queue_timeout` when every candidate is at its concurrency cap (woken by releases) or at its
/// rate limit (woken when the first bucket frees up).
///
/// Rate limits: upstreams known to refuse are excluded before the store is asked; a granted
/// upstream whose bucket refuses after all is handed back at once as `cancelled` (which moves no
/// health) and the store is asked again. A request that has to wait lines up behind those
/// already waiting for the same target. A session never moves: it waits for its own upstream.
/// Past the deadline, or when no bucket can free up before it, the answer is 429 `rate-limited`
/// if rate limits stopped the request, 503 `pool-exhausted` if only capacity did.
pub async fn acquire(
    gw: &Gateway,
    route: &Route,
    tried: &[UpstreamId],
) -> Result<Lease, ProxyError> {
    let pool = &route.pool;
    let deadline = Instant::now() + pool.config.queue_timeout;
    let limits = gw.ratelimits.pool(pool.name(), &pool.config.rate_limit);
    let target = &route.target_host;
    let sticky = route.session.is_some();
    let mut waited = false;
    // Held while waiting on this target's limits: first come, first served.
    let mut queued = None;
    if let (Some(l), false) = (&limits, sticky) {
        if let Some(queue) = l.busy_queue(target) {
            let blocked = l.blocked(target, Instant::now());
            let scope = earliest(&blocked).map_or(Scope::UpstreamTarget, |r| r.scope);
            gw.metrics.rate_limit_waited(pool.name(), scope);
            waited = true;
            queued = Some(line_up(gw, route, queue, deadline, scope).await?);
        }
    }
    // Waits for a release. Registered before an ask, so a release between the answer and the
    // wait is not missed; and only once an ask found every candidate at its cap, so that the
    // usual first ask, which finds capacity, neither registers nor looks up the signal.
    let mut waiter: Option<Pin<Box<OwnedNotified>>> = None;
    // A sharded pool binds a session within its shard, among the offered members that live
    // there: offer enough that about PREFERRED_CANDIDATES do.
    let mut offer = PREFERRED_CANDIDATES * pool.config.shards as usize;
    // Granted members that no config of this instance lists, asked again without.
    let mut unknown: Vec<UpstreamId> = Vec::new();
    loop {
        let blocked = match (&limits, sticky) {
            (Some(l), false) => l.blocked(target, Instant::now()),
            _ => Vec::new(),
        };
        let exclude: Cow<'_, [UpstreamId]> = if blocked.is_empty() && unknown.is_empty() {
            Cow::Borrowed(tried)
        } else {
            let mut ids = tried.to_vec();
            ids.extend(blocked.iter().map(|b| b.upstream.clone()));
            ids.extend(unknown.iter().cloned());
            Cow::Owned(ids)
        };
        let preferred;
        // Whether members beyond those offered could still be asked (sessions only).
        let mut more = false;
        let within = route.filter.as_deref().map(FilterView::subset);
        let want = match &route.session {
            None => Want::Any {
                exclude: &exclude,
                within,
            },
            Some(s) => {
                let ring = route.filter.as_ref().map_or(&pool.placement, |f| &f.ring);
                preferred = ring.preferred(s.key.as_str(), offer, tried);
                more = preferred.len() == offer;
                Want::Session {
                    key: &s.binding,
                    ttl: s.ttl,
                    preferred: &preferred,
                    rebind: pool.config.rebind_on_failure,
                    within,
                }
            }
        };
        // What stops this round: the soonest-freed rate limit among the excluded, and capacity.
        let mut limited = earliest(&blocked);
        let mut at_capacity = false;
        let acquired = gw.store.acquire(pool.name(), want).await?;
        if more && matches!(acquired, Acquired::AtCapacity | Acquired::NoCandidates) {
            // Every member offered is out of service or at its cap: offer more of the order.
            offer = offer.saturating_mul(4);
            continue;
        }
        match acquired {
            Acquired::Granted(grant) => {
                let refused = limits
                    .as_ref()
                    .and_then(|l| l.check(&grant.upstream, target).err());
                if let Some(refusal) = refused {
                    // Not used: handed back as cancelled, which moves no health.
                    gw.store
                        .release(
                            pool.name(),
                            &grant.upstream,
                            grant.lease,
                            Outcome::Cancelled,
                            Duration::ZERO,
                        )
                        .await?;
                    if !sticky && Instant::now() < deadline {
                        // Its hint now excludes it: ask for another upstream at once.
                        continue;
                    }
                    limited = Some(refusal);
                } else if let Some(lease) = lease_for(gw, route, grant, &mut unknown).await? {
                    return Ok(lease);
                } else if !sticky && Instant::now() < deadline && unknown.len() < MAX_UNKNOWN {
                    // A member this instance's config does not list (a reload reaching the
                    // instances one by one): ask again without it.
                    continue;
                } else {
                    return Err(ProxyError::NoUpstream);
                }
            }
            Acquired::AtCapacity => at_capacity = true,
            Acquired::SessionUnavailable(upstream) => {
                return Err(ProxyError::SessionUpstreamUnavailable {
                    upstream,
                    cause: None,
                });
            }
            Acquired::NoCandidates if limited.is_some() => {}
            // Every member of the filter is out of service: as when all are at their cap, the
            // request waits for one to come back (or a release), then the pool is exhausted.
            Acquired::NoCandidates if route.filter.is_some() && tried.is_empty() => {
                at_capacity = true
            }
            Acquired::NoCandidates => return Err(ProxyError::NoUpstream),
        }
        if at_capacity && waiter.is_none() {
            let mut w = Box::pin(gw.store.release_signal(pool.name()).notified_owned());
            w.as_mut().enable();
            waiter = Some(w);
            // Asked again at once: a release since the answer above may have freed a place.
            continue;
        }
        let Some(refusal) = limited else {
            // Only capacity stopped this round, so the waiter is registered.
            if let Some(w) = waiter.take() {
                if tokio::time::timeout_at(deadline, w).await.is_err() {
                    return Err(ProxyError::PoolExhausted);
                }
            }
            continue;
        };
        let now = Instant::now();
        // No bucket frees up in time and no release can help: say so now rather than later.
        if now >= deadline || (refusal.ready_at > deadline && !at_capacity) {
            return Err(rejected(gw, route, refusal.scope, Some(refusal.ready_at)));
        }
        if !waited {
            gw.metrics.rate_limit_waited(pool.name(), refusal.scope);
            waited = true;
        }
        if queued.is_none() && !sticky {
            if let Some(l) = &limits {
                let queue = l.queue(target);
                queued = Some(line_up(gw, route, queue, deadline, refusal.scope).await?);
                continue;
            }
        }
        let wake = tokio::time::sleep_until(refusal.ready_at.min(deadline));
        match &mut waiter {
            Some(released) if at_capacity => {
                tokio::select! {
                    _ = wake => {}
                    _ = released => {}
                }
                waiter = None;
            }
            // A registered waiter stays so for the next round.
            _ => wake.await,
        }
    }
}

/// Waits for this request's turn among those waiting on the target's limits, up to `deadline`.
async fn line_up(
    gw: &Gateway,
    route: &Route,
    queue: Arc<tokio::sync::Mutex<()>>,
    deadline: Instant,
    scope: Scope,
) -> Result<tokio::sync::OwnedMutexGuard<()>, ProxyError> {
    tokio::time::timeout_at(deadline, queue.lock_owned())
        .await
        .map_err(|_| rejected(gw, route, scope, None))
}

/// The soonest-freed of the blocked upstreams.
fn earliest(blocked: &[Blocked]) -> Option<Refusal> {
    blocked.iter().map(|b| b.refusal).min_by_key(|r| r.ready_at)
}

/// Counts a 429 and builds it, with `Retry-After` when the bucket says when.
fn rejected(gw: &Gateway, route: &Route, scope: Scope, ready_at: Option<Instant>) -> ProxyError {
    gw.metrics.rate_limit_rejected(route.pool.name(), scope);
    tracing::debug!(pool = route.pool.name(), target = %route.target_host, scope = scope.as_str(), "rate limited");
    ProxyError::RateLimited {
        scope,
        retry_after: ready_at.map(|t| t.saturating_duration_since(Instant::now())),
    }
}

/// The lease for a grant, with its upstream as configured; `None` when no config of this
/// instance lists its upstream (handed back at once, as cancelled, and added to `unknown`).
async fn lease_for(
    gw: &Gateway,
    route: &Route,
    grant: Grant,
    unknown: &mut Vec<UpstreamId>,
) -> Result<Option<Lease>, ProxyError> {
    let pool = &route.pool;
    // A member the store learnt of in a reload after this request took its pool snapshot is
    // found in the current pool set.
    let upstream = pool.upstream(&grant.upstream).cloned().or_else(|| {
        let pools = gw.pools.load();
        let current = pools.get(Some(pool.name())).ok()?;
        current.upstream(&grant.upstream).cloned()
    });
    let Some(upstream) = upstream else {
        // The store knows a member no config does.
        gw.store
            .release(
                pool.name(),
                &grant.upstream,
                grant.lease,
                Outcome::Cancelled,
                Duration::ZERO,
            )
            .await?;
        unknown.push(grant.upstream);
        return Ok(None);
    };
    Ok(Some(Lease::new(
        gw.store.clone(),
        gw.tasks.clone(),
        gw.metrics.clone(),
        pool.clone(),
        grant,
        upstream,
        route.target_host.clone(),
    )))
}

/// The per-user rate limit, checked once per request before any upstream is asked for. Waits
/// up to the pool's `queue_timeout` for the user's next turn; 429 `rate-limited` past it, or at
/// once when the turn comes later than that.
pub async fn admit_user(gw: &Gateway, route: &Route) -> Result<(), ProxyError> {
    let Some(user) = &route.user else {
        return Ok(());
    };
    let rate = gw
        .live
        .load()
        .auth
        .users
        .get(&**user)
        .and_then(|u| u.rate_limit);
    let Some(rate) = rate else {
        return Ok(());
    };
    let limiter = gw.ratelimits.user(user, rate);
    let deadline = Instant::now() + route.pool.config.queue_timeout;
    let mut waited = false;
    // Each turn either passes or sleeps until a strictly later instant, and ends by the deadline.
    loop {
        let ready_at = match limiter.check() {
            Ok(()) => return Ok(()),
            Err(at) => at,
        };
        if ready_at > deadline {
            return Err(rejected(gw, route, Scope::User, Some(ready_at)));
        }
        if !waited {
            gw.metrics.rate_limit_waited(route.pool.name(), Scope::User);
            waited = true;
        }
        tokio::time::sleep_until(ready_at).await;
    }
}
