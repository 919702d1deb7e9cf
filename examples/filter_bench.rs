//! Choosing inside a label filter against choosing from the whole pool, on both stores: pairs
//! of acquire and release per second on a pool of 10,000 upstreams labelled with 50 countries
//! (200 each), unfiltered and within one country, with the ratio, plus the Redis commands each
//! pair costs.
//!
//! The filter's members come from the pool's label index once (as a request's filter view does),
//! then every acquire names the subset; the stores keep an index per subset, so a filtered
//! acquire walks the filter's members, not the pool.
//!
//! ```text
//! cargo run --release --example filter_bench                # 3 s per run, 32 tasks
//! cargo run --release --example filter_bench -- 5 64        # seconds, tasks
//! ```

use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::memory::MemoryStore;
use poolgate::store::redis::{RedisSettings, RedisStore};
use poolgate::store::{Acquired, AnyStore, PoolSpec, Store, Subset, Want};
use poolgate::upstream::UpstreamId;

type BoxError = Box<dyn Error + Send + Sync>;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const POOL: &str = "bench";
const MEMBERS: usize = 10_000;
const COUNTRIES: usize = 50;

fn members() -> Vec<UpstreamId> {
    (0..MEMBERS)
        .map(|i| {
            UpstreamId::new(format!(
                "http://10.{}.{}.{}:3128",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            ))
        })
        .collect()
}

/// The members of country `c` (every 50th member): what a filter view hands the store.
fn country(all: &[UpstreamId], c: usize) -> Vec<UpstreamId> {
    all.iter().skip(c).step_by(COUNTRIES).cloned().collect()
}

async fn store(redis: Option<&str>, strategy: Strategy) -> Result<Arc<AnyStore>, BoxError> {
    let store = match redis {
        None => AnyStore::Memory(MemoryStore::new()),
        Some(url) => AnyStore::Redis(RedisStore::new(RedisSettings {
            url: url.to_string(),
            timeout: Duration::from_secs(2),
            key_prefix: format!("pgfilter{}", rand::random::<u32>()),
            instance_id: format!("bench-{}", std::process::id()),
            tls: Default::default(),
        })?),
    };
    store
        .configure(PoolSpec {
            name: POOL.into(),
            members: members(),
            strategy,
            // A cap, so that Redis keeps lease records (the general case, and the one a filter
            // takes: no stock of unlisted leases).
            max_concurrency: Some(1000),
            lease_ttl: Duration::from_secs(60),
            shards: 1,
        })
        .await?;
    Ok(Arc::new(store))
}

/// Pairs completed by `tasks` loops over `seconds`, within `subset` when given.
async fn run(
    store: Arc<AnyStore>,
    subset: Option<Arc<(String, Vec<UpstreamId>)>>,
    tasks: usize,
    seconds: u64,
) -> Result<u64, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let pairs = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (store, pairs, subset) = (store.clone(), pairs.clone(), subset.clone());
        set.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                if n % 64 == 0 {
                    tokio::task::yield_now().await;
                }
                let within = subset
                    .as_deref()
                    .map(|(id, members)| Subset { id, members });
                let Acquired::Granted(g) = store
                    .acquire(
                        POOL,
                        Want::Any {
                            exclude: &[],
                            within,
                        },
                    )
                    .await?
                else {
                    return Err::<(), BoxError>("no grant under a cap of 1000".into());
                };
                if let Some((_, members)) = subset.as_deref() {
                    if !members.contains(&g.upstream) {
                        return Err("a grant outside the filter".into());
                    }
                }
                store
                    .release(POOL, &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
                    .await?;
                pairs.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    if store.health() != "ok" {
        return Err("the store went degraded during the run".into());
    }
    Ok(pairs.load(Ordering::Relaxed))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds: u64 = args.first().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let tasks: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(32);
    let server = Server::start()?;
    let url = format!("redis://127.0.0.1:{}", server.1);
    let all = members();
    let us = Arc::new(("country=c7#bench".to_string(), country(&all, 7)));
    println!(
        "{seconds} s per run, {tasks} concurrent tasks, {MEMBERS} upstreams, {COUNTRIES} countries of {} each",
        us.1.len()
    );
    println!(
        "{:<34}{:>14}{:>14}{:>10}{:>16}",
        "store, strategy", "unfiltered/s", "filtered/s", "ratio", "Redis cmds/pair"
    );
    for strategy in [
        Strategy::LeastUsed,
        Strategy::LeastConnections,
        Strategy::RoundRobin,
    ] {
        for redis in [None, Some(url.as_str())] {
            let rate = |pairs: u64| pairs as f64 / seconds as f64;
            let before = server.commands()?;
            let plain = run(store(redis, strategy).await?, None, tasks, seconds).await?;
            let mid = server.commands()?;
            let filtered = run(
                store(redis, strategy).await?,
                Some(us.clone()),
                tasks,
                seconds,
            )
            .await?;
            let after = server.commands()?;
            let cmds = if redis.is_some() {
                format!(
                    "{:.2} / {:.2}",
                    (mid - before) as f64 / plain.max(1) as f64,
                    (after - mid) as f64 / filtered.max(1) as f64
                )
            } else {
                "-".into()
            };
            println!(
                "{:<34}{:>14.0}{:>14.0}{:>9.2}x{:>16}",
                format!(
                    "{}, {}",
                    if redis.is_some() { "redis" } else { "memory" },
                    strategy.as_str()
                ),
                rate(plain),
                rate(filtered),
                rate(filtered) / rate(plain).max(1.0),
                cmds
            );
        }
    }
    Ok(())
}
