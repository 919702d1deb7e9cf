//! Client authentication and the client allowlist: 407 without or with wrong credentials, 200
//! with the right ones (also when the username carries session or targeting tokens), per-user
//! pools, clients outside `auth.client_cidrs` refused, and a client past its failure budget
//! locked out alone, for a while.
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
/// `acct` logs in as `acct-country-us-session-a`, and the request is sticky on session `a` inside
/// its filter (each filter its own session, so four live sessions with the plain one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_tokens_before_the_session_log_in_as_the_account() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..4 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let labels = "country = \"us\", city = \"new_york\", type = \"residential\", asn = \"7922\"";
    let list: Vec<String> = ups
        .iter()
        .map(|u| format!("{{ url = \"{}\", labels = {{ {labels} }} }}", u.url()))
        .collect();
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [auth.users.acct]\npassword_hash = \"{}\"\n\
         [pools.default]\nupstreams = [{}]\n",
        hash("acct-password"),
        list.join(", "),
    ))
    .await;
    let url = origin.url("/ok");
    for user in [
        "acct-country-us-session-a",
        "acct-country-us-city-new_york-session-a",
        "acct-type-residential-asn-7922-session-a-sesstime-10",
    ] {
        let mut seen = std::collections::HashSet::new();
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
        assert_eq!(
            seen.len(),
            1,
            "{user}: one upstream for session a: {seen:?}"
        );
    }
    let plain = gw.client_via(&format!("http://acct:acct-password@{}", gw.proxy), None);
    let resp = plain
        .get(&url)
        .header("X-Pool-Session", "a")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(gw.status().await["pools"][0]["sessions_live"], 4);
    // The wrong password is still wrong with tokens.
    let wrong = gw.client_via(
        &format!("http://acct-country-us-session-a:nope@{}", gw.proxy),
        None,
    );
    assert_eq!(wrong.get(&url).send().await.unwrap().status(), 407);
}

/// The per-client failure budget: 3 wrong passwords from 127.0.0.1, then even the right one gets
/// `407 auth-locked-out` at once, without a password check (the check count stands still); a
/// client from 127.0.0.2 is unaffected; after `login_lockout` the right password works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_failure_budget_is_locked_out_alone_and_for_a_while() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(
        &upstream,
        "max_login_failures = 3\nlogin_failure_window = \"1m\"\nlogin_lockout = \"2s\"",
    )
    .await;
    let url = origin.url("/ok");
    let from = |local: [u8; 4], password: &str| {
        reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(format!("http://alice:{password}@{}", gw.proxy)).unwrap())
            .local_address(std::net::IpAddr::from(local))
            .timeout(std::time::Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let checks = |s: &serde_json::Value| s["auth"]["password_checks"].as_u64().unwrap();

    let wrong = from([127, 0, 0, 1], "not-wonderland");
    for i in 0..3 {
        let resp = wrong.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 407, "{i}");
        assert_eq!(resp.headers()["x-pool-error"], "auth-required", "{i}");
    }
    let before = gw.status().await;
    assert_eq!(before["auth"]["failures"], 3, "{before}");
    assert_eq!(before["auth"]["clients_locked_out"], 1, "{before}");

    let right = from([127, 0, 0, 1], "wonderland");
    for client in [&right, &wrong] {
        let resp = client.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 407);
        assert_eq!(resp.headers()["x-pool-error"], "auth-locked-out");
        let retry: u64 = resp.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=2).contains(&retry), "{retry}");
        assert!(resp.headers().contains_key("proxy-authenticate"));
    }
    let after = gw.status().await;
    assert_eq!(
        checks(&after),
        checks(&before),
        "no password check while locked out"
    );
    assert_eq!(after["auth"]["lockout_refusals"], 2, "{after}");
    let metrics = gw.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("poolgate_auth_lockout_refusals_total") && l.ends_with(" 2")),
        "{metrics}"
    );

    // Another client address is unaffected.
    let resp = from([127, 0, 0, 2], "wonderland")
        .get(&url)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    // After the lockout, the right password works again (polled, at most 5 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let resp = right.get(&url).send().await.unwrap();
        if resp.status() == 200 {
            break;
        }
        assert_eq!(resp.headers()["x-pool-error"], "auth-locked-out");
        assert!(
            std::time::Instant::now() < deadline,
            "still locked out after the lockout"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(gw.status().await["auth"]["clients_locked_out"], 0);
}
