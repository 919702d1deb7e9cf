//! `/status` lists a pool's members a page at a time (`upstreams`, `limit`, `offset`, `pool`),
//! while the pool's totals count them all; `/metrics` gives per-upstream series only for pools of
//! at most `[metrics] per_upstream_max` members.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::TestGateway;
use serde_json::Value;

/// 30 members that are never dialed (nothing is requested through them).
fn members(n: u16) -> String {
    (0..n)
        .map(|i| format!("\"http://127.0.0.1:{}\"", 20001 + i))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn gateway() -> TestGateway {
    TestGateway::start_with(
        "default_pool = \"big\"",
        &format!(
            "[metrics]\nper_upstream_max = 5\n\
         [pools.big]\nupstreams = [{}]\n\
         [pools.small]\nupstreams = [{}]\n",
            members(30),
            "\"http://127.0.0.1:20100\""
        ),
    )
    .await
}

async fn get(gw: &TestGateway, query: &str) -> (u16, String) {
    common::admin_get(gw.admin, &format!("/status{query}")).await
}

async fn status(gw: &TestGateway, query: &str) -> Value {
    let (code, body) = get(gw, query).await;
    assert_eq!(code, 200, "{query}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn pool<'a>(st: &'a Value, name: &str) -> &'a Value {
    st["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no pool {name}"))
}

fn ids(p: &Value) -> Vec<String> {
    p["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn status_pages_members_and_keeps_totals() {
    let gw = gateway().await;

    // Default: configured order, up to 1000 members.
    let st = status(&gw, "").await;
    let big = pool(&st, "big");
    assert_eq!(big["upstreams_total"], 30);
    assert_eq!(ids(big).len(), 30);
    assert_eq!(
        big["upstreams_page"],
        serde_json::json!({"order": "configured", "offset": 0, "limit": 1000, "listed": 30})
    );
    let all = ids(big);

    // A page: members 25..30 of the configured order.
    let st = status(&gw, "?limit=10&offset=25").await;
    let big = pool(&st, "big");
    assert_eq!(ids(big), all[25..].to_vec());
    assert_eq!(big["upstreams_page"]["listed"], 5);
    assert_eq!(big["upstreams_total"], 30);
    let st = status(&gw, "?limit=7&offset=3").await;
    assert_eq!(ids(pool(&st, "big")), all[3..10].to_vec());

    // None: the totals only, which still count every member.
    let st = status(&gw, "?upstreams=none").await;
    let big = pool(&st, "big");
    assert!(ids(big).is_empty());
    let counted: u64 = big["counts_by_state"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(counted, 30);

    // Top: every member idle, so configured order (the sort is stable).
    let st = status(&gw, "?upstreams=top&limit=4").await;
    assert_eq!(ids(pool(&st, "big")), all[..4].to_vec());
    assert_eq!(pool(&st, "big")["upstreams_page"]["order"], "top");

    // One pool.
    let st = status(&gw, "?pool=small").await;
    assert_eq!(st["pools"].as_array().unwrap().len(), 1);
    assert_eq!(st["pools"][0]["name"], "small");
}

#[tokio::test]
async fn bad_status_queries_are_refused_naming_the_parameter() {
    let gw = gateway().await;
    for (query, names) in [
        ("?limit=0", "limit"),
        ("?limit=100001", "limit"),
        ("?limit=ten", "limit"),
        ("?offset=-1", "offset"),
        ("?upstreams=some", "upstreams"),
        ("?page=2", "page"),
    ] {
        let (code, body) = get(&gw, query).await;
        assert_eq!(code, 400, "{query}: {body}");
        assert!(body.contains(names), "{query}: {body}");
    }
}

#[tokio::test]
async fn per_upstream_series_only_for_pools_within_per_upstream_max() {
    let gw = gateway().await;
    let metrics = gw.metrics().await;
    let series = |pool: &str| {
        metrics
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.contains(&format!("pool=\"{pool}\"")) && l.contains("upstream=\""))
            .count()
    };
    // 30 members over a bound of 5: the pool's totals only.
    assert_eq!(series("big"), 0, "{metrics}");
    assert!(
        metrics.contains("poolgate_upstreams{pool=\"big\""),
        "{metrics}"
    );
    // One member: its own series.
    assert!(series("small") > 0, "{metrics}");
}
