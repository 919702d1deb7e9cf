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
//!
//! Each source's grammar has its own file (`header`, `username`), so it can grow without touching
//! the other; this file holds the types and decides which source wins.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use http::header::PROXY_AUTHORIZATION;
use http::{HeaderMap, HeaderName};

mod header;
mod username;

pub use header::SESSION_HEADERS;
use header::{
    BASIC_FORM, HeaderSession, basic_credentials, header_labels, header_pool, header_session,
};
use username::label_form;
pub use username::{TARGETING_KEYS, UsernameLabels, parse_username};

/// Longest session key accepted, from a header or a username.
pub const MAX_SESSION_KEY_LEN: usize = 128;
/// Longest pool name accepted.
pub const MAX_POOL_NAME_LEN: usize = 64;
/// Longest session lifetime a username may ask for, in minutes (one day).
pub const MAX_LIFETIME_MINUTES: u64 = 1440;
/// Longest value of a username targeting label (`-country-`, `-city-`, …).
pub const MAX_TARGETING_LEN: usize = 64;

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
    /// The kind of exit asked for, from `X-Pool-Labels` or else the username's tokens; the pool
    /// turns it into a filter over its members.
    pub labels: Vec<LabelWant>,
}

/// One label a request asks for: its key and the values it accepts (`country=us|ca`), folded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelWant {
    pub key: String,
    pub values: Vec<String>,
    /// One of [`TARGETING_KEYS`]: it applies whether or not a member declares it. Any other key
    /// applies only in a pool where some member declares it (clients send other gateways'
    /// parameters too).
    pub named: bool,
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
            .field("labels", &self.labels)
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
    let header_labels = header_labels(headers)?;

    let mut req = match basic_credentials(headers)? {
        Some((username, password)) => from_credentials(&username, password)?,
        None => SessionRequest::default(),
    };
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
    if let Some(labels) = header_labels {
        req.labels = labels;
    }
    if req.ttl.is_some() && req.session.is_none() && !req.create {
        return Err(SessionError::LifetimeWithoutSession);
    }
    Ok(req)
}

/// What a proxy login asks for: the username's tokens and the password, as every front door
/// reads them (HTTP `Proxy-Authorization`, a SOCKS5 username/password login). A lifetime without
/// a session is left for the caller to judge, since a header may still supply the session.
pub fn from_credentials(username: &str, password: String) -> Result<SessionRequest, SessionError> {
    let labels = parse_username(username).map_err(|e| {
        if !password.is_empty() && username.contains(password.as_str()) {
            e.redact()
        } else {
            e
        }
    })?;
    Ok(SessionRequest {
        session: labels.session,
        ttl: labels.ttl,
        pool: labels.pool,
        user: Some(labels.account),
        password: Some(password),
        labels: labels.labels,
        ..SessionRequest::default()
    })
}

/// What a proxy login asks for where nothing else can add to it (a SOCKS5 login: no headers):
/// [`from_credentials`], and a lifetime without a session is an error, as it is on HTTP when no
/// header supplies the session.
pub fn from_login(username: &str, password: String) -> Result<SessionRequest, SessionError> {
    let req = from_credentials(username, password)?;
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
mod tests;
