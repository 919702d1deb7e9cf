//! What a request asks of the gateway before any upstream is chosen: the session to stick to (or
//! a request to mint one), the pool, the session's lifetime, and the proxy credentials.
//!
//! Two sources, because clients differ: headers (`X-Pool-Session`, `X-Pool-Name`, and the aliases
//! of commercial gateways) and labels in the proxy username (`user-session-abc`), which is the only
//! thing most `HTTPS_PROXY` clients can set on a CONNECT.
//!
//! Parsing is strict on purpose: a session that was asked for but cannot be read is an error
//! (400 for a header, 407 for the username), never a silent fall back to non-sticky routing, which
//! would move a client's "sticky" traffic across IPs without telling it.
//!
//! Everything here is pure: no I/O, no configuration. Whether the pool exists or the credentials
//! log in is decided later.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::header::PROXY_AUTHORIZATION;
use http::{HeaderMap, HeaderName};

mod header;
mod username;

pub use header::SESSION_HEADERS;
use header::{BASIC_FORM, HeaderSession, basic_credentials, header_pool, header_session};
use username::label_form;
pub use username::{UsernameLabels, parse_username};

/// Longest session key accepted, from a header or a username.
pub const MAX_SESSION_KEY_LEN: usize = 128;
/// Longest pool name accepted.
pub const MAX_POOL_NAME_LEN: usize = 64;
/// Longest session lifetime a username may ask for, in minutes (one day).
pub const MAX_LIFETIME_MINUTES: u64 = 1440;

/// A [`SessionKey`]'s form, for the messages of both grammars.
const HEADER_KEY_FORM: &str = "<key>, 1 to 128 characters of [A-Za-z0-9._~:@+=-]";

/// What a request asked for, read from its headers and its proxy username.
///
/// A header wins over the username when both say something: `X-Pool-Session` (or an alias) over
/// a username session, `X-Pool-Name` over `-pool-`. Headers are the explicit, per-request choice;
/// the username is often a fixed proxy URL shared by a whole program.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SessionRequest {
    /// The session to stick to, if any. `None` when `create` is set: the key is minted later.
    pub session: Option<SessionKey>,
    /// `X-Pool-Session: create` (or `X-Crawlera-Session: create`): mint a key and return it.
    pub create: bool,
    /// Pool asked for by `X-Pool-Name` or a `-pool-<name>` username token.
    pub pool: Option<String>,
    /// Session lifetime asked for by a username lifetime token.
    pub ttl: Option<Duration>,
    /// The account part of the proxy username (before the first recognised token), if a Basic
    /// username was given; used later for client auth.
    pub user: Option<String>,
    /// The proxy password, if Basic credentials were given; used later for client auth.
    pub password: Option<String>,
}

/// Hand-written so that logging a request can never print its password.
impl fmt::Debug for SessionRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionRequest")
            .field("session", &self.session)
            .field("create", &self.create)
            .field("pool", &self.pool)
            .field("ttl", &self.ttl)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// A validated session key: 1..=128 characters of `[A-Za-z0-9._~:@+=-]`, so it is safe in a
/// response header, a store key and a log line as is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(String);

impl SessionKey {
    /// Validates `key` with the header grammar (the widest one; username keys are a subset).
    pub fn new(key: &str) -> Result<Self, SessionError> {
        if is_header_key(key) {
            Ok(SessionKey(key.to_owned()))
        } else {
            Err(SessionError::InvalidKey { value: shown(key) })
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SessionKey {
    type Err = SessionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionKey::new(s)
    }
}

impl fmt::Display for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SessionKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Why a request's session headers or proxy username could not be read. Each message says what
/// was wrong and the expected form; none contains the proxy password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A header's bytes are not visible ASCII.
    #[error("header `{header}` is not valid text: expected `{header}: {expected}`")]
    HeaderNotText {
        header: &'static str,
        expected: &'static str,
    },
    /// A header the gateway reads appears more than once, so which one was meant is unknown.
    #[error("header `{header}` is given more than once: expected one `{header}: {expected}`")]
    HeaderRepeated {
        header: &'static str,
        expected: &'static str,
    },
    /// A session or pool header whose value breaks its grammar.
    #[error("header `{header}` has invalid value `{value}`: expected `{header}: {expected}`")]
    InvalidHeader {
        header: &'static str,
        value: String,
        expected: &'static str,
    },
    /// A string that is not a session key (from [`SessionKey::new`]).
    #[error("invalid session key `{value}`: expected {HEADER_KEY_FORM}")]
    InvalidKey { value: String },
    /// `Proxy-Authorization: Basic …` that does not decode to `user:password`.
    #[error("invalid Proxy-Authorization ({reason}): expected `Proxy-Authorization: {BASIC_FORM}`")]
    InvalidProxyAuthorization { reason: &'static str },
    /// The username starts with a recognised label, so it has no account.
    #[error("proxy username has no account before `-{label}-`: expected <account>-{label}-<value>")]
    EmptyAccount { label: &'static str },
    /// A doubled or trailing `-` after the first recognised label.
    #[error(
        "proxy username has an empty label (a doubled or trailing `-`): expected <account>-<label>-<value>"
    )]
    EmptyLabel,
    /// A recognised label with nothing after it.
    #[error("username token `-{label}-` needs a value: {}", label_form(.label))]
    MissingValue { label: &'static str },
    /// A recognised label whose value breaks its grammar.
    #[error("username token `-{label}-` has invalid value `{value}`: expected {}", label_form(.label))]
    InvalidValue { label: &'static str, value: String },
    /// An unrecognised label with no value after it: the pairs are out of step.
    #[error(
        "username token `-{label}` has no value: expected <user>-{label}-<value> (labels come in pairs)"
    )]
    DanglingLabel { label: String },
    /// Two labels that set the same thing (`-session-a-sessid-b`).
    #[error("proxy username sets the same thing twice (`-{first}-` and `-{label}-`): expected one, e.g. {}", label_form(.first))]
    RepeatedLabel {
        first: &'static str,
        label: &'static str,
    },
    /// A lifetime with no session to apply to: the client wanted stickiness but gave no key.
    #[error(
        "proxy username sets a session lifetime but no session: expected <user>-session-<key>-sesstime-<minutes>, or an `X-Pool-Session: <key>` header"
    )]
    LifetimeWithoutSession,
}

impl SessionError {
    /// Whether the error is in the proxy credentials (answer 407, so the client treats it as an
    /// auth problem) rather than in a header (answer 400).
    pub fn is_proxy_auth(&self) -> bool {
        use SessionError::*;
        match self {
            HeaderNotText { .. }
            | HeaderRepeated { .. }
            | InvalidHeader { .. }
            | InvalidKey { .. } => false,
            InvalidProxyAuthorization { .. }
            | EmptyAccount { .. }
            | EmptyLabel
            | MissingValue { .. }
            | InvalidValue { .. }
            | DanglingLabel { .. }
            | RepeatedLabel { .. }
            | LifetimeWithoutSession => true,
        }
    }

    /// Drops the echoed username value, for the odd client whose password also appears in its
    /// username: the echo is sanitised and cut short, so searching it for the password could miss
    /// a partial or mangled copy.
    fn redact(mut self) -> Self {
        if let SessionError::InvalidValue { value, .. }
        | SessionError::DanglingLabel { label: value } = &mut self
        {
            *value = String::from("<redacted>");
        }
        self
    }
}

/// Reads the session, pool, lifetime and credentials a request asked for.
///
/// Session headers are read in priority order — `X-Pool-Session`, `x-lpm-session`,
/// `Zyte-Session-ID`, `X-Crawlera-Session` — and only the first present one counts (the others are
/// stripped unread). A header session, or `create`, wins over a username session; `X-Pool-Name`
/// wins over `-pool-`. A username lifetime applies to whichever session wins, and is an error when
/// there is none.
pub fn parse(headers: &HeaderMap) -> Result<SessionRequest, SessionError> {
    // Most requests carry none of these: one pass over their few names costs less than the six
    // hashed lookups below.
    let read = |k: &HeaderName| *k == PROXY_AUTHORIZATION || SESSION_HEADERS.contains(&k.as_str());
    if !headers.keys().any(read) {
        return Ok(SessionRequest::default());
    }
    let header_session = header_session(headers)?;
    let header_pool = header_pool(headers)?;

    let mut req = SessionRequest::default();
    if let Some((username, password)) = basic_credentials(headers)? {
        let labels = parse_username(&username).map_err(|e| {
            if !password.is_empty() && username.contains(password.as_str()) {
                e.redact()
            } else {
                e
            }
        })?;
        req.session = labels.session;
        req.ttl = labels.ttl;
        req.pool = labels.pool;
        req.user = Some(labels.account);
        req.password = Some(password);
    }
    match header_session {
        Some(HeaderSession::Create) => {
            req.create = true;
            req.session = None;
        }
        Some(HeaderSession::Key(key)) => req.session = Some(key),
        None => {}
    }
    if header_pool.is_some() {
        req.pool = header_pool;
    }
    if req.ttl.is_some() && req.session.is_none() && !req.create {
        return Err(SessionError::LifetimeWithoutSession);
    }
    Ok(req)
}

/// A fresh random key for `X-Pool-Session: create`: 32 hex characters (128 bits), so keys minted
/// by any number of instances never collide in practice, and valid in both header and username.
pub fn mint_key() -> SessionKey {
    SessionKey(format!("{:032x}", rand::random::<u128>()))
}

fn is_name(value: &str, max: usize, allowed: impl Fn(char) -> bool) -> bool {
    !value.is_empty() && value.len() <= max && value.chars().all(allowed)
}

fn is_header_key(value: &str) -> bool {
    is_name(value, MAX_SESSION_KEY_LEN, |c| {
        c.is_ascii_alphanumeric() || "._~:@+=-".contains(c)
    })
}

/// A client value as it may appear in a message (and so in a `Proxy-Status` header): visible
/// ASCII only, no quotes or backslashes, at most 40 characters.
fn shown(value: &str) -> String {
    const MAX: usize = 40;
    let mut out: String = value
        .chars()
        .take(MAX)
        .map(|c| {
            if c.is_ascii_graphic() && !matches!(c, '"' | '\\' | '`') {
                c
            } else {
                '?'
            }
        })
        .collect();
    if value.chars().nth(MAX).is_some() {
        out.push_str("...");
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use http::HeaderValue;
    use http::header::HeaderName;
    use username::tests::CASES;

    /// The variant name of an error, from its `Debug`.
    pub(super) fn variant(e: &SessionError) -> String {
        format!("{e:?}")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect()
    }

    #[test]
    fn error_messages_say_what_and_the_expected_form() {
        let e = parse_username("u-session-").unwrap_err();
        assert_eq!(
            e.to_string(),
            "username token `-session-` needs a value: \
             <user>-session-<key>, 1 to 128 characters of [A-Za-z0-9_.]"
        );
        for &(username, expect) in CASES {
            if expect.is_err() {
                let msg = parse_username(username).unwrap_err().to_string();
                assert!(msg.contains('<'), "no expected form: {msg}");
            }
        }
        let e = parse_username("u-sesstime-abc").unwrap_err().to_string();
        assert!(
            e.contains("`-sesstime-`") && e.contains("`abc`") && e.contains("1 to 1440"),
            "{e}"
        );
        let e = parse_username("u-session-a-sessid-b")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`-session-`") && e.contains("`-sessid-`"), "{e}");
        let e = parse_username("u-session-a-Country")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`-Country`"), "{e}");
        let e = parse(&headers(b"x-pool-name: a.b"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("x-pool-name") && e.contains("[A-Za-z0-9_-]"),
            "{e}"
        );
    }

    /// What `parse` should yield.
    #[derive(Debug, Clone, Copy)]
    struct Want {
        session: Option<&'static str>,
        create: bool,
        pool: Option<&'static str>,
        ttl_min: Option<u64>,
        user: Option<&'static str>,
        password: Option<&'static str>,
    }

    /// Nothing asked for.
    const W: Want = Want {
        session: None,
        create: false,
        pool: None,
        ttl_min: None,
        user: None,
        password: None,
    };

    impl Want {
        const fn key(self, key: &'static str) -> Self {
            Want {
                session: Some(key),
                ..self
            }
        }
        const fn create(self) -> Self {
            Want {
                create: true,
                ..self
            }
        }
        const fn pool(self, pool: &'static str) -> Self {
            Want {
                pool: Some(pool),
                ..self
            }
        }
        const fn ttl(self, minutes: u64) -> Self {
            Want {
                ttl_min: Some(minutes),
                ..self
            }
        }
        const fn creds(self, user: &'static str, password: &'static str) -> Self {
            Want {
                user: Some(user),
                password: Some(password),
                ..self
            }
        }
    }

    /// Header lines `name: value`, one per `\n`; the pseudo-header `basic: user:pass` stands for
    /// `Proxy-Authorization: Basic base64(user:pass)`.
    pub(super) fn headers(spec: &[u8]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for line in spec.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            let colon = line.iter().position(|&b| b == b':').unwrap();
            let (name, value) = (&line[..colon], &line[colon + 2..]);
            if name == b"basic" {
                let v = format!("Basic {}", STANDARD.encode(value));
                map.append(PROXY_AUTHORIZATION, HeaderValue::from_str(&v).unwrap());
            } else {
                let name = HeaderName::from_bytes(name).unwrap();
                map.append(name, HeaderValue::from_bytes(value).unwrap());
            }
        }
        map
    }

    const REQUESTS: &[(&[u8], Result<Want, &str>)] = &[
        (b"", Ok(W)),
        (b"x-other: 1", Ok(W)),
        // X-Pool-Session and create.
        (b"x-pool-session: abc", Ok(W.key("abc"))),
        (b"X-Pool-Session:   abc\t", Ok(W.key("abc"))),
        (b"x-pool-session: create", Ok(W.create())),
        (b"x-pool-session: CrEaTe", Ok(W.create())),
        (b"x-pool-session: Az09._~:@+=-", Ok(W.key("Az09._~:@+=-"))),
        // Aliases.
        (b"x-lpm-session: l1", Ok(W.key("l1"))),
        (b"zyte-session-id: 0f3c-4a1e-9b", Ok(W.key("0f3c-4a1e-9b"))),
        (b"x-crawlera-session: 12345", Ok(W.key("12345"))),
        (b"x-crawlera-session: create", Ok(W.create())),
        (b"X-Crawlera-Session: CREATE", Ok(W.create())),
        // Only X-Pool-Session and X-Crawlera-Session give `create` a meaning.
        (b"zyte-session-id: create", Ok(W.key("create"))),
        (b"x-lpm-session: create", Ok(W.key("create"))),
        // Priority: the first present header counts, the others are not read.
        (
            b"x-crawlera-session: c\nzyte-session-id: z\nx-lpm-session: l\nx-pool-session: p",
            Ok(W.key("p")),
        ),
        (
            b"x-crawlera-session: c\nzyte-session-id: z\nx-lpm-session: l",
            Ok(W.key("l")),
        ),
        (b"x-crawlera-session: c\nzyte-session-id: z", Ok(W.key("z"))),
        (
            b"x-crawlera-session: create\nzyte-session-id: z",
            Ok(W.key("z")),
        ),
        (b"x-pool-session: create\nx-lpm-session: l", Ok(W.create())),
        (b"x-pool-session: p\nx-lpm-session: bad key", Ok(W.key("p"))),
        // Header key grammar.
        (b"x-pool-session: ", Err("InvalidHeader")),
        (b"x-pool-session:    ", Err("InvalidHeader")),
        (b"x-pool-session: a b", Err("InvalidHeader")),
        (b"x-pool-session: a/b", Err("InvalidHeader")),
        (b"x-pool-session: a\"b", Err("InvalidHeader")),
        (b"x-lpm-session: a,b", Err("InvalidHeader")),
        (b"x-crawlera-session: ", Err("InvalidHeader")),
        (b"x-pool-session: \xff\xfe", Err("HeaderNotText")),
        (b"zyte-session-id: caf\xc3\xa9", Err("HeaderNotText")),
        (
            b"x-pool-session: a\nx-pool-session: b",
            Err("HeaderRepeated"),
        ),
        // X-Pool-Name.
        (b"x-pool-name: eu-west_1", Ok(W.pool("eu-west_1"))),
        (b"x-pool-name: eu.west", Err("InvalidHeader")),
        (b"x-pool-name: ", Err("InvalidHeader")),
        (b"x-pool-name: \xe9", Err("HeaderNotText")),
        (b"x-pool-name: a\nx-pool-name: b", Err("HeaderRepeated")),
        // Proxy-Authorization.
        (b"basic: u:p", Ok(W.creds("u", "p"))),
        (b"proxy-authorization: Basic dTpw", Ok(W.creds("u", "p"))),
        (b"proxy-authorization: basic   dTpw ", Ok(W.creds("u", "p"))),
        (b"proxy-authorization: Basic dTp3eA", Ok(W.creds("u", "wx"))),
        (b"basic: u:p:w:x", Ok(W.creds("u", "p:w:x"))),
        (b"basic: :pw", Ok(W.creds("", "pw"))),
        (b"basic: plain:", Ok(W.creds("plain", ""))),
        (b"proxy-authorization: Bearer abc.def", Ok(W)),
        (b"proxy-authorization: Digest username=\"u\"", Ok(W)),
        (
            b"proxy-authorization: Basic !!!notbase64",
            Err("InvalidProxyAuthorization"),
        ),
        (
            b"proxy-authorization: Basic",
            Err("InvalidProxyAuthorization"),
        ),
        (
            b"proxy-authorization: Basic dXNlcg==",
            Err("InvalidProxyAuthorization"),
        ),
        (
            b"proxy-authorization: Basic df86cA==",
            Err("InvalidProxyAuthorization"),
        ),
        (
            b"proxy-authorization: Basic \xff",
            Err("InvalidProxyAuthorization"),
        ),
        (b"basic: u:p\nbasic: u:p", Err("InvalidProxyAuthorization")),
        // Username labels through parse.
        (
            b"basic: user-session-abc:pw",
            Ok(W.creds("user", "pw").key("abc")),
        ),
        (
            b"basic: u-pool-eu-sessid-s1-sesstime-10:pw",
            Ok(W.creds("u", "pw").key("s1").pool("eu").ttl(10)),
        ),
        (b"basic: u-session-:pw", Err("MissingValue")),
        (b"basic: session-a:pw", Err("EmptyAccount")),
        // A header session (or create) wins over a username session; the lifetime still applies.
        (
            b"basic: u-session-u1-sesstime-5:pw\nx-pool-session: h1",
            Ok(W.creds("u", "pw").key("h1").ttl(5)),
        ),
        (
            b"basic: u-session-u1:pw\nzyte-session-id: z1",
            Ok(W.creds("u", "pw").key("z1")),
        ),
        (
            b"basic: u-session-u1:pw\nx-pool-session: create",
            Ok(W.creds("u", "pw").create()),
        ),
        // X-Pool-Name wins over -pool-.
        (
            b"basic: u-pool-a:pw\nx-pool-name: b",
            Ok(W.creds("u", "pw").pool("b")),
        ),
        // A lifetime needs a session from somewhere.
        (b"basic: u-sesstime-10:pw", Err("LifetimeWithoutSession")),
        (
            b"basic: u-sesstime-10:pw\nx-pool-session: create",
            Ok(W.creds("u", "pw").create().ttl(10)),
        ),
        // A bad header is an error even when the username is fine.
        (
            b"basic: u-session-a:pw\nx-pool-session: a b",
            Err("InvalidHeader"),
        ),
    ];

    #[test]
    fn parse_table() {
        for &(spec, expect) in REQUESTS {
            let case = String::from_utf8_lossy(spec);
            let got = parse(&headers(spec));
            match (expect, &got) {
                (Ok(want), Ok(r)) => {
                    assert_eq!(
                        r.session.as_ref().map(SessionKey::as_str),
                        want.session,
                        "{case}"
                    );
                    assert_eq!(r.create, want.create, "{case}");
                    assert_eq!(r.pool.as_deref(), want.pool, "{case}");
                    assert_eq!(
                        r.ttl,
                        want.ttl_min.map(|m| Duration::from_secs(m * 60)),
                        "{case}"
                    );
                    assert_eq!(r.user.as_deref(), want.user, "{case}");
                    assert_eq!(r.password.as_deref(), want.password, "{case}");
                }
                (Err(name), Err(e)) => {
                    assert_eq!(variant(e), name, "{case}: {e}");
                    // Credentials problems are 407s, header problems 400s.
                    let auth = case.starts_with("basic") || case.starts_with("proxy-authorization");
                    let header = ["x-pool-", "x-lpm-", "zyte-", "x-crawlera-"]
                        .iter()
                        .any(|h| case.lines().any(|l| l.to_ascii_lowercase().starts_with(h)));
                    assert_eq!(e.is_proxy_auth(), auth && !header, "{case}: {e}");
                }
                _ => panic!("{case}: expected {expect:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn errors_never_contain_the_password() {
        const PASSWORD: &str = "hunter2SECRET";
        // Every failing username of the table (a Basic user-id cannot hold `:`), and the odd client
        // that repeats its password in its username.
        let usernames = CASES
            .iter()
            .filter(|(u, e)| e.is_err() && !u.contains(':'))
            .map(|(u, _)| *u)
            .chain([
                "u-sesstime-hunter2SECRET",
                "u-session-hunter2SECRET!",
                "u-session-a-hunter2SECRET",
                "u-pool-hunter2SECRET.x",
                "u-sesstime-10",
            ]);
        for username in usernames {
            let e =
                parse(&headers(format!("basic: {username}:{PASSWORD}").as_bytes())).unwrap_err();
            assert!(e.is_proxy_auth(), "{username}: {e}");
            assert!(!e.to_string().contains(PASSWORD), "{username}: {e}");
            assert!(!format!("{e:?}").contains(PASSWORD), "{username}: {e:?}");
        }

        // Not even a partial copy cut by the echo's length limit, or one mangled by sanitising.
        for (username, password) in [
            (format!("u-session-{}{PASSWORD}!", "x".repeat(33)), PASSWORD),
            ("u-session-a\"b!".to_owned(), "a\"b"),
        ] {
            let spec = format!("basic: {username}:{password}");
            let e = parse(&headers(spec.as_bytes())).unwrap_err();
            assert!(
                !e.to_string().contains("hunter") && !e.to_string().contains("a?b"),
                "{e}"
            );
        }

        // Malformed credentials are not echoed either.
        for raw in [
            "Basic !!hunter2SECRET",
            "Basic hunter2SECRET",
            "Basic aHVudGVyMlNFQ1JFVA==",
        ] {
            let mut h = HeaderMap::new();
            h.insert(PROXY_AUTHORIZATION, HeaderValue::from_static(raw));
            let e = parse(&h).unwrap_err().to_string();
            assert!(!e.contains("hunter2") && !e.contains("aHVudGVy"), "{e}");
        }

        // Nor does a parsed request's Debug.
        let req = parse(&headers(
            format!("basic: u-session-a:{PASSWORD}").as_bytes(),
        ))
        .unwrap();
        assert_eq!(req.password.as_deref(), Some(PASSWORD));
        assert!(!format!("{req:?}").contains(PASSWORD), "{req:?}");
    }

    #[test]
    fn minted_keys_are_distinct_and_valid() {
        let keys: std::collections::HashSet<SessionKey> = (0..1000).map(|_| mint_key()).collect();
        assert_eq!(keys.len(), 1000);
        for k in &keys {
            assert_eq!(k.as_str().len(), 32);
            assert_eq!(SessionKey::new(k.as_str()).as_ref(), Ok(k));
            let got = parse(&headers(format!("x-pool-session: {k}").as_bytes())).unwrap();
            assert_eq!(got.session.as_ref(), Some(k));
            let got = parse_username(&format!("u-session-{k}")).unwrap();
            assert_eq!(got.session.as_ref(), Some(k));
        }
    }

    #[test]
    fn session_key_new_and_display() {
        let k: SessionKey = "a.b~c".parse().unwrap();
        assert_eq!(k.to_string(), "a.b~c");
        assert_eq!(k.as_ref(), "a.b~c");
        assert_eq!(variant(&SessionKey::new("").unwrap_err()), "InvalidKey");
        assert!(SessionKey::new("a b").is_err());
        assert!(SessionKey::new(&"k".repeat(MAX_SESSION_KEY_LEN + 1)).is_err());
    }
}
