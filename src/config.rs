//! Configuration: the TOML file as written (serde structs that reject unknown keys) and the
//! validated [`Config`] the gateway runs on.
//!
//! Validation happens once, at load, and reports every problem at once, each naming its key, so a
//! broken file is fixed in one edit rather than one error at a time.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::intercept::{self, HostPattern, InterceptConfig};
use crate::upstream::{Scheme, Upstream};

pub const DEFAULT_PROXY_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:8081";
pub const DEFAULT_POOL: &str = "default";
/// How long a client may take to send a request head before the connection is closed.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Largest request head (request line + headers) accepted from a client.
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
pub const MIN_MAX_HEADER_BYTES: usize = 8 * 1024;
/// Client connections served at once; connections past it are refused (503 and close).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;
/// Client connections one client address may hold at once; more are refused like the above.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: u32 = 1_000;
/// A keep-alive client connection with no request in flight and no bytes moving is closed after
/// this long (or after `header_read_timeout`, if shorter: hyper's head timer also runs while a
/// connection waits for its next request).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
/// A CONNECT tunnel with no bytes moving either way is closed after this long.
pub const DEFAULT_TUNNEL_IDLE_TIMEOUT_MS: u64 = 5 * 60_000;
/// Largest request body forwarded (bytes); bodies stream through, nothing is buffered.
pub const DEFAULT_MAX_REQUEST_BODY_BYTES: u64 = 100 * 1024 * 1024;
/// Longest user name accepted in `[auth.users]`.
pub const MAX_USER_NAME_LEN: usize = 128;
/// How long in-flight requests and tunnels get to finish after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 30_000;
/// Bound on DNS + TCP + TLS + CONNECT/SOCKS handshake to an upstream.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
/// Bound on waiting for an upstream's response head after the request was sent.
pub const DEFAULT_RESPONSE_TIMEOUT_MS: u64 = 60_000;
/// Idle keep-alive connections to upstreams are closed after this long.
pub const DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_UPSTREAM_MAX_IDLE_PER_KEY: usize = 32;
/// More proxy worker threads than this is a typo, not a machine.
pub const MAX_WORKERS: usize = 1024;
pub const DEFAULT_QUEUE_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_SESSION_TTL_MS: u64 = 10 * 60_000;
pub const MAX_SESSION_TTL_MS: u64 = 24 * 3_600_000;
/// A lease outlives the longest exchange; tunnels renew theirs while open.
pub const DEFAULT_LEASE_TTL_MS: u64 = 10 * 60_000;
pub const MIN_LEASE_TTL_MS: u64 = 1_000;
pub const DEFAULT_RETRIES: u32 = 2;
/// How often `upstreams_url` is fetched again.
pub const DEFAULT_UPSTREAMS_URL_INTERVAL_MS: u64 = 10 * 60_000;
/// Fetching a list more often than this is hammering its provider.
pub const MIN_UPSTREAMS_URL_INTERVAL_MS: u64 = 10_000;
/// Admission probes in flight at once per pool: public lists are long and mostly dead, so more
/// than the idle probes' `concurrency`.
pub const DEFAULT_ADMISSION_CONCURRENCY: usize = 16;
pub const MAX_ADMISSION_CONCURRENCY: usize = 256;
pub const MAX_RETRIES: u32 = 10;
/// Highest rate limit accepted (requests per second); one request per microsecond.
pub const MAX_RATE_LIMIT_PER_S: f64 = 1_000_000.0;
/// Requests that may pass at once before a rate limit spaces them; 1 spaces every request evenly.
pub const DEFAULT_RATE_LIMIT_BURST: u32 = 1;
pub const MAX_RATE_LIMIT_BURST: u32 = 1_000_000;

// ---------------------------------------------------------------------------------------------
// The file as written.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    server: FileServer,
    #[serde(default)]
    store: FileStore,
    #[serde(default)]
    policy: FilePolicy,
    #[serde(default)]
    upstream_tls: FileUpstreamTls,
    #[serde(default)]
    captcha: FileCaptcha,
    intercept: Option<FileIntercept>,
    #[serde(default)]
    auth: FileAuth,
    #[serde(default)]
    pools: BTreeMap<String, FilePool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileIntercept {
    ca_cert: Option<PathBuf>,
    ca_key: Option<PathBuf>,
    cert_cache_size: Option<usize>,
    origin_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCaptcha {
    sniff_bytes: Option<usize>,
    markers: Option<Vec<String>>,
    extra_markers: Option<Vec<String>>,
    challenge_headers: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileHealth {
    window: Option<usize>,
    min_samples: Option<usize>,
    degrade_after_failures: Option<u32>,
    quarantine_after_failures: Option<u32>,
    degrade_below_success: Option<f64>,
    quarantine_below_success: Option<f64>,
    ban_quarantine_ratio: Option<f64>,
    ban_min_samples: Option<usize>,
    recover_after_successes: Option<u32>,
    half_open_successes: Option<u32>,
    cooldown_base: Option<String>,
    cooldown_max: Option<String>,
    cooldown_jitter: Option<f64>,
    cooldown_reset_after: Option<String>,
    dead_after_cycles: Option<u32>,
    max_quarantined_percent: Option<u32>,
    min_in_service: Option<usize>,
    target_incident_ratio: Option<f64>,
    target_incident_min_upstreams: Option<usize>,
    incident_window: Option<String>,
    global_incident_ratio: Option<f64>,
    max_targets: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileServer {
    listen: Option<String>,
    admin_listen: Option<String>,
    admin_token: Option<String>,
    default_pool: Option<String>,
    header_read_timeout: Option<String>,
    max_header_bytes: Option<usize>,
    max_connections: Option<u32>,
    shutdown_grace: Option<String>,
    connect_timeout: Option<String>,
    response_timeout: Option<String>,
    upstream_idle_timeout: Option<String>,
    upstream_max_idle_per_key: Option<usize>,
    max_connections_per_client: Option<u32>,
    idle_timeout: Option<String>,
    tunnel_idle_timeout: Option<String>,
    max_request_body_bytes: Option<u64>,
    workers: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileStore {
    kind: Option<String>,
    url: Option<String>,
    timeout: Option<String>,
    key_prefix: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePolicy {
    connect_ports: Option<Vec<u16>>,
    allow_private_targets: Option<bool>,
    allow_targets: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAuth {
    client_cidrs: Option<Vec<String>>,
    #[serde(default)]
    users: BTreeMap<String, FileUser>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUser {
    password_hash: Option<String>,
    pools: Option<Vec<String>>,
    rate_limit: Option<f64>,
    rate_limit_burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileUpstreamTls {
    ca_file: Option<PathBuf>,
    system_roots: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePool {
    upstreams: Option<Vec<String>>,
    upstreams_file: Option<PathBuf>,
    upstreams_url: Option<String>,
    upstreams_url_interval: Option<String>,
    admission: Option<FileAdmission>,
    strategy: Option<String>,
    max_concurrency: Option<u32>,
    queue_timeout: Option<String>,
    session_ttl: Option<String>,
    lease_ttl: Option<String>,
    retries: Option<u32>,
    rebind_on_failure: Option<bool>,
    inspect_tls: Option<bool>,
    inspect_exclude: Option<Vec<String>>,
    #[serde(default)]
    health: FileHealth,
    probe: Option<FileProbe>,
    rate_limit: Option<FileRateLimit>,
}

/// `[pools.<name>.admission]`: what a candidate from an upstream list must be to join.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileAdmission {
    schemes: Option<Vec<String>>,
    max_latency: Option<String>,
    concurrency: Option<usize>,
}

/// `[pools.<name>.probe]`: active checks through the pool's upstreams.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProbe {
    targets: Option<Vec<FileControlTarget>>,
    expect_status: Option<u16>,
    expect_body: Option<String>,
    interval: Option<String>,
    jitter: Option<f64>,
    dead_interval: Option<String>,
    successes: Option<u32>,
    concurrency: Option<usize>,
    timeout: Option<String>,
    max_latency: Option<String>,
}

/// A control target: a URL, or a table that overrides the expected answer for it.
#[derive(Debug)]
enum FileControlTarget {
    Url(String),
    Table(FileControlTable),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileControlTable {
    url: String,
    expect_status: Option<u16>,
    expect_body: Option<String>,
}

/// By hand rather than `#[serde(untagged)]`: an untagged enum reports any mistake inside the
/// table as "did not match any variant", without the key or the reason.
impl<'de> Deserialize<'de> for FileControlTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileControlTarget;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL or a table with url, expect_status and expect_body")
            }

            fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<Self::Value, E> {
                Ok(FileControlTarget::Url(url.to_string()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                FileControlTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FileControlTarget::Table)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRateLimit {
    per_upstream: Option<f64>,
    per_upstream_target: Option<f64>,
    burst: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// The validated configuration.

/// Everything the gateway runs on, validated.
#[derive(Clone, Debug)]
pub struct Config {
    pub server: ServerConfig,
    pub store: StoreConfig,
    pub policy: PolicyConfig,
    pub upstream_tls: UpstreamTlsConfig,
    pub captcha: CaptchaConfig,
    /// Who may use the proxy.
    pub auth: AuthConfig,
    /// TLS interception (`[intercept]`); `None` when the table is absent.
    pub intercept: Option<InterceptConfig>,
    /// Pools by name; never empty.
    pub pools: BTreeMap<String, PoolConfig>,
    /// The pool used when a request names none.
    pub default_pool: String,
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// Required for admin actions, and for any admin address that is not loopback.
    pub admin_token: Option<String>,
    pub header_read_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_connections: u32,
    pub shutdown_grace: Duration,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub upstream_idle_timeout: Duration,
    pub upstream_max_idle_per_key: usize,
    /// Connections one client IP may hold at once.
    pub max_connections_per_client: u32,
    /// Keep-alive client connections idle this long are closed.
    pub idle_timeout: Duration,
    /// Tunnels with no bytes moving this long are closed.
    pub tunnel_idle_timeout: Duration,
    /// Largest request body forwarded; larger ones get 413.
    pub max_request_body_bytes: u64,
    /// Threads serving the proxy port, each with a runtime of its own (see [`crate::workers`]).
    pub workers: usize,
}

#[derive(Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Embedded, single instance.
    Memory,
    /// Shared by many instances.
    Redis {
        /// May hold a password: shown only through `store_url::redact`.
        url: String,
        /// Bound on each Redis call; past it the instance serves from its local view.
        timeout: Duration,
        /// First segment of every key.
        key_prefix: String,
    },
}

/// Debug output never shows the store URL's password.
impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreConfig::Memory => f.write_str("Memory"),
            StoreConfig::Redis {
                url,
                timeout,
                key_prefix,
            } => f
                .debug_struct("Redis")
                .field("url", &crate::store_url::redact(url))
                .field("timeout", timeout)
                .field("key_prefix", key_prefix)
                .finish(),
        }
    }
}

impl StoreConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            StoreConfig::Memory => "memory",
            StoreConfig::Redis { .. } => "redis",
        }
    }
}

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    /// Ports a CONNECT may target.
    pub connect_ports: Vec<u16>,
    /// Lets clients reach loopback, private, link-local and metadata addresses. Off by default:
    /// an open path into the gateway's own network is the classic forward-proxy hole.
    pub allow_private_targets: bool,
    /// Internal targets allowed all the same: networks (an address is a /32 or /128) and exact
    /// host names. A name listed here may also resolve to internal addresses for `direct://`.
    pub allow_targets: TargetAllowList,
}

/// The "explicitly allowed" internal targets of `policy.allow_targets`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetAllowList {
    pub networks: Vec<ipnet::IpNet>,
    /// Lower-case, without a trailing dot.
    pub hosts: Vec<String>,
}

impl TargetAllowList {
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.networks.iter().any(|n| n.contains(&ip))
    }

    pub fn allows_host(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.hosts.iter().any(|h| h.eq_ignore_ascii_case(host))
    }
}

/// Client authentication and the client allowlist.
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    /// Clients allowed to use the proxy, by address; `None` allows every client.
    pub client_cidrs: Option<Vec<ipnet::IpNet>>,
    /// Users by name. When there is at least one, every proxy request must authenticate.
    pub users: BTreeMap<String, UserConfig>,
}

impl AuthConfig {
    pub fn required(&self) -> bool {
        !self.users.is_empty()
    }

    pub fn client_allowed(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.client_cidrs
            .as_ref()
            .is_none_or(|nets| nets.iter().any(|n| n.contains(&ip)))
    }
}

/// One user of the proxy. `Debug` does not print the hash.
#[derive(Clone, PartialEq, Eq)]
pub struct UserConfig {
    /// PHC string (`$argon2id$...`) from `poolgate hash-password`.
    pub password_hash: String,
    /// Pools this user may use; `None` is every pool.
    pub pools: Option<Vec<String>>,
    /// Requests per second this user may send (each instance counts its own); `None` is no limit.
    pub rate_limit: Option<Rate>,
}

impl fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserConfig")
            .field("password_hash", &"<redacted>")
            .field("pools", &self.pools)
            .field("rate_limit", &self.rate_limit)
            .finish()
    }
}

#[derive(Clone, Debug)]
pub struct UpstreamTlsConfig {
    /// Extra CA certificates (PEM) trusted for `https://` upstream proxies.
    pub ca_file: Option<PathBuf>,
    /// Whether the system's roots are trusted too.
    pub system_roots: bool,
}

/// What makes a response a captcha or challenge page.
#[derive(Clone, Debug)]
pub struct CaptchaConfig {
    /// How much of a response body is inspected while it streams on.
    pub sniff_bytes: usize,
    /// Case-insensitive substrings of challenge pages.
    pub markers: Vec<String>,
    /// `name: value` pairs (value compared case-insensitively) that mark a challenge.
    pub challenge_headers: Vec<(http::HeaderName, String)>,
}

pub const DEFAULT_SNIFF_BYTES: usize = 32 * 1024;
pub const MAX_SNIFF_BYTES: usize = 1024 * 1024;

/// Markers of the challenge pages scrapers meet most: reCAPTCHA, hCaptcha, Cloudflare, Google's
/// "unusual traffic", DataDome, PerimeterX, Imperva.
pub const DEFAULT_CAPTCHA_MARKERS: &[&str] = &[
    "g-recaptcha",
    "recaptcha/api.js",
    "h-captcha",
    "hcaptcha.com/1/api.js",
    "challenges.cloudflare.com",
    "/cdn-cgi/challenge-platform",
    "cf-chl-",
    "attention required! | cloudflare",
    "our systems have detected unusual traffic",
    "unusual traffic from your computer network",
    "captcha-delivery.com",
    "px-captcha",
    "_incapsula_resource",
];

impl Default for CaptchaConfig {
    fn default() -> Self {
        CaptchaConfig {
            sniff_bytes: DEFAULT_SNIFF_BYTES,
            markers: DEFAULT_CAPTCHA_MARKERS
                .iter()
                .map(|m| m.to_string())
                .collect(),
            challenge_headers: vec![(
                http::HeaderName::from_static("cf-mitigated"),
                "challenge".to_string(),
            )],
        }
    }
}

/// Passive-health thresholds of one pool. Defaults: one error is noise, three in a row or a
/// success ratio under one half is a fault, and bans (captcha/blocked) trip earlier at 30% of five.
#[derive(Clone, Debug)]
pub struct HealthConfig {
    /// Outcomes remembered per upstream for ratios.
    pub window: usize,
    /// Ratios count only once the window holds this many outcomes.
    pub min_samples: usize,
    pub degrade_after_failures: u32,
    pub quarantine_after_failures: u32,
    pub degrade_below_success: f64,
    pub quarantine_below_success: f64,
    /// Share of captcha/blocked outcomes that quarantines (the more sensitive threshold).
    pub ban_quarantine_ratio: f64,
    pub ban_min_samples: usize,
    /// Consecutive successes that bring a degraded upstream back to healthy.
    pub recover_after_successes: u32,
    /// Consecutive successes in half-open that make the upstream healthy again.
    pub half_open_successes: u32,
    pub cooldown_base: Duration,
    pub cooldown_max: Duration,
    /// ± share of a cool-down added at random.
    pub cooldown_jitter: f64,
    /// A healthy stretch this long resets the cool-down doubling.
    pub cooldown_reset_after: Duration,
    /// Quarantines at the longest cool-down before the upstream is declared dead.
    pub dead_after_cycles: u32,
    pub max_quarantined_percent: u32,
    pub min_in_service: usize,
    /// Share of the pool's upstreams that must be failing on a target for a target incident.
    pub target_incident_ratio: f64,
    pub target_incident_min_upstreams: usize,
    /// How recent an outcome must be to count towards an incident.
    pub incident_window: Duration,
    /// Share of active upstreams failing at once that makes a global (local network) incident.
    pub global_incident_ratio: f64,
    /// Targets tracked per pool; the least recently seen are forgotten first.
    pub max_targets: usize,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            window: 20,
            min_samples: 10,
            degrade_after_failures: 2,
            quarantine_after_failures: 3,
            degrade_below_success: 0.8,
            quarantine_below_success: 0.5,
            ban_quarantine_ratio: 0.3,
            ban_min_samples: 5,
            recover_after_successes: 5,
            half_open_successes: 5,
            cooldown_base: Duration::from_secs(30),
            cooldown_max: Duration::from_secs(30 * 60),
            cooldown_jitter: 0.2,
            cooldown_reset_after: Duration::from_secs(10 * 60),
            dead_after_cycles: 3,
            max_quarantined_percent: 30,
            min_in_service: 1,
            target_incident_ratio: 0.75,
            target_incident_min_upstreams: 3,
            incident_window: Duration::from_secs(60),
            global_incident_ratio: 0.8,
            max_targets: 1000,
        }
    }
}

/// Shortest spacing of probes of an idle upstream; each gap is drawn from
/// `[interval, interval × (1 + jitter)]`.
pub const DEFAULT_PROBE_INTERVAL_MS: u64 = 30_000;
pub const DEFAULT_PROBE_JITTER: f64 = 1.0;
/// Dead upstreams are probed this rarely.
pub const DEFAULT_PROBE_DEAD_INTERVAL_MS: u64 = 10 * 60_000;
pub const DEFAULT_PROBE_SUCCESSES: u32 = 2;
pub const DEFAULT_PROBE_CONCURRENCY: usize = 4;
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 10_000;

/// Active probing of one pool (`[pools.<name>.probe]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeConfig {
    /// Where probes go; a probe passes when any of them answers as expected.
    pub targets: Vec<ControlTarget>,
    pub interval: Duration,
    /// Share of `interval` added at random to each gap, so probes do not fall into step.
    pub jitter: f64,
    pub dead_interval: Duration,
    /// Passing probes a quarantined (or dead) upstream needs to go half-open.
    pub successes: u32,
    /// Probes in flight at once, per pool.
    pub concurrency: usize,
    /// Bound on one probe: connect, request and the answer's head and checked body.
    pub timeout: Duration,
    /// A probe answered slower than this fails (the latency ceiling of admission too).
    pub max_latency: Option<Duration>,
}

/// A URL the pool's upstreams must reach, and the answer expected from it.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlTarget {
    pub url: http::Uri,
    pub target: crate::target::Target,
    pub https: bool,
    pub expect_status: http::StatusCode,
    /// A string the first 64 KiB of the body must contain.
    pub expect_body: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    LeastUsed,
    LeastConnections,
    RoundRobin,
    /// Least-used where each upstream's share follows its success ratio and latency.
    Weighted,
}

impl Strategy {
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::LeastUsed => "least-used",
            Strategy::LeastConnections => "least-connections",
            Strategy::RoundRobin => "round-robin",
            Strategy::Weighted => "weighted",
        }
    }
}

/// Upstream lists that change while the gateway runs (see [`crate::sources`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourcesConfig {
    /// One upstream URL a line, re-read when it changes.
    pub file: Option<PathBuf>,
    /// A list fetched every `url_interval` (`http://` or `https://`).
    pub url: Option<http::Uri>,
    pub url_interval: Duration,
    pub admission: AdmissionConfig,
}

impl SourcesConfig {
    pub fn is_empty(&self) -> bool {
        self.file.is_none() && self.url.is_none()
    }
}

/// What a candidate from an upstream list must be to join the pool, besides passing the
/// pool's probe (its expected answer) when the pool probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionConfig {
    /// Schemes a listed upstream may have; `direct://` is never taken from a list.
    pub schemes: Vec<Scheme>,
    /// A candidate whose probe answered slower than this is refused.
    pub max_latency: Option<Duration>,
    /// Admission probes in flight at once.
    pub concurrency: usize,
}

#[derive(Clone, Debug)]
pub struct PoolConfig {
    pub name: String,
    /// The upstreams listed inline (`upstreams = [...]`): members from the start. Members that
    /// come from [`PoolConfig::sources`] are added to these at run time ([`crate::pool::Pool`]).
    pub upstreams: Vec<Upstream>,
    pub sources: SourcesConfig,
    pub strategy: Strategy,
    /// Live leases allowed per upstream across all instances; `None` is unlimited.
    pub max_concurrency: Option<NonZeroU32>,
    pub queue_timeout: Duration,
    pub session_ttl: Duration,
    pub lease_ttl: Duration,
    /// Further upstreams tried when connecting fails before anything was sent.
    pub retries: u32,
    /// Whether a session whose upstream is unavailable moves to another one instead of failing.
    pub rebind_on_failure: bool,
    /// Terminate clients' TLS on CONNECT and inspect the HTTP inside (needs `[intercept]`).
    pub inspect_tls: bool,
    /// Hosts never inspected, matched against the SNI name and the CONNECT host.
    pub inspect_exclude: Vec<HostPattern>,
    pub health: HealthConfig,
    /// Active probes; `None` leaves health passive (a cool-down's end alone returns an upstream
    /// to half-open).
    pub probe: Option<ProbeConfig>,
    /// `[pools.<name>.rate_limit]`; none set when the table is absent.
    pub rate_limit: RateLimitConfig,
}

/// A request rate: one request per `interval`, with up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Time between two requests once the burst is spent (1 / requests per second).
    pub interval: Duration,
    /// Requests that may go at once after a quiet spell.
    pub burst: NonZeroU32,
}

impl Rate {
    pub fn per_second(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }
}

/// A pool's rate limits (see [`crate::ratelimit`]); each `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Requests through each upstream, whatever the target.
    pub per_upstream: Option<Rate>,
    /// Requests through each upstream to one target host: politeness towards the site.
    pub per_upstream_target: Option<Rate>,
}

impl RateLimitConfig {
    pub fn is_limited(&self) -> bool {
        self.per_upstream.is_some() || self.per_upstream_target.is_some()
    }
}

/// Every problem found in a config file, each naming its key.
#[derive(Debug)]
pub struct ConfigError {
    pub source_name: String,
    pub problems: Vec<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid config {}:", self.source_name)?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads and validates a config file. Relative paths inside it (upstreams files, CA files)
    /// are taken relative to the file's folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            source_name: name.clone(),
            problems: vec![format!("cannot read the file: {e}")],
        })?;
        Self::parse(&text, &name, path.parent())
    }

    /// Validates config text; `base` resolves relative paths.
    pub fn parse(
        text: &str,
        source_name: &str,
        base: Option<&Path>,
    ) -> Result<Config, ConfigError> {
        let file: FileConfig = serde_path_to_error::deserialize(toml::Deserializer::new(text))
            .map_err(|e| ConfigError {
                source_name: source_name.to_string(),
                problems: vec![describe_toml_error(text, &e)],
            })?;
        let mut v = Validator {
            problems: Vec::new(),
            base: base.map(Path::to_path_buf),
        };
        let config = v.config(file);
        match config {
            Some(c) if v.problems.is_empty() => Ok(c),
            _ => Err(ConfigError {
                source_name: source_name.to_string(),
                problems: v.problems,
            }),
        }
    }

    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.get(name)
    }
}

/// A DNS name: dot-separated labels of letters, digits, '-' and '_' (no IP literal).
fn is_host_name(s: &str) -> bool {
    let s = s.trim_end_matches('.');
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// A syntax, type or unknown-key error, led by the dotted key serde was reading when it failed
/// and the line, then toml's own message (which lists the expected keys of an unknown one).
fn describe_toml_error(text: &str, e: &serde_path_to_error::Error<toml::de::Error>) -> String {
    let msg = e.inner().message().trim();
    let key = toml_key(e.path());
    let line = e.inner().span().map(|span| {
        text.bytes()
            .take(span.start)
            .filter(|&b| b == b'\n')
            .count()
            + 1
    });
    match (key.is_empty(), line) {
        (false, Some(line)) => format!("{key} (line {line}): {msg}"),
        (false, None) => format!("{key}: {msg}"),
        (true, Some(line)) => format!("line {line}: {msg}"),
        (true, None) => msg.to_string(),
    }
}

/// The path as a TOML dotted key, e.g. `auth.users."j.doe".pools[0]`: a part that is not a bare
/// key is quoted, so the key can be searched for in the file; empty for a syntax error.
fn toml_key(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path {
        let part = match segment {
            Segment::Seq { index } => {
                out.push_str(&format!("[{index}]"));
                continue;
            }
            Segment::Map { key } => Some(key),
            Segment::Enum { variant } => Some(variant),
            Segment::Unknown => None,
        };
        if !out.is_empty() {
            out.push('.');
        }
        match part {
            Some(part) => push_key_part(&mut out, part),
            None => out.push('?'),
        }
    }
    out
}

/// One part of a dotted key: bare when TOML allows it, else a quoted string.
fn push_key_part(out: &mut String, part: &str) {
    let bare = !part.is_empty()
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare {
        out.push_str(part);
        return;
    }
    out.push('"');
    for c in part.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

struct Validator {
    problems: Vec<String>,
    base: Option<PathBuf>,
}

impl Validator {
    fn problem(&mut self, key: &str, msg: impl fmt::Display) {
        self.problems.push(format!("{key}: {msg}"));
    }

    fn duration(&mut self, key: &str, value: Option<&str>, default_ms: u64) -> Duration {
        match value {
            None => Duration::from_millis(default_ms),
            Some(s) => match humantime::parse_duration(s) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    self.problem(key, "must be greater than zero");
                    Duration::from_millis(default_ms)
                }
                Err(e) => {
                    self.problem(
                        key,
                        format!("`{s}` is not a duration like \"5s\" or \"10m\" ({e})"),
                    );
                    Duration::from_millis(default_ms)
                }
            },
        }
    }

    fn addr(&mut self, key: &str, value: Option<&str>, default: &str) -> SocketAddr {
        let s = value.unwrap_or(default);
        match s.parse() {
            Ok(a) => a,
            Err(_) => {
                self.problem(
                    key,
                    format!("`{s}` is not an address like \"127.0.0.1:8080\""),
                );
                SocketAddr::from(([127, 0, 0, 1], 0))
            }
        }
    }

    fn path(&self, p: &Path) -> PathBuf {
        match &self.base {
            Some(base) if p.is_relative() => base.join(p),
            _ => p.to_path_buf(),
        }
    }

    fn config(&mut self, f: FileConfig) -> Option<Config> {
        let default_pool_name = f.server.default_pool.clone();
        let server = self.server(f.server);
        let store = self.store(&f.store);
        let policy = self.policy(&f.policy);
        let captcha = self.captcha(f.captcha);
        let auth = self.auth(&f.auth);
        let intercept = f.intercept.map(|i| self.intercept(i));
        let upstream_tls = UpstreamTlsConfig {
            ca_file: f.upstream_tls.ca_file.as_deref().map(|p| self.path(p)),
            system_roots: f.upstream_tls.system_roots.unwrap_or(true),
        };
        if let Some(ca) = &upstream_tls.ca_file {
            if !ca.is_file() {
                self.problem(
                    "upstream_tls.ca_file",
                    format!("no such file: {}", ca.display()),
                );
            }
        }

        let mut pools = BTreeMap::new();
        if f.pools.is_empty() {
            self.problem("pools", "at least one pool is required, e.g. [pools.default] with upstreams = [\"direct://\"]");
        }
        for (name, p) in f.pools {
            if let Some(pool) = self.pool(&name, p) {
                pools.insert(name, pool);
            }
        }
        let default_pool = match default_pool_name {
            Some(name) => {
                if !pools.contains_key(&name) && self.problems.is_empty() {
                    self.problem("server.default_pool", format!("no pool named `{name}`"));
                }
                name
            }
            None if pools.len() == 1 => pools.keys().next().cloned().unwrap_or_default(),
            None => {
                if !pools.contains_key(DEFAULT_POOL) && !pools.is_empty() {
                    self.problem(
                        "server.default_pool",
                        "several pools and none named `default`: name the default pool",
                    );
                }
                DEFAULT_POOL.to_string()
            }
        };
        for (name, p) in &pools {
            if p.inspect_tls && intercept.is_none() {
                self.problem(
                    &format!("pools.{name}.inspect_tls"),
                    "needs an interception CA: add [intercept] with ca_cert and ca_key (`poolgate ca init` makes them)",
                );
            }
        }
        if !server.admin_listen.ip().is_loopback() && server.admin_token.is_none() {
            self.problem(
                "server.admin_token",
                "required when server.admin_listen is not a loopback address",
            );
        }
        if server.listen == server.admin_listen && server.listen.port() != 0 {
            self.problem("server.admin_listen", "must differ from server.listen");
        }
        for (name, user) in &auth.users {
            for pool in user.pools.iter().flatten() {
                if !pools.contains_key(pool) && !pools.is_empty() {
                    self.problem(
                        &format!("auth.users.{name}.pools"),
                        format!("no pool named `{pool}`"),
                    );
                }
            }
        }
        Some(Config {
            server,
            store,
            policy,
            upstream_tls,
            captcha,
            auth,
            intercept: intercept.flatten(),
            pools,
            default_pool,
        })
    }

    /// `[intercept]`: both CA files readable, parsable and matching; `None` when unusable.
    fn intercept(&mut self, f: FileIntercept) -> Option<InterceptConfig> {
        let cert = f.ca_cert.as_deref().map(|p| self.path(p));
        let key = f.ca_key.as_deref().map(|p| self.path(p));
        if cert.is_none() {
            self.problem(
                "intercept.ca_cert",
                "required (`poolgate ca init` writes one)",
            );
        }
        if key.is_none() {
            self.problem(
                "intercept.ca_key",
                "required (`poolgate ca init` writes one)",
            );
        }
        let size = f
            .cert_cache_size
            .unwrap_or(intercept::DEFAULT_CERT_CACHE_SIZE);
        let cert_cache_size = std::num::NonZeroUsize::new(size);
        if cert_cache_size.is_none() {
            self.problem("intercept.cert_cache_size", "must be greater than zero");
        }
        let origin_ca_file = f.origin_ca_file.as_deref().map(|p| self.path(p));
        if let Some(p) = &origin_ca_file {
            if !p.is_file() {
                self.problem(
                    "intercept.origin_ca_file",
                    format!("no such file: {}", p.display()),
                );
            }
        }
        let (ca_cert, ca_key) = (cert?, key?);
        if let Err(e) = intercept::ca::Ca::load(&ca_cert, &ca_key) {
            let key = match e.file() {
                intercept::ca::CaFile::Cert => "intercept.ca_cert",
                intercept::ca::CaFile::Key => "intercept.ca_key",
            };
            self.problem(key, e);
        }
        Some(InterceptConfig {
            ca_cert,
            ca_key,
            cert_cache_size: cert_cache_size?,
            origin_ca_file,
        })
    }

    fn server(&mut self, s: FileServer) -> ServerConfig {
        let max_header_bytes = s.max_header_bytes.unwrap_or(DEFAULT_MAX_HEADER_BYTES);
        if max_header_bytes < MIN_MAX_HEADER_BYTES {
            self.problem(
                "server.max_header_bytes",
                format!("must be at least {MIN_MAX_HEADER_BYTES}"),
            );
        }
        let max_connections = s.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            self.problem("server.max_connections", "must be greater than zero");
        }
        let max_connections_per_client = s
            .max_connections_per_client
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_CLIENT);
        if max_connections_per_client == 0 {
            self.problem(
                "server.max_connections_per_client",
                "must be greater than zero",
            );
        }
        let max_request_body_bytes = s
            .max_request_body_bytes
            .unwrap_or(DEFAULT_MAX_REQUEST_BODY_BYTES);
        if max_request_body_bytes == 0 {
            self.problem("server.max_request_body_bytes", "must be greater than zero");
        }
        let workers = s.workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        if !(1..=MAX_WORKERS).contains(&workers) {
            self.problem(
                "server.workers",
                format!("must be between 1 and {MAX_WORKERS}"),
            );
        }
        if s.admin_token.as_deref().is_some_and(|t| t.len() < 16) {
            self.problem("server.admin_token", "must be at least 16 characters");
        }
        ServerConfig {
            listen: self.addr("server.listen", s.listen.as_deref(), DEFAULT_PROXY_LISTEN),
            admin_listen: self.addr(
                "server.admin_listen",
                s.admin_listen.as_deref(),
                DEFAULT_ADMIN_LISTEN,
            ),
            admin_token: s.admin_token,
            header_read_timeout: self.duration(
                "server.header_read_timeout",
                s.header_read_timeout.as_deref(),
                DEFAULT_HEADER_READ_TIMEOUT_MS,
            ),
            max_header_bytes,
            max_connections,
            shutdown_grace: self.duration(
                "server.shutdown_grace",
                s.shutdown_grace.as_deref(),
                DEFAULT_SHUTDOWN_GRACE_MS,
            ),
            connect_timeout: self.duration(
                "server.connect_timeout",
                s.connect_timeout.as_deref(),
                DEFAULT_CONNECT_TIMEOUT_MS,
            ),
            response_timeout: self.duration(
                "server.response_timeout",
                s.response_timeout.as_deref(),
                DEFAULT_RESPONSE_TIMEOUT_MS,
            ),
            upstream_idle_timeout: self.duration(
                "server.upstream_idle_timeout",
                s.upstream_idle_timeout.as_deref(),
                DEFAULT_UPSTREAM_IDLE_TIMEOUT_MS,
            ),
            upstream_max_idle_per_key: s
                .upstream_max_idle_per_key
                .unwrap_or(DEFAULT_UPSTREAM_MAX_IDLE_PER_KEY),
            max_connections_per_client,
            idle_timeout: self.duration(
                "server.idle_timeout",
                s.idle_timeout.as_deref(),
                DEFAULT_IDLE_TIMEOUT_MS,
            ),
            tunnel_idle_timeout: self.duration(
                "server.tunnel_idle_timeout",
                s.tunnel_idle_timeout.as_deref(),
                DEFAULT_TUNNEL_IDLE_TIMEOUT_MS,
            ),
            max_request_body_bytes,
            workers,
        }
    }

    fn store(&mut self, s: &FileStore) -> StoreConfig {
        let kind = s.kind.as_deref().unwrap_or("memory");
        if kind != "redis" {
            for (key, set) in [
                ("store.url", s.url.is_some()),
                ("store.timeout", s.timeout.is_some()),
                ("store.key_prefix", s.key_prefix.is_some()),
            ] {
                if set {
                    self.problem(key, "only used with store.kind = \"redis\"");
                }
            }
        }
        match (kind, &s.url) {
            ("memory", _) => StoreConfig::Memory,
            ("redis", Some(url)) => {
                if let Err(e) = crate::store_url::parse_target(url) {
                    self.problem("store.url", e);
                }
                let timeout = self.duration(
                    "store.timeout",
                    s.timeout.as_deref(),
                    crate::store_url::DEFAULT_TIMEOUT_MS,
                );
                let key_prefix = s
                    .key_prefix
                    .clone()
                    .unwrap_or_else(|| crate::store_url::DEFAULT_KEY_PREFIX.to_string());
                if key_prefix.is_empty()
                    || key_prefix.len() > 64
                    || !key_prefix
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
                {
                    self.problem("store.key_prefix", "1-64 characters of A-Z a-z 0-9 - _ . :");
                }
                StoreConfig::Redis {
                    url: url.clone(),
                    timeout,
                    key_prefix,
                }
            }
            ("redis", None) => {
                self.problem("store.url", "required when store.kind = \"redis\"");
                StoreConfig::Memory
            }
            (other, _) => {
                self.problem(
                    "store.kind",
                    format!("`{other}` is not a store kind (use \"memory\" or \"redis\")"),
                );
                StoreConfig::Memory
            }
        }
    }

    fn policy(&mut self, p: &FilePolicy) -> PolicyConfig {
        let connect_ports = p.connect_ports.clone().unwrap_or_else(|| vec![443]);
        if connect_ports.contains(&0) {
            self.problem("policy.connect_ports", "port 0 is not a port");
        }
        let mut allow_targets = TargetAllowList::default();
        for (i, entry) in p.allow_targets.iter().flatten().enumerate() {
            let key = format!("policy.allow_targets[{i}]");
            let entry = entry.trim();
            if let Ok(net) = entry.parse::<ipnet::IpNet>() {
                allow_targets.networks.push(net);
            } else if let Ok(ip) = entry
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
            {
                allow_targets
                    .networks
                    .push(ipnet::IpNet::from(ip.to_canonical()));
            } else if is_host_name(entry) {
                allow_targets
                    .hosts
                    .push(entry.trim_end_matches('.').to_ascii_lowercase());
            } else {
                self.problem(
                    &key,
                    format!("`{entry}` is neither a network (\"10.1.0.0/16\"), an address nor a host name"),
                );
            }
        }
        PolicyConfig {
            connect_ports,
            allow_private_targets: p.allow_private_targets.unwrap_or(false),
            allow_targets,
        }
    }

    fn auth(&mut self, a: &FileAuth) -> AuthConfig {
        let client_cidrs = a.client_cidrs.as_ref().map(|list| {
            let mut nets = Vec::new();
            for (i, entry) in list.iter().enumerate() {
                let entry = entry.trim();
                match entry.parse::<ipnet::IpNet>() {
                    Ok(n) => nets.push(n),
                    Err(_) => match entry.parse::<IpAddr>() {
                        Ok(ip) => nets.push(ipnet::IpNet::from(ip.to_canonical())),
                        Err(_) => self.problem(
                            &format!("auth.client_cidrs[{i}]"),
                            format!("`{entry}` is not a network like \"10.0.0.0/8\" or an address"),
                        ),
                    },
                }
            }
            nets
        });
        let mut users = BTreeMap::new();
        for (name, u) in &a.users {
            let key = format!("auth.users.{name}");
            if name.is_empty()
                || name.len() > MAX_USER_NAME_LEN
                || name.contains(':')
                || name.bytes().any(|b| b <= b' ' || b == 0x7f)
            {
                self.problem(
                    &key,
                    format!(
                        "user names are 1 to {MAX_USER_NAME_LEN} visible characters without ':'"
                    ),
                );
            }
            let password_hash = match &u.password_hash {
                None => {
                    self.problem(
                        &format!("{key}.password_hash"),
                        "required: make one with `poolgate hash-password`",
                    );
                    String::new()
                }
                // Never echo the value: a plain password pasted here by mistake stays private.
                Some(h) if crate::password::check_hash(h).is_err() => {
                    self.problem(
                        &format!("{key}.password_hash"),
                        "not an argon2 hash (expected `$argon2id$...`, from `poolgate hash-password`)",
                    );
                    String::new()
                }
                Some(h) => h.clone(),
            };
            if u.pools.as_ref().is_some_and(Vec::is_empty) {
                self.problem(
                    &format!("{key}.pools"),
                    "must name at least one pool (omit it for every pool)",
                );
            }
            let burst = self.burst(&format!("{key}.rate_limit_burst"), u.rate_limit_burst);
            let rate_limit = u
                .rate_limit
                .and_then(|r| self.rate(&format!("{key}.rate_limit"), r, burst));
            if u.rate_limit.is_none() && u.rate_limit_burst.is_some() {
                self.problem(
                    &format!("{key}.rate_limit_burst"),
                    "needs rate_limit (requests per second)",
                );
            }
            users.insert(
                name.clone(),
                UserConfig {
                    password_hash,
                    pools: u.pools.clone(),
                    rate_limit,
                },
            );
        }
        AuthConfig {
            client_cidrs,
            users,
        }
    }

    fn pool(&mut self, name: &str, p: FilePool) -> Option<PoolConfig> {
        let key = |k: &str| format!("pools.{name}.{k}");
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            self.problem(
                &format!("pools.{name}"),
                "pool names are 1 to 64 characters of letters, digits, '_' and '-'",
            );
        }
        let mut upstreams = Vec::new();
        for (i, url) in p.upstreams.iter().flatten().enumerate() {
            match Upstream::parse(url) {
                Ok(u) => upstreams.push(u),
                Err(e) => self.problem(&format!("pools.{name}.upstreams[{i}]"), e),
            }
        }
        let sources = self.sources(name, &p);
        if upstreams.is_empty() && sources.is_empty() {
            self.problem(
                &key("upstreams"),
                "a pool needs at least one upstream (or upstreams_file / upstreams_url)",
            );
        }
        if sources.url.is_some() && p.probe.is_none() {
            self.problem(
                &key("upstreams_url"),
                format!("candidates from a list are admitted by probing them: add [pools.{name}.probe] with control targets"),
            );
        }
        let mut seen = std::collections::HashSet::new();
        for u in &upstreams {
            if !seen.insert(u.id.clone()) {
                self.problem(
                    &key("upstreams"),
                    format!("`{}` is listed twice (give one a distinct #id)", u.id),
                );
            }
        }
        let strategy = match p.strategy.as_deref().unwrap_or("least-used") {
            "least-used" => Strategy::LeastUsed,
            "least-connections" => Strategy::LeastConnections,
            "round-robin" => Strategy::RoundRobin,
            "weighted" => Strategy::Weighted,
            other => {
                self.problem(
                    &key("strategy"),
                    format!(
                        "`{other}` is not a strategy (least-used, least-connections, round-robin, weighted)"
                    ),
                );
                Strategy::LeastUsed
            }
        };
        let max_concurrency = match p.max_concurrency {
            None => None,
            Some(0) => {
                self.problem(
                    &key("max_concurrency"),
                    "must be at least 1 (omit it for no cap)",
                );
                None
            }
            Some(n) => NonZeroU32::new(n),
        };
        let session_ttl = self.duration(
            &key("session_ttl"),
            p.session_ttl.as_deref(),
            DEFAULT_SESSION_TTL_MS,
        );
        if session_ttl > Duration::from_millis(MAX_SESSION_TTL_MS) {
            self.problem(&key("session_ttl"), "must be at most 24h");
        }
        let lease_ttl = self.duration(
            &key("lease_ttl"),
            p.lease_ttl.as_deref(),
            DEFAULT_LEASE_TTL_MS,
        );
        if lease_ttl < Duration::from_millis(MIN_LEASE_TTL_MS) {
            self.problem(&key("lease_ttl"), "must be at least 1s");
        }
        let inspect_exclude = p
            .inspect_exclude
            .iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, pattern)| match HostPattern::parse(pattern) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.problem(&format!("pools.{name}.inspect_exclude[{i}]"), e);
                    None
                }
            })
            .collect();
        let retries = p.retries.unwrap_or(DEFAULT_RETRIES);
        if retries > MAX_RETRIES {
            self.problem(&key("retries"), format!("must be at most {MAX_RETRIES}"));
        }
        Some(PoolConfig {
            name: name.to_string(),
            upstreams,
            sources,
            strategy,
            max_concurrency,
            queue_timeout: self.duration(
                &key("queue_timeout"),
                p.queue_timeout.as_deref(),
                DEFAULT_QUEUE_TIMEOUT_MS,
            ),
            session_ttl,
            lease_ttl,
            retries,
            rebind_on_failure: p.rebind_on_failure.unwrap_or(false),
            inspect_tls: p.inspect_tls.unwrap_or(false),
            inspect_exclude,
            health: self.health(&format!("pools.{name}.health"), p.health),
            probe: p
                .probe
                .map(|f| self.probe(&format!("pools.{name}.probe"), f)),
            rate_limit: p
                .rate_limit
                .map(|r| self.rate_limit(&format!("pools.{name}.rate_limit"), r))
                .unwrap_or_default(),
        })
    }

    /// `upstreams_file`, `upstreams_url` and `[pools.<name>.admission]`. The file must be readable
    /// now (a wrong path is a typo to report at once); its lines are read by the sources task,
    /// which skips a malformed one with a warning rather than refusing the whole list.
    fn sources(&mut self, name: &str, p: &FilePool) -> SourcesConfig {
        let key = |k: &str| format!("pools.{name}.{k}");
        let file = p.upstreams_file.as_deref().map(|f| self.path(f));
        if let Some(path) = &file {
            if let Err(e) = std::fs::read_to_string(path) {
                self.problem(
                    &key("upstreams_file"),
                    format!("cannot read {}: {e}", path.display()),
                );
            }
        }
        let url = p
            .upstreams_url
            .as_deref()
            .and_then(|u| match u.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.host().is_some() =>
                {
                    Some(uri)
                }
                _ => {
                    self.problem(
                        &key("upstreams_url"),
                        "must be an http:// or https:// URL with a host",
                    );
                    None
                }
            });
        let url_interval = self.duration(
            &key("upstreams_url_interval"),
            p.upstreams_url_interval.as_deref(),
            DEFAULT_UPSTREAMS_URL_INTERVAL_MS,
        );
        if url_interval < Duration::from_millis(MIN_UPSTREAMS_URL_INTERVAL_MS) {
            self.problem(&key("upstreams_url_interval"), "must be at least 10s");
        }
        if p.upstreams_url_interval.is_some() && p.upstreams_url.is_none() {
            self.problem(&key("upstreams_url_interval"), "set upstreams_url too");
        }
        let a = p.admission.as_ref();
        let mut schemes = Vec::new();
        match a.and_then(|a| a.schemes.as_ref()) {
            None => schemes.extend([Scheme::Http, Scheme::Https, Scheme::Socks5, Scheme::Socks5h]),
            Some(list) => {
                for (i, s) in list.iter().enumerate() {
                    let k = format!("pools.{name}.admission.schemes[{i}]");
                    match s.as_str() {
                        "http" => schemes.push(Scheme::Http),
                        "https" => schemes.push(Scheme::Https),
                        "socks5" => schemes.push(Scheme::Socks5),
                        "socks5h" => schemes.push(Scheme::Socks5h),
                        "direct" => self.problem(
                            &k,
                            "direct egress is never taken from a list; put direct:// in upstreams",
                        ),
                        other => self.problem(
                            &k,
                            format!(
                                "`{other}` is not a proxy scheme (http, https, socks5, socks5h)"
                            ),
                        ),
                    }
                }
                if list.is_empty() {
                    self.problem(
                        &format!("pools.{name}.admission.schemes"),
                        "name at least one scheme",
                    );
                }
            }
        }
        let max_latency = a
            .and_then(|a| a.max_latency.as_deref())
            .map(|v| self.duration(&format!("pools.{name}.admission.max_latency"), Some(v), 0));
        let concurrency = a
            .and_then(|a| a.concurrency)
            .unwrap_or(DEFAULT_ADMISSION_CONCURRENCY);
        if !(1..=MAX_ADMISSION_CONCURRENCY).contains(&concurrency) {
            self.problem(
                &format!("pools.{name}.admission.concurrency"),
                format!("must be 1 to {MAX_ADMISSION_CONCURRENCY}"),
            );
        }
        SourcesConfig {
            file,
            url,
            url_interval,
            admission: AdmissionConfig {
                schemes,
                max_latency,
                concurrency,
            },
        }
    }

    /// `[pools.<name>.rate_limit]`: at least one limit; `burst` applies to both.
    fn rate_limit(&mut self, prefix: &str, r: FileRateLimit) -> RateLimitConfig {
        let k = |s: &str| format!("{prefix}.{s}");
        if r.per_upstream.is_none() && r.per_upstream_target.is_none() {
            self.problem(
                prefix,
                "set per_upstream and/or per_upstream_target (requests per second), or remove the table",
            );
        }
        let burst = self.burst(&k("burst"), r.burst);
        RateLimitConfig {
            per_upstream: r
                .per_upstream
                .and_then(|v| self.rate(&k("per_upstream"), v, burst)),
            per_upstream_target: r
                .per_upstream_target
                .and_then(|v| self.rate(&k("per_upstream_target"), v, burst)),
        }
    }

    /// A burst size: `None` (after reporting it) when out of range.
    fn burst(&mut self, key: &str, burst: Option<u32>) -> Option<NonZeroU32> {
        match burst {
            None => NonZeroU32::new(DEFAULT_RATE_LIMIT_BURST),
            Some(b) if b > MAX_RATE_LIMIT_BURST => {
                self.problem(key, format!("must be at most {MAX_RATE_LIMIT_BURST}"));
                None
            }
            Some(b) => {
                let b = NonZeroU32::new(b);
                if b.is_none() {
                    self.problem(key, "must be at least 1");
                }
                b
            }
        }
    }

    /// A rate in requests per second (fractions allowed: 0.2 is one request every 5 s).
    fn rate(&mut self, key: &str, per_second: f64, burst: Option<NonZeroU32>) -> Option<Rate> {
        if !(per_second.is_finite() && per_second > 0.0) {
            self.problem(key, "must be > 0 (requests per second)");
            return None;
        }
        if per_second > MAX_RATE_LIMIT_PER_S {
            self.problem(key, format!("must be at most {MAX_RATE_LIMIT_PER_S}"));
            return None;
        }
        Some(Rate {
            interval: Duration::from_secs_f64(1.0 / per_second),
            burst: burst?,
        })
    }

    fn probe(&mut self, prefix: &str, p: FileProbe) -> ProbeConfig {
        let k = |name: &str| format!("{prefix}.{name}");
        let status = |v: &mut Self, key: &str, code: Option<u16>| match code {
            None => http::StatusCode::OK,
            Some(c) => http::StatusCode::from_u16(c)
                .ok()
                .filter(|s| !s.is_informational())
                .unwrap_or_else(|| {
                    v.problem(key, format!("{c} is not a final HTTP status"));
                    http::StatusCode::OK
                }),
        };
        let default_status = status(self, &k("expect_status"), p.expect_status);
        let mut targets = Vec::new();
        for (i, t) in p.targets.into_iter().flatten().enumerate() {
            let key = format!("{prefix}.targets[{i}]");
            let (url, code, body) = match t {
                FileControlTarget::Url(u) => (u, None, None),
                FileControlTarget::Table(FileControlTable {
                    url,
                    expect_status,
                    expect_body,
                }) => (url, expect_status, expect_body),
            };
            let expect_status = match code {
                Some(_) => status(self, &format!("{key}.expect_status"), code),
                None => default_status,
            };
            let parsed = url.parse::<http::Uri>().ok().and_then(|uri| {
                let https = match uri.scheme_str() {
                    Some("http") => false,
                    Some("https") => true,
                    _ => return None,
                };
                let target = crate::target::Target::from_uri(&uri, None).ok()?;
                Some((uri, target, https))
            });
            match parsed {
                Some((url, target, https)) => targets.push(ControlTarget {
                    url,
                    target,
                    https,
                    expect_status,
                    expect_body: body.or_else(|| p.expect_body.clone()),
                }),
                None => self.problem(
                    &key,
                    format!("`{url}` is not an http:// or https:// URL with a host"),
                ),
            }
        }
        if targets.is_empty() {
            self.problem(
                &k("targets"),
                "name at least one control target URL (several, so one site's outage is not taken for the upstreams')",
            );
        }
        let interval = self.duration(
            &k("interval"),
            p.interval.as_deref(),
            DEFAULT_PROBE_INTERVAL_MS,
        );
        let dead_interval = self.duration(
            &k("dead_interval"),
            p.dead_interval.as_deref(),
            DEFAULT_PROBE_DEAD_INTERVAL_MS,
        );
        let timeout = self.duration(
            &k("timeout"),
            p.timeout.as_deref(),
            DEFAULT_PROBE_TIMEOUT_MS,
        );
        let max_latency = p
            .max_latency
            .as_deref()
            .map(|s| self.duration(&k("max_latency"), Some(s), DEFAULT_PROBE_TIMEOUT_MS));
        if max_latency.is_some_and(|m| m > timeout) {
            self.problem(&k("max_latency"), "must not exceed timeout");
        }
        ProbeConfig {
            targets,
            interval,
            jitter: self.ratio(&k("jitter"), p.jitter, DEFAULT_PROBE_JITTER),
            dead_interval,
            successes: self.positive(&k("successes"), p.successes, DEFAULT_PROBE_SUCCESSES),
            concurrency: self.positive(&k("concurrency"), p.concurrency, DEFAULT_PROBE_CONCURRENCY),
            timeout,
            max_latency,
        }
    }

    fn ratio(&mut self, key: &str, value: Option<f64>, default: f64) -> f64 {
        match value {
            None => default,
            Some(v) if (0.0..=1.0).contains(&v) => v,
            Some(v) => {
                self.problem(key, format!("{v} is not a ratio between 0 and 1"));
                default
            }
        }
    }

    fn positive<T: PartialOrd + Default + Copy + fmt::Display>(
        &mut self,
        key: &str,
        value: Option<T>,
        default: T,
    ) -> T {
        match value {
            Some(v) if v <= T::default() => {
                self.problem(key, "must be greater than zero");
                default
            }
            Some(v) => v,
            None => default,
        }
    }

    fn health(&mut self, prefix: &str, h: FileHealth) -> HealthConfig {
        let d = HealthConfig::default();
        let k = |name: &str| format!("{prefix}.{name}");
        let c = HealthConfig {
            window: self.positive(&k("window"), h.window, d.window),
            min_samples: self.positive(&k("min_samples"), h.min_samples, d.min_samples),
            degrade_after_failures: self.positive(
                &k("degrade_after_failures"),
                h.degrade_after_failures,
                d.degrade_after_failures,
            ),
            quarantine_after_failures: self.positive(
                &k("quarantine_after_failures"),
                h.quarantine_after_failures,
                d.quarantine_after_failures,
            ),
            degrade_below_success: self.ratio(
                &k("degrade_below_success"),
                h.degrade_below_success,
                d.degrade_below_success,
            ),
            quarantine_below_success: self.ratio(
                &k("quarantine_below_success"),
                h.quarantine_below_success,
                d.quarantine_below_success,
            ),
            ban_quarantine_ratio: self.ratio(
                &k("ban_quarantine_ratio"),
                h.ban_quarantine_ratio,
                d.ban_quarantine_ratio,
            ),
            ban_min_samples: self.positive(
                &k("ban_min_samples"),
                h.ban_min_samples,
                d.ban_min_samples,
            ),
            recover_after_successes: self.positive(
                &k("recover_after_successes"),
                h.recover_after_successes,
                d.recover_after_successes,
            ),
            half_open_successes: self.positive(
                &k("half_open_successes"),
                h.half_open_successes,
                d.half_open_successes,
            ),
            cooldown_base: self.duration(
                &k("cooldown_base"),
                h.cooldown_base.as_deref(),
                d.cooldown_base.as_millis() as u64,
            ),
            cooldown_max: self.duration(
                &k("cooldown_max"),
                h.cooldown_max.as_deref(),
                d.cooldown_max.as_millis() as u64,
            ),
            cooldown_jitter: self.ratio(
                &k("cooldown_jitter"),
                h.cooldown_jitter,
                d.cooldown_jitter,
            ),
            cooldown_reset_after: self.duration(
                &k("cooldown_reset_after"),
                h.cooldown_reset_after.as_deref(),
                d.cooldown_reset_after.as_millis() as u64,
            ),
            dead_after_cycles: h.dead_after_cycles.unwrap_or(d.dead_after_cycles),
            max_quarantined_percent: h
                .max_quarantined_percent
                .unwrap_or(d.max_quarantined_percent),
            min_in_service: h.min_in_service.unwrap_or(d.min_in_service),
            target_incident_ratio: self.ratio(
                &k("target_incident_ratio"),
                h.target_incident_ratio,
                d.target_incident_ratio,
            ),
            target_incident_min_upstreams: self.positive(
                &k("target_incident_min_upstreams"),
                h.target_incident_min_upstreams,
                d.target_incident_min_upstreams,
            ),
            incident_window: self.duration(
                &k("incident_window"),
                h.incident_window.as_deref(),
                d.incident_window.as_millis() as u64,
            ),
            global_incident_ratio: self.ratio(
                &k("global_incident_ratio"),
                h.global_incident_ratio,
                d.global_incident_ratio,
            ),
            max_targets: self.positive(&k("max_targets"), h.max_targets, d.max_targets),
        };
        if c.max_quarantined_percent > 100 {
            self.problem(&k("max_quarantined_percent"), "must be between 0 and 100");
        }
        if c.cooldown_max < c.cooldown_base {
            self.problem(&k("cooldown_max"), "must be at least cooldown_base");
        }
        if c.quarantine_after_failures < c.degrade_after_failures {
            self.problem(
                &k("quarantine_after_failures"),
                "must be at least degrade_after_failures",
            );
        }
        if c.quarantine_below_success > c.degrade_below_success {
            self.problem(
                &k("quarantine_below_success"),
                "must not exceed degrade_below_success",
            );
        }
        if c.min_samples > c.window || c.ban_min_samples > c.window {
            self.problem(
                &k("min_samples"),
                "min_samples and ban_min_samples must not exceed window",
            );
        }
        c
    }

    fn captcha(&mut self, f: FileCaptcha) -> CaptchaConfig {
        let d = CaptchaConfig::default();
        let sniff_bytes = f.sniff_bytes.unwrap_or(d.sniff_bytes);
        if sniff_bytes > MAX_SNIFF_BYTES {
            self.problem(
                "captcha.sniff_bytes",
                format!("must be at most {MAX_SNIFF_BYTES}"),
            );
        }
        let mut markers: Vec<String> = f.markers.unwrap_or(d.markers);
        markers.extend(f.extra_markers.unwrap_or_default());
        if markers.iter().any(|m| m.trim().is_empty()) {
            self.problem("captcha.markers", "markers must not be empty strings");
        }
        let challenge_headers = match f.challenge_headers {
            None => d.challenge_headers,
            Some(list) => list
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    let parsed = h.split_once(':').and_then(|(n, v)| {
                        Some((
                            http::HeaderName::from_bytes(n.trim().as_bytes()).ok()?,
                            v.trim().to_string(),
                        ))
                    });
                    if parsed.is_none() {
                        self.problem(
                            &format!("captcha.challenge_headers[{i}]"),
                            "expected \"name: value\"",
                        );
                    }
                    parsed
                })
                .collect(),
        };
        CaptchaConfig {
            sniff_bytes,
            markers: markers
                .into_iter()
                .map(|m| m.to_ascii_lowercase())
                .collect(),
            challenge_headers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        Config::parse(text, "test.toml", None).unwrap_err().problems
    }

    #[test]
    fn minimal_config_gets_safe_defaults() {
        let c = Config::parse("[pools.default]\nupstreams = [\"direct://\"]\n", "t", None).unwrap();
        assert_eq!(c.default_pool, "default");
        assert_eq!(c.server.listen.to_string(), DEFAULT_PROXY_LISTEN);
        assert_eq!(c.policy.connect_ports, vec![443]);
        assert!(!c.policy.allow_private_targets);
        let p = c.pool("default").unwrap();
        assert_eq!(p.strategy, Strategy::LeastUsed);
        assert_eq!(p.retries, DEFAULT_RETRIES);
        assert_eq!(c.store, StoreConfig::Memory);
    }

    #[test]
    fn workers_default_to_the_cores_and_out_of_range_counts_are_refused_by_key() {
        let c = Config::parse("[pools.default]\nupstreams = [\"direct://\"]\n", "t", None).unwrap();
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        assert_eq!(c.server.workers, cores);
        let c = Config::parse(
            "[server]\nworkers = 3\n[pools.default]\nupstreams = [\"direct://\"]\n",
            "t",
            None,
        )
        .unwrap();
        assert_eq!(c.server.workers, 3);
        for bad in ["0", "1025"] {
            let p = problems(&format!(
                "[server]\nworkers = {bad}\n[pools.default]\nupstreams = [\"direct://\"]\n"
            ));
            assert!(
                p.iter().any(|m| m.starts_with("server.workers: ")),
                "{bad}: {p:?}"
            );
        }
    }

    #[test]
    fn redis_store_keys_are_read_and_the_password_never_shown() {
        let c = Config::parse(
            "[store]\nkind = \"redis\"\nurl = \"redis+cluster://:hunter2@127.0.0.1:7000,127.0.0.1:7001\"\n\
             timeout = \"100ms\"\nkey_prefix = \"pg-eu\"\n\
             [pools.default]\nupstreams = [\"direct://\"]\n",
            "test.toml",
            None,
        )
        .unwrap();
        match &c.store {
            StoreConfig::Redis {
                timeout,
                key_prefix,
                ..
            } => {
                assert_eq!(*timeout, Duration::from_millis(100));
                assert_eq!(key_prefix, "pg-eu");
            }
            other => panic!("{other:?}"),
        }
        assert!(!format!("{:?}", c.store).contains("hunter2"));
        let p = problems(
            "[store]\nkind = \"redis\"\nurl = \"http://:hunter2@h\"\nkey_prefix = \"a{b}\"\n",
        )
        .join("\n");
        assert!(
            p.contains("store.url") && p.contains("store.key_prefix"),
            "{p}"
        );
        assert!(!p.contains("hunter2"), "{p}");
        let p = problems("[store]\ntimeout = \"1s\"\n").join("\n");
        assert!(p.contains("store.timeout"), "{p}");
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let p = problems(
            r#"
[server]
listen = "nope"
[store]
kind = "etcd"
[pools.a]
upstreams = ["ftp://x:1", "http://u:hunter2@h"]
strategy = "random"
max_concurrency = 0
queue_timeout = "soon"
"#,
        );
        let joined = p.join("\n");
        for key in [
            "server.listen",
            "store.kind",
            "pools.a.upstreams[0]",
            "pools.a.upstreams[1]",
            "pools.a.strategy",
            "pools.a.max_concurrency",
            "pools.a.queue_timeout",
        ] {
            assert!(joined.contains(key), "missing {key} in:\n{joined}");
        }
        assert!(!joined.contains("hunter2"), "{joined}");
    }

    #[test]
    fn unknown_keys_name_the_line() {
        let p = problems("[pools.default]\nupstreams = [\"direct://\"]\nmax_conns = 3\n");
        assert!(
            p[0].contains("line 3") && p[0].contains("max_conns"),
            "{p:?}"
        );
    }

    /// Type, unknown-key and missing-key errors name the full dotted key and the line, at any
    /// depth, and keep toml's message (with the expected keys) as their tail.
    #[test]
    fn type_errors_name_their_full_key_at_any_depth() {
        let cases: &[(&str, &str)] = &[
            (
                "[server]\nmax_connections = \"lots\"\n",
                "server.max_connections (line 2): invalid type: string \"lots\", expected u32",
            ),
            (
                "[store]\ntimeout = 5\n",
                "store.timeout (line 2): invalid type: integer `5`, expected a string",
            ),
            (
                "[captcha]\nmarkers = \"x\"\n",
                "captcha.markers (line 2): invalid type: string \"x\", expected a sequence",
            ),
            (
                "[policy]\nconnect_ports = [443, \"80\"]\n",
                "policy.connect_ports[1] (line 2): invalid type: string \"80\", expected u16",
            ),
            (
                "[pools.default]\nupstreams = [\"direct://\"]\nretries = \"many\"\n",
                "pools.default.retries (line 3): invalid type: string \"many\", expected u32",
            ),
            (
                "pools = { default = { upstreams = [\"direct://\"], retries = \"many\" } }\n",
                "pools.default.retries (line 1): invalid type: string \"many\", expected u32",
            ),
            (
                "[pools.default.health]\nwindow = -1\n",
                "pools.default.health.window (line 2): invalid value: integer `-1`, expected usize",
            ),
            (
                "[pools.default.probe]\ninterval = 30\n",
                "pools.default.probe.interval (line 2): invalid type: integer `30`, expected a string",
            ),
            (
                "[auth.users.alice]\nrate_limit = \"fast\"\n",
                "auth.users.alice.rate_limit (line 2): invalid type: string \"fast\", expected f64",
            ),
            (
                "[auth.users.\"j.doe\"]\nrate_limit_burst = 1.5\n",
                "auth.users.\"j.doe\".rate_limit_burst (line 2): invalid type: floating point `1.5`, expected u32",
            ),
            (
                "[auth.users.'say \"hi\"']\npools = \"default\"\n",
                "auth.users.\"say \\\"hi\\\"\".pools (line 2): invalid type: string \"default\", expected a sequence",
            ),
            (
                "[pools.default.health]\nwindoww = 3\n",
                "pools.default.health.windoww (line 2): unknown field `windoww`, expected one of `window`, ",
            ),
            (
                "[pools.default.probe]\ntargets = [\"http://a.example/\", { url = \"http://b.example/\", expect_status = \"204\" }]\n",
                "pools.default.probe.targets[1].expect_status (line 2): invalid type: string \"204\", expected u16",
            ),
            (
                "[pools.default.probe]\ntargets = [{ url = \"http://a.example/\", expect_stauts = 204 }]\n",
                "pools.default.probe.targets[0].expect_stauts (line 2): unknown field `expect_stauts`, expected one of `url`, ",
            ),
            (
                "[pools.default.probe]\ntargets = [{ expect_status = 204 }]\n",
                "pools.default.probe.targets[0] (line 2): missing field `url`",
            ),
            (
                "[pools.default.probe]\ntargets = [204]\n",
                "pools.default.probe.targets[0] (line 2): invalid type: integer `204`, expected a URL or a table",
            ),
            (
                "[serverr]\n",
                "serverr (line 1): unknown field `serverr`, expected one of `server`, ",
            ),
        ];
        for (text, want) in cases {
            let p = problems(text);
            assert_eq!(p.len(), 1, "{text}: {p:?}");
            assert!(
                p[0].starts_with(want),
                "{text}:\n got {}\nwant {want}",
                p[0]
            );
        }
        // A syntax error has no key: the line alone, as before.
        let p = problems("[pools.default]\nupstreams = [\"direct://\"\n");
        assert!(p[0].starts_with("line "), "{p:?}");
    }

    #[test]
    fn sources_are_validated_with_keys_named() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[pools.default]\nupstreams_file = \"ups.txt\"\n";
        let err = Config::parse(text, "t", Some(dir.path())).unwrap_err();
        assert!(
            err.problems[0].starts_with("pools.default.upstreams_file")
                && err.problems[0].contains("cannot read"),
            "{:?}",
            err.problems
        );
        // Lines are the sources task's business: a bad one does not refuse the config.
        std::fs::write(
            dir.path().join("ups.txt"),
            "# c\nbogus\nhttp://127.0.0.1:3128#a\n",
        )
        .unwrap();
        let c = Config::parse(text, "t", Some(dir.path())).unwrap();
        let pool = c.pool("default").unwrap();
        assert!(pool.upstreams.is_empty());
        assert_eq!(
            pool.sources.file.as_deref(),
            Some(dir.path().join("ups.txt").as_path())
        );
        assert_eq!(pool.sources.admission.schemes.len(), 4);

        let p = problems(
            "[pools.default]\nupstreams_url = \"ftp://lists.example/p.txt\"\nupstreams_url_interval = \"1s\"\n[pools.default.admission]\nschemes = [\"direct\", \"gopher\"]\nmax_latency = \"soon\"\nconcurrency = 0\n",
        );
        for key in [
            "pools.default.upstreams_url:",
            "pools.default.upstreams_url_interval:",
            "pools.default.admission.schemes[0]:",
            "pools.default.admission.schemes[1]:",
            "pools.default.admission.max_latency:",
            "pools.default.admission.concurrency:",
        ] {
            assert!(p.iter().any(|m| m.starts_with(key)), "{key} in {p:?}");
        }
        let p = problems("[pools.default]\nupstreams_url = \"https://lists.example/p.txt\"\n");
        assert!(
            p.iter()
                .any(|m| m.starts_with("pools.default.upstreams_url:") && m.contains("probe")),
            "{p:?}"
        );
        let ok = Config::parse(
            "[pools.default]\nupstreams_url = \"https://lists.example/p.txt\"\n[pools.default.probe]\ntargets = [\"http://a.example/\"]\n[pools.default.admission]\nschemes = [\"socks5\"]\nmax_latency = \"2s\"\n",
            "t",
            None,
        )
        .unwrap();
        let s = &ok.pools["default"].sources;
        assert_eq!(s.url_interval, Duration::from_secs(600));
        assert_eq!(s.admission.schemes, vec![Scheme::Socks5]);
        assert_eq!(s.admission.max_latency, Some(Duration::from_secs(2)));
    }

    #[test]
    fn weighted_is_a_strategy() {
        let c = Config::parse(
            "[pools.default]\nupstreams = [\"direct://\"]\nstrategy = \"weighted\"\n",
            "t",
            None,
        )
        .unwrap();
        assert_eq!(c.pools["default"].strategy, Strategy::Weighted);
    }

    #[test]
    fn admin_off_loopback_needs_a_token() {
        let p = problems(
            "[server]\nadmin_listen = \"0.0.0.0:8081\"\n[pools.default]\nupstreams = [\"direct://\"]\n",
        );
        assert!(
            p.iter().any(|m| m.starts_with("server.admin_token")),
            "{p:?}"
        );
    }
    #[test]
    fn probe_section_is_validated_with_keys_named() {
        let ok = Config::parse(
            "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.probe]\ntargets = [\"http://a.example/ok\", { url = \"https://b.example/\", expect_status = 204 }]\nexpect_body = \"fine\"\ninterval = \"45s\"\n",
            "t",
            None,
        )
        .unwrap();
        let probe = ok.pools["default"].probe.clone().unwrap();
        assert_eq!(probe.targets.len(), 2);
        assert_eq!(probe.targets[0].expect_body.as_deref(), Some("fine"));
        assert_eq!(probe.targets[1].expect_status, http::StatusCode::NO_CONTENT);
        assert!(probe.targets[1].https);
        assert_eq!(probe.interval, Duration::from_secs(45));
        assert_eq!(probe.successes, DEFAULT_PROBE_SUCCESSES);

        let bad = Config::parse(
            "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.probe]\ntargets = [\"ftp://x\"]\nexpect_status = 99\nsuccesses = 0\nmax_latency = \"1m\"\ntimeout = \"5s\"\n",
            "t",
            None,
        )
        .unwrap_err()
        .to_string();
        for key in [
            "pools.default.probe.targets[0]",
            "pools.default.probe.expect_status",
            "pools.default.probe.successes",
            "pools.default.probe.max_latency",
        ] {
            assert!(bad.contains(key), "{key} not named in: {bad}");
        }
    }
}
