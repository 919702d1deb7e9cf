//! The last hour on this instance, in 10-second buckets: per pool, exchanges by outcome class,
//! bytes up and down, p50/p95 latency, and upstreams by state. `GET /status/history` serves it
//! and the dashboard draws it.
//!
//! Exchanges are counted as they end ([`History::record`], from every lease release: a read lock
//! and two relaxed atomic adds), latencies into log-scale bins. Every [`BUCKET_SECS`] a tick
//! closes the bucket ([`History::close`]): it takes the counts, reads the pool's byte totals and
//! state counts, and pushes one sample into a ring of [`BUCKETS`]; memory stays bounded by the
//! number of pools.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::Serialize;

use crate::fast_map::FastMap;
use crate::meter::Bytes;
use crate::outcome::Outcome;

/// Width of a bucket.
pub const BUCKET_SECS: u64 = 10;
/// Buckets kept: one hour.
pub const BUCKETS: usize = 360;
/// Latency bins: bin `i` holds latencies up to 2^(i/4) ms (about 19% wide each), the last one
/// everything longer (past 2^16 ms, some 65 s).
const LATENCY_BINS: usize = 65;
const BINS_PER_DOUBLING: f64 = 4.0;

/// What the current bucket has counted for a pool so far.
struct Live {
    classes: [AtomicU64; Outcome::CLASSES.len()],
    latency: [AtomicU64; LATENCY_BINS],
}

impl Default for Live {
    fn default() -> Self {
        Live {
            classes: std::array::from_fn(|_| AtomicU64::new(0)),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A pool's figures at the close of a bucket, read by the tick.
#[derive(Debug, Clone, Default)]
pub struct PoolGauges {
    pub name: String,
    /// Byte totals since start (the bucket holds the difference to the previous ones).
    pub bytes: Bytes,
    pub states: BTreeMap<&'static str, usize>,
}

/// One pool in one bucket.
#[derive(Debug, Clone, Default)]
struct PoolSample {
    classes: [u64; Outcome::CLASSES.len()],
    bytes: Bytes,
    p50_ms: Option<f64>,
    p95_ms: Option<f64>,
    states: BTreeMap<&'static str, usize>,
}

#[derive(Debug, Clone)]
struct Sample {
    /// The bucket's end, Unix seconds.
    t: u64,
    pools: Vec<(String, PoolSample)>,
}

#[derive(Default)]
struct Ring {
    samples: VecDeque<Sample>,
    /// Each pool's byte totals at the last close.
    last_bytes: FastMap<String, Bytes>,
}

/// The in-process history.
#[derive(Default)]
pub struct History {
    live: RwLock<FastMap<Arc<str>, Arc<Live>>>,
    ring: Mutex<Ring>,
}

fn bin_of(latency_s: f64) -> usize {
    let ms = latency_s * 1000.0;
    if ms.is_nan() || ms <= 1.0 {
        return 0;
    }
    let bin = (ms.log2() * BINS_PER_DOUBLING).ceil();
    (bin as usize).min(LATENCY_BINS - 1)
}

fn bin_upper_ms(bin: usize) -> f64 {
    (bin as f64 / BINS_PER_DOUBLING).exp2()
}

/// The `q` quantile of the binned latencies (each bin's upper bound), `None` without any.
fn quantile(bins: &[u64; LATENCY_BINS], q: f64) -> Option<f64> {
    let total: u64 = bins.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in bins.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(bin_upper_ms(i));
        }
    }
    Some(bin_upper_ms(LATENCY_BINS - 1))
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    fn live(&self, pool: &str) -> Arc<Live> {
        {
            let known = self.live.read().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = known.get(pool) {
                return l.clone();
            }
        }
        let mut known = self.live.write().unwrap_or_else(|e| e.into_inner());
        known.entry(Arc::from(pool)).or_default().clone()
    }

    /// Counts one ended exchange of `pool` in the current bucket.
    pub fn record(&self, pool: &str, outcome: Outcome, latency_s: f64) {
        let live = self.live(pool);
        let class = Outcome::CLASSES
            .iter()
            .position(|c| *c == outcome.class())
            .unwrap_or(0);
        live.classes[class].fetch_add(1, Ordering::Relaxed);
        live.latency[bin_of(latency_s)].fetch_add(1, Ordering::Relaxed);
    }

    /// Closes the bucket ending at `t` (Unix seconds) with the pools' gauges; the oldest bucket
    /// past [`BUCKETS`] goes.
    pub fn close(&self, t: u64, gauges: Vec<PoolGauges>) {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let mut pools = Vec::with_capacity(gauges.len());
        for g in gauges {
            let live = self.live(&g.name);
            let classes = std::array::from_fn(|i| live.classes[i].swap(0, Ordering::Relaxed));
            let bins: [u64; LATENCY_BINS] =
                std::array::from_fn(|i| live.latency[i].swap(0, Ordering::Relaxed));
            let last = ring.last_bytes.insert(g.name.clone(), g.bytes);
            let last = last.unwrap_or_default();
            let bytes = Bytes {
                up: g.bytes.up.saturating_sub(last.up),
                down: g.bytes.down.saturating_sub(last.down),
            };
            pools.push((
                g.name,
                PoolSample {
                    classes,
                    bytes,
                    p50_ms: quantile(&bins, 0.5),
                    p95_ms: quantile(&bins, 0.95),
                    states: g.states,
                },
            ));
        }
        ring.samples.push_back(Sample { t, pools });
        while ring.samples.len() > BUCKETS {
            ring.samples.pop_front();
        }
    }

    /// The kept buckets as series, oldest first.
    pub fn view(&self) -> HistoryView {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let n = ring.samples.len();
        let mut names: Vec<String> = Vec::new();
        for s in &ring.samples {
            for (name, _) in &s.pools {
                if !names.contains(name) {
                    names.push(name.clone());
                }
            }
        }
        let pools = names
            .into_iter()
            .map(|name| {
                let mut p = PoolHistory {
                    name: name.clone(),
                    requests: Vec::with_capacity(n),
                    outcomes: Outcome::CLASSES
                        .iter()
                        .map(|c| (*c, Vec::with_capacity(n)))
                        .collect(),
                    bytes_up: Vec::with_capacity(n),
                    bytes_down: Vec::with_capacity(n),
                    latency_p50_ms: Vec::with_capacity(n),
                    latency_p95_ms: Vec::with_capacity(n),
                    states: BTreeMap::new(),
                };
                for (i, s) in ring.samples.iter().enumerate() {
                    let found = s.pools.iter().find(|(n, _)| *n == name).map(|(_, p)| p);
                    let empty = PoolSample::default();
                    let ps = found.unwrap_or(&empty);
                    p.requests.push(ps.classes.iter().sum());
                    for (k, c) in Outcome::CLASSES.iter().enumerate() {
                        if let Some(v) = p.outcomes.get_mut(c) {
                            v.push(ps.classes[k]);
                        }
                    }
                    p.bytes_up.push(ps.bytes.up);
                    p.bytes_down.push(ps.bytes.down);
                    p.latency_p50_ms.push(ps.p50_ms);
                    p.latency_p95_ms.push(ps.p95_ms);
                    for (state, count) in &ps.states {
                        p.states
                            .entry(*state)
                            .or_insert_with(|| vec![None; i])
                            .push(Some(*count as u64));
                    }
                    for v in p.states.values_mut() {
                        if v.len() < i + 1 {
                            v.push(found.map(|_| 0));
                        }
                    }
                }
                p
            })
            .collect();
        HistoryView {
            bucket_s: BUCKET_SECS,
            t: ring.samples.iter().map(|s| s.t).collect(),
            pools,
        }
    }
}

/// `GET /status/history`: one array per figure, a value per bucket, aligned with `t`.
#[derive(Debug, Serialize)]
pub struct HistoryView {
    pub bucket_s: u64,
    /// Each bucket's end, Unix seconds, oldest first.
    pub t: Vec<u64>,
    pub pools: Vec<PoolHistory>,
}

#[derive(Debug, Serialize)]
pub struct PoolHistory {
    pub name: String,
    /// Exchanges that ended in the bucket.
    pub requests: Vec<u64>,
    /// The same by outcome class (`ok`, `proxy-fault`, `origin-ban`, `captcha`, `origin-error`,
    /// `cancelled`).
    pub outcomes: BTreeMap<&'static str, Vec<u64>>,
    pub bytes_up: Vec<u64>,
    pub bytes_down: Vec<u64>,
    /// Of the exchanges that ended in the bucket (`null` without any); binned, within ~19%.
    pub latency_p50_ms: Vec<Option<f64>>,
    pub latency_p95_ms: Vec<Option<f64>>,
    /// Upstreams by state at the bucket's end.
    pub states: BTreeMap<&'static str, Vec<Option<u64>>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gauges(name: &str, up: u64, healthy: usize) -> PoolGauges {
        PoolGauges {
            name: name.to_string(),
            bytes: Bytes { up, down: 2 * up },
            states: [("healthy", healthy), ("dead", 0)].into_iter().collect(),
        }
    }

    #[test]
    fn buckets_hold_their_own_counts_bytes_and_latency() {
        let h = History::new();
        for _ in 0..19 {
            h.record("p", Outcome::Ok, 0.010);
        }
        h.record("p", Outcome::Timeout, 2.0);
        h.record("p", Outcome::Captcha, 0.010);
        h.close(10, vec![gauges("p", 100, 3)]);
        h.record("p", Outcome::Blocked, 0.5);
        h.close(20, vec![gauges("p", 150, 2), gauges("q", 7, 1)]);
        let v = h.view();
        assert_eq!(v.t, vec![10, 20]);
        let p = &v.pools[0];
        assert_eq!(p.name, "p");
        assert_eq!(p.requests, vec![21, 1]);
        assert_eq!(p.outcomes["ok"], vec![19, 0]);
        assert_eq!(p.outcomes["proxy-fault"], vec![1, 0]);
        assert_eq!(p.outcomes["captcha"], vec![1, 0]);
        assert_eq!(p.outcomes["origin-ban"], vec![0, 1]);
        assert_eq!(p.bytes_up, vec![100, 50]);
        assert_eq!(p.bytes_down, vec![200, 100]);
        // 10 ms lies in the bin up to 2^(14/4) ≈ 11.3 ms; 2 s in the one up to 2^(44/4) ms.
        let p50 = p.latency_p50_ms[0].unwrap();
        assert!((10.0..12.0).contains(&p50), "{p50}");
        assert!((10.0..12.0).contains(&p.latency_p95_ms[0].unwrap()));
        assert!((500.0..600.0).contains(&p.latency_p50_ms[1].unwrap()));
        assert_eq!(p.states["healthy"], vec![Some(3), Some(2)]);
        // A pool that appeared later has nothing before it.
        let q = &v.pools[1];
        assert_eq!(q.requests, vec![0, 0]);
        assert_eq!(q.states["healthy"], vec![None, Some(1)]);
        assert_eq!(q.latency_p50_ms, vec![None, None]);
    }

    #[test]
    fn the_ring_keeps_one_hour() {
        let h = History::new();
        for i in 0..(BUCKETS as u64 + 25) {
            h.record("p", Outcome::Ok, 0.001);
            h.close(i * BUCKET_SECS, vec![gauges("p", i, 1)]);
        }
        let v = h.view();
        assert_eq!(v.t.len(), BUCKETS);
        assert_eq!(v.t[0], 25 * BUCKET_SECS);
        assert!(v.pools[0].requests.iter().all(|n| *n == 1));
        assert!(v.pools[0].bytes_up.iter().all(|n| *n == 1));
    }

    #[test]
    fn latency_bins_are_ordered_and_bounded() {
        assert_eq!(bin_of(0.0), 0);
        assert_eq!(bin_of(f64::NAN), 0);
        assert!(bin_of(0.010) < bin_of(0.012));
        assert_eq!(bin_of(1e6), LATENCY_BINS - 1);
        assert!(bin_upper_ms(bin_of(0.123)) >= 123.0);
    }
}
