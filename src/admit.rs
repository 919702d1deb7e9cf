//! Admission: whether a request may go where it asks to.
//!
//! The target policy denies, unless the config allows them, CONNECT to ports other than the
//! allowed ones, and targets in loopback, private, link-local (cloud metadata), CGNAT,
//! unique-local and unspecified ranges, as literals or as `localhost` names. A forward proxy that
//! lets clients into its own network is the classic open-proxy hole.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::config::PolicyConfig;
use crate::error::ProxyError;
use crate::target::Target;

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
    if policy.allow_private_targets {
        return Ok(());
    }
    let denied = match target.ip() {
        Some(ip) => is_internal(ip),
        None => is_local_name(&target.host),
    };
    if denied {
        return Err(ProxyError::TargetDenied(
            "internal addresses are not reachable through this proxy",
        ));
    }
    Ok(())
}

fn is_local_name(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    host == "localhost" || host.ends_with(".localhost") || host.is_empty()
}

/// Loopback, private, link-local, CGNAT, unique-local, unspecified, multicast/broadcast, and the
/// same inside IPv4-mapped IPv6.
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
            allow_private_targets: false,
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
        assert!(check_target(&policy(), &Target::new("example.com", 25), false).is_ok());
        let open = PolicyConfig {
            allow_private_targets: true,
            ..policy()
        };
        assert!(check_target(&open, &Target::new("127.0.0.1", 443), true).is_ok());
    }
}
