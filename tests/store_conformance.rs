//! One `Store` conformance suite, run against every backend: the embedded memory store, a single
//! Redis, and a three-node Redis Cluster (both started by the tests on free loopback ports).
//!
//! Each case takes a [`Backend`] and asks it for `n` clients of one shared state: the memory store
//! seen `n` times, or `n` separate Redis stores, as `n` gateway instances would have. Redis time is
//! real, so time-dependent cases use short TTLs (a few hundred ms) and bounded waits.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer};
use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::memory::MemoryStore;
use poolgate::store::redis::{RedisSettings, RedisStore};
use poolgate::store::{
    Acquired, AnyStore, Grant, MemberChange, MemberState, PoolSpec, PoolStatus, Store, Subset, Want,
};
use poolgate::upstream::UpstreamId;

/// Bound on each Redis call in these tests: generous, the machine may be busy.
const TEST_STORE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Clone)]
enum Backend {
    Memory,
    Redis(String),
}

type Clients = Vec<Arc<AnyStore>>;

impl Backend {
    async fn clients(&self, n: usize, spec: &PoolSpec) -> Clients {
        let clients: Clients = match self {
            Backend::Memory => {
                // One state seen by every client, on purpose.
                let shared = Arc::new(AnyStore::Memory(MemoryStore::new()));
                (0..n).map(|_| shared.clone()).collect()
            }
            Backend::Redis(url) => (0..n).map(|i| Arc::new(redis_store(url, i))).collect(),
        };
        for c in &clients {
            c.configure(spec.clone()).await.unwrap();
        }
        clients
    }

    fn is_redis(&self) -> bool {
        matches!(self, Backend::Redis(_))
    }
}

/// A member out of service that keeps its sessions: what a health quarantine sets.
const QUARANTINED: MemberState = MemberState {
    eligible: false,
    keeps_sessions: true,
    cost: 1,
};

/// A member out of service that gives up its sessions: what a dead verdict sets.
const DEAD: MemberState = MemberState {
    eligible: false,
    keeps_sessions: false,
    cost: 1,
};

/// A Redis store (an instance) on `url`, its pools not yet declared.
fn redis_store(url: &str, i: usize) -> AnyStore {
    AnyStore::Redis(
        RedisStore::new(RedisSettings {
            url: url.to_string(),
            timeout: TEST_STORE_TIMEOUT,
            key_prefix: "pgtest".into(),
            instance_id: format!("conformance-{i}-{:08x}", rand::random::<u32>()),
            tls: Default::default(),
        })
        .unwrap(),
    )
}

/// Every answer came from the shared state, not from a degraded local view.
fn assert_healthy(clients: &Clients) {
    for c in clients {
        assert_eq!(c.health(), "ok", "a client served degraded");
    }
}

fn ids(n: usize) -> Vec<UpstreamId> {
    (0..n)
        .map(|i| UpstreamId::new(format!("http://10.0.0.{i}:3128")))
        .collect()
}

fn spec(
    case: &str,
    n: usize,
    strategy: Strategy,
    cap: Option<u32>,
    lease_ttl: Duration,
) -> (PoolSpec, Vec<UpstreamId>) {
    let members = ids(n);
    (
        PoolSpec {
            name: format!("{case}-{:08x}", rand::random::<u32>()),
            members: members.clone(),
            strategy,
            max_concurrency: cap,
            lease_ttl,
            shards: 1,
        },
        members,
    )
}

fn granted(a: Acquired) -> Grant {
    match a {
        Acquired::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

const ANY: Want<'static> = Want::Any {
    exclude: &[],
    within: None,
};

fn session<'a>(key: &'a str, ttl: Duration, preferred: &'a [UpstreamId], rebind: bool) -> Want<'a> {
    Want::Session {
        key,
        ttl,
        preferred,
        rebind,
        within: None,
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
    .unwrap();
}

async fn allocations(s: &AnyStore, pool: &str) -> HashMap<String, u64> {
    s.status(pool)
        .await
        .unwrap()
        .members
        .into_iter()
        .map(|m| (m.id, m.allocations))
        .collect()
}

/// Runs `n` plain acquires at once on `store` and returns their grants.
async fn acquire_together(store: &Arc<AnyStore>, pool: &str, n: usize) -> Vec<Grant> {
    acquire_together_within(store, pool, n, None).await
}

/// [`acquire_together`], within the label filter `country=us#1` of `members` when given.
async fn acquire_together_within(
    store: &Arc<AnyStore>,
    pool: &str,
    n: usize,
    members: Option<&Arc<Vec<UpstreamId>>>,
) -> Vec<Grant> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (s, pool, members) = (store.clone(), pool.to_string(), members.cloned());
        set.spawn(async move {
            let want = Want::Any {
                exclude: &[],
                within: members.as_deref().map(|members| Subset {
                    id: "country=us#1",
                    members,
                }),
            };
            granted(s.acquire(&pool, want).await.unwrap())
        });
    }
    let mut grants = Vec::new();
    while let Some(r) = tokio::time::timeout(Duration::from_secs(10), set.join_next())
        .await
        .expect("acquires answered")
    {
        grants.push(r.unwrap());
    }
    grants
}

/// Acquires, waiting (bounded) for capacity like the request path does.
async fn acquire_waiting(s: &AnyStore, pool: &str, want: Want<'_>) -> Grant {
    let signal = s.release_signal(pool);
    for _ in 0..200 {
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match s.acquire(pool, want).await.unwrap() {
            Acquired::Granted(g) => return g,
            Acquired::AtCapacity => {
                let _ = tokio::time::timeout(Duration::from_millis(500), notified).await;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("no capacity came back");
}

// ---------------------------------------------------------------------------------------------
// The cases.

async fn least_used_balance(b: &Backend) {
    let (spec, _) = spec("lu", 8, Strategy::LeastUsed, None, Duration::from_secs(30));
    let c = b.clients(2, &spec).await;
    for i in 0..400 {
        let s = &c[i % 2];
        let g = granted(s.acquire(&spec.name, ANY).await.unwrap());
        release(s, &spec.name, &g).await;
    }
    let allocs: Vec<u64> = allocations(&c[0], &spec.name).await.into_values().collect();
    assert_eq!(allocs.iter().sum::<u64>(), 400, "{allocs:?}");
    let spread = allocs.iter().max().unwrap() - allocs.iter().min().unwrap();
    assert!(spread <= 1, "{allocs:?}");
    assert_healthy(&c);
}

async fn cap_never_exceeded_under_concurrent_acquires(b: &Backend) {
    cap_held_under_concurrent_acquires(b, None).await;
}

/// The same inside a label filter: the subset's members only, each at most at its cap.
async fn cap_never_exceeded_within_a_subset_under_concurrent_acquires(b: &Backend) {
    cap_held_under_concurrent_acquires(b, Some(&[0, 2, 3])).await;
}

/// 24 tasks on 3 clients acquire (waiting for capacity) and release 8 times each, among the whole
/// pool of 4 or within the members at `within`'s positions: no upstream ever holds more than the
/// cap, the cap is reached, every allocation is counted and every lease ends.
async fn cap_held_under_concurrent_acquires(b: &Backend, within: Option<&[usize]>) {
    const CAP: usize = 2;
    let (spec, m) = spec(
        "cap",
        4,
        Strategy::LeastUsed,
        Some(CAP as u32),
        Duration::from_secs(30),
    );
    let subset: Option<Arc<Vec<UpstreamId>>> =
        within.map(|at| Arc::new(at.iter().map(|&i| m[i].clone()).collect()));
    let c = b.clients(3, &spec).await;
    let live: Arc<Mutex<HashMap<UpstreamId, (usize, usize)>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..24 {
        let s = c[t % c.len()].clone();
        let pool = spec.name.clone();
        let live = live.clone();
        let subset = subset.clone();
        tasks.spawn(async move {
            let want = Want::Any {
                exclude: &[],
                within: subset.as_deref().map(|members| Subset {
                    id: "tier=a#1",
                    members,
                }),
            };
            for _ in 0..8 {
                let g = acquire_waiting(&s, &pool, want).await;
                if let Some(members) = &subset {
                    assert!(members.contains(&g.upstream), "{} outside", g.upstream);
                }
                {
                    let mut l = live.lock().unwrap();
                    let e = l.entry(g.upstream.clone()).or_default();
                    e.0 += 1;
                    e.1 = e.1.max(e.0);
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                live.lock().unwrap().get_mut(&g.upstream).unwrap().0 -= 1;
                release(&s, &pool, &g).await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let peaks: Vec<usize> = live.lock().unwrap().values().map(|(_, p)| *p).collect();
    assert!(peaks.iter().all(|&p| p <= CAP), "peaks {peaks:?}");
    assert!(peaks.contains(&CAP), "the cap was reached: {peaks:?}");
    let total: u64 = allocations(&c[0], &spec.name).await.values().sum();
    assert_eq!(total, 24 * 8);
    if let Some(members) = &subset {
        assert_eq!(peaks.len(), members.len(), "{peaks:?}");
    }
    let st = c[0].status(&spec.name).await.unwrap();
    assert!(st.members.iter().all(|m| m.leases_live == 0), "{st:?}");
    assert_healthy(&c);
}

async fn exclusion_and_no_candidates(b: &Backend) {
    for strategy in [
        Strategy::LeastUsed,
        Strategy::RoundRobin,
        Strategy::LeastConnections,
    ] {
        let (spec, m) = spec("excl", 2, strategy, None, Duration::from_secs(30));
        let c = b.clients(1, &spec).await;
        let s = &c[0];
        assert_eq!(
            s.acquire(
                &spec.name,
                Want::Any {
                    exclude: &m,
                    within: None
                }
            )
            .await
            .unwrap(),
            Acquired::NoCandidates
        );
        let g = granted(
            s.acquire(
                &spec.name,
                Want::Any {
                    exclude: &m[..1],
                    within: None,
                },
            )
            .await
            .unwrap(),
        );
        assert_eq!(g.upstream, m[1], "{strategy:?}");
        release(s, &spec.name, &g).await;
        // Nobody eligible is no candidate either.
        for id in &m {
            s.set_member(&spec.name, id, QUARANTINED, None)
                .await
                .unwrap();
        }
        assert_eq!(
            s.acquire(&spec.name, ANY).await.unwrap(),
            Acquired::NoCandidates,
            "{strategy:?}"
        );
        assert_healthy(&c);
    }
}

/// A pool larger than one declaration call holds (the Redis store declares it in stages), then
/// reloaded by two instances at once with members leaving, joining in the middle and moving:
/// every member of the new list, and only those, can be leased.
async fn a_large_pool_is_declared_and_reloaded_whole(b: &Backend) {
    let (first, m) = spec(
        "large",
        2_500,
        Strategy::LeastUsed,
        Some(1),
        Duration::from_secs(60),
    );
    let c = b.clients(2, &first).await;
    let mut members: Vec<UpstreamId> = m
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 7 != 0)
        .map(|(_, id)| id.clone())
        .collect();
    let joined = (0..150).map(|i| UpstreamId::new(format!("http://10.9.0.{i}:3128")));
    members.splice(1_200..1_200, joined);
    members.swap(3, 2_000);
    let second = PoolSpec {
        members: members.clone(),
        ..first.clone()
    };
    let (r0, r1) = tokio::join!(
        c[0].configure(second.clone()),
        c[1].configure(second.clone())
    );
    r0.unwrap();
    r1.unwrap();
    // A cap of one: leasing until the pool is full grants each member of the new list once.
    let mut got = HashSet::new();
    for i in 0..members.len() {
        let g = granted(c[i % 2].acquire(&second.name, ANY).await.unwrap());
        assert!(
            got.insert(g.upstream.clone()),
            "{} granted twice",
            g.upstream
        );
    }
    assert_eq!(
        c[0].acquire(&second.name, ANY).await.unwrap(),
        Acquired::AtCapacity
    );
    let want: HashSet<UpstreamId> = members.into_iter().collect();
    assert!(got == want, "the leased members are not the declared list");
}

async fn strategies_rotate(b: &Backend) {
    let (spec_rr, m) = spec("rr", 3, Strategy::RoundRobin, None, Duration::from_secs(30));
    let c = b.clients(2, &spec_rr).await;
    let mut seen = Vec::new();
    for i in 0..6 {
        let s = &c[i % 2];
        let g = granted(s.acquire(&spec_rr.name, ANY).await.unwrap());
        release(s, &spec_rr.name, &g).await;
        seen.push(g.upstream);
    }
    let expect: Vec<UpstreamId> = m.iter().chain(m.iter()).cloned().collect();
    assert_eq!(seen, expect);
    // A member of cost 2 takes one turn in two.
    c[0].set_member(
        &spec_rr.name,
        &m[1],
        MemberState {
            eligible: true,
            keeps_sessions: true,
            cost: 2,
        },
        None,
    )
    .await
    .unwrap();
    let mut counts: HashMap<UpstreamId, usize> = HashMap::new();
    for _ in 0..10 {
        let g = granted(c[1].acquire(&spec_rr.name, ANY).await.unwrap());
        release(&c[1], &spec_rr.name, &g).await;
        *counts.entry(g.upstream).or_default() += 1;
    }
    assert_eq!(counts.get(&m[1]).copied().unwrap_or(0), 2, "{counts:?}");

    let (spec_lc, _) = spec(
        "lc",
        3,
        Strategy::LeastConnections,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec_lc).await;
    let a = granted(c[0].acquire(&spec_lc.name, ANY).await.unwrap());
    let bb = granted(c[1].acquire(&spec_lc.name, ANY).await.unwrap());
    assert_ne!(a.upstream, bb.upstream);
    release(&c[0], &spec_lc.name, &a).await;
    let d = granted(c[0].acquire(&spec_lc.name, ANY).await.unwrap());
    assert_ne!(d.upstream, bb.upstream, "b still holds a connection");
    assert_healthy(&c);
}

async fn sessions_bind_once_and_slide(b: &Backend) {
    let (spec, m) = spec(
        "sess",
        4,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let long = Duration::from_secs(30);
    // Two clients binding the same new key at once, preferring different upstreams: the binding
    // is set-if-absent, so both leave through the winner's choice.
    for round in 0..20 {
        let key = format!("race-{round}");
        let pa = vec![m[round % 4].clone()];
        let pb = vec![m[(round + 1) % 4].clone()];
        let (ga, gb) = tokio::join!(
            c[0].acquire(&spec.name, session(&key, long, &pa, false)),
            c[1].acquire(&spec.name, session(&key, long, &pb, false)),
        );
        let (ga, gb) = (granted(ga.unwrap()), granted(gb.unwrap()));
        assert_eq!(ga.upstream, gb.upstream, "round {round}");
        assert!(ga.bound_now ^ gb.bound_now, "exactly one bound it");
        release(&c[0], &spec.name, &ga).await;
        release(&c[1], &spec.name, &gb).await;
    }
    // Sliding TTL: each use pushes the expiry out; a live binding ignores a new preference.
    let ttl = Duration::from_millis(600);
    let first = vec![m[2].clone(), m[0].clone()];
    let other = vec![m[1].clone()];
    let g = granted(
        c[0].acquire(&spec.name, session("slide", ttl, &first, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[2].clone(), true));
    release(&c[0], &spec.name, &g).await;
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(350)).await;
        let g = granted(
            c[i % 2]
                .acquire(&spec.name, session("slide", ttl, &other, false))
                .await
                .unwrap(),
        );
        assert_eq!((g.upstream.clone(), g.bound_now), (m[2].clone(), false));
        release(&c[i % 2], &spec.name, &g).await;
    }
    // Unused past its TTL, it is gone: the next use binds afresh.
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let g = granted(
        c[1].acquire(&spec.name, session("slide", ttl, &other, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[1].clone(), true));
    release(&c[1], &spec.name, &g).await;
    assert!(c[0].status(&spec.name).await.unwrap().sessions_live >= 1);
    // Unbind deletes only a binding that still points at the given upstream.
    c[0].unbind(&spec.name, "slide", &m[0]).await.unwrap();
    let g = granted(
        c[0].acquire(&spec.name, session("slide", ttl, &first, false))
            .await
            .unwrap(),
    );
    assert_eq!(g.upstream, m[1]);
    release(&c[0], &spec.name, &g).await;
    c[0].unbind(&spec.name, "slide", &m[1]).await.unwrap();
    let g = granted(
        c[1].acquire(&spec.name, session("slide", ttl, &first, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[2].clone(), true));
    release(&c[1], &spec.name, &g).await;
    assert_healthy(&c);
}

async fn sessions_live(s: &AnyStore, pool: &str) -> u64 {
    s.status(pool).await.unwrap().sessions_live
}

/// A session acquire that must be granted, its lease released at once; returns its grant.
async fn sticky_once(s: &AnyStore, pool: &str, want: Want<'_>) -> Grant {
    let g = granted(s.acquire(pool, want).await.unwrap());
    release(s, pool, &g).await;
    g
}

/// `/status`'s `sessions_live`, seen from either client: up on a bind, unchanged by a renewal
/// and by a rebind, down on an unbind, an end and an expiry. Both stores count a binding until
/// the end of the second its expiry falls in, so the expiry is awaited for up to a second more
/// than the TTL, and never seen before the TTL.
async fn session_count_follows_bindings(b: &Backend) {
    let (spec, m) = spec(
        "count",
        3,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let pool = spec.name.as_str();
    let long = Duration::from_secs(30);
    let (p0, p1) = (vec![m[0].clone()], vec![m[1].clone()]);
    assert_eq!(sessions_live(&c[0], pool).await, 0);

    let a = sticky_once(&c[0], pool, session("a", long, &p0, false)).await;
    assert!(a.bound_now);
    assert_eq!(sessions_live(&c[1], pool).await, 1, "a bind counts");
    for i in 0..3 {
        let g = sticky_once(&c[i % 2], pool, session("a", long, &p1, false)).await;
        assert_eq!((g.upstream, g.bound_now), (m[0].clone(), false));
        assert_eq!(sessions_live(&c[(i + 1) % 2], pool).await, 1, "a renewal");
    }
    sticky_once(&c[1], pool, session("b", long, &p1, false)).await;
    assert_eq!(sessions_live(&c[0], pool).await, 2);

    // A rebind (the bound member dead) replaces the binding.
    let dead = DEAD;
    c[0].set_member(pool, &m[0], dead, None).await.unwrap();
    let g = sticky_once(&c[1], pool, session("a", long, &p1, true)).await;
    assert_eq!((g.upstream, g.bound_now), (m[1].clone(), true));
    assert_eq!(sessions_live(&c[0], pool).await, 2, "a rebind");

    // An unbind naming another upstream leaves it; the right one takes it out.
    c[0].unbind(pool, "b", &m[2]).await.unwrap();
    assert_eq!(sessions_live(&c[1], pool).await, 2);
    c[0].unbind(pool, "b", &m[1]).await.unwrap();
    assert_eq!(sessions_live(&c[1], pool).await, 1, "an unbind");
    assert!(c[1].end_session(pool, "a").await.unwrap());
    assert!(!c[1].end_session(pool, "a").await.unwrap());
    assert_eq!(sessions_live(&c[0], pool).await, 0, "an end");

    // Left to expire (renewed once on the way), it stops counting within a second of its
    // expiry.
    let ttl = Duration::from_millis(300);
    sticky_once(&c[0], pool, session("c", ttl, &p1, false)).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    sticky_once(&c[1], pool, session("c", ttl, &p1, false)).await;
    let renewed = Instant::now();
    assert_eq!(sessions_live(&c[0], pool).await, 1);
    let mut gone = None;
    for _ in 0..60 {
        if sessions_live(&c[0], pool).await == 0 {
            gone = Some(renewed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone = gone.expect("the count fell after the expiry");
    assert!(
        gone >= ttl - Duration::from_millis(50),
        "counted for {gone:?} of a {ttl:?} TTL"
    );
    assert!(
        gone <= ttl + Duration::from_millis(1000 + 700),
        "still counted {gone:?} after a {ttl:?} TTL"
    );
    sticky_once(&c[0], pool, session("c", long, &p1, false)).await;
    assert_eq!(sessions_live(&c[1], pool).await, 1, "bound afresh");
    assert_healthy(&c);
}

/// Label filters: acquires within a subset take only its members (the subset made from the
/// members sent, then named only), with the pool's caps; a subset whose members are all out of
/// service has no candidates; a session inside a subset whose bound member left the subset
/// (its labels changed: a new subset without it) is unavailable, or rebinds inside the new one.
async fn acquire_within_a_subset(b: &Backend) {
    let (spec, m) = spec(
        "within",
        6,
        Strategy::LeastUsed,
        Some(1),
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let us = vec![m[1].clone(), m[3].clone()];
    let within = Some(Subset {
        id: "country=us#1",
        members: &us,
    });
    let any = Want::Any {
        exclude: &[],
        within,
    };
    let a = granted(c[0].acquire(&spec.name, any).await.unwrap());
    let b2 = granted(c[1].acquire(&spec.name, any).await.unwrap());
    let mut got = vec![a.upstream.clone(), b2.upstream.clone()];
    got.sort();
    assert_eq!(got, us, "each member of the subset once: the cap is 1");
    assert_eq!(
        c[0].acquire(&spec.name, any).await.unwrap(),
        Acquired::AtCapacity
    );
    // Outside the filter there is room.
    let other = granted(c[0].acquire(&spec.name, ANY).await.unwrap());
    assert!(!us.contains(&other.upstream));
    for g in [&a, &b2, &other] {
        release(&c[0], &spec.name, g).await;
    }
    // Both members out of service: nothing to choose inside the filter.
    let out = DEAD;
    for id in &us {
        c[0].set_member(&spec.name, id, out, None).await.unwrap();
    }
    assert_eq!(
        c[1].acquire(&spec.name, any).await.unwrap(),
        Acquired::NoCandidates
    );
    for id in &us {
        c[0].set_member(&spec.name, id, MemberState::IN_SERVICE, None)
            .await
            .unwrap();
    }
    // A session inside the filter binds a member of it.
    let ttl = Duration::from_secs(30);
    let sticky = |within, preferred, rebind| Want::Session {
        key: "s1|country=us",
        ttl,
        preferred,
        rebind,
        within,
    };
    let g = granted(
        c[0].acquire(&spec.name, sticky(within, &us, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (us[0].clone(), true));
    release(&c[0], &spec.name, &g).await;
    // Its member's labels change: the filter's new subset no longer holds it.
    let now_us = vec![m[3].clone()];
    let changed = Some(Subset {
        id: "country=us#2",
        members: &now_us,
    });
    assert_eq!(
        c[1].acquire(&spec.name, sticky(changed, &now_us, false))
            .await
            .unwrap(),
        Acquired::SessionUnavailable(us[0].clone())
    );
    let g = granted(
        c[1].acquire(&spec.name, sticky(changed, &now_us, true))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[3].clone(), true));
    release(&c[1], &spec.name, &g).await;
    assert_healthy(&c);
}

async fn session_unavailable_and_rebind(b: &Backend) {
    let (spec, m) = spec(
        "unavail",
        3,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let ttl = Duration::from_secs(30);
    let pref = vec![m[0].clone(), m[1].clone()];
    let g = granted(
        c[0].acquire(&spec.name, session("k", ttl, &pref, false))
            .await
            .unwrap(),
    );
    assert_eq!(g.upstream, m[0]);
    release(&c[0], &spec.name, &g).await;
    // Quarantined: the session keeps it (no teleporting), new sessions go elsewhere.
    let quarantined = QUARANTINED;
    c[0].set_member(&spec.name, &m[0], quarantined, None)
        .await
        .unwrap();
    let g = granted(
        c[1].acquire(&spec.name, session("k", ttl, &pref, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[0].clone(), false));
    release(&c[1], &spec.name, &g).await;
    let g = granted(
        c[1].acquire(&spec.name, session("k2", ttl, &pref, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[1].clone(), true));
    release(&c[1], &spec.name, &g).await;
    // Dead: the session fails clearly, unless the pool rebinds.
    let dead = DEAD;
    c[1].set_member(&spec.name, &m[0], dead, None)
        .await
        .unwrap();
    assert_eq!(
        c[0].acquire(&spec.name, session("k", ttl, &pref, false))
            .await
            .unwrap(),
        Acquired::SessionUnavailable(m[0].clone())
    );
    let g = granted(
        c[0].acquire(&spec.name, session("k", ttl, &pref, true))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[1].clone(), true));
    release(&c[0], &spec.name, &g).await;
    // No eligible preferred member at all.
    let only_dead = vec![m[0].clone()];
    assert_eq!(
        c[0].acquire(&spec.name, session("k3", ttl, &only_dead, false))
            .await
            .unwrap(),
        Acquired::NoCandidates
    );
    assert_healthy(&c);
}

/// A new session binds to the first member of its order that is in service *and* has room: a
/// member at its cap is passed over (another client holds it), an ineligible one too; only when
/// every eligible member offered is at its cap does the new session wait, and a live binding
/// still waits for its own upstream.
async fn new_sessions_pass_over_members_at_their_cap(b: &Backend) {
    let (spec, m) = spec(
        "newcap",
        4,
        Strategy::LeastUsed,
        Some(1),
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let pool = &spec.name;
    let ttl = Duration::from_secs(30);
    let order = vec![m[0].clone(), m[1].clone(), m[2].clone(), m[3].clone()];
    // Client 0's session holds m0, the first choice of every key below.
    let held = granted(
        c[0].acquire(pool, session("holder", ttl, &order, false))
            .await
            .unwrap(),
    );
    assert_eq!(
        (held.upstream.clone(), held.bound_now),
        (m[0].clone(), true)
    );
    // A new key on the other client: m0 is at its cap, so m1 is bound at once.
    let g = granted(
        c[1].acquire(pool, session("fresh", ttl, &order, false))
            .await
            .unwrap(),
    );
    assert_eq!((g.upstream.clone(), g.bound_now), (m[1].clone(), true));
    // m2 out of service: the next new key passes over it as well as over m0 and m1 (held).
    c[1].set_member(pool, &m[2], QUARANTINED, None)
        .await
        .unwrap();
    let g3 = granted(
        c[0].acquire(pool, session("third", ttl, &order, false))
            .await
            .unwrap(),
    );
    assert_eq!((g3.upstream.clone(), g3.bound_now), (m[3].clone(), true));
    // Every eligible member offered is at its cap: a new key waits (at capacity), it is not
    // refused as if nobody were in service.
    assert_eq!(
        c[1].acquire(pool, session("fourth", ttl, &order, false))
            .await
            .unwrap(),
        Acquired::AtCapacity
    );
    // A live binding waits for its own upstream even when others have room.
    release(&c[1], pool, &g).await;
    assert_eq!(
        c[1].acquire(pool, session("holder", ttl, &order, false))
            .await
            .unwrap(),
        Acquired::AtCapacity
    );
    release(&c[0], pool, &held).await;
    release(&c[0], pool, &g3).await;
    assert_healthy(&c);
}

async fn set_member_eligibility_and_returning_score(b: &Backend) {
    let (spec, m) = spec(
        "member",
        3,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let pool = &spec.name;
    let mut heard = c[0].subscribe_member_changes();
    for _ in 0..3 {
        let g = granted(c[0].acquire(pool, ANY).await.unwrap());
        release(&c[0], pool, &g).await;
    }
    let out = QUARANTINED;
    c[1].set_member(pool, &m[0], out, None).await.unwrap();
    if b.is_redis() {
        // c[0] restores the member below. Until it has heard of this quarantine, its restore
        // would be a decision on a stale view, which Redis refuses by design.
        let change = tokio::time::timeout(Duration::from_secs(2), heard.recv())
            .await
            .expect("the quarantine reached the other instance")
            .unwrap();
        assert_eq!((change.upstream, change.state), (m[0].clone(), out));
    }
    for i in 0..20 {
        let g = granted(c[i % 2].acquire(pool, ANY).await.unwrap());
        assert_ne!(g.upstream, m[0], "a quarantined member is no candidate");
        release(&c[i % 2], pool, &g).await;
    }
    let a = allocations(&c[0], pool).await;
    assert_eq!(a[m[0].as_str()], 1, "{a:?}");
    assert_eq!(a[m[1].as_str()], 11, "{a:?}");
    // Returning: max(its old score, the current minimum), so it is not flooded.
    c[0].set_member(pool, &m[0], MemberState::IN_SERVICE, None)
        .await
        .unwrap();
    let a = allocations(&c[1], pool).await;
    assert_eq!(a[m[0].as_str()], 11, "{a:?}");
    // Cost 2 takes half the share of cost 1 (least-used grows the score by the cost).
    c[1].set_member(
        pool,
        &m[1],
        MemberState {
            eligible: true,
            keeps_sessions: true,
            cost: 2,
        },
        None,
    )
    .await
    .unwrap();
    let mut picks: HashMap<UpstreamId, i64> = HashMap::new();
    for i in 0..40 {
        let g = granted(c[i % 2].acquire(pool, ANY).await.unwrap());
        release(&c[i % 2], pool, &g).await;
        *picks.entry(g.upstream).or_default() += 1;
    }
    assert!((picks[&m[1]] - 8).abs() <= 1, "{picks:?}");
    assert!((picks[&m[0]] - 16).abs() <= 1, "{picks:?}");
    assert_healthy(&c);
}

async fn lease_expiry_returns_capacity(b: &Backend) {
    let ttl = Duration::from_millis(400);
    let (spec, _) = spec("expiry", 1, Strategy::LeastUsed, Some(1), ttl);
    let c = b.clients(2, &spec).await;
    // A gateway that dies holding its lease never releases it.
    let lost = granted(c[0].acquire(&spec.name, ANY).await.unwrap());
    let started = Instant::now();
    assert_eq!(
        c[1].acquire(&spec.name, ANY).await.unwrap(),
        Acquired::AtCapacity
    );
    // Woken by the expiry itself, not by polling.
    let signal = c[1].release_signal(&spec.name);
    let mut got = None;
    for _ in 0..10 {
        let notified = signal.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        match c[1].acquire(&spec.name, ANY).await.unwrap() {
            Acquired::Granted(g) => {
                got = Some(g);
                break;
            }
            Acquired::AtCapacity => {
                let _ = tokio::time::timeout(Duration::from_secs(3), notified).await;
            }
            other => panic!("{other:?}"),
        }
    }
    let g = got.expect("capacity came back");
    let waited = started.elapsed();
    assert!(
        waited >= ttl - Duration::from_millis(100) && waited < ttl + Duration::from_millis(800),
        "capacity back after {waited:?} (lease ttl {ttl:?})"
    );
    assert_eq!(g.upstream, lost.upstream);
    // The lost lease's late release frees nothing twice.
    release(&c[0], &spec.name, &lost).await;
    assert_eq!(
        c[0].acquire(&spec.name, ANY).await.unwrap(),
        Acquired::AtCapacity
    );
    release(&c[1], &spec.name, &g).await;
    assert_healthy(&c);
}

/// Releases that arrive together (the Redis store sends them in shared calls) each end their
/// lease exactly once and each count their outcome, including a lease released twice at once.
async fn concurrent_releases_end_every_lease_once(b: &Backend) {
    let (spec, ids) = spec(
        "releases",
        5,
        Strategy::LeastUsed,
        Some(40),
        Duration::from_secs(60),
    );
    let c = b.clients(2, &spec).await;
    let mut grants = Vec::new();
    for _ in 0..150 {
        grants.push(granted(c[0].acquire(&spec.name, ANY).await.unwrap()));
    }
    let mut set = tokio::task::JoinSet::new();
    // Every lease once (alternating clients), and the first ten a second time from the other one.
    for (i, g) in grants.iter().chain(&grants[..10]).enumerate() {
        let s = c[if i < 150 { i % 2 } else { (i + 1) % 2 }].clone();
        let (pool, g) = (spec.name.clone(), g.clone());
        let outcome = if i % 3 == 0 {
            Outcome::ConnectError
        } else {
            Outcome::Ok
        };
        set.spawn(async move {
            s.release(
                &pool,
                &g.upstream,
                g.lease,
                outcome,
                Duration::from_millis(2),
            )
            .await
            .unwrap();
        });
    }
    while let Some(r) = tokio::time::timeout(Duration::from_secs(10), set.join_next())
        .await
        .expect("releases answered")
    {
        r.unwrap();
    }
    let count = |st: &PoolStatus, key: &str| -> u64 {
        st.members
            .iter()
            .map(|m| m.outcomes.get(key).copied().unwrap_or(0))
            .sum()
    };
    // Another instance's figures reach Redis within about a second (see `stats.rs`).
    let mut st = c[1].status(&spec.name).await.unwrap();
    for _ in 0..60 {
        if count(&st, "connect_error") + count(&st, "ok") >= 160 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        st = c[1].status(&spec.name).await.unwrap();
    }
    assert!(st.members.iter().all(|m| m.leases_live == 0), "{st:?}");
    assert_eq!(count(&st, "connect_error"), 54, "{st:?}");
    assert_eq!(count(&st, "ok"), 106, "{st:?}");
    // Nothing was freed twice or kept: exactly the cap of every member can be leased again.
    let mut again = 0;
    loop {
        match c[1].acquire(&spec.name, ANY).await.unwrap() {
            Acquired::Granted(_) => again += 1,
            Acquired::AtCapacity => break,
            other => panic!("{other:?}"),
        }
        assert!(again <= 40 * ids.len(), "granted past every cap");
    }
    assert_eq!(again, 40 * ids.len());
    assert_healthy(&c);
}

async fn extend_keeps_a_lease_alive(b: &Backend) {
    let ttl = Duration::from_millis(400);
    let (spec, _) = spec("extend", 1, Strategy::LeastUsed, Some(1), ttl);
    let c = b.clients(1, &spec).await;
    let s = &c[0];
    let g = granted(s.acquire(&spec.name, ANY).await.unwrap());
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        s.extend(&spec.name, &g.upstream, g.lease).await.unwrap();
    }
    assert_eq!(
        s.acquire(&spec.name, ANY).await.unwrap(),
        Acquired::AtCapacity,
        "an extended lease outlives its first deadline"
    );
    release(s, &spec.name, &g).await;
    granted(s.acquire(&spec.name, ANY).await.unwrap());
    assert_healthy(&c);
}

async fn locks_exclude_and_stale_tokens_cannot_act(b: &Backend) {
    let (spec, _) = spec(
        "lock",
        1,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(3, &spec).await;
    let name = format!("probe-sweep-{:08x}", rand::random::<u32>());
    let long = Duration::from_secs(30);
    let (a, bb, cc) = tokio::join!(
        c[0].lock(&name, long),
        c[1].lock(&name, long),
        c[2].lock(&name, long)
    );
    let tokens = [a.unwrap(), bb.unwrap(), cc.unwrap()];
    let holders: Vec<usize> = (0..3).filter(|i| tokens[*i].is_some()).collect();
    assert_eq!(holders.len(), 1, "exactly one holder");
    let h = holders[0];
    let t = tokens[h].clone().unwrap();
    assert!(c[(h + 1) % 3].lock(&name, long).await.unwrap().is_none());
    assert!(c[h].unlock(&name, &t).await.unwrap());
    // Expiry: a holder that stops extending (it died) loses the lock.
    let short = Duration::from_millis(300);
    let stale = c[0].lock(&name, short).await.unwrap().expect("free again");
    let started = Instant::now();
    let mut fresh = None;
    for _ in 0..60 {
        if let Some(t) = c[1].lock(&name, long).await.unwrap() {
            fresh = Some(t);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fresh = fresh.expect("the lock expired");
    assert!(started.elapsed() < short + Duration::from_millis(600));
    // The stale token can neither extend nor release the new holder's lock.
    assert!(!c[0].extend_lock(&name, &stale, long).await.unwrap());
    assert!(!c[0].unlock(&name, &stale).await.unwrap());
    assert!(c[2].lock(&name, long).await.unwrap().is_none());
    assert!(c[1].extend_lock(&name, &fresh, long).await.unwrap());
    assert!(c[1].unlock(&name, &fresh).await.unwrap());
    assert!(!c[1].unlock(&name, &fresh).await.unwrap(), "released once");
    assert_healthy(&c);
}

async fn release_signal_woken_by_another_clients_release(b: &Backend) {
    let (spec, _) = spec(
        "wake",
        1,
        Strategy::LeastUsed,
        Some(1),
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let g = granted(c[0].acquire(&spec.name, ANY).await.unwrap());
    let signal = c[1].release_signal(&spec.name);
    let notified = signal.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    assert_eq!(
        c[1].acquire(&spec.name, ANY).await.unwrap(),
        Acquired::AtCapacity
    );
    let started = Instant::now();
    release(&c[0], &spec.name, &g).await;
    tokio::time::timeout(Duration::from_secs(2), notified)
        .await
        .expect("woken by the other client's release");
    assert!(started.elapsed() < Duration::from_millis(500));
    granted(c[1].acquire(&spec.name, ANY).await.unwrap());
    assert_healthy(&c);
}

async fn member_changes_reach_other_instances(b: &Backend) {
    let (spec, m) = spec(
        "changes",
        2,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    let mut theirs = c[1].subscribe_member_changes();
    let mut mine = c[0].subscribe_member_changes();
    let out = QUARANTINED;
    let started = Instant::now();
    c[0].set_member(&spec.name, &m[0], out, None).await.unwrap();
    if b.is_redis() {
        let change = tokio::time::timeout(Duration::from_secs(2), theirs.recv())
            .await
            .expect("delivered")
            .unwrap();
        let took = started.elapsed();
        assert_eq!(
            change,
            MemberChange {
                pool: spec.name.clone(),
                upstream: m[0].clone(),
                state: out
            }
        );
        eprintln!("member change delivered to the other instance in {took:?}");
        assert!(took < Duration::from_millis(100), "took {took:?}");
        // Applying the same setting again publishes nothing.
        c[1].set_member(&spec.name, &m[0], out, None).await.unwrap();
    }
    // An instance does not hear its own decisions back.
    assert!(
        tokio::time::timeout(Duration::from_millis(200), mine.recv())
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), theirs.recv())
            .await
            .is_err()
    );
    assert_healthy(&c);
}

async fn listed_members_are_shared_and_announced(b: &Backend) {
    let (spec, _) = spec(
        "listed",
        1,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = b.clients(2, &spec).await;
    assert_eq!(c[0].listed(&spec.name).await.unwrap(), None);
    let mut theirs = c[1].subscribe_listed_changes();
    let mut mine = c[0].subscribe_listed_changes();
    let list = "http://u:p%40ss@10.0.0.7:3128#a\nsocks5://10.0.0.8:1080#b";
    c[0].put_listed(&spec.name, list).await.unwrap();
    assert_eq!(
        c[1].listed(&spec.name).await.unwrap().as_deref(),
        Some(list)
    );
    if b.is_redis() {
        let pool = tokio::time::timeout(Duration::from_secs(2), theirs.recv())
            .await
            .expect("announced")
            .unwrap();
        assert_eq!(pool, spec.name);
        // The same list again announces nothing.
        c[0].put_listed(&spec.name, list).await.unwrap();
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), theirs.recv())
            .await
            .is_err()
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(50), mine.recv())
            .await
            .is_err(),
        "an instance does not hear its own list back"
    );
    c[1].put_listed(&spec.name, "").await.unwrap();
    assert_eq!(c[0].listed(&spec.name).await.unwrap().as_deref(), Some(""));
    assert!(c[0].listed("no-such-pool").await.is_err());
    assert_healthy(&c);
}

// ---------------------------------------------------------------------------------------------
// The suite, per backend.

macro_rules! suite {
    ($($case:ident),* $(,)?) => {
        /// The embedded store.
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(&super::Backend::Memory).await;
                }
            )*
        }

        /// One Redis server per case.
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let server = super::RedisServer::start().await;
                    super::$case(&super::Backend::Redis(server.url())).await;
                }
            )*
        }

        /// Every case on one three-node cluster (each case uses its own pool, so its own slot).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn redis_cluster_runs_every_case() {
            common::init_tracing();
            let cluster = RedisCluster::start().await;
            let backend = Backend::Redis(cluster.url());
            $(
                eprintln!("cluster case: {}", stringify!($case));
                $case(&backend).await;
            )*
        }
    };
}

suite!(
    least_used_balance,
    a_large_pool_is_declared_and_reloaded_whole,
    acquire_within_a_subset,
    cap_never_exceeded_under_concurrent_acquires,
    cap_never_exceeded_within_a_subset_under_concurrent_acquires,
    exclusion_and_no_candidates,
    strategies_rotate,
    sessions_bind_once_and_slide,
    session_count_follows_bindings,
    session_unavailable_and_rebind,
    new_sessions_pass_over_members_at_their_cap,
    set_member_eligibility_and_returning_score,
    lease_expiry_returns_capacity,
    concurrent_releases_end_every_lease_once,
    extend_keeps_a_lease_alive,
    locks_exclude_and_stale_tokens_cannot_act,
    release_signal_woken_by_another_clients_release,
    member_changes_reach_other_instances,
    listed_members_are_shared_and_announced,
);

/// An instance that starts serving a pool adopts the settings other instances gave its members
/// before (a quarantine, a cost), and hands them to its subscribers as changes, so its health
/// view starts from what the pool is; members in their default setting give no change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_instance_joining_a_pool_adopts_its_members_settings() {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, m) = spec(
        "joining",
        4,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let first = backend.clients(1, &spec).await;
    let out = QUARANTINED;
    let dear = MemberState {
        eligible: true,
        keeps_sessions: true,
        cost: 3,
    };
    first[0]
        .set_member(&spec.name, &m[0], out, None)
        .await
        .unwrap();
    first[0]
        .set_member(&spec.name, &m[2], dear, None)
        .await
        .unwrap();

    let late = redis_store(&server.url(), 9);
    let mut heard = late.subscribe_member_changes();
    late.configure(spec.clone()).await.unwrap();
    let mut changes = Vec::new();
    while let Ok(c) = heard.try_recv() {
        changes.push((c.upstream, c.state));
    }
    changes.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    assert_eq!(changes, vec![(m[0].clone(), out), (m[2].clone(), dear)]);
    // Declaring it again (a reload) adopts nothing more.
    late.configure(spec.clone()).await.unwrap();
    assert!(heard.try_recv().is_err());
}

/// An instance that declared a pool while Redis was out of its reach adopts, once it reaches
/// Redis, the settings other instances made meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_instance_back_from_an_outage_adopts_what_others_decided() {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, m) = spec(
        "outage",
        3,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let first = backend.clients(1, &spec).await;
    let out = QUARANTINED;
    first[0]
        .set_member(&spec.name, &m[1], out, None)
        .await
        .unwrap();

    server.pause();
    let late = redis_store(&server.url(), 9);
    let mut heard = late.subscribe_member_changes();
    late.configure(spec.clone()).await.unwrap();
    assert_eq!(late.health(), "degraded");
    assert!(heard.try_recv().is_err(), "nothing read while out of reach");
    server.resume();
    let change = tokio::time::timeout(Duration::from_secs(15), heard.recv())
        .await
        .expect("the quarantine adopted once Redis answers")
        .unwrap();
    assert_eq!((change.upstream, change.state), (m[1].clone(), out));
    assert_eq!(late.health(), "ok");
}

/// A health decision made before its instance heard of another instance's quarantine does not
/// undo it, even when the instance's store has heard of it by the time the decision is applied:
/// what counts is what the decider knew. (Two instances seeing the same captchas: one
/// quarantines, the other, a moment behind, only degrades.) A decision made knowing of the
/// quarantine still returns the member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_decision_made_before_a_quarantine_was_heard_does_not_undo_it() {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, m) = spec(
        "stale",
        2,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(30),
    );
    let c = backend.clients(2, &spec).await;
    let pool = &spec.name;
    let mut heard = c[0].subscribe_member_changes();
    let out = QUARANTINED;
    c[1].set_member(pool, &m[0], out, None).await.unwrap();
    let change = tokio::time::timeout(Duration::from_secs(2), heard.recv())
        .await
        .expect("the quarantine reached the other instance")
        .unwrap();
    assert_eq!(change.state, out);
    let degraded = MemberState {
        eligible: true,
        keeps_sessions: true,
        cost: 2,
    };
    c[0].set_member(pool, &m[0], degraded, Some(MemberState::IN_SERVICE))
        .await
        .unwrap();
    let state = server.cli(&["HGET", &format!("pgtest:{{{pool}}}:state"), m[0].as_str()]);
    assert!(
        state.starts_with("0|1|1|"),
        "the quarantine was undone: {state}"
    );
    for i in 0..10 {
        let g = granted(c[i % 2].acquire(pool, ANY).await.unwrap());
        assert_ne!(g.upstream, m[0], "a quarantined member is no candidate");
        release(&c[i % 2], pool, &g).await;
    }
    c[0].set_member(pool, &m[0], MemberState::IN_SERVICE, Some(out))
        .await
        .unwrap();
    let state = server.cli(&["HGET", &format!("pgtest:{{{pool}}}:state"), m[0].as_str()]);
    assert!(state.starts_with("1|1|1|"), "not returned: {state}");
    assert_healthy(&c);
}

/// The Redis store sends the plain acquires, and the releases, that arrive while a call of their
/// kind is under way in shared calls: 120 of each at once take a few calls, not 120, and every
/// one gets its own answer (distinct leases, balanced as least-used, every lease ended). Under a
/// cap, so that the leases are listed and each release goes to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acquires_and_releases_arriving_together_share_calls() {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, _) = spec(
        "batch",
        4,
        Strategy::LeastUsed,
        Some(1000),
        Duration::from_secs(60),
    );
    let c = backend.clients(1, &spec).await;
    let evalsha = || server.command_calls()["evalsha"];

    let before = evalsha();
    let grants = acquire_together(&c[0], &spec.name, 120).await;
    let calls = evalsha() - before;
    assert!((1..=20).contains(&calls), "120 acquires took {calls} calls");
    let leases: std::collections::HashSet<_> = grants.iter().map(|g| g.lease).collect();
    assert_eq!(leases.len(), 120, "every acquire got its own lease");
    let mut per: HashMap<String, usize> = HashMap::new();
    for g in &grants {
        *per.entry(g.upstream.to_string()).or_default() += 1;
    }
    assert!(per.len() == 4 && per.values().all(|&n| n == 30), "{per:?}");

    let before = evalsha();
    let mut set = tokio::task::JoinSet::new();
    for g in grants {
        let (s, pool) = (c[0].clone(), spec.name.clone());
        set.spawn(async move { release(&s, &pool, &g).await });
    }
    while let Some(r) = tokio::time::timeout(Duration::from_secs(10), set.join_next())
        .await
        .expect("releases answered")
    {
        r.unwrap();
    }
    let calls = evalsha() - before;
    assert!((1..=20).contains(&calls), "120 releases took {calls} calls");
    let st = c[0].status(&spec.name).await.unwrap();
    assert!(st.members.iter().all(|m| m.leases_live == 0), "{st:?}");
    let ok: u64 = st.members.iter().map(|m| m.outcomes["ok"]).sum();
    assert_eq!(ok, 120);
    assert_healthy(&c);
}

/// Acquires within a label filter that arrive together share calls too, once the subset's
/// members were sent: 120 at once take a few calls, each gets its own lease, and the subset's
/// members share them evenly (least-used counts allocations through the filter). When the
/// subset has gone from Redis, the batch is answered for each acquire and each asks again with
/// the members: none fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_acquires_within_a_subset_arriving_together_share_calls() {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, m) = spec(
        "within-batch",
        8,
        Strategy::LeastUsed,
        Some(1000),
        Duration::from_secs(60),
    );
    let c = backend.clients(1, &spec).await;
    let us: Arc<Vec<UpstreamId>> = Arc::new(vec![m[0].clone(), m[3].clone(), m[5].clone()]);
    let evalsha = || server.command_calls()["evalsha"];
    let together = |n: usize| acquire_together_within(&c[0], &spec.name, n, Some(&us));
    // The first sends the members.
    let mut grants = together(1).await;
    let before = evalsha();
    grants.extend(together(119).await);
    let calls = evalsha() - before;
    assert!((1..=20).contains(&calls), "119 acquires took {calls} calls");
    let leases: std::collections::HashSet<_> = grants.iter().map(|g| g.lease).collect();
    assert_eq!(leases.len(), 120, "every acquire got its own lease");
    let mut per: HashMap<UpstreamId, usize> = HashMap::new();
    for g in &grants {
        *per.entry(g.upstream.clone()).or_default() += 1;
    }
    assert!(
        per.len() == 3 && per.keys().all(|u| us.contains(u)) && per.values().all(|&n| n == 40),
        "{per:?}"
    );

    let subset_key = format!("pgtest:{{{}}}:sub:country=us#1", spec.name);
    assert_eq!(
        server.cli(&["DEL", &subset_key]).trim(),
        "1",
        "the key's name"
    );
    let again = together(30).await;
    assert!(again.iter().all(|g| us.contains(&g.upstream)), "{again:?}");
    assert_eq!(
        server.cli(&["EXISTS", &subset_key]).trim(),
        "1",
        "made again"
    );
    for g in grants.iter().chain(&again) {
        release(&c[0], &spec.name, g).await;
    }
    let st = c[0].status(&spec.name).await.unwrap();
    assert!(st.members.iter().all(|m| m.leases_live == 0), "{st:?}");
    assert_healthy(&c);
}

/// Without a cap (and not least-connections) the Redis store's leases are unlisted: a release
/// sends nothing, and each instance reports its count once a second, which another instance's
/// status adds; an instance's own status counts its leases and outcomes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unlisted_leases_are_released_without_a_call_and_reported_to_other_instances() {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, _) = spec(
        "unlisted",
        3,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(60),
    );
    let c = backend.clients(2, &spec).await;
    let evalsha = || server.command_calls()["evalsha"];
    let mut grants = Vec::new();
    for _ in 0..6 {
        grants.push(granted(c[0].acquire(&spec.name, ANY).await.unwrap()));
    }
    assert_eq!(live(&c[0].status(&spec.name).await.unwrap()), 6);
    assert_eq!(
        server
            .cli(&["ZCARD", &format!("pgtest:{{{}}}:leases", spec.name)])
            .trim(),
        "1",
        "only the encoding pin is listed"
    );
    let seen = wait_live(&c[1], &spec.name, 6).await;
    assert_eq!(seen, 6, "the other instance counts them within 3 s");

    let before = evalsha();
    for g in &grants {
        release(&c[0], &spec.name, g).await;
    }
    assert_eq!(
        evalsha() - before,
        0,
        "a release of an unlisted lease sends nothing"
    );
    let own = c[0].status(&spec.name).await.unwrap();
    assert_eq!(live(&own), 0);
    let ok: u64 = own.members.iter().map(|m| m.outcomes["ok"]).sum();
    assert_eq!(ok, 6, "its own status counts the outcomes not yet sent");
    let seen = wait_live(&c[1], &spec.name, 0).await;
    assert_eq!(seen, 0, "the other instance sees them end within 3 s");
    assert_healthy(&c);
}

fn live(st: &PoolStatus) -> u64 {
    st.members.iter().map(|m| m.leases_live).sum()
}

/// Polls `store`'s status every 50 ms, for at most 3 s, until it counts `want` live leases;
/// returns the last count.
async fn wait_live(store: &AnyStore, pool: &str, want: u64) -> u64 {
    let started = Instant::now();
    loop {
        let n = live(&store.status(pool).await.unwrap());
        if n == want || started.elapsed() >= Duration::from_secs(3) {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// In a pool whose leases are unlisted, acquires that queue up for a call make it take grants for
/// the requests that follow: those are served without a call of their own. One request at a time
/// never forms that stock (every allocation is counted when it is used), every grant in the stock
/// was picked least-used like the others, and a member taken out of service is never granted
/// from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unlisted_pools_under_load_serve_grants_taken_ahead() {
    grants_taken_ahead(None).await;
}

/// The same within a label filter: its subset has a stock of its own, of its members only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_unlisted_pools_under_load_serve_grants_taken_ahead_within_a_filter() {
    grants_taken_ahead(Some(&[0, 2, 3, 5])).await;
}

/// Acquires from a pool of 6 without a cap, or within the members at `within`'s positions.
async fn grants_taken_ahead(within: Option<&[usize]>) {
    let server = RedisServer::start().await;
    let backend = Backend::Redis(server.url());
    let (spec, m) = spec(
        "stock",
        6,
        Strategy::LeastUsed,
        None,
        Duration::from_secs(60),
    );
    let subset: Option<Arc<Vec<UpstreamId>>> =
        within.map(|at| Arc::new(at.iter().map(|&i| m[i].clone()).collect()));
    let choosable = subset.as_deref().cloned().unwrap_or_else(|| m.clone());
    let c = backend.clients(1, &spec).await;
    let evalsha = || server.command_calls()["evalsha"];
    let total = |a: &HashMap<String, u64>| a.values().sum::<u64>();
    let one = || async {
        let want = Want::Any {
            exclude: &[],
            within: subset.as_deref().map(|members| Subset {
                id: "country=us#1",
                members,
            }),
        };
        granted(c[0].acquire(&spec.name, want).await.unwrap())
    };

    let before = evalsha();
    for _ in 0..20 {
        one().await;
    }
    let calls = evalsha() - before;
    assert!(
        (20..=22).contains(&calls),
        "{calls} calls: one per lone acquire, and the report once a second"
    );
    assert_eq!(
        total(&allocations(&c[0], &spec.name).await),
        20,
        "nothing taken ahead"
    );

    let before = evalsha();
    let burst = acquire_together_within(&c[0], &spec.name, 60, subset.as_ref()).await;
    let calls = evalsha() - before;
    assert!(calls < 30, "60 acquires at once took {calls} calls");
    let before = evalsha();
    let mut next = Vec::new();
    for _ in 0..10 {
        next.push(one().await);
    }
    let calls = evalsha() - before;
    assert!(
        calls <= 4,
        "the 10 acquires that followed took {calls} calls: the stock serves them"
    );
    let a = allocations(&c[0], &spec.name).await;
    let counted = total(&a);
    assert!(
        (20 + 70..=20 + 70 + 128).contains(&counted),
        "{counted} allocations: the 90 used and at most a stock of 128 more"
    );
    let of = |id: &UpstreamId| a[id.as_str()];
    let lo = choosable.iter().map(of).min().unwrap();
    let hi = choosable.iter().map(of).max().unwrap();
    assert!(hi - lo <= 1, "grants taken ahead are least-used too: {a:?}");
    assert_eq!(
        counted,
        choosable.iter().map(of).sum::<u64>(),
        "only the filter's members were taken: {a:?}"
    );
    assert_eq!(burst.len() + next.len(), 70);

    let out = DEAD;
    c[0].set_member(&spec.name, &m[0], out, None).await.unwrap();
    let mut after = acquire_together_within(&c[0], &spec.name, 40, subset.as_ref()).await;
    for _ in 0..10 {
        after.push(one().await);
    }
    assert!(
        after.iter().all(|g| g.upstream != m[0]),
        "a member out of service is not granted from the stock"
    );
    assert!(
        burst
            .iter()
            .chain(&next)
            .chain(&after)
            .all(|g| choosable.contains(&g.upstream)),
        "within the filter"
    );
    let st = c[0].status(&spec.name).await.unwrap();
    assert_eq!(
        live(&st),
        20 + 70 + 50,
        "every grant is a live lease: {st:?}"
    );
    assert_healthy(&c);
}
