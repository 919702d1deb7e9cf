//! Request rates: `[pools.<name>.rate_limit]` and the users' `rate_limit`.

use std::num::NonZeroU32;
use std::time::Duration;

use super::defaults::{DEFAULT_RATE_LIMIT_BURST, MAX_RATE_LIMIT_BURST, MAX_RATE_LIMIT_PER_S};
use super::file::FileRateLimit;
use super::validate::Validator;

/// A request rate: one request per `interval`, with up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Time between two requests once the burst is spent (1 / requests per second).
    pub interval: Duration,
    /// Requests that may go at once after a quiet spell.
    pub burst: NonZeroU32,
}

impl Rate {
    pub fn per_second(&self) -> f64 {
        1.0 / self.interval.as_secs_f64()
    }
}

/// A pool's rate limits (see [`crate::ratelimit`]); each `None` is no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Requests through each upstream, whatever the target.
    pub per_upstream: Option<Rate>,
    /// Requests through each upstream to one target host: politeness towards the site.
    pub per_upstream_target: Option<Rate>,
}

impl RateLimitConfig {
    pub fn is_limited(&self) -> bool {
        self.per_upstream.is_some() || self.per_upstream_target.is_some()
    }
}

impl Validator {
    /// `[pools.<name>.rate_limit]`: at least one limit; `burst` applies to both.
    pub(super) fn rate_limit(&mut self, prefix: &str, r: FileRateLimit) -> RateLimitConfig {
        let k = |s: &str| format!("{prefix}.{s}");
        if r.per_upstream.is_none() && r.per_upstream_target.is_none() {
            self.problem(
                prefix,
                "set per_upstream and/or per_upstream_target (requests per second), or remove the table",
            );
        }
        let burst = self.burst(&k("burst"), r.burst);
        RateLimitConfig {
            per_upstream: r
                .per_upstream
                .and_then(|v| self.rate(&k("per_upstream"), v, burst)),
            per_upstream_target: r
                .per_upstream_target
                .and_then(|v| self.rate(&k("per_upstream_target"), v, burst)),
        }
    }

    /// A burst size: `None` (after reporting it) when out of range.
    pub(super) fn burst(&mut self, key: &str, burst: Option<u32>) -> Option<NonZeroU32> {
        match burst {
            None => NonZeroU32::new(DEFAULT_RATE_LIMIT_BURST),
            Some(b) if b > MAX_RATE_LIMIT_BURST => {
                self.problem(key, format!("must be at most {MAX_RATE_LIMIT_BURST}"));
                None
            }
            Some(b) => {
                let b = NonZeroU32::new(b);
                if b.is_none() {
                    self.problem(key, "must be at least 1");
                }
                b
            }
        }
    }

    /// A rate in requests per second (fractions allowed: 0.2 is one request every 5 s).
    pub(super) fn rate(
        &mut self,
        key: &str,
        per_second: f64,
        burst: Option<NonZeroU32>,
    ) -> Option<Rate> {
        if !(per_second.is_finite() && per_second > 0.0) {
            self.problem(key, "must be > 0 (requests per second)");
            return None;
        }
        if per_second > MAX_RATE_LIMIT_PER_S {
            self.problem(key, format!("must be at most {MAX_RATE_LIMIT_PER_S}"));
            return None;
        }
        Some(Rate {
            interval: Duration::from_secs_f64(1.0 / per_second),
            burst: burst?,
        })
    }
}
