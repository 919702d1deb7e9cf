//! Rate limits: per upstream, per upstream × target host (politeness), and per client user.
//!
//! Each limit is a GCRA bucket from `governor`: one request per `interval`, up to `burst` at once
//! after a quiet spell. The buckets are **per instance**: every gateway keeps its own. A shared
//! bucket would cost a store round trip on every request (the hot path has two today, acquire and
//! release); with N instances behind a balancer, configure global/N.
//!
//! The limiters run on tokio's clock ([`TokioClock`]), so a paused test clock drives them like
//! every other timer. What a limit does to a request (skip the upstream, wait, 429) is decided in
//! [`crate::pool::select`]; this module holds the buckets and what is known about them:
//! - a *hint* per limited key, the instant its bucket is expected to conform again, so a request
//!   skips an upstream known to refuse instead of leasing it from the store and handing it back;
//! - a FIFO per (pool, target host) for requests that had to wait, so waiters are served in
//!   turn instead of all waking at each refill and racing for one token.
//!
//! Limiters are built lazily from the config in force and rebuilt when a reload changes a limit;
//! an unchanged limit keeps its buckets. [`RateLimits::prune`] (run on the health tick) drops
//! buckets that are back to full, stale hints, idle queues and limiters of pools or users that
//! are gone, so memory follows the active keys, not every target ever seen.

use std::collections::{BTreeMap, HashMap};
use std::ops::Add;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use governor::clock::{Clock, Reference};
use governor::middleware::{NoOpMiddleware, StateInformationMiddleware};
use governor::nanos::Nanos;
use governor::state::keyed::DashMapStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use crate::config::{Rate, RateLimitConfig, UserConfig};
use crate::upstream::UpstreamId;

/// governor's clock on tokio's time (`tokio::time::Instant`), which a paused runtime controls.
/// governor's own clocks read the system clock, which a paused test cannot advance.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioClock;

/// An instant of [`TokioClock`]. A newtype: governor's `Reference` cannot be implemented for
/// tokio's type here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TokioInstant(pub Instant);

impl Add<Nanos> for TokioInstant {
    type Output = TokioInstant;

    fn add(self, n: Nanos) -> TokioInstant {
        TokioInstant(self.0 + Duration::from(n))
    }
}

impl Reference for TokioInstant {
    fn duration_since(&self, earlier: Self) -> Nanos {
        self.0.saturating_duration_since(earlier.0).into()
    }

    fn saturating_sub(&self, duration: Nanos) -> Self {
        self.0
            .checked_sub(duration.into())
            .map_or(*self, TokioInstant)
    }
}

impl Clock for TokioClock {
    type Instant = TokioInstant;

    fn now(&self) -> TokioInstant {
        TokioInstant(Instant::now())
    }
}

/// Which limit stopped a request: the `scope` label of the rate-limit counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    Upstream,
    UpstreamTarget,
    User,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Upstream, Scope::UpstreamTarget, Scope::User];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Upstream => "upstream",
            Scope::UpstreamTarget => "upstream_target",
            Scope::User => "user",
        }
    }

    /// What a client is told.
    pub fn describe(self) -> &'static str {
        match self {
            Scope::Upstream => "every eligible upstream is at its rate limit",
            Scope::UpstreamTarget => "every eligible upstream is at its rate limit for this target",
            Scope::User => "this user's rate limit is reached",
        }
    }
}

/// A limit that said no, and when its bucket conforms again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub scope: Scope,
    pub ready_at: Instant,
}

/// An upstream known to refuse for a while (see [`PoolLimiter::blocked`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub upstream: UpstreamId,
    pub refusal: Refusal,
}

type Keyed<K> = RateLimiter<K, DashMapStateStore<K>, TokioClock, StateInformationMiddleware>;
type Direct = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<TokioInstant>>;

fn quota(rate: Rate) -> Option<Quota> {
    // `None` only for a zero interval, which validation rules out (rates are at most 10^6/s).
    Quota::with_period(rate.interval).map(|q| q.allow_burst(rate.burst))
}

/// One keyed bucket set and its rate (for the hint after a conforming request).
struct KeyedLimit<K: std::hash::Hash + Eq + Clone> {
    limiter: Keyed<K>,
    interval: Duration,
}

impl<K: std::hash::Hash + Eq + Clone> KeyedLimit<K> {
    fn new(rate: Option<Rate>) -> Option<Self> {
        let rate = rate?;
        Some(KeyedLimit {
            limiter: Keyed::new(quota(rate)?, DashMapStateStore::default(), TokioClock),
            interval: rate.interval,
        })
    }

    /// Takes a token for `key`. `Ok(Some(t))`: it conformed and spent the burst, so the bucket
    /// refuses until about `t` (exact for burst 1, at most one interval late otherwise).
    fn check(&self, key: &K, now: Instant) -> Result<Option<Instant>, Instant> {
        match self.limiter.check_key(key) {
            Ok(snapshot) if snapshot.remaining_burst_capacity() == 0 => {
                Ok(Some(now + self.interval))
            }
            Ok(_) => Ok(None),
            Err(not_until) => Err(not_until.earliest_possible().0),
        }
    }

    fn prune(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}

/// Instants until which keys are expected to refuse.
#[derive(Default)]
struct Hints {
    upstream: HashMap<UpstreamId, Instant>,
    target: HashMap<Arc<str>, HashMap<UpstreamId, Instant>>,
}

/// One pool's per-upstream and per-upstream × target limiters.
pub struct PoolLimiter {
    /// The limits these buckets were built for; a reload that changes them builds new ones.
    config: RateLimitConfig,
    per_upstream: Option<KeyedLimit<UpstreamId>>,
    per_target: Option<KeyedLimit<(UpstreamId, Arc<str>)>>,
    /// What refusals (and spent bursts) taught: lets a request skip an upstream without a store
    /// round trip. A hint is never a grant: the bucket has the last word.
    hints: Mutex<Hints>,
    /// Requests waiting for a target's limits, first come first served; an entry exists only
    /// while someone waited recently.
    queues: Mutex<HashMap<Arc<str>, Arc<tokio::sync::Mutex<()>>>>,
}

impl PoolLimiter {
    fn new(config: RateLimitConfig) -> Self {
        PoolLimiter {
            config,
            per_upstream: KeyedLimit::new(config.per_upstream),
            per_target: KeyedLimit::new(config.per_upstream_target),
            hints: Mutex::default(),
            queues: Mutex::default(),
        }
    }

    fn hints(&self) -> std::sync::MutexGuard<'_, Hints> {
        self.hints.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one request's tokens for `upstream` → `target`: the per-target bucket first (the
    /// tighter one as a rule), then the per-upstream one. When the second refuses, the first's
    /// token is spent all the same: a limit may run slower than configured, never faster.
    pub fn check(&self, upstream: &UpstreamId, target: &Arc<str>) -> Result<(), Refusal> {
        let now = Instant::now();
        if let Some(l) = &self.per_target {
            let result = l.check(&(upstream.clone(), target.clone()), now);
            let until = match result {
                Ok(until) => until,
                Err(at) => Some(at),
            };
            if let Some(until) = until {
                self.hints()
                    .target
                    .entry(target.clone())
                    .or_default()
                    .insert(upstream.clone(), until);
            }
            if let Err(ready_at) = result {
                return Err(Refusal {
                    scope: Scope::UpstreamTarget,
                    ready_at,
                });
            }
        }
        if let Some(l) = &self.per_upstream {
            let result = l.check(upstream, now);
            let until = match result {
                Ok(until) => until,
                Err(at) => Some(at),
            };
            if let Some(until) = until {
                self.hints().upstream.insert(upstream.clone(), until);
            }
            if let Err(ready_at) = result {
                return Err(Refusal {
                    scope: Scope::Upstream,
                    ready_at,
                });
            }
        }
        Ok(())
    }

    /// Upstreams expected to refuse a request to `target` at `now`, each with the limit and the
    /// instant it frees up. Requests pass these to the store as excluded.
    pub fn blocked(&self, target: &str, now: Instant) -> Vec<Blocked> {
        let hints = self.hints();
        let mut out: Vec<Blocked> = hints
            .upstream
            .iter()
            .filter(|(_, at)| **at > now)
            .map(|(id, at)| Blocked {
                upstream: id.clone(),
                refusal: Refusal {
                    scope: Scope::Upstream,
                    ready_at: *at,
                },
            })
            .collect();
        for (id, at) in hints.target.get(target).into_iter().flatten() {
            if *at <= now {
                continue;
            }
            match out.iter_mut().find(|b| b.upstream == *id) {
                // Blocked by both: it frees up when the later of the two does.
                Some(b) if b.refusal.ready_at < *at => {
                    b.refusal = Refusal {
                        scope: Scope::UpstreamTarget,
                        ready_at: *at,
                    }
                }
                Some(_) => {}
                None => out.push(Blocked {
                    upstream: id.clone(),
                    refusal: Refusal {
                        scope: Scope::UpstreamTarget,
                        ready_at: *at,
                    },
                }),
            }
        }
        out
    }

    /// The queue of requests waiting on `target`'s limits, if someone is in it now: a newcomer
    /// then lines up behind them instead of taking the next token first.
    pub fn busy_queue(&self, target: &str) -> Option<Arc<tokio::sync::Mutex<()>>> {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let q = queues.get(target)?;
        q.try_lock().is_err().then(|| q.clone())
    }

    /// The queue of requests waiting on `target`'s limits, made when missing.
    pub fn queue(&self, target: &Arc<str>) -> Arc<tokio::sync::Mutex<()>> {
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(target.clone())
            .or_default()
            .clone()
    }

    /// Keys held by the buckets (per upstream plus per upstream × target).
    pub fn keys(&self) -> usize {
        self.per_upstream.as_ref().map_or(0, |l| l.limiter.len())
            + self.per_target.as_ref().map_or(0, |l| l.limiter.len())
    }

    fn prune(&self) {
        if let Some(l) = &self.per_upstream {
            l.prune();
        }
        if let Some(l) = &self.per_target {
            l.prune();
        }
        let now = Instant::now();
        {
            let mut hints = self.hints();
            hints.upstream.retain(|_, at| *at > now);
            hints.target.retain(|_, ups| {
                ups.retain(|_, at| *at > now);
                !ups.is_empty()
            });
            hints.upstream.shrink_to_fit();
            hints.target.shrink_to_fit();
        }
        // An entry only this map holds has nobody in line or queued.
        self.queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, q| Arc::strong_count(q) > 1);
    }
}

/// One user's bucket.
pub struct UserLimiter {
    rate: Rate,
    limiter: Direct,
}

impl UserLimiter {
    /// Takes a token; `Err(t)`: none before `t`.
    pub fn check(&self) -> Result<(), Instant> {
        self.limiter.check().map_err(|n| n.earliest_possible().0)
    }
}

/// Every limiter of this instance.
#[derive(Default)]
pub struct RateLimits {
    pools: ArcSwap<HashMap<String, Arc<PoolLimiter>>>,
    users: ArcSwap<HashMap<String, Arc<UserLimiter>>>,
}

impl RateLimits {
    /// The limiter of `pool` for `config` (the config in force), or `None` when it has no limit.
    /// Read without a lock; built on first use and again after a reload changed the limits.
    pub fn pool(&self, pool: &str, config: &RateLimitConfig) -> Option<Arc<PoolLimiter>> {
        if !config.is_limited() {
            return None;
        }
        if let Some(l) = self.pools.load().get(pool) {
            if l.config == *config {
                return Some(l.clone());
            }
        }
        let fresh = Arc::new(PoolLimiter::new(*config));
        self.pools.rcu(|map| {
            let mut map = HashMap::clone(map);
            if map.get(pool).is_none_or(|l| l.config != *config) {
                map.insert(pool.to_string(), fresh.clone());
            }
            map
        });
        Some(
            self.pools
                .load()
                .get(pool)
                .filter(|l| l.config == *config)
                .cloned()
                .unwrap_or(fresh),
        )
    }

    /// The bucket of `user` for `rate`, built on first use and again when the rate changed.
    pub fn user(&self, user: &str, rate: Rate) -> Arc<UserLimiter> {
        if let Some(l) = self.users.load().get(user) {
            if l.rate == rate {
                return l.clone();
            }
        }
        let fresh = match quota(rate) {
            Some(q) => Arc::new(UserLimiter {
                rate,
                limiter: Direct::direct_with_clock(q, TokioClock),
            }),
            // Unreachable after validation; a generous bucket rather than a panic.
            None => Arc::new(UserLimiter {
                rate,
                limiter: Direct::direct_with_clock(
                    Quota::per_second(std::num::NonZeroU32::MAX),
                    TokioClock,
                ),
            }),
        };
        self.users.rcu(|map| {
            let mut map = HashMap::clone(map);
            if map.get(user).is_none_or(|l| l.rate != rate) {
                map.insert(user.to_string(), fresh.clone());
            }
            map
        });
        self.users
            .load()
            .get(user)
            .filter(|l| l.rate == rate)
            .cloned()
            .unwrap_or(fresh)
    }

    /// Bounds memory: drops limiters of pools and users whose limits are gone or changed (built
    /// again on next use), then full buckets, stale hints and idle queues of the rest.
    pub fn prune<'a>(
        &self,
        pools: impl IntoIterator<Item = (&'a str, &'a RateLimitConfig)>,
        users: &BTreeMap<String, UserConfig>,
    ) {
        let wanted: HashMap<&str, &RateLimitConfig> = pools.into_iter().collect();
        let keep = |name: &str, l: &PoolLimiter| wanted.get(name).is_some_and(|c| **c == l.config);
        if self.pools.load().iter().any(|(n, l)| !keep(n, l)) {
            self.pools.rcu(|map| {
                map.iter()
                    .filter(|(n, l)| keep(n, l))
                    .map(|(n, l)| (n.clone(), l.clone()))
                    .collect::<HashMap<_, _>>()
            });
        }
        let keep_user = |name: &str, l: &UserLimiter| {
            users
                .get(name)
                .and_then(|u| u.rate_limit)
                .is_some_and(|r| r == l.rate)
        };
        if self.users.load().iter().any(|(n, l)| !keep_user(n, l)) {
            self.users.rcu(|map| {
                map.iter()
                    .filter(|(n, l)| keep_user(n, l))
                    .map(|(n, l)| (n.clone(), l.clone()))
                    .collect::<HashMap<_, _>>()
            });
        }
        for l in self.pools.load().values() {
            l.prune();
        }
    }

    /// Keys held by `pool`'s buckets (for `/status`).
    pub fn keys(&self, pool: &str) -> usize {
        self.pools.load().get(pool).map_or(0, |l| l.keys())
    }
}

/// `/status` figures of one pool's rate limits.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RateLimitView {
    pub per_upstream_per_s: Option<f64>,
    pub per_upstream_target_per_s: Option<f64>,
    pub burst: Option<u32>,
    /// Buckets held now (per upstream and per upstream × target); pruned when full again.
    pub keys_tracked: usize,
    /// Requests answered 429 `rate-limited`, by the limit that stopped them.
    pub rejected: BTreeMap<&'static str, u64>,
    /// Requests that waited for a rate limit (and then passed or were rejected), by limit.
    pub waited: BTreeMap<&'static str, u64>,
}

impl RateLimitView {
    pub fn new(
        config: &RateLimitConfig,
        keys_tracked: usize,
        counts: impl Fn(Scope) -> (u64, u64),
    ) -> Self {
        let mut view = RateLimitView {
            per_upstream_per_s: config.per_upstream.map(|r| r.per_second()),
            per_upstream_target_per_s: config.per_upstream_target.map(|r| r.per_second()),
            burst: config
                .per_upstream
                .or(config.per_upstream_target)
                .map(|r| r.burst.get()),
            keys_tracked,
            ..Default::default()
        };
        for scope in Scope::ALL {
            let (rejected, waited) = counts(scope);
            view.rejected.insert(scope.as_str(), rejected);
            view.waited.insert(scope.as_str(), waited);
        }
        view
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::num::NonZeroU32;

    use super::*;

    fn rate(per_s: u64, burst: u32) -> Rate {
        Rate {
            interval: Duration::from_secs(1) / per_s as u32,
            burst: NonZeroU32::new(burst).unwrap(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_the_paused_runtime() {
        let clock = TokioClock;
        let a = clock.now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        let b = clock.now();
        assert_eq!(
            b.duration_since(a),
            Nanos::from(Duration::from_millis(1500))
        );
        assert_eq!(a.duration_since(b), Nanos::from(Duration::ZERO));
        assert_eq!(b.saturating_sub(Duration::from_millis(1500).into()), a);
        assert_eq!(a + Nanos::from(Duration::from_millis(1500)), b);

        // A limiter on it conforms again exactly when virtual time says so.
        let l = Direct::direct_with_clock(quota(rate(2, 1)).unwrap(), TokioClock);
        assert!(l.check().is_ok());
        let refused = l.check().unwrap_err();
        assert_eq!(
            refused.earliest_possible().0,
            Instant::now() + Duration::from_millis(500)
        );
        tokio::time::advance(Duration::from_millis(499)).await;
        assert!(l.check().is_err());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(l.check().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_and_spent_bursts_leave_hints_and_prune_forgets_them() {
        let config = RateLimitConfig {
            per_upstream: None,
            per_upstream_target: Some(rate(10, 2)),
        };
        let limits = RateLimits::default();
        let pool = limits.pool("p", &config).unwrap();
        let a = UpstreamId::new("a");
        let t: Arc<str> = Arc::from("example.com");
        assert!(pool.check(&a, &t).is_ok());
        assert!(pool.blocked("example.com", Instant::now()).is_empty());
        // The second spends the burst: a hint, at most one interval away.
        assert!(pool.check(&a, &t).is_ok());
        let blocked = pool.blocked("example.com", Instant::now());
        assert_eq!(blocked.len(), 1);
        assert_eq!(blocked[0].refusal.scope, Scope::UpstreamTarget);
        let refusal = pool.check(&a, &t).unwrap_err();
        assert_eq!(
            refusal.ready_at,
            Instant::now() + Duration::from_millis(100)
        );
        assert!(pool.blocked("other.com", Instant::now()).is_empty());
        assert_eq!(pool.keys(), 1);

        // An unchanged config keeps the buckets; a changed one starts afresh.
        assert!(Arc::ptr_eq(&pool, &limits.pool("p", &config).unwrap()));
        tokio::time::advance(Duration::from_secs(1)).await;
        limits.prune([("p", &config)], &BTreeMap::new());
        assert_eq!(pool.keys(), 0);
        assert!(pool.hints().target.is_empty());
        let changed = RateLimitConfig {
            per_upstream: Some(rate(5, 1)),
            ..config
        };
        assert!(!Arc::ptr_eq(&pool, &limits.pool("p", &changed).unwrap()));
        limits.prune([], &BTreeMap::new());
        assert_eq!(limits.pools.load().len(), 0);
    }
}
