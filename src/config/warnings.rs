//! Risks in a config that validates: what `poolgate check` warns about without failing. Each
//! warning leads with the key to look at and says what to set.
//!
//! The gravest risk, a proxy listener beyond loopback with neither users nor a client allowlist
//! (an open proxy), is not a warning but a problem: the gateway refuses to start with it (see
//! `Validator::config`), and `check` fails the same way.

use std::net::SocketAddr;

use super::{Config, StoreConfig};
use crate::upstream::{Scheme, Upstream};

/// Loopback as the listeners judge it (an IPv4-mapped loopback address counts).
fn on_loopback(addr: SocketAddr) -> bool {
    addr.ip().to_canonical().is_loopback()
}

impl Config {
    /// The risks of this config, one line each. `listed` holds the upstreams read from the pools'
    /// `upstreams_file`s (pool name, entries), which the config alone does not know.
    pub fn warnings(&self, listed: &[(&str, &[Upstream])]) -> Vec<String> {
        let mut out = Vec::new();
        let server = &self.server;
        if !on_loopback(server.listen) && self.auth.users.is_empty() {
            match &self.auth.client_cidrs {
                Some(cidrs) if cidrs.is_empty() => out.push(
                    "auth.client_cidrs: the list is empty, so every client is refused; list the \
                     clients' networks, e.g. client_cidrs = [\"10.0.0.0/8\"]"
                        .to_string(),
                ),
                Some(cidrs) => {
                    if let Some(all) = cidrs.iter().find(|c| c.prefix_len() == 0) {
                        out.push(format!(
                            "auth.client_cidrs: `{all}` admits every address, so server.listen \
                             ({}) is an open proxy for anyone who reaches it; list only the \
                             clients' networks, or add [auth.users]",
                            server.listen
                        ));
                    }
                }
                // Refused at load; never reached.
                None => {}
            }
        }
        if !on_loopback(server.admin_listen) {
            out.push(format!(
                "server.admin_listen: `{}` is beyond loopback: /status, /metrics and the dashboard \
                 (upstream addresses, targets) are reachable from the network behind \
                 server.admin_read_token or server.admin_token, and the admin actions behind \
                 server.admin_token; set admin_listen = \"127.0.0.1:{}\" unless remote admin is \
                 intended",
                server.admin_listen,
                server.admin_listen.port()
            ));
        }
        if self.policy.allow_private_targets {
            let inline = self.pools.values().flat_map(|p| {
                p.upstreams
                    .iter()
                    .enumerate()
                    .map(move |(i, u)| (format!("pools.{}.upstreams[{i}]", p.name), &**u))
            });
            let from_files = listed.iter().flat_map(|(pool, ups)| {
                ups.iter()
                    .map(move |u| (format!("pools.{pool}.upstreams_file"), u))
            });
            if let Some((key, u)) = inline
                .chain(from_files)
                .find(|(_, u)| u.scheme == Scheme::Direct)
            {
                out.push(format!(
                    "policy.allow_private_targets: true with a direct upstream ({key}, `{}`): \
                     clients can reach this host's loopback and private networks through the \
                     gateway (its admin listener, Redis, cloud metadata at 169.254.169.254); set \
                     allow_private_targets = false and name the internal targets clients need in \
                     policy.allow_targets",
                    u.id
                ));
            }
        }
        if self.store == StoreConfig::Memory {
            let mut sharded: Vec<_> = self.pools.values().filter(|p| p.shards > 1).collect();
            sharded.sort_by(|a, b| a.name.cmp(&b.name));
            for p in sharded {
                out.push(format!(
                    "pools.{}.shards: {} shards on the embedded store, which one process holds: \
                     shards spread a pool over a Redis Cluster's masters and gain nothing here; \
                     remove the key, or set [store] kind = \"redis\"",
                    p.name, p.shards
                ));
            }
        }
        out
    }
}
