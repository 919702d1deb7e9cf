//! Active probes: recovery after a cool-down, spreading of idle probes, one prober across
//! instances, and probe incidents.
//!
//! The scheduling tests run the whole gateway on a paused clock with a scripted probe runner (no
//! probe leaves the process); the incident test probes for real through fake proxies on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::redis_server::RedisServer;
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::app::StartOptions;
use poolgate::config::{Config, ProbeConfig};
use poolgate::health::Outcome;
use poolgate::health::state::State;
use poolgate::probe::prober::Runner;
use poolgate::upstream::{Upstream, UpstreamId};
use tokio::time::Instant;

/// A probe runner that answers from a script and records every probe with its (virtual) time.
#[derive(Default)]
struct Scripted {
    /// Upstream ids whose probes fail; every other one passes.
    failing: Mutex<HashSet<String>>,
    log: Mutex<Vec<(String, Instant)>>,
    start: Mutex<Option<Instant>>,
}

impl Scripted {
    fn new() -> Arc<Self> {
        let s = Arc::new(Scripted::default());
        *s.start.lock().unwrap() = Some(Instant::now());
        s
    }

    fn fail(&self, id: &str) {
        self.failing.lock().unwrap().insert(id.to_string());
    }

    fn heal(&self, id: &str) {
        self.failing.lock().unwrap().remove(id);
    }

    fn probes_of(&self, id: &str) -> Vec<Duration> {
        let start = self.start.lock().unwrap().unwrap();
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(u, _)| u == id)
            .map(|(_, t)| t.duration_since(start))
            .collect()
    }

    fn elapsed(&self) -> Duration {
        self.start.lock().unwrap().unwrap().elapsed()
    }

    fn all(&self) -> Vec<(String, Duration)> {
        let start = self.start.lock().unwrap().unwrap();
        self.log
            .lock()
            .unwrap()
            .iter()
            .map(|(u, t)| (u.clone(), t.duration_since(start)))
            .collect()
    }
}

impl Runner for Scripted {
    fn probe(
        &self,
        upstream: Arc<Upstream>,
        _cfg: Arc<ProbeConfig>,
    ) -> Pin<Box<dyn Future<Output = Result<Duration, String>> + Send>> {
        let id = upstream.id.to_string();
        self.log.lock().unwrap().push((id.clone(), Instant::now()));
        let fails = self.failing.lock().unwrap().contains(&id);
        Box::pin(async move {
            if fails {
                Err("scripted failure".to_string())
            } else {
                Ok(Duration::from_millis(5))
            }
        })
    }
}

async fn start(config: &str, runner: Arc<Scripted>) -> TestGateway {
    let text =
        format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{config}");
    let config = Config::parse(&text, "test", None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    TestGateway::from_config_with(
        config,
        StartOptions {
            probe_runner: Some(runner),
            ..StartOptions::default()
        },
    )
    .await
}

/// Ids `u0..u{n-1}` of upstreams no test traffic ever reaches (port 9 on loopback).
fn upstreams(n: usize) -> String {
    (0..n)
        .map(|i| format!("\"http://127.0.0.1:9#u{i}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn state(gw: &TestGateway, id: &str) -> State {
    let pools = gw.running().gateway().pools.load_full();
    let pool = pools.get(None).unwrap();
    pool.health.state_of(&UpstreamId::new(id)).unwrap()
}

/// Quarantines `id` the way traffic would: consecutive connect failures, applied to the store.
async fn fail_until_quarantined(gw: &TestGateway, id: &str) {
    let g = gw.running().gateway().clone();
    let pools = g.pools.load_full();
    let pool = pools.get(None).unwrap();
    for _ in 0..3 {
        let changes = pool.health.observe(
            &UpstreamId::new(id),
            "example.test",
            Outcome::ConnectError,
            Duration::from_millis(1),
        );
        poolgate::health::apply(&*g.store, pool.name(), changes).await;
    }
    assert_eq!(state(gw, id), State::Quarantined);
}

#[tokio::test(start_paused = true)]
async fn recovered_upstream_returns_after_cool_down_and_passing_probes_and_a_broken_one_does_not() {
    let runner = Scripted::new();
    runner.fail("u1");
    let gw = start(
        &format!(
            "[pools.default]\nupstreams = [{}]\n\
             [pools.default.health]\ncooldown_base = \"10s\"\ncooldown_max = \"80s\"\ncooldown_jitter = 0.0\nmax_quarantined_percent = 50\n\
             [pools.default.probe]\ntargets = [\"http://control.test/\"]\ninterval = \"30s\"\nsuccesses = 3\n",
            upstreams(4)
        ),
        runner.clone(),
    )
    .await;
    fail_until_quarantined(&gw, "u0").await;
    fail_until_quarantined(&gw, "u1").await;

    // Before the cool-down ends nothing probes them, and they stay out.
    tokio::time::sleep(Duration::from_millis(9_500)).await;
    assert!(runner.probes_of("u0").is_empty(), "probed during cool-down");
    assert_eq!(state(&gw, "u0"), State::Quarantined);

    // u0 has recovered: three passing probes after its cool-down, then half-open.
    let mut half_open_at = None;
    for step in 0..400 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if state(&gw, "u0") == State::HalfOpen {
            half_open_at = Some(9_500 + (step + 1) * 100);
            break;
        }
    }
    let half_open_at = half_open_at.unwrap_or_else(|| {
        panic!(
            "u0 not back in half-open within 50 s: {:?}; probes {:?}",
            gw.running()
                .gateway()
                .pools
                .load()
                .get(None)
                .unwrap()
                .health
                .view()
                .upstreams,
            runner.all()
        )
    });
    let u0 = runner.probes_of("u0");
    eprintln!("u0 probes at {u0:?}; half-open at {half_open_at} ms");
    assert_eq!(u0.len(), 3, "exactly M=3 probes before half-open: {u0:?}");
    assert!(
        u0[0] >= Duration::from_secs(10),
        "first probe only after the cool-down"
    );
    assert!(half_open_at <= 20_000, "half-open at {half_open_at} ms");
    let member = gw.upstream_status("default", "u0").await;
    assert_eq!(member["state"], "half-open");

    // u1 is still broken: quarantined again at each failed probe, each cool-down longer.
    let mut cooldowns = Vec::new();
    let mut seen = 0;
    for _ in 0..2_000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let probes = runner.probes_of("u1").len();
        if probes > seen {
            seen = probes;
            tokio::time::sleep(Duration::from_millis(10)).await;
            let st = gw.upstream_status("default", "u1").await;
            assert_eq!(st["state"], "quarantined", "{st}");
            // The cool-down this probe started: what is left plus what passed since the probe.
            let probed_at = *runner.probes_of("u1").last().unwrap();
            let since_probe = runner.elapsed() - probed_at;
            let remaining = st["cooldown_remaining_ms"].as_u64().unwrap();
            cooldowns.push(remaining + since_probe.as_millis() as u64);
        }
        if cooldowns.len() == 3 {
            break;
        }
    }
    eprintln!(
        "u1 probes at {:?}; cool-downs after each failed probe {cooldowns:?} ms",
        runner.probes_of("u1")
    );
    assert_eq!(cooldowns.len(), 3, "three failed probes of u1");
    // base 10 s: the first quarantine was 10 s, the probes' ones 20 s, 40 s, 80 s (the cap).
    for (got, want) in cooldowns.iter().zip([20_000u64, 40_000, 80_000]) {
        assert!(got.abs_diff(want) <= 50, "cool-downs {cooldowns:?}");
    }
    assert_ne!(state(&gw, "u1"), State::HalfOpen);
    assert_ne!(state(&gw, "u1"), State::Healthy);

    // Healing it makes it come back through the same door.
    runner.heal("u1");
    for _ in 0..2_000 {
        if state(&gw, "u1") == State::HalfOpen {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state(&gw, "u1"), State::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn idle_probes_are_spread_over_time() {
    let runner = Scripted::new();
    let gw = start(
        &format!(
            "[pools.default]\nupstreams = [{}]\n[pools.default.probe]\ntargets = [\"http://control.test/\"]\ninterval = \"30s\"\nconcurrency = 4\n",
            upstreams(100)
        ),
        runner.clone(),
    )
    .await;
    let run = Duration::from_secs(300);
    tokio::time::sleep(run).await;
    let all = runner.all();
    let mut per_second = vec![0u32; run.as_secs() as usize];
    for (_, t) in &all {
        if let Some(bin) = per_second.get_mut(t.as_secs() as usize) {
            *bin += 1;
        }
    }
    let total: u32 = per_second.iter().sum();
    let mean = total as f64 / per_second.len() as f64;
    let max = *per_second.iter().max().unwrap();
    let mut per_upstream: HashMap<&str, u32> = HashMap::new();
    for (u, _) in &all {
        *per_upstream.entry(u.as_str()).or_default() += 1;
    }
    let fewest = per_upstream.values().min().copied().unwrap_or(0);
    let most = per_upstream.values().max().copied().unwrap_or(0);
    eprintln!(
        "{total} probes in {}s: mean {mean:.2}/s, busiest second {max} ({:.2}× the mean); per upstream {fewest}..{most}",
        run.as_secs(),
        max as f64 / mean
    );
    assert_eq!(per_upstream.len(), 100, "every idle upstream is probed");
    assert!(
        max as f64 <= 3.0 * mean,
        "busiest second {max} vs mean {mean:.2}"
    );
    // Every 30–60 s: 5 to 11 probes each over 300 s.
    assert!(
        (5..=11).contains(&fewest) && (5..=11).contains(&most),
        "{fewest}..{most}"
    );
    drop(gw);
}

#[tokio::test(start_paused = true)]
async fn upstreams_carrying_traffic_are_not_probed() {
    let runner = Scripted::new();
    let gw = start(
        &format!(
            "[pools.default]\nupstreams = [{}]\n[pools.default.probe]\ntargets = [\"http://control.test/\"]\ninterval = \"30s\"\n",
            upstreams(2)
        ),
        runner.clone(),
    )
    .await;
    let g = gw.running().gateway().clone();
    let pools = g.pools.load_full();
    let pool = pools.get(None).unwrap().clone();
    // u0 serves a request every 5 s for 3 minutes; u1 idles.
    for _ in 0..36 {
        pool.health.observe(
            &UpstreamId::new("u0"),
            "example.test",
            Outcome::Ok,
            Duration::from_millis(3),
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let busy = runner.probes_of("u0");
    let idle = runner.probes_of("u1");
    eprintln!(
        "busy upstream probed {} times, idle one {} times in 180 s",
        busy.len(),
        idle.len()
    );
    assert!(
        busy.len() <= 1,
        "a busy upstream is left to passive health: {busy:?}"
    );
    assert!(idle.len() >= 3, "{idle:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_probe_each_upstream_once_per_interval() {
    let redis = RedisServer::start().await;
    let runner = Scripted::new();
    let config = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\n[pools.default]\nupstreams = [{}]\n[pools.default.probe]\ntargets = [\"http://control.test/\"]\ninterval = \"2s\"\njitter = 0.0\n",
        redis.url(),
        upstreams(4)
    );
    let a = start(&config, runner.clone()).await;
    let b = start(&config, runner.clone()).await;
    // Three intervals; every first probe falls within the first interval.
    tokio::time::sleep(Duration::from_millis(5_800)).await;
    let counts: Vec<usize> = (0..4)
        .map(|i| runner.probes_of(&format!("u{i}")).len())
        .collect();
    let leaders: Vec<bool> = [&a, &b]
        .iter()
        .map(|g| {
            g.running()
                .gateway()
                .probes
                .status("default")
                .is_some_and(|s| s.leader)
        })
        .collect();
    eprintln!(
        "probes per upstream over 3 intervals with 2 instances: {counts:?}; leaders {leaders:?}"
    );
    assert_eq!(
        counts,
        vec![3, 3, 3, 3],
        "each upstream probed once per interval in total"
    );
    assert_eq!(
        leaders.iter().filter(|l| **l).count(),
        1,
        "one instance probes"
    );
    drop(a);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_control_targets_down_is_a_probe_incident_and_changes_no_state() {
    // Control targets on loopback ports where nothing listens (yet).
    let ports: Vec<u16> = (0..2)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        })
        .collect();
    let mut proxies = Vec::new();
    for _ in 0..4 {
        proxies.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let list: Vec<String> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| format!("\"{}#p{i}\"", p.url()))
        .collect();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nconnect_timeout = \"1s\"\n\
         [policy]\nallow_private_targets = true\n\
         [pools.default]\nupstreams = [{}]\n\
         [pools.default.health]\ncooldown_base = \"1s\"\ncooldown_jitter = 0.0\n\
         [pools.default.probe]\ntargets = [\"http://127.0.0.1:{}/probe\", \"http://127.0.0.1:{}/probe\"]\nexpect_body = \"control-ok\"\ninterval = \"1s\"\njitter = 0.2\nsuccesses = 2\ntimeout = \"2s\"\n",
        list.join(", "),
        ports[0],
        ports[1]
    );
    let config = Config::parse(&config, "test", None).unwrap();
    let gw = TestGateway::from_config(config).await;
    fail_until_quarantined(&gw, "p0").await;

    // 4 s: the cool-down of p0 ends, p1..p3 idle; every probe fails because of the targets.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let status = gw.status().await;
    let pool = &status["pools"][0];
    eprintln!("probes during the outage: {}", pool["probes"]);
    assert!(
        pool["probes"]["incident"].is_object(),
        "probe incident reported: {}",
        pool["probes"]
    );
    assert!(pool["probes"]["failed_unjudged"].as_u64().unwrap() >= 3);
    assert_eq!(
        pool["counts_by_state"]["healthy"], 3,
        "{}",
        pool["counts_by_state"]
    );
    assert_eq!(pool["counts_by_state"]["quarantined"], 1);
    assert_eq!(state(&gw, "p0"), State::Quarantined);
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("poolgate_probe_incident{pool=\"default\"} 1"),
        "{metrics}"
    );

    // The control targets come back: the incident ends and p0, which works, returns.
    let _origins = [
        Origin::start_on(ports[0], OriginBehaviour::fixed("control-ok")).await,
        Origin::start_on(ports[1], OriginBehaviour::fixed("control-ok")).await,
    ];
    let mut back = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if state(&gw, "p0") == State::HalfOpen {
            back = true;
            break;
        }
    }
    let status = gw.status().await;
    eprintln!("after the outage: {}", status["pools"][0]["probes"]);
    assert!(back, "p0 back in half-open after real passing probes");
    assert!(status["pools"][0]["probes"]["incident"].is_null());
    assert!(proxies[0].requests() >= 2, "the probes went through p0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_of_one_instance_reach_the_health_view_of_another() {
    let redis = RedisServer::start().await;
    let config = format!(
        "[store]\nkind = \"redis\"\nurl = \"{}\"\n[pools.default]\nupstreams = [{}]\n[pools.default.health]\nmax_quarantined_percent = 50\n",
        redis.url(),
        upstreams(4)
    );
    let a = start(&config, Scripted::new()).await;
    let b = start(&config, Scripted::new()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    async fn wait_for(gw: &TestGateway, id: &str, want: State) -> bool {
        for _ in 0..40 {
            if state(gw, id) == want {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    fail_until_quarantined(&a, "u0").await;
    assert!(
        wait_for(&b, "u0", State::Quarantined).await,
        "B mirrors A's quarantine"
    );
    let seen = b.upstream_status("default", "u0").await;
    eprintln!(
        "B's view after A's quarantine: {} ({})",
        seen["state"], seen["state_reason"]
    );
    assert_eq!(seen["state_reason"], "quarantined by another instance");
    // The mirrored quarantine outlasts the decider's: B does not end it on its own first.
    assert!(seen["cooldown_remaining_ms"].as_u64().unwrap() >= 30_000);

    // A's operator restores it: B follows.
    let g = a.running().gateway().clone();
    let pools = g.pools.load_full();
    let pool = pools.get(None).unwrap();
    let change = pool
        .health
        .restore(&UpstreamId::new("u0"), "restored by an operator");
    poolgate::health::apply(&*g.store, pool.name(), change.into_iter().collect()).await;
    assert!(
        wait_for(&b, "u0", State::HalfOpen).await,
        "B mirrors A's return"
    );
    // Nothing of this travelled back: A's own state is the one it decided.
    assert_eq!(state(&a, "u0"), State::Healthy);
    drop(a);
    drop(b);
}
