//! `[captcha]`: what makes a response a captcha or challenge page.

use super::file::FileCaptcha;
use super::validate::Validator;

/// What makes a response a captcha or challenge page.
#[derive(Clone, Debug)]
pub struct CaptchaConfig {
    /// How much of a response body is inspected while it streams on.
    pub sniff_bytes: usize,
    /// Case-insensitive substrings of challenge pages.
    pub markers: Vec<String>,
    /// `name: value` pairs (value compared case-insensitively) that mark a challenge.
    pub challenge_headers: Vec<(http::HeaderName, String)>,
}

pub const DEFAULT_SNIFF_BYTES: usize = 32 * 1024;
pub const MAX_SNIFF_BYTES: usize = 1024 * 1024;

/// Markers of the challenge pages scrapers meet most: reCAPTCHA, hCaptcha, Cloudflare, Google's
/// "unusual traffic", DataDome, PerimeterX, Imperva.
pub const DEFAULT_CAPTCHA_MARKERS: &[&str] = &[
    "g-recaptcha",
    "recaptcha/api.js",
    "h-captcha",
    "hcaptcha.com/1/api.js",
    "challenges.cloudflare.com",
    "/cdn-cgi/challenge-platform",
    "cf-chl-",
    "attention required! | cloudflare",
    "our systems have detected unusual traffic",
    "unusual traffic from your computer network",
    "captcha-delivery.com",
    "px-captcha",
    "_incapsula_resource",
];

impl Default for CaptchaConfig {
    fn default() -> Self {
        CaptchaConfig {
            sniff_bytes: DEFAULT_SNIFF_BYTES,
            markers: DEFAULT_CAPTCHA_MARKERS
                .iter()
                .map(|m| m.to_string())
                .collect(),
            challenge_headers: vec![(
                http::HeaderName::from_static("cf-mitigated"),
                "challenge".to_string(),
            )],
        }
    }
}

impl Validator {
    pub(super) fn captcha(&mut self, f: FileCaptcha) -> CaptchaConfig {
        let d = CaptchaConfig::default();
        let sniff_bytes = f.sniff_bytes.unwrap_or(d.sniff_bytes);
        if sniff_bytes > MAX_SNIFF_BYTES {
            self.problem(
                "captcha.sniff_bytes",
                format!("must be at most {MAX_SNIFF_BYTES}"),
            );
        }
        let mut markers: Vec<String> = f.markers.unwrap_or(d.markers);
        markers.extend(f.extra_markers.unwrap_or_default());
        if markers.iter().any(|m| m.trim().is_empty()) {
            self.problem("captcha.markers", "markers must not be empty strings");
        }
        let challenge_headers = match f.challenge_headers {
            None => d.challenge_headers,
            Some(list) => list
                .iter()
                .enumerate()
                .filter_map(|(i, h)| {
                    let parsed = h.split_once(':').and_then(|(n, v)| {
                        Some((
                            http::HeaderName::from_bytes(n.trim().as_bytes()).ok()?,
                            v.trim().to_string(),
                        ))
                    });
                    if parsed.is_none() {
                        self.problem(
                            &format!("captcha.challenge_headers[{i}]"),
                            "expected \"name: value\"",
                        );
                    }
                    parsed
                })
                .collect(),
        };
        CaptchaConfig {
            sniff_bytes,
            markers: markers
                .into_iter()
                .map(|m| m.to_ascii_lowercase())
                .collect(),
            challenge_headers,
        }
    }
}
