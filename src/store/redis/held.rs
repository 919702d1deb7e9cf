//! Unlisted leases: leases of a pool that Redis does not record one by one.
//!
//! Without a cap, and under any strategy but least-connections, nothing on the hot path reads a
//! pool's lease records: they only fed `leases_live` in `/status` and lapsed when their gateway
//! died. Writing one and deleting it again was most of what Redis did per request (and all of the
//! release call). So there the acquire only counts the allocation (`acquire.lua` with lease id
//! `-`), the release sends nothing, and this instance counts its leases per upstream here and
//! reports the counts once a second with a deadline (`report.lua`), so that other instances see
//! them and a dead instance's counts lapse after `lease_ttl`, as its leases would have.

use tokio::time::Instant;

use crate::store::LeaseId;
use crate::upstream::UpstreamId;

/// This instance's unlisted leases of one pool, and what Redis holds of them.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Live unlisted leases per upstream (few upstreams are in use at once: a list beats a map).
    counts: Vec<(UpstreamId, u64)>,
    /// Leases the local view granted while Redis was unreachable and that still ran when it came
    /// back (the local view's lease id, the upstream, the lease's deadline). They are reported
    /// with the unlisted leases, so that Redis counts them against caps and least-connections
    /// loads until they end; they are not leases of Redis, so [`Held::of`] and [`Held::counts`]
    /// (what the local view is told at the next outage) leave them out: it holds them as its own.
    carried: Vec<(LeaseId, UpstreamId, Instant)>,
    /// The counts of the last report Redis acknowledged.
    reported: Vec<(UpstreamId, u64)>,
    /// A report may be in Redis: the last acknowledged one held some, or an unacknowledged one
    /// may have run.
    in_redis: bool,
}

/// A report to send: the lines `report.lua` takes, and the counts to remember once it succeeds.
#[derive(Debug)]
pub(super) struct Report {
    pub lines: String,
    /// Some upstream holds fewer than the last report said.
    pub dropped: bool,
    counts: Vec<(UpstreamId, u64)>,
}

impl Held {
    pub fn take(&mut self, upstream: &UpstreamId) {
        match self.counts.iter_mut().find(|(up, _)| up == upstream) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((upstream.clone(), 1)),
        }
    }

    /// Ends one unlisted lease of `upstream` (one it never took is ignored).
    pub fn end(&mut self, upstream: &UpstreamId) {
        if let Some(i) = self.counts.iter().position(|(up, _)| up == upstream) {
            self.counts[i].1 -= 1;
            if self.counts[i].1 == 0 {
                self.counts.swap_remove(i);
            }
        }
    }

    /// Carries the local view's `leases` (see [`Held`]), once each.
    pub fn carry(&mut self, leases: impl IntoIterator<Item = (LeaseId, UpstreamId, Instant)>) {
        for (id, up, deadline) in leases {
            if !self.carried.iter().any(|(l, _, _)| *l == id) {
                self.carried.push((id, up, deadline));
            }
        }
    }

    /// The local view's lease `id` ended; true when it was carried.
    pub fn uncarry(&mut self, id: LeaseId) -> bool {
        match self.carried.iter().position(|(l, _, _)| *l == id) {
            Some(i) => {
                self.carried.swap_remove(i);
                true
            }
            None => false,
        }
    }

    /// The local view's lease `id` was extended to `deadline`.
    pub fn extend_carried(&mut self, id: LeaseId, deadline: Instant) {
        if let Some(c) = self.carried.iter_mut().find(|(l, _, _)| *l == id) {
            c.2 = deadline;
        }
    }

    /// Live unlisted leases per upstream.
    pub fn counts(&self) -> &[(UpstreamId, u64)] {
        &self.counts
    }

    /// Live unlisted leases of `upstream`.
    pub fn of(&self, upstream: &str) -> u64 {
        self.counts
            .iter()
            .find(|(up, _)| up.as_str() == upstream)
            .map_or(0, |(_, n)| *n)
    }

    /// What to report at `now`: the counts, carried leases included, while any lease is held
    /// (that also renews the report's deadline), then one empty report; `None` once Redis holds
    /// nothing of this instance. A carried lease past its deadline is dropped: the local view
    /// purges it too.
    pub fn report(&mut self, now: Instant) -> Option<Report> {
        self.carried.retain(|(_, _, deadline)| *deadline > now);
        if self.counts.is_empty() && self.carried.is_empty() && !self.in_redis {
            return None;
        }
        let mut counts = self.counts.clone();
        for (_, up, _) in &self.carried {
            match counts.iter_mut().find(|(u, _)| u == up) {
                Some((_, n)) => *n += 1,
                None => counts.push((up.clone(), 1)),
            }
        }
        let mut lines = String::new();
        for (up, n) in &counts {
            if !lines.is_empty() {
                lines.push('\n');
            }
            lines.push_str(&n.to_string());
            lines.push(' ');
            lines.push_str(up.as_str());
        }
        let now_of = |up: &UpstreamId| counts.iter().find(|(u, _)| u == up).map_or(0, |(_, n)| *n);
        let dropped = self
            .reported
            .iter()
            .any(|(up, before)| now_of(up) < *before);
        Some(Report {
            lines,
            dropped,
            counts,
        })
    }

    /// Redis applied `report`.
    pub fn reported(&mut self, report: Report) {
        self.in_redis = !report.counts.is_empty();
        self.reported = report.counts;
    }

    /// A report may or may not have run: send one again next time, even an empty one.
    pub fn unsure(&mut self) {
        self.in_redis = true;
    }
}

/// Adds the counts of other instances' report `lines` to `live` (upstream → leases).
pub(super) fn add_lines(lines: &str, live: &mut std::collections::HashMap<String, u64>) {
    for line in lines.lines() {
        if let Some((n, up)) = line.split_once(' ') {
            if let Ok(n) = n.parse::<u64>() {
                *live.entry(up.to_string()).or_default() += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(s: &str) -> UpstreamId {
        UpstreamId::new(s)
    }

    #[test]
    fn counts_leases_per_upstream_and_reports_them_as_lines() {
        let mut h = Held::default();
        assert!(
            h.report(Instant::now()).is_none(),
            "nothing held, nothing in redis"
        );
        h.take(&up("a"));
        h.take(&up("b"));
        h.take(&up("a"));
        assert_eq!((h.of("a"), h.of("b"), h.of("c")), (2, 1, 0));
        let r = h.report(Instant::now()).expect("a report");
        assert_eq!(r.lines, "2 a\n1 b");
        assert!(!r.dropped);
        let mut live = std::collections::HashMap::new();
        add_lines(&r.lines, &mut live);
        add_lines("3 a\nbad line\nx c", &mut live);
        assert_eq!(live.get("a"), Some(&5));
        assert_eq!(live.get("b"), Some(&1));
        assert_eq!(live.get("c"), None);
    }

    #[test]
    fn reports_until_redis_holds_nothing_and_says_when_a_count_dropped() {
        let mut h = Held::default();
        h.take(&up("a"));
        h.take(&up("a"));
        let r = h.report(Instant::now()).unwrap();
        h.reported(r);
        // Unchanged counts are reported again: that renews the deadline.
        let r = h.report(Instant::now()).unwrap();
        assert!(!r.dropped);
        h.reported(r);
        h.end(&up("a"));
        let r = h.report(Instant::now()).unwrap();
        assert!(r.dropped);
        assert_eq!(r.lines, "1 a");
        h.reported(r);
        h.end(&up("a"));
        h.end(&up("a")); // one too many: ignored
        let r = h.report(Instant::now()).expect("one empty report");
        assert_eq!(r.lines, "");
        assert!(r.dropped);
        h.reported(r);
        assert!(h.report(Instant::now()).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn carried_leases_are_reported_until_they_end_or_lapse_but_are_not_held() {
        let mut h = Held::default();
        let now = Instant::now();
        let ttl = std::time::Duration::from_secs(60);
        h.take(&up("a"));
        h.carry([
            (LeaseId(7), up("a"), now + ttl),
            (LeaseId(8), up("b"), now + ttl),
        ]);
        h.carry([(LeaseId(7), up("a"), now + ttl)]); // once each
        let r = h.report(now).unwrap();
        assert_eq!(r.lines, "2 a\n1 b");
        h.reported(r);
        // The local view holds them as its own: not part of this instance's Redis leases.
        assert_eq!((h.of("a"), h.of("b")), (1, 0));
        assert_eq!(h.counts(), [(up("a"), 1)]);
        assert!(h.uncarry(LeaseId(7)));
        assert!(!h.uncarry(LeaseId(7)), "ended once");
        let r = h.report(now).unwrap();
        assert_eq!(r.lines, "1 a\n1 b");
        assert!(r.dropped);
        h.reported(r);
        // Extended, lease 8 outlives the first deadline, then lapses with its own.
        h.extend_carried(LeaseId(8), now + 2 * ttl);
        tokio::time::advance(ttl + std::time::Duration::from_secs(1)).await;
        assert_eq!(h.report(Instant::now()).unwrap().lines, "1 a\n1 b");
        tokio::time::advance(ttl).await;
        let r = h.report(Instant::now()).unwrap();
        assert_eq!(r.lines, "1 a");
        assert!(r.dropped);
    }

    #[test]
    fn a_report_that_may_have_run_is_followed_by_another() {
        let mut h = Held::default();
        assert!(h.report(Instant::now()).is_none());
        h.unsure();
        let r = h
            .report(Instant::now())
            .expect("an empty report, in case the last one ran");
        assert_eq!(r.lines, "");
        h.reported(r);
        assert!(h.report(Instant::now()).is_none());
    }
}
