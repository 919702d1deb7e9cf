//! `[policy]`: which targets clients may reach.

use std::net::IpAddr;
use std::ops::RangeInclusive;

use super::file::{FilePolicy, FilePorts};
use super::validate::Validator;

/// Ports plain HTTP may reach unless `policy.http_ports` says otherwise: Squid's `Safe_ports`
/// (http, https, ftp, gopher, wais, http-mgmt, gss-http, filemaker, multiling http, and every
/// unprivileged port). The other privileged ports belong to services (SMTP, SSH, POP, IMAP,
/// LDAP...) that a forwarded request has no business reaching: lines of an HTTP request can pass
/// for their commands.
pub const DEFAULT_HTTP_PORTS: [RangeInclusive<u16>; 10] = [
    80..=80,
    443..=443,
    21..=21,
    70..=70,
    210..=210,
    280..=280,
    488..=488,
    591..=591,
    777..=777,
    1025..=65535,
];

#[derive(Clone, Debug)]
pub struct PolicyConfig {
    /// Ports a CONNECT may target.
    pub connect_ports: Vec<u16>,
    /// Ports a forwarded (absolute-form) request may target.
    pub http_ports: PortSet,
    /// Lets clients reach loopback, private, link-local and metadata addresses. Off by default:
    /// an open path into the gateway's own network is the classic forward-proxy hole.
    pub allow_private_targets: bool,
    /// Internal targets allowed all the same: networks (an address is a /32 or /128) and exact
    /// host names. A name listed here may also resolve to internal addresses where the gateway
    /// resolves it (`direct://`, `socks5://`).
    pub allow_targets: TargetAllowList,
}

/// A set of ports, as ranges (a single port is a range of one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSet(Vec<RangeInclusive<u16>>);

impl PortSet {
    pub fn new(ranges: Vec<RangeInclusive<u16>>) -> Self {
        PortSet(ranges)
    }

    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|r| r.contains(&port))
    }
}

impl Default for PortSet {
    /// [`DEFAULT_HTTP_PORTS`].
    fn default() -> Self {
        PortSet(DEFAULT_HTTP_PORTS.to_vec())
    }
}

/// One entry of a port list: `443`, or `"1025-65535"` (`"8080"` is read as a port too).
fn port_entry(entry: &FilePorts) -> Result<RangeInclusive<u16>, String> {
    let port = |n: i64| u16::try_from(n).ok().filter(|p| *p != 0);
    match entry {
        FilePorts::Number(n) => port(*n)
            .map(|p| p..=p)
            .ok_or_else(|| format!("{n} is not a port (1-65535)")),
        FilePorts::Text(text) => {
            let bound = |s: &str| s.trim().parse::<i64>().ok().and_then(port);
            let range = match text.split_once('-') {
                Some((lo, hi)) => bound(lo).zip(bound(hi)),
                None => bound(text).map(|p| (p, p)),
            };
            match range {
                Some((lo, hi)) if lo <= hi => Ok(lo..=hi),
                Some(_) => Err(format!("`{text}` is a range that runs backwards")),
                None => Err(format!(
                    "`{text}` is neither a port (1-65535) nor a range of them like \"1025-65535\""
                )),
            }
        }
    }
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
        let http_ports = match &p.http_ports {
            None => PortSet::default(),
            Some(entries) => {
                let mut ranges = Vec::with_capacity(entries.len());
                for (i, entry) in entries.iter().enumerate() {
                    match port_entry(entry) {
                        Ok(range) => ranges.push(range),
                        Err(why) => self.problem(&format!("policy.http_ports[{i}]"), why),
                    }
                }
                PortSet::new(ranges)
            }
        };
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
            http_ports,
            allow_private_targets: p.allow_private_targets.unwrap_or(false),
            allow_targets,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::problems;
    use super::*;

    fn policy(text: &str) -> PolicyConfig {
        let text = format!("[policy]\n{text}\n[pools.default]\nupstreams = [\"direct://\"]\n");
        Config::parse(&text, "t", None).unwrap().policy
    }

    #[test]
    fn http_ports_default_to_the_safe_ports() {
        let p = policy("");
        for port in [80, 443, 21, 70, 210, 280, 488, 591, 777, 1025, 8080, 65535] {
            assert!(p.http_ports.contains(port), "{port}");
        }
        for port in [0, 1, 22, 25, 110, 143, 389, 444, 1024] {
            assert!(!p.http_ports.contains(port), "{port}");
        }
    }

    #[test]
    fn http_ports_take_ports_and_ranges() {
        let p = policy("http_ports = [80, \"8000-8099\", \"9443\"]");
        assert_eq!(
            p.http_ports,
            PortSet::new(vec![80..=80, 8000..=8099, 9443..=9443])
        );
        assert!(p.http_ports.contains(8050));
        assert!(!p.http_ports.contains(443));
        assert!(!p.http_ports.contains(8100));
        // Empty: no plain HTTP at all, CONNECT only.
        assert!(!policy("http_ports = []").http_ports.contains(80));
    }

    #[test]
    fn bad_http_ports_entries_are_named_by_key() {
        for (entry, why) in [
            ("0", "0 is not a port"),
            ("70000", "70000 is not a port"),
            ("-1", "-1 is not a port"),
            ("\"web\"", "`web` is neither a port"),
            ("\"1-2-3\"", "`1-2-3` is neither a port"),
            ("\"0-80\"", "`0-80` is neither a port"),
            (
                "\"2000-1000\"",
                "`2000-1000` is a range that runs backwards",
            ),
        ] {
            let p = problems(&format!(
                "[policy]\nhttp_ports = [80, {entry}]\n[pools.default]\nupstreams = [\"direct://\"]\n"
            ));
            assert!(
                p.iter()
                    .any(|m| m.starts_with("policy.http_ports[1]: ") && m.contains(why)),
                "{entry}: {p:?}"
            );
        }
        let p = problems(
            "[policy]\nhttp_ports = [true]\n[pools.default]\nupstreams = [\"direct://\"]\n",
        );
        assert!(
            p.iter().any(|m| m.starts_with("policy.http_ports[0]")
                && m.contains("a port (443) or a range of ports")),
            "{p:?}"
        );
    }
}
