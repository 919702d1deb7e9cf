//! The `poolgate` binary as an operator meets it: `check`, the shipped config, and SIGTERM.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::gateway::GatewayProcess;
use common::{Origin, OriginBehaviour};

const BIN: &str = env!("CARGO_BIN_EXE_poolgate");

fn write_config(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn shipped_gateway_toml_is_valid() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml");
    let config = poolgate::config::Config::load(std::path::Path::new(path)).unwrap();
    assert_eq!(config.store, poolgate::config::StoreConfig::Memory);
    assert_eq!(
        config.pools["default"].upstreams[0].id.as_str(),
        "direct://"
    );
    let out = std::process::Command::new(BIN)
        .args(["check", "--config", path])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The image's config is `gateway.toml` with the one substitution the Dockerfile makes (`sed -i
/// 's/^<from>/<to>/'`). It must still apply (a reworded `listen` line would leave the proxy on
/// the container's loopback, reachable from nowhere), the result must load, and the Dockerfile
/// must expose exactly the ports that listen beyond loopback: the proxy's, not the admin's.
#[test]
fn the_docker_images_config_loads_and_its_exposed_ports_listen() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    let source = dockerfile
        .lines()
        .find_map(|l| {
            l.strip_prefix("COPY ")
                .and_then(|rest| rest.strip_suffix(" /etc/poolgate/gateway.toml"))
        })
        .expect("the Dockerfile copies a config to /etc/poolgate/gateway.toml");
    let config =
        poolgate::config::Config::load(std::path::Path::new(&format!("{root}/{source}"))).unwrap();
    assert_eq!(config.server.listen.to_string(), "0.0.0.0:8080");
    assert!(config.server.admin_listen.ip().is_loopback());
    assert!(config.auth.users.is_empty(), "the docs say it has no users");
    // Never an open proxy: only loopback and private ranges may use it.
    let cidrs = config
        .auth
        .client_cidrs
        .clone()
        .expect("a client allowlist");
    for public in ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888"] {
        let ip: std::net::IpAddr = public.parse().unwrap();
        assert!(!cidrs.iter().any(|c| c.contains(&ip)), "{public} allowed");
    }
    for private in ["127.0.0.1", "10.1.2.3", "172.17.0.1", "192.168.1.10"] {
        let ip: std::net::IpAddr = private.parse().unwrap();
        assert!(cidrs.iter().any(|c| c.contains(&ip)), "{private} refused");
    }

    let exposed: Vec<u16> = dockerfile
        .lines()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|ports| ports.split_whitespace().map(|p| p.parse().unwrap()))
        .collect();
    let reachable: Vec<u16> = [config.server.listen, config.server.admin_listen]
        .iter()
        .filter(|a| !a.ip().is_loopback())
        .map(|a| a.port())
        .collect();
    assert_eq!(
        exposed, reachable,
        "EXPOSE lists the ports that listen beyond loopback"
    );
}

#[test]
fn check_names_every_bad_key_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        r#"
[server]
listen = "127.0.0.1:99999"
[pools.default]
upstreams = ["http://user:topsecret@10.0.0.1", "gopher://x:1"]
strategy = "fastest"
queue_timeout = "later"
"#,
    );
    let out = std::process::Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for key in [
        "server.listen",
        "pools.default.upstreams[0]",
        "pools.default.upstreams[1]",
        "pools.default.strategy",
        "pools.default.queue_timeout",
    ] {
        assert!(err.contains(key), "`{key}` not named in:\n{err}");
    }
    assert!(
        !err.contains("topsecret"),
        "a credential leaked into the error:\n{err}"
    );

    // A syntax error names its line; an unknown key is named too.
    let path = write_config(
        &dir,
        "[pools.default]\nupstreams = [\"direct://\"]\nmax_conc = 3\n",
    );
    let out = std::process::Command::new(BIN)
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 3") && err.contains("max_conc"), "{err}");

    // Running with a bad config refuses to start, with the same message.
    let out = std::process::Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_conc"));
}

#[test]
fn check_names_the_full_key_of_a_wrongly_typed_value() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(
        &dir,
        "[pools.default]\nupstreams = [\"direct://\"]\nretries = \"many\"\n",
    );
    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pools.default.retries (line 3): invalid type: string \"many\", expected u32"),
        "{err}"
    );
}

#[test]
fn check_warns_about_skipped_list_lines_without_failing_or_echoing_them() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ups.txt"),
        "# list\nhttp://u:pw@127.0.0.1:3128#a\nhttp://u:topsecret@nohost\n",
    )
    .unwrap();
    let path = write_config(&dir, "[pools.default]\nupstreams_file = \"ups.txt\"\n");
    let out = std::process::Command::new(BIN)
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("pools.default.upstreams_file") && err.contains("line 3"),
        "{err}"
    );
    assert!(!err.contains("topsecret"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("ok"));
}

/// `check` on a config that loads but carries a risk: it says which key and what to set, and
/// still exits 0; the shipped configs carry none. An open proxy is not a warning: the gateway
/// refuses to start with it, and `check` fails saying so.
#[test]
fn check_warns_about_risky_but_valid_configs_and_fails_an_open_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str| {
        let path = write_config(&dir, text);
        let out = std::process::Command::new(BIN)
            .args(["check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), err)
    };
    let warnings = |err: &str| err.lines().filter(|l| l.starts_with("warning:")).count();
    let pool = "[pools.default]\nupstreams = [\"direct://\"]\n";

    // Admin listener beyond loopback: it already needs the admin token; check warns as well.
    let (ok, err) = check(&format!(
        "[server]\nadmin_listen = \"0.0.0.0:8081\"\nadmin_token = \"0123456789abcdef\"\n{pool}"
    ));
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: server.admin_listen")
            && err.contains("admin_listen = \"127.0.0.1:8081\""),
        "{err}"
    );
    assert!(!err.contains("0123456789abcdef"), "a token leaked:\n{err}");
    let (ok, err) = check(&format!(
        "[server]\nadmin_listen = \"0.0.0.0:8081\"\n{pool}"
    ));
    assert!(!ok && err.contains("server.admin_token"), "{err}");

    // Private targets with a direct upstream, inline or from an upstreams file.
    let (ok, err) = check(&format!("[policy]\nallow_private_targets = true\n{pool}"));
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: policy.allow_private_targets")
            && err.contains("pools.default.upstreams[0]")
            && err.contains("allow_private_targets = false")
            && err.contains("policy.allow_targets"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("ups.txt"),
        "http://127.0.0.1:3128\ndirect://#nic\n",
    )
    .unwrap();
    let (ok, err) = check(
        "[policy]\nallow_private_targets = true\n[pools.default]\nupstreams_file = \"ups.txt\"\n",
    );
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: policy.allow_private_targets")
            && err.contains("pools.default.upstreams_file"),
        "{err}"
    );
    let (ok, err) = check(
        "[policy]\nallow_private_targets = true\n[pools.default]\nupstreams = [\"http://127.0.0.1:3128\"]\n",
    );
    assert!(ok && warnings(&err) == 0, "{err}");

    // Shards on the embedded store: valid, and pointless.
    let (ok, err) = check("[pools.default]\nupstreams = [\"http://127.0.0.1:3128\"]\nshards = 4\n");
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: pools.default.shards") && err.contains("kind = \"redis\""),
        "{err}"
    );
    assert!(
        !err.contains("  "),
        "a warning with a run of spaces:\n{err}"
    );
    assert_eq!(warnings(&err), 1, "{err}");

    // A client allowlist that admits every address leaves the proxy open.
    let (ok, err) = check(&format!(
        "[server]\nlisten = \"0.0.0.0:8080\"\n[auth]\nclient_cidrs = [\"10.0.0.0/8\", \"0.0.0.0/0\"]\n{pool}"
    ));
    assert!(ok, "{err}");
    assert!(
        err.contains("warning: auth.client_cidrs") && err.contains("0.0.0.0/0"),
        "{err}"
    );

    // No users and no client allowlist beyond loopback: refused, by run and by check.
    let (ok, err) = check(&format!("[server]\nlisten = \"0.0.0.0:8080\"\n{pool}"));
    assert!(!ok, "{err}");
    assert!(
        err.contains("server.listen")
            && err.contains("client_cidrs")
            && err.contains("refuses to start"),
        "{err}"
    );

    // The shipped configs warn about nothing.
    let root = env!("CARGO_MANIFEST_DIR");
    for shipped in ["gateway.toml", "docker/gateway.toml"] {
        let out = std::process::Command::new(BIN)
            .args(["check", "--config", &format!("{root}/{shipped}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && warnings(&err) == 0,
            "{shipped}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_20_in_flight_requests_finish_then_exits_zero() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let gw = GatewayProcess::spawn(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"20s\"\n\
         [policy]\nallow_private_targets = true\n\
         [pools.default]\nupstreams = [\"direct://\"]\n# origin on {}\n",
        origin.port()
    ))
    .await;
    let proxy = gw.proxy.clone();
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{proxy}")).unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let client = client.clone();
        let url = origin.url("/slow?ms=1500");
        requests.spawn(async move {
            let resp = client.get(url).send().await?;
            let status = resp.status();
            resp.bytes().await?;
            Ok::<_, reqwest::Error>(status)
        });
    }
    assert!(
        common::wait_until(|| origin.in_flight() == 20, Duration::from_secs(10)).await,
        "20 requests in flight"
    );
    gw.signal("TERM");

    let mut ok = 0;
    while let Some(r) = requests.join_next().await {
        assert_eq!(r.unwrap().unwrap(), 200);
        ok += 1;
    }
    assert_eq!(ok, 20);
    let mut gw = gw;
    let status = tokio::time::timeout(Duration::from_secs(20), gw.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let log = gw.log.await.unwrap().join("\n");
    assert!(
        log.contains("SIGTERM") && log.contains("shutdown complete"),
        "{log}"
    );

    // Nothing listens any more.
    assert!(tokio::net::TcpStream::connect(&proxy).await.is_err());
}

#[test]
fn hash_password_prints_an_argon2_hash_that_verifies() {
    use std::io::Write as _;
    let mut child = std::process::Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"correct horse battery\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hash = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(hash.starts_with("$argon2id$"), "{hash}");
    assert!(!hash.contains("correct horse"));
    // It is accepted as a user's password_hash.
    let text = format!(
        "[auth.users.alice]\npassword_hash = \"{hash}\"\n[pools.default]\nupstreams = [\"direct://\"]\n"
    );
    let config = poolgate::config::Config::parse(&text, "t", None).unwrap();
    assert!(config.auth.required());
    // A plain password pasted by mistake is refused without being echoed.
    let err = poolgate::config::Config::parse(&text.replace(&hash, "hunter2-plain"), "t", None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("auth.users.alice.password_hash") && !err.contains("hunter2"),
        "{err}"
    );
}
