//! A fake upstream HTTP proxy on 127.0.0.1:0 (hyper 1.x, HTTP/1.1 keep-alive).
//!
//! * absolute-form requests (`GET http://127.0.0.1:P/x`) are forwarded in
//!   origin-form over a fresh hyper client connection, without
//!   `Proxy-Authorization` / `Proxy-Connection`; responses get
//!   `x-fake-proxy: 127.0.0.1:PORT`; with an exit set ([`FakeProxyOpts::exit`]), forwarded
//!   requests carry `x-fake-exit: <exit>`, which the origin's `/exit-ip` answers with (every
//!   fake leaves from 127.0.0.1, so this is how tests give proxies distinct exit addresses);
//! * `CONNECT host:port` answers 200 and tunnels bytes.
//!
//! Targets are resolved first and refused with 403 (outcome
//! [`ProxyOutcome::Refused`]) unless every resolved address is loopback: the
//! fake never dials anything else.
//!
//! In-flight accounting: a request counts from the moment its head was read
//! until its response body was fully sent; a tunnel from CONNECT until close.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::origin::CAPTCHA_HTML;
use super::{
    BoxError, Gauge, GaugeGuard, GuardedBody, MAX_ACCEPTS, TestBody, connect_loopback,
    decode_basic, full_body, header_pairs, resolve_loopback_only,
};

/// How the fake proxy answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward / tunnel normally.
    #[default]
    Normal,
    /// The listener is closed (connection refused) and open connections are dropped.
    RefuseConnections,
    /// 502 with a `Proxy-Status` header to everything (before auth).
    Fail502,
    /// Reads the request head, never answers.
    Stall,
    /// 200 with a reCAPTCHA page to every plain request; CONNECT gets 403 with
    /// `cf-mitigated: challenge` and the same page.
    Captcha,
    /// 502 to everything (before auth) like Squid's own error page: `X-Squid-Error:
    /// ERR_CONNECT_FAIL 111`, `Via: 1.1 fake (squid/5.7)`, `Server: squid/5.7`, no `Proxy-Status`.
    SquidError502,
    /// 503 to everything (before auth) with no sign of whose it is: no `Proxy-Status`, `Via`,
    /// `Server` or `X-Squid-Error`, like most proxies' bare error pages.
    Plain503,
}

/// Options for [`FakeProxy::start`].
#[derive(Clone, Debug, Default)]
pub struct FakeProxyOpts {
    /// Require `Proxy-Authorization: Basic` with these (user, pass), else 407.
    pub credentials: Option<(String, String)>,
    pub mode: ProxyMode,
    /// Sleep this long (tokio time) before forwarding / tunnelling each request.
    pub delay: Option<Duration>,
    /// The exit address this proxy claims: sent as `x-fake-exit` on forwarded requests.
    pub exit: Option<String>,
}

impl FakeProxyOpts {
    /// A normal proxy whose forwarded requests say they leave from `exit`.
    pub fn with_exit(exit: &str) -> Self {
        Self {
            exit: Some(exit.to_string()),
            ..Self::default()
        }
    }
}

impl FakeProxyOpts {
    pub fn with_credentials(user: &str, pass: &str) -> Self {
        Self {
            credentials: Some((user.to_string(), pass.to_string())),
            ..Self::default()
        }
    }
}

/// What became of a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProxyOutcome {
    /// Still being handled.
    Pending,
    /// Forwarded; the origin answered this status.
    Forwarded(u16),
    /// CONNECT answered 200 and tunnelled.
    Tunneled,
    /// Target not loopback (or unresolvable): 403 without dialing.
    Refused,
    /// 407.
    AuthRequired,
    /// The loopback target could not be reached: 502.
    DialFailed,
    /// Malformed request (e.g. origin-form to a proxy): 400.
    BadRequest,
    /// Answered 502 because of [`ProxyMode::Fail502`].
    Failed502,
    /// Never answered ([`ProxyMode::Stall`]).
    Stalled,
    /// Answered with a captcha ([`ProxyMode::Captcha`]).
    Captcha,
    /// Answered an error page of its own with this status ([`ProxyMode::SquidError502`],
    /// [`ProxyMode::Plain503`]).
    OwnError(u16),
}

/// One request head the proxy read.
#[derive(Clone, Debug)]
pub struct SeenRequest {
    pub method: String,
    /// `host:port` for CONNECT, the full absolute URI otherwise.
    pub target: String,
    /// Headers as received (including `Proxy-Authorization`).
    pub headers: Vec<(String, String)>,
    /// Decoded `Proxy-Authorization` (`user:pass`), if present.
    pub auth: Option<String>,
    pub outcome: ProxyOutcome,
}

impl SeenRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

struct ProxyState {
    addr: SocketAddr,
    credentials: Option<(String, String)>,
    mode: Mutex<ProxyMode>,
    delay: Mutex<Option<Duration>>,
    exit: Mutex<Option<String>>,
    gauge: Arc<Gauge>,
    requests: AtomicUsize,
    connects: AtomicUsize,
    accepted: AtomicUsize,
    seen: Mutex<Vec<SeenRequest>>,
}

impl ProxyState {
    fn mode(&self) -> ProxyMode {
        *self.mode.lock().expect("mode")
    }

    fn push_seen(&self, s: SeenRequest) -> usize {
        let mut v = self.seen.lock().expect("seen");
        v.push(s);
        v.len() - 1
    }

    fn set_outcome(&self, idx: usize, o: ProxyOutcome) {
        if let Some(s) = self.seen.lock().expect("seen").get_mut(idx) {
            s.outcome = o;
        }
    }
}

/// One listening period (between `RefuseConnections` phases).
struct Generation {
    token: CancellationToken,
    tracker: TaskTracker,
    accept: JoinHandle<()>,
}

/// A running fake upstream proxy. Dropping it stops everything.
pub struct FakeProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    root: CancellationToken,
    current: tokio::sync::Mutex<Option<Generation>>,
}

impl Drop for FakeProxy {
    fn drop(&mut self) {
        self.root.cancel();
        if let Ok(mut g) = self.current.try_lock() {
            if let Some(g) = g.take() {
                g.accept.abort();
            }
        }
    }
}

impl FakeProxy {
    /// Starts the proxy on 127.0.0.1:0 (if `opts.mode` is `RefuseConnections`
    /// the port is reserved, then closed until the mode changes).
    pub async fn start(opts: FakeProxyOpts) -> FakeProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("proxy local_addr");
        let state = Arc::new(ProxyState {
            addr,
            credentials: opts.credentials.clone(),
            mode: Mutex::new(opts.mode),
            delay: Mutex::new(opts.delay),
            exit: Mutex::new(opts.exit.clone()),
            gauge: Gauge::new(),
            requests: AtomicUsize::new(0),
            connects: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            seen: Mutex::new(Vec::new()),
        });
        let root = CancellationToken::new();
        let current = if opts.mode == ProxyMode::RefuseConnections {
            drop(listener);
            None
        } else {
            Some(spawn_generation(listener, &state, &root))
        };
        FakeProxy {
            addr,
            state,
            root,
            current: tokio::sync::Mutex::new(current),
        }
    }

    /// An address on 127.0.0.1 where nobody listens (connections are refused).
    pub fn dead() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], super::free_port()))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://user:pass@127.0.0.1:PORT` if credentials are configured, else [`FakeProxy::url`].
    pub fn url_with_auth(&self) -> String {
        match &self.state.credentials {
            Some((u, p)) => format!("http://{u}:{p}@{}", self.addr),
            None => self.url(),
        }
    }

    pub fn credentials(&self) -> Option<(String, String)> {
        self.state.credentials.clone()
    }

    pub fn mode(&self) -> ProxyMode {
        self.state.mode()
    }

    /// Switches mode. Returns once it is in effect: after switching to
    /// `RefuseConnections` the port refuses connections and every open
    /// connection / tunnel was closed; after switching away from it the same
    /// port listens again.
    pub async fn set_mode(&self, mode: ProxyMode) {
        let mut cur = self.current.lock().await;
        *self.state.mode.lock().expect("mode") = mode;
        if mode == ProxyMode::RefuseConnections {
            if let Some(g) = cur.take() {
                g.token.cancel();
                g.accept.abort();
                let _ = g.accept.await;
                g.tracker.close();
                let _ = tokio::time::timeout(Duration::from_secs(5), g.tracker.wait()).await;
            }
        } else if cur.is_none() {
            let listener = rebind(self.addr).await;
            *cur = Some(spawn_generation(listener, &self.state, &self.root));
        }
    }

    /// Changes the per-request delay.
    /// Changes the `x-fake-exit` value of later forwarded requests (`None`: no header).
    pub fn set_exit(&self, exit: Option<&str>) {
        *self.state.exit.lock().expect("exit") = exit.map(str::to_string);
    }

    pub fn set_delay(&self, delay: Option<Duration>) {
        *self.state.delay.lock().expect("delay") = delay;
    }

    /// Non-CONNECT request heads read.
    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }

    /// CONNECT request heads read.
    pub fn connects(&self) -> usize {
        self.state.connects.load(Ordering::SeqCst)
    }

    /// TCP connections accepted (over all listening periods).
    pub fn connections(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Every request head read, in order.
    pub fn seen(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().expect("seen").clone()
    }

    /// `(method, target)` of every request head read.
    pub fn targets(&self) -> Vec<(String, String)> {
        self.seen()
            .into_iter()
            .map(|s| (s.method, s.target))
            .collect()
    }

    /// Decoded `Proxy-Authorization` values (`user:pass`) of every request that had one.
    pub fn auth_seen(&self) -> Vec<String> {
        self.seen().into_iter().filter_map(|s| s.auth).collect()
    }

    /// Headers (as received) of every request that was forwarded to an origin.
    pub fn forwarded_headers(&self) -> Vec<Vec<(String, String)>> {
        self.seen()
            .into_iter()
            .filter(|s| matches!(s.outcome, ProxyOutcome::Forwarded(_)))
            .map(|s| s.headers)
            .collect()
    }

    /// Number of requests refused because the target was not loopback.
    pub fn refused(&self) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.outcome == ProxyOutcome::Refused)
            .count()
    }

    pub fn in_flight(&self) -> usize {
        self.state.gauge.current()
    }

    pub fn peak_in_flight(&self) -> usize {
        self.state.gauge.peak()
    }

    pub fn reset_peak(&self) {
        self.state.gauge.reset_peak();
    }

    /// Forgets recorded requests and counters (not the in-flight gauge).
    pub fn clear(&self) {
        self.state.seen.lock().expect("seen").clear();
        self.state.requests.store(0, Ordering::SeqCst);
        self.state.connects.store(0, Ordering::SeqCst);
    }
}

async fn rebind(addr: SocketAddr) -> TcpListener {
    let mut last = None;
    for _ in 0..100 {
        match TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("cannot rebind fake proxy on {addr}: {last:?}");
}

fn spawn_generation(
    listener: TcpListener,
    state: &Arc<ProxyState>,
    root: &CancellationToken,
) -> Generation {
    let token = root.child_token();
    let tracker = TaskTracker::new();
    let accept = tokio::spawn(accept_loop(
        listener,
        Arc::clone(state),
        token.clone(),
        tracker.clone(),
    ));
    Generation {
        token,
        tracker,
        accept,
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<ProxyState>,
    token: CancellationToken,
    tracker: TaskTracker,
) {
    for _ in 0..MAX_ACCEPTS {
        let stream = tokio::select! {
            _ = token.cancelled() => return,
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
            },
        };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        let st = Arc::clone(&state);
        let tok = token.clone();
        let tr = tracker.clone();
        tracker.spawn(async move {
            let svc = {
                let tok = tok.clone();
                service_fn(move |req| handle(req, Arc::clone(&st), tok.clone(), tr.clone()))
            };
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::select! {
                _ = tok.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

fn respond(
    status: StatusCode,
    body: impl Into<Bytes>,
    headers: &[(&'static str, &str)],
    guard: Option<GaugeGuard>,
) -> Response<GuardedBody> {
    let mut r = Response::new(GuardedBody::new(full_body(body), guard));
    *r.status_mut() = status;
    for (k, v) in headers {
        if let Ok(v) = HeaderValue::from_str(v) {
            r.headers_mut().append(*k, v);
        }
    }
    r
}

async fn handle(
    req: Request<Incoming>,
    st: Arc<ProxyState>,
    token: CancellationToken,
    tracker: TaskTracker,
) -> Result<Response<GuardedBody>, BoxError> {
    let guard = st.gauge.enter();
    let mode = st.mode();
    if mode == ProxyMode::RefuseConnections {
        // Raced with set_mode: drop the connection without answering.
        return Err("fake proxy is refusing connections".into());
    }
    let is_connect = req.method() == Method::CONNECT;
    let target = if is_connect {
        req.uri()
            .authority()
            .map(|a| a.to_string())
            .unwrap_or_else(|| req.uri().to_string())
    } else {
        req.uri().to_string()
    };
    let auth = req
        .headers()
        .get(http::header::PROXY_AUTHORIZATION)
        .map(|v| decode_basic(&String::from_utf8_lossy(v.as_bytes())));
    if is_connect {
        st.connects.fetch_add(1, Ordering::SeqCst);
    } else {
        st.requests.fetch_add(1, Ordering::SeqCst);
    }
    let idx = st.push_seen(SeenRequest {
        method: req.method().to_string(),
        target,
        headers: header_pairs(req.headers()),
        auth: auth.clone(),
        outcome: ProxyOutcome::Pending,
    });

    match mode {
        ProxyMode::Stall => {
            st.set_outcome(idx, ProxyOutcome::Stalled);
            token.cancelled().await;
            return Err("stalled".into());
        }
        ProxyMode::Fail502 => {
            st.set_outcome(idx, ProxyOutcome::Failed502);
            return Ok(respond(
                StatusCode::BAD_GATEWAY,
                "fake proxy: bad gateway",
                &[("proxy-status", "fakeproxy; error=destination_unavailable")],
                Some(guard),
            ));
        }
        ProxyMode::Captcha => {
            st.set_outcome(idx, ProxyOutcome::Captcha);
            let status = if is_connect {
                StatusCode::FORBIDDEN
            } else {
                StatusCode::OK
            };
            let extra: &[(&'static str, &str)] = if is_connect {
                &[
                    ("content-type", "text/html; charset=utf-8"),
                    ("cf-mitigated", "challenge"),
                ]
            } else {
                &[("content-type", "text/html; charset=utf-8")]
            };
            return Ok(respond(status, CAPTCHA_HTML, extra, Some(guard)));
        }
        ProxyMode::SquidError502 => {
            st.set_outcome(idx, ProxyOutcome::OwnError(502));
            return Ok(respond(
                StatusCode::BAD_GATEWAY,
                "<html><body>ERROR: The requested URL could not be retrieved</body></html>",
                &[
                    ("server", "squid/5.7"),
                    ("x-squid-error", "ERR_CONNECT_FAIL 111"),
                    ("via", "1.1 fake (squid/5.7)"),
                    ("content-type", "text/html;charset=utf-8"),
                ],
                Some(guard),
            ));
        }
        ProxyMode::Plain503 => {
            st.set_outcome(idx, ProxyOutcome::OwnError(503));
            return Ok(respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "<html><body>503 Service Unavailable</body></html>",
                &[("content-type", "text/html")],
                Some(guard),
            ));
        }
        ProxyMode::Normal | ProxyMode::RefuseConnections => {}
    }

    if let Some((u, p)) = &st.credentials {
        let want = format!("{u}:{p}");
        if auth.as_deref() != Some(want.as_str()) {
            st.set_outcome(idx, ProxyOutcome::AuthRequired);
            return Ok(respond(
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                "proxy authentication required",
                &[("proxy-authenticate", "Basic realm=\"fakeproxy\"")],
                Some(guard),
            ));
        }
    }

    let delay = *st.delay.lock().expect("delay");
    if let Some(d) = delay {
        tokio::time::sleep(d).await;
    }

    if is_connect {
        Ok(tunnel(req, st, idx, guard, token, tracker).await)
    } else {
        Ok(forward(req, st, idx, guard, token, tracker).await)
    }
}

/// Resolves and dials `host:port`, loopback only. `Err(response)` on refusal / failure.
async fn dial(
    st: &ProxyState,
    idx: usize,
    host: &str,
    port: u16,
    guard: &mut Option<GaugeGuard>,
) -> Result<TcpStream, Response<GuardedBody>> {
    let addrs = match resolve_loopback_only(host, port).await {
        Ok(a) => a,
        Err(why) => {
            st.set_outcome(idx, ProxyOutcome::Refused);
            return Err(respond(
                StatusCode::FORBIDDEN,
                format!("fake proxy: target not allowed: {why}"),
                &[("proxy-status", "fakeproxy; error=destination_ip_prohibited")],
                guard.take(),
            ));
        }
    };
    match connect_loopback(&addrs).await {
        Ok(s) => Ok(s),
        Err(e) => {
            st.set_outcome(idx, ProxyOutcome::DialFailed);
            Err(respond(
                StatusCode::BAD_GATEWAY,
                format!("fake proxy: cannot reach {host}:{port}: {e}"),
                &[("proxy-status", "fakeproxy; error=connection_refused")],
                guard.take(),
            ))
        }
    }
}

async fn tunnel(
    req: Request<Incoming>,
    st: Arc<ProxyState>,
    idx: usize,
    guard: GaugeGuard,
    token: CancellationToken,
    tracker: TaskTracker,
) -> Response<GuardedBody> {
    let mut guard = Some(guard);
    let Some((host, port)) = req
        .uri()
        .authority()
        .and_then(|a| a.port_u16().map(|p| (a.host().to_string(), p)))
    else {
        st.set_outcome(idx, ProxyOutcome::BadRequest);
        return respond(
            StatusCode::BAD_REQUEST,
            "CONNECT needs host:port",
            &[],
            guard.take(),
        );
    };
    let mut upstream = match dial(&st, idx, &host, port, &mut guard).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    st.set_outcome(idx, ProxyOutcome::Tunneled);
    let tunnel_guard = guard.take();
    tracker.spawn(async move {
        let _in_flight = tunnel_guard;
        let pump = async move {
            if let Ok(upgraded) = hyper::upgrade::on(req).await {
                let mut client = TokioIo::new(upgraded);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            }
        };
        tokio::select! {
            _ = token.cancelled() => {}
            _ = pump => {}
        }
    });
    respond(StatusCode::OK, Bytes::new(), &[], None)
}

/// Hop-by-hop / proxy-only headers not forwarded to the origin.
const STRIP: &[&str] = &[
    "proxy-authorization",
    "proxy-connection",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

async fn forward(
    req: Request<Incoming>,
    st: Arc<ProxyState>,
    idx: usize,
    guard: GaugeGuard,
    token: CancellationToken,
    tracker: TaskTracker,
) -> Response<GuardedBody> {
    let mut guard = Some(guard);
    let uri = req.uri().clone();
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
        st.set_outcome(idx, ProxyOutcome::BadRequest);
        return respond(
            StatusCode::BAD_REQUEST,
            "fake proxy: absolute-form http:// URI required",
            &[],
            guard.take(),
        );
    };
    let host = authority.host().to_string();
    let port = authority.port_u16().unwrap_or(80);
    let host_header = authority.to_string();
    let stream = match dial(&st, idx, &host, port, &mut guard).await {
        Ok(s) => s,
        Err(resp) => return resp,
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => {
            st.set_outcome(idx, ProxyOutcome::DialFailed);
            return respond(
                StatusCode::BAD_GATEWAY,
                format!("fake proxy: handshake failed: {e}"),
                &[("proxy-status", "fakeproxy; error=http_protocol_error")],
                guard.take(),
            );
        }
    };
    let conn_token = token.clone();
    tracker.spawn(async move {
        tokio::select! {
            _ = conn_token.cancelled() => {}
            _ = conn => {}
        }
    });

    let (mut parts, body) = req.into_parts();
    let pq = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".to_string());
    parts.uri = match pq.parse() {
        Ok(u) => u,
        Err(_) => {
            st.set_outcome(idx, ProxyOutcome::BadRequest);
            return respond(StatusCode::BAD_REQUEST, "bad path", &[], guard.take());
        }
    };
    for h in STRIP {
        parts.headers.remove(*h);
    }
    if !parts.headers.contains_key(http::header::HOST) {
        if let Ok(v) = HeaderValue::from_str(&host_header) {
            parts.headers.insert(http::header::HOST, v);
        }
    }
    let exit = st.exit.lock().expect("exit").clone();
    if let Some(v) = exit.and_then(|e| HeaderValue::from_str(&e).ok()) {
        parts.headers.insert("x-fake-exit", v);
    }
    parts.version = http::Version::HTTP_11;
    let resp = match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(r) => r,
        Err(e) => {
            st.set_outcome(idx, ProxyOutcome::DialFailed);
            return respond(
                StatusCode::BAD_GATEWAY,
                format!("fake proxy: origin failed: {e}"),
                &[("proxy-status", "fakeproxy; error=http_protocol_error")],
                guard.take(),
            );
        }
    };
    st.set_outcome(idx, ProxyOutcome::Forwarded(resp.status().as_u16()));
    let (mut rparts, rbody) = resp.into_parts();
    for h in ["connection", "keep-alive", "proxy-connection"] {
        rparts.headers.remove(h);
    }
    if let Ok(v) = HeaderValue::from_str(&st.addr.to_string()) {
        rparts.headers.insert("x-fake-proxy", v);
    }
    let body: TestBody = rbody.map_err(|e| -> BoxError { Box::new(e) }).boxed();
    Response::from_parts(rparts, GuardedBody::new(body, guard.take()))
}
