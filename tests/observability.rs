//! What operators see: `/status` after a bad IP and a bad site, `/metrics` that parse and agree
//! with the traffic, the dashboard in a real headless browser, admin actions, and no secrets.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, TestGateway};

const TOKEN: &str = "test-admin-token-0123456789";

/// Five upstreams with credentials in every URL; upstream 1 serves captchas on every site.
async fn setup() -> (Vec<FakeProxy>, Origin, Origin, TestGateway) {
    let good = Origin::start(OriginBehaviour::echo()).await;
    let strict = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for i in 0..5 {
        ups.push(
            FakeProxy::start(FakeProxyOpts::with_credentials(
                &format!("user{i}"),
                &format!("hunter{i}-secret"),
            ))
            .await,
        );
    }
    ups[1].set_mode(ProxyMode::Captcha).await;
    let list: Vec<String> = ups
        .iter()
        .map(|u| format!("\"{}\"", u.url_with_auth()))
        .collect();
    let gw = TestGateway::start_with(
        &format!("admin_token = \"{TOKEN}\""),
        &format!(
            "[policy]\nallow_private_targets = true\n[pools.default]\nupstreams = [{}]\n",
            list.join(", ")
        ),
    )
    .await;
    (ups, good, strict, gw)
}

/// Traffic: half to a good site (127.0.0.1), half to a site that challenges everyone (localhost).
async fn drive(gw: &TestGateway, good: &Origin, strict: &Origin, n: usize) -> usize {
    let client = gw.client();
    let mut sent = 0;
    for i in 0..n {
        let url = if i % 2 == 0 {
            good.url("/ok")
        } else {
            strict.url_localhost("/captcha")
        };
        let resp = client.get(url).send().await.unwrap();
        resp.bytes().await.unwrap();
        sent += 1;
    }
    sent
}

fn admin_client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_the_bad_ip_the_bad_site_and_the_matrix() {
    let (ups, good, strict, gw) = setup().await;
    drive(&gw, &good, &strict, 80).await;
    let status = gw.status().await;
    let pool = &status["pools"][0];
    let bad = ups[1].url();

    let up = pool["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["id"] == bad.as_str())
        .unwrap();
    assert_eq!(up["state"], "quarantined", "{up}");
    assert!(
        up["state_reason"].as_str().unwrap().contains("captcha"),
        "{up}"
    );
    for field in [
        "state_since_s",
        "quarantines_total",
        "cooldown_remaining_ms",
        "leases_live",
        "allocations",
        "latency_p50_ms",
    ] {
        assert!(up.get(field).is_some(), "missing {field}: {up}");
    }

    let incidents = pool["incidents"]["targets"].as_array().unwrap();
    assert_eq!(incidents.len(), 1, "{pool}");
    assert_eq!(incidents[0]["target"], "localhost");
    assert_eq!(pool["incidents"]["global"], false);

    // The matrix: the strict site's row is bad in every column; the bad upstream's column is bad on
    // the good site too.
    let matrix = pool["matrix"].as_array().unwrap();
    let row = |t: &str| matrix.iter().find(|r| r["target"] == t).unwrap().clone();
    let strict_row = row("localhost");
    assert_eq!(strict_row["incident"], true);
    for cell in strict_row["cells"].as_array().unwrap() {
        assert_eq!(cell["success_ratio"], 0.0, "{cell}");
    }
    let good_row = row("127.0.0.1");
    for cell in good_row["cells"].as_array().unwrap() {
        let expect = if cell["upstream"] == bad.as_str() {
            0.0
        } else {
            1.0
        };
        assert_eq!(cell["success_ratio"], expect, "{cell}");
    }
    // Other upstreams are not blamed for the strict site.
    let healthy = pool["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["state"] == "healthy")
        .count();
    assert_eq!(healthy, 4, "{pool}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_agree_with_the_traffic() {
    let (_ups, good, strict, gw) = setup().await;
    let sent = drive(&gw, &good, &strict, 80).await;
    // Releases are recorded off the response path; wait for the last ones.
    let text = {
        let mut text = String::new();
        for _ in 0..100 {
            text = admin_client()
                .get(format!("http://{}/metrics", gw.admin))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let scrape =
                prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
            let total: f64 = scrape
                .samples
                .iter()
                .filter(|s| s.metric == "poolgate_requests_total")
                .map(|s| match s.value {
                    prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Untyped(v) => v,
                    _ => 0.0,
                })
                .sum();
            if total as usize == sent {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        text
    };
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap();
    let value = |metric: &str, labels: &[(&str, &str)]| -> f64 {
        scrape
            .samples
            .iter()
            .filter(|s| {
                s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
            })
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum()
    };
    assert_eq!(
        value("poolgate_requests_total", &[]) as usize,
        sent,
        "{text}"
    );
    let captchas = value("poolgate_requests_total", &[("outcome", "captcha")]) as usize;
    let oks = value("poolgate_requests_total", &[("outcome", "ok")]) as usize;
    assert_eq!(captchas + oks, sent);
    assert!(
        captchas >= sent / 2,
        "every strict-site request is a captcha: {captchas}"
    );
    assert_eq!(
        value("poolgate_upstreams", &[("state", "quarantined")]),
        1.0
    );
    assert_eq!(
        value("poolgate_target_incidents", &[("pool", "default")]),
        1.0
    );
    assert_eq!(
        value("poolgate_quarantine_limit", &[("pool", "default")]),
        1.0
    );
    assert_eq!(value("poolgate_store_up", &[("kind", "memory")]), 1.0);
    assert!(
        text.contains("poolgate_request_duration_seconds_bucket"),
        "latency histogram"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_need_the_token_and_take_effect() {
    let (ups, good, _strict, gw) = setup().await;
    let admin = admin_client();
    let url = |p: &str| format!("http://{}{p}", gw.admin);
    let target = ups[3].url();
    let body = serde_json::json!({"pool": "default", "upstream": target, "action": "quarantine", "duration_s": 300});

    let r = admin
        .post(url("/admin/upstream"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = admin
        .post(url("/admin/upstream"))
        .bearer_auth("wrong-token-wrong-token")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        gw.upstream_status("default", &target).await["state"],
        "healthy"
    );

    for (action, state) in [
        ("quarantine", "quarantined"),
        ("restore", "healthy"),
        ("drain", "drained"),
        ("remove", "dead"),
        ("restore", "healthy"),
    ] {
        let body = serde_json::json!({"pool": "default", "upstream": target, "action": action, "duration_s": 300});
        let r = admin
            .post(url("/admin/upstream"))
            .bearer_auth(TOKEN)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{action}");
        let s = gw.upstream_status("default", &target).await;
        assert_eq!(s["state"], state, "after {action}: {s}");
    }
    // A drained upstream gets no new work.
    let drain = serde_json::json!({"pool": "default", "upstream": target, "action": "drain"});
    admin
        .post(url("/admin/upstream"))
        .bearer_auth(TOKEN)
        .body(drain.to_string())
        .send()
        .await
        .unwrap();
    let before = ups[3].requests();
    for _ in 0..20 {
        gw.client()
            .get(good.url("/ok"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }
    assert_eq!(ups[3].requests(), before);

    // Ending a session: the next request may land anywhere, and the first end is a 200, the second a 404.
    let resp = gw
        .client()
        .get(good.url("/ok"))
        .header("X-Pool-Session", "s-end")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let end = serde_json::json!({"pool": "default", "session": "s-end", "action": "end"});
    let r = admin
        .post(url("/admin/session"))
        .body(end.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = admin
        .post(url("/admin/session"))
        .bearer_auth(TOKEN)
        .body(end.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = admin
        .post(url("/admin/session"))
        .bearer_auth(TOKEN)
        .body(end.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Malformed actions are refused with a reason.
    let r = admin
        .post(url("/admin/upstream"))
        .bearer_auth(TOKEN)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let bad = serde_json::json!({"pool": "default", "upstream": target, "action": "explode"});
    let r = admin
        .post(url("/admin/upstream"))
        .bearer_auth(TOKEN)
        .body(bad.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_metrics_and_dashboard_never_show_upstream_passwords() {
    let (_ups, good, strict, gw) = setup().await;
    drive(&gw, &good, &strict, 20).await;
    let admin = admin_client();
    for path in ["/status", "/metrics", "/dashboard"] {
        let body = admin
            .get(format!("http://{}{path}", gw.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for i in 0..5 {
            assert!(
                !body.contains(&format!("hunter{i}-secret")),
                "{path} leaks a password"
            );
            assert!(
                !body.contains(&format!("user{i}:")),
                "{path} leaks a username"
            );
        }
    }
}

fn chromium() -> Option<String> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(|b| {
            std::process::Command::new("which")
                .arg(b)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_renders_the_table_and_heatmap_in_headless_chromium() {
    let browser =
        chromium().expect("chromium is installed by scripts/test (apt-get install chromium)");
    let (_ups, good, strict, gw) = setup().await;
    drive(&gw, &good, &strict, 80).await;
    let url = format!("http://{}/dashboard", gw.admin);
    let profile = tempfile::tempdir().unwrap();
    let flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--virtual-time-budget=5000",
    ];
    let dom = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&browser)
            .args(flags)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--dump-dom")
            .arg(&url)
            .output(),
    )
    .await
    .expect("chromium finishes")
    .unwrap();
    let full = String::from_utf8_lossy(&dom.stdout);
    // The rendered DOM only, not the page's own script text.
    let html = full.split("<script").next().unwrap_or("");
    assert!(
        html.contains("data-loaded=\"yes\""),
        "the page script ran:\n{html}"
    );
    let rows = html.matches("<tr class=\"upstream\"").count();
    assert_eq!(rows, 5, "one row per upstream");
    assert!(html.contains("data-state=\"quarantined\""));
    let targets = html.matches("<tr class=\"target").count();
    assert_eq!(targets, 2, "one heatmap row per target");
    let cells = html.matches("<td class=\"cell").count();
    assert_eq!(cells, 2 * 5, "a cell per target and upstream");
    assert!(html.contains("target incident: localhost"));

    // Keep a screenshot as an artefact.
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let status = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&browser)
            .args(flags)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--window-size=1400,900")
            .arg(format!("--screenshot={}", shot.display()))
            .arg(&url)
            .output(),
    )
    .await
    .expect("chromium finishes")
    .unwrap();
    assert!(
        status.status.success() && shot.exists(),
        "screenshot at {}",
        shot.display()
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}
