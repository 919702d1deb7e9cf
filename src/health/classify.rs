//! The outcome of one exchange through an upstream, as recorded at lease release.

use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickKind};

use crate::config::CaptchaConfig;

/// What happened to one request or tunnel. Only proxy faults and bans move an upstream's health;
/// `OriginError` is the target's fault and moves nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    ConnectError,
    Timeout,
    Reset,
    /// A 5xx or 407 produced by the upstream proxy itself (including a refused CONNECT).
    UpstreamError,
    Captcha,
    /// 403/429-class answer without a challenge marker.
    Blocked,
    /// A 5xx from the origin.
    OriginError,
    /// The client went away before the exchange ended: nobody's fault, moves no health.
    Cancelled,
}

impl Outcome {
    pub const ALL: [Outcome; 9] = [
        Outcome::Ok,
        Outcome::ConnectError,
        Outcome::Timeout,
        Outcome::Reset,
        Outcome::UpstreamError,
        Outcome::Captcha,
        Outcome::Blocked,
        Outcome::OriginError,
        Outcome::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ConnectError => "connect-error",
            Outcome::Timeout => "timeout",
            Outcome::Reset => "reset",
            Outcome::UpstreamError => "upstream-error",
            Outcome::Captcha => "captcha",
            Outcome::Blocked => "blocked",
            Outcome::OriginError => "origin-error",
            Outcome::Cancelled => "cancelled",
        }
    }

    /// The snake_case name used as a field in `/status` and as a metrics label.
    pub fn key(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ConnectError => "connect_error",
            Outcome::Timeout => "timeout",
            Outcome::Reset => "reset",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Captcha => "captcha",
            Outcome::Blocked => "blocked",
            Outcome::OriginError => "origin_error",
            Outcome::Cancelled => "cancelled",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether the outcome counts as a success of the upstream.
    pub fn is_success(self) -> bool {
        matches!(self, Outcome::Ok | Outcome::OriginError)
    }

    /// Whether the outcome says anything about the upstream at all.
    pub fn is_judgement(self) -> bool {
        self != Outcome::Cancelled
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Response classification: status and headers at the head, body markers while it streams.
///
/// Built once from the config; cheap to share. Markers are matched case-insensitively with one
/// Aho-Corasick automaton over the first `sniff_bytes` of bodies that can hold a challenge page
/// (HTML or text, not compressed), so no response is buffered and the first byte is never held
/// back.
#[derive(Debug)]
pub struct CaptchaRules {
    markers: Option<Arc<AhoCorasick>>,
    longest_marker: usize,
    sniff_bytes: usize,
    challenge_headers: Vec<(http::HeaderName, String)>,
}

impl CaptchaRules {
    pub fn new(cfg: &CaptchaConfig) -> Self {
        let build = |kind| {
            AhoCorasick::builder()
                .ascii_case_insensitive(true)
                .kind(kind)
                .build(&cfg.markers)
        };
        // A full DFA searches fastest and stays small for a few dozen markers; a marker list too
        // large for one gets the automaton the library picks.
        let markers = build(Some(AhoCorasickKind::DFA))
            .or_else(|_| build(None))
            .ok()
            .filter(|_| !cfg.markers.is_empty())
            .map(Arc::new);
        CaptchaRules {
            markers,
            longest_marker: cfg.markers.iter().map(String::len).max().unwrap_or(0),
            sniff_bytes: cfg.sniff_bytes,
            challenge_headers: cfg.challenge_headers.clone(),
        }
    }

    /// The outcome the head alone gives, and a sniffer when the body should be inspected too.
    pub fn classify_head(
        &self,
        status: http::StatusCode,
        headers: &http::HeaderMap,
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
            // A proxy that failed says so with Proxy-Status (RFC 9209); an origin 5xx does not.
            500..=599 if headers.contains_key("proxy-status") => Outcome::UpstreamError,
            500..=599 => Outcome::OriginError,
            _ => Outcome::Ok,
        };
        let sniff = matches!(
            outcome,
            Outcome::Ok | Outcome::Blocked | Outcome::OriginError
        ) && self.sniff_bytes > 0
            && sniffable(headers);
        let sniffer = match (&self.markers, sniff) {
            (Some(ac), true) => Some(Sniffer {
                ac: ac.clone(),
                remaining: self.sniff_bytes,
                seam: Vec::new(),
                keep: self.longest_marker.saturating_sub(1),
                found: false,
            }),
            _ => None,
        };
        (outcome, sniffer)
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

/// Looks for challenge markers in a body's first bytes as they stream past.
pub struct Sniffer {
    ac: Arc<AhoCorasick>,
    remaining: usize,
    /// The end of the previous chunk, so a marker split across chunks is still found.
    seam: Vec<u8>,
    keep: usize,
    found: bool,
}

impl Sniffer {
    /// Inspects the next chunk; true once a marker was seen.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        if self.found || self.remaining == 0 {
            return self.found;
        }
        let chunk = &chunk[..chunk.len().min(self.remaining)];
        self.remaining -= chunk.len();
        // The seam: the end of what came before plus the start of this chunk (nothing to join
        // on the first chunk). One buffer, reused: no allocation per chunk.
        let joined = !self.seam.is_empty();
        self.seam
            .extend_from_slice(&chunk[..chunk.len().min(self.keep)]);
        if (joined && self.ac.is_match(&self.seam[..])) || self.ac.is_match(chunk) {
            self.found = true;
            return true;
        }
        // Keep the last `keep` bytes seen for the next seam.
        if chunk.len() >= self.keep {
            self.seam.clear();
            self.seam
                .extend_from_slice(&chunk[chunk.len() - self.keep..]);
        } else {
            // The seam is the old seam followed by the whole (short) chunk.
            let excess = self.seam.len().saturating_sub(self.keep);
            self.seam.drain(..excess);
        }
        false
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
        let (o, s) = r.classify_head(status, &h);
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

    #[test]
    fn sniffer_finds_markers_across_chunks_case_insensitively_within_the_limit() {
        let r = rules();
        let (_, s) = r.classify_head(StatusCode::OK, &HeaderMap::new());
        let mut s = s.unwrap();
        assert!(!s.feed(b"<html><div class=\"G-Re"));
        assert!(s.feed(b"CAPTCHA\" data-sitekey=x>"));

        let (_, s) = r.classify_head(StatusCode::OK, &HeaderMap::new());
        let mut s = s.unwrap();
        for _ in 0..100 {
            assert!(!s.feed(&[b'a'; 1000]));
        }
        assert!(s.done(), "stops after sniff_bytes");
        assert!(
            !s.feed(b"g-recaptcha"),
            "markers past the limit are not looked for"
        );

        let (_, s) = r.classify_head(StatusCode::OK, &HeaderMap::new());
        let mut s = s.unwrap();
        // One byte at a time still works.
        let page = b"xx Our systems have detected unusual traffic from your computer network";
        assert!(page.iter().any(|b| s.feed(std::slice::from_ref(b))));
    }
}
