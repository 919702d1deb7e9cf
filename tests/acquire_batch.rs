//! `acquire.lua`'s `many` mode decides a batch of plain acquires on a copy of the pool that each
//! grant updates, and writes the whole batch at the end. These tests hold it to its contract:
//! every reply, and the state left behind, are exactly what the same acquires give when each
//! runs as its own call (`any` mode), one after another, on an identical copy of the pool.
//!
//! The `many-within` mode holds to the same contract against single `within` acquires inside a
//! label filter's subset, and the `tally` mode (n unlisted acquires counted, not listed one by
//! one) against n single acquires: the same count for each upstream, in the order of its first
//! grant, and the same state.
//!
//! Each case builds two copies of one pool under different hash tags of one test-started Redis,
//! runs the batch on one and the single acquires on the other, and compares replies and keys.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::RedisServer;
use poolgate::store::redis::script_keys;
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Value};

const SCRIPT: &str = include_str!("../lua/acquire.lua");
const NOW: u64 = 1_000_000;
const DEADLINE: u64 = 1_060_000;

/// One member: id, eligible, cost, allocation score, live leases.
struct Member {
    id: &'static str,
    eligible: bool,
    cost: u32,
    score: u64,
    live: u32,
}

fn m(id: &'static str, cost: u32, score: u64, live: u32) -> Member {
    Member {
        id,
        eligible: true,
        cost,
        score,
        live,
    }
}

/// `n` members `u00`, `u01`, …; `of(i)` gives the i-th one's cost, score and live leases.
fn numbered(n: usize, of: impl Fn(usize) -> (u32, u64, u32)) -> Vec<Member> {
    (0..n)
        .map(|i| {
            let (cost, score, live) = of(i);
            m(
                Box::leak(format!("u{i:02}").into_boxed_str()),
                cost,
                score,
                live,
            )
        })
        .collect()
}

fn keys(tag: &str) -> Vec<String> {
    script_keys::ACQUIRE
        .iter()
        .map(|k| format!("t:{{{tag}}}:{k}"))
        .collect()
}

async fn setup(c: &mut MultiplexedConnection, tag: &str, members: &[Member], taken: &[&str]) {
    let k = keys(tag);
    let mut pipe = redis::pipe();
    pipe.hset(&k[0], "rr", "0");
    for (i, mb) in members.iter().enumerate() {
        let state = format!(
            "{}|1|{}|{}|0",
            u8::from(mb.eligible),
            mb.cost,
            if mb.eligible { 0 } else { mb.score }
        );
        pipe.hset(&k[1], mb.id, state);
        if mb.eligible {
            pipe.zadd(&k[2], mb.id, mb.score);
        }
        pipe.zadd(&k[3], mb.id, i);
        if mb.live > 0 {
            pipe.hset(&k[6], mb.id, mb.live);
        }
    }
    for id in taken {
        // A lease of another gateway, far from expiring.
        pipe.hset(&k[5], *id, members[0].id);
        pipe.zadd(&k[4], *id, DEADLINE + 1_000);
        pipe.hincr(&k[6], members[0].id, 1);
    }
    let _: () = pipe.query_async(c).await.expect("setup");
}

fn invocation<'a>(
    script: &'a redis::Script,
    tag: &str,
    lease: &str,
    cap: u32,
    strategy: &str,
    mode: &str,
) -> redis::ScriptInvocation<'a> {
    let mut inv = script.prepare_invoke();
    for k in keys(tag) {
        inv.key(k);
    }
    inv.arg(NOW.to_string())
        .arg(lease)
        .arg(DEADLINE.to_string())
        .arg(cap.to_string())
        .arg(strategy)
        .arg(format!("t:{{{tag}}}:events"))
        .arg(mode);
    inv
}

/// A sorted set's members with their scores, in its order.
async fn zset(c: &mut MultiplexedConnection, key: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(c)
        .await
        .expect(key)
}

/// A hash's fields and values, sorted.
async fn hash(c: &mut MultiplexedConnection, key: &str) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = c.hgetall(key).await.expect(key);
    all.sort();
    all
}

/// Everything the script writes, as text, for comparison.
async fn dump(c: &mut MultiplexedConnection, tag: &str) -> Vec<String> {
    let k = keys(tag);
    // The cursors (round-robin's, the pool's and a subset's) hold the other copy's key name.
    let mut meta: Vec<(String, String)> = hash(c, &k[0])
        .await
        .into_iter()
        .map(|(f, v)| (f.replace(tag, "TAG"), v))
        .collect();
    meta.sort();
    vec![
        format!("members {:?}", zset(c, &k[2]).await),
        format!("leases {:?}", zset(c, &k[4]).await),
        format!("lease_up {:?}", hash(c, &k[5]).await),
        format!("live {:?}", hash(c, &k[6]).await),
        format!("state {:?}", hash(c, &k[1]).await),
        format!("subset {:?}", zset(c, &subset_key(tag)).await),
        format!("meta {meta:?}"),
    ]
}

/// The key of a label filter's subset (`acquire.lua`'s last key in the within modes).
fn subset_key(tag: &str) -> String {
    format!("t:{{{tag}}}:subset:country=us#1")
}

/// Another gateway's report of unlisted leases (see `report.lua`): its deadline and lines.
struct Report {
    instance: &'static str,
    deadline: u64,
    lines: &'static str,
}

async fn add_reports(c: &mut MultiplexedConnection, tag: &str, reports: &[Report]) {
    let k = keys(tag);
    for r in reports {
        let _: () = redis::pipe()
            .zadd(&k[8], r.instance, r.deadline)
            .hset(&k[9], r.instance, r.lines)
            .query_async(c)
            .await
            .expect("report");
    }
}

async fn connect(redis: &RedisServer) -> MultiplexedConnection {
    redis::Client::open(redis.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

/// Runs `ids` as one batch and as single acquires on two copies of `members`; asserts that
/// replies and state agree, and returns the replies.
async fn same_as_single_runs(
    members: &[Member],
    taken: &[&str],
    ids: &[&str],
    cap: u32,
    strategy: &str,
) -> Vec<String> {
    same_as_single_runs_with(members, taken, &[], ids, cap, strategy).await
}

/// [`same_as_single_runs`] with other gateways' `reports` of unlisted leases.
async fn same_as_single_runs_with(
    members: &[Member],
    taken: &[&str],
    reports: &[Report],
    ids: &[&str],
    cap: u32,
    strategy: &str,
) -> Vec<String> {
    compare(members, taken, reports, None, ids, cap, strategy).await
}

/// Runs `ids` as one `many-within` batch and as single `within` acquires inside a subset of
/// `subset` members with the allocation scores `subset_scores` (by position); the contract of
/// [`same_as_single_runs`].
async fn same_as_single_runs_within(
    members: &[Member],
    subset: &[(&str, u64)],
    ids: &[&str],
    cap: u32,
    strategy: &str,
) -> Vec<String> {
    compare(members, &[], &[], Some(subset), ids, cap, strategy).await
}

/// Sets up the two copies of one pool, `batch` and `single`: its members, other gateways' leases
/// and reports, and a label filter's subset when there is one.
async fn two_copies(
    c: &mut MultiplexedConnection,
    members: &[Member],
    taken: &[&str],
    reports: &[Report],
    subset: Option<&[(&str, u64)]>,
) {
    for tag in ["batch", "single"] {
        setup(c, tag, members, taken).await;
        add_reports(c, tag, reports).await;
        for (id, score) in subset.unwrap_or_default() {
            let _: () = c.zadd(subset_key(tag), *id, *score).await.expect("subset");
        }
    }
}

/// A batch on the `batch` copy: `mode`, or `<mode>-within` naming the subset.
fn batch_acquire<'a>(
    script: &'a redis::Script,
    cap: u32,
    strategy: &str,
    mode: &str,
    within: bool,
) -> redis::ScriptInvocation<'a> {
    if !within {
        return invocation(script, "batch", "-", cap, strategy, mode);
    }
    let mut inv = invocation(
        script,
        "batch",
        "-",
        cap,
        strategy,
        &format!("{mode}-within"),
    );
    inv.key(subset_key("batch"));
    inv
}

/// A single acquire on the `single` copy: `any`, or `within` the subset (nothing excluded, the
/// subset named only).
fn single_acquire<'a>(
    script: &'a redis::Script,
    lease: &str,
    cap: u32,
    strategy: &str,
    within: bool,
) -> redis::ScriptInvocation<'a> {
    if !within {
        return invocation(script, "single", lease, cap, strategy, "any");
    }
    let mut inv = invocation(script, "single", lease, cap, strategy, "within");
    inv.key(subset_key("single")).arg("0");
    inv
}

async fn compare(
    members: &[Member],
    taken: &[&str],
    reports: &[Report],
    subset: Option<&[(&str, u64)]>,
    ids: &[&str],
    cap: u32,
    strategy: &str,
) -> Vec<String> {
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let script = redis::Script::new(SCRIPT);
    two_copies(&mut c, members, taken, reports, subset).await;
    let within = subset.is_some();
    let mut inv = batch_acquire(&script, cap, strategy, "many", within);
    for id in ids {
        inv.arg(*id);
    }
    let batch: Result<Value, _> = inv.invoke_async(&mut c).await;
    let mut single = Vec::new();
    for id in ids {
        let inv = single_acquire(&script, id, cap, strategy, within);
        let reply: Value = match inv.invoke_async(&mut c).await {
            Ok(v) => v,
            Err(e) => Value::SimpleString(format!("error {}", e.code().unwrap_or("?"))),
        };
        single.push(reply);
    }
    // A single run's reply is a list, a batch's is one line per acquire (`granted <bound>
    // <upstream>`, `cap <ms>`, `none`): both are shown as the line.
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    };
    let shown = |v: &Value| match v {
        Value::ServerError(e) => format!("error {}", e.code()),
        Value::Array(parts) => {
            let parts: Vec<String> = parts.iter().map(text).collect();
            match parts.as_slice() {
                [kind, up, bound] if kind == "granted" => format!("granted {bound} {up}"),
                _ => parts.join(" "),
            }
        }
        other => text(other),
    };
    let single: Vec<String> = single.iter().map(shown).collect();
    let batch: Vec<String> = match batch {
        Ok(Value::Array(batch)) => batch.iter().map(shown).collect(),
        // An id already in use is a caller's bug (ids are 63 random bits): the reply list then
        // holds an error, and the client takes the whole call as failed.
        Err(e) if e.code() == Some("ERR") && e.to_string().contains("lease id in use") => {
            assert!(single.iter().any(|r| r.contains("error")), "{single:?}");
            single.clone()
        }
        other => panic!("batch reply is not a list: {other:?}"),
    };
    assert_eq!(batch, single, "replies differ");
    assert_same_state(&mut c).await;
    batch
}

/// Both copies left in the same state.
async fn assert_same_state(c: &mut MultiplexedConnection) {
    assert_eq!(
        dump(c, "batch").await,
        dump(c, "single").await,
        "state differs"
    );
}

/// Equal scores everywhere: ties go by byte order, where `B` < `a` < `a-1` < `a_1` < `b` (a
/// locale-aware order would put them otherwise).
fn ties_in_byte_order() -> [Member; 5] {
    [
        m("b", 1, 0, 0),
        m("a_1", 1, 0, 0),
        m("a-1", 1, 0, 0),
        m("B", 1, 0, 0),
        m("a", 1, 0, 0),
    ]
}

#[tokio::test]
async fn least_used_batch_with_ties_in_byte_order() {
    let members = ties_in_byte_order();
    let ids: Vec<String> = (1..=23).map(|i| format!("L{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let replies = same_as_single_runs(&members, &[], &ids, 0, "least-used").await;
    assert_eq!(replies[0], "granted 0 B");
    assert!(replies.iter().all(|r| r.contains("granted")), "{replies:?}");
}

#[tokio::test]
async fn weighted_costs_and_uneven_scores() {
    let members = [
        m("http://10.0.0.1:8080", 3, 7, 0),
        m("http://10.0.0.2:8080", 1, 9, 0),
        m("http://10.0.0.3:8080", 2, 0, 0),
        m("http://10.0.0.10:8080", 1, 12, 0),
    ];
    let ids: Vec<String> = (1..=40).map(|i| format!("{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    same_as_single_runs(&members, &[], &ids, 0, "weighted").await;
    same_as_single_runs(&members, &[], &ids, 0, "least-used").await;
}

#[tokio::test]
async fn caps_fill_up_and_then_every_acquire_gets_the_earliest_deadline() {
    // cap 3: `x` has 2 live leases, `y` 1, `z` none; seven grants fit, the rest are refused.
    let members = [m("x", 1, 0, 2), m("y", 1, 5, 1), m("z", 1, 9, 0)];
    let ids: Vec<String> = (1..=10).map(|i| format!("c{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let replies = same_as_single_runs(&members, &[], &ids, 3, "least-used").await;
    let granted = replies.iter().filter(|r| r.contains("granted")).count();
    assert_eq!(granted, 6, "{replies:?}");
    assert!(replies[9].contains("cap"), "{}", replies[9]);
}

#[tokio::test]
async fn a_lease_id_in_use_is_refused_alone() {
    // `old` is another gateway's lease; `dup` comes twice in the batch.
    let members = [m("p", 1, 0, 0), m("q", 1, 0, 0)];
    let ids = ["n1", "old", "dup", "n2", "dup", "n3"];
    let replies = same_as_single_runs(&members, &["old"], &ids, 0, "least-used").await;
    assert!(replies[1].contains("error"), "{replies:?}");
    assert!(replies[4].contains("error"), "{replies:?}");
    assert_eq!(replies.iter().filter(|r| r.contains("granted")).count(), 4);
}

#[tokio::test]
async fn ineligible_members_and_an_empty_pool() {
    let mut members = vec![m("e1", 1, 0, 0), m("e2", 2, 0, 0)];
    members.push(Member {
        id: "out",
        eligible: false,
        cost: 1,
        score: 4,
        live: 0,
    });
    let ids = ["a", "b", "c", "d", "e"];
    same_as_single_runs(&members, &[], &ids, 0, "least-used").await;
    let only_out = [Member {
        id: "out",
        eligible: false,
        cost: 1,
        score: 4,
        live: 0,
    }];
    let replies = same_as_single_runs(&only_out, &[], &ids, 0, "least-used").await;
    assert!(replies.iter().all(|r| r.contains("none")), "{replies:?}");
}

#[tokio::test]
async fn a_pool_larger_than_one_chunk_is_decided_acquire_by_acquire() {
    let members = numbered(70, |i| (1, (i % 3) as u64, 0));
    let leases: Vec<String> = (1..=30).map(|i| format!("l{i}")).collect();
    let leases: Vec<&str> = leases.iter().map(String::as_str).collect();
    same_as_single_runs(&members, &[], &leases, 0, "least-used").await;
}

#[tokio::test]
async fn a_large_pool_under_a_cap_is_decided_past_the_members_read_first() {
    // 70 members with a cap of 1: the batch outgrows the lowest 65 read at its start, walks the
    // rest of the ZSET, and then every member is at its cap.
    let members = numbered(70, |i| {
        (1 + (i % 2) as u32, (i % 5) as u64, u32::from(i % 7 == 0))
    });
    let leases: Vec<String> = (1..=75).map(|i| format!("l{i}")).collect();
    let leases: Vec<&str> = leases.iter().map(String::as_str).collect();
    let replies = same_as_single_runs(&members, &[], &leases, 1, "least-used").await;
    let granted = replies.iter().filter(|r| r.contains("granted")).count();
    assert_eq!(granted, 70 - 10, "{replies:?}");
    assert!(replies[74].contains("cap"), "{}", replies[74]);
}

#[tokio::test]
async fn costs_and_caps_bind_together_within_the_members_read() {
    // cap 4 with costs 1-3, uneven scores and live leases: members run out of room at different
    // keys, ties among those left included; 30 acquires outgrow the 20 places.
    let members = numbered(8, |i| {
        (
            1 + (i % 3) as u32,
            [0, 2, 2, 5, 0, 7, 2, 1][i],
            (i % 4) as u32,
        )
    });
    let ids: Vec<String> = (1..=30).map(|i| format!("k{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    for strategy in ["least-used", "weighted"] {
        let replies = same_as_single_runs(&members, &[], &ids, 4, strategy).await;
        let granted = replies.iter().filter(|r| r.contains("granted")).count();
        assert_eq!(granted, 32 - 12, "{strategy}: {replies:?}");
    }
}

#[tokio::test]
async fn members_at_their_cap_among_the_lowest_leave_grants_to_members_beyond() {
    // 100 members under a cap of 2: the 12 lowest (score 0) are at their cap but for two with
    // one place each, so ten of a batch of 12 go to members the batch did not read first.
    let members = numbered(100, |i| match i {
        3 | 7 => (1, 0, 1),
        0..12 => (1, 0, 2),
        _ => (1, 5, 0),
    });
    let ids: Vec<String> = (1..=12).map(|i| format!("b{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let replies = same_as_single_runs(&members, &[], &ids, 2, "least-used").await;
    assert!(replies.iter().all(|r| r.contains("granted")), "{replies:?}");
}

#[tokio::test]
async fn unlisted_leases_count_their_allocations_and_record_nothing() {
    // "-" asks for an unlisted lease; `r1` and `r2` are listed leases in the same batch.
    let members = [m("a", 1, 0, 0), m("b", 2, 1, 0), m("c", 1, 3, 0)];
    let ids = ["-", "-", "r1", "-", "-", "r2", "-", "-", "-"];
    let replies = same_as_single_runs(&members, &[], &ids, 0, "least-used").await;
    assert!(replies.iter().all(|r| r.contains("granted")), "{replies:?}");
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    setup(&mut c, "one", &members, &[]).await;
    let script = redis::Script::new(SCRIPT);
    let mut inv = invocation(&script, "one", "-", 0, "least-used", "many");
    for id in ids {
        inv.arg(id);
    }
    let _: Value = inv.invoke_async(&mut c).await.expect("batch");
    let dumped = dump(&mut c, "one").await;
    let listed = vec![
        ("r1".to_string(), DEADLINE as f64),
        ("r2".to_string(), DEADLINE as f64),
    ];
    assert_eq!(
        dumped[1],
        format!("leases {listed:?}"),
        "only r1 and r2 are listed"
    );
    assert!(!dumped[2].contains("\"-\""), "{dumped:?}");
    let live: Vec<u64> = redis::cmd("HVALS")
        .arg("t:{one}:live")
        .query_async(&mut c)
        .await
        .expect("live");
    assert_eq!(
        live.iter().sum::<u64>(),
        2,
        "only the listed ones are live: {dumped:?}"
    );
    // Nine allocations in all, whichever the lease.
    let total: f64 = redis::cmd("ZRANGE")
        .arg("t:{one}:members")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async::<Vec<(String, f64)>>(&mut c)
        .await
        .expect("scores")
        .iter()
        .map(|(_, s)| s)
        .sum();
    assert_eq!(total, 4.0 + 9.0 + 2.0, "{dumped:?}");
}

#[tokio::test]
async fn a_cap_counts_the_unlisted_leases_other_gateways_report() {
    // cap 3: another gateway reports 2 unlisted leases on `x`; the report of a gateway that died
    // (its deadline passed) no longer counts its 5 on `y`.
    let members = [m("x", 1, 0, 0), m("y", 1, 5, 0), m("z", 1, 9, 0)];
    let reports = [
        Report {
            instance: "alive",
            deadline: NOW + 5_000,
            lines: "2 x\n1 z",
        },
        Report {
            instance: "dead",
            deadline: NOW,
            lines: "5 y",
        },
    ];
    let ids: Vec<String> = (1..=10).map(|i| format!("c{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let replies = same_as_single_runs_with(&members, &[], &reports, &ids, 3, "least-used").await;
    let granted: Vec<&String> = replies.iter().filter(|r| r.contains("granted")).collect();
    assert_eq!(granted.len(), 1 + 3 + 2, "{replies:?}");
    assert_eq!(
        granted.iter().filter(|r| r.ends_with(" x")).count(),
        1,
        "{replies:?}"
    );
    assert!(replies[9].contains("cap"), "{}", replies[9]);
}

/// A subset of five of eight members under a cap of 2, with uneven allocation scores through the
/// filter: least-used and weighted fill the subset's members in its order, then every acquire
/// is refused with the earliest deadline; members outside it are never taken.
#[tokio::test]
async fn within_a_subset_caps_fill_up_in_the_subsets_order() {
    let members = numbered(8, |i| {
        (1 + (i % 3) as u32, (i % 4) as u64, u32::from(i == 2))
    });
    let subset = [("u01", 4), ("u02", 0), ("u04", 1), ("u06", 1), ("u07", 9)];
    let ids: Vec<String> = (1..=13).map(|i| format!("w{i}")).collect();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    for strategy in ["least-used", "weighted"] {
        let replies = same_as_single_runs_within(&members, &subset, &ids, 2, strategy).await;
        let granted: Vec<&String> = replies.iter().filter(|r| r.contains("granted")).collect();
        assert_eq!(granted.len(), 9, "u02 had one live lease: {replies:?}");
        assert!(
            granted
                .iter()
                .all(|r| subset.iter().any(|(id, _)| r.ends_with(id))),
            "{replies:?}"
        );
        assert!(replies[12].starts_with("cap"), "{replies:?}");
    }
}

/// Round-robin walks the subset from its own cursor (kept in the meta hash), and
/// least-connections weighs the subset's live leases; listed and unlisted leases mixed.
#[tokio::test]
async fn within_a_subset_round_robin_and_least_connections() {
    let members = numbered(6, |i| (1, i as u64, (i % 2) as u32));
    let subset = [("u00", 0), ("u01", 0), ("u03", 0), ("u04", 0)];
    let ids = ["a", "-", "b", "c", "-", "d", "e", "-", "f"];
    let replies = same_as_single_runs_within(&members, &subset, &ids, 0, "round-robin").await;
    assert!(replies.iter().all(|r| r.contains("granted")), "{replies:?}");
    let replies = same_as_single_runs_within(&members, &subset, &ids, 3, "least-connections").await;
    assert!(replies.iter().all(|r| r.contains("granted")), "{replies:?}");
    // Unlisted leases leave the loads equal: the allocations decide, each grant raising its own.
    let even = numbered(6, |_| (1, 0, 0));
    let ids = ["-"; 8];
    let replies = same_as_single_runs_within(&even, &subset, &ids, 0, "least-connections").await;
    let firsts: Vec<&str> = replies[..4].iter().map(|r| &r[10..]).collect();
    assert_eq!(firsts, ["u00", "u01", "u03", "u04"], "{replies:?}");
}

/// A subset that expired (or that Redis lost) is answered `nosubset` for every acquire of the
/// batch, and nothing is written: the gateway asks again with the members.
#[tokio::test]
async fn a_missing_subset_is_answered_for_the_whole_batch_and_nothing_written() {
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let members = numbered(3, |_| (1, 0, 0));
    setup(&mut c, "gone", &members, &[]).await;
    let before = dump(&mut c, "gone").await;
    let script = redis::Script::new(SCRIPT);
    let mut inv = invocation(&script, "gone", "-", 0, "least-used", "many-within");
    inv.key(subset_key("gone"));
    for id in ["x1", "-", "x2"] {
        inv.arg(id);
    }
    let replies: Vec<String> = inv.invoke_async(&mut c).await.expect("batch");
    assert_eq!(replies, ["nosubset"; 3]);
    assert_eq!(dump(&mut c, "gone").await, before);
    // Without the subset's key the call is refused before anything runs.
    let mut inv = invocation(&script, "gone", "-", 0, "least-used", "many-within");
    let refused: Result<Value, _> = inv.arg("x3").invoke_async(&mut c).await;
    assert!(refused.is_err(), "{refused:?}");
}

/// Runs a `tally` of `n` and `n` single unlisted acquires on two copies of `members` (`setup` as
/// given, then `prepare` on each copy); asserts that the counts per upstream, in the order of each
/// one's first grant, and the state agree, and returns the tally's reply.
async fn tally_as_single_runs(
    members: &[Member],
    n: usize,
    strategy: &str,
    prepare: &[(&str, &str, &str)],
) -> Vec<String> {
    tally_compare(members, None, n, strategy, prepare).await
}

/// [`tally_as_single_runs`] for a `tally-within` against single `within` acquires inside a subset
/// of `subset` members with these allocation scores.
async fn tally_within_as_single_runs(
    members: &[Member],
    subset: &[(&str, u64)],
    n: usize,
    strategy: &str,
) -> Vec<String> {
    tally_compare(members, Some(subset), n, strategy, &[]).await
}

async fn tally_compare(
    members: &[Member],
    subset: Option<&[(&str, u64)]>,
    n: usize,
    strategy: &str,
    prepare: &[(&str, &str, &str)],
) -> Vec<String> {
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let script = redis::Script::new(SCRIPT);
    two_copies(&mut c, members, &[], &[], subset).await;
    for tag in ["batch", "single"] {
        // Raw writes: (key suffix, member, score) into a sorted set of the pool's.
        for (key, member, score) in prepare {
            let _: () = redis::cmd("ZADD")
                .arg(format!("t:{{{tag}}}:{key}"))
                .arg(*score)
                .arg(*member)
                .query_async(&mut c)
                .await
                .expect("prepare");
        }
    }
    let within = subset.is_some();
    let mut inv = batch_acquire(&script, 0, strategy, "tally", within);
    let tally: Vec<String> = inv.arg(n).invoke_async(&mut c).await.expect("tally");
    let mut counted: Vec<(String, usize)> = Vec::new();
    for _ in 0..n {
        let inv = single_acquire(&script, "-", 0, strategy, within);
        let reply: Vec<String> = inv.invoke_async(&mut c).await.expect("single");
        if let [kind, up, _] = reply.as_slice() {
            assert_eq!(kind, "granted", "{reply:?}");
            match counted.iter_mut().find(|(u, _)| u == up) {
                Some((_, k)) => *k += 1,
                None => counted.push((up.clone(), 1)),
            }
        } else {
            assert_eq!(reply, ["none"]);
        }
    }
    let single: Vec<String> = counted
        .into_iter()
        .flat_map(|(up, k)| [up, k.to_string()])
        .collect();
    assert_eq!(tally, single, "counts differ");
    assert_same_state(&mut c).await;
    tally
}

#[tokio::test]
async fn a_tally_counts_ties_in_byte_order() {
    let members = ties_in_byte_order();
    // Fewer acquires than members, a round and a part, several rounds.
    for n in [3, 7, 23] {
        let tally = tally_as_single_runs(&members, n, "least-used", &[]).await;
        assert_eq!(tally[0], "B", "{tally:?}");
    }
    // Uneven scores: ties between members that started apart.
    let uneven = [
        m("b", 1, 2, 0),
        m("a", 1, 0, 0),
        m("c", 1, 1, 0),
        m("A", 1, 3, 0),
    ];
    for n in [1, 2, 5, 6, 11] {
        tally_as_single_runs(&uneven, n, "least-used", &[]).await;
    }
}

#[tokio::test]
async fn a_tally_weighs_costs_and_uneven_scores() {
    let members = [
        m("http://10.0.0.1:8080", 3, 7, 0),
        m("http://10.0.0.2:8080", 1, 9, 0),
        m("http://10.0.0.3:8080", 2, 0, 0),
        m("http://10.0.0.10:8080", 1, 12, 0),
    ];
    for n in [1, 4, 13, 40, 128] {
        tally_as_single_runs(&members, n, "weighted", &[]).await;
        tally_as_single_runs(&members, n, "least-used", &[]).await;
    }
}

#[tokio::test]
async fn a_tally_over_a_pool_larger_than_it_reads_only_the_lowest() {
    // 70 members, 30 acquires: only the 30 lowest can be chosen.
    let members = numbered(70, |i| (1 + (i % 3) as u32, (i * 7 % 11) as u64, 0));
    tally_as_single_runs(&members, 30, "least-used", &[]).await;
    tally_as_single_runs(&members, 30, "weighted", &[]).await;
    tally_as_single_runs(&members, 200, "least-used", &[]).await;
}

#[tokio::test]
async fn a_tally_decides_one_by_one_where_it_cannot_count() {
    let members = [m("a", 1, 0, 0), m("b", 2, 1, 0), m("c", 1, 3, 0)];
    // A member in the ZSET without a state (skipped by every acquire), and a fractional score.
    let odd = [("members", "ghost", "0"), ("members", "c", "1.5")];
    tally_as_single_runs(&members, 9, "least-used", &odd).await;
    tally_as_single_runs(&members, 9, "least-used", &odd[1..]).await;
}

#[tokio::test]
async fn a_tally_of_an_empty_or_unconfigured_pool_and_bad_arguments() {
    let out = [Member {
        id: "out",
        eligible: false,
        cost: 1,
        score: 4,
        live: 0,
    }];
    let tally = tally_as_single_runs(&out, 4, "least-used", &[]).await;
    assert!(tally.is_empty(), "{tally:?}");
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    let script = redis::Script::new(SCRIPT);
    let mut inv = invocation(&script, "never", "-", 0, "least-used", "tally");
    let reply: Vec<String> = inv.arg(5).invoke_async(&mut c).await.expect("tally");
    assert_eq!(reply, ["unconfigured"]);
    setup(&mut c, "p", &[m("a", 1, 0, 0)], &[]).await;
    let before = dump(&mut c, "p").await;
    for (cap, strategy, n) in [
        (1, "least-used", "5"),
        (0, "round-robin", "5"),
        (0, "least-connections", "5"),
        (0, "least-used", "0"),
        (0, "least-used", "2.5"),
        (0, "least-used", "x"),
    ] {
        let mut inv = invocation(&script, "p", "-", cap, strategy, "tally");
        let refused: Result<Value, _> = inv.arg(n).invoke_async(&mut c).await;
        assert!(refused.is_err(), "{cap} {strategy} {n}: {refused:?}");
    }
    assert_eq!(dump(&mut c, "p").await, before, "a refused tally wrote");
}

#[tokio::test]
async fn a_tally_within_a_subset_counts_its_scores_and_the_pools() {
    // The subset's allocation scores differ from the pool's; `out` is in the subset but out of
    // service, `ghost` has no state: both are passed over.
    let mut members = vec![
        m("b", 1, 9, 0),
        m("a", 2, 0, 0),
        m("c", 1, 4, 0),
        m("d", 1, 1, 0),
    ];
    members.push(Member {
        id: "out",
        eligible: false,
        cost: 1,
        score: 0,
        live: 0,
    });
    let subset = [("a", 3), ("b", 0), ("out", 0), ("c", 1), ("ghost", 0)];
    for n in [1, 2, 7, 30] {
        tally_within_as_single_runs(&members, &subset, n, "least-used").await;
        tally_within_as_single_runs(&members, &subset, n, "weighted").await;
    }
    // Of a large subset only the lowest are read; one passed over among them sends the call
    // acquire by acquire.
    let many = numbered(70, |i| (1 + (i % 2) as u32, (i % 9) as u64, 0));
    let ids: Vec<String> = (0..70).map(|i| format!("u{i:02}")).collect();
    let large: Vec<(&str, u64)> = ids.iter().map(|id| (id.as_str(), 0)).collect();
    tally_within_as_single_runs(&many, &large[..40], 12, "least-used").await;
    let mut with_out = members;
    with_out.extend(numbered(3, |_| (1, 0, 0)));
    let crowded = [("out", 0), ("u00", 0), ("u01", 0), ("u02", 0), ("a", 0)];
    tally_within_as_single_runs(&with_out, &crowded, 2, "least-used").await;
    let none =
        tally_within_as_single_runs(&with_out, &[("out", 0), ("ghost", 0)], 3, "least-used").await;
    assert!(none.is_empty(), "{none:?}");
}

#[tokio::test]
async fn a_tally_within_a_missing_subset_asks_for_it() {
    let redis = RedisServer::start().await;
    let mut c = connect(&redis).await;
    setup(&mut c, "gone", &numbered(3, |_| (1, 0, 0)), &[]).await;
    let before = dump(&mut c, "gone").await;
    let script = redis::Script::new(SCRIPT);
    let mut inv = invocation(&script, "gone", "-", 0, "least-used", "tally-within");
    inv.key(subset_key("gone"));
    let reply: Vec<String> = inv.arg(4).invoke_async(&mut c).await.expect("tally");
    assert_eq!(reply, ["nosubset"]);
    assert_eq!(dump(&mut c, "gone").await, before);
    let mut inv = invocation(&script, "gone", "-", 0, "least-used", "tally-within");
    let refused: Result<Value, _> = inv.arg(4).invoke_async(&mut c).await;
    assert!(refused.is_err(), "without the subset's key: {refused:?}");
}
