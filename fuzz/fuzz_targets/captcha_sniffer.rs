//! The captcha sniffer over a body split into chunks at points the input picks: it must find a
//! marker exactly when the body's first `sniff_bytes` hold one, however the body is split.
//!
//! Input: byte 0 sets `sniff_bytes` (small, to reach the limit), byte 1 the number of cuts, then
//! that many cut points, then the body.
#![no_main]

use http::{HeaderMap, HeaderValue, StatusCode, header};
use libfuzzer_sys::fuzz_target;
use poolgate::config::CaptchaConfig;
use poolgate::health::classify::{CaptchaRules, ResponseFrom};

fuzz_target!(|data: &[u8]| {
    let [sniff, cuts, rest @ ..] = data else {
        return;
    };
    let cuts = usize::from(*cuts % 16).min(rest.len());
    let (points, body) = rest.split_at(cuts);
    let mut cfg = CaptchaConfig::default();
    // Short markers as well as the shipped ones, so that splits land inside them often.
    cfg.markers.extend(["ab".to_string(), "xyz1".to_string()]);
    cfg.sniff_bytes = usize::from(*sniff) * 3 + 1;
    let rules = CaptchaRules::new(&cfg);
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html"));
    let (_, sniffer) = rules.classify_head(StatusCode::OK, &headers, ResponseFrom::Origin);
    let mut sniffer = sniffer.expect("an HTML 200 is sniffed");

    let mut at: Vec<usize> = points
        .iter()
        .map(|p| usize::from(*p) * body.len() / 256)
        .collect();
    at.sort_unstable();
    let mut from = 0;
    let mut found = false;
    for cut in at.into_iter().chain([body.len()]) {
        found = sniffer.feed(&body[from..cut]);
        from = cut;
    }
    let seen: Vec<u8> = body[..body.len().min(cfg.sniff_bytes)].to_ascii_lowercase();
    let expected = cfg.markers.iter().any(|m| {
        seen.windows(m.len())
            .any(|w| w == m.to_ascii_lowercase().as_bytes())
    });
    assert_eq!(
        found, expected,
        "split sniffing disagrees with a whole-body search"
    );
    assert_eq!(sniffer.found(), expected);
});
