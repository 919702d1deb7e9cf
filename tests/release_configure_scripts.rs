//! Two scripts held to what `acquire.lua` assumes:
//! - `release.lua` judges "this release freed capacity" the way `acquire.lua` judges "at its
//!   cap": listed leases plus the unlisted ones other gateways report. Right after a reload adds
//!   a cap, older leases are still unlisted; a release that brings the upstream below its cap
//!   must wake the waiting requests (publish "r", return 1), and one that leaves it at its cap
//!   must not.
//! - `configure.lua`, which every gateway runs at start, keeps the round-robin cursor instead of
//!   sending the pool's next requests back to its first members.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::RedisServer;
use poolgate::store::redis::script_keys;
use redis::aio::MultiplexedConnection;

const RELEASE: &str = include_str!("../lua/release.lua");
const CONFIGURE: &str = include_str!("../lua/configure.lua");
const UP: &str = "http://u1";

fn key(tag: &str, k: &str) -> String {
    format!("t:{{{tag}}}:{k}")
}

/// One listed lease `l1` on `UP`, and another gateway's report of `unlisted` leases on it.
async fn setup(c: &mut MultiplexedConnection, tag: &str, unlisted: u32, now: u64) {
    let mut pipe = redis::pipe();
    pipe.zadd(key(tag, "leases"), "l1", now + 60_000)
        .hset(key(tag, "lease_up"), "l1", UP)
        .hset(key(tag, "live"), UP, 1)
        .zadd(key(tag, "instances"), "gw-other", now + 60_000);
    if unlisted > 0 {
        pipe.hset(key(tag, "held"), "gw-other", format!("{unlisted} {UP}\n"));
    }
    let _: () = pipe.query_async(c).await.unwrap();
}

/// Releases `l1` under `cap`; returns the script's answer (1: capacity freed).
async fn release(c: &mut MultiplexedConnection, tag: &str, cap: u32, now: u64) -> i64 {
    let script = redis::Script::new(RELEASE);
    let mut inv = script.prepare_invoke();
    for k in script_keys::RELEASE {
        inv.key(key(tag, k));
    }
    inv.arg(cap)
        .arg(key(tag, "events"))
        .arg(1)
        .arg("l1")
        .arg(now);
    inv.invoke_async(c).await.unwrap()
}

#[tokio::test]
async fn a_release_wakes_waiters_when_it_brings_the_upstream_below_its_cap_counting_reports() {
    common::init_tracing();
    let server = RedisServer::start().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let now = 1_000_000;

    // Cap 2: one listed lease and one unlisted reported by another gateway make it full; the
    // release frees a place. Counting listed leases only, it would never have been "at its cap".
    setup(&mut c, "a", 1, now).await;
    assert_eq!(release(&mut c, "a", 2, now).await, 1, "capacity freed");

    // Cap 2 with two unlisted leases reported: still at its cap after the release.
    setup(&mut c, "b", 2, now).await;
    assert_eq!(release(&mut c, "b", 2, now).await, 0, "still at its cap");

    // A report whose gateway's deadline has passed counts for nothing (as in acquire.lua).
    setup(&mut c, "c", 5, now).await;
    let _: () = redis::cmd("ZADD")
        .arg(key("c", "instances"))
        .arg(now - 1)
        .arg("gw-other")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(release(&mut c, "c", 1, now).await, 1);

    // The lease is gone either way, and the live count with it.
    let live: Option<u32> = redis::cmd("HGET")
        .arg(key("a", "live"))
        .arg(UP)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(live, None);
}

#[tokio::test]
async fn configure_keeps_the_round_robin_cursor_across_instance_starts() {
    common::init_tracing();
    let server = RedisServer::start().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let tag = "rr";
    let script = redis::Script::new(CONFIGURE);
    let configure = |members: &[&str]| {
        let mut inv = script.prepare_invoke();
        for k in script_keys::CONFIGURE {
            inv.key(key(tag, k));
        }
        // One call ("all"); the digest is any token that differs with the member list.
        inv.arg("all").arg("round-robin").arg(members.join(" "));
        for m in members {
            inv.arg(*m);
        }
        inv
    };
    let members = ["http://u1", "http://u2", "http://u3"];
    let fresh: i64 = configure(&members).invoke_async(&mut c).await.unwrap();
    assert_eq!(fresh, 1);
    let cursor = |c: &mut MultiplexedConnection| {
        let mut c = c.clone();
        async move {
            let v: Option<String> = redis::cmd("HGET")
                .arg(key(tag, "meta"))
                .arg("rr")
                .query_async(&mut c)
                .await
                .unwrap();
            v
        }
    };
    assert_eq!(cursor(&mut c).await.as_deref(), Some("0"));
    // Requests moved the cursor on; a second gateway starting does not move it back.
    let _: () = redis::cmd("HSET")
        .arg(key(tag, "meta"))
        .arg("rr")
        .arg("2")
        .query_async(&mut c)
        .await
        .unwrap();
    let again: i64 = configure(&members).invoke_async(&mut c).await.unwrap();
    assert_eq!(again, 0, "not a new pool");
    assert_eq!(cursor(&mut c).await.as_deref(), Some("2"));
    let n: Option<String> = redis::cmd("HGET")
        .arg(key(tag, "meta"))
        .arg("n")
        .query_async(&mut c)
        .await
        .unwrap();
    // The member count, then the declaration's digest.
    assert_eq!(
        n.as_deref(),
        Some(format!("3 {}", members.join(" ")).as_str())
    );
}
