//! The proxy username grammar (`<account>[-<label>-<value>]…`) and a login as every front door
//! reads it (`session::from_credentials`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::session::{self, MAX_LIFETIME_MINUTES, MAX_POOL_NAME_LEN, SessionError, SessionKey};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `user:password`, as a Basic credential carries it.
    let (username, password) = text.split_once(':').unwrap_or((text, ""));
    if let Ok(labels) = session::parse_username(username) {
        assert!(username.starts_with(&labels.account));
        if let Some(key) = &labels.session {
            assert_eq!(SessionKey::new(key.as_str()).as_ref(), Ok(key));
        }
        if let Some(ttl) = labels.ttl {
            assert!(!ttl.is_zero() && ttl.as_secs() <= MAX_LIFETIME_MINUTES * 60);
        }
        if let Some(pool) = &labels.pool {
            assert!(!pool.is_empty() && pool.len() <= MAX_POOL_NAME_LEN);
        }
    }
    match session::from_credentials(username, password.to_string()) {
        Ok(req) => {
            assert_eq!(req.password.as_deref(), Some(password));
        }
        Err(e) => {
            // The only errors that echo the username's text are these two; with the password
            // inside the username they must not echo it. (The other errors carry fixed text
            // only, which may well contain a short password by chance.)
            if !password.is_empty() && username.contains(password) {
                if let SessionError::InvalidValue { value, .. }
                | SessionError::DanglingLabel { label: value } = &e
                {
                    assert_eq!(value, "<redacted>", "a username error echoed the password");
                }
            }
        }
    }
});
