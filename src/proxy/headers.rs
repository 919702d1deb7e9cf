//! Header hygiene between client, gateway and upstream.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1) are stripped in both directions, and so is every header
//! that was meant for the gateway: `X-Pool-*`, the session aliases and the client's
//! `Proxy-Authorization`. The origin never learns about the gateway's controls.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::session::SESSION_HEADERS;
use crate::upstream::Upstream;

/// Always hop-by-hop, whatever `Connection` lists.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

static X_POOL_UPSTREAM: HeaderName = HeaderName::from_static("x-pool-upstream");
static X_POOL_SESSION: HeaderName = HeaderName::from_static("x-pool-session");

/// Removes the headers named in `Connection`, the fixed hop-by-hop set, `Transfer-Encoding` (the
/// body is re-framed by hyper on the way out) and every header `also` picks. One pass over the
/// names: most messages carry none of them, and then nothing is allocated or looked up.
fn strip_hop_by_hop(headers: &mut HeaderMap, also: impl Fn(&HeaderName) -> bool) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let doomed: Vec<HeaderName> = headers
        .keys()
        .filter(|k| {
            HOP_BY_HOP.contains(k)
                || *k == header::TRANSFER_ENCODING
                || listed.contains(k)
                || also(k)
        })
        .cloned()
        .collect();
    for name in doomed {
        headers.remove(name);
    }
}

/// Where `Transfer-Encoding` was present the body is re-framed, so a `Content-Length` that came
/// with it is stale: it goes, whatever the parser did with it.
fn drop_stale_length(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
}

/// Prepares a client's request headers for the upstream: the gateway's own controls (`X-Pool-*`
/// and the session aliases) go too.
pub fn clean_request(headers: &mut HeaderMap) {
    drop_stale_length(headers);
    strip_hop_by_hop(headers, |k| {
        let k = k.as_str();
        k.starts_with("x-pool-") || SESSION_HEADERS.contains(&k)
    });
}

/// Prepares an upstream's response headers for the client.
pub fn clean_response(headers: &mut HeaderMap) {
    drop_stale_length(headers);
    strip_hop_by_hop(headers, |_| false);
}

/// Adds `X-Pool-Upstream` and, for sessions, `X-Pool-Session`.
pub fn annotate_response(headers: &mut HeaderMap, upstream: &Upstream, session: Option<&str>) {
    if let Some(v) = &upstream.id_header {
        headers.insert(X_POOL_UPSTREAM.clone(), v.clone());
    }
    if let Some(v) = session.and_then(|s| HeaderValue::from_str(s).ok()) {
        headers.insert(X_POOL_SESSION.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_loses_gateway_and_hop_headers() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("proxy-authorization", "Basic dTpw"),
            ("proxy-connection", "keep-alive"),
            ("x-pool-session", "abc"),
            ("x-pool-name", "eu"),
            ("x-pool-anything", "1"),
            ("x-lpm-session", "abc"),
            ("transfer-encoding", "chunked"),
            ("accept", "*/*"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        clean_request(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["accept"]);
    }

    #[test]
    fn content_length_never_survives_next_to_transfer_encoding() {
        for clean in [clean_request, clean_response] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
            h.insert(
                header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
            clean(&mut h);
            assert!(h.is_empty(), "{h:?}");
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
            clean(&mut h);
            assert_eq!(h[header::CONTENT_LENGTH], "10");
        }
    }
}
