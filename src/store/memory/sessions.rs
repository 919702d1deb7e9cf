//! One pool's session bindings in the embedded store: session key → upstream, until an expiry.
//!
//! Built for a million bindings a pool, where a lookup's cost is its misses to memory. A
//! binding is one 48-byte slot and nothing else: the key in place ([`StoredKey`]: a minted key
//! as its 16 bytes, keys up to 22 bytes as they are, only longer ones boxed), the upstream (a
//! shared `Arc`) and the expiry as nanoseconds from the pool's epoch (8 bytes, where an
//! `Instant` takes 16). So a lookup reads the table's control bytes and the slot, and no key
//! behind a pointer.
//!
//! A key is hashed once per store call ([`Key`]: a session acquire's lookup and the slide of its
//! expiry share it), with the standard library's keyed SipHash (the keys are the clients': they
//! must not be able to craft collisions); some of the hash's bits pick the key's shard, the
//! rest place it in the shard's table.
//!
//! Expired bindings are dropped by a sweep, and lookups ignore an expired binding whether it was
//! swept or not. The bindings are split into [`SHARDS`] maps, swept one at a time, so a sweep
//! holds the pool's lock over a sixty-fourth of the bindings (about 0.3 ms at a million, where
//! sweeping them all took 20 ms and stalled every request of the pool): one shard each
//! `SWEEP_INTERVAL / SHARDS`, so each is still swept every [`SWEEP_INTERVAL`] while session
//! acquires keep coming.
//!
//! The live count (`/status`, each metrics scrape) is kept as bindings change rather than walked
//! under the pool's lock, where a walk took milliseconds at a million bindings: bindings are
//! counted by the second their expiry falls in ([`ByExpiry`]), the seconds that have passed are
//! taken out of the sum, and reading it is O(1). This is the Redis store's `session_count` (see
//! `lua/acquire.lua`), with the same meaning: a binding counts until the end of the second its
//! expiry falls in, up to 1 s after it expired and never before (sooner if a sweep drops it
//! first). It costs nothing per binding: a binding's second is its expiry, rounded up.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use hashbrown::HashTable;
use tokio::time::Instant;

use super::stored_key::{Probe, StoredKey};
use crate::upstream::UpstreamId;

/// How often each shard's expired bindings are swept out, at most.
pub(super) const SWEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Maps the bindings are split into; one is swept at a time. A power of two: a key's shard is
/// bits of its hash.
pub(super) const SHARDS: usize = 64;

const _: () = assert!(SHARDS.is_power_of_two());

/// Where a key's shard is read from its hash: the bits just below the top 7, which the tables
/// keep in their control bytes, and far above the low bits that pick a slot in a table.
const SHARD_SHIFT: u32 = 64 - 7 - SHARDS.trailing_zeros();

/// The live count's step: nanoseconds in a second (`BUCKET_MS` in `lua/acquire.lua`).
const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// A binding: one slot of its shard's table.
struct Slot {
    key: StoredKey,
    upstream: UpstreamId,
    /// Nanoseconds from [`Sessions::epoch`].
    expires: u64,
}

// The 48 bytes the module doc counts on: the key in place (24, see `stored_key`), the upstream
// (16) and the expiry (8). It was 40 with the key boxed, plus the key's own allocation (32
// bytes for a minted key) and a miss to memory to compare it at every lookup.
const _: () = assert!(size_of::<Slot>() == 48);

/// The second (from the epoch) an expiry in nanoseconds falls in: the first whole second at or
/// after it, so a binding is counted at least until it expires.
fn second_of(expires: u64) -> u64 {
    expires.div_ceil(NANOS_PER_SECOND)
}

/// Bindings counted by the second their expiry falls in, so the live count is a read.
///
/// Invariant: `seconds` holds, for each second after `aged_through`, the bindings held whose
/// expiry falls in it, and `n` is its sum; a binding in an aged second is in neither.
#[derive(Default)]
struct ByExpiry {
    /// Second → bindings whose expiry falls in it. Aged seconds are dropped, so it holds at most
    /// the longest TTL in seconds plus two entries, however many bindings there are.
    seconds: BTreeMap<u64, u32>,
    /// The sum of `seconds`: the live count.
    n: usize,
    /// The last second taken out of `seconds` (its bindings had all expired by its end).
    aged_through: u64,
}

impl ByExpiry {
    /// Counts a binding in `second` (one in an aged second has expired: not counted).
    fn add(&mut self, second: u64) {
        if second > self.aged_through {
            *self.seconds.entry(second).or_default() += 1;
            self.n += 1;
        }
    }

    /// Takes a binding out of `second`, if that second is still counted.
    fn take(&mut self, second: u64) {
        if second <= self.aged_through {
            return;
        }
        if let Entry::Occupied(mut e) = self.seconds.entry(second) {
            if *e.get() > 1 {
                *e.get_mut() -= 1;
            } else {
                e.remove();
            }
            self.n -= 1;
        }
    }

    /// Moves a binding from one second to another; nothing when they are the same.
    fn moved(&mut self, from: u64, to: u64) {
        if from != to {
            self.take(from);
            self.add(to);
        }
    }

    /// Takes the seconds up to `now` (whole seconds from the epoch) out of the sum: each once.
    fn age(&mut self, now: u64) {
        while let Some(e) = self.seconds.first_entry() {
            if *e.key() > now {
                break;
            }
            self.n -= e.remove() as usize;
        }
        self.aged_through = self.aged_through.max(now);
    }
}

/// A session key made ready for lookups in one [`Sessions`] ([`Sessions::key`]): its stored
/// form and its hash, computed once per store call, where a session acquire looks its key up
/// and then slides its expiry.
#[derive(Clone, Copy)]
pub(super) struct Key<'a> {
    probe: Probe<'a>,
    /// The key's hash with its store's hasher: bits [`SHARD_SHIFT`].. pick the shard.
    hash: u64,
}

impl Key<'_> {
    fn shard(&self) -> usize {
        (self.hash >> SHARD_SHIFT) as usize % SHARDS
    }
}

/// Session key → binding, in [`SHARDS`] tables.
pub(super) struct Sessions {
    shards: Box<[HashTable<Slot>]>,
    /// The standard library's keyed SipHash, keyed afresh per pool: the keys are the clients',
    /// so they cannot craft keys into one shard (whose sweep would be as long as a whole sweep
    /// was) or into one chain of a table.
    hasher: RandomState,
    /// Expiries are counted from here: no binding outlives 584 years of it.
    epoch: Instant,
    next_shard: usize,
    last_sweep: Instant,
    /// The live count, kept up to date by every change so that reading it walks nothing.
    live: ByExpiry,
}

impl Sessions {
    pub fn new(now: Instant) -> Self {
        Sessions {
            shards: (0..SHARDS).map(|_| HashTable::new()).collect(),
            hasher: RandomState::new(),
            epoch: now,
            next_shard: 0,
            last_sweep: now,
            live: ByExpiry::default(),
        }
    }

    fn ticks(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_nanos() as u64
    }

    /// `key` made ready for this store's lookups.
    pub fn key<'a>(&self, key: &'a str) -> Key<'a> {
        let probe = Probe::new(key);
        let hash = self.hasher.hash_one(probe.hashed());
        Key { probe, hash }
    }

    fn slot(&self, key: Key<'_>) -> Option<&Slot> {
        self.shards[key.shard()].find(key.hash, |s| s.key.is(&key.probe))
    }

    /// The upstream `key` is bound to, if its binding is live at `now`.
    pub fn live(&self, key: Key<'_>, now: Instant) -> Option<&UpstreamId> {
        let now = self.ticks(now);
        self.slot(key)
            .filter(|s| s.expires > now)
            .map(|s| &s.upstream)
    }

    /// The upstream `key` is bound to, live or expired but not yet swept.
    pub fn bound(&self, key: Key<'_>) -> Option<&UpstreamId> {
        self.slot(key).map(|s| &s.upstream)
    }

    /// Moves `key`'s expiry to `expires`, if it has a binding. Every lookup does this: the count
    /// changes only when the expiry moves into another second (once a second for a busy key).
    pub fn refresh(&mut self, key: Key<'_>, expires: Instant) {
        let expires = self.ticks(expires);
        let found = self.shards[key.shard()].find_mut(key.hash, |s| s.key.is(&key.probe));
        if let Some(s) = found {
            self.live.moved(second_of(s.expires), second_of(expires));
            s.expires = expires;
        }
    }

    /// Binds `key` to `upstream` until `expires`, replacing any binding it had.
    pub fn bind(&mut self, key: Key<'_>, upstream: &UpstreamId, expires: Instant) {
        let expires = self.ticks(expires);
        let to = second_of(expires);
        let hasher = &self.hasher;
        let shard = &mut self.shards[key.shard()];
        if let Some(s) = shard.find_mut(key.hash, |s| s.key.is(&key.probe)) {
            self.live.moved(second_of(s.expires), to);
            s.upstream = upstream.clone();
            s.expires = expires;
            return;
        }
        let slot = Slot {
            key: key.probe.to_stored(),
            upstream: upstream.clone(),
            expires,
        };
        shard.insert_unique(key.hash, slot, |s| hasher.hash_one(s.key.hashed()));
        self.live.add(to);
    }

    /// Drops `key`'s binding; true when it was live at `now`.
    pub fn remove(&mut self, key: Key<'_>, now: Instant) -> bool {
        let now = self.ticks(now);
        let found = self.shards[key.shard()].find_entry(key.hash, |s| s.key.is(&key.probe));
        let Ok(found) = found else {
            return false;
        };
        let (s, _) = found.remove();
        self.live.take(second_of(s.expires));
        s.expires > now
    }

    /// Bindings counted at `now`: those whose expiry's second has not ended (see the module
    /// doc). O(1) but for the seconds that passed since the last call, each taken out once.
    pub fn count_live(&mut self, now: Instant) -> usize {
        self.live.age(self.ticks(now) / NANOS_PER_SECOND);
        self.live.n
    }

    /// Bindings held, expired ones not yet swept included.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.shards.iter().map(HashTable::len).sum()
    }

    /// What [`Sessions::count_live`] counts, by walking every binding (as it did before).
    #[cfg(test)]
    fn walk_live(&self, now: Instant) -> usize {
        let now = self.ticks(now) / NANOS_PER_SECOND;
        self.shards
            .iter()
            .map(|s| s.iter().filter(|b| second_of(b.expires) > now).count())
            .sum()
    }

    /// The per-second counts rebuilt from the bindings held, for the seconds not yet aged.
    #[cfg(test)]
    fn seconds_walked(&self) -> BTreeMap<u64, u32> {
        let mut seconds = BTreeMap::new();
        for b in self.shards.iter().flat_map(HashTable::iter) {
            let s = second_of(b.expires);
            if s > self.live.aged_through {
                *seconds.entry(s).or_default() += 1;
            }
        }
        seconds
    }

    /// Sweeps the next shard's expired bindings, if one is due; the seconds that have passed
    /// leave the live count on the way, so its map stays bounded without `/status` calls.
    pub fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.last_sweep) < SWEEP_INTERVAL / SHARDS as u32 {
            return;
        }
        let ticks = self.ticks(now);
        self.live.age(ticks / NANOS_PER_SECOND);
        let live = &mut self.live;
        self.shards[self.next_shard].retain(|b| {
            let keep = b.expires > ticks;
            if !keep {
                // Expired within the current second: still counted until now.
                live.take(second_of(b.expires));
            }
            keep
        });
        self.next_shard = (self.next_shard + 1) % SHARDS;
        self.last_sweep = now;
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn up(i: usize) -> UpstreamId {
        UpstreamId::new(format!("u{i}"))
    }

    /// Key `i`, in one of the forms keys are stored in, by `i % 6`: a minted key (hex), the same
    /// digits in uppercase (boxed), short, empty or short Unicode (inline), long (boxed).
    fn mixed_key(i: usize) -> String {
        let digits = (i as u128 / 6 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
        let hex = format!("{digits:032x}");
        match i % 6 {
            0 => hex,
            1 => hex.to_uppercase(),
            2 => format!("k{i}"),
            3 if i == 3 => String::new(),
            3 => format!("ключ{i}"),
            4 => format!("session-{i}-of-a-key-too-long-to-fit-in-the-slot"),
            _ => format!("{hex}-and-more"),
        }
    }

    /// The per-second counts, checked against the bindings held, as (second, bindings) pairs.
    fn seconds(s: &Sessions) -> Vec<(u64, u32)> {
        assert_eq!(s.live.seconds, s.seconds_walked());
        assert_eq!(
            s.live.n,
            s.live.seconds.values().map(|&c| c as usize).sum::<usize>()
        );
        s.live.seconds.iter().map(|(&k, &v)| (k, v)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn bindings_expire_slide_and_end() {
        let t0 = Instant::now();
        let mut s = Sessions::new(t0);
        s.bind(s.key("k"), &up(1), t0 + Duration::from_secs(60));
        assert_eq!(s.live(s.key("k"), t0), Some(&up(1)));
        assert_eq!(s.live(s.key("k"), t0 + Duration::from_secs(60)), None);
        s.refresh(s.key("k"), t0 + Duration::from_secs(120));
        assert_eq!(
            s.live(s.key("k"), t0 + Duration::from_secs(119)),
            Some(&up(1))
        );
        // Expired, not swept: no longer live, still there for `unbind`.
        assert_eq!(s.bound(s.key("k")), Some(&up(1)));
        assert!(!s.remove(s.key("k"), t0 + Duration::from_secs(120)));
        s.bind(s.key("k"), &up(2), t0 + Duration::from_secs(60));
        assert!(s.remove(s.key("k"), t0));
        assert_eq!((s.bound(s.key("k")), s.len()), (None, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_of_every_form_are_found_through_growth_and_removal() {
        let t0 = Instant::now();
        let until = t0 + Duration::from_secs(60);
        let mut s = Sessions::new(t0);
        let n = 6_000;
        let distinct: std::collections::HashSet<_> = (0..n).map(mixed_key).collect();
        assert_eq!(distinct.len(), n);
        for i in 0..n {
            s.bind(s.key(&mixed_key(i)), &up(i), until);
        }
        assert_eq!(s.len(), n);
        for i in 0..n {
            let key = mixed_key(i);
            assert_eq!(s.live(s.key(&key), t0), Some(&up(i)), "{key:?}");
            assert_eq!(s.bound(s.key(&key)), Some(&up(i)), "{key:?}");
        }
        // A minted key and its uppercase: two keys, each with its own binding.
        let (lower, upper) = (mixed_key(6), mixed_key(7));
        assert_eq!(lower.to_uppercase(), upper);
        assert_eq!(
            (s.bound(s.key(&lower)), s.bound(s.key(&upper))),
            (Some(&up(6)), Some(&up(7)))
        );
        assert_eq!(s.bound(s.key(&lower.to_uppercase()[..31])), None);
        // A rebind replaces in place, whatever the form.
        for i in 0..12 {
            s.bind(s.key(&mixed_key(i)), &up(i + n), until);
            assert_eq!(s.bound(s.key(&mixed_key(i))), Some(&up(i + n)));
        }
        assert_eq!(s.len(), n);
        for i in (0..n).step_by(2) {
            assert!(s.remove(s.key(&mixed_key(i)), t0), "{:?}", mixed_key(i));
        }
        assert_eq!(s.len(), n / 2);
        for i in 0..n {
            let want = (i % 2 == 1).then(|| up(if i < 12 { i + n } else { i }));
            assert_eq!(
                s.bound(s.key(&mixed_key(i))).cloned(),
                want,
                "{:?}",
                mixed_key(i)
            );
        }
        assert_eq!(s.count_live(t0), s.walk_live(t0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_walks_one_shard_and_every_shard_is_swept_within_the_interval() {
        let t0 = Instant::now();
        let mut s = Sessions::new(t0);
        let n = 10 * SHARDS;
        for i in 0..n {
            s.bind(
                s.key(&format!("k{i}")),
                &up(i % 3),
                t0 + Duration::from_secs(1),
            );
        }
        s.bind(s.key("kept"), &up(0), t0 + Duration::from_secs(3600));
        let step = SWEEP_INTERVAL / SHARDS as u32;
        let mut now = t0 + Duration::from_secs(2);
        assert_eq!(s.count_live(now), 1);
        s.sweep(now);
        let after_one = s.len();
        assert!(
            after_one > n / 2,
            "one sweep dropped {} of {n}",
            n + 1 - after_one
        );
        // Not due again right after a sweep.
        s.sweep(now);
        assert_eq!(s.len(), after_one);
        for _ in 1..SHARDS {
            now += step;
            s.sweep(now);
        }
        assert_eq!(s.len(), 1);
        assert!(now - t0 <= Duration::from_secs(2) + SWEEP_INTERVAL);
        assert_eq!(s.live(s.key("kept"), now), Some(&up(0)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_count_follows_binds_refreshes_and_removes() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Sessions::new(t0);
        s.bind(s.key("a"), &up(0), at(10_200));
        assert_eq!(seconds(&s), [(11, 1)]);
        assert_eq!(s.count_live(t0), 1);
        // A refresh within the same second moves nothing; into another, it moves the binding.
        s.refresh(s.key("a"), at(10_900));
        assert_eq!(seconds(&s), [(11, 1)]);
        s.refresh(s.key("a"), at(11_000));
        assert_eq!(seconds(&s), [(11, 1)], "11.000 s is still second 11");
        s.refresh(s.key("a"), at(11_100));
        assert_eq!(seconds(&s), [(12, 1)]);
        s.refresh(s.key("unbound"), at(30_000));
        assert_eq!(seconds(&s), [(12, 1)]);
        // A bind adds; a bind replacing a binding moves it.
        s.bind(s.key("b"), &up(1), at(11_500));
        assert_eq!(seconds(&s), [(12, 2)]);
        s.bind(s.key("b"), &up(2), at(20_000));
        assert_eq!(seconds(&s), [(12, 1), (20, 1)]);
        s.bind(s.key("b"), &up(0), at(19_001));
        assert_eq!(seconds(&s), [(12, 1), (20, 1)]);
        assert_eq!(s.count_live(t0), 2);
        // A remove takes out, once.
        assert!(s.remove(s.key("a"), t0));
        assert!(!s.remove(s.key("a"), t0));
        assert_eq!(seconds(&s), [(20, 1)]);
        assert_eq!(s.count_live(t0), 1);

        // A binding whose second has been aged is taken out of nothing when it is replaced or
        // removed.
        s.bind(s.key("c"), &up(0), at(1_000));
        assert_eq!(seconds(&s), [(1, 1), (20, 1)]);
        assert_eq!(s.count_live(at(1_000)), 1, "second 1 has passed");
        s.bind(s.key("c"), &up(1), at(13_000));
        assert_eq!(seconds(&s), [(13, 1), (20, 1)]);
        s.bind(s.key("d"), &up(0), at(1_500));
        assert_eq!(s.count_live(at(1_999)), 3);
        assert_eq!(s.count_live(at(2_000)), 2);
        assert!(!s.remove(s.key("d"), at(2_000)));
        s.refresh(s.key("d"), at(30_000));
        assert_eq!(seconds(&s), [(13, 1), (20, 1)]);
        // Refreshed out of an aged second (a binding expired but not swept), it counts again.
        s.bind(s.key("d"), &up(0), at(1_500));
        assert_eq!(s.count_live(at(2_000)), 2);
        s.refresh(s.key("d"), at(25_000));
        assert_eq!(seconds(&s), [(13, 1), (20, 1), (25, 1)]);
        assert_eq!(s.count_live(at(2_000)), s.walk_live(at(2_000)));
        assert_eq!(s.count_live(at(30_000)), 0);
        assert!(seconds(&s).is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_binding_counts_until_the_end_of_its_expiry_second() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Sessions::new(t0);
        s.bind(s.key("half"), &up(0), at(1_500));
        s.bind(s.key("whole"), &up(1), at(3_000));
        assert_eq!(s.count_live(at(1_499)), 2);
        assert_eq!(s.live(s.key("half"), at(1_500)), None);
        assert_eq!(s.count_live(at(1_500)), 2, "expired, its second not over");
        assert_eq!(s.count_live(at(1_999)), 2);
        assert_eq!(s.count_live(at(2_000)), 1);
        // An expiry on a whole second counts until it, never less than the TTL.
        assert_eq!(s.count_live(at(2_999)), 1);
        assert_eq!(s.count_live(at(3_000)), 0);
        assert_eq!(s.count_live(at(3_000)), s.walk_live(at(3_000)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_takes_out_what_it_drops_while_its_second_still_counts() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = Sessions::new(t0);
        let n = 10 * SHARDS;
        for i in 0..n {
            s.bind(s.key(&format!("k{i}")), &up(i % 3), at(1_200));
        }
        s.bind(s.key("kept"), &up(0), at(3_600_000));
        // Expired at 1.2 s, second 2 not over: every binding still counts until a sweep.
        assert_eq!(s.count_live(at(1_300)), n + 1);
        s.sweep(at(1_300));
        let dropped = n + 1 - s.len();
        assert!(dropped > 0);
        assert_eq!(seconds(&s), [(2, (n - dropped) as u32), (3_600, 1)]);
        assert_eq!(s.count_live(at(1_300)), n + 1 - dropped);
        assert_eq!(s.count_live(at(1_300)), s.walk_live(at(1_300)));
        // The rest age out with their second, and sweeping them later takes nothing twice.
        assert_eq!(s.count_live(at(2_000)), 1);
        let mut now = at(1_300);
        for _ in 1..SHARDS {
            now += SWEEP_INTERVAL / SHARDS as u32;
            s.sweep(now);
        }
        assert_eq!(s.len(), 1);
        assert_eq!(seconds(&s), [(3_600, 1)]);
        assert_eq!(s.count_live(now), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_count_is_the_walk_after_random_operations() {
        const KEYS: usize = 300;
        const MAX_TTL_MS: u64 = 4_000;
        let t0 = Instant::now();
        let mut s = Sessions::new(t0);
        let mut rng = StdRng::seed_from_u64(0x5e55_1025);
        let mut now = t0;
        let mut checked = 0;
        for step in 0..5_000 {
            let key = mixed_key(rng.random_range(0..KEYS));
            let expires = now + Duration::from_millis(rng.random_range(0..=MAX_TTL_MS));
            match rng.random_range(0..100) {
                0..30 => s.bind(s.key(&key), &up(step % 3), expires),
                30..60 => s.refresh(s.key(&key), expires),
                60..70 => {
                    s.remove(s.key(&key), now);
                }
                70..80 => s.sweep(now),
                80..90 => {
                    assert_eq!(s.count_live(now), s.walk_live(now), "step {step}");
                    assert!(s.live.seconds.len() as u64 <= MAX_TTL_MS / 1_000 + 2);
                    checked += 1;
                }
                _ => now += Duration::from_millis(rng.random_range(0..700)),
            }
            seconds(&s);
        }
        assert!(checked > 100);
        assert!(s.count_live(now) > 0, "the sequence left bindings to count");
    }

    #[tokio::test(start_paused = true)]
    async fn the_count_holds_at_most_the_ttl_in_seconds_plus_two_entries() {
        // Session acquires (a sweep, then a bind or a refresh) and no `/status`: the sweeps age
        // the count, so its map does not grow with time.
        let ttl = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut s = Sessions::new(t0);
        let mut now = t0;
        let mut most = 0;
        for i in 0..2_000 {
            now += Duration::from_millis(37);
            s.sweep(now);
            if i % 4 == 0 {
                // A binding made about 5 s before: into a later second.
                s.refresh(s.key(&format!("k{}", i.max(135) - 135)), now + ttl);
            } else {
                s.bind(s.key(&format!("k{i}")), &up(i % 3), now + ttl);
            }
            most = most.max(s.live.seconds.len());
        }
        assert!(most <= 12, "{most} seconds held for a 10 s TTL");
        assert!(most >= 10, "{most} seconds held for a 10 s TTL");
        assert_eq!(s.count_live(now), s.walk_live(now));
    }
}
