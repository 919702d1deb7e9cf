//! Allocation under failure and load: retry on connect failure, sessions on a dead upstream,
//! concurrency caps with queueing, and least-used balance.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, TestCa, TestGateway};

fn config(upstreams: &[String], port: u16, pool_extra: &str) -> String {
    let list: Vec<String> = upstreams.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{port}]\n\
         [pools.default]\nupstreams = [{}]\n{pool_extra}\n",
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_upstream_is_skipped_by_retry_for_plain_and_tunnel_traffic() {
    let ca = TestCa::new();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let tls_origin = Origin::start_tls(OriginBehaviour::echo(), &ca).await;
    let good = FakeProxy::start(FakeProxyOpts::default()).await;
    let dead = format!("http://{}", FakeProxy::dead());
    let text = format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [\"{dead}\", \"{}\"]\nstrategy = \"round-robin\"\n",
        tls_origin.port(),
        good.url()
    );
    let gw = TestGateway::start(&text).await;
    let client = gw.client();
    for _ in 0..20 {
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-pool-upstream"], good.url().as_str());
    }
    for _ in 0..6 {
        let tls = gw.client_via(&gw.proxy_url(), Some(&ca));
        assert_eq!(
            tls.get(tls_origin.url("/ok"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
            "ok"
        );
    }
    let dead_status = gw.upstream_status("default", &dead).await;
    assert!(
        dead_status["outcomes"]["connect_error"].as_u64().unwrap() >= 3,
        "{dead_status}"
    );
    assert_eq!(dead_status["state"], "quarantined", "{dead_status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_upstreams_refusing_gives_502_upstream_connect_failed() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let dead: Vec<String> = (0..3)
        .map(|_| format!("http://{}", FakeProxy::dead()))
        .collect();
    let gw = TestGateway::start(&config(&dead, origin.port(), "")).await;
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 502);
    assert_eq!(resp.headers()["x-pool-error"], "upstream-connect-failed");
    let ps = resp.headers()["proxy-status"].to_str().unwrap();
    assert!(ps.contains("error=connection_refused"), "{ps}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_session_on_a_dead_upstream_fails_clearly_instead_of_teleporting() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let a = FakeProxy::start(FakeProxyOpts::default()).await;
    let b = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&config(&[a.url(), b.url()], origin.port(), "")).await;
    let client = gw.client();
    let resp = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "s1")
        .send()
        .await
        .unwrap();
    let bound = resp.headers()["x-pool-upstream"]
        .to_str()
        .unwrap()
        .to_string();
    let (victim, other) = if bound == a.url() { (&a, &b) } else { (&b, &a) };
    // Keep-alive connections to the victim die with it.
    victim.set_mode(ProxyMode::RefuseConnections).await;
    let other_before = other.requests();
    for _ in 0..3 {
        let resp = client
            .get(origin.url("/ok"))
            .header("X-Pool-Session", "s1")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 502);
        assert_eq!(
            resp.headers()["x-pool-error"],
            "session-upstream-unavailable"
        );
        assert_eq!(resp.headers()["x-pool-upstream"], bound.as_str());
    }
    assert_eq!(
        other.requests(),
        other_before,
        "the session never teleported"
    );
    // Non-sticky traffic still flows.
    let resp = client.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    // And the session is back once its upstream is.
    victim.set_mode(ProxyMode::Normal).await;
    let resp = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "s1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-pool-upstream"], bound.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_cap_holds_under_200_concurrent_requests() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..4 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let urls: Vec<String> = ups.iter().map(|u| u.url()).collect();
    let gw = TestGateway::start(&config(
        &urls,
        origin.port(),
        "max_concurrency = 4\nqueue_timeout = \"30s\"",
    ))
    .await;
    let client = gw.client();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let client = client.clone();
        let url = origin.url("/slow?ms=20");
        tasks.spawn(async move { client.get(url).send().await.unwrap().status() });
    }
    while let Some(status) = tasks.join_next().await {
        assert_eq!(status.unwrap(), 200);
    }
    let peaks: Vec<usize> = ups.iter().map(|u| u.peak_in_flight()).collect();
    assert!(peaks.iter().all(|&p| p <= 4), "peaks {peaks:?}");
    assert!(peaks.contains(&4), "the cap was reached: {peaks:?}");
    assert_eq!(ups.iter().map(|u| u.requests()).sum::<usize>(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_pool_answers_503_after_queue_timeout() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&config(
        &[up.url()],
        origin.port(),
        "max_concurrency = 1\nqueue_timeout = \"200ms\"",
    ))
    .await;
    let client = gw.client();
    let slow = {
        let client = client.clone();
        let url = origin.url("/slow?ms=3000");
        tokio::spawn(async move { client.get(url).send().await.unwrap().status() })
    };
    assert!(common::wait_until(|| up.in_flight() == 1, Duration::from_secs(5)).await);
    let resp = client.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["x-pool-error"], "pool-exhausted");
    assert!(
        resp.headers()["proxy-status"]
            .to_str()
            .unwrap()
            .contains("connection_limit_reached")
    );
    assert_eq!(
        slow.await.unwrap(),
        200,
        "the request holding the upstream was unharmed"
    );
    // Capacity is back after the release.
    assert_eq!(
        client.get(origin.url("/ok")).send().await.unwrap().status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_request_is_woken_by_a_release() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start(&config(
        &[up.url()],
        origin.port(),
        "max_concurrency = 1\nqueue_timeout = \"20s\"",
    ))
    .await;
    let client = gw.client();
    let first = {
        let client = client.clone();
        let url = origin.url("/slow?ms=300");
        tokio::spawn(async move {
            let resp = client.get(url).send().await.unwrap();
            let status = resp.status();
            resp.bytes().await.unwrap();
            (status, std::time::Instant::now())
        })
    };
    assert!(common::wait_until(|| up.in_flight() == 1, Duration::from_secs(5)).await);
    let resp = client.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let second_done = std::time::Instant::now();
    let (status, first_done) = first.await.unwrap();
    assert_eq!(status, 200);
    // Woken by the release itself, as the store conformance suite asserts (within 500 ms), not
    // by a poll or the queue timeout.
    let after_release = second_done.saturating_duration_since(first_done);
    assert!(
        after_release < Duration::from_millis(500),
        "the queued request finished {after_release:?} after the first released"
    );
    assert_eq!(up.peak_in_flight(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_used_balances_8000_requests_over_8_upstreams_within_one() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..8 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let urls: Vec<String> = ups.iter().map(|u| u.url()).collect();
    let gw = TestGateway::start(&config(&urls, origin.port(), "strategy = \"least-used\"")).await;
    let client = gw.client();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..16 {
        let client = client.clone();
        let url = origin.url("/ok");
        tasks.spawn(async move {
            for _ in 0..500 {
                let resp = client.get(&url).send().await.unwrap();
                assert_eq!(resp.status(), 200, "worker {worker}");
                resp.bytes().await.unwrap();
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let status = gw.status().await;
    let allocs: Vec<u64> = status["pools"][0]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["allocations"].as_u64().unwrap())
        .collect();
    assert_eq!(allocs.iter().sum::<u64>(), 8000);
    let spread = allocs.iter().max().unwrap() - allocs.iter().min().unwrap();
    assert!(spread <= 1, "allocations {allocs:?}");
    let served: Vec<usize> = ups.iter().map(|u| u.requests()).collect();
    assert!(
        served.iter().all(|&n| (999..=1001).contains(&n)),
        "{served:?}"
    );
}
