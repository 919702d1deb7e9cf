//! Opening byte streams to a target through an upstream: CONNECT through HTTP(S) proxies, SOCKS5
//! handshakes, or a plain TCP connection for `direct`.
//!
//! Everything up to the first tunnel byte (DNS, TCP, TLS, CONNECT or SOCKS) runs under one
//! `connect_timeout`, so a proxy that accepts and then stalls costs no more than one that refuses.
//! Errors name hosts and ports only: credentials are never formatted into them.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_socks::TargetAddr;
use tokio_socks::tcp::Socks5Stream;

use super::{Scheme, Upstream};
use crate::health::Outcome;
use crate::target::Target;

/// Any byte stream to an upstream or through it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// The TCP socket this stream is, when it is nothing more (no TLS, no buffered bytes): a
    /// tunnel between two of them splits them in place (see [`crate::proxy::pipe::copy`]).
    fn as_socket(&mut self) -> Option<&mut TcpStream>;
}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {
    fn as_socket(&mut self) -> Option<&mut TcpStream> {
        let any: &mut dyn Any = self;
        // A boxed stream is itself an `Io`: look through the box at what it holds.
        if any.is::<BoxIo>() {
            return any
                .downcast_mut::<BoxIo>()
                .and_then(|inner| (**inner).as_socket());
        }
        any.downcast_mut()
    }
}
pub type BoxIo = Box<dyn Io>;

/// Cap on a proxy's CONNECT reply header: a proxy that sends more is broken or hostile, and
/// buffering it without bound would let one upstream exhaust the gateway's memory.
const MAX_REPLY_HEAD: usize = 16 * 1024;
/// What the reply head is first read into.
const REPLY_HEAD_START: usize = 1024;
/// Header slots for parsing a CONNECT reply; real proxies send a handful.
const MAX_REPLY_HEADERS: usize = 64;

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
    /// Every address the target's name resolved to is denied by the target policy (`direct://`:
    /// a name that points into an internal network). Nothing was dialed.
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

/// Resolves target names for upstreams that need them resolved here (`direct://`, `socks5://`).
/// Injectable, so that tests can map test names to loopback.
pub trait Resolve: Send + Sync + 'static {
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'static>>;
}

/// The system's resolver (`getaddrinfo` through tokio).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'static>> {
        let host = host.to_string();
        Box::pin(async move { resolve(&host, port).await })
    }
}

/// Whether a resolved address may be dialed for a target: the target policy applied to what a
/// name really points at, right before `direct://` dials it.
pub type AddrGuard = Arc<dyn Fn(&Target, SocketAddr) -> bool + Send + Sync>;

/// Opens streams through upstreams. Cheap to clone (clones share settings); holds no connections.
#[derive(Clone)]
pub struct Connector {
    tls: TlsConnector,
    /// Milliseconds; shared by clones and changed on reload.
    connect_timeout_ms: Arc<AtomicU64>,
    /// Resolves target names (`direct`, `socks5`).
    resolver: Arc<dyn Resolve>,
    /// Checked on every resolved address before `direct` dials it; `None` allows all.
    guard: Option<AddrGuard>,
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("connect_timeout", &self.connect_timeout())
            .field("guarded", &self.guard.is_some())
            .finish_non_exhaustive()
    }
}

impl Connector {
    /// `tls` is used for https:// upstreams (TLS to the proxy itself). `connect_timeout` bounds
    /// the whole open (DNS + TCP + TLS + CONNECT/SOCKS handshake).
    pub fn new(tls: Arc<rustls::ClientConfig>, connect_timeout: Duration) -> Self {
        Connector {
            tls: TlsConnector::from(tls),
            connect_timeout_ms: Arc::new(AtomicU64::new(connect_timeout.as_millis() as u64)),
            resolver: Arc::new(SystemResolver),
            guard: None,
        }
    }

    /// Resolves target names with `resolver` instead of the system's.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Checks every address a `direct` target resolved to with `guard` before dialing.
    pub fn with_guard(mut self, guard: AddrGuard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// The TLS settings used towards https:// proxies (the `upstream_tls` roots), for callers that
    /// speak TLS to an origin through a tunnel, such as probes of https control targets.
    pub fn tls(&self) -> &TlsConnector {
        &self.tls
    }

    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.load(Ordering::Relaxed))
    }

    /// Changes the connect timeout for opens started from now on (reload).
    pub fn set_connect_timeout(&self, timeout: Duration) {
        self.connect_timeout_ms
            .store(timeout.as_millis() as u64, Ordering::Relaxed);
    }

    /// Resolves a target: literals as they are, names through the resolver.
    async fn resolve_target(&self, target: &Target) -> Result<Vec<SocketAddr>, ConnectError> {
        if let Some(ip) = target.ip() {
            return Ok(vec![SocketAddr::new(ip, target.port)]);
        }
        let addrs = self
            .resolver
            .resolve(&target.host, target.port)
            .await
            .map_err(|error| ConnectError::TargetDns {
                host: target.host.clone(),
                error,
            })?;
        if addrs.is_empty() {
            return Err(target_dns(target, "no addresses"));
        }
        Ok(addrs)
    }

    /// A byte stream to `target` through `upstream`, ready for the client's bytes. Any bytes a
    /// proxy sent right after its CONNECT reply are returned first.
    pub async fn tunnel(
        &self,
        upstream: &Upstream,
        target: &Target,
    ) -> Result<BoxIo, ConnectError> {
        check_target(target)?;
        let open = async {
            match upstream.scheme {
                Scheme::Http | Scheme::Https => {
                    let conn = self.open_proxy(upstream).await?;
                    http_connect(conn, upstream, target).await
                }
                Scheme::Socks5 | Scheme::Socks5h => self.socks_connect(upstream, target).await,
                Scheme::Direct => self.direct_connect(upstream, target).await,
            }
        };
        let after = self.connect_timeout();
        match tokio::time::timeout(after, open).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout {
                addr: match upstream.scheme {
                    Scheme::Direct => target.authority(),
                    _ => upstream.addr.clone(),
                },
                after,
            }),
        }
    }

    /// A connection to the proxy itself (http/https upstreams only; TCP + TLS for https) over
    /// which the caller sends absolute-form requests.
    pub async fn proxy_conn(&self, upstream: &Upstream) -> Result<BoxIo, ConnectError> {
        if !upstream.scheme.speaks_http_proxy() {
            return Err(ConnectError::NotHttpProxy {
                scheme: upstream.scheme,
            });
        }
        let after = self.connect_timeout();
        match tokio::time::timeout(after, self.open_proxy(upstream)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout {
                addr: upstream.addr.clone(),
                after,
            }),
        }
    }

    /// TCP (+ TLS for https) to an HTTP proxy.
    async fn open_proxy(&self, upstream: &Upstream) -> Result<BoxIo, ConnectError> {
        let addr = upstream.addr.as_str();
        let tcp = connect_proxy_tcp(upstream, addr).await?;
        if upstream.scheme != Scheme::Https {
            return Ok(Box::new(tcp));
        }
        // The host is stored without brackets, so IP literals parse as IP server names.
        let name = ServerName::try_from(upstream.host.clone()).map_err(|_| ConnectError::Tls {
            addr: addr.to_string(),
            error: rustls::Error::General("proxy host is not a valid TLS server name".into()),
        })?;
        match self.tls.connect(name, tcp).await {
            Ok(tls) => Ok(Box::new(tls)),
            Err(error) => Err(tls_error(addr, error)),
        }
    }

    /// SOCKS5 handshake on a TCP connection we opened ourselves, so the timeout and connect errors
    /// stay ours. `socks5` resolves the target here and sends its first address (one handshake per
    /// attempt, so no fallback); `socks5h` sends the name for the proxy to resolve.
    async fn socks_connect(
        &self,
        upstream: &Upstream,
        target: &Target,
    ) -> Result<BoxIo, ConnectError> {
        let addr = upstream.addr.as_str();
        let dest = if upstream.scheme == Scheme::Socks5 {
            let resolved = self.resolve_target(target).await?;
            match resolved.first() {
                Some(ip) => TargetAddr::Ip(*ip),
                None => return Err(target_dns(target, "no addresses")),
            }
        } else {
            match target.ip() {
                Some(ip) => TargetAddr::Ip(SocketAddr::new(ip, target.port)),
                None => TargetAddr::Domain(target.host.as_str().into(), target.port),
            }
        };
        let tcp = connect_proxy_tcp(upstream, addr).await?;
        let stream = match &upstream.credentials {
            Some(c) => {
                Socks5Stream::connect_with_password_and_socket(tcp, dest, &c.username, &c.password)
                    .await
            }
            None => Socks5Stream::connect_with_socket(tcp, dest).await,
        };
        match stream {
            // The reply is read exactly, so nothing of the tunnel is buffered in the wrapper.
            Ok(stream) => Ok(Box::new(stream.into_inner())),
            Err(e) => Err(socks_error(addr, target, e)),
        }
    }

    /// Straight to the target, on addresses the guard allows,, from `upstream.bind` when set, trying each address in turn.
    async fn direct_connect(
        &self,
        upstream: &Upstream,
        target: &Target,
    ) -> Result<BoxIo, ConnectError> {
        let resolved = self.resolve_target(target).await?;
        // The target policy again, on what the name really points at: no DNS-rebinding way in.
        let addrs: Vec<SocketAddr> = match &self.guard {
            Some(guard) => resolved.into_iter().filter(|a| guard(target, *a)).collect(),
            None => resolved,
        };
        if addrs.is_empty() {
            return Err(ConnectError::TargetDenied {
                target: target.authority(),
            });
        }
        let addrs: Vec<SocketAddr> = match upstream.bind {
            // A socket bound to one family cannot reach the other.
            Some(bind) => addrs
                .into_iter()
                .filter(|a| a.is_ipv4() == bind.is_ipv4())
                .collect(),
            None => addrs,
        };
        if addrs.is_empty() {
            return Err(target_dns(
                target,
                "no address of the bind address's family",
            ));
        }
        let tcp = connect_any(&addrs, upstream.bind, &target.authority()).await?;
        Ok(Box::new(tcp))
    }
}

/// Sends CONNECT over an open proxy connection and waits for a 2xx.
async fn http_connect(
    mut conn: BoxIo,
    upstream: &Upstream,
    target: &Target,
) -> Result<BoxIo, ConnectError> {
    let addr = upstream.addr.as_str();
    let authority = target.authority();
    let mut request = [
        "CONNECT ",
        &authority,
        " HTTP/1.1\r\nHost: ",
        &authority,
        "\r\n",
    ]
    .concat();
    if let Some(credentials) = &upstream.credentials {
        request.push_str("Proxy-Authorization: ");
        request.push_str(&credentials.basic_header());
        request.push_str("\r\n");
    }
    request.push_str("\r\n");
    conn.write_all(request.as_bytes())
        .await
        .map_err(|e| io_error(addr, e))?;
    conn.flush().await.map_err(|e| io_error(addr, e))?;

    let early = read_connect_reply(&mut conn, addr).await?;
    if early.is_empty() {
        Ok(conn)
    } else {
        Ok(Box::new(Rewind::new(early, conn)))
    }
}

/// Reads the proxy's reply header; on 2xx returns the bytes that came after it, which already
/// belong to the tunnel (a server-speaks-first protocol may arrive in the same segment).
///
/// The buffer starts small and is never zeroed: a reply head is a few hundred bytes, and this
/// runs once per tunnel.
async fn read_connect_reply(conn: &mut BoxIo, addr: &str) -> Result<Bytes, ConnectError> {
    let mut buf = BytesMut::with_capacity(REPLY_HEAD_START);
    loop {
        if buf.len() == buf.capacity() {
            buf.reserve(buf.capacity().min(MAX_REPLY_HEAD - buf.len()));
        }
        let room = MAX_REPLY_HEAD - buf.len();
        let n = (&mut *conn)
            .take(room as u64)
            .read_buf(&mut buf)
            .await
            .map_err(|e| io_error(addr, e))?;
        let filled = buf.len();
        if n == 0 {
            return Err(if filled == 0 {
                ConnectError::Reset { addr: addr.into() }
            } else {
                bad_reply(addr, ReplyFault::Incomplete)
            });
        }
        let mut headers = [httparse::EMPTY_HEADER; MAX_REPLY_HEADERS];
        let mut reply = httparse::Response::new(&mut headers);
        match reply.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(head_len)) => {
                return match reply.code.unwrap_or(0) {
                    200..=299 => Ok(Bytes::copy_from_slice(&buf[head_len..])),
                    407 => Err(ConnectError::ProxyAuth { addr: addr.into() }),
                    status => Err(ConnectError::ProxyRefused {
                        addr: addr.into(),
                        status,
                    }),
                };
            }
            Ok(httparse::Status::Partial) if filled == MAX_REPLY_HEAD => {
                return Err(bad_reply(addr, ReplyFault::Oversized));
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return Err(bad_reply(addr, ReplyFault::Oversized));
            }
            Err(e) => return Err(bad_reply(addr, ReplyFault::Invalid(e))),
        }
    }
}

/// Resolves and connects to the proxy of `upstream`.
async fn connect_proxy_tcp(upstream: &Upstream, addr: &str) -> Result<TcpStream, ConnectError> {
    let addrs = resolve(&upstream.host, upstream.port)
        .await
        .map_err(|error| ConnectError::ProxyDns {
            host: upstream.host.clone(),
            error,
        })?;
    connect_any(&addrs, None, addr).await
}

async fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"));
    }
    Ok(addrs)
}

/// Tries each address in order; the last failure is reported (they usually agree).
async fn connect_any(
    addrs: &[SocketAddr],
    bind: Option<IpAddr>,
    peer: &str,
) -> Result<TcpStream, ConnectError> {
    let mut last = None;
    for &addr in addrs {
        match connect_one(addr, bind, peer).await {
            Ok(stream) => return Ok(stream),
            // A bind failure will not get better with the next address.
            Err(e @ ConnectError::Bind { .. }) => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| ConnectError::Io {
        addr: peer.into(),
        error: io::Error::new(io::ErrorKind::NotFound, "no addresses"),
    }))
}

async fn connect_one(
    addr: SocketAddr,
    bind: Option<IpAddr>,
    peer: &str,
) -> Result<TcpStream, ConnectError> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
    .map_err(|e| io_error(peer, e))?;
    if let Some(ip) = bind {
        socket
            .bind(SocketAddr::new(ip, 0))
            .map_err(|error| ConnectError::Bind { ip, error })?;
    }
    let stream = socket.connect(addr).await.map_err(|e| io_error(peer, e))?;
    // Handshakes and interactive tunnels are many small writes; Nagle would add round trips.
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(peer, error = %e, "cannot set TCP_NODELAY");
    }
    Ok(stream)
}

/// Rejects targets that would corrupt a CONNECT request line or a SOCKS request.
fn check_target(target: &Target) -> Result<(), ConnectError> {
    let reason = if target.host.is_empty() {
        "empty host"
    } else if target.port == 0 {
        "port 0"
    } else if target.host.bytes().any(|b| {
        b <= b' ' || b == 0x7f || matches!(b, b'/' | b'\\' | b'?' | b'#' | b'@' | b'[' | b']')
    }) {
        "host contains characters not allowed in a host name"
    } else {
        return Ok(());
    };
    Err(ConnectError::InvalidTarget {
        target: target.authority(),
        reason,
    })
}

fn target_dns(target: &Target, why: &'static str) -> ConnectError {
    ConnectError::TargetDns {
        host: target.host.clone(),
        error: io::Error::new(io::ErrorKind::NotFound, why),
    }
}

fn bad_reply(addr: &str, fault: ReplyFault) -> ConnectError {
    ConnectError::BadReply {
        addr: addr.into(),
        fault,
    }
}

fn io_error(addr: &str, error: io::Error) -> ConnectError {
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

/// tokio-rustls reports TLS failures as `io::Error`s wrapping a `rustls::Error`; anything else
/// is a transport failure during the handshake.
fn tls_error(addr: &str, error: io::Error) -> ConnectError {
    let tls = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .cloned();
    match tls {
        Some(error) => ConnectError::Tls {
            addr: addr.into(),
            error,
        },
        None => io_error(addr, error),
    }
}

fn socks_error(addr: &str, target: &Target, error: tokio_socks::Error) -> ConnectError {
    use tokio_socks::Error as E;
    let fault = match error {
        E::Io(error) => return io_error(addr, error),
        E::InvalidTargetAddress(reason) => {
            return ConnectError::InvalidTarget {
                target: target.authority(),
                reason,
            };
        }
        E::PasswordAuthFailure(_) => SocksFault::AuthRejected,
        E::NoAcceptableAuthMethods => SocksFault::NoAcceptableAuth,
        E::AuthorizationRequired => SocksFault::AuthRequired,
        // Its message is static and names no credential, but ours says what to fix.
        E::InvalidAuthValues(_) => SocksFault::BadCredentials,
        E::GeneralSocksServerFailure => SocksFault::GeneralFailure,
        E::ConnectionNotAllowedByRuleset => SocksFault::NotAllowed,
        E::NetworkUnreachable => SocksFault::NetworkUnreachable,
        E::HostUnreachable => SocksFault::HostUnreachable,
        E::ConnectionRefused => SocksFault::ConnectionRefused,
        E::TtlExpired => SocksFault::TtlExpired,
        E::CommandNotSupported => SocksFault::CommandNotSupported,
        E::AddressTypeNotSupported => SocksFault::AddressTypeNotSupported,
        // Bad versions, reserved bytes, address types, unknown reply codes (which tokio-socks
        // reports as UnknownAuthMethod) and anything added later.
        _ => SocksFault::Protocol,
    };
    ConnectError::Socks {
        addr: addr.into(),
        fault,
    }
}

/// A stream that yields `prefix` before reading from `inner`: bytes read past a CONNECT reply
/// belong to the tunnel and must not be lost.
pub struct Rewind<S> {
    prefix: Bytes,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(prefix: Bytes, inner: S) -> Self {
        Rewind { prefix, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.prefix.has_remaining() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix[..n]);
            this.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use rustls::RootCertStore;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use tokio_rustls::TlsAcceptor;

    use super::*;
    use crate::upstream::Credentials;

    const USER: &str = "alice";
    const PASSWORD: &str = "pa55-w0rd-xyz";

    /// The reply head read from `chunks` written one by one, as a proxy trickling it out would.
    async fn reply_from(chunks: Vec<Vec<u8>>) -> Result<Bytes, ConnectError> {
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let writer = tokio::spawn(async move {
            for c in chunks {
                if theirs.write_all(&c).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        let mut conn: BoxIo = Box::new(ours);
        let got = read_connect_reply(&mut conn, "proxy").await;
        writer.abort();
        got
    }

    #[tokio::test]
    async fn connect_reply_heads_read_in_pieces_keep_the_bytes_after_them() {
        // The end of the head comes together with the first tunnel bytes.
        let head = b"HTTP/1.1 200 Connection established\r\nVia: x".to_vec();
        let mut pieces: Vec<Vec<u8>> = head.chunks(3).map(<[u8]>::to_vec).collect();
        pieces.push(b"\r\n\r\nSSH-2.0-hello".to_vec());
        assert_eq!(&reply_from(pieces).await.unwrap()[..], b"SSH-2.0-hello");
        // A head past the first buffer's size, still within the cap.
        let mut long = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..40 {
            long.extend_from_slice(format!("X-Filler-{i}: {}\r\n", "v".repeat(200)).as_bytes());
        }
        long.extend_from_slice(b"\r\n");
        assert!(long.len() > REPLY_HEAD_START && long.len() < MAX_REPLY_HEAD);
        assert!(reply_from(vec![long]).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_connect_reply_head_past_the_cap_is_refused_as_oversized() {
        let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
        while head.len() <= MAX_REPLY_HEAD {
            head.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        let err = reply_from(vec![head]).await.unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
        let err = reply_from(vec![b"HTTP/1.1 200 OK\r\nVia".to_vec()])
            .await
            .unwrap_err();
        assert!(!err.to_string().contains("larger than"), "{err}");
    }

    /// Every test body runs under this bound so a stuck fake fails the test instead of hanging.
    async fn bounded<F: Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("test timed out")
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn client_config(roots: RootCertStore) -> Arc<rustls::ClientConfig> {
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }

    fn connector() -> Connector {
        Connector::new(
            client_config(RootCertStore::empty()),
            Duration::from_secs(5),
        )
    }

    fn upstream(url: &str) -> Upstream {
        Upstream::parse(url).unwrap()
    }

    fn with_password(url: &str, password: &str) -> Upstream {
        let mut u = upstream(url);
        u.credentials = Some(Credentials {
            username: USER.into(),
            password: password.into(),
        });
        u
    }

    /// Neither the password nor the Basic token built from it may leak into an error.
    fn assert_no_secret(err: &ConnectError) {
        let token = Credentials {
            username: USER.into(),
            password: PASSWORD.into(),
        }
        .basic_header();
        let token = token.trim_start_matches("Basic ");
        for text in [err.to_string(), format!("{err:?}")] {
            assert!(!text.contains(PASSWORD), "{text}");
            assert!(!text.contains(token), "{text}");
        }
    }

    fn is_loopback_host(host: &str) -> bool {
        host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
    }

    async fn echo<S: AsyncRead + AsyncWrite + Unpin>(stream: S) {
        let (mut r, mut w) = tokio::io::split(stream);
        let _ = tokio::io::copy(&mut r, &mut w).await;
    }

    async fn listener() -> (TcpListener, u16) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        (l, port)
    }

    /// An echo server standing in for the target; reports each client's address.
    async fn echo_target() -> (u16, mpsc::UnboundedReceiver<SocketAddr>) {
        let (l, port) = listener().await;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, peer)) = l.accept().await {
                let _ = tx.send(peer);
                tokio::spawn(echo(s));
            }
        });
        (port, rx)
    }

    /// Writes `ping`, expects it back.
    async fn assert_echoes(io: &mut BoxIo) {
        io.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        io.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
    }

    #[derive(Clone, Copy)]
    enum Answer {
        /// 200 with early bytes in the same write, then echo (acting as the target itself).
        Tunnel,
        Status(u16),
        /// These bytes, then close.
        Raw(&'static [u8]),
        /// A reply header that never ends.
        Endless,
        /// Accept and never answer.
        Silent,
        /// No CONNECT parsing: echo everything (a stand-in for `proxy_conn`).
        Echo,
    }

    const EARLY: &[u8] = b"EARLY";

    #[derive(Debug)]
    struct Seen {
        method: String,
        path: String,
        host: Option<String>,
        auth: Option<String>,
    }

    /// A fake HTTP proxy on loopback. It never dials: a CONNECT to a loopback target is answered
    /// by echoing locally, anything else gets 403.
    async fn fake_proxy(
        answer: Answer,
        tls: Option<TlsAcceptor>,
    ) -> (u16, mpsc::UnboundedReceiver<Seen>) {
        let (l, port) = listener().await;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = l.accept().await {
                let (tx, tls) = (tx.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(s) = acceptor.accept(tcp).await {
                                serve_proxy(s, answer, tx).await;
                            }
                        }
                        None => serve_proxy(tcp, answer, tx).await,
                    }
                });
            }
        });
        (port, rx)
    }

    async fn serve_proxy<S: AsyncRead + AsyncWrite + Unpin>(
        mut s: S,
        answer: Answer,
        tx: mpsc::UnboundedSender<Seen>,
    ) {
        match answer {
            Answer::Echo => return echo(s).await,
            Answer::Silent => {
                let _hold = s;
                return std::future::pending().await;
            }
            _ => {}
        }
        let mut head = Vec::new();
        let mut chunk = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&chunk[..n]),
            }
            if head.len() > 64 * 1024 {
                return;
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        let Ok(httparse::Status::Complete(_)) = req.parse(&head) else {
            return;
        };
        let header = |name: &str| {
            req.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).into_owned())
        };
        let seen = Seen {
            method: req.method.unwrap_or_default().to_string(),
            path: req.path.unwrap_or_default().to_string(),
            host: header("host"),
            auth: header("proxy-authorization"),
        };
        let loopback = seen.path.rsplit_once(':').is_some_and(|(h, _)| {
            is_loopback_host(h.trim_start_matches('[').trim_end_matches(']'))
        });
        let _ = tx.send(seen);
        match answer {
            Answer::Tunnel if !loopback => {
                let _ = s.write_all(b"HTTP/1.1 403 Forbidden\r\n\r\n").await;
            }
            Answer::Tunnel => {
                let mut reply =
                    b"HTTP/1.1 200 Connection established\r\nVia: fake\r\n\r\n".to_vec();
                reply.extend_from_slice(EARLY);
                if s.write_all(&reply).await.is_ok() {
                    echo(s).await;
                }
            }
            Answer::Status(code) => {
                let reply = format!(
                    "HTTP/1.1 {code} Nope\r\nProxy-Authenticate: Basic realm=\"fake\"\r\n\
                     Content-Length: 5\r\n\r\nnope!"
                );
                let _ = s.write_all(reply.as_bytes()).await;
            }
            Answer::Raw(bytes) => {
                let _ = s.write_all(bytes).await;
            }
            Answer::Endless => {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
                let pad = format!("X-Pad: {}\r\n", "a".repeat(1000));
                for _ in 0..40 {
                    if s.write_all(pad.as_bytes()).await.is_err() {
                        return;
                    }
                }
                let _ = s.read(&mut chunk).await;
            }
            Answer::Silent | Answer::Echo => {}
        }
    }

    #[derive(Debug, PartialEq)]
    enum SocksDest {
        V4(Ipv4Addr),
        V6(Ipv6Addr),
        Name(String),
    }

    /// A fake SOCKS5 server on loopback: greeting, optional user/pass, CONNECT. It never dials:
    /// a loopback destination is answered by echoing locally, anything else is refused (0x02).
    async fn fake_socks(
        password: Option<&'static str>,
    ) -> (u16, mpsc::UnboundedReceiver<(SocksDest, u16)>) {
        let (l, port) = listener().await;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _ = serve_socks(s, password, tx).await;
                });
            }
        });
        (port, rx)
    }

    async fn serve_socks(
        mut s: TcpStream,
        password: Option<&str>,
        tx: mpsc::UnboundedSender<(SocksDest, u16)>,
    ) -> io::Result<()> {
        let mut greeting = [0u8; 2];
        s.read_exact(&mut greeting).await?;
        let mut methods = vec![0u8; usize::from(greeting[1])];
        s.read_exact(&mut methods).await?;
        assert_eq!(greeting[0], 5);
        match password {
            Some(expected) => {
                if !methods.contains(&2) {
                    return s.write_all(&[5, 0xff]).await;
                }
                s.write_all(&[5, 2]).await?;
                let mut ver_len = [0u8; 2];
                s.read_exact(&mut ver_len).await?;
                let mut user = vec![0u8; usize::from(ver_len[1])];
                s.read_exact(&mut user).await?;
                let mut plen = [0u8; 1];
                s.read_exact(&mut plen).await?;
                let mut pass = vec![0u8; usize::from(plen[0])];
                s.read_exact(&mut pass).await?;
                if ver_len[0] != 1 || user != USER.as_bytes() || pass != expected.as_bytes() {
                    return s.write_all(&[1, 1]).await;
                }
                s.write_all(&[1, 0]).await?;
            }
            None => {
                if !methods.contains(&0) {
                    return s.write_all(&[5, 0xff]).await;
                }
                s.write_all(&[5, 0]).await?;
            }
        }
        let mut req = [0u8; 4];
        s.read_exact(&mut req).await?;
        let dest = match req[3] {
            1 => {
                let mut ip = [0u8; 4];
                s.read_exact(&mut ip).await?;
                SocksDest::V4(ip.into())
            }
            4 => {
                let mut ip = [0u8; 16];
                s.read_exact(&mut ip).await?;
                SocksDest::V6(ip.into())
            }
            3 => {
                let mut len = [0u8; 1];
                s.read_exact(&mut len).await?;
                let mut name = vec![0u8; usize::from(len[0])];
                s.read_exact(&mut name).await?;
                SocksDest::Name(String::from_utf8_lossy(&name).into_owned())
            }
            _ => return s.write_all(&[5, 8, 0, 1, 0, 0, 0, 0, 0, 0]).await,
        };
        let mut port = [0u8; 2];
        s.read_exact(&mut port).await?;
        let allowed = req[1] == 1
            && match &dest {
                SocksDest::V4(ip) => ip.is_loopback(),
                SocksDest::V6(ip) => ip.is_loopback(),
                SocksDest::Name(name) => name == "localhost",
            };
        let _ = tx.send((dest, u16::from_be_bytes(port)));
        if !allowed {
            return s.write_all(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]).await;
        }
        s.write_all(&[5, 0, 0, 1, 127, 0, 0, 1, port[0], port[1]])
            .await?;
        echo(s).await;
        Ok(())
    }

    /// A self-signed certificate for "localhost", an acceptor serving it, and a client config
    /// trusting it.
    fn tls_pair() -> (TlsAcceptor, Arc<rustls::ClientConfig>) {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert: CertificateDer<'static> = certified.cert.der().clone();
        let key =
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der()));
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.clone()], key)
            .unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(cert).unwrap();
        (TlsAcceptor::from(Arc::new(server)), client_config(roots))
    }

    async fn err_of(result: Result<BoxIo, ConnectError>) -> ConnectError {
        match result {
            Ok(_) => panic!("expected an error"),
            Err(e) => {
                assert_no_secret(&e);
                e
            }
        }
    }

    #[tokio::test]
    async fn http_connect_sends_auth_and_returns_early_bytes_first() {
        bounded(async {
            let (port, mut seen) = fake_proxy(Answer::Tunnel, None).await;
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let target = Target::new("127.0.0.1", 4443);
            let mut io = connector().tunnel(&up, &target).await.unwrap();

            let mut early = [0u8; 5];
            io.read_exact(&mut early).await.unwrap();
            assert_eq!(&early, EARLY);
            assert_echoes(&mut io).await;

            let seen = seen.recv().await.unwrap();
            assert_eq!(
                (seen.method.as_str(), seen.path.as_str()),
                ("CONNECT", "127.0.0.1:4443")
            );
            assert_eq!(seen.host.as_deref(), Some("127.0.0.1:4443"));
            let expected = up.credentials.as_ref().map(|c| c.basic_header());
            assert_eq!(seen.auth, expected);
        })
        .await;
    }

    #[tokio::test]
    async fn http_connect_to_ipv6_target_brackets_the_authority() {
        bounded(async {
            let (port, mut seen) = fake_proxy(Answer::Tunnel, None).await;
            let up = upstream(&format!("http://127.0.0.1:{port}"));
            let mut io = connector()
                .tunnel(&up, &Target::new("[::1]", 443))
                .await
                .unwrap();
            let mut early = [0u8; 5];
            io.read_exact(&mut early).await.unwrap();
            let seen = seen.recv().await.unwrap();
            assert_eq!(seen.path, "[::1]:443");
            assert_eq!(seen.auth, None);
        })
        .await;
    }

    #[tokio::test]
    async fn proxy_407_is_an_upstream_error_without_the_password() {
        bounded(async {
            let (port, mut seen) = fake_proxy(Answer::Status(407), None).await;
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(
                connector()
                    .tunnel(&up, &Target::new("localhost", 443))
                    .await,
            )
            .await;
            assert!(matches!(err, ConnectError::ProxyAuth { .. }), "{err:?}");
            assert_eq!(err.outcome(), Outcome::UpstreamError);
            assert_eq!(err.proxy_status(), "proxy_configuration_error");
            assert!(seen.recv().await.unwrap().auth.is_some());

            let (port, _seen) = fake_proxy(Answer::Status(502), None).await;
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(
                connector()
                    .tunnel(&up, &Target::new("localhost", 443))
                    .await,
            )
            .await;
            assert!(
                matches!(err, ConnectError::ProxyRefused { status: 502, .. }),
                "{err:?}"
            );
            assert_eq!(err.outcome(), Outcome::UpstreamError);
        })
        .await;
    }

    #[tokio::test]
    async fn malformed_oversized_and_truncated_replies() {
        bounded(async {
            let target = Target::new("127.0.0.1", 443);

            let (port, _s) = fake_proxy(Answer::Raw(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), None).await;
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(
                matches!(
                    err,
                    ConnectError::BadReply {
                        fault: ReplyFault::Invalid(_),
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.outcome(), Outcome::UpstreamError);
            assert_eq!(err.proxy_status(), "http_protocol_error");

            let (port, _s) = fake_proxy(Answer::Endless, None).await;
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(
                matches!(
                    err,
                    ConnectError::BadReply {
                        fault: ReplyFault::Oversized,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.proxy_status(), "http_response_header_section_size");

            let (port, _s) = fake_proxy(Answer::Raw(b"HTTP/1.1 200 OK\r\nVia: x\r\n"), None).await;
            let up = upstream(&format!("http://127.0.0.1:{port}"));
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(
                matches!(
                    err,
                    ConnectError::BadReply {
                        fault: ReplyFault::Incomplete,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.outcome(), Outcome::Reset);

            let (port, _s) = fake_proxy(Answer::Raw(b""), None).await;
            let up = upstream(&format!("http://127.0.0.1:{port}"));
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(matches!(err, ConnectError::Reset { .. }), "{err:?}");
            assert_eq!(err.proxy_status(), "connection_terminated");
        })
        .await;
    }

    #[tokio::test]
    async fn refused_port_is_a_connect_error() {
        bounded(async {
            let port = {
                let (_l, port) = listener().await;
                port
            };
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(
                connector()
                    .tunnel(&up, &Target::new("localhost", 443))
                    .await,
            )
            .await;
            assert!(matches!(err, ConnectError::Refused { .. }), "{err:?}");
            assert_eq!(err.outcome(), Outcome::ConnectError);
            assert_eq!(err.proxy_status(), "connection_refused");
            assert!(err.to_string().contains(&format!("127.0.0.1:{port}")));

            let direct = upstream("direct://");
            let err = err_of(
                connector()
                    .tunnel(&direct, &Target::new("127.0.0.1", port))
                    .await,
            )
            .await;
            assert!(matches!(err, ConnectError::Refused { .. }), "{err:?}");
        })
        .await;
    }

    #[tokio::test]
    async fn silent_proxy_times_out_within_connect_timeout() {
        bounded(async {
            let (port, _s) = fake_proxy(Answer::Silent, None).await;
            let up = with_password(&format!("http://127.0.0.1:{port}"), PASSWORD);
            let connector = Connector::new(
                client_config(RootCertStore::empty()),
                Duration::from_millis(200),
            );
            let started = std::time::Instant::now();
            let err = err_of(connector.tunnel(&up, &Target::new("localhost", 443)).await).await;
            assert!(started.elapsed() < Duration::from_secs(2));
            assert!(matches!(err, ConnectError::Timeout { .. }), "{err:?}");
            assert_eq!(err.outcome(), Outcome::Timeout);
            assert_eq!(err.proxy_status(), "connection_timeout");
        })
        .await;
    }

    #[tokio::test]
    async fn socks5_resolves_locally_and_socks5h_sends_the_name() {
        bounded(async {
            let (echo_port, _peers) = echo_target().await;
            let (port, mut seen) = fake_socks(Some(PASSWORD)).await;
            let target = Target::new("localhost", echo_port);

            let up = with_password(&format!("socks5://127.0.0.1:{port}"), PASSWORD);
            let mut io = connector().tunnel(&up, &target).await.unwrap();
            assert_echoes(&mut io).await;
            let (dest, dest_port) = seen.recv().await.unwrap();
            assert!(
                matches!(dest, SocksDest::V4(ip) if ip.is_loopback())
                    || matches!(dest, SocksDest::V6(ip) if ip.is_loopback()),
                "{dest:?}"
            );
            assert_eq!(dest_port, echo_port);

            let up = with_password(&format!("socks5h://127.0.0.1:{port}"), PASSWORD);
            let mut io = connector().tunnel(&up, &target).await.unwrap();
            assert_echoes(&mut io).await;
            assert_eq!(
                seen.recv().await.unwrap(),
                (SocksDest::Name("localhost".into()), echo_port)
            );
        })
        .await;
    }

    #[tokio::test]
    async fn socks_failures_keep_their_kind() {
        bounded(async {
            let (port, mut seen) = fake_socks(Some(PASSWORD)).await;
            let target = Target::new("localhost", 443);

            let up = with_password(&format!("socks5h://127.0.0.1:{port}"), "wrong-password");
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(
                matches!(
                    err,
                    ConnectError::Socks {
                        fault: SocksFault::AuthRejected,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.outcome(), Outcome::UpstreamError);
            assert!(!err.to_string().contains("wrong-password"));

            let up = upstream(&format!("socks5h://127.0.0.1:{port}"));
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(
                matches!(
                    err,
                    ConnectError::Socks {
                        fault: SocksFault::NoAcceptableAuth,
                        ..
                    }
                ),
                "{err:?}"
            );

            // The fake refuses anything that is not loopback, and never dials it.
            let up = with_password(&format!("socks5h://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(
                connector()
                    .tunnel(&up, &Target::new("example.com", 443))
                    .await,
            )
            .await;
            assert!(
                matches!(
                    err,
                    ConnectError::Socks {
                        fault: SocksFault::NotAllowed,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert_eq!(err.proxy_status(), "destination_unavailable");
            assert_eq!(
                seen.recv().await.unwrap(),
                (SocksDest::Name("example.com".into()), 443)
            );

            let mut up = upstream(&format!("socks5h://127.0.0.1:{port}"));
            up.credentials = Some(Credentials {
                username: USER.into(),
                password: String::new(),
            });
            let err = err_of(connector().tunnel(&up, &target).await).await;
            assert!(
                matches!(
                    err,
                    ConnectError::Socks {
                        fault: SocksFault::BadCredentials,
                        ..
                    }
                ),
                "{err:?}"
            );
        })
        .await;
    }

    #[tokio::test]
    async fn direct_connects_to_each_address_in_turn_from_the_bind_address() {
        bounded(async {
            let (port, mut peers) = echo_target().await;
            let mut io = connector()
                .tunnel(&upstream("direct://"), &Target::new("127.0.0.1", port))
                .await
                .unwrap();
            assert_echoes(&mut io).await;

            // `localhost` may resolve to ::1 first, where nothing listens: the next address wins.
            let mut io = connector()
                .tunnel(&upstream("direct://"), &Target::new("localhost", port))
                .await
                .unwrap();
            assert_echoes(&mut io).await;

            let mut io = connector()
                .tunnel(
                    &upstream("direct://127.0.0.1"),
                    &Target::new("localhost", port),
                )
                .await
                .unwrap();
            assert_echoes(&mut io).await;
            let mut last = None;
            while let Ok(peer) = peers.try_recv() {
                last = Some(peer);
            }
            assert_eq!(last.map(|p| p.ip()), Some(IpAddr::from([127, 0, 0, 1])));
        })
        .await;
    }

    #[tokio::test]
    async fn connect_any_moves_past_a_dead_address() {
        bounded(async {
            let (port, _peers) = echo_target().await;
            let dead = {
                let (_l, dead) = listener().await;
                dead
            };
            let addrs = [
                SocketAddr::from(([127, 0, 0, 1], dead)),
                SocketAddr::from(([127, 0, 0, 1], port)),
            ];
            let tcp = connect_any(&addrs, None, "test").await.unwrap();
            assert!(tcp.nodelay().unwrap());
            let mut io: BoxIo = Box::new(tcp);
            assert_echoes(&mut io).await;

            let err = connect_any(&addrs[..1], None, "test").await.unwrap_err();
            assert!(matches!(err, ConnectError::Refused { .. }), "{err:?}");
        })
        .await;
    }

    #[tokio::test]
    async fn direct_bind_family_mismatch_is_not_the_upstreams_fault() {
        bounded(async {
            let up = upstream("direct://127.0.0.1");
            let err = err_of(connector().tunnel(&up, &Target::new("::1", 443)).await).await;
            assert!(matches!(err, ConnectError::TargetDns { .. }), "{err:?}");
            assert_eq!(err.outcome(), Outcome::OriginError);
            assert_eq!(err.proxy_status(), "dns_error");
        })
        .await;
    }

    #[tokio::test]
    async fn https_upstream_speaks_tls_to_the_proxy() {
        bounded(async {
            let (acceptor, trusting) = tls_pair();
            let connector = Connector::new(trusting, Duration::from_secs(5));

            let (port, mut seen) = fake_proxy(Answer::Tunnel, Some(acceptor.clone())).await;
            let up = with_password(&format!("https://localhost:{port}"), PASSWORD);
            let mut io = connector
                .tunnel(&up, &Target::new("localhost", 8443))
                .await
                .unwrap();
            let mut early = [0u8; 5];
            io.read_exact(&mut early).await.unwrap();
            assert_eq!(&early, EARLY);
            assert_echoes(&mut io).await;
            let seen = seen.recv().await.unwrap();
            assert_eq!(seen.path, "localhost:8443");
            assert_eq!(seen.auth, up.credentials.as_ref().map(|c| c.basic_header()));

            let (port, _s) = fake_proxy(Answer::Echo, Some(acceptor.clone())).await;
            let mut io = connector
                .proxy_conn(&upstream(&format!("https://localhost:{port}")))
                .await
                .unwrap();
            assert_echoes(&mut io).await;

            // The certificate names `localhost`, not the IP literal.
            let by_ip = with_password(&format!("https://127.0.0.1:{port}"), PASSWORD);
            let err = err_of(connector.proxy_conn(&by_ip).await).await;
            assert!(matches!(err, ConnectError::Tls { .. }), "{err:?}");
            assert_eq!(err.proxy_status(), "tls_certificate_error");
            assert_eq!(err.outcome(), Outcome::ConnectError);

            // A client that does not trust the certificate.
            let up = with_password(&format!("https://localhost:{port}"), PASSWORD);
            let err = err_of(self::connector().proxy_conn(&up).await).await;
            assert_eq!(err.proxy_status(), "tls_certificate_error", "{err:?}");
        })
        .await;
    }

    #[tokio::test]
    async fn proxy_conn_is_for_http_proxies_only() {
        bounded(async {
            let (port, _peers) = echo_target().await;
            let mut io = connector()
                .proxy_conn(&upstream(&format!("http://127.0.0.1:{port}")))
                .await
                .unwrap();
            assert_echoes(&mut io).await;

            for url in ["socks5://127.0.0.1:1", "socks5h://127.0.0.1:1", "direct://"] {
                let err = err_of(connector().proxy_conn(&upstream(url)).await).await;
                assert!(matches!(err, ConnectError::NotHttpProxy { .. }), "{err:?}");
            }
        })
        .await;
    }

    #[tokio::test]
    async fn invalid_targets_are_rejected_before_dialing() {
        bounded(async {
            // Port 1 on loopback: if anything were dialed the error would be Refused instead.
            let up = with_password("http://127.0.0.1:1", PASSWORD);
            for target in [
                Target::new("evil\r\nX-Injected: 1", 443),
                Target::new("h", 0),
            ] {
                let err = err_of(connector().tunnel(&up, &target).await).await;
                assert!(matches!(err, ConnectError::InvalidTarget { .. }), "{err:?}");
                assert!(!err.to_string().contains('\n'));
                assert_eq!(err.outcome(), Outcome::OriginError);
            }
        })
        .await;
    }

    #[tokio::test]
    async fn rewind_yields_prefix_then_inner_and_writes_through() {
        bounded(async {
            let (ours, mut theirs) = tokio::io::duplex(64);
            let mut rewind = Rewind::new(Bytes::from_static(b"abc"), ours);
            theirs.write_all(b"def").await.unwrap();
            let mut got = Vec::new();
            let mut byte = [0u8; 2];
            while got.len() < 6 {
                let n = rewind.read(&mut byte).await.unwrap();
                got.extend_from_slice(&byte[..n]);
            }
            assert_eq!(got, b"abcdef");
            rewind.write_all(b"xyz").await.unwrap();
            let mut back = [0u8; 3];
            theirs.read_exact(&mut back).await.unwrap();
            assert_eq!(&back, b"xyz");
        })
        .await;
    }
}
