//! What happened to one exchange: the word every part of the gateway uses for an outcome (the
//! store counts it, health judges it, metrics and logs show it). It lives at the bottom so that
//! none of them needs another to name it.

use std::fmt;

/// What happened to one request or tunnel. Only proxy faults and bans move an upstream's health;
/// `OriginError` is taken for the target's fault and moves nothing, unless health finds that the
/// rest of the pool does not meet it on the same target (then it is the upstream's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    ConnectError,
    Timeout,
    Reset,
    /// A 5xx or 407 produced by the upstream proxy itself (including a refused CONNECT).
    UpstreamError,
    Captcha,
    /// 403/429-class answer without a challenge marker.
    Blocked,
    /// A 5xx with no sign of the proxy's authorship: taken for the origin's.
    OriginError,
    /// The client went away before the exchange ended: nobody's fault, moves no health.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Ok,
        Outcome::ConnectError,
        Outcome::Timeout,
        Outcome::Reset,
        Outcome::UpstreamError,
        Outcome::Captcha,
        Outcome::Blocked,
        Outcome::OriginError,
        Outcome::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ConnectError => "connect-error",
            Outcome::Timeout => "timeout",
            Outcome::Reset => "reset",
            Outcome::UpstreamError => "upstream-error",
            Outcome::Captcha => "captcha",
            Outcome::Blocked => "blocked",
            Outcome::OriginError => "origin-error",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// The snake_case name used as a field in `/status` and as a metrics label.
    pub fn key(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ConnectError => "connect_error",
            Outcome::Timeout => "timeout",
            Outcome::Reset => "reset",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Captcha => "captcha",
            Outcome::Blocked => "blocked",
            Outcome::OriginError => "origin_error",
            Outcome::Cancelled => "cancelled",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// The class operators read in the access log and the history: `ok`, `proxy-fault`
    /// (connect error, timeout, reset, the upstream proxy's own error), `origin-ban`, `captcha`,
    /// `origin-error`, `cancelled`.
    pub fn class(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ConnectError | Outcome::Timeout | Outcome::Reset | Outcome::UpstreamError => {
                "proxy-fault"
            }
            Outcome::Blocked => "origin-ban",
            Outcome::Captcha => "captcha",
            Outcome::OriginError => "origin-error",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// Every class of [`Outcome::class`], in a fixed order.
    pub const CLASSES: [&'static str; 6] = [
        "ok",
        "proxy-fault",
        "origin-ban",
        "captcha",
        "origin-error",
        "cancelled",
    ];

    /// Whether the outcome counts as a success of the upstream.
    pub fn is_success(self) -> bool {
        matches!(self, Outcome::Ok | Outcome::OriginError)
    }

    /// Whether the outcome says anything about the upstream at all.
    pub fn is_judgement(self) -> bool {
        self != Outcome::Cancelled
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
