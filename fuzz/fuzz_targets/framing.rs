//! The framing checks that run before hyper hands a request on: a request head read the way
//! hyper reads it (httparse), then `proxy::framing::check_request`, the target every front door
//! builds (`Target::from_uri`), and `check_response` over the same headers.
#![no_main]

use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use libfuzzer_sys::fuzz_target;
use poolgate::proxy::framing::{check_request, check_response};
use poolgate::target::Target;

fuzz_target!(|data: &[u8]| {
    let mut raw = [httparse::EMPTY_HEADER; 64];
    let mut parsed = httparse::Request::new(&mut raw);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(data) else {
        return;
    };
    let (Some(method), Some(path)) = (parsed.method, parsed.path) else {
        return;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let Ok(uri) = path.parse::<Uri>() else {
        return;
    };
    let mut headers = HeaderMap::new();
    for h in parsed.headers.iter() {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return;
        };
        headers.append(name, value);
    }
    let mut req = Request::new(());
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri.clone();
    *req.headers_mut() = headers.clone();

    if check_request(&req).is_ok() {
        // What the checks promise of a request they let through.
        let te: Vec<_> = headers.get_all(header::TRANSFER_ENCODING).iter().collect();
        let cl: Vec<_> = headers.get_all(header::CONTENT_LENGTH).iter().collect();
        assert!(
            te.len() <= 1 && cl.len() <= 1,
            "repeated framing header passed"
        );
        assert!(te.is_empty() || cl.is_empty(), "CL and TE together passed");
        if let Some(te) = te.first() {
            assert!(te.as_bytes().trim_ascii().eq_ignore_ascii_case(b"chunked"));
        }
        if let Some(cl) = cl.first() {
            assert!(!cl.is_empty() && cl.as_bytes().iter().all(u8::is_ascii_digit));
        }
        assert!(headers.get_all(header::HOST).iter().count() <= 1);
        assert!(!uri.authority().is_some_and(|a| a.as_str().contains('@')));
        if method == Method::CONNECT {
            assert!(te.is_empty());
        }
        let default_port = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("https") => Some(443),
            Some(_) => Some(80),
            None => None,
        };
        if let Ok(t) = Target::from_uri(&uri, default_port) {
            assert_ne!(t.port, 0);
            assert_eq!(Target::parse(&t.host, t.port), Ok(t));
        }
    }
    // The response check over the same headers, with a status from the first bytes.
    let code = 100 + u16::from(data[0]) * 2 + u16::from(data.len() as u8 & 1);
    if let Ok(status) = StatusCode::from_u16(code) {
        if check_response(status, &headers).is_ok() {
            assert!(!status.is_informational());
        }
    }
});
