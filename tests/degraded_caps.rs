//! The caps while degraded: the leases Redis granted an instance that still run when it switches
//! to its local view count against `max_concurrency` there, so the instance's own total on an
//! upstream (Redis leases still running + local-view leases) stays within the cap, and the room
//! comes back as those leases end.
//!
//! Store API level, through the Redis store, with a `redis-server` of its own on a free loopback
//! port; the switch is a real one (the server killed). Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::RedisServer;
use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::redis::{RedisSettings, RedisStore};
use poolgate::store::{Acquired, Grant, PoolSpec, Store, Want};
use poolgate::upstream::UpstreamId;

/// Bound on each Redis call: generous, the machine may be busy (a killed server fails at once).
const TEST_STORE_TIMEOUT: Duration = Duration::from_secs(5);
const CAP: u32 = 2;
const POOL: &str = "capped";

const ANY: Want<'static> = Want::Any {
    exclude: &[],
    within: None,
};

fn members() -> Vec<UpstreamId> {
    ["http://10.0.0.1:3128", "http://10.0.0.2:3128"]
        .map(UpstreamId::new)
        .to_vec()
}

fn spec(members: Vec<UpstreamId>, strategy: Strategy) -> PoolSpec {
    PoolSpec {
        name: POOL.into(),
        members,
        strategy,
        max_concurrency: Some(CAP),
        lease_ttl: Duration::from_secs(60),
        shards: 1,
    }
}

async fn store(url: &str, strategy: Strategy) -> RedisStore {
    let s = RedisStore::new(RedisSettings {
        url: url.to_string(),
        timeout: TEST_STORE_TIMEOUT,
        key_prefix: "pgtest".into(),
        instance_id: format!("degraded-caps-{:08x}", rand::random::<u32>()),
        tls: Default::default(),
    })
    .unwrap();
    s.configure(spec(members(), strategy)).await.unwrap();
    s
}

async fn acquire(s: &RedisStore) -> Acquired {
    s.acquire(POOL, ANY).await.unwrap()
}

fn granted(a: Acquired) -> Grant {
    match a {
        Acquired::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn release(s: &RedisStore, g: &Grant) {
    s.release(POOL, &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
        .await
        .unwrap();
}

/// `leases_live` per member, as `/status` would show it.
async fn leases_live(s: &RedisStore) -> Vec<u64> {
    let st = s.status(POOL).await.unwrap();
    st.members.iter().map(|m| m.leases_live).collect()
}

/// Leases granted by Redis, `2 × CAP - 1` of them: one member full, the other one short.
async fn redis_leases(s: &RedisStore) -> (Vec<Grant>, UpstreamId, UpstreamId) {
    let mut grants = Vec::new();
    for _ in 0..2 * CAP - 1 {
        grants.push(granted(acquire(s).await));
    }
    assert_eq!(s.health(), "ok", "granted by Redis, not by the local view");
    let mut per: BTreeMap<UpstreamId, u32> = BTreeMap::new();
    for g in &grants {
        *per.entry(g.upstream.clone()).or_default() += 1;
    }
    let full = per.iter().find(|(_, n)| **n == CAP).map(|(u, _)| u.clone());
    let short = per
        .iter()
        .find(|(_, n)| **n == CAP - 1)
        .map(|(u, _)| u.clone());
    match (full, short) {
        (Some(full), Some(short)) => (grants, full, short),
        _ => panic!("Redis spread {per:?}, expected {CAP} and {} ", CAP - 1),
    }
}

/// Takes the Redis lease of `grants` on `upstream` out and releases it.
async fn release_one(s: &RedisStore, grants: &mut Vec<Grant>, upstream: &UpstreamId) {
    let i = grants.iter().position(|g| &g.upstream == upstream).unwrap();
    let g = grants.swap_remove(i);
    release(s, &g).await;
}

async fn the_switch_counts_running_redis_leases(strategy: Strategy) {
    common::init_tracing();
    let mut redis = RedisServer::start().await;
    let s = store(&redis.url(), strategy).await;
    let (mut from_redis, full, short) = redis_leases(&s).await;

    redis.stop();
    // The first call finds Redis gone: the switch, then the local view answers. Only the member
    // Redis left short has room there, for one lease.
    let a = granted(acquire(&s).await);
    assert_eq!(s.health(), "degraded");
    assert_eq!(a.upstream, short, "{strategy:?}");
    assert_eq!(
        acquire(&s).await,
        Acquired::AtCapacity,
        "{strategy:?}: the local view counts the {} Redis leases still running",
        2 * CAP - 1
    );
    // This instance's own leases, both kinds, counted once.
    assert_eq!(leases_live(&s).await, [CAP as u64, CAP as u64]);
    // A reload while degraded that drops the full member and brings it back (the local view
    // forgets a removed member without leases of its own) keeps its Redis leases counted.
    s.configure(spec(vec![short.clone()], strategy))
        .await
        .unwrap();
    s.configure(spec(members(), strategy)).await.unwrap();
    assert_eq!(acquire(&s).await, Acquired::AtCapacity, "{strategy:?}");
    assert_eq!(leases_live(&s).await, [CAP as u64, CAP as u64]);

    // A Redis lease that ends while degraded frees its place in the local view, and wakes the
    // requests waiting for capacity.
    let signal = s.release_signal(POOL);
    let woken = signal.notified();
    tokio::pin!(woken);
    woken.as_mut().enable();
    release_one(&s, &mut from_redis, &full).await;
    tokio::time::timeout(Duration::from_secs(5), woken)
        .await
        .expect("waiters woken by the release of a Redis lease");
    let b = granted(acquire(&s).await);
    assert_eq!(b.upstream, full, "{strategy:?}");
    assert_eq!(acquire(&s).await, Acquired::AtCapacity, "{strategy:?}");

    // Once every Redis lease has ended, the local view has the whole cap.
    for g in std::mem::take(&mut from_redis) {
        release(&s, &g).await;
    }
    let mut local = vec![a, b];
    for _ in 0..2 * CAP - 2 {
        local.push(granted(acquire(&s).await));
    }
    assert_eq!(acquire(&s).await, Acquired::AtCapacity, "{strategy:?}");
    assert_eq!(leases_live(&s).await, [CAP as u64, CAP as u64]);
    for g in &local {
        release(&s, g).await;
    }
    assert_eq!(leases_live(&s).await, [0, 0]);
    assert_eq!(s.health(), "degraded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_used_counts_running_redis_leases_after_the_switch() {
    the_switch_counts_running_redis_leases(Strategy::LeastUsed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_connections_counts_running_redis_leases_after_the_switch() {
    the_switch_counts_running_redis_leases(Strategy::LeastConnections).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_counts_running_redis_leases_after_the_switch() {
    the_switch_counts_running_redis_leases(Strategy::RoundRobin).await;
}

/// Each switch counts the Redis leases running then: one released after Redis came back leaves
/// nothing behind in the local view, and the next outage finds the count as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_switch_counts_the_redis_leases_running_then() {
    common::init_tracing();
    let mut redis = RedisServer::start().await;
    let s = store(&redis.url(), Strategy::LeastUsed).await;
    let (mut from_redis, full, short) = redis_leases(&s).await;

    redis.stop();
    assert_eq!(granted(acquire(&s).await).upstream, short);
    assert_eq!(acquire(&s).await, Acquired::AtCapacity);
    // That local lease stays; the ones Redis granted run on through its return.
    redis.restart().await;
    // The recovery reconnects with backoff (at most 2 s apart) and is ok once it has replayed.
    let back = common::wait_until(|| s.health() == "ok", Duration::from_secs(30)).await;
    assert!(back, "the store is ok again once Redis is back");
    // Released after the return: Redis's business only.
    release_one(&s, &mut from_redis, &full).await;
    release_one(&s, &mut from_redis, &short).await;
    assert_eq!(from_redis.len(), 1, "one Redis lease still runs, on {full}");

    redis.stop();
    // The local view now counts 1 Redis lease on `full` and its own one on `short`.
    let c = granted(acquire(&s).await);
    assert_eq!(s.health(), "degraded");
    assert_eq!(
        leases_live(&s).await.iter().sum::<u64>(),
        3,
        "1 Redis lease, 2 of the local view"
    );
    let d = granted(acquire(&s).await);
    let mut got = [c.upstream.clone(), d.upstream.clone()];
    got.sort();
    let mut want = [full.clone(), short.clone()];
    want.sort();
    assert_eq!(got, want, "one place left on each member");
    assert_eq!(acquire(&s).await, Acquired::AtCapacity);
}

/// Leases the local view granted during an outage that still run when Redis is back count
/// against the cap there (reported with this instance's unlisted leases) until they end, so
/// another instance is not granted a whole cap beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_view_leases_still_running_after_the_return_count_in_redis() {
    common::init_tracing();
    let mut redis = RedisServer::start().await;
    let a = store(&redis.url(), Strategy::LeastUsed).await;
    redis.stop();
    // The outage: the local view fills both members.
    let mut local = Vec::new();
    for _ in 0..2 * CAP {
        local.push(granted(acquire(&a).await));
    }
    assert_eq!(a.health(), "degraded");
    assert_eq!(acquire(&a).await, Acquired::AtCapacity);

    redis.restart().await;
    let back = common::wait_until(|| a.health() == "ok", Duration::from_secs(30)).await;
    assert!(back, "the store is ok again once Redis is back");
    // a reports them at once; another instance, started now, finds both members at their cap.
    let reported = common::wait_until(
        || {
            !redis
                .cli(&["HGETALL", "pgtest:{capped}:held"])
                .trim()
                .is_empty()
        },
        Duration::from_secs(10),
    )
    .await;
    assert!(
        reported,
        "no report of the local view's leases reached Redis"
    );
    let b = store(&redis.url(), Strategy::LeastUsed).await;
    assert_eq!(
        acquire(&b).await,
        Acquired::AtCapacity,
        "the local view's leases are not counted in Redis"
    );
    assert_eq!(b.health(), "ok");

    // One of them ends: its place comes back, to b, once a reports again (within a second).
    let ended = local.pop().unwrap();
    release(&a, &ended).await;
    let mut got = None;
    for _ in 0..100 {
        if let Acquired::Granted(g) = acquire(&b).await {
            got = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let g = got.expect("the place of the ended lease came back");
    assert_eq!(g.upstream, ended.upstream);
    assert_eq!(acquire(&b).await, Acquired::AtCapacity, "one place only");
    for l in &local {
        release(&a, l).await;
    }
    release(&b, &g).await;
    // All ended: b has the whole cap on both members again.
    let all = common::wait_until_async(
        || async {
            let mut grants = Vec::new();
            for _ in 0..2 * CAP {
                if let Acquired::Granted(g) = acquire(&b).await {
                    grants.push(g);
                }
            }
            let n = grants.len();
            for g in &grants {
                release(&b, g).await;
            }
            n == 2 * CAP as usize
        },
        Duration::from_secs(10),
    )
    .await;
    assert!(all, "the carried leases were never withdrawn");
}
