//! Passive health over real sockets: captcha pages and failing proxies seen by the gateway, and a
//! large response streamed through the captcha sniffer without buffering.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::gateway::GatewayProcess;
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, TestGateway};

async fn proxies(n: usize) -> Vec<FakeProxy> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    v
}

fn config(ups: &[FakeProxy]) -> String {
    let list: Vec<String> = ups.iter().map(|u| format!("\"{}\"", u.url())).collect();
    format!(
        "[policy]\nallow_private_targets = true\n[pools.default]\nupstreams = [{}]\n",
        list.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captcha_serving_upstream_is_quarantined_and_the_page_reaches_the_client_unchanged() {
    let origins = [
        Origin::start(OriginBehaviour::echo()).await,
        Origin::start(OriginBehaviour::echo()).await,
    ];
    let ups = proxies(5).await;
    ups[2].set_mode(ProxyMode::Captcha).await;
    let gw = TestGateway::start(&config(&ups)).await;
    let client = gw.client();
    let bad_id = ups[2].url();
    let mut pages = 0;
    for i in 0..60 {
        let resp = client.get(origins[i % 2].url("/ok")).send().await.unwrap();
        let via = resp.headers()["x-pool-upstream"]
            .to_str()
            .unwrap()
            .to_string();
        let body = resp.text().await.unwrap();
        if via == bad_id {
            assert!(
                body.contains("g-recaptcha"),
                "the page passes through unchanged"
            );
            pages += 1;
        } else {
            assert_eq!(body, "ok");
        }
    }
    let up = gw.upstream_status("default", &bad_id).await;
    assert_eq!(up["state"], "quarantined", "{up}");
    assert!(
        up["state_reason"].as_str().unwrap().contains("captcha"),
        "{up}"
    );
    assert!(
        pages <= 10,
        "quarantined within 10 of its requests, took {pages}"
    );
    assert!(up["outcomes"]["captcha"].as_u64().unwrap() >= 5);
    let status = gw.status().await;
    let pool = &status["pools"][0];
    assert_eq!(pool["quarantine_cap"]["used"], 1);
    assert_eq!(pool["incidents"]["targets"].as_array().unwrap().len(), 0);
    for other in [0, 1, 3, 4] {
        let s = gw.upstream_status("default", &ups[other].url()).await;
        assert_eq!(s["state"], "healthy", "{s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failing_of_ten_get_under_five_percent_of_traffic_after_warmup() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(10).await;
    for u in &ups[..3] {
        u.set_mode(ProxyMode::Fail502).await;
    }
    let gw = TestGateway::start(&config(&ups)).await;
    let client = gw.client();
    for _ in 0..200 {
        client
            .get(origin.url("/ok"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
    }
    let before: usize = ups[..3].iter().map(|u| u.requests()).sum();
    let mut ok = 0;
    for _ in 0..2000 {
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        ok += usize::from(resp.status() == 200);
        resp.bytes().await.unwrap();
    }
    let to_bad: usize = ups[..3].iter().map(|u| u.requests()).sum::<usize>() - before;
    eprintln!("dead share e2e: {to_bad}/2000 to the failing three, {ok}/2000 ok");
    assert!(to_bad < 100, "{to_bad} of 2000 went to the failing three");
    assert!(ok > 1900, "{ok} of 2000 succeeded");
}

/// The state of each upstream of the default pool, by id.
async fn states(gw: &TestGateway, ups: &[FakeProxy]) -> Vec<String> {
    let mut v = Vec::new();
    for u in ups {
        let s = gw.upstream_status("default", &u.url()).await;
        v.push(s["state"].as_str().unwrap().to_string());
    }
    v
}

/// Two proxies answer every request with a 5xx page of their own: one like Squid (its error
/// headers, no `Proxy-Status`), one a bare 503 with no signature at all. Four others serve the
/// same target. Both bad ones are taken out (the first by its signature, the second because the
/// rest of the pool gets the target's pages), the good ones stay healthy, and every page reaches
/// the client as the proxy sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_answering_their_own_5xx_are_quarantined_with_or_without_a_signature() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(6).await;
    ups[0].set_mode(ProxyMode::SquidError502).await;
    ups[1].set_mode(ProxyMode::Plain503).await;
    // Room for both under the quarantine cap (three of six).
    let gw = TestGateway::start(&format!(
        "{}[pools.default.health]\nmax_quarantined_percent = 50\n",
        config(&ups)
    ))
    .await;
    let client = gw.client();
    let (squid, bare) = (ups[0].url(), ups[1].url());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut out_after = [None, None];
    for i in 0..300 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "request {i}: out of time"
        );
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        let via = resp.headers()["x-pool-upstream"]
            .to_str()
            .unwrap()
            .to_string();
        let status = resp.status().as_u16();
        let squid_header = resp.headers().contains_key("x-squid-error");
        let body = resp.text().await.unwrap();
        if via == squid {
            assert_eq!(status, 502);
            assert!(squid_header, "the proxy's page passes through unchanged");
        } else if via == bare {
            assert_eq!(status, 503);
        } else {
            assert_eq!((status, body.as_str()), (200, "ok"));
        }
        let now = states(&gw, &ups[..2]).await;
        for (k, state) in now.iter().enumerate() {
            if state == "quarantined" && out_after[k].is_none() {
                out_after[k] = Some(ups[k].requests());
            }
        }
        if out_after.iter().all(Option::is_some) {
            break;
        }
    }
    eprintln!("own 5xx: quarantined after {out_after:?} of their requests");
    let [Some(squid_n), Some(bare_n)] = out_after else {
        panic!("not both quarantined: {out_after:?}");
    };
    // Three faults in a row for the signature; five answers to compare, then three faults (one
    // more each for a request in flight while the decision lands).
    assert!(squid_n <= 5, "the Squid page took {squid_n} requests");
    assert!(bare_n <= 10, "the bare 503 took {bare_n} requests");
    let s = gw.upstream_status("default", &squid).await;
    assert!(
        s["state_reason"]
            .as_str()
            .unwrap()
            .contains("consecutive failures"),
        "{s}"
    );
    let s = gw.upstream_status("default", &bare).await;
    assert!(
        s["state_reason"]
            .as_str()
            .unwrap()
            .contains("through the rest of the pool"),
        "{s}"
    );
    assert_eq!(
        states(&gw, &ups[2..]).await,
        vec!["healthy"; 4],
        "the good ones stay healthy"
    );
    let status = gw.status().await;
    let pool = &status["pools"][0];
    assert_eq!(pool["incidents"]["targets"].as_array().unwrap().len(), 0);
}

/// A site that answers 503 to everybody is the site's trouble: every upstream relays its 503,
/// and none is taken out of service or even degraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_answering_503_to_every_upstream_quarantines_nobody() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let ups = proxies(5).await;
    let gw = TestGateway::start(&config(&ups)).await;
    let client = gw.client();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for i in 0..100 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "request {i}: out of time"
        );
        let resp = client
            .get(origin.url("/status?code=503"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
        resp.bytes().await.unwrap();
    }
    assert!(
        ups.iter().all(|u| u.requests() >= 10),
        "every upstream met the site"
    );
    assert_eq!(states(&gw, &ups).await, vec!["healthy"; 5]);
    let status = gw.status().await;
    let pool = &status["pools"][0];
    assert_eq!(pool["quarantine_cap"]["used"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_50_mib_response_streams_through_without_buffering() {
    const SIZE: usize = 50 * 1024 * 1024;
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let gw = GatewayProcess::spawn(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [policy]\nallow_private_targets = true\n\
         [pools.default]\nupstreams = [\"direct://\"]\n# origin {}\n",
        origin.port()
    ))
    .await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{}", gw.proxy)).unwrap())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // Warm up so allocator arenas and connection buffers exist before the baseline.
    client
        .get(origin.url("/ok"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let rss_before = gw.memory_kib("VmRSS");

    let mut resp = client
        .get(origin.url(&format!("/bytes?n={SIZE}&chunk=65536&delay_ms=1")))
        .header("content-type", "text/html")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(!first.is_empty());
    assert_eq!(
        origin.in_flight(),
        1,
        "first byte arrived before the origin finished sending"
    );
    let mut total = first.len();
    let mut peak_rss = 0;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        total += chunk.len();
        if total % (4 * 1024 * 1024) < chunk.len() {
            peak_rss = peak_rss.max(gw.memory_kib("VmRSS"));
        }
    }
    assert_eq!(total, SIZE);
    let growth_kib = gw
        .memory_kib("VmHWM")
        .max(peak_rss)
        .saturating_sub(rss_before);
    eprintln!("50 MiB streamed; gateway RSS {rss_before} KiB before, peak growth {growth_kib} KiB");
    assert!(growth_kib < 10 * 1024, "RSS grew by {growth_kib} KiB");
}
