//! Opening byte streams to a target through an upstream: CONNECT through HTTP(S) proxies, SOCKS5
//! handshakes, or a plain TCP connection for `direct`.
//!
//! Everything up to the first tunnel byte (DNS, TCP, TLS, CONNECT or SOCKS) runs under one
//! `connect_timeout`, so a proxy that accepts and then stalls costs no more than one that refuses.
//! Errors name hosts and ports only: credentials are never formatted into them.
//!
//! Each upstream kind has a module of its own (`http` for http:// and https://, `socks5`, `direct`)
//! with one `tunnel(&Connector, &Upstream, &Target)` function. They are dispatched by matching the
//! closed [`Scheme`] enum rather than through a trait object, so each kind's future is laid out
//! inside the one [`Connector::tunnel`] awaits: no allocation per open beyond the returned
//! [`BoxIo`]. Dialing is shared (`tcp`), and so are the errors (`error`).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::{Scheme, Upstream};
use crate::target::Target;

mod direct;
mod error;
mod http;
mod rewind;
mod socks5;
mod tcp;

use error::target_dns;
pub use error::{ConnectError, ReplyFault, SocksFault};
pub use rewind::Rewind;

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

/// Whether a resolved address may be used for a target: the target policy applied to what a
/// name really points at, on every address resolved here, right before `direct://` dials it or
/// `socks5://` hands it to the proxy.
pub type AddrGuard = Arc<dyn Fn(&Target, SocketAddr) -> bool + Send + Sync>;

/// Opens streams through upstreams. Cheap to clone (clones share settings); holds no connections.
#[derive(Clone)]
pub struct Connector {
    tls: TlsConnector,
    /// Milliseconds; shared by clones and changed on reload.
    connect_timeout_ms: Arc<AtomicU64>,
    /// Resolves target names (`direct`, `socks5`).
    resolver: Arc<dyn Resolve>,
    /// Checked on every target address resolved here (`direct`, `socks5`) before it is used;
    /// `None` allows all.
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

    /// Checks every address a target resolved to here (`direct`, `socks5`) with `guard` before
    /// it is dialed or sent to a SOCKS proxy.
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

    /// The addresses of `target` that may be used: literals as they are, names through the
    /// resolver, then the target policy again on what the name really points at, so a name cannot
    /// rebind its way into an internal network. The one way a target is resolved here: every kind
    /// that resolves names itself (`direct`, `socks5`) gets its addresses from this.
    async fn guarded_addrs(&self, target: &Target) -> Result<Vec<SocketAddr>, ConnectError> {
        let resolved = match target.ip() {
            Some(ip) => vec![SocketAddr::new(ip, target.port)],
            None => self
                .resolver
                .resolve(&target.host, target.port)
                .await
                .map_err(|error| ConnectError::TargetDns {
                    host: target.host.clone(),
                    error,
                })?,
        };
        if resolved.is_empty() {
            return Err(target_dns(target, "no addresses"));
        }
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
                Scheme::Http | Scheme::Https => http::tunnel(self, upstream, target).await,
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
        match tokio::time::timeout(after, http::open(self, upstream)).await {
            Ok(result) => result,
            Err(_) => Err(ConnectError::Timeout {
                addr: upstream.addr.clone(),
                after,
            }),
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

#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
