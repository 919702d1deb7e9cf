//! A small decaying latency histogram per upstream, for the p50/p95 figures of `/status`.

/// Latency buckets: 1 ms growing by half each step, up to about a minute.
const LATENCY_BUCKETS: usize = 28;
/// Past this many samples the histogram halves, so percentiles follow recent behaviour.
const LATENCY_DECAY_AT: u32 = 2_000;

/// A small decaying histogram of latencies for p50/p95 estimates.
#[derive(Debug, Default, Clone)]
pub(crate) struct LatencyHistogram {
    counts: [u32; LATENCY_BUCKETS],
    total: u32,
}

impl LatencyHistogram {
    fn bound(i: usize) -> f64 {
        1.5f64.powi(i as i32)
    }

    pub(crate) fn record(&mut self, ms: f64) {
        let i = (0..LATENCY_BUCKETS)
            .find(|&i| ms <= Self::bound(i))
            .unwrap_or(LATENCY_BUCKETS - 1);
        self.counts[i] += 1;
        self.total += 1;
        if self.total >= LATENCY_DECAY_AT {
            self.total = 0;
            for c in self.counts.iter_mut() {
                *c /= 2;
                self.total += *c;
            }
        }
    }

    /// The upper bound of the bucket holding quantile `q`.
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = (q * self.total as f64).ceil().max(1.0) as u32;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some((Self::bound(i) * 10.0).round() / 10.0);
            }
        }
        None
    }
}
