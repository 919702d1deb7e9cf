//! Reading the admin listener: with `server.admin_read_token` set, `/status`, `/metrics` and the
//! dashboard answer `401` without a token or with a wrong one, and `200` with the read token or
//! the admin token (Bearer, or as a Basic password for browsers); `/healthz` and `/readyz` stay
//! open; the read token does not authorise actions; `poolgate status` passes a token. Without a
//! read token a loopback listener stays open. (A listener off loopback needs a token without
//! one too: that rule is a function of the bound address, tested in `admin::access`, since
//! tests bind loopback only.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::TestGateway;

const ADMIN: &str = "admin-token-0123456789abcdef";
const READ: &str = "read-token-0123456789abcdef";

const POOL: &str = "[pools.default]\nupstreams = [\"http://127.0.0.1:9#secret-upstream\"]\n";
const READS: [&str; 5] = ["/status", "/status/history", "/metrics", "/dashboard", "/"];

fn admin_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

async fn with_read_token() -> TestGateway {
    TestGateway::start_with(
        &format!("admin_token = \"{ADMIN}\"\nadmin_read_token = \"{READ}\""),
        POOL,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_the_read_token_or_the_admin_token_probes_stay_open() {
    let gw = with_read_token().await;
    let http = admin_client();
    let url = |path: &str| format!("http://{}{path}", gw.admin);
    let basic = |password: &str| {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("ops:{password}"));
        format!("Basic {b}")
    };

    for path in READS {
        let r = http.get(url(path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path} without a token");
        let challenges: Vec<String> = r
            .headers()
            .get_all("www-authenticate")
            .iter()
            .map(|v| v.to_str().unwrap().to_string())
            .collect();
        assert!(
            challenges.iter().any(|c| c.starts_with("Basic"))
                && challenges.iter().any(|c| c.starts_with("Bearer")),
            "{path}: {challenges:?}"
        );
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("secret-upstream") && !body.contains(READ) && !body.contains(ADMIN),
            "{path}: {body}"
        );

        for wrong in [
            format!("Bearer {READ}x"),
            "Bearer not-the-token-at-all".to_string(),
            basic("wrong-password-0123456789"),
            format!("Token {READ}"),
        ] {
            let r = http
                .get(url(path))
                .header("authorization", &wrong)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 401, "{path} with {wrong}");
        }

        for good in [
            format!("Bearer {READ}"),
            format!("Bearer {ADMIN}"),
            basic(READ),
            basic(ADMIN),
        ] {
            let r = http
                .get(url(path))
                .header("authorization", &good)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{path} with {good}");
        }
    }
    // What the token protects: the upstreams are in /status for a reader.
    let status = http
        .get(url("/status"))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(status.contains("secret-upstream"), "{status}");

    // Orchestrators' probes need nothing.
    for path in ["/healthz", "/readyz"] {
        let r = http.get(url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }

    // The read token reads, it does not act.
    let r = http
        .post(url("/admin/session"))
        .bearer_auth(READ)
        .body(r#"{"session": "a", "action": "end"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .post(url("/admin/session"))
        .bearer_auth(ADMIN)
        .body(r#"{"session": "a", "action": "end"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "the admin token acts (no such session)");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_without_a_read_token_stays_open() {
    let gw = TestGateway::start_with(&format!("admin_token = \"{ADMIN}\""), POOL).await;
    let http = admin_client();
    for path in READS {
        let r = http
            .get(format!("http://{}{path}", gw.admin))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_client_sends_a_token() {
    use poolgate::admin::client::{TOKEN_ENV, fetch_status};
    let gw = with_read_token().await;
    let addr = gw.admin.to_string();

    let fetch = |token: Option<&'static str>| {
        let addr = addr.clone();
        tokio::task::spawn_blocking(move || fetch_status(&addr, token))
    };
    let e = fetch(None).await.unwrap().unwrap_err();
    assert!(e.contains("401") && e.contains(TOKEN_ENV), "{e}");
    let e = fetch(Some("wrong-token-0123456789"))
        .await
        .unwrap()
        .unwrap_err();
    assert!(e.contains("401") && !e.contains("wrong-token"), "{e}");
    let e = fetch(Some("bad token\r\nX: y")).await.unwrap().unwrap_err();
    assert!(!e.contains("bad token"), "{e}");
    for token in [READ, ADMIN] {
        let body = fetch(Some(token)).await.unwrap().unwrap();
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(doc["pools"].is_array(), "{doc}");
    }

    // The command: `--token`, or the environment variable; without either it says what to do.
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_poolgate"));
        cmd.args(["status", "--admin", addr.as_str()])
            .args(args)
            .env_remove(TOKEN_ENV)
            .kill_on_drop(true);
        if let Some(v) = env {
            cmd.env(TOKEN_ENV, v);
        }
        async move {
            tokio::time::timeout(Duration::from_secs(20), cmd.output())
                .await
                .expect("poolgate status finishes")
                .unwrap()
        }
    };
    let out = run(&[], None).await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("401") && err.contains("--token"), "{err}");
    for (args, env) in [(vec!["--token", READ], None), (vec![], Some(READ))] {
        let out = run(&args, env).await;
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?} {env:?}: {text}");
        assert!(text.contains("pool default"), "{text}");
        assert!(!text.contains(READ), "{text}");
    }
    gw.shutdown().await;
}
