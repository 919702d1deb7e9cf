//! The target policy end to end: internal targets and other ports are denied with 403
//! `target-denied` by default and allowed when the config says so; `direct://` checks the address
//! a name resolved to (names mapped to loopback by an injected resolver); the admin API is not
//! reachable through the proxy port.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use common::{
    FakeProxy, FakeProxyOpts, FakeSocks, FakeSocksOpts, Origin, OriginBehaviour, TestGateway,
};
use poolgate::app::StartOptions;
use poolgate::upstream::connect::Resolve;

const DENIED_CONNECTS: [&str; 6] = [
    "127.0.0.2:25",
    "127.0.0.1:443",
    "[::1]:443",
    "[::ffff:127.0.0.1]:443",
    "169.254.169.254:443",
    "localhost:443",
];

async fn connect_status(gw: &TestGateway, target: &str) -> String {
    let raw = common::raw_http(
        gw.proxy,
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
    )
    .await;
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_targets_and_other_ports_are_denied_by_default() {
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    for target in DENIED_CONNECTS {
        let text = connect_status(&gw, target).await;
        assert!(text.starts_with("HTTP/1.1 403"), "{target}: {text}");
        assert!(
            text.to_lowercase().contains("x-pool-error: target-denied"),
            "{target}: {text}"
        );
    }
    // Plain HTTP to internal targets too.
    for url in [
        "http://127.0.0.1:9/",
        "http://[::1]:9/",
        "http://169.254.169.254/latest/meta-data/",
        "http://localhost:9/",
        "http://10.0.0.1/",
    ] {
        let resp = gw.client().get(url).send().await.unwrap();
        assert_eq!(resp.status(), 403, "{url}");
        assert_eq!(resp.headers()["x-pool-error"], "target-denied");
    }
    assert_eq!(upstream.connects() + upstream.requests(), 0, "nothing left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicitly_allowed_targets_go_through() {
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[policy]\nconnect_ports = [443, 25]\n\
         allow_targets = [\"127.0.0.0/8\", \"::1\", \"169.254.169.254/32\", \"localhost\"]\n\
         [pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    for target in DENIED_CONNECTS {
        let text = connect_status(&gw, target).await;
        // The fake upstream refuses to dial anything but loopback, and nothing listens on these
        // loopback ports: a 502 from the upstream leg, not a 403 from the policy.
        assert!(!text.contains("target-denied"), "{target}: {text}");
        assert!(text.starts_with("HTTP/1.1 502"), "{target}: {text}");
    }
    assert_eq!(upstream.connects(), DENIED_CONNECTS.len());
    // Not listed: still denied.
    let text = connect_status(&gw, "10.0.0.1:443").await;
    assert!(text.starts_with("HTTP/1.1 403"), "{text}");
}

/// Maps test names to fixed addresses; literals never reach it.
struct MapResolver(HashMap<String, IpAddr>);

impl Resolve for MapResolver {
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send + 'static>> {
        let found = self.0.get(host).map(|ip| vec![SocketAddr::new(*ip, port)]);
        Box::pin(async move {
            found.ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "unknown"))
        })
    }
}

async fn direct_gateway(policy: &str) -> TestGateway {
    let resolver = MapResolver(HashMap::from([
        ("rebind.test".to_string(), "127.0.0.1".parse().unwrap()),
        (
            "mapped.test".to_string(),
            "::ffff:127.0.0.1".parse().unwrap(),
        ),
    ]));
    TestGateway::start_text_with(
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [policy]\n{policy}\n[pools.default]\nupstreams = [\"direct://\"]\n"
        ),
        StartOptions {
            resolver: Some(Arc::new(resolver)),
            ..StartOptions::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_checks_the_resolved_address_so_rebinding_names_are_denied() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let gw = direct_gateway("").await;
    for host in ["rebind.test", "mapped.test"] {
        let resp = gw
            .client()
            .get(format!("http://{host}:{}/ok", origin.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{host}");
        assert_eq!(resp.headers()["x-pool-error"], "target-denied");
    }
    assert_eq!(origin.request_count(), 0, "nothing was dialed");
    // The denial is not the upstream's fault.
    let st = gw.upstream_status("default", "direct://").await;
    assert_eq!(st["outcomes"]["connect_error"], 0, "{st}");

    // Allowed by name: the name may resolve internally.
    let gw = direct_gateway("allow_targets = [\"rebind.test\"]").await;
    let resp = gw
        .client()
        .get(format!("http://rebind.test:{}/ok", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(origin.request_count(), 1);
    let resp = gw
        .client()
        .get(format!("http://mapped.test:{}/ok", origin.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403, "another name is still checked");
}

/// Names that resolve (through the injected resolver) to loopback, the metadata address and a
/// private network.
const INSIDE_NAMES: [(&str, &str); 3] = [
    ("loop.test", "127.0.0.1"),
    ("metadata.test", "169.254.169.254"),
    ("private.test", "10.0.0.5"),
];

/// A gateway whose one upstream is the fake SOCKS server as `socks5://` (names resolved by the
/// gateway), with `INSIDE_NAMES` as its resolver.
async fn socks5_gateway(socks: &FakeSocks, policy: &str) -> TestGateway {
    let resolver = MapResolver(
        INSIDE_NAMES
            .iter()
            .map(|(name, ip)| (name.to_string(), ip.parse().unwrap()))
            .collect(),
    );
    TestGateway::start_text_with(
        &format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [policy]\n{policy}\n[pools.default]\nupstreams = [\"{}\"]\n",
            socks.url()
        ),
        StartOptions {
            resolver: Some(Arc::new(resolver)),
            ..StartOptions::default()
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_checks_the_addresses_it_resolves_like_direct() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let port = origin.port();
    let socks = FakeSocks::start(FakeSocksOpts::default()).await;
    let gw = socks5_gateway(&socks, &format!("connect_ports = [{port}]")).await;
    for (name, _) in INSIDE_NAMES {
        let resp = gw
            .client()
            .get(format!("http://{name}:{port}/ok"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{name}");
        assert_eq!(resp.headers()["x-pool-error"], "target-denied", "{name}");
        assert!(
            resp.headers()["proxy-status"]
                .to_str()
                .unwrap()
                .contains("destination_ip_prohibited"),
            "{name}"
        );
        let text = connect_status(&gw, &format!("{name}:{port}")).await;
        assert!(text.starts_with("HTTP/1.1 403"), "CONNECT {name}: {text}");
        assert!(
            text.to_lowercase().contains("x-pool-error: target-denied"),
            "CONNECT {name}: {text}"
        );
    }
    assert_eq!(
        socks.connections(),
        0,
        "the SOCKS upstream was never contacted"
    );
    assert_eq!(origin.request_count(), 0);
    // The denial is not the upstream's fault.
    let st = gw.upstream_status("default", &socks.url()).await;
    assert_eq!(st["outcomes"]["upstream_error"], 0, "{st}");
    assert_eq!(st["outcomes"]["connect_error"], 0, "{st}");

    // With private targets allowed the resolved address is what the SOCKS server is asked for.
    // The fake dials loopback only and refuses the rest (0x02) without dialing: a 502 from the
    // upstream leg, not a 403 from the policy. A gateway per name, so that no refusal counts
    // against the upstream's health before the next request.
    for (name, ip) in INSIDE_NAMES {
        let socks = FakeSocks::start(FakeSocksOpts::default()).await;
        let gw = socks5_gateway(
            &socks,
            &format!("allow_private_targets = true\nconnect_ports = [{port}]"),
        )
        .await;
        let resp = gw
            .client()
            .get(format!("http://{name}:{port}/ok"))
            .send()
            .await
            .unwrap();
        let want = if name == "loop.test" { 200 } else { 502 };
        assert_eq!(resp.status(), want, "{name}");
        let sent: Vec<String> = socks.requests().iter().map(|r| r.addr.host()).collect();
        assert_eq!(sent, [ip], "{name}");
    }
    assert_eq!(origin.request_count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_is_not_reachable_through_the_proxy_port() {
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start_with(
        "admin_token = \"0123456789abcdef0123\"",
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [443, 1, 65535]\n\
             [pools.default]\nupstreams = [\"{}\"]\n",
            upstream.url()
        ),
    )
    .await;
    let port = gw.admin.port();
    for url in [
        format!("http://127.0.0.1:{port}/status"),
        format!("http://localhost:{port}/status"),
        format!("http://[::1]:{port}/status"),
        format!("http://127.0.0.1:{}/status", gw.proxy.port()),
    ] {
        let resp = gw.client().post(&url).send().await.unwrap();
        assert_eq!(resp.status(), 403, "{url}");
        assert_eq!(resp.headers()["x-pool-error"], "target-denied");
    }
    assert_eq!(upstream.requests(), 0);
}

/// Spellings that `inet_aton` and WHATWG read as internal addresses: fewer parts, one integer,
/// hexadecimal, octal, mixed, a trailing dot.
const LEGACY_INTERNAL: [&str; 10] = [
    "127.1",
    "2130706433",
    "0x7f000001",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "127.0.0.1.",
    "0xa9fea9fe",
    "169.254.43518",
    "012.1",
    "0",
];

/// Hosts whose last label is numeric but that mean no address, and hosts no DNS name has.
const NOT_A_HOST: [&str; 6] = [
    "127.0.0.256",
    "1.2.3.4.5",
    "09.1",
    "foo.123",
    "127..1",
    "0x7g.1",
];

fn head_of(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw).into_owned();
    text.split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spelling_of_an_internal_ipv4_is_denied_on_connect_and_absolute_form() {
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    for host in LEGACY_INTERNAL {
        let head = head_of(
            &common::raw_http(
                gw.proxy,
                format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n").as_bytes(),
            )
            .await,
        );
        assert!(head.starts_with("http/1.1 403"), "CONNECT {host}: {head}");
        assert!(
            head.contains("x-pool-error: target-denied"),
            "{host}: {head}"
        );
        assert!(head.contains("destination_ip_prohibited"), "{host}: {head}");
        // Raw bytes: an HTTP client library would canonicalise the URL itself.
        let head = head_of(
            &common::raw_http(
                gw.proxy,
                format!(
                    "GET http://{host}/latest/meta-data/ HTTP/1.1\r\nHost: {host}\r\n\
                     Connection: close\r\n\r\n"
                )
                .as_bytes(),
            )
            .await,
        );
        assert!(head.starts_with("http/1.1 403"), "GET {host}: {head}");
        assert!(
            head.contains("x-pool-error: target-denied"),
            "{host}: {head}"
        );
        assert!(head.contains("proxy-status:"), "{host}: {head}");
    }
    for host in NOT_A_HOST {
        for request in [
            format!("CONNECT {host}:443 HTTP/1.1\r\nHost: {host}:443\r\n\r\n"),
            format!("GET http://{host}/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        ] {
            let head = head_of(&common::raw_http(gw.proxy, request.as_bytes()).await);
            assert!(head.starts_with("http/1.1 400"), "{request:?}: {head}");
            assert!(head.contains("x-pool-error: bad-request"), "{host}: {head}");
        }
    }
    assert_eq!(upstream.connects() + upstream.requests(), 0, "nothing left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_legacy_spelling_reaches_the_upstream_as_its_dotted_quad() {
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_targets = [\"127.0.0.0/8\"]\n[pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    for host in ["127.1", "2130706433", "0x7f.0.0.1", "0177.0.0.1"] {
        let text = connect_status(&gw, &format!("{host}:443")).await;
        assert!(!text.contains("target-denied"), "{host}: {text}");
    }
    let seen: Vec<String> = upstream.targets().into_iter().map(|(_, t)| t).collect();
    assert_eq!(
        seen,
        vec!["127.0.0.1:443"; 4],
        "the upstream never sees a legacy spelling"
    );
}

/// The head of the answer to a raw absolute-form GET (raw: a client library would not send some
/// of these ports at all).
async fn get_head(gw: &TestGateway, authority: &str) -> String {
    head_of(
        &common::raw_http(
            gw.proxy,
            format!(
                "GET http://{authority}/ HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await,
    )
}

fn assert_port_denied(head: &str, what: &str) {
    assert!(head.starts_with("http/1.1 403"), "{what}: {head}");
    assert!(
        head.contains("x-pool-error: target-denied"),
        "{what}: {head}"
    );
    assert!(
        head.contains("proxy-status: poolgate; error=destination_ip_prohibited"),
        "{what}: {head}"
    );
    assert!(
        head.contains("http to this port is not allowed"),
        "{what}: {head}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_http_reaches_only_the_allowed_ports() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n[pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    // By default Squid's Safe_ports: privileged ports other than the web's are refused before any
    // upstream is leased, public name or not.
    for authority in [
        "example.test:22",
        "example.test:25",
        "example.test:1024",
        "203.0.113.5:6",
        "127.0.0.1:110",
    ] {
        assert_port_denied(&get_head(&gw, authority).await, authority);
    }
    assert_eq!(upstream.connections(), 0, "no upstream was contacted");
    // The origin's port (the kernel's pick, above 1024) is allowed.
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(upstream.requests(), 1);
    assert_eq!(origin.request_count(), 1);

    // Configured: only what is listed, ports and ranges.
    let port = origin.port();
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nhttp_ports = [8, \"{port}-{port}\"]\n\
         [pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url()
    ))
    .await;
    for authority in ["example.test", "example.test:443", "example.test:65535"] {
        assert_port_denied(&get_head(&gw, authority).await, authority);
    }
    assert_eq!(upstream.connections(), 0, "no upstream was contacted");
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(origin.request_count(), 2);
}
