//! The SOCKS5 front door end to end: real clients (curl, Python requests with PySocks, headless
//! Chromium) through a pool, sticky sessions from the username, the reply codes for policy,
//! logins and commands, malformed and slow handshakes, the connection limits shared with the
//! HTTP port, `/status` and `/metrics` by front door, and two instances on one Redis sharing a
//! cap for SOCKS and HTTP clients alike.
//!
//! Everything listens on loopback; the fake upstreams dial loopback only, and no test of a denied
//! target uses a `direct://` upstream.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, RedisServer, TestGateway};
use poolgate::auth::hash_password_with_cost;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Cheap argon2 cost for tests.
fn hash(pw: &str) -> String {
    hash_password_with_cost(pw, 8, 1, 1).unwrap()
}

/// A gateway with a SOCKS5 port, the user `user`/`pw` when `users`, private targets allowed and
/// CONNECT allowed to `port`, the default pool of `upstreams`, and `extra` appended.
async fn gateway(upstreams: &[&FakeProxy], port: u16, users: bool, extra: &str) -> TestGateway {
    let list: Vec<String> = upstreams.iter().map(|u| format!("{:?}", u.url())).collect();
    let users = if users {
        format!("[auth.users.user]\npassword_hash = \"{}\"\n", hash("pw"))
    } else {
        String::new()
    };
    TestGateway::start_with(
        "socks_listen = \"127.0.0.1:0\"\n",
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{port}]\n{users}\
             [pools.default]\nupstreams = [{}]\n{extra}",
            list.join(", ")
        ),
    )
    .await
}

/// Reads exactly `n` bytes, or what came before the connection closed.
async fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut out[got..])).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(k)) => got += k,
            Err(_) => panic!("no answer within 10 s (got {:?})", &out[..got]),
        }
    }
    out.truncate(got);
    out
}

/// Waits (at most 10 s) for the gateway to close `s`, returning the bytes it sent first.
async fn closed(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chunk = [0u8; 64];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(k)) => out.extend_from_slice(&chunk[..k]),
            Err(_) => panic!("still open after 10 s (got {out:?})"),
        }
    }
}

/// A CONNECT request to `127.0.0.1:port`.
fn connect_v4(port: u16) -> Vec<u8> {
    let mut r = vec![5, 1, 0, 1, 127, 0, 0, 1];
    r.extend_from_slice(&port.to_be_bytes());
    r
}

/// Greets and logs in as `user`/`pw`: the login status byte.
async fn login(s: &mut TcpStream, user: &str, pw: &str) -> Option<u8> {
    s.write_all(&[5, 1, 2]).await.unwrap();
    assert_eq!(read_n(s, 2).await, vec![5, 2], "method selection");
    let mut msg = vec![1, user.len() as u8];
    msg.extend_from_slice(user.as_bytes());
    msg.push(pw.len() as u8);
    msg.extend_from_slice(pw.as_bytes());
    s.write_all(&msg).await.unwrap();
    let status = read_n(s, 2).await;
    status.get(1).copied()
}

/// Logs in (or, without `creds`, greets with no authentication), sends `request` and returns the
/// reply code, with the stream for a tunnel.
async fn request(
    socks: SocketAddr,
    creds: Option<(&str, &str)>,
    request: &[u8],
) -> (u8, TcpStream) {
    let mut s = TcpStream::connect(socks).await.unwrap();
    match creds {
        Some((u, p)) => assert_eq!(login(&mut s, u, p).await, Some(0), "login of {u}"),
        None => {
            s.write_all(&[5, 1, 0]).await.unwrap();
            assert_eq!(read_n(&mut s, 2).await, vec![5, 0]);
        }
    }
    s.write_all(request).await.unwrap();
    let reply = read_n(&mut s, 10).await;
    assert_eq!(reply.len(), 10, "a whole reply: {reply:?}");
    assert_eq!((reply[0], reply[2]), (5, 0), "{reply:?}");
    (reply[1], s)
}

/// `GET path` over an open tunnel to `origin`: the response text.
async fn get_over(mut s: TcpStream, origin: &Origin, path: &str) -> String {
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        origin.authority()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    String::from_utf8_lossy(&closed(&mut s).await).into_owned()
}

/// Polls `/status` until `cond` holds (at most 10 s).
async fn eventually(
    gw: &TestGateway,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = gw.status().await;
        if cond(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many CONNECTs each fake upstream has seen.
fn connects(ups: &[&FakeProxy]) -> Vec<usize> {
    ups.iter().map(|u| u.connects()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_sessions_stick_across_connections_and_status_counts_the_door() {
    let origin = Origin::start(OriginBehaviour::fixed("through-socks")).await;
    let ups = [
        FakeProxy::start(FakeProxyOpts::default()).await,
        FakeProxy::start(FakeProxyOpts::default()).await,
        FakeProxy::start(FakeProxyOpts::default()).await,
    ];
    let refs: Vec<&FakeProxy> = ups.iter().collect();
    let gw = gateway(&refs, origin.port(), true, "").await;

    let curl = |user: &'static str| {
        let proxy = format!("{user}:pw@{}", gw.socks());
        let url = origin.url("/page");
        async move {
            tokio::process::Command::new("curl")
                .args(["-sS", "--max-time", "10", "--socks5-hostname", &proxy, &url])
                .env_clear()
                .output()
                .await
                .expect("curl runs")
        }
    };
    let mut per_session = Vec::new();
    for user in ["user-session-s1", "user-session-s2"] {
        let before = connects(&refs);
        for _ in 0..4 {
            let out = curl(user).await;
            assert!(
                out.status.success(),
                "curl failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), "through-socks");
        }
        let after = connects(&refs);
        let moved: Vec<usize> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        // Every connection of the session went through one upstream, by the fakes' records.
        assert_eq!(moved.iter().filter(|n| **n > 0).count(), 1, "{moved:?}");
        assert_eq!(moved.iter().sum::<usize>(), 4, "{moved:?}");
        per_session.push(moved);
    }
    for up in &ups {
        for seen in up.seen() {
            assert_eq!(seen.method, "CONNECT");
            assert_eq!(seen.target, origin.authority());
        }
    }

    // A wrong password: curl is refused at the login, nothing reaches an upstream.
    let before = connects(&refs);
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--socks5-hostname"])
        .arg(format!("user:nope@{}", gw.socks()))
        .arg(origin.url("/page"))
        .env_clear()
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(connects(&refs), before);

    let status = eventually(&gw, "the tunnels to end", |s| {
        s["tunnels"]["open"] == 0 && s["requests"]["in_flight"] == 0
    })
    .await;
    assert_eq!(status["requests"]["by_door"]["socks5"], 8, "{status}");
    assert_eq!(status["requests"]["by_door"]["http"], 0, "{status}");
    assert_eq!(status["tunnels"]["by_door"]["socks5"], 8, "{status}");
    assert_eq!(status["socks5"]["replies"]["succeeded"], 8, "{status}");
    assert_eq!(status["socks5"]["handshakes_failed"], 1, "{status}");
    assert_eq!(status["requests"]["completed"], 8, "{status}");
    let metrics = gw.metrics().await;
    for line in [
        "poolgate_requests_accepted_total{door=\"socks5\"} 8",
        "poolgate_tunnels_total{door=\"socks5\"} 8",
        "poolgate_socks5_replies_total{reply=\"succeeded\"} 8",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_over_socks5h_keeps_its_session() {
    let have = std::process::Command::new("python3")
        .args(["-c", "import socks, requests"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        have,
        "python3 with requests and PySocks is needed (scripts/test installs them)"
    );
    let origin = Origin::start(OriginBehaviour::fixed("hello-python")).await;
    let ups = [
        FakeProxy::start(FakeProxyOpts::default()).await,
        FakeProxy::start(FakeProxyOpts::default()).await,
    ];
    let refs: Vec<&FakeProxy> = ups.iter().collect();
    let gw = gateway(&refs, origin.port(), true, "").await;
    let script = format!(
        "import requests\n\
         proxy = 'socks5h://user-session-py1:pw@{socks}'\n\
         s = requests.Session()\n\
         s.trust_env = False\n\
         for _ in range(3):\n\
         \x20   r = s.get('{url}', proxies={{'http': proxy, 'https': proxy}}, timeout=10)\n\
         \x20   r.raise_for_status()\n\
         \x20   print(r.text)\n",
        socks = gw.socks(),
        url = origin.url("/py"),
    );
    let out = tokio::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        vec!["hello-python"; 3]
    );
    let used: Vec<usize> = connects(&refs);
    assert_eq!(used.iter().filter(|n| **n > 0).count(), 1, "{used:?}");
    assert!(used.iter().sum::<usize>() >= 1, "{used:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_fetches_a_page_through_the_pool() {
    let page =
        "<html><head><title>t</title></head><body><p id=\"m\">socks-chromium-ok</p></body></html>";
    let origin = Origin::start(OriginBehaviour::fixed(page)).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    // Chromium does not log in to SOCKS5 proxies: no users, loopback clients only.
    let gw = gateway(
        &[&up],
        origin.port(),
        false,
        "[auth]\nclient_cidrs = [\"127.0.0.0/8\"]\n",
    )
    .await;
    let profile = tempfile::tempdir().unwrap();
    let run = tokio::process::Command::new("/usr/bin/chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--proxy-server=socks5://{}", gw.socks()))
        // Chromium sends loopback straight to the target unless told otherwise.
        .arg("--proxy-bypass-list=<-loopback>")
        .arg("--dump-dom")
        .arg(origin.url("/"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .expect("chromium finishes within 90 s")
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("socks-chromium-ok"),
        "dom: {dom}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Through the pool's upstream, not around it.
    assert!(
        up.seen()
            .iter()
            .any(|s| s.method == "CONNECT" && s.target == origin.authority()),
        "{:?}",
        up.targets()
    );
    let status = gw.status().await;
    assert!(
        status["tunnels"]["by_door"]["socks5"].as_u64().unwrap() >= 1,
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_targets_get_02_and_never_reach_an_upstream() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    // Private targets are denied by default; the port is allowed.
    let gw = TestGateway::start_with(
        "socks_listen = \"127.0.0.1:0\"\n",
        &format!(
            "[policy]\nconnect_ports = [{}]\n[pools.default]\nupstreams = [{:?}]\n",
            origin.port(),
            up.url()
        ),
    )
    .await;
    let (code, _) = request(gw.socks(), None, &connect_v4(origin.port())).await;
    assert_eq!(code, 2, "an internal address");
    let mut name = vec![5, 1, 0, 3, 9];
    name.extend_from_slice(b"localhost");
    name.extend_from_slice(&origin.port().to_be_bytes());
    let (code, _) = request(gw.socks(), None, &name).await;
    assert_eq!(code, 2, "a name for loopback");
    // A port outside connect_ports.
    let mut public = vec![5, 1, 0, 1, 192, 0, 2, 1];
    public.extend_from_slice(&25u16.to_be_bytes());
    let (code, _) = request(gw.socks(), None, &public).await;
    assert_eq!(code, 2, "a port outside connect_ports");
    assert_eq!(up.connects(), 0);
    assert_eq!(up.connections(), 0);
    let status = gw.status().await;
    assert_eq!(status["socks5"]["replies"]["not_allowed"], 3, "{status}");
    assert_eq!(status["requests"]["rejected"], 3, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_are_checked_and_refused_with_status_01() {
    let origin = Origin::start(OriginBehaviour::fixed("in")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(&[&up], origin.port(), true, "").await;
    let socks = gw.socks();

    // With users, no authentication is not acceptable.
    let mut s = TcpStream::connect(socks).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    assert_eq!(closed(&mut s).await, vec![5, 0xff]);

    for (user, pw) in [
        ("user", "wrong"),
        ("nobody", "pw"),
        // A malformed token is refused, never ignored.
        ("user-session-", "pw"),
        ("user-sesstime-5", "pw"),
    ] {
        let mut s = TcpStream::connect(socks).await.unwrap();
        assert_eq!(login(&mut s, user, pw).await, Some(1), "{user}:{pw}");
        assert_eq!(closed(&mut s).await, Vec::<u8>::new(), "{user}: closed");
    }
    let (code, s) = request(socks, Some(("user", "pw")), &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/x").await.ends_with("in"));
    assert_eq!(up.connects(), 1);
    let status = gw.status().await;
    assert_eq!(status["socks5"]["handshakes_failed"], 5, "{status}");
    assert!(
        status["auth"]["failures"].as_u64().unwrap() >= 2,
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_and_udp_associate_get_07() {
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(&[&up], 80, false, "").await;
    for cmd in [2u8, 3] {
        let (code, mut s) = request(gw.socks(), None, &[5, cmd, 0, 1, 127, 0, 0, 1, 0, 80]).await;
        assert_eq!(code, 7, "command {cmd}");
        assert_eq!(closed(&mut s).await, Vec::<u8>::new());
    }
    assert_eq!(up.connections(), 0);
    let status = gw.status().await;
    assert_eq!(status["socks5"]["replies"]["command_not_supported"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_slow_handshakes_close_and_nothing_else_is_affected() {
    let origin = Origin::start(OriginBehaviour::fixed("fine")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let list = format!("{:?}", up.url());
    let gw = TestGateway::start_with(
        "socks_listen = \"127.0.0.1:0\"\nheader_read_timeout = \"1s\"\n",
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [pools.default]\nupstreams = [{list}]\n",
            origin.port()
        ),
    )
    .await;
    let socks = gw.socks();

    // A slow client holds its connection, sending a byte now and then.
    let mut slow = TcpStream::connect(socks).await.unwrap();
    slow.write_all(&[5]).await.unwrap();
    let slow_started = Instant::now();

    let cases: &[(&str, &[u8], &[u8])] = &[
        (
            "HTTP to the SOCKS port",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"",
        ),
        ("SOCKS4", &[4, 1, 0, 80, 127, 0, 0, 1, 0], b""),
        ("no methods", &[5, 0], &[5, 0xff]),
        ("a method list longer than its count", &[5, 1, 0, 0, 2], b""),
        ("a count larger than its method list", &[5, 3, 0], b""),
        ("truncated greeting", &[5], b""),
        ("truncated request", &[5, 1, 0, 5, 1, 0, 1, 127], &[5, 0]),
        (
            "empty domain",
            &[5, 1, 0, 5, 1, 0, 3, 0, 0, 80],
            &[5, 0, 5, 1, 0, 1, 0, 0, 0, 0, 0, 0],
        ),
        (
            "unknown address type",
            &[5, 1, 0, 5, 1, 0, 9, 0, 80],
            &[5, 0, 5, 8, 0, 1, 0, 0, 0, 0, 0, 0],
        ),
    ];
    for (what, bytes, want) in cases {
        let mut s = TcpStream::connect(socks).await.unwrap();
        s.write_all(bytes).await.unwrap();
        // The client sends nothing more: what is missing never comes.
        s.shutdown().await.unwrap();
        let got = closed(&mut s).await;
        assert_eq!(&got[..], *want, "{what}");
    }

    // Meanwhile a good client gets through.
    let (code, s) = request(socks, None, &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/").await.ends_with("fine"));

    // The slow one is cut off at header_read_timeout, however it trickles.
    slow.write_all(&[1]).await.unwrap();
    assert_eq!(closed(&mut slow).await, Vec::<u8>::new());
    let took = slow_started.elapsed();
    assert!(took < Duration::from_secs(5), "cut off after {took:?}");
    let status = gw.status().await;
    // Every malformed handshake and the slow one; the replies to requests counted by code.
    assert_eq!(status["socks5"]["handshakes_failed"], 10, "{status}");
    assert_eq!(
        status["socks5"]["replies"]["general_failure"], 1,
        "{status}"
    );
    assert_eq!(
        status["socks5"]["replies"]["address_type_not_supported"], 1,
        "{status}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_and_http_connections_share_the_per_client_limit() {
    let origin = Origin::start(OriginBehaviour::fixed("ok")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start_with(
        "socks_listen = \"127.0.0.1:0\"\nmax_connections_per_client = 2\n",
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [pools.default]\nupstreams = [{:?}]\n",
            origin.port(),
            up.url()
        ),
    )
    .await;
    // One SOCKS and one HTTP connection, both mid-handshake / idle.
    let mut held_socks = TcpStream::connect(gw.socks()).await.unwrap();
    held_socks.write_all(&[5, 1, 0]).await.unwrap();
    assert_eq!(read_n(&mut held_socks, 2).await, vec![5, 0]);
    let _held_http = TcpStream::connect(gw.proxy).await.unwrap();
    assert!(
        common::wait_until_async(
            || async { gw.status().await["connections"]["open"] == 2 },
            Duration::from_secs(10)
        )
        .await
    );
    // A third, by either door, is refused at once.
    let mut third = TcpStream::connect(gw.socks()).await.unwrap();
    third.write_all(&[5, 1, 0]).await.unwrap();
    assert_eq!(closed(&mut third).await, Vec::<u8>::new());
    let refused = common::raw_http(
        gw.proxy,
        format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", origin.url("/")).as_bytes(),
    )
    .await;
    assert!(
        String::from_utf8_lossy(&refused).starts_with("HTTP/1.1 503"),
        "{}",
        String::from_utf8_lossy(&refused)
    );
    // Once the SOCKS one is done, there is room again.
    drop(held_socks);
    assert!(
        common::wait_until_async(
            || async { gw.status().await["connections"]["open"] == 1 },
            Duration::from_secs(10)
        )
        .await
    );
    let (code, s) = request(gw.socks(), None, &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/").await.ends_with("ok"));
    assert_eq!(gw.status().await["connections"]["refused"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_session_upstream_gets_the_reply_of_its_failure() {
    let origin = Origin::start(OriginBehaviour::fixed("ok")).await;
    let ups = [
        FakeProxy::start(FakeProxyOpts::default()).await,
        FakeProxy::start(FakeProxyOpts::default()).await,
    ];
    let refs: Vec<&FakeProxy> = ups.iter().collect();
    let gw = gateway(&refs, origin.port(), true, "").await;
    let creds = Some(("user-session-d1", "pw"));
    let (code, s) = request(gw.socks(), creds, &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/").await.ends_with("ok"));
    let bound = ups.iter().position(|u| u.connects() == 1).unwrap();
    ups[bound]
        .set_mode(common::ProxyMode::RefuseConnections)
        .await;
    // The session keeps its upstream: refused, not moved.
    let (code, _) = request(gw.socks(), creds, &connect_v4(origin.port())).await;
    assert_eq!(code, 5, "connection refused");
    assert_eq!(ups[1 - bound].connects(), 0);
    // A client without a session is retried on the other upstream before the reply.
    let (code, s) = request(gw.socks(), Some(("user", "pw")), &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/").await.ends_with("ok"));
    assert_eq!(ups[1 - bound].connects(), 1);
}

/// An upstream proxy that answers CONNECT `502` (it could not reach the target) gives reply `04`
/// host unreachable, for a bound session and, once every upstream said so, for any client.
#[tokio::test]
async fn an_upstream_that_cannot_reach_the_target_gives_04() {
    let origin = Origin::start(OriginBehaviour::fixed("ok")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(&[&up], origin.port(), true, "").await;
    let creds = Some(("user-session-h1", "pw"));
    let (code, s) = request(gw.socks(), creds, &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/").await.ends_with("ok"));
    up.set_mode(common::ProxyMode::Fail502).await;
    let (code, _) = request(gw.socks(), creds, &connect_v4(origin.port())).await;
    assert_eq!(code, 4, "host unreachable, for the bound session");
    let (code, _) = request(gw.socks(), Some(("user", "pw")), &connect_v4(origin.port())).await;
    assert_eq!(code, 4, "host unreachable, without a session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_a_cap_for_socks_and_http_clients() {
    let redis = RedisServer::start().await;
    let origin = Origin::start(OriginBehaviour::fixed("capped")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         socks_listen = \"127.0.0.1:0\"\n\
         [store]\nkind = \"redis\"\nurl = \"{}\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [{:?}]\nmax_concurrency = 1\nqueue_timeout = \"300ms\"\n",
        redis.url(),
        origin.port(),
        up.url()
    );
    let a = TestGateway::start_text_with(&text, Default::default()).await;
    let b = TestGateway::start_text_with(&text, Default::default()).await;

    // A SOCKS tunnel on instance a holds the upstream's one place...
    let (code, held) = request(a.socks(), None, &connect_v4(origin.port())).await;
    assert_eq!(code, 0);
    // ...so instance b refuses a SOCKS client (01: pool exhausted) and an HTTP client (503).
    let (code, _) = request(b.socks(), None, &connect_v4(origin.port())).await;
    assert_eq!(code, 1, "pool exhausted over SOCKS");
    let resp = b.client().get(origin.url("/")).send().await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["x-pool-error"], "pool-exhausted");
    drop(held);

    // Released, the place goes to an HTTP CONNECT tunnel on b; a's SOCKS client then waits out
    // the queue and is refused.
    let mut tunnel = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while tunnel.is_none() {
        assert!(Instant::now() < deadline, "the place never came back");
        let (s, head) = common::connect_tunnel(b.proxy, origin.addr(), "").await;
        if head.starts_with("HTTP/1.1 200") {
            tunnel = Some(s);
        }
    }
    let (code, _) = request(a.socks(), None, &connect_v4(origin.port())).await;
    assert_eq!(code, 1, "pool exhausted over SOCKS on the other instance");
    drop(tunnel);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, s) = request(a.socks(), None, &connect_v4(origin.port())).await;
        if code == 0 {
            assert!(get_over(s, &origin, "/").await.ends_with("capped"));
            break;
        }
        assert!(Instant::now() < deadline, "the place never came back");
    }
    assert!(up.peak_in_flight() <= 1, "{}", up.peak_in_flight());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_tls_pools_inspect_socks_tunnels_as_connect_tunnels() {
    let origin_ca = common::TestCa::new();
    let origin = Origin::start_tls(OriginBehaviour::fixed("seen-inside"), &origin_ca).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let (ca, ca_key, origin_ca_file) = (
        dir.path().join("ca.pem"),
        dir.path().join("ca-key.pem"),
        dir.path().join("origin-ca.pem"),
    );
    poolgate::intercept::ca::write_new(&ca, &ca_key, "poolgate test interception CA", false)
        .unwrap();
    std::fs::write(&origin_ca_file, origin_ca.cert_pem()).unwrap();
    let gw = TestGateway::start_with(
        "socks_listen = \"127.0.0.1:0\"\n",
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [intercept]\nca_cert = {ca:?}\nca_key = {ca_key:?}\norigin_ca_file = {origin_ca_file:?}\n\
             [pools.default]\nupstreams = [{:?}]\ninspect_tls = true\n",
            origin.port(),
            up.url()
        ),
    )
    .await;
    // curl trusts only the interception CA: the answer can only come from the gateway's TLS.
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&ca)
        .arg("--socks5-hostname")
        .arg(gw.socks().to_string())
        .arg(origin.url("/inside"))
        .env_clear()
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "curl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "seen-inside");
    let status = eventually(&gw, "the tunnel to end", |s| s["tunnels"]["open"] == 0).await;
    let i = &status["intercept"];
    assert_eq!(i["tunnels_inspected"], 1, "{status}");
    assert_eq!(i["requests"], 1, "{status}");
    assert_eq!(status["requests"]["by_door"]["socks5"], 1, "{status}");
    assert_eq!(up.connects(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_outside_client_cidrs_are_closed_before_a_byte_is_read() {
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(
        &[&up],
        80,
        false,
        "[auth]\nclient_cidrs = [\"10.0.0.0/8\"]\n",
    )
    .await;
    let mut s = TcpStream::connect(gw.socks()).await.unwrap();
    // The greeting may or may not be taken before the close; nothing is answered.
    let _ = s.write_all(&[5, 1, 0]).await;
    assert_eq!(closed(&mut s).await, Vec::<u8>::new());
    assert_eq!(up.connections(), 0);
    assert_eq!(gw.status().await["socks5"]["handshakes_failed"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_serve_the_socks_port_and_drain_cleanly() {
    let origin = Origin::start(OriginBehaviour::fixed("from-a-worker")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         socks_listen = \"127.0.0.1:0\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [{:?}]\n",
        origin.port(),
        up.url()
    );
    let options = poolgate::app::StartOptions {
        proxy_threads: 2,
        ..Default::default()
    };
    let gw = TestGateway::start_text_with(&text, options).await;
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let socks = gw.socks();
        let port = origin.port();
        let authority = origin.authority();
        clients.spawn(async move {
            let (code, mut s) = request(socks, None, &connect_v4(port)).await;
            assert_eq!(code, 0);
            let req = format!("GET / HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&closed(&mut s).await).into_owned()
        });
    }
    while let Some(text) = clients.join_next().await {
        assert!(text.unwrap().ends_with("from-a-worker"));
    }
    assert_eq!(up.connects(), 8);
    let status = eventually(&gw, "the tunnels to end", |s| s["tunnels"]["open"] == 0).await;
    assert_eq!(status["tunnels"]["by_door"]["socks5"], 8, "{status}");
    let (drained, leases) = gw.shutdown_counting_leases().await;
    assert_eq!(drained, poolgate::app::Drained::Clean);
    assert_eq!(leases, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn username_labels_select_exits_over_socks_as_over_http() {
    let origin = Origin::start(OriginBehaviour::fixed("labelled")).await;
    let us = FakeProxy::start(FakeProxyOpts::default()).await;
    let de = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = TestGateway::start_with(
        "socks_listen = \"127.0.0.1:0\"\n",
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [auth.users.user]\npassword_hash = \"{}\"\n\
             [pools.default]\nupstreams = [\
             {{ url = {:?}, name = \"us1\", labels = {{ country = \"us\" }} }}, \
             {{ url = {:?}, name = \"de1\", labels = {{ country = \"de\" }} }}]\n",
            origin.port(),
            hash("pw"),
            us.url(),
            de.url()
        ),
    )
    .await;
    for _ in 0..3 {
        let (code, s) = request(
            gw.socks(),
            Some(("user-country-de", "pw")),
            &connect_v4(origin.port()),
        )
        .await;
        assert_eq!(code, 0);
        assert!(get_over(s, &origin, "/").await.ends_with("labelled"));
    }
    assert_eq!((us.connects(), de.connects()), (0, 3));
    // No member matches: the HTTP port's 503 no-matching-upstream is 01 here.
    let (code, _) = request(
        gw.socks(),
        Some(("user-country-fr", "pw")),
        &connect_v4(origin.port()),
    )
    .await;
    assert_eq!(code, 1);
    assert_eq!((us.connects(), de.connects()), (0, 3));
}

/// With the access log on, a SOCKS5 tunnel gets its line when it ends (method `SOCKS5`, the
/// target as asked, user, session, pool, upstream, bytes), and a refused request gets one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks_tunnels_and_refusals_get_access_log_lines() {
    let origin = Origin::start(OriginBehaviour::fixed("logged")).await;
    let up = FakeProxy::start(FakeProxyOpts::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log");
    let gw = gateway(
        &[&up],
        origin.port(),
        true,
        &format!("[log]\naccess = {:?}\n", path.display().to_string()),
    )
    .await;
    let (code, s) = request(
        gw.socks(),
        Some(("user-session-s1", "pw")),
        &connect_v4(origin.port()),
    )
    .await;
    assert_eq!(code, 0);
    assert!(get_over(s, &origin, "/").await.ends_with("logged"));
    let mut bind = connect_v4(origin.port());
    bind[1] = 2;
    let (code, _) = request(gw.socks(), Some(("user", "pw")), &bind).await;
    assert_eq!(code, 7);
    let read = || std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        common::wait_until(|| read().lines().count() >= 2, Duration::from_secs(10)).await,
        "two lines: {}",
        read()
    );
    let text = read();
    assert!(!text.contains(":pw"), "{text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let tunnel = lines
        .iter()
        .find(|l| l["status"] == 200)
        .expect("the tunnel's line");
    assert_eq!(tunnel["method"], "SOCKS5");
    assert_eq!(tunnel["target"], format!("127.0.0.1:{}", origin.port()));
    assert_eq!(tunnel["user"], "user");
    assert_eq!(tunnel["session"], "s1");
    assert_eq!(tunnel["pool"], "default");
    assert_eq!(tunnel["upstream"], up.url().as_str());
    assert_eq!(tunnel["outcome"], "ok");
    assert!(tunnel["bytes_down"].as_u64().unwrap() > 0, "{tunnel}");
    let refused = lines
        .iter()
        .find(|l| l["status"] != 200)
        .expect("the refusal's line");
    assert_eq!(refused["method"], "SOCKS5");
    assert_eq!(refused["upstream"], serde_json::Value::Null);
}
