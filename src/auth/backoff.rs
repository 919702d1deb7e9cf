//! The failure budget of logins per client address: after `max_failures` failed logins within
//! `window` (counted from the first of them), the address's logins are refused for `lockout`
//! without a password check, so a flood of wrong passwords from one client cannot keep the
//! argon2 slots busy for everyone else.
//!
//! Clients are keyed by address, IPv6 ones by their /64 (one host usually holds a whole /64, and
//! could otherwise move to a fresh address for every attempt). The map is bounded: when it is
//! full, entries with nothing left to remember (window over, not locked) are dropped; if it is
//! still full, a new address goes untracked until room frees up, while the addresses already
//! locked out stay locked.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::LoginBackoff;

/// Client addresses tracked at once.
pub const MAX_TRACKED_CLIENTS: usize = 65_536;

/// The address a failure counts against: an IPv4 address, or an IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

impl ClientKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V6(v6) => ClientKey(IpAddr::V6(Ipv6Addr::from(
                u128::from(v6) & !u128::from(u64::MAX),
            ))),
            v4 => ClientKey(v4),
        }
    }
}

impl fmt::Display for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(ip) => write!(f, "{ip}"),
            IpAddr::V6(ip) => write!(f, "{ip}/64"),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Record {
    /// When the current window of failures began.
    since: Instant,
    failures: u32,
    /// Logins are refused until then.
    locked_until: Option<Instant>,
}

impl Record {
    fn fresh(now: Instant) -> Self {
        Record {
            since: now,
            failures: 0,
            locked_until: None,
        }
    }

    fn locked_at(&self, now: Instant) -> bool {
        self.locked_until.is_some_and(|t| t > now)
    }

    /// Whether the record still says something: locked, or failures within the window.
    fn live(&self, now: Instant, window: Duration) -> bool {
        self.locked_at(now) || now.saturating_duration_since(self.since) < window
    }
}

/// Failed logins per client address; shared by every request.
#[derive(Default)]
pub struct Backoff {
    clients: Mutex<HashMap<ClientKey, Record>>,
    /// Records that carry a lockout (over or not): while there are none, which is nearly always,
    /// an authenticated request asks [`Backoff::any_locked`] and takes no lock.
    with_lockout: AtomicUsize,
}

impl Backoff {
    fn lock(&self) -> MutexGuard<'_, HashMap<ClientKey, Record>> {
        self.clients.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether any client may be locked out; false means [`Backoff::locked`] would say `None`
    /// for everyone.
    pub fn any_locked(&self) -> bool {
        self.with_lockout.load(Ordering::Relaxed) > 0
    }

    /// How much longer `client` is locked out, if it is.
    pub fn locked(&self, client: ClientKey, now: Instant) -> Option<Duration> {
        let clients = self.lock();
        let until = clients.get(&client)?.locked_until?;
        (until > now).then(|| until - now)
    }

    /// Counts a failed login of `client`; true when this failure locked it out.
    pub fn failed(&self, client: ClientKey, policy: &LoginBackoff, now: Instant) -> bool {
        if policy.max_failures == 0 {
            return false;
        }
        let mut clients = self.lock();
        if !clients.contains_key(&client) && clients.len() >= MAX_TRACKED_CLIENTS {
            let mut dropped = 0;
            clients.retain(|_, r| {
                let keep = r.live(now, policy.window);
                dropped += usize::from(!keep && r.locked_until.is_some());
                keep
            });
            self.with_lockout.fetch_sub(dropped, Ordering::Relaxed);
            if clients.len() >= MAX_TRACKED_CLIENTS {
                return false;
            }
        }
        let r = clients.entry(client).or_insert_with(|| Record::fresh(now));
        if r.locked_at(now) {
            // A check that began before the lockout: the lockout already counts.
            return false;
        }
        if r.locked_until.is_some() || now.saturating_duration_since(r.since) >= policy.window {
            if r.locked_until.is_some() {
                self.with_lockout.fetch_sub(1, Ordering::Relaxed);
            }
            *r = Record::fresh(now);
        }
        r.failures = r.failures.saturating_add(1);
        if r.failures < policy.max_failures {
            return false;
        }
        r.failures = 0;
        r.locked_until = now.checked_add(policy.lockout);
        if r.locked_until.is_some() {
            self.with_lockout.fetch_add(1, Ordering::Relaxed);
        }
        r.locked_until.is_some()
    }

    /// Client addresses locked out at `now`.
    pub fn locked_out(&self, now: Instant) -> usize {
        self.lock().values().filter(|r| r.locked_at(now)).count()
    }

    /// Client addresses tracked (for tests).
    pub fn tracked(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClientKey {
        ClientKey::of(s.parse().unwrap())
    }

    const POLICY: LoginBackoff = LoginBackoff {
        max_failures: 3,
        window: Duration::from_secs(60),
        lockout: Duration::from_secs(30),
    };

    #[test]
    fn ipv6_clients_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
        assert_eq!(key("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
    }

    #[tokio::test(start_paused = true)]
    async fn failures_within_the_window_lock_out_for_the_lockout_then_the_budget_starts_over() {
        let b = Backoff::default();
        let a = key("10.0.0.1");
        let t0 = Instant::now();
        assert!(!b.failed(a, &POLICY, t0));
        assert!(!b.failed(a, &POLICY, t0 + Duration::from_secs(10)));
        assert_eq!(b.locked(a, t0 + Duration::from_secs(10)), None);
        assert!(b.failed(a, &POLICY, t0 + Duration::from_secs(20)));
        assert_eq!(
            b.locked(a, t0 + Duration::from_secs(20)),
            Some(Duration::from_secs(30))
        );
        assert_eq!(b.locked_out(t0 + Duration::from_secs(20)), 1);
        // Failures while locked (checks already under way) change nothing.
        assert!(!b.failed(a, &POLICY, t0 + Duration::from_secs(25)));
        assert_eq!(
            b.locked(a, t0 + Duration::from_secs(49)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(b.locked(a, t0 + Duration::from_secs(50)), None);
        assert_eq!(b.locked_out(t0 + Duration::from_secs(50)), 0);
        // A fresh budget after the lockout.
        assert!(!b.failed(a, &POLICY, t0 + Duration::from_secs(51)));
        assert!(!b.failed(a, &POLICY, t0 + Duration::from_secs(52)));
        assert!(b.failed(a, &POLICY, t0 + Duration::from_secs(53)));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_spread_wider_than_the_window_never_lock() {
        let b = Backoff::default();
        let a = key("10.0.0.1");
        let t0 = Instant::now();
        for i in 0..10u64 {
            // Two per window: the third opens a new window.
            assert!(
                !b.failed(a, &POLICY, t0 + Duration::from_secs(31 * i)),
                "{i}"
            );
        }
        assert_eq!(b.locked_out(t0 + Duration::from_secs(400)), 0);
        // Turned off: nothing is counted.
        let off = LoginBackoff {
            max_failures: 0,
            ..POLICY
        };
        let c = key("10.0.0.9");
        for _ in 0..10 {
            assert!(!b.failed(c, &off, t0));
        }
        assert_eq!(b.locked(c, t0), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_map_stays_bounded_and_keeps_its_lockouts() {
        let b = Backoff::default();
        let t0 = Instant::now();
        let locked = key("10.255.255.255");
        for _ in 0..POLICY.max_failures {
            b.failed(locked, &POLICY, t0);
        }
        for i in 0..MAX_TRACKED_CLIENTS as u32 {
            b.failed(ClientKey::of(IpAddr::from(i.to_be_bytes())), &POLICY, t0);
        }
        assert_eq!(b.tracked(), MAX_TRACKED_CLIENTS);
        // Full of live entries: a newcomer is not tracked, the lockout holds.
        let late = key("11.0.0.1");
        b.failed(late, &POLICY, t0 + Duration::from_secs(1));
        assert_eq!(b.tracked(), MAX_TRACKED_CLIENTS);
        assert!(b.locked(locked, t0 + Duration::from_secs(1)).is_some());
        // Once the windows are over, the stale entries make room.
        let later = t0 + Duration::from_secs(61);
        b.failed(late, &POLICY, later);
        assert!(b.tracked() <= 2, "{}", b.tracked());
    }
}
