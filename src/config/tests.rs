use std::time::Duration;

use super::*;
use crate::upstream::Scheme;

fn problems(text: &str) -> Vec<String> {
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
fn workers_default_to_the_cores_and_out_of_range_counts_are_refused_by_key() {
    let c = Config::parse("[pools.default]\nupstreams = [\"direct://\"]\n", "t", None).unwrap();
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    assert_eq!(c.server.workers, cores);
    let c = Config::parse(
        "[server]\nworkers = 3\n[pools.default]\nupstreams = [\"direct://\"]\n",
        "t",
        None,
    )
    .unwrap();
    assert_eq!(c.server.workers, 3);
    for bad in ["0", "1025"] {
        let p = problems(&format!(
            "[server]\nworkers = {bad}\n[pools.default]\nupstreams = [\"direct://\"]\n"
        ));
        assert!(
            p.iter().any(|m| m.starts_with("server.workers: ")),
            "{bad}: {p:?}"
        );
    }
}

#[test]
fn redis_store_keys_are_read_and_the_password_never_shown() {
    let c = Config::parse(
        "[store]\nkind = \"redis\"\nurl = \"redis+cluster://:hunter2@127.0.0.1:7000,127.0.0.1:7001\"\n\
         timeout = \"100ms\"\nkey_prefix = \"pg-eu\"\n\
         [pools.default]\nupstreams = [\"direct://\"]\n",
        "test.toml",
        None,
    )
    .unwrap();
    match &c.store {
        StoreConfig::Redis {
            timeout,
            key_prefix,
            ..
        } => {
            assert_eq!(*timeout, Duration::from_millis(100));
            assert_eq!(key_prefix, "pg-eu");
        }
        other => panic!("{other:?}"),
    }
    assert!(!format!("{:?}", c.store).contains("hunter2"));
    let p =
        problems("[store]\nkind = \"redis\"\nurl = \"http://:hunter2@h\"\nkey_prefix = \"a{b}\"\n")
            .join("\n");
    assert!(
        p.contains("store.url") && p.contains("store.key_prefix"),
        "{p}"
    );
    assert!(!p.contains("hunter2"), "{p}");
    let p = problems("[store]\ntimeout = \"1s\"\n").join("\n");
    assert!(p.contains("store.timeout"), "{p}");
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
        "pools.a.queue_timeout",
    ] {
        assert!(joined.contains(key), "missing {key} in:\n{joined}");
    }
    assert!(!joined.contains("hunter2"), "{joined}");
}

#[test]
fn unknown_keys_name_the_line() {
    let p = problems("[pools.default]\nupstreams = [\"direct://\"]\nmax_conns = 3\n");
    assert!(
        p[0].contains("line 3") && p[0].contains("max_conns"),
        "{p:?}"
    );
}

/// Type, unknown-key and missing-key errors name the full dotted key and the line, at any
/// depth, and keep toml's message (with the expected keys) as their tail.
#[test]
fn type_errors_name_their_full_key_at_any_depth() {
    let cases: &[(&str, &str)] = &[
        (
            "[server]\nmax_connections = \"lots\"\n",
            "server.max_connections (line 2): invalid type: string \"lots\", expected u32",
        ),
        (
            "[store]\ntimeout = 5\n",
            "store.timeout (line 2): invalid type: integer `5`, expected a string",
        ),
        (
            "[captcha]\nmarkers = \"x\"\n",
            "captcha.markers (line 2): invalid type: string \"x\", expected a sequence",
        ),
        (
            "[policy]\nconnect_ports = [443, \"80\"]\n",
            "policy.connect_ports[1] (line 2): invalid type: string \"80\", expected u16",
        ),
        (
            "[pools.default]\nupstreams = [\"direct://\"]\nretries = \"many\"\n",
            "pools.default.retries (line 3): invalid type: string \"many\", expected u32",
        ),
        (
            "pools = { default = { upstreams = [\"direct://\"], retries = \"many\" } }\n",
            "pools.default.retries (line 1): invalid type: string \"many\", expected u32",
        ),
        (
            "[pools.default.health]\nwindow = -1\n",
            "pools.default.health.window (line 2): invalid value: integer `-1`, expected usize",
        ),
        (
            "[pools.default.probe]\ninterval = 30\n",
            "pools.default.probe.interval (line 2): invalid type: integer `30`, expected a string",
        ),
        (
            "[auth.users.alice]\nrate_limit = \"fast\"\n",
            "auth.users.alice.rate_limit (line 2): invalid type: string \"fast\", expected f64",
        ),
        (
            "[auth.users.\"j.doe\"]\nrate_limit_burst = 1.5\n",
            "auth.users.\"j.doe\".rate_limit_burst (line 2): invalid type: floating point `1.5`, expected u32",
        ),
        (
            "[auth.users.'say \"hi\"']\npools = \"default\"\n",
            "auth.users.\"say \\\"hi\\\"\".pools (line 2): invalid type: string \"default\", expected a sequence",
        ),
        (
            "[pools.default.health]\nwindoww = 3\n",
            "pools.default.health.windoww (line 2): unknown field `windoww`, expected one of `window`, ",
        ),
        (
            "[pools.default.probe]\ntargets = [\"http://a.example/\", { url = \"http://b.example/\", expect_status = \"204\" }]\n",
            "pools.default.probe.targets[1].expect_status (line 2): invalid type: string \"204\", expected u16",
        ),
        (
            "[pools.default.probe]\ntargets = [{ url = \"http://a.example/\", expect_stauts = 204 }]\n",
            "pools.default.probe.targets[0].expect_stauts (line 2): unknown field `expect_stauts`, expected one of `url`, ",
        ),
        (
            "[pools.default.probe]\ntargets = [{ expect_status = 204 }]\n",
            "pools.default.probe.targets[0] (line 2): missing field `url`",
        ),
        (
            "[pools.default.probe]\ntargets = [204]\n",
            "pools.default.probe.targets[0] (line 2): invalid type: integer `204`, expected a URL or a table",
        ),
        (
            "[serverr]\n",
            "serverr (line 1): unknown field `serverr`, expected one of `server`, ",
        ),
    ];
    for (text, want) in cases {
        let p = problems(text);
        assert_eq!(p.len(), 1, "{text}: {p:?}");
        assert!(
            p[0].starts_with(want),
            "{text}:\n got {}\nwant {want}",
            p[0]
        );
    }
    // A syntax error has no key: the line alone, as before.
    let p = problems("[pools.default]\nupstreams = [\"direct://\"\n");
    assert!(p[0].starts_with("line "), "{p:?}");
}

#[test]
fn sources_are_validated_with_keys_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = "[pools.default]\nupstreams_file = \"ups.txt\"\n";
    let err = Config::parse(text, "t", Some(dir.path())).unwrap_err();
    assert!(
        err.problems[0].starts_with("pools.default.upstreams_file")
            && err.problems[0].contains("cannot read"),
        "{:?}",
        err.problems
    );
    // Lines are the sources task's business: a bad one does not refuse the config.
    std::fs::write(
        dir.path().join("ups.txt"),
        "# c\nbogus\nhttp://127.0.0.1:3128#a\n",
    )
    .unwrap();
    let c = Config::parse(text, "t", Some(dir.path())).unwrap();
    let pool = c.pool("default").unwrap();
    assert!(pool.upstreams.is_empty());
    assert_eq!(
        pool.sources.file.as_deref(),
        Some(dir.path().join("ups.txt").as_path())
    );
    assert_eq!(pool.sources.admission.schemes.len(), 4);

    let p = problems(
        "[pools.default]\nupstreams_url = \"ftp://lists.example/p.txt\"\nupstreams_url_interval = \"1s\"\n[pools.default.admission]\nschemes = [\"direct\", \"gopher\"]\nmax_latency = \"soon\"\nconcurrency = 0\n",
    );
    for key in [
        "pools.default.upstreams_url:",
        "pools.default.upstreams_url_interval:",
        "pools.default.admission.schemes[0]:",
        "pools.default.admission.schemes[1]:",
        "pools.default.admission.max_latency:",
        "pools.default.admission.concurrency:",
    ] {
        assert!(p.iter().any(|m| m.starts_with(key)), "{key} in {p:?}");
    }
    let p = problems("[pools.default]\nupstreams_url = \"https://lists.example/p.txt\"\n");
    assert!(
        p.iter()
            .any(|m| m.starts_with("pools.default.upstreams_url:") && m.contains("probe")),
        "{p:?}"
    );
    let ok = Config::parse(
        "[pools.default]\nupstreams_url = \"https://lists.example/p.txt\"\n[pools.default.probe]\ntargets = [\"http://a.example/\"]\n[pools.default.admission]\nschemes = [\"socks5\"]\nmax_latency = \"2s\"\n",
        "t",
        None,
    )
    .unwrap();
    let s = &ok.pools["default"].sources;
    assert_eq!(s.url_interval, Duration::from_secs(600));
    assert_eq!(s.admission.schemes, vec![Scheme::Socks5]);
    assert_eq!(s.admission.max_latency, Some(Duration::from_secs(2)));
}

#[test]
fn weighted_is_a_strategy() {
    let c = Config::parse(
        "[pools.default]\nupstreams = [\"direct://\"]\nstrategy = \"weighted\"\n",
        "t",
        None,
    )
    .unwrap();
    assert_eq!(c.pools["default"].strategy, Strategy::Weighted);
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
fn probe_section_is_validated_with_keys_named() {
    let ok = Config::parse(
        "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.probe]\ntargets = [\"http://a.example/ok\", { url = \"https://b.example/\", expect_status = 204 }]\nexpect_body = \"fine\"\ninterval = \"45s\"\n",
        "t",
        None,
    )
    .unwrap();
    let probe = ok.pools["default"].probe.clone().unwrap();
    assert_eq!(probe.targets.len(), 2);
    assert_eq!(probe.targets[0].expect_body.as_deref(), Some("fine"));
    assert_eq!(probe.targets[1].expect_status, http::StatusCode::NO_CONTENT);
    assert!(probe.targets[1].https);
    assert_eq!(probe.interval, Duration::from_secs(45));
    assert_eq!(probe.successes, DEFAULT_PROBE_SUCCESSES);

    let bad = Config::parse(
        "[pools.default]\nupstreams = [\"direct://\"]\n[pools.default.probe]\ntargets = [\"ftp://x\"]\nexpect_status = 99\nsuccesses = 0\nmax_latency = \"1m\"\ntimeout = \"5s\"\n",
        "t",
        None,
    )
    .unwrap_err()
    .to_string();
    for key in [
        "pools.default.probe.targets[0]",
        "pools.default.probe.expect_status",
        "pools.default.probe.successes",
        "pools.default.probe.max_latency",
    ] {
        assert!(bad.contains(key), "{key} not named in: {bad}");
    }
}
