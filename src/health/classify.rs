//! The outcome of one exchange through an upstream, as recorded at lease release.

use std::fmt;

/// What happened to one request or tunnel. Only proxy faults and bans move an upstream's health;
/// `OriginError` is the target's fault and moves nothing.
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
    /// A 5xx from the origin.
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

/// First cut of response classification from the status line and headers alone (body sniffing
/// comes with the health engine).
pub fn classify_response(status: http::StatusCode, headers: &http::HeaderMap) -> Outcome {
    let challenge = headers
        .get("cf-mitigated")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"challenge"));
    match status.as_u16() {
        _ if challenge => Outcome::Captcha,
        407 => Outcome::UpstreamError,
        403 | 429 => Outcome::Blocked,
        // A proxy that failed says so with Proxy-Status (RFC 9209); an origin 5xx does not.
        500..=599 if headers.contains_key("proxy-status") => Outcome::UpstreamError,
        500..=599 => Outcome::OriginError,
        _ => Outcome::Ok,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, StatusCode};

    #[test]
    fn classifies_status_and_challenge_header() {
        let none = HeaderMap::new();
        assert_eq!(classify_response(StatusCode::OK, &none), Outcome::Ok);
        assert_eq!(
            classify_response(StatusCode::PROXY_AUTHENTICATION_REQUIRED, &none),
            Outcome::UpstreamError
        );
        assert_eq!(
            classify_response(StatusCode::TOO_MANY_REQUESTS, &none),
            Outcome::Blocked
        );
        assert_eq!(
            classify_response(StatusCode::BAD_GATEWAY, &none),
            Outcome::OriginError
        );
        let mut h = HeaderMap::new();
        h.insert(
            "proxy-status",
            HeaderValue::from_static("squid; error=connection_refused"),
        );
        assert_eq!(
            classify_response(StatusCode::BAD_GATEWAY, &h),
            Outcome::UpstreamError
        );
        let mut h = HeaderMap::new();
        h.insert("cf-mitigated", HeaderValue::from_static("challenge"));
        assert_eq!(
            classify_response(StatusCode::FORBIDDEN, &h),
            Outcome::Captcha
        );
    }
}
