//! `[policy]`: which targets clients may reach.

use std::net::IpAddr;

use super::file::FilePolicy;
use super::validate::Validator;

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    /// Ports a CONNECT may target.
    pub connect_ports: Vec<u16>,
    /// Lets clients reach loopback, private, link-local and metadata addresses. Off by default:
    /// an open path into the gateway's own network is the classic forward-proxy hole.
    pub allow_private_targets: bool,
    /// Internal targets allowed all the same: networks (an address is a /32 or /128) and exact
    /// host names. A name listed here may also resolve to internal addresses where the gateway
    /// resolves it (`direct://`, `socks5://`).
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

impl Validator {
    pub(super) fn policy(&mut self, p: &FilePolicy) -> PolicyConfig {
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
}
