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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::upstream::Scheme;

    use super::super::Config;
    use super::super::tests::problems;

    #[test]
    fn sources_are_validated_with_keys_named() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[pools.default]\nupstreams_file = \"ups.txt\"\n";
        let err = Config::parse(text, "t", Some(dir.path())).unwrap_err();
        assert!(
            err.problems[0].starts_with("pools.default.upstreams_file")
                && err.problems[0].contains("cannot read"),
            "{:?}",
            err.problems
        );
        // Lines are the sources task's business: a bad one does not refuse the config.
        std::fs::write(
            dir.path().join("ups.txt"),
            "# c\nbogus\nhttp://127.0.0.1:3128#a\n",
        )
        .unwrap();
        let c = Config::parse(text, "t", Some(dir.path())).unwrap();
        let pool = c.pool("default").unwrap();
        assert!(pool.upstreams.is_empty());
        assert_eq!(
            pool.sources.file.as_deref(),
            Some(dir.path().join("ups.txt").as_path())
        );
        assert_eq!(pool.sources.admission.schemes.len(), 4);

        let p = problems(
            "[pools.default]\nupstreams_url = \"ftp://lists.example/p.txt\"\nupstreams_url_interval = \"1s\"\n[pools.default.admission]\nschemes = [\"direct\", \"gopher\"]\nmax_latency = \"soon\"\nconcurrency = 0\n",
        );
        for key in [
            "pools.default.upstreams_url:",
            "pools.default.upstreams_url_interval:",
            "pools.default.admission.schemes[0]:",
            "pools.default.admission.schemes[1]:",
            "pools.default.admission.max_latency:",
            "pools.default.admission.concurrency:",
        ] {
            assert!(p.iter().any(|m| m.starts_with(key)), "{key} in {p:?}");
        }
        let p = problems("[pools.default]\nupstreams_url = \"https://lists.example/p.txt\"\n");
        assert!(
            p.iter()
                .any(|m| m.starts_with("pools.default.upstreams_url:") && m.contains("probe")),
            "{p:?}"
        );
        let ok = Config::parse(
            "[pools.default]\nupstreams_url = \"https://lists.example/p.txt\"\n[pools.default.probe]\ntargets = [\"http://a.example/\"]\n[pools.default.admission]\nschemes = [\"socks5\"]\nmax_latency = \"2s\"\n",
            "t",
            None,
        )
        .unwrap();
        let s = &ok.pools["default"].sources;
        assert_eq!(s.url_interval, Duration::from_secs(600));
        assert_eq!(s.admission.schemes, vec![Scheme::Socks5]);
        assert_eq!(s.admission.max_latency, Some(Duration::from_secs(2)));
    }
}
