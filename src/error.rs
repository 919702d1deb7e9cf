//! The gateway's one error type, and the one function that turns an error into the response a
//! client sees.
//!
//! Every response poolgate generates itself carries `X-Pool-Error: <code>` (stable, for scripts)
//! and an RFC 9209 `Proxy-Status` header (standard, for HTTP tooling). Both are derived here from
//! the error's variant, never from its message.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use thiserror::Error;

use crate::body::Body;
use crate::intercept::OriginTlsFault;
use crate::ratelimit::Scope;
use crate::session::SessionError;
use crate::store::StoreError;
use crate::upstream::UpstreamId;
use crate::upstream::connect::ConnectError;

/// Name this gateway uses in `Proxy-Status`.
pub const PROXY_NAME: &str = "poolgate";

/// Whole seconds for `Retry-After`, rounded up: a client that waits that long finds the limit
/// free again.
fn retry_after_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[derive(Debug, Error)]
pub enum ProxyError {
    /// An origin-form request sent to the proxy port.
    #[error(
        "this is a forward proxy: send absolute-form requests (curl -x http://<gateway> http://example.com/) or CONNECT"
    )]
    NotProxyRequest,
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// Malformed session header.
    #[error("{0}")]
    BadSessionHeader(#[source] SessionError),
    /// Malformed proxy username: answered 407 so the client sees it as an auth problem.
    #[error("{0}")]
    BadUsername(#[source] SessionError),
    #[error("unknown pool `{0}`")]
    UnknownPool(String),
    /// No, or wrong, proxy credentials where the gateway requires them.
    #[error(
        "proxy authentication required: send Proxy-Authorization: Basic <base64 of user:password>"
    )]
    AuthRequired,
    /// The client's address is not in `auth.client_cidrs`.
    #[error("this client address may not use the proxy")]
    ClientDenied,
    /// The authenticated user may not use the pool the request asked for.
    #[error("user may not use pool `{0}`")]
    PoolDenied(String),
    /// The request body is larger than `server.max_request_body_bytes`.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// The client's request body broke off or was malformed mid-stream (bad chunk framing).
    #[error("the request body is malformed or ended early")]
    BadRequestBody,
    #[error("target denied: {0}")]
    TargetDenied(&'static str),
    #[error("every upstream of the pool is at its concurrency limit")]
    PoolExhausted,
    #[error("no upstream of the pool is available")]
    NoUpstream,
    /// A rate limit held the request past `queue_timeout` (or could not free up before it).
    #[error(
        "rate limited: {}{}",
        scope.describe(),
        retry_after.map(|d| format!("; retry after {}s", retry_after_secs(d))).unwrap_or_default()
    )]
    RateLimited {
        scope: Scope,
        /// When the limit is expected to let a request through, if known.
        retry_after: Option<Duration>,
    },
    #[error("the session's upstream {upstream} is unavailable")]
    SessionUpstreamUnavailable {
        upstream: UpstreamId,
        #[source]
        cause: Option<ConnectError>,
    },
    #[error("could not connect through upstream {upstream}: {source}")]
    UpstreamConnect {
        upstream: UpstreamId,
        #[source]
        source: ConnectError,
    },
    #[error("upstream {upstream} sent no response in time")]
    UpstreamTimeout { upstream: UpstreamId },
    #[error("upstream {upstream} failed the exchange: {source}")]
    UpstreamProtocol {
        upstream: UpstreamId,
        #[source]
        source: hyper::Error,
    },
    /// The upstream's response cannot be passed on faithfully (e.g. a transfer coding the
    /// gateway would have to drop).
    #[error("upstream {upstream} sent an unusable response: {reason}")]
    UpstreamBadResponse {
        upstream: UpstreamId,
        reason: &'static str,
    },
    /// TLS with the origin, through the upstream, failed (inspected tunnels only).
    #[error("TLS with the origin {target} through upstream {upstream} failed: {detail}")]
    OriginTls {
        upstream: UpstreamId,
        target: String,
        fault: OriginTlsFault,
        detail: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ProxyError {
    /// Whether another upstream may be tried: only when nothing was sent upstream yet.
    pub fn retryable(&self) -> bool {
        matches!(self, ProxyError::UpstreamConnect { .. })
    }

    /// Status, `X-Pool-Error` code and RFC 9209 error type.
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

    pub fn code(&self) -> &'static str {
        self.parts().1
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The response for this error: status, `X-Pool-Error`, `Proxy-Status`, and a one-line body.
    pub fn to_response(&self) -> Response<Body> {
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
        } = self
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

#[cfg(test)]
mod tests {
    use super::*;

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
