//! Outcome feedback for opaque tunnels: `POST /feedback` on the admin listener.
//!
//! Through a raw CONNECT tunnel the gateway sees bytes only; the client sees the captcha. This
//! endpoint lets the client say what it saw, for its session (the gateway looks up the session's
//! upstream) or for an upstream id, and feeds health exactly as a passive outcome would:
//! `pool.health.observe(...)`, then the resulting decisions applied to the store, and the outcome
//! counted in the store's statistics.
//!
//! ```text
//! POST /feedback
//! Authorization: Bearer <server.admin_token>
//! {"pool": "default", "session": "abc", "outcome": "captcha", "target": "example.com"}
//! {"upstream": "http://10.0.0.1:3128", "outcome": "blocked"}
//! ```
//!
//! Answers: 200 with what was recorded and the upstream's state after it; 400 for a malformed
//! report; 401 without the right token; 404 for an unknown pool, session or upstream.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::{Deserialize, Serialize};

use crate::body::{self, Body};
use crate::health;
use crate::outcome::Outcome;
use crate::session::SessionKey;
use crate::state::Gateway;
use crate::store::Store;
use crate::upstream::{Upstream, UpstreamId};

/// Largest report body accepted.
pub const MAX_REPORT_BYTES: usize = 16 * 1024;
/// A report body must arrive within this.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Target recorded when a report names none (per-target blame then has nothing to go on).
pub const UNSPECIFIED_TARGET: &str = "(unspecified)";
/// Longest host name (RFC 1035).
const MAX_HOST_LEN: usize = 253;

/// One report, as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Report {
    /// The pool; the default pool when absent.
    pool: Option<String>,
    /// The session whose upstream the outcome is about. Exactly one of `session`, `upstream`.
    session: Option<String>,
    /// The upstream id (as in `/status`) the outcome is about.
    upstream: Option<String>,
    /// `ok`, `captcha`, `blocked`, `timeout`, `reset`, `connect-error`, `upstream-error`,
    /// `origin-error` (snake_case forms accepted too).
    outcome: String,
    /// The host the client was talking to, for per-target health.
    target: Option<String>,
    /// How long the exchange took; for `ok`, it feeds latency figures.
    latency_ms: Option<u64>,
}

/// What was recorded.
#[derive(Debug, Serialize)]
struct Recorded {
    pool: String,
    upstream: String,
    outcome: &'static str,
    target: String,
    /// The upstream's health state after the report.
    state: Option<&'static str>,
}

/// Why a report was refused; each variant is one status.
#[derive(Debug)]
pub enum Rejection {
    Unauthorized(&'static str),
    BadRequest(String),
    NotFound(String),
    Unavailable(String),
}

impl Rejection {
    fn into_response(self) -> Response<Body> {
        let (status, message) = match self {
            Rejection::Unauthorized(m) => (StatusCode::UNAUTHORIZED, m.to_string()),
            Rejection::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            Rejection::NotFound(m) => (StatusCode::NOT_FOUND, m),
            Rejection::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
        };
        let mut r = json(status, &serde_json::json!({ "error": message }));
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"poolgate\""),
            );
        }
        r
    }
}

/// Serves `POST /feedback`.
pub async fn handle(gw: &Gateway, req: Request<Incoming>) -> Response<Body> {
    match accept(gw, req).await {
        Ok(recorded) => json(StatusCode::OK, &recorded),
        Err(r) => r.into_response(),
    }
}

async fn accept(gw: &Gateway, req: Request<Incoming>) -> Result<Recorded, Rejection> {
    authorize(gw, req.headers())?;
    let body = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(req.into_body(), MAX_REPORT_BYTES).collect(),
    )
    .await
    .map_err(|_| Rejection::BadRequest("the report body did not arrive in time".into()))?
    .map_err(|e| {
        Rejection::BadRequest(format!(
            "unreadable report body (at most {MAX_REPORT_BYTES} bytes): {e}"
        ))
    })?
    .to_bytes();
    let report: Report = serde_json::from_slice(&body)
        .map_err(|e| Rejection::BadRequest(format!("malformed report: {e}")))?;
    let outcome = parse_outcome(&report.outcome)?;
    let target = match &report.target {
        Some(t) => parse_target(t)?,
        None => UNSPECIFIED_TARGET.to_string(),
    };

    let pools = gw.pools.load_full();
    let pool = pools
        .get(report.pool.as_deref())
        .map_err(|e| Rejection::NotFound(e.to_string()))?
        .clone();
    let id = match (&report.session, &report.upstream) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(Rejection::BadRequest(
                "give exactly one of \"session\" and \"upstream\"".into(),
            ));
        }
        (Some(session), None) => {
            let key = SessionKey::new(session)
                .map_err(|e| Rejection::BadRequest(format!("\"session\": {e}")))?;
            gw.store
                .session_upstream(pool.name(), key.as_str())
                .await
                .map_err(|e| Rejection::Unavailable(e.to_string()))?
                .ok_or_else(|| {
                    Rejection::NotFound(format!(
                        "no live session `{key}` in pool `{}`",
                        pool.name()
                    ))
                })?
        }
        (None, Some(upstream)) => upstream_id(upstream)?,
    };
    if pool.upstream(&id).is_none() {
        return Err(Rejection::NotFound(format!(
            "`{id}` is not an upstream of pool `{}`",
            pool.name()
        )));
    }

    let latency = match report.latency_ms {
        Some(ms) => Duration::from_millis(ms),
        // Without a figure, the upstream's usual latency: a report does not skew averages.
        None => pool
            .health
            .latency_ewma_ms(&id)
            .map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1000.0)),
    };
    let changes = pool.health.observe(&id, &target, outcome, latency);
    health::apply(&*gw.store, pool.name(), changes).await;
    if let Err(e) = gw.store.record(pool.name(), &id, outcome, latency).await {
        tracing::warn!(pool = pool.name(), upstream = %id, error = %e, "could not count a feedback outcome");
    }
    let state = pool.health.state_of(&id).map(|s| s.as_str());
    tracing::info!(
        pool = pool.name(), upstream = %id, outcome = outcome.as_str(), target,
        state = state.unwrap_or("?"), "feedback recorded"
    );
    Ok(Recorded {
        pool: pool.name().to_string(),
        upstream: id.to_string(),
        outcome: outcome.as_str(),
        target,
        state,
    })
}

/// The one check that decides who may send feedback. For now the admin token, as a Bearer
/// token; without a configured token feedback is refused (it changes health).
pub fn authorize(gw: &Gateway, headers: &HeaderMap) -> Result<(), Rejection> {
    let Some(token) = gw.config.server.admin_token.as_deref() else {
        return Err(Rejection::Unauthorized(
            "feedback needs server.admin_token to be set",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, rest) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
        })
        .ok_or(Rejection::Unauthorized(
            "send `Authorization: Bearer <admin token>`",
        ))?;
    if constant_time_eq(given.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        Err(Rejection::Unauthorized("wrong token"))
    }
}

/// Compares without an early exit, so the time taken does not tell how much of a guess was
/// right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

fn parse_outcome(s: &str) -> Result<Outcome, Rejection> {
    Outcome::ALL
        .iter()
        .copied()
        .filter(|o| *o != Outcome::Cancelled)
        .find(|o| o.as_str() == s || o.key() == s)
        .ok_or_else(|| {
            let known: Vec<&str> = Outcome::ALL
                .iter()
                .filter(|o| **o != Outcome::Cancelled)
                .map(|o| o.as_str())
                .collect();
            Rejection::BadRequest(format!(
                "\"outcome\": `{}` is not one of {}",
                shown(s),
                known.join(", ")
            ))
        })
}

/// A host from `example.com`, `example.com:443` or `https://example.com/path`.
fn parse_target(s: &str) -> Result<String, Rejection> {
    let bad = || {
        Rejection::BadRequest(format!(
            "\"target\": `{}` is not a host such as \"example.com\"",
            shown(s)
        ))
    };
    let uri: http::Uri = if s.contains("://") {
        s.parse().map_err(|_| bad())?
    } else {
        format!("http://{s}").parse().map_err(|_| bad())?
    };
    let host = uri
        .host()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
        .filter(|h| !h.is_empty() && h.len() <= MAX_HOST_LEN)
        .ok_or_else(bad)?;
    Ok(host.to_ascii_lowercase())
}

/// An upstream id as shown in `/status`; a full upstream URL is accepted too and reduced to its
/// id (its credentials are dropped, never echoed).
fn upstream_id(s: &str) -> Result<UpstreamId, Rejection> {
    if !s.contains('@') {
        return Ok(UpstreamId::new(s));
    }
    Upstream::parse(s).map(|u| u.id).map_err(|_| {
        Rejection::BadRequest("\"upstream\": expected an upstream id as shown in /status".into())
    })
}

/// A client-given value, cut short and stripped of control characters, for error messages.
fn shown(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(64).collect()
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    body::typed(status, "application/json", bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_targets_and_tokens_parse() {
        assert_eq!(parse_outcome("captcha").ok(), Some(Outcome::Captcha));
        assert_eq!(
            parse_outcome("connect_error").ok(),
            Some(Outcome::ConnectError)
        );
        assert_eq!(
            parse_outcome("upstream-error").ok(),
            Some(Outcome::UpstreamError)
        );
        assert!(parse_outcome("cancelled").is_err());
        assert!(parse_outcome("CAPTCHA!").is_err());
        assert_eq!(
            parse_target("Example.com").ok().as_deref(),
            Some("example.com")
        );
        assert_eq!(
            parse_target("example.com:443").ok().as_deref(),
            Some("example.com")
        );
        assert_eq!(
            parse_target("https://shop.example/cart?x=1")
                .ok()
                .as_deref(),
            Some("shop.example")
        );
        assert_eq!(parse_target("[::1]:8443").ok().as_deref(), Some("::1"));
        assert!(parse_target("bad host").is_err());
        assert!(parse_target("").is_err());
        assert!(constant_time_eq(b"secret-token-123", b"secret-token-123"));
        assert!(!constant_time_eq(b"secret-token-123", b"secret-token-12"));
        assert!(!constant_time_eq(b"", b"x"));
        assert_eq!(
            upstream_id("http://u:p@10.0.0.1:3128").unwrap().as_str(),
            "http://10.0.0.1:3128"
        );
    }
}
