//! Opt-in TLS interception: seeing the HTTP inside a CONNECT tunnel, so health judges HTTPS
//! responses (captchas, blocks) exactly like plain HTTP ones.
//!
//! A pool with `inspect_tls = true` answers CONNECT as usual, then reads the client's TLS
//! ClientHello. Unless the name is excluded (`inspect_exclude`) or the client does not speak TLS,
//! the gateway completes the client's handshake with a leaf minted for the SNI name ([`certs`],
//! signed by the CA of [`ca`]), speaks TLS to the origin through the same upstream tunnel
//! (verifying it), and relays HTTP/1.1 between the two with hyper (`proxy::inspect`). Everything else
//! is tunnelled raw, as without interception.
//!
//! [`Interceptor`] is the shared part: the leaf cache, the TLS client config for origins, and the
//! counters shown in `/status` under `intercept`.

pub mod ca;
pub mod certs;

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::ClientConfig;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde::Serialize;

use self::ca::{Ca, CaError};
use self::certs::{LeafCache, MintError};
use crate::outcome::Outcome;

/// Leaves cached at most, unless `intercept.cert_cache_size` says otherwise.
pub const DEFAULT_CERT_CACHE_SIZE: usize = 1000;

/// `[intercept]`, validated.
#[derive(Clone, Debug)]
pub struct InterceptConfig {
    pub ca_cert: PathBuf,
    /// Path only: the key itself is read at start and never kept in the config.
    pub ca_key: PathBuf,
    pub cert_cache_size: NonZeroUsize,
    /// Extra roots trusted for origins, besides the system's.
    pub origin_ca_file: Option<PathBuf>,
}

/// A host pattern of `inspect_exclude`: `login.example` matches that name only, `*.bank.example`
/// matches every name under `bank.example` (at any depth) but not `bank.example` itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPattern {
    /// Lower-case; for a wildcard, the suffix including its leading dot (`.bank.example`).
    name: String,
    wildcard: bool,
}

impl HostPattern {
    pub fn parse(pattern: &str) -> Result<HostPattern, &'static str> {
        let lower = pattern.trim().to_ascii_lowercase();
        let (wildcard, rest) = match lower.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, lower.as_str()),
        };
        let rest = rest.trim_end_matches('.');
        let literal_ip = rest
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok();
        if rest.is_empty() || rest.len() > 253 {
            return Err("expected a host name such as \"login.example\" or \"*.bank.example\"");
        }
        if !literal_ip
            && !rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        {
            return Err(
                "a pattern is a host name, optionally starting with \"*.\" (no other wildcards, schemes or ports)",
            );
        }
        if wildcard && literal_ip {
            return Err("\"*.\" applies to names, not IP addresses");
        }
        let host = rest.trim_start_matches('[').trim_end_matches(']');
        Ok(HostPattern {
            name: if wildcard {
                format!(".{host}")
            } else {
                host.to_string()
            },
            wildcard,
        })
    }

    /// Whether `host` (lower-case, no brackets, no port) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        if self.wildcard {
            host.len() > self.name.len() && host.ends_with(&self.name)
        } else {
            host == self.name
        }
    }
}

/// Whether `host` is excluded from inspection by any of `patterns`.
pub fn excluded(patterns: &[HostPattern], host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    patterns.iter().any(|p| p.matches(&host))
}

/// Counters of the interception path. Plain atomics, so a metrics exporter can read them too.
#[derive(Debug, Default)]
pub struct InterceptStats {
    /// Tunnels whose HTTP was relayed and inspected.
    pub tunnels_inspected: AtomicU64,
    /// Tunnels of inspecting pools passed through raw because the host is excluded.
    pub tunnels_excluded: AtomicU64,
    /// Tunnels of inspecting pools passed through raw because the client did not start TLS
    /// (or sent nothing within `server.header_read_timeout`), or no leaf could be minted.
    pub tunnels_passthrough: AtomicU64,
    /// Requests relayed inside inspected tunnels.
    pub requests: AtomicU64,
    /// Clients whose TLS handshake with the gateway failed: most often a client that does not
    /// trust the interception CA. Never counted against an upstream.
    pub client_handshake_failures: AtomicU64,
    /// TLS handshakes with origins (through the upstream) that failed.
    pub origin_handshake_failures: AtomicU64,
}

impl InterceptStats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `intercept` block of `/status`.
#[derive(Debug, Serialize)]
pub struct InterceptStatus {
    /// An interception CA is configured (pools still opt in one by one).
    pub enabled: bool,
    pub tunnels_inspected: u64,
    pub tunnels_excluded: u64,
    pub tunnels_passthrough: u64,
    pub requests: u64,
    pub client_handshake_failures: u64,
    pub origin_handshake_failures: u64,
    pub certs_minted: u64,
    pub cert_cache_entries: usize,
    pub cert_cache_capacity: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum InterceptSetupError {
    #[error("intercept: {0}")]
    Ca(#[from] CaError),
    #[error("intercept: {0}")]
    Mint(#[from] MintError),
    #[error("intercept.origin_ca_file: {0}")]
    OriginCa(String),
    #[error("intercept: {0}")]
    Rustls(#[from] rustls::Error),
}

/// What interception needs at run time; present (with zero counters) even when it is off.
#[derive(Default)]
pub struct Interceptor {
    pub stats: InterceptStats,
    engine: Option<Engine>,
}

struct Engine {
    certs: LeafCache,
    /// TLS towards origins: verified against the system roots plus `origin_ca_file`.
    origin_tls: tokio_rustls::TlsConnector,
}

impl Interceptor {
    /// Off: no CA configured.
    pub fn disabled() -> Self {
        Self::default()
    }

    pub fn from_config(cfg: Option<&InterceptConfig>) -> Result<Self, InterceptSetupError> {
        let Some(cfg) = cfg else {
            return Ok(Self::disabled());
        };
        let ca = Ca::load(&cfg.ca_cert, &cfg.ca_key)?;
        let certs = LeafCache::new(ca, cfg.cert_cache_size)?;
        let origin_tls =
            tokio_rustls::TlsConnector::from(origin_client_config(cfg.origin_ca_file.as_deref())?);
        Ok(Interceptor {
            stats: InterceptStats::default(),
            engine: Some(Engine { certs, origin_tls }),
        })
    }

    pub fn enabled(&self) -> bool {
        self.engine.is_some()
    }

    pub(crate) fn certs(&self) -> Option<&LeafCache> {
        self.engine.as_ref().map(|e| &e.certs)
    }

    pub(crate) fn origin_tls(&self) -> Option<&tokio_rustls::TlsConnector> {
        self.engine.as_ref().map(|e| &e.origin_tls)
    }

    pub fn status(&self) -> InterceptStatus {
        let s = &self.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let certs = self.certs();
        InterceptStatus {
            enabled: self.enabled(),
            tunnels_inspected: load(&s.tunnels_inspected),
            tunnels_excluded: load(&s.tunnels_excluded),
            tunnels_passthrough: load(&s.tunnels_passthrough),
            requests: load(&s.requests),
            client_handshake_failures: load(&s.client_handshake_failures),
            origin_handshake_failures: load(&s.origin_handshake_failures),
            certs_minted: certs.map_or(0, LeafCache::minted),
            cert_cache_entries: certs.map_or(0, LeafCache::len),
            cert_cache_capacity: certs.map_or(0, LeafCache::capacity),
        }
    }
}

/// The client config towards origins: system roots plus `origin_ca_file`, ALPN http/1.1 only.
fn origin_client_config(
    origin_ca_file: Option<&std::path::Path>,
) -> Result<Arc<ClientConfig>, InterceptSetupError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        // One unparsable system certificate must not take the others down.
        let _ = roots.add(cert);
    }
    if let Some(path) = origin_ca_file {
        let fail = |e: String| InterceptSetupError::OriginCa(format!("{}: {e}", path.display()));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| fail(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| fail(e.to_string()))?;
        if certs.is_empty() {
            return Err(fail("no certificate found".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| fail(e.to_string()))?;
        }
    }
    if roots.is_empty() {
        return Err(InterceptSetupError::OriginCa(
            "no trusted roots for origins (no system roots and no origin_ca_file)".into(),
        ));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Why TLS with the origin (through the upstream) failed, and whom that blames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OriginTlsFault {
    /// The origin's certificate did not verify: the origin's (or its CA's) business.
    Certificate,
    /// The origin refused the handshake with an alert.
    Alert,
    /// The bytes that came back were not TLS: something on the path (the upstream) broke them.
    Protocol,
    /// The tunnel closed or broke during the handshake.
    Closed,
    /// No handshake within `connect_timeout`.
    Timeout,
}

impl OriginTlsFault {
    /// Faults of the origin move no upstream's health; a broken path does.
    pub fn outcome(self) -> Outcome {
        match self {
            OriginTlsFault::Certificate | OriginTlsFault::Alert => Outcome::OriginError,
            OriginTlsFault::Protocol | OriginTlsFault::Closed => Outcome::Reset,
            OriginTlsFault::Timeout => Outcome::Timeout,
        }
    }

    /// RFC 9209 Proxy-Status error type.
    pub fn proxy_status(self) -> &'static str {
        match self {
            OriginTlsFault::Certificate => "tls_certificate_error",
            OriginTlsFault::Alert => "tls_alert_received",
            OriginTlsFault::Protocol => "tls_protocol_error",
            OriginTlsFault::Closed => "connection_terminated",
            OriginTlsFault::Timeout => "connection_timeout",
        }
    }

    /// Reads the fault from a failed handshake's error.
    pub fn of(e: &std::io::Error) -> Self {
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) => {
                OriginTlsFault::Certificate
            }
            Some(rustls::Error::AlertReceived(_)) => OriginTlsFault::Alert,
            Some(_) => OriginTlsFault::Protocol,
            None => OriginTlsFault::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_tls_faults_blame_the_right_party() {
        let cert = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        assert_eq!(OriginTlsFault::of(&cert), OriginTlsFault::Certificate);
        assert_eq!(OriginTlsFault::Certificate.outcome(), Outcome::OriginError);
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert_eq!(OriginTlsFault::of(&eof), OriginTlsFault::Closed);
        assert_eq!(OriginTlsFault::Closed.outcome(), Outcome::Reset);
        assert_eq!(OriginTlsFault::Timeout.outcome(), Outcome::Timeout);
    }

    #[test]
    fn host_patterns_match_names_and_subdomains() {
        let p = |s: &str| HostPattern::parse(s).unwrap();
        let bank = p("*.Bank.example");
        assert!(bank.matches("www.bank.example"));
        assert!(bank.matches("a.b.bank.example"));
        assert!(!bank.matches("bank.example"));
        assert!(!bank.matches("evilbank.example"));
        let login = p("login.example");
        assert!(login.matches("login.example"));
        assert!(login.matches("login.example."));
        assert!(!login.matches("www.login.example"));
        assert!(p("127.0.0.1").matches("127.0.0.1"));
        assert!(p("[::1]").matches("::1"));
        for bad in [
            "",
            "*",
            "a.*.example",
            "https://x.example",
            "x.example:443",
            "*.10.0.0.1",
        ] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(excluded(&[bank, login], "LOGIN.example"));
    }
}
