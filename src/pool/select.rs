//! Choosing an upstream for one attempt: sticky or by strategy, waiting for capacity when every
//! candidate is at its cap.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ProxyError;
use crate::health::Outcome;
use crate::pool::{Lease, Pool};
use crate::session::SessionKey;
use crate::state::Gateway;
use crate::store::{Acquired, Store, Want};
use crate::upstream::UpstreamId;

/// How many members of a session's consistent-hash order are offered to the store; the store binds
/// the first one still in service.
const PREFERRED_CANDIDATES: usize = 4;

/// Where a request goes: its pool and, when sticky, its session.
pub struct Route {
    pub pool: Arc<Pool>,
    pub session: Option<SessionPlan>,
    /// The target host, for per-target health.
    pub target_host: Arc<str>,
}

pub struct SessionPlan {
    pub key: SessionKey,
    pub ttl: Duration,
    /// The gateway minted the key for this request (`X-Pool-Session: create`).
    pub minted: bool,
}

/// Leases an upstream for `route`, skipping those already `tried`. Waits up to the pool's
/// `queue_timeout` when every candidate is at its concurrency cap, woken by releases.
pub async fn acquire(
    gw: &Gateway,
    route: &Route,
    tried: &[UpstreamId],
) -> Result<Lease, ProxyError> {
    let pool = &route.pool;
    let deadline = Instant::now() + pool.config.queue_timeout;
    let signal = gw.store.release_signal(pool.name());
    loop {
        // Registered before asking, so a release between the answer and the wait is not missed.
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        let preferred;
        let want = match &route.session {
            None => Want::Any { exclude: tried },
            Some(s) => {
                preferred = pool
                    .placement
                    .preferred(s.key.as_str(), PREFERRED_CANDIDATES, tried);
                Want::Session {
                    key: s.key.as_str(),
                    ttl: s.ttl,
                    preferred: &preferred,
                    rebind: pool.config.rebind_on_failure,
                }
            }
        };
        match gw.store.acquire(pool.name(), want).await? {
            Acquired::Granted(grant) => {
                // A member the store learnt of in a reload after this request took its pool
                // snapshot is found in the current pool set.
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
                    return Err(ProxyError::NoUpstream);
                };
                return Ok(Lease::new(
                    gw,
                    pool.clone(),
                    grant,
                    upstream,
                    route.target_host.clone(),
                ));
            }
            Acquired::AtCapacity => {}
            Acquired::SessionUnavailable(upstream) => {
                return Err(ProxyError::SessionUpstreamUnavailable {
                    upstream,
                    cause: None,
                });
            }
            Acquired::NoCandidates => return Err(ProxyError::NoUpstream),
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            return Err(ProxyError::PoolExhausted);
        }
    }
}
