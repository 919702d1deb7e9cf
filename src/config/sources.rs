//! A pool's upstream lists (`upstreams_file`, `upstreams_url`) and their admission.

use std::path::PathBuf;
use std::time::Duration;

use crate::upstream::Scheme;

use super::defaults::{
    DEFAULT_ADMISSION_CONCURRENCY, DEFAULT_UPSTREAMS_URL_INTERVAL_MS, MAX_ADMISSION_CONCURRENCY,
    MIN_UPSTREAMS_URL_INTERVAL_MS,
};
use super::file::FilePool;
use super::validate::Validator;

/// Upstream lists that change while the gateway runs (see [`crate::sources`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourcesConfig {
    /// One upstream URL a line, re-read when it changes.
    pub file: Option<PathBuf>,
    /// A list fetched every `url_interval` (`http://` or `https://`).
    pub url: Option<http::Uri>,
    pub url_interval: Duration,
    pub admission: AdmissionConfig,
}

impl SourcesConfig {
    pub fn is_empty(&self) -> bool {
        self.file.is_none() && self.url.is_none()
    }
}

/// What a candidate from an upstream list must be to join the pool, besides passing the
/// pool's probe (its expected answer) when the pool probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AdmissionConfig {
    /// Schemes a listed upstream may have; `direct://` is never taken from a list.
    pub schemes: Vec<Scheme>,
    /// A candidate whose probe answered slower than this is refused.
    pub max_latency: Option<Duration>,
    /// Admission probes in flight at once.
    pub concurrency: usize,
}

impl Validator {
    /// `upstreams_file`, `upstreams_url` and `[pools.<name>.admission]`. The file must be readable
    /// now (a wrong path is a typo to report at once); its lines are read by the sources task,
    /// which skips a malformed one with a warning rather than refusing the whole list.
    pub(super) fn sources(&mut self, name: &str, p: &FilePool) -> SourcesConfig {
        let key = |k: &str| format!("pools.{name}.{k}");
        let file = p.upstreams_file.as_deref().map(|f| self.path(f));
        if let Some(path) = &file {
            if let Err(e) = std::fs::read_to_string(path) {
                self.problem(
                    &key("upstreams_file"),
                    format!("cannot read {}: {e}", path.display()),
                );
            }
        }
        let url = p
            .upstreams_url
            .as_deref()
            .and_then(|u| match u.parse::<http::Uri>() {
                Ok(uri)
                    if matches!(uri.scheme_str(), Some("http" | "https"))
                        && uri.host().is_some() =>
                {
                    Some(uri)
                }
                _ => {
                    self.problem(
                        &key("upstreams_url"),
                        "must be an http:// or https:// URL with a host",
                    );
                    None
                }
            });
        let url_interval = self.duration(
            &key("upstreams_url_interval"),
            p.upstreams_url_interval.as_deref(),
            DEFAULT_UPSTREAMS_URL_INTERVAL_MS,
        );
        if url_interval < Duration::from_millis(MIN_UPSTREAMS_URL_INTERVAL_MS) {
            self.problem(&key("upstreams_url_interval"), "must be at least 10s");
        }
        if p.upstreams_url_interval.is_some() && p.upstreams_url.is_none() {
            self.problem(&key("upstreams_url_interval"), "set upstreams_url too");
        }
        let a = p.admission.as_ref();
        let mut schemes = Vec::new();
        match a.and_then(|a| a.schemes.as_ref()) {
            None => schemes.extend([Scheme::Http, Scheme::Https, Scheme::Socks5, Scheme::Socks5h]),
            Some(list) => {
                for (i, s) in list.iter().enumerate() {
                    let k = format!("pools.{name}.admission.schemes[{i}]");
                    match s.as_str() {
                        "http" => schemes.push(Scheme::Http),
                        "https" => schemes.push(Scheme::Https),
                        "socks5" => schemes.push(Scheme::Socks5),
                        "socks5h" => schemes.push(Scheme::Socks5h),
                        "direct" => self.problem(
                            &k,
                            "direct egress is never taken from a list; put direct:// in upstreams",
                        ),
                        other => self.problem(
                            &k,
                            format!(
                                "`{other}` is not a proxy scheme (http, https, socks5, socks5h)"
                            ),
                        ),
                    }
                }
                if list.is_empty() {
                    self.problem(
                        &format!("pools.{name}.admission.schemes"),
                        "name at least one scheme",
                    );
                }
            }
        }
        let max_latency = a
            .and_then(|a| a.max_latency.as_deref())
            .map(|v| self.duration(&format!("pools.{name}.admission.max_latency"), Some(v), 0));
        let concurrency = a
            .and_then(|a| a.concurrency)
            .unwrap_or(DEFAULT_ADMISSION_CONCURRENCY);
        if !(1..=MAX_ADMISSION_CONCURRENCY).contains(&concurrency) {
            self.problem(
                &format!("pools.{name}.admission.concurrency"),
                format!("must be 1 to {MAX_ADMISSION_CONCURRENCY}"),
            );
        }
        SourcesConfig {
            file,
            url,
            url_interval,
            admission: AdmissionConfig {
                schemes,
                max_latency,
                concurrency,
            },
        }
    }
}
