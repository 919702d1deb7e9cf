//! Property tests: no input makes the config parser, the proxy-username grammar or the session
//! parser panic; every spelling of an IPv4 address canonicalises to the address it means.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use base64::Engine as _;
use http::{HeaderMap, HeaderValue};
use poolgate::config::Config;
use poolgate::session;
use proptest::prelude::*;

/// TOML-ish documents built from the real keys with values of every type, so that the validator
/// (not just the TOML reader) sees odd input.
fn config_text() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "listen",
        "admin_listen",
        "admin_token",
        "admin_read_token",
        "default_pool",
        "header_read_timeout",
        "max_header_bytes",
        "max_connections",
        "max_connections_per_client",
        "idle_timeout",
        "tunnel_idle_timeout",
        "max_request_body_bytes",
        "shutdown_grace",
        "connect_timeout",
        "response_timeout",
        "connect_ports",
        "allow_private_targets",
        "allow_targets",
        "client_cidrs",
        "password_hash",
        "pools",
        "upstreams",
        "strategy",
        "max_concurrency",
        "queue_timeout",
        "session_ttl",
        "lease_ttl",
        "retries",
        "rebind_on_failure",
        "kind",
        "url",
    ]);
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<bool>().prop_map(|b| b.to_string()),
        "[ -~]{0,24}".prop_map(|s| format!("{s:?}")),
        prop::collection::vec("[ -~]{0,16}", 0..4).prop_map(|v| format!("{v:?}")),
        prop::collection::vec(any::<u16>(), 0..4).prop_map(|v| format!("{v:?}")),
        Just("\"http://u:p@127.0.0.1:3128\"".to_string()),
        Just("[\"direct://\", \"socks5h://[::1]:1080#x\"]".to_string()),
        Just("\"10s\"".to_string()),
        Just("\"10.0.0.0/8\"".to_string()),
    ];
    let table = prop::sample::select(vec![
        "[server]",
        "[policy]",
        "[store]",
        "[auth]",
        "[auth.users.alice]",
        "[pools.default]",
        "[pools.b-2]",
        "[upstream_tls]",
        "[pools.\"bad name\"]",
    ]);
    prop::collection::vec((table, prop::collection::vec((key, value), 0..6)), 0..6).prop_map(
        |tables| {
            let mut out = String::new();
            for (t, kvs) in tables {
                out.push_str(t);
                out.push('\n');
                for (k, v) in kvs {
                    out.push_str(&format!("{k} = {v}\n"));
                }
            }
            out
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn config_parser_never_panics_on_arbitrary_text(text in "\\PC{0,400}") {
        let _ = Config::parse(&text, "prop", None);
    }

    #[test]
    fn config_parser_never_panics_on_structured_input(text in config_text()) {
        match Config::parse(&text, "prop", None) {
            Ok(c) => prop_assert!(!c.pools.is_empty()),
            Err(e) => prop_assert!(!e.problems.is_empty()),
        }
    }

    #[test]
    fn username_grammar_never_panics(name in "\\PC{0,200}") {
        let _ = session::parse_username(&name);
    }

    #[test]
    fn username_grammar_never_panics_on_token_soup(
        parts in prop::collection::vec(
            prop_oneof![
                Just("session".to_string()), Just("sessid".to_string()),
                Just("sessionid".to_string()), Just("sesstime".to_string()),
                Just("lifetime".to_string()), Just("sessionduration".to_string()),
                Just("pool".to_string()), Just("country".to_string()), Just("type".to_string()),
                Just(String::new()), "[a-zA-Z0-9._~]{0,12}",
                "[0-9]{1,25}",
            ],
            0..12,
        )
    ) {
        let name = parts.join("-");
        if let Ok(labels) = session::parse_username(&name) {
            prop_assert!(name.starts_with(&labels.account));
        }
    }

    #[test]
    fn session_parse_never_panics_on_credentials(raw in prop::collection::vec(any::<u8>(), 0..200), scheme in "(Basic|basic|Bearer| )") {
        let mut h = HeaderMap::new();
        let value = format!("{scheme} {}", base64::engine::general_purpose::STANDARD.encode(&raw));
        h.insert("proxy-authorization", HeaderValue::from_str(&value).unwrap());
        let _ = session::parse(&h);
        if let Ok(v) = HeaderValue::from_bytes(&raw) {
            let mut h = HeaderMap::new();
            h.insert("x-pool-session", v.clone());
            h.insert("proxy-authorization", v);
            let _ = session::parse(&h);
        }
    }
}

/// One IPv4 address written as `parts` numbers (the last filling the bytes the others leave),
/// each in decimal, octal or (either case of) hexadecimal: every form `inet_aton` accepts.
fn legacy_ipv4() -> impl Strategy<Value = (u32, String)> {
    (
        any::<u32>(),
        1usize..=4,
        prop::collection::vec(0u8..4, 4),
        any::<bool>(),
    )
        .prop_map(|(addr, parts, radixes, trailing_dot)| {
            let bytes = addr.to_be_bytes();
            let mut numbers: Vec<u64> = bytes[..parts - 1].iter().map(|b| u64::from(*b)).collect();
            let rest = bytes[parts - 1..]
                .iter()
                .fold(0u64, |n, b| (n << 8) | u64::from(*b));
            numbers.push(rest);
            let mut text: Vec<String> = numbers
                .iter()
                .zip(radixes)
                .map(|(n, radix)| match radix {
                    0 => format!("{n}"),
                    1 => format!("0{n:o}"),
                    2 => format!("0x{n:x}"),
                    _ => format!("0X{n:X}"),
                })
                .collect();
            if trailing_dot {
                text.push(String::new());
            }
            (addr, text.join("."))
        })
}

proptest! {
    #[test]
    fn every_ipv4_spelling_means_its_address((addr, text) in legacy_ipv4()) {
        let canonical = std::net::Ipv4Addr::from(addr).to_string();
        prop_assert_eq!(poolgate::target::canonical_host(&text), Ok(canonical));
    }

    #[test]
    fn target_host_parser_never_panics_and_never_passes_a_numeric_name(raw in "[0-9a-fA-Fx.:%\\[\\]]{0,24}") {
        if let Ok(host) = poolgate::target::canonical_host(&raw) {
            let last = host.trim_end_matches('.').rsplit('.').next().unwrap_or_default().to_string();
            let numeric = !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit());
            // A host ending in a number is an address (`parse` succeeds), never a name.
            prop_assert!(!numeric || host.parse::<std::net::IpAddr>().is_ok(), "{} -> {}", raw, host);
        }
    }
}
