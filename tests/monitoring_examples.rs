//! The monitoring stack of `examples/` against the gateway itself: every metric the Grafana
//! dashboard and the alert rules name is one a live gateway exports, the alert rules pass their
//! unit tests (`promtool test rules`, when promtool is installed: Debian's `prometheus` package),
//! Prometheus accepts the scrape config, and the compose stack's gateway config loads, its read
//! token the one Prometheus sends.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::auth::hash_password_with_cost;

fn examples(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(rel)
}

/// The `poolgate_*` names in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("poolgate_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        // Not part of a longer identifier.
        let before = rest[..i].chars().last();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
    out
}

/// The sample names `/metrics` exports: every sample's, and what each family's `# TYPE` line
/// declares (a family may have no series yet: no user has sent anything, no pool refused).
fn exported(metrics: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in metrics.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            for s in suffixes {
                out.insert(format!("{name}{s}"));
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

/// The queries of the dashboard and the alert rules: the dashboard's `expr` fields and template
/// queries, the rules' `expr:` lines.
fn referenced() -> BTreeSet<String> {
    let dashboard = std::fs::read_to_string(examples("monitoring/grafana-dashboard.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut queries = Vec::new();
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, child) in m {
                    match (k.as_str(), child) {
                        ("expr" | "definition" | "query", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => walk(child, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| walk(i, out)),
            _ => {}
        }
    }
    walk(&json, &mut queries);
    let exprs = queries.len();
    assert!(exprs >= 20, "only {exprs} queries in the dashboard");
    let rules = std::fs::read_to_string(examples("monitoring/alerts.yml")).unwrap();
    let rule_exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(str::to_string)
        .collect();
    assert_eq!(rule_exprs.len(), 4, "{rules}");
    queries.extend(rule_exprs);
    let names: BTreeSet<String> = queries.iter().flat_map(|q| names_in(q)).collect();
    assert!(names.len() >= 15, "{names:?}");
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_use_is_exported() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let hash = hash_password_with_cost("pw-of-alice", 8, 1, 1).unwrap();
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [log]\naccess = {:?}\n\
         [auth.users.alice]\npassword_hash = \"{hash}\"\n\
         [pools.default]\nupstreams = [\"{}\"]\nmax_concurrency = 1\nqueue_timeout = \"50ms\"\n",
        dir.path().join("access.log"),
        upstream.url(),
    ))
    .await;
    // Traffic, so that most families have series: requests as alice (bytes per user).
    let alice = gw.client_via(&format!("http://alice:pw-of-alice@{}", gw.proxy), None);
    for _ in 0..3 {
        let resp = alice
            .post(origin.url("/ok"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let metrics = gw.metrics().await;
    let have = exported(&metrics);
    let missing: Vec<String> = referenced()
        .into_iter()
        .filter(|n| !have.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "the monitoring examples use metrics the gateway does not export: {missing:?}\n---\n{metrics}"
    );
    // Those with series after this traffic really have them.
    for name in [
        "poolgate_requests_total",
        "poolgate_pool_bytes_total",
        "poolgate_upstream_bytes_total",
        "poolgate_user_bytes_total",
        "poolgate_request_duration_seconds_bucket",
        "poolgate_store_up",
        "poolgate_upstreams",
        "poolgate_quarantine_limit",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(&format!("{name}{{"))),
            "no {name} series in\n{metrics}"
        );
    }
}

/// Runs promtool with `args` in `examples/monitoring`; `None` when promtool is not installed.
fn promtool(args: &[&str]) -> Option<std::process::Output> {
    match Command::new("promtool")
        .args(args)
        .current_dir(examples("monitoring"))
        .output()
    {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("promtool: {e}"),
    }
}

#[test]
fn the_alert_rules_pass_their_unit_tests_and_the_scrape_config_loads() {
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts.test.yml"],
        &["check", "config", "prometheus.yml"],
    ] {
        let Some(out) = promtool(args) else {
            eprintln!(
                "note: promtool is not installed (Debian: apt-get install prometheus); \
                 the alert rules' unit tests were not run"
            );
            return;
        };
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_compose_gateway_config_loads_with_the_token_prometheus_sends() {
    let config = poolgate::config::Config::load(&examples("compose/gateway.toml")).unwrap();
    let token = std::fs::read_to_string(examples("monitoring/read-token")).unwrap();
    assert_eq!(
        config.server.admin_read_token.as_deref(),
        Some(token.trim()),
        "examples/monitoring/read-token must be the gateways' admin_read_token"
    );
    assert_eq!(config.store.kind(), "redis");
    let compose = std::fs::read_to_string(examples("compose/docker-compose.yml")).unwrap();
    for service in [
        "redis:",
        "gateway-a:",
        "gateway-b:",
        "prometheus:",
        "grafana:",
    ] {
        assert!(
            compose.contains(&format!("\n  {service}\n")),
            "{service} missing"
        );
    }
}
