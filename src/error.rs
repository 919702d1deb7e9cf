//! The gateway's one error type: where a failure came from (client, upstream, store) and what
//! it carries, without any HTTP. [`crate::proxy::respond`] turns it into the response a client
//! sees: every response poolgate generates itself carries `X-Pool-Error: <code>` (stable, for
//! scripts) and an RFC 9209 `Proxy-Status` header (standard, for HTTP tooling), both derived
//! from the error's variant, never from its message.

use std::time::Duration;

use thiserror::Error;

use crate::intercept::OriginTlsFault;
use crate::ratelimit::Scope;
use crate::session::SessionError;
use crate::store::StoreError;
use crate::upstream::UpstreamId;
use crate::upstream::connect::ConnectError;

/// Whole seconds for `Retry-After`, rounded up: a client that waits that long finds the limit
/// free again.
pub fn retry_after_secs(d: Duration) -> u64 {
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
    /// Too many failed logins from the client's address: refused without a password check.
    #[error(
        "too many failed proxy logins from this address: logins are refused for now; retry after {}s",
        retry_after_secs(*retry_after)
    )]
    AuthLockedOut { retry_after: Duration },
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
    /// No member of the pool has the labels the request asked for.
    #[error("no upstream of pool `{pool}` matches the labels {filter}")]
    NoMatchingUpstream { pool: String, filter: String },
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
}
