//! Sticky sessions through the gateway: header, username and alias forms, `create`, spread over
//! upstreams, and what happens when the pool changes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestCa, TestGateway};

async fn proxies(n: usize) -> Vec<FakeProxy> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    v
}

fn config(upstreams: &[&FakeProxy], port: u16, extra_pool: &str) -> String {
    let list: Vec<String> = upstreams
        .iter()
        .map(|u| format!("\"{}\"", u.url()))
        .collect();
    format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{port}]\n\
         [pools.default]\nupstreams = [{}]\n{extra_pool}\n",
        list.join(", ")
    )
}

fn upstream_of(resp: &reqwest::Response) -> String {
    resp.headers()["x-pool-upstream"]
        .to_str()
        .unwrap()
        .to_string()
}

/// Which upstream each of `keys` is bound to, one request per key.
async fn placement(gw: &TestGateway, origin: &Origin, keys: &[String]) -> HashMap<String, String> {
    let client = gw.client();
    let mut map = HashMap::new();
    for k in keys {
        let resp = client
            .get(origin.url("/ok"))
            .header("X-Pool-Session", k)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        map.insert(k.clone(), upstream_of(&resp));
    }
    map
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_key_always_leaves_through_one_upstream() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(8).await;
    let gw = TestGateway::start(&config(&ups.iter().collect::<Vec<_>>(), origin.port(), "")).await;
    let client = gw.client();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..100 {
        let resp = client
            .get(origin.url("/ok"))
            .header("X-Pool-Session", "cart-42")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["x-pool-session"], "cart-42");
        seen.insert(upstream_of(&resp));
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    let used: Vec<usize> = ups.iter().map(|u| u.requests()).collect();
    assert_eq!(used.iter().filter(|&&n| n > 0).count(), 1, "{used:?}");
    assert_eq!(used.iter().sum::<usize>(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_spread_evenly_and_removing_an_upstream_moves_only_its_keys() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(8).await;
    let keys: Vec<String> = (0..1000).map(|i| format!("user{i}")).collect();

    let gw = TestGateway::start(&config(&ups.iter().collect::<Vec<_>>(), origin.port(), "")).await;
    let before = placement(&gw, &origin, &keys).await;
    let mut counts: HashMap<&String, usize> = HashMap::new();
    for up in before.values() {
        *counts.entry(up).or_default() += 1;
    }
    let max = *counts.values().max().unwrap();
    assert_eq!(counts.len(), 8);
    assert!(max as f64 <= 1.5 * 1000.0 / 8.0, "max {max} of {counts:?}");
    drop(gw);

    // A gateway without upstream 3 (and with a fresh store): only upstream 3's keys move.
    let removed = format!("http://{}", ups[3].addr());
    let kept: Vec<&FakeProxy> = ups
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3)
        .map(|(_, u)| u)
        .collect();
    let gw = TestGateway::start(&config(&kept, origin.port(), "")).await;
    let after = placement(&gw, &origin, &keys).await;
    let mut moved = 0;
    for k in &keys {
        if before[k] == removed {
            assert_ne!(after[k], removed);
            moved += 1;
        } else {
            assert_eq!(
                after[k], before[k],
                "key {k} moved although its upstream stayed"
            );
        }
    }
    assert_eq!(moved, counts[&removed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_session_makes_connect_tunnels_sticky() {
    let ca = TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let ups = proxies(4).await;
    let gw = TestGateway::start(&config(&ups.iter().collect::<Vec<_>>(), origin.port(), "")).await;
    for _ in 0..12 {
        // A fresh client each time: a new CONNECT tunnel each time.
        let client = gw.client_via(&gw.proxy_url_as("acct-session-tls1-zone-us"), Some(&ca));
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.text().await.unwrap(), "ok");
    }
    let connects: Vec<usize> = ups.iter().map(|u| u.connects()).collect();
    assert_eq!(
        connects.iter().filter(|&&n| n > 0).collect::<Vec<_>>(),
        vec![&12],
        "{connects:?}"
    );
    // The gateway kept the client's credentials to itself.
    assert!(ups.iter().all(|u| u.auth_seen().is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alias_headers_and_username_tokens_stick_and_are_not_forwarded() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(6).await;
    let gw = TestGateway::start(&config(&ups.iter().collect::<Vec<_>>(), origin.port(), "")).await;
    let plain = gw.client();
    for (header, key) in [
        ("x-lpm-session", "lpm1"),
        ("Zyte-Session-ID", "zyte1"),
        ("X-Crawlera-Session", "crawlera1"),
        ("X-Pool-Session", "pool1"),
    ] {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10 {
            let resp = plain
                .get(origin.url("/ok"))
                .header(header, key)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            seen.insert(upstream_of(&resp));
        }
        assert_eq!(seen.len(), 1, "{header}");
    }
    for user in [
        "me-sessid-ox1",
        "me-sessionid-soax1-sessionduration-30",
        "brd-customer-c1-zone-z-session-bd1-lifetime-5",
    ] {
        let client = gw.client_via(&gw.proxy_url_as(user), None);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10 {
            let resp = client.get(origin.url("/ok")).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{user}");
            seen.insert(upstream_of(&resp));
        }
        assert_eq!(seen.len(), 1, "{user}");
    }
    for r in origin.requests() {
        for (k, _) in &r.headers {
            let k = k.to_lowercase();
            assert!(
                ![
                    "x-lpm-session",
                    "zyte-session-id",
                    "x-crawlera-session",
                    "proxy-authorization"
                ]
                .contains(&k.as_str())
                    && !k.starts_with("x-pool-"),
                "origin saw {k}"
            );
        }
    }
    let status = gw.status().await;
    assert_eq!(status["pools"][0]["sessions_live"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_mints_a_key_that_then_sticks() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(5).await;
    let gw = TestGateway::start(&config(&ups.iter().collect::<Vec<_>>(), origin.port(), "")).await;
    let client = gw.client();
    let first = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "create")
        .send()
        .await
        .unwrap();
    let key = first.headers()["x-pool-session"]
        .to_str()
        .unwrap()
        .to_string();
    assert_ne!(key, "create");
    assert!(key.len() >= 16);
    let up = upstream_of(&first);
    for _ in 0..10 {
        let resp = client
            .get(origin.url("/ok"))
            .header("X-Pool-Session", &key)
            .send()
            .await
            .unwrap();
        assert_eq!(upstream_of(&resp), up);
    }
    // Two creates give two keys.
    let second = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "create")
        .send()
        .await
        .unwrap();
    assert_ne!(second.headers()["x-pool-session"].to_str().unwrap(), key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_session_input_is_refused_not_ignored() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(2).await;
    let gw = TestGateway::start(&config(&ups.iter().collect::<Vec<_>>(), origin.port(), "")).await;
    for user in [
        "me-session-",
        "me-session-a-session-b",
        "me-sesstime-abc-session-x",
        "me-session-ok-country",
    ] {
        let resp = gw
            .client_via(&gw.proxy_url_as(user), None)
            .get(origin.url("/ok"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 407, "{user}");
        assert_eq!(resp.headers()["x-pool-error"], "session-invalid");
        assert!(resp.headers().contains_key("proxy-authenticate"));
        let body = resp.text().await.unwrap();
        assert!(
            body.contains("username") && body.contains("<user>-"),
            "{user}: {body}"
        );
    }
    let resp = gw
        .client()
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "bad key!")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-pool-error"], "session-invalid");
    let resp = gw
        .client()
        .get(origin.url("/ok"))
        .header("X-Pool-Name", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["x-pool-error"], "unknown-pool");
    assert_eq!(
        origin.request_count(),
        0,
        "nothing malformed reached the origin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_is_chosen_by_header_or_username_token() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(2).await;
    let text = format!(
        "[policy]\nallow_private_targets = true\n\
         [pools.default]\nupstreams = [\"{}\"]\n[pools.eu]\nupstreams = [\"{}\"]\n",
        ups[0].url(),
        ups[1].url()
    );
    let gw = TestGateway::start_with("default_pool = \"default\"", &text).await;
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(upstream_of(&resp), ups[0].url());
    let resp = gw
        .client()
        .get(origin.url("/ok"))
        .header("X-Pool-Name", "eu")
        .send()
        .await
        .unwrap();
    assert_eq!(upstream_of(&resp), ups[1].url());
    let resp = gw
        .client_via(&gw.proxy_url_as("me-pool-eu"), None)
        .get(origin.url("/ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(upstream_of(&resp), ups[1].url());
}
