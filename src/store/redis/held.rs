//! Unlisted leases: leases of a pool that Redis does not record one by one.
//!
//! Without a cap, and under any strategy but least-connections, nothing on the hot path reads a
//! pool's lease records: they only fed `leases_live` in `/status` and lapsed when their gateway
//! died. Writing one and deleting it again was most of what Redis did per request (and all of the
//! release call). So there the acquire only counts the allocation (`acquire.lua` with lease id
//! `-`), the release sends nothing, and this instance counts its leases per upstream here and
//! reports the counts once a second with a deadline (`report.lua`), so that other instances see
//! them and a dead instance's counts lapse after `lease_ttl`, as its leases would have.

use crate::upstream::UpstreamId;

/// This instance's unlisted leases of one pool, and what Redis holds of them.
#[derive(Debug, Default)]
pub(super) struct Held {
    /// Live unlisted leases per upstream (few upstreams are in use at once: a list beats a map).
    counts: Vec<(UpstreamId, u64)>,
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

    /// What to report now: the counts while any lease is held (that also renews the report's
    /// deadline), then one empty report; `None` once Redis holds nothing of this instance.
    pub fn report(&self) -> Option<Report> {
        if self.counts.is_empty() && !self.in_redis {
            return None;
        }
        let mut lines = String::new();
        for (up, n) in &self.counts {
            if !lines.is_empty() {
                lines.push('\n');
            }
            lines.push_str(&n.to_string());
            lines.push(' ');
            lines.push_str(up.as_str());
        }
        let dropped = self
            .reported
            .iter()
            .any(|(up, before)| self.of(up.as_str()) < *before);
        Some(Report {
            lines,
            dropped,
            counts: self.counts.clone(),
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
        assert!(h.report().is_none(), "nothing held, nothing in redis");
        h.take(&up("a"));
        h.take(&up("b"));
        h.take(&up("a"));
        assert_eq!((h.of("a"), h.of("b"), h.of("c")), (2, 1, 0));
        let r = h.report().expect("a report");
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
        let r = h.report().unwrap();
        h.reported(r);
        // Unchanged counts are reported again: that renews the deadline.
        let r = h.report().unwrap();
        assert!(!r.dropped);
        h.reported(r);
        h.end(&up("a"));
        let r = h.report().unwrap();
        assert!(r.dropped);
        assert_eq!(r.lines, "1 a");
        h.reported(r);
        h.end(&up("a"));
        h.end(&up("a")); // one too many: ignored
        let r = h.report().expect("one empty report");
        assert_eq!(r.lines, "");
        assert!(r.dropped);
        h.reported(r);
        assert!(h.report().is_none());
    }

    #[test]
    fn a_report_that_may_have_run_is_followed_by_another() {
        let mut h = Held::default();
        assert!(h.report().is_none());
        h.unsure();
        let r = h
            .report()
            .expect("an empty report, in case the last one ran");
        assert_eq!(r.lines, "");
        h.reported(r);
        assert!(h.report().is_none());
    }
}
