//! Acquire + release pairs per second: the embedded memory store against the Redis store, from one
//! process and from two processes sharing one Redis.
//!
//! Each run keeps `tasks` concurrent loops of `acquire` (least-used over 8 upstreams, no cap) then
//! `release` for `seconds`, and counts completed pairs. The Redis runs use a `redis-server` this
//! example starts on a free loopback port (without persistence) and stops at the end, unless a URL
//! is given.
//!
//! ```text
//! cargo run --release --example store_bench                 # 3 s per run, 32 tasks per process
//! cargo run --release --example store_bench -- 5 64         # seconds, tasks per process
//! cargo run --release --example store_bench -- 5 64 redis://127.0.0.1:7000
//! ```
//!
//! A run from two processes starts this example twice more as children (`--child`), each with
//! its own store client, and adds their counts.

use std::error::Error;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use poolgate::config::Strategy;
use poolgate::health::Outcome;
use poolgate::store::memory::MemoryStore;
use poolgate::store::redis::{RedisSettings, RedisStore};
use poolgate::store::{Acquired, AnyStore, PoolSpec, Store, Want};
use poolgate::upstream::UpstreamId;

type BoxError = Box<dyn Error + Send + Sync>;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const POOL: &str = "bench";

fn spec() -> PoolSpec {
    PoolSpec {
        name: POOL.into(),
        members: (0..8)
            .map(|i| UpstreamId::new(format!("http://10.0.0.{i}:3128")))
            .collect(),
        strategy: Strategy::LeastUsed,
        max_concurrency: None,
        lease_ttl: Duration::from_secs(60),
        shards: 1,
    }
}

async fn store(redis: Option<&str>) -> Result<Arc<AnyStore>, BoxError> {
    let store = match redis {
        None => AnyStore::Memory(MemoryStore::new()),
        Some(url) => AnyStore::Redis(RedisStore::new(RedisSettings {
            url: url.to_string(),
            timeout: Duration::from_secs(2),
            key_prefix: "pgbench".into(),
            instance_id: format!("bench-{}", std::process::id()),
            tls: Default::default(),
        })?),
    };
    store.configure(spec()).await?;
    Ok(Arc::new(store))
}

/// Pairs completed by `tasks` loops over `seconds`.
async fn run(store: Arc<AnyStore>, tasks: usize, seconds: u64) -> Result<u64, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let pairs = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (store, pairs) = (store.clone(), pairs.clone());
        set.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                if n % 64 == 0 {
                    // The memory store never waits: let the other loops run.
                    tokio::task::yield_now().await;
                }
                let Acquired::Granted(g) = store
                    .acquire(
                        POOL,
                        Want::Any {
                            exclude: &[],
                            within: None,
                        },
                    )
                    .await?
                else {
                    return Err::<(), BoxError>("no grant without a cap".into());
                };
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

/// Runs two child processes at once on the same backend; returns their summed pairs.
fn two_processes(redis: Option<&str>, tasks: usize, seconds: u64) -> Result<u64, BoxError> {
    let exe = std::env::current_exe()?;
    let children = (0..2)
        .map(|_| {
            let mut cmd = Command::new(&exe);
            cmd.arg("--child")
                .arg(seconds.to_string())
                .arg(tasks.to_string());
            if let Some(url) = redis {
                cmd.arg(url);
            }
            cmd.stdout(Stdio::piped()).spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            return Err("a child run failed".into());
        }
        total += String::from_utf8(out.stdout)?.trim().parse::<u64>()?;
    }
    Ok(total)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        let seconds = args.get(1).ok_or("seconds")?.parse()?;
        let tasks = args.get(2).ok_or("tasks")?.parse()?;
        let store = store(args.get(3).map(String::as_str)).await?;
        println!("{}", run(store, tasks, seconds).await?);
        return Ok(());
    }
    let seconds: u64 = args.first().map(|s| s.parse()).transpose()?.unwrap_or(3);
    let tasks: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(32);
    let server;
    let url = match args.get(2) {
        Some(url) => url.clone(),
        None => {
            server = Server::start()?;
            format!("redis://127.0.0.1:{}", server.1)
        }
    };
    println!(
        "{seconds} s per run, {tasks} concurrent tasks per process, least-used over 8 upstreams"
    );
    let rate = |pairs: u64| pairs as f64 / seconds as f64;
    let started = Instant::now();
    let mem1 = rate(run(store(None).await?, tasks, seconds).await?);
    let redis1 = rate(run(store(Some(&url)).await?, tasks, seconds).await?);
    let mem2 = rate(two_processes(None, tasks, seconds)?);
    let redis2 = rate(two_processes(Some(&url), tasks, seconds)?);
    println!("{:<28}{:>14}", "backend, processes", "pairs/s");
    println!("{:<28}{:>14.0}", "memory, 1", mem1);
    println!("{:<28}{:>14.0}", "redis, 1", redis1);
    println!("{:<28}{:>14.0}", "memory, 2 (separate stores)", mem2);
    println!("{:<28}{:>14.0}", "redis, 2 (one shared pool)", redis2);
    println!(
        "memory/redis: {:.1}x from one process, {:.1}x from two; redis 2 processes / 1: {:.2}x ({:.0?} total)",
        mem1 / redis1,
        mem2 / redis2,
        redis2 / redis1,
        started.elapsed()
    );
    Ok(())
}
