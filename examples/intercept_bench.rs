//! Requests per second through an inspected tunnel against a raw tunnel, in the same run.
//!
//! Starts, in this process and on loopback only: an HTTPS origin (its own throw-away CA), and a
//! gateway with two pools of one `direct://` upstream each: `raw` (plain CONNECT tunnels) and
//! `inspected` (`inspect_tls = true`). Clients pick the pool with a `-pool-<name>` username token,
//! trust the origin's CA (raw) or the gateway's interception CA (inspected), and fetch a small
//! response over and over. Two shapes are measured for each pool:
//!
//! - keep-alive: `concurrency` connections, each carrying many requests (the steady state);
//! - new tunnel per request: CONNECT + TLS handshake(s) every time (the worst case).
//!
//! ```text
//! cargo run --release --example intercept_bench                # 4000 requests, 8 at a time
//! cargo run --release --example intercept_bench -- 20000 16    # requests, concurrency
//! ```
//!
//! Each line prints requests/s for raw and inspected tunnels and their ratio. To try the same by
//! hand against a running gateway whose pool has `inspect_tls = true`:
//!
//! ```text
//! curl --cacert poolgate-ca.pem -x http://127.0.0.1:8080 https://example.com/
//! ```

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use poolgate::config::Config;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;

type BoxError = Box<dyn Error + Send + Sync>;

/// Requests sent before measuring, per pool and shape.
const WARMUP: usize = 100;
/// Body of every origin response.
const BODY: &[u8] = b"ok, a small response of about sixty bytes for the benchmark.\n";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let requests: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(4000);
    let concurrency: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(8);

    let dir = tempfile::tempdir()?;
    // The origin's CA and certificate.
    let origin_ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let origin_ca = ca_params.self_signed(&origin_ca_key)?;
    let leaf_key = KeyPair::generate()?;
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(
        &leaf_key,
        &origin_ca,
        &origin_ca_key,
    )?;
    std::fs::write(dir.path().join("origin-ca.pem"), origin_ca.pem())?;
    let origin = start_origin(
        vec![leaf.der().clone(), origin_ca.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    )
    .await?;

    // The gateway's interception CA.
    let (ca_cert, ca_key) = (dir.path().join("ca.pem"), dir.path().join("ca-key.pem"));
    poolgate::intercept::ca::write_new(&ca_cert, &ca_key, "bench CA", true)?;
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\ndefault_pool = \"raw\"\n\
         [policy]\nallow_private_targets = true\nconnect_ports = [{port}]\n\
         [intercept]\nca_cert = {ca_cert:?}\nca_key = {ca_key:?}\norigin_ca_file = {origin_ca:?}\n\
         [pools.raw]\nupstreams = [\"direct://\"]\n\
         [pools.inspected]\nupstreams = [\"direct://\"]\ninspect_tls = true\n",
        port = origin.port(),
        origin_ca = dir.path().join("origin-ca.pem"),
    );
    let config = Config::parse(&text, "bench", None)?;
    let running = poolgate::app::start(config).await?;
    let proxy = running.proxy_addr;

    let origin_root = reqwest::Certificate::from_pem(origin_ca.pem().as_bytes())?;
    let gateway_root = reqwest::Certificate::from_pem(std::fs::read(&ca_cert)?.as_slice())?;
    let url = format!("https://{origin}/bench");
    println!(
        "{requests} requests per measurement, {concurrency} at a time, origin https://{origin}, gateway {proxy}"
    );
    for (shape, keep_alive) in [("keep-alive", true), ("new tunnel per request", false)] {
        let raw = client(proxy, "raw", origin_root.clone(), keep_alive)?;
        let inspected = client(proxy, "inspected", gateway_root.clone(), keep_alive)?;
        run(&raw, &url, WARMUP, concurrency).await?;
        run(&inspected, &url, WARMUP, concurrency).await?;
        let raw_rps = run(&raw, &url, requests, concurrency).await?;
        let inspected_rps = run(&inspected, &url, requests, concurrency).await?;
        println!(
            "{shape:>24}: raw {raw_rps:>8.0} req/s   inspected {inspected_rps:>8.0} req/s   ratio {:.2}",
            inspected_rps / raw_rps
        );
    }
    let status = poolgate::admin::status::collect(
        running.gateway(),
        &poolgate::admin::status::Listing::everything(),
    )
    .await;
    println!(
        "intercept: {} tunnels inspected, {} requests relayed, {} leaves minted",
        status.intercept.tunnels_inspected,
        status.intercept.requests,
        status.intercept.certs_minted
    );
    running.shutdown().await;
    Ok(())
}

fn client(
    proxy: SocketAddr,
    pool: &str,
    root: reqwest::Certificate,
    keep_alive: bool,
) -> Result<reqwest::Client, BoxError> {
    let mut b = reqwest::Client::builder()
        .proxy(reqwest::Proxy::all(format!(
            "http://bench-pool-{pool}:x@{proxy}"
        ))?)
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .timeout(Duration::from_secs(30));
    if !keep_alive {
        b = b.pool_max_idle_per_host(0);
    }
    Ok(b.build()?)
}

/// Sends `total` requests, `concurrency` at a time; returns requests per second.
async fn run(
    client: &reqwest::Client,
    url: &str,
    total: usize,
    concurrency: usize,
) -> Result<f64, BoxError> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let client = client.clone();
        let url = url.to_string();
        let share = total / concurrency + usize::from(worker < total % concurrency);
        tasks.spawn(async move {
            for _ in 0..share {
                let resp = client.get(&url).send().await?;
                if !resp.status().is_success() {
                    return Err(format!("status {}", resp.status()).into());
                }
                resp.bytes().await?;
            }
            Ok::<(), BoxError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// An HTTPS origin on 127.0.0.1:0 answering every request with [`BODY`].
async fn start_origin(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<SocketAddr, BoxError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            // As real servers do: without it, Nagle holds a response behind the TLS session
            // tickets until the client's delayed ACK (about 40 ms).
            let _ = tcp.set_nodelay(true);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                        BODY,
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Ok(addr)
}
