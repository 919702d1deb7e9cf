//! Pools and their members: declaring a pool (and declaring it again when Redis lost it), member
//! settings decided here or heard from other instances, and the shared upstream lists.

use std::sync::Arc;
use std::time::Duration;

use super::conn::Deferred;
use super::scripts::{self, Call};
use super::{Fault, Inner, PoolLocal, broken, locked, takes_unlisted_leases};
use crate::store::{MemberChange, MemberState, PoolSpec, Store, StoreError, shard};
use crate::upstream::UpstreamId;

/// Within this long after a pool's state was restored, another "unconfigured" answer is not
/// restored again (concurrent requests all notice the same loss).
const RESTORE_DEBOUNCE: Duration = Duration::from_secs(1);

/// A member setting as `set_member.lua` ranks it: 0 in service, 1 quarantined, 2 dead.
fn service_level(s: MemberState) -> u8 {
    match (s.eligible, s.keeps_sessions) {
        (true, _) => 0,
        (false, true) => 1,
        (false, false) => 2,
    }
}

/// The setting in a member's `state` field (`e|k|c|s|r`, see `acquire.lua`).
fn member_setting(field: &str) -> Option<MemberState> {
    let mut f = field.split('|');
    let eligible = f.next()? == "1";
    let keeps_sessions = f.next()? == "1";
    let cost = f.next()?.parse().ok()?;
    Some(MemberState {
        eligible,
        keeps_sessions,
        cost,
    })
}

impl Inner {
    pub(super) async fn configure(self: &Arc<Self>, spec: PoolSpec) -> Result<(), StoreError> {
        self.fallback.configure(spec.clone()).await?;
        let (p, new) = {
            let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
            match pools.get(&spec.name) {
                Some(p) => {
                    p.spec.store(Arc::new(spec.clone()));
                    p.live
                        .reconfigure(&spec.members, !takes_unlisted_leases(&spec));
                    p.clear_stocks();
                    (p.clone(), false)
                }
                None => {
                    let p = Arc::new(PoolLocal::new(
                        &self.prefix,
                        &spec,
                        self.signals.of(&spec.name),
                        &self.calls,
                    ));
                    pools.insert(spec.name.clone(), p.clone());
                    (p, true)
                }
            }
        };
        self.channels.send_modify(|c| {
            c.insert(p.keys.events.clone());
        });
        if self.is_degraded() {
            // The local view was declared afresh above: members it gained learn their counts.
            self.hold_pool_in_local_view(&p);
            // The recovery declares every pool.
            return Ok(());
        }
        let declared = match self.name_connection().await {
            Ok(()) => self.configure_remote(&p).await,
            Err(f) => Err(f),
        };
        match declared {
            Ok(fresh) => {
                if fresh {
                    tracing::info!(pool = %spec.name, store = %self.redacted, "pool declared in redis");
                }
                // Hear the pool's events before serving it (bounded: events are a latency
                // optimisation, never a reason not to serve).
                let mut subscribed = self.subscribed.subscribe();
                let heard = tokio::time::timeout(
                    self.timeout.max(Duration::from_secs(1)),
                    subscribed.wait_for(|s| s.contains(&p.keys.events)),
                )
                .await
                .is_ok_and(|r| r.is_ok());
                if !heard {
                    tracing::warn!(pool = %spec.name, "not yet subscribed to the pool's redis events");
                }
                if new {
                    self.adopt_member_settings(&p, &spec.name).await;
                }
                p.members_changed();
                Ok(())
            }
            Err(Fault::Down(why)) => {
                self.degrade(&why);
                Ok(())
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }

    /// Applies `state` to `upstream`, as decided from `believed` (`None`: from this instance's
    /// local view of it).
    pub(super) async fn set_member(
        self: &Arc<Self>,
        pool: &str,
        upstream: &UpstreamId,
        state: MemberState,
        believed: Option<MemberState>,
    ) -> Result<(), StoreError> {
        let p = self.pool(pool)?;
        // In this order: a refill that lands after the clear finds the new setting.
        locked(&p.applied).insert(upstream.clone(), state);
        p.clear_stocks();
        let believed = believed.or_else(|| self.fallback.member_state(pool, upstream));
        self.fallback
            .set_member(pool, upstream, state, None)
            .await?;
        let deferred = || Deferred::Member {
            pool: pool.to_string(),
            upstream: upstream.clone(),
            state,
        };
        if self.defer_if_degraded(deferred) {
            p.members_changed();
            return Ok(());
        }
        let mut restored = false;
        loop {
            match self.set_member_remote(&p, upstream, state, believed).await {
                Ok(-1) if !restored => {
                    restored = true;
                    // Restoring re-applies this setting with the others.
                    match self.restore_pool(&p).await {
                        Ok(()) => continue,
                        Err(Fault::Down(why)) => {
                            self.defer_and_degrade(deferred(), &why);
                            return Ok(());
                        }
                        Err(Fault::Broken(why)) => return Err(broken(why)),
                    }
                }
                Ok(2) => {
                    locked(&p.applied).remove(upstream);
                    tracing::info!(
                        pool, upstream = %upstream, eligible = state.eligible, cost = state.cost,
                        "health decision not applied: another instance moved the member out of service first"
                    );
                    self.adopt_member_setting(&p, pool, upstream).await;
                    return Ok(());
                }
                Ok(changed) => {
                    if changed == 1 {
                        p.members_changed();
                    }
                    return Ok(());
                }
                Err(Fault::Down(why)) => {
                    self.defer_and_degrade(deferred(), &why);
                    return Ok(());
                }
                Err(Fault::Broken(why)) => return Err(broken(why)),
            }
        }
    }

    pub(super) async fn put_listed(
        self: &Arc<Self>,
        pool: &str,
        list: &str,
    ) -> Result<(), StoreError> {
        let p = self.pool(pool)?;
        let mut inv = Call::new(&scripts::LISTED_PUT, 1);
        inv.key(&p.keys.listed)
            .arg(list)
            .arg(&p.keys.events)
            .arg(&self.instance);
        match self.eval::<i64>(&inv, self.timeout).await {
            Ok(_) => Ok(()),
            Err(Fault::Down(why)) => {
                self.degrade(&why);
                Err(StoreError::Unavailable(format!("redis unreachable: {why}")))
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }

    pub(super) async fn listed(self: &Arc<Self>, pool: &str) -> Result<Option<String>, StoreError> {
        let p = self.pool(pool)?;
        match self
            .query::<Option<String>>(redis::cmd("GET").arg(&p.keys.listed))
            .await
        {
            Ok(v) => Ok(v),
            Err(Fault::Down(why)) => {
                self.degrade(&why);
                Err(StoreError::Unavailable(format!("redis unreachable: {why}")))
            }
            Err(Fault::Broken(why)) => Err(broken(why)),
        }
    }

    /// Re-applies every member setting this instance made; returns how many.
    pub(super) async fn reapply_all(&self, p: &PoolLocal) -> Result<usize, Fault> {
        let applied: Vec<(UpstreamId, MemberState)> = locked(&p.applied)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for (upstream, state) in &applied {
            self.set_member_remote(p, upstream, *state, None).await?;
        }
        Ok(applied.len())
    }

    /// After Redis answered "unconfigured" (it lost its data): declares the pool again and
    /// re-applies this instance's member settings, once for a burst of requests noticing it.
    pub(super) async fn restore_pool(&self, p: &PoolLocal) -> Result<(), Fault> {
        let mut last = p.restoring.lock().await;
        if last.is_some_and(|t| t.elapsed() < RESTORE_DEBOUNCE) {
            return Ok(());
        }
        tracing::warn!(store = %self.redacted, "redis lost the pool's state: declaring it again");
        self.configure_remote(p).await?;
        self.reapply_all(p).await?;
        *last = Some(std::time::Instant::now());
        Ok(())
    }

    /// Runs `set_member.lua`: 1 changed, 0 unchanged or not a member, -1 pool state missing, 2
    /// refused. `believed` is the setting this instance last knew the member to have (`None`:
    /// apply unconditionally).
    pub(super) async fn set_member_remote(
        &self,
        p: &PoolLocal,
        upstream: &UpstreamId,
        state: MemberState,
        believed: Option<MemberState>,
    ) -> Result<i64, Fault> {
        let k = &p.keys;
        let mut inv = Call::new(&scripts::SET_MEMBER, 7);
        for key in k.set_member() {
            inv.key(key);
        }
        inv.arg(upstream.as_str())
            .arg(u8::from(state.eligible))
            .arg(u8::from(state.keeps_sessions))
            .arg(state.cost.max(1))
            .arg(&k.events)
            .arg(&self.instance);
        match believed {
            Some(b) => inv.arg(service_level(b)),
            None => inv.arg(""),
        };
        self.eval(&inv, self.timeout).await
    }

    /// Settings other instances applied while this one did not hear their events (before it
    /// served the pool, or while Redis was out of its reach) become the local view and reach its
    /// health view, as their events would have. Read in pages once the pool's events are heard,
    /// so nothing decided meanwhile is missed; a failed read leaves the view to the events to
    /// come.
    pub(super) async fn adopt_member_settings(&self, p: &PoolLocal, pool: &str) {
        let members = p.spec.load().members.len();
        let mut cursor = "0".to_string();
        // HSCAN visits every field in about members / COUNT pages; the bound is a guard.
        for _ in 0..members / 100 + 10 {
            let page: Result<(String, Vec<String>), Fault> = self
                .query(
                    redis::cmd("HSCAN")
                        .arg(&p.keys.state)
                        .arg(&cursor)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await;
            let (next, fields) = match page {
                Ok(page) => page,
                Err(f) => {
                    tracing::debug!(pool, error = ?f, "member settings not read at start");
                    return;
                }
            };
            for pair in fields.chunks_exact(2) {
                let upstream = UpstreamId::new(pair[0].as_str());
                let Some(state) = member_setting(&pair[1]) else {
                    continue;
                };
                if self
                    .fallback
                    .member_state(pool, &upstream)
                    .is_some_and(|local| local != state)
                {
                    self.member_changed_elsewhere(pool, upstream, state).await;
                }
            }
            if next == "0" {
                return;
            }
            cursor = next;
        }
    }

    /// After a refused decision: what Redis holds for `upstream` becomes the local view, as if
    /// its event had come now. It is on its way all the same, but may have been applied before
    /// the refused decision was, which the local view then still shows.
    async fn adopt_member_setting(&self, p: &PoolLocal, pool: &str, upstream: &UpstreamId) {
        let read: Result<Option<String>, Fault> = self
            .query(redis::cmd("HGET").arg(&p.keys.state).arg(upstream.as_str()))
            .await;
        match read.map(|v| v.as_deref().and_then(member_setting)) {
            Ok(Some(state)) => {
                self.member_changed_elsewhere(pool, upstream.clone(), state)
                    .await
            }
            Ok(None) => {}
            Err(f) => {
                tracing::debug!(pool, upstream = %upstream, error = ?f, "member setting not read back")
            }
        }
    }

    /// Applies a member change another instance published: to the local view, and to the
    /// subscribers of [`Store::subscribe_member_changes`].
    pub(super) async fn member_changed_elsewhere(
        &self,
        pool: &str,
        upstream: UpstreamId,
        state: MemberState,
    ) {
        tracing::info!(
            pool, upstream = %upstream, eligible = state.eligible,
            keeps_sessions = state.keeps_sessions, cost = state.cost,
            "member setting from another instance"
        );
        if let Err(e) = self.fallback.set_member(pool, &upstream, state, None).await {
            tracing::debug!(pool, error = %e, "member change for a pool this instance does not serve");
            return;
        }
        // Nobody listening is fine.
        let _ = self.changes.send(MemberChange {
            pool: shard::pool_of(pool).to_string(),
            upstream,
            state,
        });
    }
}
