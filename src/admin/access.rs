//! Who may read the admin listener: `/status`, `/metrics` and the dashboard show upstream
//! addresses, target hosts and incidents, so off loopback they need a token.
//!
//! Reads need a token when the admin listener is bound to an address that is not loopback, or
//! whenever `server.admin_read_token` is set (on any address). Either token is accepted for reads:
//! `server.admin_read_token` or the full `server.admin_token`. `/healthz` and `/readyz` stay open
//! for orchestrators' probes; actions keep their own check ([`super::actions::authorize`]).
//!
//! The token comes as `Authorization: Bearer <token>`, or as the password of
//! `Authorization: Basic` (any user name) so that a browser can open the dashboard: the `401`
//! offers both, and a browser asks for a password and sends it again on the page's own fetches.

use std::net::IpAddr;

use base64::Engine as _;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use subtle::ConstantTimeEq;

use crate::body::Body;
use crate::config::ServerConfig;

/// Whether the listener's bound address is loopback (`127.0.0.0/8`, `::1`, or an IPv4-mapped
/// loopback address). An unspecified address (`0.0.0.0`, `::`) is not: it accepts from anywhere.
pub fn is_loopback(bound: IpAddr) -> bool {
    bound.to_canonical().is_loopback()
}

/// Whether reads need a token on an admin listener bound to `bound`.
pub fn reads_need_token(bound: IpAddr, server: &ServerConfig) -> bool {
    server.admin_read_token.is_some() || !is_loopback(bound)
}

/// Checks a read of the admin listener bound to `bound`; the error is the response to send.
pub fn authorize_read(
    server: &ServerConfig,
    bound: IpAddr,
    headers: &HeaderMap,
) -> Result<(), Box<http::Response<Body>>> {
    if !reads_need_token(bound, server) {
        return Ok(());
    }
    let accepted = [
        server.admin_read_token.as_deref(),
        server.admin_token.as_deref(),
    ];
    let given = presented_token(headers);
    // Both compared, whatever the first says, so timing tells nothing about which matched.
    let mut ok = false;
    for token in accepted.into_iter().flatten() {
        ok |= given
            .as_deref()
            .is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())));
    }
    if ok {
        return Ok(());
    }
    let mut r = crate::body::typed(
        StatusCode::UNAUTHORIZED,
        "text/plain; charset=utf-8",
        "reading the admin listener needs a token: send `Authorization: Bearer <server.admin_read_token>` (or the admin token)\n",
    );
    let h = r.headers_mut();
    h.append(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"poolgate-admin\", charset=\"UTF-8\""),
    );
    h.append(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"poolgate-admin\""),
    );
    Err(Box::new(r))
}

/// The token a request presents: a Bearer token, or the password of Basic credentials.
fn presented_token(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, rest) = value.trim().split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        let text = String::from_utf8(decoded).ok()?;
        let (_user, password) = text.split_once(':')?;
        return Some(password.to_string());
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::Config;

    const READ: &str = "read-token-0123456789";
    const ADMIN: &str = "admin-token-0123456789";

    fn server(extra: &str) -> ServerConfig {
        let text = format!(
            "[server]\nadmin_token = \"{ADMIN}\"\n{extra}\n[pools.default]\nupstreams = [\"direct://\"]\n"
        );
        Config::parse(&text, "t", None).unwrap().server
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn loopback_is_told_from_every_other_bound_address() {
        for a in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip(a)), "{a}");
        }
        for a in [
            "0.0.0.0",
            "::",
            "10.0.0.5",
            "192.168.1.1",
            "2001:db8::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!is_loopback(ip(a)), "{a}");
        }
    }

    #[test]
    fn reads_need_a_token_off_loopback_or_when_a_read_token_is_set() {
        let without = server("");
        let with = server(&format!("admin_read_token = \"{READ}\""));
        // (bound address, read token set) → a token needed.
        let table = [
            ("127.0.0.1", false, false),
            ("::1", false, false),
            ("127.0.0.1", true, true),
            ("0.0.0.0", false, true),
            ("0.0.0.0", true, true),
            ("10.1.2.3", false, true),
            ("::", false, true),
        ];
        for (addr, read_token, need) in table {
            let s = if read_token { &with } else { &without };
            assert_eq!(reads_need_token(ip(addr), s), need, "{addr} {read_token}");
        }
    }

    fn headers(authorization: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = authorization {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn basic(user: &str, password: &str) -> String {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        format!("Basic {b}")
    }

    #[test]
    fn either_token_reads_as_bearer_or_basic_password_and_nothing_else_does() {
        let s = server(&format!("admin_read_token = \"{READ}\""));
        let public = ip("0.0.0.0");
        let ok = [
            format!("Bearer {READ}"),
            format!("bearer {ADMIN}"),
            basic("anyone", READ),
            basic("", ADMIN),
        ];
        for a in &ok {
            assert!(
                authorize_read(&s, public, &headers(Some(a.as_str()))).is_ok(),
                "{a}"
            );
        }
        let refused = [
            None,
            Some(format!("Bearer {READ}x")),
            Some(format!("Bearer {}", &READ[..READ.len() - 1])),
            Some("Bearer".to_string()),
            Some(format!("Token {READ}")),
            Some(basic(READ, "x")),
            Some("Basic !!!".to_string()),
        ];
        for a in &refused {
            let r = authorize_read(&s, public, &headers(a.as_deref())).unwrap_err();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{a:?}");
            let challenges: Vec<_> = r
                .headers()
                .get_all(header::WWW_AUTHENTICATE)
                .iter()
                .collect();
            assert_eq!(challenges.len(), 2, "{a:?}");
        }
        // Without a read token, the admin token alone reads off loopback; on loopback, anyone.
        let s = server("");
        assert!(authorize_read(&s, public, &headers(None)).is_err());
        assert!(authorize_read(&s, public, &headers(Some(&format!("Bearer {ADMIN}")))).is_ok());
        assert!(authorize_read(&s, ip("127.0.0.1"), &headers(None)).is_ok());
    }
}
