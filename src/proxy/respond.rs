//! Errors become responses here, and only here: one function per front door keyed on the error's
//! variant (never its message). For HTTP: the status, `X-Pool-Error`, an RFC 9209 `Proxy-Status`
//! and a one-line body. For SOCKS5: [`socks_reply`], the reply code of the same variants.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};

use crate::body::Body;
use crate::error::{ProxyError, retry_after_secs};
use crate::intercept::OriginTlsFault;
use crate::socks5::Reply;
use crate::upstream::connect::{ConnectError, SocksFault};

/// Name this gateway uses in `Proxy-Status`.
pub const PROXY_NAME: &str = "poolgate";

/// How a [`ProxyError`] is answered over HTTP.
pub trait ErrorResponse {
    /// Status, `X-Pool-Error` code and RFC 9209 error type.
    fn parts(&self) -> (StatusCode, &'static str, &'static str);
    /// The `X-Pool-Error` code.
    fn code(&self) -> &'static str {
        self.parts().1
    }
    fn status(&self) -> StatusCode {
        self.parts().0
    }
    /// The response for this error: status, `X-Pool-Error`, `Proxy-Status`, and a one-line body.
    fn to_response(&self) -> Response<Body>;
}

impl ErrorResponse for ProxyError {
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ProxyError::*;
        match self {
            NotProxyRequest => (
                StatusCode::BAD_REQUEST,
                "not-a-proxy-request",
                "http_request_error",
            ),
            BadRequest(_) => (StatusCode::BAD_REQUEST, "bad-request", "http_request_error"),
            BadSessionHeader(_) => (
                StatusCode::BAD_REQUEST,
                "session-invalid",
                "http_request_error",
            ),
            BadUsername(_) => (
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                "session-invalid",
                "http_request_denied",
            ),
            UnknownPool(_) => (
                StatusCode::BAD_REQUEST,
                "unknown-pool",
                "http_request_error",
            ),
            AuthRequired => (
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                "auth-required",
                "http_request_denied",
            ),
            AuthLockedOut { .. } => (
                StatusCode::PROXY_AUTHENTICATION_REQUIRED,
                "auth-locked-out",
                "http_request_denied",
            ),
            ClientDenied => (
                StatusCode::FORBIDDEN,
                "client-denied",
                "http_request_denied",
            ),
            PoolDenied(_) => (StatusCode::FORBIDDEN, "pool-denied", "http_request_denied"),
            BodyTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "http_request_error",
            ),
            BadRequestBody => (StatusCode::BAD_REQUEST, "bad-request", "http_request_error"),
            TargetDenied(_) => (
                StatusCode::FORBIDDEN,
                "target-denied",
                "destination_ip_prohibited",
            ),
            PoolExhausted => (
                StatusCode::SERVICE_UNAVAILABLE,
                "pool-exhausted",
                "connection_limit_reached",
            ),
            RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate-limited",
                "http_request_denied",
            ),
            NoUpstream => (
                StatusCode::SERVICE_UNAVAILABLE,
                "no-upstream-available",
                "destination_unavailable",
            ),
            NoMatchingUpstream { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "no-matching-upstream",
                "destination_unavailable",
            ),
            SessionUpstreamUnavailable { cause, .. } => (
                StatusCode::BAD_GATEWAY,
                "session-upstream-unavailable",
                cause
                    .as_ref()
                    .map_or("destination_unavailable", ConnectError::proxy_status),
            ),
            UpstreamConnect { source, .. } if source.proxy_status() == "connection_timeout" => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "connection_timeout",
            ),
            UpstreamConnect { source, .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream-connect-failed",
                source.proxy_status(),
            ),
            UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                "http_response_timeout",
            ),
            UpstreamProtocol { .. } | UpstreamBadResponse { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream-bad-response",
                "http_protocol_error",
            ),
            OriginTls { fault, .. } if *fault == OriginTlsFault::Timeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream-timeout",
                fault.proxy_status(),
            ),
            OriginTls { fault, .. } => (
                StatusCode::BAD_GATEWAY,
                "origin-tls-failed",
                fault.proxy_status(),
            ),
            Store(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "store-unavailable",
                "proxy_internal_error",
            ),
        }
    }

    fn to_response(&self) -> Response<Body> {
        let (status, code, proxy_status) = self.parts();
        let message = self.to_string();
        let details = message.replace(['"', '\\'], "'");
        let mut resp = Response::new(
            Full::new(Bytes::from(format!("{message}\n")))
                .map_err(|never| match never {})
                .boxed(),
        );
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert("x-pool-error", HeaderValue::from_static(code));
        let ps = format!("{PROXY_NAME}; error={proxy_status}; details=\"{details}\"");
        h.insert(
            "proxy-status",
            HeaderValue::from_str(&ps).unwrap_or_else(|_| {
                HeaderValue::from_static("poolgate; error=proxy_internal_error")
            }),
        );
        if status == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            h.insert(
                header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"poolgate\""),
            );
        }
        if let ProxyError::RateLimited {
            retry_after: Some(d),
            ..
        }
        | ProxyError::AuthLockedOut { retry_after: d } = self
        {
            h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs(*d)));
        }
        match self {
            ProxyError::SessionUpstreamUnavailable { upstream, .. }
            | ProxyError::UpstreamConnect { upstream, .. }
            | ProxyError::UpstreamTimeout { upstream }
            | ProxyError::UpstreamProtocol { upstream, .. }
            | ProxyError::UpstreamBadResponse { upstream, .. }
            | ProxyError::OriginTls { upstream, .. } => {
                if let Ok(v) = HeaderValue::from_str(upstream.as_str()) {
                    h.insert("x-pool-upstream", v);
                }
            }
            _ => {}
        }
        resp
    }
}

/// The SOCKS5 reply for a [`ProxyError`], keyed on its variant as [`ErrorResponse::parts`] is:
/// `02` for what policy refuses, the upstream's (or the target's) own word where it said why a
/// connect failed (`03`, `04`, `05`, `06`), `01` for everything else. Login failures never get
/// here: a SOCKS5 login is refused at its sub-negotiation, with status `01`.
pub fn socks_reply(e: &ProxyError) -> Reply {
    use ProxyError::*;
    match e {
        TargetDenied(_) | ClientDenied | PoolDenied(_) => Reply::NotAllowed,
        // Only after a reload between a SOCKS login and its request (users added, a lockout).
        AuthRequired | AuthLockedOut { .. } | BadUsername(_) => Reply::NotAllowed,
        SessionUpstreamUnavailable { cause, .. } => {
            cause.as_ref().map_or(Reply::GeneralFailure, connect_reply)
        }
        UpstreamConnect { source, .. } => connect_reply(source),
        UpstreamTimeout { .. } => Reply::TtlExpired,
        NotProxyRequest
        | BadRequest(_)
        | BadSessionHeader(_)
        | UnknownPool(_)
        | BodyTooLarge { .. }
        | BadRequestBody
        | PoolExhausted
        | RateLimited { .. }
        | NoUpstream
        | NoMatchingUpstream { .. }
        | UpstreamProtocol { .. }
        | UpstreamBadResponse { .. }
        | OriginTls { .. }
        | Store(_) => Reply::GeneralFailure,
    }
}

/// The SOCKS5 reply for a failed connect through an upstream.
fn connect_reply(e: &ConnectError) -> Reply {
    match e {
        ConnectError::TargetDns { .. } => Reply::HostUnreachable,
        ConnectError::Refused { .. } => Reply::ConnectionRefused,
        ConnectError::Timeout { .. } => Reply::TtlExpired,
        ConnectError::Io { error, .. } if error.kind() == std::io::ErrorKind::TimedOut => {
            Reply::TtlExpired
        }
        ConnectError::TargetDenied { .. } => Reply::NotAllowed,
        // An HTTP upstream's CONNECT status, where it says why.
        ConnectError::ProxyRefused { status, .. } => match status {
            403 => Reply::NotAllowed,
            502 => Reply::HostUnreachable,
            504 => Reply::TtlExpired,
            _ => Reply::GeneralFailure,
        },
        // A SOCKS5 upstream's reply code, passed on.
        ConnectError::Socks { fault, .. } => match fault {
            SocksFault::NotAllowed => Reply::NotAllowed,
            SocksFault::NetworkUnreachable => Reply::NetworkUnreachable,
            SocksFault::HostUnreachable => Reply::HostUnreachable,
            SocksFault::ConnectionRefused => Reply::ConnectionRefused,
            SocksFault::TtlExpired => Reply::TtlExpired,
            SocksFault::AuthRejected
            | SocksFault::NoAcceptableAuth
            | SocksFault::AuthRequired
            | SocksFault::BadCredentials
            | SocksFault::GeneralFailure
            | SocksFault::CommandNotSupported
            | SocksFault::AddressTypeNotSupported
            | SocksFault::Protocol => Reply::GeneralFailure,
        },
        ConnectError::ProxyDns { .. }
        | ConnectError::Reset { .. }
        | ConnectError::Bind { .. }
        | ConnectError::Io { .. }
        | ConnectError::Tls { .. }
        | ConnectError::ProxyAuth { .. }
        | ConnectError::BadReply { .. }
        | ConnectError::InvalidTarget { .. }
        | ConnectError::NotHttpProxy { .. } => Reply::GeneralFailure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::Scope;
    use std::time::Duration;

    #[test]
    fn socks_replies_follow_the_variant_and_the_upstream_word() {
        let up = || crate::upstream::UpstreamId::new("http://a:1");
        let connect = |source| ProxyError::UpstreamConnect {
            upstream: up(),
            source,
        };
        let addr = || "a:1".to_string();
        let cases = [
            (ProxyError::TargetDenied("x"), Reply::NotAllowed),
            (ProxyError::ClientDenied, Reply::NotAllowed),
            (ProxyError::PoolExhausted, Reply::GeneralFailure),
            (ProxyError::NoUpstream, Reply::GeneralFailure),
            (
                connect(ConnectError::Refused { addr: addr() }),
                Reply::ConnectionRefused,
            ),
            (
                connect(ConnectError::TargetDns {
                    host: "nx.test".into(),
                    error: std::io::ErrorKind::NotFound.into(),
                }),
                Reply::HostUnreachable,
            ),
            (
                connect(ConnectError::Timeout {
                    addr: addr(),
                    after: Duration::from_secs(1),
                }),
                Reply::TtlExpired,
            ),
            (
                connect(ConnectError::Socks {
                    addr: addr(),
                    fault: SocksFault::HostUnreachable,
                }),
                Reply::HostUnreachable,
            ),
            (
                connect(ConnectError::ProxyRefused {
                    addr: addr(),
                    status: 403,
                }),
                Reply::NotAllowed,
            ),
            (
                ProxyError::SessionUpstreamUnavailable {
                    upstream: up(),
                    cause: None,
                },
                Reply::GeneralFailure,
            ),
            (
                ProxyError::SessionUpstreamUnavailable {
                    upstream: up(),
                    cause: Some(ConnectError::Refused { addr: addr() }),
                },
                Reply::ConnectionRefused,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(socks_reply(&e), want, "{e}");
        }
    }

    #[test]
    fn generated_responses_carry_code_and_proxy_status() {
        let r = ProxyError::PoolExhausted.to_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["x-pool-error"], "pool-exhausted");
        let ps = r.headers()["proxy-status"].to_str().unwrap();
        assert!(
            ps.starts_with("poolgate; error=connection_limit_reached; details=\""),
            "{ps}"
        );

        let r = ProxyError::RateLimited {
            scope: Scope::UpstreamTarget,
            retry_after: Some(Duration::from_millis(1200)),
        }
        .to_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["x-pool-error"], "rate-limited");
        assert_eq!(r.headers()["retry-after"], "2");
        let ps = r.headers()["proxy-status"].to_str().unwrap();
        assert!(
            ps.starts_with("poolgate; error=http_request_denied; details=\"rate limited: every eligible upstream is at its rate limit for this target; retry after 2s\""),
            "{ps}"
        );

        let r = ProxyError::NotProxyRequest.to_response();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert_eq!(r.headers()["x-pool-error"], "not-a-proxy-request");
    }
}
