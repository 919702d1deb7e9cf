//! The header grammar: `X-Pool-Session` and its aliases, `X-Pool-Name`, and the Basic credentials
//! of `Proxy-Authorization`, whose username carries the labels `username` reads.

use base64::Engine as _;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use http::header::PROXY_AUTHORIZATION;
use http::{HeaderMap, HeaderName};

use super::username::TARGETING_KEYS;
use super::{HEADER_KEY_FORM, LabelWant, MAX_POOL_NAME_LEN, SessionError, SessionKey};
use super::{is_header_key, is_name, shown};
use crate::upstream::labels::fold;

/// Headers the gateway reads and must strip before forwarding (lower-case): x-pool-session,
/// x-pool-name, x-lpm-session, zyte-session-id, x-crawlera-session. (`X-Pool-*` in general is
/// stripped elsewhere by prefix; the aliases are listed because they match no prefix.)
pub const SESSION_HEADERS: &[&str] = &[
    "x-pool-session",
    "x-pool-name",
    "x-lpm-session",
    "zyte-session-id",
    "x-crawlera-session",
    "x-pool-labels",
];

/// Session headers in priority order, each with whether its value `create` asks for a minted key
/// (only where the original gateway gives `create` that meaning) and the form it expects.
static KEY_HEADERS: [(HeaderName, bool, &str); 4] = [
    (
        HeaderName::from_static("x-pool-session"),
        true,
        CREATE_OR_KEY_FORM,
    ),
    (
        HeaderName::from_static("x-lpm-session"),
        false,
        HEADER_KEY_FORM,
    ),
    (
        HeaderName::from_static("zyte-session-id"),
        false,
        HEADER_KEY_FORM,
    ),
    (
        HeaderName::from_static("x-crawlera-session"),
        true,
        CREATE_OR_KEY_FORM,
    ),
];

static POOL_HEADER: HeaderName = HeaderName::from_static("x-pool-name");
static LABELS_HEADER: HeaderName = HeaderName::from_static("x-pool-labels");

const CREATE_OR_KEY_FORM: &str = "`create` or <key>, 1 to 128 characters of [A-Za-z0-9._~:@+=-]";
const POOL_HEADER_FORM: &str = "<name>, 1 to 64 characters of [A-Za-z0-9_-]";
const LABELS_FORM: &str =
    "<key>=<value>[|<value>…], … with keys and values of 1 to 64 characters of [a-z0-9_.-]";
pub(super) const BASIC_FORM: &str = "Basic <base64 of user:password>";

/// What the winning session header asked for.
pub(super) enum HeaderSession {
    Create,
    Key(SessionKey),
}

/// The one value of header `name`, trimmed of optional whitespace; an error if it is repeated or
/// not visible ASCII.
fn single<'h>(
    headers: &'h HeaderMap,
    header: &'static HeaderName,
    expected: &'static str,
) -> Result<Option<&'h str>, SessionError> {
    let name = header.as_str();
    let mut values = headers.get_all(header).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(SessionError::HeaderRepeated {
            header: name,
            expected,
        });
    }
    let text = value.to_str().map_err(|_| SessionError::HeaderNotText {
        header: name,
        expected,
    })?;
    Ok(Some(text.trim_matches([' ', '\t'])))
}

/// The first session header present, in priority order.
pub(super) fn header_session(headers: &HeaderMap) -> Result<Option<HeaderSession>, SessionError> {
    for (header, create, expected) in &KEY_HEADERS {
        let (name, create, expected) = (header.as_str(), *create, *expected);
        let Some(value) = single(headers, header, expected)? else {
            continue;
        };
        if create && value.eq_ignore_ascii_case("create") {
            return Ok(Some(HeaderSession::Create));
        }
        if !is_header_key(value) {
            return Err(SessionError::InvalidHeader {
                header: name,
                value: shown(value),
                expected,
            });
        }
        return Ok(Some(HeaderSession::Key(SessionKey(value.to_owned()))));
    }
    Ok(None)
}

pub(super) fn header_pool(headers: &HeaderMap) -> Result<Option<String>, SessionError> {
    let Some(value) = single(headers, &POOL_HEADER, POOL_HEADER_FORM)? else {
        return Ok(None);
    };
    if is_name(value, MAX_POOL_NAME_LEN, |c| {
        c.is_ascii_alphanumeric() || c == '_' || c == '-'
    }) {
        Ok(Some(value.to_owned()))
    } else {
        Err(SessionError::InvalidHeader {
            header: POOL_HEADER.as_str(),
            value: shown(value),
            expected: POOL_HEADER_FORM,
        })
    }
}

/// Standard base64 that also accepts missing padding, which some clients leave off.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// `(username, password)` from `Proxy-Authorization: Basic …`; `None` when the header is absent or
/// uses another scheme (not ours to read). The header value is never put in an error: it is the
/// credentials.
pub(super) fn basic_credentials(
    headers: &HeaderMap,
) -> Result<Option<(String, String)>, SessionError> {
    let bad = |reason| SessionError::InvalidProxyAuthorization { reason };
    let mut values = headers.get_all(PROXY_AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(bad("given more than once"));
    }
    let text = value.to_str().map_err(|_| bad("not ASCII text"))?.trim();
    let (scheme, token) = text.split_once(' ').unwrap_or((text, ""));
    if !scheme.eq_ignore_ascii_case("basic") {
        return Ok(None);
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(bad("no credentials after `Basic`"));
    }
    let bytes = BASE64
        .decode(token)
        .map_err(|_| bad("credentials are not valid base64"))?;
    let decoded = String::from_utf8(bytes).map_err(|_| bad("credentials are not UTF-8"))?;
    let (user, password) = decoded
        .split_once(':')
        .ok_or_else(|| bad("credentials have no `:` between user and password"))?;
    Ok(Some((user.to_owned(), password.to_owned())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::session::tests::{headers, variant};
    use crate::session::{MAX_SESSION_KEY_LEN, parse};

    #[test]
    fn header_value_lengths() {
        let max = "k".repeat(MAX_SESSION_KEY_LEN);
        let got = parse(&headers(format!("x-pool-session: {max}").as_bytes())).unwrap();
        assert_eq!(got.session.unwrap().as_str(), max);
        let e = parse(&headers(format!("x-pool-session: {max}k").as_bytes())).unwrap_err();
        assert_eq!(variant(&e), "InvalidHeader");

        let name = "p".repeat(MAX_POOL_NAME_LEN);
        let got = parse(&headers(format!("x-pool-name: {name}").as_bytes())).unwrap();
        assert_eq!(got.pool, Some(name.clone()));
        assert!(parse(&headers(format!("x-pool-name: {name}p").as_bytes())).is_err());
    }

    #[test]
    fn session_headers_cover_every_header_read() {
        for h in SESSION_HEADERS {
            assert_eq!(*h, h.to_ascii_lowercase());
        }
        for (name, _, _) in &KEY_HEADERS {
            assert!(SESSION_HEADERS.contains(&name.as_str()), "{name}");
        }
        assert!(SESSION_HEADERS.contains(&POOL_HEADER.as_str()));
    }
}

/// `X-Pool-Labels: country=us|ca, type=residential`: the exit asked for. `cc` is `country`, as
/// in usernames. Strict like the session headers: a malformed or repeated pair is a 400.
pub(super) fn header_labels(headers: &HeaderMap) -> Result<Option<Vec<LabelWant>>, SessionError> {
    let Some(text) = single(headers, &LABELS_HEADER, LABELS_FORM)? else {
        return Ok(None);
    };
    let invalid = || SessionError::InvalidHeader {
        header: "x-pool-labels",
        value: shown(text),
        expected: LABELS_FORM,
    };
    let mut out: Vec<LabelWant> = Vec::new();
    for pair in text.split(',').map(str::trim) {
        let (k, v) = pair.split_once('=').ok_or_else(invalid)?;
        let mut key = fold(k.trim()).ok_or_else(invalid)?;
        if key == "cc" {
            key = String::from("country");
        }
        let values = v
            .trim()
            .split('|')
            .map(fold)
            .collect::<Option<Vec<String>>>()
            .ok_or_else(invalid)?;
        if out.iter().any(|w| w.key == key) {
            return Err(invalid());
        }
        let named = TARGETING_KEYS.contains(&key.as_str());
        out.push(LabelWant { key, values, named });
    }
    Ok(Some(out))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod label_tests {
    use super::*;

    /// (key, values joined by `|`, named) for each label asked for.
    type Read = Vec<(String, String, bool)>;

    fn labels(values: &[&str]) -> Result<Option<Read>, SessionError> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&LABELS_HEADER, http::HeaderValue::from_str(v).unwrap());
        }
        header_labels(&h).map(|o| {
            o.map(|ws| {
                ws.into_iter()
                    .map(|w| (w.key, w.values.join("|"), w.named))
                    .collect()
            })
        })
    }

    #[test]
    fn the_labels_header_is_key_value_pairs_with_alternatives() {
        assert_eq!(labels(&[]).unwrap(), None);
        let got = labels(&["country=US|ca, Type=residential ,cc2=x-y"])
            .unwrap()
            .unwrap();
        assert_eq!(
            got,
            [
                ("country".into(), "us|ca".into(), true),
                ("type".into(), "residential".into(), true),
                ("cc2".into(), "x-y".into(), false),
            ]
        );
        assert_eq!(
            labels(&["cc=de"]).unwrap().unwrap(),
            [("country".into(), "de".into(), true)]
        );
        for bad in [
            "",
            "country",
            "country=",
            "country=us|",
            "=us",
            "country=us,",
            "country=us, country=de",
            "cc=us, country=de",
            "country=u s",
            "country=us;type=x",
        ] {
            let e = labels(&[bad]).unwrap_err();
            assert!(!e.is_proxy_auth(), "{bad}: a header error is a 400");
            assert!(e.to_string().contains("x-pool-labels"), "{bad}: {e}");
        }
        assert!(matches!(
            labels(&["country=us", "type=x"]),
            Err(SessionError::HeaderRepeated { .. })
        ));
    }
}
