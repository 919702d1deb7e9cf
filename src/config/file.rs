//! The file as written: serde structs that reject unknown keys. Values stay raw (strings for
//! durations, addresses and URLs) so the validator can name the key of each bad one.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    #[serde(default)]
    pub(super) server: FileServer,
    #[serde(default)]
    pub(super) store: FileStore,
    #[serde(default)]
    pub(super) policy: FilePolicy,
    #[serde(default)]
    pub(super) upstream_tls: FileUpstreamTls,
    #[serde(default)]
    pub(super) captcha: FileCaptcha,
    pub(super) intercept: Option<FileIntercept>,
    #[serde(default)]
    pub(super) auth: FileAuth,
    #[serde(default)]
    pub(super) pools: BTreeMap<String, FilePool>,
    #[serde(default)]
    pub(super) log: FileLog,
    #[serde(default)]
    pub(super) metrics: FileMetrics,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileLog {
    pub(super) access: Option<String>,
    pub(super) access_format: Option<String>,
    pub(super) access_buffer_lines: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileMetrics {
    pub(super) per_upstream_max: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileIntercept {
    pub(super) ca_cert: Option<PathBuf>,
    pub(super) ca_key: Option<PathBuf>,
    pub(super) cert_cache_size: Option<usize>,
    pub(super) origin_ca_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileCaptcha {
    pub(super) sniff_bytes: Option<usize>,
    pub(super) markers: Option<Vec<String>>,
    pub(super) extra_markers: Option<Vec<String>>,
    pub(super) challenge_headers: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileHealth {
    pub(super) window: Option<usize>,
    pub(super) min_samples: Option<usize>,
    pub(super) degrade_after_failures: Option<u32>,
    pub(super) quarantine_after_failures: Option<u32>,
    pub(super) degrade_below_success: Option<f64>,
    pub(super) quarantine_below_success: Option<f64>,
    pub(super) ban_quarantine_ratio: Option<f64>,
    pub(super) ban_min_samples: Option<usize>,
    pub(super) recover_after_successes: Option<u32>,
    pub(super) half_open_successes: Option<u32>,
    pub(super) cooldown_base: Option<String>,
    pub(super) cooldown_max: Option<String>,
    pub(super) cooldown_jitter: Option<f64>,
    pub(super) cooldown_reset_after: Option<String>,
    pub(super) dead_after_cycles: Option<u32>,
    pub(super) max_quarantined_percent: Option<u32>,
    pub(super) min_in_service: Option<usize>,
    pub(super) target_incident_ratio: Option<f64>,
    pub(super) target_incident_min_upstreams: Option<usize>,
    pub(super) incident_window: Option<String>,
    pub(super) global_incident_ratio: Option<f64>,
    pub(super) max_targets: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileServer {
    pub(super) listen: Option<String>,
    pub(super) socks_listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) admin_token: Option<String>,
    pub(super) admin_read_token: Option<String>,
    pub(super) default_pool: Option<String>,
    pub(super) header_read_timeout: Option<String>,
    pub(super) max_header_bytes: Option<usize>,
    pub(super) max_connections: Option<u32>,
    pub(super) shutdown_grace: Option<String>,
    pub(super) connect_timeout: Option<String>,
    pub(super) response_timeout: Option<String>,
    pub(super) upstream_idle_timeout: Option<String>,
    pub(super) upstream_max_idle_per_key: Option<usize>,
    pub(super) max_connections_per_client: Option<u32>,
    pub(super) idle_timeout: Option<String>,
    pub(super) tunnel_idle_timeout: Option<String>,
    pub(super) max_request_body_bytes: Option<u64>,
    pub(super) workers: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileStore {
    pub(super) kind: Option<String>,
    pub(super) url: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) key_prefix: Option<String>,
    pub(super) tls_ca_file: Option<PathBuf>,
    pub(super) tls_cert_file: Option<PathBuf>,
    pub(super) tls_key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FilePolicy {
    pub(super) connect_ports: Option<Vec<u16>>,
    pub(super) http_ports: Option<Vec<FilePorts>>,
    pub(super) allow_private_targets: Option<bool>,
    pub(super) allow_targets: Option<Vec<String>>,
}

/// One entry of a port list as written: a port (`443`) or a range (`"1025-65535"`), checked by the
/// validator so that a bad one is named by its key.
#[derive(Debug)]
pub(super) enum FilePorts {
    Number(i64),
    Text(String),
}

/// By hand rather than `#[serde(untagged)]`, which would report a wrong type as "did not match
/// any variant" without saying what is expected.
impl<'de> Deserialize<'de> for FilePorts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = FilePorts;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port (443) or a range of ports (\"1025-65535\")")
            }

            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(FilePorts::Number(n))
            }

            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(FilePorts::Number(i64::try_from(n).unwrap_or(i64::MAX)))
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(FilePorts::Text(s.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAuth {
    pub(super) client_cidrs: Option<Vec<String>>,
    pub(super) max_login_failures: Option<u32>,
    pub(super) login_failure_window: Option<String>,
    pub(super) login_lockout: Option<String>,
    #[serde(default)]
    pub(super) users: BTreeMap<String, FileUser>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUser {
    pub(super) password_hash: Option<String>,
    pub(super) pools: Option<Vec<String>>,
    pub(super) rate_limit: Option<f64>,
    pub(super) rate_limit_burst: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUpstreamTls {
    pub(super) ca_file: Option<PathBuf>,
    pub(super) system_roots: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FilePool {
    pub(super) upstreams: Option<Vec<FileUpstream>>,
    pub(super) upstreams_file: Option<PathBuf>,
    pub(super) upstreams_url: Option<String>,
    pub(super) upstreams_url_interval: Option<String>,
    pub(super) admission: Option<FileAdmission>,
    pub(super) strategy: Option<String>,
    pub(super) max_concurrency: Option<u32>,
    pub(super) shards: Option<u32>,
    pub(super) queue_timeout: Option<String>,
    pub(super) session_ttl: Option<String>,
    pub(super) lease_ttl: Option<String>,
    pub(super) retries: Option<u32>,
    pub(super) rebind_on_failure: Option<bool>,
    pub(super) inspect_tls: Option<bool>,
    pub(super) inspect_exclude: Option<Vec<String>>,
    pub(super) metric_labels: Option<Vec<String>>,
    #[serde(default)]
    pub(super) health: FileHealth,
    pub(super) probe: Option<FileProbe>,
    pub(super) rate_limit: Option<FileRateLimit>,
}

/// One entry of a pool's `upstreams`: a URL, or a table that names and labels it.
#[derive(Debug)]
pub(super) enum FileUpstream {
    Url(String),
    Table(FileUpstreamTable),
}

/// `{ url = "http://10.0.0.2:3128", name = "de1", labels = { country = "de" } }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileUpstreamTable {
    pub(super) url: String,
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
}

/// By hand, as [`FilePorts`]: a wrong type is reported with what is expected.
impl<'de> Deserialize<'de> for FileUpstream {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileUpstream;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an upstream URL, or a table { url = \"…\", name = \"…\", labels = { key = \"value\" } }",
                )
            }

            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(FileUpstream::Url(s.to_string()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                FileUpstreamTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FileUpstream::Table)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// `[pools.<name>.admission]`: what a candidate from an upstream list must be to join.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAdmission {
    pub(super) schemes: Option<Vec<String>>,
    pub(super) max_latency: Option<String>,
    pub(super) concurrency: Option<usize>,
}

/// `[pools.<name>.probe]`: active checks through the pool's upstreams.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileProbe {
    pub(super) targets: Option<Vec<FileControlTarget>>,
    pub(super) expect_status: Option<u16>,
    pub(super) expect_body: Option<String>,
    pub(super) interval: Option<String>,
    pub(super) jitter: Option<f64>,
    pub(super) dead_interval: Option<String>,
    pub(super) successes: Option<u32>,
    pub(super) concurrency: Option<usize>,
    pub(super) timeout: Option<String>,
    pub(super) max_latency: Option<String>,
    pub(super) exit_ip_url: Option<String>,
}

/// A control target: a URL, or a table that overrides the expected answer for it.
#[derive(Debug)]
pub(super) enum FileControlTarget {
    Url(String),
    Table(FileControlTable),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileControlTable {
    pub(super) url: String,
    pub(super) expect_status: Option<u16>,
    pub(super) expect_body: Option<String>,
}

/// By hand rather than `#[serde(untagged)]`: an untagged enum reports any mistake inside the
/// table as "did not match any variant", without the key or the reason.
impl<'de> Deserialize<'de> for FileControlTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = FileControlTarget;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a URL or a table with url, expect_status and expect_body")
            }

            fn visit_str<E: serde::de::Error>(self, url: &str) -> Result<Self::Value, E> {
                Ok(FileControlTarget::Url(url.to_string()))
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<Self::Value, A::Error> {
                FileControlTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(FileControlTarget::Table)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileRateLimit {
    pub(super) per_upstream: Option<f64>,
    pub(super) per_upstream_target: Option<f64>,
    pub(super) burst: Option<u32>,
}
