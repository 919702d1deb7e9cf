//! Rate limits per upstream, per upstream × target and per user (docs/concepts.md, "Rate limits").
//!
//! Timing is measured on a paused clock: those tests start a gateway (listeners bound, nothing
//! sent through them) and drive `pool::select` with its real store and limiters, since a paused
//! runtime would skip ahead while loopback sockets are in flight. The 429 itself, its headers
//! and the counters are checked end to end over loopback, with limits slow enough (one request
//! per 10 s) that real time cannot interfere.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::config::Config;
use poolgate::error::ProxyError;
use poolgate::health::Outcome;
use poolgate::pool::select::{self, Route, SessionPlan};
use poolgate::ratelimit::Scope;
use poolgate::session::SessionKey;
use poolgate::state::Gateway;
use poolgate::store::Store;
use tokio::time::Instant;

/// Two upstreams that are never dialled: these tests stop at the lease.
const TWO_UPSTREAMS: &str = "upstreams = [\"http://127.0.0.1:9#a\", \"http://127.0.0.1:9#b\"]";

async fn paused_gateway(pool_extra: &str) -> TestGateway {
    TestGateway::start(&format!("[pools.default]\n{TWO_UPSTREAMS}\n{pool_extra}\n")).await
}

fn route(gw: &Gateway, target: &str, session: Option<&str>, user: Option<&str>) -> Route {
    Route {
        pool: gw.pools.load().get(None).unwrap().clone(),
        filter: None,
        session: session.map(|key| SessionPlan {
            key: SessionKey::new(key).unwrap(),
            binding: key.to_string(),
            ttl: Duration::from_secs(600),
            minted: false,
        }),
        target_host: Arc::from(target),
        user: user.map(Arc::from),
    }
}

/// One request as the proxy runs it up to the lease: the per-user limit, then an upstream.
/// Returns the upstream and when (virtual time) the lease was granted.
async fn request(gw: &Gateway, route: &Route) -> Result<(String, Instant), ProxyError> {
    select::admit_user(gw, route).await?;
    let lease = select::acquire(gw, route, &[]).await?;
    let at = Instant::now();
    let id = lease.upstream().unwrap().id.to_string();
    lease.finish(Outcome::Ok);
    Ok((id, at))
}

/// Most grants inside any window `[t, t + width)`.
fn max_in_window(times: &[Duration], width: Duration) -> usize {
    let mut sorted = times.to_vec();
    sorted.sort();
    let mut best = 0;
    let mut j = 0;
    for i in 0..sorted.len() {
        while sorted[j] + width <= sorted[i] {
            j += 1;
        }
        best = best.max(i - j + 1);
    }
    best
}

/// Leases handed back unused (`cancelled`) in the pool.
async fn cancelled(gw: &Gateway) -> u64 {
    let st = gw.store.status("default").await.unwrap();
    st.members.iter().map(|m| m.outcomes["cancelled"]).sum()
}

#[tokio::test(start_paused = true)]
async fn per_upstream_target_limit_paces_one_target_and_leaves_others_alone() {
    let tg = paused_gateway(
        "queue_timeout = \"30s\"\n[pools.default.rate_limit]\nper_upstream_target = 50\n",
    )
    .await;
    let gw = tg.running().gateway().clone();
    let start = Instant::now();

    let busy = route(&gw, "busy.example", None, None);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..500 {
        let gw = gw.clone();
        let busy = Route {
            pool: busy.pool.clone(),
            filter: None,
            session: None,
            target_host: busy.target_host.clone(),
            user: None,
        };
        tasks.spawn(async move { request(&gw, &busy).await });
    }
    // Meanwhile another target, at 10 requests/s (under its own limit): never held up.
    let other = {
        let gw = gw.clone();
        let other = route(&gw, "other.example", None, None);
        tokio::spawn(async move {
            let mut latencies = Vec::new();
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let asked = Instant::now();
                let (_, at) = request(&gw, &other).await.unwrap();
                latencies.push(at - asked);
            }
            latencies
        })
    };

    let mut by_upstream: HashMap<String, Vec<Duration>> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        let (id, at) = done.unwrap().unwrap();
        by_upstream.entry(id).or_default().push(at - start);
    }
    let latencies = other.await.unwrap();

    let total = by_upstream
        .values()
        .flatten()
        .max()
        .copied()
        .unwrap_or_default();
    let counts: Vec<usize> = by_upstream.values().map(Vec::len).collect();
    let worst_window = by_upstream
        .values()
        .map(|t| max_in_window(t, Duration::from_secs(1)))
        .max()
        .unwrap();
    let worst_other = latencies.iter().max().copied().unwrap();
    let wasted = cancelled(&gw).await;
    eprintln!(
        "500 requests to one target: last granted at {:.3} s virtual; per upstream {counts:?}; \
         most in any 1 s window {worst_window}; other target worst latency {worst_other:?}; \
         leases handed back {wasted}",
        total.as_secs_f64()
    );
    assert!(total >= Duration::from_millis(4900), "{total:?}");
    assert!(total <= Duration::from_millis(5100), "{total:?}");
    assert_eq!(counts.len(), 2, "both upstreams carry the target");
    // 50/s with burst 1: at most 50 grants per upstream in any [t, t + 1 s).
    assert!(worst_window <= 50, "{worst_window} in one second");
    assert_eq!(worst_other, Duration::ZERO, "{latencies:?}");
    // The hints keep the store out of it: an upstream known to refuse is not leased to be
    // handed back.
    assert!(wasted <= 5, "{wasted} leases handed back");
    let st = tg.status().await;
    assert!(
        st["pools"][0]["rate_limit"]["waited"]["upstream_target"]
            .as_u64()
            .unwrap()
            >= 490,
        "{}",
        st["pools"][0]["rate_limit"]
    );
}

#[tokio::test(start_paused = true)]
async fn per_upstream_limit_spills_to_the_other_upstream_then_rejects() {
    let tg =
        paused_gateway("queue_timeout = \"500ms\"\n[pools.default.rate_limit]\nper_upstream = 1\n")
            .await;
    let gw = tg.running().gateway().clone();
    let r = route(&gw, "t.example", None, None);
    let (first, _) = request(&gw, &r).await.unwrap();
    let (second, _) = request(&gw, &r).await.unwrap();
    assert_ne!(
        first, second,
        "the limited upstream spills to the other one"
    );
    // Both are limited and neither frees up within queue_timeout: 429 at once, not after it.
    let asked = Instant::now();
    match request(&gw, &r).await {
        Err(ProxyError::RateLimited { scope, retry_after }) => {
            assert_eq!(scope, Scope::Upstream);
            assert_eq!(retry_after, Some(Duration::from_secs(1)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(asked.elapsed(), Duration::ZERO);
    // A limit that frees up within queue_timeout is waited for.
    tokio::time::advance(Duration::from_millis(700)).await;
    let asked = Instant::now();
    request(&gw, &r).await.unwrap();
    assert_eq!(asked.elapsed(), Duration::from_millis(300));
    // The per-upstream limit holds across targets: the other upstream (free again) serves a
    // second target, and then neither has a token left for it.
    let elsewhere = route(&gw, "elsewhere.example", None, None);
    request(&gw, &elsewhere).await.unwrap();
    assert!(matches!(
        request(&gw, &elsewhere).await,
        Err(ProxyError::RateLimited {
            scope: Scope::Upstream,
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_session_waits_for_its_own_upstream_then_gets_429_and_never_moves() {
    let tg = paused_gateway(
        "queue_timeout = \"1500ms\"\n[pools.default.rate_limit]\nper_upstream = 1\n",
    )
    .await;
    let gw = tg.running().gateway().clone();
    let sticky = route(&gw, "t.example", Some("s1"), None);
    let start = Instant::now();
    let (bound, _) = request(&gw, &sticky).await.unwrap();

    // Three more on the session at once: one gets the next token of its upstream at 1 s, the
    // others then find the following one (2 s) past their deadline.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let gw = gw.clone();
        let r = route(&gw, "t.example", Some("s1"), None);
        tasks.spawn(async move {
            let res = request(&gw, &r).await;
            (res, Instant::now())
        });
    }
    // Meanwhile the other upstream is free, and a request without a session gets it at once.
    let free = route(&gw, "t.example", None, None);
    let (other, at) = request(&gw, &free).await.unwrap();
    assert_ne!(other, bound);
    assert_eq!(at, start);

    let (mut served, mut rejected) = (Vec::new(), 0);
    while let Some(done) = tasks.join_next().await {
        match done.unwrap() {
            (Ok((id, at)), _) => served.push((id, at - start)),
            (Err(ProxyError::RateLimited { scope, .. }), at) => {
                assert_eq!(scope, Scope::Upstream);
                assert_eq!(at - start, Duration::from_secs(1), "waited, then 429");
                rejected += 1;
            }
            (Err(e), _) => panic!("{e}"),
        }
    }
    assert_eq!(served, vec![(bound.clone(), Duration::from_secs(1))]);
    assert_eq!(rejected, 2);
    assert_eq!(
        gw.store.session_upstream("default", "s1").await.unwrap(),
        Some(poolgate::upstream::UpstreamId::new(bound.as_str()))
    );
}

fn hash(pw: &str) -> String {
    poolgate::auth::hash_password_with_cost(pw, 8, 1, 1).unwrap()
}

fn user_config(origin_port: u16, upstream: &str, alice_rate: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{origin_port}]\n\
         [auth.users.alice]\npassword_hash = \"{}\"\n{alice_rate}\n\
         [auth.users.bob]\npassword_hash = \"{}\"\n\
         [pools.default]\nupstreams = [\"{upstream}\"]\nqueue_timeout = \"200ms\"\n",
        hash("a"),
        hash("b"),
    )
}

#[tokio::test(start_paused = true)]
async fn a_user_over_the_limit_waits_for_the_next_turn() {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [auth.users.alice]\npassword_hash = \"{}\"\nrate_limit = 2\n\
         [pools.default]\n{TWO_UPSTREAMS}\nqueue_timeout = \"1s\"\n",
        hash("a")
    );
    let tg = TestGateway::start_text_with(&text, Default::default()).await;
    let gw = tg.running().gateway().clone();
    let alice = route(&gw, "t.example", None, Some("alice"));
    let start = Instant::now();
    let times: Vec<Duration> = {
        let mut out = Vec::new();
        for _ in 0..3 {
            out.push(request(&gw, &alice).await.unwrap().1 - start);
        }
        out
    };
    assert_eq!(
        times,
        [0, 500, 1000].map(Duration::from_millis).to_vec(),
        "2 requests/s, burst 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_limit_answers_429_to_that_user_while_another_is_served() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let text = user_config(origin.port(), &upstream.url(), "rate_limit = 0.1");
    let gw = TestGateway::start_text_with(&text, Default::default()).await;
    let alice = gw.client_via(&format!("http://alice:a@{}", gw.proxy), None);
    let bob = gw.client_via(&format!("http://bob:b@{}", gw.proxy), None);
    let url = origin.url("/ok");

    assert_eq!(alice.get(&url).send().await.unwrap().status(), 200);
    let resp = alice.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["x-pool-error"], "rate-limited");
    let ps = resp.headers()["proxy-status"].to_str().unwrap();
    assert!(
        ps.starts_with("poolgate; error=http_request_denied"),
        "{ps}"
    );
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=10).contains(&retry), "{retry}");
    for _ in 0..3 {
        assert_eq!(bob.get(&url).send().await.unwrap().status(), 200);
    }
    // The 429 never reached an upstream.
    assert_eq!(upstream.requests(), 4);

    let st = gw.status().await;
    assert_eq!(st["pools"][0]["rate_limit"]["rejected"]["user"], 1, "{st}");
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("poolgate_rate_limited_total{pool=\"default\",scope=\"user\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_upstreams_limited_gives_429_with_headers_over_http_and_reload_lifts_it() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let a = FakeProxy::start(FakeProxyOpts::default()).await;
    let b = FakeProxy::start(FakeProxyOpts::default()).await;
    let config = |limit: &str| {
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [policy]\nallow_private_targets = true\n\
             [pools.default]\nupstreams = [\"{}\", \"{}\"]\nqueue_timeout = \"200ms\"\n{limit}\n",
            a.url(),
            b.url()
        )
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        config("[pools.default.rate_limit]\nper_upstream = 0.1\n"),
    )
    .unwrap();
    let gw = TestGateway::start_file(&path).await;
    let client = gw.client();
    let url = origin.url("/ok");
    let mut used = Vec::new();
    for _ in 0..2 {
        let resp = client.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        used.push(
            resp.headers()["x-pool-upstream"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    used.sort();
    assert_eq!(used, {
        let mut both = vec![a.url(), b.url()];
        both.sort();
        both
    });
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["x-pool-error"], "rate-limited");
    assert!(resp.headers().contains_key("retry-after"));
    assert!(resp.headers().contains_key("proxy-status"));
    let st = gw.status().await;
    let rl = &st["pools"][0]["rate_limit"];
    assert_eq!(rl["rejected"]["upstream"], 1, "{rl}");
    assert_eq!(rl["per_upstream_per_s"], 0.1, "{rl}");
    assert_eq!(a.requests() + b.requests(), 2);

    // A reload that lifts the limit takes effect for the next request.
    std::fs::write(&path, config("")).unwrap();
    gw.running().reload().await.unwrap();
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    // And one that sets a new limit starts with fresh buckets.
    std::fs::write(
        &path,
        config("[pools.default.rate_limit]\nper_upstream_target = 0.1\n"),
    )
    .unwrap();
    gw.running().reload().await.unwrap();
    for _ in 0..2 {
        assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    }
    let resp = client.get(&url).send().await.unwrap();
    assert_eq!(resp.status(), 429);
    // Another target host has buckets of its own.
    let resp = client
        .get(origin.url_localhost("/ok"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[test]
fn config_errors_name_the_key() {
    let problems = |text: &str| -> String {
        Config::parse(text, "t", None)
            .unwrap_err()
            .problems
            .join("\n")
    };
    let p = problems(
        "[auth.users.alice]\npassword_hash = \"x\"\nrate_limit = 0\n\
         [auth.users.bob]\npassword_hash = \"x\"\nrate_limit_burst = 3\n\
         [pools.default]\nupstreams = [\"direct://\"]\n\
         [pools.default.rate_limit]\nper_upstream = 0\nper_upstream_target = -1\nburst = 0\n\
         [pools.b]\nupstreams = [\"direct://\"]\n[pools.b.rate_limit]\n",
    );
    for key in [
        "pools.default.rate_limit.per_upstream: must be > 0",
        "pools.default.rate_limit.per_upstream_target: must be > 0",
        "pools.default.rate_limit.burst: must be at least 1",
        "pools.b.rate_limit: set per_upstream",
        "auth.users.alice.rate_limit: must be > 0",
        "auth.users.bob.rate_limit_burst: needs rate_limit",
    ] {
        assert!(p.contains(key), "missing `{key}` in:\n{p}");
    }
    let p = problems(
        "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.rate_limit]\nper_second = 5\n",
    );
    assert!(p.contains("line 4") && p.contains("per_second"), "{p}");

    let c = Config::parse(
        "[pools.default]\nupstreams = [\"direct://\"]\n\
         [pools.default.rate_limit]\nper_upstream_target = 0.5\nburst = 3\n",
        "t",
        None,
    )
    .unwrap();
    let rl = c.pool("default").unwrap().rate_limit;
    assert_eq!(rl.per_upstream, None);
    let r = rl.per_upstream_target.unwrap();
    assert_eq!(r.interval, Duration::from_secs(2));
    assert_eq!(r.burst.get(), 3);
}
