//! The SOCKS5 wire format of a client's handshake (RFC 1928, with RFC 1929 username/password):
//! pure parsers over the bytes read so far, and the replies. No I/O and nothing of the gateway:
//! [`crate::proxy::socks`] reads the socket, calls these, and decides.
//!
//! Each parser takes the bytes received so far and answers [`Parse::Incomplete`] until a whole
//! message is there, so a message split over any number of reads (or trickled a byte at a time)
//! parses the same, and a message that breaks the grammar is refused as soon as the bytes show
//! it, with the reply the RFC has for it where there is one ([`HandshakeError::reply`]).
//!
//! ```text
//! greeting   VER=5 NMETHODS METHODS[NMETHODS]
//! login      VER=1 ULEN UNAME[ULEN] PLEN PASSWD[PLEN]          (method 02 only)
//! request    VER=5 CMD RSV=0 ATYP DST.ADDR DST.PORT
//!            ATYP 1: 4 bytes, 3: LEN NAME[LEN], 4: 16 bytes
//! reply      VER=5 REP RSV=0 ATYP BND.ADDR BND.PORT
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The protocol version byte of greetings, requests and replies.
pub const VERSION: u8 = 5;
/// The version byte of the RFC 1929 username/password sub-negotiation.
pub const LOGIN_VERSION: u8 = 1;
/// Longest greeting: version, count, and at most 255 methods.
pub const MAX_GREETING_BYTES: usize = 2 + 255;
/// Longest login: version, two lengths, and at most 255 bytes of each field.
pub const MAX_LOGIN_BYTES: usize = 3 + 255 + 255;
/// Longest request: the fixed part, a domain of at most 255 bytes, and the port.
pub const MAX_REQUEST_BYTES: usize = 4 + 1 + 255 + 2;

/// An authentication method of the greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `00`: no authentication.
    NoAuth,
    /// `02`: username/password (RFC 1929).
    Password,
}

impl Method {
    pub fn code(self) -> u8 {
        match self {
            Method::NoAuth => 0x00,
            Method::Password => 0x02,
        }
    }
}

/// The server's answer to a greeting that offers no method it accepts.
pub const NO_ACCEPTABLE_METHOD: u8 = 0xff;

/// What a client may ask for in a request. Only CONNECT is served; the others are read so that
/// they can be refused with `07`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Connect,
    Bind,
    UdpAssociate,
}

/// The destination of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Addr {
    Ip(IpAddr),
    /// A name, for the upstream (or, for `direct://`, the gateway) to resolve. Its bytes as
    /// sent, checked only to be text; [`crate::target::Target::parse`] judges it as a host.
    Domain(String),
}

/// A request's command and destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub addr: Addr,
    pub port: u16,
}

/// A username/password login (RFC 1929). Hand-written `Debug`: never prints the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Login {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// A parser's answer: a message and how many bytes it took, or the need for more bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Parse<T> {
    Done(T, usize),
    Incomplete,
}

/// Why a handshake was refused. Closed set; never carries a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    /// The first byte of a greeting or request is not 5 (an HTTP request to the SOCKS port, for
    /// one), or of a login not 1.
    #[error("wrong protocol version byte {0:#04x}")]
    Version(u8),
    /// A greeting with a method count of zero.
    #[error("the greeting offers no methods")]
    NoMethods,
    /// The greeting offers no method this gateway accepts.
    #[error("no acceptable authentication method offered")]
    NoAcceptableMethod,
    /// More bytes came with the greeting than its count announced, before the server answered
    /// (a method list longer than its count).
    #[error("the method list is longer than its count")]
    MethodListTooLong,
    /// A login with an empty username.
    #[error("empty username")]
    EmptyUsername,
    /// A username or password that is not UTF-8.
    #[error("username or password is not text")]
    LoginNotText,
    /// The reserved byte of a request is not zero.
    #[error("reserved byte is not zero")]
    Reserved,
    /// A command other than CONNECT, BIND and UDP ASSOCIATE.
    #[error("unknown command {0:#04x}")]
    UnknownCommand(u8),
    /// An address type other than 1, 3 and 4.
    #[error("unknown address type {0:#04x}")]
    AddressType(u8),
    /// A domain of length zero, or one that is not text.
    #[error("empty or non-text domain name")]
    BadDomain,
    /// The client closed the connection in the middle of a message.
    #[error("the connection closed in the middle of the handshake")]
    Truncated,
    /// The handshake did not finish within `server.header_read_timeout`.
    #[error("no complete handshake within server.header_read_timeout")]
    Timeout,
}

impl HandshakeError {
    /// The reply the client gets before the connection closes, where the protocol has one for
    /// this point of the handshake: `FF` to a greeting without an acceptable method, `07`/`08` to
    /// a request the gateway cannot read, `01` (general failure) to any other malformed request;
    /// a malformed greeting, or a connection that went quiet or away, gets nothing.
    pub fn reply(self) -> Option<Refusal> {
        use HandshakeError::*;
        match self {
            NoAcceptableMethod | NoMethods => Some(Refusal::Method),
            UnknownCommand(_) => Some(Refusal::Request(Reply::CommandNotSupported)),
            AddressType(_) => Some(Refusal::Request(Reply::AddressTypeNotSupported)),
            Reserved | BadDomain => Some(Refusal::Request(Reply::GeneralFailure)),
            EmptyUsername | LoginNotText => Some(Refusal::Login),
            Version(_) | MethodListTooLong | Truncated | Timeout => None,
        }
    }

    /// Stable name for logs and `/status`.
    pub fn as_str(self) -> &'static str {
        use HandshakeError::*;
        match self {
            Version(_) => "version",
            NoMethods => "no_methods",
            NoAcceptableMethod => "no_acceptable_method",
            MethodListTooLong => "method_list_too_long",
            EmptyUsername => "empty_username",
            LoginNotText => "login_not_text",
            Reserved => "reserved",
            UnknownCommand(_) => "unknown_command",
            AddressType(_) => "address_type",
            BadDomain => "bad_domain",
            Truncated => "truncated",
            Timeout => "timeout",
        }
    }
}

/// The message a refused handshake ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The method selection `05 FF`.
    Method,
    /// The login status `01 01`.
    Login,
    /// A reply to the request.
    Request(Reply),
}

impl Refusal {
    pub fn bytes(self) -> Vec<u8> {
        match self {
            Refusal::Method => vec![VERSION, NO_ACCEPTABLE_METHOD],
            Refusal::Login => login_status(false).to_vec(),
            Refusal::Request(r) => reply(r).to_vec(),
        }
    }
}

/// A reply code (RFC 1928 section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reply {
    Succeeded,
    GeneralFailure,
    NotAllowed,
    NetworkUnreachable,
    HostUnreachable,
    ConnectionRefused,
    TtlExpired,
    CommandNotSupported,
    AddressTypeNotSupported,
}

impl Reply {
    /// Every code, in code order.
    pub const ALL: [Reply; 9] = [
        Reply::Succeeded,
        Reply::GeneralFailure,
        Reply::NotAllowed,
        Reply::NetworkUnreachable,
        Reply::HostUnreachable,
        Reply::ConnectionRefused,
        Reply::TtlExpired,
        Reply::CommandNotSupported,
        Reply::AddressTypeNotSupported,
    ];

    pub fn code(self) -> u8 {
        match self {
            Reply::Succeeded => 0x00,
            Reply::GeneralFailure => 0x01,
            Reply::NotAllowed => 0x02,
            Reply::NetworkUnreachable => 0x03,
            Reply::HostUnreachable => 0x04,
            Reply::ConnectionRefused => 0x05,
            Reply::TtlExpired => 0x06,
            Reply::CommandNotSupported => 0x07,
            Reply::AddressTypeNotSupported => 0x08,
        }
    }

    /// Stable name for logs, `/status` and the `reply` label of `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Reply::Succeeded => "succeeded",
            Reply::GeneralFailure => "general_failure",
            Reply::NotAllowed => "not_allowed",
            Reply::NetworkUnreachable => "network_unreachable",
            Reply::HostUnreachable => "host_unreachable",
            Reply::ConnectionRefused => "connection_refused",
            Reply::TtlExpired => "ttl_expired",
            Reply::CommandNotSupported => "command_not_supported",
            Reply::AddressTypeNotSupported => "address_type_not_supported",
        }
    }
}

/// Reads a greeting and picks a method: `02` when `password` is offered and `accept_password`,
/// else `00` when offered and `accept_none`. Bytes past the greeting are only allowed when a
/// login or a request may follow at once (clients that pipeline); a method list longer than its
/// count is caught when what follows cannot be a login or a request.
pub fn greeting(
    buf: &[u8],
    accept_password: bool,
    accept_none: bool,
) -> Result<Parse<Method>, HandshakeError> {
    let Some(&version) = buf.first() else {
        return Ok(Parse::Incomplete);
    };
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    let Some(&count) = buf.get(1) else {
        return Ok(Parse::Incomplete);
    };
    if count == 0 {
        return Err(HandshakeError::NoMethods);
    }
    let end = 2 + usize::from(count);
    let Some(methods) = buf.get(2..end) else {
        return Ok(Parse::Incomplete);
    };
    let offered = |m: Method| methods.contains(&m.code());
    let method = if accept_password && offered(Method::Password) {
        Method::Password
    } else if accept_none && offered(Method::NoAuth) {
        Method::NoAuth
    } else {
        return Err(HandshakeError::NoAcceptableMethod);
    };
    // What follows the greeting before the server's answer can only be the client's next
    // message sent early: its first byte is that message's version.
    let next_version = match method {
        Method::Password => LOGIN_VERSION,
        Method::NoAuth => VERSION,
    };
    if buf.get(end).is_some_and(|&b| b != next_version) {
        return Err(HandshakeError::MethodListTooLong);
    }
    Ok(Parse::Done(method, end))
}

/// Reads an RFC 1929 login.
pub fn login(buf: &[u8]) -> Result<Parse<Login>, HandshakeError> {
    let Some(&version) = buf.first() else {
        return Ok(Parse::Incomplete);
    };
    if version != LOGIN_VERSION {
        return Err(HandshakeError::Version(version));
    }
    let Some(&ulen) = buf.get(1) else {
        return Ok(Parse::Incomplete);
    };
    if ulen == 0 {
        return Err(HandshakeError::EmptyUsername);
    }
    let uend = 2 + usize::from(ulen);
    let Some(&plen) = buf.get(uend) else {
        return Ok(Parse::Incomplete);
    };
    let pend = uend + 1 + usize::from(plen);
    if buf.len() < pend {
        return Ok(Parse::Incomplete);
    }
    let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| HandshakeError::LoginNotText);
    Ok(Parse::Done(
        Login {
            username: text(&buf[2..uend])?,
            password: text(&buf[uend + 1..pend])?,
        },
        pend,
    ))
}

/// Reads a request.
pub fn request(buf: &[u8]) -> Result<Parse<Request>, HandshakeError> {
    let Some(&version) = buf.first() else {
        return Ok(Parse::Incomplete);
    };
    if version != VERSION {
        return Err(HandshakeError::Version(version));
    }
    let Some(&cmd) = buf.get(1) else {
        return Ok(Parse::Incomplete);
    };
    let command = match cmd {
        0x01 => Command::Connect,
        0x02 => Command::Bind,
        0x03 => Command::UdpAssociate,
        other => return Err(HandshakeError::UnknownCommand(other)),
    };
    let Some(&reserved) = buf.get(2) else {
        return Ok(Parse::Incomplete);
    };
    if reserved != 0 {
        return Err(HandshakeError::Reserved);
    }
    let Some(&atyp) = buf.get(3) else {
        return Ok(Parse::Incomplete);
    };
    let (addr, at) = match atyp {
        0x01 => {
            let Some(b) = buf.get(4..8) else {
                return Ok(Parse::Incomplete);
            };
            let ip = Ipv4Addr::new(b[0], b[1], b[2], b[3]);
            (Addr::Ip(IpAddr::V4(ip)), 8)
        }
        0x04 => {
            let Some(b) = buf.get(4..20) else {
                return Ok(Parse::Incomplete);
            };
            let mut octets = [0u8; 16];
            octets.copy_from_slice(b);
            (Addr::Ip(IpAddr::V6(Ipv6Addr::from(octets))), 20)
        }
        0x03 => {
            let Some(&len) = buf.get(4) else {
                return Ok(Parse::Incomplete);
            };
            if len == 0 {
                return Err(HandshakeError::BadDomain);
            }
            let end = 5 + usize::from(len);
            let Some(name) = buf.get(5..end) else {
                return Ok(Parse::Incomplete);
            };
            let name = std::str::from_utf8(name).map_err(|_| HandshakeError::BadDomain)?;
            (Addr::Domain(name.to_string()), end)
        }
        other => return Err(HandshakeError::AddressType(other)),
    };
    let Some(p) = buf.get(at..at + 2) else {
        return Ok(Parse::Incomplete);
    };
    let port = u16::from_be_bytes([p[0], p[1]]);
    Ok(Parse::Done(
        Request {
            command,
            addr,
            port,
        },
        at + 2,
    ))
}

/// The method selection message.
pub fn method_selection(method: Method) -> [u8; 2] {
    [VERSION, method.code()]
}

/// The login status message: `01 00` accepted, `01 01` refused.
pub fn login_status(ok: bool) -> [u8; 2] {
    [LOGIN_VERSION, if ok { 0x00 } else { 0x01 }]
}

/// A reply with the bound address `0.0.0.0:0`: the gateway's own address towards the target is
/// the upstream's business, and no client of a CONNECT needs it.
pub fn reply(r: Reply) -> [u8; 10] {
    [VERSION, r.code(), 0, 0x01, 0, 0, 0, 0, 0, 0]
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;

    fn done<T>(p: Result<Parse<T>, HandshakeError>) -> (T, usize) {
        match p {
            Ok(Parse::Done(t, n)) => (t, n),
            Ok(Parse::Incomplete) => panic!("incomplete"),
            Err(e) => panic!("{e}"),
        }
    }

    /// Every prefix of a valid message is incomplete, never an error: a message trickled in byte
    /// by byte parses once it is whole.
    fn every_prefix_incomplete<T: std::fmt::Debug>(
        msg: &[u8],
        parse: impl Fn(&[u8]) -> Result<Parse<T>, HandshakeError>,
    ) {
        for n in 0..msg.len() {
            assert!(
                matches!(parse(&msg[..n]), Ok(Parse::Incomplete)),
                "prefix {n} of {msg:?}: {:?}",
                parse(&msg[..n])
            );
        }
    }

    #[test]
    fn greeting_picks_password_when_users_exist_and_no_auth_otherwise() {
        let both = [5, 2, 0, 2];
        assert_eq!(done(greeting(&both, true, false)), (Method::Password, 4));
        assert_eq!(done(greeting(&both, true, true)), (Method::Password, 4));
        assert_eq!(done(greeting(&[5, 1, 0], true, true)), (Method::NoAuth, 3));
        assert_eq!(
            greeting(&[5, 1, 0], true, false),
            Err(HandshakeError::NoAcceptableMethod)
        );
        assert_eq!(
            greeting(&[5, 1, 2], false, true),
            Err(HandshakeError::NoAcceptableMethod)
        );
        assert_eq!(
            greeting(&[5, 2, 1, 0x80], true, true),
            Err(HandshakeError::NoAcceptableMethod)
        );
        every_prefix_incomplete(&both, |b| greeting(b, true, false));
    }

    #[test]
    fn malformed_greetings_are_refused() {
        // An HTTP request to the SOCKS port, and SOCKS4.
        assert_eq!(
            greeting(b"GET / HTTP/1.1\r\n", true, true),
            Err(HandshakeError::Version(b'G'))
        );
        assert_eq!(
            greeting(&[4, 1, 0, 80], true, true),
            Err(HandshakeError::Version(4))
        );
        assert_eq!(
            greeting(&[5, 0], true, true),
            Err(HandshakeError::NoMethods)
        );
        // A count of 1 followed by three method bytes: the extra bytes are not a request.
        assert_eq!(
            greeting(&[5, 1, 0, 2, 1], true, true),
            Err(HandshakeError::MethodListTooLong)
        );
        assert_eq!(
            greeting(&[5, 1, 2, 2], true, false),
            Err(HandshakeError::MethodListTooLong)
        );
        // A client that pipelines its next message is fine.
        assert_eq!(
            done(greeting(&[5, 1, 0, 5, 1, 0], true, true)),
            (Method::NoAuth, 3)
        );
        assert_eq!(
            done(greeting(&[5, 1, 2, 1, 1], true, false)),
            (Method::Password, 3)
        );
        assert_eq!(
            HandshakeError::NoAcceptableMethod.reply().unwrap().bytes(),
            vec![5, 0xff]
        );
        assert_eq!(HandshakeError::Version(4).reply(), None);
        assert_eq!(HandshakeError::MethodListTooLong.reply(), None);
    }

    #[test]
    fn logins_parse_and_malformed_ones_are_refused() {
        let msg = [1, 3, b'b', b'o', b'b', 2, b'p', b'w'];
        let (l, n) = done(login(&msg));
        assert_eq!(
            (l.username.as_str(), l.password.as_str(), n),
            ("bob", "pw", 8)
        );
        assert!(!format!("{l:?}").contains("pw\""), "{l:?}");
        every_prefix_incomplete(&msg, login);
        // An empty password is the client's to send; the login then fails as any wrong one.
        let (l, _) = done(login(&[1, 1, b'a', 0]));
        assert_eq!(l.password, "");
        assert_eq!(login(&[5, 1, b'a', 0]), Err(HandshakeError::Version(5)));
        assert_eq!(login(&[1, 0, 0]), Err(HandshakeError::EmptyUsername));
        assert_eq!(
            login(&[1, 1, 0xff, 1, b'x']),
            Err(HandshakeError::LoginNotText)
        );
        assert_eq!(
            HandshakeError::EmptyUsername.reply().unwrap().bytes(),
            vec![1, 1]
        );
    }

    #[test]
    fn requests_of_every_address_type_parse() {
        let v4 = [5, 1, 0, 1, 127, 0, 0, 1, 0x1f, 0x90];
        let (r, n) = done(request(&v4));
        assert_eq!(n, 10);
        assert_eq!(
            r,
            Request {
                command: Command::Connect,
                addr: Addr::Ip("127.0.0.1".parse().unwrap()),
                port: 8080,
            }
        );
        every_prefix_incomplete(&v4, request);

        let mut v6 = vec![5, 1, 0, 4];
        v6.extend_from_slice(&"::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&443u16.to_be_bytes());
        let (r, n) = done(request(&v6));
        assert_eq!(
            (r.addr, r.port, n),
            (Addr::Ip("::1".parse().unwrap()), 443, 22)
        );
        every_prefix_incomplete(&v6, request);

        let mut name = vec![5, 1, 0, 3, 11];
        name.extend_from_slice(b"example.com");
        name.extend_from_slice(&443u16.to_be_bytes());
        let (r, n) = done(request(&name));
        assert_eq!(r.addr, Addr::Domain("example.com".into()));
        assert_eq!(n, name.len());
        every_prefix_incomplete(&name, request);

        // BIND and UDP ASSOCIATE are read (to be refused with 07 by the caller).
        let (r, _) = done(request(&[5, 2, 0, 1, 0, 0, 0, 0, 0, 0]));
        assert_eq!(r.command, Command::Bind);
        let (r, _) = done(request(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0]));
        assert_eq!(r.command, Command::UdpAssociate);
    }

    #[test]
    fn malformed_requests_get_their_reply() {
        let cases: &[(&[u8], HandshakeError, Option<u8>)] = &[
            (&[4, 1, 0, 1], HandshakeError::Version(4), None),
            (&[5, 9, 0, 1], HandshakeError::UnknownCommand(9), Some(7)),
            (&[5, 1, 1, 1], HandshakeError::Reserved, Some(1)),
            (&[5, 1, 0, 2], HandshakeError::AddressType(2), Some(8)),
            (&[5, 1, 0, 3, 0, 0, 80], HandshakeError::BadDomain, Some(1)),
            (
                &[5, 1, 0, 3, 1, 0xff, 0, 80],
                HandshakeError::BadDomain,
                Some(1),
            ),
        ];
        for (bytes, want, code) in cases {
            assert_eq!(request(bytes), Err(*want), "{bytes:?}");
            let got = want.reply().map(|r| match r {
                Refusal::Request(r) => r.code(),
                other => panic!("{other:?}"),
            });
            assert_eq!(got, *code, "{want:?}");
        }
        // Truncation and silence have no reply: the connection just closes.
        assert_eq!(HandshakeError::Truncated.reply(), None);
        assert_eq!(HandshakeError::Timeout.reply(), None);
    }

    #[test]
    fn replies_carry_their_code_and_an_unspecified_bound_address() {
        for (i, r) in Reply::ALL.iter().enumerate() {
            assert_eq!(usize::from(r.code()), i);
            assert_eq!(reply(*r), [5, r.code(), 0, 1, 0, 0, 0, 0, 0, 0]);
        }
        assert_eq!(method_selection(Method::Password), [5, 2]);
        assert_eq!(login_status(true), [1, 0]);
    }
}
