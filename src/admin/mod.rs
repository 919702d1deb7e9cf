//! The admin listener: `/status` (JSON), `/healthz`, and `POST /feedback` ([`crate::feedback`]).

pub mod client;
pub mod status;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

use crate::proxy::Body;
use crate::state::Gateway;

pub async fn handle(gw: Arc<Gateway>, req: Request<Incoming>) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/status") => match serde_json::to_vec_pretty(&status::collect(&gw).await) {
            Ok(json) => {
                let mut r = full(StatusCode::OK, json);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                r
            }
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
        },
        (_, "/healthz" | "/status") => text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n"),
        (&Method::POST, "/feedback") => crate::feedback::handle(&gw, req).await,
        (_, "/feedback") => text(StatusCode::METHOD_NOT_ALLOWED, "use POST\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: try /status or /healthz\n",
        ),
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(
        Full::new(body.into())
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r
}

fn text(status: StatusCode, body: &str) -> Response<Body> {
    let mut r = full(status, body.to_string());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
