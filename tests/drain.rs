//! The binary under signals: SIGTERM with 50 requests in flight and 10 open tunnels lets the
//! requests finish, gives the tunnels the grace period (they still carry bytes), then closes them,
//! releases every lease and exits 0. SIGHUP reloads the config file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{Origin, OriginBehaviour};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_poolgate");

struct Child {
    child: tokio::process::Child,
    proxy: String,
    log: tokio::sync::mpsc::UnboundedReceiver<String>,
    all: Vec<String>,
}

impl Child {
    async fn start(config: &std::path::Path) -> Child {
        let mut child = tokio::process::Command::new(BIN)
            .arg("--config")
            .arg(config)
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (tx, mut log) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let _ = tx.send(line);
            }
        });
        let mut all = Vec::new();
        let proxy = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(line) = log.recv().await {
                all.push(line.clone());
                if let Some(rest) = line.split("proxy=").nth(1) {
                    return rest.split_whitespace().next().unwrap().to_string();
                }
            }
            panic!("the gateway exited before listening");
        })
        .await
        .expect("the gateway logs its address");
        Child {
            child,
            proxy,
            log,
            all,
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().unwrap().to_string();
        assert!(
            std::process::Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// Waits (bounded) for a log line containing `text`.
    async fn wait_log(&mut self, text: &str) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        if self.all.iter().any(|l| l.contains(text)) {
            return true;
        }
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.log.recv()).await {
            self.all.push(line.clone());
            if line.contains(text) {
                return true;
            }
        }
        false
    }
}

async fn tunnel(proxy: &str, echo: std::net::SocketAddr) -> TcpStream {
    let (s, head) = common::connect_tunnel(proxy.parse().unwrap(), echo, "").await;
    assert!(head.starts_with("HTTP/1.1 200"));
    s
}

async fn echoes(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut back = vec![0u8; msg.len()];
    matches!(
        tokio::time::timeout(Duration::from_secs(3), s.read_exact(&mut back)).await,
        Ok(Ok(_))
    ) && back == msg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_50_requests_gives_10_tunnels_the_grace_and_releases_every_lease() {
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let echo = common::echo_server().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshutdown_grace = \"4s\"\n\
             [policy]\nallow_private_targets = true\nconnect_ports = [{}]\n\
             [pools.default]\nupstreams = [\"direct://\"]\n",
            echo.port()
        ),
    )
    .unwrap();
    let mut gw = Child::start(&path).await;

    let mut tunnels = Vec::new();
    for _ in 0..10 {
        tunnels.push(tunnel(&gw.proxy, echo).await);
    }
    let client = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!("http://{}", gw.proxy)).unwrap())
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let (client, url) = (client.clone(), origin.url("/slow?ms=1500"));
        requests.spawn(async move {
            let resp = client.get(url).send().await?;
            let status = resp.status();
            resp.bytes().await?;
            Ok::<_, reqwest::Error>(status)
        });
    }
    assert!(
        common::wait_until(|| origin.in_flight() == 50, Duration::from_secs(10)).await,
        "50 requests in flight"
    );
    gw.signal("-TERM");
    let term_at = Instant::now();

    // Tunnels carry bytes during the grace period.
    for t in &mut tunnels {
        assert!(echoes(t, b"during grace").await);
    }
    let mut ok = 0;
    while let Some(r) = requests.join_next().await {
        assert_eq!(r.unwrap().unwrap(), 200);
        ok += 1;
    }
    assert_eq!(ok, 50);
    // After the grace period the tunnels are closed.
    for t in &mut tunnels {
        let mut buf = [0u8; 16];
        let r = tokio::time::timeout(Duration::from_secs(10), t.read(&mut buf)).await;
        assert!(
            matches!(r, Ok(Ok(0)) | Ok(Err(_))),
            "tunnel not closed: {r:?}"
        );
    }
    let closed_after = term_at.elapsed();
    assert!(closed_after >= Duration::from_secs(3), "{closed_after:?}");
    let status = tokio::time::timeout(Duration::from_secs(20), gw.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(gw.wait_log("shutdown complete").await, "{:?}", gw.all);
    let last = gw
        .all
        .iter()
        .find(|l| l.contains("shutdown complete"))
        .unwrap();
    assert!(last.contains("leases_left=0"), "{last}");
    assert!(TcpStream::connect(&gw.proxy).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_a_bad_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    let base = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
                [pools.default]\nupstreams = [\"direct://\"]\n";
    std::fs::write(&path, base).unwrap();
    let mut gw = Child::start(&path).await;
    std::fs::write(
        &path,
        base.replace("[pools.default]", "[server2]\n[pools.default]"),
    )
    .unwrap();
    gw.signal("-HUP");
    assert!(gw.wait_log("config reload refused").await, "{:?}", gw.all);
    std::fs::write(
        &path,
        base.replace("[server]\n", "[server]\nmax_connections = 50\n"),
    )
    .unwrap();
    gw.signal("-HUP");
    assert!(gw.wait_log("config reloaded").await, "{:?}", gw.all);
    gw.signal("-TERM");
    let status = tokio::time::timeout(Duration::from_secs(20), gw.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
}
