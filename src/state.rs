//! The state every request shares, built once by `app` and read by the request path.

use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::health;
use crate::health::classify::CaptchaRules;
use crate::intercept::Interceptor;
use crate::pool::PoolSet;
use crate::store::AnyStore;
use crate::upstream::connect::Connector;
use crate::upstream::reuse::ConnPool;

pub struct Gateway {
    pub config: Arc<Config>,
    /// Read once per request without a lock; replaced whole on reload.
    pub pools: ArcSwap<PoolSet>,
    pub store: Arc<AnyStore>,
    /// Every pool's passive health.
    pub health: health::Registry,
    /// Captcha and block detection for responses.
    pub captcha: CaptchaRules,
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
}
