//! The proxy-username grammar: `<account>[-<label>-<value>]…`, e.g.
//! `acct-session-<key>-pool-<p>-sesstime-<minutes>`, the only session request most
//! `HTTPS_PROXY` clients can make on a CONNECT.

use std::time::Duration;

use super::{MAX_LIFETIME_MINUTES, MAX_POOL_NAME_LEN, MAX_SESSION_KEY_LEN, MAX_TARGETING_LEN};
use super::{SessionError, SessionKey, is_name, shown};

/// What a proxy username carries: `<account>[-<label>-<value>]…`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UsernameLabels {
    /// Everything before the first recognised label (the whole username if there is none).
    pub account: String,
    /// From `-session-`, `-sessid-` or `-sessionid-`.
    pub session: Option<SessionKey>,
    /// From `-sesstime-`, `-sessionduration-` or `-lifetime-` (minutes).
    pub ttl: Option<Duration>,
    /// From `-pool-`.
    pub pool: Option<String>,
    /// From the targeting labels (`-country-`, `-city-`, `-state-`, `-asn-`, `-type-`): read and
    /// checked, so they end the account, but not used to pick upstreams yet.
    pub targeting: Targeting,
}

/// What the targeting labels of a username ask for. Read and checked, not acted on yet: they are
/// recognised so that `acct-country-us-session-a` logs in as `acct`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Targeting {
    /// From `-country-`.
    pub country: Option<String>,
    /// From `-city-`.
    pub city: Option<String>,
    /// From `-state-`.
    pub state: Option<String>,
    /// From `-asn-`.
    pub asn: Option<String>,
    /// From `-type-` (residential, mobile, datacenter…).
    pub kind: Option<String>,
}

/// Reads the labels of a proxy username: `<account>[-<label>-<value>]…`.
///
/// The account is everything before the first recognised label, so accounts of other gateways
/// (`brd-customer-hl_1-zone-res`) pass through whole, and targeting labels (`-country-us`) end the
/// account like the session ones do. From there on the username is read as label/value pairs;
/// labels match case-insensitively, values are case-sensitive, and pairs with unrecognised labels
/// (`-zone-x`) are skipped, being meant for some other gateway. A username without any recognised
/// label is all account, even an empty one.
pub fn parse_username(username: &str) -> Result<UsernameLabels, SessionError> {
    let tokens: Vec<&str> = username.split('-').collect();
    let Some(start) = tokens.iter().position(|t| recognise(t).is_some()) else {
        return Ok(UsernameLabels {
            account: username.to_owned(),
            ..UsernameLabels::default()
        });
    };
    let account = tokens.get(..start).unwrap_or_default().join("-");
    if account.is_empty() {
        let label = tokens
            .get(start)
            .and_then(|t| recognise(t))
            .map_or("session", |l| l.0);
        return Err(SessionError::EmptyAccount { label });
    }

    let mut session = None;
    let mut ttl = None;
    let mut pool = None;
    let mut country = None;
    let mut city = None;
    let mut state = None;
    let mut asn = None;
    let mut kind_of_ip = None;
    for pair in tokens.get(start..).unwrap_or_default().chunks(2) {
        let (label, value) = match *pair {
            [label, value] => (label, value),
            [label] => {
                return Err(match recognise(label) {
                    Some((label, _)) => SessionError::MissingValue { label },
                    None if label.is_empty() => SessionError::EmptyLabel,
                    None => SessionError::DanglingLabel {
                        label: shown(label),
                    },
                });
            }
            _ => continue,
        };
        if label.is_empty() {
            return Err(SessionError::EmptyLabel);
        }
        let Some((label, kind)) = recognise(label) else {
            continue;
        };
        match kind {
            Kind::Session => take(&mut session, label, value, session_key)?,
            Kind::Lifetime => take(&mut ttl, label, value, lifetime)?,
            Kind::Pool => take(&mut pool, label, value, pool_name)?,
            Kind::Country => take(&mut country, label, value, targeting_value)?,
            Kind::City => take(&mut city, label, value, targeting_value)?,
            Kind::State => take(&mut state, label, value, targeting_value)?,
            Kind::Asn => take(&mut asn, label, value, targeting_value)?,
            Kind::Type => take(&mut kind_of_ip, label, value, targeting_value)?,
        }
    }
    Ok(UsernameLabels {
        account,
        session: session.map(|s| s.1),
        ttl: ttl.map(|t| t.1),
        pool: pool.map(|p| p.1),
        targeting: Targeting {
            country: country.map(|v| v.1),
            city: city.map(|v| v.1),
            state: state.map(|v| v.1),
            asn: asn.map(|v| v.1),
            kind: kind_of_ip.map(|v| v.1),
        },
    })
}

/// Fills `slot` with `value` read by `read`, remembering the label's spelling: each thing may be
/// set once, by any of its spellings, and the error for a second one names both.
fn take<T>(
    slot: &mut Option<(&'static str, T)>,
    label: &'static str,
    value: &str,
    read: fn(&str) -> Option<T>,
) -> Result<(), SessionError> {
    if let Some((first, _)) = *slot {
        return Err(SessionError::RepeatedLabel { first, label });
    }
    if value.is_empty() {
        return Err(SessionError::MissingValue { label });
    }
    let read = read(value).ok_or_else(|| SessionError::InvalidValue {
        label,
        value: shown(value),
    })?;
    *slot = Some((label, read));
    Ok(())
}

/// What a username label sets. Each has one arm in `parse_username`'s match, which picks the slot
/// and the value's reader, and one in `label_form`; all else about a label is its `LABELS` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Session,
    Lifetime,
    Pool,
    Country,
    City,
    State,
    Asn,
    Type,
}

/// Recognised username labels, lower-case, with the gateway habit each comes from. Another
/// spelling of something already read is one row here.
const LABELS: &[(&str, Kind)] = &[
    ("session", Kind::Session),          // Bright Data, Decodo, Geonode
    ("sessid", Kind::Session),           // Oxylabs
    ("sessionid", Kind::Session),        // SOAX
    ("sesstime", Kind::Lifetime),        // Oxylabs
    ("sessionduration", Kind::Lifetime), // Decodo
    ("lifetime", Kind::Lifetime),        // generic
    ("pool", Kind::Pool),
    // Targeting, as Bright Data, Decodo, Oxylabs and SOAX spell it: read, not used yet.
    ("country", Kind::Country),
    ("city", Kind::City),
    ("state", Kind::State),
    ("asn", Kind::Asn),
    ("type", Kind::Type),
];

fn recognise(token: &str) -> Option<(&'static str, Kind)> {
    LABELS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(token))
        .copied()
}

/// The expected form of a recognised label, for error messages.
pub(super) fn label_form(label: &str) -> String {
    match recognise(label).map(|l| l.1) {
        Some(Kind::Lifetime) => {
            format!("<user>-{label}-<minutes>, minutes from 1 to {MAX_LIFETIME_MINUTES}")
        }
        Some(Kind::Pool) => {
            format!("<user>-{label}-<name>, 1 to {MAX_POOL_NAME_LEN} characters of [A-Za-z0-9_]")
        }
        Some(Kind::Country | Kind::City | Kind::State | Kind::Asn | Kind::Type) => {
            format!("<user>-{label}-<value>, 1 to {MAX_TARGETING_LEN} characters of [A-Za-z0-9_.]")
        }
        Some(Kind::Session) | None => {
            format!("<user>-{label}-<key>, 1 to {MAX_SESSION_KEY_LEN} characters of [A-Za-z0-9_.]")
        }
    }
}

/// Lifetime in minutes: plain digits (no sign), 1 to [`MAX_LIFETIME_MINUTES`].
fn lifetime(value: &str) -> Option<Duration> {
    if value.is_empty() || value.len() > 4 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let minutes: u64 = value.parse().ok()?;
    (1..=MAX_LIFETIME_MINUTES)
        .contains(&minutes)
        .then(|| Duration::from_secs(minutes * 60))
}

/// Username keys cannot hold `-`, the label delimiter.
fn session_key(value: &str) -> Option<SessionKey> {
    is_name(value, MAX_SESSION_KEY_LEN, |c| {
        c.is_ascii_alphanumeric() || c == '_' || c == '.'
    })
    .then(|| SessionKey(value.to_owned()))
}

/// A targeting value (`us`, `new_york`, `7922`, `residential`): a name without `-`, kept as given.
fn targeting_value(value: &str) -> Option<String> {
    is_name(value, MAX_TARGETING_LEN, |c| {
        c.is_ascii_alphanumeric() || c == '_' || c == '.'
    })
    .then(|| value.to_owned())
}

/// Username pool names cannot hold `-` either, unlike `X-Pool-Name`.
fn pool_name(value: &str) -> Option<String> {
    is_name(value, MAX_POOL_NAME_LEN, |c| {
        c.is_ascii_alphanumeric() || c == '_'
    })
    .then(|| value.to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(super) mod tests {
    use super::*;
    use crate::session::tests::variant;
    use http::HeaderValue;

    /// What a username should yield.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Labels {
        account: &'static str,
        session: Option<&'static str>,
        ttl_min: Option<u64>,
        pool: Option<&'static str>,
    }

    const fn acct(account: &'static str) -> Labels {
        Labels {
            account,
            session: None,
            ttl_min: None,
            pool: None,
        }
    }

    impl Labels {
        const fn key(self, key: &'static str) -> Self {
            Labels {
                session: Some(key),
                ..self
            }
        }
        const fn ttl(self, minutes: u64) -> Self {
            Labels {
                ttl_min: Some(minutes),
                ..self
            }
        }
        const fn pool(self, pool: &'static str) -> Self {
            Labels {
                pool: Some(pool),
                ..self
            }
        }
    }

    /// `Ok` with what is expected, or `Err` with the name of the `SessionError` variant.
    pub(crate) type Expect = Result<Labels, &'static str>;

    pub(crate) const CASES: &[(&str, Expect)] = &[
        // No recognised label: all account.
        ("plainuser", Ok(acct("plainuser"))),
        ("", Ok(acct(""))),
        ("a-b-c", Ok(acct("a-b-c"))),
        ("u-zone-x-region-y", Ok(acct("u-zone-x-region-y"))),
        ("u-sessions-x", Ok(acct("u-sessions-x"))),
        ("u-countries-us", Ok(acct("u-countries-us"))),
        // The three session labels.
        ("user-session-abc", Ok(acct("user").key("abc"))),
        ("u-sessid-x1", Ok(acct("u").key("x1"))),
        ("u-sessionid-zz", Ok(acct("u").key("zz"))),
        // Accounts of other gateways pass through whole.
        (
            "brd-customer-hl_1-zone-res-session-k9",
            Ok(acct("brd-customer-hl_1-zone-res").key("k9")),
        ),
        // Targeting labels end the account too (their values: `TARGETING`).
        ("u-country-us-session-a", Ok(acct("u").key("a"))),
        ("u-country-us-zone-x", Ok(acct("u"))),
        ("u-zone-x-type-mobile", Ok(acct("u-zone-x"))),
        // Lifetimes, in minutes.
        (
            "customer-acme-sessid-x1-sesstime-10",
            Ok(acct("customer-acme").key("x1").ttl(10)),
        ),
        (
            "u-sessionid-zz-sessionduration-30",
            Ok(acct("u").key("zz").ttl(30)),
        ),
        ("u-session-a-lifetime-1", Ok(acct("u").key("a").ttl(1))),
        (
            "u-session-a-lifetime-1440",
            Ok(acct("u").key("a").ttl(1440)),
        ),
        ("u-session-a-lifetime-0010", Ok(acct("u").key("a").ttl(10))),
        ("u-sesstime-5", Ok(acct("u").ttl(5))),
        // Pool.
        ("u-pool-eu-session-s1", Ok(acct("u").key("s1").pool("eu"))),
        ("u-pool-eu_west_1", Ok(acct("u").pool("eu_west_1"))),
        // Labels case-insensitive, values case-sensitive.
        ("u-SESSION-AbC", Ok(acct("u").key("AbC"))),
        ("U-Sessid-x-SessTime-5", Ok(acct("U").key("x").ttl(5))),
        ("u-PoOl-EU", Ok(acct("u").pool("EU"))),
        // Unrecognised pairs after the first label are skipped, repeated or empty.
        ("u-session-a-country-us-zone-x", Ok(acct("u").key("a"))),
        ("u-session-a-zone-x-zone-y", Ok(acct("u").key("a"))),
        ("u-session-a-zone-", Ok(acct("u").key("a"))),
        // Username key grammar: [A-Za-z0-9_.].
        ("u-session-a.b_C9", Ok(acct("u").key("a.b_C9"))),
        ("u-session-a!b", Err("InvalidValue")),
        ("u-session-a~b", Err("InvalidValue")),
        ("u-session-ключ", Err("InvalidValue")),
        // Missing values.
        ("u-session-", Err("MissingValue")),
        ("u-session", Err("MissingValue")),
        ("u-session--country-us", Err("MissingValue")),
        ("u-session-a-sesstime", Err("MissingValue")),
        ("u-pool-", Err("MissingValue")),
        ("u-session-a-country-", Err("MissingValue")),
        ("u-session-a-country", Err("MissingValue")),
        ("u-type", Err("MissingValue")),
        // Invalid lifetimes.
        ("u-sesstime-abc", Err("InvalidValue")),
        ("u-session-a-sesstime-0", Err("InvalidValue")),
        ("u-session-a-sesstime-1441", Err("InvalidValue")),
        ("u-session-a-sesstime-+5", Err("InvalidValue")),
        ("u-session-a-sesstime-1.5", Err("InvalidValue")),
        (
            "u-session-a-sesstime-99999999999999999999999",
            Err("InvalidValue"),
        ),
        // Invalid pool names; `-` is the delimiter, so `eu-west` reads as pool `eu`, then `west`.
        ("u-pool-e.u", Err("InvalidValue")),
        ("u-pool-eu-west", Err("DanglingLabel")),
        // Dangling and empty labels.
        ("u-session-a-zone", Err("DanglingLabel")),
        ("u-session-a-", Err("EmptyLabel")),
        ("u-session-a--x", Err("EmptyLabel")),
        // Given twice, by the same or another spelling.
        ("u-session-a-session-b", Err("RepeatedLabel")),
        ("u-session-a-sessid-b", Err("RepeatedLabel")),
        ("u-session-a-session-a", Err("RepeatedLabel")),
        ("u-sesstime-1-lifetime-2", Err("RepeatedLabel")),
        ("u-pool-a-pool-b", Err("RepeatedLabel")),
        ("u-session-a-session-", Err("RepeatedLabel")),
        ("u-country-us-country-de", Err("RepeatedLabel")),
        ("u-session-a-CITY-x-city-y", Err("RepeatedLabel")),
        // Empty account.
        ("session-abc", Err("EmptyAccount")),
        ("-session-abc", Err("EmptyAccount")),
        ("pool", Err("EmptyAccount")),
        ("country-us-session-a", Err("EmptyAccount")),
        ("-asn-7922", Err("EmptyAccount")),
    ];
    #[test]
    fn username_grammar() {
        for &(username, expect) in CASES {
            let got = parse_username(username);
            match (expect, &got) {
                (Ok(want), Ok(l)) => {
                    assert_eq!(l.account, want.account, "{username}");
                    assert_eq!(
                        l.session.as_ref().map(SessionKey::as_str),
                        want.session,
                        "{username}"
                    );
                    assert_eq!(
                        l.ttl,
                        want.ttl_min.map(|m| Duration::from_secs(m * 60)),
                        "{username}"
                    );
                    assert_eq!(l.pool.as_deref(), want.pool, "{username}");
                }
                (Err(name), Err(e)) => {
                    assert_eq!(variant(e), name, "{username}: {e}");
                    assert!(e.is_proxy_auth(), "{username}: {e}");
                }
                _ => panic!("{username}: expected {expect:?}, got {got:?}"),
            }
        }
    }

    /// Targeting labels: (username, account, session, [country, city, state, asn, type]) for
    /// usernames that parse, or the error variant for those that do not.
    type TargetingCase = (
        &'static str,
        Result<
            (
                &'static str,
                Option<&'static str>,
                [Option<&'static str>; 5],
            ),
            &'static str,
        >,
    );

    const TARGETING: &[TargetingCase] = &[
        (
            "acct-country-us-session-a",
            Ok(("acct", Some("a"), [Some("us"), None, None, None, None])),
        ),
        (
            "acct-country-US-city-new_york-state-us_ny-asn-7922-type-residential",
            Ok((
                "acct",
                None,
                [
                    Some("US"),
                    Some("new_york"),
                    Some("us_ny"),
                    Some("7922"),
                    Some("residential"),
                ],
            )),
        ),
        (
            "brd-customer-hl_1-zone-res-Country-de-session-k9-sesstime-5",
            Ok((
                "brd-customer-hl_1-zone-res",
                Some("k9"),
                [Some("de"), None, None, None, None],
            )),
        ),
        (
            "acct-session-a-TYPE-mobile-ASN-AS7922",
            Ok((
                "acct",
                Some("a"),
                [None, None, None, Some("AS7922"), Some("mobile")],
            )),
        ),
        (
            "acct-state-ca-zone-x-city-st.louis",
            Ok((
                "acct",
                None,
                [None, Some("st.louis"), Some("ca"), None, None],
            )),
        ),
        ("acct-country-u!s", Err("InvalidValue")),
        ("acct-city-", Err("MissingValue")),
        ("acct-asn-1-asn-2", Err("RepeatedLabel")),
        ("type-mobile", Err("EmptyAccount")),
    ];

    #[test]
    fn targeting_labels_end_the_account_and_are_read() {
        for &(username, expect) in TARGETING {
            let got = parse_username(username);
            match (expect, &got) {
                (Ok((account, session, [country, city, state, asn, kind])), Ok(l)) => {
                    assert_eq!(l.account, account, "{username}");
                    assert_eq!(
                        l.session.as_ref().map(SessionKey::as_str),
                        session,
                        "{username}"
                    );
                    let t = &l.targeting;
                    assert_eq!(t.country.as_deref(), country, "{username}");
                    assert_eq!(t.city.as_deref(), city, "{username}");
                    assert_eq!(t.state.as_deref(), state, "{username}");
                    assert_eq!(t.asn.as_deref(), asn, "{username}");
                    assert_eq!(t.kind.as_deref(), kind, "{username}");
                }
                (Err(name), Err(e)) => {
                    assert_eq!(variant(e), name, "{username}: {e}");
                    assert!(e.to_string().contains('<'), "{username}: {e}");
                }
                _ => panic!("{username}: expected {expect:?}, got {got:?}"),
            }
        }
        let long = "x".repeat(MAX_TARGETING_LEN);
        let l = parse_username(&format!("u-city-{long}")).unwrap();
        assert_eq!(l.targeting.city.as_deref(), Some(long.as_str()));
        assert!(parse_username(&format!("u-city-{long}x")).is_err());
    }

    #[test]
    fn username_value_lengths() {
        let max = "k".repeat(MAX_SESSION_KEY_LEN);
        let l = parse_username(&format!("u-session-{max}")).unwrap();
        assert_eq!(l.session.unwrap().as_str(), max);
        let e = parse_username(&format!("u-session-{max}k")).unwrap_err();
        assert_eq!(variant(&e), "InvalidValue");
        assert!(
            e.to_string().contains("k..."),
            "the echoed value is cut short: {e}"
        );

        let pool = "p".repeat(MAX_POOL_NAME_LEN);
        assert_eq!(
            parse_username(&format!("u-pool-{pool}")).unwrap().pool,
            Some(pool.clone())
        );
        assert!(parse_username(&format!("u-pool-{pool}p")).is_err());
    }
    #[test]
    fn echoed_values_are_header_safe() {
        let e = parse_username("u-session-a\"b\\c`d\u{7f}é")
            .unwrap_err()
            .to_string();
        assert!(HeaderValue::from_str(&e).is_ok(), "{e}");
        assert!(!e.contains('"') && !e.contains('\\'), "{e}");
    }
}
