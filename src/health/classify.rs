//! The outcome of one exchange through an upstream, as recorded at lease release.

use std::cell::RefCell;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickKind};

use crate::config::CaptchaConfig;
use crate::outcome::Outcome;

/// Response classification: status and headers at the head, body markers while it streams.
///
/// Built once from the config; cheap to share. Markers are looked for case-insensitively in the
/// first `sniff_bytes` of bodies that can hold a challenge page (HTML or text, not compressed), so
/// no response is buffered and the first byte is never held back.
#[derive(Debug)]
pub struct CaptchaRules {
    markers: Option<Arc<Markers>>,
    longest_marker: usize,
    sniff_bytes: usize,
    challenge_headers: Vec<(http::HeaderName, String)>,
}

impl CaptchaRules {
    pub fn new(cfg: &CaptchaConfig) -> Self {
        CaptchaRules {
            markers: Markers::new(&cfg.markers).map(Arc::new),
            longest_marker: cfg.markers.iter().map(String::len).max().unwrap_or(0),
            sniff_bytes: cfg.sniff_bytes,
            challenge_headers: cfg.challenge_headers.clone(),
        }
    }

    /// The outcome the head alone gives, and a sniffer when the body should be inspected too.
    /// `from` says who may have written the response: only a proxy's own error page counts a
    /// 5xx against the upstream.
    pub fn classify_head(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
        from: ResponseFrom,
    ) -> (Outcome, Option<Sniffer>) {
        let challenge = self.challenge_headers.iter().any(|(name, want)| {
            headers
                .get_all(name)
                .iter()
                .any(|v| v.as_bytes().eq_ignore_ascii_case(want.as_bytes()))
        });
        let outcome = match status.as_u16() {
            _ if challenge => Outcome::Captcha,
            407 => Outcome::UpstreamError,
            403 | 429 => Outcome::Blocked,
            500..=599 if from == ResponseFrom::Proxy && written_by_proxy(headers) => {
                Outcome::UpstreamError
            }
            // Otherwise taken for the origin's; health still singles out an upstream whose 5xx
            // on a target the rest of the pool does not see (see `health::blame`).
            500..=599 => Outcome::OriginError,
            _ => Outcome::Ok,
        };
        let sniff = matches!(
            outcome,
            Outcome::Ok | Outcome::Blocked | Outcome::OriginError
        ) && self.sniff_bytes > 0
            && sniffable(headers);
        let sniffer = match (&self.markers, sniff) {
            (Some(markers), true) => Some(Sniffer {
                markers: markers.clone(),
                remaining: self.sniff_bytes,
                tail: Vec::new(),
                keep: self.longest_marker.saturating_sub(1),
                found: false,
            }),
            _ => None,
        };
        (outcome, sniffer)
    }
}

/// Who may have written a response the gateway relays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFrom {
    /// An HTTP proxy upstream relayed it: it may be the proxy's own error page.
    Proxy,
    /// Only the origin can have written it: it came through a tunnel (a SOCKS or direct
    /// upstream, or inside an inspected TLS connection, which the upstream cannot forge), so
    /// proxy signatures in it are the origin side's.
    Origin,
}

/// Proxy software that writes its own error pages with its name in `Server` but no `Via` (or
/// a `Via` naming itself): such a page on a 5xx is the proxy's, not a relayed origin answer.
/// Only forward proxies: software that commonly fronts origins (Varnish, nginx, ATS) would
/// blame upstreams for the origin's errors.
const FORWARD_PROXY_SERVERS: &[&str] = &["squid", "tinyproxy"];

/// Whether a 5xx relayed by an HTTP proxy upstream is the proxy's own error page, by evidence:
///
/// * `Proxy-Status` (RFC 9209): a proxy reporting its own failure;
/// * an author identified by `X-Squid-Error` (Squid's error pages) or by `Server` that is also
///   the nearest `Via` hop (the upstream's, the last one added): the software that added the
///   upstream's hop wrote the page. Squid's `ERR_CONNECT_FAIL` page carries all three;
/// * a known forward proxy in `Server` (or `X-Squid-Error`) with no nearest `Via` hop naming a
///   product: tinyproxy's error pages carry `Server: tinyproxy/…` only.
///
/// `Via` alone proves nothing: a proxy adds its hop to every response it relays, the origin's
/// 5xx included, and those keep the origin's `Server`. A nearest hop naming another product
/// means the page was relayed from behind it (an origin-side Squid behind the upstream).
fn written_by_proxy(headers: &http::HeaderMap) -> bool {
    if headers.contains_key("proxy-status") {
        return true;
    }
    let server = headers
        .get(http::header::SERVER)
        .and_then(|v| product(v.as_bytes()));
    let author = if headers.contains_key("x-squid-error") {
        Some(&b"squid"[..])
    } else {
        server
    };
    let Some(author) = author else {
        return false;
    };
    match nearest_via_product(headers) {
        Some(hop) => hop.eq_ignore_ascii_case(author),
        None => FORWARD_PROXY_SERVERS
            .iter()
            .any(|known| known.as_bytes().eq_ignore_ascii_case(author)),
    }
}

/// The product name at the start of `value` (`squid/5.7` → `squid`), if any.
fn product(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii_start();
    let end = value
        .iter()
        .position(|b| matches!(b, b'/' | b' ' | b'\t' | b'(' | b')' | b','))
        .unwrap_or(value.len());
    (end > 0).then(|| &value[..end])
}

/// The product named in the comment of the last `Via` hop (`1.1 host (squid/5.7)` → `squid`):
/// each proxy appends its hop, so the last one is the nearest, the upstream's when it adds one.
fn nearest_via_product(headers: &http::HeaderMap) -> Option<&[u8]> {
    let last = headers.get_all(http::header::VIA).iter().next_back()?;
    let value = last.as_bytes();
    // The last hop starts after the last comma outside a comment.
    let mut depth = 0usize;
    let mut start = 0;
    for (i, b) in value.iter().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => start = i + 1,
            _ => {}
        }
    }
    let hop = &value[start..];
    let open = hop.iter().position(|b| *b == b'(')?;
    product(&hop[open + 1..])
}

/// The marker set, searched in lowercased bytes. Lowercasing a copy and searching it
/// case-sensitively lets the SIMD (Teddy) searcher do the work: an automaton told to ignore case
/// has no fast prefilter and walks every byte, about 15 times slower on a page with no marker.
#[derive(Debug)]
enum Markers {
    Packed(aho_corasick::packed::Searcher),
    /// More markers than the SIMD searcher takes, or a CPU without it.
    Automaton(AhoCorasick),
}

impl Markers {
    fn new(markers: &[String]) -> Option<Self> {
        if markers.is_empty() {
            return None;
        }
        let lower: Vec<String> = markers.iter().map(|m| m.to_ascii_lowercase()).collect();
        if let Some(packed) = aho_corasick::packed::Searcher::new(lower.iter()) {
            return Some(Markers::Packed(packed));
        }
        // A full DFA searches fastest and stays small for a few dozen markers; a marker list too
        // large for one gets the automaton the library picks.
        let build = |kind| AhoCorasick::builder().kind(kind).build(&lower);
        build(Some(AhoCorasickKind::DFA))
            .or_else(|_| build(None))
            .ok()
            .map(Markers::Automaton)
    }

    /// Whether `lowered` (already lowercased) holds a marker.
    fn is_match(&self, lowered: &[u8]) -> bool {
        match self {
            Markers::Packed(s) => s.find(lowered).is_some(),
            Markers::Automaton(ac) => ac.is_match(lowered),
        }
    }
}

/// Bodies that can hold a challenge page: text or HTML (or untyped), not compressed.
fn sniffable(headers: &http::HeaderMap) -> bool {
    let encoded = headers
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
    let textual = headers.get(http::header::CONTENT_TYPE).is_none_or(|v| {
        let v = v.as_bytes();
        let t = |p: &[u8]| v.len() >= p.len() && v[..p.len()].eq_ignore_ascii_case(p);
        t(b"text/") || t(b"application/xhtml") || t(b"application/json")
    });
    !encoded && textual
}

/// Bytes lowercased and searched at a time: bounds the per-thread scratch buffer.
const SCAN_PIECE: usize = 16 * 1024;

thread_local! {
    /// Where a chunk is lowercased for the search; one per thread, so a response being sniffed
    /// holds only the few bytes a marker split across chunks needs.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Looks for challenge markers in a body's first bytes as they stream past.
pub struct Sniffer {
    markers: Arc<Markers>,
    remaining: usize,
    /// The last `keep` bytes seen (lowercased), so a marker split across chunks is still found.
    tail: Vec<u8>,
    keep: usize,
    found: bool,
}

impl Sniffer {
    /// Inspects the next chunk; true once a marker was seen.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.done() {
            return self.found;
        }
        let chunk = &chunk[..chunk.len().min(self.remaining)];
        self.remaining -= chunk.len();
        SCRATCH.with_borrow_mut(|buf| {
            for piece in chunk.chunks(SCAN_PIECE) {
                buf.clear();
                buf.extend_from_slice(&self.tail);
                buf.extend(piece.iter().map(u8::to_ascii_lowercase));
                if self.markers.is_match(buf) {
                    self.found = true;
                    return;
                }
                let from = buf.len().saturating_sub(self.keep);
                self.tail.clear();
                self.tail.extend_from_slice(&buf[from..]);
            }
        });
        if self.done() {
            self.tail = Vec::new();
        }
        self.found
    }

    pub fn found(&self) -> bool {
        self.found
    }

    /// Whether the sniffer still wants bytes.
    pub fn done(&self) -> bool {
        self.found || self.remaining == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, StatusCode};

    fn rules() -> CaptchaRules {
        CaptchaRules::new(&CaptchaConfig::default())
    }

    fn head(status: StatusCode, headers: &[(&'static str, &'static str)]) -> (Outcome, bool) {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, HeaderValue::from_static(v));
        }
        let r = rules();
        let (o, s) = r.classify_head(status, &h, ResponseFrom::Proxy);
        (o, s.is_some())
    }

    #[test]
    fn classifies_status_and_challenge_header() {
        assert_eq!(head(StatusCode::OK, &[]), (Outcome::Ok, true));
        assert_eq!(
            head(StatusCode::PROXY_AUTHENTICATION_REQUIRED, &[]).0,
            Outcome::UpstreamError
        );
        assert_eq!(head(StatusCode::TOO_MANY_REQUESTS, &[]).0, Outcome::Blocked);
        assert_eq!(head(StatusCode::BAD_GATEWAY, &[]).0, Outcome::OriginError);
        assert_eq!(
            head(
                StatusCode::BAD_GATEWAY,
                &[("proxy-status", "squid; error=connection_refused")]
            )
            .0,
            Outcome::UpstreamError
        );
        assert_eq!(
            head(StatusCode::FORBIDDEN, &[("cf-mitigated", "challenge")]),
            (Outcome::Captcha, false)
        );
        // Binary and compressed bodies are not sniffed.
        assert!(!head(StatusCode::OK, &[("content-type", "image/png")]).1);
        assert!(
            !head(
                StatusCode::OK,
                &[("content-type", "text/html"), ("content-encoding", "gzip")]
            )
            .1
        );
    }

    fn judged(
        status: u16,
        headers: &[(&'static str, &'static str)],
        from: ResponseFrom,
    ) -> Outcome {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(*k, HeaderValue::from_static(v));
        }
        let status = StatusCode::from_u16(status).unwrap();
        rules().classify_head(status, &h, from).0
    }

    /// Squid's own error page: `X-Squid-Error`, its hop in `Via`, its name in `Server`.
    const SQUID_PAGE: &[(&str, &str)] = &[
        ("server", "squid/5.7"),
        ("x-squid-error", "ERR_CONNECT_FAIL 111"),
        ("via", "1.1 fake (squid/5.7)"),
    ];

    #[test]
    fn a_proxys_own_5xx_page_is_the_upstreams_and_a_relayed_one_the_origins() {
        use ResponseFrom::{Origin, Proxy};
        for status in [500, 502, 503, 504] {
            assert_eq!(judged(status, SQUID_PAGE, Proxy), Outcome::UpstreamError);
            // Any one piece of Squid's evidence is enough.
            for one in [
                &[("x-squid-error", "ERR_CONNECT_FAIL 111")][..],
                &[("server", "squid"), ("via", "1.1 fake (squid/5.7)")],
                &[("server", "squid/5.7")],
                &[("server", "tinyproxy/1.11.1")],
                &[("proxy-status", "squid; error=connection_refused")],
            ] {
                assert_eq!(
                    judged(status, one, Proxy),
                    Outcome::UpstreamError,
                    "{one:?}"
                );
            }
            // Inside a tunnel the upstream cannot have written it: the origin side's proxy did.
            assert_eq!(judged(status, SQUID_PAGE, Origin), Outcome::OriginError);
            assert_eq!(
                judged(status, &[("proxy-status", "cdn; error=x")], Origin),
                Outcome::OriginError
            );
            for relayed in [
                // No evidence at all.
                &[][..],
                // Squid relaying the origin's 503: its hop, the origin's Server.
                &[("via", "1.1 fake (squid/5.7)"), ("server", "nginx/1.25")],
                &[("via", "1.1 fake (squid/5.7)")],
                // An origin-side Squid's page relayed by a tinyproxy upstream.
                &[
                    ("x-squid-error", "ERR_CONNECT_FAIL 111"),
                    ("server", "squid/5.7"),
                    ("via", "1.1 cache (squid/5.7), 1.1 gw (tinyproxy/1.11)"),
                ],
                // Software that fronts origins is not taken for a forward proxy.
                &[("server", "Varnish")],
                &[("server", "nginx")],
            ] {
                assert_eq!(
                    judged(status, relayed, Proxy),
                    Outcome::OriginError,
                    "{relayed:?}"
                );
            }
        }
        // The nearest hop is the last one, across several Via headers too.
        assert_eq!(
            judged(
                502,
                &[
                    ("server", "squid/6.1"),
                    ("via", "1.0 origin-lb"),
                    ("via", "1.1 a (nginx), 1.1 fake (Squid/6.1)"),
                ],
                Proxy
            ),
            Outcome::UpstreamError
        );
        // Never a success: a relayed 2xx with the same headers is just a success.
        assert_eq!(judged(200, SQUID_PAGE, Proxy), Outcome::Ok);
        assert_eq!(judged(404, SQUID_PAGE, Proxy), Outcome::Ok);
    }

    #[test]
    fn sniffer_finds_markers_across_chunks_case_insensitively_within_the_limit() {
        let r = rules();
        let (_, s) = r.classify_head(StatusCode::OK, &HeaderMap::new(), ResponseFrom::Proxy);
        let mut s = s.unwrap();
        assert!(!s.feed(b"<html><div class=\"G-Re"));
        assert!(s.feed(b"CAPTCHA\" data-sitekey=x>"));

        let (_, s) = r.classify_head(StatusCode::OK, &HeaderMap::new(), ResponseFrom::Proxy);
        let mut s = s.unwrap();
        for _ in 0..100 {
            assert!(!s.feed(&[b'a'; 1000]));
        }
        assert!(s.done(), "stops after sniff_bytes");
        assert!(
            !s.feed(b"g-recaptcha"),
            "markers past the limit are not looked for"
        );

        let (_, s) = r.classify_head(StatusCode::OK, &HeaderMap::new(), ResponseFrom::Proxy);
        let mut s = s.unwrap();
        // One byte at a time still works.
        let page = b"xx Our systems have detected unusual traffic from your computer network";
        assert!(page.iter().any(|b| s.feed(std::slice::from_ref(b))));
    }

    #[test]
    fn configured_markers_match_in_any_case_with_few_or_many_markers() {
        // Few markers take the SIMD searcher; more than it holds take the automaton.
        for extra in [0usize, 200] {
            let mut markers = vec!["Press-And-Hold".to_string()];
            markers.extend((0..extra).map(|i| format!("marker-{i:03}")));
            let cfg = CaptchaConfig {
                markers,
                ..CaptchaConfig::default()
            };
            let r = CaptchaRules::new(&cfg);
            let sniff = |parts: &[&[u8]]| {
                let (_, s) =
                    r.classify_head(StatusCode::OK, &HeaderMap::new(), ResponseFrom::Proxy);
                let mut s = s.expect("sniffed");
                parts.iter().any(|p| s.feed(p))
            };
            assert!(
                sniff(&[b"<p>PRESS-and-", b"HOLD</p>"]),
                "{extra} extra markers"
            );
            assert!(!sniff(&[b"<p>press and hold</p>"]), "{extra} extra markers");
            if extra > 0 {
                assert!(sniff(&[b"..MARKER-1", b"99.."]));
            }
            // A chunk larger than one scan piece, the marker straddling the pieces.
            let mut big = vec![b'x'; SCAN_PIECE - 5];
            big.extend_from_slice(b"press-and-hold");
            big.extend(vec![b'y'; 100]);
            assert!(sniff(&[&big]), "{extra} extra markers");
        }
    }
}
