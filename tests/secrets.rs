//! Secrets stay secret: with every log level on, a grep of the captured logs, `/status`, the
//! gateway's error responses and config errors finds no upstream password, no user password and
//! no admin token (plain or base64-encoded), after traffic that succeeds, fails authentication
//! both ways, and reloads.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::auth::hash_password_with_cost;

const UP_PASS: &str = "Up-S3cret-Pass-9";
const WRONG_UP_PASS: &str = "Wr0ng-Upstream-Pw";
const USER_PASS: &str = "Al1ce-S3cret-Pw";
const TOKEN: &str = "Adm1n-T0ken-Secret-42";

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn forms(secret: &str) -> Vec<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    vec![
        secret.to_string(),
        b64(&format!("up-user:{secret}")),
        b64(&format!("alice:{secret}")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_logs_status_or_errors() {
    let capture = Capture::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let origin = Origin::start(OriginBehaviour::echo()).await;
    let good = FakeProxy::start(FakeProxyOpts::with_credentials("up-user", UP_PASS)).await;
    let strict = FakeProxy::start(FakeProxyOpts::with_credentials("up-user", "other")).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{port}]\n\
         [auth.users.alice]\npassword_hash = \"{hash}\"\n\
         [pools.default]\nupstreams = [\"http://up-user:{UP_PASS}@{good}\"]\n\
         [pools.strict]\nupstreams = [\"http://up-user:{WRONG_UP_PASS}@{strict}\"]\nretries = 0\n",
        port = origin.port(),
        hash = hash_password_with_cost(USER_PASS, 8, 1, 1).unwrap(),
        good = good.addr(),
        strict = strict.addr(),
    );
    std::fs::write(&path, &text).unwrap();
    let gw = TestGateway::start_file(&path).await;
    let mut seen_text = String::new();

    let alice = gw.client_via(&format!("http://alice:{USER_PASS}@{}", gw.proxy), None);
    let wrong = gw.client_via(&format!("http://alice:not-{USER_PASS}@{}", gw.proxy), None);
    for (client, pool) in [(&alice, "default"), (&alice, "strict"), (&wrong, "default")] {
        let resp = client
            .get(origin.url("/ok"))
            .header("X-Pool-Name", pool)
            .send()
            .await
            .unwrap();
        seen_text.push_str(&format!("{:?}", resp.headers()));
        seen_text.push_str(&resp.text().await.unwrap());
    }
    // A malformed username with the password in it, and CONNECT through the refusing upstream.
    let bad = gw.client_via(
        &format!("http://alice-session-{USER_PASS}-:{USER_PASS}@{}", gw.proxy),
        None,
    );
    let resp = bad.get(origin.url("/ok")).send().await.unwrap();
    seen_text.push_str(&resp.text().await.unwrap());
    let raw = common::raw_http(
        gw.proxy,
        format!(
            "CONNECT {a} HTTP/1.1\r\nHost: {a}\r\nX-Pool-Name: strict\r\nProxy-Authorization: {}\r\n\r\n",
            common::basic_auth("alice", USER_PASS),
            a = origin.authority()
        )
        .as_bytes(),
    )
    .await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    assert!(raw.starts_with("HTTP/1.1 502"), "{raw}");
    seen_text.push_str(&raw);
    // A reload (ok) and a refused one whose file names the secrets.
    let admin = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{}/admin/reload", gw.admin);
    let r = admin.post(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 200);
    seen_text.push_str(&r.text().await.unwrap());
    std::fs::write(&path, text.replace("retries = 0", "retries = 0\nbogus = 1")).unwrap();
    let r = admin.post(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status(), 400);
    seen_text.push_str(&r.text().await.unwrap());
    let r = admin.post(&url).bearer_auth("x").send().await.unwrap();
    seen_text.push_str(&r.text().await.unwrap());
    // Config errors name keys, not values.
    let err =
        poolgate::config::Config::parse(&text.replace("retries = 0", "retries = \"x\""), "t", None)
            .unwrap_err();
    seen_text.push_str(&err.to_string());
    let status = gw.status().await.to_string();
    seen_text.push_str(&status);

    assert!(good.requests() >= 1, "the good upstream was used");
    assert_eq!(good.auth_seen()[0], format!("up-user:{UP_PASS}"));
    let logs = String::from_utf8_lossy(&capture.0.lock().unwrap()).into_owned();
    assert!(logs.len() > 1000, "logs were captured: {}", logs.len());
    for secret in [UP_PASS, WRONG_UP_PASS, USER_PASS, TOKEN] {
        for form in forms(secret) {
            assert!(!logs.contains(&form), "{form} in the logs");
            assert!(!status.contains(&form), "{form} in /status");
            assert!(
                !seen_text.contains(&form),
                "{form} in a response or error: {seen_text}"
            );
        }
    }
    gw.shutdown().await;
}
