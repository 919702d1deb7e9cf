//! Bytes through the gateway: sent and received per pool member, per pool and per user, counted
//! as they flow (a long tunnel shows its traffic while it lasts, not only once it ends).
//!
//! Each exchange gets a [`Tap`] when its upstream is known; the copy loops call
//! [`Tap::up`]/[`Tap::down`] per chunk, which is a few relaxed atomic adds: the exchange's
//! own totals (for its access-log line), its member's, its user's. The maps are read under a lock
//! once per exchange, never per chunk. Figures are this instance's since start; they are not
//! shared through the store. A pool's figures are the sum of its members'.
//!
//! Directions: `up` is what went out through the upstream (the client's request bodies and
//! tunnel bytes), `down` what came back from it. Forwarded requests count their bodies; tunnels every
//! byte of the stream.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::Serialize;

use crate::fast_map::FastMap;

/// Bytes up and down of one member, user or exchange.
#[derive(Debug, Default)]
pub struct ByteCounts {
    up: AtomicU64,
    down: AtomicU64,
}

impl ByteCounts {
    fn add_up(&self, n: u64) {
        self.up.fetch_add(n, Ordering::Relaxed);
    }

    fn add_down(&self, n: u64) {
        self.down.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> Bytes {
        Bytes {
            up: self.up.load(Ordering::Relaxed),
            down: self.down.load(Ordering::Relaxed),
        }
    }
}

/// A reading of [`ByteCounts`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bytes {
    /// Out through the upstream: the client's request bodies and tunnel bytes.
    pub up: u64,
    /// Back from the upstream.
    pub down: u64,
}

impl std::ops::AddAssign for Bytes {
    fn add_assign(&mut self, o: Bytes) {
        self.up += o.up;
        self.down += o.down;
    }
}

/// Upstream id → its counts.
type Members = FastMap<Arc<str>, Arc<ByteCounts>>;

/// Every member's and user's counts on this instance.
#[derive(Default)]
pub struct Meter {
    /// pool → upstream id → counts. Members that left a pool keep their counts (since start).
    members: RwLock<FastMap<Arc<str>, Members>>,
    /// Authenticated user → counts. Users come from the config: the map stays small.
    users: RwLock<FastMap<Arc<str>, Arc<ByteCounts>>>,
}

impl Meter {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The tap of one exchange through `upstream` of `pool`, for `user` when authenticated.
    pub fn tap(&self, pool: &str, upstream: &str, user: Option<&str>) -> Arc<Tap> {
        Arc::new(Tap {
            own: ByteCounts::default(),
            member: self.member(pool, upstream),
            user: user.map(|u| self.user(u)),
        })
    }

    fn member(&self, pool: &str, upstream: &str) -> Arc<ByteCounts> {
        {
            let known = self.members.read().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = known.get(pool).and_then(|m| m.get(upstream)) {
                return c.clone();
            }
        }
        let mut known = self.members.write().unwrap_or_else(|e| e.into_inner());
        known
            .entry(Arc::from(pool))
            .or_default()
            .entry(Arc::from(upstream))
            .or_default()
            .clone()
    }

    fn user(&self, user: &str) -> Arc<ByteCounts> {
        {
            let known = self.users.read().unwrap_or_else(|e| e.into_inner());
            if let Some(c) = known.get(user) {
                return c.clone();
            }
        }
        let mut known = self.users.write().unwrap_or_else(|e| e.into_inner());
        known.entry(Arc::from(user)).or_default().clone()
    }

    /// A member's counts (zero when it never carried anything).
    pub fn upstream(&self, pool: &str, upstream: &str) -> Bytes {
        let known = self.members.read().unwrap_or_else(|e| e.into_inner());
        known
            .get(pool)
            .and_then(|m| m.get(upstream))
            .map_or_else(Bytes::default, |c| c.get())
    }

    /// A pool's counts: the sum of every member it ever had.
    pub fn pool(&self, pool: &str) -> Bytes {
        let known = self.members.read().unwrap_or_else(|e| e.into_inner());
        let mut sum = Bytes::default();
        for c in known.get(pool).into_iter().flat_map(|m| m.values()) {
            sum += c.get();
        }
        sum
    }

    /// Every user who sent or received anything, by name.
    pub fn users(&self) -> Vec<(String, Bytes)> {
        let known = self.users.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = known
            .iter()
            .map(|(k, c)| (k.to_string(), c.get()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// One exchange's meter: its own totals, and its member's and user's.
#[derive(Debug)]
pub struct Tap {
    own: ByteCounts,
    member: Arc<ByteCounts>,
    user: Option<Arc<ByteCounts>>,
}

impl Tap {
    /// `n` bytes went out through the upstream.
    pub fn up(&self, n: u64) {
        self.own.add_up(n);
        self.member.add_up(n);
        if let Some(u) = &self.user {
            u.add_up(n);
        }
    }

    /// `n` bytes came back from the upstream.
    pub fn down(&self, n: u64) {
        self.own.add_down(n);
        self.member.add_down(n);
        if let Some(u) = &self.user {
            u.add_down(n);
        }
    }

    /// This exchange's totals so far.
    pub fn totals(&self) -> Bytes {
        self.own.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taps_add_up_per_member_pool_and_user() {
        let m = Meter::new();
        let a = m.tap("p", "http://a:1", Some("alice"));
        let b = m.tap("p", "http://b:1", None);
        let c = m.tap("q", "http://a:1", Some("alice"));
        a.up(10);
        a.down(100);
        b.up(1);
        c.down(7);
        assert_eq!(a.totals(), Bytes { up: 10, down: 100 });
        assert_eq!(m.upstream("p", "http://a:1"), Bytes { up: 10, down: 100 });
        assert_eq!(m.pool("p"), Bytes { up: 11, down: 100 });
        assert_eq!(m.pool("q"), Bytes { up: 0, down: 7 });
        assert_eq!(m.pool("none"), Bytes::default());
        assert_eq!(
            m.users(),
            vec![("alice".to_string(), Bytes { up: 10, down: 107 })]
        );
        // A second exchange through the same member adds to the same counts.
        m.tap("p", "http://a:1", None).up(5);
        assert_eq!(m.upstream("p", "http://a:1").up, 15);
    }
}
