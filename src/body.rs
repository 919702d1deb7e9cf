//! The body types the gateway sends, and their builders: one place for the
//! `Full::new(..).map_err(|never| match never {}).boxed()` dance every response needs.

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt, Empty, Full};

/// Body of every response the gateway sends to a client.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// Body of a request sent upstream: the client's (through its size limit), or empty when a
/// request is replayed.
pub type OutBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body with nothing in it.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// An empty request body for upstream.
pub fn empty_out() -> OutBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A response of `status` with `bytes` as its body.
pub fn response(status: StatusCode, bytes: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(full(bytes));
    *r.status_mut() = status;
    r
}

/// A response of `status` whose body of `content_type` is `bytes`.
pub fn typed(
    status: StatusCode,
    content_type: &'static str,
    bytes: impl Into<Bytes>,
) -> Response<Body> {
    let mut r = response(status, bytes);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    r
}
