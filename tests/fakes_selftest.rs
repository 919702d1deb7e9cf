//! Self-test of the fakes in `tests/common`, run against each other.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::fake_socks::reply;
use common::{
    FakeProxy, FakeProxyOpts, FakeSocks, FakeSocksOpts, Origin, OriginBehaviour, ProxyMode,
    ProxyOutcome, SocksAddr, TestCa, pattern_bytes, raw_http, resolve_loopback_only, wait_until,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Upper bound for any single await in these tests.
const STEP: Duration = Duration::from_secs(10);

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(STEP, f).await.expect("step timed out")
}

fn client_via(proxy_url: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy_url).expect("proxy url"))
        .timeout(STEP)
        .build()
        .expect("client")
}

fn tls_client_via(proxy_url: &str, ca: &TestCa) -> reqwest::Client {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy_url).expect("proxy url"))
        .add_root_certificate(ca.reqwest_cert())
        .tls_built_in_root_certs(false)
        .timeout(STEP)
        .build()
        .expect("client")
}

fn direct_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(STEP)
        .build()
        .expect("client")
}

async fn json_of(resp: reqwest::Response) -> serde_json::Value {
    let body = within(resp.bytes()).await.expect("body");
    serde_json::from_slice(&body).expect("json body")
}

fn head_of(resp: &[u8]) -> String {
    let s = String::from_utf8_lossy(resp);
    s.split("\r\n\r\n").next().unwrap_or("").to_string()
}

// ---------------------------------------------------------------------------
// HTTP forwarding
// ---------------------------------------------------------------------------

#[tokio::test]
async fn http_through_fake_proxy_strips_proxy_authorization() {
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::with_credentials("alice", "s3cret")).await;
    let client = client_via(&proxy.url_with_auth());

    let resp = within(client.get(origin.url("/hello?x=1")).send())
        .await
        .expect("request through proxy");
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-fake-proxy"].to_str().unwrap(),
        proxy.addr().to_string()
    );
    assert_eq!(
        resp.headers()["x-origin"].to_str().unwrap(),
        origin.addr().to_string()
    );
    let json: serde_json::Value = json_of(resp).await;
    assert_eq!(json["method"], "GET");
    assert_eq!(json["path"], "/hello");
    assert_eq!(json["query"], "x=1");

    let seen = origin.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].uri, "/hello?x=1", "origin-form at the origin");
    assert!(!seen[0].has_header("proxy-authorization"));
    assert_eq!(
        seen[0].header("host"),
        Some(origin.authority().as_str()),
        "host header kept"
    );

    assert_eq!(proxy.requests(), 1);
    assert_eq!(proxy.connects(), 0);
    assert_eq!(proxy.auth_seen(), vec!["alice:s3cret".to_string()]);
    assert_eq!(
        proxy.targets(),
        vec![("GET".to_string(), origin.url("/hello?x=1"))]
    );
    let fwd = proxy.forwarded_headers();
    assert_eq!(fwd.len(), 1);
    assert!(
        fwd[0]
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("proxy-authorization")),
        "the proxy saw the header it then stripped"
    );
    assert_eq!(proxy.seen()[0].outcome, ProxyOutcome::Forwarded(200));
}

#[tokio::test]
async fn post_body_is_forwarded() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let client = client_via(&proxy.url());
    let resp = within(
        client
            .post(origin.url("/upload"))
            .body(vec![7u8; 12345])
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 200);
    let json: serde_json::Value = json_of(resp).await;
    assert_eq!(json["body_len"], 12345);
    assert_eq!(origin.requests()[0].body_len, 12345);
    assert_eq!(origin.requests()[0].method, "POST");
}

#[tokio::test]
async fn fake_proxy_answers_407_without_credentials() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::with_credentials("alice", "s3cret")).await;

    let resp = within(client_via(&proxy.url()).get(origin.url("/")).send())
        .await
        .unwrap();
    assert_eq!(resp.status(), 407);
    assert!(resp.headers().contains_key("proxy-authenticate"));

    let wrong = format!("http://alice:nope@{}", proxy.addr());
    let resp = within(client_via(&wrong).get(origin.url("/")).send())
        .await
        .unwrap();
    assert_eq!(resp.status(), 407);

    assert_eq!(origin.request_count(), 0, "nothing reached the origin");
    assert_eq!(proxy.auth_seen(), vec!["alice:nope".to_string()]);
    assert!(
        proxy
            .seen()
            .iter()
            .all(|s| s.outcome == ProxyOutcome::AuthRequired)
    );
}

#[tokio::test]
async fn keep_alive_reuses_the_proxy_connection() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let client = client_via(&proxy.url());
    for i in 0..3 {
        let resp = within(client.get(origin.url(&format!("/k{i}"))).send())
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        within(resp.bytes()).await.unwrap();
    }
    assert_eq!(proxy.requests(), 3);
    assert_eq!(proxy.connections(), 1, "one keep-alive connection");
}

// ---------------------------------------------------------------------------
// CONNECT + TLS
// ---------------------------------------------------------------------------

#[tokio::test]
async fn https_through_connect_with_test_ca() {
    let ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let proxy = FakeProxy::start(FakeProxyOpts::with_credentials("bob", "pw")).await;
    let client = tls_client_via(&proxy.url_with_auth(), &ca);

    let url = origin.url("/bytes?n=100000&chunk=7000");
    assert!(url.starts_with("https://127.0.0.1:"));
    let resp = within(client.get(&url).send())
        .await
        .expect("https via CONNECT");
    assert_eq!(resp.status(), 200);
    let body = within(resp.bytes()).await.unwrap();
    assert_eq!(body.as_ref(), pattern_bytes(100_000).as_slice());

    // Host name variant (cert has both localhost and 127.0.0.1).
    let resp = within(client.get(origin.url_localhost("/ok")).send())
        .await
        .expect("https://localhost via CONNECT");
    assert_eq!(within(resp.text()).await.unwrap(), "ok");

    assert!(proxy.connects() >= 1);
    assert_eq!(proxy.requests(), 0);
    assert!(proxy.auth_seen().iter().all(|a| a == "bob:pw"));
    assert!(!proxy.auth_seen().is_empty());
    let seen = proxy.seen();
    assert_eq!(seen[0].method, "CONNECT");
    assert_eq!(seen[0].target, origin.authority());
    assert_eq!(seen[0].outcome, ProxyOutcome::Tunneled);
    assert_eq!(origin.request_count(), 2);
    assert!(
        origin
            .requests()
            .iter()
            .all(|r| !r.has_header("proxy-authorization"))
    );

    // An untrusting client fails: the cert really comes from the test CA.
    let other = TestCa::new();
    let bad = tls_client_via(&proxy.url_with_auth(), &other);
    assert!(within(bad.get(origin.url("/ok")).send()).await.is_err());
}

#[tokio::test]
async fn tls_origin_direct_with_tokio_rustls_client_config() {
    let ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let tcp = within(TcpStream::connect(origin.addr())).await.unwrap();
    let mut tls = within(
        ca.connector()
            .connect(common::tls::server_name("localhost"), tcp),
    )
    .await
    .expect("TLS handshake");
    tls.write_all(b"GET /ok HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    within(tls.read_to_end(&mut out)).await.ok();
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("ok"), "{text}");
}

// ---------------------------------------------------------------------------
// Loopback-only guard
// ---------------------------------------------------------------------------

#[tokio::test]
async fn loopback_guard() {
    for ok in [
        "127.0.0.1",
        "127.1.2.3",
        "::1",
        "[::1]",
        "::ffff:127.0.0.1",
        "localhost",
    ] {
        let addrs = resolve_loopback_only(ok, 80).await.expect(ok);
        assert!(
            addrs.iter().all(|a| a.ip().is_loopback()),
            "{ok}: {addrs:?}"
        );
    }
    assert_eq!(
        resolve_loopback_only("::ffff:127.0.0.1", 80).await.unwrap(),
        vec![SocketAddr::from(([127, 0, 0, 1], 80))],
        "mapped addresses are canonicalised"
    );
    for bad in [
        "10.0.0.1",
        "0.0.0.0",
        "::",
        "::ffff:10.0.0.1",
        "[::ffff:8.8.8.8]",
        "8.8.8.8",
        "example.com",
        "",
        "[]",
    ] {
        assert!(
            resolve_loopback_only(bad, 80).await.is_err(),
            "{bad} must be refused"
        );
    }
}

#[tokio::test]
async fn connect_to_non_loopback_is_refused_without_dialing() {
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let targets = ["10.0.0.1:443", "example.com:443", "[::ffff:10.0.0.1]:443"];
    for t in targets {
        let started = Instant::now();
        let req = format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\nConnection: close\r\n\r\n");
        let resp = within(raw_http(proxy.addr(), req.as_bytes())).await;
        let head = head_of(&resp);
        assert!(head.starts_with("HTTP/1.1 403"), "{t}: {head}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{t}: refused quickly"
        );
    }
    // Absolute-form to a non-loopback origin too.
    let resp = within(raw_http(
        proxy.addr(),
        b"GET http://10.0.0.1/ HTTP/1.1\r\nHost: 10.0.0.1\r\nConnection: close\r\n\r\n",
    ))
    .await;
    assert!(head_of(&resp).starts_with("HTTP/1.1 403"));

    assert_eq!(proxy.connects(), 3);
    assert_eq!(proxy.refused(), 4);
    let seen = proxy.seen();
    assert_eq!(seen[0].target, "10.0.0.1:443");
    assert_eq!(seen[1].target, "example.com:443");
    assert!(seen.iter().all(|s| s.outcome == ProxyOutcome::Refused));
    assert_eq!(proxy.in_flight(), 0);
}

#[tokio::test]
async fn connect_to_unreachable_loopback_is_502() {
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let dead = FakeProxy::dead();
    let req = format!("CONNECT {dead} HTTP/1.1\r\nHost: {dead}\r\nConnection: close\r\n\r\n");
    let resp = within(raw_http(proxy.addr(), req.as_bytes())).await;
    let head = head_of(&resp);
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("proxy-status:"),
        "{head}"
    );
    assert_eq!(proxy.seen()[0].outcome, ProxyOutcome::DialFailed);
}

// ---------------------------------------------------------------------------
// SOCKS5
// ---------------------------------------------------------------------------

async fn http_get_over(mut s: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin) -> String {
    s.write_all(b"GET /ok HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    within(s.read_to_end(&mut out)).await.ok();
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn socks5_with_tokio_socks_client() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let socks = FakeSocks::start(FakeSocksOpts::with_credentials("carol", "pw")).await;
    let port = origin.port();

    // Domain address type.
    let s = within(tokio_socks::tcp::Socks5Stream::connect_with_password(
        socks.addr(),
        ("localhost", port),
        "carol",
        "pw",
    ))
    .await
    .expect("socks connect by name");
    let text = http_get_over(s).await;
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
        "{text}"
    );

    // IPv4 address type.
    let s = within(tokio_socks::tcp::Socks5Stream::connect_with_password(
        socks.addr(),
        origin.addr(),
        "carol",
        "pw",
    ))
    .await
    .expect("socks connect by IPv4");
    assert!(http_get_over(s).await.ends_with("ok"));

    // IPv6 address type, IPv4-mapped loopback: allowed, dialed as 127.0.0.1.
    let mapped: SocketAddr = format!("[::ffff:127.0.0.1]:{port}").parse().unwrap();
    let s = within(tokio_socks::tcp::Socks5Stream::connect_with_password(
        socks.addr(),
        mapped,
        "carol",
        "pw",
    ))
    .await
    .expect("socks connect by mapped IPv6");
    assert!(http_get_over(s).await.ends_with("ok"));

    // Wrong password is rejected.
    let bad = within(tokio_socks::tcp::Socks5Stream::connect_with_password(
        socks.addr(),
        origin.addr(),
        "carol",
        "wrong",
    ))
    .await;
    assert!(bad.is_err());

    let reqs = socks.requests();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[0].addr, SocksAddr::Domain("localhost".into()));
    assert_eq!(reqs[0].addr.atyp(), 0x03);
    assert_eq!(reqs[1].addr, SocksAddr::Ipv4([127, 0, 0, 1].into()));
    assert_eq!(reqs[2].addr.atyp(), 0x04);
    assert_eq!(reqs[2].addr.host(), "::ffff:127.0.0.1");
    assert!(
        reqs.iter()
            .all(|r| r.port == port && r.reply == reply::SUCCEEDED)
    );
    assert_eq!(
        socks.auth_seen(),
        vec![
            ("carol".to_string(), "pw".to_string()),
            ("carol".to_string(), "pw".to_string()),
            ("carol".to_string(), "pw".to_string()),
            ("carol".to_string(), "wrong".to_string()),
        ]
    );
    assert_eq!(origin.request_count(), 3);
    assert!(wait_until(|| socks.tunnels() == 0, STEP).await);
    assert!(socks.peak_tunnels() >= 1);
}

/// Hand-written client: greeting + optional auth + CONNECT; returns the reply code.
async fn socks_connect_raw(
    server: SocketAddr,
    auth: Option<(&str, &str)>,
    cmd: u8,
    addr: &[u8],
    port: u16,
) -> (TcpStream, u8) {
    let mut s = within(TcpStream::connect(server)).await.unwrap();
    let method = if auth.is_some() { 0x02 } else { 0x00 };
    s.write_all(&[5, 1, method]).await.unwrap();
    let mut choice = [0u8; 2];
    within(s.read_exact(&mut choice)).await.unwrap();
    assert_eq!(choice, [5, method]);
    if let Some((u, p)) = auth {
        let mut m = vec![1, u.len() as u8];
        m.extend_from_slice(u.as_bytes());
        m.push(p.len() as u8);
        m.extend_from_slice(p.as_bytes());
        s.write_all(&m).await.unwrap();
        let mut r = [0u8; 2];
        within(s.read_exact(&mut r)).await.unwrap();
        if r[1] != 0 {
            return (s, 0xFF);
        }
    }
    let mut req = vec![5, cmd, 0];
    req.extend_from_slice(addr);
    req.extend_from_slice(&port.to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut head = [0u8; 4];
    within(s.read_exact(&mut head)).await.unwrap();
    let rest = match head[3] {
        0x01 => 4 + 2,
        0x04 => 16 + 2,
        other => panic!("unexpected bound atyp {other}"),
    };
    let mut skip = vec![0u8; rest];
    within(s.read_exact(&mut skip)).await.unwrap();
    (s, head[1])
}

fn domain(name: &str) -> Vec<u8> {
    let mut v = vec![0x03, name.len() as u8];
    v.extend_from_slice(name.as_bytes());
    v
}

#[tokio::test]
async fn socks5_hand_written_client_and_refusals() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let socks = FakeSocks::start(FakeSocksOpts::default()).await;

    // No-auth CONNECT by domain works and tunnels.
    let (s, code) =
        socks_connect_raw(socks.addr(), None, 1, &domain("localhost"), origin.port()).await;
    assert_eq!(code, reply::SUCCEEDED);
    assert!(http_get_over(s).await.ends_with("ok"));

    // Non-loopback targets: 0x02, never dialed.
    let started = Instant::now();
    let (_s, code) = socks_connect_raw(socks.addr(), None, 1, &[0x01, 10, 0, 0, 1], 443).await;
    assert_eq!(code, reply::NOT_ALLOWED);
    let (_s, code) = socks_connect_raw(socks.addr(), None, 1, &domain("example.com"), 443).await;
    assert_eq!(code, reply::NOT_ALLOWED);
    let mut v6 = vec![0x04];
    v6.extend_from_slice(
        &"::ffff:10.0.0.1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    let (_s, code) = socks_connect_raw(socks.addr(), None, 1, &v6, 443).await;
    assert_eq!(code, reply::NOT_ALLOWED);
    assert!(started.elapsed() < Duration::from_secs(5));

    // Unsupported command (BIND).
    let (_s, code) = socks_connect_raw(socks.addr(), None, 2, &[0x01, 127, 0, 0, 1], 80).await;
    assert_eq!(code, reply::COMMAND_NOT_SUPPORTED);

    // Loopback but nobody listening.
    let dead = FakeProxy::dead();
    let (_s, code) =
        socks_connect_raw(socks.addr(), None, 1, &[0x01, 127, 0, 0, 1], dead.port()).await;
    assert_eq!(code, reply::CONNECTION_REFUSED);

    assert_eq!(socks.refused(), 3);
    assert_eq!(socks.connects(), 6);
    let reqs = socks.requests();
    assert_eq!(reqs[1].addr, SocksAddr::Ipv4([10, 0, 0, 1].into()));
    assert_eq!(reqs[2].addr, SocksAddr::Domain("example.com".into()));

    // User/password server: wrong then right.
    let authed = FakeSocks::start(FakeSocksOpts::with_credentials("u", "p")).await;
    let (_s, code) = socks_connect_raw(
        authed.addr(),
        Some(("u", "bad")),
        1,
        &[0x01, 127, 0, 0, 1],
        origin.port(),
    )
    .await;
    assert_eq!(code, 0xFF, "auth failure");
    let (s, code) = socks_connect_raw(
        authed.addr(),
        Some(("u", "p")),
        1,
        &[0x01, 127, 0, 0, 1],
        origin.port(),
    )
    .await;
    assert_eq!(code, reply::SUCCEEDED);
    assert!(http_get_over(s).await.ends_with("ok"));
    assert_eq!(
        authed.auth_seen(),
        vec![("u".into(), "bad".into()), ("u".into(), "p".into())]
    );
    // A no-auth-only client is refused by a server that needs credentials.
    let mut s = within(TcpStream::connect(authed.addr())).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    let mut choice = [0u8; 2];
    within(s.read_exact(&mut choice)).await.unwrap();
    assert_eq!(choice, [5, 0xFF]);
}

#[tokio::test]
async fn socks5_peak_tunnels() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let socks = FakeSocks::start(FakeSocksOpts::default()).await;
    let mut open = Vec::new();
    for _ in 0..4 {
        let s = within(tokio_socks::tcp::Socks5Stream::connect(
            socks.addr(),
            origin.addr(),
        ))
        .await
        .unwrap();
        open.push(s);
    }
    assert!(wait_until(|| socks.tunnels() == 4, STEP).await);
    assert_eq!(socks.peak_tunnels(), 4);
    drop(open);
    assert!(wait_until(|| socks.tunnels() == 0, STEP).await);
    assert_eq!(socks.peak_tunnels(), 4);
    socks.reset_peak();
    assert_eq!(socks.peak_tunnels(), 0);
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

#[tokio::test]
async fn ten_concurrent_slow_requests_raise_peak_to_ten() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let client = client_via(&proxy.url());
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let c = client.clone();
        let url = origin.url("/slow?ms=500");
        tasks.push(tokio::spawn(async move {
            let r = c.get(url).send().await?;
            let status = r.status();
            r.bytes().await?;
            Ok::<_, reqwest::Error>(status)
        }));
    }
    for t in tasks {
        let status = within(t).await.unwrap().unwrap();
        assert_eq!(status, 200);
    }
    assert_eq!(proxy.peak_in_flight(), 10);
    assert_eq!(origin.peak_in_flight(), 10);
    assert!(wait_until(|| proxy.in_flight() == 0, STEP).await);
    assert!(wait_until(|| origin.in_flight() == 0, STEP).await);
    proxy.reset_peak();
    assert_eq!(proxy.peak_in_flight(), 0);
}

#[tokio::test]
async fn proxy_delay_holds_requests_in_flight() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts {
        delay: Some(Duration::from_millis(400)),
        ..FakeProxyOpts::default()
    })
    .await;
    let client = client_via(&proxy.url());
    let mut tasks = Vec::new();
    for i in 0..3 {
        let c = client.clone();
        let url = origin.url(&format!("/d{i}"));
        tasks.push(tokio::spawn(async move { c.get(url).send().await }));
    }
    assert!(wait_until(|| proxy.in_flight() == 3, STEP).await);
    assert_eq!(origin.request_count(), 0, "held before forwarding");
    for t in tasks {
        assert_eq!(within(t).await.unwrap().unwrap().status(), 200);
    }
    assert_eq!(origin.request_count(), 3);
    assert_eq!(proxy.peak_in_flight(), 3);
}

#[tokio::test]
async fn tunnel_counts_in_flight_until_close() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let mut s = within(TcpStream::connect(proxy.addr())).await.unwrap();
    let t = origin.authority();
    s.write_all(format!("CONNECT {t} HTTP/1.1\r\nHost: {t}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 256];
    let n = within(s.read(&mut buf)).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert_eq!(proxy.in_flight(), 1);
    let text = http_get_over(&mut s).await;
    assert!(text.ends_with("ok"), "{text}");
    drop(s);
    assert!(wait_until(|| proxy.in_flight() == 0, STEP).await);
}

// ---------------------------------------------------------------------------
// Modes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn modes_refuse_fail502_stall_captcha_and_revive() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(proxy.url()).unwrap())
        .pool_max_idle_per_host(0)
        .timeout(STEP)
        .build()
        .unwrap();
    let get = || client.get(origin.url("/ok")).send();

    assert_eq!(within(get()).await.unwrap().status(), 200);

    proxy.set_mode(ProxyMode::RefuseConnections).await;
    assert_eq!(proxy.mode(), ProxyMode::RefuseConnections);
    let err = within(get()).await.expect_err("refused");
    assert!(err.is_connect() || err.is_request(), "{err:?}");
    assert!(within(TcpStream::connect(proxy.addr())).await.is_err());

    proxy.set_mode(ProxyMode::Normal).await;
    assert_eq!(
        within(get()).await.unwrap().status(),
        200,
        "revived on same port"
    );

    proxy.set_mode(ProxyMode::Fail502).await;
    let r = within(get()).await.unwrap();
    assert_eq!(r.status(), 502);
    assert!(r.headers().contains_key("proxy-status"));

    proxy.set_mode(ProxyMode::Captcha).await;
    let r = within(get()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        within(r.text())
            .await
            .unwrap()
            .contains("<div class=\"g-recaptcha\"")
    );

    proxy.set_mode(ProxyMode::Stall).await;
    let short = reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(proxy.url()).unwrap())
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let err = within(short.get(origin.url("/ok")).send())
        .await
        .expect_err("stalled");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(proxy.seen().last().unwrap().outcome, ProxyOutcome::Stalled);
    assert_eq!(proxy.in_flight(), 1, "stalled request still in flight");
    // Killing the upstream closes the stalled exchange.
    proxy.set_mode(ProxyMode::RefuseConnections).await;
    assert!(wait_until(|| proxy.in_flight() == 0, STEP).await);
    proxy.set_mode(ProxyMode::Normal).await;
    assert_eq!(within(get()).await.unwrap().status(), 200);

    assert_eq!(
        origin.request_count(),
        3,
        "only Normal mode reached the origin"
    );
}

#[tokio::test]
async fn start_in_refuse_mode_and_dead_address() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts {
        mode: ProxyMode::RefuseConnections,
        ..FakeProxyOpts::default()
    })
    .await;
    assert!(within(TcpStream::connect(proxy.addr())).await.is_err());
    proxy.set_mode(ProxyMode::Normal).await;
    let r = within(client_via(&proxy.url()).get(origin.url("/ok")).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    let dead = FakeProxy::dead();
    assert!(dead.ip().is_loopback());
    let err = within(
        client_via(&format!("http://{dead}"))
            .get(origin.url("/ok"))
            .send(),
    )
    .await
    .expect_err("dead proxy");
    assert!(err.is_connect(), "{err:?}");
}

#[tokio::test]
async fn captcha_mode_connect_is_403_challenge() {
    let proxy = FakeProxy::start(FakeProxyOpts {
        mode: ProxyMode::Captcha,
        ..FakeProxyOpts::default()
    })
    .await;
    let resp = within(raw_http(
        proxy.addr(),
        b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: close\r\n\r\n",
    ))
    .await;
    let text = String::from_utf8_lossy(&resp).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 403"), "{text}");
    assert!(text.contains("cf-mitigated: challenge"));
    assert!(text.contains("g-recaptcha"));
}

// ---------------------------------------------------------------------------
// Origin
// ---------------------------------------------------------------------------

#[tokio::test]
async fn origin_routes() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let c = direct_client();

    let r = within(c.get(origin.url("status?code=503")).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 503);

    let r = within(c.get(origin.url("/captcha")).send()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        within(r.text())
            .await
            .unwrap()
            .contains("<div class=\"g-recaptcha\"")
    );

    let r = within(c.get(origin.url("/cf-challenge")).send())
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert_eq!(r.headers()["cf-mitigated"], "challenge");

    let r = within(
        c.get(origin.url("/bytes?n=5000&chunk=100&delay_ms=1"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(r.content_length(), Some(5000));
    assert_eq!(
        within(r.bytes()).await.unwrap().as_ref(),
        pattern_bytes(5000).as_slice()
    );

    let r = within(c.get(origin.url("/echo")).header("x-test", "1").send())
        .await
        .unwrap();
    let json: serde_json::Value = json_of(r).await;
    assert_eq!(json["path"], "/echo");
    assert!(
        json["headers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h[0] == "x-test" && h[1] == "1")
    );

    let raw = within(raw_http(
        origin.addr(),
        b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ))
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("ok"),
        "{text}"
    );
    assert_eq!(origin.request_count(), 6);
    assert_eq!(origin.requests()[4].header("x-test"), Some("1"));

    let fixed = Origin::start(OriginBehaviour::fixed("hello")).await;
    let r = within(c.get(fixed.url("/anything")).send()).await.unwrap();
    assert_eq!(within(r.text()).await.unwrap(), "hello");
}

#[tokio::test(start_paused = true)]
async fn slow_route_follows_the_paused_clock() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let real = Instant::now();
    let virt = tokio::time::Instant::now();
    let raw = raw_http(
        origin.addr(),
        b"GET /slow?ms=3000 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(virt.elapsed() >= Duration::from_millis(3000));
    assert!(real.elapsed() < Duration::from_secs(2), "no real waiting");
}

#[tokio::test(start_paused = true)]
async fn proxy_delay_follows_the_paused_clock() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let proxy = FakeProxy::start(FakeProxyOpts {
        delay: Some(Duration::from_millis(1000)),
        ..FakeProxyOpts::default()
    })
    .await;
    let real = Instant::now();
    let virt = tokio::time::Instant::now();
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        origin.url("/slow?ms=2000"),
        origin.authority()
    );
    let raw = raw_http(proxy.addr(), req.as_bytes()).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.ends_with("slow"), "{text}");
    assert!(virt.elapsed() >= Duration::from_millis(3000));
    assert!(real.elapsed() < Duration::from_secs(2), "no real waiting");
}

// ---------------------------------------------------------------------------
// Lifecycle and small helpers
// ---------------------------------------------------------------------------

fn refuses(addr: SocketAddr) -> bool {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
}

#[tokio::test]
async fn servers_stop_when_dropped() {
    let ca = TestCa::new();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let tls_origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let proxy = FakeProxy::start(FakeProxyOpts::default()).await;
    let socks = FakeSocks::start(FakeSocksOpts::default()).await;
    let addrs = [origin.addr(), tls_origin.addr(), proxy.addr(), socks.addr()];
    assert!(addrs.iter().all(|a| !refuses(*a)));

    // An open tunnel is closed too.
    let mut tunnel = within(tokio_socks::tcp::Socks5Stream::connect(
        socks.addr(),
        origin.addr(),
    ))
    .await
    .unwrap();
    drop((origin, tls_origin, proxy, socks));
    for a in addrs {
        assert!(wait_until(|| refuses(a), STEP).await, "{a} still listening");
    }
    let mut buf = [0u8; 16];
    let n = within(tunnel.read(&mut buf)).await.unwrap_or(0);
    assert_eq!(n, 0, "tunnel closed");
}

#[tokio::test]
async fn small_helpers() {
    common::init_tracing();
    common::init_tracing();
    let p = common::free_port();
    assert_ne!(p, 0);
    assert!(!wait_until(|| false, Duration::from_millis(30)).await);
    let mut n = 0;
    assert!(
        wait_until(
            || {
                n += 1;
                n > 3
            },
            STEP
        )
        .await
    );
    assert_eq!(common::basic_auth("a", "b"), "Basic YTpi");
    assert_eq!(common::decode_basic("Basic YTpi"), "a:b");
    // raw_http to a closed port returns nothing rather than hanging.
    let empty = within(raw_http(FakeProxy::dead(), b"GET / HTTP/1.1\r\n\r\n")).await;
    assert!(empty.is_empty());
}
