//! The processes `bench/soak.sh` runs poolgate with for a soak under chaos, and its report.
//!
//! One program, one subcommand per role, everything on 127.0.0.1 only:
//!
//! - `origin`: an HTTP origin: `/1k` answers 1 KiB, `/big` answers `--big-kib` KiB (for slow
//!   readers), anything else 1 KiB too.
//! - `upstream --listen ADDR`: one fake upstream HTTP proxy (absolute-form forwarding and
//!   CONNECT). It dials loopback IP literals and `localhost` only (403 for anything else). It
//!   counts its exchanges in flight (a forwarded request from its head to the last frame of its
//!   response, a tunnel from its CONNECT to the first end of either side) and appends a line to
//!   `--events` each time that count reaches a new peak or exceeds `--cap`. While the file
//!   `--captcha-flag` exists it answers every forwarded request with a captcha page. One process
//!   per upstream, so that the chaos loop can kill one and start it again on the same port.
//! - `load`: the mixed load: plain HTTP, sticky sessions (`X-Pool-Session` and the proxy username
//!   `soak-session-<key>`), CONNECT tunnels opened and closed, a second pool fed by an upstream
//!   list, slow clients (a request head trickled in, a large body read slowly), and direct fetches
//!   of the origin for the latency baseline. Each request ends in exactly one outcome; the JSON
//!   summary counts them and says which ones the docs promise for the faults the chaos loop made.
//! - `report`: turns the load summary, the process samples, the final `/status` documents and
//!   the fakes' events into the result table.
//! - `free-ports`: prints loopback ports that were free a moment ago.
//!
//! Servers print `name=127.0.0.1:PORT` lines and then `ready`. Every process exits by itself after
//! `--max-lifetime` (default 1h).
//!
//! Try it by hand (`bench/soak.sh --short` does all of this):
//!
//! ```text
//! cargo build --profile fixture --example soak
//! target/fixture/examples/soak origin                                   # origin=…
//! target/fixture/examples/soak upstream --listen 127.0.0.1:0 --cap 4    # upstream=…
//! curl -x http://127.0.0.1:UPSTREAM_PORT http://127.0.0.1:ORIGIN_PORT/1k | wc -c   # 1024
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::error::Error;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http::header::{HOST, HeaderValue, PROXY_AUTHORIZATION};
use http::{Method, Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout};

type BoxError = Box<dyn Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// The origin's small response body.
static BODY_1K: [u8; 1024] = [b'x'; 1024];
/// The page a fake upstream answers while its captcha flag is up (reCAPTCHA's marker, and
/// Cloudflare's challenge header on the response).
const CAPTCHA_PAGE: &str =
    "<html><body><div class=\"g-recaptcha\" data-sitekey=\"soak\"></div></body></html>\n";
/// Connecting or one step of a fake's forwarding may take this long.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// A tunnel through a fake upstream lives at most this long.
const MAX_TUNNEL_LIFE: Duration = Duration::from_secs(120);
/// Pause after an accept error (such as running out of file descriptors).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Largest response head the load accepts.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// A request of the load that has no complete answer after this long is a hang.
const HANG_TIMEOUT: Duration = Duration::from_secs(30);
/// Lines a fake upstream writes to its events file at most.
const MAX_EVENT_LINES: u64 = 10_000;
/// A truncation or a bad response within this long of an upstream's kill is blamed on it.
const KILL_BLAME_MS: u64 = 2_000;
/// After Redis is back, leases granted by the instances' local views may still be live (the
/// slowest request of the load takes a few seconds): cap excesses are blamed on the outage this
/// long after its end.
const OUTAGE_GRACE_MS: u64 = 15_000;

#[derive(Parser)]
#[command(about = "Origin, fake upstreams, load and report for bench/soak.sh")]
struct Cli {
    /// Exit after this long whatever happens, so a forgotten process never lingers.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "1h")]
    max_lifetime: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// HTTP origin: /1k and /big.
    Origin {
        #[arg(long, default_value_t = 1024)]
        big_kib: usize,
    },
    /// One fake upstream HTTP proxy.
    Upstream {
        /// Loopback address to listen on (port 0: the kernel's choice).
        #[arg(long)]
        listen: SocketAddr,
        /// Exchanges in flight beyond this are recorded as cap violations (0: no cap).
        #[arg(long, default_value_t = 0)]
        cap: usize,
        /// Peaks and cap violations are appended here, one line each.
        #[arg(long)]
        events: Option<PathBuf>,
        /// While this file exists, forwarded requests get a captcha page.
        #[arg(long)]
        captcha_flag: Option<PathBuf>,
    },
    /// The mixed load; prints progress on stderr and writes its summary to --out.
    Load(LoadArgs),
    /// Prints the result table from the files `bench/soak.sh` gathered.
    Report(ReportArgs),
    /// Prints COUNT distinct loopback ports that were free when asked.
    FreePorts {
        #[arg(long, default_value_t = 1)]
        count: usize,
    },
}

#[derive(clap::Args, Clone)]
struct LoadArgs {
    /// The gateways' proxy ports (requests alternate between them).
    #[arg(long, required = true)]
    proxy: Vec<SocketAddr>,
    #[arg(long)]
    origin: SocketAddr,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    duration: Duration,
    /// Latencies of requests that start before this are left out.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    warmup: Duration,
    /// The chaos loop's log (`<epoch ms> <event> [<arg>]` lines), read at the end to tell the
    /// errors a fault explains from the others.
    #[arg(long)]
    chaos_log: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// The pool fed by an upstream list (`X-Pool-Name`).
    #[arg(long, default_value = "listed")]
    listed_pool: String,
    /// Pause between two requests of one worker.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20ms")]
    pause: Duration,
    #[arg(long, default_value_t = 10)]
    plain: usize,
    #[arg(long, default_value_t = 4)]
    sticky: usize,
    #[arg(long, default_value_t = 3)]
    tunnel: usize,
    #[arg(long, default_value_t = 2)]
    listed: usize,
    #[arg(long, default_value_t = 1)]
    slow_head: usize,
    #[arg(long, default_value_t = 2)]
    slow_read: usize,
    #[arg(long, default_value_t = 2)]
    direct: usize,
}

#[derive(clap::Args)]
struct ReportArgs {
    #[arg(long)]
    load: PathBuf,
    /// Lines `<seconds since start> <instance> <rss KiB> <open fds>`.
    #[arg(long)]
    samples: PathBuf,
    /// The instances' final `/status` documents.
    #[arg(long)]
    status: Vec<PathBuf>,
    /// Fake upstreams' events files.
    #[arg(long)]
    events: Vec<PathBuf>,
    #[arg(long)]
    chaos_log: PathBuf,
    /// `name=value` counts of lease records left in Redis.
    #[arg(long)]
    redis_leases: Vec<String>,
    /// Seconds of warm-up before the start sample.
    #[arg(long)]
    warmup_s: u64,
    /// Seconds the load ran.
    #[arg(long)]
    duration_s: u64,
    /// The cap of the capped pool's fake upstreams.
    #[arg(long)]
    cap: usize,
    /// Lines `<epoch ms> degraded|ok <instance>`: when each instance switched to its local view
    /// and back, from its log.
    #[arg(long)]
    degraded: Option<PathBuf>,
    /// The upstream that answered captchas for a while (its quarantines are shown).
    #[arg(long)]
    captcha_upstream: Option<String>,
    /// Lines printed under the table.
    #[arg(long)]
    meta: Vec<String>,
}

fn main() -> Result<(), BoxError> {
    let cli = Cli::parse();
    match cli.command {
        Command::FreePorts { count } => return free_ports(count),
        Command::Report(args) => return report(&args),
        _ => {}
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .build()?;
    let lifetime = cli.max_lifetime;
    rt.block_on(async move {
        let work = async move {
            match cli.command {
                Command::Origin { big_kib } => origin(big_kib).await,
                Command::Upstream {
                    listen,
                    cap,
                    events,
                    captcha_flag,
                } => upstream(listen, cap, events, captcha_flag).await,
                Command::Load(args) => load(args).await,
                Command::FreePorts { .. } | Command::Report(_) => Ok(()),
            }
        };
        match timeout(lifetime, work).await {
            Ok(r) => r,
            Err(_) => Err("max lifetime reached".into()),
        }
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn free_ports(count: usize) -> Result<(), BoxError> {
    let listeners: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<_, _>>()?;
    for l in &listeners {
        println!("{}", l.local_addr()?.port());
    }
    Ok(())
}

/// Accepts until the process ends, one task per connection, with Nagle off.
async fn accept_loop<F, Fut>(listener: TcpListener, serve: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                let _ = s.set_nodelay(true);
                tokio::spawn(serve(s));
            }
            Err(_) => sleep(ACCEPT_ERROR_PAUSE).await,
        }
    }
}

// ---------------------------------------------------------------------------
// Origin
// ---------------------------------------------------------------------------

async fn origin(big_kib: usize) -> Result<(), BoxError> {
    let http = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
    println!("origin={}", http.local_addr()?);
    println!("ready");
    let big = Bytes::from(vec![b'y'; big_kib * 1024]);
    accept_loop(http, move |s| {
        let big = big.clone();
        async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let body = if req.uri().path() == "/big" {
                    big.clone()
                } else {
                    Bytes::from_static(&BODY_1K)
                };
                async move {
                    let mut resp = Response::new(Full::new(body));
                    resp.headers_mut()
                        .insert("content-type", HeaderValue::from_static("text/plain"));
                    Ok::<_, Infallible>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(s), svc)
                .await;
        }
    })
    .await;
    Ok(())
}

// ---------------------------------------------------------------------------
// Fake upstream proxy with an exchange gauge
// ---------------------------------------------------------------------------

/// Exchanges in flight through one fake upstream, its peak, and where excesses are written.
struct Gauge {
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    cap: usize,
    lines: AtomicU64,
    events: Option<StdMutex<std::fs::File>>,
    listen: SocketAddr,
}

impl Gauge {
    fn enter(self: &Arc<Self>) -> Slot {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        if self.peak.fetch_max(now, Ordering::SeqCst) < now {
            self.write(&format!("{} peak {} {now}", now_ms(), self.listen));
        }
        if self.cap > 0 && now > self.cap {
            self.write(&format!(
                "{} over {} {now} cap {}",
                now_ms(),
                self.listen,
                self.cap
            ));
        }
        Slot {
            gauge: self.clone(),
            done: AtomicBool::new(false),
        }
    }

    fn write(&self, line: &str) {
        let Some(file) = &self.events else { return };
        if self.lines.fetch_add(1, Ordering::Relaxed) >= MAX_EVENT_LINES {
            return;
        }
        if let Ok(mut f) = file.lock() {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// One exchange counted in a [`Gauge`]; it leaves the count once, at [`Slot::end`] or drop.
struct Slot {
    gauge: Arc<Gauge>,
    done: AtomicBool,
}

impl Slot {
    fn end(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.gauge.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.end();
    }
}

pin_project_lite::pin_project! {
    /// A response body that ends its exchange's slot when it hands out its last frame, before
    /// hyper writes that frame: the gateway can only see the end after the count went down.
    struct Counted<B> {
        #[pin]
        inner: B,
        slot: Slot,
    }
}

impl<B: Body> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let r = this.inner.as_mut().poll_frame(cx);
        match &r {
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.slot.end(),
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.slot.end(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

async fn upstream(
    listen: SocketAddr,
    cap: usize,
    events: Option<PathBuf>,
    captcha_flag: Option<PathBuf>,
) -> Result<(), BoxError> {
    if !listen.ip().is_loopback() {
        return Err("the fake upstream listens on loopback only".into());
    }
    let l = TcpListener::bind(listen).await?;
    let listen = l.local_addr()?;
    let events = match events {
        Some(p) => Some(StdMutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)?,
        )),
        None => None,
    };
    let gauge = Arc::new(Gauge {
        in_flight: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        cap,
        lines: AtomicU64::new(0),
        events,
        listen,
    });
    let captcha_flag = Arc::new(captcha_flag);
    println!("upstream={listen}");
    println!("ready");
    accept_loop(l, move |s| {
        let gauge = gauge.clone();
        let captcha_flag = captcha_flag.clone();
        async move { serve_proxy_conn(s, gauge, captcha_flag).await }
    })
    .await;
    Ok(())
}

/// The origin connection a client connection forwards over (requests on one HTTP/1 connection
/// come one after another).
struct OriginConn {
    addr: SocketAddr,
    sender: SendRequest<Incoming>,
}

async fn serve_proxy_conn(s: TcpStream, gauge: Arc<Gauge>, captcha_flag: Arc<Option<PathBuf>>) {
    let origin: Arc<Mutex<Option<OriginConn>>> = Arc::new(Mutex::new(None));
    let svc = service_fn(move |req| {
        let origin = origin.clone();
        let slot = gauge.enter();
        let captcha = captcha_flag.as_ref().as_ref().is_some_and(|p| p.exists());
        async move { Ok::<_, Infallible>(proxy_request(req, origin, slot, captcha).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(s), svc)
        .with_upgrades()
        .await;
}

/// The target as a loopback socket address: an IP literal that is loopback, or `localhost`.
/// Every other name and address is refused, so the fakes can never reach beyond this machine.
fn loopback_target(host: &str, port: u16) -> Option<SocketAddr> {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = if h.eq_ignore_ascii_case("localhost") {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        h.parse().ok()?
    };
    ip.is_loopback().then_some(SocketAddr::new(ip, port))
}

fn status_only(status: StatusCode, slot: Slot) -> Response<ProxyBody> {
    slot.end();
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = status;
    resp
}

async fn proxy_request(
    req: Request<Incoming>,
    origin: Arc<Mutex<Option<OriginConn>>>,
    slot: Slot,
    captcha: bool,
) -> Response<ProxyBody> {
    if req.method() == Method::CONNECT {
        return proxy_connect(req, slot).await;
    }
    let Some(authority) = req.uri().authority().cloned() else {
        return status_only(StatusCode::BAD_REQUEST, slot);
    };
    if req.uri().scheme_str() != Some("http") {
        return status_only(StatusCode::BAD_REQUEST, slot);
    }
    let Some(addr) = loopback_target(authority.host(), authority.port_u16().unwrap_or(80)) else {
        return status_only(StatusCode::FORBIDDEN, slot);
    };
    if captcha {
        let body = Counted {
            inner: Full::new(Bytes::from_static(CAPTCHA_PAGE.as_bytes()))
                .map_err(|never| match never {}),
            slot,
        };
        let mut resp = Response::new(body.boxed());
        resp.headers_mut()
            .insert("content-type", HeaderValue::from_static("text/html"));
        resp.headers_mut()
            .insert("cf-mitigated", HeaderValue::from_static("challenge"));
        return resp;
    }
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_owned();
    parts.uri = match path.parse() {
        Ok(u) => u,
        Err(_) => return status_only(StatusCode::BAD_REQUEST, slot),
    };
    parts.version = Version::HTTP_11;
    parts.headers.remove(PROXY_AUTHORIZATION);
    parts.headers.remove("proxy-connection");
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        parts.headers.insert(HOST, host);
    }
    let req = Request::from_parts(parts, body);

    let mut conn = origin.lock().await;
    let mut reusable = false;
    if let Some(c) = conn.as_mut() {
        reusable = c.addr == addr && !c.sender.is_closed() && c.sender.ready().await.is_ok();
    }
    if !reusable {
        match dial_origin(addr).await {
            Ok(c) => *conn = Some(c),
            Err(_) => return status_only(StatusCode::BAD_GATEWAY, slot),
        }
    }
    let Some(c) = conn.as_mut() else {
        return status_only(StatusCode::BAD_GATEWAY, slot);
    };
    match timeout(STEP_TIMEOUT, c.sender.send_request(req)).await {
        Ok(Ok(resp)) => resp.map(|b| Counted { inner: b, slot }.boxed()),
        _ => {
            *conn = None;
            status_only(StatusCode::BAD_GATEWAY, slot)
        }
    }
}

async fn dial_origin(addr: SocketAddr) -> Result<OriginConn, BoxError> {
    let tcp = timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await??;
    tcp.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(OriginConn { addr, sender })
}

/// Dials first (a failure is a 502), answers 200, then carries the tunnel.
async fn proxy_connect(req: Request<Incoming>, slot: Slot) -> Response<ProxyBody> {
    let Some(authority) = req.uri().authority().cloned() else {
        return status_only(StatusCode::BAD_REQUEST, slot);
    };
    let Some(port) = authority.port_u16() else {
        return status_only(StatusCode::BAD_REQUEST, slot);
    };
    let Some(addr) = loopback_target(authority.host(), port) else {
        return status_only(StatusCode::FORBIDDEN, slot);
    };
    let target = match timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        _ => return status_only(StatusCode::BAD_GATEWAY, slot),
    };
    let _ = target.set_nodelay(true);
    tokio::spawn(async move {
        if let Ok(upgraded) = hyper::upgrade::on(req).await {
            let client = TokioIo::new(upgraded);
            let _ = timeout(MAX_TUNNEL_LIFE, carry(client, target, &slot)).await;
        }
        slot.end();
    });
    let mut resp = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *resp.status_mut() = StatusCode::OK;
    resp
}

/// Copies `r` into `w` until either fails or `r` ends (then half-closes `w`), ending `slot` first.
async fn one_way<R, W>(mut r: R, mut w: W, slot: &Slot)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(n) if n > 0 => {
                if w.write_all(&buf[..n]).await.is_err() {
                    slot.end();
                    return;
                }
            }
            _ => {
                slot.end();
                let _ = w.shutdown().await;
                return;
            }
        }
    }
}

/// Copies both ways; the first end of either side (EOF or error) ends the exchange's slot before
/// it is passed on, so the gateway sees the tunnel end only after the count went down.
async fn carry<C>(client: C, target: TcpStream, slot: &Slot)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let (cr, cw) = tokio::io::split(client);
    let (tr, tw) = target.into_split();
    tokio::join!(one_way(cr, tw, slot), one_way(tr, cw, slot));
}

// ---------------------------------------------------------------------------
// Load: a minimal HTTP/1.1 client that tells every way an exchange can end
// ---------------------------------------------------------------------------

/// What the client got for one request.
#[derive(Debug)]
enum Got {
    /// A complete response.
    Response(Answer),
    /// The gateway refused the TCP connection.
    Refused,
    /// The connection ended (EOF or reset) before any byte of a response head.
    NoResponse { reused: bool, reset: bool },
    /// A response head arrived but its body (or a tunnel's inner response) broke off.
    Truncated {
        status: u16,
        upstream: Option<String>,
    },
    /// Not a parseable HTTP response.
    Malformed(String),
    /// No complete answer within [`HANG_TIMEOUT`].
    Hang,
}

#[derive(Debug)]
struct Answer {
    status: u16,
    error: Option<String>,
    upstream: Option<String>,
    body_len: usize,
    captcha: bool,
    close: bool,
}

/// A parsed response head.
struct Head {
    status: u16,
    len: usize,
    content_length: Option<usize>,
    chunked: bool,
    close: bool,
    error: Option<String>,
    upstream: Option<String>,
    captcha_header: bool,
}

fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 48];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => {
            let mut head = Head {
                status: resp.code.unwrap_or(0),
                len,
                content_length: None,
                chunked: false,
                close: resp.version == Some(0),
                error: None,
                upstream: None,
                captcha_header: false,
            };
            for h in resp.headers.iter() {
                let v = String::from_utf8_lossy(h.value).trim().to_string();
                let n = h.name.to_ascii_lowercase();
                match n.as_str() {
                    "content-length" => head.content_length = v.parse().ok(),
                    "transfer-encoding" => head.chunked = v.eq_ignore_ascii_case("chunked"),
                    "connection" | "proxy-connection" => {
                        head.close |= v.eq_ignore_ascii_case("close")
                    }
                    "x-pool-error" => head.error = Some(v),
                    "x-pool-upstream" => head.upstream = Some(v),
                    "cf-mitigated" => head.captcha_header = true,
                    _ => {}
                }
            }
            Ok(Some(head))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(e) => Err(format!("bad response head: {e}")),
    }
}

/// Reads from `s` into `buf`; `Ok(0)` at EOF. A reset is an error.
async fn fill(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = s.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn is_reset(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::ConnectionAborted
    )
}

/// How a response body is read.
#[derive(Clone, Copy)]
enum Reading {
    /// As fast as it comes.
    Fast,
    /// `bytes` at a time with a pause after each: a slow reader.
    Slow { bytes: usize, pause: Duration },
}

/// Reads one response (head and body) from `s`. `buf` may already hold bytes of it.
async fn read_response(
    s: &mut TcpStream,
    buf: &mut Vec<u8>,
    reused: bool,
    until_eof: bool,
    reading: Reading,
) -> Got {
    let head = loop {
        match parse_head(buf) {
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) => return Got::Malformed(e),
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Got::Malformed("response head too large".into());
        }
        match fill(s, buf).await {
            Ok(0) if buf.is_empty() => {
                return Got::NoResponse {
                    reused,
                    reset: false,
                };
            }
            Ok(0) => return Got::Malformed("EOF inside a response head".into()),
            Ok(_) => {}
            Err(e) if buf.is_empty() => {
                return Got::NoResponse {
                    reused,
                    reset: is_reset(&e),
                };
            }
            Err(_) => return Got::Malformed("reset inside a response head".into()),
        }
    };
    buf.drain(..head.len);
    let truncated = |head: &Head| Got::Truncated {
        status: head.status,
        upstream: head.upstream.clone(),
    };
    let mut body: Vec<u8> = Vec::new();
    if head.chunked {
        // Chunked: size line, data, CRLF; ends with a zero-size chunk and an empty line.
        loop {
            let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
                match fill(s, buf).await {
                    Ok(n) if n > 0 => continue,
                    _ => return truncated(&head),
                }
            };
            let line = String::from_utf8_lossy(&buf[..eol]).to_string();
            let size_text = line.split(';').next().unwrap_or("").trim();
            let Ok(size) = usize::from_str_radix(size_text, 16) else {
                return Got::Malformed(format!("bad chunk size {line:?}"));
            };
            if size == 0 {
                // Trailers (none expected) and the final CRLF.
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        buf.drain(..end + 4);
                        break;
                    }
                    if buf.len() >= eol + 4 && &buf[eol..eol + 4] == b"\r\n\r\n" {
                        buf.drain(..eol + 4);
                        break;
                    }
                    match fill(s, buf).await {
                        Ok(n) if n > 0 => {}
                        _ => return truncated(&head),
                    }
                }
                break;
            }
            while buf.len() < eol + 2 + size + 2 {
                match fill(s, buf).await {
                    Ok(n) if n > 0 => {}
                    _ => return truncated(&head),
                }
            }
            body.extend_from_slice(&buf[eol + 2..eol + 2 + size]);
            buf.drain(..eol + 2 + size + 2);
        }
    } else if let Some(len) = head.content_length.filter(|_| !until_eof) {
        let mut got = buf.len().min(len);
        body.extend_from_slice(&buf[..got]);
        buf.drain(..got);
        while got < len {
            if let Reading::Slow { bytes, pause } = reading {
                sleep(pause).await;
                let mut chunk = vec![0u8; bytes.min(len - got)];
                match s.read(&mut chunk).await {
                    Ok(n) if n > 0 => {
                        got += n;
                        body.extend_from_slice(&chunk[..n]);
                    }
                    _ => return truncated(&head),
                }
            } else {
                match fill(s, buf).await {
                    Ok(n) if n > 0 => {
                        let take = buf.len().min(len - got);
                        body.extend_from_slice(&buf[..take]);
                        buf.drain(..take);
                        got += take;
                    }
                    _ => return truncated(&head),
                }
            }
        }
    } else {
        // Until EOF (a response framed by close, or a tunnel's inner response).
        body.append(buf);
        loop {
            match fill(s, &mut body).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => return truncated(&head),
            }
        }
        if let Some(len) = head.content_length {
            if body.len() < len {
                return truncated(&head);
            }
        }
    }
    let captcha = head.captcha_header || body.windows(11).any(|w| w == b"g-recaptcha");
    Got::Response(Answer {
        status: head.status,
        error: head.error,
        upstream: head.upstream,
        body_len: body.len(),
        captcha,
        close: head.close,
    })
}

/// The kinds of request the load sends.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Plain,
    StickyHeader,
    StickyUser,
    Tunnel,
    TunnelSticky,
    Listed,
    ListedSticky,
    SlowHead,
    SlowRead,
    Direct,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::StickyHeader => "sticky-header",
            Kind::StickyUser => "sticky-username",
            Kind::Tunnel => "tunnel",
            Kind::TunnelSticky => "tunnel-sticky",
            Kind::Listed => "listed",
            Kind::ListedSticky => "listed-sticky",
            Kind::SlowHead => "slow-head",
            Kind::SlowRead => "slow-read",
            Kind::Direct => "direct",
        }
    }

    fn sticky(self) -> bool {
        matches!(
            self,
            Kind::StickyHeader | Kind::StickyUser | Kind::TunnelSticky | Kind::ListedSticky
        )
    }

    fn listed(self) -> bool {
        matches!(self, Kind::Listed | Kind::ListedSticky)
    }
}

/// One finished request, as the summary needs it.
struct Record {
    kind: Kind,
    start_ms: u64,
    end_ms: u64,
    latency_us: u64,
    got: Got,
    /// The body length a complete answer must have.
    want_len: usize,
    session: Option<String>,
}

/// What the load collects; shared by its workers.
#[derive(Default)]
struct Tally {
    /// kind → outcome label → count.
    outcomes: BTreeMap<String, BTreeMap<String, u64>>,
    /// Latencies (µs) of complete 200 answers after warm-up, by kind.
    latencies: BTreeMap<String, Vec<u32>>,
    /// Outcomes that need the chaos log to be judged: (kind, label, start, end, upstream).
    pending: Vec<(Kind, String, u64, u64, Option<String>)>,
    /// session → (last upstream, changes).
    sessions: BTreeMap<String, (String, u64)>,
    /// Every change of a session's upstream: (kind, when, from, to).
    changes: Vec<(Kind, u64, String, String)>,
    requests: u64,
}

fn outcome_label(got: &Got, want_len: usize) -> String {
    match got {
        Got::Response(a) if a.error.is_some() => {
            format!("{} {}", a.status, a.error.as_deref().unwrap_or(""))
        }
        Got::Response(a) if a.status == 200 && a.captcha => "200 captcha page (relayed)".into(),
        Got::Response(a) if a.status == 200 && a.body_len == want_len => "200 ok".into(),
        Got::Response(a) if a.status == 200 => format!("200 body of {} bytes", a.body_len),
        Got::Response(a) => format!("{} without X-Pool-Error", a.status),
        Got::Refused => "connection refused by the gateway".into(),
        Got::NoResponse { reused, reset } => format!(
            "{} before any response ({} connection)",
            if *reset { "reset" } else { "EOF" },
            if *reused { "reused" } else { "new" }
        ),
        Got::Truncated { status, .. } => format!("{status} then the body broke off"),
        Got::Malformed(e) => format!("malformed: {e}"),
        Got::Hang => "hang (no answer within 30 s)".into(),
    }
}

impl Tally {
    fn add(&mut self, r: Record, warmup_end_ms: u64) {
        self.requests += 1;
        let label = outcome_label(&r.got, r.want_len);
        if let Got::Response(a) = &r.got {
            if a.status == 200
                && a.error.is_none()
                && !a.captcha
                && a.body_len == r.want_len
                && r.start_ms >= warmup_end_ms
            {
                self.latencies
                    .entry(r.kind.name().to_string())
                    .or_default()
                    .push(r.latency_us.min(u64::from(u32::MAX)) as u32);
            }
            if let (Some(key), Some(up)) = (&r.session, &a.upstream) {
                if a.status == 200 {
                    let e = self
                        .sessions
                        .entry(key.clone())
                        .or_insert_with(|| (up.clone(), 0));
                    if e.0 != *up {
                        self.changes
                            .push((r.kind, r.start_ms, e.0.clone(), up.clone()));
                        e.0 = up.clone();
                        e.1 += 1;
                    }
                }
            }
        }
        let upstream = match &r.got {
            Got::Truncated { upstream, .. } => upstream.clone(),
            Got::Response(a) => a.upstream.clone(),
            _ => None,
        };
        if judge_now(r.kind, &label).is_none() {
            self.pending
                .push((r.kind, label.clone(), r.start_ms, r.end_ms, upstream));
        }
        *self
            .outcomes
            .entry(r.kind.name().to_string())
            .or_default()
            .entry(label)
            .or_default() += 1;
    }
}

/// Whether an outcome is one the docs promise for the faults this soak makes, when that does not
/// depend on when it happened: `Some(reason)` for a promised one, `Some("")` for a success,
/// `None` when the chaos log has to decide (see [`judge_with_chaos`]).
fn judge_now(kind: Kind, label: &str) -> Option<&'static str> {
    match label {
        "200 ok" => Some(""),
        "200 captcha page (relayed)" => Some("an upstream answering captchas (its page relayed)"),
        "503 pool-exhausted" if kind.listed() => Some(
            "every member at its cap, or (list-fed pool) no member admitted yet: concepts.md, operations.md",
        ),
        "503 pool-exhausted" => Some("every candidate at its cap past queue_timeout: concepts.md"),
        "502 session-upstream-unavailable" if kind.sticky() => {
            Some("the session's upstream killed or gone from its list: concepts.md, operations.md")
        }
        "503 no-upstream-available" if kind.listed() => {
            Some("the list-fed pool without a usable member (its members killed or out)")
        }
        _ => None,
    }
}

/// Faults as the chaos log tells them: intervals during which an upstream was down, and Redis.
struct Chaos {
    /// upstream address → (down since, up again) intervals, in epoch ms.
    upstream_down: BTreeMap<String, Vec<(u64, u64)>>,
    redis_down: Vec<(u64, u64)>,
    /// Every event, for counts.
    counts: BTreeMap<String, u64>,
}

fn read_chaos(path: &Path, end_ms: u64) -> Chaos {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut chaos = Chaos {
        upstream_down: BTreeMap::new(),
        redis_down: Vec::new(),
        counts: BTreeMap::new(),
    };
    let mut open_up: BTreeMap<String, u64> = BTreeMap::new();
    let mut open_redis: Option<u64> = None;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(ts), Some(event)) = (f.next().and_then(|t| t.parse::<u64>().ok()), f.next())
        else {
            continue;
        };
        let arg = f.next().unwrap_or("").to_string();
        *chaos.counts.entry(event.to_string()).or_default() += 1;
        match event {
            "kill-upstream" => {
                open_up.insert(arg, ts);
            }
            "start-upstream" => {
                if let Some(since) = open_up.remove(&arg) {
                    chaos
                        .upstream_down
                        .entry(arg)
                        .or_default()
                        .push((since, ts));
                }
            }
            "redis-stop" => open_redis = Some(ts),
            "redis-start" => {
                if let Some(since) = open_redis.take() {
                    chaos.redis_down.push((since, ts));
                }
            }
            _ => {}
        }
    }
    for (arg, since) in open_up {
        chaos
            .upstream_down
            .entry(arg)
            .or_default()
            .push((since, end_ms));
    }
    if let Some(since) = open_redis {
        chaos.redis_down.push((since, end_ms));
    }
    chaos
}

/// When the instances served from their local views: (from, to) in epoch ms, each instance's
/// episodes one after another (an episode still open at the end lasts until `end_ms`).
fn read_degraded(path: Option<&Path>, end_ms: u64) -> Vec<(u64, u64)> {
    let text = path
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    let mut windows = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [ts, what, instance] = f.as_slice() else {
            continue;
        };
        let Ok(ts) = ts.parse::<u64>() else { continue };
        match *what {
            "degraded" => {
                open.entry((*instance).to_string()).or_insert(ts);
            }
            "ok" => {
                if let Some(since) = open.remove(*instance) {
                    windows.push((since, ts));
                }
            }
            _ => {}
        }
    }
    windows.extend(open.into_values().map(|since| (since, end_ms)));
    windows
}

fn overlaps(intervals: &[(u64, u64)], start: u64, end: u64, slack: u64) -> bool {
    intervals
        .iter()
        .any(|(a, b)| *a <= end + slack && start <= b + slack)
}

/// The outcomes [`judge_now`] left open, judged against the faults of their time.
fn judge_with_chaos(
    chaos: &Chaos,
    kind: Kind,
    label: &str,
    start: u64,
    end: u64,
    upstream: Option<&str>,
) -> Option<&'static str> {
    let any_down = chaos
        .upstream_down
        .values()
        .any(|v| overlaps(v, start, end, KILL_BLAME_MS));
    let this_down = upstream.is_some_and(|u| {
        let addr = u.trim_start_matches("http://");
        chaos
            .upstream_down
            .get(addr)
            .is_some_and(|v| overlaps(v, start, end, KILL_BLAME_MS))
    });
    if label.ends_with("then the body broke off") && this_down {
        return Some(
            "its upstream killed mid-response: the response broke off (operations.md: a response that broke off is `failed`)",
        );
    }
    match label {
        "502 upstream-connect-failed" if !kind.sticky() && any_down => {
            Some("every upstream tried refused (killed ones): concepts.md")
        }
        "502 upstream-bad-response" if any_down => {
            Some("an upstream killed during the exchange: concepts.md")
        }
        _ => None,
    }
}

/// State of one load worker: a keep-alive connection per gateway.
struct Worker {
    proxies: Vec<SocketAddr>,
    conns: Vec<Option<TcpStream>>,
    next: usize,
}

impl Worker {
    fn new(proxies: &[SocketAddr], first: usize) -> Worker {
        Worker {
            proxies: proxies.to_vec(),
            conns: proxies.iter().map(|_| None).collect(),
            next: first,
        }
    }

    fn pick(&mut self) -> usize {
        let i = self.next % self.proxies.len();
        self.next = self.next.wrapping_add(1);
        i
    }
}

fn basic(user: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:x"));
    format!("Basic {token}")
}

/// One forwarded GET through gateway `i` of `w` (kept alive), or directly to the origin.
async fn http_get(
    w: &mut Worker,
    i: usize,
    target: &str,
    headers: &str,
    slow_head: bool,
    reading: Reading,
    direct: Option<SocketAddr>,
) -> Got {
    let (request, addr) = match direct {
        Some(origin) => (
            format!("GET {target} HTTP/1.1\r\nHost: {origin}\r\n{headers}\r\n"),
            origin,
        ),
        None => {
            let authority = target
                .trim_start_matches("http://")
                .split('/')
                .next()
                .unwrap_or("");
            (
                format!("GET {target} HTTP/1.1\r\nHost: {authority}\r\n{headers}\r\n"),
                w.proxies[i],
            )
        }
    };
    let reused = w.conns[i].is_some();
    let mut s = match w.conns[i].take() {
        Some(s) => s,
        None => match connect(addr, matches!(reading, Reading::Slow { .. })).await {
            Ok(s) => s,
            Err(got) => return got,
        },
    };
    let sent = if slow_head {
        trickle(&mut s, request.as_bytes()).await
    } else {
        s.write_all(request.as_bytes()).await
    };
    if let Err(e) = sent {
        return Got::NoResponse {
            reused,
            reset: is_reset(&e),
        };
    }
    let mut buf = Vec::new();
    let got = read_response(&mut s, &mut buf, reused, false, reading).await;
    if let Got::Response(a) = &got {
        if !a.close && buf.is_empty() {
            w.conns[i] = Some(s);
        }
    }
    got
}

/// Connects to the gateway (or the origin); a small receive buffer for slow readers, so the
/// gateway cannot park a large body in the kernel and move on.
async fn connect(addr: SocketAddr, small_buffer: bool) -> Result<TcpStream, Got> {
    let socket = TcpSocket::new_v4().map_err(|e| Got::Malformed(format!("socket: {e}")))?;
    if small_buffer {
        let _ = socket.set_recv_buffer_size(16 * 1024);
    }
    match socket.connect(addr).await {
        Ok(s) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(Got::Refused),
        Err(e) => Err(Got::Malformed(format!("connect: {e}"))),
    }
}

/// Sends a request head in four pieces half a second apart (well within header_read_timeout).
async fn trickle(s: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    let piece = bytes.len().div_ceil(4);
    for (n, chunk) in bytes.chunks(piece.max(1)).enumerate() {
        if n > 0 {
            sleep(Duration::from_millis(500)).await;
        }
        s.write_all(chunk).await?;
    }
    Ok(())
}

/// A CONNECT through gateway `i`, then a GET of `/1k` inside (`Connection: close`), read to EOF.
async fn tunnel(w: &Worker, i: usize, origin: SocketAddr, user: Option<&str>) -> Got {
    let mut s = match connect(w.proxies[i], false).await {
        Ok(s) => s,
        Err(got) => return got,
    };
    let auth = user.map_or(String::new(), |u| {
        format!("Proxy-Authorization: {}\r\n", basic(u))
    });
    let connect_req = format!("CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n{auth}\r\n");
    if let Err(e) = s.write_all(connect_req.as_bytes()).await {
        return Got::NoResponse {
            reused: false,
            reset: is_reset(&e),
        };
    }
    let mut buf = Vec::new();
    // The CONNECT answer: a head only when it is 200 (no body), else a gateway error with a body.
    let head = loop {
        match parse_head(&buf) {
            Ok(Some(h)) => break h,
            Ok(None) => {}
            Err(e) => return Got::Malformed(e),
        }
        match fill(&mut s, &mut buf).await {
            Ok(n) if n > 0 => {}
            Ok(_) if buf.is_empty() => {
                return Got::NoResponse {
                    reused: false,
                    reset: false,
                };
            }
            Err(e) if buf.is_empty() => {
                return Got::NoResponse {
                    reused: false,
                    reset: is_reset(&e),
                };
            }
            _ => return Got::Malformed("the CONNECT answer's head broke off".into()),
        }
    };
    if head.status != 200 {
        return read_response(&mut s, &mut buf, false, false, Reading::Fast).await;
    }
    buf.drain(..head.len);
    let inner = format!("GET /1k HTTP/1.1\r\nHost: {origin}\r\nConnection: close\r\n\r\n");
    if s.write_all(inner.as_bytes()).await.is_err() {
        return Got::Truncated {
            status: 200,
            upstream: head.upstream,
        };
    }
    match read_response(&mut s, &mut buf, false, true, Reading::Fast).await {
        Got::Response(mut a) => {
            a.upstream = head.upstream;
            Got::Response(a)
        }
        Got::NoResponse { .. } | Got::Truncated { .. } | Got::Malformed(_) => Got::Truncated {
            status: 200,
            upstream: head.upstream,
        },
        other => other,
    }
}

async fn one_request(
    w: &mut Worker,
    kind: Kind,
    n: u64,
    id: usize,
    args: &LoadArgs,
) -> (Got, usize, Option<String>) {
    let origin = args.origin;
    let small = format!("http://{origin}/1k");
    let i = w.pick();
    // Sessions: each worker uses 16 keys in turn, shared by both gateways.
    let key = format!("w{id}k{}", n % 16);
    match kind {
        Kind::Plain => (
            http_get(w, i, &small, "", false, Reading::Fast, None).await,
            1024,
            None,
        ),
        Kind::StickyHeader => (
            http_get(
                w,
                i,
                &small,
                &format!("X-Pool-Session: {key}\r\n"),
                false,
                Reading::Fast,
                None,
            )
            .await,
            1024,
            Some(format!("default/{key}")),
        ),
        Kind::StickyUser => (
            http_get(
                w,
                i,
                &small,
                &format!(
                    "Proxy-Authorization: {}\r\n",
                    basic(&format!("soak-session-{key}"))
                ),
                false,
                Reading::Fast,
                None,
            )
            .await,
            1024,
            Some(format!("default/{key}")),
        ),
        Kind::Tunnel => (tunnel(w, i, origin, None).await, 1024, None),
        Kind::TunnelSticky => (
            tunnel(w, i, origin, Some(&format!("soak-session-t{key}"))).await,
            1024,
            Some(format!("default/t{key}")),
        ),
        Kind::Listed => (
            http_get(
                w,
                i,
                &small,
                &format!("X-Pool-Name: {}\r\n", args.listed_pool),
                false,
                Reading::Fast,
                None,
            )
            .await,
            1024,
            None,
        ),
        Kind::ListedSticky => (
            http_get(
                w,
                i,
                &small,
                &format!(
                    "X-Pool-Name: {}\r\nX-Pool-Session: l{key}\r\n",
                    args.listed_pool
                ),
                false,
                Reading::Fast,
                None,
            )
            .await,
            1024,
            Some(format!("{}/l{key}", args.listed_pool)),
        ),
        Kind::SlowHead => (
            http_get(w, i, &small, "", true, Reading::Fast, None).await,
            1024,
            None,
        ),
        Kind::SlowRead => {
            let big = format!("http://{origin}/big");
            let got = http_get(
                w,
                i,
                &big,
                "",
                false,
                Reading::Slow {
                    bytes: 16 * 1024,
                    pause: Duration::from_millis(40),
                },
                None,
            )
            .await;
            // A fresh connection each time, so the small receive buffer applies.
            w.conns[i] = None;
            (got, 0, None)
        }
        Kind::Direct => (
            http_get(w, 0, "/1k", "", false, Reading::Fast, Some(origin)).await,
            1024,
            None,
        ),
    }
}

async fn load(args: LoadArgs) -> Result<(), BoxError> {
    let start = Instant::now();
    let start_ms = now_ms();
    let warmup_end_ms = start_ms + args.warmup.as_millis() as u64;
    let deadline = start + args.duration;
    let tally = Arc::new(StdMutex::new(Tally::default()));
    let big_len = Arc::new(AtomicUsize::new(0));
    let mut plan: Vec<Kind> = Vec::new();
    let mut add = |k: Kind, n: usize| plan.extend(std::iter::repeat_n(k, n));
    add(Kind::Plain, args.plain);
    add(Kind::StickyHeader, args.sticky.div_ceil(2));
    add(Kind::StickyUser, args.sticky / 2);
    add(Kind::Tunnel, args.tunnel.div_ceil(2));
    add(Kind::TunnelSticky, args.tunnel / 2);
    add(Kind::Listed, args.listed.div_ceil(2));
    add(Kind::ListedSticky, args.listed / 2);
    add(Kind::SlowHead, args.slow_head);
    add(Kind::SlowRead, args.slow_read);
    add(Kind::Direct, args.direct);
    let mut set = tokio::task::JoinSet::new();
    for (id, kind) in plan.into_iter().enumerate() {
        let args = args.clone();
        let tally = tally.clone();
        let big_len = big_len.clone();
        set.spawn(async move {
            let mut w = Worker::new(&args.proxy, id);
            let mut n: u64 = 0;
            while Instant::now() < deadline {
                n += 1;
                let t0 = Instant::now();
                let began = now_ms();
                let (got, mut want_len, session) =
                    match timeout(HANG_TIMEOUT, one_request(&mut w, kind, n, id, &args)).await {
                        Ok(r) => r,
                        Err(_) => {
                            w.conns.iter_mut().for_each(|c| *c = None);
                            (Got::Hang, 1024, None)
                        }
                    };
                if kind == Kind::SlowRead {
                    // The big body's length is whatever the origin serves: learn it from the
                    // first complete answer.
                    if let Got::Response(a) = &got {
                        if a.status == 200 && a.error.is_none() && !a.captcha {
                            let _ = big_len.compare_exchange(
                                0,
                                a.body_len,
                                Ordering::SeqCst,
                                Ordering::SeqCst,
                            );
                        }
                    }
                    want_len = big_len.load(Ordering::SeqCst);
                }
                let record = Record {
                    kind,
                    start_ms: began,
                    end_ms: now_ms(),
                    latency_us: t0.elapsed().as_micros() as u64,
                    got,
                    want_len,
                    session,
                };
                if let Ok(mut t) = tally.lock() {
                    t.add(record, warmup_end_ms);
                }
                sleep(args.pause).await;
            }
        });
    }
    let progress = {
        let tally = tally.clone();
        tokio::spawn(async move {
            let mut last = 0;
            loop {
                sleep(Duration::from_secs(30)).await;
                let (n, errors) = match tally.lock() {
                    Ok(t) => (
                        t.requests,
                        t.outcomes
                            .values()
                            .flat_map(|m| m.iter())
                            .filter(|(l, _)| l.as_str() != "200 ok")
                            .map(|(_, c)| *c)
                            .sum::<u64>(),
                    ),
                    Err(_) => (0, 0),
                };
                eprintln!(
                    "soak load: {:>4} s, {n} requests ({}/s), {errors} not 200 ok",
                    start.elapsed().as_secs(),
                    (n - last) / 30
                );
                last = n;
            }
        })
    };
    while set.join_next().await.is_some() {}
    progress.abort();
    let _ = progress.await;
    let end_ms = now_ms();
    let tally = match Arc::try_unwrap(tally) {
        Ok(m) => m.into_inner().map_err(|_| "tally poisoned")?,
        Err(_) => return Err("workers still hold the tally".into()),
    };
    let summary = summarize(tally, &args, start_ms, end_ms);
    std::fs::write(&args.out, serde_json::to_string_pretty(&summary)? + "\n")?;
    Ok(())
}

fn percentile(sorted: &[u32], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Some(f64::from(sorted[idx.min(sorted.len() - 1)]) / 1000.0)
}

fn summarize(mut tally: Tally, args: &LoadArgs, start_ms: u64, end_ms: u64) -> Value {
    let chaos = read_chaos(&args.chaos_log, end_ms);
    // kind → label → (count, verdict).
    let mut judged: BTreeMap<(String, String), (u64, String)> = BTreeMap::new();
    for (kind, labels) in &tally.outcomes {
        for (label, count) in labels {
            let Some(k) = kind_by_name(kind) else {
                continue;
            };
            if let Some(reason) = judge_now(k, label) {
                let verdict = if reason.is_empty() {
                    "ok".to_string()
                } else {
                    format!("promised: {reason}")
                };
                judged.insert((kind.clone(), label.clone()), (*count, verdict));
            }
        }
    }
    for (kind, label, start, end, upstream) in &tally.pending {
        let verdict =
            match judge_with_chaos(&chaos, *kind, label, *start, *end, upstream.as_deref()) {
                Some(reason) => format!("promised: {reason}"),
                None => "UNEXPECTED".to_string(),
            };
        let e = judged
            .entry((kind.name().to_string(), format!("{label} [{verdict}]")))
            .or_insert((0, verdict));
        e.0 += 1;
    }
    let mut outcomes = Vec::new();
    let mut unexpected = 0;
    let mut total = 0;
    for ((kind, label), (count, verdict)) in &judged {
        total += count;
        if verdict == "UNEXPECTED" {
            unexpected += count;
        }
        let label = label.split(" [").next().unwrap_or(label);
        outcomes.push(json!({"kind": kind, "outcome": label, "count": count, "verdict": verdict}));
    }
    let mut latency = serde_json::Map::new();
    for (kind, v) in tally.latencies.iter_mut() {
        v.sort_unstable();
        latency.insert(
            kind.clone(),
            json!({"n": v.len(), "p50_ms": percentile(v, 0.5), "p99_ms": percentile(v, 0.99)}),
        );
    }
    let session_changes: u64 = tally.sessions.values().map(|(_, c)| *c).sum();
    json!({
        "start_ms": start_ms,
        "end_ms": end_ms,
        "requests": tally.requests,
        "judged": total,
        "unexpected": unexpected,
        "outcomes": outcomes,
        "latency": latency,
        "sessions": tally.sessions.len(),
        "session_upstream_changes": session_changes,
        "session_changes": tally
            .changes
            .iter()
            .map(|(kind, at, from, to)| json!([kind.name(), at, from, to]))
            .collect::<Vec<_>>(),
        "chaos": chaos.counts,
    })
}

fn kind_by_name(name: &str) -> Option<Kind> {
    [
        Kind::Plain,
        Kind::StickyHeader,
        Kind::StickyUser,
        Kind::Tunnel,
        Kind::TunnelSticky,
        Kind::Listed,
        Kind::ListedSticky,
        Kind::SlowHead,
        Kind::SlowRead,
        Kind::Direct,
    ]
    .into_iter()
    .find(|k| k.name() == name)
}

// ---------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------

/// Median of the samples of `instance` whose time falls in [from, to).
fn window_median(
    samples: &[(f64, String, f64, f64)],
    instance: &str,
    from: f64,
    to: f64,
) -> Option<(f64, f64)> {
    let mut rss: Vec<f64> = Vec::new();
    let mut fds: Vec<f64> = Vec::new();
    for (t, i, r, f) in samples {
        if i == instance && *t >= from && *t < to {
            rss.push(*r);
            fds.push(*f);
        }
    }
    if rss.is_empty() {
        return None;
    }
    rss.sort_by(f64::total_cmp);
    fds.sort_by(f64::total_cmp);
    Some((rss[rss.len() / 2], fds[fds.len() / 2]))
}

fn report(args: &ReportArgs) -> Result<(), BoxError> {
    let load: Value = serde_json::from_str(&std::fs::read_to_string(&args.load)?)?;
    let mut out = String::new();
    let mut pass = true;

    // Requests by outcome.
    let _ = writeln!(out, "requests by outcome ({} in all)", load["requests"]);
    let _ = writeln!(out, "| kind | outcome | count | verdict |");
    let _ = writeln!(out, "|---|---|---:|---|");
    if let Some(rows) = load["outcomes"].as_array() {
        for r in rows {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} |",
                r["kind"].as_str().unwrap_or(""),
                r["outcome"].as_str().unwrap_or(""),
                r["count"],
                r["verdict"].as_str().unwrap_or("")
            );
        }
    }
    let unexpected = load["unexpected"].as_u64().unwrap_or(0);
    pass &= unexpected == 0;
    let _ = writeln!(out);

    // Summary table.
    let mut rows: Vec<(String, String, String)> = Vec::new();
    rows.push((
        "unexpected outcomes (hangs, resets without a response, errors not promised for the fault)"
            .into(),
        unexpected.to_string(),
        verdict(unexpected == 0),
    ));

    // Leases left, and what the instances say of themselves at the end.
    let mut leases_status = 0u64;
    let mut quarantines = 0u64;
    let mut reloads = (0u64, 0u64);
    let mut stores = Vec::new();
    let mut books_balance = true;
    for path in &args.status {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
        if let Some(pools) = doc["pools"].as_array() {
            for p in pools {
                leases_status += p["leases_live"].as_u64().unwrap_or(0);
                for u in p["upstreams"].as_array().into_iter().flatten() {
                    if args.captcha_upstream.as_deref() == u["id"].as_str() {
                        quarantines += u["quarantines_total"].as_u64().unwrap_or(0);
                    }
                }
            }
        }
        reloads.0 += doc["config"]["reloads_ok"].as_u64().unwrap_or(0);
        reloads.1 += doc["config"]["reloads_failed"].as_u64().unwrap_or(0);
        stores.push(doc["store"]["health"].as_str().unwrap_or("?").to_string());
        let r = &doc["requests"];
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        books_balance &= n("accepted")
            == n("completed") + n("rejected") + n("failed") + n("in_flight")
            && n("in_flight") == 0;
    }
    let mut redis_text = Vec::new();
    let mut leases_redis = 0u64;
    for kv in &args.redis_leases {
        if let Some((k, v)) = kv.split_once('=') {
            let n: u64 = v.trim().parse().unwrap_or(u64::MAX);
            leases_redis = leases_redis.saturating_add(n);
            redis_text.push(format!("{k} {v}"));
        }
    }
    rows.push((
        "leases left after the run: /status of both instances".into(),
        leases_status.to_string(),
        verdict(leases_status == 0),
    ));
    rows.push((
        format!(
            "leases left after the run: Redis ({})",
            redis_text.join(", ")
        ),
        leases_redis.to_string(),
        verdict(leases_redis == 0),
    ));
    pass &= leases_status == 0 && leases_redis == 0;

    // Cap violations.
    let end_ms = load["end_ms"].as_u64().unwrap_or(u64::MAX);
    let chaos = read_chaos(&args.chaos_log, end_ms);
    let degraded_windows = read_degraded(args.degraded.as_deref(), end_ms);
    // Redis stopped by the chaos loop, or an instance serving from its local view for any reason
    // (a call past the store's timeout on a busy machine degrades it too).
    let mut outages = chaos.redis_down.clone();
    outages.extend(degraded_windows.iter().copied());
    let instances_n = args.status.len().max(1);
    let mut violations = 0u64;
    let mut degraded = 0u64;
    let mut worst = 0usize;
    let mut peak_default = 0usize;
    for path in &args.events {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                [ts, "over", _addr, n, "cap", cap] => {
                    let (Ok(ts), Ok(n), Ok(cap)) =
                        (ts.parse::<u64>(), n.parse::<usize>(), cap.parse::<usize>())
                    else {
                        continue;
                    };
                    worst = worst.max(n);
                    // While an instance serves from its local view, caps hold per instance (n ×
                    // max_concurrency); once Redis is back, the local views' leases run on beside
                    // its new grants (operations.md, "Shared store"): up to (n + 1) ×
                    // max_concurrency, in a window or within the grace after it.
                    let in_outage = overlaps(&outages, ts, ts, OUTAGE_GRACE_MS);
                    if in_outage && n <= cap * (instances_n + 1) {
                        degraded += 1;
                    } else {
                        violations += 1;
                    }
                }
                [_ts, "peak", _addr, n] => {
                    if let Ok(n) = n.parse::<usize>() {
                        peak_default = peak_default.max(n);
                    }
                }
                _ => {}
            }
        }
    }
    rows.push((
        format!(
            "cap violations (fake upstreams count exchanges in flight against max_concurrency = {})",
            args.cap
        ),
        violations.to_string(),
        verdict(violations == 0),
    ));
    rows.push((
        format!(
            "  excesses while an instance served from its local view or within 15 s of its return, ≤ (instances + 1) × cap (documented degraded mode; local-view episodes: {}, {:.1} s in all)",
            degraded_windows.len(),
            degraded_windows.iter().map(|(a, b)| b.saturating_sub(*a)).sum::<u64>() as f64 / 1000.0
        ),
        format!("{degraded} (highest {worst})"),
        "info".into(),
    ));
    rows.push((
        "  highest count of exchanges in flight seen by any capped upstream".into(),
        peak_default.to_string(),
        "info".into(),
    ));
    pass &= violations == 0;

    // RSS and fds.
    let text = std::fs::read_to_string(&args.samples)?;
    let samples: Vec<(f64, String, f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [t, i, r, d] => Some((
                    t.parse().ok()?,
                    (*i).to_string(),
                    r.parse().ok()?,
                    d.parse().ok()?,
                )),
                _ => None,
            }
        })
        .collect();
    let mut instances: Vec<String> = samples.iter().map(|s| s.1.clone()).collect();
    instances.sort();
    instances.dedup();
    let w = args.warmup_s as f64;
    let d = args.duration_s as f64;
    let span = ((d - w) / 10.0).clamp(10.0, 60.0);
    let mid = w + (d - w) / 2.0;
    for inst in &instances {
        let s = window_median(&samples, inst, w, w + span);
        let m = window_median(&samples, inst, mid - span / 2.0, mid + span / 2.0);
        let e = window_median(&samples, inst, d - span, d);
        let fmt = |x: Option<(f64, f64)>, rss: bool| {
            x.map_or("—".to_string(), |(r, f)| {
                if rss {
                    format!("{:.1}", r / 1024.0)
                } else {
                    format!("{f:.0}")
                }
            })
        };
        for (what, rss) in [("RSS (MiB)", true), ("open fds", false)] {
            let growth = match (s, e) {
                (Some(a), Some(b)) => {
                    let (a, b) = if rss { (a.0, b.0) } else { (a.1, b.1) };
                    if a > 0.0 {
                        Some((b - a) / a * 100.0)
                    } else {
                        None
                    }
                }
                _ => None,
            };
            let flat = growth.is_some_and(|g| g <= 10.0);
            pass &= flat;
            rows.push((
                format!("instance {inst}: {what} start / middle / end"),
                format!(
                    "{} / {} / {} ({})",
                    fmt(s, rss),
                    fmt(m, rss),
                    fmt(e, rss),
                    growth.map_or("—".into(), |g| format!("{g:+.1}%"))
                ),
                verdict(flat),
            ));
        }
    }

    // Latency added.
    let lat = &load["latency"];
    let p = |k: &str, q: &str| lat[k][q].as_f64();
    if let (Some(dp50), Some(dp99)) = (p("direct", "p50_ms"), p("direct", "p99_ms")) {
        rows.push((
            "direct fetch of the origin: p50 / p99 (ms)".into(),
            format!("{dp50:.2} / {dp99:.2}"),
            "info".into(),
        ));
        for k in ["plain", "sticky-header", "tunnel"] {
            if let (Some(p50), Some(p99)) = (p(k, "p50_ms"), p(k, "p99_ms")) {
                rows.push((
                    format!("{k} through a gateway and a fake upstream: p50 / p99 (ms), p99 added"),
                    format!("{p50:.2} / {p99:.2}, +{:.2}", p99 - dp99),
                    "info".into(),
                ));
            }
        }
    }
    rows.push((
        "sticky sessions: keys / times a key's upstream changed".into(),
        format!(
            "{} / {}",
            load["sessions"], load["session_upstream_changes"]
        ),
        "info".into(),
    ));
    rows.push((
        "instances at the end: store health; requests accepted = completed + rejected + failed, none in flight".into(),
        format!("{}; {}", stores.join(", "), if books_balance { "balanced" } else { "NOT balanced" }),
        verdict(books_balance && stores.iter().all(|s| s == "ok")),
    ));
    pass &= books_balance && stores.iter().all(|s| s == "ok");
    rows.push((
        "reloads applied / refused (SIGHUP, both instances)".into(),
        format!("{} / {}", reloads.0, reloads.1),
        verdict(reloads.1 == 0 && reloads.0 == chaos.counts.get("sighup").copied().unwrap_or(0)),
    ));
    pass &= reloads.1 == 0 && reloads.0 == chaos.counts.get("sighup").copied().unwrap_or(0);
    if args.captcha_upstream.is_some() {
        rows.push((
            "quarantines of the upstream that answered captchas (as the instances saw them)".into(),
            quarantines.to_string(),
            "info".into(),
        ));
    }
    // Why a session's upstream changed, as far as the faults of the time tell.
    let mut causes: BTreeMap<String, u64> = BTreeMap::new();
    for c in load["session_changes"].as_array().into_iter().flatten() {
        let (Some(kind), Some(at), Some(from)) = (c[0].as_str(), c[1].as_u64(), c[2].as_str())
        else {
            continue;
        };
        let listed = kind_by_name(kind).is_some_and(Kind::listed);
        let from_addr = from.trim_start_matches("http://");
        let cause = if overlaps(&outages, at, at, OUTAGE_GRACE_MS) {
            "an instance on its local view, or just back (bindings made there)"
        } else if chaos
            .upstream_down
            .get(from_addr)
            .is_some_and(|v| v.iter().any(|(a, _)| *a <= at))
        {
            "its upstream was killed earlier in the run"
        } else if listed {
            "list-fed pool (members come and go with the list)"
        } else {
            "none of the faults"
        };
        *causes.entry(format!("{kind}: {cause}")).or_default() += 1;
    }
    for (k, v) in causes {
        rows.push((
            format!("  session upstream changes, {k}"),
            v.to_string(),
            "info".into(),
        ));
    }
    let mut chaos_counts: Vec<String> = Vec::new();
    if let Some(m) = load["chaos"].as_object() {
        for (k, v) in m {
            chaos_counts.push(format!("{k} {v}"));
        }
    }
    rows.push((
        "chaos events".into(),
        chaos_counts.join(", "),
        "info".into(),
    ));

    let _ = writeln!(out, "| check | figure | verdict |");
    let _ = writeln!(out, "|---|---|---|");
    for (a, b, c) in &rows {
        let _ = writeln!(out, "| {a} | {b} | {c} |");
    }
    if !args.meta.is_empty() {
        let _ = writeln!(out);
        for m in &args.meta {
            let _ = writeln!(out, "{m}");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "soak: {}",
        if pass {
            "PASSED"
        } else {
            "FAILED (see the verdicts above)"
        }
    );
    print!("{out}");
    Ok(())
}

fn verdict(ok: bool) -> String {
    if ok { "ok".into() } else { "FAILED".into() }
}
