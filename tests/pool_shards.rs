//! Sharded pools (`pools.<name>.shards`): what stays exact across shards (a member's cap, a
//! session's upstream, the pool's status), how plain requests spread and fall over, and, on a
//! Redis Cluster, that the shards spread evenly over the masters while instances still share
//! them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::{
    FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, RedisCluster, RedisServer, TestGateway,
    redis_store,
};
use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::memory::MemoryStore;
use poolgate::store::shard::{Sharded, shard_names, shard_of};
use poolgate::store::{Acquired, AnyStore, Grant, MemberState, PoolSpec, Store, Subset, Want};
use poolgate::upstream::UpstreamId;

const SHARDS: u32 = 4;

type Gateway = Sharded<AnyStore>;

fn ids(n: usize) -> Vec<UpstreamId> {
    (0..n)
        .map(|i| UpstreamId::new(format!("http://10.1.{}.{}:3128", i / 200, i % 200)))
        .collect()
}

fn spec(name: &str, members: &[UpstreamId], cap: Option<u32>, shards: u32) -> PoolSpec {
    PoolSpec {
        name: name.to_string(),
        members: members.to_vec(),
        strategy: Strategy::LeastUsed,
        max_concurrency: cap,
        lease_ttl: Duration::from_secs(60),
        shards,
    }
}

fn unique(case: &str) -> String {
    format!("{case}-{:08x}", rand::random::<u32>())
}

fn memory() -> Gateway {
    Sharded::new(AnyStore::Memory(MemoryStore::new()))
}

/// Pool `p` of `n` members in [`SHARDS`] shards on the embedded store.
async fn sharded(n: usize, cap: Option<u32>) -> (Gateway, Vec<UpstreamId>) {
    let store = memory();
    let members = ids(n);
    store
        .configure(spec("p", &members, cap, SHARDS))
        .await
        .unwrap();
    (store, members)
}

fn on_redis(url: &str, instance: &str) -> Gateway {
    Sharded::new(redis_store(url, "pgshard", instance))
}

const QUARANTINED: MemberState = MemberState {
    eligible: false,
    keeps_sessions: true,
    cost: 1,
};

fn any() -> Want<'static> {
    Want::Any {
        exclude: &[],
        within: None,
    }
}

fn session<'a>(key: &'a str, preferred: &'a [UpstreamId]) -> Want<'a> {
    Want::Session {
        key,
        ttl: Duration::from_secs(600),
        preferred,
        rebind: false,
        within: None,
    }
}

fn granted(a: Acquired) -> Grant {
    match a {
        Acquired::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

async fn release(store: &Gateway, pool: &str, g: &Grant) {
    store
        .release(pool, &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
        .await
        .unwrap();
}

/// A session's preferred order as the gateway offers it: the whole pool, rotated by the key
/// (enough for these tests: every member is offered, in an order that depends on the key).
fn order_for(key: &str, members: &[UpstreamId]) -> Vec<UpstreamId> {
    let start = key.bytes().map(usize::from).sum::<usize>() % members.len();
    members[start..]
        .iter()
        .chain(&members[..start])
        .cloned()
        .collect()
}

#[tokio::test]
async fn each_member_lives_in_the_shard_its_id_names_and_status_reports_the_pool_in_order() {
    let (store, members) = sharded(40, None).await;
    let mut seen = HashSet::new();
    for i in 0..SHARDS as usize {
        let part = store
            .inner()
            .status(&shard_names("p", SHARDS as usize)[i])
            .await
            .unwrap();
        for m in &part.members {
            let id = UpstreamId::new(m.id.as_str());
            assert_eq!(shard_of(&id, SHARDS as usize), i, "{} in shard {i}", m.id);
            assert!(seen.insert(m.id.clone()), "{} in two shards", m.id);
        }
    }
    assert_eq!(seen.len(), 40);
    // The pool itself is not a store pool: only its shards are.
    assert!(store.inner().status("p").await.is_err());
    let status = store.status("p").await.unwrap();
    let listed: Vec<&str> = status.members.iter().map(|m| m.id.as_str()).collect();
    let want: Vec<&str> = members.iter().map(UpstreamId::as_str).collect();
    assert_eq!(listed, want);
}

#[tokio::test]
async fn a_cap_holds_exactly_across_shards() {
    let (store, _) = sharded(24, Some(1)).await;
    let mut grants = Vec::new();
    for _ in 0..24 {
        grants.push(granted(store.acquire("p", any()).await.unwrap()));
    }
    let distinct: HashSet<_> = grants.iter().map(|g| g.upstream.clone()).collect();
    assert_eq!(distinct.len(), 24, "one lease each before anyone gets two");
    assert_eq!(
        store.acquire("p", any()).await.unwrap(),
        Acquired::AtCapacity
    );
    let freed = grants.swap_remove(7);
    release(&store, "p", &freed).await;
    let again = granted(store.acquire("p", any()).await.unwrap());
    assert_eq!(again.upstream, freed.upstream);
    let status = store.status("p").await.unwrap();
    assert_eq!(
        status.members.iter().map(|m| m.leases_live).sum::<u64>(),
        24
    );
}

#[tokio::test]
async fn plain_requests_spread_over_every_shard_and_fall_over_when_one_has_none_in_service() {
    let (store, members) = sharded(32, None).await;
    let mut uses: HashMap<UpstreamId, u32> = HashMap::new();
    for _ in 0..9600 {
        let g = granted(store.acquire("p", any()).await.unwrap());
        release(&store, "p", &g).await;
        *uses.entry(g.upstream).or_default() += 1;
    }
    assert_eq!(uses.len(), 32);
    let (lo, hi) = (uses.values().min().unwrap(), uses.values().max().unwrap());
    // Least-used within a shard, shards in proportion to their members (in runs of requests):
    // 300 each, give or take a few runs' worth.
    assert!(*lo >= 255 && *hi <= 345, "{lo}..{hi}");

    // Every member outside one shard quarantined: every request still finds that shard.
    let keep = shard_of(&members[0], SHARDS as usize);
    for m in &members {
        if shard_of(m, SHARDS as usize) != keep {
            store.set_member("p", m, QUARANTINED, None).await.unwrap();
        }
    }
    for _ in 0..50 {
        let g = granted(store.acquire("p", any()).await.unwrap());
        assert_eq!(shard_of(&g.upstream, SHARDS as usize), keep);
        release(&store, "p", &g).await;
    }
    for m in &members {
        store.set_member("p", m, QUARANTINED, None).await.unwrap();
    }
    assert_eq!(
        store.acquire("p", any()).await.unwrap(),
        Acquired::NoCandidates
    );
}

#[tokio::test]
async fn a_session_keeps_its_upstream_and_lives_in_one_shard() {
    let (store, members) = sharded(32, None).await;
    let mut bound = HashMap::new();
    for round in 0..3 {
        for k in 0..200 {
            let key = format!("s{k}");
            let order = order_for(&key, &members);
            let g = granted(store.acquire("p", session(&key, &order)).await.unwrap());
            assert_eq!(g.bound_now, round == 0, "{key}");
            let first = bound.entry(key.clone()).or_insert(g.upstream.clone());
            assert_eq!(first, &g.upstream, "{key} moved");
            release(&store, "p", &g).await;
        }
    }
    let used: HashSet<_> = bound.values().collect();
    assert!(
        used.len() >= 24,
        "sessions spread over {} members",
        used.len()
    );
    for (key, up) in &bound {
        let mut holders = Vec::new();
        for i in 0..SHARDS as usize {
            if let Some(u) = store
                .inner()
                .session_upstream(&shard_names("p", SHARDS as usize)[i], key)
                .await
                .unwrap()
            {
                holders.push((i, u));
            }
        }
        assert_eq!(holders, vec![(shard_of(up, SHARDS as usize), up.clone())]);
        assert_eq!(
            store.session_upstream("p", key).await.unwrap().as_ref(),
            Some(up)
        );
    }
    assert_eq!(store.status("p").await.unwrap().sessions_live, 200);
    assert!(store.end_session("p", "s5").await.unwrap());
    assert!(!store.end_session("p", "s5").await.unwrap());
    assert_eq!(store.session_upstream("p", "s5").await.unwrap(), None);
    // Unbinding from the upstream it points at finds its shard.
    let up = bound["s6"].clone();
    store.unbind("p", "s6", &up).await.unwrap();
    assert_eq!(store.session_upstream("p", "s6").await.unwrap(), None);
}

#[tokio::test]
async fn a_label_filter_chooses_among_its_members_in_every_shard() {
    let (store, members) = sharded(60, None).await;
    // Every fifth member: spread over the shards.
    let chosen: Vec<UpstreamId> = members.iter().step_by(5).cloned().collect();
    let shards_used: HashSet<_> = chosen
        .iter()
        .map(|m| shard_of(m, SHARDS as usize))
        .collect();
    assert!(shards_used.len() > 1);
    let subset = Subset {
        id: "country=us#t1",
        members: &chosen,
    };
    let mut seen = HashSet::new();
    // Enough runs of plain acquires to visit every shard.
    for _ in 0..1200 {
        let want = Want::Any {
            exclude: &[],
            within: Some(subset),
        };
        let g = granted(store.acquire("p", want).await.unwrap());
        assert!(
            chosen.contains(&g.upstream),
            "{} is outside the filter",
            g.upstream
        );
        seen.insert(g.upstream.clone());
        release(&store, "p", &g).await;
    }
    assert_eq!(seen.len(), chosen.len(), "every matching member used");
    for k in 0..40 {
        let key = format!("f{k}|country=us");
        let order = order_for(&key, &chosen);
        let mut first = None;
        for _ in 0..3 {
            let want = Want::Session {
                key: &key,
                ttl: Duration::from_secs(600),
                preferred: &order,
                rebind: false,
                within: Some(subset),
            };
            let g = granted(store.acquire("p", want).await.unwrap());
            assert!(chosen.contains(&g.upstream));
            assert_eq!(first.get_or_insert(g.upstream.clone()), &g.upstream);
            release(&store, "p", &g).await;
        }
    }
}

#[tokio::test]
async fn a_release_in_any_shard_wakes_a_request_waiting_on_the_pool() {
    let (store, _) = sharded(8, Some(1)).await;
    let mut grants = Vec::new();
    for _ in 0..8 {
        grants.push(granted(store.acquire("p", any()).await.unwrap()));
    }
    let signal = store.release_signal("p");
    for i in 0..SHARDS as usize {
        assert!(Arc::ptr_eq(
            &signal,
            &store
                .inner()
                .release_signal(&shard_names("p", SHARDS as usize)[i])
        ));
    }
    // The last grant's shard: whichever it is, the waiter hears it.
    let last = grants.pop().unwrap();
    let notified = signal.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    release(&store, "p", &last).await;
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("the pool's waiter was woken");
}

#[tokio::test]
async fn changing_the_shard_count_keeps_serving() {
    let (store, members) = sharded(16, Some(2)).await;
    let held = granted(store.acquire("p", any()).await.unwrap());
    store
        .configure(spec("p", &members, Some(2), 1))
        .await
        .unwrap();
    // A lease from the old layout ends without an error; the pool serves from its new one.
    release(&store, "p", &held).await;
    let g = granted(store.acquire("p", any()).await.unwrap());
    release(&store, "p", &g).await;
    store
        .configure(spec("p", &members, Some(2), 8))
        .await
        .unwrap();
    let g = granted(store.acquire("p", any()).await.unwrap());
    release(&store, "p", &g).await;
    assert_eq!(store.status("p").await.unwrap().members.len(), 16);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_shards_spread_over_masters_and_instances_share_them() {
    let cluster = RedisCluster::start().await;
    let url = cluster.url();
    let pool = unique("big");
    let members = ids(48);
    let shards = 12;
    let a = on_redis(&url, "shard-a");
    let b = on_redis(&url, "shard-b");
    for s in [&a, &b] {
        s.configure(spec(&pool, &members, Some(1), shards))
            .await
            .unwrap();
    }
    // Masters hold equal thirds of the slots; the shards spread evenly over the slots.
    let mut per_master: HashMap<usize, usize> = HashMap::new();
    for name in shard_names(&pool, shards as usize) {
        let master = cluster
            .master_of(&format!("pgshard:{{{name}}}:meta"))
            .unwrap();
        *per_master.entry(master).or_default() += 1;
        // The shard's state is where its name says.
        let keys = cluster.nodes[master].cli(&["EXISTS", &format!("pgshard:{{{name}}}:meta")]);
        assert_eq!(keys.trim(), "1", "{name}");
    }
    assert_eq!(per_master.len(), 3, "{per_master:?}");
    assert!(
        per_master.values().all(|n| (3..=5).contains(n)),
        "{per_master:?}"
    );

    // The cap is global across instances and shards: 48 leases, then no more.
    let mut grants = Vec::new();
    for i in 0..48 {
        let s = if i % 2 == 0 { &a } else { &b };
        grants.push((i % 2, granted(s.acquire(&pool, any()).await.unwrap())));
    }
    let distinct: HashSet<_> = grants.iter().map(|(_, g)| g.upstream.clone()).collect();
    assert_eq!(distinct.len(), 48);
    assert_eq!(a.acquire(&pool, any()).await.unwrap(), Acquired::AtCapacity);
    assert_eq!(b.acquire(&pool, any()).await.unwrap(), Acquired::AtCapacity);
    for (who, g) in &grants {
        let s = if *who == 0 { &a } else { &b };
        release(s, &pool, g).await;
    }

    // A session bound through one instance is found by the other.
    for k in 0..30 {
        let key = format!("acct-{k}");
        let order = order_for(&key, &members);
        let first = granted(a.acquire(&pool, session(&key, &order)).await.unwrap());
        release(&a, &pool, &first).await;
        let second = granted(b.acquire(&pool, session(&key, &order)).await.unwrap());
        assert_eq!(second.upstream, first.upstream, "{key}");
        assert!(!second.bound_now);
        release(&b, &pool, &second).await;
    }
    let status = b.status(&pool).await.unwrap();
    assert_eq!(status.sessions_live, 30);
    assert_eq!(status.members.len(), 48);
    assert_eq!(status.members.iter().map(|m| m.leases_live).sum::<u64>(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_setting_made_by_another_instance_reaches_this_one_under_the_pool_name() {
    let server = RedisServer::start().await;
    let pool = unique("changes");
    let members = ids(12);
    let a = on_redis(&server.url(), "changes-a");
    let b = on_redis(&server.url(), "changes-b");
    let mut heard = b.subscribe_member_changes();
    for s in [&a, &b] {
        s.configure(spec(&pool, &members, None, SHARDS))
            .await
            .unwrap();
    }
    let target = members[5].clone();
    a.set_member(&pool, &target, QUARANTINED, None)
        .await
        .unwrap();
    let change = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let c = heard.recv().await.unwrap();
            if c.upstream == target {
                return c;
            }
        }
    })
    .await
    .expect("the change reached the other instance");
    assert_eq!(change.pool, pool);
    assert_eq!(change.state, QUARANTINED);
    // And the other instance no longer hands the member out.
    for _ in 0..60 {
        let g = granted(b.acquire(&pool, any()).await.unwrap());
        assert_ne!(g.upstream, target);
        release(&b, &pool, &g).await;
    }
}

const TOKEN: &str = "shard-token-0123456789";

fn gateway_config(ups: &[FakeProxy], origin_port: u16, pool_extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|u| format!("\"{}\"", u.url())).collect();
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{origin_port}]\n\
         [pools.default]\nupstreams = [{}]\n{pool_extra}\n",
        list.join(", ")
    )
}

async fn admin_post(gw: &TestGateway, path: &str, body: serde_json::Value) -> u16 {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{}{path}", gw.admin))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Which upstream each of `n` plain requests left through.
async fn exits(gw: &TestGateway, origin: &Origin, n: usize) -> HashMap<String, usize> {
    let client = gw.client();
    let mut seen = HashMap::new();
    for _ in 0..n {
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let up = resp.headers()["x-pool-upstream"]
            .to_str()
            .unwrap()
            .to_string();
        *seen.entry(up).or_default() += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_on_reload_keeps_a_quarantine() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let mut ups = Vec::new();
    for _ in 0..6 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, gateway_config(&ups, origin.port(), "")).unwrap();
    let gw = TestGateway::start_file(&path).await;
    let bad = ups[0].url();
    let body = serde_json::json!({"pool": "default", "upstream": bad, "action": "quarantine", "duration_s": 600});
    assert_eq!(admin_post(&gw, "/admin/upstream", body).await, 200);
    assert!(!exits(&gw, &origin, 30).await.contains_key(&bad));

    for shards in [3, 1] {
        std::fs::write(
            &path,
            gateway_config(&ups, origin.port(), &format!("shards = {shards}")),
        )
        .unwrap();
        assert_eq!(
            admin_post(&gw, "/admin/reload", serde_json::json!({})).await,
            200
        );
        // Enough runs of plain requests to visit every shard.
        let seen = exits(&gw, &origin, 400).await;
        assert!(!seen.contains_key(&bad), "shards = {shards}: {seen:?}");
        assert_eq!(seen.len(), 5, "shards = {shards}: {seen:?}");
        assert_eq!(
            gw.upstream_status("default", &bad).await["state"],
            "quarantined"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_list_shared_by_another_instance_reaches_this_one_under_the_pool_name() {
    let server = RedisServer::start().await;
    let pool = unique("listed");
    let members = ids(12);
    let a = on_redis(&server.url(), "listed-a");
    let b = on_redis(&server.url(), "listed-b");
    let mut heard = b.subscribe_listed_changes();
    for s in [&a, &b] {
        s.configure(spec(&pool, &members, None, SHARDS))
            .await
            .unwrap();
    }
    let list = "http://10.9.0.1:3128\nhttp://10.9.0.2:3128\n";
    a.put_listed(&pool, list).await.unwrap();
    let name = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let name = heard.recv().await.unwrap();
            if name.starts_with(pool.as_str()) {
                return name;
            }
        }
    })
    .await
    .expect("the list change reached the other instance");
    assert_eq!(name, pool);
    assert_eq!(b.listed(&pool).await.unwrap().as_deref(), Some(list));
}
