//! The proxy port served by worker threads of their own (`server.workers`), as the binary runs it:
//! both proxy paths work, upstream connections are reused within a thread, and shutdown drains
//! every connection and lease before the threads stop accepting for good.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use poolgate::app::{Drained, StartOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Client connections, each sending requests one after another.
const CLIENTS: usize = 8;
const REQUESTS_PER_CLIENT: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_serve_both_paths_reuse_upstream_connections_and_drain_cleanly() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let echo = common::echo_server().await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
         [pools.default]\nupstreams = [\"{}\"]\n",
        echo.port(),
        upstream.url()
    );
    let options = StartOptions {
        proxy_threads: 2,
        ..StartOptions::default()
    };
    let gw = TestGateway::start_text_with(&text, options).await;

    // Clients on connections of their own, so both threads get some.
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CLIENTS {
        let client = gw.client();
        let url = origin.url("/ok");
        clients.spawn(async move {
            for _ in 0..REQUESTS_PER_CLIENT {
                let resp = client.get(&url).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                assert_eq!(resp.text().await.unwrap(), "ok");
            }
        });
    }
    let all = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(done) = clients.join_next().await {
            done.unwrap();
        }
    });
    all.await.expect("every client finishes in time");
    assert_eq!(upstream.requests(), CLIENTS * REQUESTS_PER_CLIENT);
    // At most one upstream connection per request in flight at once: the rest were reused.
    assert!(
        upstream.connections() <= CLIENTS,
        "{} upstream connections for {} requests from {CLIENTS} clients",
        upstream.connections(),
        upstream.requests()
    );

    let (mut tunnel, head) = common::connect_tunnel(gw.proxy, echo, "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    tunnel.write_all(b"through a worker").await.unwrap();
    let mut back = [0u8; 16];
    tokio::time::timeout(Duration::from_secs(5), tunnel.read_exact(&mut back))
        .await
        .expect("echo in time")
        .unwrap();
    assert_eq!(&back, b"through a worker");
    drop(tunnel);

    let proxy = gw.proxy;
    let (drained, leases_left) =
        tokio::time::timeout(Duration::from_secs(20), gw.shutdown_counting_leases())
            .await
            .expect("shutdown in time");
    assert_eq!(drained, Drained::Clean);
    assert_eq!(leases_left, 0);
    // Every thread's handle of the listening socket is closed once shutdown returns.
    assert!(
        tokio::net::TcpStream::connect(proxy).await.is_err(),
        "the proxy port still accepts after shutdown"
    );
}

/// Worker threads listen with `SO_REUSEPORT` (on Linux), which would let a second gateway started
/// on the same port join the group and take a share of its connections. It must fail to start
/// instead, as it would on a plain socket, and the first must go on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_a_taken_proxy_port_fails_to_start_and_the_first_keeps_serving() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let upstream = FakeProxy::start(FakeProxyOpts::default()).await;
    let config = |listen: &str| {
        format!(
            "[server]\nlisten = \"{listen}\"\nadmin_listen = \"127.0.0.1:0\"\n\
             [policy]\nallow_private_targets = true\n\
             [pools.default]\nupstreams = [\"{}\"]\n",
            upstream.url()
        )
    };
    let options = || StartOptions {
        proxy_threads: 2,
        ..StartOptions::default()
    };
    let gw = TestGateway::start_text_with(&config("127.0.0.1:0"), options()).await;

    let second = poolgate::config::Config::parse(&config(&gw.proxy.to_string()), "test", None)
        .expect("config parses");
    let err = match poolgate::app::start_with(second, options()).await {
        Ok(_) => panic!("a second gateway started on {}", gw.proxy),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("server.listen"), "{err}");
    assert!(err.contains("in use"), "{err}");

    // Every connection still reaches the first gateway: none is handed to a half-started second.
    let client = gw.client();
    for _ in 0..8 {
        let client = reqwest::Client::builder()
            .proxy(reqwest::Proxy::all(gw.proxy_url()).unwrap())
            .pool_max_idle_per_host(0)
            .build()
            .unwrap();
        let resp = client.get(origin.url("/ok")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    let resp = client.get(origin.url("/ok")).send().await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "ok");
    assert_eq!(upstream.requests(), 9);
}
