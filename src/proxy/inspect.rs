//! One inspected tunnel: from the client's ClientHello to the last relayed response.
//!
//! [`open`] reads the ClientHello (keeping every byte, so a tunnel that is not inspected after all
//! still passes through intact) and decides: inspect, pass through raw (excluded name, not TLS,
//! nothing sent in time, no leaf), or give up (client gone). [`serve`] then completes the
//! client's handshake with the minted leaf while, at the same time, speaking TLS to the origin
//! through the upstream tunnel; and relays HTTP/1.1 with hyper — a server connection towards the
//! client, a client connection towards the origin.
//!
//! Health, per request: every response is classified like a plain-HTTP one (status and headers
//! by [`crate::health::classify::CaptchaRules::classify_head`], the body's first bytes by the
//! streaming sniffer of [`Observed`]), and each one counts as one exchange of the tunnel's lease
//! ([`Exchange`]): health observes it when its body ends, the store counts it. The lease is the
//! tunnel's (one connection through the upstream, one unit of its concurrency cap); its release
//! adds nothing of its own. A client that fails the handshake (it does not trust the CA) is
//! counted in `intercept.client_handshake_failures` and never blamed on the upstream.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;

use crate::body::OutBody;
use crate::body::{self, Body};
use crate::error::ProxyError;
use crate::health::classify::ResponseFrom;
use crate::intercept::certs::Leaf;
use crate::intercept::{HostPattern, InterceptStats, OriginTlsFault, excluded};
use crate::outcome::Outcome;
use crate::pool::lease::{Exchange, Lease};
use crate::proxy::observe::Observed;
use crate::proxy::respond::ErrorResponse;
use crate::proxy::{framing, headers};
use crate::state::Gateway;
use crate::target::Target;
use crate::upstream::connect::{BoxIo, Rewind};
use crate::upstream::{Upstream, UpstreamId};

/// The client's side of a tunnel, once it has been told the tunnel is up (CONNECT's 200, the
/// SOCKS5 success reply).
pub type ClientIo = BoxIo;
/// The client's stream with the bytes already read put back in front.
pub type Replayed = Rewind<ClientIo>;

/// Longest ClientHello read before giving up on inspecting (post-quantum key shares make hellos
/// of a few KiB; anything this large is not a hello worth parsing).
const MAX_HELLO_BYTES: usize = 64 * 1024;
/// First byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// What to do with a tunnel of an inspecting pool.
pub enum Opening {
    Inspect(Hello),
    /// Tunnel it raw: these are the client's bytes, none lost.
    PassThrough(Replayed),
    /// The client left before saying anything usable.
    Gone,
}

/// A client that started TLS for a name the gateway will answer for.
pub struct Hello {
    client: Replayed,
    /// The SNI name, or the CONNECT host when the client sent none (lower-case).
    name: String,
    leaf: Arc<Leaf>,
}

/// Reads the ClientHello and decides whether the tunnel is inspected.
pub async fn open(
    gw: &Gateway,
    mut client: ClientIo,
    target: &Target,
    exclude: &[HostPattern],
) -> Opening {
    let stats = &gw.intercept.stats;
    let mut buf = Vec::new();
    let peeked = tokio::time::timeout(
        gw.config.server.header_read_timeout,
        peek_hello(&mut client, &mut buf),
    )
    .await;
    let sni = match peeked {
        Ok(Peek::Hello(sni)) => sni,
        Ok(Peek::Closed) => return Opening::Gone,
        Ok(Peek::NotTls) | Err(_) => {
            // Not TLS, or a protocol where the server speaks first: nothing to inspect.
            InterceptStats::bump(&stats.tunnels_passthrough);
            return Opening::PassThrough(Rewind::new(Bytes::from(buf), client));
        }
    };
    let replayed = Rewind::new(Bytes::from(buf), client);
    let name = sni
        .unwrap_or_else(|| target.host.clone())
        .to_ascii_lowercase();
    if excluded(exclude, &name) {
        InterceptStats::bump(&stats.tunnels_excluded);
        return Opening::PassThrough(replayed);
    }
    let leaf = gw.intercept.certs().map(|c| c.get(&name));
    match leaf {
        Some(Ok(leaf)) => Opening::Inspect(Hello {
            client: replayed,
            name,
            leaf,
        }),
        Some(Err(e)) => {
            tracing::warn!(name, error = %e, "no leaf certificate: tunnelling raw");
            InterceptStats::bump(&stats.tunnels_passthrough);
            Opening::PassThrough(replayed)
        }
        None => {
            InterceptStats::bump(&stats.tunnels_passthrough);
            Opening::PassThrough(replayed)
        }
    }
}

enum Peek {
    /// A complete ClientHello, with its SNI name if any.
    Hello(Option<String>),
    NotTls,
    Closed,
}

/// Reads until a whole ClientHello is in `buf` (parsed by rustls), or it is clear none is coming.
async fn peek_hello(client: &mut ClientIo, buf: &mut Vec<u8>) -> Peek {
    let mut reader = HelloReader::default();
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        let n = match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return Peek::Closed,
            Ok(n) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        match reader.feed(&chunk[..n]) {
            HelloStep::More => {}
            HelloStep::Hello(sni) => return Peek::Hello(sni),
            HelloStep::NotTls => return Peek::NotTls,
        }
    }
}

/// The parsing half of reading a ClientHello, apart from the socket: fed the client's bytes as
/// they arrive, it says when a whole hello (and its SNI name) is in, or that none is coming.
#[derive(Default)]
pub struct HelloReader {
    acceptor: rustls::server::Acceptor,
    /// Bytes fed so far.
    seen: usize,
    first: Option<u8>,
}

/// What the bytes fed to a [`HelloReader`] so far amount to.
#[derive(Debug, PartialEq, Eq)]
pub enum HelloStep {
    /// A hello may still come: feed more.
    More,
    /// A complete ClientHello, with its SNI name if any.
    Hello(Option<String>),
    /// Not TLS, or not a hello worth parsing.
    NotTls,
}

impl HelloReader {
    /// Takes the next bytes from the client (never empty: an empty read is the client gone).
    pub fn feed(&mut self, chunk: &[u8]) -> HelloStep {
        self.seen += chunk.len();
        if *self
            .first
            .get_or_insert(chunk.first().copied().unwrap_or(0))
            != TLS_HANDSHAKE
        {
            return HelloStep::NotTls;
        }
        let mut rd = chunk;
        while !rd.is_empty() {
            if self.acceptor.read_tls(&mut rd).is_err() {
                return HelloStep::NotTls;
            }
        }
        match self.acceptor.accept() {
            Ok(Some(accepted)) => {
                HelloStep::Hello(accepted.client_hello().server_name().map(str::to_owned))
            }
            Ok(None) if self.seen < MAX_HELLO_BYTES => HelloStep::More,
            Ok(None) | Err(_) => HelloStep::NotTls,
        }
    }
}

/// A failed step towards the origin: the outcome it records and the error the client sees.
struct Failed {
    outcome: Outcome,
    error: ProxyError,
}

/// Serves one inspected tunnel until the client or the origin ends it (or shutdown).
pub async fn serve(
    gw: Arc<Gateway>,
    hello: Hello,
    upstream_io: BoxIo,
    lease: Lease,
    target: Target,
    session: Option<String>,
) {
    let Some(upstream) = lease.upstream().cloned() else {
        lease.finish(Outcome::Cancelled);
        return;
    };
    let stats = &gw.intercept.stats;
    let server = &gw.config.server;
    let started = Instant::now();
    let acceptor = tokio_rustls::TlsAcceptor::from(hello.leaf.config.clone());

    // Both handshakes at once: the client's with the gateway, the gateway's with the origin.
    let client_hs = async {
        match tokio::time::timeout(server.header_read_timeout, acceptor.accept(hello.client)).await
        {
            Ok(Ok(tls)) => Ok(tls),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no handshake within server.header_read_timeout".to_string()),
        }
    };
    let (client, origin) = {
        let origin_hs = origin_connect(&gw, &upstream.id, &target, &hello.name, upstream_io);
        tokio::pin!(client_hs, origin_hs);
        tokio::select! {
            c = &mut client_hs => match c {
                Ok(c) => (Ok(c), Some(origin_hs.await)),
                // The origin side is dropped: nothing more is needed from it.
                Err(e) => (Err(e), None),
            },
            o = &mut origin_hs => (client_hs.await, Some(o)),
        }
    };
    let client = match client {
        Ok(c) => c,
        Err(e) => {
            InterceptStats::bump(&stats.client_handshake_failures);
            tracing::warn!(
                target = %target, name = %hello.name, error = %e,
                "client TLS handshake with the gateway failed (does the client trust the interception CA?); not counted against the upstream"
            );
            lease.finish(Outcome::Cancelled);
            return;
        }
    };
    let sender = match origin {
        Some(Ok(s)) => s,
        Some(Err(failed)) => {
            lease.finish(failed.outcome);
            answer_once(&gw, client, failed.error).await;
            return;
        }
        None => {
            lease.finish(Outcome::Cancelled);
            return;
        }
    };
    InterceptStats::bump(&stats.tunnels_inspected);
    tracing::debug!(
        target = %target, name = %hello.name, upstream = %upstream.id,
        setup_ms = started.elapsed().as_millis() as u64, "inspecting tunnel"
    );

    let lease = Arc::new(lease);
    let renew_every = lease.ttl() / 2;
    let shared = Arc::new(Shared {
        gw: gw.clone(),
        lease: lease.clone(),
        upstream,
        target,
        name: hello.name,
        session,
        origin: tokio::sync::Mutex::new(Some(sender)),
    });
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(shared.exchange(req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .max_buf_size(server.max_header_bytes)
        .serve_connection(TokioIo::new(client), svc);
    tokio::pin!(conn);
    let mut renew = tokio::time::interval(renew_every);
    renew.tick().await;
    let mut draining = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "inspected client connection ended with an error");
                }
                break;
            }
            _ = renew.tick() => lease.extend().await,
            _ = gw.shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    // The connection (and with it the service and every response body) is gone: the last
    // reference to the lease releases it, counting the last exchange.
}

/// TLS to the origin over `io` (a tunnel through the upstream), then an HTTP/1.1 client
/// connection on it, driven on the gateway's task tracker.
async fn origin_connect(
    gw: &Gateway,
    upstream: &UpstreamId,
    target: &Target,
    name: &str,
    io: BoxIo,
) -> Result<SendRequest<OutBody>, Failed> {
    let tls_failed = |fault: OriginTlsFault, detail: String| {
        InterceptStats::bump(&gw.intercept.stats.origin_handshake_failures);
        tracing::info!(target = %target, upstream = %upstream, fault = ?fault, detail, "TLS with the origin failed");
        Failed {
            outcome: fault.outcome(),
            error: ProxyError::OriginTls {
                upstream: upstream.clone(),
                target: target.authority(),
                fault,
                detail,
            },
        }
    };
    let Some(connector) = gw.intercept.origin_tls() else {
        return Err(Failed {
            outcome: Outcome::Cancelled,
            error: ProxyError::BadRequest("TLS interception is not configured"),
        });
    };
    let server_name = ServerName::try_from(name.to_string()).map_err(|_| {
        tls_failed(
            OriginTlsFault::Certificate,
            format!("{name:?} is not a valid TLS server name"),
        )
    })?;
    let timeout = gw.config.server.connect_timeout;
    let tls = match tokio::time::timeout(timeout, connector.connect(server_name, io)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => return Err(tls_failed(OriginTlsFault::of(&e), e.to_string())),
        Err(_) => {
            return Err(tls_failed(
                OriginTlsFault::Timeout,
                format!("no handshake within {timeout:?}"),
            ));
        }
    };
    let (sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(tls))
        .await
        .map_err(|e| Failed {
            outcome: Outcome::Reset,
            error: ProxyError::UpstreamProtocol {
                upstream: upstream.clone(),
                source: e,
            },
        })?;
    let upstream = upstream.clone();
    gw.tasks.spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(upstream = %upstream, error = %e, "origin connection ended");
        }
    });
    Ok(sender)
}

/// Answers the client's first request with `error`, then closes: the client's TLS is up but the
/// origin's is not, and a proper HTTP answer says why.
async fn answer_once<S>(gw: &Gateway, client: S, error: ProxyError)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let error = Arc::new(error);
    let svc = service_fn(move |_req: Request<Incoming>| {
        let mut resp = error.to_response();
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        async move { Ok::<_, Infallible>(resp) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(client), svc);
    let _ = tokio::time::timeout(gw.config.server.header_read_timeout, conn).await;
}

/// What every request of one inspected tunnel shares.
struct Shared {
    gw: Arc<Gateway>,
    lease: Arc<Lease>,
    upstream: Arc<Upstream>,
    target: Target,
    /// The TLS name towards the origin (SNI, else the CONNECT host).
    name: String,
    session: Option<String>,
    /// The connection to the origin; replaced when the origin closed it between requests. hyper
    /// serves a client connection's requests one after another, so this is never contended.
    origin: tokio::sync::Mutex<Option<SendRequest<OutBody>>>,
}

impl Shared {
    async fn exchange(&self, req: Request<Incoming>) -> Response<Body> {
        InterceptStats::bump(&self.gw.intercept.stats.requests);
        match self.forward(req).await {
            Ok(resp) => resp,
            Err(e) => {
                tracing::debug!(error = %e, code = e.code(), "inspected request failed");
                e.to_response()
            }
        }
    }

    async fn forward(&self, req: Request<Incoming>) -> Result<Response<Body>, ProxyError> {
        if req.method() == Method::CONNECT {
            return Err(ProxyError::BadRequest(
                "CONNECT inside an inspected tunnel is not supported",
            ));
        }
        let (mut parts, body) = req.into_parts();
        headers::clean_request(&mut parts.headers);
        if parts.uri.scheme().is_some() {
            // Origin servers expect origin-form; keep the path and query only.
            parts.uri = parts
                .uri
                .path_and_query()
                .map(|pq| pq.as_str())
                .unwrap_or("/")
                .parse()
                .unwrap_or_else(|_| Uri::from_static("/"));
        }
        if !parts.headers.contains_key(header::HOST) {
            if let Ok(v) = HeaderValue::from_str(&self.target.authority()) {
                parts.headers.insert(header::HOST, v);
            }
        }
        let replay = {
            use http_body::Body as _;
            body.is_end_stream().then(|| parts.clone())
        };
        let out = Request::from_parts(
            parts,
            body.map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { e.into() })
                .boxed_unsync(),
        );

        let started = Instant::now();
        let timeout = self.gw.config.server.response_timeout;
        let mut slot = self.origin.lock().await;
        let sent = tokio::time::timeout(timeout, self.send(&mut slot, out, replay)).await;
        drop(slot);
        let resp = match sent {
            Ok(Ok(resp)) => resp,
            Ok(Err(failed)) => {
                self.lease.record(failed.outcome, started.elapsed());
                return Err(failed.error);
            }
            Err(_) => {
                // The connection may still deliver the late answer: it is not reused.
                *self.origin.lock().await = None;
                self.lease.record(Outcome::Timeout, started.elapsed());
                return Err(ProxyError::UpstreamTimeout {
                    upstream: self.upstream.id.clone(),
                });
            }
        };
        let latency = started.elapsed();

        let (mut parts, body) = resp.into_parts();
        if let Err(reason) = framing::check_response(parts.status, &parts.headers) {
            // Inside the origin's TLS the upstream cannot forge an answer: the origin is at
            // fault. Its connection goes with the refused response.
            *self.origin.lock().await = None;
            self.lease.record(Outcome::OriginError, latency);
            return Err(ProxyError::UpstreamBadResponse {
                upstream: self.upstream.id.clone(),
                reason,
            });
        }
        // Inside the origin's TLS the upstream cannot have written the answer: proxy
        // signatures in it are the origin side's.
        let (outcome, sniffer) =
            self.gw
                .captcha
                .classify_head(parts.status, &parts.headers, ResponseFrom::Origin);
        headers::clean_response(&mut parts.headers);
        headers::annotate_response(&mut parts.headers, &self.upstream, self.session.as_deref());
        let exchange = Exchange::new(self.lease.clone(), latency);
        let tap = exchange.tap().cloned();
        let body = crate::proxy::ledger::Metered::new(body, tap, crate::proxy::ledger::Way::Down);
        let body = Observed::new(body, exchange, outcome, sniffer).boxed();
        Ok(Response::from_parts(parts, body))
    }

    /// Sends `req` to the origin. A connection the origin closed between requests is replaced
    /// (a new tunnel through the same upstream, under the same lease); a request that a reused
    /// connection could not deliver is sent once more on a fresh one.
    async fn send(
        &self,
        slot: &mut Option<SendRequest<OutBody>>,
        req: Request<OutBody>,
        replay: Option<http::request::Parts>,
    ) -> Result<Response<Incoming>, Failed> {
        let mut sender = match slot.take() {
            Some(mut s) => match s.ready().await {
                Ok(()) => s,
                // The origin closed it since the last request.
                Err(_) => self.reconnect().await?,
            },
            None => self.reconnect().await?,
        };
        let e = match sender.try_send_request(req).await {
            Ok(resp) => {
                *slot = Some(sender);
                return Ok(resp);
            }
            Err(e) => e,
        };
        let mut e = e;
        let retry = match (e.take_message(), replay) {
            (Some(req), _) => Some(req),
            (None, Some(parts)) => Some(Request::from_parts(parts, body::empty_out())),
            (None, None) => None,
        };
        let protocol = |source| Failed {
            outcome: Outcome::Reset,
            error: ProxyError::UpstreamProtocol {
                upstream: self.upstream.id.clone(),
                source,
            },
        };
        let Some(req) = retry else {
            return Err(protocol(e.into_error()));
        };
        let mut sender = self.reconnect().await?;
        match sender.send_request(req).await {
            Ok(resp) => {
                *slot = Some(sender);
                Ok(resp)
            }
            Err(source) => Err(protocol(source)),
        }
    }

    async fn reconnect(&self) -> Result<SendRequest<OutBody>, Failed> {
        let io = self
            .gw
            .connector
            .tunnel(&self.upstream, &self.target)
            .await
            .map_err(|source| Failed {
                outcome: source.outcome(),
                error: ProxyError::UpstreamConnect {
                    upstream: self.upstream.id.clone(),
                    source,
                },
            })?;
        origin_connect(&self.gw, &self.upstream.id, &self.target, &self.name, io).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{HelloReader, HelloStep};

    fn client_hello(sni: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    /// A hello is read the same in one piece or a byte at a time; anything else is not TLS.
    #[test]
    fn a_hello_is_read_however_it_is_split() {
        let hello = client_hello("example.com");
        let mut whole = HelloReader::default();
        let want = HelloStep::Hello(Some("example.com".to_string()));
        assert_eq!(whole.feed(&hello), want);
        let mut bytewise = HelloReader::default();
        for (i, b) in hello.iter().enumerate() {
            let step = bytewise.feed(std::slice::from_ref(b));
            if i + 1 < hello.len() {
                assert_eq!(step, HelloStep::More, "byte {i}");
            } else {
                assert_eq!(step, want);
            }
        }
        assert_eq!(
            HelloReader::default().feed(b"GET / HTTP/1.1\r\n"),
            HelloStep::NotTls
        );
        // A handshake record that is no hello.
        assert_eq!(
            HelloReader::default().feed(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]),
            HelloStep::NotTls
        );
    }
}
