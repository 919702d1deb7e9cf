//! The SOCKS5 handshake's parsers (greeting, RFC 1929 login, request), fed any bytes. What they
//! promise: never a panic; a message taken is no longer than the bytes given; and the answer for
//! a prefix agrees with the whole: a prefix of a parsed message is incomplete or the same error,
//! never another message, and more bytes after a complete message never change it (the extra
//! bytes of a greeting aside, which may be refused as a method list longer than its count).
#![no_main]

use libfuzzer_sys::fuzz_target;
use poolgate::socks5::{self, Parse};

fn agrees<T: PartialEq + std::fmt::Debug, E: PartialEq + std::fmt::Debug>(
    data: &[u8],
    parse: impl Fn(&[u8]) -> Result<Parse<T>, E>,
) {
    let whole = parse(data);
    if let Ok(Parse::Done(_, used)) = &whole {
        assert!(*used <= data.len(), "took more bytes than given");
        // The message alone reads the same.
        let alone = parse(&data[..*used]);
        match (&whole, &alone) {
            (Ok(Parse::Done(a, n)), Ok(Parse::Done(b, m))) => {
                assert_eq!(a, b);
                assert_eq!(n, m);
            }
            other => panic!("the message alone reads differently: {other:?}"),
        }
        // Every proper prefix is incomplete.
        for cut in 0..*used {
            assert!(
                matches!(parse(&data[..cut]), Ok(Parse::Incomplete)),
                "a prefix of {cut} bytes is not incomplete"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (flags, rest) = data.split_first().map_or((0, data), |(f, r)| (*f, r));
    let accept_password = flags & 1 != 0;
    let accept_none = flags & 2 != 0;
    // A greeting's extra bytes are judged by what may follow: only whole-message agreement on
    // the greeting itself is asked.
    if let Ok(Parse::Done(method, used)) = socks5::greeting(rest, accept_password, accept_none) {
        assert!(used <= rest.len() && used >= 3);
        assert!(accept_password || method == socks5::Method::NoAuth);
        assert_eq!(
            socks5::greeting(&rest[..used], accept_password, accept_none),
            Ok(Parse::Done(method, used))
        );
    }
    agrees(rest, socks5::login);
    agrees(rest, socks5::request);
});
