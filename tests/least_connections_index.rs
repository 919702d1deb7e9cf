//! The Redis store's least-connections acquire reads its load index (`acquire.lua`) from the
//! least loaded member on, instead of weighing every member. This holds it to the rule the walk
//! applied, computed here from what Redis holds: among the eligible members not excluded, below
//! the cap and (within a label filter) in the subset, the fewest live leases (listed, plus the
//! unlisted ones other gateways report) × cost, then the fewest allocations, then the first in
//! the configured order.
//!
//! A pool of a few hundred members goes through a seeded random run of plain acquires (some
//! excluding the member the rule picks, some within a subset, some arriving together and batched
//! into one call), session acquires, releases, leases that expire, quarantines, restores and
//! cost changes, reports of other gateways' unlisted leases (live and lapsed), reloads that
//! change the members, their order, the cap and the strategy, and declarations by another
//! gateway of another strategy (which drop the index: the next acquire builds it again). Every
//! least-connections grant is checked against the rule, and after every step the index against
//! the state it is built from. Bounded: a fixed number of steps per seed, each a few calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::RedisServer;
use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::{Acquired, AnyStore, Grant, MemberState, PoolSpec, Store, Subset, Want};
use poolgate::upstream::UpstreamId;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use redis::aio::MultiplexedConnection;

const PREFIX: &str = "pglc";
const POOL: &str = "lc";
/// Upstreams a pool may have as members; a reload keeps most of them.
const UNIVERSE: usize = 300;
const STEPS: usize = 500;
const SEEDS: [u64; 2] = [37, 0x5eed];
/// Far longer than a run: a lease only expires when a step moves its deadline.
const LEASE_TTL: Duration = Duration::from_secs(600);

fn key(name: &str) -> String {
    format!("{PREFIX}:{{{POOL}}}:{name}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn universe() -> Vec<UpstreamId> {
    (0..UNIVERSE)
        .map(|i| UpstreamId::new(format!("http://10.0.{}.{}:3128", i / 200, i % 200)))
        .collect()
}

fn store(url: &str, instance: &str) -> AnyStore {
    common::redis_store(url, PREFIX, instance)
}

/// What the rule reads, as Redis holds it.
#[derive(Clone, Default)]
struct Snapshot {
    /// upstream → (eligible, cost)
    state: HashMap<String, (bool, u32)>,
    /// Allocation scores of the eligible members.
    allocs: HashMap<String, f64>,
    /// Configured positions.
    pos: HashMap<String, f64>,
    /// Listed live leases, as the HASH holds them.
    live: HashMap<String, i64>,
    /// Listed leases past their deadline, per upstream: the acquire's purge ends them first.
    expired: HashMap<String, i64>,
    /// Unlisted leases in the reports still alive.
    held: HashMap<String, i64>,
}

async fn hash(c: &mut MultiplexedConnection, name: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key(name))
        .query_async(c)
        .await
        .unwrap()
}

async fn zset(c: &mut MultiplexedConnection, name: &str) -> Vec<(String, f64)> {
    redis::cmd("ZRANGE")
        .arg(key(name))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(c)
        .await
        .unwrap()
}

async fn snapshot(c: &mut MultiplexedConnection) -> Snapshot {
    let now = now_ms();
    let mut s = Snapshot::default();
    for (up, v) in hash(c, "state").await {
        let f: Vec<&str> = v.split('|').collect();
        s.state.insert(up, (f[0] == "1", f[2].parse().unwrap()));
    }
    s.allocs = zset(c, "members").await.into_iter().collect();
    s.pos = zset(c, "order").await.into_iter().collect();
    s.live = hash(c, "live")
        .await
        .into_iter()
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    let expired: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(key("leases"))
        .arg("-inf")
        .arg(now)
        .query_async(c)
        .await
        .unwrap();
    if !expired.is_empty() {
        let ups: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(key("lease_up"))
            .arg(&expired)
            .query_async(c)
            .await
            .unwrap();
        for up in ups.into_iter().flatten() {
            *s.expired.entry(up).or_default() += 1;
        }
    }
    let alive: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(key("instances"))
        .arg(format!("({now}"))
        .arg("+inf")
        .query_async(c)
        .await
        .unwrap();
    let held = hash(c, "held").await;
    for instance in alive {
        for line in held.get(&instance).map_or("", String::as_str).lines() {
            let (n, up) = line.split_once(' ').unwrap();
            *s.held.entry(up.to_string()).or_default() += n.parse::<i64>().unwrap();
        }
    }
    s
}

/// What a plain acquire must answer.
#[derive(Debug, PartialEq)]
enum Expect {
    Grant(String),
    AtCapacity,
    None,
}

impl Snapshot {
    /// Live leases as the acquire counts them: listed (after its purge) plus reported.
    fn counted(&self, up: &str) -> i64 {
        self.live.get(up).copied().unwrap_or(0) - self.expired.get(up).copied().unwrap_or(0)
            + self.held.get(up).copied().unwrap_or(0)
    }

    /// The rule the walk over every member applied.
    fn expected(
        &self,
        cap: Option<u32>,
        exclude: &[UpstreamId],
        within: Option<&[UpstreamId]>,
    ) -> Expect {
        let mut saw = false;
        let mut best: Option<((i64, f64, f64), &str)> = None;
        for (up, &(eligible, cost)) in &self.state {
            if !eligible
                || exclude.iter().any(|x| x.as_str() == up)
                || within.is_some_and(|w| !w.iter().any(|x| x.as_str() == up))
            {
                continue;
            }
            saw = true;
            let live = self.counted(up);
            if cap.is_some_and(|cap| live >= i64::from(cap)) {
                continue;
            }
            let k = (
                live * i64::from(cost.max(1)),
                self.allocs[up.as_str()],
                self.pos[up.as_str()],
            );
            if best.is_none_or(|(b, _)| k < b) {
                best = Some((k, up));
            }
        }
        match best {
            Some((_, up)) => Expect::Grant(up.to_string()),
            None if saw => Expect::AtCapacity,
            None => Expect::None,
        }
    }

    /// Counts a grant of `up` as the acquire does: one more live lease, its cost in allocations.
    fn grant(&mut self, up: &str) {
        *self.live.entry(up.to_string()).or_default() += 1;
        let cost = self.state[up].1.max(1);
        *self.allocs.get_mut(up).unwrap() += f64::from(cost);
    }
}

/// While the index is kept: one entry per eligible member, made of its allocation score and
/// position, scored by its listed live leases × cost, and `load_of` naming it with the cost.
async fn check_index(c: &mut MultiplexedConnection, step: usize, what: &str) -> bool {
    let kept: Option<String> = redis::cmd("HGET")
        .arg(key("meta"))
        .arg("load")
        .query_async(c)
        .await
        .unwrap();
    let load = zset(c, "load").await;
    let load_of = hash(c, "load_of").await;
    if kept.as_deref() != Some("1") {
        assert!(
            load.is_empty() && load_of.is_empty(),
            "step {step} ({what}): an index left behind while not kept"
        );
        return false;
    }
    let s = snapshot(c).await;
    let mut want_load = Vec::new();
    let mut want_of = HashMap::new();
    for (up, &(eligible, cost)) in &s.state {
        if !eligible {
            continue;
        }
        let cost = cost.max(1);
        let entry = format!("{:017}{:08}{up}", s.allocs[up] as u64, s.pos[up] as u64);
        let live = s.live.get(up).copied().unwrap_or(0);
        want_load.push((entry.clone(), (live * i64::from(cost)) as f64));
        want_of.insert(up.clone(), format!("{cost} {entry}"));
    }
    let have: Vec<String> = load.iter().map(|(e, s)| format!("{e} = {s}")).collect();
    let want: Vec<String> = want_load
        .iter()
        .map(|(e, s)| format!("{e} = {s}"))
        .collect();
    let extra: Vec<&String> = have.iter().filter(|e| !want.contains(e)).take(5).collect();
    let missing: Vec<&String> = want.iter().filter(|e| !have.contains(e)).take(5).collect();
    assert!(
        extra.is_empty() && missing.is_empty() && have.len() == want.len(),
        "step {step} ({what}): load index has {extra:?}, lacks {missing:?}"
    );
    let wrong: Vec<(&String, &String, Option<&String>)> = want_of
        .iter()
        .filter(|(up, v)| load_of.get(*up) != Some(v))
        .map(|(up, v)| (up, v, load_of.get(up)))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty() && load_of.len() == want_of.len(),
        "step {step} ({what}): load_of (member, wanted, held) {wrong:?}"
    );
    true
}

struct Run {
    rng: StdRng,
    a: Arc<AnyStore>,
    other: AnyStore,
    c: MultiplexedConnection,
    all: Vec<UpstreamId>,
    spec: PoolSpec,
    /// Leases granted and not yet released (some expired meanwhile).
    held: Vec<Grant>,
    /// Changes with each reload: subsets are named after their members.
    generation: u32,
    checked: usize,
}

impl Run {
    fn lc(&self) -> bool {
        self.spec.strategy == Strategy::LeastConnections
    }

    fn subset_members(&self) -> Vec<UpstreamId> {
        self.spec.members.iter().step_by(3).cloned().collect()
    }

    /// A plain acquire, checked against the rule under least-connections.
    async fn acquire(&mut self, exclude: &[UpstreamId], within: bool, step: usize) {
        let members = self.subset_members();
        let id = format!("third#{}", self.generation);
        let subset = within.then(|| Subset {
            id: &id,
            members: &members,
        });
        let snap = snapshot(&mut self.c).await;
        let expect = snap.expected(
            self.spec.max_concurrency,
            exclude,
            within.then_some(members.as_slice()),
        );
        let got = self
            .a
            .acquire(
                POOL,
                Want::Any {
                    exclude,
                    within: subset,
                },
            )
            .await
            .unwrap();
        let answer = match &got {
            Acquired::Granted(g) => Expect::Grant(g.upstream.as_str().to_string()),
            Acquired::AtCapacity => Expect::AtCapacity,
            Acquired::NoCandidates => Expect::None,
            other => panic!("step {step}: {other:?}"),
        };
        if self.lc() {
            assert_eq!(
                answer, expect,
                "step {step}: excluding {exclude:?}, within {within}, cap {:?}",
                self.spec.max_concurrency
            );
            self.checked += 1;
        }
        if let Acquired::Granted(g) = got {
            self.held.push(g);
        }
    }

    /// `n` plain acquires at once, from the whole pool or `within` the subset (batched into calls
    /// of several): the grants are those of `n` acquires one after another.
    async fn burst(&mut self, n: usize, within: bool, step: usize) {
        let members = Arc::new(self.subset_members());
        let id: Arc<str> = format!("third#{}", self.generation).into();
        if within {
            // The subset's members go with the first acquire that names it; these are batched
            // once they were sent.
            self.acquire(&[], true, step).await;
        }
        let mut snap = snapshot(&mut self.c).await;
        let mut want = Vec::new();
        for _ in 0..n {
            match snap.expected(
                self.spec.max_concurrency,
                &[],
                within.then_some(members.as_slice()),
            ) {
                Expect::Grant(up) => {
                    snap.grant(&up);
                    want.push(up);
                }
                other => want.push(format!("{other:?}")),
            }
        }
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (a, members, id) = (self.a.clone(), members.clone(), id.clone());
            calls.spawn(async move {
                let plain = Want::Any {
                    exclude: &[],
                    within: within.then(|| Subset {
                        id: &id,
                        members: &members,
                    }),
                };
                a.acquire(POOL, plain).await
            });
        }
        let mut have = Vec::new();
        while let Some(g) = calls.join_next().await {
            match g.unwrap().unwrap() {
                Acquired::Granted(g) => {
                    have.push(g.upstream.as_str().to_string());
                    self.held.push(g);
                }
                other => have.push(format!("{other:?}")),
            }
        }
        if self.lc() {
            want.sort();
            have.sort();
            assert_eq!(have, want, "step {step}: {n} acquires together");
            self.checked += n;
        }
    }

    async fn session(&mut self, step: usize) {
        let key = format!("s{}", self.rng.random_range(0..20));
        let mut preferred = self.spec.members.clone();
        preferred.shuffle(&mut self.rng);
        preferred.truncate(3);
        let got = self
            .a
            .acquire(
                POOL,
                Want::Session {
                    key: &key,
                    ttl: Duration::from_secs(600),
                    preferred: &preferred,
                    rebind: true,
                    within: None,
                },
            )
            .await
            .unwrap_or_else(|e| panic!("step {step}: {e}"));
        if let Acquired::Granted(g) = got {
            self.held.push(g);
        }
    }

    async fn release(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.held.len());
        let g = self.held.swap_remove(i);
        self.a
            .release(POOL, &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
            .await
            .unwrap();
    }

    /// Moves a few leases' deadlines into the past, as if their gateway had died long ago.
    async fn expire(&mut self) {
        let past = now_ms() - 10_000;
        for _ in 0..self.rng.random_range(1..4) {
            if self.held.is_empty() {
                return;
            }
            let g = &self.held[self.rng.random_range(0..self.held.len())];
            let _: i64 = redis::cmd("ZADD")
                .arg(key("leases"))
                .arg("XX")
                .arg(past)
                .arg(g.lease.0)
                .query_async(&mut self.c)
                .await
                .unwrap();
        }
    }

    /// A quarantine, a death, a restore, or a cost change.
    async fn set_member(&mut self) {
        let up = self.spec.members[self.rng.random_range(0..self.spec.members.len())].clone();
        let cost = self.rng.random_range(1..5);
        let state = match self.rng.random_range(0..10) {
            0..3 => MemberState {
                eligible: false,
                keeps_sessions: true,
                cost,
            },
            3 => MemberState {
                eligible: false,
                keeps_sessions: false,
                cost,
            },
            _ => MemberState {
                eligible: true,
                keeps_sessions: true,
                cost,
            },
        };
        self.a.set_member(POOL, &up, state, None).await.unwrap();
    }

    /// Another gateway's report of its unlisted leases: alive, or lapsed.
    async fn report(&mut self) {
        let instance = ["gw-x", "gw-y"][self.rng.random_range(0..2)];
        let alive = self.rng.random_range(0..4) > 0;
        let deadline = if alive {
            now_ms() + 3_600_000
        } else {
            now_ms() - 3_600_000
        };
        let mut lines = String::new();
        for _ in 0..self.rng.random_range(1..6) {
            let up = &self.spec.members[self.rng.random_range(0..self.spec.members.len())];
            lines.push_str(&format!("{} {up}\n", self.rng.random_range(1..4)));
        }
        let _: () = redis::pipe()
            .hset(key("held"), instance, lines)
            .zadd(key("instances"), instance, deadline)
            .query_async(&mut self.c)
            .await
            .unwrap();
    }

    /// A reload: members dropped, added and moved, the cap and at times the strategy changed.
    async fn reload(&mut self) {
        let mut members = self.spec.members.clone();
        for _ in 0..self.rng.random_range(0..8) {
            let i = self.rng.random_range(0..members.len());
            members.remove(i);
        }
        for _ in 0..self.rng.random_range(0..8) {
            let up = self.all[self.rng.random_range(0..self.all.len())].clone();
            if !members.contains(&up) {
                let at = self.rng.random_range(0..=members.len());
                members.insert(at, up);
            }
        }
        for _ in 0..self.rng.random_range(0..5) {
            let (i, j) = (
                self.rng.random_range(0..members.len()),
                self.rng.random_range(0..members.len()),
            );
            members.swap(i, j);
        }
        // Another strategy keeps a cap: its leases are listed too, so no report of this
        // instance's own enters the counts at a time of the timer's choosing.
        let (strategy, cap) = match self.rng.random_range(0..6) {
            0 => (Strategy::RoundRobin, Some(self.rng.random_range(2..5))),
            1 | 2 => (
                Strategy::LeastConnections,
                Some(self.rng.random_range(1..4)),
            ),
            _ => (Strategy::LeastConnections, None),
        };
        self.spec = PoolSpec {
            members,
            strategy,
            max_concurrency: cap,
            ..self.spec.clone()
        };
        self.generation += 1;
        self.a.configure(self.spec.clone()).await.unwrap();
    }

    /// Another gateway, still on least-used, declares the pool: the index is dropped.
    async fn other_declares(&mut self) {
        let spec = PoolSpec {
            strategy: Strategy::LeastUsed,
            max_concurrency: None,
            ..self.spec.clone()
        };
        self.other.configure(spec).await.unwrap();
    }
}

async fn run(redis: &RedisServer, seed: u64) {
    let _: () = redis::cmd("FLUSHALL")
        .query_async(
            &mut redis::Client::open(redis.url())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        )
        .await
        .unwrap();
    let all = universe();
    let spec = PoolSpec {
        name: POOL.into(),
        members: all[..UNIVERSE - 20].to_vec(),
        strategy: Strategy::LeastConnections,
        max_concurrency: None,
        lease_ttl: LEASE_TTL,
        shards: 1,
    };
    let a = store(&redis.url(), &format!("lc-a-{seed}"));
    a.configure(spec.clone()).await.unwrap();
    let other = store(&redis.url(), &format!("lc-b-{seed}"));
    let c = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut r = Run {
        rng: StdRng::seed_from_u64(seed),
        a: Arc::new(a),
        other,
        c,
        all,
        spec,
        held: Vec::new(),
        generation: 0,
        checked: 0,
    };
    let mut indexed_steps = 0;
    for step in 0..STEPS {
        let what = match r.rng.random_range(0..100) {
            0..30 => {
                r.acquire(&[], false, step).await;
                "acquire"
            }
            30..36 => {
                // Excluding the member the rule picks, and a few others: the walk goes past them.
                let snap = snapshot(&mut r.c).await;
                let mut exclude = Vec::new();
                if let Expect::Grant(up) = snap.expected(r.spec.max_concurrency, &[], None) {
                    exclude.push(UpstreamId::new(up));
                }
                for _ in 0..r.rng.random_range(0..3) {
                    exclude
                        .push(r.spec.members[r.rng.random_range(0..r.spec.members.len())].clone());
                }
                r.acquire(&exclude, false, step).await;
                "acquire excluding"
            }
            36..41 => {
                r.acquire(&[], true, step).await;
                "acquire within"
            }
            41..45 if r.spec.max_concurrency.is_none() => {
                let n = r.rng.random_range(2..9);
                let within = r.rng.random_bool(0.5);
                r.burst(n, within, step).await;
                if within {
                    "acquires within together"
                } else {
                    "acquires together"
                }
            }
            41..49 => {
                r.session(step).await;
                "session"
            }
            49..80 => {
                r.release().await;
                "release"
            }
            80..84 => {
                r.expire().await;
                "expire"
            }
            84..91 => {
                r.set_member().await;
                "set member"
            }
            91..95 => {
                r.report().await;
                "report"
            }
            95..98 => {
                r.reload().await;
                "reload"
            }
            _ => {
                r.other_declares().await;
                "another gateway declares"
            }
        };
        if check_index(&mut r.c, step, what).await {
            indexed_steps += 1;
        }
    }
    assert!(
        r.checked >= STEPS / 4,
        "seed {seed}: only {} grants checked",
        r.checked
    );
    assert!(
        indexed_steps >= STEPS / 2,
        "seed {seed}: the index was kept for {indexed_steps} steps only"
    );
    eprintln!(
        "seed {seed}: {} grants checked, index kept for {indexed_steps} steps",
        r.checked
    );
    assert_eq!(r.a.health(), "ok");
}

#[tokio::test]
async fn redis_least_connections_grants_follow_the_rule_through_random_changes() {
    common::init_tracing();
    let redis = RedisServer::start().await;
    for seed in SEEDS {
        run(&redis, seed).await;
    }
}
