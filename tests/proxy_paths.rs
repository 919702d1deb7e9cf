//! The two proxy paths end to end: absolute-form HTTP and CONNECT, through each upstream kind,
//! with the header hygiene users rely on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{
    FakeProxy, FakeProxyOpts, FakeSocks, FakeSocksOpts, Origin, OriginBehaviour, TestCa,
    TestGateway,
};

/// Pool config with the given upstream URLs, private (loopback) targets allowed, CONNECT allowed to
/// `port`.
fn pool_config(upstreams: &[String], port: u16) -> String {
    let list: Vec<String> = upstreams.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [443, {port}]\n\
         [pools.default]\nupstreams = [{}]\n",
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_client_via_http_proxy_env_reaches_origin_through_upstream() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::with_credentials("up-user", "up-pass")).await;
    let gw = TestGateway::start(&pool_config(&[upstream.url_with_auth()], origin.port())).await;

    // curl configured only through the standard environment, with its own proxy credentials
    // (which carry a session token) and gateway control headers.
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "-D", "-"])
        .args(["-H", "X-Pool-Session: k1", "-H", "X-Pool-Debug: 1"])
        .arg(origin.url("/hello?x=1"))
        .env_clear()
        .env(
            "http_proxy",
            format!("http://client-user:client-pass@{}", gw.proxy),
        )
        .output()
        .await
        .expect("curl runs");
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(text.starts_with("http/1.1 200"), "{text}");
    assert!(
        text.contains(&format!("x-pool-upstream: http://{}", upstream.addr())),
        "{text}"
    );
    assert!(text.contains("x-pool-session: k1"), "{text}");

    // The upstream saw the request with its own configured credentials, not the client's.
    assert_eq!(upstream.auth_seen(), vec!["up-user:up-pass".to_string()]);
    let seen = &upstream.seen()[0];
    assert_eq!(seen.target, origin.url("/hello?x=1"));
    assert!(
        seen.headers
            .iter()
            .all(|(k, _)| !k.to_lowercase().starts_with("x-pool-")),
        "{:?}",
        seen.headers
    );

    // The origin saw neither gateway headers nor any proxy credentials.
    let reqs = origin.requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert_eq!(r.path, "/hello");
    for (k, _) in &r.headers {
        let k = k.to_lowercase();
        assert!(
            !k.starts_with("x-pool-") && k != "proxy-authorization",
            "origin saw {k}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reqwest_client_post_body_passes_through_unchanged() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&pool_config(&[upstream.url()], origin.port())).await;
    let body = vec![b'z'; 100_000];
    let resp = gw
        .client()
        .post(origin.url("/upload"))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let echo: serde_json::Value = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["body_len"], 100_000);
    // Later requests reuse the kept-alive connection to the upstream.
    for _ in 0..5 {
        let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.text().await.unwrap(), "ok");
    }
    assert_eq!(upstream.requests(), 6);
    assert_eq!(
        upstream.connections(),
        1,
        "one upstream connection for six requests"
    );
}

/// HTTPS to a TLS origin through CONNECT, for one kind of upstream.
async fn https_through(upstream_url: String, origin: &Origin, ca: &TestCa) -> TestGateway {
    let gw = TestGateway::start(&pool_config(&[upstream_url], origin.port())).await;
    let client = gw.client_via(&gw.proxy_url(), Some(ca));
    for _ in 0..3 {
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "ok");
    }
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_connect_via_http_upstream() {
    let ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let upstream = FakeProxy::start(FakeProxyOpts::with_credentials("u", "p")).await;
    let _gw = https_through(upstream.url_with_auth(), &origin, &ca).await;
    assert!(upstream.connects() >= 1);
    assert!(upstream.auth_seen().iter().all(|a| a == "u:p"));
    assert_eq!(origin.request_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_connect_via_socks5_upstreams() {
    let ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let socks = FakeSocks::start(FakeSocksOpts::with_credentials("su", "sp")).await;
    let _gw = https_through(socks.url_with_auth(), &origin, &ca).await;
    assert!(socks.connects() >= 1);
    assert!(
        socks
            .auth_seen()
            .iter()
            .all(|(u, p)| u == "su" && p == "sp")
    );
    // socks5h: the name goes to the proxy unresolved.
    let socks_h = FakeSocks::start(FakeSocksOpts::default()).await;
    let gw = TestGateway::start(&pool_config(&[socks_h.url_h()], origin.port())).await;
    let client = gw.client_via(&gw.proxy_url(), Some(&ca));
    let resp = client
        .get(origin.url_localhost("/ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok");
    assert_eq!(socks_h.requests()[0].addr.host(), "localhost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_connect_via_direct_upstream() {
    let ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let _gw = https_through("direct://127.0.0.1".to_string(), &origin, &ca).await;
    assert_eq!(origin.request_count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_via_socks_and_direct_uses_origin_form_and_keeps_connections() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let socks = FakeSocks::start(FakeSocksOpts::default()).await;
    for up in [socks.url(), "direct://".to_string()] {
        let gw = TestGateway::start(&pool_config(std::slice::from_ref(&up), origin.port())).await;
        let client = gw.client();
        for i in 0..5 {
            let resp = client
                .get(origin.url(&format!("/p{i}")))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200, "{up}");
            let echo: serde_json::Value =
                serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap();
            assert_eq!(echo["uri"], format!("/p{i}"), "origin-form through {up}");
        }
    }
    // Five requests through the SOCKS upstream reused one tunnel to the origin.
    assert_eq!(socks.connects(), 1, "keep-alive reuse through SOCKS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_proxy_and_malformed_requests_get_400_and_others_keep_being_served() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let gw = TestGateway::start(&pool_config(&["direct://".to_string()], origin.port())).await;

    let resp = common::raw_http(gw.proxy, b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let text = String::from_utf8_lossy(&resp).to_lowercase();
    assert!(text.starts_with("http/1.1 400"), "{text}");
    assert!(text.contains("x-pool-error: not-a-proxy-request"), "{text}");
    assert!(
        text.contains("proxy-status: poolgate; error=http_request_error"),
        "{text}"
    );
    assert!(text.contains("send absolute-form requests"), "{text}");

    for garbage in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n"[..],
        b"GET http://[::1 HTTP/1.1\r\n\r\n",
        b"NOT A REQUEST\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: a\r\nbad header\r\n\r\n",
    ] {
        let resp = common::raw_http(gw.proxy, garbage).await;
        let text = String::from_utf8_lossy(&resp);
        assert!(text.starts_with("HTTP/1.1 400"), "{garbage:?} -> {text}");
    }
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_policy_denies_internal_targets_without_dialing() {
    // A fake upstream that would refuse anyway; the gateway must not even ask it.
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    let resp = common::raw_http(
        gw.proxy,
        b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n",
    )
    .await;
    let text = String::from_utf8_lossy(&resp).to_lowercase();
    assert!(
        text.starts_with("http/1.1 403") && text.contains("x-pool-error: target-denied"),
        "{text}"
    );
    let resp = common::raw_http(
        gw.proxy,
        b"CONNECT example.com:25 HTTP/1.1\r\nHost: example.com:25\r\n\r\n",
    )
    .await;
    assert!(String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 403"));
    assert_eq!(upstream.requests() + upstream.connects(), 0);
}
