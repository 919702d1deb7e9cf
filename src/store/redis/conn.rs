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
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

use super::release::Release;
use super::scripts::Call;
use super::{
    CONFIGURE_TIMEOUT, Fault, Inner, PoolLocal, RedisSettings, Target, UNLISTED_LEASE, locked,
    parse_target,
};
use crate::config::StoreTls;
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
    /// The master the sentinels name, asked again for every new connection: after a failover
    /// the old master refuses writes (READONLY) or is gone, and a fresh connection (see
    /// `recover`, and `sentinel.rs`, which drops the connection as soon as the sentinels name
    /// another master) is the one that finds the new master.
    Sentinel {
        /// Also serialises the asking, so concurrent callers share one answer.
        sentinel: Box<tokio::sync::Mutex<SentinelClient>>,
        /// The master's name as the sentinels know it.
        master_name: String,
        config: ConnectionManagerConfig,
        manager: ArcSwapOption<ConnectionManager>,
        /// The master's address last connected to, to log a change once.
        master: std::sync::Mutex<String>,
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
pub fn client_name(instance: &str) -> String {
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

/// The `TlsCertificates` of `store.tls_*`, or none to trust the system's roots.
fn certificates(tls: &StoreTls) -> Option<redis::TlsCertificates> {
    if tls.ca_pem.is_none() && tls.client_cert_pem.is_none() {
        return None;
    }
    let client_tls = match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        }),
        _ => None,
    };
    Some(redis::TlsCertificates {
        client_tls,
        root_cert: tls.ca_pem.clone(),
    })
}

/// A client for one server's URL, with `certs` when it is a `rediss://` one.
fn open(url: &str, certs: Option<&redis::TlsCertificates>) -> redis::RedisResult<redis::Client> {
    match certs {
        Some(certs) if url.starts_with("rediss://") => {
            redis::Client::build_with_tls(url, certs.clone())
        }
        _ => redis::Client::open(url),
    }
}

/// The settings of the single-server connection, shared by a sentinel's master connection.
fn manager_config(settings: &RedisSettings) -> ConnectionManagerConfig {
    // Responses are bounded per call (see `Inner::eval`), so the connection itself has no
    // response timeout: a large pool's declaration may take longer.
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_millis(500))
}

/// The command connection (made on first use) and the RESP3 clients for the events connection.
pub(super) fn connect(
    settings: &RedisSettings,
    redacted: &str,
) -> Result<(Remote, Vec<redis::Client>), StoreError> {
    let bad = |what: &str| StoreError::Unavailable(format!("redis {redacted}: {what}"));
    let target = parse_target(&settings.url).map_err(|e| bad(&e))?;
    let certs = certificates(&settings.tls);
    let connected = match target {
        Target::Single(url) => {
            let client = open(&url, certs.as_ref()).map_err(|e| bad(&tls_or_url(&e)))?;
            let events = resp3(&client).map_err(|_| bad("invalid URL"))?;
            let config = manager_config(settings);
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
            let mut builder = ClusterClient::builder(nodes.clone())
                .connection_timeout(settings.timeout)
                .response_timeout(CONFIGURE_TIMEOUT)
                .retries(2)
                .min_retry_wait(10)
                .max_retry_wait(100);
            if let Some(certs) = &certs {
                builder = builder.certs(certs.clone());
            }
            let client = builder.build().map_err(|e| bad(&tls_or_url(&e)))?;
            let events = nodes
                .iter()
                .map(|n| open(n, certs.as_ref()).and_then(|c| resp3(&c)))
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
        Target::Sentinel {
            sentinels,
            master,
            auth,
        } => {
            let auth = redis::Client::open(auth.as_str()).map_err(|_| bad("invalid URL"))?;
            let node = SentinelNodeConnectionInfo::default()
                .set_redis_connection_info(auth.get_connection_info().redis_settings().clone());
            let sentinel = SentinelClient::build(
                sentinels,
                master.clone(),
                Some(node),
                SentinelServerType::Master,
            )
            .map_err(|_| bad("invalid sentinel URL"))?;
            (
                Remote::Sentinel {
                    sentinel: Box::new(tokio::sync::Mutex::new(sentinel)),
                    master_name: master,
                    config: manager_config(settings),
                    manager: ArcSwapOption::empty(),
                    master: std::sync::Mutex::default(),
                },
                // Found through the sentinels on each connection (see `Inner::event_clients`).
                Vec::new(),
            )
        }
    };
    Ok(connected)
}

/// Why a client could not be built: the TLS files, or the URL.
fn tls_or_url(e: &redis::RedisError) -> String {
    if e.kind() == redis::ErrorKind::InvalidClientConfig || e.is_io_error() {
        format!("store.tls_*: {e}")
    } else {
        "invalid URL".into()
    }
}

/// The certificate problem in `e`'s chain, if the TLS handshake failed on one.
fn certificate_error(e: &redis::RedisError) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        let rustls_err = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(
            r @ (rustls::Error::InvalidCertificate(_)
            | rustls::Error::AlertReceived(_)
            | rustls::Error::NoCertificatesPresented),
        ) = rustls_err
        {
            return Some(r.to_string());
        }
        next = err.source();
    }
    let text = e.to_string();
    text.contains("invalid peer certificate").then_some(text)
}

/// A refusal that no retry will fix, as a start-up error naming the key to change; `None`
/// for anything else (an unreachable Redis only delays the start of the shared state).
pub(super) fn refusal(e: &redis::RedisError) -> Option<String> {
    use redis::{ErrorKind, ServerErrorKind};
    let code = e.code().unwrap_or("");
    if e.kind() == ErrorKind::AuthenticationFailed || code == "WRONGPASS" || code == "NOAUTH" {
        return Some(format!(
            "store.url: Redis refused the user name or password ({})",
            if code.is_empty() {
                "authentication failed"
            } else {
                code
            }
        ));
    }
    if e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm) {
        return Some(format!(
            "store.url: the Redis user lacks a permission poolgate needs ({e}); see docs/configuration.md, [store]"
        ));
    }
    if let Some(why) = certificate_error(e) {
        return Some(format!(
            "store.tls_ca_file: the TLS handshake with Redis failed on a certificate ({why}); \
             store.tls_ca_file must hold the CA that signed the server's certificate \
             (and store.tls_cert_file/tls_key_file one the server accepts)"
        ));
    }
    if e.kind() == ErrorKind::MasterNameNotFoundBySentinel {
        return Some("store.url: the sentinels do not know that master name".into());
    }
    None
}

impl Inner {
    async fn conn(&self) -> Result<Conn, Fault> {
        self.conn_raw().await.map_err(Fault::from_redis)
    }

    async fn conn_raw(&self) -> redis::RedisResult<Conn> {
        match &self.remote {
            Remote::Single { manager, .. } => Ok(Conn::Single((**manager.load()).clone())),
            Remote::Sentinel {
                sentinel,
                config,
                manager,
                master,
                ..
            } => {
                if let Some(m) = manager.load_full() {
                    return Ok(Conn::Single((*m).clone()));
                }
                let mut sentinel = sentinel.lock().await;
                if let Some(m) = manager.load_full() {
                    return Ok(Conn::Single((*m).clone()));
                }
                // Boxed: the sentinel client's future is deep, and every store call awaits this.
                let client = Box::pin(sentinel.async_get_client()).await?;
                let addr = client.get_connection_info().addr().to_string();
                let previous = std::mem::replace(&mut *locked(master), addr.clone());
                if previous != addr {
                    tracing::info!(store = %self.redacted, master = %addr, "redis master found through the sentinels");
                }
                let m = ConnectionManager::new_lazy_with_config(client, config.clone())?;
                manager.store(Some(Arc::new(m.clone())));
                Ok(Conn::Single(m))
            }
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
                let c = client.get_async_connection().await?;
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
            Remote::Sentinel { manager, .. } => manager.store(None),
        }
    }

    /// Whether every failed reconnection should start from a fresh connection: a sentinel's
    /// master may have moved, and asking again is cheap.
    fn follows_master(&self) -> bool {
        matches!(self.remote, Remote::Sentinel { .. })
    }

    /// RESP3 clients for the events connection: the seed nodes, or the master the sentinels
    /// name now.
    pub(super) async fn event_clients(&self) -> Vec<redis::Client> {
        let Remote::Sentinel { sentinel, .. } = &self.remote else {
            return self.event_clients.clone();
        };
        let ask = async { Box::pin(sentinel.lock().await.async_get_client()).await };
        match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), ask).await {
            Ok(Ok(client)) => resp3(&client).into_iter().collect(),
            Ok(Err(e)) => {
                tracing::debug!(store = %self.redacted, error = %e, "the sentinels named no master");
                Vec::new()
            }
            Err(_) => Vec::new(),
        }
    }

    /// One PING at start: a refusal no retry will fix (credentials, ACL, certificate, unknown
    /// master) is returned as a start-up error naming the key; anything else, such as an
    /// unreachable server, only starts the instance degraded.
    pub(super) async fn first_contact(&self) -> Result<(), String> {
        let ping = async {
            let mut conn = self.conn_raw().await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await
        };
        match tokio::time::timeout(self.timeout.max(Duration::from_secs(1)), ping).await {
            Ok(Err(e)) => match refusal(&e) {
                Some(why) => Err(why),
                None => {
                    tracing::warn!(store = %self.redacted, error = %e, "redis not reachable at start; serving degraded until it is");
                    Ok(())
                }
            },
            _ => Ok(()),
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
    ///
    /// The local view is told this instance's live Redis leases (see `live.rs`) before the switch,
    /// so that the acquires that follow it at once find them, and again after: a lease granted or
    /// released in between, by a thread that still saw the store `ok`, is in the second count (its
    /// count moved before it read the flag, and the count is read after the flag was set); one
    /// that saw it degraded tells the local view itself ([`Inner::recount`]).
    pub(super) fn degrade(self: &Arc<Self>, why: &str) {
        *locked(&self.degraded_reason) = Some(why.to_string());
        if !self.is_degraded() {
            self.hold_in_local_view();
        }
        if !self.degraded.swap(true, Ordering::SeqCst) {
            self.hold_in_local_view();
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

    /// Tells the local view, for every pool, the leases Redis granted this instance that still
    /// run: it counts them against the caps and in the least-connections order while degraded.
    /// Each switch replaces the counts whole, so nothing is cleared when Redis is back (the local
    /// view serves nothing then).
    fn hold_in_local_view(&self) {
        for p in self.all_pools() {
            self.hold_pool_in_local_view(&p);
        }
    }

    /// Back from an outage: the leases the local view granted that still run are reported to
    /// Redis with this instance's unlisted ones until they end (see `held.rs`), so that Redis
    /// counts them against caps and loads instead of granting a whole cap beside them. Listed
    /// under the local view's lock, then `held`'s, the order [`Inner::hold_pool_in_local_view`]
    /// takes them in.
    fn carry_local_leases(&self) {
        for p in self.all_pools() {
            let name = p.spec.load().name.clone();
            self.fallback.with_own_leases(&name, |leases| {
                if !leases.is_empty() {
                    tracing::info!(pool = %name, leases = leases.len(), "leases of the local view still run: reported to redis until they end");
                }
                locked(&p.held).carry(leases);
            });
        }
    }

    /// [`Inner::hold_in_local_view`] for one pool (after a reload, while degraded). The counts
    /// are read under the local view's pool lock, `held` included: nothing locks `held` first and
    /// then calls the local view, so the two locks are always taken in this order.
    pub(super) fn hold_pool_in_local_view(&self, p: &PoolLocal) {
        let name = p.spec.load().name.clone();
        self.fallback.hold_all(&name, || {
            let mut counts = p.live.counts();
            counts.extend(locked(&p.held).counts().iter().cloned());
            counts
        });
    }

    /// This instance's count of its Redis leases on `upstream` moved (a lease granted or ended);
    /// while degraded the local view takes the new count (read under its lock, so a later count
    /// is never overwritten by this one). True when the local view was told: a release then
    /// freed capacity there.
    pub(super) fn recount(&self, pool: &str, p: &PoolLocal, upstream: &UpstreamId) -> bool {
        if !self.is_degraded() {
            return false;
        }
        self.fallback.hold(pool, upstream, || {
            p.live.of(upstream) + locked(&p.held).of(upstream.as_str())
        });
        true
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
                    Ok(()) => {
                        // Report the carried leases now rather than at the next tick.
                        self.flush();
                        break;
                    }
                    Err(Fault::Down(why)) => {
                        tracing::debug!(store = %self.redacted, reason = %why, "redis still unreachable");
                        *locked(&self.degraded_reason) = Some(why);
                        delay = (delay * 2).min(RECONNECT_MAX);
                        failures += 1;
                        if failures % FRESH_CONNECTION_AFTER == 0 || self.follows_master() {
                            self.fresh_connection();
                        }
                    }
                    Err(Fault::Broken(why)) => {
                        tracing::warn!(store = %self.redacted, reason = %why, "redis answers but refuses the shared state; still degraded");
                        *locked(&self.degraded_reason) = Some(why);
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
                    drop(backlog);
                    self.carry_local_leases();
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
        // What other instances decided meanwhile, published while this one was not listening.
        for p in self.all_pools() {
            let name = p.spec.load().name.clone();
            self.adopt_member_settings(&p, &name).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_key_and_outages_are_not_refusals() {
        let auth = redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "denied"));
        assert!(refusal(&auth).is_some_and(|r| r.starts_with("store.url:")));
        let cert = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        ));
        assert!(
            refusal(&cert).is_some_and(|r| r.starts_with("store.tls_ca_file:")),
            "{cert}"
        );
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(refusal(&refused), None);
    }
}
