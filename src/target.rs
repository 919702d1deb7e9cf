//! The target a client asked for: `host:port` of an origin.

use std::fmt;
use std::net::IpAddr;

/// A request's destination. `host` is lower-case and carries no IPv6 brackets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: String,
    pub port: u16,
}

impl Target {
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        let host: String = host.into();
        let mut host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(inner) => inner.to_string(),
            None => host,
        };
        // In place: a request names its target once, and this is on every request's path.
        host.make_ascii_lowercase();
        Target { host, port }
    }

    /// Target of an absolute-form URI or a CONNECT authority; `None` when the host or port is
    /// missing or unusable.
    pub fn from_uri(uri: &http::Uri, default_port: Option<u16>) -> Option<Self> {
        let host = uri.host()?;
        if host.is_empty() {
            return None;
        }
        let port = uri.port_u16().or(default_port).or(match uri.scheme_str() {
            Some("http") => Some(80),
            Some("https") => Some(443),
            _ => None,
        })?;
        if port == 0 {
            return None;
        }
        Some(Target::new(host, port))
    }

    /// The host as an IP address, when it is a literal.
    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }

    /// `host:port` with brackets around IPv6 literals, as used in CONNECT and Host. Built by hand:
    /// it is on every tunnel's path, where the formatting machinery cost more than the rest.
    pub fn authority(&self) -> String {
        let v6 = self.host.contains(':');
        let mut s = String::with_capacity(self.host.len() + 8);
        if v6 {
            s.push('[');
        }
        s.push_str(&self.host);
        if v6 {
            s.push(']');
        }
        s.push(':');
        s.push_str(itoa::Buffer::new().format(self.port));
        s
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.authority())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_uri_fills_default_ports_and_strips_brackets() {
        let t = Target::from_uri(&"http://Example.com/x".parse().unwrap(), None).unwrap();
        assert_eq!(t, Target::new("example.com", 80));
        let t = Target::from_uri(&"[::1]:8443".parse().unwrap(), None).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 8443));
        assert_eq!(t.to_string(), "[::1]:8443");
        assert!(Target::from_uri(&"/relative".parse().unwrap(), None).is_none());
        assert!(Target::from_uri(&"example.com".parse().unwrap(), None).is_none());
    }
}
