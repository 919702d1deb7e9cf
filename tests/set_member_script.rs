//! `set_member.lua` applies one gateway's health decision to the shared pool. Decisions of two
//! gateways about one member can cross: one quarantines it while the other, not yet told,
//! degrades it (which keeps it in service with a higher cost). Applied last, the stale decision
//! would silently return a member the other gateway found serving captchas. The script takes the
//! level of service the deciding gateway last knew (ARGV[7]) and refuses a decision that brings
//! the member back towards service when that knowledge is out of date.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::RedisServer;
use poolgate::store::redis::script_keys;
use redis::aio::MultiplexedConnection;

const SCRIPT: &str = include_str!("../lua/set_member.lua");
const UP: &str = "http://u1";

fn keys(tag: &str) -> [String; 7] {
    script_keys::SET_MEMBER.map(|k| format!("t:{{{tag}}}:{k}"))
}

/// A pool with `UP` in the given state (`e|k|c|s|r`) and another member in service at score 7.
async fn setup(c: &mut MultiplexedConnection, tag: &str, state: &str) {
    let k = keys(tag);
    let mut pipe = redis::pipe();
    pipe.hset(&k[0], "n", 2)
        .hset(&k[1], UP, state)
        .hset(&k[1], "http://u2", "1|1|1|0|0")
        .zadd(&k[2], "http://u2", 7);
    if state.starts_with('1') {
        pipe.zadd(&k[2], UP, 3);
    }
    let _: () = pipe.query_async(c).await.unwrap();
}

/// Runs the script: `UP` to `setting` (`(eligible, keeps_sessions, cost)`), decided by a
/// gateway that believed the level `believed` (`""`: unconditionally).
async fn set(
    c: &mut MultiplexedConnection,
    tag: &str,
    setting: (u8, u8, u32),
    believed: &str,
) -> i64 {
    let script = redis::Script::new(SCRIPT);
    let mut inv = script.prepare_invoke();
    for k in keys(tag) {
        inv.key(k);
    }
    inv.arg(UP)
        .arg(setting.0)
        .arg(setting.1)
        .arg(setting.2)
        .arg(format!("t:{{{tag}}}:events"))
        .arg("gw-test")
        .arg(believed);
    inv.invoke_async(c).await.unwrap()
}

async fn state(c: &mut MultiplexedConnection, tag: &str) -> (String, Option<f64>) {
    let k = keys(tag);
    let s: String = redis::cmd("HGET")
        .arg(&k[1])
        .arg(UP)
        .query_async(c)
        .await
        .unwrap();
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(&k[2])
        .arg(UP)
        .query_async(c)
        .await
        .unwrap();
    (s, score)
}

#[tokio::test]
async fn a_decision_on_a_stale_view_does_not_bring_a_member_back() {
    let server = RedisServer::start().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();

    // Quarantined by another gateway; this one still believed it in service and degrades it.
    setup(&mut c, "stale", "0|1|1|5|0").await;
    assert_eq!(set(&mut c, "stale", (1, 1, 2), "0").await, 2, "refused");
    assert_eq!(state(&mut c, "stale").await, ("0|1|1|5|0".into(), None));
    // Nor does a stale quarantine weaken a death.
    setup(&mut c, "dead", "0|0|1|5|0").await;
    assert_eq!(set(&mut c, "dead", (0, 1, 1), "0").await, 2);
    assert_eq!(state(&mut c, "dead").await.0, "0|0|1|5|0");

    // Knowing it was quarantined, a gateway may return it (its cool-down ended): it comes back
    // at max(its old score, the lowest in service).
    setup(&mut c, "known", "0|1|1|5|0").await;
    assert_eq!(set(&mut c, "known", (1, 1, 1), "1").await, 1);
    assert_eq!(
        state(&mut c, "known").await,
        ("1|1|1|7|0".into(), Some(7.0))
    );

    // Without a belief (a restore after Redis lost its data) the setting applies as given.
    setup(&mut c, "restore", "0|1|1|5|0").await;
    assert_eq!(set(&mut c, "restore", (1, 1, 1), "").await, 1);
    assert_eq!(state(&mut c, "restore").await.1, Some(7.0));

    // A move further out of service always applies, whatever the gateway believed.
    setup(&mut c, "worse", "1|1|1|0|0").await;
    assert_eq!(set(&mut c, "worse", (0, 1, 1), "1").await, 1);
    assert_eq!(state(&mut c, "worse").await, ("0|1|1|3|0".into(), None));
    setup(&mut c, "dies", "0|1|1|5|0").await;
    assert_eq!(set(&mut c, "dies", (0, 0, 1), "0").await, 1);
    assert_eq!(state(&mut c, "dies").await.0, "0|0|1|5|0");

    // So does a cost change of a member in service, and a setting it already has is no change.
    setup(&mut c, "cost", "1|1|1|0|0").await;
    assert_eq!(set(&mut c, "cost", (1, 1, 3), "1").await, 1);
    assert_eq!(state(&mut c, "cost").await.0, "1|1|3|0|0");
    assert_eq!(set(&mut c, "cost", (1, 1, 3), "0").await, 0);
}
