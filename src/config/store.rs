//! `[store]`: where shared state lives (embedded, or Redis for several instances).

use std::fmt;
use std::time::Duration;

use super::file::FileStore;
use super::validate::Validator;

#[derive(Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// Embedded, single instance.
    Memory,
    /// Shared by many instances.
    Redis {
        /// May hold a password: shown only through `store_url::redact`.
        url: String,
        /// Bound on each Redis call; past it the instance serves from its local view.
        timeout: Duration,
        /// First segment of every key.
        key_prefix: String,
    },
}

/// Debug output never shows the store URL's password.
impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreConfig::Memory => f.write_str("Memory"),
            StoreConfig::Redis {
                url,
                timeout,
                key_prefix,
            } => f
                .debug_struct("Redis")
                .field("url", &crate::store_url::redact(url))
                .field("timeout", timeout)
                .field("key_prefix", key_prefix)
                .finish(),
        }
    }
}

impl StoreConfig {
    pub fn kind(&self) -> &'static str {
        match self {
            StoreConfig::Memory => "memory",
            StoreConfig::Redis { .. } => "redis",
        }
    }
}

impl Validator {
    pub(super) fn store(&mut self, s: &FileStore) -> StoreConfig {
        let kind = s.kind.as_deref().unwrap_or("memory");
        if kind != "redis" {
            for (key, set) in [
                ("store.url", s.url.is_some()),
                ("store.timeout", s.timeout.is_some()),
                ("store.key_prefix", s.key_prefix.is_some()),
            ] {
                if set {
                    self.problem(key, "only used with store.kind = \"redis\"");
                }
            }
        }
        match (kind, &s.url) {
            ("memory", _) => StoreConfig::Memory,
            ("redis", Some(url)) => {
                if let Err(e) = crate::store_url::parse_target(url) {
                    self.problem("store.url", e);
                }
                let timeout = self.duration(
                    "store.timeout",
                    s.timeout.as_deref(),
                    crate::store_url::DEFAULT_TIMEOUT_MS,
                );
                let key_prefix = s
                    .key_prefix
                    .clone()
                    .unwrap_or_else(|| crate::store_url::DEFAULT_KEY_PREFIX.to_string());
                if key_prefix.is_empty()
                    || key_prefix.len() > 64
                    || !key_prefix
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
                {
                    self.problem("store.key_prefix", "1-64 characters of A-Z a-z 0-9 - _ . :");
                }
                StoreConfig::Redis {
                    url: url.clone(),
                    timeout,
                    key_prefix,
                }
            }
            ("redis", None) => {
                self.problem("store.url", "required when store.kind = \"redis\"");
                StoreConfig::Memory
            }
            (other, _) => {
                self.problem(
                    "store.kind",
                    format!("`{other}` is not a store kind (use \"memory\" or \"redis\")"),
                );
                StoreConfig::Memory
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Config;
    use super::super::tests::problems;
    use super::StoreConfig;

    #[test]
    fn redis_store_keys_are_read_and_the_password_never_shown() {
        let c = Config::parse(
            "[store]\nkind = \"redis\"\nurl = \"redis+cluster://:hunter2@127.0.0.1:7000,127.0.0.1:7001\"\n\
             timeout = \"100ms\"\nkey_prefix = \"pg-eu\"\n\
             [pools.default]\nupstreams = [\"direct://\"]\n",
            "test.toml",
            None,
        )
        .unwrap();
        match &c.store {
            StoreConfig::Redis {
                timeout,
                key_prefix,
                ..
            } => {
                assert_eq!(*timeout, Duration::from_millis(100));
                assert_eq!(key_prefix, "pg-eu");
            }
            other => panic!("{other:?}"),
        }
        assert!(!format!("{:?}", c.store).contains("hunter2"));
        let p = problems(
            "[store]\nkind = \"redis\"\nurl = \"http://:hunter2@h\"\nkey_prefix = \"a{b}\"\n",
        )
        .join("\n");
        assert!(
            p.contains("store.url") && p.contains("store.key_prefix"),
            "{p}"
        );
        assert!(!p.contains("hunter2"), "{p}");
        let p = problems("[store]\ntimeout = \"1s\"\n").join("\n");
        assert!(p.contains("store.timeout"), "{p}");
    }
}
