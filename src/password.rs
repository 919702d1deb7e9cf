//! Argon2 password hashes: recognising one, making one, verifying against one. Below config
//! (which checks `password_hash` values at load) and auth (which verifies clients).

use std::sync::OnceLock;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};

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
pub(crate) fn verify(phc: &str, password: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// A hash no password matches in practice, verified for unknown users so they cost the same.
pub(crate) fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let pw: [u8; 16] = rand::random();
        hash_password(&format!("{pw:?}")).unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
