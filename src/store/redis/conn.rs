//! Reaching Redis, and coping while it cannot be reached: the connection (one server or a
//! cluster), bounded calls, and degraded mode (the switch to the local view, the backlog of
//! missed writes, reconnection and replay).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use redis::FromRedisValue;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use super::release::Release;
use super::scripts::Call;
use super::{
    CONFIGURE_TIMEOUT, Fault, Inner, RedisSettings, Target, UNLISTED_LEASE, locked, parse_target,
};
use crate::store::{LeaseId, MemberState, StoreError};
use crate::upstream::UpstreamId;

/// First and longest pause between reconnection attempts.
pub(super) const RECONNECT_MIN: Duration = Duration::from_millis(100);
pub(super) const RECONNECT_MAX: Duration = Duration::from_secs(2);
/// Writes kept for replay while Redis is unreachable. Past this the oldest are dropped: their
/// leases expire by themselves within `lease_ttl`.
const MAX_BACKLOG: usize = 100_000;
/// Failed reconnection attempts in a row after which the connection is replaced by a new one.
const FRESH_CONNECTION_AFTER: u32 = 3;

/// One connection handle, cloned per call.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[expect(
    clippy::large_enum_variant,
    reason = "one per store, built once and never moved on the hot path"
)]
pub(super) enum Remote {
    /// Reconnects by itself after a failed command; replaced whole when calls keep timing out
    /// (a connection whose peer vanished without closing it never fails, it only goes silent).
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
        manager: ArcSwap<ConnectionManager>,
    },
    /// Connected on first use (and again after a failed first connection).
    Cluster {
        client: Box<ClusterClient>,
        conn: ArcSwapOption<ClusterConnection>,
        connecting: tokio::sync::Mutex<()>,
    },
}

/// A write Redis missed while unreachable, replayed when it is back.
#[derive(Debug)]
pub(super) enum Deferred {
    Release {
        pool: String,
        release: Release,
    },
    Unbind {
        pool: String,
        key: String,
        upstream: UpstreamId,
    },
    Member {
        pool: String,
        upstream: UpstreamId,
        state: MemberState,
    },
}

#[derive(Default)]
pub(super) struct Backlog {
    writes: VecDeque<Deferred>,
    /// The latest setting per member (only the last one matters).
    members: HashMap<(String, UpstreamId), MemberState>,
}

impl Backlog {
    fn push(&mut self, d: Deferred) {
        match d {
            Deferred::Member {
                pool,
                upstream,
                state,
            } => {
                self.members.insert((pool, upstream), state);
            }
            other => {
                if self.writes.len() >= MAX_BACKLOG {
                    self.writes.pop_front();
                }
                self.writes.push_back(other);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.members.is_empty()
    }
}

/// A client for the same server speaking RESP3, which lets one connection both subscribe and
/// answer PINGs.
fn resp3(client: &redis::Client) -> redis::RedisResult<redis::Client> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings))
}

/// `poolgate:<instance id>`, with anything Redis would refuse in a client name replaced.
pub(super) fn client_name(instance: &str) -> String {
    let clean: String = instance
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("poolgate:{clean}")
}

/// The command connection (made on first use) and the RESP3 clients for the events connection.
pub(super) fn connect(
    settings: &RedisSettings,
    redacted: &str,
) -> Result<(Remote, Vec<redis::Client>), StoreError> {
    let bad = |what: &str| StoreError::Unavailable(format!("redis {redacted}: {what}"));
    let target = parse_target(&settings.url).map_err(|e| bad(&e))?;
    let connected = match target {
        Target::Single(url) => {
            let client = redis::Client::open(url.as_str()).map_err(|_| bad("invalid URL"))?;
            let events = resp3(&client).map_err(|_| bad("invalid URL"))?;
            // Responses are bounded per call (see `Inner::eval`), so the connection itself
            // has no response timeout: a large pool's declaration may take longer.
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(settings.timeout))
                .set_response_timeout(None)
                .set_number_of_retries(1)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            let manager = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                .map_err(|e| bad(&e.to_string()))?;
            (
                Remote::Single {
                    client,
                    config,
                    manager: ArcSwap::from_pointee(manager),
                },
                vec![events],
            )
        }
        Target::Cluster(nodes) => {
            let client = ClusterClient::builder(nodes.clone())
                .connection_timeout(settings.timeout)
                .response_timeout(CONFIGURE_TIMEOUT)
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100)
                .build()
                .map_err(|_| bad("invalid cluster URL"))?;
            let events = nodes
                .iter()
                .map(|n| redis::Client::open(n.as_str()).and_then(|c| resp3(&c)))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| bad("invalid cluster URL"))?;
            (
                Remote::Cluster {
                    client: Box::new(client),
                    conn: ArcSwapOption::empty(),
                    connecting: tokio::sync::Mutex::new(()),
                },
                events,
            )
        }
    };
    Ok(connected)
}

impl Inner {
    async fn conn(&self) -> Result<Conn, Fault> {
        match &self.remote {
            Remote::Single { manager, .. } => Ok(Conn::Single((**manager.load()).clone())),
            Remote::Cluster {
                client,
                conn,
                connecting,
            } => {
                if let Some(c) = conn.load_full() {
                    return Ok(Conn::Cluster((*c).clone()));
                }
                let _one_at_a_time = connecting.lock().await;
                if let Some(c) = conn.load_full() {
                    return Ok(Conn::Cluster((*c).clone()));
                }
                let c = client
                    .get_async_connection()
                    .await
                    .map_err(Fault::from_redis)?;
                conn.store(Some(Arc::new(c.clone())));
                Ok(Conn::Cluster(c))
            }
        }
    }

    /// Drops the current connection for a new one (made on next use).
    fn fresh_connection(&self) {
        match &self.remote {
            Remote::Single {
                client,
                config,
                manager,
            } => match ConnectionManager::new_lazy_with_config(client.clone(), config.clone()) {
                Ok(m) => manager.store(Arc::new(m)),
                Err(e) => tracing::debug!(error = %e, "cannot prepare a new redis connection"),
            },
            Remote::Cluster { conn, .. } => conn.store(None),
        }
    }

    /// Runs a script (EVALSHA, reloading it after NOSCRIPT), bounded by `limit`.
    pub(super) async fn eval<T: FromRedisValue>(
        &self,
        inv: &Call,
        limit: Duration,
    ) -> Result<T, Fault> {
        let call = async {
            let mut conn = self.conn().await?;
            inv.invoke(&mut conn).await.map_err(Fault::from_redis)
        };
        match tokio::time::timeout(limit, call).await {
            Ok(r) => r,
            Err(_) => Err(Fault::Down(format!(
                "no answer within {}ms",
                limit.as_millis()
            ))),
        }
    }

    /// Sends one plain command, bounded by the store timeout.
    pub(super) async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Fault> {
        let call = async {
            let mut conn = self.conn().await?;
            cmd.query_async(&mut conn).await.map_err(Fault::from_redis)
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(Fault::Down(format!(
                "no answer within {}ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// Switches to the local view (once) and makes sure a reconnection is under way.
    pub(super) fn degrade(self: &Arc<Self>, why: &str) {
        if !self.degraded.swap(true, Ordering::SeqCst) {
            *locked(&self.degraded_since) = Some(std::time::Instant::now());
            tracing::warn!(
                store = %self.redacted, reason = why,
                "redis unreachable: serving from this instance's local view (store degraded)"
            );
            // Waiting requests should retry against the local view.
            self.notify_all();
        }
        if !self.recovering.swap(true, Ordering::SeqCst) {
            let inner = self.clone();
            tokio::spawn(async move { inner.recover().await });
        }
    }

    /// Keeps `make()` for replay if the store is degraded (decided under the backlog lock, so a
    /// recovery that is finishing cannot miss it). Returns whether it was kept.
    pub(super) fn defer_if_degraded(&self, make: impl FnOnce() -> Deferred) -> bool {
        let mut backlog = locked(&self.backlog);
        if !self.is_degraded() {
            return false;
        }
        backlog.push(make());
        true
    }

    /// Keeps a write Redis may have missed and goes degraded.
    pub(super) fn defer_and_degrade(self: &Arc<Self>, d: Deferred, why: &str) {
        locked(&self.backlog).push(d);
        self.degrade(why);
    }

    /// Keeps the release of each of `leases` for replay and goes degraded: for calls Redis may
    /// or may not have run, so the replay records no outcome (it may be counted already).
    pub(super) fn replay_quietly(
        self: &Arc<Self>,
        pool: &str,
        leases: impl IntoIterator<Item = LeaseId>,
        why: &str,
    ) {
        {
            let mut backlog = locked(&self.backlog);
            // An unlisted lease leaves nothing in Redis to cancel.
            for lease in leases.into_iter().filter(|l| l.0 & UNLISTED_LEASE == 0) {
                backlog.push(Deferred::Release {
                    pool: pool.to_string(),
                    release: Release::quiet(lease),
                });
            }
        }
        self.degrade(why);
    }

    /// Names the command connection `poolgate:<instance id>` (`CLIENT LIST`, `MONITOR`). Sent on
    /// every pool declaration and every recovery, which covers every reconnection: the
    /// connection is only replaced after a failed command, and a failure makes the store recover.
    pub(super) async fn name_connection(&self) -> Result<(), Fault> {
        let name = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(&self.client_name)
            .clone();
        self.query::<()>(&name).await
    }

    /// Reconnects with backoff until Redis answers and the backlog is replayed.
    async fn recover(self: Arc<Self>) {
        loop {
            let mut delay = RECONNECT_MIN;
            let mut failures = 0u32;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = self.stop.cancelled() => {
                        self.recovering.store(false, Ordering::SeqCst);
                        return;
                    }
                }
                match self.try_recover().await {
                    Ok(()) => break,
                    Err(Fault::Down(why)) => {
                        tracing::debug!(store = %self.redacted, reason = %why, "redis still unreachable");
                        delay = (delay * 2).min(RECONNECT_MAX);
                        failures += 1;
                        if failures % FRESH_CONNECTION_AFTER == 0 {
                            self.fresh_connection();
                        }
                    }
                    Err(Fault::Broken(why)) => {
                        tracing::warn!(store = %self.redacted, reason = %why, "redis answers but refuses the shared state; still degraded");
                        delay = RECONNECT_MAX;
                    }
                }
            }
            self.recovering.store(false, Ordering::SeqCst);
            // A failure between the switch back and here found `recovering` set and spawned
            // nothing: pick it up.
            if !self.is_degraded() || self.recovering.swap(true, Ordering::SeqCst) {
                return;
            }
        }
    }

    /// One reconnection attempt: name the connection, re-declare every pool, re-apply member
    /// settings, replay the backlog, then leave degraded mode.
    async fn try_recover(&self) -> Result<(), Fault> {
        self.name_connection().await?;
        let mut restored = 0usize;
        for p in self.all_pools() {
            if self.configure_remote(&p).await? {
                restored += self.reapply_all(&p).await?;
            }
        }
        let mut replayed = 0usize;
        loop {
            let (writes, members) = {
                let mut backlog = locked(&self.backlog);
                if backlog.is_empty() {
                    self.degraded.store(false, Ordering::SeqCst);
                    break;
                }
                (
                    std::mem::take(&mut backlog.writes),
                    std::mem::take(&mut backlog.members),
                )
            };
            replayed += writes.len() + members.len();
            self.replay(writes, members).await?;
        }
        let outage = locked(&self.degraded_since)
            .take()
            .map_or(0, |t| t.elapsed().as_millis() as u64);
        tracing::info!(
            store = %self.redacted, outage_ms = outage, replayed, restored,
            "redis reachable again: shared state in use (store ok)"
        );
        self.notify_all();
        Ok(())
    }

    /// Applies missed writes; on failure puts back what was not applied.
    async fn replay(
        &self,
        writes: VecDeque<Deferred>,
        members: HashMap<(String, UpstreamId), MemberState>,
    ) -> Result<(), Fault> {
        let mut members: Vec<_> = members.into_iter().collect();
        while let Some(((pool, upstream), state)) = members.pop() {
            let Ok(p) = self.pool(&pool) else { continue };
            if let Err(f) = self.set_member_remote(&p, &upstream, state, None).await {
                let mut backlog = locked(&self.backlog);
                members.push(((pool, upstream), state));
                for (k, v) in members {
                    backlog.members.entry(k).or_insert(v);
                }
                for w in writes.into_iter().rev() {
                    backlog.writes.push_front(w);
                }
                return Err(f);
            }
        }
        let mut writes = writes;
        while let Some(w) = writes.pop_front() {
            let done = match &w {
                Deferred::Release { pool, release } => match self.pool(pool) {
                    Ok(p) => {
                        let done = self
                            .release_remote(&p, std::slice::from_ref(release), &Default::default())
                            .await
                            .map(drop);
                        if done.is_ok()
                            && let (Some(up), Some(outcome)) = (&release.upstream, release.outcome)
                        {
                            locked(&p.stats).add(up, outcome, release.latency);
                        }
                        done
                    }
                    Err(_) => Ok(()),
                },
                Deferred::Unbind {
                    pool,
                    key,
                    upstream,
                } => match self.pool(pool) {
                    Ok(p) => self.unbind_remote(&p, key, upstream).await,
                    Err(_) => Ok(()),
                },
                Deferred::Member { .. } => Ok(()),
            };
            if let Err(f) = done {
                let mut backlog = locked(&self.backlog);
                writes.push_front(w);
                for w in writes.into_iter().rev() {
                    backlog.writes.push_front(w);
                }
                return Err(f);
            }
        }
        Ok(())
    }
}
