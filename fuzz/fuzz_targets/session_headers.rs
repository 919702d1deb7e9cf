//! The session headers (`X-Pool-Session` and its aliases, `X-Pool-Name`, `X-Pool-Labels`) and Basic
//! `Proxy-Authorization`, read together by `session::parse` from a header map built of the input.
//!
//! Input: lines `<n><value>`, where the first byte picks the header name from a short table (so
//! the fuzzer spends its time on values, and on repeats, rather than on spelling names).
#![no_main]

use base64::Engine as _;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use poolgate::session;

const NAMES: &[&str] = &[
    "x-pool-session",
    "x-pool-name",
    "x-lpm-session",
    "zyte-session-id",
    "x-crawlera-session",
    "proxy-authorization",
    "host",
    "x-pool-other",
    "x-pool-labels",
];

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some((&n, value)) = line.split_first() else {
            continue;
        };
        let name = NAMES[usize::from(n) % NAMES.len()];
        let value = if name == "proxy-authorization" && n & 0x80 != 0 {
            // A well-formed Basic header whose credentials are the rest of the line.
            let b64 = base64::engine::general_purpose::STANDARD.encode(value);
            format!("Basic {b64}").into_bytes()
        } else {
            value.to_vec()
        };
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            headers.append(HeaderName::from_static(name), v);
        }
    }
    if let Ok(req) = session::parse(&headers) {
        if req.ttl.is_some() {
            assert!(req.session.is_some() || req.create);
        }
        if req.create {
            assert!(req.session.is_none());
        }
        if let Some(key) = &req.session {
            assert!(session::SessionKey::new(key.as_str()).is_ok());
        }
    }
});
