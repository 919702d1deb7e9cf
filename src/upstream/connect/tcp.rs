//! Dialing: resolving a proxy's name and trying addresses in turn, shared by every upstream kind.

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpSocket, TcpStream};

use super::ConnectError;
use super::error::io_error;
use crate::upstream::Upstream;

/// Resolves and connects to the proxy of `upstream`.
pub(super) async fn connect_proxy_tcp(
    upstream: &Upstream,
    addr: &str,
) -> Result<TcpStream, ConnectError> {
    let addrs = resolve(&upstream.host, upstream.port)
        .await
        .map_err(|error| ConnectError::ProxyDns {
            host: upstream.host.clone(),
            error,
        })?;
    connect_any(&addrs, None, addr).await
}

/// The system resolver: for proxies' own names always, for target names unless a
/// [`super::Resolve`] is injected.
pub(super) async fn resolve(host: &str, port: u16) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "no addresses"));
    }
    Ok(addrs)
}

/// Tries each address in order; the last failure is reported (they usually agree).
pub(super) async fn connect_any(
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

/// One address: bound to `bind` when set, with Nagle off.
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

#[cfg(test)]
mod tests;
