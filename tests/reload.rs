//! Config reload under load: upstreams are added and removed five times while requests run, a
//! session is bound and tunnels are open; no request fails, no tunnel drops, the session keeps its
//! (kept) upstream. Invalid reloads and listener changes are refused with the reason and traffic
//! goes on; the admin endpoint wants its bearer token.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::{FakeProxy, FakeProxyOpts, Origin, OriginBehaviour, TestGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "reload-token-0123456789";

fn config(ups: &[&FakeProxy], echo_port: u16, extra: &str) -> String {
    let list: Vec<String> = ups.iter().map(|u| format!("\"{}\"", u.url())).collect();
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nadmin_token = \"{TOKEN}\"\n{extra}\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{echo_port}]\n\
         [pools.default]\nupstreams = [{}]\n",
        list.join(", ")
    )
}

async fn admin_reload(gw: &TestGateway, token: Option<&str>) -> (u16, serde_json::Value) {
    let mut req = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://{}/admin/reload", gw.admin));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (
        status,
        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap(),
    )
}

async fn open_tunnel(gw: &TestGateway, echo: std::net::SocketAddr) -> TcpStream {
    let (s, head) = common::connect_tunnel(gw.proxy, echo, "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    s
}

async fn echoes(s: &mut TcpStream, msg: &[u8]) {
    s.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut back))
        .await
        .expect("tunnel answers")
        .expect("tunnel open");
    assert_eq!(back, msg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_reloads_under_load_drop_nothing() {
    common::init_tracing();
    let origin = Origin::start(OriginBehaviour::echo()).await;
    let echo = common::echo_server().await;
    let mut ups = Vec::new();
    for _ in 0..4 {
        ups.push(FakeProxy::start(FakeProxyOpts::default()).await);
    }
    let (a, b, c, d) = (&ups[0], &ups[1], &ups[2], &ups[3]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config(&[a, b], echo.port(), "")).unwrap();
    let gw = TestGateway::start_file(&path).await;

    // A session, bound now, on the upstream kept through every reload below? Find out where.
    let client = gw.client();
    let sess = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "s1")
        .send()
        .await
        .unwrap();
    let bound = sess.headers()["x-pool-upstream"]
        .to_str()
        .unwrap()
        .to_string();
    let kept = if bound == a.url() { a } else { b };
    let mut tunnels = Vec::new();
    for _ in 0..3 {
        tunnels.push(open_tunnel(&gw, echo).await);
    }

    // The load: 4 workers, each until told to stop (at most 2,000 requests).
    let stop = tokio_util::sync::CancellationToken::new();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (client, stop, url) = (client.clone(), stop.clone(), origin.url("/slow?ms=30"));
        workers.spawn(async move {
            let (mut ok, mut failed) = (0u32, Vec::new());
            for _ in 0..2_000 {
                if stop.is_cancelled() {
                    break;
                }
                match client.get(&url).send().await {
                    Ok(r) if r.status() == 200 => {
                        let _ = r.bytes().await;
                        ok += 1;
                    }
                    Ok(r) => failed.push(format!(
                        "{} {:?}",
                        r.status(),
                        r.headers().get("x-pool-error")
                    )),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        });
    }

    let sets: [Vec<&FakeProxy>; 5] = [
        vec![kept, c],
        vec![kept, c, d],
        vec![kept],
        vec![kept, a, b, d],
        vec![a, b, c, d],
    ];
    for (i, set) in sets.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut seen = std::collections::HashSet::new();
        let set: Vec<&FakeProxy> = set
            .iter()
            .copied()
            .filter(|u| seen.insert(u.url()))
            .collect();
        std::fs::write(&path, config(&set, echo.port(), "")).unwrap();
        let (status, body) = if i % 2 == 0 {
            admin_reload(&gw, Some(TOKEN)).await
        } else {
            // What SIGHUP runs.
            match gw.running().reload().await {
                Ok(s) => (200, serde_json::to_value(s).unwrap()),
                Err(e) => (400, serde_json::json!(e.to_string())),
            }
        };
        assert_eq!(status, 200, "reload {i}: {body}");
        for t in &mut tunnels {
            echoes(t, format!("after reload {i}").as_bytes()).await;
        }
    }

    // Refused reloads: the running config stays, traffic goes on.
    std::fs::write(
        &path,
        "[pools.default]\nupstreams = [\"gopher://x\"]\nbogus = 1\n",
    )
    .unwrap();
    let (status, body) = admin_reload(&gw, Some(TOKEN)).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("bogus"), "{body}");
    std::fs::write(
        &path,
        config(&[a], echo.port(), "").replacen("127.0.0.1:0", "127.0.0.1:1", 1),
    )
    .unwrap();
    let (status, body) = admin_reload(&gw, Some(TOKEN)).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("server.listen cannot change"),
        "{body}"
    );
    // Without or with a wrong token: 401.
    assert_eq!(admin_reload(&gw, None).await.0, 401);
    assert_eq!(
        admin_reload(&gw, Some("wrong-token-0123456789")).await.0,
        401
    );
    tokio::time::sleep(Duration::from_millis(300)).await;

    stop.cancel();
    let (mut ok, mut failed) = (0, Vec::new());
    while let Some(r) = workers.join_next().await {
        let (o, f) = r.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(ok > 50, "{ok}");
    for t in &mut tunnels {
        echoes(t, b"still open").await;
    }
    // The session kept its upstream, which every config kept.
    let again = client
        .get(origin.url("/ok"))
        .header("X-Pool-Session", "s1")
        .send()
        .await
        .unwrap();
    assert_eq!(again.headers()["x-pool-upstream"], bound.as_str());
    // Every upstream of the last config serves.
    let st = gw.status().await;
    assert_eq!(st["config"]["generation"], 6, "{st}");
    assert_eq!(st["config"]["reloads_ok"], 5);
    assert_eq!(st["config"]["reloads_failed"], 2);
    assert_eq!(st["pools"][0]["upstreams_total"], 4);
    assert_eq!(st["tunnels"]["open"], 3);
    eprintln!("reload under load: {ok} requests, 0 failed, 3 tunnels kept");
    drop(tunnels);
    let (_, leases_left) = gw.shutdown_counting_leases().await;
    assert_eq!(leases_left, 0);
}
