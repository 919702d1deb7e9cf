//! Why an open failed: [`ConnectError`], a closed set that never holds credentials, and how each
//! failure counts against the upstream ([`ConnectError::outcome`]) and is reported to the client
//! (RFC 9209 `Proxy-Status`).

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use super::http::MAX_REPLY_HEAD;
use crate::outcome::Outcome;
use crate::target::Target;
use crate::upstream::Scheme;

/// Why opening a connection through an upstream failed. Closed set; never contains credentials.
///
/// `addr` is the peer that failed: the proxy's `host:port`, or the target for `direct`.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The proxy's host name did not resolve.
    #[error("cannot resolve proxy host {host}: {error}")]
    ProxyDns { host: String, error: io::Error },
    /// The target's name did not resolve here (`direct` and `socks5` resolve targets locally), or
    /// it has no address of the family a `direct` upstream binds to. Not the upstream's fault.
    #[error("cannot resolve target host {host}: {error}")]
    TargetDns { host: String, error: io::Error },
    #[error("{addr} refused the connection")]
    Refused { addr: String },
    /// `connect_timeout` ran out before the stream was ready.
    #[error("{addr}: no connection within {after:?}")]
    Timeout { addr: String, after: Duration },
    /// The peer closed or reset the connection before the tunnel was up.
    #[error("{addr} closed the connection before the tunnel was up")]
    Reset { addr: String },
    /// The local address of a `direct` upstream cannot be bound (not configured on this host).
    #[error("cannot bind to local address {ip}: {error}")]
    Bind { ip: IpAddr, error: io::Error },
    #[error("connecting to {addr}: {error}")]
    Io { addr: String, error: io::Error },
    /// TLS to an `https://` proxy failed (certificate, alert or protocol).
    #[error("TLS handshake with {addr} failed: {error}")]
    Tls { addr: String, error: rustls::Error },
    /// The proxy answered CONNECT with 407: the configured credentials are missing or wrong.
    #[error("{addr} rejected the proxy credentials (407)")]
    ProxyAuth { addr: String },
    /// The proxy answered CONNECT with another non-2xx status.
    #[error("{addr} refused CONNECT with status {status}")]
    ProxyRefused { addr: String, status: u16 },
    #[error("{addr} sent a bad CONNECT reply: {fault}")]
    BadReply { addr: String, fault: ReplyFault },
    #[error("SOCKS5 proxy {addr}: {fault}")]
    Socks { addr: String, fault: SocksFault },
    /// The target cannot be put on the wire (control characters, overlong name, port 0): the
    /// client's fault, caught before anything is sent.
    #[error("cannot open a tunnel to {target:?}: {reason}")]
    InvalidTarget {
        target: String,
        reason: &'static str,
    },
    /// Every address the target's name resolved to is denied by the target policy (`direct://`,
    /// `socks5://`: a name that points into an internal network). Nothing was dialed or sent.
    #[error("{target} resolves only to addresses this proxy may not reach")]
    TargetDenied { target: String },
    /// `proxy_conn` was called for an upstream that does not speak HTTP proxy.
    #[error("{} upstreams do not take proxy requests", .scheme.as_str())]
    NotHttpProxy { scheme: Scheme },
}

/// What was wrong with a proxy's reply to CONNECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReplyFault {
    #[error("reply header larger than {MAX_REPLY_HEAD} bytes")]
    Oversized,
    #[error("connection closed in the middle of the reply header")]
    Incomplete,
    #[error("{0}")]
    Invalid(httparse::Error),
}

/// A SOCKS5 failure, as reported by the server or seen in its replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SocksFault {
    #[error("username/password rejected")]
    AuthRejected,
    #[error("no acceptable authentication method")]
    NoAcceptableAuth,
    #[error("server requires authentication but no credentials are configured")]
    AuthRequired,
    /// Credentials that SOCKS5 cannot carry (empty or longer than 255 bytes).
    #[error("configured credentials cannot be sent over SOCKS5 (each must be 1 to 255 bytes)")]
    BadCredentials,
    #[error("general server failure")]
    GeneralFailure,
    #[error("connection not allowed by ruleset")]
    NotAllowed,
    #[error("network unreachable")]
    NetworkUnreachable,
    #[error("host unreachable")]
    HostUnreachable,
    #[error("target refused the connection")]
    ConnectionRefused,
    #[error("TTL expired")]
    TtlExpired,
    #[error("command not supported")]
    CommandNotSupported,
    #[error("address type not supported")]
    AddressTypeNotSupported,
    /// The server's bytes do not follow the protocol.
    #[error("protocol violation")]
    Protocol,
}

impl ConnectError {
    /// The outcome recorded for the upstream. Failures that are the target's or the client's
    /// (`TargetDns`, `InvalidTarget`) map to `OriginError`, which moves no upstream's health.
    pub fn outcome(&self) -> Outcome {
        match self {
            ConnectError::Timeout { .. } => Outcome::Timeout,
            ConnectError::Io { error, .. } if error.kind() == io::ErrorKind::TimedOut => {
                Outcome::Timeout
            }
            ConnectError::Reset { .. }
            | ConnectError::BadReply {
                fault: ReplyFault::Incomplete,
                ..
            } => Outcome::Reset,
            ConnectError::ProxyAuth { .. }
            | ConnectError::ProxyRefused { .. }
            | ConnectError::BadReply { .. }
            | ConnectError::Socks { .. } => Outcome::UpstreamError,
            ConnectError::TargetDns { .. }
            | ConnectError::InvalidTarget { .. }
            | ConnectError::TargetDenied { .. } => Outcome::OriginError,
            ConnectError::ProxyDns { .. }
            | ConnectError::Refused { .. }
            | ConnectError::Bind { .. }
            | ConnectError::Io { .. }
            | ConnectError::Tls { .. }
            | ConnectError::NotHttpProxy { .. } => Outcome::ConnectError,
        }
    }

    /// RFC 9209 Proxy-Status error type, from the gateway's point of view (its next hop is the
    /// upstream). Failures the upstream reports about the target are `destination_unavailable`.
    pub fn proxy_status(&self) -> &'static str {
        match self {
            ConnectError::ProxyDns { .. } | ConnectError::TargetDns { .. } => "dns_error",
            ConnectError::Refused { .. } => "connection_refused",
            ConnectError::Timeout { .. } => "connection_timeout",
            ConnectError::Reset { .. } => "connection_terminated",
            ConnectError::Bind { .. } => "proxy_configuration_error",
            ConnectError::Io { error, .. } if error.kind() == io::ErrorKind::TimedOut => {
                "connection_timeout"
            }
            ConnectError::Io { .. } => "destination_unavailable",
            ConnectError::Tls { error, .. } => match error {
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
                    "tls_certificate_error"
                }
                rustls::Error::AlertReceived(_) => "tls_alert_received",
                _ => "tls_protocol_error",
            },
            ConnectError::ProxyAuth { .. } => "proxy_configuration_error",
            ConnectError::ProxyRefused { .. } => "destination_unavailable",
            ConnectError::BadReply { fault, .. } => match fault {
                ReplyFault::Oversized => "http_response_header_section_size",
                ReplyFault::Incomplete => "http_response_incomplete",
                ReplyFault::Invalid(_) => "http_protocol_error",
            },
            ConnectError::Socks { fault, .. } => match fault {
                SocksFault::AuthRejected
                | SocksFault::NoAcceptableAuth
                | SocksFault::AuthRequired
                | SocksFault::BadCredentials
                | SocksFault::CommandNotSupported
                | SocksFault::AddressTypeNotSupported => "proxy_configuration_error",
                SocksFault::GeneralFailure
                | SocksFault::NotAllowed
                | SocksFault::NetworkUnreachable
                | SocksFault::HostUnreachable
                | SocksFault::ConnectionRefused
                | SocksFault::TtlExpired
                | SocksFault::Protocol => "destination_unavailable",
            },
            ConnectError::InvalidTarget { .. } => "http_request_error",
            ConnectError::TargetDenied { .. } => "destination_ip_prohibited",
            ConnectError::NotHttpProxy { .. } => "proxy_internal_error",
        }
    }
}

/// The target has no address to dial: counted as its fault, not the upstream's.
pub(super) fn target_dns(target: &Target, why: &'static str) -> ConnectError {
    ConnectError::TargetDns {
        host: target.host.clone(),
        error: io::Error::new(io::ErrorKind::NotFound, why),
    }
}

/// Sorts a transport failure by kind, so refusals and resets are told apart from other I/O.
pub(super) fn io_error(addr: &str, error: io::Error) -> ConnectError {
    let addr = addr.to_string();
    match error.kind() {
        io::ErrorKind::ConnectionRefused => ConnectError::Refused { addr },
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => ConnectError::Reset { addr },
        _ => ConnectError::Io { addr, error },
    }
}
