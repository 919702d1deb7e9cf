//! The last hour on the dashboard: `/status/history` after a few buckets of traffic, and the
//! page rendered in headless Chromium with one chart per figure whose lines hold exactly the
//! values of `/status/history`; a screenshot is kept as an artefact.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use serde_json::Value;

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

async fn history(gw: &TestGateway) -> Value {
    common::admin_json(gw.admin, "/status/history").await
}

/// The attribute `name` of the element starting at `tag` (the text after `<polyline`).
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = tag.find(&key)? + key.len();
    let end = tag[start..].find('"')?;
    Some(&tag[start..start + end])
}

/// Every chart's lines in the rendered page: (pool, chart, series) → data-values and the number
/// of points drawn.
fn lines(html: &str) -> Vec<(String, String, String, String, usize)> {
    let mut out = Vec::new();
    for svg in html.split("<svg class=\"chart\"").skip(1) {
        let pool = attr(svg, "data-pool").unwrap().to_string();
        let chart = attr(svg, "data-chart").unwrap().to_string();
        let svg = svg.split("</svg>").next().unwrap();
        for line in svg.split("<polyline").skip(1) {
            let series = attr(line, "data-series").unwrap().to_string();
            let values = attr(line, "data-values").unwrap().to_string();
            let points = attr(line, "points")
                .unwrap()
                .split_whitespace()
                .filter(|p| !p.is_empty())
                .count();
            out.push((pool.clone(), chart.clone(), series, values, points));
        }
    }
    out
}

/// `data-values` ("1,,3") against a `/status/history` array ([1, null, 3]), as numbers.
fn same_values(drawn: &str, want: &Value) -> bool {
    let want = want.as_array().unwrap();
    let drawn: Vec<&str> = drawn.split(',').collect();
    drawn.len() == want.len()
        && drawn.iter().zip(want).all(|(d, w)| match w.as_f64() {
            None => d.is_empty(),
            Some(w) => d.parse::<f64>().is_ok_and(|d| (d - w).abs() < 1e-9),
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_the_last_hour_as_status_history_has_it() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url(),
    ))
    .await;
    assert_eq!(history(&gw).await["t"], serde_json::json!([]));

    // Three buckets: 3, 0 and 5 requests.
    let client = gw.client();
    for n in [3, 0, 5] {
        for _ in 0..n {
            let resp = client
                .post(origin.url("/ok"))
                .body("0123456789")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.bytes().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        gw.running().sample_history();
    }
    let h = history(&gw).await;
    assert_eq!(h["bucket_s"], 10);
    assert_eq!(h["t"].as_array().unwrap().len(), 3, "{h}");
    let p = &h["pools"][0];
    assert_eq!(p["name"], "default");
    assert_eq!(p["requests"], serde_json::json!([3, 0, 5]), "{h}");
    assert_eq!(p["outcomes"]["ok"], serde_json::json!([3, 0, 5]), "{h}");
    assert_eq!(p["bytes_up"], serde_json::json!([30, 0, 50]), "{h}");
    assert!(p["latency_p50_ms"][1].is_null(), "{h}");
    assert!(p["latency_p95_ms"][2].as_f64().unwrap() > 0.0, "{h}");
    assert_eq!(p["states"]["healthy"], serde_json::json!([1, 1, 1]), "{h}");

    let Some(browser) = chromium() else {
        eprintln!(
            "note: chromium is not installed (scripts/test installs it); the page was not rendered"
        );
        return;
    };
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
    let html = full.split("<script").next().unwrap_or("");
    assert!(
        html.contains("data-history=\"yes\""),
        "the page read /status/history:\n{html}"
    );
    let drawn = lines(html);
    // The gateway's own 10-second tick may have closed a bucket while the page loaded: the page
    // then drew the history as it was before or after it.
    let after = history(&gw).await;
    let want = |chart: &str, series: &str| -> Vec<Value> {
        [&h, &after]
            .iter()
            .map(|h| {
                let p = &h["pools"][0];
                match (chart, series) {
                    ("outcomes", s) => p["outcomes"][s].clone(),
                    ("bytes", "up") => p["bytes_up"].clone(),
                    ("bytes", _) => p["bytes_down"].clone(),
                    ("latency", "p50") => p["latency_p50_ms"].clone(),
                    ("latency", _) => p["latency_p95_ms"].clone(),
                    (_, s) => p["states"][s].clone(),
                }
            })
            .collect()
    };
    for (chart, series) in [
        ("outcomes", "ok"),
        ("outcomes", "proxy-fault"),
        ("bytes", "up"),
        ("bytes", "down"),
        ("latency", "p50"),
        ("latency", "p95"),
        ("states", "healthy"),
    ] {
        let line = drawn
            .iter()
            .find(|(pool, c, s, _, _)| pool == "default" && c == chart && s == series)
            .unwrap_or_else(|| panic!("no {chart}/{series} line in {drawn:?}"));
        let candidates = want(chart, series);
        let matched = candidates
            .iter()
            .find(|values| same_values(&line.3, values))
            .unwrap_or_else(|| {
                panic!(
                    "{chart}/{series}: drawn {} but /status/history has {candidates:?}",
                    line.3
                )
            });
        let points = matched
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| !v.is_null())
            .count();
        assert_eq!(line.4, points, "{chart}/{series}: a point per value");
    }
    assert_eq!(
        drawn.iter().filter(|l| l.1 == "outcomes").count(),
        6,
        "a line per outcome class"
    );

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-history.png");
    let status = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(&browser)
            .args(flags)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("--window-size=1400,1000")
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
