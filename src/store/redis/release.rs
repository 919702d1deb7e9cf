//! Ending and extending leases, and sending what exchanges recorded: releases batched per pool
//! (most posted without waiting, see [`RedisStore::release_now`]), the statistics they leave and
//! the reports of unlisted leases (see `stats.rs` and `held.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::conn::Deferred;
use super::scripts::{self, Call};
use super::{
    FALLBACK_LEASE, Fault, Inner, PoolLocal, RedisStore, UNLISTED_LEASE, broken, held, locked,
    millis, now_ms, stats, takes_unlisted_leases,
};
use crate::outcome::Outcome;
use crate::store::{LeaseId, Store, StoreError};
use crate::upstream::UpstreamId;

/// One lease to end, and what its exchange recorded.
#[derive(Debug, Clone)]
pub(super) struct Release {
    /// `None` records nothing (see [`Release::quiet`]).
    pub(super) upstream: Option<UpstreamId>,
    pub(super) lease: LeaseId,
    /// `None` records nothing, like a `None` upstream.
    pub(super) outcome: Option<Outcome>,
    pub(super) latency: Duration,
}

impl Release {
    /// Ends `lease` and records nothing: for a lease whose acquire timed out (it may have been
    /// granted all the same) and for a release already sent once, whose outcome may be counted.
    pub(super) fn quiet(lease: LeaseId) -> Release {
        Release {
            upstream: None,
            lease,
            outcome: None,
            latency: Duration::ZERO,
        }
    }
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
pub(super) async fn flush_periodically(inner: Arc<Inner>) {
    let mut tick = tokio::time::interval(stats::FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = inner.stop.cancelled() => return,
            _ = tick.tick() => inner.flush(),
        }
    }
}

impl RedisStore {
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
        self.inner
            .release_now(pool, upstream, lease, outcome, latency)
    }
}

impl Inner {
    /// See [`RedisStore::release_now`].
    pub(super) fn release_now(
        self: &Arc<Self>,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        if let Some((p, r)) = self.to_send(pool, upstream, lease, outcome, latency)? {
            p.releases.post(r, || release_sender(self, pool, &p));
        }
        Ok(())
    }

    /// [`Store::release`], waiting for the call that carries it.
    pub(super) async fn release(
        self: &Arc<Self>,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let Some((p, r)) = self.to_send(pool, upstream, lease, outcome, latency)? else {
            return Ok(());
        };
        if let Err(Fault::Down(why)) = p.releases.send(r, || release_sender(self, pool, &p)).await {
            // The call carrying it was abandoned; it may have run all the same.
            self.replay_quietly(pool, [lease], &why);
        }
        Ok(())
    }

    pub(super) async fn extend(
        self: &Arc<Self>,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
    ) -> Result<(), StoreError> {
        let p = self.pool(pool)?;
        if lease.0 & FALLBACK_LEASE != 0 {
            let local = LeaseId(lease.0 & !FALLBACK_LEASE);
            let r = self.fallback.extend(pool, upstream, local).await;
            let until = tokio::time::Instant::now() + p.spec.load().lease_ttl;
            locked(&p.held).extend_carried(local, until);
            return r;
        }
        // An unlisted lease lives as long as this instance's reports do.
        if self.is_degraded() || lease.0 & UNLISTED_LEASE != 0 {
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
        match self.query::<i64>(&cmd).await {
            Ok(_) => Ok(()),
            Err(Fault::Down(why)) => {
                self.degrade(&why);
                Ok(())
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }

    pub(super) async fn record(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<(), StoreError> {
        let p = self.pool(pool)?;
        if self.is_degraded() {
            return self.fallback.record(pool, upstream, outcome, latency).await;
        }
        match self.record_remote(&p, upstream, outcome, latency).await {
            Ok(()) => Ok(()),
            // Statistics are best effort: a lost count is not worth failing anyone for.
            Err(Fault::Down(why) | Fault::Broken(why)) => {
                tracing::debug!(pool, error = %why, "could not record an outcome in redis");
                self.fallback.record(pool, upstream, outcome, latency).await
            }
        }
    }

    /// The release that must go to Redis, or `None` when it is done already: a lease of the local
    /// view ends there, an unlisted lease here (its outcome joins the pending statistics), and
    /// while degraded the release waits in the backlog for replay. A lease Redis granted leaves
    /// this instance's count of them (`held.rs`, `live.rs`) at once, and so, while degraded, the
    /// local view's.
    fn to_send(
        &self,
        pool: &str,
        upstream: &UpstreamId,
        lease: LeaseId,
        outcome: Outcome,
        latency: Duration,
    ) -> Result<Option<(Arc<PoolLocal>, Release)>, StoreError> {
        let p = self.pool(pool)?;
        if lease.0 & FALLBACK_LEASE != 0 {
            let local = LeaseId(lease.0 & !FALLBACK_LEASE);
            let r = self
                .fallback
                .release_now(pool, upstream, local, outcome, latency);
            // After this, so that a recovery listing the local view's leases either sees it no
            // more or has carried it already.
            locked(&p.held).uncarry(local);
            p.wake();
            return r.map(|()| None);
        }
        if lease.0 & UNLISTED_LEASE != 0 {
            locked(&p.held).end(upstream);
            if self.recount(pool, &p, upstream) {
                p.wake();
            }
            locked(&p.stats).add(upstream, outcome, latency);
            return Ok(None);
        }
        p.live.end(upstream);
        if self.recount(pool, &p, upstream) {
            // The local view counted this lease against the cap: its capacity is free there.
            p.wake();
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
        if self.defer_if_degraded(deferred) {
            return Ok(None);
        }
        Ok(Some((p, r)))
    }

    /// Sends the pending statistics of every pool, each in a call of its own, and the report of
    /// its unlisted leases (see `held.rs`) in another. The calls are tracked like releases, so
    /// `settle` waits for them; one that finds Redis unreachable puts its figures back for the
    /// next flush. Nothing is sent while degraded.
    pub(super) fn flush(self: &Arc<Self>) {
        if self.is_degraded() {
            return;
        }
        for p in self.all_pools() {
            let report = locked(&p.held).report(tokio::time::Instant::now());
            if let Some(report) = report {
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
    pub(super) async fn release_remote(
        &self,
        p: &PoolLocal,
        releases: &[Release],
        stats: &stats::Taken,
    ) -> Result<bool, Fault> {
        let k = &p.keys;
        let cap = p.spec.load().max_concurrency.unwrap_or(0);
        let mut inv = Call::new(&scripts::RELEASE, 8);
        // Under a cap, "freed" counts the unlisted leases other gateways report (the reports'
        // keys are read only then); a release moves the least-connections load index, which any
        // instance may keep, whatever this one's strategy.
        for key in k.release() {
            inv.key(key);
        }
        inv.arg(cap).arg(&k.events).arg(releases.len());
        for r in releases {
            inv.arg(r.lease.0);
        }
        for (field, amount) in stats.pairs() {
            inv.arg(field).arg(amount);
        }
        if cap > 0 {
            inv.arg(now_ms());
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
}
