//! Builds the shared state, binds the listeners, spawns the background tasks, and owns the
//! shutdown sequence.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accounting::Counters;
use crate::admit::TargetPolicy;
use crate::auth::Authenticator;
use crate::config::{Config, StoreConfig};
use crate::health::classify::CaptchaRules;
use crate::intercept::{InterceptSetupError, Interceptor};
use crate::limits::ClientConns;
use crate::metrics::Metrics;
use crate::pool::PoolSet;
use crate::state::Gateway;
use crate::store::memory::MemoryStore;
use crate::store::redis::{RedisSettings, RedisStore};
use crate::store::shard::Sharded;
use crate::store::{AnyStore, MemberChange, Store};
use crate::upstream::connect::{Connector, Resolve};
use crate::upstream::reuse::ConnPool;
use crate::upstream::tls::{self, TlsSetupError};
use crate::workers::{self, Workers};
use crate::{admin, health, proxy, reload, server, shutdown};

/// How often idle upstream connections past their timeout are closed.
const IDLE_SWEEP_INTERVAL: Duration = Duration::from_secs(15);
/// After the grace period, tunnels are closed and their leases released; this bounds the wait
/// for those releases.
const LEASE_RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How to start, beyond the config.
#[derive(Clone, Default)]
pub struct StartOptions {
    /// The file the config came from; SIGHUP and `POST /admin/reload` re-read it.
    pub config_path: Option<PathBuf>,
    /// Resolves target names for `direct://` and `socks5://` upstreams (tests map names to
    /// loopback); the system resolver when `None`.
    pub resolver: Option<Arc<dyn Resolve>>,
    /// Carries out probes (tests drive the prober with their own); probes through the gateway's
    /// connector when `None`.
    pub probe_runner: Option<Arc<dyn crate::probe::prober::Runner>>,
    /// Threads of their own serving the proxy port ([`crate::workers`]); 0 serves it on the
    /// caller's runtime, as tests do (their clock and their tasks stay in one runtime).
    pub proxy_threads: usize,
}

/// Closes the history's current bucket: each pool's byte totals and upstreams by state.
pub fn history_tick(gw: &Gateway) {
    let pools = gw.pools.load_full();
    let gauges = pools
        .iter()
        .map(|p| crate::history::PoolGauges {
            name: p.name().to_string(),
            bytes: gw.meter.pool(p.name()),
            states: p.health.counts_by_state(),
        })
        .collect();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    gw.metrics.history.close(t, gauges);
}

/// How often cool-downs are checked; the granularity of a quarantine's end.
const HEALTH_TICK_INTERVAL: Duration = Duration::from_secs(1);

/// Ends the cool-downs that are over in every pool, and prunes idle rate-limit buckets.
pub async fn health_tick(gw: &Gateway) {
    let pools = gw.pools.load_full();
    for pool in pools.iter() {
        let changes = pool.health.tick();
        if !changes.is_empty() {
            health::apply(&*gw.store, pool.name(), changes).await;
        }
    }
    gw.ratelimits.prune(
        pools.iter().map(|p| (p.name(), &p.config.rate_limit)),
        &gw.live.load().auth.users,
    );
}

/// Applies member settings decided by other instances (shared store) to this instance's health
/// view, so its `/status` and its own later decisions start from what the pool really is.
async fn mirror_member_changes(
    gw: Arc<Gateway>,
    mut changes: tokio::sync::broadcast::Receiver<MemberChange>,
) {
    loop {
        let change = tokio::select! {
            c = changes.recv() => c,
            _ = gw.shutdown.cancelled() => return,
        };
        match change {
            Ok(c) => {
                let pools = gw.pools.load_full();
                if let Ok(pool) = pools.get(Some(&c.pool)) {
                    pool.health.mirror(&c.upstream, c.state);
                }
            }
            Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "member changes from other instances were missed; the health view catches up with the next ones"
                );
            }
            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr} ({key}): {source}")]
    Bind {
        key: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    #[error("store: {0}")]
    Store(String),
    #[error(transparent)]
    Intercept(#[from] InterceptSetupError),
    #[error("cannot start the proxy worker threads: {0}")]
    Workers(std::io::Error),
    #[error(transparent)]
    AccessLog(#[from] crate::access_log::OpenError),
}

/// A started gateway.
pub struct Running {
    pub proxy_addr: SocketAddr,
    /// The SOCKS5 port, when `server.socks_listen` is set.
    pub socks_addr: Option<SocketAddr>,
    pub admin_addr: SocketAddr,
    gw: Arc<Gateway>,
    listeners: tokio::task::JoinSet<()>,
    /// Dropped last: the worker threads' runtimes carry their connections' work to the end.
    workers: Option<Workers>,
}

/// How shutdown ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Drained {
    /// Every request and tunnel finished.
    Clean,
    /// The grace period ran out with work still open.
    GraceExpired,
}

pub async fn start(config: Config) -> Result<Running, StartError> {
    start_with(config, StartOptions::default()).await
}

pub async fn start_with(config: Config, options: StartOptions) -> Result<Running, StartError> {
    let config = Arc::new(config);
    let instance_id = instance_id();
    let access_log = crate::access_log::AccessLog::start(&config.log, &instance_id)?;
    let store = match &config.store {
        StoreConfig::Memory => AnyStore::Memory(MemoryStore::new()),
        StoreConfig::Redis {
            url,
            timeout,
            key_prefix,
            tls,
        } => AnyStore::Redis(
            RedisStore::new(RedisSettings {
                url: url.clone(),
                timeout: *timeout,
                key_prefix: key_prefix.clone(),
                instance_id: instance_id.clone(),
                tls: tls.clone(),
            })
            .map_err(|e| StartError::Store(e.to_string()))?,
        ),
    };
    if let AnyStore::Redis(redis) = &store {
        redis.first_contact().await.map_err(StartError::Store)?;
    }
    let store = Sharded::new(store);
    // Before the pools are declared: declaring one adopts the settings other instances gave its
    // members, which reach the health view as changes.
    let member_changes = store.subscribe_member_changes();
    let health = health::Registry::default();
    let sources = crate::sources::Registry::default();
    sources.preload(&config);
    let pools = PoolSet::from_config(&config, &health, &sources);
    for pool in pools.iter() {
        store
            .configure(pool.spec())
            .await
            .map_err(|e| StartError::Store(e.to_string()))?;
    }
    let server = &config.server;
    let intercept = Arc::new(Interceptor::from_config(config.intercept.as_ref())?);
    let listen_failed = |source| StartError::Bind {
        key: "server.listen",
        addr: server.listen,
        source,
    };
    let proxy_listener = if options.proxy_threads == 0 {
        ProxyListener::Here(bind("server.listen", server.listen).await?)
    } else {
        ProxyListener::Workers(
            workers::bind(server.listen, options.proxy_threads).map_err(listen_failed)?,
        )
    };
    let admin_listener = bind("server.admin_listen", server.admin_listen).await?;
    let proxy_addr = match &proxy_listener {
        ProxyListener::Here(l) => local_addr("server.listen", l)?,
        ProxyListener::Workers(ls) => ls[0].local_addr().map_err(listen_failed)?,
    };
    let admin_addr = local_addr("server.admin_listen", &admin_listener)?;
    // The SOCKS5 port is served where the proxy port is: on this runtime, or by the workers.
    let socks_listener = match server.socks_listen {
        None => None,
        Some(addr) if options.proxy_threads == 0 => Some(ProxyListener::Here(
            bind("server.socks_listen", addr).await?,
        )),
        Some(addr) => Some(ProxyListener::Workers(
            workers::bind(addr, options.proxy_threads).map_err(|source| StartError::Bind {
                key: "server.socks_listen",
                addr,
                source,
            })?,
        )),
    };
    let socks_addr = match &socks_listener {
        None => None,
        Some(ProxyListener::Here(l)) => Some(local_addr("server.socks_listen", l)?),
        Some(ProxyListener::Workers(ls)) => {
            Some(ls[0].local_addr().map_err(|source| StartError::Bind {
                key: "server.socks_listen",
                addr: server.socks_listen.unwrap_or(server.listen),
                source,
            })?)
        }
    };
    // The gateway's own listeners are never a target.
    let own = [Some(proxy_addr), Some(admin_addr), socks_addr];
    let policy = Arc::new(ArcSwap::from_pointee(TargetPolicy::new(
        config.policy.clone(),
        own.into_iter().flatten().collect(),
    )));
    let guard_policy = policy.clone();
    let mut connector = Connector::new(
        tls::client_config(&config.upstream_tls)?,
        server.connect_timeout,
    )
    .with_guard(Arc::new(move |target, addr| {
        guard_policy.load().allows_resolved(target, addr)
    }));
    if let Some(resolver) = options.resolver {
        connector = connector.with_resolver(resolver);
    }

    let gw = Arc::new(Gateway {
        conns: Arc::new(ConnPool::new(
            options.proxy_threads,
            server.upstream_max_idle_per_key,
            server.upstream_idle_timeout,
        )),
        pools: ArcSwap::from_pointee(pools),
        store: Arc::new(store),
        health,
        sources,
        probes: Default::default(),
        captcha: CaptchaRules::new(&config.captcha),
        metrics: Arc::new({
            let m = Metrics::new();
            m.set_per_upstream_max(config.metrics.per_upstream_max);
            m
        }),
        meter: crate::meter::Meter::new(),
        access_log,
        connector,
        intercept,
        tasks: TaskTracker::new(),
        shutdown: CancellationToken::new(),
        started: std::time::Instant::now(),
        instance_id,
        live: ArcSwap::new(config.clone()),
        config: config.clone(),
        policy,
        auth: Authenticator::new(),
        client_conns: ClientConns::new(),
        counters: Counters::new(options.proxy_threads),
        config_path: options.config_path,
        reloads: tokio::sync::Mutex::new(crate::state::ReloadLog {
            generation: 1,
            ..Default::default()
        }),
        tunnels_stop: CancellationToken::new(),
        ratelimits: Default::default(),
    });

    let mut listeners = tokio::task::JoinSet::new();
    let (socks_here, socks_workers) = match socks_listener {
        Some(ProxyListener::Here(l)) => (Some(l), Vec::new()),
        Some(ProxyListener::Workers(ls)) => (None, ls),
        None => (None, Vec::new()),
    };
    if let Some(listener) = socks_here {
        listeners.spawn(server::serve_streams(
            gw.clone(),
            listener,
            proxy::socks::handle,
        ));
    }
    let workers = match proxy_listener {
        ProxyListener::Here(listener) => {
            listeners.spawn(server::serve(
                gw.clone(),
                listener,
                server::Listener::Proxy,
                proxy::handle,
            ));
            None
        }
        ProxyListener::Workers(sockets) => {
            let (workers, stopped) = workers::start(&gw, sockets, socks_workers)
                .await
                .map_err(StartError::Workers)?;
            listeners.spawn(stopped);
            Some(workers)
        }
    };
    listeners.spawn(server::serve(
        gw.clone(),
        admin_listener,
        server::Listener::Admin,
        move |gw, req, _peer| admin::handle(gw, req, admin_addr.ip()),
    ));
    let ticker = gw.clone();
    listeners.spawn(async move {
        let mut tick = tokio::time::interval(HEALTH_TICK_INTERVAL);
        loop {
            tokio::select! {
                _ = tick.tick() => health_tick(&ticker).await,
                _ = ticker.shutdown.cancelled() => break,
            }
        }
    });
    let historian = gw.clone();
    listeners.spawn(async move {
        let every = Duration::from_secs(crate::history::BUCKET_SECS);
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = tick.tick() => history_tick(&historian),
                _ = historian.shutdown.cancelled() => break,
            }
        }
    });
    let runner = options.probe_runner.unwrap_or_else(|| {
        Arc::new(crate::probe::prober::LiveRunner {
            connector: gw.connector.clone(),
        })
    });
    listeners.spawn(crate::probe::prober::run(gw.clone(), runner.clone()));
    listeners.spawn(crate::sources::watch::run(gw.clone(), runner));
    listeners.spawn(mirror_member_changes(gw.clone(), member_changes));
    let sweeper = gw.clone();
    listeners.spawn(async move {
        let mut tick = tokio::time::interval(IDLE_SWEEP_INTERVAL);
        loop {
            tokio::select! {
                _ = tick.tick() => sweeper.conns.sweep(),
                _ = sweeper.shutdown.cancelled() => break,
            }
        }
    });
    tracing::info!(
        proxy = %proxy_addr,
        socks = socks_addr.map(|a| a.to_string()).as_deref().unwrap_or("off"),
        admin = %admin_addr,
        store = gw.store.kind(),
        proxy_threads = options.proxy_threads,
        store_health = gw.store.health(),
        pools = config.pools.len(),
        "poolgate listening"
    );
    Ok(Running {
        proxy_addr,
        socks_addr,
        admin_addr,
        gw,
        listeners,
        workers,
    })
}

/// A proxy port (HTTP or SOCKS5): served on the caller's runtime, or by worker threads with a
/// socket each.
enum ProxyListener {
    Here(TcpListener),
    Workers(Vec<std::net::TcpListener>),
}

async fn bind(key: &'static str, addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { key, addr, source })
}

fn local_addr(key: &'static str, l: &TcpListener) -> Result<SocketAddr, StartError> {
    l.local_addr().map_err(|source| StartError::Bind {
        key,
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })
}

fn instance_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "poolgate".to_string());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

impl Running {
    /// Stops accepting and asks every connection to finish its in-flight work and close.
    pub fn begin_shutdown(&self) {
        self.gw.shutdown.cancel();
    }

    /// Begins shutdown (if not yet begun) and waits for in-flight work, at most the grace period.
    /// Tunnels still open then are closed and their leases released before this returns.
    pub async fn shutdown(mut self) -> Drained {
        self.begin_shutdown();
        while self.listeners.join_next().await.is_some() {}
        self.gw.conns.clear();
        self.gw.tasks.close();
        let grace = self.gw.live.load().server.shutdown_grace;
        let drained = match tokio::time::timeout(grace, self.gw.tasks.wait()).await {
            Ok(()) => Drained::Clean,
            Err(_) => Drained::GraceExpired,
        };
        if drained == Drained::GraceExpired {
            // Close what is still open; each tunnel releases its lease as it ends.
            self.gw.tunnels_stop.cancel();
            if tokio::time::timeout(LEASE_RELEASE_TIMEOUT, self.gw.tasks.wait())
                .await
                .is_err()
            {
                tracing::warn!("some work did not end after its tunnel was closed");
            }
        }
        if !self.gw.store.settle(LEASE_RELEASE_TIMEOUT).await {
            tracing::warn!("some lease releases did not reach the store before exit");
        }
        if let Some(log) = &self.gw.access_log {
            if !log.settle(LEASE_RELEASE_TIMEOUT).await {
                tracing::warn!("some access-log lines were not written before exit");
            }
        }
        drop(self.workers.take());
        drained
    }

    /// Leases still live in the store, over every pool (0 after a clean shutdown).
    pub async fn leases_live(&self) -> u64 {
        leases_live(&self.gw).await
    }

    /// Closes the history's current bucket now (the 10-second tick does it otherwise).
    pub fn sample_history(&self) {
        history_tick(&self.gw);
    }

    /// Reopens the access log's file (what SIGUSR1 does, and SIGHUP besides reloading).
    pub fn reopen_logs(&self) {
        if let Some(log) = &self.gw.access_log {
            log.reopen();
        }
    }

    /// Re-reads the config file and applies it (what SIGHUP does).
    pub async fn reload(&self) -> Result<reload::ReloadSummary, reload::ReloadError> {
        reload::reload(&self.gw).await
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }
}

async fn leases_live(gw: &Gateway) -> u64 {
    let mut n = 0;
    for pool in gw.pools.load().iter() {
        if let Ok(st) = gw.store.status(pool.name()).await {
            n += st.members.iter().map(|m| m.leases_live).sum::<u64>();
        }
    }
    n
}

/// Runs the gateway until SIGTERM/SIGINT, then drains; SIGHUP reloads the config from
/// `config_path`. Returns the process exit status.
pub async fn run(config: Config, config_path: Option<PathBuf>) -> i32 {
    // Registered before the listeners announce themselves: a SIGHUP that arrived between the two
    // would otherwise end the process (its default action).
    let mut signals = match shutdown::Signals::new() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for signals");
            return 1;
        }
    };
    let options = StartOptions {
        config_path,
        proxy_threads: config.server.workers,
        ..StartOptions::default()
    };
    let running = match start_with(config, options).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "poolgate failed to start");
            eprintln!("poolgate: {e}");
            return 1;
        }
    };
    loop {
        match signals.next().await {
            shutdown::Signal::Reload => {
                // Success and failure are logged by the reload itself.
                let _ = running.reload().await;
                running.reopen_logs();
            }
            shutdown::Signal::Reopen => running.reopen_logs(),
            shutdown::Signal::Terminate(sig) => {
                tracing::info!(signal = sig, "shutting down: draining in-flight work");
                break;
            }
        }
    }
    let grace = running.gw.live.load().server.shutdown_grace;
    let gw = running.gw.clone();
    tokio::select! {
        drained = running.shutdown() => {
            let leases_left = leases_live(&gw).await;
            match drained {
                Drained::Clean => {
                    tracing::info!(leases_left, "shutdown complete: all work finished");
                }
                Drained::GraceExpired => {
                    tracing::warn!(grace_ms = grace.as_millis() as u64, leases_left, "shutdown complete: grace expired, open tunnels were closed");
                }
            }
            0
        },
        sig = signals.next_terminate() => {
            tracing::warn!(signal = sig, "second signal: exiting without waiting");
            1
        }
    }
}
