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
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{Scheme, Upstream};
use crate::target::Target;

mod direct;
mod error;
mod rewind;
mod socks5;
mod tcp;

pub use error::{ConnectError, ReplyFault, SocksFault};
use error::{io_error, target_dns};
pub use rewind::Rewind;
use tcp::connect_proxy_tcp;

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
        Box::pin(async move { tcp::resolve(&host, port).await })
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

    /// The addresses of `target` that may be dialed: the target policy again, on what the name
    /// really points at, so a name cannot rebind its way into an internal network.
    async fn guarded_addrs(&self, target: &Target) -> Result<Vec<SocketAddr>, ConnectError> {
        let resolved = self.resolve_target(target).await?;
        let addrs: Vec<SocketAddr> = match &self.guard {
            Some(guard) => resolved.into_iter().filter(|a| guard(target, *a)).collect(),
            None => resolved,
        };
        if addrs.is_empty() {
            return Err(ConnectError::TargetDenied {
                target: target.authority(),
            });
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
                Scheme::Socks5 | Scheme::Socks5h => socks5::tunnel(self, upstream, target).await,
                Scheme::Direct => direct::tunnel(self, upstream, target).await,
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

fn bad_reply(addr: &str, fault: ReplyFault) -> ConnectError {
    ConnectError::BadReply {
        addr: addr.into(),
        fault,
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

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
