//! `socks5://` and `socks5h://`: a SOCKS5 CONNECT, with username/password when configured.

use std::net::SocketAddr;

use tokio_socks::TargetAddr;
use tokio_socks::tcp::Socks5Stream;

use super::error::{io_error, target_dns};
use super::tcp::connect_proxy_tcp;
use super::{BoxIo, ConnectError, Connector, SocksFault};
use crate::target::Target;
use crate::upstream::{Scheme, Upstream};

/// SOCKS5 handshake on a TCP connection we opened ourselves, so the timeout and connect errors
/// stay ours. `socks5` resolves the target here and sends the first address the target policy
/// allows (the same check `direct` makes before dialing; one handshake per attempt, so no
/// fallback); `socks5h` sends the name for the proxy to resolve.
pub(super) async fn tunnel(
    connector: &Connector,
    upstream: &Upstream,
    target: &Target,
) -> Result<BoxIo, ConnectError> {
    let addr = upstream.addr.as_str();
    let dest = if upstream.scheme == Scheme::Socks5 {
        let allowed = connector.guarded_addrs(target).await?;
        match allowed.first() {
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

/// tokio-socks errors sorted into ours: the server's reply codes keep their meaning.
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

#[cfg(test)]
mod tests;
