//! The proxy-username grammar: `<account>[-<label>-<value>]…`, e.g.
//! `acct-session-<key>-pool-<p>-sesstime-<minutes>`, the only session request most
//! `HTTPS_PROXY` clients can make on a CONNECT.

use std::time::Duration;

use super::{LabelWant, SessionError, SessionKey, is_name, shown};
use super::{MAX_LIFETIME_MINUTES, MAX_POOL_NAME_LEN, MAX_SESSION_KEY_LEN, MAX_TARGETING_LEN};
use crate::upstream::labels::fold;

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
    /// The exit it asks for: the targeting tokens (`-country-us|ca`, `-cc-`, `-city-`,
    /// `-state-`, `-asn-`, `-type-`), then every other pair that reads as a label (`-zone-x`),
    /// which applies only where some member of the pool declares its key.
    pub labels: Vec<LabelWant>,
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
    let mut targeting: [Option<(&'static str, Vec<String>)>; TARGETING_KEYS.len()] =
        Default::default();
    let mut others: Vec<LabelWant> = Vec::new();
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
            // Another gateway's parameter, or a label some member of the pool may declare.
            let key = fold(label);
            let values = alternatives(value);
            if let (Some(key), Some(values)) = (key, values) {
                if !others.iter().any(|w| w.key == key) {
                    others.push(LabelWant {
                        key,
                        values,
                        named: false,
                    });
                }
            }
            continue;
        };
        match kind {
            Kind::Session => take(&mut session, label, value, session_key)?,
            Kind::Lifetime => take(&mut ttl, label, value, lifetime)?,
            Kind::Pool => take(&mut pool, label, value, pool_name)?,
            Kind::Target(i) => {
                let slot = targeting.get_mut(i).ok_or(SessionError::EmptyLabel)?;
                take(slot, label, value, alternatives)?
            }
        }
    }
    let mut labels: Vec<LabelWant> = TARGETING_KEYS
        .iter()
        .zip(targeting)
        .filter_map(|(key, slot)| {
            slot.map(|(_, values)| LabelWant {
                key: (*key).to_string(),
                values,
                named: true,
            })
        })
        .collect();
    labels.extend(others);
    Ok(UsernameLabels {
        account,
        session: session.map(|s| s.1),
        ttl: ttl.map(|t| t.1),
        pool: pool.map(|p| p.1),
        labels,
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
    /// A targeting label: its key is `TARGETING_KEYS[i]`.
    Target(usize),
}

/// The label keys every pool understands, whether or not a member declares them: a request for
/// one that no member has gets `503 no-matching-upstream`, not an exit of any kind.
pub const TARGETING_KEYS: [&str; 5] = ["country", "city", "state", "asn", "type"];

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
    // Targeting, as Bright Data, Decodo, Oxylabs and SOAX spell it.
    ("country", Kind::Target(0)),
    ("cc", Kind::Target(0)), // Oxylabs
    ("city", Kind::Target(1)),
    ("state", Kind::Target(2)),
    ("asn", Kind::Target(3)),
    ("type", Kind::Target(4)),
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
        Some(Kind::Target(_)) => format!(
            "<user>-{label}-<value>[|<value>…], each 1 to {MAX_TARGETING_LEN} characters of [A-Za-z0-9_.]"
        ),
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

/// A targeting value (`us`, `new_york`, `7922`, `residential`), or alternatives `us|ca`: names
/// without `-`, folded to lower case as labels are.
fn alternatives(value: &str) -> Option<Vec<String>> {
    value
        .split('|')
        .map(|v| {
            is_name(v, MAX_TARGETING_LEN, |c| {
                c.is_ascii_alphanumeric() || c == '_' || c == '.'
            })
            .then(|| v.to_ascii_lowercase())
        })
        .collect()
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

    /// Targeting labels: (username, account, session, labels as `key=a|b` words, other keys
    /// marked `~`) for usernames that parse, or the error variant for those that do not.
    type TargetingCase = (
        &'static str,
        Result<(&'static str, Option<&'static str>, &'static str), &'static str>,
    );

    const TARGETING: &[TargetingCase] = &[
        (
            "acct-country-us-session-a",
            Ok(("acct", Some("a"), "country=us")),
        ),
        (
            "acct-country-US-city-new_york-state-us_ny-asn-7922-type-residential",
            Ok((
                "acct",
                None,
                "country=us city=new_york state=us_ny asn=7922 type=residential",
            )),
        ),
        (
            "brd-customer-hl_1-zone-res-Country-de-session-k9-sesstime-5",
            Ok(("brd-customer-hl_1-zone-res", Some("k9"), "country=de")),
        ),
        (
            "acct-session-a-TYPE-mobile-ASN-AS7922",
            Ok(("acct", Some("a"), "asn=as7922 type=mobile")),
        ),
        (
            "acct-state-ca-zone-x-city-st.louis",
            Ok(("acct", None, "city=st.louis state=ca ~zone=x")),
        ),
        // Oxylabs' `cc`, alternatives, and pairs for other gateways (or declared keys).
        (
            "acct-cc-US-session-s1",
            Ok(("acct", Some("s1"), "country=us")),
        ),
        (
            "acct-country-us|CA-Tier-Gold|silver-x-a|",
            // `a|` holds an empty alternative: not a label, so skipped like any foreign pair.
            Ok(("acct", None, "country=us|ca ~tier=gold|silver")),
        ),
        (
            "acct-country-us-Zone-a-zone-b",
            Ok(("acct", None, "country=us ~zone=a")),
        ),
        ("acct-country-u!s", Err("InvalidValue")),
        ("acct-country-us|", Err("InvalidValue")),
        ("acct-country-|us", Err("InvalidValue")),
        ("acct-city-", Err("MissingValue")),
        ("acct-asn-1-asn-2", Err("RepeatedLabel")),
        ("acct-country-us-cc-de", Err("RepeatedLabel")),
        ("type-mobile", Err("EmptyAccount")),
    ];

    fn shown_labels(labels: &[LabelWant]) -> String {
        labels
            .iter()
            .map(|w| {
                let mark = if w.named { "" } else { "~" };
                format!("{mark}{}={}", w.key, w.values.join("|"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    #[test]
    fn targeting_labels_end_the_account_and_are_read() {
        for &(username, expect) in TARGETING {
            let got = parse_username(username);
            match (expect, &got) {
                (Ok((account, session, labels)), Ok(l)) => {
                    assert_eq!(l.account, account, "{username}");
                    assert_eq!(
                        l.session.as_ref().map(SessionKey::as_str),
                        session,
                        "{username}"
                    );
                    assert_eq!(shown_labels(&l.labels), labels, "{username}");
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
        assert_eq!(shown_labels(&l.labels), format!("city={long}"));
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
