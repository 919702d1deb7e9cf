//! `/dashboard`: one self-contained page (no external scripts, fonts or CDNs: it works offline)
//! that renders `/status` every two seconds: pool summary, upstream table with state colours, the
//! upstream × target heatmap and incidents; and `/status/history` every ten as SVG line charts
//! of the last hour (its small chart code is inline in the page).

use http::{HeaderValue, StatusCode, header};

use crate::body::Body;

const PAGE: &str = include_str!("dashboard.html");

pub fn page() -> http::Response<Body> {
    let mut r = crate::body::response(StatusCode::OK, PAGE);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // Everything the page needs is inline; forbid the rest.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'",
        ),
    );
    r
}
