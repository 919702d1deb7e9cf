//! The access log and the byte counts, end to end: requests and a tunnel through an
//! authenticating gateway leave one JSON line each with every field, never a password (the
//! client's or the upstream's); a tunnel's bytes show in `/status` and `/metrics` while it is
//! still open; a reopen (logrotate) moves the writing to a new file; the combined format writes
//! Apache's fields first.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::auth::hash_password_with_cost;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CLIENT_PASSWORD: &str = "wonderland-secret";
const UPSTREAM_PASSWORD: &str = "upstream-secret";
const FIELDS: &[&str] = &[
    "time",
    "client",
    "user",
    "session",
    "pool",
    "label",
    "upstream",
    "target",
    "method",
    "status",
    "outcome",
    "error",
    "bytes_up",
    "bytes_down",
    "duration_ms",
    "retries",
    "instance",
];

async fn gateway(upstream: &FakeProxy, echo_port: u16, log: &Path, format: &str) -> TestGateway {
    let hash = hash_password_with_cost(CLIENT_PASSWORD, 8, 1, 1).unwrap();
    TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\nconnect_ports = [{echo_port}]\n\
         [log]\naccess = {log:?}\naccess_format = \"{format}\"\n\
         [auth.users.alice]\npassword_hash = \"{hash}\"\n\
         [pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url_with_auth(),
    ))
    .await
}

/// Opens a CONNECT tunnel through the gateway as alice.
async fn tunnel(gw: &TestGateway, port: u16) -> TcpStream {
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    let login =
        base64::engine::general_purpose::STANDARD.encode(format!("alice:{CLIENT_PASSWORD}"));
    s.write_all(
        format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Proxy-Authorization: Basic {login}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "tunnel closed early");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

/// The file's lines once it holds at least `n` (waits for the writer).
async fn lines(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} lines of {n} in {}:\n{text}",
            lines.len(),
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/status` once `cond` holds (10 s at most).
async fn status_when(gw: &TestGateway, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = gw.status().await;
        if cond(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "waiting for {what}: {s}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_a_tunnel_leave_a_line_each_and_bytes_count_as_they_flow() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let echo = common::echo_server().await.port();
    let upstream =
        FakeProxy::start(FakeProxyOpts::with_credentials("upuser", UPSTREAM_PASSWORD)).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let gw = gateway(&upstream, echo, &path, "json").await;

    // Two plain requests as alice, one with a session, and one without credentials (407).
    let alice = gw.client_via(
        &format!("http://alice:{CLIENT_PASSWORD}@{}", gw.proxy),
        None,
    );
    for session in [None, Some("s1")] {
        let mut req = alice.post(origin.url("/ok")).body("hello body");
        if let Some(s) = session {
            req = req.header("X-Pool-Session", s);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 407);

    // A tunnel: its bytes show in /status and /metrics while it is open.
    let mut t = tunnel(&gw, echo).await;
    let payload = vec![7u8; 100_000];
    t.write_all(&payload).await.unwrap();
    let mut back = vec![0u8; payload.len()];
    t.read_exact(&mut back).await.unwrap();
    let status = status_when(&gw, "the tunnel's bytes", |s| {
        s["pools"][0]["bytes_up"].as_u64() >= Some(100_000)
            && s["pools"][0]["bytes_down"].as_u64() >= Some(100_000)
    })
    .await;
    assert_eq!(status["tunnels"]["open"], 1, "{status}");
    let up = &status["pools"][0]["upstreams"][0];
    assert!(up["bytes_up"].as_u64().unwrap() >= 100_000, "{up}");
    assert_eq!(status["users"][0]["name"], "alice", "{status}");
    assert!(status["users"][0]["bytes_down"].as_u64().unwrap() >= 100_000);
    let text = gw.metrics().await;
    let up_series = metric(
        &text,
        "poolgate_upstream_bytes_total{pool=\"default\",upstream=",
    );
    assert!(up_series.is_some(), "{text}");
    assert!(
        metric(
            &text,
            "poolgate_pool_bytes_total{pool=\"default\",direction=\"up\"}"
        )
        .unwrap()
            >= 100_000.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "poolgate_user_bytes_total{user=\"alice\",direction=\"down\"}"
        )
        .unwrap()
            >= 100_000.0,
        "{text}"
    );
    // Not yet written: the tunnel's line comes at its end.
    assert!(
        !std::fs::read_to_string(&path)
            .unwrap_or_default()
            .contains("CONNECT")
    );
    drop(t);

    let lines = lines(&path, 4).await;
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let mut by_method: Vec<Value> = Vec::new();
    for line in &lines {
        assert!(!line.contains(CLIENT_PASSWORD), "client password in {line}");
        assert!(
            !line.contains(UPSTREAM_PASSWORD),
            "upstream password in {line}"
        );
        let v: Value = serde_json::from_str(line).unwrap();
        for f in FIELDS {
            assert!(v.get(*f).is_some(), "{f} missing from {line}");
        }
        assert!(v["instance"].as_str().is_some_and(|s| !s.is_empty()));
        by_method.push(v);
    }
    let connect = by_method.iter().find(|v| v["method"] == "CONNECT").unwrap();
    eprintln!("a tunnel's line: {connect}");
    assert_eq!(connect["status"], 200);
    assert_eq!(connect["outcome"], "ok");
    assert_eq!(connect["user"], "alice");
    assert_eq!(connect["pool"], "default");
    assert_eq!(connect["target"], format!("127.0.0.1:{echo}"));
    assert_eq!(connect["bytes_up"], 100_000);
    assert_eq!(connect["bytes_down"], 100_000);
    assert_eq!(connect["retries"], 0);
    assert!(
        connect["upstream"]
            .as_str()
            .unwrap()
            .contains(&upstream.addr().to_string())
    );
    assert!(connect["label"].is_null());

    let posts: Vec<&Value> = by_method.iter().filter(|v| v["method"] == "POST").collect();
    assert_eq!(posts.len(), 2, "{lines:#?}");
    for p in &posts {
        assert_eq!(p["status"], 200);
        assert_eq!(p["outcome"], "ok");
        assert_eq!(p["user"], "alice");
        assert_eq!(p["bytes_up"], "hello body".len());
        assert!(p["bytes_down"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["target"], origin.authority());
        assert!(p["error"].is_null());
    }
    assert!(posts.iter().any(|p| p["session"] == "s1"), "{posts:?}");

    let refused = by_method.iter().find(|v| v["status"] == 407).unwrap();
    assert_eq!(refused["outcome"], "gateway-error");
    assert_eq!(refused["error"], "auth-required");
    assert!(refused["user"].is_null() && refused["upstream"].is_null());

    let s = gw.status().await;
    assert_eq!(s["access_log"]["lines_written"], 4, "{s}");
    assert_eq!(s["access_log"]["lines_dropped"], 0, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_moves_the_writing_to_a_new_file_and_combined_lines_read_as_apaches() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let gw = gateway(&upstream, 1, &path, "combined").await;
    let alice = gw.client_via(
        &format!("http://alice:{CLIENT_PASSWORD}@{}", gw.proxy),
        None,
    );
    let get = || async {
        let resp = alice.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    };
    get().await;
    let first = lines(&path, 1).await;
    let line = &first[0];
    assert!(line.starts_with("127.0.0.1 - alice ["), "{line}");
    assert!(
        line.contains(&format!("] \"GET {} HTTP/1.1\" 200 ", origin.authority())),
        "{line}"
    );
    for key in [
        " pool=default ",
        " outcome=ok ",
        " error=- ",
        " bytes_up=0 ",
        " retries=0 ",
        " instance=",
    ] {
        assert!(line.contains(key), "{key} missing from {line}");
    }

    // logrotate: move the file away, then ask for a reopen (SIGUSR1).
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&path, &rotated).unwrap();
    gw.running().reopen_logs();
    tokio::time::sleep(Duration::from_millis(600)).await;
    get().await;
    let fresh = lines(&path, 1).await;
    assert_eq!(fresh.len(), 1, "{fresh:?}");
    assert_eq!(
        std::fs::read_to_string(&rotated).unwrap().lines().count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_writer_drops_lines_and_traffic_goes_on() {
    // The log is a pipe whose reader never reads: once the pipe is full the writer blocks, the
    // one-line queue fills, and every further line is dropped, while requests keep being served.
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("access.pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let reader_path = fifo.clone();
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let f = std::fs::File::open(&reader_path).unwrap();
        opened_tx.send(()).unwrap();
        // Held open, never read, until the test ends.
        std::thread::sleep(Duration::from_secs(120));
        drop(f);
    });
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [log]\naccess = {fifo:?}\naccess_buffer_lines = 1\n\
         [pools.default]\nupstreams = [\"{}\"]\n",
        upstream.url(),
    ))
    .await;
    opened_rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let client = gw.client();
    let started = Instant::now();
    // A pipe holds 64 KiB: some 200 lines of about 300 bytes.
    for _ in 0..600 {
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let s = gw.status().await;
    let log = &s["access_log"];
    let dropped = log["lines_dropped"].as_u64().unwrap();
    let written = log["lines_written"].as_u64().unwrap();
    eprintln!(
        "600 requests in {:?}: {written} lines written, {dropped} dropped",
        started.elapsed()
    );
    assert!(dropped > 0, "{log}");
    assert!(written + dropped <= 600, "{log}");
    let text = gw.metrics().await;
    assert_eq!(
        metric(&text, "poolgate_access_log_lines_total{result=\"dropped\"}"),
        Some(dropped as f64),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_past_per_upstream_max_show_bytes_per_pool_only() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let a = FakeProxy::start(FakeProxyOpts::default()).await;
    let b = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start_with(
        "default_pool = \"big\"",
        &format!(
            "[policy]\nallow_private_targets = true\n\
         [metrics]\nper_upstream_max = 1\n\
         [pools.big]\nupstreams = [\"{}\", \"{}\"]\n\
         [pools.small]\nupstreams = [\"{}#s\"]\n",
            a.url(),
            b.url(),
            a.url(),
        ),
    )
    .await;
    for pool in ["big", "small"] {
        let resp = gw
            .client()
            .post(origin.url("/ok"))
            .header("X-Pool-Name", pool)
            .body("0123456789")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let s = status_when(&gw, "both pools' bytes", |s| {
        s["pools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["bytes_up"] == 10)
    })
    .await;
    for p in s["pools"].as_array().unwrap() {
        for u in p["upstreams"].as_array().unwrap() {
            assert_eq!(u["bytes_up"].is_null(), p["name"] == "big", "{p}");
        }
    }
    let text = gw.metrics().await;
    assert!(
        !text.contains("poolgate_upstream_bytes_total{pool=\"big\""),
        "{text}"
    );
    assert!(text.contains("poolgate_upstream_bytes_total{pool=\"small\""));
    assert_eq!(
        metric(
            &text,
            "poolgate_pool_bytes_total{pool=\"big\",direction=\"up\"}"
        ),
        Some(10.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_exhausted_refusal_is_counted_and_logged_with_its_pool() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts {
        delay: Some(Duration::from_millis(800)),
        ..FakeProxyOpts::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [log]\naccess = {path:?}\n\
         [pools.default]\nupstreams = [\"{}\"]\nmax_concurrency = 1\nqueue_timeout = \"50ms\"\n",
        upstream.url(),
    ))
    .await;
    let text = gw.metrics().await;
    assert_eq!(
        metric(
            &text,
            "poolgate_pool_refusals_total{pool=\"default\",code=\"pool-exhausted\"}"
        ),
        Some(0.0),
        "{text}"
    );
    let client = gw.client();
    let slow = tokio::spawn({
        let client = client.clone();
        let url = origin.url("/slow");
        async move { client.get(url).send().await.unwrap().status() }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let resp = client.get(origin.url("/refused")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["x-pool-error"], "pool-exhausted");
    assert_eq!(slow.await.unwrap(), 200);
    let text = gw.metrics().await;
    assert_eq!(
        metric(
            &text,
            "poolgate_pool_refusals_total{pool=\"default\",code=\"pool-exhausted\"}"
        ),
        Some(1.0),
        "{text}"
    );
    let lines = lines(&path, 2).await;
    let refused: Value = lines
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["status"] == 503)
        .unwrap();
    assert_eq!(refused["outcome"], "gateway-error");
    assert_eq!(refused["error"], "pool-exhausted");
    assert_eq!(refused["pool"], "default");
    assert!(refused["upstream"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reopens_its_access_log_on_sigusr1_and_sighup() {
    use common::gateway::GatewayProcess;
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let gw = GatewayProcess::spawn(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [policy]\nallow_private_targets = true\n\
         [log]\naccess = {path:?}\n\
         [pools.default]\nupstreams = [\"direct://\"]\n"
    ))
    .await;
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{}", gw.proxy)).unwrap())
        .build()
        .unwrap();
    let get = || async {
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    };
    get().await;
    lines(&path, 1).await;
    for (i, signal) in ["USR1", "HUP"].into_iter().enumerate() {
        let rotated = dir.path().join(format!("access.log.{i}"));
        std::fs::rename(&path, &rotated).unwrap();
        gw.signal(signal);
        // The writer looks for a reopen at least every 250 ms.
        tokio::time::sleep(Duration::from_millis(700)).await;
        get().await;
        assert_eq!(lines(&path, 1).await.len(), 1, "after SIG{signal}");
        assert_eq!(
            std::fs::read_to_string(&rotated).unwrap().lines().count(),
            1,
            "SIG{signal}: nothing more went to the moved file"
        );
    }
    gw.signal("TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_names_the_label_filter_the_request_asked_for() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let us = FakeProxy::start(FakeProxyOpts::default()).await;
    let de = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let gw = TestGateway::start(&format!(
        "[policy]\nallow_private_targets = true\n\
         [log]\naccess = {path:?}\n\
         [pools.default]\nupstreams = [\
         {{ url = \"{}\", labels = {{ country = \"us\" }} }}, \
         {{ url = \"{}\", labels = {{ country = \"de\" }} }}]\n",
        us.url(),
        de.url(),
    ))
    .await;
    let resp = gw
        .client()
        .get(origin.url("/ok"))
        .header("X-Pool-Labels", "country=de")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.bytes().await.unwrap();
    let line: Value = serde_json::from_str(&lines(&path, 1).await[0]).unwrap();
    assert_eq!(line["label"], "country=de", "{line}");
    assert!(
        line["upstream"]
            .as_str()
            .unwrap()
            .contains(&de.addr().to_string()),
        "{line}"
    );
}
