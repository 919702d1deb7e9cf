//! Configuration: the TOML file as written (serde structs that reject unknown keys) and the
//! validated [`Config`] the gateway runs on.
//!
//! Validation happens once, at load, and reports every problem at once, each naming its key, so a
//! broken file is fixed in one edit rather than one error at a time.
//!
//! `file` holds the serde structs, `validate` the problem collector and the shared value readers,
//! `error` how problems are reported; each section (`server`, `store`, `pool`, `health`, ...) has
//! a file with its validated type and its checks. This file ties them together and runs the
//! checks that span sections.

mod auth;
mod captcha;
mod defaults;
mod error;
mod file;
mod health;
mod intercept;
mod log;
mod policy;
mod pool;
mod probe;
mod rate_limit;
mod server;
mod sources;
mod store;
#[cfg(test)]
mod tests;
mod upstream_tls;
mod validate;
mod warnings;

use std::collections::BTreeMap;
use std::path::Path;

use crate::intercept::InterceptConfig;

pub use auth::{AuthConfig, LoginBackoff, UserConfig};
pub use captcha::{CaptchaConfig, DEFAULT_CAPTCHA_MARKERS, DEFAULT_SNIFF_BYTES, MAX_SNIFF_BYTES};
pub use defaults::*;
pub use error::ConfigError;
pub use health::HealthConfig;
pub use log::{
    AccessFormat, AccessTarget, DEFAULT_ACCESS_BUFFER_LINES, DEFAULT_PER_UPSTREAM_MAX, LogConfig,
    MAX_ACCESS_BUFFER_LINES, MetricsConfig,
};
pub use policy::{DEFAULT_HTTP_PORTS, PolicyConfig, PortSet, TargetAllowList};
pub use pool::{PoolConfig, Strategy};
pub use probe::{
    ControlTarget, DEFAULT_PROBE_CONCURRENCY, DEFAULT_PROBE_DEAD_INTERVAL_MS,
    DEFAULT_PROBE_INTERVAL_MS, DEFAULT_PROBE_JITTER, DEFAULT_PROBE_SUCCESSES,
    DEFAULT_PROBE_TIMEOUT_MS, ProbeConfig,
};
pub use rate_limit::{Rate, RateLimitConfig};
pub use server::ServerConfig;
pub use sources::{AdmissionConfig, SourcesConfig};
pub use store::{StoreConfig, StoreTls};
pub use upstream_tls::UpstreamTlsConfig;

use error::describe_toml_error;
use file::FileConfig;
use validate::Validator;

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
    /// The access log (`[log]`); fixed at start.
    pub log: LogConfig,
    /// Bounds on exported series (`[metrics]`).
    pub metrics: MetricsConfig,
}

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

impl Validator {
    /// The whole file: each section, then the checks that span sections.
    fn config(&mut self, f: FileConfig) -> Option<Config> {
        let default_pool_name = f.server.default_pool.clone();
        let server = self.server(f.server);
        let store = self.store(&f.store);
        let policy = self.policy(&f.policy);
        let captcha = self.captcha(f.captcha);
        let auth = self.auth(&f.auth);
        let intercept = f.intercept.map(|i| self.intercept(i));
        let upstream_tls = self.upstream_tls(&f.upstream_tls);
        let log = self.log(&f.log);
        let metrics = self.metrics(&f.metrics);

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
        // Safe by default: a proxy reachable beyond this machine with neither users nor a
        // client allowlist would serve anyone as an open proxy (Squid refuses all but its
        // `localnet` the same way).
        let open = auth.users.is_empty() && auth.client_cidrs.is_none();
        let proxy_listeners = [
            ("server.listen", Some(server.listen)),
            ("server.socks_listen", server.socks_listen),
        ];
        for (key, addr) in proxy_listeners {
            if open && addr.is_some_and(|a| !a.ip().is_loopback()) {
                self.problem(
                    key,
                    "a proxy listener beyond loopback needs [auth.users] or auth.client_cidrs, or \
                     anyone who reaches it may use it; for a private network: client_cidrs = \
                     [\"10.0.0.0/8\", \"172.16.0.0/12\", \"192.168.0.0/16\", \"127.0.0.0/8\"]",
                );
            }
        }
        if server.listen == server.admin_listen && server.listen.port() != 0 {
            self.problem("server.admin_listen", "must differ from server.listen");
        }
        if let Some(socks) = server.socks_listen.filter(|a| a.port() != 0) {
            if socks == server.listen || socks == server.admin_listen {
                self.problem(
                    "server.socks_listen",
                    "must differ from server.listen and server.admin_listen",
                );
            }
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
            log,
            metrics,
        })
    }
}
