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
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use blake2::{Blake2b512, Digest};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::{AuthConfig, UserConfig};

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

/// A hash string that is not a usable argon2 PHC string.
#[derive(Debug, thiserror::Error)]
#[error("not an argon2 password hash")]
pub struct BadHash;

/// Checks that `phc` is an argon2 PHC string (`$argon2id$v=19$m=..,t=..,p=..$salt$hash`).
pub fn check_hash(phc: &str) -> Result<(), BadHash> {
    let parsed = PasswordHash::new(phc).map_err(|_| BadHash)?;
    match parsed.algorithm.as_str() {
        "argon2id" | "argon2i" | "argon2d" if parsed.hash.is_some() => Ok(()),
        _ => Err(BadHash),
    }
}

/// Hashes `password` with argon2id and the crate's default (OWASP) cost: what
/// `poolgate hash-password` prints.
pub fn hash_password(password: &str) -> Result<String, argon2::password_hash::Error> {
    hash_with(Argon2::default(), password)
}

/// Hashes with explicit costs (`m_kib` memory in KiB, `t` passes, `p` lanes); tests use cheap ones.
pub fn hash_password_with_cost(
    password: &str,
    m_kib: u32,
    t: u32,
    p: u32,
) -> Result<String, argon2::password_hash::Error> {
    let params = Params::new(m_kib, t, p, None)?;
    hash_with(
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params),
        password,
    )
}

fn hash_with(argon: Argon2<'_>, password: &str) -> Result<String, argon2::password_hash::Error> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())?;
    Ok(argon.hash_password(password.as_bytes(), &salt)?.to_string())
}

/// Verifies `password` against `phc`; constant-time in the comparison of the derived key.
fn verify(phc: &str, password: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// A hash no password matches in practice, verified for unknown users so they cost the same.
fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let pw: [u8; 16] = rand::random();
        hash_password(&format!("{pw:?}")).unwrap_or_default()
    })
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
    fn hashes_are_recognised_and_other_strings_are_not() {
        let h = hash_password_with_cost("x", 8, 1, 1).unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(check_hash(&h).is_ok());
        for bad in [
            "",
            "hunter2",
            "$2b$12$abcdefghijklmnopqrstuv",
            "$argon2id$v=19$m=8,t=1,p=1",
        ] {
            assert!(check_hash(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn debug_of_a_user_hides_the_hash() {
        let c = config("alice", "pw");
        let shown = format!("{c:?}");
        assert!(!shown.contains("argon2"), "{shown}");
    }
}
