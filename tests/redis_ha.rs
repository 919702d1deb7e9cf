//! Redis high availability against real servers: a Redis Cluster master SIGKILLed under load and
//! its replica promoted, a Sentinel failover under load, and a TLS server with a client
//! certificate and an ACL user limited to the key prefix (and the start-up errors of a wrong
//! password or an untrusted certificate).
//!
//! Every Redis, sentinel and cluster node is started by the test on free loopback ports; the
//! gateways of the failover tests are the `poolgate` binary as child processes. Each test prints
//! the figures docs/performance.md ("Redis high availability") quotes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::gateway::GatewayProcess;
use common::redis_server::{RedisCluster, RedisServer, SentinelGroup, Setup};
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestCa, TestGateway};

/// Per-upstream cap of the failover tests, and their upstreams: 12 slots for 16 clients, so the
/// cap is reached and requests queue.
const CAP: usize = 3;
const UPSTREAMS: usize = 4;
const WORKERS_PER_GATEWAY: usize = 8;
/// Lease TTL of the failover tests: the bound on reclaiming the dead master's leases.
const LEASE_TTL: Duration = Duration::from_secs(3);
/// How long the test waits for the failover at most (detection, promotion, the gateways back).
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);
/// The bound asserted on each gateway being back on the shared state, from the fault: measured
/// at 2.7–4.6 s for the cluster (node timeout 1 s) and 1.3–2.4 s for Sentinel on a loaded 2-core
/// machine (docs/performance.md, "Redis high availability").
const RECOVERY_BOUND: Duration = Duration::from_secs(10);

fn config(url: &str, upstreams: &[String], origin_port: u16, store_extra: &str) -> String {
    let list: Vec<String> = upstreams.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"5s\"\n\
         [store]\nkind = \"redis\"\nurl = \"{url}\"\ntimeout = \"250ms\"\n{store_extra}\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{origin_port}]\n\
         [pools.default]\nupstreams = [{}]\nmax_concurrency = {CAP}\nlease_ttl = \"{}s\"\n\
         queue_timeout = \"10s\"\n",
        list.join(", "),
        LEASE_TTL.as_secs()
    )
}

fn client_via(proxy: &str) -> reqwest::Client {
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{proxy}")).unwrap())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

async fn status(admin: &str) -> serde_json::Value {
    common::admin_json(admin, "/status").await
}

/// Requests through several gateways until stopped, counted by outcome (`200`, `502
/// <X-Pool-Error>`, `error`).
struct Load {
    stop: Arc<AtomicBool>,
    outcomes: Arc<Mutex<BTreeMap<String, usize>>>,
    tasks: tokio::task::JoinSet<()>,
}

impl Load {
    fn start(clients: &[reqwest::Client], url: &str, workers_each: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes = Arc::new(Mutex::new(BTreeMap::new()));
        let mut tasks = tokio::task::JoinSet::new();
        for client in clients {
            for _ in 0..workers_each {
                let (client, url) = (client.clone(), url.to_string());
                let (stop, outcomes) = (stop.clone(), outcomes.clone());
                tasks.spawn(async move {
                    // Bounded: at most 100k requests per worker.
                    for _ in 0..100_000 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let outcome = match client.get(&url).send().await {
                            Ok(r) => {
                                let code = r.status().as_u16();
                                let why = r
                                    .headers()
                                    .get("x-pool-error")
                                    .map(|v| v.to_str().unwrap_or("").to_string());
                                match (r.bytes().await, why) {
                                    (Ok(_), None) => code.to_string(),
                                    (Ok(_), Some(why)) => format!("{code} {why}"),
                                    (Err(_), _) => format!("{code} body cut"),
                                }
                            }
                            Err(e) if e.is_timeout() => "error: timeout".into(),
                            Err(_) => "error: no response".into(),
                        };
                        *outcomes.lock().unwrap().entry(outcome).or_insert(0) += 1;
                    }
                });
            }
        }
        Load {
            stop,
            outcomes,
            tasks,
        }
    }

    async fn finish(mut self) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::SeqCst);
        while self.tasks.join_next().await.is_some() {}
        self.outcomes.lock().unwrap().clone()
    }
}

/// What one gateway's `/status` showed after the fault: when it first said `degraded` (and
/// why), and when it said `ok` again after that, both counted from the fault.
#[derive(Debug, Default)]
struct Seen {
    degraded_after: Option<Duration>,
    reason: Option<String>,
    ok_after: Option<Duration>,
}

/// Polls `/status` every 25 ms from `since` until it was degraded and is `ok` again, or `enough`
/// is set, or `limit` passed.
fn watch_health(
    admin: String,
    since: Instant,
    enough: Arc<AtomicBool>,
    limit: Duration,
) -> tokio::task::JoinHandle<Seen> {
    tokio::spawn(async move {
        let mut seen = Seen::default();
        while since.elapsed() < limit && !enough.load(Ordering::SeqCst) {
            let s = status(&admin).await;
            let health = s["store"]["health"].as_str().unwrap_or("").to_string();
            if health == "degraded" && seen.degraded_after.is_none() {
                seen.degraded_after = Some(since.elapsed());
                seen.reason = s["store"]["reason"].as_str().map(str::to_string);
            }
            if health == "ok" && seen.degraded_after.is_some() {
                seen.ok_after = Some(since.elapsed());
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        seen
    })
}

/// The Redis client name of a gateway's command connection (`poolgate:<instance id>`).
async fn client_name(admin: &str) -> String {
    let id = status(admin).await["instance_id"]
        .as_str()
        .unwrap()
        .to_string();
    poolgate::store::redis::client_name(&id)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// Leases of the default pool whose deadline has not passed, as `server` holds them.
fn live_leases(server: &RedisServer) -> u64 {
    server
        .cli(&[
            "ZCOUNT",
            "pg:{default}:leases",
            &now_ms().to_string(),
            "(+inf",
        ])
        .trim()
        .parse()
        .unwrap_or(u64::MAX)
}

/// The live leases `/status` counts over the default pool's upstreams.
async fn leases_live_in_status(admin: &str) -> u64 {
    status(admin).await["pools"][0]["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["leases_live"].as_u64().unwrap())
        .sum()
}

/// Two gateways on `url` with their upstreams and origin, under load.
struct UnderLoad {
    origin: Origin,
    ups: Vec<FakeProxy>,
    a: GatewayProcess,
    b: GatewayProcess,
    load: Load,
}

async fn two_gateways_under_load(url: &str) -> UnderLoad {
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..UPSTREAMS {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let urls: Vec<String> = ups.iter().map(|u| u.url()).collect();
    let text = config(url, &urls, origin.port(), "");
    let a = GatewayProcess::spawn(&text).await;
    let b = GatewayProcess::spawn(&text).await;
    for gw in [&a, &b] {
        assert_eq!(status(&gw.admin).await["store"]["health"], "ok");
    }
    let clients = [client_via(&a.proxy), client_via(&b.proxy)];
    let load = Load::start(&clients, &origin.url("/slow?ms=20"), WORKERS_PER_GATEWAY);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    UnderLoad {
        origin,
        ups,
        a,
        b,
        load,
    }
}

/// The figures of one failover, printed and checked the same way for Cluster and Sentinel.
struct Figures {
    promoted_after: Duration,
    seen: [Seen; 2],
    /// When each gateway was back on the shared state: `ok` after being degraded, or (a gateway
    /// that switched masters without a failed call) connected to the new master and `ok`.
    recovered_after: [Duration; 2],
}

impl UnderLoad {
    /// After both gateways are `ok` again: a window of load in which no upstream may pass its
    /// cap, then the load stops; returns the outcomes and the peaks in that window.
    async fn settle(
        self,
    ) -> (
        BTreeMap<String, usize>,
        Vec<usize>,
        usize,
        usize,
        GatewayProcess,
        GatewayProcess,
    ) {
        // Leases the local views granted while degraded end with their request (20 ms, but up
        // to hundreds on a loaded 2-core machine); until then they count against no shared cap.
        tokio::time::sleep(Duration::from_secs(1)).await;
        for u in &self.ups {
            u.reset_peak();
        }
        // Bounded: 40 looks at both gateways, 50 ms apart.
        let mut relapses = 0;
        for _ in 0..40 {
            for gw in [&self.a, &self.b] {
                if status(&gw.admin).await["store"]["health"] != "ok" {
                    relapses += 1;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let peaks: Vec<usize> = self.ups.iter().map(|u| u.peak_in_flight()).collect();
        let outcomes = self.load.finish().await;
        let total = outcomes.values().sum();
        drop(self.origin);
        (outcomes, peaks, relapses, total, self.a, self.b)
    }
}

/// Checks and prints one failover's figures.
async fn check_failover(
    what: &str,
    run: UnderLoad,
    figures: Figures,
    new_master: impl Fn() -> u64,
) {
    let ups_len = run.ups.len();
    let (outcomes, peaks, relapses, total, a, b) = run.settle().await;
    let stopped = Instant::now();
    // Reclaimed: every lease in the new master ends within lease_ttl of the load's end (a lease
    // the dead master granted, or released, without the replica hearing of it, expires; releases
    // the gateways could not send were replayed).
    let mut reclaimed_after = None;
    for _ in 0..((LEASE_TTL.as_millis() + 2000) / 50) {
        if new_master() == 0 {
            reclaimed_after = Some(stopped.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let in_status = leases_live_in_status(&a.admin).await + leases_live_in_status(&b.admin).await;
    let ok = outcomes.get("200").copied().unwrap_or(0);
    eprintln!(
        "{what}: replica promoted after {:?}; gateway A degraded after {:?} ({:?}), on the shared \
         state again after {:?}; gateway B degraded after {:?} ({:?}), on the shared state again \
         after {:?}; {total} requests over the run, by \
         outcome {outcomes:?}; peaks after recovery {peaks:?} (cap {CAP}, {relapses} looks found a \
         gateway degraded again); leases in the new master \
         0 after {reclaimed_after:?} from the end of the load (lease_ttl {LEASE_TTL:?})",
        figures.promoted_after,
        figures.seen[0].degraded_after,
        figures.seen[0].reason,
        figures.recovered_after[0],
        figures.seen[1].degraded_after,
        figures.seen[1].reason,
        figures.recovered_after[1],
    );
    assert_eq!(peaks.len(), ups_len);
    assert!(
        peaks.iter().all(|&p| p <= CAP),
        "cap violated after recovery: {peaks:?} ({relapses} looks at /status found a gateway \
         degraded again in that window)"
    );
    assert!(peaks.contains(&CAP), "the cap was reached: {peaks:?}");
    assert_eq!(ok, total, "every request was served: {outcomes:?}");
    for (seen, recovered) in figures.seen.iter().zip(figures.recovered_after) {
        assert!(
            recovered < RECOVERY_BOUND,
            "back after {recovered:?}: {seen:?}"
        );
        if seen.degraded_after.is_some() {
            assert!(
                seen.reason.as_deref().is_some_and(|r| !r.is_empty()),
                "{seen:?}"
            );
        }
    }
    for gw in [&a, &b] {
        assert_eq!(status(&gw.admin).await["store"]["health"], "ok");
    }
    let reclaimed = reclaimed_after.expect("the leases were reclaimed");
    assert!(
        reclaimed <= LEASE_TTL,
        "leases reclaimed after {reclaimed:?}"
    );
    assert_eq!(in_status, 0, "/status counts no live lease");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_killed_under_load_is_replaced_by_its_replica() {
    let mut cluster = RedisCluster::start_with_replicas(1000).await;
    let run = two_gateways_under_load(&cluster.url()).await;
    let slot_key = "pg:{default}:leases";
    let old = cluster
        .master_of(slot_key)
        .expect("the pool's slot has a master");
    cluster.nodes[old].stop();
    let killed = Instant::now();
    let never = Arc::new(AtomicBool::new(false));
    let watch = [
        watch_health(run.a.admin.clone(), killed, never.clone(), RECOVERY_LIMIT),
        watch_health(run.b.admin.clone(), killed, never, RECOVERY_LIMIT),
    ];
    let mut promoted = None;
    for _ in 0..(RECOVERY_LIMIT.as_millis() / 50) {
        match cluster.master_of(slot_key) {
            Some(i) if i != old => {
                promoted = Some((i, killed.elapsed()));
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let (new, promoted_after) = promoted.expect("a replica took the slot");
    let [wa, wb] = watch;
    let seen = [wa.await.unwrap(), wb.await.unwrap()];
    // A killed master fails the calls in flight: both gateways went degraded, then ok.
    let recovered_after = [0, 1].map(|i| seen[i].ok_after.expect("degraded, then ok again"));
    let figures = Figures {
        promoted_after,
        seen,
        recovered_after,
    };
    let new_master = &cluster.nodes[new];
    check_failover(
        "cluster master SIGKILL (node timeout 1000ms)",
        run,
        figures,
        || live_leases(new_master),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_under_load_moves_both_gateways_to_the_new_master() {
    let group = SentinelGroup::start(1, 1000).await;
    let run = two_gateways_under_load(&group.url()).await;
    let old = group.master_port().expect("the sentinels name a master");
    let answer = group.sentinels[0].cli(&[
        "SENTINEL",
        "FAILOVER",
        common::redis_server::SENTINEL_MASTER,
    ]);
    assert!(answer.contains("OK"), "SENTINEL FAILOVER: {answer}");
    let started = Instant::now();
    let moved = Arc::new(AtomicBool::new(false));
    let watch = [
        watch_health(run.a.admin.clone(), started, moved.clone(), RECOVERY_LIMIT),
        watch_health(run.b.admin.clone(), started, moved.clone(), RECOVERY_LIMIT),
    ];
    let mut promoted = None;
    for _ in 0..(RECOVERY_LIMIT.as_millis() / 50) {
        match group.master_port() {
            Some(p) if p != old => {
                promoted = Some((p, started.elapsed()));
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let (new, promoted_after) = promoted.expect("the sentinels promoted the replica");
    let new_master = group.server(new).unwrap();
    // Each gateway has switched once its command connection is on the new master and it is ok.
    let names = [
        client_name(&run.a.admin).await,
        client_name(&run.b.admin).await,
    ];
    let admins = [run.a.admin.clone(), run.b.admin.clone()];
    let mut switched: [Option<Duration>; 2] = [None, None];
    for _ in 0..(RECOVERY_LIMIT.as_millis() / 50) {
        let clients = new_master.cli(&["CLIENT", "LIST"]);
        for i in 0..2 {
            let on_new = clients
                .lines()
                .any(|l| l.split(' ').any(|f| f == format!("name={}", names[i])));
            if switched[i].is_none()
                && on_new
                && status(&admins[i]).await["store"]["health"] == "ok"
            {
                switched[i] = Some(started.elapsed());
            }
        }
        if switched.iter().all(Option::is_some) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    moved.store(true, Ordering::SeqCst);
    let [wa, wb] = watch;
    let seen = [wa.await.unwrap(), wb.await.unwrap()];
    let recovered_after = [0, 1].map(|i| {
        let switched = switched[i].expect("the gateway moved to the new master");
        seen[i].ok_after.map_or(switched, |ok| ok.max(switched))
    });
    let figures = Figures {
        promoted_after,
        seen,
        recovered_after,
    };
    check_failover("SENTINEL FAILOVER", run, figures, || {
        live_leases(new_master)
    })
    .await;
    // The gateways write to the new master: the pool is declared there.
    assert_eq!(new_master.cli(&["ROLE"]).lines().next(), Some("master"));
}

/// The ACL a gateway needs, and no more: its keys and channels only, the commands it sends and
/// those its scripts run (see docs/configuration.md, `[store]`).
const GATEWAY_ACL: &[&str] = &[
    "on",
    "resetkeys",
    "~pg:*",
    "resetchannels",
    "&pg:*",
    "-@all",
    "+ping",
    "+hello",
    "+client|setname",
    "+evalsha",
    "+script|load",
    "+subscribe",
    "+get",
    "+hget",
    "+zadd",
    // /status reads the per-member hashes a thousand fields a call.
    "+hscan",
    "+zscan",
    // Run by the scripts.
    "+del",
    "+exists",
    "+hdel",
    "+hgetall",
    "+hincrby",
    "+hkeys",
    "+hmget",
    "+hset",
    "+hsetnx",
    "+pexpire",
    "+pexpireat",
    "+pexpiretime",
    "+publish",
    "+set",
    "+zcard",
    "+zincrby",
    "+zrange",
    "+zrangebyscore",
    "+zrem",
    "+zscore",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_and_an_acl_user_limited_to_the_key_prefix() {
    common::init_tracing();
    let ca = TestCa::new();
    let (cert, key) = ca.leaf_pem(&["127.0.0.1"]);
    let mut redis = RedisServer::start_setup(Setup {
        tls: Some((ca.cert_pem(), cert.clone(), key.clone())),
        extra: vec!["--tls-auth-clients".into(), "yes".into()],
        ..Setup::default()
    })
    .await;
    let mut acl = vec!["ACL", "SETUSER", "pg", ">s3cret-pw"];
    acl.extend(GATEWAY_ACL);
    assert_eq!(redis.cli(&acl).trim(), "OK");
    let files = tempfile::tempdir().unwrap();
    let path = |name: &str, text: &str| {
        let p = files.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (ca_file, cert_file, key_file) = (
        path("ca.pem", &ca.cert_pem()),
        path("client.pem", &cert),
        path("client.key", &key),
    );
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let port = redis.port();
    let store = |password: &str, ca_file: &str| {
        format!(
            "[store]\nkind = \"redis\"\nurl = \"rediss://pg:{password}@127.0.0.1:{port}\"\n\
             timeout = \"250ms\"\ntls_ca_file = \"{ca_file}\"\ntls_cert_file = \"{cert_file}\"\n\
             tls_key_file = \"{key_file}\"\n\
             [policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [pools.default]\nupstreams = [\"{}\"]\nmax_concurrency = 4\n",
            origin.port(),
            up.url()
        )
    };

    // A wrong password and an untrusted certificate stop the start, naming the key; the
    // password is never shown.
    let start_error = |text: String| async move {
        let text =
            format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{text}");
        let config = poolgate::config::Config::parse(&text, "test", None).unwrap();
        match poolgate::app::start(config).await {
            Ok(_) => panic!("started"),
            Err(e) => e.to_string(),
        }
    };
    let wrong = start_error(store("wrong-pw", &ca_file)).await;
    eprintln!("wrong password: {wrong}");
    assert!(wrong.contains("store.url"), "{wrong}");
    assert!(!wrong.contains("wrong-pw"), "{wrong}");
    let other_ca = TestCa::new();
    let untrusted = start_error(store(
        "s3cret-pw",
        &path("other-ca.pem", &other_ca.cert_pem()),
    ))
    .await;
    eprintln!("untrusted certificate: {untrusted}");
    assert!(untrusted.contains("store.tls_ca_file"), "{untrusted}");
    assert!(!untrusted.contains("s3cret-pw"), "{untrusted}");

    // The right ones: served through Redis, every command allowed by the ACL (the log so far
    // holds the wrong password's attempts).
    assert_eq!(redis.cli(&["ACL", "LOG", "RESET"]).trim(), "OK");
    let gw = TestGateway::start(&store("s3cret-pw", &ca_file)).await;
    let client = gw.client();
    for _ in 0..20 {
        let r = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    // A session bound and renewed, and counted.
    for _ in 0..3 {
        let r = client
            .get(origin.url("/ok"))
            .header("X-Pool-Session", "acl-check")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    let status = gw.status().await;
    assert_eq!(status["store"]["health"], "ok");
    assert_eq!(status["pools"][0]["sessions_live"], 1);
    assert_eq!(redis.cli(&["EXISTS", "pg:{default}:meta"]).trim(), "1");
    let denied = redis.cli(&["ACL", "LOG"]);
    assert!(denied.trim().is_empty(), "ACL denials: {denied}");
    let clients = redis.cli(&["CLIENT", "LIST"]);
    assert!(
        clients.lines().filter(|l| l.contains("user=pg")).count() >= 2,
        "the command and events connections log in as pg: {clients}"
    );

    // Redis gone after start: degraded, with the reason in /status and no password.
    redis.stop();
    let mut reason = None;
    for _ in 0..100 {
        let _ = client.get(origin.url("/ok")).send().await;
        let s = gw.status().await;
        if s["store"]["health"] == "degraded" {
            reason = s["store"]["reason"].as_str().map(str::to_string);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reason = reason.expect("degraded with a reason");
    eprintln!("redis gone after start: /status store.reason = {reason:?}");
    assert!(
        !reason.is_empty() && !reason.contains("s3cret-pw"),
        "{reason}"
    );
    let r = client.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(r.status(), 200, "served from the local view");
}
