//! Store conformance under random interleavings (proptest): sequences of acquires (any member, or
//! a session), releases, lease expiry, member settings (quarantine, dead, restore) and
//! reconfigurations that add and remove members, on the memory store (paused clock) and on a
//! real `redis-server` (real lease TTLs, two instances sharing it).
//!
//! After every step: no grant was ever made on an upstream already holding its cap of live
//! leases, no member's `leases_live` exceeds the cap, and a plain acquire only gets an eligible
//! member. At the end every lease granted (expired ones too) releases without error, every count
//! is back to zero, and the whole capacity can be leased again: nothing was lost or freed twice.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use poolgate::config::Strategy as Pick;
use poolgate::health::Outcome;
use poolgate::store::memory::MemoryStore;
use poolgate::store::redis::{RedisSettings, RedisStore};
use poolgate::store::{Acquired, AnyStore, Grant, MemberState, PoolSpec, Store, Want};
use poolgate::upstream::UpstreamId;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use tokio::time::Instant;

/// Upstreams a pool may have as members (every reconfiguration picks a subset of these).
const UNIVERSE: usize = 4;
const SESSION_TTL: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
enum Op {
    /// A plain acquire, on client `on` (of two).
    Acquire { on: usize },
    /// A session acquire for one of a few keys, preferring members in a rotated order.
    Session {
        on: usize,
        key: u8,
        rotate: usize,
        rebind: bool,
    },
    /// Release the `n`-th lease still held (modulo how many), on client `on`.
    Release { n: usize, on: usize },
    /// Let every lease held so far expire.
    Expire,
    /// Let a little time pass (the memory store only: Redis time is real).
    Tick,
    /// Quarantine (0), kill (1) or restore (2) a member.
    SetMember { member: usize, state: u8 },
    /// Reconfigure the pool with the members of this bit mask (never empty).
    Configure { mask: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..2usize).prop_map(|on| Op::Acquire { on }),
        3 => (0..2usize, 0..3u8, 0..UNIVERSE, any::<bool>())
            .prop_map(|(on, key, rotate, rebind)| Op::Session { on, key, rotate, rebind }),
        6 => (any::<usize>(), 0..2usize).prop_map(|(n, on)| Op::Release { n, on }),
        1 => Just(Op::Expire),
        2 => Just(Op::Tick),
        2 => (0..UNIVERSE, 0..3u8).prop_map(|(member, state)| Op::SetMember { member, state }),
        1 => (1..(1u8 << UNIVERSE)).prop_map(|mask| Op::Configure { mask }),
    ]
}

#[derive(Clone, Copy, Debug)]
struct Case {
    cap: u32,
    strategy: Pick,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1..4u32,
        prop::sample::select(vec![
            Pick::LeastUsed,
            Pick::LeastConnections,
            Pick::RoundRobin,
            Pick::Weighted,
        ]),
    )
        .prop_map(|(cap, strategy)| Case { cap, strategy })
}

/// How a backend keeps time and builds its clients.
enum Backend<'a> {
    /// Paused tokio clock: expiry is exact.
    Memory,
    /// Real time on a real server: a lease is taken as surely live only well inside its TTL.
    Redis(&'a str),
}

struct Timing {
    lease_ttl: Duration,
    /// A lease younger than `lease_ttl - margin` is surely live, one older than
    /// `lease_ttl + margin` surely expired (zero for the paused clock).
    margin: Duration,
    /// What `Expire` waits.
    expire_wait: Duration,
}

impl Backend<'_> {
    fn timing(&self) -> Timing {
        match self {
            Backend::Memory => Timing {
                lease_ttl: Duration::from_millis(300),
                margin: Duration::ZERO,
                // Never a multiple of the tick: no lease ever sits exactly on its deadline.
                expire_wait: Duration::from_millis(310),
            },
            Backend::Redis(_) => Timing {
                lease_ttl: Duration::from_millis(800),
                margin: Duration::from_millis(300),
                expire_wait: Duration::from_millis(1200),
            },
        }
    }

    fn clients(&self) -> Vec<Arc<AnyStore>> {
        match self {
            Backend::Memory => {
                let shared = Arc::new(AnyStore::Memory(MemoryStore::new()));
                vec![shared.clone(), shared]
            }
            Backend::Redis(url) => (0..2)
                .map(|i| {
                    Arc::new(AnyStore::Redis(
                        RedisStore::new(RedisSettings {
                            url: url.to_string(),
                            timeout: Duration::from_secs(2),
                            key_prefix: "pgprop".into(),
                            instance_id: format!("prop-{i}-{:08x}", rand::random::<u32>()),
                            tls: Default::default(),
                        })
                        .unwrap(),
                    ))
                })
                .collect(),
        }
    }
}

fn universe() -> Vec<UpstreamId> {
    (0..UNIVERSE)
        .map(|i| UpstreamId::new(format!("http://10.9.0.{i}:3128")))
        .collect()
}

/// A lease the test holds.
struct Held {
    grant: Grant,
    at: Instant,
}

/// What the test knows of the pool.
struct Model {
    members: Vec<UpstreamId>,
    /// Eligibility as last set; `None` for a member whose setting a reconfiguration may have
    /// reset (it was removed and added back).
    eligible: HashMap<UpstreamId, Option<bool>>,
    held: Vec<Held>,
}

async fn run_case(backend: &Backend<'_>, case: Case, ops: &[Op]) {
    let timing = backend.timing();
    let all = universe();
    let clients = backend.clients();
    let name = format!("prop-{:08x}", rand::random::<u32>());
    let spec = |members: Vec<UpstreamId>| PoolSpec {
        name: name.clone(),
        members,
        strategy: case.strategy,
        max_concurrency: Some(case.cap),
        lease_ttl: timing.lease_ttl,
        shards: 1,
    };
    for c in &clients {
        c.configure(spec(all.clone())).await.unwrap();
    }
    let mut m = Model {
        members: all.clone(),
        eligible: all.iter().map(|id| (id.clone(), Some(true))).collect(),
        held: Vec::new(),
    };
    let cap = u64::from(case.cap);
    let surely_live =
        |h: &Held, now: Instant| now.duration_since(h.at) + timing.margin < timing.lease_ttl;

    for (step, op) in ops.iter().enumerate() {
        let now = Instant::now();
        let live_on = |m: &Model, id: &UpstreamId| {
            m.held
                .iter()
                .filter(|h| h.grant.upstream == *id && surely_live(h, now))
                .count() as u64
        };
        match op {
            Op::Acquire { on } => {
                let got = clients[*on]
                    .acquire(
                        &name,
                        Want::Any {
                            exclude: &[],
                            within: None,
                        },
                    )
                    .await
                    .unwrap();
                if let Acquired::Granted(g) = got {
                    assert!(
                        live_on(&m, &g.upstream) < cap,
                        "step {step}: granted {} past its cap of {cap}",
                        g.upstream
                    );
                    assert!(m.members.contains(&g.upstream), "step {step}: not a member");
                    assert_ne!(
                        m.eligible.get(&g.upstream).copied().flatten(),
                        Some(false),
                        "step {step}: a plain acquire got an ineligible member"
                    );
                    m.held.push(Held { grant: g, at: now });
                }
            }
            Op::Session {
                on,
                key,
                rotate,
                rebind,
            } => {
                let mut preferred = m.members.clone();
                let r = rotate % preferred.len();
                preferred.rotate_left(r);
                let key = format!("s{key}");
                let got = clients[*on]
                    .acquire(
                        &name,
                        Want::Session {
                            key: &key,
                            ttl: SESSION_TTL,
                            preferred: &preferred,
                            rebind: *rebind,
                            within: None,
                        },
                    )
                    .await
                    .unwrap();
                if let Acquired::Granted(g) = got {
                    assert!(
                        live_on(&m, &g.upstream) < cap,
                        "step {step}: session granted {} past its cap of {cap}",
                        g.upstream
                    );
                    m.held.push(Held { grant: g, at: now });
                }
            }
            Op::Release { n, on } => {
                if !m.held.is_empty() {
                    let h = m.held.swap_remove(n % m.held.len());
                    release(&clients[*on], &name, &h.grant).await;
                }
            }
            Op::Expire => {
                tokio::time::sleep(timing.expire_wait).await;
            }
            Op::Tick => {
                if matches!(backend, Backend::Memory) {
                    tokio::time::sleep(Duration::from_millis(70)).await;
                }
            }
            Op::SetMember { member, state } => {
                let id = &all[*member];
                if m.members.contains(id) {
                    let s = match state {
                        0 => MemberState {
                            eligible: false,
                            keeps_sessions: true,
                            cost: 1,
                        },
                        1 => MemberState {
                            eligible: false,
                            keeps_sessions: false,
                            cost: 1,
                        },
                        _ => MemberState::IN_SERVICE,
                    };
                    clients[0].set_member(&name, id, s, None).await.unwrap();
                    m.eligible.insert(id.clone(), Some(s.eligible));
                }
            }
            Op::Configure { mask } => {
                let members: Vec<UpstreamId> = all
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, id)| id.clone())
                    .collect();
                for id in &members {
                    if !m.members.contains(id) {
                        m.eligible.insert(id.clone(), None);
                    }
                }
                for c in &clients {
                    c.configure(spec(members.clone())).await.unwrap();
                }
                m.members = members;
            }
        }
        // The store's own count never passes the cap either.
        let st = clients[step % 2].status(&name).await.unwrap();
        for member in &st.members {
            assert!(
                member.leases_live <= cap,
                "step {step}: {} counts {} live leases, cap {cap}",
                member.id,
                member.leases_live
            );
        }
    }

    // Every lease ends, expired or not; then nothing is counted and the whole capacity is back.
    for (i, h) in std::mem::take(&mut m.held).into_iter().enumerate() {
        release(&clients[i % 2], &name, &h.grant).await;
    }
    for c in &clients {
        c.configure(spec(all.clone())).await.unwrap();
    }
    for id in &all {
        clients[0]
            .set_member(&name, id, MemberState::IN_SERVICE, None)
            .await
            .unwrap();
    }
    for c in &clients {
        let mut live = u64::MAX;
        for _ in 0..60 {
            let st = c.status(&name).await.unwrap();
            live = st.members.iter().map(|m| m.leases_live).sum();
            if live == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(live, 0, "leases still counted after every one was released");
    }
    let whole = cap * UNIVERSE as u64;
    let mut again = 0u64;
    loop {
        match clients[(again % 2) as usize]
            .acquire(
                &name,
                Want::Any {
                    exclude: &[],
                    within: None,
                },
            )
            .await
            .unwrap()
        {
            Acquired::Granted(_) => again += 1,
            Acquired::AtCapacity => break,
            other => panic!("{other:?}"),
        }
        assert!(again <= whole, "granted past every cap");
    }
    assert_eq!(
        again, whole,
        "capacity lost: {again} of {whole} leases granted"
    );
    for c in &clients {
        assert_eq!(c.health(), "ok", "a client served degraded");
    }
}

async fn release(s: &AnyStore, pool: &str, g: &Grant) {
    s.release(
        pool,
        &g.upstream,
        g.lease,
        Outcome::Ok,
        Duration::from_millis(3),
    )
    .await
    .expect("every granted lease can be released");
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases,
        // Shrinking replays whole sequences; on Redis each replay takes real time.
        max_shrink_iters: 200,
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

#[test]
fn memory_store_keeps_caps_and_loses_no_lease_under_random_interleavings() {
    let mut runner = runner(96);
    runner
        .run(
            &(case(), prop::collection::vec(op(), 1..60)),
            |(case, ops)| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .start_paused(true)
                    .build()
                    .unwrap();
                rt.block_on(run_case(&Backend::Memory, case, &ops));
                Ok(())
            },
        )
        .unwrap();
}

#[test]
fn redis_store_keeps_caps_and_loses_no_lease_under_random_interleavings() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(RedisServer::start());
    let url = server.url();
    // Few cases, each short: every `Expire` waits out a real TTL.
    let ops = prop::collection::vec(
        op().prop_filter("no more than an expiry or two", |o| !matches!(o, Op::Tick)),
        1..30,
    )
    .prop_filter("at most two expiries", |ops| {
        ops.iter().filter(|o| matches!(o, Op::Expire)).count() <= 2
    });
    let mut runner = runner(10);
    runner
        .run(&(case(), ops), |(case, ops)| {
            rt.block_on(run_case(&Backend::Redis(&url), case, &ops));
            Ok(())
        })
        .unwrap();
    drop(server);
}
