//! Message framing rules: what the gateway refuses so that it never forwards a request, or passes
//! back a response, that the next hop could frame differently from the gateway.
//!
//! hyper's HTTP/1 parser already refuses (with 400, or 431 for an oversized head, and a close)
//! heads it cannot read strictly: obs-fold, whitespace tricks in the request line, invalid header
//! bytes, `Content-Length` values that are empty, signed or differ from each other, a
//! `Transfer-Encoding` whose last coding is not `chunked`, and invalid chunk sizes or chunk
//! extensions in the body. When both `Transfer-Encoding` and `Content-Length` arrive, hyper frames
//! by `Transfer-Encoding`, drops `Content-Length` and closes the connection after the exchange.
//! On top of that, this module refuses with 400:
//! - any `Transfer-Encoding` other than one `chunked` (`gzip, chunked`, repeated lines): the
//!   gateway would otherwise forward a body whose transfer coding it silently dropped;
//! - a `Content-Length` that is a list (`5, 5`) or appears next to `Transfer-Encoding`;
//! - a CONNECT with a body;
//! - more than one `Host` (RFC 9112 §3.2), and a request target with user info (`http://u:p@h/`).
//!
//! Bodies are re-framed canonically on the way out (hyper writes `Content-Length` for a known
//! length, chunked otherwise); [`crate::proxy::headers`] drops `Content-Length` wherever
//! `Transfer-Encoding` was present so that no stale length is ever written.

use http::{HeaderMap, Method, Request, StatusCode, header};

use crate::error::ProxyError;

/// Checks a request's framing headers and target before anything is done with it.
pub fn check_request<B>(req: &Request<B>) -> Result<(), ProxyError> {
    let h = req.headers();
    let te = transfer_encoding(h);
    if te == Coding::Other {
        return Err(ProxyError::BadRequest(
            "Transfer-Encoding must be exactly `chunked`",
        ));
    }
    let cl = h.get_all(header::CONTENT_LENGTH).iter().count();
    if cl > 1
        || h.get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.is_empty() || !v.as_bytes().iter().all(u8::is_ascii_digit))
    {
        return Err(ProxyError::BadRequest(
            "Content-Length must be one decimal number",
        ));
    }
    if te == Coding::Chunked && cl > 0 {
        return Err(ProxyError::BadRequest(
            "Content-Length and Transfer-Encoding together",
        ));
    }
    if req.method() == Method::CONNECT
        && (te != Coding::None
            || h.get(header::CONTENT_LENGTH)
                .is_some_and(|v| v.as_bytes().iter().any(|b| *b != b'0')))
    {
        return Err(ProxyError::BadRequest("CONNECT cannot carry a body"));
    }
    if h.get_all(header::HOST).iter().count() > 1 {
        return Err(ProxyError::BadRequest("more than one Host header"));
    }
    if req
        .uri()
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        return Err(ProxyError::BadRequest(
            "user info in the request target is not accepted",
        ));
    }
    Ok(())
}

/// Checks an upstream response before anything of it reaches the client.
///
/// - A 1xx as the final response: the gateway strips `Upgrade` and never asks for one, and
///   hyper's client consumes interim `100`/`103` answers itself, so a `101` (or any other 1xx)
///   here is a protocol switch nobody asked for. Relayed, it would turn the client's connection
///   into a raw pipe to the upstream; it is refused and the upstream connection dropped.
/// - A transfer coding other than plain `chunked` would be dropped on the way to the client.
pub fn check_response(status: StatusCode, headers: &HeaderMap) -> Result<(), &'static str> {
    if status.is_informational() {
        return Err(if status == StatusCode::SWITCHING_PROTOCOLS {
            "101 Switching Protocols without a requested upgrade"
        } else {
            "an interim 1xx status as the final response"
        });
    }
    match transfer_encoding(headers) {
        Coding::Other => Err("transfer coding other than chunked"),
        Coding::None | Coding::Chunked => Ok(()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coding {
    None,
    Chunked,
    Other,
}

fn transfer_encoding(h: &HeaderMap) -> Coding {
    let mut values = h.get_all(header::TRANSFER_ENCODING).iter();
    match (values.next(), values.next()) {
        (None, _) => Coding::None,
        (Some(v), None) if v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked") => {
            Coding::Chunked
        }
        _ => Coding::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Method, URI and headers of a test request.
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    fn req(method: &str, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn framing_rules() {
        let ok: &[Case] = &[
            ("GET", "http://a.test/", &[]),
            ("POST", "http://a.test/", &[("content-length", "5")]),
            (
                "POST",
                "http://a.test/",
                &[("transfer-encoding", "chunked")],
            ),
            (
                "POST",
                "http://a.test/",
                &[("transfer-encoding", "Chunked")],
            ),
            ("CONNECT", "a.test:443", &[]),
            ("CONNECT", "a.test:443", &[("content-length", "0")]),
        ];
        for (m, u, h) in ok {
            assert!(check_request(&req(m, u, h)).is_ok(), "{m} {u} {h:?}");
        }
        let bad: &[Case] = &[
            (
                "POST",
                "http://a.test/",
                &[("transfer-encoding", "gzip, chunked")],
            ),
            (
                "POST",
                "http://a.test/",
                &[
                    ("transfer-encoding", "chunked"),
                    ("transfer-encoding", "chunked"),
                ],
            ),
            (
                "POST",
                "http://a.test/",
                &[("transfer-encoding", "identity")],
            ),
            ("POST", "http://a.test/", &[("content-length", "5, 5")]),
            (
                "POST",
                "http://a.test/",
                &[("content-length", "5"), ("content-length", "5")],
            ),
            (
                "POST",
                "http://a.test/",
                &[("content-length", "5"), ("transfer-encoding", "chunked")],
            ),
            ("CONNECT", "a.test:443", &[("content-length", "5")]),
            ("CONNECT", "a.test:443", &[("transfer-encoding", "chunked")]),
            (
                "GET",
                "http://a.test/",
                &[("host", "a.test"), ("host", "b.test")],
            ),
            ("GET", "http://user:pw@a.test/", &[]),
        ];
        for (m, u, h) in bad {
            assert!(check_request(&req(m, u, h)).is_err(), "{m} {u} {h:?}");
        }
    }

    #[test]
    fn response_codings() {
        let ok = StatusCode::OK;
        let mut h = HeaderMap::new();
        assert!(check_response(ok, &h).is_ok());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        assert!(check_response(ok, &h).is_ok());
        h.insert(header::TRANSFER_ENCODING, "gzip, chunked".parse().unwrap());
        assert!(check_response(ok, &h).is_err());
    }

    /// Every 1xx is refused as a final response (the gateway never asks for an upgrade), and
    /// every final status with clean framing passes.
    #[test]
    fn interim_statuses_are_never_final_responses() {
        let h = HeaderMap::new();
        for code in 100..=999u16 {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(
                check_response(status, &h).is_err(),
                (100..200).contains(&code),
                "{code}"
            );
        }
    }
}
