//! Exchange statistics on their way to a pool's stats HASH.
//!
//! Outcome counts and latency sums are summed here per upstream and go to Redis once per
//! [`FLUSH_EVERY`] (in a call of their own, or with a release call when they have waited that
//! long), instead of with every release call. Three `HINCRBY` per upstream per release call were
//! a sixth of Redis's work per proxied request; once a second they cost nothing. The figures are
//! telemetry (`/status`): another instance sees this one's at most that late, and this instance
//! adds what it has not sent yet to what it reads.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::outcome::Outcome;
use crate::upstream::UpstreamId;

/// How long statistics may wait before they go to Redis.
pub(super) const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What one upstream's ended exchanges add.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Sums {
    outcomes: [u64; Outcome::ALL.len()],
    latency_us: u64,
    latency_n: u64,
}

/// Statistics not yet sent, and since when the oldest of them waits.
#[derive(Debug, Default)]
pub(super) struct Pending {
    since: Option<Instant>,
    /// A pool has few upstreams with traffic in a second: a list searched in place beats a map.
    sums: Vec<(UpstreamId, Sums)>,
}

impl Pending {
    pub fn add(&mut self, upstream: &UpstreamId, outcome: Outcome, latency: Duration) {
        let sums = self.sums_of(upstream);
        sums.outcomes[outcome.index()] += 1;
        sums.latency_us += latency.as_micros() as u64;
        sums.latency_n += 1;
        self.since.get_or_insert_with(Instant::now);
    }

    /// True when the oldest waiting figure has waited [`FLUSH_EVERY`] at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.since
            .is_some_and(|since| now.saturating_duration_since(since) >= FLUSH_EVERY)
    }

    /// Everything waiting, leaving nothing.
    pub fn take(&mut self) -> Taken {
        self.since = None;
        Taken(std::mem::take(&mut self.sums))
    }

    /// Puts back what a failed call carried, so it goes with the next one.
    pub fn restore(&mut self, taken: Taken) {
        for (up, s) in taken.0 {
            self.sums_of(&up).add(&s);
        }
        self.since.get_or_insert_with(Instant::now);
    }

    /// `upstream`'s sums, new ones when it has none yet.
    fn sums_of(&mut self, upstream: &UpstreamId) -> &mut Sums {
        let i = match self.sums.iter().position(|(up, _)| up == upstream) {
            Some(i) => i,
            None => {
                self.sums.push((upstream.clone(), Sums::default()));
                self.sums.len() - 1
            }
        };
        &mut self.sums[i].1
    }

    /// Adds what waits here to `counters` (upstream -> field -> count), as read from Redis.
    pub fn add_to(&self, counters: &mut HashMap<String, HashMap<String, u64>>) {
        for (up, s) in &self.sums {
            let c = counters.entry(up.as_str().to_string()).or_default();
            for (field, amount) in s.fields() {
                *c.entry(field.to_string()).or_default() += amount;
            }
        }
    }
}

impl Sums {
    fn add(&mut self, other: &Sums) {
        for (mine, theirs) in self.outcomes.iter_mut().zip(other.outcomes) {
            *mine += theirs;
        }
        self.latency_us += other.latency_us;
        self.latency_n += other.latency_n;
    }

    /// The stats HASH's fields of one upstream (without the upstream), with what to add; zeros
    /// left out.
    fn fields(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Outcome::ALL
            .iter()
            .map(|o| (o.key(), self.outcomes[o.index()]))
            .chain([
                ("latency_us", self.latency_us),
                ("latency_n", self.latency_n),
            ])
            .filter(|(_, n)| *n > 0)
    }
}

/// Statistics taken for one call.
#[derive(Debug, Default)]
pub(super) struct Taken(Vec<(UpstreamId, Sums)>);

impl Taken {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs `release.lua` takes: a field of the stats HASH (`<upstream>\n<counter>`) and the
    /// amount to add to it.
    pub fn pairs(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        self.0.iter().flat_map(|(up, s)| {
            s.fields().map(move |(what, amount)| {
                let mut field = String::with_capacity(up.as_str().len() + 1 + what.len());
                field.push_str(up.as_str());
                field.push('\n');
                field.push_str(what);
                (field, amount)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(s: &str) -> UpstreamId {
        UpstreamId::new(s)
    }

    /// Every field appears once, with the sum of what its exchanges add, and upstreams whose ids
    /// share a prefix stay apart.
    #[test]
    fn each_field_is_summed_once() {
        let mut p = Pending::default();
        p.add(&up("http://a:1"), Outcome::Ok, Duration::from_micros(100));
        p.add(&up("http://a:10"), Outcome::Ok, Duration::from_micros(7));
        p.add(
            &up("http://a:1"),
            Outcome::Timeout,
            Duration::from_micros(2_000),
        );
        p.add(&up("http://a:1"), Outcome::Ok, Duration::from_micros(50));
        let mut got: Vec<_> = p.take().pairs().collect();
        got.sort();
        let ok = Outcome::Ok.key();
        let timeout = Outcome::Timeout.key();
        let mut want = vec![
            (format!("http://a:1\n{ok}"), 2),
            (format!("http://a:1\n{timeout}"), 1),
            ("http://a:1\nlatency_us".to_string(), 2_150),
            ("http://a:1\nlatency_n".to_string(), 3),
            (format!("http://a:10\n{ok}"), 1),
            ("http://a:10\nlatency_us".to_string(), 7),
            ("http://a:10\nlatency_n".to_string(), 1),
        ];
        want.sort();
        assert_eq!(got, want);
        assert!(p.take().is_empty());
    }

    /// Figures become due one flush period after the oldest arrived, not after the newest.
    #[test]
    fn due_counts_from_the_oldest_waiting_figure() {
        let mut p = Pending::default();
        let start = Instant::now();
        assert!(!p.due(start + FLUSH_EVERY * 10), "nothing waits");
        p.add(&up("http://a:1"), Outcome::Ok, Duration::ZERO);
        let first = p.since.expect("set by the first figure");
        p.add(&up("http://a:1"), Outcome::Ok, Duration::ZERO);
        assert_eq!(p.since, Some(first));
        assert!(!p.due(first + FLUSH_EVERY - Duration::from_millis(1)));
        assert!(p.due(first + FLUSH_EVERY));
        p.take();
        assert!(!p.due(first + FLUSH_EVERY * 10));
    }

    /// What a failed call carried is summed with what arrived meanwhile, and reported locally.
    #[test]
    fn restored_figures_add_to_newer_ones() {
        let mut p = Pending::default();
        p.add(&up("http://a:1"), Outcome::Ok, Duration::from_micros(10));
        let taken = p.take();
        p.add(&up("http://a:1"), Outcome::Ok, Duration::from_micros(5));
        p.add(&up("http://b:2"), Outcome::Reset, Duration::from_micros(1));
        p.restore(taken);
        let mut counters = HashMap::new();
        counters.insert(
            "http://a:1".to_string(),
            HashMap::from([(Outcome::Ok.key().to_string(), 40)]),
        );
        p.add_to(&mut counters);
        let a = &counters["http://a:1"];
        assert_eq!(a[Outcome::Ok.key()], 42);
        assert_eq!(a["latency_us"], 15);
        assert_eq!(a["latency_n"], 2);
        assert_eq!(counters["http://b:2"][Outcome::Reset.key()], 1);
        assert!(p.due(Instant::now() + FLUSH_EVERY));
    }
}
