//! The SOCKS5 front door: one client connection on `server.socks_listen`, from its greeting to
//! the end of its tunnel, through exactly the machinery of an HTTP CONNECT.
//!
//! The handshake ([`crate::socks5`] parses it) must be complete within `header_read_timeout`
//! (the time a password check takes is not counted against the client):
//!
//! 1. Greeting. With `[auth.users]` configured only username/password (`02`) is accepted; with
//!    none, `02` is preferred when offered, so that the username's tokens (`-session-s1`,
//!    `-pool-eu`) still route as on the HTTP port, its password unchecked as there, and `00`
//!    otherwise. The client allowlist (`client_cidrs`) is checked before a byte is read.
//! 2. Login (RFC 1929): the username read by [`session::from_login`] (a malformed token is
//!    refused, never ignored) and checked by [`proxy::login`] (the HTTP port's check, back-off
//!    lockout included). A refusal gets status `01` and the connection closes.
//! 3. Request: CONNECT only; BIND and UDP ASSOCIATE get `07`. From here on it is one request,
//!    counted as one ([`crate::accounting`], door `socks5`): routed by [`proxy::route_ask`],
//!    opened by [`proxy::open`] (one lease for the connection's life, retries before the reply),
//!    an error answered with [`respond::socks_reply`]'s code, and success carried by
//!    [`tunnel::Carry`] (inspection for `inspect_tls` pools, or a relay that records the outcome).
//!
//! A handshake that breaks the protocol closes the connection with the reply the protocol has for
//! it, if any ([`HandshakeError::reply`]).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::accounting::{Door, End};
use crate::admit;
use crate::error::ProxyError;
use crate::limits::ConnSlot;
use crate::outcome::Outcome;
use crate::pool::lease::Lease;
use crate::pool::select::Route;
use crate::proxy;
use crate::proxy::ledger;
use crate::proxy::respond::{self, ErrorResponse};
use crate::proxy::tunnel::Carry;
use crate::session::{self, SessionRequest};
use crate::socks5::{self, Command, HandshakeError, Method, Parse, Refusal, Reply};
use crate::state::Gateway;
use crate::target::Target;
use crate::upstream::connect::{BoxIo, Rewind};

/// Bytes a handshake may hold unparsed at once: a greeting, a login and a request, each at its
/// longest, sent together.
const MAX_HANDSHAKE_BYTES: usize =
    socks5::MAX_GREETING_BYTES + socks5::MAX_LOGIN_BYTES + socks5::MAX_REQUEST_BYTES;

/// Serves one connection of the SOCKS5 port. `slot` is its place under the connection limits,
/// held until its tunnel starts (a CONNECT tunnel, too, stops counting as a client connection).
pub async fn handle(gw: Arc<Gateway>, mut stream: TcpStream, peer: SocketAddr, slot: ConnSlot) {
    let _ = stream.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(512);
    let (ask, request) = match handshake(&gw, &mut stream, &mut buf, peer).await {
        Ok(Some(read)) => read,
        Ok(None) => return,
        Err(e) => {
            gw.counters.socks5_handshake_failed();
            tracing::debug!(peer = %peer, error = %e, reason = e.as_str(), "socks5 handshake refused");
            if let Some(refusal) = e.reply() {
                if let Refusal::Request(reply) = refusal {
                    gw.counters.socks5_reply(reply);
                }
                let _ = write(&mut stream, &refusal.bytes(), reply_deadline(&gw)).await;
            }
            return;
        }
    };
    let ticket = gw.counters.accept(Door::Socks5);
    let entry = {
        let host = match &request.addr {
            socks5::Addr::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
            socks5::Addr::Ip(ip) => ip.to_string(),
            socks5::Addr::Domain(name) => name.clone(),
        };
        ledger::begin_socks(&gw, peer, format!("{host}:{}", request.port))
    };
    let connect = match request.command {
        Command::Connect => connect(&gw, ask, &request, peer).await,
        Command::Bind | Command::UdpAssociate => Err(Answer::Protocol(Reply::CommandNotSupported)),
    };
    let (route, target, lease, upstream) = match connect {
        Ok(opened) => opened,
        Err(answer) => {
            let (reply, end) = match &answer {
                Answer::Protocol(reply) => (*reply, End::Rejected),
                Answer::Error(e) => {
                    let end = if e.status().is_client_error() {
                        End::Rejected
                    } else {
                        End::Failed
                    };
                    (respond::socks_reply(e), end)
                }
            };
            match &answer {
                Answer::Error(e) => tracing::debug!(
                    peer = %peer, error = %e, code = e.code(), reply = reply.as_str(),
                    "socks5 request failed"
                ),
                Answer::Protocol(_) => tracing::debug!(
                    peer = %peer, command = ?request.command, reply = reply.as_str(),
                    "socks5 command not supported"
                ),
            }
            gw.counters.socks5_reply(reply);
            ticket.finish(end);
            let (status, code) = match &answer {
                Answer::Error(e) => (e.status(), Some(e.code())),
                Answer::Protocol(_) => (http::StatusCode::NOT_IMPLEMENTED, None),
            };
            ledger::answered(entry, status, code);
            let _ = write(&mut stream, &socks5::reply(reply), reply_deadline(&gw)).await;
            return;
        }
    };
    let mut lease = lease;
    if let Some(entry) = &entry {
        ledger::fill_route(entry, &route);
    }
    ledger::attach(entry.clone(), &mut lease);
    ledger::answered(entry, http::StatusCode::OK, None);
    let carry = Carry::plan(&gw, Door::Socks5, &route, target);
    let replied = write(
        &mut stream,
        &socks5::reply(Reply::Succeeded),
        reply_deadline(&gw),
    )
    .await;
    if let Err(e) = replied {
        tracing::debug!(peer = %peer, error = %e, "socks5 client gone before the reply");
        lease.finish(Outcome::Cancelled);
        ticket.finish(End::Failed);
        return;
    }
    gw.counters.socks5_reply(Reply::Succeeded);
    ticket.finish(End::Completed);
    // Bytes the client sent past its request (an early TLS hello) belong to the tunnel.
    let client: BoxIo = if buf.is_empty() {
        Box::new(stream)
    } else {
        Box::new(Rewind::new(buf.freeze(), stream))
    };
    drop(slot);
    carry.run(gw, client, upstream, lease).await;
}

/// Why a request got no tunnel.
enum Answer {
    /// The request is valid SOCKS5 the gateway does not serve.
    Protocol(Reply),
    /// The gateway's routing or connect failed.
    Error(ProxyError),
}

/// A routed and opened CONNECT: its route, target, lease and upstream connection.
type Opened = (Route, Target, Lease, BoxIo);

/// Routes and opens a CONNECT as an HTTP CONNECT is: [`proxy::route_ask`], then [`proxy::open`]
/// with the connector's tunnel.
async fn connect(
    gw: &Arc<Gateway>,
    ask: SessionRequest,
    request: &socks5::Request,
    peer: SocketAddr,
) -> Result<Opened, Answer> {
    let host = match &request.addr {
        socks5::Addr::Ip(ip) => ip.to_string(),
        socks5::Addr::Domain(name) => name.clone(),
    };
    let target = Target::parse(&host, request.port)
        .map_err(|e| Answer::Error(ProxyError::BadRequest(e.message())))?;
    let route = proxy::route_ask(gw, ask, &target, true, peer)
        .await
        .map_err(Answer::Error)?;
    let (mut lease, io) = proxy::open(gw, &route, |up| {
        let gw = gw.clone();
        let target = target.clone();
        async move { gw.connector.tunnel(&up, &target).await }
    })
    .await
    .map_err(Answer::Error)?;
    lease.mark_latency();
    Ok((route, target, lease, io))
}

/// Greeting, login and request, within `header_read_timeout`. `Ok(None)`: the connection was
/// refused (client allowlist, a refused login) and has been answered.
async fn handshake(
    gw: &Gateway,
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    peer: SocketAddr,
) -> Result<Option<(SessionRequest, socks5::Request)>, HandshakeError> {
    let live = gw.live.load_full();
    if let Err(e) = admit::check_client(&live.auth, peer.ip()) {
        gw.counters.socks5_handshake_failed();
        tracing::debug!(peer = %peer, error = %e, "socks5 client refused");
        return Ok(None);
    }
    let mut deadline = Instant::now() + live.server.header_read_timeout;
    let users = live.auth.required();
    let method = read(stream, buf, deadline, |b| socks5::greeting(b, true, !users)).await?;
    write(stream, &socks5::method_selection(method), deadline).await?;
    let ask = match method {
        Method::NoAuth => SessionRequest::default(),
        Method::Password => {
            let login = read(stream, buf, deadline, socks5::login).await?;
            let ask = match session::from_login(&login.username, login.password) {
                Ok(ask) => ask,
                Err(e) => {
                    refuse_login(gw, stream, peer, deadline, &ProxyError::BadUsername(e)).await;
                    return Ok(None);
                }
            };
            let checking = Instant::now();
            let checked = proxy::login(
                gw,
                &live.auth,
                peer.ip(),
                ask.user.as_deref(),
                ask.password.as_deref(),
            )
            .await;
            // The password check's time is the gateway's, not the client's.
            deadline += checking.elapsed();
            if let Err(e) = checked {
                refuse_login(gw, stream, peer, deadline, &e).await;
                return Ok(None);
            }
            write(stream, &socks5::login_status(true), deadline).await?;
            ask
        }
    };
    let request = read(stream, buf, deadline, socks5::request).await?;
    Ok(Some((ask, request)))
}

/// Answers a refused login with status `01`; the connection then closes.
async fn refuse_login(
    gw: &Gateway,
    stream: &mut TcpStream,
    peer: SocketAddr,
    deadline: Instant,
    e: &ProxyError,
) {
    gw.counters.socks5_handshake_failed();
    tracing::debug!(peer = %peer, error = %e, code = e.code(), "socks5 login refused");
    let _ = write(stream, &Refusal::Login.bytes(), deadline).await;
}

/// Reads until `parse` has a whole message, which it takes from the front of `buf`.
async fn read<T>(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    deadline: Instant,
    parse: impl Fn(&[u8]) -> Result<Parse<T>, HandshakeError>,
) -> Result<T, HandshakeError> {
    loop {
        if let Parse::Done(msg, used) = parse(buf)? {
            buf.advance(used);
            return Ok(msg);
        }
        // Never reached while the parsers bound their messages; a bound all the same.
        if buf.len() >= MAX_HANDSHAKE_BYTES {
            return Err(HandshakeError::Truncated);
        }
        buf.reserve(512);
        match tokio::time::timeout_at(deadline, stream.read_buf(buf)).await {
            Err(_) => return Err(HandshakeError::Timeout),
            Ok(Ok(0)) | Ok(Err(_)) => return Err(HandshakeError::Truncated),
            Ok(Ok(_)) => {}
        }
    }
}

/// How long a reply may take to send: a client that does not read its reply holds nothing.
fn reply_deadline(gw: &Gateway) -> Instant {
    Instant::now() + gw.live.load().server.header_read_timeout
}

async fn write(
    stream: &mut TcpStream,
    bytes: &[u8],
    deadline: Instant,
) -> Result<(), HandshakeError> {
    match tokio::time::timeout_at(deadline, stream.write_all(bytes)).await {
        Err(_) => Err(HandshakeError::Timeout),
        Ok(Err(_)) => Err(HandshakeError::Truncated),
        Ok(Ok(())) => Ok(()),
    }
}
