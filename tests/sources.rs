//! Upstream lists: `upstreams_file` edited under load (members join after passing a probe,
//! leave by draining, a session on a kept upstream keeps it, no client request fails),
//! `upstreams_url` candidate lists (only the entries that pass admission join; a list that can no
//! longer be fetched keeps its members), malformed lines skipped with a warning, a half-written
//! file, retries of refused candidates, a dropped upstream's tunnel and session, and two
//! instances on one Redis sharing one reader.
//!
//! Everything runs on loopback: fake proxies that dial loopback only, origins as control targets
//! and list servers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, ProxyMode, TestGateway};

/// The `[pools.default.probe]` section: one control target answering `control-ok`.
fn probe_section(control: &Origin, extra: &str) -> String {
    format!(
        "[pools.default.probe]\ntargets = [\"{}\"]\nexpect_body = \"control-ok\"\ninterval = \"30s\"\nsuccesses = 2\ntimeout = \"2s\"\nconcurrency = 8\n{extra}",
        control.url("/control")
    )
}

fn server() -> &'static str {
    "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nconnect_timeout = \"1s\"\n\
     [policy]\nallow_private_targets = true\n"
}

fn members(status: &serde_json::Value) -> HashSet<String> {
    status["pools"][0]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["id"].as_str().unwrap().to_string())
        .collect()
}

async fn wait_members(gw: &TestGateway, want: &HashSet<String>, within: Duration) -> bool {
    let mut last = HashSet::new();
    for _ in 0..(within.as_millis() / 50).max(1) {
        last = members(&gw.status().await);
        if &last == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("members {last:?}, wanted {want:?}");
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn editing_the_upstream_file_under_load_adds_and_removes_members_with_no_failed_request() {
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let mut ups = Vec::new();
    for _ in 0..4 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let entry = |i: usize| format!("{}#p{i}", ups[i].url());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upstreams.txt");
    std::fs::write(
        &file,
        format!("# the pool\n{}\n{}\n{}\n", entry(0), entry(1), entry(2)),
    )
    .unwrap();
    let config = format!(
        "{}[pools.default]\nupstreams_file = \"{}\"\n{}",
        server(),
        file.display(),
        probe_section(&control, "")
    );
    let gw = TestGateway::start_text_with(&config, Default::default()).await;
    let three: HashSet<String> = ["p0", "p1", "p2"].map(String::from).into();
    assert!(
        wait_members(&gw, &three, Duration::from_secs(10)).await,
        "the listed upstreams are admitted after their probes"
    );

    // A session, bound now; the upstream it is bound to stays listed throughout.
    let client = gw.client();
    let bound = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "cart-1")
        .send()
        .await
        .unwrap()
        .headers()["x-pool-upstream"]
        .to_str()
        .unwrap()
        .to_string();
    let removed = ["p0", "p1", "p2"]
        .into_iter()
        .find(|id| *id != bound)
        .unwrap()
        .to_string();

    // Steady load: 4 workers, each request checked, bounded in count.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (client, url) = (client.clone(), origin.url(&format!("/w{w}")));
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            for _ in 0..5_000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match client.get(&url).send().await {
                    Ok(r) => {
                        let (status, error) =
                            (r.status(), r.headers().get("x-pool-error").cloned());
                        if status == 200 && r.bytes().await.is_ok() {
                            ok.fetch_add(1, Ordering::Relaxed);
                        } else {
                            eprintln!("failed: {status} {error:?}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        eprintln!("failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let session_client = client.clone();
    let session_url = origin.url("/session");
    let session_stop = stop.clone();
    let session = tokio::spawn(async move {
        let mut seen = HashSet::new();
        for _ in 0..2_000 {
            if session_stop.load(Ordering::Relaxed) {
                break;
            }
            let r = session_client
                .get(&session_url)
                .header("X-Pool-Session", "cart-1")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            seen.insert(r.headers()["x-pool-upstream"].to_str().unwrap().to_string());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seen
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Edit: p3 joins, one unbound upstream leaves, a malformed line is skipped.
    let kept: Vec<String> = ["p0", "p1", "p2"]
        .into_iter()
        .filter(|id| *id != removed)
        .map(String::from)
        .collect();
    let idx = |id: &str| id[1..].parse::<usize>().unwrap();
    std::fs::write(
        &file,
        format!(
            "# the pool, edited\n{}\n{}\nthis line is not an upstream\n{}   # new\n",
            entry(idx(&kept[0])),
            entry(idx(&kept[1])),
            entry(3)
        ),
    )
    .unwrap();
    let want: HashSet<String> = kept.iter().cloned().chain(["p3".to_string()]).collect();
    assert!(
        wait_members(&gw, &want, Duration::from_secs(10)).await,
        "p3 admitted and {removed} removed"
    );
    let removed_before = ups[idx(&removed)].requests();
    let p3_before = ups[3].requests();
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let session_upstreams = session.await.unwrap();

    let status = gw.status().await;
    let sources = &status["pools"][0]["sources"];
    eprintln!("sources: {sources}");
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!(
        "{ok} requests ok, {failed} failed; session upstreams {session_upstreams:?}; \
         after the edit: {} requests through p3, {} through the removed {removed}",
        ups[3].requests() - p3_before,
        ups[idx(&removed)].requests() - removed_before
    );
    assert_eq!(failed, 0, "no client request failed");
    assert!(ok > 100, "the load ran ({ok} requests)");
    assert_eq!(
        session_upstreams,
        HashSet::from([bound.clone()]),
        "the session kept its upstream"
    );
    assert!(
        ups[3].requests() > p3_before,
        "the new member carries traffic"
    );
    assert_eq!(
        ups[idx(&removed)].requests(),
        removed_before,
        "the removed member gets no new requests"
    );
    assert_eq!(sources["skipped_lines"], 1, "{sources}");
    assert_eq!(sources["admitted"], 3, "{sources}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_list_of_20_admits_only_the_12_that_pass() {
    common::init_tracing();
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let mut good = Vec::new();
    for _ in 0..12 {
        good.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let start = |mode| {
        FakeProxy::start(FakeProxyOpts {
            mode,
            ..Default::default()
        })
    };
    let fail502 = start(ProxyMode::Fail502).await;
    let captcha = start(ProxyMode::Captcha).await;
    let stall = start(ProxyMode::Stall).await;
    let slow = FakeProxy::start(FakeProxyOpts {
        delay: Some(Duration::from_millis(1200)),
        ..Default::default()
    })
    .await;
    let needs_auth = FakeProxy::start(FakeProxyOpts::with_credentials("u", "p")).await;

    let mut lines = vec!["# a candidate list: 12 good, 8 dead or wrong".to_string()];
    lines.extend(
        good.iter()
            .enumerate()
            .map(|(i, p)| format!("{}#good{i}", p.url())),
    );
    lines.push(format!("http://{}#dead0", FakeProxy::dead()));
    lines.push(format!("socks5://{}#dead1", FakeProxy::dead()));
    lines.push(format!("{}#fail502", fail502.url()));
    lines.push(format!("{}#captcha", captcha.url()));
    lines.push(format!("{}#stall", stall.url()));
    lines.push(format!("{}#slow", slow.url()));
    lines.push(format!("{}#needs-auth", needs_auth.url()));
    lines.push("direct://#egress".to_string());
    let list = Origin::start(OriginBehaviour::fixed(&lines.join("\n"))).await;

    let config = format!(
        "{}[pools.default]\nupstreams_url = \"{}\"\nupstreams_url_interval = \"10s\"\n\
         [pools.default.admission]\nmax_latency = \"800ms\"\nconcurrency = 4\n{}",
        server(),
        list.url("/proxies.txt"),
        probe_section(&control, "")
    );
    let gw = TestGateway::start_text_with(&config, Default::default()).await;
    let want: HashSet<String> = (0..12).map(|i| format!("good{i}")).collect();
    assert!(
        wait_members(&gw, &want, Duration::from_secs(10)).await,
        "exactly the 12 good candidates are members"
    );
    // Every candidate has been judged (the stalled one times out at 2 s).
    let mut sources = serde_json::Value::Null;
    for _ in 0..100 {
        sources = gw.status().await["pools"][0]["sources"].clone();
        if sources["probing"] == 0 && sources["pending"] == 0 && sources["rejected"] == 8 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("sources: {sources:#}");
    assert_eq!(sources["listed"], 20);
    assert_eq!(sources["admitted"], 12);
    assert_eq!(sources["rejected"], 8);
    assert_eq!(sources["fetches_ok"], 1);
    let rejected: HashSet<&str> = sources["rejections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["upstream"].as_str().unwrap())
        .collect();
    assert_eq!(
        rejected,
        HashSet::from([
            "dead0",
            "dead1",
            "fail502",
            "captcha",
            "stall",
            "slow",
            "needs-auth",
            "egress"
        ])
    );
    assert_eq!(members(&gw.status().await), want, "still exactly the 12");
    let metrics = gw.metrics().await;
    for series in [
        "poolgate_source_upstreams{pool=\"default\",state=\"admitted\"} 12",
        "poolgate_source_upstreams{pool=\"default\",state=\"rejected\"} 8",
        "poolgate_source_fetches{pool=\"default\",state=\"ok\"} 1",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }

    // Traffic goes to the admitted members only.
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let client = gw.client();
    for i in 0..24 {
        let r = client
            .get(origin.url(&format!("/r{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let id = r.headers()["x-pool-upstream"].to_str().unwrap();
        assert!(want.contains(id), "{id}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_that_can_no_longer_be_fetched_keeps_its_members_and_a_changed_one_applies() {
    common::init_tracing();
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let a = FakeProxy::start(FakeProxyOpts::default()).await;
    let b = FakeProxy::start(FakeProxyOpts::default()).await;
    let list = Origin::start(OriginBehaviour::fixed(&format!("{}#a\n", a.url()))).await;
    let config = format!(
        "{}[pools.default]\nupstreams_url = \"{}\"\nupstreams_url_interval = \"10s\"\n{}",
        server(),
        list.url("/list"),
        probe_section(&control, "")
    );
    let gw = TestGateway::start_text_with(&config, Default::default()).await;
    assert!(
        wait_members(
            &gw,
            &HashSet::from(["a".to_string()]),
            Duration::from_secs(10)
        )
        .await
    );

    // The list server goes away: the next fetch fails, `a` stays.
    let list_port = list.port();
    drop(list);
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let s = gw.status().await;
    let sources = &s["pools"][0]["sources"];
    eprintln!("after a failed fetch: {sources}");
    assert!(
        sources["fetches_failed"].as_u64().unwrap() >= 1,
        "{sources}"
    );
    assert!(sources["last_error"].as_str().unwrap().contains("fetching"));
    assert_eq!(members(&s), HashSet::from(["a".to_string()]));

    // It comes back with another list: `b` joins, `a` leaves (retry after a failure: 10 s).
    let _list = Origin::start_on(
        list_port,
        OriginBehaviour::fixed(&format!("{}#b\n", b.url())),
    )
    .await;
    assert!(
        wait_members(
            &gw,
            &HashSet::from(["b".to_string()]),
            Duration::from_secs(15)
        )
        .await,
        "the new list applies"
    );
    let s = gw.status().await;
    assert!(s["pools"][0]["sources"]["last_error"].is_null());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_pool_without_probes_serves_its_list_from_the_start() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let a = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ups.txt");
    std::fs::write(&file, format!("{}#a\nnot-a-url\n", a.url())).unwrap();
    let config = format!(
        "{}[pools.default]\nupstreams_file = \"{}\"\n",
        server(),
        file.display()
    );
    let gw = TestGateway::start_text_with(&config, Default::default()).await;
    // The very first request is served: the file was read before the listener opened.
    let r = gw.client().get(origin.url("/first")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-pool-upstream"], "a");
    // A save caught half-way (the file briefly empty, then whole again) is not read as a
    // shorter list: the change is read only once it has settled.
    std::fs::write(&file, "").unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&file, format!("{}#a\nnot-a-url\n# saved again\n", a.url())).unwrap();
    for _ in 0..60 {
        assert_eq!(
            members(&gw.status().await),
            HashSet::from(["a".to_string()]),
            "a half-written file removed nothing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Emptying the file empties the pool: requests then fail cleanly, nothing hangs.
    std::fs::write(&file, "# nothing left\n").unwrap();
    assert!(wait_members(&gw, &HashSet::new(), Duration::from_secs(5)).await);
    let r = gw.client().get(origin.url("/after")).send().await.unwrap();
    assert!(r.status().is_server_error(), "{}", r.status());
    assert!(r.headers().contains_key("x-pool-error"));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_fetch_and_probe_a_list_once_and_agree_on_its_members() {
    common::init_tracing();
    let redis = common::RedisServer::start().await;
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let mut good = Vec::new();
    for _ in 0..4 {
        good.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let bad = FakeProxy::start(FakeProxyOpts {
        mode: ProxyMode::Fail502,
        ..Default::default()
    })
    .await;
    let mut lines: Vec<String> = good
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}#g{i}", p.url()))
        .collect();
    lines.push(format!("{}#bad", bad.url()));
    let list = Origin::start(OriginBehaviour::fixed(&lines.join("\n"))).await;
    // Idle probes once a day: the prober spreads first idle probes over the interval, the first
    // member's within interval / (members + 1), so 10 min gave it one chance in five of an idle
    // probe within this test's 24 s, and a day gives about one in 700. So only admission probes
    // reach the proxies here. A generous store timeout: a busy machine must not look like a Redis outage (in which each
    // instance would rightly read and probe for itself).
    let config = format!(
        "{}[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\n\
         [pools.default]\nupstreams_url = \"{}\"\nupstreams_url_interval = \"10s\"\n\
         [pools.default.probe]\ntargets = [\"{}\"]\nexpect_body = \"control-ok\"\ninterval = \"24h\"\ntimeout = \"2s\"\n",
        server(),
        redis.url(),
        list.url("/list"),
        control.url("/control")
    );
    let a = TestGateway::start_text_with(&config, Default::default()).await;
    let b = TestGateway::start_text_with(&config, Default::default()).await;
    let want: HashSet<String> = (0..4).map(|i| format!("g{i}")).collect();
    assert!(wait_members(&a, &want, Duration::from_secs(10)).await);
    assert!(
        wait_members(&b, &want, Duration::from_secs(10)).await,
        "b takes a's members"
    );

    // Three intervals: fetches at 0, 10 and 20 s, by one instance.
    tokio::time::sleep(Duration::from_millis(24_000)).await;
    let fetches = list.requests().len();
    let probes: Vec<usize> = good.iter().chain([&bad]).map(|p| p.requests()).collect();
    let leaders: Vec<bool> = [&a, &b]
        .iter()
        .map(|g| {
            g.running()
                .gateway()
                .sources
                .status("default")
                .is_some_and(|s| s.leader)
        })
        .collect();
    eprintln!(
        "2 instances, 3 intervals: {fetches} fetches of the list, admission probes per candidate {probes:?}, leaders {leaders:?}"
    );
    assert_eq!(
        fetches, 3,
        "the list is fetched once per interval across both instances"
    );
    assert_eq!(
        probes,
        vec![1, 1, 1, 1, 1],
        "each candidate is probed once, not once per instance"
    );
    assert_eq!(leaders.iter().filter(|l| **l).count(), 1);
    assert_eq!(members(&a.status().await), want);
    assert_eq!(members(&b.status().await), want);

    // The leader goes: the other takes over with the members as they are, without re-probing.
    let (leader, follower) = if leaders[0] { (a, b) } else { (b, a) };
    leader.shutdown().await;
    let mut took_over = false;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if follower
            .running()
            .gateway()
            .sources
            .status("default")
            .is_some_and(|s| s.leader)
        {
            took_over = true;
            break;
        }
    }
    assert!(took_over, "the remaining instance reads the list now");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(members(&follower.status().await), want);
    let probes_after: Vec<usize> = good.iter().map(|p| p.requests()).collect();
    assert_eq!(
        probes_after,
        vec![1, 1, 1, 1],
        "admitted members are not probed again"
    );
    assert_eq!(
        list.requests().len(),
        4,
        "the new holder fetched the list at once"
    );
    follower.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_candidate_is_tried_again_after_the_dead_interval() {
    common::init_tracing();
    let control = Origin::start(OriginBehaviour::fixed("control-ok")).await;
    let good = FakeProxy::start(FakeProxyOpts::default()).await;
    let flaky = FakeProxy::start(FakeProxyOpts {
        mode: ProxyMode::Fail502,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ups.txt");
    std::fs::write(
        &file,
        format!("{}#good\n{}#flaky\n", good.url(), flaky.url()),
    )
    .unwrap();
    let config = format!(
        "{}[pools.default]\nupstreams_file = \"{}\"\n{}",
        server(),
        file.display(),
        probe_section(&control, "dead_interval = \"2s\"\n")
    );
    let gw = TestGateway::start_text_with(&config, Default::default()).await;
    assert!(
        wait_members(
            &gw,
            &HashSet::from(["good".to_string()]),
            Duration::from_secs(5)
        )
        .await
    );
    let s = gw.status().await;
    assert_eq!(
        s["pools"][0]["sources"]["rejected"], 1,
        "{}",
        s["pools"][0]["sources"]
    );
    // It recovers; the next try, a dead interval later, admits it.
    flaky.set_mode(ProxyMode::Normal).await;
    let both: HashSet<String> = ["good", "flaky"].map(String::from).into();
    assert!(wait_members(&gw, &both, Duration::from_secs(6)).await);
    assert_eq!(gw.status().await["pools"][0]["sources"]["rejected"], 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlisted_upstream_drains_its_tunnel_and_its_session_follows_the_session_rules() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let echo = common::echo_server().await;
    let a = FakeProxy::start(FakeProxyOpts::default()).await;
    let b = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ups.txt");
    std::fs::write(&file, format!("{}#a\n{}#b\n", a.url(), b.url())).unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams_file = \"{}\"\n",
        echo.port(),
        file.display()
    );
    let gw = TestGateway::start_text_with(&config, Default::default()).await;

    // A session's tunnel, on whichever upstream the session is placed.
    let basic = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode("me-session-s9:x")
    };
    let (mut tunnel, head) = common::connect_tunnel(
        gw.proxy,
        echo,
        &format!("Proxy-Authorization: Basic {basic}\r\n"),
    )
    .await;
    let head = head.to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let bound = if head.contains("x-pool-upstream: a") {
        "a"
    } else {
        "b"
    };
    let kept = if bound == "a" { "b" } else { "a" };
    let kept_url = if bound == "a" { b.url() } else { a.url() };

    // The session's upstream leaves the list.
    std::fs::write(&file, format!("{kept_url}#{kept}\n")).unwrap();
    assert!(
        wait_members(
            &gw,
            &HashSet::from([kept.to_string()]),
            Duration::from_secs(5)
        )
        .await
    );

    // The open tunnel still works: live work on a removed upstream finishes.
    tunnel.write_all(b"still here").await.unwrap();
    let mut back = [0u8; 10];
    tokio::time::timeout(Duration::from_secs(5), tunnel.read_exact(&mut back))
        .await
        .expect("the tunnel answers")
        .unwrap();
    assert_eq!(&back, b"still here");
    // The session is not moved silently: 502 session-upstream-unavailable.
    let r = gw
        .client_via(&format!("http://me-session-s9:x@{}", gw.proxy), None)
        .get(origin.url("/after"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(r.headers()["x-pool-error"], "session-upstream-unavailable");
    // Other traffic goes to the kept upstream.
    let r = gw.client().get(origin.url("/other")).send().await.unwrap();
    assert_eq!(r.headers()["x-pool-upstream"], kept);
    drop(tunnel);
    gw.shutdown().await;
}
