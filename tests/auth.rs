//! Client authentication and the client allowlist: 407 without or with wrong credentials, 200
//! with the right ones (also when the username carries session tokens), per-user pools, and
//! clients outside `auth.client_cidrs` refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::auth::hash_password_with_cost;

/// Cheap argon2 cost for tests; production hashes come from `poolgate hash-password`.
fn hash(pw: &str) -> String {
    hash_password_with_cost(pw, 8, 1, 1).unwrap()
}

async fn gateway(upstream: &FakeProxy, extra: &str) -> TestGateway {
    TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [auth]\n{extra}\n\
         [auth.users.alice]\npassword_hash = \"{}\"\n\
         [auth.users.bob]\npassword_hash = \"{}\"\npools = [\"eu\"]\n\
         [pools.default]\nupstreams = [\"{}\"]\n\
         [pools.eu]\nupstreams = [\"{}#eu\"]\n",
        hash("wonderland"),
        hash("builder"),
        upstream.url(),
        upstream.url(),
    ))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_credentials_get_407_and_right_ones_get_through() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(&upstream, "").await;
    let url = origin.url("/ok");

    let resp = gw.client().get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 407);
    assert_eq!(resp.headers()["x-pool-error"], "auth-required");
    assert!(
        resp.headers()["proxy-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );

    for (user, pw) in [("alice", "wrong"), ("mallory", "wonderland"), ("alice", "")] {
        let url_with = format!("http://{user}:{pw}@{}", gw.proxy);
        let resp = gw
            .client_via(&url_with, None)
            .get(&url)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 407, "{user}:{pw}");
    }
    assert_eq!(
        upstream.requests(),
        0,
        "nothing unauthenticated went upstream"
    );

    // Right password, also with session tokens in the username, repeatedly (cached).
    for user in ["alice", "alice-session-abc", "alice-session-abc-sesstime-5"] {
        let client = gw.client_via(&gw.proxy_url_as(user).replace(":x@", ":wonderland@"), None);
        for _ in 0..3 {
            let resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{user}");
            assert_eq!(resp.text().await.unwrap(), "ok");
        }
    }
    assert_eq!(upstream.requests(), 9);
    // The client's credentials never reach the upstream or the origin.
    assert!(
        upstream.auth_seen().is_empty(),
        "{:?}",
        upstream.auth_seen()
    );
    assert!(
        origin
            .requests()
            .iter()
            .all(|r| !r.has_header("proxy-authorization"))
    );

    // CONNECT: 407 without credentials, and the connection is closed.
    let raw = common::raw_http(
        gw.proxy,
        format!("CONNECT {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.authority()).as_bytes(),
    )
    .await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 407"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_are_limited_to_their_pools() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(&upstream, "").await;
    let bob = gw.client_via(&format!("http://bob:builder@{}", gw.proxy), None);
    // Naming no pool, bob lands in his only pool.
    let resp = bob.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-pool-upstream"], "eu");
    let resp = bob
        .get(origin.url("/ok"))
        .header("X-Pool-Name", "default")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.headers()["x-pool-error"], "pool-denied");
    // alice may use every pool.
    let alice = gw.client_via(&format!("http://alice:wonderland@{}", gw.proxy), None);
    for pool in ["default", "eu"] {
        let resp = alice
            .get(origin.url("/ok"))
            .header("X-Pool-Name", pool)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{pool}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_outside_the_allowlist_are_refused() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(&upstream, "client_cidrs = [\"10.0.0.0/8\"]").await;
    let alice = gw.client_via(&format!("http://alice:wonderland@{}", gw.proxy), None);
    let resp = alice.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.headers()["x-pool-error"], "client-denied");
    assert_eq!(upstream.requests(), 0);

    let gw = gateway(&upstream, "client_cidrs = [\"127.0.0.0/8\", \"::1\"]").await;
    let alice = gw.client_via(&format!("http://alice:wonderland@{}", gw.proxy), None);
    let resp = alice.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
}

/// Targeting tokens (`-country-us`) before the session token end the account like it does: user
/// `acct` logs in as `acct-country-us-session-a`, and the request is sticky on session `a` (the
/// same upstream as `X-Pool-Session: a`, one live session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_tokens_before_the_session_log_in_as_the_account() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..4 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let list: Vec<String> = ups.iter().map(|u| format!("\"{}\"", u.url())).collect();
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [auth.users.acct]\npassword_hash = \"{}\"\n\
         [pools.default]\nupstreams = [{}]\n",
        hash("acct-password"),
        list.join(", "),
    ))
    .await;
    let url = origin.url("/ok");
    let mut seen = std::collections::HashSet::new();
    for user in [
        "acct-country-us-session-a",
        "acct-country-us-city-new_york-session-a",
        "acct-type-residential-asn-7922-session-a-sesstime-10",
    ] {
        let client = gw.client_via(&format!("http://{user}:acct-password@{}", gw.proxy), None);
        for _ in 0..3 {
            let resp = client.get(&url).send().await.unwrap();
            assert_eq!(resp.status(), 200, "{user}");
            assert_eq!(resp.headers()["x-pool-session"], "a", "{user}");
            seen.insert(
                resp.headers()["x-pool-upstream"]
                    .to_str()
                    .unwrap()
                    .to_string(),
            );
        }
    }
    let plain = gw.client_via(&format!("http://acct:acct-password@{}", gw.proxy), None);
    let resp = plain
        .get(&url)
        .header("X-Pool-Session", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    seen.insert(
        resp.headers()["x-pool-upstream"]
            .to_str()
            .unwrap()
            .to_string(),
    );
    assert_eq!(seen.len(), 1, "one upstream for session a: {seen:?}");
    assert_eq!(gw.status().await["pools"][0]["sessions_live"], 1);
    // The wrong password is still wrong with tokens.
    let wrong = gw.client_via(
        &format!("http://acct-country-us-session-a:nope@{}", gw.proxy),
        None,
    );
    assert_eq!(wrong.get(&url).send().await.unwrap().status(), 407);
}
