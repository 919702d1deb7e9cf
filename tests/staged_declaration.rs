//! A pool of more than 1,000 members is declared in Redis in a run of short `configure.lua`
//! calls (begin, stage, sweep, apply, finish) instead of one that held Redis for a second at
//! 100,000 members. These hold the run to what one call did: the pool ends exactly as its list
//! says (members, positions, the state of members that stay, the least-connections load index),
//! whoever declares at the same time; a declaration already in Redis is recognised by its digest
//! and costs one call; an abandoned one is taken over once its claim lapses; and the load index
//! built while requests run stays right.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::RedisServer;
use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::redis::script_keys;
use poolgate::store::{Acquired, AnyStore, Grant, PoolSpec, Store, Want};
use poolgate::upstream::UpstreamId;
use redis::aio::MultiplexedConnection;

const PREFIX: &str = "pgsd";
const CONFIGURE: &str = include_str!("../lua/configure.lua");

fn key(pool: &str, name: &str) -> String {
    format!("{PREFIX}:{{{pool}}}:{name}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn store(url: &str, instance: &str) -> AnyStore {
    common::redis_store(url, PREFIX, instance)
}

fn ids(range: std::ops::Range<usize>) -> Vec<UpstreamId> {
    range
        .map(|i| UpstreamId::new(format!("http://10.1.{}.{}:3128", i / 250, i % 250)))
        .collect()
}

fn spec(pool: &str, members: Vec<UpstreamId>, strategy: Strategy) -> PoolSpec {
    PoolSpec {
        name: pool.into(),
        members,
        strategy,
        max_concurrency: None,
        lease_ttl: Duration::from_secs(600),
        shards: 1,
    }
}

async fn connect(redis: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn hash(c: &mut MultiplexedConnection, pool: &str, name: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key(pool, name))
        .query_async(c)
        .await
        .unwrap()
}

async fn zset(c: &mut MultiplexedConnection, pool: &str, name: &str) -> HashMap<String, f64> {
    let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key(pool, name))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(c)
        .await
        .unwrap();
    v.into_iter().collect()
}

async fn script_calls(c: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|v| v.split(',').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// The pool is exactly `members`, in that order, and its load index (least-connections) is
/// what acquire.lua would build from the state: every eligible member's entry, its allocation
/// score, position and live count; no declaration is left under way.
async fn check_pool(c: &mut MultiplexedConnection, pool: &str, members: &[UpstreamId], lc: bool) {
    let state = hash(c, pool, "state").await;
    let want: HashSet<&str> = members.iter().map(UpstreamId::as_str).collect();
    let have: HashSet<&str> = state.keys().map(String::as_str).collect();
    assert_eq!(
        have.len(),
        want.len(),
        "{pool}: {} members in state, {} declared",
        have.len(),
        want.len()
    );
    assert!(have == want, "{pool}: state holds other members");
    let order = zset(c, pool, "order").await;
    assert_eq!(order.len(), members.len(), "{pool}: order");
    for (i, m) in members.iter().enumerate() {
        assert_eq!(
            order.get(m.as_str()),
            Some(&(i as f64)),
            "{pool}: position of {m}"
        );
    }
    let allocs = zset(c, pool, "members").await;
    let eligible: Vec<&String> = state
        .iter()
        .filter(|(_, v)| v.starts_with("1|"))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(allocs.len(), eligible.len(), "{pool}: members ZSET");
    let meta = hash(c, pool, "meta").await;
    // The count, then the declaration's digest.
    let n = meta.get("n").map(String::as_str).unwrap_or_default();
    let (count, digest) = n.split_once(' ').unwrap_or((n, ""));
    assert_eq!(count, members.len().to_string(), "{pool}: n");
    assert!(!digest.is_empty(), "{pool}: no digest");
    for field in ["decl", "decl_until", "decl_strategy", "decl_n"] {
        assert!(!meta.contains_key(field), "{pool}: {field} left");
    }
    let exists: bool = redis::cmd("EXISTS")
        .arg(key(pool, "decl"))
        .query_async(c)
        .await
        .unwrap();
    assert!(!exists, "{pool}: staging set left");
    let load = zset(c, pool, "load").await;
    let load_of = hash(c, pool, "load_of").await;
    if !lc {
        assert!(
            !meta.contains_key("load"),
            "{pool}: load flag without least-connections"
        );
        assert!(load.is_empty() && load_of.is_empty(), "{pool}: index left");
        return;
    }
    assert_eq!(
        meta.get("load").map(String::as_str),
        Some("1"),
        "{pool}: load flag"
    );
    let live = hash(c, pool, "live").await;
    assert_eq!(load.len(), eligible.len(), "{pool}: load entries");
    assert_eq!(load_of.len(), eligible.len(), "{pool}: load_of entries");
    for up in eligible {
        let cost: u64 = state[up].split('|').nth(2).unwrap().parse().unwrap();
        let entry = format!("{:017}{:08}{up}", allocs[up] as u64, order[up] as u64);
        assert_eq!(
            load_of.get(up),
            Some(&format!("{} {entry}", cost.max(1))),
            "{pool}: load_of of {up}"
        );
        let n: f64 = live.get(up).map_or(0.0, |v| v.parse().unwrap());
        assert_eq!(
            load.get(&entry),
            Some(&(n * cost.max(1) as f64)),
            "{pool}: load of {up}"
        );
    }
}

/// A plain acquire that must be granted.
async fn granted(store: &AnyStore, pool: &str) -> Grant {
    let any = Want::Any {
        exclude: &[],
        within: None,
    };
    match store.acquire(pool, any).await.unwrap() {
        Acquired::Granted(g) => g,
        other => panic!("{other:?}"),
    }
}

/// Runs `configure.lua` in `mode` on `pool` with `args`.
async fn run(
    c: &mut MultiplexedConnection,
    pool: &str,
    mode: &str,
    args: &[String],
) -> redis::Value {
    let script = redis::Script::new(CONFIGURE);
    let mut inv = script.prepare_invoke();
    for k in script_keys::CONFIGURE {
        inv.key(key(pool, k));
    }
    inv.arg(mode);
    for a in args {
        inv.arg(a.as_str());
    }
    inv.invoke_async(c).await.unwrap()
}

fn words(v: &redis::Value) -> Vec<String> {
    redis::from_redis_value(v.clone()).unwrap()
}

#[tokio::test]
async fn a_large_pool_is_declared_in_short_calls_and_reloads_keep_what_stays() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let a = store(&redis.url(), "sd-a");
    let first = ids(0..2_500);
    let before = script_calls(&mut c).await;
    a.configure(spec("big", first.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    let calls = script_calls(&mut c).await - before;
    // begin, 3 stages, a sweep, 3 applies, finish (and a load of the script).
    assert!(calls >= 9, "declared in {calls} calls: not in stages");
    check_pool(&mut c, "big", &first, true).await;

    // Traffic moves allocation scores and leaves live leases on some members.
    let mut held = Vec::new();
    for i in 0..40 {
        let g = granted(&a, "big").await;
        if i % 2 == 0 {
            held.push(g);
        } else {
            a.release("big", &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
                .await
                .unwrap();
        }
    }
    let scores_before = zset(&mut c, "big", "members").await;

    // A reload: 300 members leave (some with live leases), 250 join in the middle, two swap.
    let mut second: Vec<UpstreamId> = first
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 8 != 3 || *i > 2_400)
        .map(|(_, m)| m.clone())
        .collect();
    let joined = ids(5_000..5_250);
    second.splice(1_000..1_000, joined.iter().cloned());
    second.swap(0, 2_000);
    a.configure(spec("big", second.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    check_pool(&mut c, "big", &second, true).await;
    let scores = zset(&mut c, "big", "members").await;
    for m in second.iter().filter(|m| !joined.contains(m)) {
        assert_eq!(
            scores[m.as_str()],
            scores_before[m.as_str()],
            "{m} kept its score"
        );
    }
    // Joining members start at the lowest score of those that stayed.
    let lowest = second
        .iter()
        .filter(|m| !joined.contains(m))
        .map(|m| scores_before[m.as_str()])
        .fold(f64::INFINITY, f64::min);
    for m in &joined {
        assert_eq!(scores[m.as_str()], lowest, "{m} joins at the lowest score");
    }

    // The same declaration again (an instance starting): one call, nothing written.
    let b = store(&redis.url(), "sd-b");
    let before = script_calls(&mut c).await;
    b.configure(spec("big", second.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    assert!(
        script_calls(&mut c).await - before <= 2,
        "declared again at full cost"
    );
    check_pool(&mut c, "big", &second, true).await;

    // An instance of an older version declares a list without the first member: it sets `n`
    // to its count alone. The next declaration of this version is not taken for done.
    let gone = second[0].as_str();
    let _: () = redis::pipe()
        .hset(key("big", "meta"), "n", second.len() - 1)
        .hdel(key("big", "state"), gone)
        .zrem(key("big", "members"), gone)
        .zrem(key("big", "order"), gone)
        .query_async(&mut c)
        .await
        .unwrap();
    b.configure(spec("big", second.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    let state = hash(&mut c, "big", "state").await;
    assert!(
        state.contains_key(gone),
        "the older declaration was taken for this one"
    );

    // Switching strategy drops the index; switching back builds it in stages.
    a.configure(spec("big", second.clone(), Strategy::LeastUsed))
        .await
        .unwrap();
    check_pool(&mut c, "big", &second, false).await;
    a.configure(spec("big", second.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    check_pool(&mut c, "big", &second, true).await;

    // Shrunk to a few members: still right, the leftovers swept in stages.
    let few = ids(5_000..5_010);
    a.configure(spec("big", few.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    check_pool(&mut c, "big", &few, true).await;
    for g in held {
        a.release("big", &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
    }
    assert_eq!(a.health(), "ok");
    assert_eq!(b.health(), "ok");
}

#[tokio::test]
async fn instances_declaring_at_once_leave_one_whole_declaration() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let a = store(&redis.url(), "sd-a");
    let b = store(&redis.url(), "sd-b");
    // The same list from both: they join one declaration.
    let same = ids(0..3_000);
    let (ra, rb) = tokio::join!(
        a.configure(spec("same", same.clone(), Strategy::LeastConnections)),
        b.configure(spec("same", same.clone(), Strategy::LeastConnections)),
    );
    ra.unwrap();
    rb.unwrap();
    check_pool(&mut c, "same", &same, true).await;

    // Different lists: one waits for the other, and the pool is one of them, whole.
    let one = ids(0..2_200);
    let two = ids(1_000..3_500);
    let (ra, rb) = tokio::join!(
        a.configure(spec("two", one.clone(), Strategy::LeastUsed)),
        b.configure(spec("two", two.clone(), Strategy::LeastConnections)),
    );
    ra.unwrap();
    rb.unwrap();
    let state = hash(&mut c, "two", "state").await;
    if state.contains_key(one[0].as_str()) {
        check_pool(&mut c, "two", &one, false).await;
    } else {
        check_pool(&mut c, "two", &two, true).await;
    }
    assert_eq!(a.health(), "ok");
    assert_eq!(b.health(), "ok");
}

#[tokio::test]
async fn a_declaration_waits_for_a_live_claim_takes_over_a_lapsed_one_and_knows_when_it_lost() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let now = now_ms();
    let s = |v: &str| v.to_string();
    let begin = |digest: &str, at: u64, n: usize| {
        vec![
            s("least-used"),
            s(digest),
            at.to_string(),
            s("10000"),
            n.to_string(),
        ]
    };
    // An instance begins and stages, then stops answering.
    let r = run(&mut c, "p", "begin", &begin("dead", now, 3)).await;
    assert_eq!(words(&r), ["go", "1"]);
    let r = run(
        &mut c,
        "p",
        "stage",
        &[
            s("dead"),
            now.to_string(),
            s("10000"),
            s("0"),
            s("http://a"),
        ],
    )
    .await;
    assert_eq!(words(&r), ["ok"]);
    // Another digest is told to wait while the claim is live.
    let r = run(&mut c, "p", "begin", &begin("live", now + 1_000, 2)).await;
    let w = words(&r);
    assert_eq!(w[0], "busy");
    let left: u64 = w[1].parse().unwrap();
    assert!((8_000..=9_000).contains(&left), "{left} ms left");
    // The same digest joins it.
    let r = run(&mut c, "p", "begin", &begin("dead", now + 1_000, 3)).await;
    assert_eq!(words(&r), ["go", "0"]);
    // Past the claim, another declaration takes over; the first one learns it lost.
    let later = now + 30_000;
    let r = run(&mut c, "p", "begin", &begin("live", later, 2)).await;
    assert_eq!(words(&r), ["go", "0"]);
    let r = run(
        &mut c,
        "p",
        "sweep",
        &[s("dead"), later.to_string(), s("10000"), s("0")],
    )
    .await;
    assert_eq!(words(&r), ["superseded"]);
    let cont = |mode: &str, extra: &[&str]| {
        let mut v = vec![s("live"), later.to_string(), s("10000")];
        v.extend(extra.iter().map(|x| x.to_string()));
        (mode.to_string(), v)
    };
    for (mode, args) in [
        cont("stage", &["0", "http://b", "http://c"]),
        cont("sweep", &["0"]),
        cont("apply", &["0"]),
        cont("finish", &[]),
    ] {
        let r = run(&mut c, "p", &mode, &args).await;
        let w = words(&r);
        assert!(
            w[0] == "ok" || (w[0] == "more" && w[1] == "0"),
            "{mode}: {w:?}"
        );
    }
    check_pool(
        &mut c,
        "p",
        &[UpstreamId::new("http://b"), UpstreamId::new("http://c")],
        false,
    )
    .await;
    // A joiner's late call learns the declaration is done; a new begin of it has nothing to do.
    let r = run(
        &mut c,
        "p",
        "apply",
        &[s("live"), later.to_string(), s("10000"), s("0")],
    )
    .await;
    assert_eq!(words(&r), ["done"]);
    let r = run(&mut c, "p", "begin", &begin("live", later, 2)).await;
    assert_eq!(words(&r), ["done"]);
    // A staged list with a member missing or twice is refused before anything is removed.
    let r = run(&mut c, "p", "begin", &begin("dup", later, 3)).await;
    assert_eq!(words(&r), ["go", "0"]);
    let _ = run(
        &mut c,
        "p",
        "stage",
        &[
            s("dup"),
            later.to_string(),
            s("10000"),
            s("0"),
            s("http://b"),
            s("http://b"),
        ],
    )
    .await;
    let script = redis::Script::new(CONFIGURE);
    let mut inv = script.prepare_invoke();
    for k in script_keys::CONFIGURE {
        inv.key(key("p", k));
    }
    inv.arg("sweep").arg("dup").arg(later).arg(10_000).arg("0");
    let err = inv
        .invoke_async::<redis::Value>(&mut c)
        .await
        .expect_err("a short list is refused");
    assert!(
        err.to_string().contains("duplicate or missing member"),
        "{err}"
    );
    assert_eq!(hash(&mut c, "p", "state").await.len(), 2, "nothing removed");
}

#[tokio::test]
async fn the_load_index_built_while_requests_run_matches_the_state() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let members = ids(0..4_000);
    // Instance a allocates least-used with a cap (so its leases are listed and counted live).
    let a = store(&redis.url(), "sd-a");
    let capped = PoolSpec {
        max_concurrency: Some(1_000),
        ..spec("lc", members.clone(), Strategy::LeastUsed)
    };
    a.configure(capped).await.unwrap();
    // Instance b switches the pool to least-connections while a's requests come and go: the
    // index is built in stages, and a's grants and releases move the entries made so far.
    let b = store(&redis.url(), "sd-b");
    let traffic = async {
        let mut held = Vec::new();
        let mut pairs = 0;
        for i in 0..400 {
            let got = a
                .acquire(
                    "lc",
                    Want::Any {
                        exclude: &[],
                        within: None,
                    },
                )
                .await
                .unwrap();
            if let Acquired::Granted(g) = got {
                if i % 3 == 0 {
                    held.push(g);
                } else {
                    a.release("lc", &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
                        .await
                        .unwrap();
                    pairs += 1;
                }
            }
            tokio::task::yield_now().await;
        }
        (held, pairs)
    };
    let (declared, (held, pairs)) = tokio::join!(
        b.configure(spec("lc", members.clone(), Strategy::LeastConnections)),
        traffic
    );
    declared.unwrap();
    assert!(pairs > 100, "only {pairs} pairs");
    // Releases go out in batches: wait (bounded) until the live counts are what is held.
    let want_live = held.len();
    let mut settled = false;
    for _ in 0..100 {
        let live = hash(&mut c, "lc", "live").await;
        let n: usize = live.values().map(|v| v.parse::<usize>().unwrap()).sum();
        if n == want_live {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(settled, "live counts did not settle");
    check_pool(&mut c, "lc", &members, true).await;
    // A least-connections acquire reads the index now: the member with no live lease and the
    // lowest allocation score, first in order.
    let g = granted(&b, "lc").await;
    let live = hash(&mut c, "lc", "live").await;
    assert_eq!(
        live.get(g.upstream.as_str()).map(String::as_str),
        Some("1"),
        "{g:?}"
    );
    assert_eq!(a.health(), "ok");
    assert_eq!(b.health(), "ok");
}

#[tokio::test]
async fn a_large_least_connections_pool_without_an_index_chooses_as_least_used() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let members = ids(0..1_500);
    let a = store(&redis.url(), "sd-a");
    a.configure(spec("nl", members.clone(), Strategy::LeastConnections))
        .await
        .unwrap();
    // Another instance, still on least-used, declares it last: the index is dropped.
    let b = store(&redis.url(), "sd-b");
    b.configure(spec("nl", members.clone(), Strategy::LeastUsed))
        .await
        .unwrap();
    // Least-used takes members[700], the least allocated; least-connections would pass it over
    // for its live leases.
    let mut scores = redis::cmd("ZADD");
    scores.arg(key("nl", "members"));
    for m in &members {
        scores.arg(5).arg(m.as_str());
    }
    scores.arg(2).arg(members[700].as_str());
    let _: () = scores.query_async(&mut c).await.unwrap();
    let _: () = redis::cmd("HSET")
        .arg(key("nl", "live"))
        .arg(members[700].as_str())
        .arg(3)
        .query_async(&mut c)
        .await
        .unwrap();
    let g = granted(&a, "nl").await;
    assert_eq!(g.upstream, members[700]);
    let meta = hash(&mut c, "nl", "meta").await;
    assert!(
        !meta.contains_key("load"),
        "the acquire built the index of a large pool"
    );
    assert_eq!(a.health(), "ok");
}
