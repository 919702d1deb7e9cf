//! The state every request shares, built once by `app` and read by the request path.

use std::sync::Arc;

use arc_swap::ArcSwap;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::accounting::Counters;
use crate::admit::TargetPolicy;
use crate::auth::Authenticator;
use crate::config::Config;
use crate::health;
use crate::health::classify::CaptchaRules;
use crate::intercept::Interceptor;
use crate::limits::ClientConns;
use crate::metrics::Metrics;
use crate::pool::PoolSet;
use crate::store::GatewayStore;
use crate::upstream::connect::Connector;
use crate::upstream::reuse::ConnPool;

pub struct Gateway {
    /// The config the process started with: listener addresses and the store, which a reload
    /// cannot change. What may change is read from [`Gateway::live`].
    pub config: Arc<Config>,
    /// The config in force; replaced whole by a reload.
    pub live: ArcSwap<Config>,
    /// Target policy in force with the gateway's own listener addresses; shared with the
    /// connector, which applies it to the target addresses it resolves (`direct://`,
    /// `socks5://`).
    pub policy: Arc<ArcSwap<TargetPolicy>>,
    /// Checks proxy credentials and remembers successful checks.
    pub auth: Authenticator,
    /// Open client connections, for the connection limits.
    pub client_conns: Arc<ClientConns>,
    /// Requests accepted/completed/rejected/failed, tunnels open.
    pub counters: Arc<Counters>,
    /// The config file, re-read on reload (`None` when started from text).
    pub config_path: Option<std::path::PathBuf>,
    /// Serialises reloads and counts them.
    pub reloads: tokio::sync::Mutex<ReloadLog>,
    /// Cancelled when the shutdown grace has run out: open tunnels close then.
    pub tunnels_stop: CancellationToken,
    /// Read once per request without a lock; replaced whole on reload.
    pub pools: ArcSwap<PoolSet>,
    pub store: Arc<GatewayStore>,
    /// Every pool's passive health.
    pub health: health::Registry,
    /// Members admitted from every pool's upstream lists, and the lists' status.
    pub sources: crate::sources::Registry,
    /// Every probing pool's probe status.
    pub probes: crate::probe::status::Registry,
    /// Captcha and block detection for responses.
    pub captcha: CaptchaRules,
    pub metrics: Arc<Metrics>,
    /// Bytes up and down per member, pool and user (see [`crate::meter`]).
    pub meter: Arc<crate::meter::Meter>,
    /// The access log, when `[log] access` is set.
    pub access_log: Option<Arc<crate::access_log::AccessLog>>,
    pub connector: Connector,
    /// TLS interception for pools with `inspect_tls`: leaf certificates, origin TLS, counters.
    pub intercept: Arc<Interceptor>,
    /// Keep-alive connections to upstreams, reused across requests.
    pub conns: Arc<ConnPool>,
    /// Tunnels and lease releases outlive their hyper connection; shutdown waits for them here.
    pub tasks: TaskTracker,
    /// Cancelled once, when shutdown begins.
    pub shutdown: CancellationToken,
    pub started: std::time::Instant,
    /// Distinguishes this instance in `/status` (and, with a shared store, among its peers).
    pub instance_id: String,
    /// This instance's rate-limit buckets; they follow the live config by themselves.
    pub ratelimits: crate::ratelimit::RateLimits,
}

/// Reload history, shown in `/status`.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ReloadLog {
    /// 1 for the config the process started with, +1 per successful reload.
    pub generation: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Why the last failed reload was refused (cleared by a successful one).
    pub last_error: Option<String>,
}
