//! Every count of `/status` has a `/metrics` series showing the same figure. The test walks the
//! `/status` document and looks every numeric field up in one table ([`TABLE`]): a field missing
//! from it fails the test with its path, so a count added later without a series is caught.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestCa, TestGateway};
use serde_json::Value;

/// Where a numeric `/status` field is found in `/metrics`.
enum Want {
    /// The sum of these series: each a name and labels beyond the ones the path gives (`pool`,
    /// `upstream`, `target`); series with more labels are summed too.
    Series(&'static [Sel]),
    /// A map of `/status` (its keys in the path as `*`): the series `name`, the key as label.
    Keyed(&'static str, &'static str),
    /// Not a count: why it has no series.
    Not(&'static str),
}

type Sel = (&'static str, &'static [(&'static str, &'static str)]);

use Want::{Keyed, Not, Series};

const AGE: &str = "an age, not a count";
const CONFIG: &str = "configuration, not a count";
const PAGE: &str = "which part of the member list the document shows, not a count";
const LATENCY: &str = "a latency summary (see poolgate_request_duration_seconds)";

/// `/status` path (arrays as `[]`, map keys as `*`) → its series.
const TABLE: &[(&str, Want)] = &[
    ("uptime_s", Series(&[("poolgate_uptime_seconds", &[])])),
    ("pools[].max_concurrency", Not(CONFIG)),
    ("pools[].shards", Not(CONFIG)),
    ("pools[].upstreams_page.offset", Not(PAGE)),
    ("pools[].matrix[].cells_total", Not(PAGE)),
    ("pools[].upstreams_page.limit", Not(PAGE)),
    ("pools[].upstreams_page.listed", Not(PAGE)),
    (
        "pools[].upstreams_total",
        Series(&[("poolgate_upstreams", &[])]),
    ),
    (
        "pools[].sessions_live",
        Series(&[("poolgate_sessions_live", &[])]),
    ),
    (
        "pools[].leases_live",
        Series(&[("poolgate_leases_live", &[])]),
    ),
    (
        "pools[].counts_by_state.*",
        Keyed("poolgate_upstreams", "state"),
    ),
    (
        "pools[].bytes_by_label.*.*.bytes_up",
        Not(
            "the same sums are poolgate_label_bytes_total{label,value,direction=\"up\"} (nested keys; compared in tests/targeting.rs)",
        ),
    ),
    (
        "pools[].bytes_by_label.*.*.bytes_down",
        Not(
            "the same sums are poolgate_label_bytes_total{label,value,direction=\"down\"} (nested keys; compared in tests/targeting.rs)",
        ),
    ),
    (
        "pools[].labels.*.*.*",
        Not(
            "members by label value and state: in /metrics as poolgate_upstreams split by the pool's metric_labels, so that cardinality stays the operator's choice",
        ),
    ),
    (
        "pools[].quarantine_cap.limit",
        Series(&[("poolgate_quarantine_limit", &[])]),
    ),
    (
        "pools[].quarantine_cap.used",
        Series(&[("poolgate_quarantine_used", &[])]),
    ),
    ("pools[].incidents.targets[].since_s", Not(AGE)),
    ("pools[].upstreams[].state_since_s", Not(AGE)),
    (
        "pools[].upstreams[].success_ratio",
        Series(&[("poolgate_upstream_success_ratio", &[])]),
    ),
    (
        "pools[].upstreams[].captcha_ratio",
        Series(&[("poolgate_upstream_captcha_ratio", &[])]),
    ),
    (
        "pools[].upstreams[].quarantines_total",
        Series(&[("poolgate_upstream_quarantines_total", &[])]),
    ),
    ("pools[].upstreams[].cooldown_remaining_ms", Not(AGE)),
    (
        "pools[].upstreams[].probe_passes",
        Not("progress towards half-open, back to 0 at each state change"),
    ),
    ("pools[].upstreams[].latency_ewma_ms", Not(LATENCY)),
    ("pools[].upstreams[].latency_p50_ms", Not(LATENCY)),
    ("pools[].upstreams[].latency_p95_ms", Not(LATENCY)),
    (
        "pools[].upstreams[].allocation_cost",
        Not("an allocation weight"),
    ),
    (
        "pools[].upstreams[].leases_live",
        Series(&[("poolgate_leases_live", &[])]),
    ),
    (
        "pools[].upstreams[].allocations",
        Series(&[("poolgate_upstream_allocations_total", &[])]),
    ),
    (
        "pools[].upstreams[].outcomes.*",
        Keyed("poolgate_upstream_outcomes_total", "outcome"),
    ),
    (
        "pools[].upstreams[].success_ratio_total",
        Not("a ratio of poolgate_upstream_outcomes_total"),
    ),
    ("pools[].upstreams[].latency_avg_ms", Not(LATENCY)),
    (
        "pools[].matrix[].cells[].ok",
        Series(&[("poolgate_target_exchanges", &[("result", "ok")])]),
    ),
    (
        "pools[].matrix[].cells[].faults",
        Series(&[("poolgate_target_exchanges", &[("result", "faults")])]),
    ),
    (
        "pools[].matrix[].cells[].bans",
        Series(&[("poolgate_target_exchanges", &[("result", "bans")])]),
    ),
    (
        "pools[].matrix[].cells[].success_ratio",
        Series(&[("poolgate_target_success_ratio", &[])]),
    ),
    (
        "pools[].matrix[].cells[].captcha_ratio",
        Series(&[("poolgate_target_captcha_ratio", &[])]),
    ),
    (
        "pools[].probes.in_flight",
        Series(&[("poolgate_probes_in_flight", &[])]),
    ),
    (
        "pools[].probes.probes_total",
        Series(&[("poolgate_probe_results", &[])]),
    ),
    (
        "pools[].probes.passed",
        Series(&[("poolgate_probe_results", &[("result", "passed")])]),
    ),
    (
        "pools[].probes.failed",
        Series(&[
            ("poolgate_probe_results", &[("result", "failed")]),
            ("poolgate_probe_results", &[("result", "unjudged")]),
        ]),
    ),
    (
        "pools[].probes.failed_unjudged",
        Series(&[("poolgate_probe_results", &[("result", "unjudged")])]),
    ),
    (
        "pools[].probes.reference_probes",
        Series(&[("poolgate_reference_probes_total", &[])]),
    ),
    (
        "pools[].probes.exit_ip.recorded",
        Series(&[("poolgate_exit_ip_answers_total", &[("result", "recorded")])]),
    ),
    (
        "pools[].probes.exit_ip.rejected",
        Series(&[("poolgate_exit_ip_answers_total", &[("result", "rejected")])]),
    ),
    (
        "pools[].probes.exit_ip.failed",
        Series(&[("poolgate_exit_ip_answers_total", &[("result", "failed")])]),
    ),
    (
        "pools[].shared_exit_ips",
        Series(&[("poolgate_shared_exit_ips", &[])]),
    ),
    ("pools[].probes.incident.since_s", Not(AGE)),
    ("pools[].probes.last_probe_s_ago", Not(AGE)),
    ("pools[].rate_limit.per_upstream_per_s", Not(CONFIG)),
    ("pools[].rate_limit.per_upstream_target_per_s", Not(CONFIG)),
    ("pools[].rate_limit.burst", Not(CONFIG)),
    (
        "pools[].rate_limit.keys_tracked",
        Series(&[("poolgate_rate_limit_keys", &[])]),
    ),
    (
        "pools[].rate_limit.rejected.*",
        Keyed("poolgate_rate_limited_total", "scope"),
    ),
    (
        "pools[].rate_limit.waited.*",
        Keyed("poolgate_rate_limit_waits_total", "scope"),
    ),
    (
        "pools[].sources.listed",
        Series(&[("poolgate_source_upstreams", &[("state", "listed")])]),
    ),
    (
        "pools[].sources.admitted",
        Series(&[("poolgate_source_upstreams", &[("state", "admitted")])]),
    ),
    (
        "pools[].sources.probing",
        Series(&[("poolgate_source_upstreams", &[("state", "probing")])]),
    ),
    (
        "pools[].sources.pending",
        Series(&[("poolgate_source_upstreams", &[("state", "pending")])]),
    ),
    (
        "pools[].sources.rejected",
        Series(&[("poolgate_source_upstreams", &[("state", "rejected")])]),
    ),
    (
        "pools[].sources.skipped_lines",
        Series(&[("poolgate_source_skipped_lines", &[])]),
    ),
    (
        "pools[].sources.fetches_ok",
        Series(&[("poolgate_source_fetches", &[("state", "ok")])]),
    ),
    (
        "pools[].sources.fetches_failed",
        Series(&[("poolgate_source_fetches", &[("state", "failed")])]),
    ),
    (
        "requests.accepted",
        Series(&[("poolgate_requests_accepted_total", &[])]),
    ),
    (
        "requests.completed",
        Series(&[("poolgate_requests_ended_total", &[("end", "completed")])]),
    ),
    (
        "requests.rejected",
        Series(&[("poolgate_requests_ended_total", &[("end", "rejected")])]),
    ),
    (
        "requests.failed",
        Series(&[("poolgate_requests_ended_total", &[("end", "failed")])]),
    ),
    (
        "requests.in_flight",
        Series(&[("poolgate_requests_in_flight", &[])]),
    ),
    (
        "requests.forwarded",
        Series(&[("poolgate_requests_forwarded_total", &[])]),
    ),
    (
        "requests.by_door.*",
        Keyed("poolgate_requests_accepted_total", "door"),
    ),
    ("tunnels.open", Series(&[("poolgate_tunnels_open", &[])])),
    ("tunnels.total", Series(&[("poolgate_tunnels_total", &[])])),
    ("tunnels.by_door.*", Keyed("poolgate_tunnels_total", "door")),
    (
        "tunnels.open_by_door.*",
        Keyed("poolgate_tunnels_open", "door"),
    ),
    (
        "socks5.replies.*",
        Keyed("poolgate_socks5_replies_total", "reply"),
    ),
    (
        "socks5.handshakes_failed",
        Series(&[("poolgate_socks5_handshakes_failed_total", &[])]),
    ),
    (
        "connections.open",
        Series(&[("poolgate_connections_open", &[])]),
    ),
    (
        "connections.refused",
        Series(&[("poolgate_connections_refused_total", &[])]),
    ),
    (
        "config.generation",
        Series(&[("poolgate_config_generation", &[])]),
    ),
    (
        "config.reloads_ok",
        Series(&[("poolgate_config_reloads_total", &[("result", "ok")])]),
    ),
    (
        "config.reloads_failed",
        Series(&[("poolgate_config_reloads_total", &[("result", "failed")])]),
    ),
    (
        "intercept.tunnels_inspected",
        Series(&[("poolgate_intercept_tunnels_total", &[("mode", "inspected")])]),
    ),
    (
        "intercept.tunnels_excluded",
        Series(&[("poolgate_intercept_tunnels_total", &[("mode", "excluded")])]),
    ),
    (
        "intercept.tunnels_passthrough",
        Series(&[(
            "poolgate_intercept_tunnels_total",
            &[("mode", "passthrough")],
        )]),
    ),
    (
        "intercept.requests",
        Series(&[("poolgate_intercept_requests_total", &[])]),
    ),
    (
        "intercept.client_handshake_failures",
        Series(&[(
            "poolgate_intercept_handshake_failures_total",
            &[("side", "client")],
        )]),
    ),
    (
        "intercept.origin_handshake_failures",
        Series(&[(
            "poolgate_intercept_handshake_failures_total",
            &[("side", "origin")],
        )]),
    ),
    (
        "intercept.certs_minted",
        Series(&[("poolgate_intercept_certs_minted_total", &[])]),
    ),
    (
        "intercept.cert_cache_entries",
        Series(&[("poolgate_intercept_cert_cache_entries", &[])]),
    ),
    (
        "intercept.cert_cache_capacity",
        Series(&[("poolgate_intercept_cert_cache_capacity", &[])]),
    ),
    (
        "auth.password_checks",
        Series(&[("poolgate_auth_password_checks_total", &[])]),
    ),
    (
        "auth.failures",
        Series(&[("poolgate_auth_failures_total", &[])]),
    ),
    (
        "auth.lockout_refusals",
        Series(&[("poolgate_auth_lockout_refusals_total", &[])]),
    ),
    (
        "auth.clients_locked_out",
        Series(&[("poolgate_auth_clients_locked_out", &[])]),
    ),
    (
        "auth.cache_entries",
        Series(&[("poolgate_auth_cache_entries", &[])]),
    ),
    (
        "pools[].bytes_up",
        Series(&[("poolgate_pool_bytes_total", &[("direction", "up")])]),
    ),
    (
        "pools[].bytes_down",
        Series(&[("poolgate_pool_bytes_total", &[("direction", "down")])]),
    ),
    (
        "pools[].upstreams[].bytes_up",
        Series(&[("poolgate_upstream_bytes_total", &[("direction", "up")])]),
    ),
    (
        "pools[].upstreams[].bytes_down",
        Series(&[("poolgate_upstream_bytes_total", &[("direction", "down")])]),
    ),
    (
        "users[].bytes_up",
        Series(&[("poolgate_user_bytes_total", &[("direction", "up")])]),
    ),
    (
        "users[].bytes_down",
        Series(&[("poolgate_user_bytes_total", &[("direction", "down")])]),
    ),
    (
        "access_log.lines_written",
        Series(&[("poolgate_access_log_lines_total", &[("result", "written")])]),
    ),
    (
        "access_log.lines_dropped",
        Series(&[("poolgate_access_log_lines_total", &[("result", "dropped")])]),
    ),
];

/// Array elements whose field names the series of everything under them: (element path, field,
/// label).
const ELEMENT_LABELS: &[(&str, &str, &str)] = &[
    ("pools[]", "name", "pool"),
    ("pools[].upstreams[]", "id", "upstream"),
    ("pools[].matrix[]", "target", "target"),
    ("pools[].matrix[].cells[]", "upstream", "upstream"),
    ("users[]", "name", "user"),
];

/// One numeric field of `/status`.
#[derive(Debug)]
struct Leaf {
    /// With indices and keys, e.g. `pools[0].upstreams[2].outcomes.ok`.
    path: String,
    /// As in [`TABLE`], e.g. `pools[].upstreams[].outcomes.ok`.
    shape: String,
    labels: Vec<(String, String)>,
    value: f64,
}

fn walk(v: &Value, path: &str, shape: &str, labels: &[(String, String)], out: &mut Vec<Leaf>) {
    let join = |base: &str, key: &str| {
        if base.is_empty() {
            key.to_string()
        } else {
            format!("{base}.{key}")
        }
    };
    match v {
        Value::Number(n) => out.push(Leaf {
            path: path.to_string(),
            shape: shape.to_string(),
            labels: labels.to_vec(),
            value: n.as_f64().unwrap(),
        }),
        Value::Object(map) => {
            for (k, child) in map {
                walk(child, &join(path, k), &join(shape, k), labels, out);
            }
        }
        Value::Array(items) => {
            let shape = format!("{shape}[]");
            for (i, item) in items.iter().enumerate() {
                let mut labels = labels.to_vec();
                for (element, field, label) in ELEMENT_LABELS {
                    if *element == shape {
                        let name = item[*field]
                            .as_str()
                            .unwrap_or_else(|| panic!("{path}[{i}] has no string {field}: {item}"));
                        labels.retain(|(l, _)| l != label);
                        labels.push((label.to_string(), name.to_string()));
                    }
                }
                walk(item, &format!("{path}[{i}]"), &shape, &labels, out);
            }
        }
        Value::Null | Value::Bool(_) | Value::String(_) => {}
    }
}

fn leaves(status: &Value) -> Vec<Leaf> {
    let mut out = Vec::new();
    walk(status, "", "", &[], &mut out);
    out
}

/// The table's entry for `leaf`, and the map key when it matched a `*` entry.
fn lookup(leaf: &Leaf) -> Option<(&'static Want, Option<String>)> {
    if let Some((_, want)) = TABLE.iter().find(|(shape, _)| *shape == leaf.shape) {
        return Some((want, None));
    }
    let (parent, key) = leaf.shape.rsplit_once('.')?;
    let wildcard = format!("{parent}.*");
    if let Some((_, want)) = TABLE.iter().find(|(shape, _)| *shape == wildcard) {
        return Some((want, Some(key.to_string())));
    }
    // Nested maps (`a.*.*.*`): each `*` stands for one key; only `Not` entries are written so.
    let segments: Vec<&str> = leaf.shape.split('.').collect();
    TABLE
        .iter()
        .find(|(shape, want)| {
            let t: Vec<&str> = shape.split('.').collect();
            matches!(want, Not(_))
                && t.len() == segments.len()
                && t.iter().zip(&segments).all(|(a, b)| *a == "*" || a == b)
        })
        .map(|(_, want)| (want, None))
}

fn sample_value(v: &prometheus_parse::Value) -> Option<f64> {
    match v {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => Some(*v),
        _ => None,
    }
}

/// The sum of the series `sels` select under `labels`, or `None` when none matches.
fn metric_value(
    scrape: &prometheus_parse::Scrape,
    sels: &[(&str, Vec<(String, String)>)],
) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for (name, labels) in sels {
        let selected = scrape.samples.iter().filter(|s| {
            s.metric == *name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(k) == Some(v.as_str()))
        });
        for v in selected.filter_map(|s| sample_value(&s.value)) {
            found = true;
            sum += v;
        }
    }
    found.then_some(sum)
}

/// Holds every numeric leaf of `before` to its series in `scrape`, taken between `before` and
/// `after`: the series must exist and lie between the two figures. Returns the mismatches.
fn compare(before: &Value, scrape: &prometheus_parse::Scrape, after: &Value) -> Vec<String> {
    let after: BTreeMap<String, f64> = leaves(after)
        .into_iter()
        .map(|l| (l.path, l.value))
        .collect();
    let mut problems = Vec::new();
    for leaf in leaves(before) {
        let Some((want, key)) = lookup(&leaf) else {
            problems.push(format!("{}: not in the table", leaf.path));
            continue;
        };
        let sels: Vec<(&str, Vec<(String, String)>)> = match want {
            Not(_) => continue,
            Series(sels) => sels
                .iter()
                .map(|(name, extra)| {
                    let mut labels = leaf.labels.clone();
                    labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
                    (*name, labels)
                })
                .collect(),
            Keyed(name, label) => {
                let mut labels = leaf.labels.clone();
                labels.push((label.to_string(), key.clone().unwrap()));
                vec![(*name, labels)]
            }
        };
        let Some(got) = metric_value(scrape, &sels) else {
            problems.push(format!("{}: no series {sels:?}", leaf.path));
            continue;
        };
        let Some(&later) = after.get(&leaf.path) else {
            problems.push(format!("{}: gone from the second /status", leaf.path));
            continue;
        };
        let (lo, hi) = (leaf.value.min(later), leaf.value.max(later));
        if got < lo - 1e-9 || got > hi + 1e-9 {
            problems.push(format!(
                "{}: /status {} (then {later}), /metrics {got} for {sels:?}",
                leaf.path, leaf.value
            ));
        }
    }
    problems
}

fn scrape(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// A client through `proxy_url` trusting exactly `roots`.
fn client(
    proxy_url: &str,
    roots: &[&TestCa],
    extra: Option<reqwest::Certificate>,
) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(proxy_url).unwrap())
        .tls_built_in_root_certs(false)
        .timeout(Duration::from_secs(20));
    for r in roots {
        b = b.add_root_certificate(r.reqwest_cert());
    }
    if let Some(c) = extra {
        b = b.add_root_certificate(c);
    }
    b.build().unwrap()
}

/// Polls `/status` until `cond` holds (at most 10 s).
async fn eventually(gw: &TestGateway, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = gw.status().await;
        if cond(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_status_count_has_a_metric_with_the_same_value() {
    // An inspecting pool of two upstreams, and a pool read from a list and probed.
    let origin_ca = TestCa::new();
    let plain = Origin::start(OriginBehaviour::echo()).await;
    let tls = Origin::start_tls(OriginBehaviour::echo(), &origin_ca).await;
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let ups = [
        FakeProxy::start(FakeProxyOpts::default()).await,
        FakeProxy::start(FakeProxyOpts::default()).await,
    ];
    let listed = FakeProxy::start(FakeProxyOpts::default()).await;

    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let ca_key = dir.path().join("ca-key.pem");
    poolgate::intercept::ca::write_new(&ca, &ca_key, "poolgate test interception CA", false)
        .unwrap();
    let origin_ca_file = dir.path().join("origin-ca.pem");
    std::fs::write(&origin_ca_file, origin_ca.cert_pem()).unwrap();
    let interception_ca =
        reqwest::Certificate::from_pem(std::fs::read_to_string(&ca).unwrap().as_bytes()).unwrap();
    let list = dir.path().join("upstreams.txt");
    std::fs::write(&list, format!("{} country=us\nnot a proxy\n", listed.url())).unwrap();

    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}, {}]\n\
         [intercept]\nca_cert = {ca:?}\nca_key = {ca_key:?}\norigin_ca_file = {origin_ca_file:?}\n\
         [pools.default]\nupstreams = [{:?}, {:?}]\ninspect_tls = true\n\
         [pools.listed]\nupstreams_file = {list:?}\n\
         [pools.listed.probe]\ntargets = [{:?}]\nexpect_body = \"control-ok\"\ninterval = \"30s\"\n\
         successes = 2\ntimeout = \"2s\"\n",
        tls.port(),
        plain.port(),
        ups[0].url(),
        ups[1].url(),
        control.url("/control"),
    ))
    .await;

    // Plain requests.
    let plain_client = gw.client();
    for _ in 0..4 {
        let resp = plain_client.get(plain.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    // An inspected tunnel with two requests.
    let trusting = client(
        &gw.proxy_url(),
        &[&origin_ca],
        Some(interception_ca.clone()),
    );
    for _ in 0..2 {
        let resp = trusting.get(tls.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    drop(trusting);
    // A client that does not trust the interception CA: a client handshake failure.
    let untrusting = client(&gw.proxy_url(), &[&origin_ca], None);
    untrusting.get(tls.url("/ok")).send().await.unwrap_err();
    drop(untrusting);
    // An origin that does not speak TLS: an origin handshake failure.
    let to_plain = client(&gw.proxy_url(), &[&origin_ca], Some(interception_ca));
    let _ = to_plain
        .get(format!("https://127.0.0.1:{}/ok", plain.port()))
        .send()
        .await;
    drop(to_plain);

    // Everything settled: the failures counted, the list's upstream admitted, nothing in flight.
    let status = eventually(&gw, "the traffic to settle", |s| {
        let i = &s["intercept"];
        let pools = s["pools"].as_array().unwrap();
        i["client_handshake_failures"].as_u64() >= Some(1)
            && i["origin_handshake_failures"].as_u64() >= Some(1)
            && s["requests"]["in_flight"] == 0
            && s["tunnels"]["open"] == 0
            && pools.iter().all(|p| p["leases_live"] == 0)
            && pools
                .iter()
                .any(|p| p["name"] == "listed" && p["sources"]["admitted"] == 1)
    })
    .await;
    assert!(
        status["requests"]["completed"].as_u64().unwrap() >= 4,
        "{status}"
    );
    assert!(
        status["intercept"]["requests"].as_u64().unwrap() >= 2,
        "{status}"
    );

    // Fields missing from the table fail at once; figures that moved meanwhile are read again.
    let unknown: Vec<String> = leaves(&status)
        .iter()
        .filter(|l| lookup(l).is_none())
        .map(|l| format!("{} ({})", l.path, l.shape))
        .collect();
    assert!(
        unknown.is_empty(),
        "/status counts missing from the table (give each a /metrics series): {unknown:?}"
    );
    for (shape, want) in TABLE {
        if let Not(why) = want {
            eprintln!("no series for {shape}: {why}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let before = gw.status().await;
        let text = gw.metrics().await;
        let after = gw.status().await;
        let problems = compare(&before, &scrape(&text), &after);
        if problems.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics disagrees with /status:\n{}\n---\n{text}",
            problems.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
