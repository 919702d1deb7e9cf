//! `http://` and `https://` proxies: TCP, TLS to the proxy for https, then CONNECT and its reply.

use std::io;

use bytes::{Bytes, BytesMut};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::io_error;
use super::tcp::connect_proxy_tcp;
use super::{BoxIo, ConnectError, Connector, ReplyFault, Rewind};
use crate::target::Target;
use crate::upstream::{Scheme, Upstream};

/// Cap on a proxy's CONNECT reply header: a proxy that sends more is broken or hostile, and
/// buffering it without bound would let one upstream exhaust the gateway's memory.
pub(super) const MAX_REPLY_HEAD: usize = 16 * 1024;
/// What the reply head is first read into.
const REPLY_HEAD_START: usize = 1024;
/// Header slots for parsing a CONNECT reply; real proxies send a handful.
const MAX_REPLY_HEADERS: usize = 64;

/// A tunnel through an HTTP(S) proxy: open, then CONNECT.
pub(super) async fn tunnel(
    connector: &Connector,
    upstream: &Upstream,
    target: &Target,
) -> Result<BoxIo, ConnectError> {
    let conn = open(connector, upstream).await?;
    connect(conn, upstream, target).await
}

/// TCP (+ TLS for https) to an HTTP proxy: the connection CONNECT is sent on, or that carries
/// absolute-form requests ([`Connector::proxy_conn`]).
pub(super) async fn open(
    connector: &Connector,
    upstream: &Upstream,
) -> Result<BoxIo, ConnectError> {
    let addr = upstream.addr.as_str();
    let tcp = connect_proxy_tcp(upstream, addr).await?;
    if upstream.scheme != Scheme::Https {
        return Ok(Box::new(tcp));
    }
    tls(connector, upstream, tcp).await
}

/// The https:// step: TLS to the proxy itself, with the `upstream_tls` roots.
async fn tls(
    connector: &Connector,
    upstream: &Upstream,
    tcp: TcpStream,
) -> Result<BoxIo, ConnectError> {
    let addr = upstream.addr.as_str();
    // The host is stored without brackets, so IP literals parse as IP server names.
    let name = ServerName::try_from(upstream.host.clone()).map_err(|_| ConnectError::Tls {
        addr: addr.to_string(),
        error: rustls::Error::General("proxy host is not a valid TLS server name".into()),
    })?;
    match connector.tls.connect(name, tcp).await {
        Ok(tls) => Ok(Box::new(tls)),
        Err(error) => Err(tls_error(addr, error)),
    }
}

/// Sends CONNECT over an open proxy connection and waits for a 2xx.
async fn connect(
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
mod tests;
