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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blake2::{Blake2b512, Digest};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{AuthConfig, UserConfig};
use crate::password::{dummy_hash, verify};
pub use crate::password::{hash_password, hash_password_with_cost};

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
}

/// Checks proxy credentials; shared by every request.
pub struct Authenticator {
    /// Key of the cache's keyed hash, random per process.
    key: [u8; 32],
    cache: Mutex<HashMap<[u8; 32], Instant>>,
    verifications: Arc<Semaphore>,
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

    /// Authenticates `user`/`password` against `auth`; returns the user's config on success.
    pub async fn authenticate<'a>(
        &self,
        auth: &'a AuthConfig,
        user: Option<&str>,
        password: Option<&str>,
    ) -> Result<&'a UserConfig, AuthFailure> {
        let (Some(user), Some(password)) = (user, password) else {
            return Err(AuthFailure::Missing);
        };
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
            _ => Err(AuthFailure::Invalid),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            a.authenticate(&c, None, None).await.unwrap_err(),
            AuthFailure::Missing
        );
        assert!(
            a.authenticate(&c, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );
        assert_eq!(a.cache_len(), 1);
        // Cached now; a wrong password still fails, and is not remembered.
        assert!(
            a.authenticate(&c, Some("alice"), Some("correct horse"))
                .await
                .is_ok()
        );
        for wrong in ["correct hors", "correct horse ", "", "CORRECT HORSE"] {
            assert_eq!(
                a.authenticate(&c, Some("alice"), Some(wrong))
                    .await
                    .unwrap_err(),
                AuthFailure::Invalid
            );
        }
        assert_eq!(
            a.authenticate(&c, Some("bob"), Some("correct horse"))
                .await
                .unwrap_err(),
            AuthFailure::Invalid
        );
        assert_eq!(a.cache_len(), 1);
        // A changed hash (a reload) does not reuse the old entry.
        let c2 = config("alice", "new password");
        assert!(
            a.authenticate(&c2, Some("alice"), Some("correct horse"))
                .await
                .is_err()
        );
        assert!(
            a.authenticate(&c2, Some("alice"), Some("new password"))
                .await
                .is_ok()
        );
    }

    #[test]
    fn debug_of_a_user_hides_the_hash() {
        let c = config("alice", "pw");
        let shown = format!("{c:?}");
        assert!(!shown.contains("argon2"), "{shown}");
    }
}
