//! `[server]`: listeners, client limits and timeouts.

use std::net::SocketAddr;
use std::time::Duration;

use super::defaults::*;
use super::file::FileServer;
use super::validate::Validator;

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// The SOCKS5 front door (see [`crate::proxy::socks`]); off when `None`.
    pub socks_listen: Option<SocketAddr>,
    pub admin_listen: SocketAddr,
    /// Required for admin actions, and for any admin address that is not loopback.
    pub admin_token: Option<String>,
    /// Lets its bearer read `/status`, `/metrics` and the dashboard (the admin token does too).
    /// Set, reads need a token on any admin address; unset, only on an address that is not
    /// loopback (see `crate::admin::access`).
    pub admin_read_token: Option<String>,
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

impl Validator {
    pub(super) fn server(&mut self, s: FileServer) -> ServerConfig {
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
        // Never echo a token's value.
        if s.admin_token
            .as_deref()
            .is_some_and(|t| t.len() < MIN_ADMIN_TOKEN_LEN)
        {
            self.problem(
                "server.admin_token",
                format!("must be at least {MIN_ADMIN_TOKEN_LEN} characters"),
            );
        }
        match s.admin_read_token.as_deref() {
            Some(t) if t.len() < MIN_ADMIN_TOKEN_LEN => self.problem(
                "server.admin_read_token",
                format!("must be at least {MIN_ADMIN_TOKEN_LEN} characters"),
            ),
            Some(t) if !t.bytes().all(|b| b.is_ascii_graphic()) => self.problem(
                "server.admin_read_token",
                "must be visible ASCII without spaces (it is sent in a header)",
            ),
            _ => {}
        }
        ServerConfig {
            listen: self.addr("server.listen", s.listen.as_deref(), DEFAULT_PROXY_LISTEN),
            socks_listen: s
                .socks_listen
                .as_deref()
                .map(|a| self.addr("server.socks_listen", Some(a), a)),
            admin_listen: self.addr(
                "server.admin_listen",
                s.admin_listen.as_deref(),
                DEFAULT_ADMIN_LISTEN,
            ),
            admin_token: s.admin_token,
            admin_read_token: s.admin_read_token,
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
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::problems;

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
}
