//! Tests of the whole pipeline and of the checks that span sections; each section's own tests
//! sit in its file.

use super::*;

/// The problems of a config that does not validate.
pub(super) fn problems(text: &str) -> Vec<String> {
    Config::parse(text, "test.toml", None).unwrap_err().problems
}

#[test]
fn minimal_config_gets_safe_defaults() {
    let c = Config::parse("[pools.default]\nupstreams = [\"direct://\"]\n", "t", None).unwrap();
    assert_eq!(c.default_pool, "default");
    assert_eq!(c.server.listen.to_string(), DEFAULT_PROXY_LISTEN);
    assert_eq!(c.policy.connect_ports, vec![443]);
    assert!(!c.policy.allow_private_targets);
    let p = c.pool("default").unwrap();
    assert_eq!(p.strategy, Strategy::LeastUsed);
    assert_eq!(p.retries, DEFAULT_RETRIES);
    assert_eq!(c.store, StoreConfig::Memory);
}

#[test]
fn every_problem_is_reported_with_its_key() {
    let p = problems(
        r#"
[server]
listen = "nope"
[store]
kind = "etcd"
[pools.a]
upstreams = ["ftp://x:1", "http://u:hunter2@h"]
strategy = "random"
max_concurrency = 0
shards = 65
queue_timeout = "soon"
"#,
    );
    let joined = p.join("\n");
    for key in [
        "server.listen",
        "store.kind",
        "pools.a.upstreams[0]",
        "pools.a.upstreams[1]",
        "pools.a.strategy",
        "pools.a.max_concurrency",
        "pools.a.shards",
        "pools.a.queue_timeout",
    ] {
        assert!(joined.contains(key), "missing {key} in:\n{joined}");
    }
    assert!(!joined.contains("hunter2"), "{joined}");
}

/// A proxy listener beyond loopback needs users or a client allowlist; with either, or on
/// loopback, it starts.
#[test]
fn a_proxy_listener_beyond_loopback_is_never_an_open_proxy() {
    let pool = "[pools.default]\nupstreams = [\"direct://\"]\n";
    for listen in ["0.0.0.0:8080", "[::]:8080", "192.0.2.1:8080"] {
        let p = problems(&format!("[server]\nlisten = \"{listen}\"\n{pool}"));
        assert!(
            p.iter()
                .any(|m| m.starts_with("server.listen") && m.contains("client_cidrs")),
            "{listen}: {p:?}"
        );
    }
    let ok = |text: &str| {
        Config::parse(text, "t", None)
            .map(|_| ())
            .map_err(|e| e.problems)
    };
    assert_eq!(
        ok(&format!(
            "[server]\nlisten = \"0.0.0.0:8080\"\n[auth]\nclient_cidrs = [\"10.0.0.0/8\"]\n{pool}"
        )),
        Ok(())
    );
    assert_eq!(
        ok(&format!("[server]\nlisten = \"127.0.0.1:8080\"\n{pool}")),
        Ok(())
    );
    // The SOCKS5 port is a proxy listener too.
    for socks in ["0.0.0.0:1080", "[::]:1080"] {
        let p = problems(&format!("[server]\nsocks_listen = \"{socks}\"\n{pool}"));
        assert!(
            p.iter()
                .any(|m| m.starts_with("server.socks_listen") && m.contains("client_cidrs")),
            "{socks}: {p:?}"
        );
        assert!(!p.iter().any(|m| m.starts_with("server.listen")), "{p:?}");
    }
    assert_eq!(
        ok(&format!(
            "[server]\nsocks_listen = \"0.0.0.0:1080\"\n[auth]\nclient_cidrs = [\"10.0.0.0/8\"]\n{pool}"
        )),
        Ok(())
    );
    let c = Config::parse(
        &format!("[server]\nsocks_listen = \"127.0.0.1:1080\"\n{pool}"),
        "t",
        None,
    )
    .unwrap();
    assert_eq!(
        c.server.socks_listen,
        Some("127.0.0.1:1080".parse().unwrap())
    );
    let p = problems(&format!("[server]\nsocks_listen = \"nope\"\n{pool}"));
    assert!(
        p.iter().any(|m| m.starts_with("server.socks_listen")),
        "{p:?}"
    );
    let p = problems(&format!(
        "[server]\nlisten = \"127.0.0.1:1080\"\nsocks_listen = \"127.0.0.1:1080\"\n{pool}"
    ));
    assert!(
        p.iter().any(|m| m.starts_with("server.socks_listen")),
        "{p:?}"
    );
}

#[test]
fn admin_off_loopback_needs_a_token() {
    let p = problems(
        "[server]\nadmin_listen = \"0.0.0.0:8081\"\n[pools.default]\nupstreams = [\"direct://\"]\n",
    );
    assert!(
        p.iter().any(|m| m.starts_with("server.admin_token")),
        "{p:?}"
    );
}

#[test]
fn admin_read_token_and_login_backoff_are_read_and_bounded() {
    let pool = "[pools.default]\nupstreams = [\"direct://\"]\n";
    let c = Config::parse(
        &format!(
            "[server]\nadmin_read_token = \"0123456789abcdef\"\n\
             [auth]\nmax_login_failures = 5\nlogin_failure_window = \"30s\"\nlogin_lockout = \"5m\"\n{pool}"
        ),
        "t",
        None,
    )
    .unwrap();
    assert_eq!(
        c.server.admin_read_token.as_deref(),
        Some("0123456789abcdef")
    );
    assert_eq!(
        c.auth.login_backoff,
        LoginBackoff {
            max_failures: 5,
            window: std::time::Duration::from_secs(30),
            lockout: std::time::Duration::from_secs(300),
        }
    );
    let c = Config::parse(pool, "t", None).unwrap();
    assert_eq!(c.server.admin_read_token, None);
    assert_eq!(c.auth.login_backoff, LoginBackoff::default());
    assert_eq!(c.auth.login_backoff.max_failures, 10);

    for (text, key) in [
        (
            "[server]\nadmin_read_token = \"short-secret\"\n",
            "server.admin_read_token",
        ),
        (
            "[server]\nadmin_read_token = \"with spaces 0123456789\"\n",
            "server.admin_read_token",
        ),
        ("[auth]\nlogin_lockout = \"25h\"\n", "auth.login_lockout"),
        (
            "[auth]\nlogin_failure_window = \"0s\"\n",
            "auth.login_failure_window",
        ),
    ] {
        let p = problems(&format!("{text}{pool}"));
        assert!(p.iter().any(|m| m.starts_with(key)), "{text}: {p:?}");
        let joined = p.join("\n");
        assert!(
            !joined.contains("short-secret") && !joined.contains("with spaces"),
            "{joined}"
        );
    }
}

#[test]
fn user_names_holding_a_username_token_are_refused() {
    for name in ["acct-country-us", "a-session-b", "team-type-x", "x-pool"] {
        let p = problems(&format!(
            "[auth.users.{name:?}]\npassword_hash = {:?}\n[pools.default]\nupstreams = [\"direct://\"]\n",
            crate::password::dummy_hash()
        ));
        assert!(
            p.iter()
                .any(|m| m.starts_with(&format!("auth.users.{name}:"))),
            "{name}: {p:?}"
        );
    }
    for name in ["acct", "brd-customer-hl_1-zone-res", "a-countries-b"] {
        let text = format!(
            "[auth.users.{name:?}]\npassword_hash = {:?}\n[pools.default]\nupstreams = [\"direct://\"]\n",
            crate::password::dummy_hash()
        );
        assert!(Config::parse(&text, "t", None).is_ok(), "{name}");
    }
}
