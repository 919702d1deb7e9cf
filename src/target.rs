//! The target a client asked for: `host:port` of an origin, with its host in one canonical form.
//!
//! Every front door builds its target through [`Target::parse`] (via [`Target::from_uri`]) so
//! the target policy judges the address the host *means*, not the spelling the client chose.
//! The C library's `inet_aton` and WHATWG URL parsing both read `127.1`, `2130706433`,
//! `0x7f.0.0.1` and `0177.0.0.1` as 127.0.0.1, and an upstream proxy that resolves names with
//! them would reach its own loopback. So a host whose last label is numeric is parsed the WHATWG
//! way into the dotted quad it denotes, or refused when it denotes nothing; it is never passed on
//! as a name. Names keep to the characters of DNS names, and IPv6 literals to what
//! `Ipv6Addr` reads (no zone ids).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A request's destination. `host` is lower-case and carries no IPv6 brackets.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: String,
    pub port: u16,
}

/// Why a target was refused before any policy looked at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetError {
    /// No host, no port (and no scheme to imply one), or port 0.
    Unusable,
    /// The host is neither a DNS name nor an IP address in any form (`127.0.0.256`, `1.2.3.4.5`,
    /// `0x7g`, `09.1`, `a..b`, `%31`, `fe80::1%eth0`).
    BadHost,
}

impl TargetError {
    pub fn message(self) -> &'static str {
        match self {
            TargetError::Unusable => "the target has no usable host and port",
            TargetError::BadHost => "the target host is neither a DNS name nor an IP address",
        }
    }
}

impl Target {
    /// A target from a host already known to be canonical (tests, the gateway's own values). A
    /// client's host goes through [`Target::parse`].
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

    /// A client's target: the host canonicalised by [`canonical_host`], the port nonzero.
    pub fn parse(host: &str, port: u16) -> Result<Self, TargetError> {
        if port == 0 {
            return Err(TargetError::Unusable);
        }
        Ok(Target {
            host: canonical_host(host)?,
            port,
        })
    }

    /// Target of an absolute-form URI or a CONNECT authority.
    pub fn from_uri(uri: &http::Uri, default_port: Option<u16>) -> Result<Self, TargetError> {
        let host = uri.host().ok_or(TargetError::Unusable)?;
        if host.is_empty() {
            return Err(TargetError::Unusable);
        }
        let port = uri
            .port_u16()
            .or(default_port)
            .or(match uri.scheme_str() {
                Some("http") => Some(80),
                Some("https") => Some(443),
                _ => None,
            })
            .ok_or(TargetError::Unusable)?;
        Target::parse(host, port)
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

/// The one spelling of a host: an IPv4 literal in any `inet_aton`/WHATWG form becomes its dotted
/// quad, an IPv6 literal (bracketed or not) its compressed form, a name lower-case with only DNS
/// characters and no empty label (one trailing dot is allowed).
pub fn canonical_host(raw: &str) -> Result<String, TargetError> {
    // Nearly every target is already canonical: a dotted quad (which the standard parser reads
    // only in its one spelling, no leading zeros) is returned as it is, without formatting.
    if raw.parse::<Ipv4Addr>().is_ok() {
        return Ok(raw.to_owned());
    }
    let unbracketed = raw.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
    if unbracketed.is_some() || raw.contains(':') {
        let ip: Ipv6Addr = unbracketed
            .unwrap_or(raw)
            .parse()
            .map_err(|_| TargetError::BadHost)?;
        return Ok(ip.to_string());
    }
    let host = raw.to_ascii_lowercase();
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(TargetError::BadHost);
    }
    // One trailing dot is allowed; no label may be empty.
    let bare = host.strip_suffix('.').unwrap_or(&host);
    if bare.is_empty() || bare.split('.').any(str::is_empty) {
        return Err(TargetError::BadHost);
    }
    let last = bare.rsplit('.').next().unwrap_or_default();
    // Numeric by its characters, not by its value: `0x100000000` is an IPv4 literal too large
    // to mean anything, not a name.
    let numeric = match last.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => last.bytes().all(|b| b.is_ascii_digit()),
    };
    if numeric {
        let labels: Vec<&str> = bare.split('.').collect();
        return parse_ipv4(&labels)
            .map(|ip| ip.to_string())
            .ok_or(TargetError::BadHost);
    }
    Ok(host)
}

/// The WHATWG IPv4 parser: up to four parts, each decimal, `0x` hexadecimal or `0`-led octal;
/// the last part fills the bytes the others left.
fn parse_ipv4(labels: &[&str]) -> Option<Ipv4Addr> {
    if labels.len() > 4 {
        return None;
    }
    let numbers: Vec<u64> = labels
        .iter()
        .map(|l| ipv4_number(l))
        .collect::<Option<_>>()?;
    let (last, leading) = numbers.split_last()?;
    if leading.iter().any(|n| *n > 255) {
        return None;
    }
    let room = 256u64.pow(5 - numbers.len() as u32);
    if *last >= room {
        return None;
    }
    let mut addr = *last;
    for (i, n) in leading.iter().enumerate() {
        addr += n << (8 * (3 - i));
    }
    u32::try_from(addr).ok().map(Ipv4Addr::from)
}

/// One part of an IPv4 literal; `None` when it is not a number in its radix or exceeds 32 bits.
fn ipv4_number(part: &str) -> Option<u64> {
    let (digits, radix) = if let Some(hex) = part.strip_prefix("0x") {
        (hex, 16)
    } else if part.len() > 1 && part.starts_with('0') {
        (&part[1..], 8)
    } else {
        (part, 10)
    };
    if digits.is_empty() {
        // `0x` alone is zero; an empty part is not a number at all.
        return (radix == 16).then_some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix)
        .ok()
        .filter(|n| *n <= u64::from(u32::MAX))
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
        assert!(Target::from_uri(&"/relative".parse().unwrap(), None).is_err());
        assert!(Target::from_uri(&"example.com".parse().unwrap(), None).is_err());
        assert_eq!(
            Target::from_uri(&"http://a.test:0/".parse().unwrap(), None),
            Err(TargetError::Unusable)
        );
    }

    /// Every spelling `inet_aton` and WHATWG accept for an IPv4 address: fewer parts, one
    /// integer, hexadecimal, octal, mixed, upper case, a trailing dot.
    #[test]
    fn legacy_ipv4_forms_become_the_dotted_quad_they_mean() {
        for (raw, canonical) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("0X7F.1", "127.0.0.1"),
            ("0x7f.0.0.1", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0177.1", "127.0.0.1"),
            ("017700000001", "127.0.0.1"),
            ("169.254.43518", "169.254.169.254"),
            ("0xa9fea9fe", "169.254.169.254"),
            ("0251.0376.0251.0376", "169.254.169.254"),
            ("10.0x10.1", "10.16.0.1"),
            ("0", "0.0.0.0"),
            ("0x", "0.0.0.0"),
            ("0x.0x.0x.0x", "0.0.0.0"),
            ("00000000000000000000000000127.1", "87.0.0.1"),
            ("127.0.0.1.", "127.0.0.1"),
            ("4294967295", "255.255.255.255"),
            ("192.168.1", "192.168.0.1"),
        ] {
            assert_eq!(canonical_host(raw).as_deref(), Ok(canonical), "{raw}");
        }
    }

    /// A host whose last label is numeric but that denotes no address is refused, never passed
    /// on as a name; so are characters no DNS name has, empty labels and IPv6 zone ids.
    #[test]
    fn almost_addresses_and_impossible_names_are_refused() {
        for raw in [
            "127.0.0.256",
            "256.0.0.1",
            "1.2.3.4.5",
            "4294967296",
            "0x100000000",
            "127.0x1000000",
            "127.1.65536",
            "09.1",
            "08",
            "0x7g.1",
            "foo.123",
            "127..1",
            "127.0.0.1..",
            ".127.0.0.1",
            "",
            ".",
            "127.0.0.%31",
            "exa mple.com",
            "a\r\nb",
            "fe80::1%eth0",
            "[fe80::1%25eth0]",
            "[127.0.0.1]",
            "[::1",
            "1::2::3",
            "99999999999999999999999999",
        ] {
            assert_eq!(canonical_host(raw), Err(TargetError::BadHost), "{raw:?}");
        }
    }

    #[test]
    fn names_and_ipv6_keep_one_spelling() {
        for (raw, canonical) in [
            ("Example.COM", "example.com"),
            ("example.com.", "example.com."),
            ("_srv.a-b.test", "_srv.a-b.test"),
            ("127.0.0.1.nip.io", "127.0.0.1.nip.io"),
            ("0x7f.example", "0x7f.example"),
            ("1e2", "1e2"),
            ("[::1]", "::1"),
            ("[0:0:0:0:0:0:0:1]", "::1"),
            ("::FFFF:127.0.0.1", "::ffff:127.0.0.1"),
            ("[::ffff:7f00:1]", "::ffff:127.0.0.1"),
        ] {
            assert_eq!(canonical_host(raw).as_deref(), Ok(canonical), "{raw}");
        }
        let t = Target::from_uri(&"http://0x7f.1:8080/x".parse().unwrap(), None).unwrap();
        assert_eq!(t, Target::new("127.0.0.1", 8080));
        assert_eq!(t.ip(), Some(IpAddr::from([127, 0, 0, 1])));
    }
}
