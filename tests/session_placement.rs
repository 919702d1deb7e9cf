//! Where a new session lands when the first members of its order cannot take it: past members
//! out of service (drained by an operator) and past members at their concurrency cap, the key
//! binds to the next member of its consistent-hash order that can, through the whole gateway.
//! (The store's side of the same rule, on both stores, is in tests/store_conformance.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashSet;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};

const TOKEN: &str = "test-admin-token-0123456789";

async fn drain(gw: &TestGateway, upstream: &str) {
    let body = serde_json::json!({"pool": "default", "upstream": upstream, "action": "drain"});
    let r = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{}/admin/upstream", gw.admin))
        .bearer_auth(TOKEN)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// Seven of eight members drained: most keys have none of their first four choices left, and
/// every new session still binds to the one member in service at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sessions_walk_past_drained_members() {
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..8 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let list: Vec<String> = ups.iter().map(|u| format!("\"{}\"", u.url())).collect();
    let gw = TestGateway::start_with(
        &format!("admin_token = \"{TOKEN}\""),
        &format!(
            "[policy]\nallow_private_targets = true\n\
             [pools.default]\nupstreams = [{}]\nqueue_timeout = \"3s\"\n",
            list.join(", ")
        ),
    )
    .await;
    let client = gw.client();
    let url = origin.url("/ok");
    for up in &ups[1..] {
        drain(&gw, &up.url()).await;
    }
    let started = tokio::time::Instant::now();
    let mut used = HashSet::new();
    for i in 0..24 {
        let key = format!("walk-{i}");
        let resp = client
            .get(&url)
            .header("X-Pool-Session", key.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "session {key} refused");
        used.insert(
            resp.headers()["x-pool-upstream"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(used.len(), 1, "{used:?}");
    assert!(
        used.iter()
            .next()
            .unwrap()
            .contains(&ups[0].addr().to_string()),
        "{used:?}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "new sessions waited: {:?}",
        started.elapsed()
    );
}
