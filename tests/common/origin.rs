//! A fake origin web server (hyper 1.x, HTTP/1.1) on 127.0.0.1:0, plain or
//! TLS (certificate from a [`TestCa`]).
//!
//! Routes (any method):
//! * `/slow?ms=N` — waits N ms (tokio sleep, so paused clocks work), then 200 `slow`.
//! * `/bytes?n=N[&chunk=K][&delay_ms=D]` — 200 with N bytes ([`pattern_bytes`])
//!   streamed in chunks of K bytes (default 16 KiB), D ms before each chunk.
//! * `/status?code=N` — answers status N (200..=599) with body `status N`.
//! * `/captcha` — 200, HTML containing `<div class="g-recaptcha" ...>`.
//! * `/cf-challenge` — 403 with `cf-mitigated: challenge`, Cloudflare-like HTML.
//! * `/ok` — 200 `ok`.
//! * anything else — 200 JSON echo `{"method","path","uri","query","headers":[[k,v]..],"body_len"}`
//!   (or [`OriginBehaviour::body`] if set).
//!
//! Every response carries `x-origin: 127.0.0.1:PORT`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::tls::TestCa;
use super::{BoxError, Gauge, GuardedBody, MAX_ACCEPTS, TestBody, full_body, header_pairs};

/// Longest `/slow` delay honoured (ms).
const MAX_SLOW_MS: u64 = 120_000;
/// Largest `/bytes` body (bytes).
const MAX_BYTES: usize = 256 * 1024 * 1024;

/// How the origin behaves beyond its fixed routes.
#[derive(Clone, Debug, Default)]
pub struct OriginBehaviour {
    /// Delay before answering every request (in addition to `/slow`).
    pub delay: Option<Duration>,
    /// If set, the catch-all route answers 200 with this body instead of the JSON echo.
    pub body: Option<String>,
    /// Answer with `Connection: close` (no keep-alive).
    pub close: bool,
}

impl OriginBehaviour {
    /// Default: JSON echo on the catch-all route, keep-alive, no delay.
    pub fn echo() -> Self {
        Self::default()
    }

    /// Catch-all route answers 200 with `body`.
    pub fn fixed(body: &str) -> Self {
        Self {
            body: Some(body.to_string()),
            ..Self::default()
        }
    }

    /// Every request is delayed by `d`.
    pub fn delayed(d: Duration) -> Self {
        Self {
            delay: Some(d),
            ..Self::default()
        }
    }
}

/// One request as the origin saw it.
#[derive(Clone, Debug)]
pub struct RecordedRequest {
    pub method: String,
    /// The request target as received (origin-form, e.g. `/a?b=c`).
    pub uri: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body_len: usize,
}

impl RecordedRequest {
    /// First value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn has_header(&self, name: &str) -> bool {
        self.header(name).is_some()
    }
}

struct OriginState {
    addr: SocketAddr,
    behaviour: Mutex<OriginBehaviour>,
    log: Mutex<Vec<RecordedRequest>>,
    gauge: Arc<Gauge>,
    connections: AtomicUsize,
}

/// A running fake origin. Dropping it stops the server and closes its connections.
pub struct Origin {
    addr: SocketAddr,
    tls: bool,
    state: Arc<OriginState>,
    cancel: CancellationToken,
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl Origin {
    /// Plain HTTP origin on 127.0.0.1:0.
    pub async fn start(behaviour: OriginBehaviour) -> Origin {
        Self::start_inner(behaviour, None).await
    }

    /// HTTPS origin on 127.0.0.1:0 with a certificate for `localhost` and
    /// `127.0.0.1` signed by `ca`.
    pub async fn start_tls(behaviour: OriginBehaviour, ca: &TestCa) -> Origin {
        let acceptor = ca.acceptor(&["localhost", "127.0.0.1"]);
        Self::start_inner(behaviour, Some(acceptor)).await
    }

    /// Plain HTTP origin on a given loopback port (one a test reserved, e.g. to bring a service
    /// back where clients expect it).
    pub async fn start_on(port: u16, behaviour: OriginBehaviour) -> Origin {
        Self::start_at(behaviour, None, port).await
    }

    async fn start_inner(
        behaviour: OriginBehaviour,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Origin {
        Self::start_at(behaviour, tls, 0).await
    }

    async fn start_at(
        behaviour: OriginBehaviour,
        tls: Option<tokio_rustls::TlsAcceptor>,
        port: u16,
    ) -> Origin {
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind origin on loopback");
        let addr = listener.local_addr().expect("origin local_addr");
        let state = Arc::new(OriginState {
            addr,
            behaviour: Mutex::new(behaviour),
            log: Mutex::new(Vec::new()),
            gauge: Gauge::new(),
            connections: AtomicUsize::new(0),
        });
        let cancel = CancellationToken::new();
        let is_tls = tls.is_some();
        tokio::spawn(accept_loop(
            listener,
            Arc::clone(&state),
            tls,
            cancel.clone(),
        ));
        Origin {
            addr,
            tls: is_tls,
            state,
            cancel,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// `127.0.0.1:PORT`
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:PORT/path` (`https://` for a TLS origin). A missing
    /// leading `/` is added.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let slash = if path.starts_with('/') { "" } else { "/" };
        format!("{scheme}://{}{slash}{path}", self.addr)
    }

    /// Like [`Origin::url`] but with host `localhost`.
    pub fn url_localhost(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let slash = if path.starts_with('/') { "" } else { "/" };
        format!("{scheme}://localhost:{}{slash}{path}", self.addr.port())
    }

    /// Every request seen so far, in arrival order (recorded once its body was read).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.log.lock().expect("origin log").clone()
    }

    pub fn request_count(&self) -> usize {
        self.state.log.lock().expect("origin log").len()
    }

    pub fn clear_requests(&self) {
        self.state.log.lock().expect("origin log").clear();
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Requests currently being handled (until their body was sent).
    pub fn in_flight(&self) -> usize {
        self.state.gauge.current()
    }

    pub fn peak_in_flight(&self) -> usize {
        self.state.gauge.peak()
    }

    pub fn reset_peak(&self) {
        self.state.gauge.reset_peak();
    }

    pub fn set_behaviour(&self, b: OriginBehaviour) {
        *self.state.behaviour.lock().expect("origin behaviour") = b;
    }
}

/// The bytes `/bytes?n=N` sends: byte i is `(i % 251) as u8`.
pub fn pattern_bytes(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i % 251) as u8).collect()
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<OriginState>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    cancel: CancellationToken,
) {
    for _ in 0..MAX_ACCEPTS {
        let stream = tokio::select! {
            _ = cancel.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            },
        };
        state.connections.fetch_add(1, Ordering::SeqCst);
        let st = Arc::clone(&state);
        let tls = tls.clone();
        let c = cancel.clone();
        tokio::spawn(async move {
            let work = async move {
                match tls {
                    Some(acc) => {
                        if let Ok(s) = acc.accept(stream).await {
                            serve_io(s, st).await;
                        }
                    }
                    None => serve_io(stream, st).await,
                }
            };
            tokio::select! {
                _ = c.cancelled() => {}
                _ = work => {}
            }
        });
    }
}

async fn serve_io<I>(io: I, st: Arc<OriginState>)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| handle(req, Arc::clone(&st)));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(io), svc)
        .await;
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('=').or(Some((kv, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<TestBody> {
    let mut r = Response::new(full_body(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain"),
    );
    r
}

fn html(status: StatusCode, body: &'static str) -> Response<TestBody> {
    let mut r = Response::new(full_body(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    r
}

/// Body of `/captcha` (and of the fake proxy's Captcha mode).
pub const CAPTCHA_HTML: &str = "<html><head><title>Verify you are human</title></head><body>\
<form action=\"/verify\"><div class=\"g-recaptcha\" data-sitekey=\"test-site-key\"></div></form>\
</body></html>";

/// Body of `/cf-challenge`.
pub const CF_CHALLENGE_HTML: &str = "<html><head><title>Just a moment...</title></head><body>\
<div id=\"challenge-form\">Checking your browser before accessing.</div></body></html>";

async fn handle(
    req: Request<Incoming>,
    st: Arc<OriginState>,
) -> Result<Response<GuardedBody>, Infallible> {
    let guard = st.gauge.enter();
    let (parts, body) = req.into_parts();
    let body_len = match body.collect().await {
        Ok(c) => c.to_bytes().len(),
        Err(_) => 0,
    };
    let method = parts.method.to_string();
    let uri = parts.uri.to_string();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or("").to_string();
    let headers = header_pairs(&parts.headers);
    st.log.lock().expect("origin log").push(RecordedRequest {
        method: method.clone(),
        uri: uri.clone(),
        path: path.clone(),
        headers: headers.clone(),
        body_len,
    });
    let behaviour = st.behaviour.lock().expect("origin behaviour").clone();
    if let Some(d) = behaviour.delay {
        tokio::time::sleep(d).await;
    }

    let mut resp: Response<TestBody> = match path.as_str() {
        "/slow" => {
            let ms = query_param(&query, "ms")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1000)
                .min(MAX_SLOW_MS);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            text(StatusCode::OK, "slow")
        }
        "/bytes" => {
            let n = query_param(&query, "n")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(1024)
                .min(MAX_BYTES);
            let chunk = query_param(&query, "chunk")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(16 * 1024)
                .clamp(1, 1024 * 1024);
            let delay = query_param(&query, "delay_ms")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| Duration::from_millis(ms.min(MAX_SLOW_MS)));
            let mut r = Response::new(
                PatternBody {
                    sent: 0,
                    total: n,
                    chunk,
                    delay,
                    sleep: None,
                }
                .boxed(),
            );
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r
        }
        "/status" => {
            match query_param(&query, "code")
                .and_then(|v| v.parse::<u16>().ok())
                .filter(|c| (200..=599).contains(c))
                .and_then(|c| StatusCode::from_u16(c).ok())
            {
                Some(code) => text(code, format!("status {}", code.as_u16())),
                None => text(StatusCode::BAD_REQUEST, "bad code"),
            }
        }
        "/captcha" => html(StatusCode::OK, CAPTCHA_HTML),
        "/cf-challenge" => {
            let mut r = html(StatusCode::FORBIDDEN, CF_CHALLENGE_HTML);
            r.headers_mut()
                .insert("cf-mitigated", HeaderValue::from_static("challenge"));
            r.headers_mut()
                .insert(http::header::SERVER, HeaderValue::from_static("cloudflare"));
            r
        }
        "/ok" => text(StatusCode::OK, "ok"),
        // The caller's exit address as a fake proxy claims it (`x-fake-exit`), else the peer's:
        // as text, as `{"ip": …}` for `/exit-ip.json`; `?pad=N` appends N spaces (N ≤ 64 KiB).
        "/exit-ip" | "/exit-ip.json" => {
            let exit = parts
                .headers
                .get("x-fake-exit")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("127.0.0.1")
                .to_string();
            let pad = query_param(&query, "pad")
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0)
                .min(64 * 1024);
            let body = if path == "/exit-ip.json" {
                serde_json::json!({ "ip": exit }).to_string()
            } else {
                exit
            };
            text(StatusCode::OK, format!("{body}{}", " ".repeat(pad)))
        }
        _ => match &behaviour.body {
            Some(b) => text(StatusCode::OK, b.clone()),
            None => {
                let hdrs: Vec<[String; 2]> = headers.into_iter().map(|(k, v)| [k, v]).collect();
                let v = serde_json::json!({
                    "method": method,
                    "path": path,
                    "uri": uri,
                    "query": query,
                    "headers": hdrs,
                    "body_len": body_len,
                });
                let mut r = Response::new(full_body(v.to_string()));
                r.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
        },
    };
    if let Ok(v) = HeaderValue::from_str(&st.addr.to_string()) {
        resp.headers_mut().insert("x-origin", v);
    }
    if behaviour.close {
        resp.headers_mut()
            .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    }
    let (parts, body) = resp.into_parts();
    Ok(Response::from_parts(
        parts,
        GuardedBody::new(body, Some(guard)),
    ))
}

/// Streams `total` pattern bytes in `chunk`-sized frames, optionally waiting
/// `delay` before each frame.
struct PatternBody {
    sent: usize,
    total: usize,
    chunk: usize,
    delay: Option<Duration>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.sent >= this.total {
            return Poll::Ready(None);
        }
        if let Some(d) = this.delay {
            let s = this
                .sleep
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(d)));
            ready!(s.as_mut().poll(cx));
            this.sleep = None;
        }
        let n = this.chunk.min(this.total - this.sent);
        let start = this.sent;
        let data: Vec<u8> = (start..start + n).map(|i| (i % 251) as u8).collect();
        this.sent += n;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(data)))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent >= self.total
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact((self.total - self.sent) as u64)
    }
}
