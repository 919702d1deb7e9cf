//! Grants taken ahead of need, in pools whose leases are unlisted (see `held.rs`).
//!
//! There a plain acquire only picks the least-used upstream and counts the allocation; nothing
//! is recorded that the request itself must own. Under load, requests still waited a Redis round
//! trip each (parked, then woken across worker threads), which cost the gateway more CPU than the
//! acquire did Redis. So when requests queue up for the acquire call, the call also takes grants
//! for the requests that will follow, picked and counted by the same script in the same atomic
//! step; those requests take one from here without waiting, and a refill goes out in the
//! background when half the stock is used.
//!
//! Each lane of plain acquires (the whole pool's, and each label-filter subset's, see
//! `acquire.rs`) keeps a stock of its own, of grants its own call picked.
//!
//! The stock only forms under concurrency: a call that carries a single waiting request asks for
//! nothing extra, so a lightly used pool counts every allocation when it is used, as before. A
//! grant is used within [`MAX_AGE`] or dropped, and a lapse halves the stock's size; any change
//! to the pool's members (a local health decision, an event from another instance, a reload, a
//! reconnection) drops what the stock holds and what a call sent before it brings. A grant is
//! thus never used more than [`MAX_AGE`] after it was picked, nor after a change this instance
//! knows of. A dropped grant stays counted in Redis: an allocation that was not used, at most
//! [`MAX_STOCK`] per lane at a time.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use crate::upstream::UpstreamId;

/// How long a grant may wait for its request.
pub(super) const MAX_AGE: Duration = Duration::from_millis(100);

/// The most grants one lane holds ahead; also what one refill asks for at most. At 64, a busy
/// gateway on loopback Redis still found the stock empty for one request in nine (the refill's
/// round trip outlasted the half it was sent at); at 128, for one in 150, and Redis spent 12%
/// less time in the acquire script (fewer, larger calls).
pub(super) const MAX_STOCK: usize = 128;

#[derive(Debug, Default)]
pub(super) struct Stock {
    grants: VecDeque<(UpstreamId, Instant)>,
    /// How many grants to hold: grows by the requests that queued up for a call (to at least
    /// twice their number), halves at a lapse.
    want: usize,
    /// A refill is queued or under way.
    refilling: bool,
    /// Moves at every [`Stock::clear`]: grants picked by a call sent before it are not stocked.
    generation: u64,
}

impl Stock {
    /// A grant picked less than [`MAX_AGE`] ago, the oldest first; lapsed ones are dropped on the
    /// way, and a lapse halves the stock's size.
    pub fn take(&mut self, now: Instant) -> Option<UpstreamId> {
        let mut lapsed = false;
        while let Some((up, at)) = self.grants.pop_front() {
            if now.saturating_duration_since(at) < MAX_AGE {
                if lapsed {
                    self.want /= 2;
                }
                return Some(up);
            }
            lapsed = true;
        }
        if lapsed {
            self.want /= 2;
        }
        None
    }

    /// Whether a refill should go out now (half the stock is used and none is under way); when
    /// it should, it is marked as under way.
    pub fn start_refill(&mut self) -> bool {
        let start = !self.refilling && self.want > 0 && self.grants.len() * 2 <= self.want;
        if start {
            self.refilling = true;
        }
        start
    }

    /// A call carries `waiting` requests that the stock could not serve: it should hold at least
    /// twice that many, and as many more than it held, since what it held ran out before its
    /// refill came back. A lone request is no sign of load and changes nothing.
    pub fn note_waiting(&mut self, waiting: usize) {
        if waiting >= 2 {
            self.want = (self.want + waiting).max(2 * waiting).min(MAX_STOCK);
        }
    }

    /// How many grants a refill should ask for.
    pub fn refill_size(&self) -> usize {
        self.want.saturating_sub(self.grants.len())
    }

    /// What [`Stock::fill`] must be handed with the grants of a call sent now.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Stocks the grants a call brought, picked at `now` by a call sent in `generation`, and ends
    /// the refill. Grants picked before the last clear are dropped.
    pub fn fill(
        &mut self,
        grants: impl IntoIterator<Item = UpstreamId>,
        now: Instant,
        generation: u64,
    ) {
        self.refilling = false;
        if generation != self.generation {
            return;
        }
        for up in grants {
            if self.grants.len() < MAX_STOCK {
                self.grants.push_back((up, now));
            }
        }
    }

    /// A refill failed or brought nothing.
    pub fn refill_failed(&mut self) {
        self.refilling = false;
    }

    /// Drops every grant: the pool's members changed, or Redis may have.
    pub fn clear(&mut self) {
        self.grants.clear();
        self.generation += 1;
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.grants.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up(i: usize) -> UpstreamId {
        UpstreamId::new(format!("http://10.0.0.{i}:3128"))
    }

    #[test]
    fn lone_requests_never_form_a_stock() {
        let mut s = Stock::default();
        for _ in 0..100 {
            s.note_waiting(1);
            assert!(!s.start_refill());
            assert_eq!(s.refill_size(), 0);
        }
        assert_eq!(s.take(Instant::now()), None);
    }

    #[test]
    fn a_queue_sizes_the_stock_and_a_refill_goes_out_when_half_is_used() {
        let t0 = Instant::now();
        let mut s = Stock::default();
        s.note_waiting(5);
        assert!(s.start_refill(), "ten wanted, none held");
        assert!(!s.start_refill(), "one refill at a time");
        assert_eq!(s.refill_size(), 10);
        s.fill((0..10).map(up), t0, 0);
        assert_eq!(s.len(), 10);
        for i in 0..4 {
            assert_eq!(s.take(t0), Some(up(i)), "the oldest first");
            assert!(!s.start_refill(), "more than half left after {}", i + 1);
        }
        assert_eq!(s.take(t0), Some(up(4)));
        assert!(s.start_refill(), "half used");
        assert_eq!(s.refill_size(), 5);
        s.note_waiting(500);
        assert_eq!(s.refill_size(), MAX_STOCK - 5, "never more than MAX_STOCK");
        s.fill((0..2 * MAX_STOCK).map(up), t0, 0);
        assert_eq!(s.len(), MAX_STOCK);
    }

    #[test]
    fn a_stock_that_runs_out_grows_by_the_requests_that_waited() {
        let mut s = Stock::default();
        s.note_waiting(4);
        assert_eq!(s.refill_size(), 8, "twice the first queue");
        // Refills that came back too late: every call again carries a few waiting requests.
        for grown in [12, 16, 20] {
            s.note_waiting(4);
            assert_eq!(s.refill_size(), grown);
        }
        s.note_waiting(30);
        assert_eq!(s.refill_size(), 60, "a large queue: twice its size");
        for _ in 0..100 {
            s.note_waiting(3);
        }
        assert_eq!(s.refill_size(), MAX_STOCK, "never more than MAX_STOCK");
    }

    #[test]
    fn grants_lapse_after_max_age_and_a_lapse_halves_the_stock() {
        let t0 = Instant::now();
        let mut s = Stock::default();
        s.note_waiting(8);
        assert!(s.start_refill());
        s.fill((0..16).map(up), t0, 0);
        let just_in_time = t0 + MAX_AGE - Duration::from_millis(1);
        assert_eq!(s.take(just_in_time), Some(up(0)));
        s.fill([up(20)], t0 + MAX_AGE, 0);
        assert_eq!(
            s.take(t0 + MAX_AGE),
            Some(up(20)),
            "the lapsed ones are dropped on the way to a fresh one"
        );
        assert_eq!(s.len(), 0);
        assert_eq!(s.refill_size(), 8, "16 halved");
        assert_eq!(s.take(t0 + MAX_AGE), None);
        assert_eq!(s.refill_size(), 8, "nothing lapsed this time");
    }

    #[test]
    fn clearing_drops_every_grant_and_what_a_call_sent_before_it_brings() {
        let t0 = Instant::now();
        let mut s = Stock::default();
        s.note_waiting(3);
        assert!(s.start_refill());
        s.refill_failed();
        assert!(s.start_refill(), "a failed refill does not block the next");
        s.fill((0..6).map(up), t0, s.generation());
        s.clear();
        assert_eq!(s.take(t0), None);
        assert_eq!(s.refill_size(), 6, "a change of members is no lapse");
        let sent = s.generation();
        assert!(s.start_refill());
        s.clear();
        s.fill((0..6).map(up), t0, sent);
        assert_eq!(s.take(t0), None, "picked before the change: not stocked");
        assert!(s.start_refill(), "and the refill is over");
    }
}
