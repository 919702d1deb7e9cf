//! The admin listener: `/status` (JSON), `/status/history` (the last hour, see
//! [`crate::history`]), `/metrics` (Prometheus), `/dashboard`, `/healthz`,
//! `/readyz`, `POST /feedback` ([`crate::feedback`]), `POST /admin/reload` and the other
//! token-protected admin actions under `/admin/`. Off loopback, or with
//! `server.admin_read_token` set, the reads need a token too ([`access`]).

pub mod access;
pub mod actions;
pub mod client;
pub mod dashboard;
pub mod metrics;
pub mod status;
pub mod traffic;

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use crate::body::{self, Body};
use crate::state::Gateway;

/// Serves one request of the admin listener bound to `bound` (its address decides whether reads
/// need a token, see [`access`]).
pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>, bound: IpAddr) -> Response<Body> {
    let path = req.uri().path().to_string();
    if req.method() == Method::GET
        && matches!(
            path.as_str(),
            "/status" | "/status/history" | "/metrics" | "/" | "/dashboard"
        )
    {
        if let Err(denied) = access::authorize_read(&gw.live.load().server, bound, req.headers()) {
            return *denied;
        }
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        // Not ready once shutdown begins, so a load balancer stops sending new clients.
        (&Method::GET, "/readyz") if gw.shutdown.is_cancelled() => {
            text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
        }
        (&Method::GET, "/readyz") => text(StatusCode::OK, "ready\n"),
        (&Method::GET, "/status") => {
            let listing = match status::Listing::parse(req.uri().query()) {
                Ok(l) => l,
                Err(e) => return text(StatusCode::BAD_REQUEST, &format!("/status: {e}\n")),
            };
            json(serde_json::to_vec_pretty(
                &status::collect(&gw, &listing).await,
            ))
        }
        (&Method::GET, "/status/history") => json(serde_json::to_vec(&gw.metrics.history.view())),
        (&Method::POST, "/admin/reload") => crate::reload::admin_reload(&gw, &req).await,
        (_, "/admin/reload") => text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"),
        (&Method::GET, "/metrics") => match gw
            .metrics
            .render(&status::collect(&gw, &status::Listing::everything()).await)
        {
            Ok(body) => {
                let mut r = body::response(StatusCode::OK, body);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    ),
                );
                r
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
        },
        (&Method::GET, "/" | "/dashboard") => dashboard::page(),
        (&Method::POST, "/admin/upstream" | "/admin/session") => {
            if let Err(denied) = actions::authorize(&gw, req.headers()) {
                return *denied;
            }
            if path == "/admin/upstream" {
                actions::upstream(&gw, req.into_body()).await
            } else {
                actions::session(&gw, req.into_body()).await
            }
        }
        (_, "/healthz" | "/readyz" | "/status" | "/status/history" | "/metrics" | "/dashboard") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n")
        }
        (_, "/admin/upstream" | "/admin/session") => {
            text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n")
        }
        (&Method::POST, "/feedback") => crate::feedback::handle(&gw, req).await,
        (_, "/feedback") => text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /dashboard, /status, /metrics, /healthz or /readyz\n",
        ),
    }
}

/// A JSON document, or a 500 saying why it could not be written.
fn json(document: serde_json::Result<Vec<u8>>) -> Response<Body> {
    match document {
        Ok(json) => {
            let mut r = body::response(StatusCode::OK, json);
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    body::typed(status, "text/plain; charset=utf-8", body.to_string())
}
