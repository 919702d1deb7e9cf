//! Issue #37's scale curves: how the cost of a session binding and of a tracked target grows
//! with their number.
//!
//! ```text
//! cargo run --profile fixture --example scale_bench -- sessions   # 1k, 100k, 1M bindings
//! cargo run --profile fixture --example scale_bench -- targets    # 10, 1k, 100k targets
//! cargo run --profile fixture --example scale_bench -- leastconn  # 10, 1k, 10k, 100k members
//! cargo run --profile fixture --example scale_bench -- declare    # 1k, 10k, 100k members
//! ```
//!
//! **sessions**: for each size N, N live bindings are made through the store API (a session
//! acquire of a new key, then its release), then two bounded samples are timed, each call on
//! its own: the acquire of an *existing* binding (a lookup; random keys among the N) and the
//! acquire of a *new* key (a placement; the binding is ended again, untimed, so the size stays
//! N). On the embedded store, `status` (what `/status` and each metrics scrape call, under the
//! pool's lock) is timed too, `STATUS_SAMPLE` calls. Memory per binding is the growth of the process's resident set (`VmRSS`) over the fill
//! on the embedded store, each size in a fresh child process, and the growth of Redis's
//! `used_memory` on a `redis-server` this example starts on a free loopback port. Keys are what
//! the gateway mints (`X-Pool-Session: create`): 32 hex digits, made from the index, so the
//! benchmark holds no copy of them.
//!
//! **targets**: for each count T of distinct target hosts, the pool's health engine is fed
//! outcomes (`PoolHealth::observe`, what every finished request calls) for targets drawn at
//! random among the T, with the default `max_targets` (1,000) and with `max_targets` raised
//! to 100,000; each size in a fresh child process, so the resident-set growth is its own.
//! The health engine is measured directly rather than through a gateway: the per-target state
//! lives there, and a gateway's request path would drown its cost in sockets.
//!
//! **leastconn**: for each member count M, a pool of M members allocating by least-connections
//! (no cap) is declared on a fresh store, then `LEASTCONN_TASKS` concurrent tasks each loop on
//! a plain acquire and its release through the store API for `LEASTCONN_SECONDS`; the figure is
//! pairs completed over the time the run took (a run whose acquires are slow overshoots its
//! nominal length: every task finishes its pair). On Redis, the commands per pair are
//! `total_commands_processed` over the run, the commands scripts ran included; the bytes per
//! member are the `MEMORY USAGE` of the load index (`load`, `load_of`); and on stderr, the time
//! to declare the pool fresh and again (as an instance starting does), and of one acquire after
//! the index was dropped (as a declaration by an instance of another strategy does), which
//! builds it again in a pool of up to 1,000 members (a larger one chooses as least-used).
//!
//! **declare**: for each member count M and strategy (least-used, least-connections), a pool of
//! M members is declared on a fresh Redis, declared again with the same members (an instance
//! starting), with one member renamed (a reload), and with the strategy switched; for each, the
//! wall time, the script calls it made, the longest of them (`SLOWLOG`: every other instance's
//! acquires wait behind it) and their time together (INFO commandstats).
//!
//! Times are the same process's wall clock around each call on a shared machine: compare
//! within a run (the ratios to the smallest size), not across runs.

use std::error::Error;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use poolgate::config::{HealthConfig, Strategy};
use poolgate::health::blame::MAX_TARGETS_PER_TICK;
use poolgate::health::{Outcome, PoolHealth};
use poolgate::store::memory::MemoryStore;
use poolgate::store::redis::{RedisSettings, RedisStore};
use poolgate::store::{Acquired, AnyStore, PoolSpec, Store, Want};
use poolgate::upstream::UpstreamId;

// The gateway's allocator (src/main.rs), so that resident memory is what a gateway would hold.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type BoxError = Box<dyn Error + Send + Sync>;

#[path = "support/redis_server.rs"]
mod redis_server;
use redis_server::Server;

const POOL: &str = "bench";
/// Members of the benchmark's pool.
const MEMBERS: usize = 64;
/// Consistent-hash candidates offered with each new session (the gateway offers a few).
const PREFERRED: usize = 3;
/// Long enough that no binding expires during a run.
const SESSION_TTL: Duration = Duration::from_secs(3600);
const SESSION_SIZES: [usize; 3] = [1_000, 100_000, 1_000_000];
const TARGET_SIZES: [usize; 3] = [10, 1_000, 100_000];
/// Timed calls per sample, and the time a sample may take at most.
const MEMORY_SAMPLE: usize = 20_000;
const REDIS_SAMPLE: usize = 4_000;
/// Timed `status` calls per size on the embedded store.
const STATUS_SAMPLE: usize = 50;
const SAMPLE_LIMIT: Duration = Duration::from_secs(20);
/// A fill may take at most this long (1M bindings in Redis take about a minute here).
const FILL_LIMIT: Duration = Duration::from_secs(240);
/// Concurrent acquires while filling Redis.
const REDIS_FILL_TASKS: usize = 64;
const LEASTCONN_SIZES: [usize; 4] = [10, 1_000, 10_000, 100_000];
/// Concurrent acquire/release loops, as in `filter_bench`.
const LEASTCONN_TASKS: usize = 32;
const LEASTCONN_SECONDS: u64 = 3;
const DECLARE_SIZES: [usize; 3] = [1_000, 10_000, 100_000];

fn members() -> Vec<UpstreamId> {
    (0..MEMBERS)
        .map(|i| UpstreamId::new(format!("http://10.0.{}.{}:3128", i >> 8, i & 255)))
        .collect()
}

fn spec() -> PoolSpec {
    PoolSpec {
        name: POOL.into(),
        members: members(),
        strategy: Strategy::LeastUsed,
        max_concurrency: None,
        lease_ttl: Duration::from_secs(60),
        shards: 1,
    }
}

/// splitmix64: a bijection, so distinct indexes give distinct keys.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Session key number `i`: 32 hex digits, like a key the gateway mints.
fn key(i: u64) -> String {
    format!("{:016x}{:016x}", mix(i), mix(i ^ 0x5555_5555_5555_5555))
}

/// The consistent-hash order's first candidates for key `i` (any spread does here).
fn preferred(all: &[UpstreamId], i: u64) -> Vec<UpstreamId> {
    let h = mix(i) as usize;
    (0..PREFERRED)
        .map(|k| all[(h + k * 7) % all.len()].clone())
        .collect()
}

fn rss_bytes() -> Result<u64, BoxError> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .ok_or("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024)
}

/// Median, 99th percentile and maximum of `samples` (ns), in µs.
fn quantiles(samples: &mut [u64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize] as f64 / 1e3;
    (at(0.5), at(0.99), at(1.0))
}

/// One session acquire, timed; its lease is released (untimed).
async fn timed_session(
    store: &AnyStore,
    all: &[UpstreamId],
    i: u64,
    expect_new: bool,
) -> Result<u64, BoxError> {
    let k = key(i);
    let pref = preferred(all, i);
    let start = Instant::now();
    let acquired = store
        .acquire(
            POOL,
            Want::Session {
                key: &k,
                ttl: SESSION_TTL,
                preferred: &pref,
                rebind: false,
                within: None,
            },
        )
        .await?;
    let took = start.elapsed().as_nanos() as u64;
    let Acquired::Granted(g) = acquired else {
        return Err(format!("session {i}: {acquired:?}").into());
    };
    if g.bound_now != expect_new {
        return Err(format!("session {i}: bound_now {}", g.bound_now).into());
    }
    store.release_now(POOL, &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)?;
    Ok(took)
}

/// Binds sessions `from..to`, `tasks` at a time.
async fn fill(store: &Arc<AnyStore>, from: u64, to: u64, tasks: usize) -> Result<(), BoxError> {
    let deadline = Instant::now() + FILL_LIMIT;
    let next = Arc::new(AtomicU64::new(from));
    let all = Arc::new(members());
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (store, next, all) = (store.clone(), next.clone(), all.clone());
        set.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= to {
                    return Ok::<(), BoxError>(());
                }
                if Instant::now() > deadline {
                    return Err("the fill took too long".into());
                }
                if i % 256 == 0 {
                    tokio::task::yield_now().await;
                }
                timed_session(&store, &all, i, true).await?;
            }
        });
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

/// Figures of one store at one size.
struct SessionRow {
    bytes_per_binding: f64,
    lookup: (f64, f64, f64),
    place: (f64, f64, f64),
    /// One lookup timed right after the embedded store's periodic sweep fell due (µs).
    sweep: Option<f64>,
    /// The embedded store's `status` call: median and maximum (µs).
    status: Option<(f64, f64)>,
}

impl SessionRow {
    fn line(&self) -> String {
        let status = self.status.unwrap_or((f64::NAN, f64::NAN));
        format!(
            "{} {} {} {} {} {} {} {} {} {}",
            self.bytes_per_binding,
            self.lookup.0,
            self.lookup.1,
            self.lookup.2,
            self.place.0,
            self.place.1,
            self.place.2,
            self.sweep.unwrap_or(f64::NAN),
            status.0,
            status.1,
        )
    }

    fn parse(line: &str) -> Result<SessionRow, BoxError> {
        let v: Vec<f64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        if v.len() < 10 {
            return Err(format!("bad child line {line:?}").into());
        }
        Ok(SessionRow {
            bytes_per_binding: v[0],
            lookup: (v[1], v[2], v[3]),
            place: (v[4], v[5], v[6]),
            sweep: (!v[7].is_nan()).then_some(v[7]),
            status: (!v[8].is_nan()).then_some((v[8], v[9])),
        })
    }
}

/// Times the lookup and placement samples on a store holding `n` bindings.
async fn sample(
    store: &Arc<AnyStore>,
    n: usize,
    count: usize,
) -> Result<((f64, f64, f64), (f64, f64, f64)), BoxError> {
    let all = members();
    let mut lookups = Vec::with_capacity(count);
    let deadline = Instant::now() + SAMPLE_LIMIT;
    while lookups.len() < count && Instant::now() < deadline {
        let i = rand::random_range(0..n as u64);
        lookups.push(timed_session(store, &all, i, false).await?);
    }
    let mut places = Vec::with_capacity(count);
    let deadline = Instant::now() + SAMPLE_LIMIT;
    // New keys past every bound one; each binding is ended again so the size stays n.
    let mut i = n as u64 + 1_000_000_000;
    while places.len() < count && Instant::now() < deadline {
        places.push(timed_session(store, &all, i, true).await?);
        store.end_session(POOL, &key(i)).await?;
        i += 1;
    }
    Ok((quantiles(&mut lookups), quantiles(&mut places)))
}

/// A child process: `n` bindings on a fresh embedded store; prints a [`SessionRow`] line.
async fn sessions_memory_child(n: usize) -> Result<(), BoxError> {
    let store = Arc::new(AnyStore::Memory(MemoryStore::new()));
    store.configure(spec()).await?;
    // Warm the allocator and the runtime with a few bindings made and ended.
    let all = members();
    for i in 0..100 {
        let j = u64::MAX - i;
        timed_session(&store, &all, j, true).await?;
        store.end_session(POOL, &key(j)).await?;
    }
    let before = rss_bytes()?;
    fill(&store, 0, n as u64, 1).await?;
    let after = rss_bytes()?;
    let live = store.status(POOL).await?.sessions_live;
    if live != n as u64 {
        return Err(format!("{live} sessions live, not {n}").into());
    }
    let mut statuses = Vec::with_capacity(STATUS_SAMPLE);
    for _ in 0..STATUS_SAMPLE {
        let start = Instant::now();
        let live = store.status(POOL).await?.sessions_live;
        statuses.push(start.elapsed().as_nanos() as u64);
        if live != n as u64 {
            return Err(format!("{live} sessions live, not {n}").into());
        }
    }
    let (status_p50, _, status_max) = quantiles(&mut statuses);
    let (lookup, place) = sample(&store, n, MEMORY_SAMPLE).await?;
    // The embedded store sweeps expired bindings every 5 s, on the next session acquire: wait
    // until one is due and time that acquire.
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let i = rand::random_range(0..n as u64);
    let sweep = timed_session(&store, &all, i, false).await? as f64 / 1e3;
    let row = SessionRow {
        bytes_per_binding: after.saturating_sub(before) as f64 / n as f64,
        lookup,
        place,
        sweep: Some(sweep),
        status: Some((status_p50, status_max)),
    };
    println!("{}", row.line());
    Ok(())
}

fn redis_info(port: u16, field: &str) -> Result<u64, BoxError> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "memory"])
        .output()?;
    let text = String::from_utf8(out.stdout)?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .ok_or("no such INFO field")?
        .trim()
        .parse()
        .map_err(Into::into)
}

/// `MEMORY USAGE` of each of `keys` (every element counted), through one `redis-cli`.
fn memory_usage(port: u16, keys: &[String]) -> Result<Vec<u64>, BoxError> {
    use std::io::Write;
    let mut cli = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    {
        let mut stdin = cli.stdin.take().ok_or("no stdin")?;
        for k in keys {
            writeln!(stdin, "MEMORY USAGE {k} SAMPLES 0")?;
        }
    }
    let out = cli.wait_with_output()?;
    String::from_utf8(out.stdout)?
        .lines()
        .map(|l| l.trim().parse().map_err(Into::into))
        .collect()
}

fn redis_cli(port: u16, args: &[&str]) -> Result<String, BoxError> {
    let out = Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

async fn sessions_redis(server: &Server, n: usize) -> Result<SessionRow, BoxError> {
    redis_cli(server.1, &["FLUSHALL"])?;
    let store = Arc::new(AnyStore::Redis(RedisStore::new(RedisSettings {
        url: format!("redis://127.0.0.1:{}", server.1),
        timeout: Duration::from_secs(5),
        key_prefix: poolgate::store::redis::DEFAULT_KEY_PREFIX.into(),
        instance_id: format!("scale-{}", std::process::id()),
        tls: Default::default(),
    })?));
    store.configure(spec()).await?;
    let all = members();
    for i in 0..100 {
        let j = u64::MAX - i;
        timed_session(&store, &all, j, true).await?;
        store.end_session(POOL, &key(j)).await?;
    }
    if !store.settle(Duration::from_secs(5)).await {
        return Err("releases did not settle".into());
    }
    let before = redis_info(server.1, "used_memory")?;
    fill(&store, 0, n as u64, REDIS_FILL_TASKS).await?;
    if !store.settle(Duration::from_secs(10)).await {
        return Err("releases did not settle".into());
    }
    let after = redis_info(server.1, "used_memory")?;
    let live = store.status(POOL).await?.sessions_live;
    if live != n as u64 {
        return Err(format!("{live} sessions live, not {n}").into());
    }
    // Where a binding's bytes are: its STRING key (key, value, dict entry; not its entry in the
    // expires dict), and the pool's session count (one HASH, by expiry second, for all of them).
    let prefix = poolgate::store::redis::DEFAULT_KEY_PREFIX;
    let count = memory_usage(server.1, &[format!("{prefix}:{{{POOL}}}:session_count")])?;
    let strings: Vec<String> = (0..200.min(n as u64))
        .map(|i| format!("{prefix}:{{{POOL}}}:sess:{}", key(i)))
        .collect();
    let each = memory_usage(server.1, &strings)?;
    eprintln!(
        "redis {n}: MEMORY USAGE: session_count HASH {} B ({:.2} B/binding), a binding's STRING key {:.0} B (mean of {})",
        count.iter().sum::<u64>(),
        count.iter().sum::<u64>() as f64 / n as f64,
        each.iter().sum::<u64>() as f64 / each.len().max(1) as f64,
        each.len()
    );
    let (lookup, place) = sample(&store, n, REDIS_SAMPLE).await?;
    if store.health() != "ok" {
        return Err("the store went degraded during the run".into());
    }
    Ok(SessionRow {
        bytes_per_binding: after.saturating_sub(before) as f64 / n as f64,
        lookup,
        place,
        sweep: None,
        status: None,
    })
}

fn child(args: &[&str]) -> Result<String, BoxError> {
    let out = Command::new(std::env::current_exe()?)
        .arg("--child")
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        return Err(format!("child {args:?} failed").into());
    }
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

fn size_name(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn print_sessions(store: &str, rows: &[(usize, SessionRow)]) {
    let Some((_, base)) = rows.first() else {
        return;
    };
    println!(
        "\n{store}: bindings | bytes/binding | lookup p50 µs (x) | lookup p99 µs (x) | place p50 µs (x) | place p99 µs (x) | lookup max µs{}",
        if store == "memory" {
            " | lookup that swept µs | status p50 µs (x) | status max µs"
        } else {
            ""
        }
    );
    for (n, r) in rows {
        let sweep = r.sweep.map_or(String::new(), |s| format!(" | {s:.0}"));
        let status = match (r.status, base.status) {
            (Some((p50, max)), Some((base_p50, _))) => {
                format!(" | {p50:.2} ({:.2}x) | {max:.0}", p50 / base_p50)
            }
            _ => String::new(),
        };
        println!(
            "{store}: {} | {:.0} | {:.2} ({:.2}x) | {:.2} ({:.2}x) | {:.2} ({:.2}x) | {:.2} ({:.2}x) | {:.0}{sweep}{status}",
            size_name(*n),
            r.bytes_per_binding,
            r.lookup.0,
            r.lookup.0 / base.lookup.0,
            r.lookup.1,
            r.lookup.1 / base.lookup.1,
            r.place.0,
            r.place.0 / base.place.0,
            r.place.1,
            r.place.1 / base.place.1,
            r.lookup.2,
        );
    }
}

async fn sessions(sizes: &[usize], stores: &str) -> Result<(), BoxError> {
    let started = Instant::now();
    if stores != "redis" {
        let mut rows = Vec::new();
        for &n in sizes {
            let line = child(&["sessions-memory", &n.to_string()])?;
            rows.push((n, SessionRow::parse(&line)?));
        }
        print_sessions("memory", &rows);
    }
    if stores != "memory" {
        let server = Server::start()?;
        let mut rows = Vec::new();
        for &n in sizes {
            let t = Instant::now();
            rows.push((n, sessions_redis(&server, n).await?));
            eprintln!("redis {n}: {:.0?}", t.elapsed());
        }
        print_sessions("redis", &rows);
    }
    println!("({:.0?} in all)", started.elapsed());
    Ok(())
}

/// Figures of the health engine at one target count.
struct TargetRow {
    tracked: usize,
    rss_bytes: f64,
    observe: (f64, f64, f64),
    per_second: f64,
    tick_us: f64,
    /// The longest of the ticks that age every tracked target once all came due together (the
    /// worst case), and how many ticks that took.
    tick_all_us: f64,
    ticks_all: f64,
}

/// Observations timed per target count, and the time they may take at most.
const OBSERVE_SAMPLE: usize = 200_000;
const OBSERVE_LIMIT: Duration = Duration::from_secs(30);

/// A child process: the health engine fed outcomes on `n` distinct targets, on a paused clock
/// (the engine reads tokio's) so that every outcome falls in the same instant; times are taken
/// on the machine's clock.
fn targets_child(n: usize, max_targets: usize) -> Result<(), BoxError> {
    // Its own thread: this one runs the main runtime already, where another cannot be run or
    // dropped.
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()?
                .block_on(targets_paused(n, max_targets))
        })
        .join()
        .map_err(|_| BoxError::from("the targets child panicked"))?
    })
}

async fn targets_paused(n: usize, max_targets: usize) -> Result<(), BoxError> {
    let all = members();
    let cfg = HealthConfig {
        max_targets,
        ..HealthConfig::default()
    };
    let health = PoolHealth::new(POOL, cfg, Strategy::LeastUsed, &all);
    let names: Vec<String> = (0..n).map(|i| format!("host-{i}.example.com")).collect();
    let outcome = |r: u64| {
        if r % 50 == 0 {
            Outcome::OriginError
        } else {
            Outcome::Ok
        }
    };
    let before = rss_bytes()?;
    // Every target once, then as many again at random: the engine's steady state.
    let warm = (n * 2).max(10_000);
    for i in 0..warm {
        let r = mix(i as u64);
        let t = if i < n { i } else { r as usize % n };
        health.observe(
            &all[(r >> 32) as usize % all.len()],
            &names[t],
            outcome(r),
            Duration::from_millis(20),
        );
    }
    let after = rss_bytes()?;
    let mut times = Vec::with_capacity(OBSERVE_SAMPLE);
    let deadline = Instant::now() + OBSERVE_LIMIT;
    let run = Instant::now();
    let mut i = warm as u64;
    while times.len() < OBSERVE_SAMPLE && Instant::now() < deadline {
        let r = mix(i);
        i += 1;
        let t = &names[r as usize % n];
        let up = &all[(r >> 32) as usize % all.len()];
        let start = Instant::now();
        health.observe(up, t, outcome(r), Duration::from_millis(20));
        times.push(start.elapsed().as_nanos() as u64);
    }
    let per_second = times.len() as f64 / run.elapsed().as_secs_f64();
    let start = Instant::now();
    health.tick();
    let tick_us = start.elapsed().as_secs_f64() * 1e6;
    // Every target was seen in the same instant of the paused clock: one window later all of
    // them come due at once, the worst case. Each tick ages at most MAX_TARGETS_PER_TICK; the
    // rest are due at the next.
    tokio::time::advance(HealthConfig::default().incident_window + Duration::from_secs(1)).await;
    let ticks_all = health
        .view()
        .targets_tracked
        .div_ceil(MAX_TARGETS_PER_TICK)
        .max(1);
    let mut tick_all_us: f64 = 0.0;
    for _ in 0..ticks_all {
        let start = Instant::now();
        health.tick();
        tick_all_us = tick_all_us.max(start.elapsed().as_secs_f64() * 1e6);
    }
    let tracked = health.view().targets_tracked;
    let (p50, p99, max) = quantiles(&mut times);
    // The names' own memory (the caller's, not the engine's) is not subtracted: it was made
    // before the first measurement.
    println!(
        "{tracked} {} {p50} {p99} {max} {per_second} {tick_us} {tick_all_us} {ticks_all}",
        after.saturating_sub(before)
    );
    Ok(())
}

fn targets(sizes: &[usize]) -> Result<(), BoxError> {
    let started = Instant::now();
    for max_targets in [HealthConfig::default().max_targets, 100_000] {
        let mut rows = Vec::new();
        for &n in sizes {
            let line = child(&["targets", &n.to_string(), &max_targets.to_string()])?;
            let v: Vec<f64> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()?;
            if v.len() < 9 {
                return Err(format!("bad child line {line:?}").into());
            }
            rows.push((
                n,
                TargetRow {
                    tracked: v[0] as usize,
                    rss_bytes: v[1],
                    observe: (v[2], v[3], v[4]),
                    per_second: v[5],
                    tick_us: v[6],
                    tick_all_us: v[7],
                    ticks_all: v[8],
                },
            ));
        }
        let Some((_, base)) = rows.first() else {
            continue;
        };
        println!(
            "\nmax_targets {max_targets}: targets | tracked | RSS growth KiB | per tracked target B | observe p50 µs (x) | observe p99 µs (x) | observe max µs | observes/s (x) | tick µs | ticks, all due: longest µs (ticks)"
        );
        for (n, r) in &rows {
            println!(
                "max_targets {max_targets}: {} | {} | {:.0} | {:.0} | {:.3} ({:.2}x) | {:.3} ({:.2}x) | {:.0} | {:.0} ({:.2}x) | {:.0} | {:.0} ({:.0})",
                size_name(*n),
                r.tracked,
                r.rss_bytes / 1024.0,
                r.rss_bytes / r.tracked.max(1) as f64,
                r.observe.0,
                r.observe.0 / base.observe.0,
                r.observe.1,
                r.observe.1 / base.observe.1,
                r.observe.2,
                r.per_second,
                r.per_second / base.per_second,
                r.tick_us,
                r.tick_all_us,
                r.ticks_all,
            );
        }
    }
    println!("({:.0?} in all)", started.elapsed());
    Ok(())
}

/// A pool of `n` members allocating by least-connections.
fn leastconn_spec(n: usize) -> PoolSpec {
    PoolSpec {
        name: POOL.into(),
        members: (0..n)
            .map(|i| {
                UpstreamId::new(format!(
                    "http://10.{}.{}.{}:3128",
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                ))
            })
            .collect(),
        strategy: Strategy::LeastConnections,
        max_concurrency: None,
        lease_ttl: Duration::from_secs(60),
        shards: 1,
    }
}

/// Acquire/release pairs completed by `LEASTCONN_TASKS` loops on `store`'s pool, and the time
/// they took.
async fn leastconn_run(store: Arc<AnyStore>) -> Result<(u64, Duration), BoxError> {
    leastconn_pairs(store, LEASTCONN_TASKS, u64::MAX).await
}

/// Pairs completed by `tasks` loops of at most `each` pairs, for at most `LEASTCONN_SECONDS`.
async fn leastconn_pairs(
    store: Arc<AnyStore>,
    tasks: usize,
    each: u64,
) -> Result<(u64, Duration), BoxError> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(LEASTCONN_SECONDS);
    let pairs = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..tasks {
        let (store, pairs) = (store.clone(), pairs.clone());
        set.spawn(async move {
            let mut n = 0u64;
            while n < each && Instant::now() < deadline {
                n += 1;
                if n % 64 == 0 {
                    tokio::task::yield_now().await;
                }
                let want = Want::Any {
                    exclude: &[],
                    within: None,
                };
                let Acquired::Granted(g) = store.acquire(POOL, want).await? else {
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
    Ok((pairs.load(Ordering::Relaxed), started.elapsed()))
}

async fn leastconn(sizes: &[usize], stores: &str) -> Result<(), BoxError> {
    let started = Instant::now();
    println!(
        "least-connections, no cap: {LEASTCONN_TASKS} tasks, {LEASTCONN_SECONDS} s a run\nstore | members | pairs/s (x) | Redis commands per pair | load index B per member"
    );
    let server = if stores != "memory" {
        Some(Server::start()?)
    } else {
        None
    };
    for store_kind in ["memory", "redis"] {
        if !stores.is_empty() && stores != store_kind {
            continue;
        }
        let mut base = None;
        for &n in sizes {
            let (store, port) = match (store_kind, &server) {
                ("redis", Some(server)) => {
                    redis_cli(server.1, &["FLUSHALL"])?;
                    let store = AnyStore::Redis(RedisStore::new(RedisSettings {
                        url: format!("redis://127.0.0.1:{}", server.1),
                        // The slow runs (one walk of the pool per acquire) must not degrade.
                        timeout: Duration::from_secs(120),
                        key_prefix: poolgate::store::redis::DEFAULT_KEY_PREFIX.into(),
                        instance_id: format!("scale-{}", std::process::id()),
                        tls: Default::default(),
                    })?);
                    (store, Some(server))
                }
                _ => (AnyStore::Memory(MemoryStore::new()), None),
            };
            let store = Arc::new(store);
            let t = Instant::now();
            store.configure(leastconn_spec(n)).await?;
            let configured = t.elapsed();
            // Declared again with the same members, as by an instance starting.
            let t = Instant::now();
            store.configure(leastconn_spec(n)).await?;
            let again = t.elapsed();
            let before = port.map(|s| s.commands()).transpose()?;
            let (pairs, took) = leastconn_run(store.clone()).await?;
            let after = port.map(|s| s.commands()).transpose()?;
            let rate = pairs as f64 / took.as_secs_f64();
            let per_pair = match (before, after) {
                (Some(b), Some(a)) => format!("{:.1}", (a - b) as f64 / pairs.max(1) as f64),
                _ => "-".into(),
            };
            // The least-connections load index (`load` and `load_of`), where the store keeps one.
            let index = match port {
                Some(server) => {
                    let prefix = poolgate::store::redis::DEFAULT_KEY_PREFIX;
                    let keys = ["load", "load_of"].map(|k| format!("{prefix}:{{{POOL}}}:{k}"));
                    let bytes: u64 = memory_usage(server.1, &keys)
                        .unwrap_or_default()
                        .iter()
                        .sum();
                    format!("{:.0}", bytes as f64 / n as f64)
                }
                None => "-".into(),
            };
            let base_rate = *base.get_or_insert(rate);
            println!(
                "{store_kind} | {} | {rate:.0} ({:.2}x) | {per_pair} | {index}",
                size_name(n),
                rate / base_rate
            );
            eprintln!(
                "{store_kind} {n}: declared in {configured:.0?}, declared again in {again:.0?}"
            );
            if let Some(server) = port {
                // As if an instance of another strategy had declared the pool last: the next
                // acquire builds the index again.
                let prefix = poolgate::store::redis::DEFAULT_KEY_PREFIX;
                redis_cli(
                    server.1,
                    &["HDEL", &format!("{prefix}:{{{POOL}}}:meta"), "load"],
                )?;
                let t = Instant::now();
                let (pairs, _) = leastconn_pairs(store.clone(), 1, 1).await?;
                eprintln!(
                    "{store_kind} {n}: {pairs} acquire/release after the index was dropped: {:.0?}",
                    t.elapsed()
                );
            }
        }
    }
    println!("({:.0?} in all)", started.elapsed());
    Ok(())
}

/// The script calls Redis ran since the last look: how many and their time together (INFO
/// commandstats, `evalsha`), and the longest (`SLOWLOG`, which keeps every call above 1 ms);
/// then both are reset.
async fn redis_calls(
    c: &mut redis::aio::MultiplexedConnection,
) -> Result<(u64, Duration, Duration), BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(c)
        .await?;
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
            .and_then(|l| l.split(',').find_map(|kv| kv.strip_prefix(name)))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let (calls, usec) = (field("calls="), field("usec="));
    let log: redis::Value = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(c)
        .await?;
    let mut longest = 0i64;
    if let redis::Value::Array(entries) = log {
        for e in &entries {
            let redis::Value::Array(fields) = e else {
                continue;
            };
            let script = matches!(fields.get(3), Some(redis::Value::Array(a))
                if matches!(a.first(), Some(redis::Value::BulkString(b))
                    if b.eq_ignore_ascii_case(b"evalsha")));
            if let (true, Some(redis::Value::Int(us))) = (script, fields.get(2)) {
                longest = longest.max(*us);
            }
        }
    }
    let _: () = redis::cmd("SLOWLOG").arg("RESET").query_async(c).await?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(c).await?;
    Ok((
        calls,
        Duration::from_micros(longest.max(0) as u64),
        Duration::from_micros(usec),
    ))
}

/// The declarations `declare` times, in order: a pool of `n` members allocating by `strategy`
/// (fresh), the same again, with its last member renamed, and that with the strategy switched.
fn declarations(strategy: Strategy, n: usize) -> [(&'static str, PoolSpec); 4] {
    let base = PoolSpec {
        strategy,
        ..leastconn_spec(n)
    };
    let mut renamed = base.clone();
    if let Some(last) = renamed.members.last_mut() {
        *last = UpstreamId::new("http://192.0.2.1:3128");
    }
    let switched = PoolSpec {
        strategy: if strategy == Strategy::LeastUsed {
            Strategy::LeastConnections
        } else {
            Strategy::LeastUsed
        },
        ..renamed.clone()
    };
    [
        ("fresh", base.clone()),
        ("again", base),
        ("one renamed", renamed),
        ("strategy switched", switched),
    ]
}

/// Declarations of a pool of N members on Redis, fresh, again, with one member renamed and with
/// the strategy switched: the wall time of each, and the longest single Redis call in it, which
/// every other instance's acquires wait behind.
async fn declare(sizes: &[usize]) -> Result<(), BoxError> {
    let server = Server::start()?;
    let url = format!("redis://127.0.0.1:{}", server.1);
    let mut c = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("slowlog-log-slower-than")
        .arg(1000)
        .arg("slowlog-max-len")
        .arg(10_000)
        .query_async(&mut c)
        .await?;
    println!(
        "declaring a pool on Redis\nstrategy | members | declaration | wall time | script calls | longest call | Redis time in all | another instance's slowest acquire"
    );
    for strategy in [Strategy::LeastUsed, Strategy::LeastConnections] {
        for &n in sizes {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut c).await?;
            let store = AnyStore::Redis(RedisStore::new(RedisSettings {
                url: url.clone(),
                timeout: Duration::from_secs(5),
                key_prefix: poolgate::store::redis::DEFAULT_KEY_PREFIX.into(),
                instance_id: format!("declare-{}", std::process::id()),
                tls: Default::default(),
            })?);
            // Another instance serving the pool (its store's timeout is the default 250 ms).
            let other = Arc::new(AnyStore::Redis(RedisStore::new(RedisSettings {
                url: url.clone(),
                timeout: Duration::from_millis(250),
                key_prefix: poolgate::store::redis::DEFAULT_KEY_PREFIX.into(),
                instance_id: format!("declare-other-{}", std::process::id()),
                tls: Default::default(),
            })?));
            let _ = redis_calls(&mut c).await?;
            for (what, spec) in declarations(strategy, n) {
                if what == "again" {
                    // From here on, the other instance serves the pool meanwhile.
                    other.configure(spec.clone()).await?;
                    let _ = redis_calls(&mut c).await?;
                }
                // Another instance's requests meanwhile (from the second declaration on).
                let probe = (what != "fresh").then(|| other.clone());
                let declaring = async { Ok(store.configure(spec.clone()).await?) };
                let (wall, slowest) =
                    timed_with_probe(probe, Duration::from_millis(1), declaring).await?;
                let (calls, longest, sum) = redis_calls(&mut c).await?;
                println!(
                    "{} | {} | {what} | {wall:.0?} | {calls} | {longest:.1?} | {sum:.0?} | {slowest:.1?}",
                    strategy.as_str(),
                    size_name(n)
                );
            }
            if store.health() != "ok" || other.health() != "ok" {
                println!(
                    "(a store went degraded: {} / {})",
                    store.health(),
                    other.health()
                );
            }
        }
    }
    Ok(())
}

/// Runs `declare`, timed, while a task of its own makes acquire and release pairs on `probe`'s
/// pool (`pause` apart, or a yield when zero; none without `probe`): the declaration's wall time
/// and the slowest acquire meanwhile. The declaration starts once the first pair is made, and the
/// probe asks for 5 ms more after it ended.
async fn timed_with_probe(
    probe: Option<Arc<AnyStore>>,
    pause: Duration,
    declare: impl Future<Output = Result<(), BoxError>>,
) -> Result<(Duration, Duration), BoxError> {
    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicBool::new(probe.is_none()));
    let task = probe.map(|store| {
        let (done, started) = (done.clone(), started.clone());
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let any = Want::Any {
                    exclude: &[],
                    within: None,
                };
                if let Acquired::Granted(g) = store.acquire(POOL, any).await? {
                    slowest = slowest.max(t.elapsed());
                    store
                        .release(POOL, &g.upstream, g.lease, Outcome::Ok, Duration::ZERO)
                        .await?;
                }
                started.store(true, Ordering::Relaxed);
                if pause.is_zero() {
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(pause).await;
                }
            }
            Ok::<_, BoxError>(slowest)
        })
    });
    while !started.load(Ordering::Relaxed) {
        tokio::task::yield_now().await;
    }
    let t = Instant::now();
    let declared = declare.await;
    let wall = t.elapsed();
    if task.is_some() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done.store(true, Ordering::Relaxed);
    let slowest = match task {
        Some(task) => task.await??,
        None => Duration::ZERO,
    };
    declared.map(|()| (wall, slowest))
}

/// The same declarations on the embedded store, which makes them under the pool's lock: the
/// wall time of each and the slowest acquire of a task asking meanwhile.
async fn declare_memory(sizes: &[usize]) -> Result<(), BoxError> {
    println!(
        "declaring a pool on the embedded store\nstrategy | members | declaration | wall time | slowest acquire meanwhile"
    );
    for strategy in [Strategy::LeastUsed, Strategy::LeastConnections] {
        for &n in sizes {
            let store = Arc::new(AnyStore::Memory(MemoryStore::new()));
            for (what, spec) in declarations(strategy, n) {
                // A request loop on another worker thread meanwhile (none before the pool exists).
                let probe = (what != "fresh").then(|| store.clone());
                let declaring = async { Ok(store.configure(spec.clone()).await?) };
                let (wall, slowest) = timed_with_probe(probe, Duration::ZERO, declaring).await?;
                println!(
                    "{} | {} | {what} | {wall:.1?} | {slowest:.1?}",
                    strategy.as_str(),
                    size_name(n)
                );
            }
        }
    }
    Ok(())
}

fn parse_sizes(arg: Option<&String>, default: &[usize]) -> Result<Vec<usize>, BoxError> {
    match arg {
        None => Ok(default.to_vec()),
        Some(s) => s
            .split(',')
            .map(|n| n.parse().map_err(Into::into))
            .collect(),
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or("");
    match (arg(0), arg(1)) {
        ("--child", "sessions-memory") => sessions_memory_child(arg(2).parse()?).await,
        ("--child", "targets") => targets_child(arg(2).parse()?, arg(3).parse()?),
        // Optional: a comma-separated list of sizes, then `memory` or `redis` for one store only.
        ("sessions", _) => {
            let sizes = parse_sizes(args.get(1), &SESSION_SIZES)?;
            sessions(&sizes, arg(2)).await
        }
        ("targets", _) => targets(&parse_sizes(args.get(1), &TARGET_SIZES)?),
        ("declare", _) => {
            let sizes = parse_sizes(args.get(1), &DECLARE_SIZES)?;
            if arg(2) != "memory" {
                declare(&sizes).await?;
            }
            declare_memory(&sizes).await
        }
        ("leastconn", _) => {
            let sizes = parse_sizes(args.get(1), &LEASTCONN_SIZES)?;
            leastconn(&sizes, arg(2)).await
        }
        _ => Err(
            "usage: scale_bench sessions [sizes [memory|redis]] | targets [sizes] | leastconn [sizes [memory|redis]] | declare [sizes]"
                .into(),
        ),
    }
}
