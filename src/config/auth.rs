//! `[auth]`: the client allowlist and the proxy's users.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use super::Rate;
use super::defaults::{
    DEFAULT_LOGIN_FAILURE_WINDOW_MS, DEFAULT_LOGIN_LOCKOUT_MS, DEFAULT_MAX_LOGIN_FAILURES,
    MAX_LOGIN_BACKOFF_MS, MAX_USER_NAME_LEN,
};
use super::file::FileAuth;
use super::validate::Validator;

/// Client authentication and the client allowlist.
#[derive(Clone, Debug, Default)]
pub struct AuthConfig {
    /// Clients allowed to use the proxy, by address; `None` allows every client.
    pub client_cidrs: Option<Vec<ipnet::IpNet>>,
    /// Users by name. When there is at least one, every proxy request must authenticate.
    pub users: BTreeMap<String, UserConfig>,
    /// How many failed logins one client address gets before its logins are refused for a while.
    pub login_backoff: LoginBackoff,
}

/// The per-client failure budget of logins (see `crate::auth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginBackoff {
    /// Failed logins within `window` that lock a client address out; 0 turns the back-off off.
    pub max_failures: u32,
    /// How long failures are counted from the first of them.
    pub window: Duration,
    /// How long a locked-out address is refused without a password check.
    pub lockout: Duration,
}

impl Default for LoginBackoff {
    fn default() -> Self {
        LoginBackoff {
            max_failures: DEFAULT_MAX_LOGIN_FAILURES,
            window: Duration::from_millis(DEFAULT_LOGIN_FAILURE_WINDOW_MS),
            lockout: Duration::from_millis(DEFAULT_LOGIN_LOCKOUT_MS),
        }
    }
}

impl AuthConfig {
    pub fn required(&self) -> bool {
        !self.users.is_empty()
    }

    pub fn client_allowed(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.client_cidrs
            .as_ref()
            .is_none_or(|nets| nets.iter().any(|n| n.contains(&ip)))
    }
}

/// One user of the proxy. `Debug` does not print the hash.
#[derive(Clone, PartialEq, Eq)]
pub struct UserConfig {
    /// PHC string (`$argon2id$...`) from `poolgate hash-password`.
    pub password_hash: String,
    /// Pools this user may use; `None` is every pool.
    pub pools: Option<Vec<String>>,
    /// Requests per second this user may send (each instance counts its own); `None` is no limit.
    pub rate_limit: Option<Rate>,
}

impl fmt::Debug for UserConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserConfig")
            .field("password_hash", &"<redacted>")
            .field("pools", &self.pools)
            .field("rate_limit", &self.rate_limit)
            .finish()
    }
}

impl Validator {
    pub(super) fn auth(&mut self, a: &FileAuth) -> AuthConfig {
        let client_cidrs = a.client_cidrs.as_ref().map(|list| {
            let mut nets = Vec::new();
            for (i, entry) in list.iter().enumerate() {
                let entry = entry.trim();
                match entry.parse::<ipnet::IpNet>() {
                    Ok(n) => nets.push(n),
                    Err(_) => match entry.parse::<IpAddr>() {
                        Ok(ip) => nets.push(ipnet::IpNet::from(ip.to_canonical())),
                        Err(_) => self.problem(
                            &format!("auth.client_cidrs[{i}]"),
                            format!("`{entry}` is not a network like \"10.0.0.0/8\" or an address"),
                        ),
                    },
                }
            }
            nets
        });
        let mut users = BTreeMap::new();
        for (name, u) in &a.users {
            let key = format!("auth.users.{name}");
            if name.is_empty()
                || name.len() > MAX_USER_NAME_LEN
                || name.contains(':')
                || name.bytes().any(|b| b <= b' ' || b == 0x7f)
            {
                self.problem(
                    &key,
                    format!(
                        "user names are 1 to {MAX_USER_NAME_LEN} visible characters without ':'"
                    ),
                );
            }
            // A name with a username token in it can never log in: a login's account ends
            // before its first token (`acct-country-us` logs in as `acct`).
            if !name.is_empty()
                && !crate::session::parse_username(name).is_ok_and(|l| l.account == *name)
            {
                self.problem(
                    &key,
                    "the name holds a proxy-username token (`-session-`, `-pool-`, `-country-`, `-type-`, ...), \
                     so no login can name it: a login's account ends before its first token",
                );
            }
            let password_hash = match &u.password_hash {
                None => {
                    self.problem(
                        &format!("{key}.password_hash"),
                        "required: make one with `poolgate hash-password`",
                    );
                    String::new()
                }
                // Never echo the value: a plain password pasted here by mistake stays private.
                Some(h) if crate::password::check_hash(h).is_err() => {
                    self.problem(
                        &format!("{key}.password_hash"),
                        "not an argon2 hash (expected `$argon2id$...`, from `poolgate hash-password`)",
                    );
                    String::new()
                }
                Some(h) => h.clone(),
            };
            if u.pools.as_ref().is_some_and(Vec::is_empty) {
                self.problem(
                    &format!("{key}.pools"),
                    "must name at least one pool (omit it for every pool)",
                );
            }
            let burst = self.burst(&format!("{key}.rate_limit_burst"), u.rate_limit_burst);
            let rate_limit = u
                .rate_limit
                .and_then(|r| self.rate(&format!("{key}.rate_limit"), r, burst));
            if u.rate_limit.is_none() && u.rate_limit_burst.is_some() {
                self.problem(
                    &format!("{key}.rate_limit_burst"),
                    "needs rate_limit (requests per second)",
                );
            }
            users.insert(
                name.clone(),
                UserConfig {
                    password_hash,
                    pools: u.pools.clone(),
                    rate_limit,
                },
            );
        }
        let login_backoff = LoginBackoff {
            max_failures: a.max_login_failures.unwrap_or(DEFAULT_MAX_LOGIN_FAILURES),
            window: self.duration(
                "auth.login_failure_window",
                a.login_failure_window.as_deref(),
                DEFAULT_LOGIN_FAILURE_WINDOW_MS,
            ),
            lockout: self.duration(
                "auth.login_lockout",
                a.login_lockout.as_deref(),
                DEFAULT_LOGIN_LOCKOUT_MS,
            ),
        };
        for (key, d) in [
            ("auth.login_failure_window", login_backoff.window),
            ("auth.login_lockout", login_backoff.lockout),
        ] {
            if d > Duration::from_millis(MAX_LOGIN_BACKOFF_MS) {
                self.problem(key, "must be at most 24h");
            }
        }
        AuthConfig {
            client_cidrs,
            users,
            login_backoff,
        }
    }
}
