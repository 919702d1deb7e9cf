//! HTTPS visibility: TLS interception for pools with `inspect_tls`, exclusions, clients that do
//! not trust the interception CA, leaf caching, outcome feedback for opaque tunnels, and the
//! opaque-tunnel heuristics. Everything on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::origin::CAPTCHA_HTML;
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestCa, TestGateway};
use poolgate::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const ADMIN_TOKEN: &str = "feedback-token-0123456789";

/// An interception CA written to `dir`, the origin CA's PEM beside it, and the `[intercept]`
/// table that uses both.
struct Interception {
    dir: tempfile::TempDir,
    ca_pem: String,
}

impl Interception {
    fn new(origin_ca: &TestCa) -> Interception {
        let dir = tempfile::tempdir().unwrap();
        poolgate::intercept::ca::write_new(
            &dir.path().join("ca.pem"),
            &dir.path().join("ca-key.pem"),
            "poolgate test interception CA",
            false,
        )
        .unwrap();
        std::fs::write(dir.path().join("origin-ca.pem"), origin_ca.cert_pem()).unwrap();
        let ca_pem = std::fs::read_to_string(dir.path().join("ca.pem")).unwrap();
        Interception { dir, ca_pem }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn table(&self, extra: &str) -> String {
        format!(
            "[intercept]\nca_cert = {:?}\nca_key = {:?}\norigin_ca_file = {:?}\n{extra}\n",
            self.path("ca.pem"),
            self.path("ca-key.pem"),
            self.path("origin-ca.pem"),
        )
    }

    fn reqwest_cert(&self) -> reqwest::Certificate {
        reqwest::Certificate::from_pem(self.ca_pem.as_bytes()).unwrap()
    }

    fn root_store(&self) -> rustls::RootCertStore {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.ca_pem.as_bytes()).unwrap())
            .unwrap();
        roots
    }
}

/// A config: `[policy]` for loopback targets on `port`, the interception table, one pool.
fn config(icpt: &Interception, upstreams: &[String], port: u16, pool_extra: &str) -> String {
    let list: Vec<String> = upstreams.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [443, {port}]\n{}\
         [pools.default]\nupstreams = [{}]\n{pool_extra}\n",
        icpt.table(""),
        list.join(", ")
    )
}

async fn fake_proxies(n: usize) -> Vec<FakeProxy> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    v
}

/// A client through `proxy_url` trusting exactly `roots`.
fn client(proxy_url: &str, roots: Vec<reqwest::Certificate>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy_url).unwrap())
        .tls_built_in_root_certs(false)
        .timeout(Duration::from_secs(20));
    for r in roots {
        b = b.add_root_certificate(r);
    }
    b.build().unwrap()
}

/// Bans health has observed for `upstream` on `target` (the `/status` matrix).
async fn bans(gw: &TestGateway, upstream: &str, target: &str) -> u64 {
    let status = gw.status().await;
    status["pools"][0]["matrix"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|row| row["target"] == target)
        .flat_map(|row| row["cells"].as_array().unwrap().iter())
        .filter(|c| c["upstream"] == upstream)
        .map(|c| c["bans"].as_u64().unwrap())
        .sum()
}

/// Polls `/status` until `cond` holds (at most 5 s).
async fn eventually<F>(gw: &TestGateway, what: &str, mut cond: F) -> serde_json::Value
where
    F: FnMut(&serde_json::Value) -> bool,
{
    let mut last = serde_json::Value::Null;
    for _ in 0..500 {
        last = gw.status().await;
        if cond(&last) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}: {last}");
}

fn upstream_of<'a>(status: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    status["pools"][0]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == id)
        .unwrap()
}

/// Requests `url` through a session until its upstream is quarantined; returns how many captcha
/// pages that took (each checked to arrive unchanged).
async fn captchas_until_quarantined(gw: &TestGateway, client: &reqwest::Client, url: &str) -> u64 {
    for i in 1..=12u64 {
        let resp = client.get(url).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let id = resp.headers()["x-pool-upstream"]
            .to_str()
            .unwrap()
            .to_string();
        assert_eq!(
            resp.headers()["content-type"],
            "text/html; charset=utf-8",
            "headers pass through"
        );
        assert_eq!(
            resp.text().await.unwrap(),
            CAPTCHA_HTML,
            "the page is unchanged"
        );
        // Health hears each response when its body ends, off the response path: wait for it.
        for _ in 0..500 {
            if bans(gw, &id, "127.0.0.1").await >= i {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(bans(gw, &id, "127.0.0.1").await, i);
        if gw.upstream_status("default", &id).await["state"] == "quarantined" {
            return i;
        }
    }
    panic!("never quarantined");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captchas_inside_inspected_https_quarantine_after_as_many_as_over_plain_http() {
    let origin_ca = TestCa::new();
    let icpt = Interception::new(&origin_ca);
    let tls_origin = Origin::start_tls(OriginBehaviour::echo(), &origin_ca).await;
    let plain_origin = Origin::start(OriginBehaviour::echo()).await;

    // Plain HTTP, the reference.
    let ups = fake_proxies(5).await;
    let urls: Vec<String> = ups.iter().map(FakeProxy::url).collect();
    let gw = TestGateway::start(&config(&icpt, &urls, plain_origin.port(), "")).await;
    let plain = client(&gw.proxy_url_as("acct-session-cap1"), vec![]);
    let plain_count = captchas_until_quarantined(&gw, &plain, &plain_origin.url("/captcha")).await;

    // HTTPS through an inspecting pool.
    let ups = fake_proxies(5).await;
    let urls: Vec<String> = ups.iter().map(FakeProxy::url).collect();
    let gw = TestGateway::start(&config(
        &icpt,
        &urls,
        tls_origin.port(),
        "inspect_tls = true",
    ))
    .await;
    let https = client(
        &gw.proxy_url_as("acct-session-cap2"),
        vec![origin_ca.reqwest_cert(), icpt.reqwest_cert()],
    );
    let https_count = captchas_until_quarantined(&gw, &https, &tls_origin.url("/captcha")).await;
    eprintln!("captchas until quarantine: plain HTTP {plain_count}, inspected HTTPS {https_count}");
    assert_eq!(plain_count, 5, "default thresholds: 5 captchas");
    assert_eq!(https_count, plain_count);

    let status = gw.status().await;
    let i = &status["intercept"];
    assert_eq!(i["enabled"], true, "{i}");
    assert!(i["tunnels_inspected"].as_u64().unwrap() >= 1, "{i}");
    assert_eq!(i["requests"], 5, "{i}");
    assert_eq!(i["client_handshake_failures"], 0, "{i}");
    // Once the client closes its tunnel, the store has counted every relayed response once.
    drop(https);
    let status = eventually(&gw, "the tunnel's lease to be released", |s| {
        s["pools"][0]["leases_live"] == 0
    })
    .await;
    let quarantined: Vec<&serde_json::Value> = status["pools"][0]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["state"] == "quarantined")
        .collect();
    assert_eq!(quarantined.len(), 1);
    assert_eq!(
        quarantined[0]["outcomes"]["captcha"], 5,
        "{}",
        quarantined[0]
    );
    assert_eq!(
        quarantined[0]["outcomes"]["cancelled"], 0,
        "{}",
        quarantined[0]
    );
}

/// CONNECT to `authority` through the gateway (raw bytes), then a TLS handshake with `sni`
/// trusting only `roots`. Returns the server's certificate chain.
async fn tls_through(
    gw: &TestGateway,
    authority: &str,
    sni: &str,
    roots: rustls::RootCertStore,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    let tcp = connect_tunnel(gw, authority, "").await;
    let cfg = rustls::ClientConfig::builder_with_provider(common::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tls = tokio::time::timeout(
        Duration::from_secs(10),
        connector.connect(common::tls::server_name(sni), tcp),
    )
    .await
    .map_err(|_| "handshake timed out".to_string())?
    .map_err(|e| e.to_string())?;
    Ok(tls.get_ref().1.peer_certificates().unwrap().to_vec())
}

/// Sends CONNECT (with `extra` header lines) and reads the reply head; returns the stream,
/// positioned at the first tunnel byte. Panics unless the reply is 200.
async fn connect_tunnel(gw: &TestGateway, authority: &str, extra: &str) -> TcpStream {
    let (tcp, head) = connect_tunnel_head(gw, authority, extra).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tcp
}

async fn connect_tunnel_head(
    gw: &TestGateway,
    authority: &str,
    extra: &str,
) -> (TcpStream, String) {
    let mut tcp = TcpStream::connect(gw.proxy).await.unwrap();
    tcp.write_all(
        format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n{extra}\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    // Bounded: a reply head is far below 16 KiB.
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
        let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut byte))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 1, "connection closed in the reply head");
        head.push(byte[0]);
    }
    (tcp, String::from_utf8_lossy(&head).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_hosts_and_non_tls_clients_are_tunnelled_raw() {
    let origin_ca = TestCa::new();
    let icpt = Interception::new(&origin_ca);
    let origin = Origin::start_tls(OriginBehaviour::echo(), &origin_ca).await;
    let gw = TestGateway::start(&config(
        &icpt,
        &["direct://".to_string()],
        origin.port(),
        "inspect_tls = true\ninspect_exclude = [\"localhost\", \"*.bank.example\"]",
    ))
    .await;
    let authority = format!("127.0.0.1:{}", origin.port());

    // Excluded by SNI: the client sees the origin's own certificate (it trusts only the origin CA,
    // and the handshake through the gateway succeeds)...
    let chain = tls_through(&gw, &authority, "localhost", origin_ca.root_store())
        .await
        .unwrap();
    // ...and the same name does not verify against the interception CA: it was not minted.
    let err = tls_through(&gw, &authority, "localhost", icpt.root_store())
        .await
        .unwrap_err();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // A reqwest client that trusts only the origin CA works end to end with an excluded host.
    let raw_client = client(&gw.proxy_url(), vec![origin_ca.reqwest_cert()]);
    let resp = raw_client
        .get(origin.url_localhost("/ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok");

    // Not excluded: the gateway answers with a leaf of its own for the name.
    let minted = tls_through(&gw, &authority, "127.0.0.1", icpt.root_store())
        .await
        .unwrap();
    assert_ne!(minted[0], chain[0]);

    // A client that speaks plain HTTP inside the tunnel passes through untouched.
    let plain = Origin::start(OriginBehaviour::echo()).await;
    let gw2 = TestGateway::start(&config(
        &icpt,
        &["direct://".to_string()],
        plain.port(),
        "inspect_tls = true",
    ))
    .await;
    let mut tcp = connect_tunnel(&gw2, &plain.authority(), "").await;
    tcp.write_all(b"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
        "{answer}"
    );

    let status = gw.status().await;
    assert!(
        status["intercept"]["tunnels_excluded"].as_u64().unwrap() >= 3,
        "{status}"
    );
    let status = gw2.status().await;
    assert_eq!(status["intercept"]["tunnels_passthrough"], 1, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_trust_the_ca_fails_is_counted_and_the_upstream_is_untouched() {
    let origin_ca = TestCa::new();
    let icpt = Interception::new(&origin_ca);
    let origin = Origin::start_tls(OriginBehaviour::echo(), &origin_ca).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&config(
        &icpt,
        &[up.url()],
        origin.port(),
        "inspect_tls = true",
    ))
    .await;
    // Trusts the origin's CA but not the gateway's.
    let untrusting = client(&gw.proxy_url(), vec![origin_ca.reqwest_cert()]);
    for _ in 0..3 {
        let err = untrusting.get(origin.url("/ok")).send().await.unwrap_err();
        eprintln!("client error as expected: {err:?}");
    }
    let status = eventually(&gw, "three failures counted and leases released", |s| {
        s["intercept"]["client_handshake_failures"] == 3 && s["pools"][0]["leases_live"] == 0
    })
    .await;
    let u = upstream_of(&status, &up.url());
    assert_eq!(u["state"], "healthy", "{u}");
    assert!(u["success_ratio"].is_null(), "health saw no sample: {u}");
    for (k, v) in u["outcomes"].as_object().unwrap() {
        let want = if k == "cancelled" { 3 } else { 0 };
        assert_eq!(v.as_u64().unwrap(), want, "outcome {k}: {u}");
    }
    assert_eq!(status["intercept"]["tunnels_inspected"], 0);
    assert_eq!(origin.request_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaves_are_cached_per_name_within_the_bound() {
    let origin_ca = TestCa::new();
    let icpt = Interception::new(&origin_ca);
    let origin = Origin::start_tls(OriginBehaviour::echo(), &origin_ca).await;
    let text = format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n{}\
         [pools.default]\nupstreams = [\"direct://\"]\ninspect_tls = true\n",
        origin.port(),
        icpt.table("cert_cache_size = 20"),
    );
    let gw = TestGateway::start(&text).await;
    let authority = format!("127.0.0.1:{}", origin.port());
    let first = tls_through(&gw, &authority, "name-0.test", icpt.root_store())
        .await
        .unwrap();
    let again = tls_through(&gw, &authority, "name-0.test", icpt.root_store())
        .await
        .unwrap();
    assert_eq!(first[0], again[0], "the same name reuses its certificate");
    for i in 1..30 {
        tls_through(
            &gw,
            &authority,
            &format!("name-{i}.test"),
            icpt.root_store(),
        )
        .await
        .unwrap();
    }
    let status = gw.status().await;
    let i = &status["intercept"];
    assert_eq!(i["cert_cache_capacity"], 20, "{i}");
    assert_eq!(i["cert_cache_entries"], 20, "{i}");
    assert_eq!(i["certs_minted"], 30, "{i}");
    // These names are not the origin's: its certificate does not verify for them.
    assert!(
        i["origin_handshake_failures"].as_u64().unwrap() >= 30,
        "{i}"
    );
}

async fn post_feedback(
    gw: &TestGateway,
    token: Option<&str>,
    body: &str,
) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{}/feedback", gw.admin))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let json = serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or_default();
    (status, json)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_captcha_reports_for_a_session_quarantine_its_upstream() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = fake_proxies(5).await;
    let list: Vec<String> = ups.iter().map(|u| format!("{:?}", u.url())).collect();
    let gw = TestGateway::start_with(
        &format!("admin_token = {ADMIN_TOKEN:?}"),
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [pools.default]\nupstreams = [{}]\n",
            origin.port(),
            list.join(", ")
        ),
    )
    .await;

    // An opaque tunnel binds the session; the client leaves at once (no judgement of health).
    let (tcp, head) =
        connect_tunnel_head(&gw, &origin.authority(), "X-Pool-Session: fb1\r\n").await;
    drop(tcp);
    let id = head
        .lines()
        .find_map(|l| l.strip_prefix("x-pool-upstream: "))
        .unwrap()
        .to_string();
    eventually(&gw, "the tunnel's lease to be released", |s| {
        s["pools"][0]["leases_live"] == 0
    })
    .await;
    assert!(gw.upstream_status("default", &id).await["success_ratio"].is_null());

    let report =
        r#"{"pool": "default", "session": "fb1", "outcome": "captcha", "target": "shop.example"}"#;
    for n in 1..=5 {
        let (code, body) = post_feedback(&gw, Some(ADMIN_TOKEN), report).await;
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["upstream"], id.as_str());
        assert_eq!(body["outcome"], "captcha");
        assert_eq!(body["target"], "shop.example");
        let quarantined = body["state"] == "quarantined";
        assert_eq!(quarantined, n == 5, "after report {n}: {body}");
    }
    let up = gw.upstream_status("default", &id).await;
    assert_eq!(up["state"], "quarantined", "{up}");
    assert_eq!(up["outcomes"]["captcha"], 5, "{up}");
    for other in ups.iter().map(FakeProxy::url).filter(|u| *u != id) {
        assert_eq!(
            gw.upstream_status("default", &other).await["state"],
            "healthy"
        );
    }

    // By upstream id, without a pool (the default one).
    let (code, body) = post_feedback(
        &gw,
        Some(ADMIN_TOKEN),
        &format!(r#"{{"upstream": {:?}, "outcome": "ok"}}"#, ups[0].url()),
    )
    .await;
    assert_eq!(
        (code, body["target"].as_str()),
        (200, Some("(unspecified)")),
        "{body}"
    );

    // Bad auth: 401.
    for token in [None, Some("wrong-token-0123456789")] {
        let (code, body) = post_feedback(&gw, token, report).await;
        assert_eq!(code, 401, "{body}");
    }
    // Malformed: 400 with a message.
    for bad in [
        "not json",
        r#"{"session": "fb1"}"#,
        r#"{"session": "fb1", "outcome": "angry"}"#,
        r#"{"outcome": "captcha"}"#,
        r#"{"session": "fb1", "upstream": "x", "outcome": "captcha"}"#,
        r#"{"session": "bad key!", "outcome": "captcha"}"#,
        r#"{"session": "fb1", "outcome": "captcha", "target": "no such host"}"#,
        r#"{"session": "fb1", "outcome": "captcha", "colour": "red"}"#,
    ] {
        let (code, body) = post_feedback(&gw, Some(ADMIN_TOKEN), bad).await;
        assert_eq!(code, 400, "{bad}: {body}");
        assert!(!body["error"].as_str().unwrap().is_empty(), "{body}");
    }
    // Unknown session, upstream or pool: 404.
    for missing in [
        r#"{"session": "nobody", "outcome": "captcha"}"#,
        r#"{"upstream": "http://127.0.0.1:1", "outcome": "captcha"}"#,
        r#"{"pool": "nope", "session": "fb1", "outcome": "captcha"}"#,
    ] {
        let (code, body) = post_feedback(&gw, Some(ADMIN_TOKEN), missing).await;
        assert_eq!(code, 404, "{missing}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feedback_is_refused_without_a_configured_token() {
    let gw = TestGateway::start("[pools.default]\nupstreams = [\"direct://\"]\n").await;
    let (code, body) = post_feedback(
        &gw,
        Some(ADMIN_TOKEN),
        r#"{"upstream": "direct://", "outcome": "ok"}"#,
    )
    .await;
    assert_eq!(code, 401, "{body}");
    assert!(body["error"].as_str().unwrap().contains("admin_token"));
}

/// An upstream proxy that answers CONNECT with 200 and then either closes at once
/// (`close = true`) or stays silent until the gateway gives up.
async fn misbehaving_proxy(close: bool) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        for _ in 0..16 {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 16 * 1024 {
                if s.read(&mut byte).await.unwrap_or(0) == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            let _ = s
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await;
            if close {
                drop(s);
            } else {
                held.push(s);
            }
        }
    });
    (url, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opaque_tunnels_closed_at_once_or_never_answered_count_against_the_upstream() {
    let origin_ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &origin_ca).await;
    let (closing, _c) = misbehaving_proxy(true).await;
    let (silent, _s) = misbehaving_proxy(false).await;
    let good = FakeProxy::start(FakeProxyOpts::default()).await;
    let hello: &[u8] = &[0x16, 0x03, 0x01, 0x00, 0x05, 0x01, 0x00, 0x00, 0x01, 0x00];
    let mut judged = Vec::new();
    for (url, want) in [(&closing, "reset"), (&silent, "timeout")] {
        let gw = TestGateway::start_with(
            "connect_timeout = \"1s\"",
            &format!(
                "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
                 [pools.default]\nupstreams = [{url:?}]\n",
                origin.port()
            ),
        )
        .await;
        let mut tcp = connect_tunnel(&gw, &origin.authority(), "").await;
        tcp.write_all(hello).await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut rest)).await;
        assert!(rest.is_empty(), "nothing came back");
        drop(tcp);
        let status = eventually(&gw, "the tunnel to be judged", |s| {
            s["pools"][0]["leases_live"] == 0
        })
        .await;
        let u = upstream_of(&status, url);
        assert_eq!(u["outcomes"][want], 1, "{u}");
        judged.push(want);
    }
    // A healthy raw tunnel through a working proxy is ok.
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [{:?}]\n",
        origin.port(),
        good.url()
    ))
    .await;
    let c = client(&gw.proxy_url(), vec![origin_ca.reqwest_cert()]);
    assert_eq!(
        c.get(origin.url("/ok"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "ok"
    );
    drop(c);
    let status = eventually(&gw, "the tunnel to end", |s| {
        s["pools"][0]["leases_live"] == 0
    })
    .await;
    assert_eq!(upstream_of(&status, &good.url())["outcomes"]["ok"], 1);
    assert_eq!(judged, ["reset", "timeout"]);
}

#[test]
fn config_names_every_interception_problem_by_key() {
    let origin_ca = TestCa::new();
    let icpt = Interception::new(&origin_ca);
    let problems = |text: &str| -> String {
        Config::parse(text, "t", None)
            .unwrap_err()
            .problems
            .join("\n")
    };
    let p = problems(
        "[pools.default]\nupstreams = [\"direct://\"]\ninspect_tls = true\n\
         inspect_exclude = [\"*.ok.example\", \"https://bad\"]\n",
    );
    assert!(p.contains("pools.default.inspect_tls"), "{p}");
    assert!(p.contains("pools.default.inspect_exclude[1]"), "{p}");
    assert!(!p.contains("inspect_exclude[0]"), "{p}");

    let p = problems(&format!(
        "[intercept]\nca_cert = {:?}\nca_key = {:?}\ncert_cache_size = 0\n\
         [pools.default]\nupstreams = [\"direct://\"]\n",
        icpt.path("missing.pem"),
        icpt.path("ca-key.pem")
    ));
    assert!(p.contains("intercept.ca_cert"), "{p}");
    assert!(p.contains("intercept.cert_cache_size"), "{p}");

    // A key that does not belong to the certificate.
    let other = poolgate::intercept::ca::generate("other").unwrap();
    std::fs::write(icpt.path("other-key.pem"), &other.key_pem).unwrap();
    let p = problems(&format!(
        "[intercept]\nca_cert = {:?}\nca_key = {:?}\n[pools.default]\nupstreams = [\"direct://\"]\n",
        icpt.path("ca.pem"),
        icpt.path("other-key.pem")
    ));
    assert!(
        p.starts_with("intercept.ca_key") && p.contains("does not belong"),
        "{p}"
    );
    assert!(!p.contains("PRIVATE KEY"), "{p}");

    let ok = Config::parse(
        &format!(
            "{}[pools.default]\nupstreams = [\"direct://\"]\ninspect_tls = true\n",
            icpt.table("")
        ),
        "t",
        None,
    )
    .unwrap();
    assert!(ok.pool("default").unwrap().inspect_tls);
}

#[tokio::test]
async fn ca_init_writes_a_ca_that_check_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_poolgate"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let out = run(&["ca", "init"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("poolgate-ca.pem") && !stdout.contains("PRIVATE"),
        "{stdout}"
    );
    // Never overwritten by accident.
    let again = run(&["ca", "init"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));

    write(
        dir.path(),
        "gateway.toml",
        "[intercept]\nca_cert = \"poolgate-ca.pem\"\nca_key = \"poolgate-ca-key.pem\"\n\
         [pools.default]\nupstreams = [\"direct://\"]\ninspect_tls = true\n",
    );
    let out = run(&["check", "--config", "gateway.toml"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}
