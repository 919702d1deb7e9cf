//! Admin actions: quarantine, restore, drain or remove an upstream; end a session.
//!
//! Every action needs `Authorization: Bearer <server.admin_token>`; without a configured token
//! actions are disabled. Requests are small JSON documents:
//! `POST /admin/upstream {"pool": "default", "upstream": "<id>", "action": "quarantine", "duration_s": 600}`
//! (`action`: quarantine | restore | drain | remove) and
//! `POST /admin/session {"pool": "default", "session": "<key>", "action": "end"}`.

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::json;

use crate::body::Body;
use crate::health;
use crate::state::Gateway;
use crate::store::Store;
use crate::upstream::UpstreamId;

/// Largest action document accepted.
const MAX_ACTION_BYTES: usize = 64 * 1024;
/// Quarantine length when an action gives none.
const DEFAULT_QUARANTINE_S: u64 = 600;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamAction {
    pool: Option<String>,
    upstream: String,
    action: String,
    duration_s: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionAction {
    pool: Option<String>,
    session: String,
    action: String,
}

/// A JSON answer.
pub fn reply(status: StatusCode, body: serde_json::Value) -> http::Response<Body> {
    let mut r = crate::body::response(status, body.to_string());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> http::Response<Body> {
    reply(status, json!({ "error": message.to_string() }))
}

/// Compares in constant time for equal lengths, so response timing says nothing about how much of
/// a guessed token was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Checks the bearer token; the error is the response to send.
pub fn authorize(gw: &Gateway, headers: &HeaderMap) -> Result<(), Box<http::Response<Body>>> {
    let Some(token) = gw.config.server.admin_token.as_deref() else {
        return Err(Box::new(error(
            StatusCode::FORBIDDEN,
            "admin actions are disabled: set server.admin_token",
        )));
    };
    let given = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if same_secret(given.as_bytes(), token.as_bytes()) {
        Ok(())
    } else {
        let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
        r.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static("Bearer realm=\"poolgate-admin\""),
        );
        Err(Box::new(r))
    }
}

/// Reads a small JSON body.
pub async fn read_json<T: serde::de::DeserializeOwned>(
    body: Incoming,
) -> Result<T, Box<http::Response<Body>>> {
    let bytes: Bytes = Limited::new(body, MAX_ACTION_BYTES)
        .collect()
        .await
        .map_err(|e| {
            Box::new(error(
                StatusCode::BAD_REQUEST,
                format!("unreadable body: {e}"),
            ))
        })?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}"))))
}

pub async fn upstream(gw: &Gateway, body: Incoming) -> http::Response<Body> {
    let a: UpstreamAction = match read_json(body).await {
        Ok(a) => a,
        Err(r) => return *r,
    };
    let pools = gw.pools.load_full();
    let pool = match pools.get(a.pool.as_deref()) {
        Ok(p) => p.clone(),
        Err(e) => return error(StatusCode::NOT_FOUND, e),
    };
    let id = UpstreamId::new(a.upstream.as_str());
    if pool.upstream(&id).is_none() {
        return error(
            StatusCode::NOT_FOUND,
            format!("no upstream `{}` in pool `{}`", a.upstream, pool.name()),
        );
    }
    let change = match a.action.as_str() {
        "quarantine" => pool.health.quarantine(
            &id,
            std::time::Duration::from_secs(a.duration_s.unwrap_or(DEFAULT_QUARANTINE_S)),
        ),
        "restore" => pool.health.restore(&id, "restored by an operator"),
        "drain" => pool.health.drain(&id),
        "remove" => pool.health.remove(&id),
        other => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("unknown action `{other}` (quarantine, restore, drain, remove)"),
            );
        }
    };
    health::apply(&*gw.store, pool.name(), change.into_iter().collect()).await;
    let state = pool.health.state_of(&id).map_or("unknown", |s| s.as_str());
    tracing::info!(pool = pool.name(), upstream = %id, action = %a.action, state, "admin action");
    reply(
        StatusCode::OK,
        json!({ "pool": pool.name(), "upstream": id.as_str(), "state": state }),
    )
}

pub async fn session(gw: &Gateway, body: Incoming) -> http::Response<Body> {
    let a: SessionAction = match read_json(body).await {
        Ok(a) => a,
        Err(r) => return *r,
    };
    if a.action != "end" {
        return error(
            StatusCode::BAD_REQUEST,
            format!("unknown action `{}` (end)", a.action),
        );
    }
    let pools = gw.pools.load_full();
    let pool = match pools.get(a.pool.as_deref()) {
        Ok(p) => p.clone(),
        Err(e) => return error(StatusCode::NOT_FOUND, e),
    };
    match gw.store.end_session(pool.name(), &a.session).await {
        Ok(true) => {
            tracing::info!(pool = pool.name(), "admin action: session ended");
            reply(
                StatusCode::OK,
                json!({ "pool": pool.name(), "session": a.session, "ended": true }),
            )
        }
        Ok(false) => error(StatusCode::NOT_FOUND, "no live session with that key"),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e),
    }
}
