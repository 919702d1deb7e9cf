//! Shared helpers for the integration tests: fake origins, fake upstream
//! proxies (HTTP and SOCKS5), a throw-away test CA, and small utilities.
//!
//! Every test file that needs them does `mod common;`. The crate's clippy
//! lints deny `unwrap`/`expect`/`panic`; this module allows them for itself,
//! and a test file that uses them starts with
//! `#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]`.
//!
//! Safety rules followed by every helper in this folder:
//! * every server binds `127.0.0.1:0` (a fake proxy that is revived after
//!   `RefuseConnections` rebinds the same loopback port);
//! * a fake upstream never dials anything but a loopback address: the target
//!   is resolved first and refused unless *every* resolved address is
//!   loopback (see [`resolve_loopback_only`]);
//! * every loop is bounded and every server task stops when its handle is
//!   dropped.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fake_proxy;
pub mod fake_socks;
pub mod gateway;
pub mod origin;
pub mod raw_upstream;
pub mod redis_server;
pub mod tls;

// Re-exports: not every test file uses every helper.
#[allow(unused_imports)]
pub use fake_proxy::{FakeProxy, FakeProxyOpts, ProxyMode, ProxyOutcome, SeenRequest};
#[allow(unused_imports)]
pub use fake_socks::{FakeSocks, FakeSocksOpts, SocksAddr, SocksRequest};
#[allow(unused_imports)]
pub use gateway::{TestGateway, admin_get, admin_json};
#[allow(unused_imports)]
pub use origin::{Origin, OriginBehaviour, RecordedRequest, pattern_bytes};
#[allow(unused_imports)]
pub use redis_server::{RedisCluster, RedisServer, redis_store};
#[allow(unused_imports)]
pub use tls::TestCa;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Boxed error used by the fakes' bodies.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Boxed response body used by the fakes.
pub type TestBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// Upper bound for the number of connections any fake server accepts.
pub(crate) const MAX_ACCEPTS: usize = 100_000;
/// How long a name lookup done by a fake upstream may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// `raw_http` gives up after this long.
const RAW_HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// `raw_http` reads at most this many bytes.
const RAW_HTTP_MAX_BYTES: usize = 64 * 1024 * 1024;

/// A TCP echo server on 127.0.0.1:0 for tunnel tests; it accepts at most 64 connections.
pub async fn echo_server() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind echo server on loopback");
    let addr = l.local_addr().expect("echo local_addr");
    tokio::spawn(async move {
        for _ in 0..64 {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// Opens a CONNECT tunnel to `target` through the loopback proxy `proxy`, with `extra_headers`
/// (whole `Name: value\r\n` lines) in the request; returns the stream and the response head
/// (at most 4 KiB, read byte by byte so nothing past it is consumed).
pub async fn connect_tunnel(
    proxy: SocketAddr,
    target: SocketAddr,
    extra_headers: &str,
) -> (TcpStream, String) {
    assert!(is_loopback_ip(proxy.ip()), "tests only talk to loopback");
    let mut s = TcpStream::connect(proxy)
        .await
        .expect("connect to the proxy");
    s.write_all(
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{extra_headers}\r\n").as_bytes(),
    )
    .await
    .expect("send CONNECT");
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    for _ in 0..4096 {
        s.read_exact(&mut b).await.expect("read the CONNECT answer");
        head.push(b[0]);
        if head.ends_with(b"\r\n\r\n") {
            break;
        }
    }
    (s, String::from_utf8_lossy(&head).into_owned())
}

/// A port on 127.0.0.1 that was free a moment ago (bind, read, drop).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// Sends `bytes` to the loopback `addr` and returns everything read back
/// until the peer closes, 64 MiB were read, or 5 s passed.
pub async fn raw_http(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    assert!(
        is_loopback_ip(addr.ip()),
        "raw_http only talks to loopback, not {addr}"
    );
    let mut out = Vec::new();
    let exchange = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(bytes).await?;
        s.flush().await?;
        let mut buf = vec![0u8; 16 * 1024];
        // Bounded: at most RAW_HTTP_MAX_BYTES, and every read returns >= 1 byte.
        while out.len() < RAW_HTTP_MAX_BYTES {
            let n = s.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(RAW_HTTP_TIMEOUT, exchange).await;
    out
}

/// Installs a `tracing` subscriber writing through the test harness
/// (captured per test), filtered by `RUST_LOG` (default `warn`).
/// Safe to call any number of times.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Polls `cond` every 5 ms (tokio time, so paused clocks work) until it is
/// true or `timeout` passed. Returns the last value of `cond`.
pub async fn wait_until<F: FnMut() -> bool>(mut cond: F, timeout: Duration) -> bool {
    const STEP: Duration = Duration::from_millis(5);
    let iterations = (timeout.as_millis() / STEP.as_millis()).clamp(1, 200_000);
    for _ in 0..iterations {
        if cond() {
            return true;
        }
        tokio::time::sleep(STEP).await;
    }
    cond()
}

/// Like [`wait_until`] for an async condition, polled every 20 ms (at most 10,000 times).
pub async fn wait_until_async<F, Fut>(mut cond: F, timeout: Duration) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    const STEP: Duration = Duration::from_millis(20);
    let iterations = (timeout.as_millis() / STEP.as_millis()).clamp(1, 10_000);
    for _ in 0..iterations {
        if cond().await {
            return true;
        }
        tokio::time::sleep(STEP).await;
    }
    cond().await
}

/// `Basic base64(user:pass)`, e.g. for `Proxy-Authorization`.
pub fn basic_auth(user: &str, pass: &str) -> String {
    use base64::Engine as _;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

/// Decodes a `Basic` credential header value into `user:pass`; other values
/// are returned unchanged.
pub fn decode_basic(value: &str) -> String {
    use base64::Engine as _;
    let trimmed = value.trim();
    let Some((scheme, rest)) = trimmed.split_once(' ') else {
        return trimmed.to_string();
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return trimmed.to_string();
    }
    match base64::engine::general_purpose::STANDARD.decode(rest.trim()) {
        Ok(raw) => String::from_utf8_lossy(&raw).into_owned(),
        Err(_) => trimmed.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Loopback guard
// ---------------------------------------------------------------------------

/// True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (`::ffff:127.x.y.z`).
pub fn is_loopback_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Resolves `host:port` and returns the addresses only if EVERY one of them
/// is loopback; otherwise (or if resolution fails) returns an error and the
/// caller must refuse without dialing. IP literals (optionally in brackets)
/// are checked without any lookup; names go through `tokio::net::lookup_host`.
/// Returned addresses are canonical (IPv4-mapped IPv6 becomes IPv4).
pub async fn resolve_loopback_only(host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
    let h = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if h.is_empty() {
        return Err("empty host".to_string());
    }
    if let Ok(ip) = h.parse::<IpAddr>() {
        return if is_loopback_ip(ip) {
            Ok(vec![SocketAddr::new(ip.to_canonical(), port)])
        } else {
            Err(format!("{ip} is not loopback"))
        };
    }
    let addrs: Vec<SocketAddr> =
        match tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((h, port))).await {
            Ok(Ok(it)) => it.collect(),
            Ok(Err(e)) => return Err(format!("cannot resolve {h}: {e}")),
            Err(_) => return Err(format!("resolving {h} timed out")),
        };
    if addrs.is_empty() {
        return Err(format!("{h} resolved to nothing"));
    }
    if let Some(bad) = addrs.iter().find(|a| !is_loopback_ip(a.ip())) {
        return Err(format!("{h} resolves to non-loopback {bad}"));
    }
    Ok(addrs
        .into_iter()
        .map(|a| SocketAddr::new(a.ip().to_canonical(), a.port()))
        .collect())
}

/// Connects to the first reachable address of `addrs`, which must all be
/// loopback (re-checked here; a non-loopback address is never dialed).
pub async fn connect_loopback(addrs: &[SocketAddr]) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address");
    for a in addrs {
        if !is_loopback_ip(a.ip()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("refusing to dial non-loopback {a}"),
            ));
        }
    }
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

// ---------------------------------------------------------------------------
// In-flight gauge
// ---------------------------------------------------------------------------

/// Current and peak number of things in flight.
#[derive(Debug, Default)]
pub struct Gauge {
    cur: AtomicUsize,
    peak: AtomicUsize,
}

impl Gauge {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts one more in flight until the returned guard is dropped.
    pub fn enter(self: &Arc<Self>) -> GaugeGuard {
        let now = self.cur.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
        GaugeGuard(Arc::clone(self))
    }

    pub fn current(&self) -> usize {
        self.cur.load(Ordering::SeqCst)
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// Sets the peak back to the current value.
    pub fn reset_peak(&self) {
        self.peak
            .store(self.cur.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// Decrements its [`Gauge`] on drop.
#[derive(Debug)]
pub struct GaugeGuard(Arc<Gauge>);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.cur.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A body that keeps a [`GaugeGuard`] until it has been fully sent (or
/// dropped), so "in flight" covers the whole response body.
pub struct GuardedBody {
    inner: TestBody,
    guard: Option<GaugeGuard>,
}

impl GuardedBody {
    pub fn new(inner: TestBody, guard: Option<GaugeGuard>) -> Self {
        Self { inner, guard }
    }
}

impl Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.guard = None;
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

/// A complete in-memory body.
pub fn full_body(data: impl Into<Bytes>) -> TestBody {
    http_body_util::Full::new(data.into())
        .map_err(|never: Infallible| -> BoxError { match never {} })
        .boxed()
}

/// Response headers as `(name, value)` pairs (values lossily decoded).
pub fn header_pairs(h: &http::HeaderMap) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect()
}
