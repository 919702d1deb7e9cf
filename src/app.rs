//! Builds the shared state, binds the listeners, spawns the background tasks, and owns the
//! shutdown sequence.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{Config, StoreConfig};
use crate::health::classify::CaptchaRules;
use crate::intercept::{InterceptSetupError, Interceptor};
use crate::pool::PoolSet;
use crate::state::Gateway;
use crate::store::memory::MemoryStore;
use crate::store::{AnyStore, Store};
use crate::upstream::connect::Connector;
use crate::upstream::reuse::ConnPool;
use crate::upstream::tls::{self, TlsSetupError};
use crate::{admin, health, proxy, server, shutdown};

/// How often idle upstream connections past their timeout are closed.
const IDLE_SWEEP_INTERVAL: Duration = Duration::from_secs(15);
/// How often cool-downs are checked; the granularity of a quarantine's end.
const HEALTH_TICK_INTERVAL: Duration = Duration::from_secs(1);

/// Ends the cool-downs that are over in every pool.
pub async fn health_tick(gw: &Gateway) {
    let pools = gw.pools.load_full();
    for pool in pools.iter() {
        let changes = pool.health.tick();
        if !changes.is_empty() {
            health::apply(&*gw.store, pool.name(), changes).await;
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
}

/// A started gateway.
pub struct Running {
    pub proxy_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    gw: Arc<Gateway>,
    listeners: tokio::task::JoinSet<()>,
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
    let config = Arc::new(config);
    let store = match &config.store {
        StoreConfig::Memory => AnyStore::Memory(MemoryStore::new()),
        StoreConfig::Redis { .. } => {
            return Err(StartError::Store(
                "the redis store is not available in this build yet".into(),
            ));
        }
    };
    let health = health::Registry::default();
    let pools = PoolSet::from_config(&config, &health);
    for pool in pools.iter() {
        store
            .configure(pool.spec())
            .await
            .map_err(|e| StartError::Store(e.to_string()))?;
    }
    let server = &config.server;
    let connector = Connector::new(
        tls::client_config(&config.upstream_tls)?,
        server.connect_timeout,
    );
    let intercept = Arc::new(Interceptor::from_config(config.intercept.as_ref())?);
    let proxy_listener = bind("server.listen", server.listen).await?;
    let admin_listener = bind("server.admin_listen", server.admin_listen).await?;
    let proxy_addr = local_addr("server.listen", &proxy_listener)?;
    let admin_addr = local_addr("server.admin_listen", &admin_listener)?;

    let gw = Arc::new(Gateway {
        conns: Arc::new(ConnPool::new(
            server.upstream_max_idle_per_key,
            server.upstream_idle_timeout,
        )),
        pools: ArcSwap::from_pointee(pools),
        store: Arc::new(store),
        health,
        captcha: CaptchaRules::new(&config.captcha),
        connector,
        intercept,
        tasks: TaskTracker::new(),
        shutdown: CancellationToken::new(),
        started: std::time::Instant::now(),
        instance_id: instance_id(),
        config: config.clone(),
    });

    let mut listeners = tokio::task::JoinSet::new();
    let max = config.server.max_connections as usize;
    listeners.spawn(server::serve(
        gw.clone(),
        proxy_listener,
        max,
        |gw, req, _peer| proxy::handle(gw, req),
    ));
    listeners.spawn(server::serve(
        gw.clone(),
        admin_listener,
        64,
        |gw, req, _peer| admin::handle(gw, req),
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
        admin = %admin_addr,
        store = gw.store.kind(),
        pools = config.pools.len(),
        "poolgate listening"
    );
    Ok(Running {
        proxy_addr,
        admin_addr,
        gw,
        listeners,
    })
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
    pub async fn shutdown(mut self) -> Drained {
        self.begin_shutdown();
        while self.listeners.join_next().await.is_some() {}
        self.gw.conns.clear();
        self.gw.tasks.close();
        let grace = self.gw.config.server.shutdown_grace;
        match tokio::time::timeout(grace, self.gw.tasks.wait()).await {
            Ok(()) => Drained::Clean,
            Err(_) => Drained::GraceExpired,
        }
    }

    pub fn gateway(&self) -> &Arc<Gateway> {
        &self.gw
    }
}

/// Runs the gateway until SIGTERM/SIGINT, then drains. Returns the process exit status.
pub async fn run(config: Config) -> i32 {
    let running = match start(config).await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "poolgate failed to start");
            eprintln!("poolgate: {e}");
            return 1;
        }
    };
    match shutdown::terminate().await {
        Ok(sig) => tracing::info!(signal = sig, "shutting down: draining in-flight work"),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for signals");
            return 1;
        }
    }
    let grace = running.gw.config.server.shutdown_grace;
    tokio::select! {
        drained = running.shutdown() => match drained {
            Drained::Clean => {
                tracing::info!("shutdown complete: all work finished");
                0
            }
            Drained::GraceExpired => {
                tracing::warn!(grace_ms = grace.as_millis() as u64, "shutdown grace expired with work still open");
                0
            }
        },
        sig = shutdown::terminate() => {
            tracing::warn!(signal = sig.unwrap_or("?"), "second signal: exiting without waiting");
            1
        }
    }
}
