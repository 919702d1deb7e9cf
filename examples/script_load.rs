//! Drives `acquire.lua` and `release.lua` the way a busy gateway does, so that redis-server's cost
//! per request can be counted on its own (`bench/instructions.sh --scripts` runs redis-server
//! under callgrind around it; the gateway's share is counted by the other modes).
//!
//! A pool of `--upstreams` members is declared (least-used, no cap); then each round acquires
//! `--batch` unlisted leases in one call (the `many` mode a gateway uses for the plain acquires
//! that queued while its last call was under way), which is all a gateway sends per request in a
//! pool without a cap. With `--listed`, as in a pool with a cap, the pool is topped up to `--live`
//! listed leases first, and each round also releases the oldest `--batch` in one call, without
//! statistics (a gateway sends those about once a second); each run picks up the leases the
//! previous one left, so a warm-up run and a measured run see the same steady state. Loopback
//! only: it connects to 127.0.0.1:`--port`.

use clap::Parser;
use poolgate::store::redis::script_keys;
use redis::Script;
use redis::aio::MultiplexedConnection;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
struct Args {
    /// The redis-server's port on 127.0.0.1.
    #[arg(long)]
    port: u16,
    /// Acquires per acquire call and releases per release call.
    #[arg(long, default_value_t = 11)]
    batch: usize,
    /// Leases held between rounds (a gateway's requests in flight).
    #[arg(long, default_value_t = 64)]
    live: usize,
    /// Rounds of one acquire call and one release call.
    #[arg(long, default_value_t = 300)]
    rounds: usize,
    #[arg(long, default_value_t = 8)]
    upstreams: usize,
    /// Lease and release listed leases, as gateways do in a pool with a cap (and did in every
    /// pool before unlisted leases).
    #[arg(long)]
    listed: bool,
    /// With `--listed`, send every release call's statistics with it (one outcome count, the latency sum and the
    /// latency count per upstream of the batch), as gateways did before they sent them once a
    /// second.
    #[arg(long)]
    stats_every_call: bool,
}

const LEASE_TTL_MS: u64 = 600_000;

fn key(name: &str) -> String {
    format!("pg:{{bench}}:{name}")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Acquires `n` leases with ids from `next` (unlisted ones with `next` = `None`); returns their
/// ids and upstreams.
async fn acquire(
    c: &mut MultiplexedConnection,
    script: &Script,
    next: Option<&mut u64>,
    n: usize,
) -> Result<Vec<(u64, String)>, BoxError> {
    let now = now_ms();
    let mut inv = script.prepare_invoke();
    for k in script_keys::ACQUIRE {
        inv.key(key(k));
    }
    inv.arg(now)
        .arg("-")
        .arg(now + LEASE_TTL_MS)
        .arg(0)
        .arg("least-used")
        .arg(key("events"))
        .arg("many");
    let ids: Vec<u64> = match next {
        Some(next) => {
            let ids = (0..n as u64).map(|i| *next + i).collect();
            *next += n as u64;
            ids
        }
        None => vec![0; n],
    };
    for id in &ids {
        match id {
            0 => inv.arg("-"),
            id => inv.arg(*id),
        };
    }
    let replies: Vec<String> = inv.invoke_async(c).await?;
    ids.into_iter()
        .zip(replies)
        .map(|(id, r)| match r.strip_prefix("granted ") {
            Some(rest) => Ok((id, rest.split_once(' ').map_or("", |(_, u)| u).to_string())),
            None => Err(format!("acquire answered {r:?}").into()),
        })
        .collect()
}

async fn release(
    c: &mut MultiplexedConnection,
    script: &Script,
    leases: &[(u64, String)],
    with_stats: bool,
) -> Result<(), BoxError> {
    let mut inv = script.prepare_invoke();
    for k in script_keys::RELEASE {
        inv.key(key(k));
    }
    inv.arg(0).arg(key("events")).arg(leases.len());
    for (id, _) in leases {
        inv.arg(*id);
    }
    if with_stats {
        let mut sums: Vec<(&str, u64)> = Vec::new();
        for (_, up) in leases {
            match sums.iter_mut().find(|(u, _)| u == up) {
                Some((_, n)) => *n += 1,
                None => sums.push((up, 1)),
            }
        }
        for (up, n) in sums {
            inv.arg(format!("{up}\nok")).arg(n);
            inv.arg(format!("{up}\nlatency_us")).arg(n * 1_500);
            inv.arg(format!("{up}\nlatency_n")).arg(n);
        }
    }
    let _: i64 = inv.invoke_async(c).await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    if args.batch == 0 || args.upstreams == 0 {
        return Err("--batch and --upstreams must be at least 1".into());
    }
    if args.upstreams > 1000 {
        return Err("--upstreams is at most 1000 (one configure.lua call)".into());
    }
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", args.port))?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let configure = Script::new(include_str!("../lua/configure.lua"));
    let acquire_lua = Script::new(include_str!("../lua/acquire.lua"));
    let release_lua = Script::new(include_str!("../lua/release.lua"));

    let mut inv = configure.prepare_invoke();
    for k in script_keys::CONFIGURE {
        inv.key(key(k));
    }
    // One call: up to 1,000 members (a larger pool is declared in stages by the store).
    inv.arg("all")
        .arg("least-used")
        .arg(format!("{} upstreams", args.upstreams));
    for i in 0..args.upstreams {
        inv.arg(format!("http://127.0.0.1:{}", 20_000 + i));
    }
    let _: i64 = inv.invoke_async(&mut c).await?;

    if !args.listed {
        for _ in 0..args.rounds {
            acquire(&mut c, &acquire_lua, None, args.batch).await?;
        }
        println!("requests={}", args.rounds * args.batch);
        return Ok(());
    }

    // The leases a previous run left, oldest first (not the encoding pin, whose score is +inf).
    let left: Vec<u64> = redis::cmd("ZRANGEBYSCORE")
        .arg(key("leases"))
        .arg("-inf")
        .arg("(+inf")
        .query_async(&mut c)
        .await?;
    let mut next = left.iter().max().map_or(1, |m| m + 1);
    let ups: Vec<Option<String>> = if left.is_empty() {
        Vec::new()
    } else {
        redis::cmd("HMGET")
            .arg(key("lease_up"))
            .arg(&left)
            .query_async(&mut c)
            .await?
    };
    let mut live: std::collections::VecDeque<(u64, String)> = left
        .into_iter()
        .zip(ups)
        .map(|(id, up)| (id, up.unwrap_or_default()))
        .collect();
    if live.len() < args.live {
        let more = args.live - live.len();
        live.extend(acquire(&mut c, &acquire_lua, Some(&mut next), more).await?);
    }
    for _ in 0..args.rounds {
        live.extend(acquire(&mut c, &acquire_lua, Some(&mut next), args.batch).await?);
        let oldest: Vec<(u64, String)> = live.drain(..args.batch.min(live.len())).collect();
        release(&mut c, &release_lua, &oldest, args.stats_every_call).await?;
    }
    println!("requests={}", args.rounds * args.batch);
    Ok(())
}
