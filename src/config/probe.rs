//! `[pools.<name>.probe]`: active checks through a pool's upstreams.

use std::time::Duration;

use super::file::{FileControlTable, FileControlTarget, FileProbe};
use super::validate::Validator;

/// Shortest spacing of probes of an idle upstream; each gap is drawn from
/// `[interval, interval × (1 + jitter)]`.
pub const DEFAULT_PROBE_INTERVAL_MS: u64 = 30_000;
pub const DEFAULT_PROBE_JITTER: f64 = 1.0;
/// Dead upstreams are probed this rarely.
pub const DEFAULT_PROBE_DEAD_INTERVAL_MS: u64 = 10 * 60_000;
pub const DEFAULT_PROBE_SUCCESSES: u32 = 2;
pub const DEFAULT_PROBE_CONCURRENCY: usize = 4;
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 10_000;

/// Active probing of one pool (`[pools.<name>.probe]`).
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeConfig {
    /// Where probes go; a probe passes when any of them answers as expected.
    pub targets: Vec<ControlTarget>,
    pub interval: Duration,
    /// Share of `interval` added at random to each gap, so probes do not fall into step.
    pub jitter: f64,
    pub dead_interval: Duration,
    /// Passing probes a quarantined (or dead) upstream needs to go half-open.
    pub successes: u32,
    /// Probes in flight at once, per pool.
    pub concurrency: usize,
    /// Bound on one probe: connect, request and the answer's head and checked body.
    pub timeout: Duration,
    /// A probe answered slower than this fails (the latency ceiling of admission too).
    pub max_latency: Option<Duration>,
    /// Where a passing probe also asks, through the same upstream, which IP address the world
    /// sees (`exit_ip_url`): members that share one are one identity to a target site.
    pub exit_ip: Option<ControlTarget>,
}

/// A URL the pool's upstreams must reach, and the answer expected from it.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlTarget {
    pub url: http::Uri,
    pub target: crate::target::Target,
    pub https: bool,
    pub expect_status: http::StatusCode,
    /// A string the first 64 KiB of the body must contain.
    pub expect_body: Option<String>,
}

impl Validator {
    pub(super) fn probe(&mut self, prefix: &str, p: FileProbe) -> ProbeConfig {
        let k = |name: &str| format!("{prefix}.{name}");
        let status = |v: &mut Self, key: &str, code: Option<u16>| match code {
            None => http::StatusCode::OK,
            Some(c) => http::StatusCode::from_u16(c)
                .ok()
                .filter(|s| !s.is_informational())
                .unwrap_or_else(|| {
                    v.problem(key, format!("{c} is not a final HTTP status"));
                    http::StatusCode::OK
                }),
        };
        let default_status = status(self, &k("expect_status"), p.expect_status);
        let mut targets = Vec::new();
        for (i, t) in p.targets.into_iter().flatten().enumerate() {
            let key = format!("{prefix}.targets[{i}]");
            let (url, code, body) = match t {
                FileControlTarget::Url(u) => (u, None, None),
                FileControlTarget::Table(FileControlTable {
                    url,
                    expect_status,
                    expect_body,
                }) => (url, expect_status, expect_body),
            };
            let expect_status = match code {
                Some(_) => status(self, &format!("{key}.expect_status"), code),
                None => default_status,
            };
            match parse_url(&url) {
                Some((url, target, https)) => targets.push(ControlTarget {
                    url,
                    target,
                    https,
                    expect_status,
                    expect_body: body.or_else(|| p.expect_body.clone()),
                }),
                None => self.problem(
                    &key,
                    format!("`{url}` is not an http:// or https:// URL with a host"),
                ),
            }
        }
        if targets.is_empty() {
            self.problem(
                &k("targets"),
                "name at least one control target URL (several, so one site's outage is not taken for the upstreams')",
            );
        }
        let interval = self.duration(
            &k("interval"),
            p.interval.as_deref(),
            DEFAULT_PROBE_INTERVAL_MS,
        );
        let dead_interval = self.duration(
            &k("dead_interval"),
            p.dead_interval.as_deref(),
            DEFAULT_PROBE_DEAD_INTERVAL_MS,
        );
        let timeout = self.duration(
            &k("timeout"),
            p.timeout.as_deref(),
            DEFAULT_PROBE_TIMEOUT_MS,
        );
        let max_latency = p
            .max_latency
            .as_deref()
            .map(|s| self.duration(&k("max_latency"), Some(s), DEFAULT_PROBE_TIMEOUT_MS));
        if max_latency.is_some_and(|m| m > timeout) {
            self.problem(&k("max_latency"), "must not exceed timeout");
        }
        let exit_ip = p.exit_ip_url.and_then(|url| match parse_url(&url) {
            Some((url, target, https)) => Some(ControlTarget {
                url,
                target,
                https,
                expect_status: http::StatusCode::OK,
                expect_body: None,
            }),
            None => {
                self.problem(
                    &k("exit_ip_url"),
                    format!("`{url}` is not an http:// or https:// URL with a host"),
                );
                None
            }
        });
        ProbeConfig {
            targets,
            exit_ip,
            interval,
            jitter: self.ratio(&k("jitter"), p.jitter, DEFAULT_PROBE_JITTER),
            dead_interval,
            successes: self.positive(&k("successes"), p.successes, DEFAULT_PROBE_SUCCESSES),
            concurrency: self.positive(&k("concurrency"), p.concurrency, DEFAULT_PROBE_CONCURRENCY),
            timeout,
            max_latency,
        }
    }
}

/// An `http://` or `https://` URL with a host: the URL, its target, and whether it is https.
fn parse_url(url: &str) -> Option<(http::Uri, crate::target::Target, bool)> {
    let uri = url.parse::<http::Uri>().ok()?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return None,
    };
    let target = crate::target::Target::from_uri(&uri, None).ok()?;
    Some((uri, target, https))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Config;
    use super::DEFAULT_PROBE_SUCCESSES;

    #[test]
    fn probe_section_is_validated_with_keys_named() {
        let ok = Config::parse(
            "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.probe]\ntargets = [\"http://a.example/ok\", { url = \"https://b.example/\", expect_status = 204 }]\nexpect_body = \"fine\"\ninterval = \"45s\"\nexit_ip_url = \"https://ip.example/json\"\n",
            "t",
            None,
        )
        .unwrap();
        let probe = ok.pools["default"].probe.clone().unwrap();
        assert_eq!(probe.targets.len(), 2);
        assert_eq!(probe.targets[0].expect_body.as_deref(), Some("fine"));
        assert_eq!(probe.targets[1].expect_status, http::StatusCode::NO_CONTENT);
        assert!(probe.targets[1].https);
        assert_eq!(probe.interval, Duration::from_secs(45));
        assert_eq!(probe.successes, DEFAULT_PROBE_SUCCESSES);
        let exit = probe.exit_ip.unwrap();
        assert!(exit.https);
        assert_eq!(exit.target.host, "ip.example");

        let bad = Config::parse(
            "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.probe]\ntargets = [\"ftp://x\"]\nexpect_status = 99\nsuccesses = 0\nmax_latency = \"1m\"\ntimeout = \"5s\"\nexit_ip_url = \"ip.example\"\n",
            "t",
            None,
        )
        .unwrap_err()
        .to_string();
        for key in [
            "pools.default.probe.targets[0]",
            "pools.default.probe.expect_status",
            "pools.default.probe.successes",
            "pools.default.probe.max_latency",
            "pools.default.probe.exit_ip_url",
        ] {
            assert!(bad.contains(key), "{key} not named in: {bad}");
        }
    }
}
