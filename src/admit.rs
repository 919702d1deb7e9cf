//! Admission: who may use the proxy, and whether a request may go where it asks to.
//!
//! The client check comes first: a client address outside `auth.client_cidrs` is refused before
//! anything else is looked at.
//!
//! The target policy denies, unless the config allows them, CONNECT to ports other than
//! `connect_ports`, forwarded HTTP to ports other than `http_ports` (by default Squid's
//! `Safe_ports`: a request aimed at a mail or database port is an attack, not a page), and targets
//! in loopback, private, link-local (cloud metadata), CGNAT, unique-local and unspecified ranges,
//! as literals or as `localhost` names. A forward proxy that lets clients into its own network is
//! the classic open-proxy hole. `policy.allow_targets` lists the internal networks and names
//! allowed all the same; `allow_private_targets` opens them all. The gateway's own listeners
//! (proxy and admin) are denied whatever the config says, so the admin API is never reachable
//! through the proxy port.
//!
//! Wherever the gateway resolves a target name itself (`direct://`, and `socks5://`, which sends
//! the proxy an address), the same decision is made again on every address the name resolved to
//! ([`TargetPolicy::allows_resolved`], called by the connector right before the address is dialed
//! or sent), so a public name that resolves to an internal address (DNS rebinding) is refused too.
//! `socks5h://` and HTTP proxies resolve names themselves: the name is all the gateway sees.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::{AuthConfig, PolicyConfig};
use crate::error::ProxyError;
use crate::target::Target;

const INTERNAL_DENIED: &str = "internal addresses are not reachable through this proxy";
const OWN_DENIED: &str = "the gateway's own listeners are not reachable through the proxy";

/// The target policy in force: the configured one plus the gateway's own listener addresses.
#[derive(Clone, Debug)]
pub struct TargetPolicy {
    pub config: PolicyConfig,
    /// Addresses the gateway listens on; never a target.
    pub own: Vec<SocketAddr>,
}

impl TargetPolicy {
    pub fn new(config: PolicyConfig, own: Vec<SocketAddr>) -> Self {
        TargetPolicy { config, own }
    }

    /// The check on the target as the client wrote it (literal address or name).
    pub fn check(&self, target: &Target, connect: bool) -> Result<(), ProxyError> {
        if self.is_own(target.ip(), &target.host, target.port) {
            return Err(ProxyError::TargetDenied(OWN_DENIED));
        }
        check_target(&self.config, target, connect)
    }

    /// Whether `addr`, which `target`'s name resolved to here, may be dialed or sent to a SOCKS
    /// proxy (`direct://`, `socks5://`).
    pub fn allows_resolved(&self, target: &Target, addr: SocketAddr) -> bool {
        if self.is_own(Some(addr.ip()), "", addr.port()) {
            return false;
        }
        let p = &self.config;
        p.allow_private_targets
            || !is_internal(addr.ip())
            || p.allow_targets.allows_ip(addr.ip())
            || (target.ip().is_none() && p.allow_targets.allows_host(&target.host))
    }

    fn is_own(&self, ip: Option<IpAddr>, host: &str, port: u16) -> bool {
        self.own.iter().any(|own| {
            own.port() == port
                && match ip {
                    Some(ip) => {
                        let ip = ip.to_canonical();
                        ip == own.ip()
                            || ip.is_loopback()
                            || ip.is_unspecified()
                            || (own.ip().is_unspecified() && is_internal(ip))
                    }
                    None => is_local_name(host),
                }
        })
    }
}

/// Refuses clients outside `auth.client_cidrs`.
pub fn check_client(auth: &AuthConfig, peer: IpAddr) -> Result<(), ProxyError> {
    if auth.client_allowed(peer) {
        Ok(())
    } else {
        Err(ProxyError::ClientDenied)
    }
}

pub fn check_target(
    policy: &PolicyConfig,
    target: &Target,
    connect: bool,
) -> Result<(), ProxyError> {
    if connect && !policy.connect_ports.contains(&target.port) {
        return Err(ProxyError::TargetDenied(
            "CONNECT to this port is not allowed",
        ));
    }
    if !connect && !policy.http_ports.contains(target.port) {
        return Err(ProxyError::TargetDenied("HTTP to this port is not allowed"));
    }
    if policy.allow_private_targets {
        return Ok(());
    }
    let denied = match target.ip() {
        Some(ip) => is_internal(ip) && !policy.allow_targets.allows_ip(ip),
        None => is_local_name(&target.host) && !policy.allow_targets.allows_host(&target.host),
    };
    if denied {
        return Err(ProxyError::TargetDenied(INTERNAL_DENIED));
    }
    Ok(())
}

fn is_local_name(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    host == "localhost" || host.ends_with(".localhost") || host.is_empty()
}

/// Loopback, private, link-local, CGNAT, unique-local, unspecified, multicast/broadcast, and the
/// same inside IPv4-mapped (and IPv4-compatible) IPv6.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_internal_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => is_internal_v4(v4),
            None => is_internal_v6(v6),
        },
    }
}

fn is_internal_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
}

fn is_internal_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        || ip
            .to_ipv4()
            .is_some_and(|v4| ip.segments()[..6] == [0; 6] && is_internal_v4(v4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> PolicyConfig {
        PolicyConfig {
            connect_ports: vec![443],
            http_ports: Default::default(),
            allow_private_targets: false,
            allow_targets: Default::default(),
        }
    }

    #[test]
    fn internal_ranges_are_denied_by_default() {
        for host in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "::ffff:127.0.0.1",
            "fd00::1",
            "fe80::1",
            "::",
            "localhost",
            "api.localhost",
        ] {
            let t = Target::new(host, 443);
            assert!(check_target(&policy(), &t, true).is_err(), "{host} allowed");
        }
        for host in ["93.184.216.34", "2606:2800:220:1::1", "example.com"] {
            assert!(
                check_target(&policy(), &Target::new(host, 443), true).is_ok(),
                "{host} denied"
            );
        }
    }

    #[test]
    fn connect_ports_and_the_private_switch() {
        assert!(check_target(&policy(), &Target::new("example.com", 25), true).is_err());
        assert!(check_target(&policy(), &Target::new("example.com", 8025), false).is_ok());
        let open = PolicyConfig {
            allow_private_targets: true,
            ..policy()
        };
        assert!(check_target(&open, &Target::new("127.0.0.1", 443), true).is_ok());
    }

    #[test]
    fn http_ports_apply_to_forwarded_requests_only() {
        for port in [80, 443, 8080, 65535] {
            let t = Target::new("example.com", port);
            assert!(check_target(&policy(), &t, false).is_ok(), "{port}");
        }
        for port in [22, 25, 110, 1024] {
            let t = Target::new("example.com", port);
            assert!(
                matches!(
                    check_target(&policy(), &t, false),
                    Err(ProxyError::TargetDenied(_))
                ),
                "{port}"
            );
        }
        // CONNECT answers to connect_ports alone.
        let mut p = policy();
        p.connect_ports = vec![25];
        p.http_ports = crate::config::PortSet::new(vec![25..=25]);
        assert!(check_target(&p, &Target::new("example.com", 25), false).is_ok());
        assert!(check_target(&p, &Target::new("example.com", 80), false).is_err());
        assert!(check_target(&p, &Target::new("example.com", 25), true).is_ok());
        assert!(check_target(&p, &Target::new("example.com", 443), true).is_err());
    }

    #[test]
    fn metadata_cgnat_unique_local_and_mapped_forms_are_internal() {
        for ip in [
            "169.254.169.254",
            "169.254.0.1",
            "100.64.0.1",
            "100.127.255.254",
            "10.0.0.1",
            "172.31.255.255",
            "192.168.0.1",
            "127.8.9.10",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "::",
            "::1",
            "fc00::1",
            "fdff::1",
            "fe80::1",
            "febf::1",
            "ff02::1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:127.0.0.1",
            "::127.0.0.1",
        ] {
            assert!(is_internal(ip.parse().unwrap()), "{ip} is internal");
        }
        for ip in [
            "8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "172.32.0.1",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
        ] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip} is public");
        }
    }

    #[test]
    fn allow_list_opens_named_networks_and_hosts_only() {
        let mut p = policy();
        p.allow_targets
            .networks
            .push("10.1.0.0/16".parse().unwrap());
        p.allow_targets.networks.push("::1/128".parse().unwrap());
        p.allow_targets.hosts.push("intranet.test".into());
        for ok in ["10.1.2.3", "::1", "intranet.test", "INTRANET.test."] {
            assert!(
                check_target(&p, &Target::new(ok, 443), true).is_ok(),
                "{ok}"
            );
        }
        for denied in ["10.2.0.1", "127.0.0.1", "localhost", "169.254.169.254"] {
            assert!(
                check_target(&p, &Target::new(denied, 443), true).is_err(),
                "{denied}"
            );
        }
    }

    #[test]
    fn resolved_addresses_are_checked_like_literals() {
        let mut tp = TargetPolicy::new(policy(), vec![]);
        let name = Target::new("rebind.test", 443);
        for ip in [
            "127.0.0.1",
            "10.0.0.5",
            "169.254.169.254",
            "::1",
            "::ffff:192.168.1.1",
        ] {
            let addr = SocketAddr::new(ip.parse().unwrap(), 443);
            assert!(!tp.allows_resolved(&name, addr), "{ip}");
        }
        assert!(tp.allows_resolved(&name, "93.184.216.34:443".parse().unwrap()));
        tp.config.allow_targets.hosts.push("rebind.test".into());
        assert!(tp.allows_resolved(&name, "127.0.0.1:443".parse().unwrap()));
        assert!(!tp.allows_resolved(
            &Target::new("other.test", 443),
            "127.0.0.1:443".parse().unwrap()
        ));
    }

    #[test]
    fn own_listeners_are_denied_even_when_private_targets_are_allowed() {
        let mut p = policy();
        p.allow_private_targets = true;
        p.connect_ports = vec![443, 8081];
        let tp = TargetPolicy::new(p, vec!["127.0.0.1:8081".parse().unwrap()]);
        for host in [
            "127.0.0.1",
            "localhost",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
        ] {
            assert!(tp.check(&Target::new(host, 8081), false).is_err(), "{host}");
            assert!(tp.check(&Target::new(host, 8081), true).is_err(), "{host}");
        }
        assert!(tp.check(&Target::new("127.0.0.1", 443), true).is_ok());
        let t = Target::new("anything.test", 8081);
        assert!(!tp.allows_resolved(&t, "127.0.0.1:8081".parse().unwrap()));
        assert!(tp.allows_resolved(&t, "127.0.0.1:8082".parse().unwrap()));
    }

    #[test]
    fn client_allowlist() {
        let mut auth = AuthConfig::default();
        assert!(check_client(&auth, "203.0.113.9".parse().unwrap()).is_ok());
        auth.client_cidrs = Some(vec!["10.0.0.0/8".parse().unwrap()]);
        assert!(check_client(&auth, "10.9.9.9".parse().unwrap()).is_ok());
        assert!(check_client(&auth, "::ffff:10.9.9.9".parse().unwrap()).is_ok());
        assert!(check_client(&auth, "127.0.0.1".parse().unwrap()).is_err());
    }
}
