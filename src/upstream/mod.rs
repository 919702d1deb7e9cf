//! Upstreams: the proxies (or direct egress) a request can leave through.
//!
//! An upstream is configured as a URL. Its [`UpstreamId`] is derived without the credentials, so
//! the id can be logged, shown in `/status` and sent to clients in `X-Pool-Upstream`.

pub mod connect;
pub mod labels;
pub mod reuse;
pub mod tls;

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use thiserror::Error;

pub use labels::{Filter, LabelError, Labels};

/// Stable, credential-free name of an upstream (`http://host:port`, `direct://`, or an explicit
/// `#name` fragment from the URL).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UpstreamId(Arc<str>);

impl UpstreamId {
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UpstreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for UpstreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// How the gateway talks to an upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP proxy: absolute-form requests, CONNECT for tunnels.
    Http,
    /// HTTP proxy reached over TLS.
    Https,
    /// SOCKS5; the gateway resolves target names itself.
    Socks5,
    /// SOCKS5; target names are resolved by the proxy.
    Socks5h,
    /// No proxy: egress from this machine, optionally from a given local address.
    Direct,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
            Scheme::Socks5 => "socks5",
            Scheme::Socks5h => "socks5h",
            Scheme::Direct => "direct",
        }
    }

    /// Whether plain-HTTP requests are sent to the upstream in absolute form (an HTTP proxy),
    /// rather than through a tunnel opened to the target.
    pub fn speaks_http_proxy(self) -> bool {
        matches!(self, Scheme::Http | Scheme::Https)
    }
}

/// Credentials the gateway presents to an upstream. `Debug` never prints them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Credentials(<redacted>)")
    }
}

impl Credentials {
    /// The `Proxy-Authorization` value for an HTTP proxy upstream.
    pub fn basic_header(&self) -> String {
        use base64::Engine as _;
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// One configured upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Upstream {
    pub id: UpstreamId,
    pub scheme: Scheme,
    /// Proxy host (name or IP literal, without brackets); empty for `direct`.
    pub host: String,
    /// Proxy port; 0 for `direct`.
    pub port: u16,
    /// `host:port` (`[v6]:port`), made once: every connect names it (errors, logs).
    pub addr: String,
    /// Local address to bind outgoing connections to (`direct://<ip>` only).
    pub bind: Option<IpAddr>,
    pub credentials: Option<Credentials>,
    /// The id as the `X-Pool-Upstream` value, made once: every response carries it. `None` for
    /// an id that cannot be a header value (then no response names it).
    pub id_header: Option<http::HeaderValue>,
    /// What kind of exit it is (`country=de type=datacenter`), for requests that ask for one.
    pub labels: Labels,
    /// Its credentials hold `{placeholders}` (a provider's backconnect gateway): each request
    /// connects with them filled in ([`Upstream::filled`]).
    pub templated: bool,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum UpstreamUrlError {
    #[error(
        "expected <scheme>://[user:pass@]host:port, with scheme http, https, socks5, socks5h or direct"
    )]
    Syntax,
    #[error("unsupported scheme `{0}` (use http, https, socks5, socks5h or direct)")]
    Scheme(String),
    #[error("missing or invalid port")]
    Port,
    #[error("missing host")]
    Host,
    #[error("the host is neither a DNS name nor an IP address (an IPv6 address goes in brackets)")]
    BadHost,
    #[error("direct:// takes only an optional local IP address to bind to")]
    DirectBind,
    #[error("invalid percent-encoding in credentials")]
    Credentials,
}

impl Upstream {
    /// Parses `scheme://[user:pass@]host:port[#id]` or `direct://[bind-ip][#id]`.
    ///
    /// Errors never echo the input: it may hold a password.
    pub fn parse(url: &str) -> Result<Self, UpstreamUrlError> {
        let url = url.trim();
        let (url, explicit_id) = match url.split_once('#') {
            Some((u, id)) if !id.is_empty() => (u, Some(id)),
            Some((u, _)) => (u, None),
            None => (url, None),
        };
        let (scheme, rest) = url.split_once("://").ok_or(UpstreamUrlError::Syntax)?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            "socks5" => Scheme::Socks5,
            "socks5h" => Scheme::Socks5h,
            "direct" => Scheme::Direct,
            other => return Err(UpstreamUrlError::Scheme(other.to_string())),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if scheme == Scheme::Direct {
            let bind = if rest.is_empty() {
                None
            } else {
                let ip = rest.trim_start_matches('[').trim_end_matches(']');
                Some(ip.parse().map_err(|_| UpstreamUrlError::DirectBind)?)
            };
            let id = match (explicit_id, bind) {
                (Some(id), _) => id.to_string(),
                (None, None) => "direct://".to_string(),
                (None, Some(ip)) => format!("direct://{ip}"),
            };
            return Ok(Upstream {
                id_header: http::HeaderValue::from_str(&id).ok(),
                id: UpstreamId::new(id),
                scheme,
                host: String::new(),
                port: 0,
                addr: String::new(),
                bind,
                credentials: None,
                labels: Labels::default(),
                templated: false,
            });
        }
        if rest.contains('/') || rest.contains('?') {
            return Err(UpstreamUrlError::Syntax);
        }
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        let credentials = match userinfo {
            None => None,
            Some(u) => {
                let (user, pass) = u.split_once(':').unwrap_or((u, ""));
                Some(Credentials {
                    username: percent_decode(user)?,
                    password: percent_decode(pass)?,
                })
            }
        };
        let (host, port) = split_host_port(hostport)?;
        let addr = crate::target::Target {
            host: host.clone(),
            port,
        }
        .authority();
        let id = match explicit_id {
            Some(id) => id.to_string(),
            None => format!("{}://{addr}", scheme.as_str()),
        };
        Ok(Upstream {
            id_header: http::HeaderValue::from_str(&id).ok(),
            id: UpstreamId::new(id),
            scheme,
            host,
            port,
            addr,
            bind: None,
            templated: credentials
                .as_ref()
                .is_some_and(|c| has_placeholder(&c.username) || has_placeholder(&c.password)),
            credentials,
            labels: Labels::default(),
        })
    }
}

/// Whether `s` holds a `{name}` placeholder.
fn has_placeholder(s: &str) -> bool {
    s.find('{').is_some_and(|open| s[open..].contains('}'))
}

/// `s` with every `{name}` replaced by `value(name)` (nothing when it has none). Text that is not
/// a whole placeholder (a lone brace) stays as it is.
fn fill(s: &str, value: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let name = &rest[open + 1..open + close];
        out.push_str(&value(name).unwrap_or_default());
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

impl Upstream {
    /// This upstream with its credentials' `{name}` placeholders filled by `value` (`{session}`,
    /// `{country}`, any label); a placeholder with no value becomes empty. The id stays: health
    /// and blame are per member, whatever each request's credentials.
    pub fn filled(&self, value: &dyn Fn(&str) -> Option<String>) -> Upstream {
        let mut up = self.clone();
        if let Some(c) = &mut up.credentials {
            c.username = fill(&c.username, value);
            c.password = fill(&c.password, value);
        }
        up
    }

    /// The upstream as a line of an upstream list, its URL and then its labels: what
    /// [`crate::sources::list::parse`] reads back. Holds the credentials, so never for logs.
    pub fn to_list_line(&self) -> String {
        if self.labels.is_empty() {
            self.to_url()
        } else {
            format!("{} {}", self.to_url(), self.labels)
        }
    }

    /// The URL [`Upstream::parse`] reads back into this upstream, credentials included: for
    /// handing a list to other instances through the store, never for logs.
    pub fn to_url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let base = match self.scheme {
            Scheme::Direct => format!(
                "direct://{}",
                self.bind.map(|ip| ip.to_string()).unwrap_or_default()
            ),
            scheme => {
                let auth = self.credentials.as_ref().map_or(String::new(), |c| {
                    format!(
                        "{}:{}@",
                        percent_encode(&c.username),
                        percent_encode(&c.password)
                    )
                });
                format!("{}://{auth}{host}:{}", scheme.as_str(), self.port)
            }
        };
        format!("{base}#{}", self.id)
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Splits `host:port` or `[v6]:port`; the port is required. The host is a DNS name (letters,
/// digits, `-`, `_`, `.`) or an IP address, IPv6 in brackets: anything else could not be dialed,
/// and would not read back from [`Upstream::to_url`] as the same upstream.
pub(crate) fn split_host_port(s: &str) -> Result<(String, u16), UpstreamUrlError> {
    let (host, port, bracketed) = if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once(']').ok_or(UpstreamUrlError::Host)?;
        (h, p.strip_prefix(':').ok_or(UpstreamUrlError::Port)?, true)
    } else {
        let (h, p) = s.rsplit_once(':').ok_or(UpstreamUrlError::Port)?;
        (h, p, false)
    };
    if host.is_empty() {
        return Err(UpstreamUrlError::Host);
    }
    let valid = if bracketed {
        host.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        host.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    if !valid {
        return Err(UpstreamUrlError::BadHost);
    }
    let port: u16 = port.parse().map_err(|_| UpstreamUrlError::Port)?;
    if port == 0 {
        return Err(UpstreamUrlError::Port);
    }
    Ok((host.to_ascii_lowercase(), port))
}

fn percent_decode(s: &str) -> Result<String, UpstreamUrlError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or(UpstreamUrlError::Credentials)?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| UpstreamUrlError::Credentials)?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| UpstreamUrlError::Credentials)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_scheme_and_hides_credentials_from_the_id() {
        let u = Upstream::parse("http://alice:s%40cret@10.0.0.1:3128").unwrap();
        assert_eq!(u.id.as_str(), "http://10.0.0.1:3128");
        assert_eq!(u.scheme, Scheme::Http);
        let c = u.credentials.unwrap();
        assert_eq!(
            (c.username.as_str(), c.password.as_str()),
            ("alice", "s@cret")
        );
        assert!(!format!("{c:?}").contains("cret"));

        let u = Upstream::parse("socks5h://u:p@[::1]:1080#eu-1").unwrap();
        assert_eq!(
            (u.scheme, u.host.as_str(), u.port),
            (Scheme::Socks5h, "::1", 1080)
        );
        assert_eq!(u.id.as_str(), "eu-1");

        let u = Upstream::parse("direct://").unwrap();
        assert_eq!(
            (u.scheme, u.id.as_str(), u.bind),
            (Scheme::Direct, "direct://", None)
        );
        let u = Upstream::parse("direct://127.0.0.2").unwrap();
        assert_eq!(u.bind, Some("127.0.0.2".parse().unwrap()));
    }

    #[test]
    fn to_url_reads_back_into_the_same_upstream() {
        for url in [
            "http://alice:s%40c:r%20et@10.0.0.1:3128",
            "https://10.0.0.2:443#named",
            "socks5h://u:p@[::1]:1080#eu-1",
            "socks5://[2001:db8::1]:1080",
            "direct://",
            "direct://127.0.0.2#egress",
        ] {
            let u = Upstream::parse(url).unwrap();
            assert_eq!(
                Upstream::parse(&u.to_url()).unwrap(),
                u,
                "{url} → {}",
                u.to_url()
            );
        }
    }

    #[test]
    fn rejects_bad_urls_without_echoing_them() {
        for bad in [
            "ftp://h:1",
            "http://h",
            "http://h:0",
            "http://:80",
            "http://u:p@h:1/path",
            "direct://not-an-ip",
            "nonsense",
        ] {
            let err = Upstream::parse(bad).unwrap_err();
            assert!(!err.to_string().contains("u:p"), "{bad}: {err}");
        }
    }

    /// Found by the `upstream_url` fuzz target: a host with brackets inside it parsed, and its
    /// `to_url` (how instances share lists) did not read back, so other instances dropped it.
    #[test]
    fn a_host_that_is_no_name_or_address_is_refused() {
        for bad in [
            "socks5://ffffffff[2001:db8::1]:1080",
            "http://h]:1",
            "http://a:b:1",
            "http://[not-v6]:1",
            "http://[fe80::1%eth0]:1",
            "http://h%20:1",
            "http://u:p@h/x:1",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
        for good in ["http://Proxy-1.example_x:3128", "http://[::ffff:1.2.3.4]:1"] {
            let u = Upstream::parse(good).unwrap();
            assert_eq!(Upstream::parse(&u.to_url()).unwrap(), u, "{good}");
        }
    }
}
