//! The live-session count in Redis (`session_count`, see `lua/acquire.lua`), driven through the
//! scripts with an explicit `now`: a bind adds a binding to the second its expiry falls in, a
//! renewal moves it, an unbind or an end takes it out, and a second that has passed is swept
//! out of the count by the next acquire or `/status`. `n` is always the sum of the seconds'
//! fields, and the hash holds no second that has passed once swept.
//!
//! The binding keys themselves expire on Redis's clock (PXAT), so the timeline starts at the
//! wall clock, with an hour's TTL, and only moves forward from there.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use poolgate::store::redis::script_keys;
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use common::RedisServer;
use redis::aio::MultiplexedConnection;

const ACQUIRE: &str = include_str!("../lua/acquire.lua");
const STATUS: &str = include_str!("../lua/status.lua");
const UNBIND: &str = include_str!("../lua/unbind.lua");
const END_SESSION: &str = include_str!("../lua/end_session.lua");
const CONFIGURE: &str = include_str!("../lua/configure.lua");
const TTL: u64 = 3_600_000;
const U1: &str = "http://u1";
const U2: &str = "http://u2";

fn key(k: &str) -> String {
    format!("t:{{count}}:{k}")
}

fn sess(k: &str) -> String {
    key(&format!("sess:{k}"))
}

struct Scripts {
    c: MultiplexedConnection,
    acquire: redis::Script,
    status: redis::Script,
    unbind: redis::Script,
    end_session: redis::Script,
    configure: redis::Script,
}

impl Scripts {
    async fn configure(&mut self, members: &[&str]) {
        let mut inv = self.configure.prepare_invoke();
        for k in script_keys::CONFIGURE {
            inv.key(key(k));
        }
        // One call ("all"); the digest is any token that differs with the member list.
        inv.arg("all").arg("least-used").arg(members.join(" "));
        for m in members {
            inv.arg(*m);
        }
        let _: i64 = inv.invoke_async(&mut self.c).await.unwrap();
    }

    /// A session acquire of `skey` at `now`, preferring `up`; returns (upstream, bound now).
    async fn acquire(&mut self, now: u64, skey: &str, up: &str, rebind: bool) -> (String, bool) {
        let mut inv = self.acquire.prepare_invoke();
        for k in script_keys::ACQUIRE {
            inv.key(key(k));
        }
        inv.key(sess(skey));
        inv.arg(now.to_string())
            .arg("-")
            .arg((now + 60_000).to_string())
            .arg("0")
            .arg("least-used")
            .arg(key("events"))
            .arg("session")
            .arg(TTL.to_string())
            .arg(if rebind { "1" } else { "0" })
            .arg(skey)
            .arg(up);
        let reply: Vec<String> = inv.invoke_async(&mut self.c).await.unwrap();
        assert_eq!(reply[0], "granted", "{reply:?}");
        (reply[1].clone(), reply[2] == "1")
    }

    /// `status.lua`'s live-session count at `now`.
    async fn status(&mut self, now: u64) -> u64 {
        let mut inv = self.status.prepare_invoke();
        for k in ["leases", "lease_up", "session_count", "instances", "held"] {
            inv.key(key(k));
        }
        inv.arg(now.to_string()).arg("me");
        let (n, _, _): (u64, Vec<String>, Vec<String>) =
            inv.invoke_async(&mut self.c).await.unwrap();
        n
    }

    async fn unbind(&mut self, skey: &str, up: &str) -> i64 {
        let mut inv = self.unbind.prepare_invoke();
        inv.key(sess(skey)).key(key("session_count")).arg(up);
        inv.invoke_async(&mut self.c).await.unwrap()
    }

    async fn end_session(&mut self, skey: &str) -> i64 {
        let mut inv = self.end_session.prepare_invoke();
        inv.key(sess(skey)).key(key("session_count"));
        inv.invoke_async(&mut self.c).await.unwrap()
    }

    /// The count's seconds, after checking that `n` is their sum.
    async fn seconds(&mut self) -> HashMap<u64, u64> {
        let all: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(key("session_count"))
            .query_async(&mut self.c)
            .await
            .unwrap();
        let seconds: HashMap<u64, u64> = all
            .iter()
            .filter_map(|(f, c)| Some((f.parse().ok()?, *c)))
            .collect();
        let n = all.get("n").copied().unwrap_or(0);
        assert_eq!(n, seconds.values().sum::<u64>(), "n is the sum: {all:?}");
        assert!(seconds.values().all(|&c| c > 0), "no empty second: {all:?}");
        seconds
    }
}

/// The second a binding expiring at `ms` is counted in.
fn second(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

#[tokio::test]
async fn the_session_count_follows_binds_renewals_unbinds_ends_and_expiry() {
    common::init_tracing();
    let server = RedisServer::start().await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut s = Scripts {
        c: client.get_multiplexed_async_connection().await.unwrap(),
        acquire: redis::Script::new(ACQUIRE),
        status: redis::Script::new(STATUS),
        unbind: redis::Script::new(UNBIND),
        end_session: redis::Script::new(END_SESSION),
        configure: redis::Script::new(CONFIGURE),
    };
    // A pool left by an older version: its per-session ZSET goes at the next configure.
    let _: () = redis::cmd("ZADD")
        .arg(key("sessions"))
        .arg(1)
        .arg("old")
        .query_async(&mut s.c)
        .await
        .unwrap();
    s.configure(&[U1, U2]).await;
    let legacy: bool = redis::cmd("EXISTS")
        .arg(key("sessions"))
        .query_async(&mut s.c)
        .await
        .unwrap();
    assert!(!legacy, "the old sessions ZSET is deleted");

    let t0 = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(s.status(t0).await, 0);

    // Binds count, each in its expiry's second.
    assert_eq!(s.acquire(t0, "a", U1, false).await, (U1.into(), true));
    assert_eq!(s.status(t0).await, 1);
    assert_eq!(s.acquire(t0, "b", U2, false).await, (U2.into(), true));
    assert_eq!(s.status(t0).await, 2);
    assert_eq!(s.seconds().await, HashMap::from([(second(t0 + TTL), 2)]));
    let expiry: i64 = redis::cmd("PEXPIRETIME")
        .arg(sess("a"))
        .query_async(&mut s.c)
        .await
        .unwrap();
    assert_eq!(expiry as u64, t0 + TTL, "the binding expires at now + TTL");

    // A renewal moves its binding to its new second; the count stays.
    let t1 = t0 + 5_000;
    assert_eq!(s.acquire(t1, "a", U2, false).await, (U1.into(), false));
    assert_eq!(s.status(t1).await, 2);
    assert_eq!(
        s.seconds().await,
        HashMap::from([(second(t0 + TTL), 1), (second(t1 + TTL), 1)])
    );
    // Renewed again within the same second: nothing moves.
    assert_eq!(s.acquire(t1 + 1, "a", U2, false).await, (U1.into(), false));
    assert_eq!(s.status(t1 + 1).await, 2);

    // "b" expires: counted up to the end of its second, not after.
    let b_end = second(t0 + TTL) * 1000;
    assert_eq!(s.status(t0 + TTL - 1).await, 2);
    assert_eq!(
        s.status(b_end - 1).await,
        2,
        "counted until its second ends"
    );
    assert!(b_end - 1 < t0 + TTL + 1000);
    assert_eq!(s.status(b_end).await, 1);
    assert_eq!(
        s.seconds().await,
        HashMap::from([(second(t1 + TTL), 1)]),
        "the past second is swept"
    );

    // Unbinding "b", whose key Redis still holds but whose second was swept, changes nothing.
    let t2 = b_end;
    assert_eq!(s.unbind("b", U2).await, 1);
    assert_eq!(s.status(t2).await, 1);
    // A bind counts again; an unbind naming another upstream does not uncount it, the right one
    // does.
    assert_eq!(s.acquire(t2, "c", U2, false).await, (U2.into(), true));
    assert_eq!(s.status(t2).await, 2);
    assert_eq!(s.unbind("c", U1).await, 0);
    assert_eq!(s.status(t2).await, 2);
    assert_eq!(s.unbind("c", U2).await, 1);
    assert_eq!(s.status(t2).await, 1);

    // A rebind (its upstream left the pool) replaces the binding: still one.
    s.configure(&[U2]).await;
    assert_eq!(s.acquire(t2, "a", U2, true).await, (U2.into(), true));
    assert_eq!(s.status(t2).await, 1);
    assert_eq!(s.seconds().await, HashMap::from([(second(t2 + TTL), 1)]));

    // An end takes it out; ending a missing binding changes nothing.
    assert_eq!(s.end_session("a").await, 1);
    assert_eq!(s.end_session("a").await, 0);
    assert_eq!(s.status(t2).await, 0);
    assert!(s.seconds().await.is_empty());

    // Bindings left to expire, read after a long idle time (past the sweep's one-by-one span):
    // the count falls to nothing and so does the hash.
    for k in ["d", "e", "f"] {
        s.acquire(t2, k, U2, false).await;
    }
    assert_eq!(s.status(t2).await, 3);
    let far = t2 + TTL + 5_000_000;
    assert_eq!(s.status(far).await, 0);
    assert!(s.seconds().await.is_empty());
    let fields: u64 = redis::cmd("HLEN")
        .arg(key("session_count"))
        .query_async(&mut s.c)
        .await
        .unwrap();
    assert_eq!(fields, 2, "only n and swept are left");
    // A renewal after its second was swept counts the binding again (its key was still there).
    assert_eq!(s.acquire(far, "d", U2, false).await, (U2.into(), false));
    assert_eq!(s.status(far).await, 1);
}
