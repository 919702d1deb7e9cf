//! Listeners: the accept loop and one hyper HTTP/1.1 connection per client.
//!
//! Connection limits are checked right after `accept()`: a connection past `max_connections`, or
//! past `max_connections_per_client` for its address, gets a one-line 503 and is closed at once,
//! so a flood is refused quickly instead of piling up, and connections already open are never
//! touched. Accept errors (out of file descriptors, mostly) back off and never end the loop.
//!
//! Each connection runs under the limits in force when it was accepted: `header_read_timeout`
//! (a slow client sending its head byte by byte is cut off), `max_header_bytes` (431), and
//! `idle_timeout` (a keep-alive connection with no request in flight and no bytes moving is
//! closed). Connection tasks live on the gateway's task tracker: shutdown asks each one to finish
//! its in-flight request and close, then waits for them.
//!
//! The SOCKS5 port has the same accept loop and limits ([`serve_streams`]); its connections,
//! counted with the proxy port's, are handed to their handler as TCP streams.
//!
//! A connection that becomes a tunnel (CONNECT) goes on in the same task: the handler leaves the
//! tunnel's future in the request's [`AfterUpgrade`], and the connection task runs it once hyper
//! has handed the connection over, instead of spawning a task for it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

use crate::limits::{self, Activity, ClientConns, ConnSlot, Expiry, Guarded, Tracked};
use crate::state::Gateway;

const ACCEPT_BACKOFF_START: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Connections the admin listener serves at once.
const MAX_ADMIN_CONNECTIONS: usize = 64;

/// A body a service answers with. Generic rather than boxed: each layer a response body is
/// wrapped in (the request's accounting, the connection's activity) is then a plain field, not
/// another allocation and virtual call for every frame.
pub trait ResponseBody:
    http_body::Body<Data = Bytes, Error = hyper::Error> + Send + 'static
{
}

impl<B: http_body::Body<Data = Bytes, Error = hyper::Error> + Send + 'static> ResponseBody for B {}

/// Which listener a loop serves: the limits differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    /// The proxy port: limits from the config in force.
    Proxy,
    /// The SOCKS5 port: the proxy port's limits, counted together with its connections.
    Socks,
    /// The admin port: a small fixed limit.
    Admin,
}

/// Runs the accept loop until shutdown, serving each connection with `service`.
pub async fn serve<S, F, B>(gw: Arc<Gateway>, listener: TcpListener, kind: Listener, service: S)
where
    S: Fn(Arc<Gateway>, Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: ResponseBody,
{
    accept(gw, listener, kind, move |gw, stream, peer, slot| {
        serve_connection(gw, stream, peer, slot, service.clone())
    })
    .await
}

/// Runs the accept loop of a listener that does not speak HTTP (the SOCKS5 port) until
/// shutdown: `handle` gets each connection the limits admit, with its slot, in a task of its own.
pub async fn serve_streams<H, F>(gw: Arc<Gateway>, listener: TcpListener, handle: H)
where
    H: Fn(Arc<Gateway>, TcpStream, SocketAddr, ConnSlot) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    accept(gw, listener, Listener::Socks, handle).await
}

/// The accept loop: each connection the limits admit runs `conn` on the gateway's task tracker.
async fn accept<H, F>(gw: Arc<Gateway>, listener: TcpListener, kind: Listener, conn: H)
where
    H: Fn(Arc<Gateway>, TcpStream, SocketAddr, ConnSlot) -> F + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let conns = match kind {
        Listener::Proxy | Listener::Socks => gw.client_conns.clone(),
        Listener::Admin => ClientConns::new(),
    };
    let mut backoff = ACCEPT_BACKOFF_START;
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = gw.shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => {
                backoff = ACCEPT_BACKOFF_START;
                a
            }
            Err(e) => {
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = gw.shutdown.cancelled() => break,
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        let (max_total, max_per_client) = match kind {
            Listener::Proxy | Listener::Socks => {
                let live = gw.live.load();
                (
                    live.server.max_connections as usize,
                    live.server.max_connections_per_client,
                )
            }
            Listener::Admin => (MAX_ADMIN_CONNECTIONS, MAX_ADMIN_CONNECTIONS as u32),
        };
        let slot = match conns.try_admit(peer.ip(), max_total, max_per_client) {
            Ok(slot) => slot,
            Err(refusal) => {
                tracing::debug!(peer = %peer, limit = refusal.as_str(), "connection refused");
                // Best effort and never blocking: the accept loop must not wait on a client. A
                // SOCKS5 client has no message for this before its greeting: it is closed.
                if kind != Listener::Socks {
                    let _ = stream.try_write(limits::refusal_response(refusal).as_bytes());
                }
                drop(stream);
                continue;
            }
        };
        gw.tasks.spawn(conn(gw.clone(), stream, peer, slot));
    }
}

/// What a connection runs after hyper handed it over (an upgrade): a handler of the request
/// finds this in the request's extensions and may leave one future here, which the connection's
/// task then runs to its end.
#[derive(Clone, Default)]
pub struct AfterUpgrade(Arc<Mutex<Option<Continuation>>>);

type Continuation = Pin<Box<dyn Future<Output = ()> + Send>>;

impl AfterUpgrade {
    /// Leaves `f` to run after the upgrade (replacing one left before).
    pub fn set(&self, f: impl Future<Output = ()> + Send + 'static) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::pin(f));
    }

    fn take(&self) -> Option<Continuation> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

async fn serve_connection<S, F, B>(
    gw: Arc<Gateway>,
    stream: TcpStream,
    peer: SocketAddr,
    slot: ConnSlot,
    service: S,
) where
    S: Fn(Arc<Gateway>, Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: ResponseBody,
{
    let _ = stream.set_nodelay(true);
    let live = gw.live.load_full();
    let server = &live.server;
    let activity = Activity::new();
    let svc_gw = gw.clone();
    let svc_activity = activity.clone();
    let after = AfterUpgrade::default();
    let svc_after = after.clone();
    let svc = service_fn(move |mut req: Request<Incoming>| {
        // Only a CONNECT can become a tunnel; other requests are spared the extension map.
        if req.method() == http::Method::CONNECT {
            req.extensions_mut().insert(svc_after.clone());
        }
        // In flight until the response body has been sent: the connection is not idle then.
        let busy = svc_activity.busy();
        // The service's future is made inside the block: a future made outside and awaited
        // inside is stored twice (the capture and the awaited copy), and hyper moves the whole
        // block into place for every request.
        let (service, gw) = (service.clone(), svc_gw.clone());
        async move {
            let resp = service(gw, req, peer).await;
            Ok::<_, Infallible>(resp.map(|body| Guarded::new(body, busy)))
        }
    });
    // The connection's state is dropped before a tunnel runs in its place; boxed, so that the
    // task of a tunnel (which lives as long as the tunnel) does not keep room for it.
    let result = {
        let mut conn = Box::pin(
            http1::Builder::new()
                // The head deadline is `limits::expired`'s, kept per connection below: hyper's
                // own timer is armed and cleared for every request head, a few percent of the
                // gateway's CPU per request.
                .header_read_timeout(None)
                // Header lines per request head stay at hyper's default of 100 (Apache's
                // LimitRequestFields): `max_headers` is not called, because any other limit makes
                // hyper allocate and fill two header tables for every request head it parses.
                .max_buf_size(server.max_header_bytes)
                // A client that shuts down its sending side after its request still gets the
                // answer.
                .half_close(true)
                .serve_connection(TokioIo::new(Tracked::new(stream, activity.clone())), svc)
                .with_upgrades(),
        );
        let (idle_timeout, head_timeout) = (server.idle_timeout, server.header_read_timeout);
        let mut closing = false;
        loop {
            let idle = (!closing).then_some(idle_timeout);
            tokio::select! {
                r = conn.as_mut() => break r,
                _ = gw.shutdown.cancelled(), if !closing => {
                    closing = true;
                    conn.as_mut().graceful_shutdown();
                }
                why = limits::expired(&activity, idle, head_timeout) => match why {
                    Expiry::Idle => {
                        tracing::debug!(peer = %peer, "closing idle client connection");
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    // Cut off: a client that sends its head byte by byte holds nothing longer.
                    Expiry::Head => {
                        tracing::debug!(peer = %peer, "no request head within header_read_timeout");
                        break Ok(());
                    }
                },
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(peer = %peer, error = %e, "client connection ended with an error");
    }
    if let Some(tunnel) = after.take() {
        // The tunnel no longer counts as a client connection, nor holds the settings the
        // connection was accepted under (as when it ran in its own task).
        drop((slot, live));
        tunnel.await;
    }
}
