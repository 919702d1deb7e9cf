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
    let e = parse_username("u-session-a-Zone").unwrap_err().to_string();
    assert!(e.contains("`-Zone`"), "{e}");
    let e = parse_username("u-session-a-Country")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`-country-` needs a value"), "{e}");
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
    (
        b"basic: acct-country-us-session-a:pw",
        Ok(W.creds("acct", "pw").key("a")),
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
        let e = parse(&headers(format!("basic: {username}:{PASSWORD}").as_bytes())).unwrap_err();
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
