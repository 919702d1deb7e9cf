//! Client limits on loopback: a slowloris client is cut off at the header-read timeout while 50
//! others are served; connections past the limits are refused cleanly while a load test on
//! existing connections goes on without a failure; idle keep-alive connections close; bodies past
//! the limit get 413.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

async fn gateway(server_extra: &str, upstream: &FakeProxy) -> TestGateway {
    TestGateway::start_with(
        server_extra,
        &format!(
            "[policy]\nallow_private_targets = true\n[pools.default]\nupstreams = [\"{}\"]\n",
            upstream.url()
        ),
    )
    .await
}

/// A gateway whose one pool tunnels to `echo` (a loopback port, allowed for CONNECT) through
/// `upstream`, with `server_extra` in `[server]` and `pool_extra` in the pool's table.
async fn tunnel_gateway(
    server_extra: &str,
    pool_extra: &str,
    echo: SocketAddr,
    upstream: &FakeProxy,
) -> TestGateway {
    TestGateway::start_with(
        server_extra,
        &format!(
            "[policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [pools.default]\nupstreams = [\"{}\"]\n{pool_extra}\n",
            echo.port(),
            upstream.url()
        ),
    )
    .await
}

/// Reads until EOF, an error, or `limit` passed; returns the bytes and whether the peer closed.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    for _ in 0..10_000 {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (out, true),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
    (out, false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_off_at_the_header_timeout_while_50_others_are_served() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway("header_read_timeout = \"2s\"", &upstream).await;

    let proxy = gw.proxy;
    let head = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nX-Padding: {}\r\n\r\n",
        origin.url("/ok"),
        origin.authority(),
        "a".repeat(64)
    );
    let slow = tokio::spawn(async move {
        let mut s = TcpStream::connect(proxy).await.unwrap();
        let start = Instant::now();
        // One byte per second, at most 10 bytes: the head is never complete within the timeout.
        for b in head.as_bytes().iter().take(10) {
            if s.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let mut probe = [0u8; 1];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(1), s.read(&mut probe)).await
            {
                return start.elapsed();
            }
        }
        let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
        assert!(closed, "the slow client was never cut off");
        start.elapsed()
    });

    let client = gw.client();
    let mut others = tokio::task::JoinSet::new();
    for i in 0..50 {
        let client = client.clone();
        let url = origin.url(&format!("/slow?ms={}", 20 * (i % 5)));
        others.spawn(async move { client.get(url).send().await.map(|r| r.status()) });
    }
    let mut ok = 0;
    while let Some(r) = others.join_next().await {
        assert_eq!(r.unwrap().unwrap(), 200);
        ok += 1;
    }
    assert_eq!(ok, 50);
    let cut_after = slow.await.unwrap();
    assert!(
        cut_after >= Duration::from_millis(1500) && cut_after < Duration::from_secs(5),
        "cut off after {cut_after:?}"
    );
    assert_eq!(
        upstream.requests(),
        50,
        "the slow request never went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(
        "idle_timeout = \"1s\"\nheader_read_timeout = \"30s\"",
        &upstream,
    )
    .await;
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\n\r\n",
        origin.url("/ok"),
        origin.authority()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let start = Instant::now();
    let (resp, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 200"));
    assert!(closed, "idle connection kept open");
    let after = start.elapsed();
    assert!(
        after >= Duration::from_millis(800) && after < Duration::from_secs(4),
        "{after:?}"
    );
}

async fn connect_from(ip: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(ip.parse().unwrap(), 0))
        .unwrap();
    socket.connect(to).await.unwrap()
}

/// Whether a fresh connection is refused: the gateway answers 503 at once and closes.
async fn is_refused(mut s: TcpStream) -> bool {
    let (bytes, closed) = read_until_closed(&mut s, Duration::from_secs(3)).await;
    let text = String::from_utf8_lossy(&bytes);
    closed && (text.is_empty() || text.starts_with("HTTP/1.1 503"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_limit_are_refused_without_harming_a_load_test() {
    const LIMIT: u64 = 60;
    const FLOOD: usize = 2_000;
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(
        &format!("max_connections = {LIMIT}\nheader_read_timeout = \"60s\""),
        &upstream,
    )
    .await;

    // The load test: 8 workers on kept-alive connections, until told to stop (bounded).
    let client = gw.client();
    let stop = tokio_util::sync::CancellationToken::new();
    let warm = std::sync::Arc::new(tokio::sync::Barrier::new(9));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (client, stop, warm) = (client.clone(), stop.clone(), warm.clone());
        let url = origin.url("/ok");
        workers.spawn(async move {
            let (mut ok, mut failed) = (0u32, 0u32);
            for i in 0..5_000 {
                if i == 3 {
                    warm.wait().await;
                }
                if i > 3 && stop.is_cancelled() {
                    break;
                }
                let good = match client.get(&url).send().await {
                    Ok(r) => r.status() == 200 && r.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if good {
                    ok += 1;
                } else {
                    failed += 1;
                }
            }
            (ok, failed)
        });
    }
    warm.wait().await;

    // Fill what is left of the limit with idle connections.
    // One per worker, and now and then a spare one: the shared client's pool opens another
    // when a request starts before the previous response's connection is back in the pool.
    let open = gw.status().await["connections"]["open"].as_u64().unwrap();
    assert!(open <= 16, "{open}");
    let mut idle = Vec::new();
    for _ in open..LIMIT {
        idle.push(TcpStream::connect(gw.proxy).await.unwrap());
    }
    assert!(
        common::wait_until_async(
            || async { gw.status().await["connections"]["open"].as_u64() == Some(LIMIT) },
            Duration::from_secs(5)
        )
        .await
    );

    // The flood: 2,000 more, 200 at a time; every one refused.
    let mut refused = 0;
    for _ in 0..FLOOD / 200 {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..200 {
            let addr = gw.proxy;
            batch.spawn(async move { is_refused(TcpStream::connect(addr).await.unwrap()).await });
        }
        while let Some(r) = batch.join_next().await {
            if r.unwrap() {
                refused += 1;
            }
        }
    }
    assert_eq!(refused, FLOOD);
    stop.cancel();
    let (mut ok, mut failed) = (0, 0);
    while let Some(r) = workers.join_next().await {
        let (o, f) = r.unwrap();
        ok += o;
        failed += f;
    }
    assert_eq!(failed, 0, "load test requests failed during the flood");
    assert!(ok > 32, "{ok}");
    let st = gw.status().await;
    assert!(
        st["connections"]["refused"].as_u64().unwrap() >= FLOOD as u64,
        "{st}"
    );

    // The idle connections are unharmed: one of them still serves a request. The first one
    // opened: should the load test's client have opened a spare connection while the idle ones
    // were being opened, the last of them was past the limit and refused (as it should be).
    let mut s = idle.swap_remove(0);
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        origin.url("/ok"),
        origin.authority()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let (resp, _) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&resp);
    assert!(text.starts_with("HTTP/1.1 200"), "{text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_cannot_take_every_connection() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway(
        "max_connections_per_client = 3\nheader_read_timeout = \"60s\"",
        &upstream,
    )
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect_from("127.0.0.2", gw.proxy).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(is_refused(connect_from("127.0.0.2", gw.proxy).await).await);
    // Another client address is served.
    let resp = gw.client().get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let s = connect_from("127.0.0.2", gw.proxy).await;
    let mut s = s;
    s.write_all(
        format!(
            "GET {} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            origin.url("/ok")
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (resp, _) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(String::from_utf8_lossy(&resp).starts_with("HTTP/1.1 200"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_limit_get_413() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway("max_request_body_bytes = 1000", &upstream).await;
    let client = gw.client();
    let resp = client
        .post(origin.url("/up"))
        .body(vec![b'a'; 1000])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = client
        .post(origin.url("/up"))
        .body(vec![b'a'; 1001])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(resp.headers()["x-pool-error"], "body-too-large");

    // Chunked, growing past the limit mid-stream.
    let mut req = format!(
        "POST {} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
        origin.url("/up")
    )
    .into_bytes();
    for _ in 0..4 {
        req.extend_from_slice(format!("190\r\n{}\r\n", "b".repeat(400)).as_bytes());
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let raw = common::raw_http(gw.proxy, &req).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(origin.requests().iter().all(|r| r.body_len <= 1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tunnels_are_closed() {
    let echo = common::echo_server().await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = tunnel_gateway("tunnel_idle_timeout = \"1s\"", "", echo, &upstream).await;
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    // Busy for 2 s (bytes every 300 ms): stays open past the timeout.
    for _ in 0..7 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        s.read_exact(&mut back).await.unwrap();
    }
    let start = Instant::now();
    let (_, closed) = read_until_closed(&mut s, Duration::from_secs(5)).await;
    assert!(closed, "idle tunnel kept open");
    assert!(
        start.elapsed() >= Duration::from_millis(800),
        "{:?}",
        start.elapsed()
    );
    assert!(
        common::wait_until_async(
            || async { gw.status().await["tunnels"]["open"] == 0 },
            Duration::from_secs(3)
        )
        .await
    );
}

/// A tunnel open past `lease_ttl` keeps its upstream's capacity: its lease is renewed while it
/// lives, so with a cap of one a second tunnel waits until the first closes, however long that is.
/// (A lease left to expire would let the second through after `lease_ttl`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_tunnel_keeps_its_lease_past_the_lease_ttl() {
    let echo = common::echo_server().await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let pool = "max_concurrency = 1\nlease_ttl = \"1s\"\nqueue_timeout = \"10s\"";
    let gw = tunnel_gateway("", pool, echo, &upstream).await;
    let open = |proxy: SocketAddr| async move {
        let (s, head) = common::connect_tunnel(proxy, echo, "").await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        s
    };
    let mut first = open(gw.proxy).await;
    let second = tokio::spawn(open(gw.proxy));
    // 2.4 s, more than twice the lease TTL, with bytes moving through the first tunnel.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        first.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        first.read_exact(&mut back).await.unwrap();
        assert!(
            !second.is_finished(),
            "a second tunnel got the capped upstream"
        );
    }
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(5), second)
        .await
        .expect("the second tunnel never got the upstream after the first closed")
        .unwrap();
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_request_heads_get_431() {
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway("max_header_bytes = 8192", &upstream).await;
    for head in [
        format!(
            "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX-Big: {}\r\n\r\n",
            "a".repeat(9000)
        ),
        format!(
            "GET http://a.test/{} HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "a".repeat(9000)
        ),
    ] {
        let raw = common::raw_http(gw.proxy, head.as_bytes()).await;
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    }
    assert_eq!(upstream.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_of_100_header_lines_passes_and_one_of_101_gets_431() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let gw = gateway("", &upstream).await;
    let head = |lines: usize| {
        // Host plus (lines - 1) others.
        let extra: String = (1..lines).map(|i| format!("X-H{i}: v\r\n")).collect();
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\n{extra}Connection: close\r\n\r\n",
            origin.url("/ok"),
            origin.authority()
        )
    };
    // Host and Connection are two of the lines.
    let raw = common::raw_http(gw.proxy, head(99).as_bytes()).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert_eq!(upstream.requests(), 1);
    let raw = common::raw_http(gw.proxy, head(100).as_bytes()).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 431"), "{text}");
    assert_eq!(upstream.requests(), 1);
}
