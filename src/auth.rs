//! Client authentication: Basic proxy credentials checked against argon2 hashes from the config.
//!
//! Argon2 is slow on purpose, so a successful check is remembered in a bounded cache and the hot
//! path pays for it once per user and password, not once per request. The cache is keyed by a
//! keyed hash (BLAKE2b with a per-process random key) of the user name, the password *and* the
//! stored hash: a wrong password yields a different key, so it can never hit the cache, and a
//! changed hash (a reload) makes old entries unreachable.
//!
//! Timing: the stored hash is compared by argon2's own constant-time check; an unknown user is
//! verified against a dummy hash so that it costs what a known one does; cache keys are looked up
//! by a keyed hash, which leaks nothing about the password.
//!
//! Floods: each client address has a failure budget ([`backoff`], `[auth] max_login_failures`
//! within `login_failure_window`). Past it, its logins are refused for `login_lockout` before any
//! check, the cache included (a cache hit would tell a guesser its guess was right), so one
//! client's wrong passwords cannot keep the argon2 slots busy for everyone.

pub mod backoff;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blake2::{Blake2b512, Digest};
use serde::Serialize;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{AuthConfig, LoginBackoff, UserConfig};
use crate::password::{dummy_hash, verify};
pub use crate::password::{hash_password, hash_password_with_cost};
use backoff::{Backoff, ClientKey};

/// How many successful verifications are remembered at once.
pub const MAX_AUTH_CACHE_ENTRIES: usize = 10_000;
/// How long a remembered verification stays valid.
pub const AUTH_CACHE_TTL: Duration = Duration::from_secs(300);
/// Argon2 verifications running at once; more wait, so a flood of wrong passwords costs a bounded
/// share of the CPU.
pub const MAX_CONCURRENT_VERIFICATIONS: usize = 4;

/// Why a request did not authenticate. Never carries the password.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Proxy-Authorization` at all.
    Missing,
    /// Unknown user or wrong password (not told apart, to the client or in logs).
    Invalid,
    /// Too many failed logins from this client address: refused without a check for this long.
    LockedOut { retry_after: Duration },
}

/// What authentication has done since start, for `/status` and `/metrics`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct AuthStats {
    /// Passwords checked with argon2 (cache hits and refusals not included).
    pub password_checks: u64,
    /// Logins refused for an unknown user or a wrong password.
    pub failures: u64,
    /// Logins refused at once, without a check, because their client address was locked out.
    pub lockout_refusals: u64,
    /// Client addresses locked out now.
    pub clients_locked_out: u64,
    /// Successful checks remembered now.
    pub cache_entries: u64,
}

/// Checks proxy credentials; shared by every request.
pub struct Authenticator {
    /// Key of the cache's keyed hash, random per process.
    key: [u8; 32],
    cache: Mutex<HashMap<[u8; 32], Instant>>,
    verifications: Arc<Semaphore>,
    backoff: Backoff,
    password_checks: AtomicU64,
    failures: AtomicU64,
    lockout_refusals: AtomicU64,
}

impl Default for Authenticator {
    fn default() -> Self {
        Self::new()
    }
}

impl Authenticator {
    pub fn new() -> Self {
        Authenticator {
            key: rand::random(),
            cache: Mutex::new(HashMap::new()),
            verifications: Arc::new(Semaphore::new(MAX_CONCURRENT_VERIFICATIONS)),
            backoff: Backoff::default(),
            password_checks: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            lockout_refusals: AtomicU64::new(0),
        }
    }

    fn cache_key(&self, user: &str, password: &str, phc: &str) -> [u8; 32] {
        let mut h = Blake2b512::new();
        h.update(self.key);
        for part in [user, password, phc] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        let out = h.finalize();
        let mut key = [0u8; 32];
        key.copy_from_slice(&out[..32]);
        key
    }

    fn cached(&self, key: &[u8; 32]) -> bool {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .get(key)
            .is_some_and(|at| at.elapsed() < AUTH_CACHE_TTL)
    }

    fn remember(&self, key: [u8; 32]) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_AUTH_CACHE_ENTRIES {
            cache.retain(|_, at| at.elapsed() < AUTH_CACHE_TTL);
            if cache.len() >= MAX_AUTH_CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(key, Instant::now());
    }

    /// Number of remembered verifications (for tests and `/status`).
    pub fn cache_len(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// The counts of `/status`.
    pub fn stats(&self) -> AuthStats {
        AuthStats {
            password_checks: self.password_checks.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            lockout_refusals: self.lockout_refusals.load(Ordering::Relaxed),
            clients_locked_out: self.backoff.locked_out(Instant::now()) as u64,
            cache_entries: self.cache_len() as u64,
        }
    }

    /// Refuses a locked-out client, counting the refusal.
    fn refuse_locked_out(
        &self,
        client: ClientKey,
        policy: &LoginBackoff,
    ) -> Result<(), AuthFailure> {
        if policy.max_failures == 0 || !self.backoff.any_locked() {
            return Ok(());
        }
        match self.backoff.locked(client, Instant::now()) {
            Some(retry_after) => {
                self.lockout_refusals.fetch_add(1, Ordering::Relaxed);
                Err(AuthFailure::LockedOut { retry_after })
            }
            None => Ok(()),
        }
    }

    /// Authenticates `user`/`password` from the client at `client` against `auth`; returns the
    /// user's config on success. A client locked out by its failures is refused before any check.
    pub async fn authenticate<'a>(
        &self,
        auth: &'a AuthConfig,
        client: IpAddr,
        user: Option<&str>,
        password: Option<&str>,
    ) -> Result<&'a UserConfig, AuthFailure> {
        let (Some(user), Some(password)) = (user, password) else {
            return Err(AuthFailure::Missing);
        };
        let client = ClientKey::of(client);
        let policy = &auth.login_backoff;
        self.refuse_locked_out(client, policy)?;
        let known = auth.users.get(user);
        let phc = known.map_or_else(|| dummy_hash().to_string(), |u| u.password_hash.clone());
        let key = self.cache_key(user, password, &phc);
        if let Some(u) = known {
            if self.cached(&key) {
                return Ok(u);
            }
        }
        let ok = {
            let Ok(_permit) = self.verifications.clone().acquire_owned().await else {
                return Err(AuthFailure::Invalid);
            };
            // The client may have been locked out while this check waited for its slot.
            self.refuse_locked_out(client, policy)?;
            self.password_checks.fetch_add(1, Ordering::Relaxed);
            let password = password.to_string();
            tokio::task::spawn_blocking(move || verify(&phc, &password))
                .await
                .unwrap_or(false)
        };
        match known {
            Some(u) if ok => {
                self.remember(key);
                Ok(u)
            }
            _ => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                if self.backoff.failed(client, policy, Instant::now()) {
                    tracing::warn!(
                        client = %client,
                        failures = policy.max_failures,
                        lockout_s = policy.lockout.as_secs(),
                        "too many failed proxy logins from one client: its logins are refused for a while"
                    );
                }
                Err(AuthFailure::Invalid)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

    fn config(user: &str, password: &str) -> AuthConfig {
        let mut c = AuthConfig::default();
        c.users.insert(
            user.to_string(),
            UserConfig {
                password_hash: hash_password_with_cost(password, 8, 1, 1).unwrap(),
                pools: None,
                rate_limit: None,
            },
        );
        c
    }

    #[tokio::test]
    async fn right_password_passes_and_is_cached_wrong_never_hits_the_cache() {
        let c = config("alice", "correct horse");
        let a = Authenticator::new();
        assert_eq!(
            a.authenticate(&c, CLIENT, None, None).await.unwrap_err(),
            AuthFailure::Missing
        );
        assert!(
            a.authenticate(&c, CLIENT, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );
        assert_eq!(a.cache_len(), 1);
        // Cached now; a wrong password still fails, and is not remembered.
        assert!(
            a.authenticate(&c, CLIENT, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );
        for wrong in ["correct hors", "correct horse ", "", "CORRECT HORSE"] {
            assert_eq!(
                a.authenticate(&c, CLIENT, Some("alice"), Some(wrong))
                    .await
                    .unwrap_err(),
                AuthFailure::Invalid
            );
        }
        assert_eq!(
            a.authenticate(&c, CLIENT, Some("bob"), Some("correct horse"))
                .await
                .unwrap_err(),
            AuthFailure::Invalid
        );
        assert_eq!(a.cache_len(), 1);
        // A changed hash (a reload) does not reuse the old entry.
        let c2 = config("alice", "new password");
        assert!(
            a.authenticate(&c2, CLIENT, Some("alice"), Some("correct horse"))
                .await
                .is_err()
        );
        assert!(
            a.authenticate(&c2, CLIENT, Some("alice"), Some("new password"))
                .await
                .is_ok()
        );
    }

    /// N wrong passwords from one client lock it out: the next login, even with the right
    /// password (cached or not), is refused at once without an argon2 check; another client is
    /// unaffected; after the lockout the right password works again.
    #[tokio::test(start_paused = true)]
    async fn a_client_past_its_failure_budget_is_refused_without_a_check_until_the_lockout_ends() {
        let mut c = config("alice", "correct horse");
        c.login_backoff = LoginBackoff {
            max_failures: 3,
            window: Duration::from_secs(60),
            lockout: Duration::from_secs(60),
        };
        let a = Authenticator::new();
        let other = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));
        // Cached from before: the lockout must not let a cache hit through either.
        assert!(
            a.authenticate(&c, CLIENT, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );
        for i in 0..3 {
            assert_eq!(
                a.authenticate(&c, CLIENT, Some("alice"), Some("wrong"))
                    .await
                    .unwrap_err(),
                AuthFailure::Invalid,
                "{i}"
            );
        }
        let s = a.stats();
        assert_eq!((s.password_checks, s.failures), (4, 3));
        assert_eq!((s.lockout_refusals, s.clients_locked_out), (0, 1));

        for pw in ["correct horse", "wrong"] {
            let e = a
                .authenticate(&c, CLIENT, Some("alice"), Some(pw))
                .await
                .unwrap_err();
            assert!(
                matches!(e, AuthFailure::LockedOut { retry_after } if retry_after <= Duration::from_secs(60)),
                "{e:?}"
            );
        }
        // Without credentials it is just missing: there is no check to save.
        assert_eq!(
            a.authenticate(&c, CLIENT, None, None).await.unwrap_err(),
            AuthFailure::Missing
        );
        let s = a.stats();
        assert_eq!(s.password_checks, 4, "no argon2 check while locked out");
        assert_eq!(s.lockout_refusals, 2);

        // Another client address is unaffected.
        assert!(
            a.authenticate(&c, other, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );

        tokio::time::advance(Duration::from_secs(59)).await;
        assert!(matches!(
            a.authenticate(&c, CLIENT, Some("alice"), Some("correct horse"))
                .await
                .unwrap_err(),
            AuthFailure::LockedOut { .. }
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            a.authenticate(&c, CLIENT, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );
        assert_eq!(a.stats().clients_locked_out, 0);

        // Turned off (max_login_failures = 0): wrong passwords are only ever wrong.
        c.login_backoff.max_failures = 0;
        for _ in 0..5 {
            assert_eq!(
                a.authenticate(&c, other, Some("alice"), Some("wrong"))
                    .await
                    .unwrap_err(),
                AuthFailure::Invalid
            );
        }
    }

    #[test]
    fn debug_of_a_user_hides_the_hash() {
        let c = config("alice", "pw");
        let shown = format!("{c:?}");
        assert!(!shown.contains("argon2"), "{shown}");
    }
}
