//! `[store]`: where shared state lives (embedded, or Redis for several instances).

use std::fmt;
use std::path::Path;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
        /// What a `rediss://` connection trusts and presents; read and checked at load.
        tls: StoreTls,
    },
}

/// `store.tls_*`: the PEM files a `rediss://` store connection uses, read once at load so a
/// missing or malformed file stops the start, not the first reconnection.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StoreTls {
    /// `store.tls_ca_file`: the only roots trusted for the Redis server's certificate (the
    /// system's are not consulted when it is set).
    pub ca_pem: Option<Vec<u8>>,
    /// `store.tls_cert_file` and `store.tls_key_file`: a client certificate for servers started
    /// with `tls-auth-clients yes`.
    pub client_cert_pem: Option<Vec<u8>>,
    pub client_key_pem: Option<Vec<u8>>,
}

/// Debug output shows which files are set, never the key.
impl fmt::Debug for StoreTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_cert", &self.client_cert_pem.is_some())
            .finish()
    }
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
                tls,
            } => f
                .debug_struct("Redis")
                .field("url", &crate::store_url::redact(url))
                .field("timeout", timeout)
                .field("key_prefix", key_prefix)
                .field("tls", tls)
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
                ("store.tls_ca_file", s.tls_ca_file.is_some()),
                ("store.tls_cert_file", s.tls_cert_file.is_some()),
                ("store.tls_key_file", s.tls_key_file.is_some()),
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
                let tls = self.store_tls(s, url);
                StoreConfig::Redis {
                    url: url.clone(),
                    timeout,
                    key_prefix,
                    tls,
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

impl Validator {
    /// Reads `store.tls_*`, each file checked for what it must hold.
    fn store_tls(&mut self, s: &FileStore, url: &str) -> StoreTls {
        let any = s.tls_ca_file.is_some() || s.tls_cert_file.is_some() || s.tls_key_file.is_some();
        if any && !(url.starts_with("rediss://") || url.starts_with("rediss+cluster://")) {
            for (key, set) in [
                ("store.tls_ca_file", s.tls_ca_file.is_some()),
                ("store.tls_cert_file", s.tls_cert_file.is_some()),
                ("store.tls_key_file", s.tls_key_file.is_some()),
            ] {
                if set {
                    self.problem(
                        key,
                        "only used with a rediss:// or rediss+cluster:// store.url",
                    );
                }
            }
            return StoreTls::default();
        }
        if s.tls_cert_file.is_some() != s.tls_key_file.is_some() {
            self.problem(
                "store.tls_cert_file",
                "store.tls_cert_file and store.tls_key_file are set together",
            );
        }
        let has_certs = |pem: &[u8]| {
            let certs = CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>();
            matches!(certs, Ok(c) if !c.is_empty())
        };
        let ca_pem = s.tls_ca_file.as_deref().and_then(|p| {
            self.pem_file(
                "store.tls_ca_file",
                p,
                has_certs,
                "no PEM certificate in it",
            )
        });
        let client_cert_pem = s.tls_cert_file.as_deref().and_then(|p| {
            self.pem_file(
                "store.tls_cert_file",
                p,
                has_certs,
                "no PEM certificate in it",
            )
        });
        let client_key_pem = s.tls_key_file.as_deref().and_then(|p| {
            self.pem_file(
                "store.tls_key_file",
                p,
                |pem| PrivateKeyDer::from_pem_slice(pem).is_ok(),
                "no PEM private key in it",
            )
        });
        StoreTls {
            ca_pem,
            client_cert_pem,
            client_key_pem,
        }
    }

    /// The file's bytes if it can be read and `valid` accepts them; else a problem for `key`.
    fn pem_file(
        &mut self,
        key: &str,
        path: &Path,
        valid: impl Fn(&[u8]) -> bool,
        invalid: &str,
    ) -> Option<Vec<u8>> {
        let path = self.path(path);
        match std::fs::read(&path) {
            Ok(pem) if valid(&pem) => Some(pem),
            Ok(_) => {
                self.problem(key, format!("{}: {invalid}", path.display()));
                None
            }
            Err(e) => {
                self.problem(key, format!("cannot read {}: {e}", path.display()));
                None
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

    #[test]
    fn store_tls_files_are_checked_at_load_each_naming_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let junk = junk.display();
        let p = problems(&format!(
            "[store]\nkind = \"redis\"\nurl = \"rediss://:hunter2@h:1\"\n\
             tls_ca_file = \"{junk}\"\ntls_cert_file = \"/nonexistent/c.pem\"\n"
        ))
        .join("\n");
        assert!(
            p.contains("store.tls_ca_file") && p.contains("no PEM certificate"),
            "{p}"
        );
        assert!(
            p.contains("store.tls_cert_file") && p.contains("cannot read"),
            "{p}"
        );
        assert!(p.contains("set together"), "{p}");
        assert!(!p.contains("hunter2"), "{p}");
        let p = problems(&format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://h:1\"\ntls_ca_file = \"{junk}\"\n"
        ))
        .join("\n");
        assert!(
            p.contains("store.tls_ca_file: only used with a rediss://"),
            "{p}"
        );
    }
}
